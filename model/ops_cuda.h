// model/ops_cuda.h — CUDA twins of the CPU reference kernels (model/ops.h, moe/moe.h, the LoRA
// forward/backward of lora/lora.h and the AdamW update of trainer/optim.h), fp32.
//
// Each `xxx_cuda(be, ...)` takes the arguments of its `xxx_cpu` twin with the same meaning, with
// every array a device pointer of the cuda backend `be`; work is launched on the backend's stream
// and nothing waits for it, except where the API returns a host value (cross_entropy_cuda,
// moe_zloss_sum_cuda, moe_aux_stats_download_cuda, mt_grad_norm_cuda): those compute on the
// device, copy one small result out and synchronise the stream once. Conventions as on the CPU:
// forward writes, backward ACCUMULATES, a NULL gradient is skipped. Scratch goes through
// mt_work_alloc (ledger: work). Reductions use no float atomics: results are reproducible run to
// run (they may differ from the CPU in the last bits: summation order, FMA).
//
// Plain C, no CUDA types: any build may include this header; the functions exist only in CUDA
// builds (MT_CUDA), so a CPU build must not call them. Implementations: model/ops_cuda.cu,
// moe/moe_cuda.cu, lora/lora_cuda.cu, trainer/optim_cuda.cu; parity: tests/test_cuda_ops.c and
// scripts/cuda_parity.c.
#pragma once
#include <stdint.h>

#include "core/backend.h"
#include "moe/moe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_lora mt_lora;    // lora/lora.h
typedef struct mt_param mt_param;  // trainer/optim.h
typedef struct mt_adamw mt_adamw;
typedef struct mt_adamw_opts mt_adamw_opts;

// ---------------------------------------------------------------------------------------------
// model/ops.h

void embedding_forward_cuda(mt_backend *be, float *out, const int32_t *tokens, const float *wte, int T, int H);
// Deterministic: one thread per column walks the tokens in order (as the CPU does), so repeated
// tokens need no atomics; parallel over H only (a frozen embedding passes dwte = NULL).
void embedding_backward_cuda(mt_backend *be, float *dwte, const float *dout, const int32_t *tokens, int T, int H);

void rmsnorm_forward_cuda(mt_backend *be, float *y, float *rstd, const float *x, const float *w, int T, int H,
                          float eps);
void rmsnorm_backward_cuda(mt_backend *be, float *dx, float *dw, const float *dy, const float *x, const float *w,
                           const float *rstd, int T, int H);

void rope_forward_cuda(mt_backend *be, float *x, const int32_t *pos, int T, int n_heads, int hd, float theta);
void rope_backward_cuda(mt_backend *be, float *dx, const int32_t *pos, int T, int n_heads, int hd, float theta);

// Fused (flash-style): one block per (sequence, head, tile of queries), online softmax in fp32;
// lse as the CPU writes it. Backward recomputes the probabilities from lse, one pass for dq
// (over query tiles) and one for dk, dv (over key tiles), so each output row has one writer.
// hd ≤ 256.
void attention_forward_cuda(mt_backend *be, float *out, float *lse, const float *q, const float *k,
                            const float *v, const uint8_t *key_mask, int B, int S, int nh, int nkv, int hd,
                            int window);
void attention_backward_cuda(mt_backend *be, float *dq, float *dk, float *dv, const float *dout, const float *q,
                             const float *k, const float *v, const float *out, const float *lse,
                             const uint8_t *key_mask, int B, int S, int nh, int nkv, int hd, int window);

// One block per row: max, log-sum-exp and the gradient in one kernel. dlogits may be logits
// itself: then each counted row of logits is REPLACED by dscale·(softmax − onehot) (the fused
// lm_head path: fp32 logits are never duplicated) and ignored rows are zeroed; otherwise dlogits
// is accumulated as on the CPU and ignored rows are left untouched. Returns the loss sum (host) and sets *count:
// one device-to-host copy and one stream synchronisation. A target outside [0, V) is fatal, as
// on the CPU (detected on the device, reported after the synchronisation).
double cross_entropy_cuda(mt_backend *be, float *dlogits, float dscale, int64_t *count, const float *logits,
                          const int32_t *targets, int T, int V, int ignore_index);

// y [n] = a + b (the residual add of the block).
void mt_add_cuda(mt_backend *be, float *y, const float *a, const float *b, int64_t n);

// ---------------------------------------------------------------------------------------------
// moe/moe.h

void router_forward_cuda(mt_backend *be, int32_t *ids, float *weights, float *probs, const float *logits, int T,
                         int E, int k, int norm_topk);
void router_backward_cuda(mt_backend *be, float *dlogits, const float *dweights, const float *probs,
                          const int32_t *ids, const float *weights, int T, int E, int k, int norm_topk);

// The aux-loss statistics live on the device while a step runs, as MT_AUX_STATS_LEN(E) doubles:
// counts [E], prob_sums [E], rows [1] (the fields of moe_aux_stats). The caller zeroes them at
// the start of a step (fill_zero), each layer accumulates, and moe_aux_stats_download_cuda fills
// a host moe_aux_stats (one synchronisation per step) for moe_aux_loss. The backward reads the
// device totals, so it needs no host value.
#define MT_AUX_STATS_LEN(E) (2 * (E) + 1)
void moe_aux_accumulate_cuda(mt_backend *be, double *stats, const float *probs, const int32_t *ids,
                             const uint8_t *row_mask, int T, int E, int k);
void moe_aux_stats_download_cuda(mt_backend *be, moe_aux_stats *s, const double *stats);
void moe_aux_backward_cuda(mt_backend *be, float *dlogits, float coef, const double *stats, const float *probs,
                           const uint8_t *row_mask, int T, int E);

// Returns the sum (host) and adds the row count to *rows: one copy and one synchronisation.
double moe_zloss_sum_cuda(mt_backend *be, int64_t *rows, const float *logits, const uint8_t *row_mask, int T,
                          int E);
void moe_zloss_backward_cuda(mt_backend *be, float *dlogits, float dscale, const float *logits,
                             const uint8_t *row_mask, int T, int E);

// Stable counting sort on the device (chunk histograms, a scan, a stable scatter), no host
// synchronisation: order, offsets and counts stay on the device (copy counts out asynchronously
// when the host wants them). E ≤ 1024. An expert id outside [0, E) traps the kernel (the next
// checked CUDA call reports the fault), where the CPU exits with a message.
void moe_permute_cuda(mt_backend *be, int32_t *order, int32_t *offsets, int32_t *counts, const int32_t *ids,
                      int T, int E, int k);
void moe_gather_cuda(mt_backend *be, float *xs, const float *x, const int32_t *order, int n, int H, int k);
// The scatters (gather backward, combine) invert `order` on the device and add each token's k
// rows in the CPU's order (ascending position in `order`): no atomics. k ≤ 16.
void moe_gather_backward_cuda(mt_backend *be, float *dx, const float *dxs, const int32_t *order, int n, int H,
                              int k);
void moe_combine_cuda(mt_backend *be, float *out, const float *ys, const float *weights, const int32_t *order,
                      int n, int H, int k);
void moe_combine_backward_cuda(mt_backend *be, float *dys, float *dweights, const float *dout, const float *ys,
                               const float *weights, const int32_t *order, int n, int H, int k);

// Replay of recorded routing: weights [T, k] = the chosen probs, renormalised (model/forward.c).
void moe_weights_of_choices_cuda(mt_backend *be, float *weights, const float *probs, const int32_t *ids, int T,
                                 int E, int k);

void swiglu_forward_cuda(mt_backend *be, float *a, const float *g, const float *u, int64_t n);
void swiglu_backward_cuda(mt_backend *be, float *dg, float *du, const float *da, const float *g, const float *u,
                          int64_t n);

// ---------------------------------------------------------------------------------------------
// lora/lora.h: A, B, dA, dB of `l` are f32 tensors of `be`; the matmuls go through the backend
// (cuBLASLt), dropout is regenerated from the same hash as the CPU (lora/lora_dropout.h).

void mt_lora_forward_cuda(mt_backend *be, const mt_lora *l, float *y, const float *x, float *xa, int64_t n);
void mt_lora_backward_cuda(mt_backend *be, const mt_lora *l, float *dx, const float *dy, const float *x,
                           const float *xa, float *scratch, int64_t n);

// ---------------------------------------------------------------------------------------------
// trainer/optim.h: the AdamW element update and the grad norm, on device tensors.

// The per-step scalars of the update, as trainer/optim.c rounds them (double → fp32 once).
typedef struct mt_adamw_scalars {
    float scale;      // clipping factor for g
    float decay_mul;  // 1 − lr·wd (params with decay = 1; the others use 1)
    float beta1, one_minus_beta1, beta2, one_minus_beta2;
    float step_size;  // lr / (1 − β1^t)
    float bc2_sqrt;   // √(1 − β2^t)
    float eps;
} mt_adamw_scalars;
// t = the step count after this step; norm = the grad norm before clipping.
mt_adamw_scalars mt_adamw_scalars_make(const mt_adamw_opts *o, int64_t t, double lr, double clip, double norm);

// Σ g² over the grads of params [n] (f32 or bf16 tensors of `be`), in double, ADDED to the device
// scalar *sumsq: fixed blocks summed in a fixed order, no synchronisation.
void grad_sumsq_cuda(mt_backend *be, double *sumsq, const mt_param *params, int n);
// mt_grad_norm's twin: √ of the above, one copy and one synchronisation.
double mt_grad_norm_cuda(mt_backend *be, const mt_param *params, int n);

// One AdamW update of every param with the optimizer's state (built by mt_adamw_init on `be`,
// without offload or 8-bit state): f32 weights, or bf16 with an fp32 master (w = bf16(master))
// or without (w = bf16(update of f32(w)), to nearest even). Multi-tensor launches, no sync.
// The caller computed k (mt_adamw_scalars_make) and advances o->step. 0, or -1 with an error.
int adamw_update_cuda(mt_backend *be, const mt_adamw *o, const mt_param *params, int n,
                      const mt_adamw_scalars *k);

#ifdef __cplusplus
}
#endif
