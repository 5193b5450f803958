// optim/optim_cuda.h — CUDA twins of optim/optim.h's AdamW element update and grad norm
// (optim/optim_cuda.cu), on device tensors; conventions as in model/ops_cuda.h; CUDA builds
// (MT_CUDA) only.
#pragma once
#include <stdint.h>

#include "core/backend.h"
#include "optim/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

// The per-step scalars of the update, as optim/optim.c rounds them (double → fp32 once).
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
