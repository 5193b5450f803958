// model/dispatch.c — each op of a step on the model's backend: the CPU reference kernels, or
// their CUDA twins (model/ops_cuda.h). The arguments are the CPU kernels'; pointers are memory
// of m->be, mt_act ones in the step's storage dtype (model/model_internal.h: f32 on the cpu, bf16
// on cuda). The null backend never calls these (its step runs no kernel), but
// mt_op_attention_count, which makes the attention's scratch on it.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/profile.h"
#include "model/attention_cudnn.h"
#include "model/attention_scratch.h"
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

// MT_PROFILE (core/profile.h): `body` as a region of the step's profile named after
// scripts/step_model.h's op, with its FLOPs and bytes (step_model's conventions; AB: bytes of a
// stored activation element), evaluated only when a profiled step runs.
#define PROFILED(name, flops, bytes, ...)                   \
    do {                                                    \
        if (mt_prof_active) {                               \
            mt_prof_push2_on(name, NULL);                   \
            mt_prof_count_on((double)(flops), (double)(bytes)); \
        }                                                   \
        __VA_ARGS__;                                        \
        mt_prof_pop();                                      \
    } while (0)
#define AB(m) ((double)mt_dtype_bytes(act_dtype(m), 1))

void mt_op_embedding_forward(mt_model *m, mt_act *out, const int32_t *tokens, const mt_act *wte, int T, int H) {
    PROFILED("embedding", 0, 2 * AB(m) * T * H, {
        DISPATCH(m, embedding_forward_cpu(out, tokens, wte, T, H), embedding_forward_cuda(m->be, out, tokens, wte, T, H));
    });
}

void mt_op_embedding_backward(mt_model *m, mt_act *dwte, const mt_act *dout, const int32_t *tokens, int T, int H) {
    PROFILED("embedding", 0, 3 * AB(m) * T * H, {
        DISPATCH(m, embedding_backward_cpu(dwte, dout, tokens, T, H),
                 embedding_backward_cuda(m->be, dwte, dout, tokens, T, H));
    });
}

void mt_op_rmsnorm_forward(mt_model *m, mt_act *y, float *rstd, const mt_act *x, const mt_act *w, int T, int H,
                           float eps) {
    PROFILED("rmsnorm", 4.0 * T * H, 2 * AB(m) * T * H + 4.0 * T, {
        DISPATCH(m, rmsnorm_forward_cpu(y, rstd, x, w, T, H, eps), rmsnorm_forward_cuda(m->be, y, rstd, x, w, T, H, eps));
    });
}

void mt_op_rmsnorm_backward(mt_model *m, mt_act *dx, mt_act *dw, const mt_act *dy, const mt_act *x, const mt_act *w,
                            const float *rstd, int T, int H) {
    PROFILED("rmsnorm", 6.0 * T * H, 4 * AB(m) * T * H + 4.0 * T, {
        DISPATCH(m, rmsnorm_backward_cpu(dx, dw, dy, x, w, rstd, T, H),
                 rmsnorm_backward_cuda(m->be, dx, dw, dy, x, w, rstd, T, H));
    });
}

void mt_op_rope(mt_model *m, mt_act *x, const int32_t *pos, int T, int nh, int stride, int off, int rot,
                int interleave, int backward) {
    const float *inv = m->rope_inv_freq, sc = m->rope_scale;
    const float *inv_dev = m->rope_inv_freq_dev ? m->rope_inv_freq_dev->data : NULL;
    (void)inv_dev;
    PROFILED("rope (q, k)", 3.0 * T * nh * rot, 2 * AB(m) * T * nh * rot, {
        if (backward)
            DISPATCH(m, rope_backward_cpu(x, pos, T, nh, stride, off, rot, interleave, inv, sc),
                     rope_backward_cuda(m->be, x, pos, T, nh, stride, off, rot, interleave, inv_dev, sc));
        else
            DISPATCH(m, rope_forward_cpu(x, pos, T, nh, stride, off, rot, interleave, inv, sc),
                     rope_forward_cuda(m->be, x, pos, T, nh, stride, off, rot, interleave, inv_dev, sc));
    });
}

#ifdef MT_CUDA
// cuDNN takes a key mask as sequence lengths: made on the device when this step's padding is all
// at the sequences' ends (m->pad_right, from the host mask), in work scratch freed by kv_len_end.
static int32_t *kv_len_begin(mt_model *m, const uint8_t *mask, int B, int S) {
    if (!mask || !m->pad_right) return NULL;
    int32_t *kv = mt_work_alloc(m->be, (size_t)B * sizeof(int32_t));
    attention_kv_len_cuda(m->be, kv, mask, B, S);
    return kv;
}
static void kv_len_end(mt_model *m, int32_t *kv, int B) {
    if (kv) mt_work_free(m->be, kv, (size_t)B * sizeof(int32_t));
}
static void attention_forward_on_cuda(mt_model *m, mt_act *out, float *lse, const mt_act *q, const mt_act *k,
                                      const mt_act *v, const mt_act *sinks, const uint8_t *mask, int B, int S, int nh,
                                      int nkv, int hd, int hd_v, float scale, int window) {
    int32_t *kv = sinks ? NULL : kv_len_begin(m, mask, B, S);  // lengths are for cuDNN, which sinks skip
    attention_forward_cuda(m->be, out, lse, q, k, v, sinks, mask, kv, B, S, nh, nkv, hd, hd_v, scale, window);
    kv_len_end(m, kv, B);
}
static void attention_backward_on_cuda(mt_model *m, mt_act *dq, mt_act *dk, mt_act *dv, mt_act *dsinks,
                                       const mt_act *dout, const mt_act *q, const mt_act *k, const mt_act *v,
                                       const mt_act *out, const float *lse, const mt_act *sinks, const uint8_t *mask,
                                       int B, int S, int nh, int nkv, int hd, int hd_v, float scale, int window) {
    int32_t *kv = sinks ? NULL : kv_len_begin(m, mask, B, S);
    attention_backward_cuda(m->be, dq, dk, dv, dsinks, dout, q, k, v, out, lse, sinks, mask, kv, B, S, nh, nkv, hd,
                            hd_v, scale, window);
    kv_len_end(m, kv, B);
}
#endif

// The profile's attention rows name the kernel that runs (scripts/step_model.h's names), and count
// its FLOPs in S²-GEMMs over a head dim: forward Q·Kᵀ (hd) and P·V (hd_v); backward cuDNN's five
// (FlashAttention-2's: Q·Kᵀ, dO·Vᵀ, Pᵀ·dO, dS·K, dSᵀ·Q = 3 hd + 2 hd_v), the WMMA kernel's seven
// (Q·Kᵀ twice, dO·Vᵀ twice, dS·K, Pᵀ·dO, dSᵀ·Q = 4 hd + 3 hd_v). Bytes: q, k, dq, dk rows of hd;
// v, out, dout, dv rows of hd_v. Sinks always run the WMMA kernels (model/ops_cuda.h).
static int attention_on_cudnn(const mt_model *m, const mt_act *sinks, const uint8_t *mask, int nh, int nkv, int hd,
                              int hd_v) {
#ifdef MT_CUDA
    return mt_prof_active && ON_CUDA(m) && !sinks &&
           !strcmp(attention_path(mask != NULL, mask && m->pad_right, nh, nkv, hd, hd_v), "cudnn");
#else
    (void)m, (void)sinks, (void)mask, (void)nh, (void)nkv, (void)hd, (void)hd_v;
    return 0;
#endif
}


void mt_op_attention_forward(mt_model *m, mt_act *out, float *lse, const mt_act *q, const mt_act *k, const mt_act *v,
                             const mt_act *sinks, const uint8_t *mask, int B, int S, int nh, int nkv, int hd, int hd_v,
                             float scale, int window) {
    const int cudnn = attention_on_cudnn(m, sinks, mask, nh, nkv, hd, hd_v);
    const double s2 = (double)B * S * S * nh, rows = (double)B * S;
    PROFILED(cudnn ? "attention fwd (cuDNN SDPA)" : "attention fwd (wmma bf16)", s2 * (hd + hd_v),
             AB(m) * rows * (nh + nkv) * (hd + hd_v) + 4.0 * rows * nh, {
        DISPATCH(m, attention_forward_cpu(out, lse, q, k, v, sinks, mask, B, S, nh, nkv, hd, hd_v, scale, window),
                 attention_forward_on_cuda(m, out, lse, q, k, v, sinks, mask, B, S, nh, nkv, hd, hd_v, scale, window));
    });
}

void mt_op_attention_backward(mt_model *m, mt_act *dq, mt_act *dk, mt_act *dv, mt_act *dsinks, const mt_act *dout,
                              const mt_act *q, const mt_act *k, const mt_act *v, const mt_act *out, const float *lse,
                              const mt_act *sinks, const uint8_t *mask, int B, int S, int nh, int nkv, int hd,
                              int hd_v, float scale, int window) {
    const int cudnn = attention_on_cudnn(m, sinks, mask, nh, nkv, hd, hd_v);
    const double s2 = (double)B * S * S * nh, rows = (double)B * S;
    PROFILED(cudnn ? "attention bwd (cuDNN SDPA)" : "attention bwd (wmma bf16)",
             s2 * (cudnn ? 3.0 * hd + 2.0 * hd_v : 4.0 * hd + 3.0 * hd_v),
             AB(m) * rows * 2.0 * (nh + nkv) * (hd + hd_v) + 8.0 * rows * nh, {
        DISPATCH(m, attention_backward_cpu(dq, dk, dv, dsinks, dout, q, k, v, out, lse, sinks, mask, B, S, nh, nkv, hd,
                                           hd_v, scale, window),
                 attention_backward_on_cuda(m, dq, dk, dv, dsinks, dout, q, k, v, out, lse, sinks, mask, B, S, nh, nkv,
                                            hd, hd_v, scale, window));
    });
}

// The path the counting step takes for the GPU step's attention, and its scratch: cuDNN's (its
// scratch, its plan's workspace where a device can build the plan, else the measured guess) or
// the WMMA kernels'. A CUDA build asks the library (loaded, the shape's limits, a plan where a
// device exists); other builds assume it loads (the GPU machine's cuDNN 9.14). MT_ATTENTION=wmma:
// the kernels.
static int attention_count_path(int bwd, int sinks, int kv, const uint8_t *mask, int B, int S, int nh, int nkv,
                                int hd, int hd_v, int window, size_t *scratch, size_t *ws) {
    if (sinks) return 0;
#ifdef MT_CUDA
    int64_t w;
    if (!attention_cudnn_count(bwd, mask != NULL, B, S, nh, nkv, hd, hd_v, window, kv, scratch, &w)) return 0;
    *ws = w >= 0 ? (size_t)w : mt_att_cudnn_workspace_guess(bwd, B, S, nh, hd);
    return 1;
#else
    const char *e = getenv("MT_ATTENTION");
    if ((e && !strcmp(e, "wmma")) || mt_att_cudnn_shape_refusal(mask != NULL, kv, nh, nkv, hd, hd_v)) return 0;
    (void)window;
    *scratch = mt_att_cudnn_scratch_bytes(bwd, B, S, nh, hd,
                                          mt_att_cudnn_needs_lens(bwd, S, kv, MT_ATT_CUDNN_VERSION_GUESS), kv);
    *ws = mt_att_cudnn_workspace_guess(bwd, B, S, nh, hd);
    return 1;
#endif
}

void mt_op_attention_count(mt_model *m, int bwd, int sinks, const uint8_t *mask, int B, int S, int nh, int nkv, int hd,
                           int hd_v, int window) {
    if (!m->counting || B <= 0 || S <= 0) return;
    const int kv = mask && m->pad_right && !sinks;  // key lengths made on the device (kv_len_begin)
    size_t scratch = 0, ws = 0, kvb = kv ? (size_t)B * sizeof(int32_t) : 0;
    void *kvp = kvb ? mt_work_alloc(m->be, kvb) : NULL;
    if (attention_count_path(bwd, sinks, kv, mask, B, S, nh, nkv, hd, hd_v, window, &scratch, &ws)) {
        // the backward's staged gradients, then the scratch, then the workspace: the step's nesting
        // (the null backend's pointers are NULL: the sizes say what to free)
        size_t staged = bwd ? mt_att_cudnn_staging_bytes(B, S, nh, nkv, hd, hd_v) : 0;
        void *a = staged ? mt_work_alloc(m->be, staged) : NULL, *b = mt_work_alloc(m->be, scratch);
        void *c = ws ? mt_work_alloc(m->be, ws) : NULL;
        if (ws) mt_work_free(m->be, c, ws);
        mt_work_free(m->be, b, scratch);
        if (staged) mt_work_free(m->be, a, staged);
    } else if (bwd) {
        size_t d = mt_att_wmma_scratch_bytes(1, B, S, nh);
        mt_work_free(m->be, mt_work_alloc(m->be, d), d);
    }
    if (kvb) mt_work_free(m->be, kvp, kvb);
}

// MLA's keys and values from kv_b_proj's output and the shared rotated key part (model/ops.h).
// Copies and adds: bytes only (a row with FLOPs must be one scripts/step_model.h knows).
void mt_op_mla_kv_forward(mt_model *m, mt_act *k, mt_act *v, const mt_act *kvb, const mt_act *krot,
                          int64_t krot_stride, int T, int nh, int nope, int rope, int vd) {
    PROFILED("mla k, v", 0, 2 * AB(m) * T * ((double)nh * (nope + rope + vd)), {
        DISPATCH(m, mla_kv_forward_cpu(k, v, kvb, krot, krot_stride, T, nh, nope, rope, vd),
                 mla_kv_forward_cuda(m->be, k, v, kvb, krot, krot_stride, T, nh, nope, rope, vd));
    });
}

void mt_op_mla_kv_backward(mt_model *m, mt_act *dkvb, mt_act *dkrot, const mt_act *dk, const mt_act *dv,
                           int64_t krot_stride, int T, int nh, int nope, int rope, int vd) {
    PROFILED("mla k, v", 0, AB(m) * T * ((double)nh * (3 * nope + 2 * vd + rope) + 2 * rope), {
        DISPATCH(m, mla_kv_backward_cpu(dkvb, dkrot, dk, dv, krot_stride, T, nh, nope, rope, vd),
                 mla_kv_backward_cuda(m->be, dkvb, dkrot, dk, dv, krot_stride, T, nh, nope, rope, vd));
    });
}

double mt_op_cross_entropy(mt_model *m, float *dlogits, float dscale, int64_t *count, const float *logits,
                           const int32_t *targets, int T, int V) {
    double sum = 0.0;
    int64_t unused;  // the CPU twin always counts
    PROFILED("cross-entropy gradient", 3.0 * T * V, 8.0 * T * V,
             DISPATCH(m, sum = cross_entropy_cpu(dlogits, dscale, count ? count : &unused, logits, targets, T, V, -100),
                      sum = cross_entropy_cuda(m->be, dlogits, dscale, count, logits, targets, T, V, -100)));
    return sum;
}

// The fused loss's forward on cuda (model/ops_cuda.h: cross_entropy_acc_*); the cpu sums each
// chunk with cross_entropy_cpu instead and never calls these.
void mt_op_ce_acc_start(mt_model *m, void *acc, int rows) {
    DISPATCH(m, (void)acc, cross_entropy_acc_start(m->be, acc, rows));
    (void)rows;
}

void mt_op_ce_acc_add(mt_model *m, void *acc, int rows, const float *logits, int64_t row0, int n, int V) {
    PROFILED("lm_head GEMM + loss", 3.0 * n * V, 4.0 * n * V, {
        DISPATCH(m, (void)logits, cross_entropy_acc_add(m->be, acc, rows, logits, m->step_targets + row0, row0, n, V, -100));
        (void)acc, (void)rows, (void)row0, (void)n, (void)V;
    });
}

double mt_op_ce_acc_finish(mt_model *m, void *acc, int rows, int V, int64_t *count) {
    double sum = 0.0;
    *count = 0;
    DISPATCH(m, (void)acc, sum = cross_entropy_acc_finish(m->be, acc, rows, m->step_targets, V, -100, count));
    (void)rows, (void)V;
    return sum;
}

void mt_op_add(mt_model *m, mt_act *y, const mt_act *a, const mt_act *b, int64_t n) {
    PROFILED("residual adds", n, 3 * AB(m) * n, {
        float *yf = y;
        const float *af = a, *bf = b;
        DISPATCH(m, for (int64_t i = 0; i < n; i++) yf[i] = af[i] + bf[i], mt_add_cuda(m->be, y, a, b, n));
    });
}

void mt_op_router_forward(mt_model *m, int32_t *ids, float *weights, float *probs, const float *logits, int T,
                          int E, int k) {
    PROFILED("router GEMM + top-k", 0, 4.0 * 2 * T * E + 8.0 * T * k, {
        int norm = m->cfg.norm_topk_prob;
        DISPATCH(m, router_forward_cpu(ids, weights, probs, logits, T, E, k, norm),
                 router_forward_cuda(m->be, ids, weights, probs, logits, T, E, k, norm));
    });
}

void mt_op_router_backward(mt_model *m, float *dlogits, const float *dweights, const float *probs,
                           const int32_t *ids, const float *weights, int T, int E, int k) {
    PROFILED("router GEMM (dx)", 0, 4.0 * 3 * T * E + 8.0 * T * k, {
        int norm = m->cfg.norm_topk_prob;
        DISPATCH(m, router_backward_cpu(dlogits, dweights, probs, ids, weights, T, E, k, norm),
                 router_backward_cuda(m->be, dlogits, dweights, probs, ids, weights, T, E, k, norm));
    });
}

// The chosen probabilities of recorded choices, renormalised when norm (replay of a recomputed
// layer).
static void weights_of_choices_cpu(float *weights, const float *probs, const int32_t *ids, int T, int E, int k,
                                   int norm) {
    for (int t = 0; t < T; t++) {
        float sum = 0;
        for (int j = 0; j < k; j++) sum += probs[(int64_t)t * E + ids[t * k + j]];
        if (!norm) sum = 1.0f;
        for (int j = 0; j < k; j++) weights[t * k + j] = probs[(int64_t)t * E + ids[t * k + j]] / sum;
    }
}

void mt_op_weights_of_choices(mt_model *m, float *weights, const float *probs, const int32_t *ids, int T, int E,
                              int k) {
    PROFILED("router GEMM + top-k", 0, 4.0 * T * E + 8.0 * T * k, {
        DISPATCH(m, weights_of_choices_cpu(weights, probs, ids, T, E, k, m->cfg.norm_topk_prob),
                 moe_weights_of_choices_cuda(m->be, weights, probs, ids, T, E, k, m->cfg.norm_topk_prob));
    });
}

// The DeepSeek-style router (moe/moe.h): the rule is the caller's (from the config), bias its
// fp32 e_score_correction_bias or NULL. Profiled under the softmax router's names.
void mt_op_router_grouped_forward(mt_model *m, int32_t *ids, float *weights, float *scores, const float *logits,
                                  const float *bias, int T, int E, int k, moe_route_rule rule) {
    PROFILED("router GEMM + top-k", 0, 4.0 * 2 * T * E + 8.0 * T * k, {
        DISPATCH(m, router_grouped_forward_cpu(ids, weights, scores, logits, bias, T, E, k, rule),
                 router_grouped_forward_cuda(m->be, ids, weights, scores, logits, bias, T, E, k, rule));
    });
}

void mt_op_router_grouped_backward(mt_model *m, float *dlogits, const float *dweights, const float *scores,
                                   const int32_t *ids, const float *weights, int T, int E, int k, moe_route_rule rule) {
    PROFILED("router GEMM (dx)", 0, 4.0 * 3 * T * E + 8.0 * T * k, {
        DISPATCH(m, router_grouped_backward_cpu(dlogits, dweights, scores, ids, weights, T, E, k, rule),
                 router_grouped_backward_cuda(m->be, dlogits, dweights, scores, ids, weights, T, E, k, rule));
    });
}

void mt_op_router_grouped_weights_of_choices(mt_model *m, float *weights, const float *scores, const int32_t *ids,
                                             int T, int E, int k, moe_route_rule rule) {
    PROFILED("router GEMM + top-k", 0, 4.0 * T * E + 8.0 * T * k, {
        DISPATCH(m, router_grouped_weights_of_choices_cpu(weights, scores, ids, T, E, k, rule),
                 router_grouped_weights_of_choices_cuda(m->be, weights, scores, ids, T, E, k, rule));
    });
}

// The bias update's load, counts [E] doubles of m->be (zeroed by the caller at a step's start),
// and the update itself (after the counts are summed over ranks).
void mt_op_router_load_accumulate(mt_model *m, double *counts, const int32_t *ids, const uint8_t *mask, int T, int E,
                                  int k) {
    PROFILED("router GEMM + top-k", 0, 4.0 * T * k + 8.0 * E, {
        DISPATCH(m, router_load_accumulate_cpu(counts, ids, mask, T, E, k),
                 router_load_accumulate_cuda(m->be, counts, ids, mask, T, E, k));
    });
}

void mt_op_router_bias_update(mt_model *m, float *bias, const double *counts, int E, float rate) {
    DISPATCH(m, router_bias_update_cpu(bias, counts, E, rate), router_bias_update_cuda(m->be, bias, counts, E, rate));
}

// The sequence-wise balance loss: its sum over sequences and their count added to m->seq_aux on
// the CPU, to the two doubles of aux_dev on CUDA (no host wait; mt_op_aux_finish brings them).
void mt_op_router_seq_aux_accumulate(mt_model *m, const float *scores, const int32_t *ids, const uint8_t *mask,
                                     int B, int S, int E, int k) {
    PROFILED("router GEMM + top-k", 0, 4.0 * B * S * (E + k), {
        int64_t n = 0;
        DISPATCH(m, (m->seq_aux[0] += router_seq_aux_sum_cpu(&n, scores, ids, mask, B, S, E, k), m->seq_aux[1] += (double)n),
                 router_seq_aux_accumulate_cuda(m->be, (double *)m->aux_dev->data + MT_AUX_STATS_SEQ(E), scores, ids,
                                                mask, B, S, E, k));
        (void)n;
    });
}

void mt_op_router_seq_aux_backward(mt_model *m, float *dlogits, float dscale, const float *scores, const int32_t *ids,
                                   const uint8_t *mask, int B, int S, int E, int k, int sigmoid) {
    PROFILED("router GEMM (dx)", 0, 4.0 * B * S * (2 * E + k), {
        DISPATCH(m, router_seq_aux_backward_cpu(dlogits, dscale, scores, ids, mask, B, S, E, k, sigmoid),
                 router_seq_aux_backward_cuda(m->be, dlogits, dscale, scores, ids, mask, B, S, E, k, sigmoid));
    });
}

// The aux statistics: m->aux on the CPU; on CUDA a device copy (m->aux_dev) that layers add to,
// brought to m->aux once per forward (mt_op_aux_finish).
void mt_op_aux_accumulate(mt_model *m, const float *probs, const int32_t *ids, const uint8_t *mask, int T) {
    PROFILED("router GEMM + top-k", 0, 4.0 * T * m->aux.E + 4.0 * T * m->aux.k, {
        DISPATCH(m, moe_aux_accumulate_cpu(&m->aux, probs, ids, mask, T),
                 moe_aux_accumulate_cuda(m->be, (double *)m->aux_dev->data, probs, ids, mask, T, m->aux.E, m->aux.k));
    });
}

void mt_op_aux_start(mt_model *m) {
    moe_aux_init(&m->aux, (int)m->cfg.experts, (int)m->cfg.top_k);
    if (m->aux_dev) m->be->ops->fill_zero(m->be, m->aux_dev->data, m->aux_dev->nbytes);
}

// The load log's tokens per expert from the host copy of the layer's offsets.
static void counts_from_offsets(mt_layer_kept *kp, int E) {
    for (int e = 0; e < E; e++) kp->counts[e] = kp->host_offsets[e + 1] - kp->host_offsets[e];
}

// On CUDA, the statistics come to the host in one wait, and with them the expert offsets of the
// layers whose offsets stayed on the device (model/expert_rows.c), gathered into one scratch
// first: the load log's counts.
void mt_op_aux_finish(mt_model *m) {
#ifdef MT_CUDA
    if (ON_CUDA(m)) {
        const int E = (int)m->cfg.experts, layers = (int)m->cfg.layers;
        const size_t one = (size_t)(E + 1) * sizeof(int32_t);
        int n = 0;
        for (int L = 0; L < layers; L++) n += m->kept[L].rows_on_device;
        int32_t *dev = n ? mt_work_alloc(m->be, n * one) : NULL, *host = n ? mt_xmalloc(n * one) : NULL;
        for (int L = 0, i = 0; L < layers; L++)
            if (m->kept[L].rows_on_device) m->be->ops->copy(m->be, dev + (size_t)i++ * (E + 1), m->kept[L].offsets->data, one);
        moe_aux_stats_download_cuda(m->be, &m->aux, (const double *)m->aux_dev->data, &m->z_sum, &m->z_rows, m->seq_aux,
                                    host, dev, n * one);
        for (int L = 0, i = 0; L < layers; L++) {
            mt_layer_kept *kp = &m->kept[L];
            if (!kp->rows_on_device) continue;
            memcpy(kp->host_offsets, host + (size_t)i++ * (E + 1), one);
            counts_from_offsets(kp, E);
        }
        if (n) mt_work_free(m->be, dev, n * one);
        free(host);
        return;
    }
#endif
    (void)m;
}

// After the host statistics changed (summed over ranks): the device copy follows.
void mt_op_aux_upload(mt_model *m) {
    if (!m->aux_dev) return;
    int E = m->aux.E;
    double *v = mt_xcalloc((size_t)MT_AUX_STATS_LEN(E), sizeof(double));
    memcpy(v, m->aux.counts, (size_t)E * sizeof(double));
    memcpy(v + E, m->aux.prob_sums, (size_t)E * sizeof(double));
    v[2 * E] = (double)m->aux.rows, v[2 * E + 1] = m->z_sum, v[2 * E + 2] = (double)m->z_rows;
    v[MT_AUX_STATS_SEQ(E)] = m->seq_aux[0], v[MT_AUX_STATS_SEQ(E) + 1] = m->seq_aux[1];
    mt_tensor_upload(m->aux_dev, v);
    free(v);
}

void mt_op_aux_backward(mt_model *m, float *dlogits, float coef, const float *probs, const uint8_t *mask, int T) {
    PROFILED("router GEMM (dx)", 0, 4.0 * 2 * T * m->aux.E, {
        DISPATCH(m, moe_aux_backward_cpu(dlogits, coef, &m->aux, probs, mask, T),
                 moe_aux_backward_cuda(m->be, dlogits, coef, (const double *)m->aux_dev->data, probs, mask, T, m->aux.E));
    });
}

// The z-loss statistics: m->z_sum / m->z_rows on the CPU; on CUDA two more doubles of aux_dev,
// brought back with the aux statistics (no host wait per layer).
void mt_op_zloss_accumulate(mt_model *m, const float *logits, const uint8_t *mask, int T, int E) {
    PROFILED("router GEMM + top-k", 0, 4.0 * T * E, {
        DISPATCH(m, m->z_sum += moe_zloss_sum_cpu(&m->z_rows, logits, mask, T, E),
                 moe_zloss_accumulate_cuda(m->be, (double *)m->aux_dev->data, logits, mask, T, E));
    });
}

void mt_op_zloss_backward(mt_model *m, float *dlogits, float dscale, const float *logits, const uint8_t *mask, int T,
                          int E) {
    PROFILED("router GEMM (dx)", 0, 4.0 * 2 * T * E, {
        DISPATCH(m, moe_zloss_backward_cpu(dlogits, dscale, logits, mask, T, E),
                 moe_zloss_backward_cuda(m->be, dlogits, dscale, logits, mask, T, E));
    });
}

// Layer L's expert order from its recorded choices, and the host copy of the offsets that the
// expert loop walks. On CUDA that copy is a host wait per layer, unless the offsets stay on the
// device (model/expert_rows.c): begun here, collected by mt_op_permute_wait once the work that
// does not need it is queued (the gather, a shared expert), so that the device is not idle while
// the host waits and sets up the experts.
void mt_op_permute(mt_model *m, int L) {
    mt_layer_kept *kp = &m->kept[L];
    int T = m->B * m->S, E = (int)m->cfg.experts, k = (int)m->cfg.top_k;
    int32_t *order = kp->order->data, *offsets = kp->offsets->data;
    const int32_t *ids = kp->ids->data;
    if (ON_CUDA(m)) {
#ifdef MT_CUDA
        kp->rows_on_device = mt_rows_on_device(m, L);  // then the experts read them there: no download
        PROFILED("permute/gather + combine", 0, 8.0 * T * k + 4.0 * (E + 1), {
            moe_permute_cuda(m->be, order, offsets, NULL, ids, T, E, k);
            if (!kp->rows_on_device) mt_download_begin(m->be, kp->host_offsets, offsets, kp->offsets->nbytes);
        });
        kp->offsets_pending = !kp->rows_on_device;
        return;
#endif
    }
    moe_permute_cpu(order, offsets, NULL, ids, T, E, k);
    memcpy(kp->host_offsets, offsets, (size_t)(E + 1) * sizeof(int32_t));
    kp->offsets_pending = 1;
    mt_op_permute_wait(m, L);
}

void mt_op_permute_wait(mt_model *m, int L) {
    mt_layer_kept *kp = &m->kept[L];
    if (!kp->offsets_pending) return;
    if (ON_CUDA(m)) mt_download_end(m->be);  // a host wait of its own in the profile
    kp->offsets_pending = 0;
    counts_from_offsets(kp, (int)m->cfg.experts);
}

void mt_op_gather(mt_model *m, mt_act *xs, int64_t ldo, const mt_act *x, const int32_t *order, int n, int H, int k) {
    PROFILED("permute/gather + combine", 0, 2 * AB(m) * n * H, {
        DISPATCH(m, moe_gather_cpu(xs, ldo, x, order, n, H, k), moe_gather_cuda(m->be, xs, ldo, x, order, n, H, k));
    });
}

void mt_op_gather_backward(mt_model *m, mt_act *dx, const mt_act *dxs, int64_t ldi, const int32_t *order, int n, int H,
                           int k) {
    PROFILED("permute/gather + combine", (double)n * H, AB(m) * (n * (double)H + (double)n / k * H), {
        DISPATCH(m, moe_gather_backward_cpu(dx, dxs, ldi, order, n, H, k),
                 moe_gather_backward_cuda(m->be, dx, dxs, ldi, order, n, H, k));
    });
}

void mt_op_combine(mt_model *m, mt_act *out, const mt_act *ys, const float *weights, const int32_t *order, int n, int H,
                   int k) {
    PROFILED("permute/gather + combine", 2.0 * n * H, AB(m) * (n * (double)H + 2.0 * n / k * H) + 4.0 * n, {
        DISPATCH(m, moe_combine_cpu(out, ys, weights, order, n, H, k),
                 moe_combine_cuda(m->be, out, ys, weights, order, n, H, k));
    });
}

void mt_op_combine_backward(mt_model *m, mt_act *dys, int64_t ldd, float *dweights, const mt_act *dout,
                            const mt_act *ys, const float *weights, const int32_t *order, int n, int H, int k) {
    PROFILED("permute/gather + combine", (dys ? 1.0 : 0.0) * n * H + (dweights ? 2.0 : 0.0) * n * H, AB(m) * ((dys ? 1.0 : 0.0) * n * H + (dweights ? (double)n * H : 0.0) + (double)n / k * H) + 8.0 * n, {
        DISPATCH(m, moe_combine_backward_cpu(dys, ldd, dweights, dout, ys, weights, order, n, H, k),
                 moe_combine_backward_cuda(m->be, dys, ldd, dweights, dout, ys, weights, order, n, H, k));
    });
}

// The CPU's SwiGLU of split g, u [n] (its experts run w1 and w3 apart).
// The cpu's experts (model/experts.c): the family's SwiGLU, plain or clamped (gpt-oss).
void mt_op_swiglu_forward(mt_model *m, float *a, const float *g, const float *u, int64_t n) {
    const mt_model_config *c = &m->cfg;
    if (c->swiglu_limit > 0) swiglu_clamped_forward_cpu(a, g, u, n, (float)c->swiglu_alpha, (float)c->swiglu_limit);
    else swiglu_forward_cpu(a, g, u, n);
}

void mt_op_swiglu_backward(mt_model *m, float *dg, float *du, const float *da, const float *g, const float *u,
                           int64_t n) {
    const mt_model_config *c = &m->cfg;
    if (c->swiglu_limit > 0)
        swiglu_clamped_backward_cpu(dg, du, da, g, u, n, (float)c->swiglu_alpha, (float)c->swiglu_limit);
    else swiglu_backward_cpu(dg, du, da, g, u, n);
}

// The router's bias (gpt-oss) on its f32 logits [T, E], and its gradient (column sums over T in
// a fixed order on both backends).
void mt_op_logit_bias_forward(mt_model *m, float *logits, const mt_act *b, int T, int E) {
    if (m->counting) return;
    DISPATCH(m, bias_forward_cpu(logits, b, T, E), logit_bias_forward_cuda(m->be, logits, b, T, E));
}

void mt_op_logit_bias_backward(mt_model *m, mt_act *db, const float *dlogits, int T, int E) {
    if (m->counting || !db) return;
    DISPATCH(m, bias_backward_cpu(db, dlogits, T, E), logit_bias_backward_cuda(m->be, db, dlogits, T, E));
}

// The experts' biases (gpt-oss) over the rows of a grouped call (model/ops.h mt_expert_offsets).
void mt_op_expert_bias_forward(mt_model *m, mt_act *y, int64_t ldy, const mt_act *b, int64_t ldb, int64_t n,
                               const mt_expert_offsets *g) {
    if (m->counting) return;
    DISPATCH(m, expert_bias_forward_cpu(y, ldy, b, ldb, n, g), expert_bias_forward_cuda(m->be, y, ldy, b, ldb, n, g));
}

void mt_op_expert_bias_backward(mt_model *m, mt_act *db, int64_t lddb, const mt_act *dy, int64_t ldy, int64_t n,
                                const mt_expert_offsets *g) {
    if (m->counting || !db) return;
    DISPATCH(m, expert_bias_backward_cpu(db, lddb, dy, ldy, n, g),
             expert_bias_backward_cuda(m->be, db, lddb, dy, ldy, n, g));
}

// The GPU step's SwiGLU of gu [rows, 2f], w1's and w3's outputs side by side (one GEMM): the
// family's, plain or clamped (gpt-oss). a and da have row stride lda (w2's LoRA xa may sit beside).
void mt_op_swiglu_fused_forward(mt_model *m, mt_act *a, int64_t lda, const mt_act *gu, int64_t rows, int64_t f) {
    const mt_model_config *c = &m->cfg;
    float alpha = (float)c->swiglu_alpha, lim = (float)c->swiglu_limit;
    PROFILED("SwiGLU", 8.0 * rows * f, 3 * AB(m) * rows * f, {
        if (lim > 0)
            DISPATCH(m, swiglu_clamped_fused_forward_cpu(a, lda, gu, rows, f, alpha, lim),
                     swiglu_clamped_fused_forward_cuda(m->be, a, lda, gu, rows, f, alpha, lim));
        else
            DISPATCH(m, swiglu_fused_forward_cpu(a, lda, gu, rows, f),
                     swiglu_fused_forward_cuda(m->be, a, lda, gu, rows, f));
    });
}

void mt_op_swiglu_fused_backward(mt_model *m, mt_act *dgu, const mt_act *da, int64_t ldda, const mt_act *gu, int64_t rows,
                                 int64_t f) {
    const mt_model_config *c = &m->cfg;
    float alpha = (float)c->swiglu_alpha, lim = (float)c->swiglu_limit;
    PROFILED("SwiGLU", 12.0 * rows * f, 5 * AB(m) * rows * f, {
        if (lim > 0)
            DISPATCH(m, swiglu_clamped_fused_backward_cpu(dgu, da, ldda, gu, rows, f, alpha, lim),
                     swiglu_clamped_fused_backward_cuda(m->be, dgu, da, ldda, gu, rows, f, alpha, lim));
        else
            DISPATCH(m, swiglu_fused_backward_cpu(dgu, da, ldda, gu, rows, f),
                     swiglu_fused_backward_cuda(m->be, dgu, da, ldda, gu, rows, f));
    });
}

// dst [n] = src [n] rounded to the step's storage (an fp32 gradient about to feed a GEMM).
void mt_op_to_act(mt_model *m, mt_act *dst, const float *src, int64_t n) {
    DISPATCH(m, memcpy(dst, src, (size_t)n * sizeof(float)), mt_f32_to_bf16_cuda(m->be, dst, src, n));
}

// The parts some families add (model/bias.c, model/parts_cuda.cu). Counting: nothing runs.
void mt_bias_forward(mt_model *m, mt_act *y, const mt_act *b, int64_t T, int64_t n) {
    if (m->counting) return;
    DISPATCH(m, bias_forward_cpu(y, b, T, n), bias_forward_cuda(m->be, y, b, T, n));
}

void mt_bias_backward(mt_model *m, mt_act *db, const mt_act *dy, int64_t T, int64_t n) {
    if (m->counting || !db) return;
    DISPATCH(m, bias_backward_cpu(db, dy, T, n), bias_backward_cuda(m->be, db, dy, T, n));
}

void mt_clip_forward(mt_model *m, mt_act *x, int64_t n, float c) {
    if (m->counting) return;
    DISPATCH(m, clip_forward_cpu(x, n, c), clip_forward_cuda(m->be, x, n, c));
}

void mt_clip_backward(mt_model *m, mt_act *dy, const mt_act *x, int64_t n, float c) {
    if (m->counting) return;
    DISPATCH(m, clip_backward_cpu(dy, x, n, c), clip_backward_cuda(m->be, dy, x, n, c));
}

void mt_clip_backward_normed(mt_model *m, mt_act *dy, const mt_act *x_raw, const float *rstd, const mt_act *w,
                             int64_t rows, int64_t width, float c) {
    if (m->counting) return;
    DISPATCH(m, clip_backward_normed_cpu(dy, x_raw, rstd, w, rows, width, c),
             clip_backward_normed_cuda(m->be, dy, x_raw, rstd, w, rows, width, c));
}

void mt_op_sigmoid(mt_model *m, float *x, int64_t n) {
    DISPATCH(m, sigmoid_cpu(x, n), sigmoid_cuda(m->be, x, n));
}

void mt_op_scaled_add(mt_model *m, mt_act *out, const mt_act *y, const float *s, int64_t T, int64_t H) {
    DISPATCH(m, scaled_add_cpu(out, y, s, T, H), scaled_add_cuda(m->be, out, y, s, T, H));
}

void mt_op_gate_backward(mt_model *m, mt_act *dy, float *ds, const mt_act *dx, const mt_act *y, const float *s,
                         int64_t T, int64_t H) {
    DISPATCH(m, gate_backward_cpu(dy, ds, dx, y, s, T, H), gate_backward_cuda(m->be, dy, ds, dx, y, s, T, H));
}
