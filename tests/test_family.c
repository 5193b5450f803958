// Model families (model/family.h, docs/families.md): each tiny config reads with its parts, the
// class defaults of transformers apply when a field is absent, every family-specific check names
// its field, write → load is exact, the weight list has each family's names and shapes and its
// sum is the parameter count, and a model whose parts the step lacks is refused by name.
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/backend.h"
#include "core/common.h"
#include "model/config.h"
#include "model/family.h"
#include "model/mixtral.h"
#include "model/weights.h"
#include "core/safetensors.h"
#include "lora/peft.h"
#include "trainer/options.h"
#include "plan/plan.h"
#include "tests/fd.h"
#include "tests/test_util.h"

#define CONFIGS MT_REPO_ROOT "/configs/"

static char tmp[256];
static void setup(void) { mt_test_tmpdir(tmp, sizeof tmp); }
static void teardown(void) { mt_test_rmrf(tmp); }
TestSuite(family, .init = setup, .fini = teardown);

static void load(const char *name, mt_model_config *c) {
    cr_assert_eq(mt_model_config_load(name, c), 0, "%s: %s", name, mt_error_get());
}

static int parse(const char *json, mt_model_config *c) { return mt_model_config_parse(json, strlen(json), "x.json", c); }

// The parse fails with an error that contains `frag`.
static void expect_error(const char *json, const char *frag) {
    mt_model_config c;
    mt_error_clear();
    cr_assert_neq(parse(json, &c), 0, "accepted: %s", json);
    cr_assert(strstr(mt_error_get(), frag), "error '%s' lacks '%s'", mt_error_get(), frag);
}

Test(family, table_names_each_model_type) {
    const char *types[] = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss", "deepseek_v2", "deepseek_v3", "glm4_moe", "glm4_moe_lite"};
    cr_assert_eq(MT_ARRAY_LEN(types), MT_FAMILY_COUNT);
    for (int i = 0; i < MT_FAMILY_COUNT; i++) {
        const mt_family *f = mt_family_find(types[i]);
        cr_assert_not_null(f, "%s", types[i]);
        cr_assert_eq(f, mt_family_get((mt_family_id)i));
        cr_assert(strstr(mt_family_list(), types[i]));
    }
    cr_assert_null(mt_family_find("llama"));
    cr_assert_null(mt_family_find(NULL));
    cr_assert_str_eq(mt_family_get(MT_FAMILY_MIXTRAL)->moe_module, "block_sparse_moe");
    cr_assert_str_eq(mt_family_get(MT_FAMILY_QWEN3_MOE)->expert[1], "down_proj");
    cr_assert_str_eq(mt_family_get(MT_FAMILY_GPT_OSS)->router, "router");
}

// gpt-oss's checkpoint (the names and shapes transformers' GptOssForCausalLM has: its fused
// experts [E, H, 2f] and [E, f, H], their biases, the router's bias, the attention sinks); the
// sum of the list is the parameter count; `moetrain init` of it loads in transformers 4.57 and
// 5.24 with no missing or unexpected key (scripts/check_family_init.py, run by hand).
Test(family, gpt_oss_weight_list) {
    mt_model_config c;
    load(MT_REPO_ROOT "/tests/data/hf_configs/v5/gpt_oss.json", &c);
    mt_weight_desc *w;
    size_t n = mt_weights_list(&c, &w);
    int64_t sum = 0;
    for (size_t i = 0; i < n; i++) sum += mt_weight_numel(&w[i]);
    cr_assert_eq(sum, mt_config_total_params(&c), "list %lld, count %lld", (long long)sum,
                 (long long)mt_config_total_params(&c));
    struct { const char *name; int ndim; int64_t d[3]; } want[] = {
        {"model.layers.1.self_attn.sinks", 1, {6}},
        {"model.layers.1.self_attn.o_proj.bias", 1, {48}},
        {"model.layers.1.mlp.router.weight", 2, {6, 48}},
        {"model.layers.1.mlp.router.bias", 1, {6}},
        {"model.layers.1.mlp.experts.gate_up_proj", 3, {6, 48, 80}},
        {"model.layers.1.mlp.experts.gate_up_proj_bias", 2, {6, 80}},
        {"model.layers.1.mlp.experts.down_proj", 3, {6, 40, 48}},
        {"model.layers.1.mlp.experts.down_proj_bias", 2, {6, 48}},
    };
    for (size_t k = 0; k < MT_ARRAY_LEN(want); k++) {
        const mt_weight_desc *x = NULL;
        for (size_t i = 0; i < n && !x; i++)
            if (strcmp(w[i].name, want[k].name) == 0) x = &w[i];
        cr_assert_not_null(x, "%s missing", want[k].name);
        cr_assert_eq(x->ndim, want[k].ndim, "%s", want[k].name);
        for (int d = 0; d < x->ndim; d++) cr_assert_eq(x->shape[d], want[k].d[d], "%s dim %d", want[k].name, d);
    }
    for (size_t i = 0; i < n; i++) cr_assert_null(strstr(w[i].name, "experts.0."), "%s: per-expert name", w[i].name);
    free(w);
}

Test(family, tiny_configs_read_with_their_parts) {
    mt_model_config c;
    load(CONFIGS "tiny-qwen2-moe.json", &c);
    cr_assert_eq(c.family, MT_FAMILY_QWEN2_MOE);
    cr_assert_eq(c.intermediate, 19, "an expert's size is moe_intermediate_size");
    cr_assert_eq(c.dense_intermediate, 37);
    cr_assert_eq(c.shared_intermediate, 23);
    cr_assert_eq(c.experts, 7);
    cr_assert_eq(c.head_dim, 14);
    cr_assert(c.qkv_bias && !c.o_bias && !c.norm_topk_prob);
    cr_assert_eq(c.decoder_sparse_step, 2);
    // (L + 1) % 2 == 0: only layer 1 of 3 is MoE.
    cr_assert(!mt_config_layer_is_moe(&c, 0) && mt_config_layer_is_moe(&c, 1) && !mt_config_layer_is_moe(&c, 2));
    cr_assert_eq(mt_config_moe_layers(&c), 1);

    load(CONFIGS "tiny-qwen3-moe.json", &c);
    cr_assert_eq(c.family, MT_FAMILY_QWEN3_MOE);
    cr_assert_eq(c.head_dim, 10, "explicit head_dim, not 44 / 5");
    cr_assert_eq(c.n_mlp_only, 1);
    cr_assert(mt_config_layer_is_moe(&c, 0) && !mt_config_layer_is_moe(&c, 1) && mt_config_layer_is_moe(&c, 2));
    cr_assert(c.norm_topk_prob && !c.qkv_bias && c.shared_intermediate == 0);

    load(CONFIGS "tiny-olmoe.json", &c);
    cr_assert_eq(c.family, MT_FAMILY_OLMOE);
    cr_assert_eq(c.intermediate, 17, "OLMoE's experts use intermediate_size");
    cr_assert_eq(c.dense_intermediate, 0);
    cr_assert_float_eq(c.clip_qkv, 8.0, 0);
    cr_assert_eq(c.bos_token_id, -1);
    cr_assert_eq(mt_config_moe_layers(&c), c.layers);

    load(CONFIGS "tiny.json", &c);
    cr_assert_eq(c.family, MT_FAMILY_MIXTRAL);
    cr_assert(c.norm_topk_prob, "Mixtral always renormalises");
    cr_assert_eq(mt_config_moe_layers(&c), c.layers);
}

// Only the required sizes given: the rest are the configuration_*.py class defaults.
Test(family, class_defaults_when_fields_are_absent) {
    mt_model_config c;
    cr_assert_eq(parse("{\"model_type\": \"qwen2_moe\", \"hidden_size\": 64, \"moe_intermediate_size\": 8, "
                       "\"num_hidden_layers\": 2, \"num_attention_heads\": 16, \"num_experts\": 4, "
                       "\"num_experts_per_tok\": 2, \"vocab_size\": 100}", &c), 0, "%s", mt_error_get());
    cr_assert_eq(c.kv_heads, 16);
    cr_assert_eq(c.dense_intermediate, 5632);
    cr_assert_eq(c.shared_intermediate, 5632);
    cr_assert(c.qkv_bias && !c.norm_topk_prob && !c.output_router_logits);
    cr_assert_eq(c.decoder_sparse_step, 1);
    cr_assert_eq(c.max_positions, 32768);
    cr_assert_float_eq(c.rms_norm_eps, 1e-6, 0);
    cr_assert_float_eq(c.rope_theta, 10000.0, 0);
    cr_assert_float_eq(c.router_aux_loss_coef, 0.001, 0);
    cr_assert_eq(c.bos_token_id, -1);

    cr_assert_eq(parse("{\"model_type\": \"qwen3_moe\", \"hidden_size\": 64, \"moe_intermediate_size\": 8, "
                       "\"num_hidden_layers\": 2, \"num_attention_heads\": 16, \"num_experts\": 4, "
                       "\"num_experts_per_tok\": 2, \"vocab_size\": 100}", &c), 0, "%s", mt_error_get());
    cr_assert_eq(c.kv_heads, 4);
    cr_assert_eq(c.dense_intermediate, 6144);
    cr_assert(!c.qkv_bias && !c.o_bias && c.shared_intermediate == 0);

#define OLMOE_NO_HEAD_DIM "{\"architectures\": [\"OlmoeForCausalLM\"], \"hidden_size\": 64, \"intermediate_size\": 8, " \
                          "\"num_hidden_layers\": 2, \"num_attention_heads\": 16, \"num_experts\": 4, " \
                          "\"num_experts_per_tok\": 2, \"vocab_size\": 60000"
    // OLMoE's head_dim: transformers 4 ignores it, 5 reads it. Equal to hidden/heads both agree;
    // otherwise the config means two models and is refused.
    cr_assert_eq(parse(OLMOE_NO_HEAD_DIM ", \"head_dim\": 4}", &c), 0, "%s", mt_error_get());
    cr_assert_eq(c.head_dim, 4);
    cr_assert_neq(parse(OLMOE_NO_HEAD_DIM ", \"head_dim\": 7}", &c), 0);
    cr_assert(strstr(mt_error_get(), "head_dim: 7") && strstr(mt_error_get(), "transformers 5 reads it"), "%s",
              mt_error_get());
    cr_assert_eq(parse(OLMOE_NO_HEAD_DIM "}", &c), 0, "%s", mt_error_get());
    cr_assert_eq(c.kv_heads, 16, "OLMoE: num_key_value_heads defaults to the heads");
    cr_assert_eq(c.head_dim, 4);
    cr_assert_float_eq(c.router_aux_loss_coef, 0.01, 0);
    cr_assert_eq(c.eos_token_id, 50279);
    cr_assert_eq(c.max_positions, 4096);
    cr_assert_float_eq(c.clip_qkv, 0, 0);
}

#define Q2 "\"model_type\": \"qwen2_moe\", \"hidden_size\": 64, \"moe_intermediate_size\": 8, " \
           "\"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_experts\": 4, "     \
           "\"num_experts_per_tok\": 2, \"vocab_size\": 100, \"num_key_value_heads\": 4"
#define OL "\"model_type\": \"olmoe\", \"hidden_size\": 64, \"intermediate_size\": 8, " \
           "\"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_experts\": 4, " \
           "\"num_experts_per_tok\": 2, \"vocab_size\": 60000"

Test(family, each_check_names_its_field) {
    expect_error("{\"architectures\": [\"Qwen3MoeForCausalLM\"], " Q2 "}", "does not match");
    expect_error("{" Q2 ", \"mlp_only_layers\": [4]}", "mlp_only_layers");
    expect_error("{" Q2 ", \"mlp_only_layers\": 1}", "mlp_only_layers");
    expect_error("{" Q2 ", \"decoder_sparse_step\": 0}", "decoder_sparse_step");
    expect_error("{" Q2 ", \"use_sliding_window\": true}", "use_sliding_window");
    expect_error("{" Q2 ", \"head_dim\": 8}", "head_dim");
    expect_error("{" Q2 ", \"rope_scaling\": {\"type\": \"longrope\", \"factor\": 4.0}}", "rope_scaling");
    expect_error("{" Q2 ", \"norm_topk_prob\": 1}", "norm_topk_prob");
    expect_error("{" OL ", \"clip_qkv\": 0}", "clip_qkv");
    expect_error("{" OL ", \"clip_qkv\": -1.5}", "clip_qkv");
    mt_model_config c;
    // OLMoE has no dense layers: transformers ignores the field there, and so do we.
    cr_assert_eq(parse("{" OL ", \"mlp_only_layers\": [1]}", &c), 0, "%s", mt_error_get());
    cr_assert(c.n_mlp_only == 0 && mt_config_moe_layers(&c) == 4);
    cr_assert_eq(parse("{" Q2 ", \"mlp_only_layers\": [3, 0, 3]}", &c), 0, "%s", mt_error_get());
    cr_assert_eq(c.n_mlp_only, 2, "a repeated index counts once");
    cr_assert(c.mlp_only_layers[0] == 0 && c.mlp_only_layers[1] == 3, "sorted");
    // Checks of the struct itself (what mt_model_config_write refuses).
    load(CONFIGS "tiny-qwen2-moe.json", &c);
    mt_model_config d = c;
    d.shared_intermediate = 0;
    cr_assert_neq(mt_model_config_check(&d), 0);
    cr_assert(strstr(mt_error_get(), "shared_expert_intermediate_size"), "%s", mt_error_get());
    load(CONFIGS "tiny.json", &c);
    d = c, d.norm_topk_prob = 0;
    cr_assert_neq(mt_model_config_check(&d), 0);
    cr_assert(strstr(mt_error_get(), "norm_topk_prob"), "%s", mt_error_get());
    d = c, d.clip_qkv = 3;
    cr_assert_neq(mt_model_config_check(&d), 0);
    cr_assert(strstr(mt_error_get(), "clip_qkv"), "%s", mt_error_get());
    d = c, d.qkv_bias = 1;
    cr_assert_neq(mt_model_config_check(&d), 0);
    cr_assert(strstr(mt_error_get(), "biases"), "%s", mt_error_get());
    d = c, d.family = MT_FAMILY_OLMOE;
    cr_assert_neq(mt_model_config_check(&d), 0);
    cr_assert(strstr(mt_error_get(), "architectures"), "%s", mt_error_get());
}

Test(family, write_load_equal_for_each_family) {
    const char *names[] = {"tiny-qwen2-moe.json", "tiny-qwen3-moe.json", "tiny-olmoe.json", "tiny.json"};
    char path[512], src[512];
    snprintf(path, sizeof path, "%s/config.json", tmp);
    for (size_t i = 0; i < MT_ARRAY_LEN(names); i++) {
        mt_model_config c, d;
        snprintf(src, sizeof src, CONFIGS "%s", names[i]);
        load(src, &c);
        c.output_router_logits = 1;  // away from the default, so it must be written
        cr_assert_eq(mt_model_config_write(&c, path), 0, "%s", mt_error_get());
        load(path, &d);
        cr_assert(memcmp(&c, &d, sizeof c) == 0, "%s: write -> load changed the config", names[i]);
    }
}

// The names and shapes transformers' modules have (scripts/check_family_init.py loads `init`'s
// output in transformers itself); here: the parts each family adds, and the count.
static const mt_weight_desc *find(const mt_weight_desc *w, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(w[i].name, name) == 0) return &w[i];
    return NULL;
}

static void expect_shape(const mt_weight_desc *w, size_t n, const char *name, int64_t d0, int64_t d1) {
    const mt_weight_desc *x = find(w, n, name);
    cr_assert_not_null(x, "no %s", name);
    cr_assert(x->shape[0] == d0 && x->shape[1] == d1, "%s: [%lld, %lld], expected [%lld, %lld]", name,
              (long long)x->shape[0], (long long)x->shape[1], (long long)d0, (long long)d1);
}

static int64_t list_params(const mt_model_config *c, mt_weight_desc **w, size_t *n) {
    *n = mt_weights_list(c, w);
    int64_t sum = 0;
    for (size_t i = 0; i < *n; i++) sum += (*w)[i].shape[0] * ((*w)[i].ndim == 2 ? (*w)[i].shape[1] : 1);
    return sum;
}

Test(family, weight_lists_have_each_familys_names) {
    mt_model_config c;
    mt_weight_desc *w;
    size_t n;
    load(CONFIGS "tiny-qwen2-moe.json", &c);
    cr_assert_eq(list_params(&c, &w, &n), mt_config_total_params(&c));
    expect_shape(w, n, "model.layers.0.self_attn.q_proj.bias", 42, 0);
    expect_shape(w, n, "model.layers.0.self_attn.k_proj.bias", 14, 0);
    cr_assert_null(find(w, n, "model.layers.0.self_attn.o_proj.bias"));
    expect_shape(w, n, "model.layers.0.mlp.gate_proj.weight", 37, 42);  // dense layer
    expect_shape(w, n, "model.layers.1.mlp.gate.weight", 7, 42);
    expect_shape(w, n, "model.layers.1.mlp.experts.6.down_proj.weight", 42, 19);
    expect_shape(w, n, "model.layers.1.mlp.shared_expert.up_proj.weight", 23, 42);
    expect_shape(w, n, "model.layers.1.mlp.shared_expert_gate.weight", 1, 42);
    cr_assert_null(find(w, n, "model.layers.0.mlp.gate.weight"), "a dense layer has no router");
    cr_assert_eq(mt_config_shared_expert_params(&c), 3 * 42 * 23 + 42);
    cr_assert_eq(mt_config_dense_mlp_params(&c), 3 * 42 * 37);
    free(w);

    load(CONFIGS "tiny-qwen3-moe.json", &c);
    cr_assert_eq(list_params(&c, &w, &n), mt_config_total_params(&c));
    expect_shape(w, n, "model.layers.0.self_attn.q_proj.weight", 50, 44);
    expect_shape(w, n, "model.layers.0.self_attn.q_norm.weight", 10, 0);
    expect_shape(w, n, "model.layers.0.self_attn.k_norm.weight", 10, 0);
    expect_shape(w, n, "model.layers.1.mlp.down_proj.weight", 44, 39);
    expect_shape(w, n, "model.layers.2.mlp.experts.8.gate_proj.weight", 21, 44);
    free(w);

    load(CONFIGS "tiny-olmoe.json", &c);
    cr_assert_eq(list_params(&c, &w, &n), mt_config_total_params(&c));
    expect_shape(w, n, "model.layers.1.self_attn.q_norm.weight", 30, 0);
    expect_shape(w, n, "model.layers.1.self_attn.k_norm.weight", 30, 0);
    expect_shape(w, n, "model.layers.1.mlp.experts.0.up_proj.weight", 17, 30);
    free(w);

    load(CONFIGS "tiny.json", &c);
    cr_assert_eq(list_params(&c, &w, &n), mt_config_total_params(&c));
    cr_assert_eq(n, 3 + (size_t)c.layers * (7 + 3 * (size_t)c.experts), "Mixtral's list is unchanged");
    expect_shape(w, n, "model.layers.1.block_sparse_moe.experts.7.w2.weight", 64, 128);
    free(w);
}

// Init fills biases with 0 and q/k norms with 1, as transformers' _init_weights does.
Test(family, init_fill_of_biases_and_norms) {
    mt_model_config c;
    load(CONFIGS "tiny-qwen2-moe.json", &c);
    mt_weight_desc *w;
    size_t n = mt_weights_list(&c, &w);
    const mt_weight_desc *b = find(w, n, "model.layers.0.self_attn.q_proj.bias");
    cr_assert_eq(b->kind, MT_WEIGHT_BIAS);
    float v[42];
    mt_weights_init_fill(&c, b, 1, MT_F32, v);
    for (int i = 0; i < 42; i++) cr_assert_eq(v[i], 0.0f);
    free(w);
    load(CONFIGS "tiny-qwen3-moe.json", &c);
    n = mt_weights_list(&c, &w);
    const mt_weight_desc *q = find(w, n, "model.layers.0.self_attn.q_norm.weight");
    cr_assert_eq(q->kind, MT_WEIGHT_NORM);
    mt_weights_init_fill(&c, q, 1, MT_F32, v);
    for (int i = 0; i < 10; i++) cr_assert_eq(v[i], 1.0f);
    free(w);
}

// Every family's tiny config (odd sizes; Qwen2-MoE with biases, shared expert and dense layers;
// Qwen3-MoE with a dense layer; OLMoE with clip_qkv) builds and takes a finite training step on
// the cpu, and the counting backend gives back everything it took. (On CUDA: tests/test_cuda_family.c.)
Test(family, tiny_configs_step_on_cpu_and_counting_backends) {
    const char *names[] = {"tiny-qwen2-moe.json", "tiny-qwen3-moe.json", "tiny-olmoe.json"};
    for (size_t i = 0; i < MT_ARRAY_LEN(names); i++) {
        char src[512];
        snprintf(src, sizeof src, CONFIGS "%s", names[i]);
        mt_model_config c;
        load(src, &c);
        mt_run_opts o;
        mt_run_opts_default(&o);
        o.mode = MT_MODE_LORA, o.lora_r = 2, o.targets = MT_TARGET_EXPERTS | MT_TARGET_ATTN | MT_TARGET_GATE;
        const char *be_names[] = {"cpu", "null"};
        for (int k = 0; k < 2; k++) {
            mt_backend *be = mt_backend_new(be_names[k]);
            cr_assert_not_null(be);
            mt_model m;
            cr_assert_eq(mt_model_build(&m, be, &c, NULL, MT_MODEL_SPEC_OF(&o)), 0, "%s: %s", names[i], mt_error_get());
            int32_t tok[14], lab[14];
            for (int t = 0; t < 14; t++) tok[t] = lab[t] = (t * 37 + 5) % (int)c.vocab;
            mt_batch b = {2, 7, tok, lab, NULL};
            mt_loss l;
            mt_model_zero_grad(&m);
            cr_assert_eq(mt_model_forward_train(&m, &b, &l), 0, "%s", mt_error_get());
            mt_model_backward(&m);
            if (k == 0) cr_expect(isfinite(l.loss) && l.ce > 0, "%s: loss %g", names[i], l.loss);
            mt_model_free(&m);
            cr_expect_eq(be->ledger.total_cur, 0, "%s on %s: everything went back", names[i], be_names[k]);
            mt_backend_free(be);
        }
    }
}

Test(family, init_writes_each_family) {
    const char *names[] = {"tiny-qwen2-moe.json", "tiny-qwen3-moe.json", "tiny-olmoe.json"};
    for (size_t i = 0; i < MT_ARRAY_LEN(names); i++) {
        char out[8192];
        cr_assert_eq(mt_test_run(out, sizeof out, "init --config %s%s --out %s/m%zu --seed 5", CONFIGS, names[i], tmp, i),
                     0, "%s", out);
        char dir[512], src[512];
        snprintf(dir, sizeof dir, "%s/m%zu", tmp, i);
        snprintf(src, sizeof src, CONFIGS "%s", names[i]);
        mt_model_config a, b;
        load(src, &a);
        load(dir, &b);
        cr_assert(memcmp(&a, &b, sizeof a) == 0, "%s: the written config.json differs", names[i]);
    }
}

// The families whose parts the step has (q/k norms, norm_topk_prob false, dense layers, the shared
// expert) build and run a training step on the counting backend too, which allocates what the
// GPU step would (the pre-norm q/k and their statistics, the MLP's activations) and gives it all
// back.
Test(family, qk_norm_families_step_on_the_counting_backend) {
    const char *dirs[] = {"f_qwen3_moe", "f_olmoe", "f_qwen3_dense", "f_qwen2_shared"};
    for (size_t i = 0; i < MT_ARRAY_LEN(dirs); i++) {
        char dir[512];
        snprintf(dir, sizeof dir, MT_REPO_ROOT "/tests/data/golden/%s", dirs[i]);
        mt_model_config c;
        load(dir, &c);
        mt_run_opts o;
        mt_run_opts_default(&o);
        o.mode = MT_MODE_LORA, o.lora_r = 2;
        mt_backend *be = mt_backend_null_new();
        mt_model m;
        cr_assert_eq(mt_model_build(&m, be, &c, NULL, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
        cr_assert(m.layers[0].qn || c.family == MT_FAMILY_QWEN2_MOE, "%s: q_norm weight", dirs[i]);
        cr_assert_eq(m.layers[1].dense, !mt_config_layer_is_moe(&c, 1));
        int32_t tok[16] = {0}, lab[16] = {0};
        mt_batch b = {2, 8, tok, lab, NULL};
        mt_loss l;
        cr_assert_eq(mt_model_forward_train(&m, &b, &l), 0, "%s", mt_error_get());
        if (m.layers[0].qn) {
            cr_assert_not_null(m.acts[0].q_raw, "the pre-norm q is kept");
            cr_assert_eq(m.acts[0].rstd_q->shape[0], c.family == MT_FAMILY_QWEN3_MOE ? 16 * c.heads : 16,
                         "one rstd per normed row");
        }
        if (c.shared_intermediate || mt_config_moe_layers(&c) < c.layers)
            cr_assert_not_null(m.acts[0].mlp_y, "%s: the MLP's activations", dirs[i]);
        mt_model_backward(&m);
        mt_model_free(&m);
        cr_expect_eq(be->ledger.total_cur, 0, "%s: everything went back to the ledger", dirs[i]);
        mt_backend_free(be);
    }
}

// --quant nf4 makes the frozen shared expert's and dense MLPs' projections 4-bit with the experts
// (their gate [1, H] stays dense), and the step runs on them: the loss moves by the quantization
// error only, and their LoRA still learns.
Test(family, nf4_base_quantizes_the_shared_expert_and_dense_mlps) {
    const char *dirs[] = {"f_qwen2_shared", "f_qwen3_dense"};
    for (size_t i = 0; i < MT_ARRAY_LEN(dirs); i++) {
        char dir[512];
        snprintf(dir, sizeof dir, MT_REPO_ROOT "/tests/data/golden/%s", dirs[i]);
        mt_backend *be = mt_backend_cpu_new();
        mt_loss l[2];
        for (int q = 0; q < 2; q++) {
            mt_run_opts o;
            mt_run_opts_default(&o);
            o.mode = MT_MODE_LORA, o.lora_r = 4, o.targets = MT_TARGET_EXPERTS | MT_TARGET_ATTN;
            o.quant = q ? MT_QUANT_NF4 : MT_QUANT_NONE;
            mt_model m;
            cr_assert_eq(mt_model_load(&m, be, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
            int mlps = 0;
            for (int L = 0; L < m.cfg.layers; L++) {
                mt_layer *ly = &m.layers[L];
                for (int k = 0; k < 3 && ly->mlp[k].out; k++, mlps++) {
                    cr_expect_eq(ly->mlp[k].q != NULL, q, "%s layer %d MLP %d: 4-bit only under --quant nf4", dirs[i], L, k);
                    cr_expect_not_null(ly->mlp[k].lora, "%s layer %d MLP %d: its LoRA", dirs[i], L, k);
                }
                cr_expect_null(ly->shared_gate.q, "%s layer %d: the shared gate stays dense", dirs[i], L);
            }
            cr_assert_gt(mlps, 0, "%s has a shared expert or a dense layer", dirs[i]);
            int32_t tok[16], lab[16];
            for (int t = 0; t < 16; t++) tok[t] = (t * 7 + 3) % (int)m.cfg.vocab, lab[t] = (t * 5 + 1) % (int)m.cfg.vocab;
            mt_batch b = {2, 8, tok, lab, NULL};
            mt_model_zero_grad(&m);
            cr_assert_eq(mt_model_forward_train(&m, &b, &l[q]), 0, "%s", mt_error_get());
            mt_model_backward(&m);
            mt_linear *down = m.layers[0].mlp[1].out ? &m.layers[0].mlp[1] : &m.layers[1].mlp[1];
            double g = 0;  // LoRA B starts at 0, so its gradient is what moves first
            for (int64_t k = 0; k < mt_tensor_numel(down->lora->db); k++) g += fabs(((float *)down->lora->db->data)[k]);
            cr_expect_gt(g, 0.0, "%s: the MLP's LoRA gets a gradient through the 4-bit base", dirs[i]);
            mt_model_free(&m);
        }
        cr_expect(isfinite(l[1].loss) && fabs(l[1].loss - l[0].loss) < 0.02 * l[0].loss, "%s: nf4 %.6f, dense %.6f",
                  dirs[i], l[1].loss, l[0].loss);
        cr_expect_neq(l[1].loss, l[0].loss, "%s: the 4-bit base is used", dirs[i]);
        mt_backend_free(be);
    }
}

// A LoRA adapter of a family is saved under its module names (PEFT v4 keys) and in the v5 layout
// (fused experts, docs/families.md "Adapters"); each reads back into an identical model.
Test(family, adapter_names_and_round_trip) {
    char dir[512], out[600], path[700];
    snprintf(dir, sizeof dir, MT_REPO_ROOT "/tests/data/golden/f_qwen3_moe");
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = MT_MODE_LORA, o.lora_r = 4, o.lora_alpha = 8, o.quant = MT_QUANT_NONE;
    o.targets = MT_TARGET_EXPERTS | MT_TARGET_ATTN | MT_TARGET_GATE;
    mt_backend *be = mt_backend_cpu_new();
    mt_model m, back;
    cr_assert_eq(mt_model_load(&m, be, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    cr_assert_eq(mt_model_load_adapter(&m, dir), 0, "%s", mt_error_get());  // PEFT's own file
    snprintf(out, sizeof out, "%s/adapter", tmp);
    cr_assert_eq(mt_model_save_adapter(&m, out, "f_qwen3_moe"), 0, "%s", mt_error_get());
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", out);
    mt_st_file f;
    cr_assert_eq(mt_st_file_open(&f, path), 0, "%s", mt_error_get());
    const char *keys[] = {"base_model.model.model.layers.1.mlp.experts.8.gate_proj.lora_A.weight",
                          "base_model.model.model.layers.0.mlp.experts.0.down_proj.lora_B.weight",
                          "base_model.model.model.layers.0.mlp.gate.lora_A.weight",
                          "base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight"};
    for (size_t i = 0; i < MT_ARRAY_LEN(keys); i++) cr_assert_not_null(mt_st_file_find(&f, keys[i]), "no %s", keys[i]);
    for (size_t i = 0; i < f.n_tensors; i++) cr_assert_null(strstr(f.tensors[i].name, "block_sparse_moe"), "%s", f.tensors[i].name);
    mt_st_file_close(&f);
    char v5[300];
    snprintf(v5, sizeof v5, "%s/v5", tmp);
    cr_assert_eq(mt_model_save_adapter_as(&m, v5, "x", MT_PEFT_V5), 0, "%s", mt_error_get());
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", v5);
    cr_assert_eq(mt_st_file_open(&f, path), 0, "%s", mt_error_get());
    cr_assert_not_null(mt_st_file_find(&f, "base_model.model.model.layers.1.mlp.experts.base_layer.lora_A.weight"));
    for (size_t i = 0; i < f.n_tensors; i++) cr_assert_null(strstr(f.tensors[i].name, "experts.0."), "%s", f.tensors[i].name);
    mt_st_file_close(&f);
    const char *dirs[] = {out, v5};
    for (int d = 0; d < 2; d++) {
        cr_assert_eq(mt_model_load(&back, be, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
        cr_assert_eq(mt_model_load_adapter(&back, dirs[d]), 0, "%s: %s", dirs[d], mt_error_get());
        mt_linear *l[2] = {mt_model_find_linear(&m, "model.layers.0.mlp.gate"),
                           mt_model_find_linear(&back, "model.layers.0.mlp.gate")};
        cr_assert(l[0] && l[1] && l[0]->lora && l[1]->lora);
        cr_assert_eq(memcmp(l[0]->lora->b->data, l[1]->lora->b->data, l[0]->lora->b->nbytes), 0, "%s: router LoRA B", dirs[d]);
        static const char *ex[] = {"model.layers.1.mlp.experts.4.up_proj", "model.layers.0.mlp.experts.8.gate_proj",
                                   "model.layers.1.mlp.experts.0.down_proj", "model.layers.1.self_attn.v_proj"};
        for (size_t k = 0; k < MT_ARRAY_LEN(ex); k++) {
            l[0] = mt_model_find_linear(&m, ex[k]), l[1] = mt_model_find_linear(&back, ex[k]);
            cr_assert(l[0] && l[1] && l[0]->lora && l[1]->lora, "%s", ex[k]);
            cr_assert_eq(memcmp(l[0]->lora->a->data, l[1]->lora->a->data, l[0]->lora->a->nbytes), 0, "%s: %s A", dirs[d], ex[k]);
            cr_assert_eq(memcmp(l[0]->lora->b->data, l[1]->lora->b->data, l[0]->lora->b->nbytes), 0, "%s: %s B", dirs[d], ex[k]);
        }
        cr_assert(mt_model_find_linear(&back, ex[0]) == &back.layers[1].w3[4], "up_proj is w3");
        mt_model_free(&back);
    }
    cr_assert_null(mt_model_find_linear(&m, "model.layers.0.block_sparse_moe.gate"), "Mixtral's name is not Qwen's");
    mt_model_free(&m);
    mt_backend_free(be);
}

// ---------------------------------------------------------------------------------------------
// Finite differences of the whole model's loss (CE + aux, fp32 CPU forward) against the backward,
// for the parameters the families add: biases, q/k norm weights, the shared expert's gate and a
// dense layer's MLP (--mode full: every weight has its gradient).

typedef struct { mt_model *m; mt_batch b; } fd_ctx;

static double fd_loss(void *ctx) {
    fd_ctx *c = ctx;
    mt_loss l;
    cr_assert_eq(mt_model_forward(c->m, &c->b, &l), 0, "%s", mt_error_get());
    return l.loss;
}

static void fd_tensor(fd_ctx *c, const char *what, mt_tensor *w, mt_tensor *g, int64_t n) {
    cr_assert(w && g, "%s: no tensor or gradient", what);
    n = MT_MIN(n, mt_tensor_numel(w));
    fd_report r = fd_check_f32(fd_loss, c, w->data, g->data, n, 1e-2f, 2e-3);
    cr_expect_lt(r.worst, 2e-2, "%s: " FD_FMT, what, FD_ARGS(r));
}

static void fd_family(const char *config) {
    mt_model_config cfg;
    load(config, &cfg);
    cfg.top_k = cfg.experts;  // every expert chosen: no top-k switch makes the loss jump under ±h
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = MT_MODE_FULL, o.quant = MT_QUANT_NONE;
    mt_backend *be = mt_backend_cpu_new();
    mt_model m;
    cr_assert_eq(mt_model_build(&m, be, &cfg, NULL, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    // Larger biases and norms than init's 0 and 1, so their gradients carry information.
    for (int L = 0; L < cfg.layers; L++) {
        mt_tensor *t[] = {m.layers[L].bias[0], m.layers[L].bias[1], m.layers[L].bias[2], m.layers[L].bias[3],
                          m.layers[L].qn, m.layers[L].kn};
        for (size_t i = 0; i < MT_ARRAY_LEN(t); i++)
            for (int64_t j = 0; t[i] && j < mt_tensor_numel(t[i]); j++)
                ((float *)t[i]->data)[j] = (i < 4 ? 0.0f : 1.0f) + 0.3f * sinf((float)(7 * j + 3 * L + (int)i));
    }
    static int32_t tok[14], lab[14];
    for (int t = 0; t < 14; t++) tok[t] = lab[t] = (t * 37 + 5) % (int)cfg.vocab;
    fd_ctx c = {&m, {2, 7, tok, lab, NULL}};
    mt_loss l;
    mt_model_zero_grad(&m);
    cr_assert_eq(mt_model_forward_train(&m, &c.b, &l), 0);
    mt_model_backward(&m);
    for (int L = 0; L < cfg.layers; L++) {
        mt_layer *ly = &m.layers[L];
        char what[96];
        static const char *bn[] = {"q bias", "k bias", "v bias", "o bias"};
        for (int i = 0; i < 4; i++)
            if (ly->bias[i]) snprintf(what, sizeof what, "layer %d %s", L, bn[i]), fd_tensor(&c, what, ly->bias[i], ly->dbias[i], 12);
        if (ly->qn) {
            snprintf(what, sizeof what, "layer %d q_norm", L), fd_tensor(&c, what, ly->qn, ly->dqn, 12);
            snprintf(what, sizeof what, "layer %d k_norm", L), fd_tensor(&c, what, ly->kn, ly->dkn, 12);
        }
        if (ly->shared_gate.out)
            snprintf(what, sizeof what, "layer %d shared_expert_gate", L),
                fd_tensor(&c, what, ly->shared_gate.w, ly->shared_gate.dw, 12);
        for (int i = 0; i < 3 && ly->mlp[i].out; i++)
            snprintf(what, sizeof what, "layer %d %s mlp[%d]", L, ly->dense ? "dense" : "shared", i),
                fd_tensor(&c, what, ly->mlp[i].w, ly->mlp[i].dw, 8);
    }
    mt_model_free(&m);
    mt_backend_free(be);
}

Test(family, finite_differences_qwen2_moe_biases_shared_expert_dense_layers) { fd_family(CONFIGS "tiny-qwen2-moe.json"); }
Test(family, finite_differences_qwen3_moe_head_qk_norm_dense_layer) { fd_family(CONFIGS "tiny-qwen3-moe.json"); }

// The real configs read, and their parameter counts are the ones their model cards publish
// (docs/families.md says where each value came from): the sizes are right, and every part
// (shared expert, q/k norms, experts of moe_intermediate_size) is counted.
Test(family, real_configs_count_their_published_parameters) {
    struct { const char *file; double total, active; } real[] = {
        {"qwen3-30b-a3b.json", 30.5e9, 3.3e9},      // Qwen3 model card: 30.5B total, 3.3B activated
        {"qwen1.5-moe-a2.7b.json", 14.3e9, 2.7e9},  // Qwen1.5-MoE card: 14.3B total, 2.7B activated
        {"olmoe-1b-7b.json", 6.9e9, 1.3e9},         // OLMoE paper: 6.9B total, 1.3B active
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(real); i++) {
        char path[512];
        snprintf(path, sizeof path, CONFIGS "%s", real[i].file);
        mt_model_config c;
        load(path, &c);
        double t = (double)mt_config_total_params(&c), a = (double)mt_config_active_params(&c);
        cr_expect_lt(fabs(t - real[i].total) / real[i].total, 0.01, "%s: total %.4g", real[i].file, t);
        cr_expect_lt(fabs(a - real[i].active) / real[i].active, 0.03, "%s: active %.4g", real[i].file, a);
    }
}

// The planner counts the family's parts beside Mixtral's (shared experts, biases, q/k norms) in
// the model and in the base (the MLPs' projections 4-bit with the experts, the rest bf16); a dense
// layer as its MLP (no router, no experts).
// In lora mode every weight of the checkpoint is frozen on the one GPU, each counted once.
Test(family, plan_counts_the_family_parts) {
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = MT_MODE_LORA, o.lora_r = 16, o.seq = 4096;
    const char *files[] = {"qwen1.5-moe-a2.7b.json", "qwen3-30b-a3b.json", "olmoe-1b-7b.json", "mixtral-8x7b.json",
                           "tiny-qwen3-moe.json", "tiny-qwen2-moe.json", "tiny-olmoe.json"};
    for (size_t i = 0; i < MT_ARRAY_LEN(files); i++) {
        char path[512];
        snprintf(path, sizeof path, CONFIGS "%s", files[i]);
        mt_model_config c;
        load(path, &c);
        mt_plan p;
        cr_assert_eq(mt_plan_compute(&c, MT_PLAN_OPTS_OF(&o), &p), 0, "%s", mt_error_get());
        cr_expect_eq(p.model_params, mt_config_total_params(&c), "%s: the planner's model is the checkpoint's", files[i]);
        cr_expect_eq(p.frozen_bf16_gpu + p.frozen_quant_gpu, mt_config_total_params(&c), "%s: frozen %lld + %lld",
                     files[i], (long long)p.frozen_bf16_gpu, (long long)p.frozen_quant_gpu);
        if (c.shared_intermediate)  // the shared experts 4-bit with the experts (NF4 by default), their gates bf16
            cr_expect_geq(p.frozen_quant_gpu, mt_config_moe_layers(&c) * (mt_config_shared_expert_params(&c) - c.hidden),
                          "%s", files[i]);
    }
}

// With and without recomputation (--checkpointing full, the default the goldens use, and none)
// the same step gives the same loss and LoRA gradients: the replayed layer rebuilds the q/k norm,
// clip, bias and MLP activations exactly.
Test(family, recomputation_changes_nothing) {
    const char *dirs[] = {"f_qwen2_bias", "f_olmoe_clip", "f_qwen3_dense"};
    for (size_t i = 0; i < MT_ARRAY_LEN(dirs); i++) {
        char dir[512];
        snprintf(dir, sizeof dir, MT_REPO_ROOT "/tests/data/golden/%s", dirs[i]);
        mt_model m[2];
        mt_loss l[2];
        mt_backend *be = mt_backend_cpu_new();
        for (int k = 0; k < 2; k++) {
            mt_run_opts o;
            mt_run_opts_default(&o);
            o.mode = MT_MODE_LORA, o.lora_r = 4, o.lora_alpha = 8, o.quant = MT_QUANT_NONE;
            o.targets = MT_TARGET_EXPERTS | MT_TARGET_ATTN | MT_TARGET_GATE;
            o.checkpointing = k ? MT_CKPT_NONE : MT_CKPT_FULL;
            cr_assert_eq(mt_model_load(&m[k], be, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
            cr_assert_eq(mt_model_load_adapter(&m[k], dir), 0, "%s", mt_error_get());
            int32_t tok[16], lab[16];
            for (int t = 0; t < 16; t++) tok[t] = lab[t] = (t * 29 + 3) % (int)m[k].cfg.vocab;
            mt_batch b = {2, 8, tok, lab, NULL};
            mt_model_zero_grad(&m[k]);
            cr_assert_eq(mt_model_forward_train(&m[k], &b, &l[k]), 0);
            mt_model_backward(&m[k]);
        }
        cr_expect_eq(l[0].loss, l[1].loss, "%s: loss", dirs[i]);
        int compared = 0;
        for (int L = 0; L < m[0].cfg.layers; L++) {
            mt_layer *a = &m[0].layers[L], *b = &m[1].layers[L];
            mt_linear *la[] = {&a->q, &a->v, &a->gate, &a->mlp[0], &a->mlp[1], &a->w2[0]};
            mt_linear *lb[] = {&b->q, &b->v, &b->gate, &b->mlp[0], &b->mlp[1], &b->w2[0]};
            for (size_t j = 0; j < MT_ARRAY_LEN(la); j++) {
                if (!la[j]->lora) continue;
                cr_expect_eq(memcmp(la[j]->lora->da->data, lb[j]->lora->da->data, la[j]->lora->da->nbytes), 0,
                             "%s layer %d Linear %zu: dA differs", dirs[i], L, j);
                compared++;
            }
        }
        cr_expect_gt(compared, 4);
        mt_model_free(&m[0]), mt_model_free(&m[1]);
        mt_backend_free(be);
    }
}

// `moetrain train` end to end on a family with every part (Qwen2-MoE: biases, shared expert,
// dense layers), the 4-bit default base included: the planner's check, the load, the steps, the
// adapter under the family's names; then eval reads that adapter back.
Test(family, train_and_eval_from_the_command_line) {
    mt_model_config c;
    load(CONFIGS "tiny-qwen2-moe.json", &c);
    c.vocab = 300;  // the byte-level tokenizer's ids
    char cfg[512], out[16384];
    snprintf(cfg, sizeof cfg, "%s/q2.json", tmp);
    cr_assert_eq(mt_model_config_write(&c, cfg), 0, "%s", mt_error_get());
    cr_assert_eq(mt_test_run(out, sizeof out, "init --config %s --out %s/base --seed 3", cfg, tmp), 0, "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "train --model %s/base --data %s/scripts/interop/data.jsonl --out %s/run "
                             "--mode lora --r 4 --targets all --steps 2 --seq 32 --seed 5", tmp, MT_REPO_ROOT, tmp),
                 0, "%s", out);
    char path[600];
    snprintf(path, sizeof path, "%s/run/adapter/adapter_model.safetensors", tmp);
    mt_st_file f;
    cr_assert_eq(mt_st_file_open(&f, path), 0, "%s", mt_error_get());
    cr_expect_not_null(mt_st_file_find(&f, "base_model.model.model.layers.1.mlp.shared_expert.up_proj.lora_A.weight"));
    cr_expect_not_null(mt_st_file_find(&f, "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"));
    mt_st_file_close(&f);
    cr_assert_eq(mt_test_run(out, sizeof out, "eval --model %s/base --adapter %s/run/adapter --data "
                             "%s/scripts/interop/data.jsonl", tmp, tmp, MT_REPO_ROOT), 0, "%s", out);
    cr_expect(strstr(out, "loss="), "%s", out);
}
