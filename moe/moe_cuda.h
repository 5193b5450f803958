// moe/moe_cuda.h — CUDA twins of moe/moe.h's kernels (moe/moe_cuda.cu), conventions as in
// model/ops_cuda.h: same arguments as the CPU twin, device pointers of the cuda backend, CUDA
// builds (MT_CUDA) only.
//
// Dtypes (issue 12): the step's activations and their gradients are bf16 (mt_bf16): gather,
// combine and SwiGLU read and write bf16, compute in fp32 and round once per stored element
// (backward ops read their bf16 gradient, add in fp32, round once). The router, its losses,
// permute and weights_of_choices stay fp32 (logits, probs, weights, dlogits, dweights).
#pragma once
#include <stdint.h>

#include "core/backend.h"
#include "moe/moe.h"

#ifdef __cplusplus
extern "C" {
#endif

void router_forward_cuda(mt_backend *be, int32_t *ids, float *weights, float *probs, const float *logits, int T,
                         int E, int k, int norm_topk);
void router_backward_cuda(mt_backend *be, float *dlogits, const float *dweights, const float *probs,
                          const int32_t *ids, const float *weights, int T, int E, int k, int norm_topk);

// The DeepSeek-style router (moe/moe.h, moe_route_rule): the CPU twin's per-row code
// (moe/router_grouped_row.h), a thread per row. bias [E] (fp32, device) or NULL.
void router_grouped_forward_cuda(mt_backend *be, int32_t *ids, float *weights, float *scores, const float *logits,
                                 const float *bias, int T, int E, int k, moe_route_rule rule);
void router_grouped_backward_cuda(mt_backend *be, float *dlogits, const float *dweights, const float *scores,
                                  const int32_t *ids, const float *weights, int T, int E, int k, moe_route_rule rule);
void router_grouped_weights_of_choices_cuda(mt_backend *be, float *weights, const float *scores, const int32_t *ids,
                                            int T, int E, int k, moe_route_rule rule);
// The bias update's load: counts [E] device doubles += the unmasked rows choosing e (no host
// wait; zero them at the start of a step); then the update from the device counts. Download the
// counts (or sum them over ranks) only for a log line.
void router_load_accumulate_cuda(mt_backend *be, double *counts, const int32_t *ids, const uint8_t *row_mask, int T,
                                 int E, int k);
void router_bias_update_cuda(mt_backend *be, float *bias, const double *counts, int E, float rate);

// The sequence-wise balance loss (router_seq_aux_*_cpu): acc [2] device doubles += the sum of
// the sequences' losses and their count (no host wait; fetch them with the step's statistics).
void router_seq_aux_accumulate_cuda(mt_backend *be, double *acc, const float *scores, const int32_t *ids,
                                    const uint8_t *row_mask, int B, int S, int E, int k);
void router_seq_aux_backward_cuda(mt_backend *be, float *dlogits, float dscale, const float *scores,
                                  const int32_t *ids, const uint8_t *row_mask, int B, int S, int E, int k, int sigmoid);

// The router's loss statistics live on the device while a step runs, as MT_AUX_STATS_LEN(E)
// doubles: counts [E], prob_sums [E], rows [1] (the fields of moe_aux_stats), then the z-loss
// sum [1] and its row count [1], then the sequence-wise balance loss's sum and sequence count
// (MT_AUX_STATS_SEQ(E), router_seq_aux_accumulate_cuda's acc). The caller zeroes them at the start of a step (fill_zero), each
// layer accumulates (moe_aux_accumulate_cuda, moe_zloss_accumulate_cuda: no host wait), and
// moe_aux_stats_download_cuda brings all of them to the host at once (the step's one
// synchronisation for them) for moe_aux_loss and the z-loss mean. The backwards read the device
// totals, so they need no host value.
// stats [MT_AUX_STATS_LEN(E)] device doubles: the aux statistics, the z-loss sum and its row count,
// the balance loss's sum and its sequence count
#define MT_AUX_STATS_LEN(E) (2 * (E) + 5)
#define MT_AUX_STATS_SEQ(E) (2 * (E) + 3)
void moe_aux_accumulate_cuda(mt_backend *be, double *stats, const float *probs, const int32_t *ids,
                             const uint8_t *row_mask, int T, int E, int k);
// Sets *s (its E from s->E, as moe_aux_init left it), *z_sum, *z_rows and seq [2] (the balance
// loss's sum and count; any of these may be NULL) from the device totals: one copy, one
// synchronisation; and extra_bytes more from the device's extra_src to the host's extra_dst in
// the same wait (0: none; the step's expert offsets that stayed on the device).
void moe_aux_stats_download_cuda(mt_backend *be, moe_aux_stats *s, const double *stats, double *z_sum,
                                 int64_t *z_rows, double *seq, void *extra_dst, const void *extra_src,
                                 size_t extra_bytes);
void moe_aux_backward_cuda(mt_backend *be, float *dlogits, float coef, const double *stats, const float *probs,
                           const uint8_t *row_mask, int T, int E);

// stats[2E+1] += Σ over unmasked rows of logsumexp(logits)² (moe_zloss_sum_cpu's sum), stats[2E+2]
// += their count; no host wait. Per-block partials in a fixed tree, then one block adds them in
// block order: the same bits every run (they may differ from the CPU's in the last places).
void moe_zloss_accumulate_cuda(mt_backend *be, double *stats, const float *logits, const uint8_t *row_mask, int T,
                               int E);
void moe_zloss_backward_cuda(mt_backend *be, float *dlogits, float dscale, const float *logits,
                             const uint8_t *row_mask, int T, int E);

// Stable counting sort on the device (chunk histograms, a scan, a stable scatter), no host
// synchronisation: order, offsets and counts stay on the device (copy counts out asynchronously
// when the host wants them). E ≤ 1024. An expert id outside [0, E) traps the kernel (the next
// checked CUDA call reports the fault), where the CPU exits with a message.
void moe_permute_cuda(mt_backend *be, int32_t *order, int32_t *offsets, int32_t *counts, const int32_t *ids,
                      int T, int E, int k);
// xs [n, H] bf16 (rows ldo ≥ H apart): row i = x [order[i] / k] (a copy: exact).
void moe_gather_cuda(mt_backend *be, mt_bf16 *xs, int64_t ldo, const mt_bf16 *x, const int32_t *order, int n, int H,
                     int k);
// The scatters (gather backward, combine) invert `order` on the device and add each token's k
// rows in the CPU's order (ascending position in `order`) in fp32 (combine: onto the fp32 value
// of the bf16 output), and round once: no atomics. k ≤ 16. H % 8 == 0 takes 16-byte loads and
// stores.
// dx [T, H] = Σ of token t's rows of dxs [n, H] (rows ldi ≥ H apart; written, not added to: the
// caller need not zero it)
void moe_gather_backward_cuda(mt_backend *be, mt_bf16 *dx, const mt_bf16 *dxs, int64_t ldi, const int32_t *order, int n,
                              int H, int k);
// out [T, H] += weights[a] · ys[i] (weights fp32)
void moe_combine_cuda(mt_backend *be, mt_bf16 *out, const mt_bf16 *ys, const float *weights, const int32_t *order,
                      int n, int H, int k);
// dys [n, H] (rows ldd apart) = weights[a] · dout[t] (bf16, written, not accumulated: the caller
// need not zero it); dweights [n] += <dout[t], ys[i]> (fp32, summed in fp32); either may be NULL.
void moe_combine_backward_cuda(mt_backend *be, mt_bf16 *dys, int64_t ldd, float *dweights, const mt_bf16 *dout,
                               const mt_bf16 *ys, const float *weights, const int32_t *order, int n, int H, int k);

// Replay of recorded routing: weights [T, k] = the chosen probs, renormalised when norm
// (norm_topk_prob; model/forward.c).
void moe_weights_of_choices_cuda(mt_backend *be, float *weights, const float *probs, const int32_t *ids, int T,
                                 int E, int k, int norm);

// SwiGLU over the fused w1‖w3 output: row r of gu [rows, 2f] is [g_r (f) | u_r (f)], bf16.
// f % 8 == 0 takes 16-byte loads and stores (8 bf16), other f a scalar path. CPU twins:
// swiglu_fused_forward_cpu / swiglu_fused_backward_cpu (moe/moe.h).
// a [rows, f] (row stride lda ≥ f: columns past f untouched) = silu(gu[:, :f]) * gu[:, f:]
void swiglu_fused_forward_cuda(mt_backend *be, mt_bf16 *a, int64_t lda, const mt_bf16 *gu, int64_t rows, int64_t f);
// dgu [rows, 2f] = (d/dg, d/du) of a given da [rows, f] (row stride ldda), written, not added
// (dgu NULL: nothing to do); dgu may be gu itself (in place: the experts' backward reuses gu's
// storage)
void swiglu_fused_backward_cuda(mt_backend *be, mt_bf16 *dgu, const mt_bf16 *da, int64_t ldda, const mt_bf16 *gu,
                                int64_t rows, int64_t f);
// gpt-oss's clamped SwiGLU over the same layout (alpha, limit from the config), the same
// contract; CPU twins swiglu_clamped_fused_forward_cpu / _backward_cpu (moe/moe.h).
void swiglu_clamped_fused_forward_cuda(mt_backend *be, mt_bf16 *a, int64_t lda, const mt_bf16 *gu, int64_t rows,
                                       int64_t f, float alpha, float limit);
void swiglu_clamped_fused_backward_cuda(mt_backend *be, mt_bf16 *dgu, const mt_bf16 *da, int64_t ldda,
                                        const mt_bf16 *gu, int64_t rows, int64_t f, float alpha, float limit);

#ifdef __cplusplus
}
#endif
