// trainer/optim.h — AdamW over a list of trainable tensors: global-norm clipping, bias
// correction, decoupled weight decay, fp32 master copies of non-f32 weights, and its state
// saved to / restored from a safetensors file bit for bit.
//
// The update is torch.optim.AdamW's (single-tensor path, amsgrad off, maximize off), with
// t = the step count after this step (1 on the first step):
//
//   g  = grad · s          s = clip / ‖grad‖₂ (global, all params) when ‖grad‖ > clip > 0, else 1
//   w  = w · (1 − lr·wd)   only for params with decay = 1 (decoupled, before the Adam update)
//   m  = β1·m + (1 − β1)·g
//   v  = β2·v + (1 − β2)·g²
//   w  = w − (lr / (1 − β1^t)) · m / (√v / √(1 − β2^t) + ε)
//
// Clipping uses clip/‖g‖ where torch.nn.utils.clip_grad_norm_ uses clip/(‖g‖ + 1e-6); the two
// differ by a relative 1e-6/‖g‖. The gradients themselves are left untouched: the scale is
// applied inside the update (as g[i]·(float)s, identical to scaling them first in fp32).
//
// Numbers: m, v, the master copy and the element arithmetic are fp32; the scalars (bias
// corrections, step size, scale) are computed in double and rounded once to fp32 per step.
// No float atomics and a fixed reduction order (mt_grad_norm), so two runs — and a run resumed
// from mt_adamw_save() — give the same bits whatever the thread count.
//
// Which params decay is the caller's choice through mt_param.decay; mt_param_decays() gives the
// usual rule: every matrix decays (embeddings and lm_head included, as the transformers Trainer
// and llm.c do), 1-D tensors (norm weights, biases) do not.
//
// Backends: the update runs where the tensors live; this issue has the CPU one (host floats).
// On the null backend the state is allocated (so the ledger counts it) and steps compute
// nothing. Other backends: mt_adamw_step returns -1 until their twin of the update exists.
#pragma once
#include <stdint.h>

#include "core/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_param {  // one trainable tensor
    const char *name;      // checkpoint/adapter name, for logs and state files
    mt_tensor *w;          // the weight: f32, or bf16 (then an fp32 master copy is kept)
    mt_tensor *g;          // its gradient: same shape, same dtype as w
    int decay;             // 1: weight decay applies
} mt_param;

typedef struct mt_adamw_opts {
    double lr;            // peak lr (for the schedule; mt_adamw_step takes the step's own lr)
    double beta1, beta2;  // 0.9, 0.999
    double eps;           // 1e-8
    double weight_decay;  // 0.0 (transformers' TrainingArguments default)
} mt_adamw_opts;

mt_adamw_opts mt_adamw_opts_default(void);  // lr 1e-4 and the defaults above

typedef struct mt_adamw {
    mt_backend *be;      // where m, v and the masters live
    mt_adamw_opts opts;
    int n;               // number of params, fixed at init
    mt_tensor **m;       // [n] exp_avg, fp32, MT_MEM_OPTIM
    mt_tensor **v;       // [n] exp_avg_sq, fp32, MT_MEM_OPTIM
    mt_tensor **master;  // [n] fp32 copy of w when w is not f32 (MT_MEM_MASTER), else NULL
    int64_t step;        // updates applied so far (skipped steps do not count)
} mt_adamw;

// Allocates zeroed m and v for every param and a master copy (initialised from w) for every
// non-f32 w, all on `be`. 0, or -1 with an error naming the param (bad dtype, shape mismatch
// between w and g, bad option, ledger refusal); on failure nothing stays allocated.
// opts NULL: mt_adamw_opts_default().
int mt_adamw_init(mt_adamw *o, mt_backend *be, const mt_param *params, int n,
                  const mt_adamw_opts *opts);
void mt_adamw_free(mt_adamw *o);

// Global L2 norm over all grads: sum of squares in double, in fixed-size blocks summed in order,
// so the result depends only on the data (not on the thread count). NaN/inf propagate. Grads on
// the null backend count as zero; on a backend without a norm kernel the result is NaN (with
// an error set), so a caller skips rather than trusting a wrong norm.
double mt_grad_norm(const mt_param *params, int n);

// One step at learning rate lr, clipping to `clip` (0: no clipping). The norm before clipping
// goes to *grad_norm_out (may be NULL). Returns 0 when applied; 1 when the norm is not finite
// (nothing changes, the step count included: the caller logs the skip); -1 with an error when
// params do not match init, lr is negative or not finite, or the backend has no update.
int mt_adamw_step(mt_adamw *o, const mt_param *params, int n, double lr, double clip,
                  double *grad_norm_out);

// State for resume: for each param "<name>.exp_avg", "<name>.exp_avg_sq" and, when kept,
// "<name>.master" (F32, the param's shape), and the step count in the metadata
// {"format":"moetrain-adamw","step":"<n>"}; written atomically. Load checks every tensor
// (present, F32, shape) and that the file holds no others before copying anything, so a failed
// load leaves the optimizer as it was; errors name the file and the tensor. The weights
// themselves are not touched by load: the caller restores them from its own checkpoint.
int mt_adamw_save(const mt_adamw *o, const mt_param *params, int n, const char *path);
int mt_adamw_load(mt_adamw *o, const mt_param *params, int n, const char *path);

// The usual decay rule: 1 for tensors of rank >= 2, 0 for rank < 2 (norms, biases).
int mt_param_decays(const mt_tensor *w);

#ifdef __cplusplus
}
#endif
