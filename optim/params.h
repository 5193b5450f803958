// optim/params.h — the model's trainable tensors as the optimizer and checkpoints see them.
#pragma once
#include "model/mixtral.h"
#include "optim/optim.h"

// Every trainable of `m` in a fixed order, named as in the files they are saved to: LoRA as
// PEFT keys ("base_model.model.<module>.lora_A.weight"), full tensors by checkpoint name.
// The caller frees with mt_params_free.
int mt_model_params(mt_model *m, mt_param **out);
void mt_params_free(mt_param *p, int n);
uint64_t mt_params_count(const mt_param *p, int n);  // elements
// The dropout masks of step `step`, micro-batch `micro`: a pure function of (seed, step, micro,
// adapter), so a resumed run draws the same masks.
void mt_model_set_dropout_seed(mt_model *m, uint64_t seed, int64_t step, int micro);
// Every LoRA's dropout probability (0 for evaluation passes inside a training run).
void mt_model_set_lora_dropout(mt_model *m, float p);
// Scale every gradient by s (gradient accumulation averages micro-batches).
void mt_params_scale_grads(const mt_param *p, int n, float s);
