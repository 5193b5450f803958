// model/family.c — the family table (docs/families.md says where each entry comes from).
#include "model/family.h"

#include <stdio.h>
#include <string.h>

#include "core/common.h"

static const mt_family FAMILIES[MT_FAMILY_COUNT] = {
    [MT_FAMILY_MIXTRAL] = {
        .model_type = "mixtral", .architecture = "MixtralForCausalLM",
        .moe_module = "block_sparse_moe", .router = "gate",
        .expert = {"w1", "w2", "w3"}, .mlp = {"w1", "w2", "w3"},
        .experts_key = "num_local_experts", .expert_size_key = "intermediate_size",
        .norm_topk_fixed = 1, .has_jitter = 1, .has_sliding_window = 1, .qk_norm = MT_QK_NORM_NONE, .head_dim_rule = MT_HEAD_DIM_EXPLICIT,
        .default_kv_heads = 0, .default_max_positions = 131072, .default_bos = 1, .default_eos = 2,
        .default_rope_theta = 1e6, .default_rms_eps = 1e-5, .default_aux_coef = 0.001,
    },
    [MT_FAMILY_QWEN2_MOE] = {
        .model_type = "qwen2_moe", .architecture = "Qwen2MoeForCausalLM",
        .moe_module = "mlp", .router = "gate",
        .expert = {"gate_proj", "down_proj", "up_proj"}, .mlp = {"gate_proj", "down_proj", "up_proj"},
        .shared_expert = "shared_expert", .shared_gate = "shared_expert_gate",
        .experts_key = "num_experts", .expert_size_key = "moe_intermediate_size",
        .has_dense_layers = 1, .qk_norm = MT_QK_NORM_NONE, .head_dim_rule = MT_HEAD_DIM_MUST_MATCH,
        .qkv_bias_key = "qkv_bias", .qkv_bias_default = 1, .has_sliding_window = 1, .has_sliding_flag = 1,
        .default_dense_intermediate = 5632, .default_shared_intermediate = 5632, .default_kv_heads = 16, .default_max_positions = 32768, .default_bos = -1, .default_eos = -1,
        .default_rope_theta = 10000.0, .default_rms_eps = 1e-6, .default_aux_coef = 0.001,
    },
    [MT_FAMILY_QWEN3_MOE] = {
        .model_type = "qwen3_moe", .architecture = "Qwen3MoeForCausalLM",
        .moe_module = "mlp", .router = "gate",
        .expert = {"gate_proj", "down_proj", "up_proj"}, .mlp = {"gate_proj", "down_proj", "up_proj"},
        .experts_key = "num_experts", .expert_size_key = "moe_intermediate_size",
        .has_dense_layers = 1, .qk_norm = MT_QK_NORM_HEAD, .head_dim_rule = MT_HEAD_DIM_EXPLICIT,
        .attn_bias_key = "attention_bias", .has_sliding_window = 1, .has_sliding_flag = 1,
        .default_dense_intermediate = 6144, .default_kv_heads = 4, .default_max_positions = 32768, .default_bos = -1, .default_eos = -1,
        .default_rope_theta = 10000.0, .default_rms_eps = 1e-6, .default_aux_coef = 0.001,
    },
    [MT_FAMILY_OLMOE] = {
        .model_type = "olmoe", .architecture = "OlmoeForCausalLM",
        .moe_module = "mlp", .router = "gate",
        .expert = {"gate_proj", "down_proj", "up_proj"}, .mlp = {"gate_proj", "down_proj", "up_proj"},
        .experts_key = "num_experts", .expert_size_key = "intermediate_size",
        .qk_norm = MT_QK_NORM_PROJ, .head_dim_rule = MT_HEAD_DIM_IGNORED,
        .attn_bias_key = "attention_bias", .has_clip_qkv = 1,
        .default_kv_heads = 0, .default_max_positions = 4096, .default_bos = -1, .default_eos = 50279,
        .default_rope_theta = 10000.0, .default_rms_eps = 1e-5, .default_aux_coef = 0.01,
    },
    [MT_FAMILY_GPT_OSS] = {
        .model_type = "gpt_oss", .architecture = "GptOssForCausalLM",
        .moe_module = "mlp", .router = "router",
        .expert = {"gate_proj", "down_proj", "up_proj"}, .mlp = {"gate_proj", "down_proj", "up_proj"},
        .experts_key = "num_local_experts", .expert_size_key = "intermediate_size",
        .norm_topk_fixed = 1, .qk_norm = MT_QK_NORM_NONE, .head_dim_rule = MT_HEAD_DIM_EXPLICIT,
        .attn_bias_key = "attention_bias", .attn_bias_default = 1, .has_sliding_window = 1,
        .router_bias = 1, .attn_sinks = 1, .fused_experts = 1, .router_param = 1, .clamped_swiglu = 1, .has_layer_types = 1,
        .default_rope_yarn = 1, .default_sliding_window = 128, .default_head_dim = 64,
        .default_kv_heads = 0, .default_max_positions = 131072, .default_bos = -1, .default_eos = -1,
        .default_rope_theta = 150000.0, .default_rms_eps = 1e-5, .default_aux_coef = 0.001,
    },
    // DeepSeek-style (docs/families.md "DeepSeek-style"): per-expert checkpoints under mlp.experts.E,
    // the router mlp.gate, a shared MLP mlp.shared_experts without gate, dense first layers.
    [MT_FAMILY_DEEPSEEK_V2] = {
        .model_type = "deepseek_v2", .architecture = "DeepseekV2ForCausalLM",
        .moe_module = "mlp", .router = "gate",
        .expert = {"gate_proj", "down_proj", "up_proj"}, .mlp = {"gate_proj", "down_proj", "up_proj"},
        .shared_expert = "shared_experts", .shared_from_count = 1,
        .experts_key = "n_routed_experts", .expert_size_key = "moe_intermediate_size",
        .qk_norm = MT_QK_NORM_NONE, .head_dim_rule = MT_HEAD_DIM_IGNORED, .attn_bias_key = "attention_bias",
        .route = MT_ROUTE_SOFTMAX_GROUPED, .router_param = 1, .first_k_dense = 1, .mla = 1, .rope_interleave_default = 1,
        .default_n_group = 1, .default_topk_group = 1, .default_first_k_dense = 0, .default_routed_scaling = 1.0,
        .default_q_lora_rank = 1536, .default_qk_nope = 128, .default_v_head = 128,
        .default_dense_intermediate = 11008, .default_shared_intermediate = 2,  // n_shared_experts
        .default_kv_heads = 0, .default_max_positions = 2048, .default_bos = 1, .default_eos = 2,
        .default_rope_theta = 10000.0, .default_rms_eps = 1e-6, .default_aux_coef = 0.0,
    },
    [MT_FAMILY_DEEPSEEK_V3] = {
        .model_type = "deepseek_v3", .architecture = "DeepseekV3ForCausalLM",
        .moe_module = "mlp", .router = "gate", .score_bias = "e_score_correction_bias",
        .expert = {"gate_proj", "down_proj", "up_proj"}, .mlp = {"gate_proj", "down_proj", "up_proj"},
        .shared_expert = "shared_experts", .shared_from_count = 1,
        .experts_key = "n_routed_experts", .expert_size_key = "moe_intermediate_size",
        .qk_norm = MT_QK_NORM_NONE, .head_dim_rule = MT_HEAD_DIM_IGNORED, .attn_bias_key = "attention_bias",
        .route = MT_ROUTE_SIGMOID_GROUPED, .router_param = 1, .first_k_dense = 1, .mla = 1, .rope_interleave_default = -1,
        .default_n_group = 8, .default_topk_group = 4, .default_first_k_dense = 3, .default_routed_scaling = 2.5,
        .default_q_lora_rank = 1536, .default_qk_nope = 128, .default_v_head = 128,
        .default_norm_topk = 1,
        .default_dense_intermediate = 18432, .default_shared_intermediate = 1,
        .default_kv_heads = 128, .default_max_positions = 4096, .default_bos = 0, .default_eos = 1,
        .default_rope_theta = 10000.0, .default_rms_eps = 1e-6, .default_aux_coef = 0.0,
    },
    [MT_FAMILY_GLM4_MOE] = {
        .model_type = "glm4_moe", .architecture = "Glm4MoeForCausalLM",
        .moe_module = "mlp", .router = "gate", .score_bias = "e_score_correction_bias",
        .expert = {"gate_proj", "down_proj", "up_proj"}, .mlp = {"gate_proj", "down_proj", "up_proj"},
        .shared_expert = "shared_experts", .shared_from_count = 1,
        .experts_key = "n_routed_experts", .expert_size_key = "moe_intermediate_size",
        .qk_norm = MT_QK_NORM_HEAD, .qk_norm_flag = 1, .head_dim_rule = MT_HEAD_DIM_EXPLICIT,
        .qkv_bias_key = "attention_bias",  // q, k, v only: o_proj never has one
        .route = MT_ROUTE_SIGMOID_GROUPED, .router_param = 1, .first_k_dense = 1, .partial_rotary = 1,
        .default_n_group = 1, .default_topk_group = 1, .default_first_k_dense = 1, .default_routed_scaling = 1.0,
        .default_norm_topk = 1,
        .default_dense_intermediate = 10944, .default_shared_intermediate = 1,
        .default_kv_heads = 8, .default_max_positions = 131072, .default_bos = -1, .default_eos = -1,
        .default_rope_theta = 10000.0, .default_rms_eps = 1e-5, .default_aux_coef = 0.0,
    },
    // GLM-4.7-Flash: DeepSeek-V3's MLA (Glm4MoeLiteAttention is DeepseekV3Attention) under GLM-4.5's
    // router, experts and MLPs; the dense layers by mlp_layer_types.
    [MT_FAMILY_GLM4_MOE_LITE] = {
        .model_type = "glm4_moe_lite", .architecture = "Glm4MoeLiteForCausalLM",
        .moe_module = "mlp", .router = "gate", .score_bias = "e_score_correction_bias",
        .expert = {"gate_proj", "down_proj", "up_proj"}, .mlp = {"gate_proj", "down_proj", "up_proj"},
        .shared_expert = "shared_experts", .shared_from_count = 1,
        .experts_key = "n_routed_experts", .expert_size_key = "moe_intermediate_size",
        .qk_norm = MT_QK_NORM_NONE, .head_dim_rule = MT_HEAD_DIM_IGNORED, .attn_bias_key = "attention_bias",
        .route = MT_ROUTE_SIGMOID_GROUPED, .router_param = 1, .first_k_dense = 1, .mlp_layer_types = 1, .mla = 1,
        .rope_interleave_default = -1,
        .default_n_group = 1, .default_topk_group = 1, .default_first_k_dense = 1, .default_routed_scaling = 1.8,
        .default_q_lora_rank = 768, .default_qk_nope = 192, .default_v_head = 256,
        .default_norm_topk = 1,
        .default_dense_intermediate = 10240, .default_shared_intermediate = 1,
        .default_kv_heads = 20, .default_max_positions = 202752, .default_bos = 0, .default_eos = 1,
        .default_rope_theta = 10000.0, .default_rms_eps = 1e-5, .default_aux_coef = 0.0,
    },
};

const mt_family *mt_family_find(const char *model_type) {
    for (int i = 0; i < MT_FAMILY_COUNT; i++)
        if (model_type && strcmp(FAMILIES[i].model_type, model_type) == 0) return &FAMILIES[i];
    return NULL;
}

const mt_family *mt_family_get(mt_family_id id) {
    return (unsigned)id < MT_FAMILY_COUNT ? &FAMILIES[id] : &FAMILIES[MT_FAMILY_MIXTRAL];
}

const char *mt_family_list(void) { return "mixtral, qwen2_moe, qwen3_moe, olmoe, gpt_oss, deepseek_v2, deepseek_v3, glm4_moe, glm4_moe_lite"; }

const char *mt_family_module_name(const mt_family *fam, const char *module, char *buf, size_t n) {
    const char *mx = ".block_sparse_moe.", *at = strstr(module, mx);
    if (!at || strcmp(fam->moe_module, "block_sparse_moe") == 0) return module;
    const char *rest = at + strlen(mx);
    int pre = (int)(at - module), e;
    char leaf[8];
    if (strcmp(rest, "gate") == 0) {
        snprintf(buf, n, "%.*s.%s.%s", pre, module, fam->moe_module, fam->router);
        return buf;
    }
    if (sscanf(rest, "experts.%d.%7s", &e, leaf) == 2 && leaf[0] == 'w' && leaf[1] >= '1' && leaf[1] <= '3' && !leaf[2]) {
        snprintf(buf, n, "%.*s.%s.experts.%d.%s", pre, module, fam->moe_module, e, fam->expert[leaf[1] - '1']);
        return buf;
    }
    return module;
}
