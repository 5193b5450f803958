// scripts/cuda_parity.c — the cuda backend's matmul against a scalar fp64 reference, and every
// CUDA op of model/ops_cuda.h against its CPU twin (the cases of tests/cuda_ops_cases.h), without
// Criterion (for GPU machines that lack it; scripts/gpu_check.sh builds and runs it).
//
//   cuda_parity [--bench]
//
// One line per case: for matmul the dtypes, shape, transposes, the normalised error (max |got -
// want| / max |want|), the worst element; for an op its name, the worst error over its outputs,
// the tolerance and the worst element. Then PASS, FAIL or SKIP (an op whose CPU twin was not
// linked: built with -DCUDA_OPS_NO_HOST_LIBS). Exit status: 0 all passed, 1 a case failed,
// 2 no usable GPU. --bench also times one large bf16 GEMM (informational, never fails).
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/backend.h"
#include "core/common.h"
#include "core/dtype.h"
#include "tests/cuda_ops_cases.h"

static uint64_t rng_state = 12345;
static float rnd_uniform(void) {  // [-1, 1)
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) * (1.0 / 8388608.0)) * 2.0f - 1.0f;
}

// n random values of dtype dt in `host`, and the same (rounded) values as f32 in `f`.
static void fill_random(void *host, float *f, mt_dtype dt, size_t n) {
    for (size_t i = 0; i < n; i++) f[i] = rnd_uniform();
    if (dt == MT_F32) {
        memcpy(host, f, n * sizeof(float));
    } else {
        mt_convert(host, dt, f, MT_F32, n);
        mt_convert(f, MT_F32, host, dt, n);
    }
}

static mt_tensor *tensor2(mt_backend *be, mt_dtype dt, int64_t r, int64_t c) {
    int64_t shape[2] = {r, c};
    mt_tensor *t = mt_tensor_new(be, MT_MEM_ACT, dt, 2, shape);
    if (!t) mt_fatal(MT_EXIT_OOM, "tensor [%lld, %lld]: %s", (long long)r, (long long)c, mt_error_get());
    return t;
}

// Row-major element (i, j) of op(x) where x is stored [rows, cols] and op transposes when t.
static double at(const float *x, int64_t cols, int t, int64_t i, int64_t j) {
    return t ? x[j * cols + i] : x[i * cols + j];
}

// One case; prints its line and returns 1 when it passed.
static int run_case(mt_backend *gpu, int64_t m, int64_t n, int64_t k, int ta, int tb, mt_dtype in,
                    mt_dtype out, float alpha, float beta, double tol) {
    int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    size_t na = (size_t)(ar * ac), nb = (size_t)(br * bc), nc = (size_t)(m * n);
    float *fa = mt_xmalloc(na * 4), *fb = mt_xmalloc(nb * 4), *fc = mt_xmalloc(nc * 4), *got = mt_xmalloc(nc * 4);
    void *ha = mt_xmalloc(mt_dtype_bytes(in, na)), *hb = mt_xmalloc(mt_dtype_bytes(in, nb));
    void *hc = mt_xmalloc(mt_dtype_bytes(out, nc));
    fill_random(ha, fa, in, na);
    fill_random(hb, fb, in, nb);
    fill_random(hc, fc, out, nc);

    mt_tensor *a = tensor2(gpu, in, ar, ac), *b = tensor2(gpu, in, br, bc), *c = tensor2(gpu, out, m, n);
    mt_tensor_upload(a, ha);
    mt_tensor_upload(b, hb);
    mt_tensor_upload(c, hc);
    int rc = mt_matmul(c, a, b, ta, tb, alpha, beta);
    if (rc == 0) {
        mt_tensor_download(c, hc);
        if (out == MT_F32) memcpy(got, hc, nc * 4);
        else mt_convert(got, MT_F32, hc, out, nc);
    }

    double max_diff = 0, max_ref = 0, g = 0, w = 0;
    size_t worst = 0;
    for (int64_t i = 0; rc == 0 && i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0;
            for (int64_t p = 0; p < k; p++) s += at(fa, ac, ta, i, p) * at(fb, bc, tb, p, j);
            double want = alpha * s + (beta != 0.0f ? beta * (double)fc[i * n + j] : 0.0);
            double d = fabs(got[i * n + j] - want);
            if (!(d <= max_diff)) max_diff = d, worst = (size_t)(i * n + j), g = got[i * n + j], w = want;
            if (fabs(want) > max_ref) max_ref = fabs(want);
        }
    double err = max_diff / (max_ref > 0 ? max_ref : 1.0);
    int pass = rc == 0 && err < tol;
    printf("matmul %-4s->%-4s M=%-4lld N=%-4lld K=%-4lld ta=%d tb=%d alpha=%g beta=%g  err=%.3e (tol %.0e)",
           mt_dtype_name(in), mt_dtype_name(out), (long long)m, (long long)n, (long long)k, ta, tb, alpha,
           beta, err, tol);
    if (rc != 0) printf("  error: %s", mt_error_get());
    else printf("  worst [%zu,%zu] got %.6g want %.6g", worst / (size_t)n, worst % (size_t)n, g, w);
    printf("  %s\n", pass ? "PASS" : "FAIL");

    mt_tensor_free(a), mt_tensor_free(b), mt_tensor_free(c);
    free(fa), free(fb), free(fc), free(got), free(ha), free(hb), free(hc);
    return pass;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Times c = a · b^T (the layout of a linear layer) at a size where cuBLASLt should be near peak.
static void bench(mt_backend *gpu, int64_t m, int64_t n, int64_t k) {
    mt_tensor *a = tensor2(gpu, MT_BF16, m, k), *b = tensor2(gpu, MT_BF16, n, k), *c = tensor2(gpu, MT_BF16, m, n);
    gpu->ops->fill_zero(gpu, a->data, a->nbytes);  // values do not matter for cuBLASLt's speed much;
    gpu->ops->fill_zero(gpu, b->data, b->nbytes);  // zeros flatter it a little (less switching power)
    for (int i = 0; i < 3; i++)
        if (mt_matmul(c, a, b, 0, 1, 1.0f, 0.0f) != 0) mt_fatal(MT_EXIT_ERROR, "bench: %s", mt_error_get());
    gpu->ops->synchronize(gpu);
    int iters = 20;
    double t0 = now_s();
    for (int i = 0; i < iters; i++) mt_matmul(c, a, b, 0, 1, 1.0f, 0.0f);
    gpu->ops->synchronize(gpu);
    double dt = (now_s() - t0) / iters;
    printf("bench matmul bf16 M=%lld N=%lld K=%lld (b transposed, zeros): %.3f ms  %.1f TFLOP/s\n", (long long)m,
           (long long)n, (long long)k, dt * 1e3, 2.0 * m * n * k / dt / 1e12);
    mt_tensor_free(a), mt_tensor_free(b), mt_tensor_free(c);
}

int main(int argc, char **argv) {
    int do_bench = argc > 1 && strcmp(argv[1], "--bench") == 0;
    int ndev = mt_cuda_device_count();
    mt_backend *gpu = ndev > 0 ? mt_backend_cuda_new(0) : NULL;
    if (!gpu) {
        if (ndev == 0) mt_backend_cuda_new(0);  // for its message: why there is no GPU
        printf("cuda_parity: SKIP: %s\n", mt_error_get());
        return 2;
    }
    static const int64_t shapes[][3] = {{1, 1, 1}, {7, 13, 5}, {64, 128, 96}, {257, 33, 129}, {3, 1, 200}};
    static const struct { mt_dtype in, out; double tol; } kinds[] = {
        {MT_BF16, MT_BF16, 1e-2}, {MT_BF16, MT_F32, 1e-3}, {MT_F32, MT_F32, 1e-4}};
    int passed = 0, failed = 0;
    for (size_t d = 0; d < MT_ARRAY_LEN(kinds); d++)
        for (size_t s = 0; s < MT_ARRAY_LEN(shapes); s++)
            for (int t = 0; t < 4; t++) {
                int ok = run_case(gpu, shapes[s][0], shapes[s][1], shapes[s][2], t & 1, t >> 1, kinds[d].in,
                                  kinds[d].out, 1.0f, 0.0f, kinds[d].tol);
                *(ok ? &passed : &failed) += 1;
            }
    // alpha/beta, and more distinct shapes than the backend's plan cache holds.
    *(run_case(gpu, 33, 17, 9, 1, 0, MT_F32, MT_F32, 0.5f, 1.5f, 1e-4) ? &passed : &failed) += 1;
    *(run_case(gpu, 33, 17, 9, 0, 1, MT_BF16, MT_BF16, -2.0f, 0.25f, 1e-2) ? &passed : &failed) += 1;
    int cache_fail = 0;
    for (int64_t m = 1; m <= 80; m++)
        cache_fail += !run_case(gpu, m, 9, 17, (int)(m & 1), 0, MT_BF16, MT_F32, 1.0f, 0.0f, 1e-3);
    printf("plan cache: 80 distinct shapes, %d failed\n", cache_fail);
    *(cache_fail ? &failed : &passed) += 1;

    int skipped = 0;
    for (size_t c = 0; c < MT_ARRAY_LEN(co_cases); c++) {
        co_result r = co_cases[c].run(gpu);
        if (r.skipped) {
            printf("op %-38s SKIP (%s)\n", co_cases[c].name, r.what);
            skipped++;
            continue;
        }
        int ok = r.err <= r.tol;
        printf("op %-38s err=%.3e (tol %.0e)  worst %s  %s\n", co_cases[c].name, r.err, r.tol, r.what,
               ok ? "PASS" : "FAIL");
        *(ok ? &passed : &failed) += 1;
    }

    if (do_bench) bench(gpu, 8192, 8192, 8192);
    printf("ledger after the checks (the cuBLASLt workspace stays under work):\n");
    mt_ledger_print(&gpu->ledger, stdout);
    mt_backend_free(gpu);
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
