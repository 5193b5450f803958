// tests/test_util.h — helpers shared by the tests: run the real binary, make temp folders.
#pragma once
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#ifndef MT_TEST_BIN
#error "the Makefile passes MT_TEST_BIN, the path of the moetrain binary under test"
#endif

// Runs `moetrain ARGS` through the shell (stderr merged into stdout), captures up to outsz-1
// bytes of output, returns the exit code (or -1 when it did not exit normally).
static inline int mt_test_run(char *out, size_t outsz, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#include <stdarg.h>
static inline int mt_test_run(char *out, size_t outsz, const char *fmt, ...) {
    char args[4096], cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", MT_TEST_BIN, args);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = 0, r;
    char sink[4096];
    while ((r = fread(out && n < outsz - 1 ? out + n : sink, 1,
                      out && n < outsz - 1 ? outsz - 1 - n : sizeof sink, p)) > 0)
        if (out && n < outsz - 1) n += r;
    if (out) out[n] = 0;
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A fresh folder under /tmp; the caller removes it with mt_test_rmrf.
static inline void mt_test_tmpdir(char *buf, size_t n) {
    snprintf(buf, n, "/tmp/moetrain-test-XXXXXX");
    if (!mkdtemp(buf)) abort();
}

static inline void mt_test_rmrf(const char *dir) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
}

// In `tmp`: a tiny checkpoint (configs/tiny.json, seed 3) at model (128 bytes) and `lines` text
// samples at data (128 bytes), for tests that run training.
static inline int mt_test_tiny_run_inputs(const char *tmp, char *model, char *data, int lines) {
    char log[8192];
    snprintf(model, 128, "%s/tiny", tmp);
    snprintf(data, 128, "%s/data.jsonl", tmp);
    if (mt_test_run(log, sizeof log, "init --config %s/configs/tiny.json --out %s --seed 3", MT_REPO_ROOT, model) != 0) {
        fprintf(stderr, "%s", log);
        return -1;
    }
    FILE *f = fopen(data, "w");
    if (!f) return -1;
    for (int i = 0; i < lines; i++) fprintf(f, "{\"text\":\"sample %d of the tiny set %03d\"}\n", i, i * 7);
    return fclose(f);
}
