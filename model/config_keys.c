// model/config_keys.c — which config.json fields moetrain reads, which it may ignore, and
// (everything else) which it refuses: a field that transformers reads and moetrain does not would
// make a silently different model. The lists cover the fields transformers 4.57 and 5.x write
// for the four families (their configuration classes, PretrainedConfig's common attributes
// included), and fields found in published checkpoints of them.
#include <string.h>

#include "core/common.h"
#include "model/config.h"

// Read by model/config.c for every family (values checked there).
static const char *const READ_ALWAYS[] = {
    "architectures", "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "num_experts_per_tok", "vocab_size", "max_position_embeddings", "head_dim",
    "bos_token_id", "eos_token_id", "rope_theta", "rope_parameters", "rope_scaling",
    "partial_rotary_factor", "layer_types", "rms_norm_eps", "router_aux_loss_coef", "initializer_range",
    "tie_word_embeddings", "hidden_act", "attention_dropout", "output_router_logits", "torch_dtype", "dtype",
    "quantization_config", "num_experts", "num_local_experts", "n_routed_experts",
};

// Fields that do not change the math of a training step (generation defaults, bookkeeping,
// inference switches, head types moetrain does not build). pad_token_id: transformers gives the
// pad row of the embedding no gradient; moetrain's padding sits at the end of a row, masked and
// without loss, so nothing reaches an embedding row through it either.
static const char *const IGNORED[] = {
    "use_cache", "transformers_version", "_name_or_path", "pad_token_id", "return_dict",
    "output_hidden_states", "output_attentions", "torchscript", "pruned_heads", "chunk_size_feed_forward",
    "is_encoder_decoder", "is_decoder", "add_cross_attention", "cross_attention_hidden_size",
    "tie_encoder_decoder", "finetuning_task", "id2label", "label2id", "num_labels", "problem_type",
    "tokenizer_class", "prefix", "sep_token_id", "decoder_start_token_id", "task_specific_params",
    "_attn_implementation", "_attn_implementation_autoset", "attn_implementation", "auto_map",
    "_commit_hash", "use_bfloat16", "tf_legacy_loss", "max_length", "min_length", "do_sample",
    "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p",
    "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
    "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
    // Qwen: the layers a sliding window would apply to; moetrain refuses use_sliding_window: true.
    "max_window_layers",
    // gpt-oss's published config.json: OpenAI's own names, which GptOssConfig stores and its
    // modeling never reads (num_experts_per_tok and rope_scaling are what it uses).
    "experts_per_token", "initial_context_length",
    // DeepSeek's published config.json (its remote code's fields): inference sharding.
    "ep_size", "pretraining_tp",
};

// Fields of the family's optional parts (model/family.h), read by model/config.c.
static int family_reads(const mt_family *f, const char *key) {
    const char *own[] = {
        f->expert_size_key,
        f->qkv_bias_key,
        f->attn_bias_key,
        f->has_dense_layers ? "intermediate_size" : NULL,
        f->has_dense_layers ? "decoder_sparse_step" : NULL,
        f->has_dense_layers ? "mlp_only_layers" : NULL,
        f->mlp_layer_types ? "mlp_layer_types" : NULL,
        f->shared_expert ? "shared_expert_intermediate_size" : NULL,
        f->norm_topk_fixed ? NULL : "norm_topk_prob",
        f->has_clip_qkv ? "clip_qkv" : NULL,
        f->has_sliding_flag ? "use_sliding_window" : NULL,
        f->has_jitter ? "router_jitter_noise" : NULL,
        f->has_sliding_window ? "sliding_window" : NULL,
        f->clamped_swiglu ? "swiglu_alpha" : NULL,
        f->clamped_swiglu ? "swiglu_limit" : NULL,
    };
    int ds = f->route != MT_ROUTE_SOFTMAX || f->mla;  // model/config.c read_deepseek, read_mla
    const char *deepseek[] = {"n_group", "topk_group", "routed_scaling_factor", "n_shared_experts",
                              "first_k_dense_replace", "intermediate_size", "num_nextn_predict_layers",
                              "moe_layer_freq", "topk_method", "scoring_func", "mlp_bias", "aux_loss_alpha",
                              "seq_aux"};
    const char *mla[] = {"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                         "qk_head_dim"};
    if ((ds && mt_str_in(deepseek, MT_ARRAY_LEN(deepseek), key)) || (f->mla && mt_str_in(mla, MT_ARRAY_LEN(mla), key)) ||
        (f->rope_interleave_default < 0 && strcmp(key, "rope_interleave") == 0) ||
        (f->qk_norm_flag && strcmp(key, "use_qk_norm") == 0))
        return 1;
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if (own[i] && strcmp(own[i], key) == 0) return 1;
    return 0;
}

mt_config_key_class mt_config_key_classify(const mt_family *f, const char *key) {
    if (mt_str_in(READ_ALWAYS, sizeof READ_ALWAYS / sizeof *READ_ALWAYS, key) || family_reads(f, key))
        return MT_CONFIG_KEY_READ;
    if (mt_str_in(IGNORED, sizeof IGNORED / sizeof *IGNORED, key)) return MT_CONFIG_KEY_IGNORED;
    // Another family's field (OLMoE's clip_qkv in a Mixtral config, Qwen's mlp_only_layers in an
    // OLMoE one): this family's modeling code, in transformers 4.57 and 5.x, does not read it.
    for (int i = 0; i < MT_FAMILY_COUNT; i++)
        if (family_reads(mt_family_get((mt_family_id)i), key)) return MT_CONFIG_KEY_IGNORED;
    return MT_CONFIG_KEY_UNKNOWN;
}

static int allow_unknown;  // --allow-unknown-config: one switch for the whole process

void mt_config_allow_unknown(int on) { allow_unknown = on; }

int mt_config_allows_unknown(void) { return allow_unknown; }
