// model/dispatch.c — each op of a step on the model's backend: the CPU reference kernels, or
// their CUDA twins (model/ops_cuda.h). The arguments are the CPU kernels'; pointers are memory
// of m->be. The null backend never calls these (its step runs no kernel).
#include <string.h>

#include "core/common.h"
#include "model/model_internal.h"
#include "model/ops.h"
#include "model/ops_cuda.h"
#include "moe/moe.h"

#ifdef MT_CUDA
#define ON_CUDA(m) ((m)->be->ops->kind == MT_BACKEND_CUDA)
#else
#define ON_CUDA(m) 0
#endif
// `cuda_call` is compiled only in CUDA builds, where its functions exist.
#ifdef MT_CUDA
#define DISPATCH(m, cpu_call, cuda_call) \
    do {                                 \
        if (ON_CUDA(m)) cuda_call;       \
        else cpu_call;                   \
    } while (0)
#else
#define DISPATCH(m, cpu_call, cuda_call) \
    do {                                 \
        (void)(m);                       \
        cpu_call;                        \
    } while (0)
#endif

void mt_op_embedding_forward(mt_model *m, float *out, const int32_t *tokens, const float *wte, int T, int H) {
    DISPATCH(m, embedding_forward_cpu(out, tokens, wte, T, H), embedding_forward_cuda(m->be, (mt_bf16 *)out, tokens, (const mt_bf16 *)wte, T, H));
}

void mt_op_embedding_backward(mt_model *m, float *dwte, const float *dout, const int32_t *tokens, int T, int H) {
    DISPATCH(m, embedding_backward_cpu(dwte, dout, tokens, T, H),
             embedding_backward_cuda(m->be, (mt_bf16 *)dwte, (const mt_bf16 *)dout, tokens, T, H));
}

void mt_op_rmsnorm_forward(mt_model *m, float *y, float *rstd, const float *x, const float *w, int T, int H,
                           float eps) {
    DISPATCH(m, rmsnorm_forward_cpu(y, rstd, x, w, T, H, eps), rmsnorm_forward_cuda(m->be, (mt_bf16 *)y, rstd, (const mt_bf16 *)x, (const mt_bf16 *)w, T, H, eps));
}

void mt_op_rmsnorm_backward(mt_model *m, float *dx, float *dw, const float *dy, const float *x, const float *w,
                            const float *rstd, int T, int H) {
    DISPATCH(m, rmsnorm_backward_cpu(dx, dw, dy, x, w, rstd, T, H),
             rmsnorm_backward_cuda(m->be, (mt_bf16 *)dx, (mt_bf16 *)dw, (const mt_bf16 *)dy, (const mt_bf16 *)x, (const mt_bf16 *)w, rstd, T, H));
}

void mt_op_rope(mt_model *m, float *x, const int32_t *pos, int T, int nh, int hd, float theta, int backward) {
    if (backward)
        DISPATCH(m, rope_backward_cpu(x, pos, T, nh, hd, theta), rope_backward_cuda(m->be, (mt_bf16 *)x, pos, T, nh, hd, theta));
    else
        DISPATCH(m, rope_forward_cpu(x, pos, T, nh, hd, theta), rope_forward_cuda(m->be, (mt_bf16 *)x, pos, T, nh, hd, theta));
}

void mt_op_attention_forward(mt_model *m, float *out, float *lse, const float *q, const float *k, const float *v,
                             const uint8_t *mask, int B, int S, int nh, int nkv, int hd, int window) {
    DISPATCH(m, attention_forward_cpu(out, lse, q, k, v, mask, B, S, nh, nkv, hd, window),
             attention_forward_cuda(m->be, (mt_bf16 *)out, lse, (const mt_bf16 *)q, (const mt_bf16 *)k, (const mt_bf16 *)v, mask, B, S, nh, nkv, hd, window));
}

void mt_op_attention_backward(mt_model *m, float *dq, float *dk, float *dv, const float *dout, const float *q,
                              const float *k, const float *v, const float *out, const float *lse,
                              const uint8_t *mask, int B, int S, int nh, int nkv, int hd, int window) {
    DISPATCH(m, attention_backward_cpu(dq, dk, dv, dout, q, k, v, out, lse, mask, B, S, nh, nkv, hd, window),
             attention_backward_cuda(m->be, (mt_bf16 *)dq, (mt_bf16 *)dk, (mt_bf16 *)dv, (const mt_bf16 *)dout, (const mt_bf16 *)q, (const mt_bf16 *)k, (const mt_bf16 *)v, (const mt_bf16 *)out, lse, mask, B, S, nh, nkv, hd, window));
}

double mt_op_cross_entropy(mt_model *m, float *dlogits, float dscale, int64_t *count, const float *logits,
                           const int32_t *targets, int T, int V) {
    double sum = 0.0;
    DISPATCH(m, sum = cross_entropy_cpu(dlogits, dscale, count, logits, targets, T, V, -100),
             sum = cross_entropy_cuda(m->be, dlogits, dscale, count, logits, targets, T, V, -100));
    return sum;
}

void mt_op_add(mt_model *m, float *y, const float *a, const float *b, int64_t n) {
    DISPATCH(m, for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i], mt_add_cuda(m->be, (mt_bf16 *)y, (const mt_bf16 *)a, (const mt_bf16 *)b, n));
}

void mt_op_router_forward(mt_model *m, int32_t *ids, float *weights, float *probs, const float *logits, int T,
                          int E, int k) {
    DISPATCH(m, router_forward_cpu(ids, weights, probs, logits, T, E, k, 1),
             router_forward_cuda(m->be, ids, weights, probs, logits, T, E, k, 1));
}

void mt_op_router_backward(mt_model *m, float *dlogits, const float *dweights, const float *probs,
                           const int32_t *ids, const float *weights, int T, int E, int k) {
    DISPATCH(m, router_backward_cpu(dlogits, dweights, probs, ids, weights, T, E, k, 1),
             router_backward_cuda(m->be, dlogits, dweights, probs, ids, weights, T, E, k, 1));
}

// The chosen probabilities of recorded choices, renormalised (replay of a recomputed layer).
static void weights_of_choices_cpu(float *weights, const float *probs, const int32_t *ids, int T, int E, int k) {
    for (int t = 0; t < T; t++) {
        float sum = 0;
        for (int j = 0; j < k; j++) sum += probs[(int64_t)t * E + ids[t * k + j]];
        for (int j = 0; j < k; j++) weights[t * k + j] = probs[(int64_t)t * E + ids[t * k + j]] / sum;
    }
}

void mt_op_weights_of_choices(mt_model *m, float *weights, const float *probs, const int32_t *ids, int T, int E,
                              int k) {
    DISPATCH(m, weights_of_choices_cpu(weights, probs, ids, T, E, k),
             moe_weights_of_choices_cuda(m->be, weights, probs, ids, T, E, k));
}

// The aux statistics: m->aux on the CPU; on CUDA a device copy (m->aux_dev) that layers add to,
// brought to m->aux once per forward (mt_op_aux_finish).
void mt_op_aux_accumulate(mt_model *m, const float *probs, const int32_t *ids, const uint8_t *mask, int T) {
    DISPATCH(m, moe_aux_accumulate_cpu(&m->aux, probs, ids, mask, T),
             moe_aux_accumulate_cuda(m->be, (double *)m->aux_dev->data, probs, ids, mask, T, m->aux.E, m->aux.k));
}

void mt_op_aux_start(mt_model *m) {
    moe_aux_init(&m->aux, (int)m->cfg.experts, (int)m->cfg.top_k);
    if (m->aux_dev) m->be->ops->fill_zero(m->be, m->aux_dev->data, m->aux_dev->nbytes);
}

void mt_op_aux_finish(mt_model *m) {
    DISPATCH(m, (void)0, moe_aux_stats_download_cuda(m->be, &m->aux, (const double *)m->aux_dev->data));
}

// After the host statistics changed (summed over ranks): the device copy follows.
void mt_op_aux_upload(mt_model *m) {
    if (!m->aux_dev) return;
    int E = m->aux.E;
    double *v = mt_xcalloc((size_t)MT_AUX_STATS_LEN(E), sizeof(double));
    memcpy(v, m->aux.counts, (size_t)E * sizeof(double));
    memcpy(v + E, m->aux.prob_sums, (size_t)E * sizeof(double));
    v[2 * E] = (double)m->aux.rows;
    mt_tensor_upload(m->aux_dev, v);
    free(v);
}

void mt_op_aux_backward(mt_model *m, float *dlogits, float coef, const float *probs, const uint8_t *mask, int T) {
    DISPATCH(m, moe_aux_backward_cpu(dlogits, coef, &m->aux, probs, mask, T),
             moe_aux_backward_cuda(m->be, dlogits, coef, (const double *)m->aux_dev->data, probs, mask, T, m->aux.E));
}

double mt_op_zloss_sum(mt_model *m, int64_t *rows, const float *logits, const uint8_t *mask, int T, int E) {
    double sum = 0.0;
    DISPATCH(m, sum = moe_zloss_sum_cpu(rows, logits, mask, T, E),
             sum = moe_zloss_sum_cuda(m->be, rows, logits, mask, T, E));
    return sum;
}

void mt_op_zloss_backward(mt_model *m, float *dlogits, float dscale, const float *logits, const uint8_t *mask, int T,
                          int E) {
    DISPATCH(m, moe_zloss_backward_cpu(dlogits, dscale, logits, mask, T, E),
             moe_zloss_backward_cuda(m->be, dlogits, dscale, logits, mask, T, E));
}

// Layer L's expert order from its recorded choices, and the host copy of the offsets that the
// expert loop walks (on CUDA: one small download, the step's one sync per layer).
void mt_op_permute(mt_model *m, int L) {
    mt_layer_kept *kp = &m->kept[L];
    int T = m->B * m->S, E = (int)m->cfg.experts, k = (int)m->cfg.top_k;
    int32_t *order = kp->order->data, *offsets = kp->offsets->data;
    const int32_t *ids = kp->ids->data;
    if (ON_CUDA(m)) {
#ifdef MT_CUDA
        moe_permute_cuda(m->be, order, offsets, NULL, ids, T, E, k);
        mt_tensor_download(kp->offsets, kp->host_offsets);
#endif
    } else {
        moe_permute_cpu(order, offsets, NULL, ids, T, E, k);
        memcpy(kp->host_offsets, offsets, (size_t)(E + 1) * sizeof(int32_t));
    }
    for (int e = 0; e < E; e++) kp->counts[e] = kp->host_offsets[e + 1] - kp->host_offsets[e];
}

void mt_op_gather(mt_model *m, float *xs, const float *x, const int32_t *order, int n, int H, int k) {
    DISPATCH(m, moe_gather_cpu(xs, x, order, n, H, k), moe_gather_cuda(m->be, xs, x, order, n, H, k));
}

void mt_op_gather_backward(mt_model *m, float *dx, const float *dxs, const int32_t *order, int n, int H, int k) {
    DISPATCH(m, moe_gather_backward_cpu(dx, dxs, order, n, H, k), moe_gather_backward_cuda(m->be, dx, dxs, order, n, H, k));
}

void mt_op_combine(mt_model *m, float *out, const float *ys, const float *weights, const int32_t *order, int n, int H,
                   int k) {
    DISPATCH(m, moe_combine_cpu(out, ys, weights, order, n, H, k),
             moe_combine_cuda(m->be, out, ys, weights, order, n, H, k));
}

void mt_op_combine_backward(mt_model *m, float *dys, float *dweights, const float *dout, const float *ys,
                            const float *weights, const int32_t *order, int n, int H, int k) {
    DISPATCH(m, moe_combine_backward_cpu(dys, dweights, dout, ys, weights, order, n, H, k),
             moe_combine_backward_cuda(m->be, dys, dweights, dout, ys, weights, order, n, H, k));
}

void mt_op_swiglu_forward(mt_model *m, float *a, const float *g, const float *u, int64_t n) {
    DISPATCH(m, swiglu_forward_cpu(a, g, u, n), swiglu_forward_cuda(m->be, a, g, u, n));
}

void mt_op_swiglu_backward(mt_model *m, float *dg, float *du, const float *da, const float *g, const float *u,
                           int64_t n) {
    DISPATCH(m, swiglu_backward_cpu(dg, du, da, g, u, n), swiglu_backward_cuda(m->be, dg, du, da, g, u, n));
}
