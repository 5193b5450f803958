// model/model_internal.h — shared between the model's own files; not for other folders.
#pragma once
#include "model/mixtral.h"

void mt_model_acts_ensure(mt_model *m, int B, int S);
void mt_model_acts_free(mt_model *m);

// The activation set layer L uses: its own, or the shared one when recomputing.
static inline mt_layer_acts *layer_acts(mt_model *m, int L) { return &m->acts[m->recompute ? 0 : L]; }
void mt_layer_forward(mt_model *m, int L, float *x_out, int replay);

// A tensor's floats; NULL for no tensor (an EP rank whose experts got no rows has no expert buffers).
static inline float *F(const mt_tensor *t) { return t ? (float *)t->data : NULL; }
static inline int32_t *I(const mt_tensor *t) { return (int32_t *)t->data; }
// Element `i` of a buffer that may have no data (the null backend): NULL stays NULL.
static inline float *at(float *p, int64_t i) { return p ? p + i : NULL; }

// A step buffer's dtype: `gpu`, what a GPU run stores, when counting on the null backend; the
// cpu backend computes and keeps everything in f32 (integers stay as they are).
static inline mt_dtype step_dtype(const mt_model *m, mt_dtype gpu) {
    return m->counting || gpu == MT_I32 ? gpu : MT_F32;
}

// Rows [*row0, *row0 + *rows) of expert e in layer L's expert order. Counting, where routing has
// no data, every expert gets T·k/E rows and the first (T·k mod E) one more: balanced routing, as
// the planner assumes.
// With EP these are rows of the own layout (model/expert_parallel.c), none for another rank's.
void mt_expert_rows(const mt_model *m, int L, int e, int64_t *row0, int64_t *rows);

// Expert parallelism (model/expert_parallel.c); EP ranks call these in the same order.
void mt_ep_exchange_counts(mt_model *m, int L);
int64_t mt_ep_own_rows(const mt_model *m, int L);
void mt_ep_dispatch(mt_model *m, int L, float *own, float *local, int64_t w);
void mt_ep_return(mt_model *m, int L, float *local, float *own, int64_t w);
// Ops on the model's backend (model/dispatch.c): the CPU kernels' arguments, memory of m->be.
void mt_op_embedding_forward(mt_model *m, float *out, const int32_t *tokens, const float *wte, int T, int H);
void mt_op_embedding_backward(mt_model *m, float *dwte, const float *dout, const int32_t *tokens, int T, int H);
void mt_op_rmsnorm_forward(mt_model *m, float *y, float *rstd, const float *x, const float *w, int T, int H,
                           float eps);
void mt_op_rmsnorm_backward(mt_model *m, float *dx, float *dw, const float *dy, const float *x, const float *w,
                            const float *rstd, int T, int H);
void mt_op_rope(mt_model *m, float *x, const int32_t *pos, int T, int nh, int hd, float theta, int backward);
void mt_op_attention_forward(mt_model *m, float *out, float *lse, const float *q, const float *k, const float *v,
                             const uint8_t *mask, int B, int S, int nh, int nkv, int hd, int window);
void mt_op_attention_backward(mt_model *m, float *dq, float *dk, float *dv, const float *dout, const float *q,
                              const float *k, const float *v, const float *out, const float *lse,
                              const uint8_t *mask, int B, int S, int nh, int nkv, int hd, int window);
double mt_op_cross_entropy(mt_model *m, float *dlogits, float dscale, int64_t *count, const float *logits,
                           const int32_t *targets, int T, int V);
void mt_op_add(mt_model *m, float *y, const float *a, const float *b, int64_t n);
void mt_op_router_forward(mt_model *m, int32_t *ids, float *weights, float *probs, const float *logits, int T,
                          int E, int k);
void mt_op_router_backward(mt_model *m, float *dlogits, const float *dweights, const float *probs,
                           const int32_t *ids, const float *weights, int T, int E, int k);
void mt_op_weights_of_choices(mt_model *m, float *weights, const float *probs, const int32_t *ids, int T, int E,
                              int k);
void mt_op_aux_start(mt_model *m);
void mt_op_aux_accumulate(mt_model *m, const float *probs, const int32_t *ids, const uint8_t *mask, int T);
void mt_op_aux_finish(mt_model *m);
void mt_op_aux_upload(mt_model *m);
void mt_op_aux_backward(mt_model *m, float *dlogits, float coef, const float *probs, const uint8_t *mask, int T);
double mt_op_zloss_sum(mt_model *m, int64_t *rows, const float *logits, const uint8_t *mask, int T, int E);
void mt_op_zloss_backward(mt_model *m, float *dlogits, float dscale, const float *logits, const uint8_t *mask, int T,
                          int E);
void mt_op_permute(mt_model *m, int L);
void mt_op_gather(mt_model *m, float *xs, const float *x, const int32_t *order, int n, int H, int k);
void mt_op_gather_backward(mt_model *m, float *dx, const float *dxs, const int32_t *order, int n, int H, int k);
void mt_op_combine(mt_model *m, float *out, const float *ys, const float *weights, const int32_t *order, int n, int H,
                   int k);
void mt_op_combine_backward(mt_model *m, float *dys, float *dweights, const float *dout, const float *ys,
                            const float *weights, const int32_t *order, int n, int H, int k);
void mt_op_swiglu_forward(mt_model *m, float *a, const float *g, const float *u, int64_t n);
void mt_op_swiglu_backward(mt_model *m, float *dg, float *du, const float *da, const float *g, const float *u,
                           int64_t n);

// Expert buffers of `a` (xs, g, u, a, expert xa) holding at least `rows` rows (model/acts.c).
void mt_model_expert_acts_ensure(mt_model *m, mt_layer_acts *a, int64_t rows);
