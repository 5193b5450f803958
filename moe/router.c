// moe/router.c — router softmax → top-k → (re)normalise, and its backward (CPU reference, fp32).
// As transformers' MixtralSparseMoeBlock (docs/design.md "The step's arithmetic"): softmax over all E experts in fp32,
// torch.topk of the probabilities, routing_weights /= routing_weights.sum(-1) (norm_topk).
#include <math.h>

#include "moe/moe.h"

// The order top-k ranks experts by: higher probability first, the lower index on a tie.
static inline int router_better(const float *p, int a, int b) {
    return p[a] > p[b] || (p[a] == p[b] && a < b);
}

// logits [T, E] → probs [T, E], ids [T, k], weights [T, k]
void router_forward_cpu(int32_t *ids, float *weights, float *probs, const float *logits, int T,
                        int E, int k, int norm_topk) {
#pragma omp parallel for
    for (int t = 0; t < T; t++) {
        const float *l = logits + (int64_t)t * E;
        float *p = probs + (int64_t)t * E;
        int32_t *id = ids + (int64_t)t * k;
        float *w = weights + (int64_t)t * k;
        float maxv = -INFINITY;
        for (int e = 0; e < E; e++) maxv = fmaxf(maxv, l[e]);
        float sum = 0.0f;
        for (int e = 0; e < E; e++) {
            p[e] = expf(l[e] - maxv);
            sum += p[e];
        }
        for (int e = 0; e < E; e++) p[e] /= sum;
        // choice j = the best expert ranked strictly below choice j-1: O(k·E), no scratch.
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if ((j == 0 || router_better(p, id[j - 1], e)) && (best < 0 || router_better(p, e, best)))
                    best = e;
            if (best < 0) {  // NaN probabilities order nothing: take the lowest expert unused
                for (int e = 0; e < E && best < 0; e++) {
                    int used = 0;
                    for (int i = 0; i < j; i++) used |= id[i] == e;
                    if (!used) best = e;
                }
            }
            id[j] = best;
            w[j] = p[best];
        }
        if (norm_topk) {
            float s = 0.0f;
            for (int j = 0; j < k; j++) s += w[j];
            for (int j = 0; j < k; j++) w[j] /= s;
        }
    }
}

// dweights [T, k] → dlogits [T, E] += ; with S = Σ_j p[id_j] and w_j = p[id_j] / S:
// dp[id_j] = (dw_j − Σ_i dw_i·w_i) / S (or dw_j without norm_topk), then the softmax backward
// dlogits_e += p_e · (dp_e − Σ_i dp_i·p_i). dp is non-zero only on the k chosen experts.
void router_backward_cpu(float *dlogits, const float *dweights, const float *probs,
                         const int32_t *ids, const float *weights, int T, int E, int k, int norm_topk) {
#pragma omp parallel for
    for (int t = 0; t < T; t++) {
        const float *p = probs + (int64_t)t * E;
        const int32_t *id = ids + (int64_t)t * k;
        const float *w = weights + (int64_t)t * k;
        const float *dw = dweights + (int64_t)t * k;
        float *dl = dlogits + (int64_t)t * E;
        float S = 1.0f, wdw = 0.0f;
        if (norm_topk) {
            S = 0.0f;
            for (int j = 0; j < k; j++) {
                S += p[id[j]];
                wdw += dw[j] * w[j];
            }
        }
        float pdp = 0.0f;  // Σ_e dp_e · p_e over the chosen experts
        for (int j = 0; j < k; j++) pdp += (dw[j] - wdw) / S * p[id[j]];
        for (int e = 0; e < E; e++) dl[e] -= p[e] * pdp;
        for (int j = 0; j < k; j++) dl[id[j]] += p[id[j]] * (dw[j] - wdw) / S;
    }
}
