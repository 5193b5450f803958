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
#include "model/mixtral.h"
#include "quant/qweight.h"
#include "quant/quant.h"
#include "trainer/options.h"

#define DIR MT_REPO_ROOT "/tests/data/golden/gpt_oss"
#define DIR_MX MT_REPO_ROOT "/tests/data/golden/gpt_oss_mxfp4"

typedef struct {
    mt_st_file g;
    int B, S;
    int32_t *tokens, *labels, *mask;
} fixture;

static const mt_st_tensor *need(const fixture *fx, const char *name) {
    const mt_st_tensor *t = mt_st_file_find(&fx->g, name);
    cr_assert_not_null(t, "golden.safetensors lacks %s", name);
    return t;
}

static int32_t *ints(const fixture *fx, const char *name) {
    const mt_st_tensor *t = need(fx, name);
    int32_t *v = mt_xmalloc(t->nbytes);
    memcpy(v, t->data, t->nbytes);
    return v;
}

static void fixture_open_in(fixture *fx, const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/golden.safetensors", dir);
    cr_assert_eq(mt_st_file_open(&fx->g, path), 0, "%s", mt_error_get());
    const mt_st_tensor *t = need(fx, "tokens");
    fx->B = (int)t->shape[0], fx->S = (int)t->shape[1];
    fx->tokens = ints(fx, "tokens"), fx->labels = ints(fx, "labels"), fx->mask = ints(fx, "attention_mask");
}

static void fixture_open(fixture *fx) { fixture_open_in(fx, DIR); }

static void fixture_close(fixture *fx) {
    mt_st_file_close(&fx->g);
    free(fx->tokens), free(fx->labels), free(fx->mask);
}

static double rel_err(const float *got, const float *want, size_t n) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) diff = fmax(diff, fabs((double)got[i] - want[i])), scale = fmax(scale, fabs(want[i]));
    return scale > 0 ? diff / scale : diff;
}

static void expect_close(const char *what, const mt_tensor *got, const mt_st_tensor *want, double tol) {
    cr_assert_eq(got->nbytes, want->nbytes, "%s: %zu bytes, golden %zu", what, (size_t)got->nbytes, (size_t)want->nbytes);
    double e = rel_err(got->data, want->data, want->nbytes / sizeof(float));
    cr_expect_leq(e, tol, "%s: relative error %.3g > %.1g", what, e, tol);
}

// One step; the losses and the real tokens' logits against `prefix`'s.
static void step(mt_model *m, const fixture *fx, const char *prefix) {
    mt_batch b = {fx->B, fx->S, fx->tokens, fx->labels, fx->mask};
    mt_loss l;
    mt_model_zero_grad(m);
    cr_assert_eq(mt_model_forward(m, &b, &l), 0, "%s", mt_error_get());
    int T = fx->B * fx->S, V = (int)m->cfg.vocab;
    float *got = mt_xmalloc((size_t)T * V * sizeof(float));
    cr_assert_eq(mt_model_logits(m, 0, T, got), 0, "%s", mt_error_get());
    mt_model_backward(m);
    char name[64];
    struct { const char *key; double got; } v[] = {{"ce", l.ce}, {"aux", l.aux}, {"loss", l.loss}};
    for (size_t i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "%s.%s", prefix, v[i].key);
        double want = *(const double *)need(fx, name)->data;
        cr_expect_leq(fabs(v[i].got - want) / fabs(want), 1e-4, "%s: %.8f vs transformers %.8f", name, v[i].got, want);
    }
    snprintf(name, sizeof name, "%s.logits", prefix);
    const float *w = need(fx, name)->data;
    double diff = 0, scale = 0;
    for (int t = 0; t < T; t++)
        for (int j = 0; fx->mask[t] && j < V; j++)
            diff = fmax(diff, fabs((double)got[(size_t)t * V + j] - w[(size_t)t * V + j])),
            scale = fmax(scale, fabs((double)w[(size_t)t * V + j]));
    cr_expect_leq(diff / scale, 1e-4, "%s: relative error %.3g", name, diff / scale);
    free(got);
}

Test(gpt_oss, lora_matches_transformers) {
    fixture fx;
    fixture_open(&fx);
    mt_backend *be = mt_backend_cpu_new();
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = MT_MODE_LORA, o.lora_r = 4, o.lora_alpha = 8, o.quant = MT_QUANT_NONE;
    o.targets = MT_TARGET_EXPERTS | MT_TARGET_ATTN | MT_TARGET_GATE;
    mt_model m;
    cr_assert_eq(mt_model_load(&m, be, DIR, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    // The LoRA factors the fixture used, by moetrain's module names.
    int set = 0;
    for (size_t i = 0; i < fx.g.n_tensors; i++) {
        const mt_st_tensor *t = &fx.g.tensors[i];
        if (strncmp(t->name, "lora.A.", 7) != 0) continue;
        mt_linear *l = mt_model_find_linear(&m, t->name + 7);
        cr_assert(l && l->lora, "no LoRA on %s", t->name + 7);
        char bname[256];
        snprintf(bname, sizeof bname, "lora.B.%s", t->name + 7);
        const mt_st_tensor *tb = need(&fx, bname);
        cr_assert(l->lora->a->nbytes == t->nbytes && l->lora->b->nbytes == tb->nbytes, "%s: shapes", t->name + 7);
        memcpy(l->lora->a->data, t->data, t->nbytes);
        memcpy(l->lora->b->data, tb->data, tb->nbytes);
        set++;
    }
    cr_assert_eq(set, 3 * (4 + 1 + 3 * 6), "every q/k/v/o, router and expert projection has a LoRA");
    step(&m, &fx, "lora");
    int checked = 0;
    for (size_t i = 0; i < fx.g.n_tensors; i++) {
        const mt_st_tensor *t = &fx.g.tensors[i];
        int isa = strncmp(t->name, "lora.dA.", 8) == 0;
        if (!isa && strncmp(t->name, "lora.dB.", 8) != 0) continue;
        mt_linear *l = mt_model_find_linear(&m, t->name + 8);
        cr_assert(l && l->lora, "%s", t->name);
        expect_close(t->name, isa ? l->lora->da : l->lora->db, t, 1e-3);
        checked++;
    }
    cr_assert_eq(checked, 2 * set);
    mt_model_free(&m);
    cr_expect_eq(be->ledger.total_cur, 0, "everything the model took went back to the ledger");
    mt_backend_free(be);
    fixture_close(&fx);
}

// Router-only training of the checkpoint in `dir` (its experts dense, or MXFP4 kept as stored or
// dequantized on load as `quant` says) against transformers'.
static void router_case(const char *dir, mt_quant quant) {
    fixture fx;
    fixture_open_in(&fx, dir);
    mt_backend *be = mt_backend_cpu_new();
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = MT_MODE_ROUTER, o.quant = quant;
    o.quant_targets = MT_QTARGET_EXPERTS;  // attention stays as stored (dense), as in transformers
    mt_model m;
    cr_assert_eq(mt_model_load(&m, be, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    if (quant == MT_QUANT_MXFP4)  // the experts stay in the checkpoint's bytes
        cr_assert(m.layers[0].w1[0].q && m.layers[0].w1[0].q->type == MT_QUANT_MXFP4 && m.layers[2].w2[5].q);
    step(&m, &fx, "base");
    for (int L = 0; L < m.cfg.layers; L++) {
        char name[128], module[96];
        snprintf(module, sizeof module, "model.layers.%d.mlp.router", L);
        mt_linear *l = mt_model_find_linear(&m, module);
        cr_assert(l && l->dw && m.layers[L].dgate_bias, "layer %d: the router and its bias train", L);
        snprintf(name, sizeof name, "router.grad.%s.weight", module);
        expect_close(name, l->dw, need(&fx, name), 1e-3);
        snprintf(name, sizeof name, "router.grad.%s.bias", module);
        expect_close(name, m.layers[L].dgate_bias, need(&fx, name), 1e-3);
    }
    mt_model_free(&m);
    mt_backend_free(be);
    fixture_close(&fx);
}

Test(gpt_oss, router_only_matches_transformers) { router_case(DIR, MT_QUANT_NONE); }

// gpt-oss as OpenAI ships it: the experts' MXFP4 blocks and scales split per expert (gate/up rows
// de-interleaved) and kept as they are, or dequantized on load; both give transformers' result
// on its dequantization of the same bytes.
Test(gpt_oss, mxfp4_checkpoint_kept_as_stored) { router_case(DIR_MX, MT_QUANT_MXFP4); }
Test(gpt_oss, mxfp4_checkpoint_dequantized) { router_case(DIR_MX, MT_QUANT_NONE); }

// What is not written yet is refused by name, never run wrong.
Test(gpt_oss, unwritten_modes_are_refused) {
    mt_backend *be = mt_backend_cpu_new();
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.quant = MT_QUANT_NONE;
    mt_model m;
    mt_mode modes[] = {MT_MODE_FULL, MT_MODE_UNFREEZE};
    for (size_t i = 0; i < MT_ARRAY_LEN(modes); i++) {
        o.mode = modes[i];
        cr_assert_neq(mt_model_load(&m, be, DIR, MT_MODEL_SPEC_OF(&o)), 0, "--mode %s accepted", mt_mode_name(modes[i]));
        cr_assert(strstr(mt_error_get(), "fused"), "%s", mt_error_get());
    }
    mt_backend_free(be);
}
