// gpt-oss on the cpu step against transformers' GptOssForCausalLM (tests/data/golden/gpt_oss,
// made by scripts/make_gpt_oss_goldens.py): fused experts split on load, router and expert
// biases, the clamped SwiGLU (cutting about half its inputs), attention sinks, per-layer sliding
// and full attention, YaRN RoPE, a right-padded row. Logits and losses to 1e-4, every LoRA
// gradient (attention, router, each expert's gate/up/down) and the router-only gradients
// (weight and bias) to 1e-3, as for the other families (tests/test_golden.c).
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/backend.h"
#include "core/common.h"
#include "core/safetensors.h"
#include "lora/lora.h"
#include "model/fused_experts.h"
#include "model/mixtral.h"
#include "optim/params.h"
#include "quant/qweight.h"
#include "quant/quant.h"
#include "tests/golden_fixture.h"
#include "trainer/options.h"

#define DIR MT_REPO_ROOT "/tests/data/golden/gpt_oss"
#define DIR_MX MT_REPO_ROOT "/tests/data/golden/gpt_oss_mxfp4"

Test(gpt_oss, lora_matches_transformers) {
    golden_fixture fx;
    golden_open(&fx, DIR);
    mt_backend *be = mt_backend_cpu_new();
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = MT_MODE_LORA, o.lora_r = 4, o.lora_alpha = 8, o.quant = MT_QUANT_NONE;
    o.targets = MT_TARGET_EXPERTS | MT_TARGET_ATTN | MT_TARGET_GATE;
    mt_model m;
    cr_assert_eq(mt_model_load(&m, be, DIR, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    int set = golden_set_lora(&m, &fx);  // the LoRA factors the fixture used, by moetrain's module names
    cr_assert_eq(set, 3 * (4 + 1 + 3 * 6), "every q/k/v/o, router and expert projection has a LoRA");
    golden_step(&m, &fx, "lora", 1);
    int checked = golden_expect_lora_grads(&m, &fx, 1e-3);
    cr_assert_eq(checked, 2 * set);
    mt_model_free(&m);
    cr_expect_eq(be->ledger.total_cur, 0, "everything the model took went back to the ledger");
    mt_backend_free(be);
    golden_close(&fx);
}

// The fixture's full.grad of trainable `name` in moetrain's layout, into buf: an expert's Linear
// ("....experts.E.gate_proj.weight") split out of the fused gradient as the loader splits the
// weights, an expert bias ("....experts.gate_proj_bias", [E, f]) de-interleaved, else as named.
static const float *full_grad(const golden_fixture *fx, const char *name, int64_t H, int64_t f, float *buf) {
    char key[200], leaf[32];
    const char *at = strstr(name, ".experts.");
    int e, len = 0, pre = at ? (int)(at - name) : 0;
    static const char *const leaves[3] = {"gate_proj", "down_proj", "up_proj"};
    if (at && sscanf(at, ".experts.%d.%31[a-z_].weight%n", &e, leaf, &len) == 2 && !at[len]) {
        int which = !strcmp(leaf, "down_proj") ? 1 : !strcmp(leaf, "up_proj") ? 2 : 0;
        snprintf(key, sizeof key, "full.grad.%.*s.experts.%s", pre, name, which == 1 ? "down_proj" : "gate_up_proj");
        mt_fused_part p = mt_fused_part_of(which, H, f);
        mt_fused_get((const float *)golden_need(fx, key)->data + e * p.rows * p.in, p, buf);
        return buf;
    }
    for (int which = 0; at && which < 3; which++) {
        char bias[48];
        snprintf(bias, sizeof bias, ".experts.%s_bias", leaves[which]);
        if (strcmp(at, bias) != 0) continue;
        snprintf(key, sizeof key, "full.grad.%.*s.experts.%s", pre, name, which == 1 ? "down_proj_bias" : "gate_up_proj_bias");
        const float *g = golden_need(fx, key)->data;
        int64_t E = 6, w = which == 1 ? H : f;
        for (int64_t x = 0; x < E; x++)
            for (int64_t j = 0; j < w; j++) buf[x * w + j] = which == 1 ? g[x * H + j] : g[x * 2 * f + 2 * j + (which == 2)];
        return buf;
    }
    snprintf(key, sizeof key, "full.grad.%s", name);
    return golden_need(fx, key)->data;
}

// --mode full: every parameter's gradient against autograd's, the fused experts' weights and
// biases split per expert and projection.
Test(gpt_oss, full_mode_matches_transformers) {
    golden_fixture fx;
    golden_open(&fx, DIR);
    mt_backend *be = mt_backend_cpu_new();
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = MT_MODE_FULL, o.quant = MT_QUANT_NONE;
    mt_model m;
    cr_assert_eq(mt_model_load(&m, be, DIR, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    golden_step(&m, &fx, "base", 1);
    mt_param *p;
    int n = mt_model_params(&m, &p), experts = 0, biases = 0;
    float *buf = malloc((size_t)(m.cfg.hidden * m.cfg.intermediate * m.cfg.experts) * sizeof(float));
    for (int i = 0; i < n; i++) {
        const float *want = full_grad(&fx, p[i].name, m.cfg.hidden, m.cfg.intermediate, buf);
        mt_st_tensor t = {.data = want, .nbytes = p[i].g->nbytes};
        golden_expect_close(p[i].name, p[i].g, &t, 1e-3);
        experts += strstr(p[i].name, ".experts.") && !strstr(p[i].name, "_bias");
        biases += strstr(p[i].name, "_bias") != NULL;
    }
    cr_expect_eq(experts, 3 * 6 * 3, "every expert's gate, up and down trains");
    cr_expect_eq(biases, 3 * 3, "each layer's three expert biases train");
    cr_expect_eq(n, 1 + 3 * (2 + 4 + 4 + 1 + 2 + 3 + 18) + 2, "every parameter of the model");
    mt_params_free(p, n);
    free(buf);
    mt_model_free(&m);
    mt_backend_free(be);
    golden_close(&fx);
}

// Router-only training of the checkpoint in `dir` (its experts dense, or MXFP4 kept as stored or
// dequantized on load as `quant` says) against transformers'.
static void router_case(const char *dir, mt_quant quant) {
    golden_fixture fx;
    golden_open(&fx, dir);
    mt_backend *be = mt_backend_cpu_new();
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = MT_MODE_ROUTER, o.quant = quant;
    o.quant_targets = MT_QTARGET_EXPERTS;  // attention stays as stored (dense), as in transformers
    mt_model m;
    cr_assert_eq(mt_model_load(&m, be, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    if (quant == MT_QUANT_MXFP4)  // the experts stay in the checkpoint's bytes
        cr_assert(m.layers[0].w1[0].q && m.layers[0].w1[0].q->type == MT_QUANT_MXFP4 && m.layers[2].w2[5].q);
    golden_step(&m, &fx, "base", 1);
    for (int L = 0; L < m.cfg.layers; L++) {
        char name[128], module[96];
        snprintf(module, sizeof module, "model.layers.%d.mlp.router", L);
        mt_linear *l = mt_model_find_linear(&m, module);
        cr_assert(l && l->dw && m.layers[L].dgate_bias, "layer %d: the router and its bias train", L);
        snprintf(name, sizeof name, "router.grad.%s.weight", module);
        golden_expect_close(name, l->dw, golden_need(&fx, name), 1e-3);
        snprintf(name, sizeof name, "router.grad.%s.bias", module);
        golden_expect_close(name, m.layers[L].dgate_bias, golden_need(&fx, name), 1e-3);
    }
    mt_model_free(&m);
    mt_backend_free(be);
    golden_close(&fx);
}

Test(gpt_oss, router_only_matches_transformers) { router_case(DIR, MT_QUANT_NONE); }

// gpt-oss as OpenAI ships it: the experts' MXFP4 blocks and scales split per expert (gate/up rows
// de-interleaved) and kept as they are, or dequantized on load; both give transformers' result
// on its dequantization of the same bytes.
Test(gpt_oss, mxfp4_checkpoint_kept_as_stored) { router_case(DIR_MX, MT_QUANT_MXFP4); }
Test(gpt_oss, mxfp4_checkpoint_dequantized) { router_case(DIR_MX, MT_QUANT_NONE); }

// What is not written yet is refused by name, never run wrong.
// The expert biases are one tensor a layer: full mode does not split them across EP ranks.
Test(gpt_oss, full_mode_with_expert_parallelism_is_refused) {
    mt_backend *be = mt_backend_cpu_new();
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.quant = MT_QUANT_NONE, o.mode = MT_MODE_FULL;
    mt_model_config cfg;
    cr_assert_eq(mt_model_config_load(DIR, &cfg), 0);
    mt_model m;
    mt_model_par par = {.ep_rank = 0, .ep_size = 2};
    cr_assert_neq(mt_model_build_par(&m, be, &cfg, DIR, MT_MODEL_SPEC_OF(&o), &par), 0, "--mode full --ep 2 accepted");
    cr_assert(strstr(mt_error_get(), "--mode full with --ep 2"), "%s", mt_error_get());
    mt_backend_free(be);
}
