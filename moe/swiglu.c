// moe/swiglu.c — the experts' gated activation a = silu(g) ⊙ u (CPU reference, fp32).
// g = w1·x (gate), u = w3·x (up); Mixtral's expert is w2(silu(w1 x) ⊙ w3 x).
#include <math.h>

#include "moe/moe.h"

// 1 / (1 + e^-g) without overflow: e^-|g| never exceeds 1.
static inline float sigmoidf(float g) {
    if (g >= 0.0f) return 1.0f / (1.0f + expf(-g));
    const float z = expf(g);
    return z / (1.0f + z);
}

// g, u [n] → a [n]
void swiglu_forward_cpu(float *a, const float *g, const float *u, int64_t n) {
#pragma omp parallel for
    for (int64_t i = 0; i < n; i++) a[i] = g[i] * sigmoidf(g[i]) * u[i];
}

// da [n] → dg, du [n] += (either may be NULL); silu'(g) = s·(1 + g·(1 − s)), s = sigmoid(g)
void swiglu_backward_cpu(float *dg, float *du, const float *da, const float *g, const float *u, int64_t n) {
#pragma omp parallel for
    for (int64_t i = 0; i < n; i++) {
        const float s = sigmoidf(g[i]);
        if (dg) dg[i] += da[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
        if (du) du[i] += da[i] * g[i] * s;
    }
}
