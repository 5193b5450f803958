// model/config.h — a Hugging Face config.json of the Mixtral family, read and checked.
#pragma once
#include <stdint.h>

#include "core/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_model_config {
    char architecture[64];   // "MixtralForCausalLM"
    char model_type[32];     // "mixtral"
    int64_t hidden;          // hidden_size
    int64_t intermediate;    // intermediate_size (per expert)
    int64_t layers;          // num_hidden_layers
    int64_t heads;           // num_attention_heads
    int64_t kv_heads;        // num_key_value_heads
    int64_t head_dim;        // hidden / heads unless config sets head_dim
    int64_t experts;         // num_local_experts
    int64_t top_k;           // num_experts_per_tok
    int64_t vocab;           // vocab_size
    int64_t max_positions;   // max_position_embeddings
    int64_t sliding_window;  // 0 = none (null in config.json)
    int64_t bos_token_id, eos_token_id;
    double rope_theta, rms_norm_eps, router_aux_loss_coef, router_jitter_noise, initializer_range;
    int tie_word_embeddings;
    mt_dtype torch_dtype;    // the checkpoint's stored dtype

    // quantization_config (bitsandbytes), when the checkpoint is pre-quantized
    int quantized;           // 1 when quantization_config.load_in_4bit is true
    char quant_type[8];      // "nf4" / "fp4"
    int double_quant;        // bnb_4bit_use_double_quant
} mt_model_config;

// Reads `path` (a config.json, or a folder holding one). 0, or -1 with an error that names the
// file and the field. The result has passed mt_model_config_check().
int mt_model_config_load(const char *path, mt_model_config *cfg);
// Parses JSON text; `source` names it in errors.
int mt_model_config_parse(const char *json, size_t len, const char *source, mt_model_config *cfg);
// Consistency: positive sizes, heads divide hidden, kv_heads divide heads, top_k <= experts, ...
int mt_model_config_check(const mt_model_config *cfg);
// Writes config.json in Hugging Face's field names, through a temporary file and rename.
int mt_model_config_write(const mt_model_config *cfg, const char *path);

// Parameter counts (BUDGETS.md §1).
int64_t mt_config_attn_params(const mt_model_config *cfg);     // q, k, v, o of one layer
int64_t mt_config_expert_params(const mt_model_config *cfg);   // w1, w2, w3 of one expert
int64_t mt_config_router_params(const mt_model_config *cfg);   // gate of one layer
int64_t mt_config_layer_params(const mt_model_config *cfg);    // one decoder layer with norms
int64_t mt_config_total_params(const mt_model_config *cfg);
int64_t mt_config_active_params(const mt_model_config *cfg);   // per token (top_k experts)

#ifdef __cplusplus
}
#endif
