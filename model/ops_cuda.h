// model/ops_cuda.h — CUDA twins of the CPU reference kernels of model/ops.h (bf16 storage); with
// them, the twins of moe/moe.h (moe/moe_cuda.h) and the LoRA's dropout (lora/lora_cuda.h).
// The AdamW update's are optim/optim_cuda.h. What follows holds for all of them.
//
// Each `xxx_cuda(be, ...)` takes the arguments of its `xxx_cpu` twin with the same meaning, with
// every array a device pointer of the cuda backend `be`; work is launched on the backend's stream
// and nothing waits for it, except where the API returns a host value (cross_entropy_cuda,
// moe_aux_stats_download_cuda, mt_grad_norm_cuda): those compute on the device, copy one small
// result out and synchronise the stream once (mt_cuda_backend_sync: counted). Conventions as on the CPU:
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
#include "model/ops.h"  // mt_expert_offsets
#include "moe/moe_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---------------------------------------------------------------------------------------------
// model/ops.h, on bf16 storage (the dtype rule of a cuda step): activations, their gradients,
// the dense weights (norm weights and embedding included) and the weight gradients are bf16
// (mt_bf16 here, __nv_bfloat16 in the kernels); fp32 stays for RMSNorm's rstd, attention's lse,
// the cross-entropy's logits and gradient. Kernels load bf16 into fp32, compute in fp32 and
// round once on store; a gradient they accumulate into is read, added in fp32 and rounded once.
// The CPU twins stay fp32: the parity tests feed them the bf16-rounded inputs. The row and
// elementwise kernels move 8 bf16 (16 bytes) per access where the pointers are 16-byte aligned
// and the row length a multiple of 8, element by element otherwise (any H).

// out [T, H] = wte [V, H] [tokens[t]], an exact copy.
void embedding_forward_cuda(mt_backend *be, mt_bf16 *out, const int32_t *tokens, const mt_bf16 *wte, int T, int H);
// dwte [V, H] += dout [T, H] by token. Deterministic and one rounding per row of dwte: the rows
// of a repeated token are summed in fp32, in row order, by the block of its first row (links to
// the next row with the same token in work scratch, int32 [2T], found by a tiled scan of the
// later tokens: O(T²) comparisons at worst, ~1e9 for T = 32k). A frozen embedding passes
// dwte = NULL.
void embedding_backward_cuda(mt_backend *be, mt_bf16 *dwte, const mt_bf16 *dout, const int32_t *tokens, int T, int H);

// x [T, H], w [H] → y [T, H] = w · x · rstd, rstd [T] f32.
void rmsnorm_forward_cuda(mt_backend *be, mt_bf16 *y, float *rstd, const mt_bf16 *x, const mt_bf16 *w, int T, int H,
                          float eps);
// dx [T, H] += ..., dw [H] += Σ_t dy · x · rstd: reduced over T in fp32 (partials of 256 rows in
// work scratch, f32 [ceil(T/256), H], then summed in order), one rounding into dw.
void rmsnorm_backward_cuda(mt_backend *be, mt_bf16 *dx, mt_bf16 *dw, const mt_bf16 *dy, const mt_bf16 *x,
                           const mt_bf16 *w, const float *rstd, int T, int H);

// x [T, n_heads, stride]: dims [off, off + rot) of each head rotated in place (one rounding per
// element), pairs as model/ops.h's interleave says; inv_freq [rot/2] f32 (device).
void rope_forward_cuda(mt_backend *be, mt_bf16 *x, const int32_t *pos, int T, int n_heads, int stride, int off,
                       int rot, int interleave, const float *inv_freq, float scale);
void rope_backward_cuda(mt_backend *be, mt_bf16 *dx, const int32_t *pos, int T, int n_heads, int stride, int off,
                        int rot, int interleave, const float *inv_freq, float scale);

// Fused (flash-style, on tensor cores: WMMA bf16 GEMMs with fp32 accumulation): one block per
// (sequence, head, tile of queries), online softmax in fp32; lse [T, nh] f32 as the CPU writes
// it. q, k, v, out and the gradients bf16, as are the shared-memory tiles and P, dS before their
// GEMMs. Backward recomputes the probabilities from lse, one pass for dq (over query tiles) and
// one for dk, dv (over key tiles), so each output row has one writer. q, k rows of hd, v, out
// rows of hd_v, scores scaled by `scale`, as model/ops.h.
// Which path runs:
//   - cuDNN's SDPA (model/attention_cudnn.h, same results and lse), the default (MT_ATTENTION=auto)
//     where cuDNN loads and the shape suits it (hd and hd_v multiples of 8 up to 256 — they may
//     differ: cuDNN 9 takes d_qk ≠ d_v, e.g. 192 | 128 on Hopper —, 16-byte aligned rows, a key
//     mask only as lengths) and the library builds both graphs; under MT_ATTENTION=cudnn any
//     refusal is fatal.
//   - the WMMA kernels: any 0 < hd, hd_v ≤ 256, equal or not (MLA's 192 | 128), multiples of 16
//     or not (each tile zero-padded to a multiple of 16 in shared memory, so nobody pads or copies);
//     where cuDNN declines (its reason printed once), under MT_ATTENTION=wmma, and always with sinks.
//   - beyond 256: fatal on both.
// kv_len [B] int32 (device) or NULL: the key mask as sequence lengths when it is right padding
// (attention_kv_len_cuda makes them), the form cuDNN takes a key mask in.
// sinks [nh] bf16 or NULL (a dense weight), dsinks [nh] bf16 += (its gradient; NULL: skipped),
// reduced over the rows in fp32 in a fixed order, one rounding. With sinks both run the WMMA
// kernels, whatever MT_ATTENTION asks (cuDNN's graph here has no sink; noted once).
void attention_forward_cuda(mt_backend *be, mt_bf16 *out, float *lse, const mt_bf16 *q, const mt_bf16 *k,
                            const mt_bf16 *v, const mt_bf16 *sinks, const uint8_t *key_mask, const int32_t *kv_len,
                            int B, int S, int nh, int nkv, int hd, int hd_v, float scale, int window);
void attention_backward_cuda(mt_backend *be, mt_bf16 *dq, mt_bf16 *dk, mt_bf16 *dv, mt_bf16 *dsinks,
                             const mt_bf16 *dout, const mt_bf16 *q, const mt_bf16 *k, const mt_bf16 *v,
                             const mt_bf16 *out, const float *lse, const mt_bf16 *sinks, const uint8_t *key_mask,
                             const int32_t *kv_len, int B, int S, int nh, int nkv, int hd, int hd_v, float scale,
                             int window);
// kv_len [B] = the number of visible keys of each sequence of key_mask [B, S]: its length when
// the mask is right padding (the caller knows: the host copy of the mask).
void attention_kv_len_cuda(mt_backend *be, int32_t *kv_len, const uint8_t *key_mask, int B, int S);

// fp32 (the logits and their gradient stay fp32 by the dtype rule). One block per row: max,
// log-sum-exp and the gradient in one kernel. dlogits may be logits itself: then each counted
// row of logits is REPLACED by dscale·(softmax − onehot) (the fused lm_head path: fp32 logits
// are never duplicated) and ignored rows are zeroed; otherwise dlogits is accumulated as on the
// CPU and ignored rows are left untouched. Returns the loss sum (host) and sets *count: one
// device-to-host copy and one stream synchronisation. A target outside [0, V) is fatal, as
// on the CPU (detected on the device, reported after the synchronisation). With dlogits and
// count NULL only the gradient is made (the backward's pass, whose forward checked the
// targets): returns 0, no host wait.
double cross_entropy_cuda(mt_backend *be, float *dlogits, float dscale, int64_t *count, const float *logits,
                          const int32_t *targets, int T, int V, int ignore_index);

// The fused loss's forward (model/loss.c) over chunks of rows, with one host wait for all of
// them: acc is device scratch of MT_CE_ACC_BYTES(rows), rows the largest chunk (the caller takes
// it through the ledger, so the null backend counts it too). start zeroes the running sum; add
// takes a chunk's logits [n, V] fp32 and targets [n] (rows row0.. of the step) and adds their
// loss, summed in row order, to it on the device (no wait; the row losses are consumed before the
// next chunk's kernel overwrites them, in stream order); finish waits once and returns the sum
// and *count. A target outside [0, V) is fatal at finish, named by its row in `targets` (the
// step's). Deterministic: one stream, one writer, no atomics on the sums.
#define MT_CE_ACC_BYTES(rows) ((size_t)(rows) * sizeof(double) + 64)
void cross_entropy_acc_start(mt_backend *be, void *acc, int rows);
void cross_entropy_acc_add(mt_backend *be, void *acc, int rows, const float *logits, const int32_t *targets,
                           int64_t row0, int n, int V, int ignore_index);
double cross_entropy_acc_finish(mt_backend *be, void *acc, int rows, const int32_t *targets, int V, int ignore_index,
                                int64_t *count);

// y [n] = a + b (the residual add of the block), bf16, added in fp32.
void mt_add_cuda(mt_backend *be, mt_bf16 *y, const mt_bf16 *a, const mt_bf16 *b, int64_t n);

// dst [n] bf16 = src [n] f32 rounded to nearest even, NaN stays NaN (as mt_f32_to_bf16 of
// core/dtype.h, bit for bit except a NaN's payload): the router's and lm_head's fp32 gradients
// become GEMM inputs this way.
void mt_f32_to_bf16_cuda(mt_backend *be, mt_bf16 *dst, const float *src, int64_t n);

// The parts some families add (model/parts_cuda.cu; CPU twins in model/bias.c). bf16 except s,
// ds (f32). bias_backward sums each column over T in fp32 in a fixed order, one rounding into db
// (NULL: skipped). clip_backward_normed recomputes RMSNorm's bf16 output as
// rmsnorm_forward_cuda rounded it, so it cuts where the forward's clamp did.
void bias_forward_cuda(mt_backend *be, mt_bf16 *y, const mt_bf16 *b, int64_t T, int64_t n);
void bias_backward_cuda(mt_backend *be, mt_bf16 *db, const mt_bf16 *dy, int64_t T, int64_t n);
// gpt-oss's router bias on its fp32 logits [T, n] (bf16 b, db): twins of bias_forward_cpu and
// bias_backward_cpu; and its expert biases over a grouped call's rows (expert_bias_*_cpu).
void logit_bias_forward_cuda(mt_backend *be, float *logits, const mt_bf16 *b, int64_t T, int64_t n);
void logit_bias_backward_cuda(mt_backend *be, mt_bf16 *db, const float *dlogits, int64_t T, int64_t n);
void expert_bias_forward_cuda(mt_backend *be, mt_bf16 *y, int64_t ldy, const mt_bf16 *b, int64_t ldb, int64_t n,
                              const mt_expert_offsets *g);
void expert_bias_backward_cuda(mt_backend *be, mt_bf16 *db, int64_t lddb, const mt_bf16 *dy, int64_t ldy, int64_t n,
                               const mt_expert_offsets *g);
void clip_forward_cuda(mt_backend *be, mt_bf16 *x, int64_t n, float c);
void clip_backward_cuda(mt_backend *be, mt_bf16 *dy, const mt_bf16 *x, int64_t n, float c);
void clip_backward_normed_cuda(mt_backend *be, mt_bf16 *dy, const mt_bf16 *x_raw, const float *rstd,
                               const mt_bf16 *w, int64_t rows, int64_t width, float c);
void sigmoid_cuda(mt_backend *be, float *x, int64_t n);
// MLA's key and value assembly (model/mla.c): copies, so bit for bit; the backward's dkrot sums
// the heads in fp32 in head order and rounds once into dkrot, as dkvb's adds (NULL: skipped).
void mla_kv_forward_cuda(mt_backend *be, mt_bf16 *k, mt_bf16 *v, const mt_bf16 *kvb, const mt_bf16 *krot,
                         int64_t krot_stride, int T, int nh, int nope, int rope, int vd);
void mla_kv_backward_cuda(mt_backend *be, mt_bf16 *dkvb, mt_bf16 *dkrot, const mt_bf16 *dk, const mt_bf16 *dv,
                          int64_t krot_stride, int T, int nh, int nope, int rope, int vd);
void scaled_add_cuda(mt_backend *be, mt_bf16 *out, const mt_bf16 *y, const float *s, int64_t T, int64_t H);
// dy and ds are written; ds [T] summed per row by a block reduction (fixed order).
void gate_backward_cuda(mt_backend *be, mt_bf16 *dy, float *ds, const mt_bf16 *dx, const mt_bf16 *y,
                        const float *s, int64_t T, int64_t H);

#ifdef __cplusplus
}
#endif
