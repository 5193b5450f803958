// tests/omp_passive.c — the test binary's OpenMP threads sleep when idle, as the trainer's
// do (core/threads.h, mt_threads_init): without it, two test jobs on two cores, each opening
// thousands of tiny parallel regions (the finite-difference tests), spin against each other.
// Measured on the CI machine (2 cores, --jobs 2): the suite took 219 s spinning, 43 s passive;
// three attention finite-difference tests took 60–120 s each against 0.1–0.8 s.
//
// libgomp reads its environment in a constructor before main, and Criterion owns main, so this
// constructor re-executes the binary with the policy set, rebuilding argv from /proc/self/cmdline.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/threads.h"

enum { MAX_ARGS = 256, MAX_CMDLINE = 1 << 16 };

__attribute__((constructor)) static void sleep_idle_threads(void) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;  // the caller's choice stands
    static char buf[MAX_CMDLINE];
    static char *argv[MAX_ARGS + 1];
    FILE *f = fopen("/proc/self/cmdline", "rb");
    if (!f) return;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    int whole = feof(f);
    fclose(f);
    if (!whole || n == 0) return;  // a command line this cannot rebuild: run as started
    buf[n] = '\0';
    int argc = 0;
    for (size_t i = 0; i < n && argc < MAX_ARGS; i += strlen(buf + i) + 1) argv[argc++] = buf + i;
    if (argc == MAX_ARGS) return;
    argv[argc] = NULL;
    mt_threads_init(argv);
}
