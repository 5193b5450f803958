// model/family.h — one description per MoE model family (model_type): the tensor names, which
// optional parts exist and the routing semantics, read from transformers' modeling and
// configuration files (docs/families.md). The config reader, the weight list, `init` and the
// planner read this table; no code asks "is this Qwen".
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MT_FAMILY_MIXTRAL, MT_FAMILY_QWEN2_MOE, MT_FAMILY_QWEN3_MOE, MT_FAMILY_OLMOE, MT_FAMILY_GPT_OSS,
    MT_FAMILY_DEEPSEEK_V2, MT_FAMILY_DEEPSEEK_V3, MT_FAMILY_GLM4_MOE, MT_FAMILY_GLM4_MOE_LITE, MT_FAMILY_COUNT
} mt_family_id;

// Where the q/k RMSNorm applies: none, each head's head_dim values (Qwen3-MoE, before RoPE), or
// the whole q_proj / k_proj output (OLMoE: [heads·head_dim] and [kv_heads·head_dim]).
typedef enum { MT_QK_NORM_NONE, MT_QK_NORM_HEAD, MT_QK_NORM_PROJ } mt_qk_norm;

// How head_dim is found: config's head_dim or hidden/heads (Mixtral, Qwen3-MoE); the same but it
// must equal hidden/heads (Qwen2-MoE's attention raises otherwise); always hidden/heads (OLMoE
// ignores the field).
typedef enum { MT_HEAD_DIM_EXPLICIT, MT_HEAD_DIM_MUST_MATCH, MT_HEAD_DIM_IGNORED } mt_head_dim_rule;

// How the router chooses (docs/families.md): top-k of a softmax over all experts (Mixtral to
// gpt-oss); DeepSeek-V2's softmax with topk_method "greedy" or "group_limited_greedy" (group score:
// the group's best); DeepSeek-V3's and GLM-4.5's sigmoid, chosen by score + e_score_correction_bias
// within the best topk_group of n_group groups (group score: the sum of its top two).
typedef enum { MT_ROUTE_SOFTMAX, MT_ROUTE_SOFTMAX_GROUPED, MT_ROUTE_SIGMOID_GROUPED } mt_route_kind;

typedef struct mt_family {
    const char *model_type;     // config.json model_type
    const char *architecture;   // config.json architectures[0]
    // Names under model.layers.L.
    const char *moe_module;     // "block_sparse_moe" / "mlp": gate (router) and experts.E live here
    const char *router;         // "gate"
    const char *expert[3];      // an expert's SwiGLU: gate (w1), down (w2), up (w3) projections
    const char *mlp[3];         // a dense MLP's and the shared expert's: gate, down, up
    const char *shared_expert;  // "shared_expert" (an MLP under moe_module), NULL: none
    const char *shared_gate;    // "shared_expert_gate" [1, H], scales it by sigmoid
    // config.json keys and class defaults (configuration_*.py) when a field is absent.
    const char *experts_key;    // "num_local_experts" / "num_experts"
    const char *expert_size_key;// "intermediate_size" (Mixtral, OLMoE) / "moe_intermediate_size"
    int has_dense_layers;       // decoder_sparse_step, mlp_only_layers; dense MLP of intermediate_size
    int norm_topk_fixed;        // 1: top-k weights always renormalised (Mixtral: no field)
    mt_qk_norm qk_norm;
    mt_head_dim_rule head_dim_rule;
    const char *qkv_bias_key;   // "qkv_bias" (q, k, v biases) or NULL
    int qkv_bias_default;
    const char *attn_bias_key;  // "attention_bias" (q, k, v and o biases) or NULL
    int attn_bias_default;      // its class default (gpt-oss: true)
    int has_clip_qkv;           // clip_qkv: q, k, v clamped to ±clip after the q/k norm (OLMoE)
    int has_sliding_window;     // the attention reads sliding_window (not OLMoE's)
    int has_sliding_flag;       // use_sliding_window gates sliding_window (Qwen)
    int has_jitter;             // router_jitter_noise (Mixtral)
    // gpt-oss's parts (docs/families.md "gpt-oss").
    int router_bias;            // the router has a bias [E] (`<router>.bias`)
    int attn_sinks;             // self_attn.sinks [heads]: a learned logit per head in the softmax's denominator
    int fused_experts;          // experts stored fused: experts.gate_up_proj [E, H, 2f] (gate, up interleaved
                                // by column) with gate_up_proj_bias [E, 2f]; down_proj [E, f, H], down_proj_bias [E, H]
    int router_param;           // transformers 4 keeps the router as a bare weight [E, H], not an nn.Linear:
                                // PEFT adapts it only through target_parameters (in both adapter layouts)
    int clamped_swiglu;         // swiglu_limit / swiglu_alpha: (clamp(u, ±l) + 1) · g·σ(α·g), g = min(g, l)
    int has_layer_types;        // layer_types: sliding_attention (sliding_window) or full_attention, per layer
    int default_rope_yarn;      // rope_parameters absent: YaRN (factor 32, beta_fast 32, beta_slow 1, no
                                // truncation, original 4096), the class default
    // DeepSeek-style parts (docs/families.md "DeepSeek-style").
    mt_route_kind route;
    const char *score_bias;     // "e_score_correction_bias" [E] beside the router's weight (a frozen
                                // buffer: it moves the choice, not the weight), or NULL
    int shared_from_count;      // the shared expert is n_shared_experts · moe_intermediate_size wide
                                // and has no gate (shared_expert names its module)
    int first_k_dense;          // first_k_dense_replace: layers below it are dense MLPs of intermediate_size
    int mlp_layer_types;        // mlp_layer_types ("dense"/"sparse" per layer) decides instead, default a dense
                                // first layer; first_k_dense_replace, where given, must agree (GLM-4.7-Flash)
    int mla;                    // multi-head latent attention (q_lora_rank, kv_lora_rank, ...)
    int rope_interleave_default;// RoPE on adjacent pairs (DeepSeek's complex form); -1: rope_interleave
                                // is read (DeepSeek-V3, default true)
    int qk_norm_flag;           // use_qk_norm switches the per-head q/k norm on (GLM-4.5)
    int partial_rotary;         // partial_rotary_factor is read: RoPE on the head's first dims (GLM-4.5)
    int64_t default_n_group, default_topk_group, default_first_k_dense;  // class defaults (V2's None: 1, 1)
    double default_routed_scaling;
    int64_t default_q_lora_rank, default_qk_nope, default_v_head;  // MLA's class defaults (kv_lora_rank 512
                                // and qk_rope_head_dim 64 in every family)
    int default_norm_topk;      // norm_topk_prob's class default (DeepSeek-V3, GLM-4.5: true)
    int64_t default_kv_heads;   // 0: num_attention_heads
    int64_t default_dense_intermediate, default_shared_intermediate;  // intermediate_size (dense
                                // layers), shared_expert_intermediate_size: class defaults (with
                                // shared_from_count: n_shared_experts's)
    int64_t default_max_positions, default_bos, default_eos;  // -1: None
    int64_t default_sliding_window;  // 0: None
    int64_t default_head_dim;   // 0: hidden / heads; else the class default (gpt-oss: 64), and config.json
                                // always carries head_dim
    double default_rope_theta, default_rms_eps, default_aux_coef;
} mt_family;

// The description of a model_type, or NULL.
const mt_family *mt_family_find(const char *model_type);
// The description of a family id (never NULL for a valid id).
const mt_family *mt_family_get(mt_family_id id);
// The PEFT reader (lora/peft.h) reports a v5 router, and v5 experts, under Mixtral's v4 module
// names ("....block_sparse_moe.gate", "....block_sparse_moe.experts.E.w1"): the same module under
// the family's names, written into buf, or `module` itself when it needs no change.
const char *mt_family_module_name(const mt_family *fam, const char *module, char *buf, size_t n);
// "mixtral, qwen2_moe, ..." for error messages.
const char *mt_family_list(void);

#ifdef __cplusplus
}
#endif
