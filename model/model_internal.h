// model/model_internal.h — shared between the model's own files; not for other folders.
#pragma once
#include "model/mixtral.h"
#include "model/ops.h"  // mt_expert_offsets

void mt_model_acts_ensure(mt_model *m, int B, int S);
void mt_model_acts_free(mt_model *m);

// The activation set layer L uses: its own parts, and pointers to the shared set's recomputed ones.
static inline mt_layer_acts *layer_acts(mt_model *m, int L) { return &m->acts[L]; }
void mt_layer_forward(mt_model *m, int L, void *x_out, int replay);  // x_out: step storage

// The fused, chunked lm_head + cross-entropy (model/loss.c). Forward: the CE sum over counted
// rows, *count of them (counting: 0, no kernel). Backward: dxf [T, H] rows get the loss's
// gradient (dscale 1/m->ce_count), a trainable lm_head's dW and LoRA accumulate.
// The loss (model/loss.c). with_grad: a training forward, whose backward follows; with a frozen
// lm_head the chunks' gradient of xf is made here into m->dxf_early, unscaled.
double mt_model_loss_forward(mt_model *m, int64_t *count, int with_grad);
// dxf [T, H] (zeroed) += the loss's gradient of xf (and lm_head's own, when it trains).
void mt_model_loss_backward(mt_model *m, const mt_tensor *dxf);

// THE dtype rule of a step, in one place. The GPU step (cuda, and the null backend that counts it
// for `plan --measure`) stores activations, their gradients, dense weights, LoRA and weight
// gradients in bf16, and keeps fp32 where precision needs it: norm statistics (rstd), the
// attention lse, the router's logits, probabilities and weights (and their gradients), the
// lm_head logits (a chunk at a time) and the loss. The cpu backend is the fp32 reference: everything f32.
static inline int gpu_step(const mt_model *m) { return m->be->ops->kind != MT_BACKEND_CPU; }
static inline mt_dtype step_dtype(const mt_model *m, mt_dtype gpu) {
    return gpu_step(m) || gpu == MT_I32 || gpu == MT_U8 ? gpu : MT_F32;
}
// The dtype of activations and weights: bf16 on the GPU step, f32 on the cpu.
static inline mt_dtype act_dtype(const mt_model *m) { return step_dtype(m, MT_BF16); }

// DeepSeek-style routing (model/family.h mt_route_kind): the rule of the grouped router's ops.
static inline int grouped_router(const mt_model *m) { return mt_config_family(&m->cfg)->route != MT_ROUTE_SOFTMAX; }
static inline moe_route_rule route_rule(const mt_model *m) {
    const mt_model_config *c = &m->cfg;
    int sig = mt_config_family(c)->route == MT_ROUTE_SIGMOID_GROUPED;
    return (moe_route_rule){.sigmoid = sig, .n_group = c->route_grouped ? (int)c->n_group : 1,
                            .topk_group = c->route_grouped ? (int)c->topk_group : 1, .group_top2 = sig,
                            .norm_topk = c->norm_topk_prob, .scaling = (float)c->routed_scaling};
}

// A step-storage buffer as the ops see it (f32 on the cpu, bf16 on cuda): only kernels look in.
typedef void mt_act;
static inline mt_act *A(const mt_tensor *t) { return t ? t->data : NULL; }
// A tensor that is fp32 on every backend (rstd, lse, router buffers, logits).
static inline float *F(const mt_tensor *t) {
    return t ? (float *)t->data : NULL;
}
static inline int32_t *I(const mt_tensor *t) { return (int32_t *)t->data; }
// Rows [r0, r0 + n) of a 2-D tensor as a view, or NULL for no tensor (a Linear without LoRA has
// no xa). The view lives until the end of the enclosing block.
#define ROWS(t, r0, n) ((t) ? (mt_tensor[1]){mt_view_rows((t), (r0), (n))} : (mt_tensor *)NULL)

// Work scratch of a step: [rows, cols] of dt through the ledger (null: counted, no memory);
// zeroed when `zero` (gradients accumulate into it). Every step_work needs its step_unwork.
static inline mt_tensor step_work(mt_model *m, mt_dtype dt, int64_t rows, int64_t cols, int zero) {
    size_t bytes = mt_dtype_bytes(dt, (size_t)(rows * cols));
    void *p = mt_work_alloc(m->be, bytes);
    if (p && zero) m->be->ops->fill_zero(m->be, p, bytes);
    return mt_view2(m->be, p, dt, rows, cols, 0);
}
static inline void step_unwork(mt_model *m, mt_tensor *t) {
    mt_work_free(m->be, t->data, mt_dtype_bytes(t->dtype, (size_t)(t->shape[0] * t->shape[1])));
}

// Rows [*row0, *row0 + *rows) of expert e in layer L's expert order. Counting, where routing has
// no data, every expert gets T·k/E rows and the first (T·k mod E) one more: balanced routing, as
// the planner assumes.
// With EP these are rows of the own layout (model/expert_parallel.c), none for another rank's.
void mt_expert_rows(const mt_model *m, int L, int e, int64_t *row0, int64_t *rows);

// Expert parallelism (model/expert_parallel.c); EP ranks call these in the same order.
void mt_ep_exchange_counts(mt_model *m, int L);
int64_t mt_ep_own_rows(const mt_model *m, int L);
// The first w columns of each row; ld_*: the layouts' row strides (≥ w).
void mt_ep_dispatch(mt_model *m, int L, mt_act *own, int64_t ld_own, mt_act *local, int64_t ld_local, int64_t w);
void mt_ep_return(mt_model *m, int L, mt_act *local, int64_t ld_local, mt_act *own, int64_t ld_own, int64_t w);
// Ops on the model's backend (model/dispatch.c): the CPU kernels' arguments, memory of m->be;
// mt_act buffers in the step's storage dtype.
void mt_op_embedding_forward(mt_model *m, mt_act *out, const int32_t *tokens, const mt_act *wte, int T, int H);
void mt_op_embedding_backward(mt_model *m, mt_act *dwte, const mt_act *dout, const int32_t *tokens, int T, int H);
void mt_op_rmsnorm_forward(mt_model *m, mt_act *y, float *rstd, const mt_act *x, const mt_act *w, int T, int H,
                           float eps);
void mt_op_rmsnorm_backward(mt_model *m, mt_act *dx, mt_act *dw, const mt_act *dy, const mt_act *x, const mt_act *w,
                            const float *rstd, int T, int H);
// RoPE by the model's table (m->rope_inv_freq [rot/2], its device copy on cuda, m->rope_scale) on
// dims [off, off + rot) of each head of x [T, nh, stride]; interleave: adjacent pairs (model/ops.h).
void mt_op_rope(mt_model *m, mt_act *x, const int32_t *pos, int T, int nh, int stride, int off, int rot,
                int interleave, int backward);
// q, k rows of hd, v, out rows of hd_v, scores times scale (model/ops.h; on cuda the WMMA kernels
// take any hd, hd_v ≤ 256: model/ops_cuda.h says which path runs). sinks [nh] (a weight in the
// model's dtype) or NULL; dsinks [nh] += or NULL.
// The model's scale: mt_config_attn_scale (1/sqrt(hd) in fp32 but for MLA).
void mt_op_attention_forward(mt_model *m, mt_act *out, float *lse, const mt_act *q, const mt_act *k, const mt_act *v,
                             const mt_act *sinks, const uint8_t *mask, int B, int S, int nh, int nkv, int hd, int hd_v,
                             float scale, int window);
void mt_op_attention_backward(mt_model *m, mt_act *dq, mt_act *dk, mt_act *dv, mt_act *dsinks, const mt_act *dout,
                              const mt_act *q, const mt_act *k, const mt_act *v, const mt_act *out, const float *lse,
                              const mt_act *sinks, const uint8_t *mask, int B, int S, int nh, int nkv, int hd,
                              int hd_v, float scale, int window);
// plan --measure's step (the null backend runs no kernel): the scratch the GPU step's attention
// would take (model/attention_scratch.h), allocated and freed in the step's nesting so the
// ledger's work peak holds it. No-op on a running backend.
void mt_op_attention_count(mt_model *m, int bwd, int sinks, const uint8_t *mask, int B, int S, int nh, int nkv, int hd,
                           int hd_v, int window);
// MLA: k [T, nh, nope + rope] = kvb[:, h, :nope] | krot[t], v [T, nh, vd] = kvb[:, h, nope:] from
// kvb [T, nh, nope + vd] and krot rows of krot_stride (a slice of kv_a_proj_with_mqa's rows); the
// backward accumulates dkvb and dkrot (Σ over heads), NULL skipped (model/ops.h mla_kv_*).
void mt_op_mla_kv_forward(mt_model *m, mt_act *k, mt_act *v, const mt_act *kvb, const mt_act *krot,
                          int64_t krot_stride, int T, int nh, int nope, int rope, int vd);
void mt_op_mla_kv_backward(mt_model *m, mt_act *dkvb, mt_act *dkrot, const mt_act *dk, const mt_act *dv,
                           int64_t krot_stride, int T, int nh, int nope, int rope, int vd);
double mt_op_cross_entropy(mt_model *m, float *dlogits, float dscale, int64_t *count, const float *logits,
                           const int32_t *targets, int T, int V);
void mt_op_add(mt_model *m, mt_act *y, const mt_act *a, const mt_act *b, int64_t n);
// cuda: the fused loss's chunks summed on the device, one host wait (model/ops_cuda.h).
void mt_op_ce_acc_start(mt_model *m, void *acc, int rows);
void mt_op_ce_acc_add(mt_model *m, void *acc, int rows, const float *logits, int64_t row0, int n, int V);
double mt_op_ce_acc_finish(mt_model *m, void *acc, int rows, int V, int64_t *count);
void mt_op_router_forward(mt_model *m, int32_t *ids, float *weights, float *probs, const float *logits, int T,
                          int E, int k);
void mt_op_router_backward(mt_model *m, float *dlogits, const float *dweights, const float *probs,
                           const int32_t *ids, const float *weights, int T, int E, int k);
void mt_op_weights_of_choices(mt_model *m, float *weights, const float *probs, const int32_t *ids, int T, int E,
                              int k);
// The DeepSeek-style router (moe/moe.h, moe_route_rule); bias fp32 [E] or NULL. counts [E]:
// doubles of m->be, the load of the bias update (zeroed by the caller).
void mt_op_router_grouped_forward(mt_model *m, int32_t *ids, float *weights, float *scores, const float *logits,
                                  const float *bias, int T, int E, int k, moe_route_rule rule);
void mt_op_router_grouped_backward(mt_model *m, float *dlogits, const float *dweights, const float *scores,
                                   const int32_t *ids, const float *weights, int T, int E, int k, moe_route_rule rule);
void mt_op_router_grouped_weights_of_choices(mt_model *m, float *weights, const float *scores, const int32_t *ids,
                                             int T, int E, int k, moe_route_rule rule);
void mt_op_router_load_accumulate(mt_model *m, double *counts, const int32_t *ids, const uint8_t *mask, int T, int E,
                                  int k);
void mt_op_router_bias_update(mt_model *m, float *bias, const double *counts, int E, float rate);
// The sequences the balance loss of a step averages over: m->seq_aux's count of (MoE layer,
// sequence) pairs over the MoE layers; the loss sums each layer's mean, as DeepSeek's code.
static inline double mt_model_seq_aux_seqs(const mt_model *m) {
    int moe = 0;
    for (int L = 0; L < m->cfg.layers; L++) moe += !m->layers[L].dense;
    return moe ? m->seq_aux[1] / moe : 0.0;
}
// The sequence-wise balance loss (moe/moe.h): m->seq_aux (on CUDA its device copy in aux_dev) += Σ
// of the sequences' losses, their count; the backward's dscale is the loss's factor on each.
void mt_op_router_seq_aux_accumulate(mt_model *m, const float *scores, const int32_t *ids, const uint8_t *mask,
                                     int B, int S, int E, int k);
void mt_op_router_seq_aux_backward(mt_model *m, float *dlogits, float dscale, const float *scores, const int32_t *ids,
                                   const uint8_t *mask, int B, int S, int E, int k, int sigmoid);
void mt_op_aux_start(mt_model *m);
void mt_op_aux_accumulate(mt_model *m, const float *probs, const int32_t *ids, const uint8_t *mask, int T);
void mt_op_aux_finish(mt_model *m);
void mt_op_aux_upload(mt_model *m);
void mt_op_aux_backward(mt_model *m, float *dlogits, float coef, const float *probs, const uint8_t *mask, int T);
void mt_op_zloss_accumulate(mt_model *m, const float *logits, const uint8_t *mask, int T, int E);
void mt_op_zloss_backward(mt_model *m, float *dlogits, float dscale, const float *logits, const uint8_t *mask, int T,
                          int E);
// Where the experts' offsets live (model/expert_rows.c): mt_rows_decide once per model on the
// cuda backend (it says which, and why), mt_rows_on_device per layer and step.
void mt_rows_decide(mt_model *m);
int mt_rows_on_device(mt_model *m, int L);
// The expert order of layer L's routing; its offsets' host copy (host_offsets, counts) is
// collected by mt_op_permute_wait, which every reader of them calls first (a no-op when done),
// unless they stay on the device (mt_rows_on_device: then they come with mt_op_aux_finish's).
void mt_op_permute(mt_model *m, int L);
void mt_op_permute_wait(mt_model *m, int L);
// xs's rows ldo elements apart (≥ H: room for what the experts' forward puts beside them).
void mt_op_gather(mt_model *m, mt_act *xs, int64_t ldo, const mt_act *x, const int32_t *order, int n, int H, int k);
// dxs's rows ldi elements apart (≥ H: the experts' backward may put their LoRAs' dxa beside dx).
void mt_op_gather_backward(mt_model *m, mt_act *dx, const mt_act *dxs, int64_t ldi, const int32_t *order, int n, int H,
                           int k);
void mt_op_combine(mt_model *m, mt_act *out, const mt_act *ys, const float *weights, const int32_t *order, int n,
                   int H, int k);
// dys's rows ldd elements apart (≥ H: room for what the experts' backward puts beside it).
void mt_op_combine_backward(mt_model *m, mt_act *dys, int64_t ldd, float *dweights, const mt_act *dout,
                            const mt_act *ys, const float *weights, const int32_t *order, int n, int H, int k);
void mt_op_swiglu_forward(mt_model *m, float *a, const float *g, const float *u, int64_t n);
void mt_op_swiglu_backward(mt_model *m, float *dg, float *du, const float *da, const float *g, const float *u,
                           int64_t n);
void mt_op_swiglu_fused_forward(mt_model *m, mt_act *a, int64_t lda, const mt_act *gu, int64_t rows, int64_t f);
void mt_op_swiglu_fused_backward(mt_model *m, mt_act *dgu, const mt_act *da, int64_t ldda, const mt_act *gu,
                                 int64_t rows, int64_t f);
void mt_op_to_act(mt_model *m, mt_act *dst, const float *src, int64_t n);

// The experts of layer L, each on its rows [o0, o0 + n) of the expert buffers (model/experts.c;
// R: the rows this rank's experts hold): forward xs -> a -> ys_own rows; backward from dys_own
// rows, ACCUMULATING into dxs rows (dxs NULL: not wanted), the experts' weight and LoRA
// gradients. The cpu runs w1 and w3 apart (the f32 reference), experts in parallel; the GPU step
// runs a layer's experts together, a grouped launch per GEMM kind (model/experts_gpu.c).
// The cpu's scratch, taken once per layer: the backward's da [rows, f] and dgu [rows, 2f] (dg | du)
// for as many rows as one expert can get (each token picks k distinct experts: at most T per
// rank), or every row (every_row) when experts run at once, each then with its own rows.
typedef struct mt_expert_scratch {
    int64_t rows;
    int every_row;
    mt_tensor da, dgu;       // backward only
    mt_tensor w;             // the recomputing backward: f32 [w1; w3; w2] per thread
} mt_expert_scratch;
void mt_experts_forward(mt_model *m, int L, const mt_tensor *ys_own, int64_t R);
// Recomputation on one EP rank: the replay forward skips the experts, and the backward recomputes
// their rows (g, u or gu, a, ys) first: on the cpu each expert with its 4-bit weights dequantized
// once for both (an f32 scratch per thread running an expert); on the GPU step the layer's
// grouped forward again, dequantizing in the kernels.
int mt_experts_recompute_in_backward(const mt_model *m);
// The cpu on one EP rank: the experts' backward also gives the router's top-k weight gradient
// (dweights [T·k], added into), from w2's input gradient, so that a recomputing backward never
// forms ys again; otherwise the combine's backward takes it from ys, and dweights is NULL here.
int mt_experts_give_dweights(const mt_model *m);
// dxs [R, H] (or NULL: not wanted) is written whole, its earlier values ignored: the caller need
// not zero it. The GPU step's has mt_experts_xs_extra more columns (its LoRAs' dxa, beside dx).
void mt_experts_backward(mt_model *m, int L, const mt_tensor *dys_own, const mt_tensor *dxs, float *dweights,
                         int64_t R);
// The GPU step's (model/experts_gpu.c): the backward writes da and dgu over a and gu (their
// storage is the layer's activations'), its one scratch the LoRAs' dxa [R, r] for every row
// (w1's and w3's beside dx in dxs when they fold: mt_experts_xs_extra).
void mt_experts_forward_gpu(mt_model *m, int L, const mt_tensor *ys_own);
// The columns the GPU step's experts want beside layer L's dys [Tk, H] (its row stride H + this):
// with w2's LoRA folded into the experts' dx GEMM, dxa = s·dys·B2 goes there, and
// da = [dys | dxa]·[W2; A2] is one GEMM. 0: no fold (the cpu, dropout, an expert without).
int64_t mt_experts_dys_extra(const mt_model *m, int L);
// Columns beside x in xs's rows for w1's and w3's LoRA xa (2r) when their B fold into the
// forward's base GEMM, else 0 (model/experts_gpu.c).
int64_t mt_experts_xs_extra(mt_model *m);
// Columns beside the SwiGLU output in a's rows for w2's LoRA xa (r) when its B folds into the
// forward's w2 GEMM, ys = [a | xa2]·[W2 | s·B2]ᵀ, else 0 (model/experts_gpu.c).
int64_t mt_experts_a_extra(mt_model *m);
void mt_experts_backward_gpu(mt_model *m, int L, const mt_tensor *dys_own, const mt_tensor *dxs, int64_t R);

// MLA's attention (model/attention_mla.c): ln1's output -> a->att, and from the attention output's
// gradient datt back into MLA's weights, LoRAs and dln1 (NULL: not wanted; accumulated).
void mt_mla_forward(mt_model *m, int L);
void mt_mla_backward(mt_model *m, int L, const mt_tensor *datt, const mt_tensor *dln1);

// The dense MLP of a dense layer, or the shared expert of an MoE layer (model/mlp.c), on every
// token of ln2: forward fills a->mlp_* (y, and s for the shared expert); add_output: x_out += y,
// or s ⊙ y. Backward from dx (the layer output's gradient) accumulates into dln2 (NULL: not
// wanted) and the Linears' gradients. Counting: the same buffers and scratch, no kernel.
void mt_mlp_forward(mt_model *m, int L);
void mt_mlp_add_output(mt_model *m, int L, mt_act *x_out);
void mt_mlp_backward(mt_model *m, int L, const mt_tensor *dx, const mt_tensor *dln2);
// The intermediate size of layer L's MLP (dense or shared expert), 0 when it has none.
int64_t mt_mlp_size(const mt_model *m, int L);

// Attention extras on the model's backend (model/dispatch.c; kernels model/bias.c and
// model/parts_cuda.cu): y [T, n] += b [n]; db [n] += Σ_t dy [T, n] (db NULL: frozen); x [n]
// clamped to [-c, c]; dy zeroed where the value before clamping (x, or RMSNorm's output
// w · (x_raw · rstd) over rows of `width`) was outside [-c, c]. Counting: nothing runs.
void mt_bias_forward(mt_model *m, mt_act *y, const mt_act *b, int64_t T, int64_t n);
void mt_op_logit_bias_forward(mt_model *m, float *logits, const mt_act *b, int T, int E);
void mt_op_logit_bias_backward(mt_model *m, mt_act *db, const float *dlogits, int T, int E);
// gpt-oss's expert biases over a grouped call's rows (model/ops.h: expert_bias_*_cpu; the GPU
// step's experts, model/experts_gpu.c). Counting: nothing runs.
void mt_op_expert_bias_forward(mt_model *m, mt_act *y, int64_t ldy, const mt_act *b, int64_t ldb, int64_t n,
                               const mt_expert_offsets *g);
void mt_op_expert_bias_backward(mt_model *m, mt_act *db, int64_t lddb, const mt_act *dy, int64_t ldy, int64_t n,
                                const mt_expert_offsets *g);
void mt_bias_backward(mt_model *m, mt_act *db, const mt_act *dy, int64_t T, int64_t n);
void mt_clip_forward(mt_model *m, mt_act *x, int64_t n, float c);
void mt_clip_backward(mt_model *m, mt_act *dy, const mt_act *x, int64_t n, float c);
void mt_clip_backward_normed(mt_model *m, mt_act *dy, const mt_act *x_raw, const float *rstd, const mt_act *w,
                             int64_t rows, int64_t width, float c);

// Expert buffers of `a` (xs, g, u, a, expert xa) holding at least `rows` rows (model/acts.c).
void mt_model_expert_acts_ensure(mt_model *m, mt_layer_acts *a, int64_t rows);
// The shared expert's gate (model/mlp.c): x [n] = sigmoid(x) (f32); out [T, H] += (s ? s[t] : 1)
// · y; dy [T, H] = s[t] · dx and ds [T] = s (1 − s) Σ_i dx·y, both written (model/ops.h).
void mt_op_sigmoid(mt_model *m, float *x, int64_t n);
void mt_op_scaled_add(mt_model *m, mt_act *out, const mt_act *y, const float *s, int64_t T, int64_t H);
void mt_op_gate_backward(mt_model *m, mt_act *dy, float *ds, const mt_act *dx, const mt_act *y, const float *s,
                         int64_t T, int64_t H);
