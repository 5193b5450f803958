// model/bias.c — the parts of attention some families add around their projections
// (docs/families.md): biases of q/k/v(/o)_proj (and gpt-oss's router and expert biases), and
// OLMoE's clip_qkv; and the shared expert's
// gate around an MLP's output (model/mlp.c). CPU reference kernels (model/ops.h), fp32; their
// CUDA twins are model/parts_cuda.cu, the step calls them through model/dispatch.c.
#include <math.h>

#include "core/common.h"
#include "model/ops.h"

void bias_forward_cpu(float *y, const float *b, int64_t T, int64_t n) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < n; i++) y[t * n + i] += b[i];
}

void bias_backward_cpu(float *db, const float *dy, int64_t T, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double s = 0;  // in order over t: the same bits on every run
        for (int64_t t = 0; t < T; t++) s += dy[t * n + i];
        db[i] += (float)s;
    }
}

void expert_bias_forward_cpu(float *y, int64_t ldy, const float *b, int64_t ldb, int64_t n,
                             const mt_expert_offsets *g) {
    if (g->dev) mt_fatal(MT_EXIT_ERROR, "expert biases on the cpu: offsets on a device");
    for (int e = 0; e < g->experts; e++)
        for (int64_t r = g->off[e] - g->off[0]; r < g->off[e + 1] - g->off[0]; r++)
            for (int64_t i = 0; i < n; i++) y[r * ldy + i] += b[e * ldb + i];
}

void expert_bias_backward_cpu(float *db, int64_t lddb, const float *dy, int64_t ldy, int64_t n,
                              const mt_expert_offsets *g) {
    if (g->dev) mt_fatal(MT_EXIT_ERROR, "expert biases on the cpu: offsets on a device");
    for (int e = 0; e < g->experts; e++)
        for (int64_t i = 0; i < n; i++) {
            double s = 0;  // in order over the expert's rows
            for (int64_t r = g->off[e] - g->off[0]; r < g->off[e + 1] - g->off[0]; r++) s += dy[r * ldy + i];
            db[e * lddb + i] += (float)s;
        }
}

void clip_forward_cpu(float *x, int64_t n, float c) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] < -c ? -c : x[i] > c ? c : x[i];
}

// torch.clamp's gradient passes where -c <= x <= c (x the value before clamping) and is 0 elsewhere.
void clip_backward_cpu(float *dy, const float *x, int64_t n, float c) {
    for (int64_t i = 0; i < n; i++)
        if (x[i] < -c || x[i] > c) dy[i] = 0.0f;
}

// The same where the value before clamping was RMSNorm's output, computed again exactly as
// rmsnorm_forward_cpu did (w · (x · rstd)) from its kept input and statistics.
void clip_backward_normed_cpu(float *dy, const float *x, const float *rstd, const float *w, int64_t rows,
                              int64_t width, float c) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < width; i++) {
            float v = w[i] * (x[r * width + i] * rstd[r]);
            if (v < -c || v > c) dy[r * width + i] = 0.0f;
        }
}

void sigmoid_cpu(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = 1.0f / (1.0f + expf(-x[i]));
}

void scaled_add_cpu(float *out, const float *y, const float *s, int64_t T, int64_t H) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < H; i++) out[t * H + i] += (s ? s[t] : 1.0f) * y[t * H + i];
}

void gate_backward_cpu(float *dy, float *ds, const float *dx, const float *y, const float *s, int64_t T, int64_t H) {
    for (int64_t t = 0; t < T; t++) {
        double dot = 0;
        for (int64_t i = 0; i < H; i++) dy[t * H + i] = s[t] * dx[t * H + i], dot += (double)dx[t * H + i] * y[t * H + i];
        ds[t] = (float)(dot * s[t] * (1.0f - s[t]));
    }
}
