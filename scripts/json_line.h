// scripts/json_line.h — results of the GPU check's programs as JSON lines, appended to the file
// that $MT_GPU_JSONL names (scripts/gpu_check.sh gathers them into its one JSON file after each
// step), one line per result as soon as it is known: a run cut off by its time limit keeps what
// it had measured. Without $MT_GPU_JSONL nothing is written.
//
//   json_line("probe", "\"device\":\"%s\",\"sms\":%d", name, sms);
//   -> {"part":"probe","device":"NVIDIA H100 80GB HBM3","sms":132}
#pragma once
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((format(printf, 2, 3))) static inline void json_line(const char *part, const char *fmt, ...) {
    const char *path = getenv("MT_GPU_JSONL");
    if (!path || !*path) return;
    FILE *f = fopen(path, "a");
    if (!f) {
        fprintf(stderr, "json_line: cannot open %s: results are printed but not recorded\n", path);
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    fprintf(f, "{\"part\":\"%s\",", part);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputs("}\n", f);
    // To the disk now: the next step may be the one that hangs the machine.
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) fprintf(stderr, "json_line: cannot write %s\n", path);
    fclose(f);
}
