// core/gemm_rows.h on the GPU (the emulator in `make SIM=1`, whose cuBLASLt stand-in reads the
// grouped layouts' shapes from device memory when the matmul runs): each group's product against
// a double reference from the same bf16 inputs, the rows no group owns left alone, a group
// without rows, no host wait, and the refusal where the library has no grouped matmul. On a GPU
// whose cuBLASLt lacks it, each test checks that refusal instead (a skip would be a failure in
// the GPU check, and the refusal is what that GPU must do).
//
// The offsets are written on the device by a queued upload-and-copy that the host never reads
// back, as the routing's prefix sum will write them.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu_or_skip.h"
#include "core/backend.h"
#include "core/common.h"
#include "core/gemm_rows.h"
#include "core/rng.h"
#include "model/attention_cudnn.h"  // attention_cudnn_emulated: whether the stand-ins run

static float bfr(float x) { return mt_bf16_to_f32(mt_f32_to_bf16(x)); }

// A [rows, cols] tensor of dtype dt with random values, `vals` the values it holds.
static mt_tensor *random_tensor(mt_backend *be, mt_dtype dt, int64_t rows, int64_t cols, uint64_t seed, float **vals) {
    int64_t sh[2] = {rows, cols};
    mt_tensor *t = mt_tensor_new(be, MT_MEM_ACT, dt, 2, sh);
    cr_assert_not_null(t, "%s", mt_error_get());
    mt_rng r;
    mt_rng_seed(&r, seed, 3);
    float *v = mt_xmalloc((size_t)(rows * cols + 1) * sizeof *v);
    for (int64_t i = 0; i < rows * cols; i++) v[i] = dt == MT_BF16 ? bfr(mt_rng_normal(&r)) : mt_rng_normal(&r);
    mt_tensor_upload_f32(t, v);
    *vals = v;
    return t;
}

static float *download(const mt_tensor *t) {
    float *v = mt_xmalloc((size_t)(mt_tensor_numel(t) + 1) * sizeof *v);
    mt_tensor_download_f32(t, v);
    return v;
}

// Device offsets [E+1] from rows per group.
static mt_tensor *offsets(mt_backend *be, const int *rows, int E, int32_t *host) {
    host[0] = 0;
    for (int e = 0; e < E; e++) host[e + 1] = host[e] + rows[e];
    int64_t sh[1] = {E + 1};
    mt_tensor *t = mt_tensor_new(be, MT_MEM_ACT, MT_I32, 1, sh);
    cr_assert_not_null(t, "%s", mt_error_get());
    mt_tensor_upload(t, host);
    return t;
}

static void *scratch(mt_backend *be) {
    void *p = NULL;
    cr_assert_eq(mt_backend_alloc(be, MT_MEM_WORK, MT_GEMM_ROWS_SCRATCH_BYTES, &p), 0, "%s", mt_error_get());
    return p;
}

// be (gpu_or_skip's, in the test's body: tests/cuda_tests.sh lists a test by it); NULL (be freed)
// where its cuBLASLt has no grouped matmul, after checking that a call says so rather than
// computing.
static mt_backend *with_rows(mt_backend *be) {
    char why[200];
    if (mt_gemm_rows_available(be, why, sizeof why)) return be;
    int64_t sh[2] = {2, 8};
    mt_tensor *a = mt_tensor_new(be, MT_MEM_ACT, MT_BF16, 2, sh), *c = mt_tensor_new(be, MT_MEM_ACT, MT_F32, 2, sh);
    const mt_tensor *w[1] = {a};
    char arrays[16];
    cr_assert_eq(mt_gemm_rows(be, c, a, w, 1, 1, NULL, 2, 1.0f, 0.0f, arrays), -1);
    cr_assert(strstr(mt_error_get(), why), "%s (want: %s)", mt_error_get(), why);
    cr_log_info("no grouped matmul here, the refusal checked: %s", why);
    mt_tensor_free(a), mt_tensor_free(c);
    mt_backend_free(be);
    return NULL;
}

static void close_to(double got, double want, double tol, const char *what, int e, int64_t i, int64_t j) {
    cr_assert(fabs(got - want) <= tol * (1.0 + fabs(want)), "%s: group %d, (%lld, %lld): %.7g, want %.7g", what, e,
              (long long)i, (long long)j, got, want);
}

// c[rows e] = alpha · a[rows e] · op(w_e) + beta · c[rows e], c a view of columns [C0, C0 + N) of
// a wider matrix, a's rows padded (16-byte aligned rows, as core/gemm_rows.h asks), two rows past
// the last group: every other element unchanged.
static void forward_case(mt_backend *be, int trans, mt_dtype cdt, float alpha, float beta) {
    if (!be) return;
    enum { E = 5, K = 24, N = 16, LDA = 32, C0 = 8, LDC = N + 16 };
    static const int rows[E] = {3, 0, 7, 1, 5};
    int32_t off[E + 1];
    mt_tensor *doff = offsets(be, rows, E, off);
    const int64_t R = off[E] + 2;
    float *av, *cv, *wv[E];
    mt_tensor *a = random_tensor(be, MT_BF16, R, LDA, 1, &av), *c = random_tensor(be, cdt, R, LDC, 2, &cv);
    mt_tensor *w[E];
    for (int e = 0; e < E; e++) w[e] = random_tensor(be, MT_BF16, trans ? N : K, trans ? K : N, 10 + e, &wv[e]);
    mt_tensor a_view = mt_view2(be, a->data, MT_BF16, R, K, LDA);
    mt_tensor c_view = mt_view2(be, (char *)c->data + mt_dtype_bytes(cdt, C0), cdt, R, N, LDC);
    void *s = scratch(be);
    const uint64_t waits = be->host_syncs;
    cr_assert_eq(mt_gemm_rows(be, &c_view, &a_view, (const mt_tensor *const *)w, trans, E, (const int32_t *)doff->data,
                              off[E], alpha, beta, s), 0, "%s", mt_error_get());
    cr_assert_eq(be->host_syncs, waits, "mt_gemm_rows waited for the device");
    // the same kind of call again (beta 1 adds the product to c once more; the reference below
    // reads c after the second): the heuristic's choice is kept, not asked for again
    const uint64_t asked = mt_gemm_rows_heuristic_calls();
    cr_assert_eq(mt_gemm_rows(be, &c_view, &a_view, (const mt_tensor *const *)w, trans, E, (const int32_t *)doff->data,
                              off[E], alpha, beta, s), 0, "%s", mt_error_get());
    cr_assert_eq(mt_gemm_rows_heuristic_calls(), asked, "the heuristic ran again for the same kind of problem");
    float *got = download(c);
    const double tol = cdt == MT_BF16 ? 8e-3 : 1e-5;
    for (int e = 0; e < E; e++)
        for (int32_t i = off[e]; i < off[e + 1]; i++)
            for (int j = 0; j < N; j++) {
                double acc = 0;
                for (int k = 0; k < K; k++) acc += (double)av[i * LDA + k] * wv[e][trans ? j * K + k : k * N + j];
                double want = (1.0 + beta) * alpha * acc + (beta != 0.0f ? beta * cv[i * LDC + C0 + j] : 0.0);  // two calls
                close_to(got[i * LDC + C0 + j], want, tol, "mt_gemm_rows", e, i, j);
            }
    for (int64_t i = 0; i < R; i++)
        for (int j = 0; j < LDC; j++)
            if (i >= off[E] || j < C0 || j >= C0 + N)
                cr_assert_eq(got[i * LDC + j], cv[i * LDC + j], "element (%lld, %d) outside every group changed",
                             (long long)i, j);
    mt_backend_release(be, MT_MEM_WORK, MT_GEMM_ROWS_SCRATCH_BYTES, s);
    for (int e = 0; e < E; e++) mt_tensor_free(w[e]), free(wv[e]);
    mt_tensor_free(a), mt_tensor_free(c), mt_tensor_free(doff);
    free(av), free(cv), free(got);
    mt_backend_free(be);
}

Test(gemm_rows, trans_f32_accumulates) { forward_case(with_rows(gpu_or_skip()), 1, MT_F32, 0.5f, 1.0f); }
Test(gemm_rows, plain_bf16_overwrites) { forward_case(with_rows(gpu_or_skip()), 0, MT_BF16, 1.0f, 0.0f); }

// g_e = alpha · x[rows e]ᵀ · y[rows e] + beta · g_e, group 1 without rows: beta · g_1.
static void tn_case(mt_backend *be, mt_dtype gdt, float beta) {
    if (!be) return;
    enum { E = 4, M = 12, N = 8, LDX = 16 };
    static const int rows[E] = {5, 0, 9, 2};
    int32_t off[E + 1];
    mt_tensor *doff = offsets(be, rows, E, off);
    const int64_t R = off[E];
    float *xv, *yv, *gv[E];
    mt_tensor *x = random_tensor(be, MT_BF16, R, LDX, 1, &xv), *y = random_tensor(be, MT_BF16, R, N, 2, &yv);
    mt_tensor *g[E];
    for (int e = 0; e < E; e++) g[e] = random_tensor(be, gdt, M, N, 20 + e, &gv[e]);
    mt_tensor x_view = mt_view2(be, x->data, MT_BF16, R, M, LDX);
    void *s = scratch(be);
    const uint64_t waits = be->host_syncs;
    cr_assert_eq(mt_gemm_rows_tn(be, g, &x_view, y, E, (const int32_t *)doff->data, R, 2.0f, beta, s), 0, "%s",
                 mt_error_get());
    cr_assert_eq(be->host_syncs, waits, "mt_gemm_rows_tn waited for the device");
    const double tol = gdt == MT_BF16 ? 8e-3 : 1e-5;
    for (int e = 0; e < E; e++) {
        float *got = download(g[e]);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double acc = 0;
                for (int32_t r = off[e]; r < off[e + 1]; r++) acc += (double)xv[r * LDX + i] * yv[r * N + j];
                close_to(got[i * N + j], 2.0 * acc + beta * gv[e][i * N + j], tol, "mt_gemm_rows_tn", e, i, j);
            }
        free(got);
    }
    mt_backend_release(be, MT_MEM_WORK, MT_GEMM_ROWS_SCRATCH_BYTES, s);
    for (int e = 0; e < E; e++) mt_tensor_free(g[e]), free(gv[e]);
    mt_tensor_free(x), mt_tensor_free(y), mt_tensor_free(doff);
    free(xv), free(yv);
    mt_backend_free(be);
}

Test(gemm_rows, tn_f32_accumulates) { tn_case(with_rows(gpu_or_skip()), MT_F32, 1.0f); }
Test(gemm_rows, tn_bf16_overwrites_an_empty_group) { tn_case(with_rows(gpu_or_skip()), MT_BF16, 0.0f); }

// Shapes that disagree are refused on the host, naming the operand.
Test(gemm_rows, refuses_mismatched_shapes) {
    mt_backend *be = with_rows(gpu_or_skip());
    if (!be) return;
    int64_t sa[2] = {4, 8}, sc[2] = {4, 6}, sw[2] = {6, 7};
    mt_tensor *a = mt_tensor_new(be, MT_MEM_ACT, MT_BF16, 2, sa), *c = mt_tensor_new(be, MT_MEM_ACT, MT_F32, 2, sc);
    mt_tensor *w = mt_tensor_new(be, MT_MEM_ACT, MT_BF16, 2, sw);
    void *s = scratch(be);
    const mt_tensor *ws[1] = {w};
    const int32_t *dummy_off = (const int32_t *)s;  // device memory: never read, the call refuses first
    cr_assert_eq(mt_gemm_rows(be, c, a, ws, 1, 1, NULL, 4, 1.0f, 0.0f, s), -1);
    cr_assert(strstr(mt_error_get(), "no offsets"), "%s", mt_error_get());
    cr_assert_eq(mt_gemm_rows(be, c, a, ws, 1, 1, dummy_off, 4, 1.0f, 0.0f, s), -1);
    cr_assert(strstr(mt_error_get(), "op(w) is [7, 6]"), "%s", mt_error_get());
    cr_assert_eq(mt_gemm_rows(be, c, a, ws, 1, 0, NULL, 4, 1.0f, 0.0f, s), -1);
    cr_assert(strstr(mt_error_get(), "0 groups"), "%s", mt_error_get());
    // rows 12 bytes apart: a group's rows would start anywhere, which the grouped matmul is not asked to read
    mt_tensor a6 = mt_view2(be, a->data, MT_BF16, 4, 6, 6), c6 = mt_view2(be, c->data, MT_F32, 4, 6, 8);
    mt_tensor w66 = mt_view2(be, w->data, MT_BF16, 6, 6, 8);
    const mt_tensor *w6[1] = {&w66};
    cr_assert_eq(mt_gemm_rows(be, &c6, &a6, w6, 1, 1, dummy_off, 4, 1.0f, 0.0f, s), -1);
    cr_assert(strstr(mt_error_get(), "16-byte aligned"), "%s", mt_error_get());
    mt_backend_release(be, MT_MEM_WORK, MT_GEMM_ROWS_SCRATCH_BYTES, s);
    mt_tensor_free(a), mt_tensor_free(c), mt_tensor_free(w);
    mt_backend_free(be);
}

// A cuBLASLt without the grouped matmul for Hopper (the stand-in told to claim 13.1.0): the
// availability says so, with the version, and the call refuses rather than guess. On a GPU, the
// answer must agree with the library's version, whichever it is.
Test(gemm_rows, says_why_when_the_library_lacks_it) {
    mt_backend *be = gpu_or_skip();
#ifdef MT_CUDA
    char why[200];
    if (attention_cudnn_emulated()) setenv("CUDASIM_CUBLASLT_VERSION", "130100", 1);
    const int ok = mt_gemm_rows_available(be, why, sizeof why);
    if (attention_cudnn_emulated()) {
        cr_assert_eq(ok, 0, "available under a claimed 13.1.0: %s", why);
        cr_assert(strstr(why, "13.1.0") && strstr(why, "13.4"), "%s", why);
        int64_t sh[2] = {2, 8};
        mt_tensor *a = mt_tensor_new(be, MT_MEM_ACT, MT_BF16, 2, sh), *c = mt_tensor_new(be, MT_MEM_ACT, MT_F32, 2, sh);
        const mt_tensor *w[1] = {a};
        char dummy[16];
        cr_assert_eq(mt_gemm_rows(be, c, a, w, 1, 1, NULL, 2, 1.0f, 0.0f, dummy), -1);
        cr_assert(strstr(mt_error_get(), "mt_gemm_rows") && strstr(mt_error_get(), "13.1.0"), "%s", mt_error_get());
        unsetenv("CUDASIM_CUBLASLT_VERSION");
        cr_assert_eq(mt_gemm_rows_available(be, why, sizeof why), 1, "%s", why);
        mt_tensor_free(a), mt_tensor_free(c);
    } else {
        cr_assert(strstr(why, "cuBLASLt") || strstr(why, "compute capability"), "%s", why);
        cr_log_info("gemm_rows on this GPU: %s (%s)", ok ? "available" : "not available", why);
    }
#endif
    mt_backend_free(be);
}
