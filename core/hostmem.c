// core/hostmem.c — a host memory limit met at start-up (see hostmem.h).
#include "core/hostmem.h"

#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core/common.h"

#ifdef _OPENMP
#include <omp.h>
#endif

// OpenBLAS's own allocator (exported by libopenblas); weak: another BLAS has none.
extern void *blas_memory_alloc(int procpos) __attribute__((weak));
extern void blas_memory_free(void *buffer) __attribute__((weak));

#define MARGIN_BYTES ((uint64_t)16 << 20)  // libraries' own start-up allocations

uint64_t mt_hostmem_limit(void) {
    struct rlimit r;
    if (getrlimit(RLIMIT_AS, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return 0;
    return (uint64_t)r.rlim_cur;
}

// Raw syscalls only: this also runs before the C library's users are initialised.
uint64_t mt_hostmem_used(void) {
    char buf[128];
    int fd = open("/proc/self/statm", O_RDONLY);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    uint64_t pages = 0;
    for (char *p = buf; *p >= '0' && *p <= '9'; p++) pages = pages * 10 + (uint64_t)(*p - '0');
    return pages * (uint64_t)sysconf(_SC_PAGESIZE);
}

// The address space a run takes at start-up beyond what is mapped before main: OpenBLAS's n + 1
// buffers while it loads, then one per thread and their stacks (mt_hostmem_reserve).
static uint64_t startup_need(int threads) {
    struct rlimit st;
    uint64_t stack = getrlimit(RLIMIT_STACK, &st) == 0 && st.rlim_cur != RLIM_INFINITY ? (uint64_t)st.rlim_cur
                                                                                       : (uint64_t)8 << 20;
    return (uint64_t)(2 * threads + 1) * MT_BLAS_BUFFER_BYTES + (uint64_t)(threads - 1) * stack + 2 * MARGIN_BYTES;
}

// `want`: the address space the whole start-up needs from here, an upper estimate (the figure to
// raise the limit to).
static void refuse(uint64_t limit, uint64_t used, uint64_t need, uint64_t want, const char *what) {
    char msg[512];
    int n = snprintf(msg, sizeof msg,
                     "moetrain: fatal: out of host memory: the address-space limit (ulimit -v) of "
                     "%llu MiB leaves %llu MiB, and %s needs %llu MiB; a limit of %llu MiB "
                     "(ulimit -v %llu) is enough to start\n",
                     (unsigned long long)(limit >> 20),
                     (unsigned long long)(limit > used ? (limit - used) >> 20 : 0), what,
                     (unsigned long long)(need >> 20), (unsigned long long)((used + want) >> 20) + 1,
                     (unsigned long long)((used + want) >> 10) + 1024);
    if (write(2, msg, (size_t)(n < (int)sizeof msg ? n : (int)sizeof msg - 1)) < 0) _exit(MT_EXIT_OOM);
    _exit(MT_EXIT_OOM);
}

// The thread count OpenBLAS takes while it loads: OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS or
// OMP_NUM_THREADS, else the CPUs this process may run on. `env` is the environment as main gets it.
static int blas_threads(char **env) {
    static const char *const keys[] = {"OPENBLAS_NUM_THREADS=", "GOTO_NUM_THREADS=", "OMP_NUM_THREADS="};
    for (size_t k = 0; k < MT_ARRAY_LEN(keys); k++)
        for (char **e = env; e && *e; e++)
            if (strncmp(*e, keys[k], strlen(keys[k])) == 0) {
                int n = atoi(*e + strlen(keys[k]));
                if (n > 0) return n;
            }
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

// Before every library initialiser: OpenBLAS's gotoblas_init takes a buffer for each of its
// threads (blas_thread_init) and one for its warm-up.
static void preinit_check(int argc, char **argv, char **env) {
    (void)argc, (void)argv;
    uint64_t limit = mt_hostmem_limit();
    if (!limit) return;
    int n = blas_threads(env);
    uint64_t used = mt_hostmem_used(), need = (uint64_t)(n + 1) * MT_BLAS_BUFFER_BYTES + MARGIN_BYTES;
    if (used + need > limit) {
        char what[96];
        snprintf(what, sizeof what, "OpenBLAS's start-up work buffers (%d + 1 of 128 MiB)", n);
        refuse(limit, used, need, startup_need(n), what);
    }
}
__attribute__((section(".preinit_array"), used)) static void (*const preinit_hook)(int, char **, char **) =
    preinit_check;

void mt_hostmem_reserve(void) {
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    uint64_t limit = mt_hostmem_limit();
    if (limit) {
        struct rlimit st;
        uint64_t stack = getrlimit(RLIMIT_STACK, &st) == 0 && st.rlim_cur != RLIM_INFINITY
                             ? (uint64_t)st.rlim_cur : (uint64_t)8 << 20;
        uint64_t used = mt_hostmem_used();
        // Each thread's sgemm takes a buffer (the warm-up's is not reused: seen), each thread but
        // this one a stack.
        uint64_t need = (uint64_t)threads * MT_BLAS_BUFFER_BYTES + (uint64_t)(threads - 1) * stack + MARGIN_BYTES;
        if (used + need > limit) {
            char what[160];
            snprintf(what, sizeof what, "a 128 MiB OpenBLAS work buffer for each of %d threads and "
                     "their stacks", threads);
            refuse(limit, used, need, need, what);
        }
    }
    // One buffer per thread taken and given back: OpenBLAS keeps them for later sgemms.
    if (blas_memory_alloc && blas_memory_free) {
        void *held[256];
        int n = threads < 256 ? threads : 256;
        for (int i = 0; i < n; i++) held[i] = blas_memory_alloc(0);
        for (int i = 0; i < n; i++) blas_memory_free(held[i]);
    }
    int started = 0;
#pragma omp parallel reduction(+ : started)
    started += 1;  // starts the OpenMP threads now, under the check above
    (void)started;
}
