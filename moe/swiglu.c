// moe/swiglu.c — the experts' gated activation a = silu(g) ⊙ u (CPU reference, fp32).
// g = w1·x (gate), u = w3·x (up); Mixtral's expert is w2(silu(w1 x) ⊙ w3 x).
// Vectorized (core/vmath.h): built for x86-64-v3 and the baseline, the pick made at load time.
#include <math.h>

#include "core/vmath.h"
#include "moe/moe.h"

// 1 / (1 + e^-g): e^-g saturates to +inf below g ≈ −88.7 (s = 0) and to 0 above 87 (s = 1).
static inline float sigmoidf(float g) { return 1.0f / (1.0f + mt_vexpf(-g)); }

// g, u [n] → a [n]
MT_HOT void swiglu_forward_cpu(float *restrict a, const float *restrict g, const float *restrict u, int64_t n) {
#pragma omp parallel for simd
    for (int64_t i = 0; i < n; i++) a[i] = g[i] * sigmoidf(g[i]) * u[i];
}

// da [n] → dg, du [n] += (either may be NULL); silu'(g) = s·(1 + g·(1 − s)), s = sigmoid(g)
MT_HOT void swiglu_backward_cpu(float *restrict dg, float *restrict du, const float *restrict da,
                                const float *restrict g, const float *restrict u, int64_t n) {
    if (dg) {
#pragma omp parallel for simd
        for (int64_t i = 0; i < n; i++) {
            const float s = sigmoidf(g[i]);
            dg[i] += da[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
        }
    }
    if (du) {
#pragma omp parallel for simd
        for (int64_t i = 0; i < n; i++) du[i] += da[i] * g[i] * sigmoidf(g[i]);
    }
}

MT_HOT void swiglu_clamped_forward_cpu(float *restrict a, const float *restrict g, const float *restrict u, int64_t n,
                                       float alpha, float limit) {
#pragma omp parallel for simd
    for (int64_t i = 0; i < n; i++) {
        const float gc = fminf(g[i], limit), uc = fminf(fmaxf(u[i], -limit), limit);
        a[i] = (uc + 1.0f) * (gc * sigmoidf(gc * alpha));
    }
}

// d/du' = g'·σ(αg'); d/dg' = (u' + 1)·s·(1 + αg'(1 − s)), s = σ(αg'); then the clamps' masks.
MT_HOT void swiglu_clamped_backward_cpu(float *restrict dg, float *restrict du, const float *restrict da,
                                        const float *restrict g, const float *restrict u, int64_t n, float alpha,
                                        float limit) {
#pragma omp parallel for simd
    for (int64_t i = 0; i < n; i++) {
        const float gc = fminf(g[i], limit), uc = fminf(fmaxf(u[i], -limit), limit), s = sigmoidf(gc * alpha);
        if (dg && g[i] <= limit) dg[i] += da[i] * (uc + 1.0f) * s * (1.0f + alpha * gc * (1.0f - s));
        if (du && u[i] >= -limit && u[i] <= limit) du[i] += da[i] * gc * s;
    }
}

// The fused layout: row r of gu [rows, 2f] = [g_r | u_r]. Same expressions as above, so the same
// bits; a row per iteration of the parallel loop, the row's columns vectorized.
MT_HOT void swiglu_fused_forward_cpu(float *restrict a, int64_t lda, const float *restrict gu, int64_t rows,
                                     int64_t f) {
#pragma omp parallel for
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict g = gu + r * 2 * f, *restrict u = g + f;
        float *restrict ar = a + r * lda;
#pragma omp simd
        for (int64_t c = 0; c < f; c++) ar[c] = g[c] * sigmoidf(g[c]) * u[c];
    }
}

// da [rows, f] (row stride ldda) → dgu [rows, 2f] = [dg | du], in place when dgu is gu (both read
// before written)
MT_HOT void swiglu_fused_backward_cpu(float *dgu, const float *restrict da, int64_t ldda, const float *gu, int64_t rows,
                                      int64_t f) {
#pragma omp parallel for
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gu + r * 2 * f, *u = g + f, *restrict d = da + r * ldda;
        float *dg = dgu + r * 2 * f, *du = dg + f;
        for (int64_t c = 0; c < f; c++) {
            const float gc = g[c], uc = u[c], s = sigmoidf(gc);
            dg[c] = d[c] * uc * s * (1.0f + gc * (1.0f - s));
            du[c] = d[c] * gc * sigmoidf(gc);
        }
    }
}

// gpt-oss's clamped SwiGLU over the fused layout: the split kernels' expressions element for
// element (so the same bits), dg and du written (0 where a clamp cut), in place when dgu is gu.
MT_HOT void swiglu_clamped_fused_forward_cpu(float *restrict a, int64_t lda, const float *restrict gu, int64_t rows,
                                             int64_t f, float alpha, float limit) {
#pragma omp parallel for
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict g = gu + r * 2 * f, *restrict u = g + f;
        float *restrict ar = a + r * lda;
#pragma omp simd
        for (int64_t c = 0; c < f; c++) {
            const float gc = fminf(g[c], limit), uc = fminf(fmaxf(u[c], -limit), limit);
            ar[c] = (uc + 1.0f) * (gc * sigmoidf(gc * alpha));
        }
    }
}

MT_HOT void swiglu_clamped_fused_backward_cpu(float *dgu, const float *restrict da, int64_t ldda, const float *gu,
                                              int64_t rows, int64_t f, float alpha, float limit) {
#pragma omp parallel for
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gu + r * 2 * f, *u = g + f, *restrict d = da + r * ldda;
        float *dg = dgu + r * 2 * f, *du = dg + f;
        for (int64_t c = 0; c < f; c++) {
            const float g0 = g[c], u0 = u[c];
            const float gc = fminf(g0, limit), uc = fminf(fmaxf(u0, -limit), limit), s = sigmoidf(gc * alpha);
            dg[c] = g0 <= limit ? d[c] * (uc + 1.0f) * s * (1.0f + alpha * gc * (1.0f - s)) : 0.0f;
            du[c] = u0 >= -limit && u0 <= limit ? d[c] * gc * s : 0.0f;
        }
    }
}
