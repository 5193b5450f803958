// model/rope.h — the rotary embedding's frequency table: transformers' default RoPE and YaRN
// (modeling_rope_utils.py: _compute_default_rope_parameters, _compute_yarn_parameters), computed
// once per model; the kernels (model/ops.h rope_*) rotate by pos · inv_freq[j] and scale cos and
// sin by `scale` (transformers' attention_scaling).
#pragma once
#include <stdint.h>

#include "model/config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_rope_params {
    int yarn;                   // 0: default RoPE (theta and hd only), 1: YaRN
    int hd;                     // the rotated dimension (head_dim; even)
    double theta;               // rope_theta
    // YaRN (rope_parameters), as transformers reads them; 0 means "absent" where it has a default:
    double factor;              // 0: max_positions / original_max
    double beta_fast, beta_slow;  // 0: 32 and 1 (transformers' `or` defaults)
    double attention_factor;    // 0: derived from factor (and mscale, mscale_all_dim when both set)
    double mscale, mscale_all_dim;
    int64_t original_max;       // original_max_position_embeddings
    int64_t max_positions;      // max_position_embeddings (only to derive factor)
    int truncate;               // 1: floor/ceil the correction range (transformers' default)
} mt_rope_params;

// inv_freq [hd/2] and *scale (cos and sin are multiplied by it: 1 for the default RoPE) with
// transformers' fp32 steps, bit for bit where it computes in fp32. 0, or -1 with an error for
// bad values (hd odd or < 2, theta not positive, YaRN's factor or original_max not positive).
int mt_rope_table(const mt_rope_params *p, float *inv_freq, float *scale);

// The model's rope from its config: for now the default rope from rope_theta and head_dim.
void mt_rope_params_from_config(const mt_model_config *c, mt_rope_params *p);

#ifdef __cplusplus
}
#endif
