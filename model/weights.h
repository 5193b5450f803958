// model/weights.h — the tensors of a Mixtral-family checkpoint, by Hugging Face name and shape
// (FORMATS.md §3.2), and their random initialisation for `moetrain init`.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "model/config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MT_WEIGHT_EMBED, MT_WEIGHT_NORM, MT_WEIGHT_LINEAR } mt_weight_kind;

typedef struct mt_weight_desc {
    char name[128];
    mt_weight_kind kind;
    int ndim;
    int64_t shape[2];  // [out, in] for linears, [vocab, hidden] for embeddings, [hidden] for norms
    int layer;         // -1 outside the decoder layers
    int expert;        // -1 outside the experts
} mt_weight_desc;

// Every tensor of the checkpoint in Hugging Face order; the caller frees *out.
size_t mt_weights_list(const mt_model_config *cfg, mt_weight_desc **out);

// Fills `dst` (numel elements of `dtype`) with the weight's initial values: norms 1, the rest
// N(0, initializer_range), from a stream derived from (seed, name) alone.
void mt_weights_init_fill(const mt_model_config *cfg, const mt_weight_desc *w, uint64_t seed,
                          mt_dtype dtype, void *dst);

#ifdef __cplusplus
}
#endif
