// model/grouped.h's grouped GEMMs on the GPU (the emulator in `make SIM=1`) against an fp32
// reference built on the CPU from the same bf16-rounded inputs and the same weights: a 4-bit W
// quantized from the same floats on the cpu backend and dequantized there
// (mt_qweight_dequantize_rows_cpu, bit for bit what the device dequantizes: tests/test_quant_cuda.c),
// rounded to bf16 as the kernel stages it. Dropout masks come from lora/lora_dropout.h.
//
// Numeric tests skip, saying why, in a CPU build or without a GPU (each calls gpu_or_skip() in its
// body: tests/cudasim/run.sh counts such tests as CUDA tests, where a skip fails); the refusal
// tests run on the null and cpu backends in every build.
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "tests/gpu_or_skip.h"
#include "core/backend.h"
#include "core/common.h"
#include "core/gemm_rows.h"
#include "core/rng.h"
#include "lora/lora_dropout.h"
#include "model/attention_cudnn.h"  // attention_cudnn_emulated: whether the stand-ins run
#include "model/expert_scratch.h"
#include "model/grouped.h"
#include "quant/qweight.h"

enum { GK_NF4, GK_NF4_DQ, GK_FP4, GK_INT4, GK_DENSE, GK_SKIP };  // expert e's W

static float bfr(float x) { return mt_bf16_to_f32(mt_f32_to_bf16(x)); }

static float *randn(int64_t n, uint64_t seed, float scale) {
    mt_rng r;
    mt_rng_seed(&r, seed, 7);
    float *f = mt_xmalloc((size_t)(n ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) f[i] = mt_rng_normal(&r) * scale;
    return f;
}

// f32 host values into a new tensor [rows, cols] of dtype dt on be, rounded as dt stores them;
// `vals` is rounded in place to what was stored.
static mt_tensor *upload(mt_backend *be, mt_dtype dt, float *vals, int64_t rows, int64_t cols) {
    int64_t sh[2] = {rows, cols};
    mt_tensor *t = mt_tensor_new(be, MT_MEM_ACT, dt, 2, sh);
    cr_assert_not_null(t, "%s", mt_error_get());
    if (dt == MT_BF16)
        for (int64_t i = 0; i < rows * cols; i++) vals[i] = bfr(vals[i]);
    mt_tensor_upload_f32(t, vals);
    return t;
}

typedef struct gcase {
    int E;
    const int *rows;   // [E]
    const int *kind;   // [E] GK_*
    int64_t row0;      // off[0]
    int K, N, trans, blocksize;
    mt_dtype cdt;
    int c_col;         // C is columns [c_col, c_col + N) of a [R, N + 2·c_col] matrix (0: dense)
    int a_pad;         // A's row stride K + a_pad
    float alpha, beta, p;
    int drop_a;        // with p > 0: dropout on A, else on C
} gcase;

// Runs one mt_grouped_gemm case and checks every element of the wide C: the experts' rows in the
// view against the reference, everything else unchanged (bit for bit).
static void run_gemm(mt_backend *gpu, const gcase *t) {
    mt_backend *cpu = mt_backend_cpu_new();
    const int E = t->E, K = t->K, N = t->N, lda = K + t->a_pad, ldc = N + 2 * t->c_col;
    int64_t off[MT_GROUPED_MAX + 1];
    off[0] = t->row0;
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + t->rows[e];
    const int64_t R = off[E] + 2;  // two rows past the last expert: not touched
    uint64_t seeds[MT_GROUPED_MAX];
    for (int e = 0; e < E; e++) seeds[e] = 1000 + 17 * (uint64_t)e;

    float *a = randn(R * lda, 1, 1.0f), *c0 = randn(R * ldc, 2, 1.0f);
    mt_tensor *ta = upload(gpu, MT_BF16, a, R, lda), *tc = upload(gpu, t->cdt, c0, R, ldc);
    mt_tensor av = mt_view2(gpu, ta->data, MT_BF16, R, K, lda);
    mt_tensor cv = mt_view2(gpu, (char *)tc->data + (size_t)t->c_col * mt_dtype_bytes(t->cdt, 1), t->cdt, R, N, ldc);

    // W per expert: op(W) (k, n) in wref[e][k·N + n] as the kernel sees it (bf16 values).
    const int64_t wout = t->trans ? N : K, win = t->trans ? K : N;
    mt_qweight qg[MT_GROUPED_MAX];
    const mt_qweight *qp[MT_GROUPED_MAX];
    mt_tensor *wt[MT_GROUPED_MAX];
    const mt_tensor *wp[MT_GROUPED_MAX];
    float **wref = mt_xmalloc((size_t)E * sizeof(float *));
    for (int e = 0; e < E; e++) {
        qp[e] = NULL, wp[e] = NULL, wt[e] = NULL, wref[e] = NULL;
        const int kd = t->kind[e];
        if (kd == GK_SKIP) continue;
        float *w = randn(wout * win, 100 + (uint64_t)e, 0.5f), *deq = mt_xmalloc((size_t)(wout * win) * sizeof(float));
        if (kd == GK_DENSE) {
            wt[e] = upload(gpu, MT_BF16, w, wout, win);
            wp[e] = wt[e];
            memcpy(deq, w, (size_t)(wout * win) * sizeof(float));
        } else {
            mt_quant qt = kd == GK_FP4 ? MT_QUANT_FP4 : kd == GK_INT4 ? MT_QUANT_INT4 : MT_QUANT_NF4;
            int dq = kd == GK_NF4_DQ;
            mt_qweight qc;
            cr_assert_eq(mt_qweight_quantize(&qc, cpu, "w", w, wout, win, qt, t->blocksize, dq), 0, "%s",
                         mt_error_get());
            cr_assert_eq(mt_qweight_quantize(&qg[e], gpu, "w", w, wout, win, qt, t->blocksize, dq), 0, "%s",
                         mt_error_get());
            mt_qweight_dequantize_rows_cpu(&qc, deq, 0, wout);
            for (int64_t i = 0; i < wout * win; i++) deq[i] = bfr(deq[i]);
            mt_qweight_free(&qc);
            qp[e] = &qg[e];
        }
        wref[e] = mt_xmalloc((size_t)(K * N) * sizeof(float));
        for (int k = 0; k < K; k++)
            for (int n = 0; n < N; n++)
                wref[e][k * N + n] = t->trans ? deq[(int64_t)n * K + k] : deq[(int64_t)k * N + n];
        free(w), free(deq);
    }

    mt_grouped g = {.experts = E, .off = off, .q = qp, .w = wp, .trans = t->trans, .alpha = t->alpha,
                    .beta = t->beta, .seed = t->p > 0 ? seeds : NULL, .p = t->p, .drop_a = t->drop_a};
    cr_assert_eq(mt_grouped_gemm(&cv, &av, &g), 0, "mt_grouped_gemm: %s", mt_error_get());
    float *got = mt_xmalloc((size_t)(R * ldc) * sizeof(float));
    mt_tensor_download_f32(tc, got);

    double worst = 0;
    int64_t checked = 0, dropped = 0, worst_at = -1;
    for (int64_t r = 0; r < R; r++) {
        int e = -1;
        for (int j = 0; j < E; j++)
            if (r >= off[j] && r < off[j + 1] && t->kind[j] != GK_SKIP) e = j;
        for (int j = 0; j < ldc; j++) {
            const float have = got[r * ldc + j], old = c0[r * ldc + j];
            const int n = j - t->c_col;
            if (e < 0 || n < 0 || n >= N) {
                cr_assert(memcmp(&have, &old, 4) == 0,
                          "row %lld column %d (no expert's or outside the view) changed: %g -> %g", (long long)r, j,
                          (double)old, (double)have);
                continue;
            }
            const int64_t rl = r - off[e];
            double acc = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                float x = a[r * lda + k];
                if (t->p > 0 && t->drop_a) x = bfr(x * mt_lora_dropout_factor(seeds[e], t->p, (uint64_t)(rl * K + k)));
                acc += (double)x * wref[e][k * N + n];
                mag += fabs((double)x * wref[e][k * N + n]);
            }
            float v = (float)acc;
            if (t->p > 0 && !t->drop_a) {
                float f = mt_lora_dropout_factor(seeds[e], t->p, (uint64_t)(rl * N + n));
                dropped += f == 0.0f;
                v *= f;
                mag *= f;
            }
            v = v * t->alpha + t->beta * old;
            double tol = 1e-5 * mag * fabs(t->alpha) + 1e-6 * fabs(t->beta * old) + 1e-30;
            // bf16 output: one unit in the last place, 2^-7·|v| (8 significant bits). Half of that is one
            // correct rounding; cuBLAS on the H100 came 0.75 ulp off (2026-11-27: its epilogue may round twice).
            if (t->cdt == MT_BF16) tol += fabs(v) / 128.0;
            double err = fabs((double)have - v) / tol;
            checked++;
            if (!(err <= worst)) worst = err, worst_at = r * ldc + j;  // NaN counts as worst
        }
    }
    if (getenv("GG_PRINT"))
        fprintf(stderr, "checked %lld, dropped %lld, worst %.3f of tol\n", (long long)checked, (long long)dropped,
                worst);
    cr_assert_gt(checked, 0, "no element checked");
    if (t->p > 0 && !t->drop_a) cr_assert_gt(dropped, 0, "dropout on C dropped nothing: the mask is not exercised");
    cr_assert(worst <= 1.0, "worst element (row %lld, column %lld) %g, reference off by %.2f of the tolerance",
              (long long)(worst_at / ldc), (long long)(worst_at % ldc), (double)got[worst_at], worst);

    for (int e = 0; e < E; e++) {
        if (qp[e]) mt_qweight_free(&qg[e]);
        if (wt[e]) mt_tensor_free(wt[e]);
        free(wref[e]);
    }
    free(wref), free(a), free(c0), free(got);
    mt_tensor_free(ta), mt_tensor_free(tc);
    cr_expect_eq(gpu->ledger.cur[MT_MEM_ACT], 0, "test buffers left in the ledger");
    mt_backend_free(gpu), mt_backend_free(cpu);
}

static const int rows5[] = {0, 1, 17, 33, 5};

#define ALL5(k) ((const int[]){k, k, k, k, k})

Test(cuda_grouped, nf4_trans_f32) {
    mt_backend *gpu = gpu_or_skip();
    run_gemm(gpu, &(gcase){.E = 5, .rows = rows5, .kind = ALL5(GK_NF4), .K = 40, .N = 24, .trans = 1, .blocksize = 64,
                           .cdt = MT_F32, .alpha = 1, .beta = 0});
}
Test(cuda_grouped, nf4_double_quant_no_trans_bf16_beta1_alpha) {
    mt_backend *gpu = gpu_or_skip();
    run_gemm(gpu, &(gcase){.E = 5, .rows = rows5, .kind = ALL5(GK_NF4_DQ), .row0 = 3, .K = 40, .N = 24, .trans = 0,
                           .blocksize = 32, .cdt = MT_BF16, .alpha = 0.5f, .beta = 1});
}
Test(cuda_grouped, fp4_trans_c_view_beta1) {
    mt_backend *gpu = gpu_or_skip();
    run_gemm(gpu, &(gcase){.E = 5, .rows = rows5, .kind = ALL5(GK_FP4), .K = 40, .N = 24, .trans = 1, .blocksize = 64,
                           .cdt = MT_F32, .c_col = 5, .a_pad = 3, .alpha = 1, .beta = 1});
}
Test(cuda_grouped, int4_no_trans_dropout_on_c) {
    mt_backend *gpu = gpu_or_skip();
    run_gemm(gpu, &(gcase){.E = 5, .rows = rows5, .kind = ALL5(GK_INT4), .K = 40, .N = 24, .trans = 0, .blocksize = 128,
                           .cdt = MT_F32, .alpha = 2, .beta = 0, .p = 0.3f});
}
Test(cuda_grouped, int4_trans_bf16_view) {
    mt_backend *gpu = gpu_or_skip();
    run_gemm(gpu, &(gcase){.E = 5, .rows = rows5, .kind = ALL5(GK_INT4), .K = 40, .N = 24, .trans = 1, .blocksize = 32,
                           .cdt = MT_BF16, .c_col = 3, .alpha = 1, .beta = 1});
}
Test(cuda_grouped, dense_trans_dropout_on_a) {
    mt_backend *gpu = gpu_or_skip();
    run_gemm(gpu, &(gcase){.E = 5, .rows = rows5, .kind = ALL5(GK_DENSE), .K = 40, .N = 24, .trans = 1, .cdt = MT_BF16,
                           .alpha = 1.5f, .beta = 0, .p = 0.25f, .drop_a = 1});
}
Test(cuda_grouped, dense_no_trans_dropout_on_c_beta1) {
    mt_backend *gpu = gpu_or_skip();
    run_gemm(gpu, &(gcase){.E = 5, .rows = rows5, .kind = ALL5(GK_DENSE), .K = 40, .N = 24, .trans = 0, .cdt = MT_F32,
                           .c_col = 2, .alpha = 1, .beta = 1, .p = 0.5f});
}
// A layer mixing frozen 4-bit experts with dense ones, and an expert with rows but no W (skipped:
// its rows of C untouched).
Test(cuda_grouped, mixed_and_skipped_expert) {
    mt_backend *gpu = gpu_or_skip();
    run_gemm(gpu, &(gcase){.E = 5, .rows = (const int[]){3, 1, 17, 33, 5},
                           .kind = (const int[]){GK_NF4, GK_DENSE, GK_SKIP, GK_INT4, GK_DENSE}, .K = 40, .N = 24,
                           .trans = 1, .blocksize = 64, .cdt = MT_F32, .alpha = 1, .beta = 1});
}
// Several row tiles, K steps and column tiles, none of them whole; the dropout's index across them.
Test(cuda_grouped, nf4_dq_tiles_k72_n80_dropout_on_c) {
    mt_backend *gpu = gpu_or_skip();
    run_gemm(gpu, &(gcase){.E = 2, .rows = (const int[]){70, 3}, .kind = (const int[]){GK_NF4_DQ, GK_FP4}, .K = 72,
                           .N = 80, .trans = 0, .blocksize = 64, .cdt = MT_F32, .alpha = 1, .beta = 0, .p = 0.3f});
}
// 128 experts of 0..3 rows each, every one with its own W: the block's expert lookup.
Test(cuda_grouped, many_experts_e128) {
    int rows[128], kind[128];
    for (int e = 0; e < 128; e++) rows[e] = (e * 7) % 4, kind[e] = e % 3 ? GK_NF4 : GK_DENSE;
    mt_backend *gpu = gpu_or_skip();
    run_gemm(gpu, &(gcase){.E = 128, .rows = rows, .kind = kind, .row0 = 1, .K = 24, .N = 16, .trans = 1,
                           .blocksize = 64, .cdt = MT_F32, .alpha = 1, .beta = 0});
}

// ---------------------------------------------------------------------------------------------
// mt_grouped_gemm_tn: G_e = alpha · X_eᵀ · drop(Y_e) + beta · G_e

typedef struct gtcase {
    int E;
    const int *rows;
    int M, N, x_pad;
    mt_dtype gdt;
    float alpha, beta, p;
    int null_g;  // this expert's g is NULL (not wanted)
} gtcase;

static void run_tn(mt_backend *gpu, const gtcase *t) {
    const int E = t->E, M = t->M, N = t->N, ldx = M + t->x_pad;
    int64_t off[MT_GROUPED_MAX + 1];
    off[0] = 2;
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + t->rows[e];
    const int64_t R = off[E] + 1;
    uint64_t seeds[MT_GROUPED_MAX];
    for (int e = 0; e < E; e++) seeds[e] = 77 + 3 * (uint64_t)e;
    float *x = randn(R * ldx, 11, 1.0f), *y = randn(R * N, 12, 1.0f);
    mt_tensor *tx = upload(gpu, MT_BF16, x, R, ldx), *ty = upload(gpu, MT_BF16, y, R, N);
    mt_tensor xv = mt_view2(gpu, tx->data, MT_BF16, R, M, ldx);
    mt_tensor *tg[MT_GROUPED_MAX];
    float *g0[MT_GROUPED_MAX];
    for (int e = 0; e < E; e++) {
        g0[e] = randn(M * N, 20 + (uint64_t)e, 1.0f);
        if (t->rows[e] == 0) g0[e][0] = -0.0f;  // beta 1 must leave it, bit for bit (0 + -0 would be +0)
        tg[e] = upload(gpu, t->gdt, g0[e], M, N);
    }
    mt_tensor *gp[MT_GROUPED_MAX];
    for (int e = 0; e < E; e++) gp[e] = e == t->null_g ? NULL : tg[e];
    mt_grouped gr = {.experts = E, .off = off, .alpha = t->alpha, .beta = t->beta, .seed = t->p > 0 ? seeds : NULL,
                     .p = t->p};
    cr_assert_eq(mt_grouped_gemm_tn(gp, &xv, ty, &gr), 0, "mt_grouped_gemm_tn: %s", mt_error_get());

    float *got = mt_xmalloc((size_t)(M * N) * sizeof(float));
    double worst = 0;
    int64_t dropped = 0;
    for (int e = 0; e < E; e++) {
        mt_tensor_download_f32(tg[e], got);
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                const float have = got[m * N + n], old = g0[e][m * N + n];
                if (!gp[e] || (t->rows[e] == 0 && t->beta != 0)) {  // skipped, or beta·G_e = G_e: untouched
                    cr_assert(memcmp(&have, &old, 4) == 0, "expert %d: G[%d][%d] changed %g -> %g", e, m, n,
                              (double)old, (double)have);
                    continue;
                }
                double acc = 0, mag = 0;
                for (int64_t r = off[e]; r < off[e + 1]; r++) {
                    float yv = y[r * N + n];
                    if (t->p > 0) {
                        float f = mt_lora_dropout_factor(seeds[e], t->p, (uint64_t)((r - off[e]) * N + n));
                        dropped += f == 0.0f;
                        yv = bfr(yv * f);
                    }
                    acc += (double)x[r * ldx + m] * yv;
                    mag += fabs((double)x[r * ldx + m] * yv);
                }
                float v = (float)acc * t->alpha + t->beta * old;
                double tol = 1e-5 * mag * fabs(t->alpha) + 1e-6 * fabs(t->beta * old) + 1e-30;
                // bf16 G: a rounding of every bf16 value on the way, the partial sums (up to mag) and the
                // result. cuBLAS's grouped GEMM on the H100 came 3.5 times a one-rounding bound off here
                // with beta = 1 (2026-11-27), as if alpha·XᵀY were rounded to bf16 before beta·G is added.
                if (t->gdt == MT_BF16) tol += (fabs(t->alpha) * mag + fabs(v)) / 256.0;
                double err = fabs((double)have - v) / tol;
                cr_assert(err <= 1.0, "expert %d: G[%d][%d] = %g, reference %g (%.2f of the tolerance)", e, m, n,
                          (double)have, (double)v, err);
                if (err > worst) worst = err;
            }
    }
    if (getenv("GG_PRINT")) fprintf(stderr, "tn: dropped %lld, worst %.3f of tol\n", (long long)dropped, worst);
    if (t->p > 0) cr_assert_gt(dropped, 0, "dropout on Y dropped nothing: the mask is not exercised");
    for (int e = 0; e < E; e++) mt_tensor_free(tg[e]), free(g0[e]);
    free(x), free(y), free(got);
    mt_tensor_free(tx), mt_tensor_free(ty);
    cr_expect_eq(gpu->ledger.cur[MT_MEM_ACT], 0, "test buffers left in the ledger");
    mt_backend_free(gpu);
}

Test(cuda_grouped, tn_f32_beta0_dropout_on_y) {
    mt_backend *gpu = gpu_or_skip();
    run_tn(gpu, &(gtcase){.E = 5, .rows = rows5, .M = 24, .N = 40, .x_pad = 3, .gdt = MT_F32, .alpha = 1, .beta = 0,
                          .p = 0.3f, .null_g = -1});
}
Test(cuda_grouped, tn_bf16_beta1_alpha_null_g) {
    mt_backend *gpu = gpu_or_skip();
    run_tn(gpu, &(gtcase){.E = 5, .rows = rows5, .M = 40, .N = 24, .gdt = MT_BF16, .alpha = 0.5f, .beta = 1,
                          .null_g = 3});
}
Test(cuda_grouped, tn_tiles_m80_n72_rows70_dropout) {
    mt_backend *gpu = gpu_or_skip();
    run_tn(gpu, &(gtcase){.E = 2, .rows = (const int[]){70, 0}, .M = 80, .N = 72, .gdt = MT_F32, .alpha = 1, .beta = 0,
                          .p = 0.2f, .null_g = -1});
}

// ---------------------------------------------------------------------------------------------
// Refusals and the backends that do not compute (every build)

Test(cuda_grouped, refusals_name_the_tensor) {
    mt_backend *nb = mt_backend_null_new(), *cpu = mt_backend_cpu_new();
    int64_t off[3] = {0, 2, 5}, sa[2] = {5, 8}, sc[2] = {5, 4}, sw[2] = {4, 8};
    mt_tensor *a = mt_tensor_new(nb, MT_MEM_ACT, MT_BF16, 2, sa), *a32 = mt_tensor_new(nb, MT_MEM_ACT, MT_F32, 2, sa);
    mt_tensor *c = mt_tensor_new(nb, MT_MEM_ACT, MT_F32, 2, sc), *w = mt_tensor_new(nb, MT_MEM_ACT, MT_BF16, 2, sw);
    mt_tensor *c16 = mt_tensor_new(nb, MT_MEM_ACT, MT_F16, 2, sc);
    const mt_tensor *ws[2] = {w, w};
    mt_grouped g = {.experts = 2, .off = off, .w = ws, .trans = 1, .alpha = 1, .beta = 0};
    cr_assert_eq(mt_grouped_gemm(c, a, &g), 0, "null backend: %s", mt_error_get());  // counted step: nothing done
    cr_assert_eq(mt_grouped_gemm(c, a32, &g), -1);
    cr_assert(strstr(mt_error_get(), "a is f32"), "%s", mt_error_get());
    cr_assert_eq(mt_grouped_gemm(c16, a, &g), -1);
    cr_assert(strstr(mt_error_get(), "c is f16"), "%s", mt_error_get());
    g.trans = 0;  // W must then be [K, N] = [8, 4]
    cr_assert_eq(mt_grouped_gemm(c, a, &g), -1);
    cr_assert(strstr(mt_error_get(), "w[0]"), "%s", mt_error_get());
    g.trans = 1;
    int64_t bad_off[3] = {0, 4, 3};
    g.off = bad_off;
    cr_assert_eq(mt_grouped_gemm(c, a, &g), -1);
    cr_assert(strstr(mt_error_get(), "off[2]"), "%s", mt_error_get());
    int64_t long_off[3] = {0, 2, 6};
    g.off = long_off;
    cr_assert_eq(mt_grouped_gemm(c, a, &g), -1);
    cr_assert(strstr(mt_error_get(), "a has 5 rows"), "%s", mt_error_get());
    g.off = off;
    g.beta = 0.5f;
    cr_assert_eq(mt_grouped_gemm(c, a, &g), -1);
    cr_assert(strstr(mt_error_get(), "beta"), "%s", mt_error_get());
    g.beta = 0;
    g.experts = MT_GROUPED_MAX + 1;
    cr_assert_eq(mt_grouped_gemm(c, a, &g), -1);
    cr_assert(strstr(mt_error_get(), "experts"), "%s", mt_error_get());
    g.experts = 2;
    // tn: x [5, 8], y [5, 4] -> g_e [8, 4]
    int64_t sg[2] = {8, 4};
    mt_tensor *gt = mt_tensor_new(nb, MT_MEM_ACT, MT_F32, 2, sg), *g16 = mt_tensor_new(nb, MT_MEM_ACT, MT_F16, 2, sg);
    mt_tensor *y = mt_tensor_new(nb, MT_MEM_ACT, MT_BF16, 2, sc);
    mt_tensor *gs[2] = {gt, NULL}, *gbad[2] = {NULL, g16};
    cr_assert_eq(mt_grouped_gemm_tn(gs, a, y, &g), 0, "null backend: %s", mt_error_get());
    cr_assert_eq(mt_grouped_gemm_tn(gbad, a, y, &g), -1);
    cr_assert(strstr(mt_error_get(), "g[1] is f16"), "%s", mt_error_get());
    cr_assert_eq(mt_grouped_gemm_tn(gs, a, c, &g), -1);
    cr_assert(strstr(mt_error_get(), "y is f32"), "%s", mt_error_get());
    // cpu: refused, whatever the arguments
    mt_tensor *ac = mt_tensor_new(cpu, MT_MEM_ACT, MT_BF16, 2, sa), *cc = mt_tensor_new(cpu, MT_MEM_ACT, MT_F32, 2, sc);
    cr_assert_eq(mt_grouped_gemm(cc, ac, &g), -1);
    cr_assert(strstr(mt_error_get(), "GPU step"), "%s", mt_error_get());
    mt_tensor_free(ac), mt_tensor_free(cc);
    mt_tensor_free(gt), mt_tensor_free(g16), mt_tensor_free(y);
    mt_tensor_free(a), mt_tensor_free(a32), mt_tensor_free(c), mt_tensor_free(c16), mt_tensor_free(w);
    mt_backend_free(nb), mt_backend_free(cpu);
}

// ---------------------------------------------------------------------------------------------
// w1‖w3 stacked (q2): one GEMM of N = 2f forward, K = 2f for dx, equal to two GEMMs on the halves

static mt_tensor *zeros(mt_backend *be, mt_dtype dt, int64_t rows, int64_t cols) {
    int64_t sh[2] = {rows, cols};
    mt_tensor *t = mt_tensor_new(be, MT_MEM_ACT, dt, 2, sh);
    cr_assert_not_null(t, "%s", mt_error_get());
    be->ops->fill_zero(be, t->data, t->nbytes);
    return t;
}

static float *down(const mt_tensor *t) {
    float *h = mt_xmalloc((size_t)mt_tensor_numel(t) * sizeof(float));
    mt_tensor_download_f32(t, h);
    return h;
}

Test(cuda_grouped, stacked_w1_w3_equals_two_halves) {
    mt_backend *gpu = gpu_or_skip();
    enum { E = 3, D = 40, F = 24 };
    const int rows[E] = {7, 0, 12};
    int64_t off[E + 1] = {2};
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + rows[e];
    const int64_t R = off[E] + 1;
    mt_qweight q1[E], q3[E];
    const mt_qweight *p1[E], *p3[E];
    for (int e = 0; e < E; e++) {
        float *w1 = randn(F * D, 50 + (uint64_t)e, 0.5f), *w3 = randn(F * D, 70 + (uint64_t)e, 0.5f);
        cr_assert_eq(mt_qweight_quantize(&q1[e], gpu, "w1", w1, F, D, MT_QUANT_NF4, 64, 1), 0, "%s", mt_error_get());
        cr_assert_eq(mt_qweight_quantize(&q3[e], gpu, "w3", w3, F, D, MT_QUANT_NF4, 64, 1), 0, "%s", mt_error_get());
        p1[e] = &q1[e], p3[e] = &q3[e];
        free(w1), free(w3);
    }
    float *x = randn(R * D, 3, 1.0f), *dgu = randn(R * 2 * F, 4, 1.0f);
    mt_tensor *tx = upload(gpu, MT_BF16, x, R, D), *tdgu = upload(gpu, MT_BF16, dgu, R, 2 * F);

    // Forward: gu = x·[W1;W3]ᵀ in one call, against g = x·W1ᵀ and u = x·W3ᵀ into gu's halves.
    mt_tensor *one = zeros(gpu, MT_F32, R, 2 * F), *two = zeros(gpu, MT_F32, R, 2 * F);
    mt_grouped g = {.experts = E, .off = off, .q = p1, .q2 = p3, .trans = 1, .alpha = 1, .beta = 0};
    size_t work0 = gpu->ledger.cur[MT_MEM_WORK];
    mt_ledger_reset_peak(&gpu->ledger);
    cr_assert_eq(mt_grouped_gemm(one, tx, &g), 0, "%s", mt_error_get());
    cr_expect_eq(gpu->ledger.cur[MT_MEM_WORK], work0, "the scratch is released");
    cr_expect_geq(gpu->ledger.peak[MT_MEM_WORK], work0 + (size_t)mt_expert_dequant_scratch_bytes(D, F, E, 0, 0, 0),
                  "two slots of E [2f, d] bf16 held during the call (small experts: a slot holds them all)");
    mt_tensor gh = mt_view2(gpu, two->data, MT_F32, R, F, 2 * F);
    mt_tensor uh = mt_view2(gpu, (float *)two->data + F, MT_F32, R, F, 2 * F);
    mt_grouped h = {.experts = E, .off = off, .q = p1, .trans = 1, .alpha = 1, .beta = 0};
    cr_assert_eq(mt_grouped_gemm(&gh, tx, &h), 0, "%s", mt_error_get());
    h.q = p3;
    cr_assert_eq(mt_grouped_gemm(&uh, tx, &h), 0, "%s", mt_error_get());
    float *a = down(one), *b = down(two);
    for (int64_t i = 0; i < R * 2 * F; i++)
        cr_assert_leq(fabsf(a[i] - b[i]), 1e-5f * (1.0f + fabsf(b[i])), "gu[%lld]: stacked %g, halves %g", (long long)i,
                      (double)a[i], (double)b[i]);
    free(a), free(b);

    // dx += dgu·[W1;W3] (K = 2f) in one call, against dg·W1 + du·W3.
    mt_tensor *dx1 = zeros(gpu, MT_F32, R, D), *dx2 = zeros(gpu, MT_F32, R, D);
    g.trans = 0, g.beta = 1;
    cr_assert_eq(mt_grouped_gemm(dx1, tdgu, &g), 0, "%s", mt_error_get());
    mt_tensor dg = mt_view2(gpu, tdgu->data, MT_BF16, R, F, 2 * F);
    mt_tensor du = mt_view2(gpu, (mt_bf16 *)tdgu->data + F, MT_BF16, R, F, 2 * F);
    h.trans = 0, h.beta = 1, h.q = p1;
    cr_assert_eq(mt_grouped_gemm(dx2, &dg, &h), 0, "%s", mt_error_get());
    h.q = p3;
    cr_assert_eq(mt_grouped_gemm(dx2, &du, &h), 0, "%s", mt_error_get());
    a = down(dx1), b = down(dx2);
    double norm = 0;
    for (int64_t i = 0; i < R * D; i++) norm += fabs(b[i]);
    cr_assert_gt(norm, 0, "dx was computed");
    for (int64_t i = 0; i < R * D; i++)
        cr_assert_leq(fabsf(a[i] - b[i]), 1e-5f * (1.0f + fabsf(b[i])), "dx[%lld]: stacked %g, halves %g", (long long)i,
                      (double)a[i], (double)b[i]);
    free(a), free(b);

    // A stacked W needs both halves, of one `in`.
    p3[2] = NULL;
    cr_assert_eq(mt_grouped_gemm(dx1, tdgu, &g), -1);
    cr_assert(strstr(mt_error_get(), "q2"), "%s", mt_error_get());
    p3[2] = &q3[2];
    for (int e = 0; e < E; e++) mt_qweight_free(&q1[e]), mt_qweight_free(&q3[e]);
    mt_tensor_free(tx), mt_tensor_free(tdgu), mt_tensor_free(one), mt_tensor_free(two);
    mt_tensor_free(dx1), mt_tensor_free(dx2);
    free(x), free(dgu);
    mt_backend_free(gpu);
}

// Rows under W (grouped.h's under: w2's LoRA A under its W2 in the folded backward):
// [dy | z]·[W; U] in one call equals dy·W + z·U in two, on the grouped path (several small experts
// with rows) and the per-expert one (one expert with rows); the slots hold the extra rows; an
// under without a 4-bit W or of the wrong width is refused naming it.
static void under_case(mt_backend *gpu, const int *rows) {
    enum { E = 3, D = 40, F = 24, RU = 8 };
    int64_t off[E + 1] = {1};
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + rows[e];
    const int64_t R = off[E] + 2;
    mt_qweight q[E];
    const mt_qweight *pq[E];
    mt_tensor *u[E];
    const mt_tensor *pu[E];
    for (int e = 0; e < E; e++) {
        float *w = randn(D * F, 90 + (uint64_t)e, 0.5f), *uv = randn(RU * F, 95 + (uint64_t)e, 0.5f);
        cr_assert_eq(mt_qweight_quantize(&q[e], gpu, "w2", w, D, F, MT_QUANT_NF4, 64, 1), 0, "%s", mt_error_get());
        u[e] = upload(gpu, MT_BF16, uv, RU, F);
        pq[e] = &q[e], pu[e] = u[e];
        free(w), free(uv);
    }
    float *dyz = randn(R * (D + RU), 7, 1.0f);
    mt_tensor *tdyz = upload(gpu, MT_BF16, dyz, R, D + RU);
    mt_tensor dy = mt_view2(gpu, tdyz->data, MT_BF16, R, D, D + RU);
    mt_tensor z = mt_view2(gpu, (mt_bf16 *)tdyz->data + D, MT_BF16, R, RU, D + RU);
    mt_tensor *one = zeros(gpu, MT_F32, R, F), *two = zeros(gpu, MT_F32, R, F);
    mt_grouped g = {.experts = E, .off = off, .q = pq, .under = pu, .trans = 0, .alpha = 1, .beta = 0};
    size_t work0 = gpu->ledger.cur[MT_MEM_WORK];
    mt_ledger_reset_peak(&gpu->ledger);
    cr_assert_eq(mt_grouped_gemm(one, tdyz, &g), 0, "%s", mt_error_get());
    cr_expect_geq(gpu->ledger.peak[MT_MEM_WORK],
                  work0 + (size_t)(MT_EXPERT_SCRATCH_SLOTS * mt_expert_slot_elems((D + RU) * F, E) * 2),
                  "the slots hold W and the rows under it");
    mt_grouped h = {.experts = E, .off = off, .q = pq, .trans = 0, .alpha = 1, .beta = 0};
    cr_assert_eq(mt_grouped_gemm(two, &dy, &h), 0, "%s", mt_error_get());
    h.q = NULL, h.w = pu, h.beta = 1;
    cr_assert_eq(mt_grouped_gemm(two, &z, &h), 0, "%s", mt_error_get());
    float *a = down(one), *b = down(two);
    double norm = 0;
    for (int64_t i = 0; i < R * F; i++) norm += fabs(b[i]);
    cr_assert_gt(norm, 0, "the products were computed");
    for (int64_t i = 0; i < R * F; i++)
        cr_assert_leq(fabsf(a[i] - b[i]), 1e-5f * (1.0f + fabsf(b[i])), "row %lld col %lld: under %g, two calls %g",
                      (long long)(i / F), (long long)(i % F), (double)a[i], (double)b[i]);
    free(a), free(b);

    const mt_tensor *dense[E] = {u[0], u[1], u[2]};  // under a dense expert: refused
    mt_grouped bad = g;
    bad.q = NULL, bad.w = dense;
    cr_assert_eq(mt_grouped_gemm(one, tdyz, &bad), -1);
    cr_assert(strstr(mt_error_get(), "under[0]"), "%s", mt_error_get());
    mt_tensor narrow = mt_view2(gpu, u[1]->data, MT_BF16, RU, F - 8, F - 8);  // not W's width
    const mt_tensor *pn[E] = {u[0], &narrow, u[2]};
    bad = g, bad.under = pn;
    cr_assert_eq(mt_grouped_gemm(one, tdyz, &bad), -1);
    cr_assert(strstr(mt_error_get(), "under[1]"), "%s", mt_error_get());
    for (int e = 0; e < E; e++) mt_qweight_free(&q[e]), mt_tensor_free(u[e]);
    mt_tensor_free(tdyz), mt_tensor_free(one), mt_tensor_free(two);
    free(dyz);
}

Test(cuda_grouped, rows_under_w_equal_a_second_gemm) {
    mt_backend *gpu = gpu_or_skip();
    const int grouped[3] = {7, 0, 12}, per_expert[3] = {0, 9, 0};
    under_case(gpu, grouped);
    under_case(gpu, per_expert);
    mt_backend_free(gpu);
}

// Blocks beside W (grouped.h's beside, beside2: w1's and w3's LoRA B beside [W1;W3] in the
// folded forward and dx): [x | z1 | z3]·[[W1 | s·B1 | 0]; [W3 | 0 | s·B3]]ᵀ in one call equals
// x·[W1;W3]ᵀ plus s·z1·B1ᵀ into g's half and s·z3·B3ᵀ into u's, and (no trans)
// dgu·[[W1 | s·B1 | 0]; [W3 | 0 | s·B3]] equals [dgu·[W1;W3] | s·dg·B1 | s·du·B3], on the grouped
// path and the per-expert one; with RB = 6 the slots hold rows at a padded stride (D + 2·RB = 52
// -> 56: the padding is never read into a product), with RB = 8 (the step's: r % 8 == 0) every
// stride is 16-byte and bf16 C takes cuBLAS's grouped call; a beside with rows under W, or with a
// of the wrong width, is refused.
static void beside_case(mt_backend *gpu, const int *rows, int RB) {
    enum { E = 3, D = 40, F = 24 };
    const int K = D + 2 * RB, LD = (K + 7) / 8 * 8;
    const float s = 0.5f;  // a power of two: s·B is exact in bf16, the two ways agree to rounding
    int64_t off[E + 1] = {1};
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + rows[e];
    const int64_t R = off[E] + 2;
    mt_qweight q1[E], q3[E];
    const mt_qweight *p1[E], *p3[E];
    mt_tensor *b1[E], *b3[E];
    const mt_tensor *pb1[E], *pb3[E];
    for (int e = 0; e < E; e++) {
        float *w1 = randn(F * D, 20 + (uint64_t)e, 0.5f), *w3 = randn(F * D, 30 + (uint64_t)e, 0.5f);
        float *v1 = randn(F * RB, 40 + (uint64_t)e, 0.5f), *v3 = randn(F * RB, 45 + (uint64_t)e, 0.5f);
        cr_assert_eq(mt_qweight_quantize(&q1[e], gpu, "w1", w1, F, D, MT_QUANT_NF4, 64, 1), 0, "%s", mt_error_get());
        cr_assert_eq(mt_qweight_quantize(&q3[e], gpu, "w3", w3, F, D, MT_QUANT_NF4, 64, 1), 0, "%s", mt_error_get());
        b1[e] = upload(gpu, MT_BF16, v1, F, RB), b3[e] = upload(gpu, MT_BF16, v3, F, RB);
        p1[e] = &q1[e], p3[e] = &q3[e], pb1[e] = b1[e], pb3[e] = b3[e];
        free(w1), free(w3), free(v1), free(v3);
    }
    float *xz = randn(R * K, 8, 1.0f);
    mt_tensor *txz = upload(gpu, MT_BF16, xz, R, K);
    mt_tensor x = mt_view2(gpu, txz->data, MT_BF16, R, D, K);
    mt_tensor z1 = mt_view2(gpu, (mt_bf16 *)txz->data + D, MT_BF16, R, RB, K);
    mt_tensor z3 = mt_view2(gpu, (mt_bf16 *)txz->data + D + RB, MT_BF16, R, RB, K);
    mt_tensor *one = zeros(gpu, MT_F32, R, 2 * F), *two = zeros(gpu, MT_F32, R, 2 * F);
    mt_grouped g = {.experts = E, .off = off, .q = p1, .q2 = p3, .beside = pb1, .beside2 = pb3, .beside_scale = s,
                    .trans = 1, .alpha = 1, .beta = 0};
    size_t work0 = gpu->ledger.cur[MT_MEM_WORK];
    mt_ledger_reset_peak(&gpu->ledger);
    cr_assert_eq(mt_grouped_gemm(one, txz, &g), 0, "%s", mt_error_get());
    cr_expect_eq(gpu->ledger.peak[MT_MEM_WORK],
                 work0 + (size_t)(MT_EXPERT_SCRATCH_SLOTS * mt_expert_slot_elems(2 * F * LD, E) * 2) + MT_GROUPED_PTR_BYTES,
                 "the slots hold [W1;W3] with B1, B3 beside at a row stride of %d (%d unpadded), and the pointer table",
                 LD, K);
    cr_expect_eq(mt_grouped_slot_ld(&g, 0), LD);
    mt_grouped h = {.experts = E, .off = off, .q = p1, .q2 = p3, .trans = 1, .alpha = 1, .beta = 0};
    cr_assert_eq(mt_grouped_gemm(two, &x, &h), 0, "%s", mt_error_get());
    mt_tensor gh = mt_view2(gpu, two->data, MT_F32, R, F, 2 * F), uh = mt_view2(gpu, (float *)two->data + F, MT_F32, R, F, 2 * F);
    mt_grouped lo = {.experts = E, .off = off, .w = pb1, .trans = 1, .alpha = s, .beta = 1};
    cr_assert_eq(mt_grouped_gemm(&gh, &z1, &lo), 0, "%s", mt_error_get());
    lo.w = pb3;
    cr_assert_eq(mt_grouped_gemm(&uh, &z3, &lo), 0, "%s", mt_error_get());
    float *a = down(one), *b = down(two);
    double norm = 0;
    for (int64_t i = 0; i < R * 2 * F; i++) norm += fabs(b[i]);
    cr_assert_gt(norm, 0, "the products were computed");
    for (int64_t i = 0; i < R * 2 * F; i++)
        cr_assert_leq(fabsf(a[i] - b[i]), 1e-5f * (1.0f + fabsf(b[i])), "row %lld col %lld: beside %g, three calls %g",
                      (long long)(i / (2 * F)), (long long)(i % (2 * F)), (double)a[i], (double)b[i]);
    free(a), free(b);

    // bf16 C (the step's gu: cuBLAS's grouped call, the f32 one above being a call per expert),
    // against the three calls' f32 result: one rounding of bf16.
    mt_tensor *one16 = zeros(gpu, MT_BF16, R, 2 * F);
    cr_assert_eq(mt_grouped_gemm(one16, txz, &g), 0, "%s", mt_error_get());
    a = down(one16), b = down(two);
    for (int64_t i = 0; i < R * 2 * F; i++)
        cr_assert_leq(fabsf(a[i] - b[i]), 1e-5f + fabsf(b[i]) / 128, "bf16 row %lld col %lld: beside %g, three calls %g",
                      (long long)(i / (2 * F)), (long long)(i % (2 * F)), (double)a[i], (double)b[i]);
    free(a), free(b);
    mt_tensor_free(one16);

    // dx: [dx | z1 | z3] = dgu·[[W1 | s·B1 | 0]; [W3 | 0 | s·B3]] against its three parts.
    float *dguv = randn(R * 2 * F, 9, 1.0f);
    mt_tensor *tdgu = upload(gpu, MT_BF16, dguv, R, 2 * F);
    mt_tensor *dx = zeros(gpu, MT_F32, R, K), *dx2 = zeros(gpu, MT_F32, R, K);
    mt_grouped gt = g;
    gt.trans = 0;
    cr_assert_eq(mt_grouped_gemm(dx, tdgu, &gt), 0, "%s", mt_error_get());
    mt_tensor dxh = mt_view2(gpu, dx2->data, MT_F32, R, D, K), z1h = mt_view2(gpu, (float *)dx2->data + D, MT_F32, R, RB, K);
    mt_tensor z3h = mt_view2(gpu, (float *)dx2->data + D + RB, MT_F32, R, RB, K);
    mt_grouped ht = h;
    ht.trans = 0;
    cr_assert_eq(mt_grouped_gemm(&dxh, tdgu, &ht), 0, "%s", mt_error_get());
    mt_tensor dg = mt_view2(gpu, tdgu->data, MT_BF16, R, F, 2 * F), du = mt_view2(gpu, (mt_bf16 *)tdgu->data + F, MT_BF16, R, F, 2 * F);
    mt_grouped lt = {.experts = E, .off = off, .w = pb1, .trans = 0, .alpha = s, .beta = 0};
    cr_assert_eq(mt_grouped_gemm(&z1h, &dg, &lt), 0, "%s", mt_error_get());
    lt.w = pb3;
    cr_assert_eq(mt_grouped_gemm(&z3h, &du, &lt), 0, "%s", mt_error_get());
    a = down(dx), b = down(dx2);
    for (int64_t i = 0; i < R * K; i++)
        cr_assert_leq(fabsf(a[i] - b[i]), 1e-5f * (1.0f + fabsf(b[i])), "dx row %lld col %lld: beside %g, three calls %g",
                      (long long)(i / K), (long long)(i % K), (double)a[i], (double)b[i]);
    free(a), free(b), free(dguv);
    mt_tensor_free(tdgu), mt_tensor_free(dx2);

    float *uv = randn(4 * D, 10, 1.0f);
    mt_tensor *u = upload(gpu, MT_BF16, uv, 4, D), dgu_room = mt_view2(gpu, txz->data, MT_BF16, R, 2 * F + 4, K);
    const mt_tensor *under[E] = {u, u, u};
    mt_grouped bad = gt;
    bad.under = under;  // rows under W and blocks beside it: one or the other
    cr_assert_eq(mt_grouped_gemm(dx, &dgu_room, &bad), -1);
    cr_assert(strstr(mt_error_get(), "beside[0]"), "%s", mt_error_get());
    mt_tensor_free(u), free(uv);
    cr_assert_eq(mt_grouped_gemm(one, &x, &g), -1);  // a without the room
    cr_assert(strstr(mt_error_get(), "with beside"), "%s", mt_error_get());
    for (int e = 0; e < E; e++) mt_qweight_free(&q1[e]), mt_qweight_free(&q3[e]), mt_tensor_free(b1[e]), mt_tensor_free(b3[e]);
    mt_tensor_free(txz), mt_tensor_free(one), mt_tensor_free(two), mt_tensor_free(dx);
    free(xz);
}

Test(cuda_grouped, blocks_beside_w_equal_the_lora_products) {
    mt_backend *gpu = gpu_or_skip();
    const int grouped[3] = {7, 0, 12}, per_expert[3] = {0, 9, 0};
    for (int rb = 6; rb <= 8; rb += 2) beside_case(gpu, grouped, rb), beside_case(gpu, per_expert, rb);
    mt_backend_free(gpu);
}

// The null backend (plan --measure) reserves the same scratch as the cuda backend: two slots for
// a call with a 4-bit expert with rows, none for dense weights, the f32 dropout buffer with a seed,
// the grouped call's pointer table always.
Test(cuda_grouped, null_backend_counts_the_scratch) {
    mt_backend *nb = mt_backend_null_new();
    enum { D = 64, F = 32 };
    int64_t off[3] = {0, 5, 9};
    mt_qweight q[2];
    const mt_qweight *qp[2] = {&q[0], &q[1]};
    for (int e = 0; e < 2; e++)
        cr_assert_eq(mt_qweight_quantize(&q[e], nb, "w2", NULL, D, F, MT_QUANT_NF4, 64, 1), 0, "%s", mt_error_get());
    int64_t sa[2] = {9, F}, sc[2] = {9, D};
    mt_tensor *a = mt_tensor_new(nb, MT_MEM_ACT, MT_BF16, 2, sa), *c = mt_tensor_new(nb, MT_MEM_ACT, MT_BF16, 2, sc);
    mt_grouped g = {.experts = 2, .off = off, .q = qp, .trans = 1, .alpha = 1, .beta = 0};
    mt_ledger_reset_peak(&nb->ledger);
    size_t w0 = nb->ledger.cur[MT_MEM_WORK];
    cr_assert_eq(mt_grouped_gemm(c, a, &g), 0, "%s", mt_error_get());
    cr_expect_eq(nb->ledger.peak[MT_MEM_WORK] - w0, (size_t)(MT_EXPERT_SCRATCH_SLOTS * mt_expert_slot_elems(D * F, 2) * 2) + MT_GROUPED_PTR_BYTES,
                 "w2's two slots, each of both experts, and the pointer table");
    cr_expect_eq(nb->ledger.cur[MT_MEM_WORK], w0, "released");
    uint64_t seeds[2] = {1, 2};
    g.seed = seeds, g.p = 0.1f, g.drop_a = 1;
    mt_ledger_reset_peak(&nb->ledger);
    cr_assert_eq(mt_grouped_gemm(c, a, &g), 0, "%s", mt_error_get());
    cr_expect_eq(nb->ledger.peak[MT_MEM_WORK] - w0,
                 (size_t)(MT_EXPERT_SCRATCH_SLOTS * mt_expert_slot_elems(D * F, 2) * 2 + mt_expert_dropout_scratch_bytes(9, F)) +
                     MT_GROUPED_PTR_BYTES,
                 "the slots and the dropout buffer of A's width");
    for (int e = 0; e < 2; e++) mt_qweight_free(&q[e]);
    mt_tensor_free(a), mt_tensor_free(c);
    mt_backend_free(nb);
}

// Experts kept dequantized (grouped.h's cached: --expert-cache): one kept W2 with room for both
// LoRA blocks ([D + RU, LD], LD = F + RB rounded up to 8) serves the forward's call with B beside
// (trans) and the dx call with A under, each equal bit for bit to the same call dequantizing into
// the slots, on the grouped path and the per-expert one; the call holds no slot and never reads
// the 4-bit codes (the kept calls' q are copies whose codes were given back after W was
// dequantized into the kept matrix, as model/mixtral.c does), and the blocks are written at every
// call: after B and A change, the kept W still gives the slots' products. A kept W too small is
// refused naming it; a copy without codes refuses to be dequantized.
static void kept_case(mt_backend *gpu, const int *rows) {
    enum { E = 3, D = 40, F = 24, RB = 8, RU = 8, LD = (F + RB + 7) / 8 * 8 };
    int64_t off[E + 1] = {1};
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + rows[e];
    const int64_t R = off[E] + 2;
    mt_qweight q[E], qk[E];
    const mt_qweight *pq[E], *pqk[E];
    mt_tensor *b[E], *u[E], *kept[E];
    const mt_tensor *pb[E], *pu[E];
    for (int e = 0; e < E; e++) {
        float *w = randn(D * F, 60 + (uint64_t)e, 0.5f), *bv = randn(D * RB, 65 + (uint64_t)e, 0.5f);
        float *uv = randn(RU * F, 70 + (uint64_t)e, 0.5f);
        cr_assert_eq(mt_qweight_quantize(&q[e], gpu, "w2", w, D, F, MT_QUANT_NF4, 64, 1), 0, "%s", mt_error_get());
        b[e] = upload(gpu, MT_BF16, bv, D, RB), u[e] = upload(gpu, MT_BF16, uv, RU, F);
        kept[e] = zeros(gpu, MT_BF16, D + RU, LD);
        cr_assert_eq(mt_qweight_clone(&qk[e], &q[e], "w2 kept"), 0, "%s", mt_error_get());
        mt_tensor w_kept = mt_view2(gpu, kept[e]->data, MT_BF16, D, F, LD);
        cr_assert_eq(mt_qweight_dequantize_2d(&qk[e], &w_kept), 0, "%s", mt_error_get());
        mt_qweight_release_codes(&qk[e]);
        cr_assert(!mt_qweight_has_codes(&qk[e]));
        pq[e] = &q[e], pqk[e] = &qk[e], pb[e] = b[e], pu[e] = u[e];
        free(w), free(bv), free(uv);
    }
    float *av = randn(R * (D + RU), 11, 1.0f);  // wide enough for both calls' a
    mt_tensor *ta = upload(gpu, MT_BF16, av, R, D + RU);
    mt_tensor a_fwd = mt_view2(gpu, ta->data, MT_BF16, R, F + RB, D + RU), a_dx = *ta;
    mt_grouped fwd = {.experts = E, .off = off, .q = pq, .beside = pb, .beside_scale = 0.5f, .trans = 1, .alpha = 1};
    mt_grouped dx = {.experts = E, .off = off, .q = pq, .under = pu, .trans = 0, .alpha = 1};
    mt_grouped kf = fwd, kd = dx;
    kf.cached = kd.cached = kept, kf.q = kd.q = pqk;
    for (int round = 0; round < 2; round++) {
        const mt_grouped *calls[2][2] = {{&fwd, &kf}, {&dx, &kd}};
        const mt_tensor *as[2] = {&a_fwd, &a_dx};
        const int64_t ncols[2] = {D, F};
        for (int k = 0; k < 2; k++) {
            mt_tensor *slots = zeros(gpu, MT_F32, R, ncols[k]), *fromkept = zeros(gpu, MT_F32, R, ncols[k]);
            cr_assert_eq(mt_grouped_gemm(slots, as[k], calls[k][0]), 0, "%s", mt_error_get());
            size_t work0 = gpu->ledger.cur[MT_MEM_WORK];
            mt_ledger_reset_peak(&gpu->ledger);
            cr_assert_eq(mt_grouped_gemm(fromkept, as[k], calls[k][1]), 0, "%s", mt_error_get());
            cr_expect_leq(gpu->ledger.peak[MT_MEM_WORK], work0 + MT_GROUPED_PTR_BYTES, "no slot for kept experts");
            float *x = down(slots), *y = down(fromkept);
            double norm = 0;
            for (int64_t i = 0; i < R * ncols[k]; i++) norm += fabs(x[i]);
            cr_assert_gt(norm, 0, "the products were computed");
            cr_expect(memcmp(x, y, (size_t)(R * ncols[k]) * sizeof(float)) == 0,
                      "round %d, %s call: the kept W's products differ from the slots'", round, k ? "dx" : "forward");
            free(x), free(y);
            mt_tensor_free(slots), mt_tensor_free(fromkept);
        }
        for (int e = 0; e < E; e++) {  // the LoRAs move (an optimizer step): new B and A
            float *bv = randn(D * RB, 80 + (uint64_t)e, 0.5f), *uv = randn(RU * F, 85 + (uint64_t)e, 0.5f);
            mt_tensor_upload_f32(b[e], bv), mt_tensor_upload_f32(u[e], uv);
            free(bv), free(uv);
        }
    }
    mt_tensor small = mt_view2(gpu, kept[0]->data, MT_BF16, D, LD, LD);  // no room for A's rows
    mt_tensor *psmall[E] = {&small, kept[1], kept[2]};
    mt_grouped bad = kd;
    bad.cached = psmall;
    mt_tensor *c = zeros(gpu, MT_F32, R, F);
    cr_assert_eq(mt_grouped_gemm(c, &a_dx, &bad), -1);
    cr_assert(strstr(mt_error_get(), "cached[0]"), "%s", mt_error_get());
    cr_expect_eq(mt_qweight_dequantize(&qk[0], c), -1, "a weight without codes is not dequantized");
    cr_expect(strstr(mt_error_get(), "released"), "%s", mt_error_get());
    mt_tensor_free(c);
    for (int e = 0; e < E; e++)
        mt_qweight_free(&q[e]), mt_qweight_free(&qk[e]), mt_tensor_free(b[e]), mt_tensor_free(u[e]), mt_tensor_free(kept[e]);
    mt_tensor_free(ta), free(av);
}

Test(cuda_grouped, kept_w_gives_the_slots_products) {
    mt_backend *gpu = gpu_or_skip();
    const int grouped[3] = {7, 0, 12}, per_expert[3] = {0, 9, 0};
    kept_case(gpu, grouped);
    kept_case(gpu, per_expert);
    mt_backend_free(gpu);
}

// The offsets on the device (grouped.h's doff; core/gemm_rows.h's grouped matmul) against the
// same offsets on the host: dense W (LoRA-like) with dropout on A and on C, and the weight
// gradient with dropout on Y, one expert without rows and one without W (or G); the row operands
// two rows longer than the offsets reach. The same bits (the same masks, and under the emulator
// the same reference arithmetic; within rounding on a GPU, whose grouped kernels differ). Where
// the library has no grouped matmul, the device call is refused with the reason instead.
static void device_vs_host(mt_backend *gpu, int drop_a) {
    enum { E = 4, K = 16, N = 24 };
    const int rows[E] = {5, 0, 7, 3};
    int64_t off[E + 1] = {0};
    int32_t off32[E + 1] = {0};
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + rows[e], off32[e + 1] = (int32_t)off[e + 1];
    const int64_t R = off[E], RL = R + 2;
    int64_t so[1] = {E + 1};
    mt_tensor *doff = mt_tensor_new(gpu, MT_MEM_ACT, MT_I32, 1, so);
    mt_tensor_upload(doff, off32);
    float *av = randn(RL * K, 1, 1.0f), *cv = randn(RL * N, 2, 1.0f), *wv[E];
    mt_tensor *ta = upload(gpu, MT_BF16, av, RL, K), *c[2], *w[E];
    for (int k = 0; k < 2; k++) c[k] = upload(gpu, MT_F32, cv, RL, N);
    for (int e = 0; e < E; e++) wv[e] = randn(N * K, 10 + (uint64_t)e, 0.5f), w[e] = upload(gpu, MT_BF16, wv[e], N, K);
    const mt_tensor *wp[E] = {w[0], w[1], NULL, w[3]};  // expert 2 has no W: its rows stay
    uint64_t seeds[E] = {11, 12, 13, 14};
    mt_grouped g = {.experts = E, .off = off, .w = wp, .trans = 1, .alpha = 0.5f, .beta = 1.0f, .seed = seeds,
                    .p = 0.25f, .drop_a = drop_a};
    cr_assert_eq(mt_grouped_gemm(c[0], ta, &g), 0, "%s", mt_error_get());
    mt_grouped gd = g;
    gd.off = NULL, gd.doff = (const int32_t *)doff->data, gd.rows = R;
    char why[240];
    if (!mt_gemm_rows_available(gpu, why, sizeof why)) {
        cr_assert_eq(mt_grouped_gemm(c[1], ta, &gd), -1);
        cr_log_info("no grouped matmul here: %s", why);
    } else {
        cr_assert_eq(mt_grouped_gemm(c[1], ta, &gd), 0, "%s", mt_error_get());
        float *h0 = mt_xmalloc((size_t)(RL * N) * sizeof(float)), *h1 = mt_xmalloc((size_t)(RL * N) * sizeof(float));
        mt_tensor_download_f32(c[0], h0), mt_tensor_download_f32(c[1], h1);
        for (int64_t i = 0; i < RL * N; i++)
            cr_assert(attention_cudnn_emulated() ? h0[i] == h1[i] : fabsf(h0[i] - h1[i]) <= 1e-2f * (1 + fabsf(h0[i])),
                      "drop_a %d: element %lld: host offsets %.9g, device %.9g", drop_a, (long long)i, h0[i], h1[i]);
        free(h0), free(h1);
        // the weight gradient, dropout on Y (c's rows as Y: bf16 copies), G of experts 0 and 2 only
        float *yv = randn(RL * N, 3, 1.0f);
        mt_tensor *ty = upload(gpu, MT_BF16, yv, RL, N), *gk[2][E];
        for (int k = 0; k < 2; k++)
            for (int e = 0; e < E; e++) gk[k][e] = e % 2 ? NULL : upload(gpu, MT_F32, wv[e], K, N);
        mt_grouped gt = {.experts = E, .off = off, .alpha = 1.0f, .beta = 1.0f, .seed = seeds, .p = 0.25f};
        cr_assert_eq(mt_grouped_gemm_tn(gk[0], ta, ty, &gt), 0, "%s", mt_error_get());
        gt.off = NULL, gt.doff = gd.doff, gt.rows = R;
        cr_assert_eq(mt_grouped_gemm_tn(gk[1], ta, ty, &gt), 0, "%s", mt_error_get());
        float g0[K * N], g1[K * N];
        for (int e = 0; e < E; e += 2) {
            mt_tensor_download_f32(gk[0][e], g0), mt_tensor_download_f32(gk[1][e], g1);
            for (int i = 0; i < K * N; i++)
                cr_assert(attention_cudnn_emulated() ? g0[i] == g1[i] : fabsf(g0[i] - g1[i]) <= 1e-2f * (1 + fabsf(g0[i])),
                          "dG %d element %d: host offsets %.9g, device %.9g", e, i, g0[i], g1[i]);
        }
        mt_tensor *none[E] = {NULL, NULL, NULL, NULL};  // no gradient wanted: nothing done, nothing read
        cr_assert_eq(mt_grouped_gemm_tn(none, ta, ty, &gt), 0, "%s", mt_error_get());
        for (int k = 0; k < 2; k++)
            for (int e = 0; e < E; e += 2) mt_tensor_free(gk[k][e]);
        mt_tensor_free(ty), free(yv);
    }
    for (int e = 0; e < E; e++) mt_tensor_free(w[e]), free(wv[e]);
    mt_tensor_free(ta), mt_tensor_free(c[0]), mt_tensor_free(c[1]), mt_tensor_free(doff), free(av), free(cv);
}

Test(cuda_grouped, device_offsets_give_the_host_offsets_products) {
    mt_backend *gpu = gpu_or_skip();
    device_vs_host(gpu, 1);
    device_vs_host(gpu, 0);
    mt_backend_free(gpu);
}
