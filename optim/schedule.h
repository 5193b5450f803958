// optim/schedule.h — learning-rate schedules: linear warmup, then cosine, linear or constant.
//
// These are Hugging Face transformers' schedules (src/transformers/optimization.py), the
// multipliers of torch.optim.lr_scheduler.LambdaLR, with peak = the optimizer's base lr:
//
//   warmup (every schedule), step < warmup:   lr = peak · step / max(1, warmup)
//   cosine  (get_cosine_schedule_with_warmup, num_cycles = 0.5), step >= warmup:
//       progress = (step − warmup) / max(1, total − warmup)
//       lr = peak · max(0, 0.5 · (1 + cos(π · 2 · 0.5 · progress)))
//   linear  (get_linear_schedule_with_warmup), step >= warmup:
//       lr = peak · max(0, (total − step) / max(1, total − warmup))
//   constant (get_constant_schedule_with_warmup; with warmup = 0 also get_constant_schedule):
//       lr = peak
//
// `step` is transformers' `current_step`: the number of optimizer updates already applied, so
// the first update uses step 0 (LambdaLR evaluates the multiplier at last_epoch = 0 when it is
// built, and the Trainer calls scheduler.step() after each optimizer.step()). With a warmup,
// the first update therefore has lr = 0 exactly, as in transformers — it is not
// peak · (step + 1) / warmup. The last update of a run of `total` updates uses step total − 1;
// step == total gives 0 for cosine and linear. Past `total` transformers' cosine rises again
// (it is not clamped) and so does this one; the training loop never asks for it.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MT_SCHED_COSINE, MT_SCHED_LINEAR, MT_SCHED_CONSTANT } mt_schedule;

// lr for the update that follows `step` updates, in a run of `total` updates with `warmup`
// warmup updates. Negative warmup counts as 0.
double mt_lr_at(int64_t step, int64_t total, int64_t warmup, double peak, mt_schedule s);

// "cosine", "linear", "constant" <-> the enum. Parse: 0, or -1 with an error listing them.
int mt_schedule_parse(const char *text, mt_schedule *out);
const char *mt_schedule_name(mt_schedule s);

#ifdef __cplusplus
}
#endif
