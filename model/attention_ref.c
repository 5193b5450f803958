// model/attention_ref.c — the scalar reference of model/attention.c: causal grouped-query attention
// with sliding window and key padding mask, fp32, one (query, head, key) at a time. Forward keeps
// only lse [T, nh]; backward recomputes the probabilities, so no S×S matrix outlives a call.
// The tiled kernels in model/attention.c are tested against these (tests/test_model_ops.c).
//
// Visibility (the one rule every loop below uses): key j is visible to query i of sequence b iff
//   j ≤ i  and  (window == 0 or i − j < window)  and  (key_mask == NULL or key_mask[b·S + j]).
// This is transformers' sliding-window mask (masking_utils.sliding_window_overlay:
// kv_idx > q_idx − sliding_window), so a query sees itself and the window − 1 keys before it;
// window = 1 sees only itself. (flash-attn's window_size = (w, 0) means i − j ≤ w: one more key.)
#include <math.h>
#include <stdlib.h>

#include "core/common.h"
#include "model/ops.h"

static inline int attn_visible(const uint8_t *key_mask, int b, int S, int i, int j, int window) {
    return j <= i && (window == 0 || i - j < window) && (!key_mask || key_mask[(int64_t)b * S + j]);
}

// First visible key index for query i ignoring the mask: keys before it are outside the window.
static inline int attn_first_key(int i, int window) {
    return window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
}

static void attn_check_shape(int nh, int nkv, int hd, int hd_v) {
    if (nkv <= 0 || nh % nkv != 0 || hd <= 0 || hd_v <= 0)
        mt_fatal(MT_EXIT_ERROR, "attention: nh=%d must be a multiple of nkv=%d, hd=%d and hd_v=%d > 0", nh, nkv, hd,
                 hd_v);
}

static inline float dot_f(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int d = 0; d < n; d++) s += a[d] * b[d];
    return s;
}

// q [T, nh, hd], k [T, nkv, hd], v [T, nkv, hd_v], sinks [nh] or NULL, key_mask [T] or NULL
// → out [T, nh, hd_v], lse [T, nh]
void attention_forward_ref(float *out, float *lse, const float *q, const float *k, const float *v, const float *sinks,
                           const uint8_t *key_mask, int B, int S, int nh, int nkv, int hd, int hd_v, float scale,
                           int window) {
    attn_check_shape(nh, nkv, hd, hd_v);
    const int group = nh / nkv;
#pragma omp parallel
    {
        float *p = mt_xmalloc((size_t)S * sizeof(float));  // this thread's row of scores
#pragma omp for collapse(3)
        for (int b = 0; b < B; b++)
            for (int i = 0; i < S; i++)
                for (int h = 0; h < nh; h++) {
                    int64_t ti = (int64_t)b * S + i;
                    const float *qi = q + (ti * nh + h) * hd;
                    float *oi = out + (ti * nh + h) * hd_v;
                    int kvh = h / group;
                    // scaled scores of visible keys and their max
                    float m = -INFINITY;
                    for (int j = attn_first_key(i, window); j <= i; j++) {
                        if (!attn_visible(key_mask, b, S, i, j, window)) continue;
                        const float *kj = k + (((int64_t)b * S + j) * nkv + kvh) * hd;
                        p[j] = dot_f(qi, kj, hd) * scale;
                        if (p[j] > m) m = p[j];
                    }
                    for (int d = 0; d < hd_v; d++) oi[d] = 0.0f;
                    if (m == -INFINITY) {  // no visible key: out 0, lse -inf (the sink), and no 0/0
                        lse[ti * nh + h] = sinks ? sinks[h] : -INFINITY;
                        continue;
                    }
                    // out = Σ_j exp(s_j − m) v_j / Σ_j exp(s_j − m)
                    double sum = 0.0;
                    for (int j = attn_first_key(i, window); j <= i; j++) {
                        if (!attn_visible(key_mask, b, S, i, j, window)) continue;
                        float e = expf(p[j] - m);
                        sum += e;
                        const float *vj = v + (((int64_t)b * S + j) * nkv + kvh) * hd_v;
                        for (int d = 0; d < hd_v; d++) oi[d] += e * vj[d];
                    }
                    if (sinks) sum += exp((double)sinks[h] - m);  // in the denominator only
                    float inv = (float)(1.0 / sum);
                    for (int d = 0; d < hd_v; d++) oi[d] *= inv;
                    lse[ti * nh + h] = m + (float)log(sum);
                }
        free(p);
    }
}

// With P_ij = exp(s_ij − lse_i), s_ij = scale·q_i·k_j:
//   dP_ij = dO_i·v_j,  D_i = dO_i·O_i (= Σ_j P_ij dP_ij),  dS_ij = P_ij (dP_ij − D_i)
//   dq_i += scale Σ_j dS_ij k_j,  dk_j += scale Σ_i dS_ij q_i,  dv_j += Σ_i P_ij dO_i
// With sinks (lse includes them) the sink's column has dP = 0: dsink_h = −Σ_i exp(sink_h − lse_i) D_i.
// Two passes so that each output row has one writer (no atomics, deterministic at any thread
// count): pass 1 over queries writes dq, pass 2 over (key, kv head) writes dk and dv, summing
// the query heads of its group. D [T, nh] is computed once between them.
// q [T, nh, hd], k [T, nkv, hd], v [T, nkv, hd_v], dout, out [T, nh, hd_v], lse [T, nh]
// → dq +=, dk +=, dv += (NULL skipped)
void attention_backward_ref(float *dq, float *dk, float *dv, float *dsinks, const float *dout, const float *q,
                            const float *k, const float *v, const float *out, const float *lse, const float *sinks,
                            const uint8_t *key_mask, int B, int S, int nh, int nkv, int hd, int hd_v, float scale,
                            int window) {
    attn_check_shape(nh, nkv, hd, hd_v);
    const int group = nh / nkv;
    const int64_t T = (int64_t)B * S;
    float *D = mt_xmalloc((size_t)T * nh * sizeof(float));
#pragma omp parallel for
    for (int64_t r = 0; r < T * nh; r++) D[r] = dot_f(dout + r * hd_v, out + r * hd_v, hd_v);
    if (dsinks && !sinks) mt_fatal(MT_EXIT_ERROR, "attention_backward_ref: dsinks without sinks");
    if (dsinks)
        for (int h = 0; h < nh; h++) {
            double acc = 0.0;
            for (int64_t t = 0; t < T; t++) acc -= exp((double)sinks[h] - lse[t * nh + h]) * D[t * nh + h];
            dsinks[h] += (float)acc;
        }

    if (dq) {
#pragma omp parallel for collapse(3)
        for (int b = 0; b < B; b++)
            for (int i = 0; i < S; i++)
                for (int h = 0; h < nh; h++) {
                    int64_t ti = (int64_t)b * S + i, r = ti * nh + h;
                    if (lse[r] == -INFINITY) continue;  // no visible key: zero gradient
                    const float *qi = q + r * hd, *gi = dout + r * hd_v;
                    float *dqi = dq + r * hd;
                    int kvh = h / group;
                    for (int j = attn_first_key(i, window); j <= i; j++) {
                        if (!attn_visible(key_mask, b, S, i, j, window)) continue;
                        int64_t kr = ((int64_t)b * S + j) * nkv + kvh;
                        const float *kj = k + kr * hd, *vj = v + kr * hd_v;
                        float pij = expf(dot_f(qi, kj, hd) * scale - lse[r]);
                        float ds = pij * (dot_f(gi, vj, hd_v) - D[r]) * scale;
                        for (int d = 0; d < hd; d++) dqi[d] += ds * kj[d];
                    }
                }
    }

    if (dk || dv) {
#pragma omp parallel for collapse(3)
        for (int b = 0; b < B; b++)
            for (int j = 0; j < S; j++)
                for (int kvh = 0; kvh < nkv; kvh++) {
                    int64_t kr = ((int64_t)b * S + j) * nkv + kvh;
                    if (key_mask && !key_mask[(int64_t)b * S + j]) continue;  // seen by no one
                    const float *kj = k + kr * hd, *vj = v + kr * hd_v;
                    int64_t reach = window > 0 ? (int64_t)j + window - 1 : S - 1;
                    int last = reach < S - 1 ? (int)reach : S - 1;
                    for (int i = j; i <= last; i++) {  // the queries that can see key j
                        int64_t ti = (int64_t)b * S + i;
                        if (!attn_visible(key_mask, b, S, i, j, window)) continue;  // (bounds did)
                        for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                            int64_t r = ti * nh + h;
                            const float *qi = q + r * hd, *gi = dout + r * hd_v;
                            float pij = expf(dot_f(qi, kj, hd) * scale - lse[r]);
                            if (dv)
                                for (int d = 0; d < hd_v; d++) dv[kr * hd_v + d] += pij * gi[d];
                            if (dk) {
                                float ds = pij * (dot_f(gi, vj, hd_v) - D[r]) * scale;
                                for (int d = 0; d < hd; d++) dk[kr * hd + d] += ds * qi[d];
                            }
                        }
                    }
                }
    }
    free(D);
}
