// moe/aux_loss.c — the load-balancing aux loss and the router z-loss (CPU reference).
//
// transformers' load_balancing_loss_func (models/mixtral/modeling_mixtral.py, read for this
// file): the router logits of all layers are concatenated (rows = layers × tokens), re-softmaxed
// and top-k'd; with an attention_mask it builds expert_attention_mask [rows, k, E] and
// router_per_expert_attention_mask [rows, E] by broadcasting the per-token 0/1 mask (the same
// mask for every layer), and computes
//   tokens_per_expert[j,e]    = Σ_rows onehot[row,j,e]·mask[row] / Σ_rows mask[row]
//   router_prob_per_expert[e] = Σ_rows probs[row,e]·mask[row]    / Σ_rows mask[row]
//   loss = E · Σ_j Σ_e tokens_per_expert[j,e] · router_prob_per_expert[e]
// Every entry of either broadcast mask sums to the same count, the unmasked rows, so both are
// plain means over the unmasked rows: counts/rows and prob_sums/rows here. There is no 1/k, so
// a perfectly balanced router scores k. Where transformers divides 0/0 (every row masked) and
// returns NaN, we return 0 with gradient 0. Only router_prob_per_expert carries gradient
// (the one-hot of a top-k has none).
#include <math.h>
#include <string.h>

#include "core/common.h"
#include "moe/moe.h"

void moe_aux_init(moe_aux_stats *s, int E, int k) {
    if (E < 1 || E > (int)MT_ARRAY_LEN(s->counts) || k < 1 || k > E)
        mt_fatal(MT_EXIT_ERROR, "moe_aux_init: E=%d k=%d out of range (1 ≤ k ≤ E ≤ %d)", E, k,
                 (int)MT_ARRAY_LEN(s->counts));
    memset(s, 0, sizeof *s);
    s->E = E;
    s->k = k;
}

// probs [T, E], ids [T, k], row_mask [T] or NULL. Serial, in row order: a reproducible sum.
void moe_aux_accumulate_cpu(moe_aux_stats *s, const float *probs, const int32_t *ids,
                            const uint8_t *row_mask, int T) {
    const int E = s->E, k = s->k;
    for (int t = 0; t < T; t++) {
        if (row_mask && !row_mask[t]) continue;
        const float *p = probs + (int64_t)t * E;
        for (int e = 0; e < E; e++) s->prob_sums[e] += p[e];
        for (int j = 0; j < k; j++) {
            int32_t e = ids[(int64_t)t * k + j];
            if (e >= 0 && e < E) s->counts[e] += 1.0;
        }
        s->rows++;
    }
}

// L = E · Σ_e (counts[e]/rows) · (prob_sums[e]/rows); 0 when no row counts.
double moe_aux_loss(const moe_aux_stats *s) {
    if (s->rows == 0) return 0.0;
    const double n = (double)s->rows;
    double L = 0.0;
    for (int e = 0; e < s->E; e++) L += (s->counts[e] / n) * (s->prob_sums[e] / n);
    return s->E * L;
}

// dL/dprobs[t,e] = E · counts[e] / rows² on unmasked rows (f constant), through the softmax:
// dlogits[t,e] += coef · p_e · (g_e − Σ_i g_i p_i). probs [T, E] → dlogits [T, E] +=
void moe_aux_backward_cpu(float *dlogits, float coef, const moe_aux_stats *s, const float *probs,
                          const uint8_t *row_mask, int T) {
    if (s->rows == 0) return;
    const int E = s->E;
    const double n = (double)s->rows;
    float g[1024];
    for (int e = 0; e < E; e++) g[e] = (float)(coef * E * s->counts[e] / (n * n));
#pragma omp parallel for
    for (int t = 0; t < T; t++) {
        if (row_mask && !row_mask[t]) continue;
        const float *p = probs + (int64_t)t * E;
        float *dl = dlogits + (int64_t)t * E;
        float gp = 0.0f;
        for (int e = 0; e < E; e++) gp += g[e] * p[e];
        for (int e = 0; e < E; e++) dl[e] += p[e] * (g[e] - gp);
    }
}

// logsumexp of one row of E logits, max-subtracted, in double.
static double row_lse(const float *l, int E) {
    float maxv = -INFINITY;
    for (int e = 0; e < E; e++) maxv = fmaxf(maxv, l[e]);
    if (isinf(maxv)) return maxv;  // all -inf (or a +inf): lse is that infinity
    double sum = 0.0;
    for (int e = 0; e < E; e++) sum += exp((double)l[e] - maxv);
    return maxv + log(sum);
}

// logits [T, E] → Σ over unmasked rows of lse², *rows += unmasked rows. Serial, in row order
// (an OpenMP reduction combines in arrival order, which is not reproducible bit for bit).
double moe_zloss_sum_cpu(int64_t *rows, const float *logits, const uint8_t *row_mask, int T, int E) {
    double z = 0.0;
    int64_t n = 0;
    for (int t = 0; t < T; t++) {
        if (row_mask && !row_mask[t]) continue;
        double lse = row_lse(logits + (int64_t)t * E, E);
        z += lse * lse;
        n++;
    }
    *rows += n;
    return z;
}

// dlogits [T, E] += dscale · 2 · lse · softmax(logits), on unmasked rows
void moe_zloss_backward_cpu(float *dlogits, float dscale, const float *logits,
                            const uint8_t *row_mask, int T, int E) {
#pragma omp parallel for
    for (int t = 0; t < T; t++) {
        if (row_mask && !row_mask[t]) continue;
        const float *l = logits + (int64_t)t * E;
        float *dl = dlogits + (int64_t)t * E;
        double lse = row_lse(l, E);
        double c = 2.0 * dscale * lse;
        for (int e = 0; e < E; e++) dl[e] += (float)(c * exp((double)l[e] - lse));
    }
}
