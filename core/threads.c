// core/threads.c — the OpenMP wait policy default (see threads.h).
#include "core/threads.h"

#include <stdlib.h>
#include <unistd.h>

void mt_threads_init(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
    execv("/proc/self/exe", argv);
    // The exec failed (no /proc): libgomp keeps the policy it started with; nothing else changed.
}
