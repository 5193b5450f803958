// optim/ — AdamW (fp32 and 8-bit state, offload), its CUDA twin, learning-rate schedules, a
// model's trainables as params (params.h) and their distribution over ranks with ZeRO-1
// (dist.h). Uses core/, quant/ (8-bit maps), model/ (params.h); used by plan/ (--measure) and
// trainer/. This is its main header.
//
// optim/optim.h — AdamW over a list of trainable tensors: global-norm clipping, bias
// correction, decoupled weight decay, fp32 master copies of non-f32 weights, optional 8-bit
// state (bitsandbytes' blockwise AdamW8bit), optional offload of the state to host memory, and
// the state saved to / restored from a safetensors file bit for bit.
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
// Options (mt_adamw_opts; the trainer's --adam-8bit, --no-master-weights, --offload-optimizer):
//
//   adam_8bit       bitsandbytes' AdamW8bit state (bitsandbytes/optim/optimizer.py,
//                   Optimizer2State.init_state and update_step; csrc/kernels.cu,
//                   kOptimizerStatic8bit2StateBlockwise). For a param of n >= MT_ADAM8_MIN_SIZE
//                   (4096, bitsandbytes' min_8bit_size) elements, m and v are 8-bit codes (U8,
//                   the param's shape) with one fp32 absmax per block of MT_ADAM8_BLOCK (256)
//                   consecutive elements: m on the signed dynamic map (quant/formats.h,
//                   create_dynamic_map(signed=True)), v on the unsigned one
//                   (mt_adam8_map(0), create_dynamic_map(signed=False)). A step, block by block:
//                   dequantize (map[code]·absmax), apply the fp32 update above to the block (the
//                   new weights use the new m, v before requantization, as the kernel does), then
//                   absmax = max|x| over the block and code = nearest map entry of x/absmax
//                   (mt_q8_code, the kernel's binary search); a code of m whose map value lost
//                   m's sign moves one step toward it (the kernel's sign fix). Smaller params keep
//                   fp32 state. State bytes: 2 per element + 8 per block of 256 (2.03125 B/param).
//                   Where the kernel and torch differ, this follows our fp32 path (torch's order:
//                   decay before the update; the CUDA kernel decays after it, bitsandbytes'
//                   pure-PyTorch reference before, as here), so 8-bit differs from fp32 only by
//                   the state's quantization, and the first step is bit-identical to fp32 Adam.
//                   An all-zero block stores absmax 0 and the codes of 0.0. Checked by hand
//                   against bitsandbytes 0.50.2's pure-PyTorch reference of this update
//                   (backends/triton/kernels_optim.py, optimizer_update_8bit_blockwise_pytorch):
//                   after 20 steps every code equal, absmax within 1 ulp, weights within 3e-8.
//   master_weights  1 (default): bf16 weights get an fp32 master (MT_MEM_MASTER) and w = bf16 of
//                   it after each step. 0: no master; the update reads the bf16 weight, computes
//                   in fp32 and rounds to the nearest bf16 (ties to even), so an update smaller
//                   than half a bf16 ulp of the weight is lost. f32 weights: no effect.
//   offload         m, v, absmax and masters live in host memory, in a host backend the
//                   optimizer owns (its own ledger: mt_adamw_host_bytes), not in the weights'
//                   backend, whose ledger then holds no optim or master bytes. The update runs
//                   on the host: grads come down and weights go up through the weights'
//                   backend's download/upload, in chunks of MT_ADAM_OFFLOAD_CHUNK elements
//                   (the norm reads the grads in a first pass). On the cpu backend the numbers
//                   are bit-identical to no offload (the copies are memcpy); on the null backend
//                   the host side is a null backend too (counted, nothing allocated). Transfers
//                   do not overlap compute yet.
//
// Which params decay is the caller's choice through mt_param.decay; mt_param_decays() gives the
// usual rule: every matrix decays (embeddings and lm_head included, as the transformers Trainer
// and llm.c do), 1-D tensors (norm weights, biases) do not.
//
// Backends: without offload the update runs where the tensors live: the CPU one (host floats),
// or CUDA (optim/optim_cuda.cu: multi-tensor launches, fp32 state only; NOT yet run on a GPU).
// On the null backend the state is allocated (so the ledger counts it) and steps compute
// nothing. Other backends, and 8-bit state on CUDA: mt_adamw_step returns -1 unless offload is
// on (the update then runs on the host for any backend with download/upload).
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
    int adam_8bit;        // 0; 1: blockwise 8-bit m, v for params of >= MT_ADAM8_MIN_SIZE elements
    int master_weights;   // 1; 0: bf16 weights are updated directly (no fp32 master)
    int offload;          // 0; 1: state and masters in host memory, updated on the host
} mt_adamw_opts;

mt_adamw_opts mt_adamw_opts_default(void);  // lr 1e-4, master weights on and the defaults above

#define MT_ADAM8_BLOCK 256              // bitsandbytes' blocksize for blockwise 8-bit optimizers
#define MT_ADAM8_MIN_SIZE 4096          // bitsandbytes' min_8bit_size: smaller params stay fp32
#define MT_ADAM_OFFLOAD_CHUNK (1 << 19) // elements per download/update/upload round (offload)

typedef struct mt_adamw {
    mt_backend *be;        // the weights' backend (given to init)
    mt_backend *state_be;  // where m, v, absmax and the masters live: be, or `host`
    mt_backend *host;      // offload: the host backend the optimizer owns (cpu, or null), else NULL
    mt_adamw_opts opts;
    int n;                 // number of params, fixed at init
    mt_tensor **m;         // [n] exp_avg: fp32, or U8 codes (8-bit), the param's shape, MT_MEM_OPTIM
    mt_tensor **v;         // [n] exp_avg_sq: likewise (unsigned map)
    mt_tensor **m_absmax;  // [n] 8-bit params: fp32 [ceil(numel/256)] of m, MT_MEM_OPTIM; else NULL
    mt_tensor **v_absmax;  // [n] likewise for v
    mt_tensor **master;    // [n] fp32 copy of w when w is bf16 and master_weights, else NULL
    int64_t step;          // updates applied so far (skipped steps do not count)
} mt_adamw;

// Allocates zeroed m and v (and absmax) for every param and a master copy (initialised from w)
// for every bf16 w when master_weights, on `be` or, with offload, on the optimizer's own host
// backend. 0, or -1 with an error naming the param (bad dtype, shape mismatch between w and g,
// bad option, ledger refusal); on failure nothing stays allocated.
// opts NULL: mt_adamw_opts_default().
int mt_adamw_init(mt_adamw *o, mt_backend *be, const mt_param *params, int n,
                  const mt_adamw_opts *opts);
void mt_adamw_free(mt_adamw *o);

// Global L2 norm over all grads: sum of squares in double, in fixed-size blocks summed in order,
// so the result depends only on the data (not on the thread count). NaN/inf propagate. Grads on
// the null backend count as zero; on a backend without a norm kernel the result is NaN (with
// an error set), so a caller skips rather than trusting a wrong norm.
double mt_grad_norm(const mt_param *params, int n);

// Σ x² of host memory x [n] (f32 or bf16) in the norm's fixed blocked order.
double mt_sumsq(const void *x, mt_dtype dt, int64_t n);
// The same of memory of `be` (cuda: the device's blocked sum, one small download).
double mt_sumsq_any(mt_backend *be, const void *x, mt_dtype dt, int64_t n);
// The same for `count` pieces x[i] [n[i]] of dtype dt, into sums[i]: on cuda one download for
// all of them (the host waits once, not once a piece).
void mt_sumsq_pieces(mt_backend *be, const void *const *x, mt_dtype dt, const int64_t *n, int count, double *sums);

// One step at learning rate lr, clipping to `clip` (0: no clipping). The norm before clipping
// goes to *grad_norm_out (may be NULL). Returns 0 when applied; 1 when the norm is not finite
// (nothing changes, the step count included: the caller logs the skip); -1 with an error when
// params do not match init, lr is negative or not finite, or the backend has no update.
int mt_adamw_step(mt_adamw *o, const mt_param *params, int n, double lr, double clip,
                  double *grad_norm_out);

// The same step with the norm given: a distributed run's norm covers every rank's gradients
// (optim/dist.h), which no rank holds alone. A non-finite norm skips as above.
int mt_adamw_step_norm(mt_adamw *o, const mt_param *params, int n, double lr, double clip,
                       double grad_norm);

// 1 when param i keeps 8-bit state.
int mt_adamw_is_8bit(const mt_adamw *o, int i);
// Bytes of optimizer state in host memory (offload: m, v, absmax and masters; else 0): the host
// figure beside the device ledger, equal to what the ledger's optim + master would hold.
uint64_t mt_adamw_host_bytes(const mt_adamw *o);

// State for resume: for each param "<name>.exp_avg", "<name>.exp_avg_sq" (F32, or U8 codes for
// 8-bit state, the param's shape), for 8-bit state "<name>.exp_avg.absmax" and
// "<name>.exp_avg_sq.absmax" (F32 [ceil(numel/256)]) and, when kept, "<name>.master" (F32, the
// param's shape), and the step count in the metadata
// {"format":"moetrain-adamw","step":"<n>"}; written atomically. Load checks every tensor
// (present, dtype, shape) and that the file holds no others before copying anything, so a failed
// load leaves the optimizer as it was; errors name the file and the tensor. The weights
// themselves are not touched by load: the caller restores them from its own checkpoint.
int mt_adamw_save(const mt_adamw *o, const mt_param *params, int n, const char *path);
int mt_adamw_load(mt_adamw *o, const mt_param *params, int n, const char *path);

// The usual decay rule: 1 for tensors of rank >= 2, 0 for rank < 2 (norms, biases).
int mt_param_decays(const mt_tensor *w);

// ---------------------------------------------------------------------------------------------
// 8-bit state (optim/optim8.c): bitsandbytes' blockwise dynamic quantization, host arrays.

// The 256-entry map: signed (m; quant/formats.h's MT_DYNAMIC_MAP_VALUES) or unsigned (v;
// create_dynamic_map(signed=False): 0.0 at code 0, 1.0 at 255, strictly increasing).
const float *mt_adam8_map(int is_signed);
// x [n] -> codes [n] and absmax [ceil(n/256)], blocks of 256 from x[0]: absmax = max|x| of the
// block; code = mt_q8_code(map, x / absmax), then for the signed map the sign fix; an all-zero
// block gets absmax 0 and the code of 0.0. Unsigned: x must be >= 0.
void mt_adam8_quantize(int is_signed, const float *x, int64_t n, uint8_t *codes, float *absmax);
// y[i] = map[codes[i]] · absmax[i / 256].
void mt_adam8_dequantize(int is_signed, const uint8_t *codes, const float *absmax, int64_t n,
                         float *y);

#ifdef __cplusplus
}
#endif
