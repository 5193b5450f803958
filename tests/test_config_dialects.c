// tests/test_config_dialects.c — config.json as transformers 4.57 and 5.x write it
// (tests/data/hf_configs/, made by scripts/make_config_fixtures.py): both dialects read as the
// same model with every value that matters; fields moetrain does not implement refused by name.
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/safetensors.h"
#include "model/config.h"
#include "model/mixtral.h"
#include "trainer/options.h"

#define FIXTURES MT_REPO_ROOT "/tests/data/hf_configs/"

static const char *const FAMILIES[] = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe"};
// Families whose config fixtures exist (gpt-oss's checkpoint goldens live in test_gpt_oss.c).
static const char *const CONFIG_FAMILIES[] = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss"};

static void load(const char *version, const char *family, mt_model_config *c) {
    char path[512];
    snprintf(path, sizeof path, FIXTURES "%s/%s.json", version, family);
    cr_assert_eq(mt_model_config_load(path, c), 0, "%s", mt_error_get());
}

// What scripts/make_config_fixtures.py put in every fixture, and per family.
Test(config_dialects, both_versions_read_every_value) {
    for (size_t f = 0; f < MT_ARRAY_LEN(CONFIG_FAMILIES); f++) {
        mt_model_config c4, c5;
        load("v4", CONFIG_FAMILIES[f], &c4);
        load("v5", CONFIG_FAMILIES[f], &c5);
        const mt_model_config *cs[2] = {&c4, &c5};
        for (int v = 0; v < 2; v++) {
            const mt_model_config *c = cs[v];
            const char *fam = CONFIG_FAMILIES[f];
            cr_assert_str_eq(c->model_type, fam);
            cr_assert_eq(c->experts, 6, "%s v%d: experts %lld", fam, 4 + v, (long long)c->experts);
            cr_assert_float_eq(c->rope_theta, 31337.0, 0, "%s v%d: rope_theta %g", fam, 4 + v, c->rope_theta);
            cr_assert(c->hidden == 48 && c->layers == 3 && c->heads == 6 && c->kv_heads == 2 && c->vocab == 300);
            cr_assert(c->top_k == 2 && c->max_positions == 640);
            cr_assert_float_eq(c->rms_norm_eps, 3e-6, 1e-18);
            cr_assert_float_eq(c->router_aux_loss_coef, 0.03, 1e-15);
            int mixtral = strcmp(fam, "mixtral") == 0, olmoe = strcmp(fam, "olmoe") == 0;
            int qwen2 = strcmp(fam, "qwen2_moe") == 0, qwen3 = strcmp(fam, "qwen3_moe") == 0;
            int oss = strcmp(fam, "gpt_oss") == 0;
            cr_assert_eq(c->head_dim, mixtral || qwen3 || oss ? 12 : 8, "%s v%d: head_dim %lld", fam, 4 + v,
                         (long long)c->head_dim);
            cr_assert_eq(c->intermediate, mixtral || olmoe || oss ? 40 : 20);
            cr_assert_eq(c->sliding_window, mixtral || oss ? 5 : 0, "%s v%d", fam, 4 + v);
            cr_assert_eq(c->rope_yarn, oss, "%s v%d", fam, 4 + v);
            if (oss) {  // per-layer windows, YaRN, the clamped SwiGLU, every attention bias
                cr_assert(c->has_layer_types && mt_config_layer_window(c, 0) == 5 && mt_config_layer_window(c, 1) == 0 &&
                          mt_config_layer_window(c, 2) == 5);
                cr_assert(c->rope_factor == 4.0 && c->rope_beta_fast == 16.0 && c->rope_beta_slow == 2.0 &&
                          c->rope_truncate == 1 && c->rope_original_max == 160 && c->rope_attention_factor == 0);
                cr_assert(c->swiglu_alpha == 1.5 && c->swiglu_limit == 6.5 && c->qkv_bias && c->o_bias);
            } else {
                cr_assert(!c->has_layer_types && mt_config_layer_window(c, 1) == c->sliding_window);
            }
            cr_assert_eq(c->norm_topk_prob, 1);
            if (qwen2) cr_assert(c->shared_intermediate == 36 && c->dense_intermediate == 56 && c->qkv_bias && !c->o_bias);
            if (qwen2) cr_assert(c->decoder_sparse_step == 2 && c->n_mlp_only == 1 && c->mlp_only_layers[0] == 0);
            if (qwen3) cr_assert(c->n_mlp_only == 1 && c->mlp_only_layers[0] == 1 && c->qkv_bias && c->o_bias);
            if (olmoe) cr_assert(c->clip_qkv == 4.5 && c->qkv_bias && c->o_bias);
        }
        // The two dialects describe one model: the structs agree field by field.
        cr_assert_eq(memcmp(&c4, &c5, sizeof c4), 0, "%s: the v4 and v5 configs read differently", FAMILIES[f]);
    }
}

// A config text with one field added to a fixture (before its closing brace).
static int parse_with(const char *version, const char *family, const char *field, mt_model_config *c) {
    char path[512], *text;
    size_t len;
    snprintf(path, sizeof path, FIXTURES "%s/%s.json", version, family);
    cr_assert_eq(mt_read_file(path, 1 << 20, &text, &len), 0, "%s", mt_error_get());
    char *end = strrchr(text, '}');
    cr_assert_not_null(end);
    char buf[8192];
    snprintf(buf, sizeof buf, "%.*s, %s}", (int)(end - text), text, field);
    free(text);
    return mt_model_config_parse(buf, strlen(buf), "x.json", c);
}

static void refused(const char *version, const char *family, const char *field, const char *want) {
    mt_model_config c;
    cr_assert_neq(parse_with(version, family, field, &c), 0, "%s %s: %s was accepted", version, family, field);
    cr_assert(strstr(mt_error_get(), want), "%s %s: %s: error '%s' does not name '%s'", version, family, field,
              mt_error_get(), want);
}

Test(config_dialects, what_changes_the_math_is_refused_by_name) {
    for (size_t f = 0; f < MT_ARRAY_LEN(CONFIG_FAMILIES); f++) {
        const char *fam = CONFIG_FAMILIES[f];
        int oss = strcmp(fam, "gpt_oss") == 0;
        // transformers 4's rope_scaling (added to the v5 fixture, which has none; a v4 one has
        // "rope_scaling": null for some families, and a second copy is refused as such).
        refused("v5", fam, "\"rope_scaling\": {\"rope_type\": \"longrope\", \"factor\": 4.0}", "rope_scaling.rope_type: 'longrope'");
        refused("v5", fam, "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0}", "rope_scaling and rope_parameters are both given");
        refused("v4", fam, "\"partial_rotary_factor\": 0.5", "partial_rotary_factor: 0.5");
        if (!oss)
            refused("v4", fam, "\"layer_types\": [\"full_attention\", \"sliding_attention\", \"full_attention\"]",
                    "layer_types[1]: 'sliding_attention'");

        refused("v4", fam, "\"rope_theta\": 10000.0", "appears twice");
        refused("v5", fam, "\"rope_theta\": 10000.0", "rope_theta (10000) and rope_parameters.rope_theta (31337) disagree");
        // The other name of the experts' count (the fixture has one), with another value.
        refused("v4", fam, f == 0 || oss ? "\"num_experts\": 7" : "\"num_local_experts\": 7", "disagree");
        refused("v4", fam, "\"hidden_act\": \"gelu\"", "hidden_act");
        refused("v4", fam, "\"attention_dropout\": 0.1", "attention_dropout");
        // A field moetrain has never heard of: refused, naming it and the way out.
        refused("v5", fam, "\"use_qk_l2norm\": true", "use_qk_l2norm: true is not a field moetrain knows");
        refused("v5", fam, "\"use_qk_l2norm\": true", "--allow-unknown-config");
        // ...and, with the switch, read with a warning.
        mt_model_config c;
        mt_config_allow_unknown(1);
        int rc = parse_with("v5", fam, "\"use_qk_l2norm\": true", &c);
        mt_config_allow_unknown(0);
        cr_assert_eq(rc, 0, "%s: --allow-unknown-config: %s", fam, mt_error_get());
    }
    // rope_parameters with anything beyond the default RoPE.
    refused("v5", "mixtral", "\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 1.0, \"factor\": 2.0}",
            "appears twice");
    mt_model_config c;
    const char *yarn = "{\"model_type\": \"mixtral\", \"hidden_size\": 48, \"intermediate_size\": 8, "
                       "\"num_hidden_layers\": 1, \"num_attention_heads\": 6, \"num_local_experts\": 2, "
                       "\"num_experts_per_tok\": 1, \"vocab_size\": 300, \"rope_parameters\": %s}";
    const char *bad[][2] = {
        {"{\"rope_type\": \"yarn\", \"rope_theta\": 1e6, \"low_freq_factor\": 1.0}", "rope_parameters.low_freq_factor: not understood"},
        {"{\"rope_type\": \"yarn\", \"factor\": -2.0}", "factor (-2) must be positive"},
        {"{\"rope_type\": \"dynamic\", \"factor\": 2.0}", "rope_parameters.rope_type: 'dynamic'"},
        {"{\"rope_type\": \"default\", \"rope_theta\": 1e6, \"factor\": 2.0}", "rope_parameters.factor: not understood"},
        {"{\"rope_type\": \"default\", \"partial_rotary_factor\": 0.25}", "rope_parameters.partial_rotary_factor: 0.25"},
        {"{\"full_attention\": {\"rope_type\": \"default\"}}", "rope_parameters.full_attention: not understood"},
        {"[1]", "rope_parameters: expected an object"},
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(bad); i++) {
        char buf[1024];
        snprintf(buf, sizeof buf, yarn, bad[i][0]);
        cr_assert_neq(mt_model_config_parse(buf, strlen(buf), "x.json", &c), 0, "%s accepted", bad[i][0]);
        cr_assert(strstr(mt_error_get(), bad[i][1]), "'%s' does not name '%s'", mt_error_get(), bad[i][1]);
    }
    // The default type spelled out, with or without a theta: the plain RoPE.
    char buf[1024];
    snprintf(buf, sizeof buf, yarn, "{\"rope_type\": \"default\"}");
    cr_assert_eq(mt_model_config_parse(buf, strlen(buf), "x.json", &c), 0, "%s", mt_error_get());
    cr_assert_float_eq(c.rope_theta, 1e6, 0, "Mixtral's default theta");
    // YaRN on any family, with transformers' defaults for what is absent; original_max_position_embeddings
    // absent is max_position_embeddings (Mixtral's class default, 131072).
    snprintf(buf, sizeof buf, yarn, "{\"rope_type\": \"yarn\", \"factor\": 2.0}");
    cr_assert_eq(mt_model_config_parse(buf, strlen(buf), "x.json", &c), 0, "%s", mt_error_get());
    cr_assert(c.rope_yarn && c.rope_factor == 2.0 && c.rope_beta_fast == 32.0 && c.rope_beta_slow == 1.0 &&
              c.rope_truncate == 1 && c.rope_original_max == 131072);
}

// gpt-oss without rope_parameters, layer_types and sliding_window: GptOssConfig's class defaults
// (YaRN factor 32 over 4096 positions, sliding on even layers, window 128); sliding_window null is
// no window.
Test(config_dialects, gpt_oss_class_defaults) {
    const char *text = "{\"model_type\": \"gpt_oss\", \"hidden_size\": 48, \"intermediate_size\": 8, "
                       "\"num_hidden_layers\": 4, \"num_attention_heads\": 6, \"num_local_experts\": 2, "
                       "\"num_experts_per_tok\": 1, \"vocab_size\": 300%s}";
    char buf[1024];
    mt_model_config c;
    snprintf(buf, sizeof buf, text, "");
    cr_assert_eq(mt_model_config_parse(buf, strlen(buf), "x.json", &c), 0, "%s", mt_error_get());
    cr_assert(c.rope_yarn && c.rope_factor == 32.0 && c.rope_truncate == 0 && c.rope_original_max == 4096);
    cr_assert(c.rope_theta == 150000.0 && c.sliding_window == 128 && c.qkv_bias && c.o_bias);
    cr_assert(c.swiglu_alpha == 1.702 && c.swiglu_limit == 7.0);
    cr_assert_eq(c.head_dim, 64, "GptOssConfig's head_dim is 64 whatever hidden / heads is");
    cr_assert(mt_config_layer_window(&c, 0) == 128 && mt_config_layer_window(&c, 1) == 0 &&
              mt_config_layer_window(&c, 2) == 128 && mt_config_layer_window(&c, 3) == 0);
    snprintf(buf, sizeof buf, text, ", \"sliding_window\": null");
    cr_assert_eq(mt_model_config_parse(buf, strlen(buf), "x.json", &c), 0, "%s", mt_error_get());
    cr_assert_eq(mt_config_layer_window(&c, 0), 0);
    snprintf(buf, sizeof buf, text, ", \"layer_types\": [\"full_attention\", \"chunked_attention\", \"full_attention\", "
                                    "\"full_attention\"]");
    cr_assert_neq(mt_model_config_parse(buf, strlen(buf), "x.json", &c), 0);
    cr_assert(strstr(mt_error_get(), "layer_types[1]: 'chunked_attention'"), "%s", mt_error_get());
    snprintf(buf, sizeof buf, text, ", \"swiglu_limit\": 0");
    cr_assert_neq(mt_model_config_parse(buf, strlen(buf), "x.json", &c), 0);
    cr_assert(strstr(mt_error_get(), "swiglu_limit"), "%s", mt_error_get());
}

// Fields transformers' modeling code of this family does not read: accepted whatever their value.
Test(config_dialects, fields_transformers_ignores_are_ignored) {
    mt_model_config c;
    cr_assert_eq(parse_with("v4", "olmoe", "\"sliding_window\": 16, \"mlp_only_layers\": [0]", &c), 0, "%s",
                 mt_error_get());
    cr_assert(c.sliding_window == 0 && c.n_mlp_only == 0, "OLMoE's attention has no window, its layers no dense MLP");
    cr_assert_eq(parse_with("v5", "mixtral", "\"attention_bias\": true, \"clip_qkv\": 2.0", &c), 0, "%s", mt_error_get());
    cr_assert(!c.qkv_bias && !c.o_bias && c.clip_qkv == 0);
    cr_assert_eq(parse_with("v5", "qwen3_moe", "\"max_window_layers\": 2, \"temperature\": 0.7", &c), 0, "%s",
                 mt_error_get());
}

// Checkpoints saved by transformers 4.57 and 5.x (scripts/make_dialect_goldens.py: the fixtures'
// configs, seeded weights saved in bf16): moetrain's fp32 CPU forward against transformers' logits.
Test(config_dialects, saved_checkpoints_give_transformers_logits) {
    const char *versions[] = {"v4", "v5"};
    mt_backend *be = mt_backend_cpu_new();
    for (size_t v = 0; v < MT_ARRAY_LEN(versions); v++)
        for (size_t f = 0; f < MT_ARRAY_LEN(FAMILIES); f++) {
            char dir[512], path[600];
            snprintf(dir, sizeof dir, MT_REPO_ROOT "/tests/data/hf_models/%s/%s", versions[v], FAMILIES[f]);
            snprintf(path, sizeof path, "%s/golden.safetensors", dir);
            mt_st_file g;
            cr_assert_eq(mt_st_file_open(&g, path), 0, "%s", mt_error_get());
            const mt_st_tensor *tok = mt_st_file_find(&g, "tokens"), *want = mt_st_file_find(&g, "logits");
            cr_assert(tok && want && tok->ndim == 2 && want->ndim == 3, "%s: tokens/logits missing", path);
            int B = (int)tok->shape[0], S = (int)tok->shape[1], T = B * S;
            int32_t *mask = mt_xmalloc((size_t)T * sizeof(int32_t));
            for (int i = 0; i < T; i++) mask[i] = 1;
            mt_run_opts o;
            mt_run_opts_default(&o);
            o.quant = MT_QUANT_NONE;
            mt_model m;
            cr_assert_eq(mt_model_load(&m, be, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
            mt_batch b = {B, S, (int32_t *)tok->data, (int32_t *)tok->data, mask};
            mt_loss l;
            cr_assert_eq(mt_model_forward(&m, &b, &l), 0, "%s", mt_error_get());
            int64_t V = m.cfg.vocab;
            cr_assert_eq(want->shape[2], V);
            float *got = mt_xmalloc((size_t)(T * V) * sizeof(float));
            cr_assert_eq(mt_model_logits(&m, 0, T, got), 0, "%s", mt_error_get());
            const float *w = want->data;
            double diff = 0, scale = 0;
            for (int64_t i = 0; i < T * V; i++) diff = fmax(diff, fabs((double)got[i] - w[i])), scale = fmax(scale, fabs(w[i]));
            cr_expect_leq(diff / scale, 1e-4, "%s %s: logits' relative error %.3g", versions[v], FAMILIES[f],
                          diff / scale);
            free(got), free(mask);
            mt_model_free(&m);
            mt_st_file_close(&g);
        }
    mt_backend_free(be);
}
