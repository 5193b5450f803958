// moe/router_grouped_row.h — one token of the DeepSeek-style router (moe/moe.h, moe_route_rule),
// written once for the CPU (moe/router_grouped.c) and its CUDA twin (moe/moe_cuda.cu, a thread
// per token): the same operations in the same order, so the two can differ only where expf does.
#pragma once
#include <math.h>
#include <stdint.h>

#include "moe/moe.h"

#ifdef __CUDACC__
#define MT_RG_FN static inline __host__ __device__
#else
#define MT_RG_FN static inline
#endif

// a ranks before b: the higher value, the lower index on a tie. Never true with a NaN.
MT_RG_FN int rg_before(float va, int a, float vb, int b) { return va > vb || (va == vb && a < b); }

// Whether v (not NaN) is the next in rank: strictly after the previous pick (prev < 0: none yet)
// and before the best so far (best < 0: none). NaN values are never ranked: they are only taken
// after every ranked value is, so picks never repeat.
MT_RG_FN int rg_next(float v, int i, float pv, int prev, float bv, int best) {
    return v == v && (prev < 0 || rg_before(pv, prev, v, i)) && (best < 0 || rg_before(v, i, bv, best));
}

// The choice score of expert e: its score plus the correction bias.
MT_RG_FN float rg_choice(const float *s, const float *bias, int e) { return bias ? s[e] + bias[e] : s[e]; }

// s [E] = sigmoid(l) or softmax(l) (moe/router.c's), fp32.
MT_RG_FN void rg_scores(float *s, const float *l, int E, int sigmoid) {
    if (sigmoid) {
        for (int e = 0; e < E; e++) s[e] = 1.0f / (1.0f + expf(-l[e]));
        return;
    }
    float maxv = -INFINITY, sum = 0.0f;
    for (int e = 0; e < E; e++) maxv = fmaxf(maxv, l[e]);
    for (int e = 0; e < E; e++) sum += s[e] = expf(l[e] - maxv);
    for (int e = 0; e < E; e++) s[e] /= sum;
}

// The groups whose experts may be chosen, one bit each (without groups: the one group, bit 0).
// Group g scores the sum of its top-2 choice scores (a tie counts twice, as torch.topk) or their
// max; the best topk_group groups are kept, ties to the lower group. NaN choice scores are passed
// over here; NaN group scores (an inf bias) order nothing and the lowest groups not kept fill in.
MT_RG_FN uint64_t rg_kept_groups(const float *s, const float *bias, int E, moe_route_rule r) {
    if (r.n_group <= 1) return 1;
    const int G = r.n_group, n = E / G;
    float gs[MOE_ROUTE_MAX_GROUPS];
    for (int g = 0; g < G; g++) {
        float m1 = -INFINITY, m2 = -INFINITY;
        for (int e = g * n; e < (g + 1) * n; e++) {
            const float c = rg_choice(s, bias, e);
            if (c > m1) m2 = m1, m1 = c;
            else if (c > m2) m2 = c;
        }
        gs[g] = r.group_top2 ? m1 + m2 : m1;
    }
    uint64_t kept = 0;
    for (int j = 0, prev = -1; j < r.topk_group; j++) {
        int best = -1;  // the best group ranked strictly below the previous one
        for (int g = 0; g < G; g++)
            if (rg_next(gs[g], g, prev < 0 ? 0.0f : gs[prev], prev, best < 0 ? 0.0f : gs[best], best)) best = g;
        for (int g = 0; g < G && best < 0; g++)
            if (!(kept >> g & 1)) best = g;
        kept |= 1ull << best;
        prev = best;
    }
    return kept;
}

// id [k] = the top-k choice scores among the kept groups' experts, highest first, ties to the
// lower index. The other experts are out entirely, as transformers 5.x's V3/GLM and DeepSeek's
// own code mask them with -inf (transformers 4.57's DeepseekV3 masked with 0.0, which lets a
// masked expert in when a kept one's biased score is below 0; 5.x's DeepseekV2 still masks its
// softmax scores with 0.0: the same choice, k being at most the kept experts, unless a kept score
// underflows to 0). O(k·E): choice j is the best expert ranked strictly below choice j-1. NaN
// choice scores order nothing: the lowest kept experts unused fill in.
MT_RG_FN void rg_choose(int32_t *id, const float *s, const float *bias, uint64_t kept, int E, int k, int G) {
    const int n = E / G;
    for (int j = 0; j < k; j++) {
        const int prev = j ? id[j - 1] : -1;
        const float pv = j ? rg_choice(s, bias, prev) : 0.0f;
        int best = -1;
        float bv = 0.0f;
        for (int g = 0; g < G; g++) {
            if (!(kept >> g & 1)) continue;
            for (int e = g * n; e < (g + 1) * n; e++) {
                const float c = rg_choice(s, bias, e);
                if (rg_next(c, e, pv, prev, bv, best)) best = e, bv = c;
            }
        }
        for (int g = 0; g < G && best < 0; g++) {
            if (!(kept >> g & 1)) continue;
            for (int e = g * n; e < (g + 1) * n && best < 0; e++) {
                int used = 0;
                for (int i = 0; i < j; i++) used |= id[i] == e;
                if (!used) best = e;
            }
        }
        id[j] = best;
    }
}

// w [k] = the chosen (unbiased) scores, / (their sum + 1e-20) when norm_topk, then · scaling:
// transformers' order of operations.
MT_RG_FN void rg_weights(float *w, const float *s, const int32_t *id, int k, moe_route_rule r) {
    float sum = 0.0f;
    for (int j = 0; j < k; j++) sum += w[j] = s[id[j]];
    const float den = sum + 1e-20f;
    for (int j = 0; j < k; j++) {
        if (r.norm_topk) w[j] /= den;
        w[j] *= r.scaling;
    }
}

MT_RG_FN void rg_forward(int32_t *id, float *w, float *s, const float *l, const float *bias, int E, int k,
                         moe_route_rule r) {
    rg_scores(s, l, E, r.sigmoid);
    rg_choose(id, s, bias, rg_kept_groups(s, bias, E, r), E, k, r.n_group > 1 ? r.n_group : 1);
    rg_weights(w, s, id, k, r);
}

// dl [E] += the gradient of one row. With a = scaling, D = Σ_j s_j + 1e-20 (s_j = s[id_j]) and
// w_j = a·s_j / D: ds_j = (a·dw_j − Σ_i dw_i·w_i) / D when norm_topk, else a·dw_j; the choice and
// the bias are constants. Then sigmoid: dl[id_j] += ds_j·s_j·(1 − s_j); softmax: dl_e +=
// s_e·(ds_e − Σ_j ds_j·s_j) over all e (ds is non-zero on the chosen experts only).
MT_RG_FN void rg_backward(float *dl, const float *dw, const float *s, const int32_t *id, const float *w, int E, int k,
                          moe_route_rule r) {
    const float a = r.scaling;
    float den = 1.0f, wdw = 0.0f;
    if (r.norm_topk) {
        float sum = 0.0f;
        for (int j = 0; j < k; j++) sum += s[id[j]], wdw += dw[j] * w[j];
        den = sum + 1e-20f;
    }
    if (r.sigmoid) {
        for (int j = 0; j < k; j++) {
            const float sj = s[id[j]];
            dl[id[j]] += (a * dw[j] - wdw) / den * (sj * (1.0f - sj));
        }
        return;
    }
    float sds = 0.0f;
    for (int j = 0; j < k; j++) sds += (a * dw[j] - wdw) / den * s[id[j]];
    for (int e = 0; e < E; e++) dl[e] -= s[e] * sds;
    for (int j = 0; j < k; j++) dl[id[j]] += s[id[j]] * ((a * dw[j] - wdw) / den);
}
