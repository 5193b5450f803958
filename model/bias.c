// model/bias.c — the parts of attention some families add around their projections
// (docs/families.md): biases of q/k/v(/o)_proj, and OLMoE's clip_qkv. CPU reference (the CUDA
// step refuses these families for now: model/mixtral.c); the counting backend runs none of them.
#include "core/common.h"
#include "model/model_internal.h"

void mt_bias_forward(mt_model *m, mt_act *y, const mt_act *b, int64_t T, int64_t n) {
    if (m->counting) return;
    float *yf = y;
    const float *bf = b;
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < n; i++) yf[t * n + i] += bf[i];
}

void mt_bias_backward(mt_model *m, mt_act *db, const mt_act *dy, int64_t T, int64_t n) {
    if (m->counting || !db) return;
    float *d = db;
    const float *g = dy;
    for (int64_t i = 0; i < n; i++) {
        double s = 0;  // in order over t: the same bits on every run
        for (int64_t t = 0; t < T; t++) s += g[t * n + i];
        d[i] += (float)s;
    }
}

void mt_clip_forward(mt_model *m, mt_act *x, int64_t n, float c) {
    if (m->counting) return;
    float *v = x;
    for (int64_t i = 0; i < n; i++) v[i] = v[i] < -c ? -c : v[i] > c ? c : v[i];
}

// torch.clamp's gradient passes where -c <= x <= c (x the value before clamping) and is 0 elsewhere.
void mt_clip_backward(mt_model *m, mt_act *dy, const mt_act *x, int64_t n, float c) {
    if (m->counting) return;
    float *d = dy;
    const float *v = x;
    for (int64_t i = 0; i < n; i++)
        if (v[i] < -c || v[i] > c) d[i] = 0.0f;
}

// The same where the value before clamping was RMSNorm's output, computed again exactly as
// rmsnorm_forward_cpu did (w · (x · rstd)) from its kept input and statistics.
void mt_clip_backward_normed(mt_model *m, mt_act *dy, const mt_act *x_raw, const float *rstd, const mt_act *w,
                             int64_t rows, int64_t width, float c) {
    if (m->counting) return;
    float *d = dy;
    const float *x = x_raw, *wf = w;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < width; i++) {
            float v = wf[i] * (x[r * width + i] * rstd[r]);
            if (v < -c || v > c) d[r * width + i] = 0.0f;
        }
}
