// Model config.json: the real Mixtral config, our test models, every check naming its field,
// hostile inputs (deep nesting, huge numbers), write → load, and the parameter counts of docs/memory.md "Parameter counts".
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/common.h"
#include "core/fileio.h"
#include "model/config.h"
#include "test_util.h"

#ifndef MT_REPO_ROOT
#error "the Makefile passes MT_REPO_ROOT"
#endif
#define CONFIGS MT_REPO_ROOT "/configs/"
#define SRC "cfgs/x.json"

static char tmp[256];
static void setup(void) { mt_test_tmpdir(tmp, sizeof tmp); }
static void teardown(void) { mt_test_rmrf(tmp); }
TestSuite(config, .init = setup, .fini = teardown);

// ---------------------------------------------------------------------------------------------
// A small valid config, with fields replaced, added or dropped: make_json(buf, key, value, ...,
// NULL). A value of DROP removes the key.
static const char DROP[] = "<drop>";
static const char *base_pairs[][2] = {
    {"architectures", "[\"MixtralForCausalLM\"]"},
    {"model_type", "\"mixtral\""},
    {"hidden_size", "64"},
    {"intermediate_size", "128"},
    {"num_hidden_layers", "2"},
    {"num_attention_heads", "4"},
    {"num_key_value_heads", "2"},
    {"num_local_experts", "8"},
    {"num_experts_per_tok", "2"},
    {"vocab_size", "256"},
    {"torch_dtype", "\"float32\""},
};

static char *make_json(char *buf, size_t n, ...) {
    const char *over[32][2];
    int nover = 0;
    va_list ap;
    va_start(ap, n);
    for (const char *k; (k = va_arg(ap, const char *)) != NULL && nover < 32; nover++) {
        over[nover][0] = k;
        over[nover][1] = va_arg(ap, const char *);
    }
    va_end(ap);
    size_t len = (size_t)snprintf(buf, n, "{");
    int first = 1, used[32] = {0};
    for (size_t i = 0; i < MT_ARRAY_LEN(base_pairs); i++) {
        const char *v = base_pairs[i][1];
        for (int j = 0; j < nover; j++)
            if (strcmp(over[j][0], base_pairs[i][0]) == 0) v = over[j][1], used[j] = 1;
        if (v == DROP) continue;
        len += (size_t)snprintf(buf + len, n - len, "%s\"%s\": %s", first ? "" : ", ", base_pairs[i][0], v);
        first = 0;
    }
    for (int j = 0; j < nover; j++)
        if (!used[j] && over[j][1] != DROP)
            len += (size_t)snprintf(buf + len, n - len, ", \"%s\": %s", over[j][0], over[j][1]);
    snprintf(buf + len, n - len, "}");
    return buf;
}

static void roundtrip(const mt_model_config *c);

static int parse_str(const char *json, mt_model_config *c) {
    return mt_model_config_parse(json, strlen(json), SRC, c);
}

// The parse fails and the error starts with the source and contains every given fragment.
#define expect_error(json, ...)                                                                    \
    do {                                                                                           \
        mt_model_config c_;                                                                        \
        mt_error_clear();                                                                          \
        cr_assert_neq(parse_str(json, &c_), 0, "accepted: %.200s", json);                          \
        const char *e_ = mt_error_get();                                                           \
        cr_assert(strncmp(e_, SRC ": ", strlen(SRC) + 2) == 0, "error lacks the file: %s", e_);   \
        const char *frags_[] = {__VA_ARGS__};                                                      \
        for (size_t i_ = 0; i_ < MT_ARRAY_LEN(frags_); i_++)                                       \
            cr_assert(strstr(e_, frags_[i_]), "error lacks '%s': %s", frags_[i_], e_);            \
    } while (0)

// ---------------------------------------------------------------------------------------------
// Real and shipped configs.

// Kimi K2 as published: model_type "kimi_k2", DeepseekV3ForCausalLM, DeepSeek-V3's remote code; its
// sequence-wise balance loss on (seq_aux, aux_loss_alpha 0.001).
Test(config, kimi_k2_reads_as_deepseek_v3) {
    mt_model_config c;
    cr_assert_eq(mt_model_config_load(CONFIGS "kimi-k2.json", &c), 0, "%s", mt_error_get());
    cr_assert_str_eq(c.model_type, "deepseek_v3");
    cr_assert_str_eq(c.architecture, "DeepseekV3ForCausalLM");
    cr_expect_eq(c.experts, 384);
    cr_expect(c.mla && c.kv_lora_rank == 512 && c.q_lora_rank == 1536);
    cr_expect(c.seq_aux && c.aux_loss_alpha == 0.001);
}

// GLM-4.7-Flash as published (transformers 5.24's glm4_moe_lite): MLA with its own class defaults,
// GLM's router, a dense first layer by first_k_dense_replace (mlp_layer_types absent: layer 0).
Test(config, glm_4_7_flash_reads_as_glm4_moe_lite) {
    mt_model_config c;
    cr_assert_eq(mt_model_config_load(CONFIGS "glm-4.7-flash.json", &c), 0, "%s", mt_error_get());
    cr_assert_str_eq(c.model_type, "glm4_moe_lite");
    cr_expect(c.mla && c.q_lora_rank == 768 && c.kv_lora_rank == 512 && c.qk_nope_dim == 192 &&
              c.qk_rope_dim == 64 && c.v_head_dim == 256 && c.head_dim == 256 && c.rotary_dim == 64);
    cr_expect(c.rope_interleave && c.rope_theta == 1e6 && c.rms_norm_eps == 1e-5);
    cr_expect(c.experts == 64 && c.top_k == 4 && c.n_group == 1 && c.routed_scaling == 1.8 && c.norm_topk_prob);
    cr_expect(c.first_k_dense == 1 && c.n_mlp_only == 0 && c.mtp_layers == 1 && c.dense_intermediate == 10240);
    cr_expect(!mt_config_layer_is_moe(&c, 0) && mt_config_layer_is_moe(&c, 1) && mt_config_layer_is_moe(&c, 46));
    roundtrip(&c);
}

// mlp_layer_types decides the dense layers (any pattern); first_k_dense_replace, read by other
// stacks, must name the same layers where given; bad entries are refused by index.
Test(config, glm4_moe_lite_mlp_layer_types) {
    char *text;
    size_t len;
    cr_assert_eq(mt_read_file(CONFIGS "tiny-glm4-moe-lite.json", 1 << 20, &text, &len), 0);
    mt_model_config c;
    cr_assert_eq(parse_str(text, &c), 0, "%s", mt_error_get());
    cr_expect(c.first_k_dense == 1 && c.n_mlp_only == 1 && c.mlp_only_layers[0] == 2);
    cr_expect(!mt_config_layer_is_moe(&c, 0) && mt_config_layer_is_moe(&c, 1) && !mt_config_layer_is_moe(&c, 2) &&
              mt_config_layer_is_moe(&c, 3) && mt_config_moe_layers(&c) == 2);
    roundtrip(&c);
    char buf[4096], *at = strstr(text, "\"mlp_layer_types\"");
    cr_assert(at);
    struct { const char *insert, *frag; } bad[] = {
        {"\"first_k_dense_replace\": 1, ", "first_k_dense_replace (1) and mlp_layer_types (1 leading dense layer(s) "
                                           "and more later) disagree"},
        {"\"mlp_layer_types\": [\"dense\", \"sparse\", \"moe\", \"sparse\"], ", "mlp_layer_types[2]"},
        {"\"mlp_layer_types\": [\"dense\", \"sparse\"], ", "num_hidden_layers (4)"},
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(bad); i++) {
        // the inserted key comes first; a second mlp_layer_types later would be a duplicate key: drop the file's
        const char *rest = at;
        if (strstr(bad[i].insert, "mlp_layer_types")) rest = strchr(strchr(at, ']'), ',') + 1;
        snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - text), text, bad[i].insert, rest);
        expect_error(buf, bad[i].frag);
    }
    free(text);
    // without mlp_layer_types: layer 0 dense, as transformers builds it; first_k_dense_replace 2 disagrees
#define LITE "{\"architectures\": [\"Glm4MoeLiteForCausalLM\"], \"num_hidden_layers\": 4, \"hidden_size\": 64, " \
             "\"num_attention_heads\": 20, \"moe_intermediate_size\": 8, \"n_routed_experts\": 8, \"num_experts_per_tok\": 2, " \
             "\"vocab_size\": 100"
    cr_assert_eq(parse_str(LITE "}", &c), 0, "%s", mt_error_get());
    cr_expect(c.first_k_dense == 1 && c.n_mlp_only == 0 && c.qk_nope_dim == 192 && c.v_head_dim == 256);
    expect_error(LITE ", \"first_k_dense_replace\": 2}",
                 "first_k_dense_replace (2) and mlp_layer_types (1 leading dense layer(s)) disagree");
#undef LITE
}

Test(config, real_mixtral_every_field) {
    mt_model_config c;
    cr_assert_eq(mt_model_config_load(CONFIGS "mixtral-8x7b.json", &c), 0, "%s", mt_error_get());
    cr_assert_str_eq(c.architecture, "MixtralForCausalLM");
    cr_assert_str_eq(c.model_type, "mixtral");
    cr_assert_eq(c.hidden, 4096);
    cr_assert_eq(c.intermediate, 14336);
    cr_assert_eq(c.layers, 32);
    cr_assert_eq(c.heads, 32);
    cr_assert_eq(c.kv_heads, 8);
    cr_assert_eq(c.head_dim, 128);
    cr_assert_eq(c.experts, 8);
    cr_assert_eq(c.top_k, 2);
    cr_assert_eq(c.vocab, 32000);
    cr_assert_eq(c.max_positions, 32768);
    cr_assert_eq(c.sliding_window, 0);
    cr_assert_eq(c.bos_token_id, 1);
    cr_assert_eq(c.eos_token_id, 2);
    cr_assert_eq(c.rope_theta, 1e6);
    cr_assert_eq(c.rms_norm_eps, 1e-5);
    cr_assert_eq(c.router_aux_loss_coef, 0.02);
    cr_assert_eq(c.router_jitter_noise, 0.0);
    cr_assert_eq(c.initializer_range, 0.02);
    cr_assert_eq(c.tie_word_embeddings, 0);
    cr_assert_eq(c.torch_dtype, MT_BF16);
    cr_assert_eq(c.quantized, 0);
}

Test(config, mixtral_param_counts) {
    mt_model_config c;
    cr_assert_eq(mt_model_config_load(CONFIGS "mixtral-8x7b.json", &c), 0, "%s", mt_error_get());
    cr_assert_eq(mt_config_attn_params(&c), 41943040LL);
    cr_assert_eq(mt_config_expert_params(&c), 176160768LL);
    cr_assert_eq(mt_config_router_params(&c), 32768LL);
    cr_assert_eq(mt_config_layer_params(&c), 1451270144LL);
    cr_assert_eq(mt_config_total_params(&c), 46702792704LL);
    cr_assert_eq(mt_config_active_params(&c), 12879925248LL);
    // Tied embeddings drop one V·h.
    c.tie_word_embeddings = 1;
    cr_assert_eq(mt_config_total_params(&c), 46702792704LL - 32000LL * 4096);
    cr_assert_eq(mt_config_active_params(&c), 12879925248LL - 32000LL * 4096);
}

Test(config, tiny_loads) {
    mt_model_config c;
    cr_assert_eq(mt_model_config_load(CONFIGS "tiny.json", &c), 0, "%s", mt_error_get());
    cr_assert_eq(c.layers, 2);
    cr_assert_eq(c.experts, 8);
    cr_assert_eq(c.top_k, 2);
    cr_assert_eq(c.hidden, 64);
    cr_assert_eq(c.intermediate, 128);
    cr_assert_eq(c.heads, 4);
    cr_assert_eq(c.kv_heads, 2);
    cr_assert_eq(c.head_dim, 16);
    cr_assert_eq(c.vocab, 256);
    cr_assert_eq(c.max_positions, 512);
    cr_assert_eq(c.torch_dtype, MT_F32);
    // layer = 2·64·64 + 2·64·32 + 128 + 512 + 8·3·64·128 = 209,536; total = 2·layer + 2·256·64 + 64
    cr_assert_eq(mt_config_layer_params(&c), 209536LL);
    cr_assert_eq(mt_config_total_params(&c), 451904LL);
}

// Over 1 GB in bf16: quant/'s memory benchmark quantizes a multi-shard checkpoint of it.
Test(config, mid_loads_and_is_over_a_gigabyte) {
    mt_model_config c;
    cr_assert_eq(mt_model_config_load(CONFIGS "mid.json", &c), 0, "%s", mt_error_get());
    cr_assert_eq(c.hidden, 512);
    cr_assert_eq(c.intermediate, 1792);
    cr_assert_eq(c.layers, 24);
    cr_assert_eq(c.head_dim, 64);
    cr_assert_eq(c.torch_dtype, MT_BF16);
    // layer = 2·512·512 + 2·512·128 + 1024 + 4096 + 8·3·512·1792 = 22,680,576
    cr_assert_eq(mt_config_layer_params(&c), 22680576LL);
    // 24 layers + embed_tokens, lm_head (2·32000·512) + final norm (512)
    cr_assert_eq(mt_config_total_params(&c), 577102336LL);
    cr_assert_eq(mt_config_active_params(&c), 180740608LL);
    int64_t bytes = 2 * mt_config_total_params(&c);  // bf16
    cr_assert(bytes > 1000000000LL && bytes < 1300000000LL, "bf16 bytes %lld", (long long)bytes);
}

Test(config, folder_holding_config_json) {
    char path[512], *text;
    size_t len;
    cr_assert_eq(mt_read_file(CONFIGS "tiny.json", 1 << 20, &text, &len), 0);
    snprintf(path, sizeof path, "%s/config.json", tmp);
    cr_assert_eq(mt_write_file_atomic(path, text, len), 0);
    free(text);
    mt_model_config c;
    cr_assert_eq(mt_model_config_load(tmp, &c), 0, "%s", mt_error_get());
    cr_assert_eq(c.hidden, 64);
}

Test(config, missing_file_names_the_path) {
    char path[512];
    snprintf(path, sizeof path, "%s/nope.json", tmp);
    mt_model_config c;
    cr_assert_neq(mt_model_config_load(path, &c), 0);
    cr_assert(strstr(mt_error_get(), path), "%s", mt_error_get());
    // A folder without config.json names the file it looked for.
    cr_assert_neq(mt_model_config_load(tmp, &c), 0);
    cr_assert(strstr(mt_error_get(), "config.json"), "%s", mt_error_get());
}

Test(config, defaults_when_absent) {
    char j[4096];
    mt_model_config c;
    cr_assert_eq(parse_str(make_json(j, sizeof j, "num_key_value_heads", DROP, "torch_dtype", DROP, NULL), &c),
                 0, "%s", mt_error_get());
    cr_assert_eq(c.kv_heads, 4);
    cr_assert_eq(c.head_dim, 16);
    cr_assert_eq(c.rope_theta, 1e6);
    cr_assert_eq(c.rms_norm_eps, 1e-5);
    cr_assert_eq(c.router_aux_loss_coef, 0.001);
    cr_assert_eq(c.router_jitter_noise, 0.0);
    cr_assert_eq(c.max_positions, 131072);
    cr_assert_eq(c.sliding_window, 0);
    cr_assert_eq(c.tie_word_embeddings, 0);
    cr_assert_eq(c.torch_dtype, MT_BF16);
    cr_assert_eq(c.initializer_range, 0.02);
    cr_assert_eq(c.bos_token_id, 1);
    cr_assert_eq(c.eos_token_id, 2);
    // No architectures list, model_type mixtral: fine.
    cr_assert_eq(parse_str(make_json(j, sizeof j, "architectures", DROP, NULL), &c), 0, "%s", mt_error_get());
    cr_assert_str_eq(c.architecture, "MixtralForCausalLM");
    // transformers v5 spells it "dtype".
    cr_assert_eq(parse_str(make_json(j, sizeof j, "torch_dtype", DROP, "dtype", "\"float16\"", NULL), &c), 0);
    cr_assert_eq(c.torch_dtype, MT_F16);
}

// ---------------------------------------------------------------------------------------------
// Every check names its field.

Test(config, kv_heads_must_divide_heads) {
    char j[4096];
    expect_error(make_json(j, sizeof j, "num_attention_heads", "32", "hidden_size", "4096",
                           "num_key_value_heads", "3", NULL),
                 "num_key_value_heads (3) does not divide num_attention_heads (32)");
}

Test(config, top_k_within_experts) {
    char j[4096];
    expect_error(make_json(j, sizeof j, "num_experts_per_tok", "9", NULL), "num_experts_per_tok (9)",
                 "num_local_experts (8)");
    expect_error(make_json(j, sizeof j, "num_experts_per_tok", "0", NULL), "num_experts_per_tok");
}

Test(config, sizes_must_be_positive_integers) {
    static const char *fields[] = {"hidden_size", "intermediate_size", "num_hidden_layers",
                                   "num_attention_heads", "num_key_value_heads", "num_local_experts",
                                   "num_experts_per_tok", "vocab_size", "max_position_embeddings",
                                   "head_dim"};
    static const char *bad[] = {"0", "-4", "1.5", "\"32\"", "true", "[4]", "4294967296", "1e300"};
    char j[4096];
    for (size_t f = 0; f < MT_ARRAY_LEN(fields); f++)
        for (size_t b = 0; b < MT_ARRAY_LEN(bad); b++)
            expect_error(make_json(j, sizeof j, fields[f], bad[b], NULL), fields[f]);
    expect_error(make_json(j, sizeof j, "hidden_size", "\"32\"", NULL), "hidden_size: expected an integer, got a string");
    expect_error(make_json(j, sizeof j, "hidden_size", "1.5", NULL), "hidden_size: 1.5 is not an integer");
    expect_error(make_json(j, sizeof j, "vocab_size", "-1", NULL), "vocab_size: -1 is out of range");
    // A size that is a whole number written as a float is still that integer (json.dumps never
    // writes one, but some tools do).
    mt_model_config c;
    cr_assert_eq(parse_str(make_json(j, sizeof j, "vocab_size", "256.0", NULL), &c), 0, "%s", mt_error_get());
    cr_assert_eq(c.vocab, 256);
}

Test(config, missing_required_field_is_named) {
    static const char *required[] = {"hidden_size", "intermediate_size", "num_hidden_layers",
                                     "num_attention_heads", "num_local_experts", "num_experts_per_tok",
                                     "vocab_size"};
    char j[4096];
    for (size_t i = 0; i < MT_ARRAY_LEN(required); i++) {
        expect_error(make_json(j, sizeof j, required[i], DROP, NULL), required[i], "missing");
        expect_error(make_json(j, sizeof j, required[i], "null", NULL), required[i]);
    }
}

Test(config, unknown_architecture_is_named) {
    char j[4096];
    expect_error(make_json(j, sizeof j, "architectures", "[\"LlamaForCausalLM\"]", NULL),
                 "unsupported architecture 'LlamaForCausalLM'");
    expect_error(make_json(j, sizeof j, "architectures", DROP, "model_type", "\"llama\"", NULL),
                 "model_type", "'llama'");
    expect_error(make_json(j, sizeof j, "architectures", DROP, "model_type", DROP, NULL), "architectures");
    expect_error(make_json(j, sizeof j, "architectures", "\"MixtralForCausalLM\"", NULL), "architectures");
    expect_error(make_json(j, sizeof j, "hidden_act", "\"gelu\"", NULL), "hidden_act", "'gelu'");
}

Test(config, dtype_and_floats) {
    char j[4096];
    expect_error(make_json(j, sizeof j, "torch_dtype", "\"int8\"", NULL), "torch_dtype", "'int8'");
    expect_error(make_json(j, sizeof j, "rms_norm_eps", "0", NULL), "rms_norm_eps");
    expect_error(make_json(j, sizeof j, "rms_norm_eps", "\"1e-5\"", NULL), "rms_norm_eps");
    expect_error(make_json(j, sizeof j, "rope_theta", "-1", NULL), "rope_theta");
    expect_error(make_json(j, sizeof j, "rope_theta", "1e999", NULL), "rope_theta", "finite");
    expect_error(make_json(j, sizeof j, "sliding_window", "-1", NULL), "sliding_window");
    expect_error(make_json(j, sizeof j, "tie_word_embeddings", "1", NULL), "tie_word_embeddings");
    expect_error(make_json(j, sizeof j, "router_jitter_noise", "1.5", NULL), "router_jitter_noise");
    expect_error(make_json(j, sizeof j, "bos_token_id", "256", NULL), "bos_token_id");
    expect_error(make_json(j, sizeof j, "attention_dropout", "0.1", NULL), "attention_dropout");
    // A list's first id is range-checked like a single one (the fuzzer's 1.3e46 was cast to int64).
    expect_error(make_json(j, sizeof j, "eos_token_id", "[1.3e46, 2]", NULL), "eos_token_id", "token id");
    expect_error(make_json(j, sizeof j, "eos_token_id", "[-1]", NULL), "eos_token_id", "token id");
    mt_model_config c;
    cr_assert_eq(parse_str(make_json(j, sizeof j, "eos_token_id", "null", "sliding_window", "4096",
                                     "rope_theta", "10000", NULL), &c), 0, "%s", mt_error_get());
    cr_assert_eq(c.eos_token_id, -1);
    cr_assert_eq(c.sliding_window, 4096);
    cr_assert_eq(c.rope_theta, 10000.0);
}

Test(config, head_dim) {
    char j[4096];
    mt_model_config c;
    // Explicit head_dim may differ from hidden/heads (as in Mistral-Nemo-style configs).
    cr_assert_eq(parse_str(make_json(j, sizeof j, "head_dim", "32", NULL), &c), 0, "%s", mt_error_get());
    cr_assert_eq(c.head_dim, 32);
    cr_assert_eq(mt_config_attn_params(&c), 2 * 64 * 4 * 32 + 2 * 64 * 2 * 32);
    // Without it, hidden must split evenly.
    expect_error(make_json(j, sizeof j, "num_attention_heads", "3", "num_key_value_heads", "1", NULL),
                 "hidden_size (64) is not divisible by num_attention_heads (3)");
    cr_assert_eq(parse_str(make_json(j, sizeof j, "num_attention_heads", "3", "num_key_value_heads", "1",
                                     "head_dim", "16", NULL), &c), 0, "%s", mt_error_get());
}

Test(config, quantization_config) {
    char j[4096];
    mt_model_config c;
    cr_assert_eq(parse_str(make_json(j, sizeof j, "quantization_config",
                                     "{\"quant_method\": \"bitsandbytes\", \"load_in_4bit\": true, "
                                     "\"load_in_8bit\": false, \"bnb_4bit_quant_type\": \"nf4\", "
                                     "\"bnb_4bit_use_double_quant\": true, \"llm_int8_threshold\": 6.0}",
                                     NULL), &c), 0, "%s", mt_error_get());
    cr_assert_eq(c.quantized, 1);
    cr_assert_str_eq(c.quant_type, "nf4");
    cr_assert_eq(c.double_quant, 1);
    cr_assert_eq(parse_str(make_json(j, sizeof j, "quantization_config", "{\"_load_in_4bit\": true}", NULL), &c), 0);
    cr_assert_str_eq(c.quant_type, "fp4");  // BitsAndBytesConfig's default
    cr_assert_eq(c.double_quant, 0);
    expect_error(make_json(j, sizeof j, "quantization_config",
                           "{\"quant_method\": \"bitsandbytes\", \"load_in_8bit\": true}", NULL),
                 "quantization_config", "8-bit");
    expect_error(make_json(j, sizeof j, "quantization_config", "{\"quant_method\": \"gptq\", \"bits\": 4}", NULL),
                 "quantization_config", "'gptq'");
    expect_error(make_json(j, sizeof j, "quantization_config",
                           "{\"load_in_4bit\": true, \"bnb_4bit_quant_type\": \"int4\"}", NULL),
                 "bnb_4bit_quant_type", "'int4'");
    expect_error(make_json(j, sizeof j, "quantization_config", "{\"load_in_4bit\": false}", NULL),
                 "load_in_4bit");
    expect_error(make_json(j, sizeof j, "quantization_config", "[]", NULL), "quantization_config");
}

// ---------------------------------------------------------------------------------------------
// Hostile and broken input.

Test(config, deep_nesting_is_refused) {
    size_t depth = 2000;
    char *j = malloc(4 * depth + 256);
    size_t n = (size_t)sprintf(j, "{\"hidden_size\": 64, \"extra\": ");
    for (size_t i = 0; i < depth; i++) j[n++] = '[';
    for (size_t i = 0; i < depth; i++) j[n++] = ']';
    strcpy(j + n, "}");
    expect_error(j, "extra", "nesting deeper than");
    // And at the top level, with no key around it.
    n = 0;
    for (size_t i = 0; i < depth; i++) j[n++] = '[';
    for (size_t i = 0; i < depth; i++) j[n++] = ']';
    j[n] = 0;
    expect_error(j, "nesting deeper than", "line 1");
    free(j);
}

Test(config, megabyte_number_is_refused) {
    size_t digits = 1 << 20;
    char *j = malloc(digits + 256);
    size_t n = (size_t)sprintf(j, "{\"architectures\": [\"MixtralForCausalLM\"], \"hidden_size\": ");
    memset(j + n, '7', digits);
    strcpy(j + n + digits, "}");
    expect_error(j, "hidden_size", "too long");
    // Written to a file and loaded, the error names that file.
    char path[512];
    snprintf(path, sizeof path, "%s/big.json", tmp);
    cr_assert_eq(mt_write_file_atomic(path, j, strlen(j)), 0);
    mt_model_config c;
    cr_assert_neq(mt_model_config_load(path, &c), 0);
    cr_assert(strstr(mt_error_get(), path) && strstr(mt_error_get(), "hidden_size"), "%s", mt_error_get());
    free(j);
}

Test(config, not_json) {
    expect_error("hidden_size: 64\n", "not valid JSON", "line 1");
    expect_error("", "not valid JSON");
    expect_error("{\"hidden_size\": 64,\n \"vocab_size\": }", "not valid JSON", "line 2");
    expect_error("[1, 2]", "top level");
    char j[4096];
    make_json(j, sizeof j, NULL);
    strcat(j, " {}");
    expect_error(j, "trailing");
    expect_error(make_json(j, sizeof j, "hidden_size", "64, \"hidden_size\": 128", NULL), "hidden_size", "twice");
    // Reading is capped: a file over 4 MiB is refused before it is parsed.
    char path[512];
    snprintf(path, sizeof path, "%s/huge.json", tmp);
    size_t big = (4u << 20) + 1;
    char *pad = malloc(big);
    memset(pad, ' ', big);
    cr_assert_eq(mt_write_file_atomic(path, pad, big), 0);
    free(pad);
    mt_model_config c;
    cr_assert_neq(mt_model_config_load(path, &c), 0);
    cr_assert(strstr(mt_error_get(), path) && strstr(mt_error_get(), "limit"), "%s", mt_error_get());
}

Test(config, check_on_a_struct) {
    mt_model_config c, d;
    cr_assert_eq(mt_model_config_load(CONFIGS "tiny.json", &c), 0, "%s", mt_error_get());
    cr_assert_eq(mt_model_config_check(&c), 0);
    d = c, d.head_dim = 0;
    cr_assert_neq(mt_model_config_check(&d), 0);
    cr_assert(strstr(mt_error_get(), "head_dim"), "%s", mt_error_get());
    d = c, d.kv_heads = 3;
    cr_assert_neq(mt_model_config_check(&d), 0);
    cr_assert(strstr(mt_error_get(), "num_key_value_heads (3)"), "%s", mt_error_get());
    d = c, d.rms_norm_eps = 0;
    cr_assert_neq(mt_model_config_check(&d), 0);
    cr_assert(strstr(mt_error_get(), "rms_norm_eps"), "%s", mt_error_get());
    d = c, d.sliding_window = -5;
    cr_assert_neq(mt_model_config_check(&d), 0);
    cr_assert(strstr(mt_error_get(), "sliding_window"), "%s", mt_error_get());
    d = c, d.hidden = INT64_MAX / 2, d.head_dim = 1;
    cr_assert_neq(mt_model_config_check(&d), 0);
    cr_assert(strstr(mt_error_get(), "overflows"), "%s", mt_error_get());
    d = c, strcpy(d.architecture, "LlamaForCausalLM");
    cr_assert_neq(mt_model_config_check(&d), 0);
    cr_assert(strstr(mt_error_get(), "LlamaForCausalLM"), "%s", mt_error_get());
}

// ---------------------------------------------------------------------------------------------
// Write → load.

static void roundtrip(const mt_model_config *c) {
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", tmp);
    cr_assert_eq(mt_model_config_write(c, path), 0, "%s", mt_error_get());
    mt_model_config d;
    cr_assert_eq(mt_model_config_load(path, &d), 0, "%s", mt_error_get());
    cr_assert(memcmp(c, &d, sizeof *c) == 0, "write → load changed the config (hidden %lld/%lld)",
              (long long)c->hidden, (long long)d.hidden);
}

Test(config, write_load_equal) {
    mt_model_config c;
    cr_assert_eq(mt_model_config_load(CONFIGS "mixtral-8x7b.json", &c), 0, "%s", mt_error_get());
    roundtrip(&c);
    cr_assert_eq(mt_model_config_load(CONFIGS "tiny.json", &c), 0, "%s", mt_error_get());
    roundtrip(&c);
    // Everything away from the defaults: quantized, explicit head_dim, tied, odd floats.
    char j[4096];
    cr_assert_eq(parse_str(make_json(j, sizeof j, "head_dim", "24", "tie_word_embeddings", "true",
                                     "sliding_window", "4096", "bos_token_id", "null", "eos_token_id", "0",
                                     "rope_theta", "123456.789", "rms_norm_eps", "1.5e-06",
                                     "router_aux_loss_coef", "0.1", "router_jitter_noise", "0.01",
                                     "initializer_range", "0.0001", "max_position_embeddings", "7",
                                     "torch_dtype", "\"float16\"",
                                     "quantization_config",
                                     "{\"load_in_4bit\": true, \"bnb_4bit_quant_type\": \"nf4\", "
                                     "\"bnb_4bit_use_double_quant\": true}",
                                     NULL), &c), 0, "%s", mt_error_get());
    roundtrip(&c);
    c.rope_theta = 1e17, c.rms_norm_eps = 1.0 / 3.0, c.initializer_range = 0;
    roundtrip(&c);
}

Test(config, write_looks_like_transformers) {
    mt_model_config c;
    cr_assert_eq(mt_model_config_load(CONFIGS "mixtral-8x7b.json", &c), 0, "%s", mt_error_get());
    char path[512], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/config.json", tmp);
    cr_assert_eq(mt_model_config_write(&c, path), 0, "%s", mt_error_get());
    cr_assert_eq(mt_read_file(path, 1 << 20, &text, &len), 0);
    static const char *lines[] = {
        "{\n  \"architectures\": [\n    \"MixtralForCausalLM\"\n  ],\n",
        "\n  \"rms_norm_eps\": 1e-05,\n", "\n  \"rope_theta\": 1000000.0,\n",
        "\n  \"router_aux_loss_coef\": 0.02,\n", "\n  \"sliding_window\": null,\n",
        "\n  \"torch_dtype\": \"bfloat16\",\n", "\n  \"vocab_size\": 32000\n}\n",
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(lines); i++)
        cr_assert(strstr(text, lines[i]), "missing %s in:\n%s", lines[i], text);
    cr_assert(!strstr(text, "head_dim"), "head_dim written though it is hidden/heads");
    cr_assert(!strstr(text, "quantization_config"));
    free(text);
    // An invalid struct is not written.
    c.top_k = 9;
    cr_assert_neq(mt_model_config_write(&c, path), 0);
    cr_assert(strstr(mt_error_get(), "num_experts_per_tok"), "%s", mt_error_get());
}
