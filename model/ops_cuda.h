// model/ops_cuda.h — CUDA twins of the CPU reference kernels of model/ops.h, fp32; with them,
// the twins of moe/moe.h (moe/moe_cuda.h) and of the LoRA forward/backward (lora/lora_cuda.h).
// The AdamW update's are optim/optim_cuda.h. What follows holds for all of them.
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
// moe/moe_cuda.cu, lora/lora_cuda.cu, optim/optim_cuda.cu; parity: tests/test_cuda_ops.c and
// scripts/cuda_parity.c.
#pragma once
#include <stdint.h>

#include "core/backend.h"
#include "lora/lora_cuda.h"  // the LoRA and MoE twins, declared beside their CPU kernels
#include "moe/moe_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

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

#ifdef __cplusplus
}
#endif
