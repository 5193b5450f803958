// core/threads.c — the OpenMP wait policy default and thread counts (see threads.h).
#include "core/threads.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#include <stdlib.h>
#include <unistd.h>

void mt_threads_init(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
    execv("/proc/self/exe", argv);
    // The exec failed (no /proc): libgomp keeps the policy it started with; nothing else changed.
}

int mt_threads_max(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

int mt_thread_index(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}
