// moe/moe_cuda.h — CUDA twins of moe/moe.h's kernels (moe/moe_cuda.cu), conventions as in
// model/ops_cuda.h: same arguments as the CPU twin, device pointers of the cuda backend, CUDA
// builds (MT_CUDA) only.
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

#ifdef __cplusplus
}
#endif
