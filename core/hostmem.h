// core/hostmem.h — a host memory limit (ulimit -v, RLIMIT_AS) met at start-up, not mid-run.
//
// OpenBLAS (the OpenMP build, 0.3.21) takes 128 MiB work buffers from blas_memory_alloc: one
// per thread and one for a warm-up while the library loads (gotoblas_init, before main), then one
// per concurrent sgemm; when such an allocation fails it retries forever: under a tight
// `ulimit -v` the program would hang at 100% CPU instead of failing (seen with gdb in
// blas_thread_init and in cblas_sgemm). So:
//   * before any library initialiser runs (an ELF preinit function of the executable), the
//     address space left under RLIMIT_AS is compared with those n + 1 buffers (n: the thread
//     count OpenBLAS will take): too little → "out of host memory" naming the limit, exit
//     MT_EXIT_OOM;
//   * mt_hostmem_reserve(), first thing in main, compares what is left with a buffer and a
//     thread stack for each OpenMP thread, then takes those buffers from OpenBLAS and gives them
//     back (they stay in its table, so later sgemms never allocate) and starts the threads.
// After that, running out of memory is an ordinary failed malloc: exit MT_EXIT_OOM.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// OpenBLAS's buffer as mmap'ed (BUFFER_SIZE 128 MiB on x86_64, plus its page of slack).
#define MT_BLAS_BUFFER_BYTES ((uint64_t)129 << 20)

// RLIMIT_AS's soft limit in bytes, 0 when there is none.
uint64_t mt_hostmem_limit(void);
// The process's address space in use now (VmSize).
uint64_t mt_hostmem_used(void);
// The start-up check and reservation above: 0, or exits MT_EXIT_OOM with a message.
void mt_hostmem_reserve(void);

#ifdef __cplusplus
}
#endif
