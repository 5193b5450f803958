// core/gemm.c — the CPU's f32 GEMM in blocks fixed by the shape (see gemm.h).
#include "core/gemm.h"

#include "core/threads.h"

#include <cblas.h>
#include <stdint.h>

#ifdef _OPENMP
#include <omp.h>
#endif

// A product is cut only where each block keeps enough work to hide its own sgemm call and the
// packing it repeats (a block of rows packs all of B again, a block of columns all of A, so the
// cut runs along the longer side; the repeated share grows as blocks narrow): in as many blocks
// as the program started with threads (mt_threads_started: the count before the load adapts it;
// at least 2), each at least GEMM_MIN_DIM wide and GEMM_MIN_WORK multiply-adds, and in blocks of
// GEMM_WIDE beyond that (an even count, at most GEMM_BLOCKS_MAX). Measured at 2 threads on the
// mid config's shapes (M = 512..2048; K, N of 512, 1792, 32000; 24 shapes), interleaved pairs
// against OpenBLAS's own 2-thread sgemm: a median 0.995× its speed, worst 0.974×. Narrower blocks
// cost more: up to 4 blocks of 256 gave 0.991× (worst 0.952×), 16 of 2,000 on the vocab 0.958×.
// So a result depends on the shape and the thread count the program started with (the machine,
// or OMP_NUM_THREADS), never on the load. Block edges are multiples of GEMM_ALIGN.
enum { GEMM_MIN_DIM = 256, GEMM_WIDE = 4096, GEMM_BLOCKS_MAX = 16, GEMM_ALIGN = 16 };
#define GEMM_MIN_WORK ((int64_t)1 << 22)

// One single-threaded sgemm. OpenBLAS's OpenMP build takes as many threads as the calling task's
// omp_get_max_threads() (outside an active parallel region; openblas_set_num_threads does not pin
// it: the next call follows OpenMP again), so this task's count is 1 for the call.
static void sgemm_one_thread(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
                             const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc) {
#ifdef _OPENMP
    int keep = omp_get_max_threads();
    if (keep != 1) omp_set_num_threads(1);
#endif
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#ifdef _OPENMP
    if (keep != 1) omp_set_num_threads(keep);
#endif
}

void mt_sgemm_blocks(int m, int n, int k, int *by_rows, int *blocks, int *step) {
    *by_rows = m >= n;
    int dim = *by_rows ? m : n;
    int64_t work = (int64_t)m * n * k;
    int64_t nb = dim / GEMM_WIDE, threads = mt_threads_started() < 2 ? 2 : mt_threads_started();
    if (nb < threads) nb = dim / GEMM_MIN_DIM < threads ? dim / GEMM_MIN_DIM : threads;
    if (nb > work / GEMM_MIN_WORK) nb = work / GEMM_MIN_WORK;
    if (nb > GEMM_BLOCKS_MAX) nb = GEMM_BLOCKS_MAX;
    if (nb < 2) {
        *blocks = 1, *step = dim;
        return;
    }
    nb &= ~(int64_t)1;
    int s = (int)((dim + nb - 1) / nb);
    s = (s + GEMM_ALIGN - 1) / GEMM_ALIGN * GEMM_ALIGN;
    *step = s, *blocks = (dim + s - 1) / s;
}

void mt_sgemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
              const float *b, int ldb, float beta, float *c, int ldc) {
    if (m <= 0 || n <= 0) return;
    const enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
    int by_rows, blocks, step;
    mt_sgemm_blocks(m, n, k, &by_rows, &blocks, &step);
    int nested = 0;
#ifdef _OPENMP
    nested = omp_in_parallel();
#endif
    (void)nested;  // a build without OpenMP: the blocks in turn
#pragma omp parallel for schedule(dynamic, 1) if (blocks > 1 && !nested)
    for (int i = 0; i < blocks; i++) {
        int o = i * step;
        if (by_rows) {  // rows [o, o + len) of op(A) and of C
            int len = m - o < step ? m - o : step;
            const float *ai = a + (trans_a ? (int64_t)o : (int64_t)o * lda);
            sgemm_one_thread(ta, tb, len, n, k, alpha, ai, lda, b, ldb, beta, c + (int64_t)o * ldc, ldc);
        } else {  // columns [o, o + len) of op(B) and of C
            int len = n - o < step ? n - o : step;
            const float *bi = b + (trans_b ? (int64_t)o * ldb : (int64_t)o);
            sgemm_one_thread(ta, tb, m, len, k, alpha, a, lda, bi, ldb, beta, c + o, ldc);
        }
    }
}
