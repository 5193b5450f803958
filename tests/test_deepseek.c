// DeepSeek-style families on the cpu step against transformers 5.24 (tests/data/golden/{glm4_moe,
// deepseek_v3,deepseek_v2}, made by scripts/make_deepseek_goldens.py): the sigmoid router with
// e_score_correction_bias and group-limited top-k (softmax and max-group for V2), the routed
// scaling, an ungated shared expert, a dense first layer, MLA (q_lora_rank or a plain q_proj, the
// latent norm, the shared rope key, interleaved RoPE, YaRN's mscale on the softmax scale) and
// GLM-4.5's per-head q/k norm, partial RoPE and q/k/v biases. Routing equal to transformers' token
// for token; logits and losses to 1e-4, LoRA and router-only gradients to 1e-3 (tests/test_golden.c's
// tolerances).
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/common.h"
#include "core/safetensors.h"
#include "lora/lora.h"
#include "model/mixtral.h"
#include "trainer/options.h"

#define GOLDEN MT_REPO_ROOT "/tests/data/golden/"

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

static void fixture_open(fixture *fx, const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/golden.safetensors", dir);
    cr_assert_eq(mt_st_file_open(&fx->g, path), 0, "%s", mt_error_get());
    const mt_st_tensor *t = need(fx, "tokens");
    fx->B = (int)t->shape[0], fx->S = (int)t->shape[1];
    fx->tokens = ints(fx, "tokens"), fx->labels = ints(fx, "labels"), fx->mask = ints(fx, "attention_mask");
}

static void fixture_close(fixture *fx) {
    mt_st_file_close(&fx->g);
    free(fx->tokens), free(fx->labels), free(fx->mask);
}

static void expect_close(const char *what, const mt_tensor *got, const mt_st_tensor *want, double tol) {
    cr_assert_eq(got->nbytes, want->nbytes, "%s: %zu bytes, golden %zu", what, (size_t)got->nbytes, (size_t)want->nbytes);
    const float *g = got->data, *w = want->data;
    double diff = 0, scale = 0;
    for (size_t i = 0; i < want->nbytes / sizeof(float); i++)
        diff = fmax(diff, fabs((double)g[i] - w[i])), scale = fmax(scale, fabs((double)w[i]));
    double e = scale > 0 ? diff / scale : diff;
    cr_expect_leq(e, tol, "%s: relative error %.3g > %.1g", what, e, tol);
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

// The experts every MoE layer chose, as sets per token, against transformers' (routing.ids.L).
static void expect_routing(const mt_model *m, const fixture *fx) {
    int T = fx->B * fx->S, k = (int)m->cfg.top_k, checked = 0;
    for (int L = 0; L < m->cfg.layers; L++) {
        if (m->layers[L].dense) continue;
        char name[64];
        snprintf(name, sizeof name, "routing.ids.%d", L);
        const int32_t *want = need(fx, name)->data;
        int32_t got[64];
        for (int t = 0; t < T; t++) {
            if (!fx->mask[t]) continue;  // a padded row's hidden state is nobody's to match
            memcpy(got, (const int32_t *)m->kept[L].ids->data + (size_t)t * k, (size_t)k * sizeof(int32_t));
            qsort(got, (size_t)k, sizeof(int32_t), cmp_i32);
            for (int j = 0; j < k; j++)
                cr_expect_eq(got[j], want[t * k + j], "layer %d token %d choice %d: expert %d, transformers %d", L, t,
                             j, got[j], want[t * k + j]);
        }
        checked++;
    }
    cr_assert_gt(checked, 0);
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
    snprintf(name, sizeof name, "%s.ce", prefix);
    double want = *(const double *)need(fx, name)->data;
    cr_expect_leq(fabs(l.ce - want) / fabs(want), 1e-4, "%s: %.8f vs transformers %.8f", name, l.ce, want);
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

static void model_open(mt_model *m, mt_backend *be, const char *dir, mt_mode mode) {
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = mode, o.lora_r = 4, o.lora_alpha = 8, o.quant = MT_QUANT_NONE;
    o.targets = MT_TARGET_EXPERTS | MT_TARGET_ATTN;
    cr_assert_eq(mt_model_load(m, be, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
}

static void lora_case(const char *family) {
    char dir[256];
    snprintf(dir, sizeof dir, GOLDEN "%s", family);
    fixture fx;
    fixture_open(&fx, dir);
    mt_backend *be = mt_backend_cpu_new();
    mt_model m;
    model_open(&m, be, dir, MT_MODE_LORA);
    int set = 0;  // the LoRA factors the fixture used, by module name
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
    cr_assert_gt(set, 0);
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

static void router_case(const char *family) {
    char dir[256];
    snprintf(dir, sizeof dir, GOLDEN "%s", family);
    fixture fx;
    fixture_open(&fx, dir);
    mt_backend *be = mt_backend_cpu_new();
    mt_model m;
    model_open(&m, be, dir, MT_MODE_ROUTER);
    step(&m, &fx, "base");
    expect_routing(&m, &fx);
    for (int L = 0; L < m.cfg.layers; L++) {
        if (m.layers[L].dense) continue;
        char name[128], module[96];
        snprintf(module, sizeof module, "model.layers.%d.mlp.gate", L);
        mt_linear *l = mt_model_find_linear(&m, module);
        cr_assert(l && l->dw, "layer %d: the router trains", L);
        snprintf(name, sizeof name, "router.grad.%s.weight", module);
        expect_close(name, l->dw, need(&fx, name), 1e-3);
    }
    mt_model_free(&m);
    mt_backend_free(be);
    fixture_close(&fx);
}

Test(deepseek, glm4_moe_lora) { lora_case("glm4_moe"); }
Test(deepseek, glm4_moe_router_and_routing) { router_case("glm4_moe"); }
Test(deepseek, deepseek_v3_lora) { lora_case("deepseek_v3"); }
Test(deepseek, deepseek_v3_router_and_routing) { router_case("deepseek_v3"); }
Test(deepseek, deepseek_v2_lora) { lora_case("deepseek_v2"); }
Test(deepseek, deepseek_v2_router_and_routing) { router_case("deepseek_v2"); }
