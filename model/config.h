// model/config.h — a Hugging Face config.json of a supported MoE family (model/family.h), read
// and checked.
#pragma once
#include <stdint.h>

#include "core/dtype.h"
#include "model/family.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_CONFIG_MAX_MLP_ONLY 256
#define MT_CONFIG_MAX_LAYERS 1024  // layer_types entries

typedef struct mt_model_config {
    char architecture[64];   // "MixtralForCausalLM"
    char model_type[32];     // "mixtral"
    int64_t hidden;          // hidden_size
    int64_t intermediate;    // one routed expert's size: intermediate_size (Mixtral, OLMoE) or
                             // moe_intermediate_size (Qwen)
    int64_t layers;          // num_hidden_layers
    int64_t heads;           // num_attention_heads
    int64_t kv_heads;        // num_key_value_heads
    int64_t head_dim;        // hidden / heads unless config sets head_dim
    int64_t experts;         // num_local_experts (Mixtral) / num_experts
    int64_t top_k;           // num_experts_per_tok
    int64_t vocab;           // vocab_size
    int64_t max_positions;   // max_position_embeddings
    int64_t sliding_window;  // 0 = none (null in config.json)
    int64_t bos_token_id, eos_token_id;
    double rope_theta, rms_norm_eps, router_aux_loss_coef, router_jitter_noise, initializer_range;
    int tie_word_embeddings;

    // The family's parts (model/family.h, docs/families.md); defaults are transformers' class
    // defaults. Mixtral: none of them, norm_topk_prob 1.
    mt_family_id family;
    int64_t dense_intermediate;   // intermediate_size of dense MLP layers (Qwen), else 0
    int64_t shared_intermediate;  // shared_expert_intermediate_size (Qwen2-MoE), 0: no shared expert
    int norm_topk_prob;           // top-k routing weights renormalised to sum 1
    int qkv_bias, o_bias;         // biases on q/k/v_proj, on o_proj
    double clip_qkv;              // 0: none; else q, k, v clamped to [-clip, clip]
    int64_t decoder_sparse_step;  // layer L is MoE when (L+1) % step == 0 and not mlp_only
    int n_mlp_only;
    int32_t mlp_only_layers[MT_CONFIG_MAX_MLP_ONLY];  // dense layers, ascending
    // gpt-oss (docs/families.md "gpt-oss")
    int rope_yarn;                // rope_type "yarn": the frequencies and cos/sin scale of _compute_yarn_parameters
    double rope_factor, rope_beta_fast, rope_beta_slow;
    double rope_attention_factor; // 0: derived from factor (0.1·ln(factor) + 1)
    int64_t rope_original_max;    // original_max_position_embeddings (0: max_position_embeddings)
    int rope_truncate;            // truncate (transformers' default true): floor/ceil the correction range
    int has_layer_types;          // layer_sliding says which layers use sliding_window
    uint8_t layer_sliding[MT_CONFIG_MAX_LAYERS];  // 1: sliding_attention, 0: full_attention
    double swiglu_alpha, swiglu_limit;  // the clamped SwiGLU (families with clamped_swiglu), else 0
    // DeepSeek-style (docs/families.md "DeepSeek-style"); elsewhere n_group 1, scaling 1, the rest 0.
    mt_qk_norm qk_norm;           // the family's q/k norm, or none where use_qk_norm is false (GLM-4.5)
    int64_t n_group, topk_group;  // group-limited routing: the best topk_group of n_group groups
    int route_grouped;            // DeepSeek-V2: topk_method "group_limited_greedy" (else "greedy")
    double routed_scaling;        // routed_scaling_factor: the top-k weights' multiplier
    int64_t n_shared_experts;     // shared_intermediate = n_shared_experts · moe_intermediate_size
    int64_t first_k_dense;        // first_k_dense_replace: layers below it are dense MLPs
    int64_t mtp_layers;           // num_nextn_predict_layers: multi-token-prediction layers in the checkpoint, skipped
    int seq_aux;                  // DeepSeek's remote code: the sequence-wise balance loss on (transformers applies none)
    double aux_loss_alpha;        // and its coefficient (mt_model.seq_aux_coef takes it where seq_aux is on)
    double partial_rotary_factor; // as read (GLM-4.5's default 0.5); 1 elsewhere
    int64_t rotary_dim;           // dims of each head RoPE turns: head_dim · partial_rotary_factor (GLM-4.5), else head_dim
    int rope_interleave;          // RoPE on adjacent pairs (2j, 2j+1), DeepSeek's form, not rotate_half's (j, j + d/2)
    double rope_mscale, rope_mscale_all_dim;  // YaRN's mscale fields (DeepSeek), 0: absent
    // MLA (DeepSeek-V2/V3): q = q_b(norm(q_a(x))) or q_proj(x) when q_lora_rank is 0; kv_a(x) =
    // [latent (kv_lora_rank) | shared rope key (qk_rope)]; kv_b(norm(latent)) = per head [k_nope | v].
    // head_dim is the query/key head (qk_nope + qk_rope), v_head_dim the value head.
    int mla;
    int64_t q_lora_rank, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim;
    int output_router_logits;     // recorded; moetrain applies the aux loss either way (docs/design.md, "The step's arithmetic")
    mt_dtype torch_dtype;    // the checkpoint's stored dtype

    // quantization_config (bitsandbytes), when the checkpoint is pre-quantized
    int quantized;           // 1 when quantization_config.load_in_4bit is true
    char quant_type[8];      // "nf4" / "fp4"
    int double_quant;        // bnb_4bit_use_double_quant
    int mxfp4;               // quant_method "mxfp4" (gpt-oss): the experts stored as *_blocks / *_scales
    int fp8_block[2];        // quant_method "fp8" (DeepSeek-V3, Kimi K2): weight_block_size [rows, cols]
                             // of the F8_E4M3 weights' scales; {0, 0}: not a block-FP8 checkpoint
    int fp8_scale_ue8m0;     // and scale_fmt "ue8m0" (DeepSeek-V3.1: the scales powers of two, still F32)
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

// A config.json field for a family: read by moetrain, known not to change a training step, or
// neither (refused, unless mt_config_allow_unknown(1): --allow-unknown-config, which warns per field).
typedef enum { MT_CONFIG_KEY_READ, MT_CONFIG_KEY_IGNORED, MT_CONFIG_KEY_UNKNOWN } mt_config_key_class;
mt_config_key_class mt_config_key_classify(const mt_family *fam, const char *key);
void mt_config_allow_unknown(int on);
int mt_config_allows_unknown(void);

// The family description of a config.
static inline const mt_family *mt_config_family(const mt_model_config *c) { return mt_family_get(c->family); }
// 1 when layer L has routed experts (router, experts, shared expert), 0 when it is a dense MLP.
int mt_config_layer_is_moe(const mt_model_config *c, int64_t L);
// The attention window of layer L: 0 (none), or sliding_window where that layer slides.
int64_t mt_config_layer_window(const mt_model_config *c, int64_t L);
// The softmax scale of layer attention: head_dim^-0.5, times YaRN's mscale(factor, mscale_all_dim)²
// for MLA (DeepSeek's attention).
double mt_config_attn_scale(const mt_model_config *c);
// The dims of each query/key head RoPE turns (rotary_dim, or head_dim for a config built in code).
int64_t mt_config_rotary_dim(const mt_model_config *c);
// The value head dim: v_head_dim (MLA), else head_dim.
int64_t mt_config_v_head_dim(const mt_model_config *c);
// Number of MoE layers.
int64_t mt_config_moe_layers(const mt_model_config *c);

// Parameter counts (docs/memory.md "Parameter counts"), by the family's parts: biases, q/k norms, shared expert and
// dense layers included.
int64_t mt_config_attn_params(const mt_model_config *cfg);     // q, k, v, o of one layer
int64_t mt_config_expert_params(const mt_model_config *cfg);   // w1, w2, w3 of one expert
int64_t mt_config_router_params(const mt_model_config *cfg);   // gate of one layer
int64_t mt_config_layer_params(const mt_model_config *cfg);    // one MoE decoder layer with norms
int64_t mt_config_shared_expert_params(const mt_model_config *cfg);  // shared expert + its gate
int64_t mt_config_dense_mlp_params(const mt_model_config *cfg);      // one dense layer's MLP
int64_t mt_config_total_params(const mt_model_config *cfg);
int64_t mt_config_active_params(const mt_model_config *cfg);   // per token (top_k experts)

#ifdef __cplusplus
}
#endif
