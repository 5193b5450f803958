// moe/router_grouped.c — the DeepSeek-style router (CPU reference, fp32): sigmoid or softmax
// scores, a correction bias in the choice only, group-limited top-k, normalised and scaled
// weights (moe/moe.h); its backward and replay; and DeepSeek-V3's auxiliary-loss-free bias
// update. Read from transformers 5.24's DeepseekV3TopkRouter, Glm4MoeTopkRouter and
// DeepseekV2TopkRouter. The per-token arithmetic is moe/router_grouped_row.h, which the CUDA
// twin (moe/moe_cuda.cu) runs too.
#include "core/common.h"
#include "moe/moe.h"
#include "moe/router_grouped_row.h"

void moe_route_rule_check(const char *what, moe_route_rule r, int E, int k) {
    if (E < 1 || E > 1024 || k < 1 || k > E)
        mt_fatal(MT_EXIT_ERROR, "%s: E=%d k=%d out of range (1 <= k <= E <= 1024)", what, E, k);
    if (r.n_group <= 1) return;
    if (r.n_group > MOE_ROUTE_MAX_GROUPS || E % r.n_group != 0)
        mt_fatal(MT_EXIT_ERROR, "%s: n_group=%d must divide E=%d and be at most %d", what, r.n_group, E,
                 (int)MOE_ROUTE_MAX_GROUPS);
    if (r.topk_group < 1 || r.topk_group > r.n_group)
        mt_fatal(MT_EXIT_ERROR, "%s: topk_group=%d out of [1, n_group=%d]", what, r.topk_group, r.n_group);
    // fewer kept experts than k would have torch.topk pick masked (-inf) experts
    if (k > r.topk_group * (E / r.n_group))
        mt_fatal(MT_EXIT_ERROR, "%s: k=%d exceeds the %d experts of topk_group=%d groups", what, k,
                 r.topk_group * (E / r.n_group), r.topk_group);
    if (r.group_top2 && E / r.n_group < 2)
        mt_fatal(MT_EXIT_ERROR, "%s: a group's top-2 score needs 2 experts a group (E=%d, n_group=%d)", what, E,
                 r.n_group);
}

void router_grouped_forward_cpu(int32_t *ids, float *weights, float *scores, const float *logits,
                                const float *bias, int T, int E, int k, moe_route_rule rule) {
    moe_route_rule_check("router_grouped_forward_cpu", rule, E, k);
#pragma omp parallel for
    for (int t = 0; t < T; t++)
        rg_forward(ids + (int64_t)t * k, weights + (int64_t)t * k, scores + (int64_t)t * E,
                   logits + (int64_t)t * E, bias, E, k, rule);
}

void router_grouped_backward_cpu(float *dlogits, const float *dweights, const float *scores,
                                 const int32_t *ids, const float *weights, int T, int E, int k,
                                 moe_route_rule rule) {
#pragma omp parallel for
    for (int t = 0; t < T; t++)
        rg_backward(dlogits + (int64_t)t * E, dweights + (int64_t)t * k, scores + (int64_t)t * E,
                    ids + (int64_t)t * k, weights + (int64_t)t * k, E, k, rule);
}

void router_grouped_weights_of_choices_cpu(float *weights, const float *scores, const int32_t *ids,
                                           int T, int E, int k, moe_route_rule rule) {
    for (int t = 0; t < T; t++)
        rg_weights(weights + (int64_t)t * k, scores + (int64_t)t * E, ids + (int64_t)t * k, k, rule);
}

// ---------------------------------------------------------------------------------------------
// Auxiliary-loss-free balancing (DeepSeek-V3, section 2.1.2): after each step, an expert that got
// more than the mean load has its bias lowered by `rate`, one that got less raised. The bias
// steers the choice only (rg_choice), never the weights.

void router_load_accumulate_cpu(double *counts, const int32_t *ids, const uint8_t *row_mask, int T,
                                int E, int k) {
    for (int t = 0; t < T; t++) {
        if (row_mask && !row_mask[t]) continue;
        for (int j = 0; j < k; j++) {
            const int32_t e = ids[(int64_t)t * k + j];
            if (e >= 0 && e < E) counts[e] += 1.0;
        }
    }
}

// Counts are whole numbers: the total and E·counts[e] are exact, in any order of addition, so
// comparing them (load against mean, times E) gives the CUDA twin's signs too.
void router_bias_update_cpu(float *bias, const double *counts, int E, float rate) {
    double total = 0.0;
    for (int e = 0; e < E; e++) total += counts[e];
    for (int e = 0; e < E; e++) {
        const double c = E * counts[e];
        bias[e] += rate * (float)((c < total) - (c > total));
    }
}

double router_load_max_over_mean(const double *counts, int E) {
    double total = 0.0, max = 0.0;
    for (int e = 0; e < E; e++) total += counts[e], max = counts[e] > max ? counts[e] : max;
    return total > 0.0 ? max / (total / E) : 0.0;
}

// ---------------------------------------------------------------------------------------------
// Sequence-wise balance loss (DeepSeek-V3, section 2.1.2, eq. 17-20; DeepSeek-V2's seq_aux). The
// CUDA twin keeps these sums' orders: row sums over e, P over rows in double.

// cnt [E] = the sequence's choices per expert; returns its unmasked rows.
static int seq_counts(int32_t *cnt, const int32_t *ids, const uint8_t *mask, int64_t t0, int S, int E, int k) {
    int n = 0;
    for (int e = 0; e < E; e++) cnt[e] = 0;
    for (int64_t t = t0; t < t0 + S; t++) {
        if (mask && !mask[t]) continue;
        n++;
        for (int j = 0; j < k; j++) {
            const int32_t e = ids[t * k + j];
            if (e >= 0 && e < E) cnt[e]++;
        }
    }
    return n;
}

static float row_sum(const float *s, int E) {
    float z = 0.0f;
    for (int e = 0; e < E; e++) z += s[e];
    return z;
}

double router_seq_aux_sum_cpu(int64_t *seqs, const float *scores, const int32_t *ids,
                              const uint8_t *row_mask, int B, int S, int E, int k) {
    int32_t cnt[1024];
    double P[1024], total = 0.0;
    for (int b = 0; b < B; b++) {
        const int64_t t0 = (int64_t)b * S;
        const int n = seq_counts(cnt, ids, row_mask, t0, S, E, k);
        if (n == 0) continue;
        for (int e = 0; e < E; e++) P[e] = 0.0;
        for (int64_t t = t0; t < t0 + S; t++) {
            if (row_mask && !row_mask[t]) continue;
            const float *s = scores + t * E, z = row_sum(s, E);
            if (z > 0.0f)
                for (int e = 0; e < E; e++) P[e] += s[e] / z;
        }
        double L = 0.0;
        for (int e = 0; e < E; e++) L += (double)E * cnt[e] / ((double)k * n) * (P[e] / n);
        total += L;
        (*seqs)++;
    }
    return total;
}

// With g_e = dscale · f_e / n (the gradient on s'_te) and z = Σ_e s_te:
// ds_te = (g_e − Σ_i g_i·s_ti / z) / z; then through the sigmoid or the softmax.
void router_seq_aux_backward_cpu(float *dlogits, float dscale, const float *scores, const int32_t *ids,
                                 const uint8_t *row_mask, int B, int S, int E, int k, int sigmoid) {
#pragma omp parallel for
    for (int b = 0; b < B; b++) {
        int32_t cnt[1024];
        float g[1024];
        const int64_t t0 = (int64_t)b * S;
        const int n = seq_counts(cnt, ids, row_mask, t0, S, E, k);
        if (n == 0) continue;
        for (int e = 0; e < E; e++) g[e] = (float)(dscale * (double)E * cnt[e] / ((double)k * n * n));
        for (int64_t t = t0; t < t0 + S; t++) {
            if (row_mask && !row_mask[t]) continue;
            const float *s = scores + t * E, z = row_sum(s, E);
            float *dl = dlogits + t * E;
            if (!(z > 0.0f)) continue;
            float gs = 0.0f, sds = 0.0f;
            for (int e = 0; e < E; e++) gs += g[e] * s[e];
            gs /= z;
            if (sigmoid) {
                for (int e = 0; e < E; e++) dl[e] += (g[e] - gs) / z * (s[e] * (1.0f - s[e]));
                continue;
            }
            for (int e = 0; e < E; e++) sds += (g[e] - gs) / z * s[e];
            for (int e = 0; e < E; e++) dl[e] += s[e] * ((g[e] - gs) / z - sds);
        }
    }
}
