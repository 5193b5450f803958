// model/weights.h — the tensors of a checkpoint of any supported family, by Hugging Face name and
// shape (docs/formats.md "Hugging Face checkpoints", docs/families.md), and their random initialisation for `moetrain init`.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "model/config.h"

#ifdef __cplusplus
extern "C" {
#endif

// BIAS: a Linear's bias [out] (Qwen2-MoE's q/k/v), or gpt-oss's experts' [E, n], zero at init;
// NORM also covers the q/k RMSNorm weights; PARAM: a vector drawn like a Linear's weight (gpt-oss's
// router bias, attention sinks); EXPERTS: gpt-oss's fused experts, [E, in, out] (x · W).
typedef enum { MT_WEIGHT_EMBED, MT_WEIGHT_NORM, MT_WEIGHT_LINEAR, MT_WEIGHT_BIAS, MT_WEIGHT_PARAM,
               MT_WEIGHT_EXPERTS } mt_weight_kind;

typedef struct mt_weight_desc {
    char name[128];
    mt_weight_kind kind;
    int ndim;
    int64_t shape[3];  // [out, in] for linears, [vocab, hidden] for embeddings, [n] for norms, biases,
                       // [E, in, out] for fused experts
    int layer;         // -1 outside the decoder layers
    int expert;        // -1 outside the experts
} mt_weight_desc;

// Elements of a described tensor.
int64_t mt_weight_numel(const mt_weight_desc *w);
// Every tensor of the checkpoint in Hugging Face order; the caller frees *out.
size_t mt_weights_list(const mt_model_config *cfg, mt_weight_desc **out);

// Fills `dst` (numel elements of `dtype`) with the weight's initial values: norms 1, biases 0
// (transformers' _init_weights), the rest N(0, initializer_range), from a stream derived from
// (seed, name) alone.
void mt_weights_init_fill(const mt_model_config *cfg, const mt_weight_desc *w, uint64_t seed,
                          mt_dtype dtype, void *dst);

#ifdef __cplusplus
}
#endif
