// tests/fuzz/fuzz_common.h — helpers shared by the libFuzzer targets: a per-process scratch
// folder and whole-file writes (the parsers under test read paths).
#pragma once
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

// "/dev/shm/moetrain-fuzz-<what>-<pid>" (memory: the writers fsync), else under /tmp; made once.
static inline const char *fuzz_dir(const char *what) {
    static char dir[128];
    if (!dir[0]) {
        struct stat st;
        const char *base = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : "/tmp";
        snprintf(dir, sizeof dir, "%s/moetrain-fuzz-%s-%d", base, what, (int)getpid());
        mkdir(dir, 0700);
    }
    return dir;
}

static inline void fuzz_write(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
}
