// core/gemm.h — every CPU f32 GEMM of the program, with bits that do not depend on the thread
// count.
//
// OpenBLAS 0.3.21 splits a GEMM over its threads in a way that changes the summation order: its
// sgemm gives different bits at 1 and 2 threads for most shapes. Run so, a training step's result
// would depend on how many threads it got, and core/threads.c chooses that from the machine's
// load. Here OpenBLAS always runs single-threaded (its OpenMP build follows the calling task's
// omp_get_max_threads(), set to 1 around each call), and a large product is cut into blocks of C
// (rows or columns, never K) fixed by the shape alone, each one single-threaded sgemm; the blocks
// share the threads dynamically. Each element of C is then always summed by the same call on the
// same operands, whichever thread runs it and however many there are.
#pragma once

// C [m, n] = alpha · op(A) · op(B) + beta · C, row-major; op(A) [m, k], op(B) [k, n]: A is [m, k]
// (lda) or, trans_a, [k, m]; B is [k, n] (ldb) or, trans_b, [n, k]. Inside a parallel region
// the blocks run in turn on the calling thread (same bits). m, n or k may be 0.
void mt_sgemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
              const float *b, int ldb, float beta, float *c, int ldc);

// How mt_sgemm cuts an [m, n] × k product: *blocks pieces along rows (*by_rows) or columns, each
// `*step` wide but the last. Exposed for the tests.
void mt_sgemm_blocks(int m, int n, int k, int *by_rows, int *blocks, int *step);
