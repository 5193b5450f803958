// DeepSeek-style families on the cpu step against transformers 5.24 (tests/data/golden/{glm4_moe,
// deepseek_v3,deepseek_v2}, made by scripts/make_deepseek_goldens.py): the sigmoid router with
// e_score_correction_bias and group-limited top-k (softmax and max-group for V2), the routed
// scaling, an ungated shared expert, a dense first layer, MLA (q_lora_rank or a plain q_proj, the
// latent norm, the shared rope key, interleaved RoPE, YaRN's mscale on the softmax scale) and
// GLM-4.5's per-head q/k norm, partial RoPE and q/k/v biases. Routing equal to transformers' token
// for token; logits and losses to 1e-4, LoRA and router-only gradients to 1e-3 (tests/test_golden.c's
// tolerances).
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/common.h"
#include "core/fileio.h"
#include "core/safetensors.h"
#include "lora/lora.h"
#include "model/mixtral.h"
#include "model/model_internal.h"
#include "moe/moe.h"
#include "optim/params.h"
#include "tests/golden_fixture.h"
#include "trainer/options.h"
#include "tests/test_util.h"

#define GOLDEN MT_REPO_ROOT "/tests/data/golden/"

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

// The experts every MoE layer chose, as sets per token, against transformers' (routing.ids.L).
static void expect_routing(const mt_model *m, const golden_fixture *fx) {
    int T = fx->B * fx->S, k = (int)m->cfg.top_k, checked = 0;
    for (int L = 0; L < m->cfg.layers; L++) {
        if (m->layers[L].dense) continue;
        char name[64];
        snprintf(name, sizeof name, "routing.ids.%d", L);
        const int32_t *want = golden_need(fx, name)->data;
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

static void model_open(mt_model *m, mt_backend *be, const char *dir, mt_mode mode) {
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = mode, o.lora_r = 4, o.lora_alpha = 8, o.quant = MT_QUANT_NONE;
    o.targets = MT_TARGET_EXPERTS | MT_TARGET_ATTN;
    cr_assert_eq(mt_model_load(m, be, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
}

// The fixture of `family` and its checkpoint loaded for `mode` on a cpu backend.
typedef struct {
    golden_fixture fx;
    mt_backend *be;
    mt_model m;
} family_case;

static void case_open(family_case *fc, const char *family, mt_mode mode) {
    char dir[256];
    snprintf(dir, sizeof dir, GOLDEN "%s", family);
    golden_open(&fc->fx, dir);
    fc->be = mt_backend_cpu_new();
    model_open(&fc->m, fc->be, dir, mode);
}

static void case_close(family_case *fc) {
    mt_model_free(&fc->m);
    cr_expect_eq(fc->be->ledger.total_cur, 0, "everything the model took went back to the ledger");
    mt_backend_free(fc->be);
    golden_close(&fc->fx);
}

static void lora_case(const char *family) {
    family_case fc;
    case_open(&fc, family, MT_MODE_LORA);
    int set = golden_set_lora(&fc.m, &fc.fx);
    cr_assert_gt(set, 0);
    golden_step(&fc.m, &fc.fx, "lora", 0);
    cr_assert_eq(golden_expect_lora_grads(&fc.m, &fc.fx, 1e-3), 2 * set);
    case_close(&fc);
}

static void router_case(const char *family) {
    family_case fc;
    case_open(&fc, family, MT_MODE_ROUTER);
    golden_step(&fc.m, &fc.fx, "base", 0);
    expect_routing(&fc.m, &fc.fx);
    for (int L = 0; L < fc.m.cfg.layers; L++) {
        if (fc.m.layers[L].dense) continue;
        char name[128], module[96];
        snprintf(module, sizeof module, "model.layers.%d.mlp.gate", L);
        mt_linear *l = mt_model_find_linear(&fc.m, module);
        cr_assert(l && l->dw, "layer %d: the router trains", L);
        snprintf(name, sizeof name, "router.grad.%s.weight", module);
        golden_expect_close(name, l->dw, golden_need(&fc.fx, name), 1e-3);
    }
    case_close(&fc);
}

// --mode full (every parameter) and --mode unfreeze (two layers' experts 0 and 4, and their
// routers): every trainable's gradient against autograd's of the base loss (golden full.grad.*, the
// fused experts' split per expert and projection), to 1e-3; full mode trains a tensor for each of
// transformers' parameters (each full.grad), unfreeze `want`.
static void full_case(const char *family, mt_mode mode, const char *layers, int want) {
    family_case fc;
    char dir[256];
    snprintf(dir, sizeof dir, GOLDEN "%s", family);
    golden_open(&fc.fx, dir);
    fc.be = mt_backend_cpu_new();
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = mode, o.quant = MT_QUANT_NONE;
    if (mode == MT_MODE_UNFREEZE)
        cr_assert(mt_index_set_parse(&o.layers, layers) == 0 && mt_index_set_parse(&o.experts, "0,4") == 0);
    cr_assert_eq(mt_model_load(&fc.m, fc.be, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    golden_step(&fc.m, &fc.fx, "base", 0);
    mt_param *p;
    int n = mt_model_params(&fc.m, &p);
    for (int i = 0; i < n; i++) {
        char key[200];
        snprintf(key, sizeof key, "full.grad.%s", p[i].name);
        golden_expect_close(p[i].name, p[i].g, golden_need(&fc.fx, key), 1e-3);
        if (mode == MT_MODE_UNFREEZE)
            cr_expect(strstr(p[i].name, ".experts.0.") || strstr(p[i].name, ".experts.4.") ||
                      strstr(p[i].name, ".mlp.gate.weight"), "%s trains", p[i].name);
    }
    if (mode == MT_MODE_FULL)
        for (size_t i = 0, pre = strlen("full.grad."); i < fc.fx.g.n_tensors; i++)
            want += !strncmp(fc.fx.g.tensors[i].name, "full.grad.", pre);
    cr_expect_eq(n, want, "%s: %d trainables, want %d", family, n, want);
    mt_params_free(p, n);
    case_close(&fc);
}

Test(deepseek, glm4_moe_full_mode_matches_transformers) { full_case("glm4_moe", MT_MODE_FULL, NULL, 0); }
Test(deepseek, deepseek_v3_full_mode_matches_transformers) { full_case("deepseek_v3", MT_MODE_FULL, NULL, 0); }
Test(deepseek, deepseek_v2_full_mode_matches_transformers) { full_case("deepseek_v2", MT_MODE_FULL, NULL, 0); }
Test(deepseek, glm4_moe_lite_full_mode_matches_transformers) { full_case("glm4_moe_lite", MT_MODE_FULL, NULL, 0); }
Test(deepseek, deepseek_v3_unfreeze_matches_transformers) { full_case("deepseek_v3", MT_MODE_UNFREEZE, "1,2", 14); }
Test(deepseek, glm4_moe_lite_unfreeze_matches_transformers) { full_case("glm4_moe_lite", MT_MODE_UNFREEZE, "1,3", 14); }

// GLM-4.7-Flash's fixture carries a multi-token-prediction layer past the last one (model.layers.4.*,
// num_nextn_predict_layers 1): skipped unread, and said. A config that does not declare it leaves
// those tensors no part of the model: ignored as transformers ignores them, with a warning naming one.
static void redirect_both(void) { cr_redirect_stdout(), cr_redirect_stderr(); }

// What the run printed to `f` (a redirected stream), into buf.
static const char *printed(FILE *f, char *buf, size_t n) {
    size_t got = fread(buf, 1, n - 1, f);
    buf[got] = 0;
    return buf;
}

Test(deepseek, mtp_layer_skipped_where_the_config_declares_it, .init = redirect_both) {
    family_case fc;
    case_open(&fc, "glm4_moe_lite", MT_MODE_LORA);
    cr_expect(fc.m.cfg.mtp_layers == 1 && fc.m.cfg.layers == 4);
    case_close(&fc);
    char tmp[256], path[320], *text;
    size_t len;
    mt_test_tmpdir(tmp, sizeof tmp);
    cr_assert_eq(mt_read_file(GOLDEN "glm4_moe_lite/config.json", 1 << 20, &text, &len), 0);
    char *at = strstr(text, "\"num_nextn_predict_layers\": 1");
    cr_assert(at);
    at[strlen("\"num_nextn_predict_layers\": ")] = '0';
    snprintf(path, sizeof path, "%s/config.json", tmp);
    cr_assert_eq(mt_write_file_atomic(path, text, len), 0);
    free(text);
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    cr_assert_eq(symlink(MT_REPO_ROOT "/tests/data/golden/glm4_moe_lite/model.safetensors", path), 0);
    mt_backend *be = mt_backend_cpu_new();
    mt_model m;
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = MT_MODE_LORA, o.quant = MT_QUANT_NONE;
    cr_assert_eq(mt_model_load(&m, be, tmp, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    mt_model_free(&m);
    mt_backend_free(be);
    mt_test_rmrf(tmp);
    fflush(stdout), fflush(stderr);
    char out[4096], err[4096];
    printed(cr_get_redirected_stdout(), out, sizeof out), printed(cr_get_redirected_stderr(), err, sizeof err);
    cr_expect(strstr(out, "9 tensors of the checkpoint's 1 multi-token-prediction layer(s) (model.layers.4 on) were "
                          "skipped"), "%s", out);
    cr_expect(strstr(err, "9 tensors of the checkpoint are no part of this glm4_moe_lite model and were ignored "
                          "(the first: model.layers.4."), "%s", err);
    cr_expect(!strstr(out, "no part of") && !strstr(err, "were skipped"), "each said once");
}

Test(deepseek, glm4_moe_lora) { lora_case("glm4_moe"); }
Test(deepseek, glm4_moe_router_and_routing) { router_case("glm4_moe"); }
Test(deepseek, glm4_moe_lite_lora) { lora_case("glm4_moe_lite"); }
Test(deepseek, glm4_moe_lite_router_and_routing) { router_case("glm4_moe_lite"); }
Test(deepseek, deepseek_v3_lora) { lora_case("deepseek_v3"); }
Test(deepseek, deepseek_v3_router_and_routing) { router_case("deepseek_v3"); }
Test(deepseek, deepseek_v2_lora) { lora_case("deepseek_v2"); }
Test(deepseek, deepseek_v2_router_and_routing) { router_case("deepseek_v2"); }

// Routing at near ties (golden ties.*, scripts/make_deepseek_goldens.py): router logits that
// transformers computed exactly (dyadic weights and inputs) whose experts, or whose groups' top-2
// sums, differ by one or two ulps of a score (9.5e-7), some where the correction bias turns the
// choice and (negbias) where biased scores go negative, so that a masked group must be left out
// rather than filled with 0. The cpu's rule on those logits chooses transformers' experts, row for
// row, with its weights to 1e-6.
static void *fixture_copy(const golden_fixture *fx, const char *name, int64_t *n) {
    const mt_st_tensor *t = golden_need(fx, name);
    void *v = mt_xmalloc(t->nbytes);
    memcpy(v, t->data, t->nbytes);  // an mmap'd tensor need not be aligned
    *n = (int64_t)(t->nbytes / 4);
    return v;
}

// The router's logits of prefix.hidden [T, H] by ties.router.weight [E, H], summed in double (the
// fixture's values are dyadic with few bits: exact in fp32 too).
static float *ties_logits(const family_case *fc, const char *prefix, int64_t *nl) {
    char name[96];
    int64_t nh, nwt, E = fc->m.cfg.experts, H = fc->m.cfg.hidden;
    snprintf(name, sizeof name, "%s.hidden", prefix);
    float *x = fixture_copy(&fc->fx, name, &nh), *w = fixture_copy(&fc->fx, "ties.router.weight", &nwt);
    cr_assert_eq(nwt, E * H, "ties.router.weight: %lld values", (long long)nwt);
    int64_t T = nh / H;
    float *logits = mt_xmalloc((size_t)(T * E) * sizeof(float));
    for (int64_t t = 0; t < T; t++)
        for (int64_t e = 0; e < E; e++) {
            double z = 0;
            for (int64_t h = 0; h < H; h++) z += (double)x[t * H + h] * w[e * H + h];
            logits[t * E + e] = (float)z;
        }
    free(x), free(w);
    *nl = T * E;
    return logits;
}

// How many of the T rows `rule` (with bias, or none) sends to transformers' experts, each chosen
// weight within 1e-6 of transformers' (expect: whether to report each difference).
static int rows_as_transformers(const float *logits, const float *bias, int T, int E, int k, moe_route_rule rule,
                                const int32_t *want_ids, const float *want_w, const char *what, int expect) {
    int32_t *ids = mt_xmalloc((size_t)T * k * sizeof(int32_t));
    float *w = mt_xmalloc((size_t)T * k * sizeof(float)), *scores = mt_xmalloc((size_t)T * E * sizeof(float));
    router_grouped_forward_cpu(ids, w, scores, logits, bias, T, E, k, rule);
    int same = 0;
    for (int t = 0; t < T; t++) {
        int row = 1;
        for (int j = 0; j < k; j++) {
            int found = -1;
            for (int i = 0; i < k; i++)
                if (want_ids[t * k + i] == ids[t * k + j]) found = i;
            int ok = found >= 0 && fabsf(w[t * k + j] - want_w[t * k + found]) <= 1e-6f * fabsf(want_w[t * k + found]);
            if (expect)
                cr_expect(ok, "%s row %d: expert %d (weight %.9g) %s", what, t, ids[t * k + j], w[t * k + j],
                          found < 0 ? "not chosen by transformers" : "with another weight in transformers");
            row &= ok;
        }
        same += row;
    }
    free(ids), free(w), free(scores);
    return same;
}

// The rows of prefix: every one routed as transformers did; and a rule that left out the bias, or
// (ties) scored groups the other way (max against top-2 sum), would route some other way.
static int ties_rows(const family_case *fc, const char *prefix) {
    const mt_model *m = &fc->m;
    char name[96];
    int E = (int)m->cfg.experts, k = (int)m->cfg.top_k;
    int64_t nl, ni, nw, nb = 0;
    float *logits = ties_logits(fc, prefix, &nl);
    if (!strcmp(prefix, "ties")) {  // the logits transformers computed: the same
        int64_t n;
        float *want = fixture_copy(&fc->fx, "ties.router_logits", &n);
        cr_assert_eq(n, nl);
        for (int64_t i = 0; i < n; i++) cr_expect_eq(logits[i], want[i], "ties logit %lld", (long long)i);
        free(want);
    }
    snprintf(name, sizeof name, "%s.ids.1", prefix);
    int32_t *want_ids = fixture_copy(&fc->fx, name, &ni);
    snprintf(name, sizeof name, "%s.weights.1", prefix);
    float *want_w = fixture_copy(&fc->fx, name, &nw);
    snprintf(name, sizeof name, "%s.router.e_score_correction_bias", prefix);
    float *bias = mt_st_file_find(&fc->fx.g, name) ? fixture_copy(&fc->fx, name, &nb) : NULL;
    int T = (int)(nl / E);
    cr_assert(T > 0 && ni == (int64_t)T * k && nw == ni && (!bias || nb == E), "%s: shapes", prefix);
    moe_route_rule rule = route_rule(m), other = rule;
    other.group_top2 = !rule.group_top2;
    cr_expect_eq(rows_as_transformers(logits, bias, T, E, k, rule, want_ids, want_w, prefix, 1), T);
    if (!strcmp(prefix, "ties")) {  // (negbias: rows where a masked group filled with 0 would win)
        int as_other = rows_as_transformers(logits, bias, T, E, k, other, want_ids, want_w, prefix, 0);
        cr_expect_lt(as_other, T, "%s: the group score's rule changes no row", prefix);
    }
    if (bias) {
        int unbiased = rows_as_transformers(logits, NULL, T, E, k, rule, want_ids, want_w, prefix, 0);
        cr_expect_lt(unbiased, T, "%s: the correction bias changes no row", prefix);
    }
    free(logits), free(want_ids), free(want_w), free(bias);
    return T;
}

static void ties_case(const char *family, int negbias) {
    family_case fc;
    case_open(&fc, family, MT_MODE_ROUTER);
    cr_expect_geq(ties_rows(&fc, "ties"), 12, "%s: near-tie rows", family);
    if (negbias) cr_expect_gt(ties_rows(&fc, "ties.negbias"), 0, "%s: negative biased scores", family);
    case_close(&fc);
}

Test(deepseek, glm4_moe_routing_at_near_ties) { ties_case("glm4_moe", 1); }
Test(deepseek, glm4_moe_lite_routing_at_near_ties) { ties_case("glm4_moe_lite", 1); }
Test(deepseek, deepseek_v3_routing_at_near_ties) { ties_case("deepseek_v3", 1); }
Test(deepseek, deepseek_v2_routing_at_near_ties) { ties_case("deepseek_v2", 0); }

// PEFT's own adapter of the fixture's LoRA factors (peft/: PEFT 0.21.2 on transformers 5.24, the
// experts fused through target_parameters with gate_up_proj at rank 2r, MLA's Linears by name),
// read by mt_model_load_adapter as eval --adapter does: the loss PEFT computed, to 1e-4.
static void peft_adapter_case(const char *family) {
    family_case fc;
    case_open(&fc, family, MT_MODE_LORA);
    char dir[256];
    snprintf(dir, sizeof dir, GOLDEN "%s/peft", family);
    cr_assert_eq(mt_model_load_adapter(&fc.m, dir), 0, "%s: %s", dir, mt_error_get());
    mt_batch b = {fc.fx.B, fc.fx.S, fc.fx.tokens, fc.fx.labels, fc.fx.mask};
    mt_loss l;
    cr_assert_eq(mt_model_forward(&fc.m, &b, &l), 0, "%s", mt_error_get());
    double want = *(const double *)golden_need(&fc.fx, "peft.loss")->data;
    double base = *(const double *)golden_need(&fc.fx, "base.loss")->data;
    cr_expect_gt(fabs(want - base), 1e-3 * base, "%s: the adapter moves the loss (%.8f, base %.8f)", family, want, base);
    cr_expect_leq(fabs(l.loss - want), 1e-4 * fabs(want), "%s: loss %.8f with PEFT's adapter, PEFT %.8f", family,
                  l.loss, want);
    case_close(&fc);
}

Test(deepseek, glm4_moe_peft_adapter) { peft_adapter_case("glm4_moe"); }
Test(deepseek, glm4_moe_lite_peft_adapter) { peft_adapter_case("glm4_moe_lite"); }
Test(deepseek, deepseek_v3_peft_adapter) { peft_adapter_case("deepseek_v3"); }
Test(deepseek, deepseek_v2_peft_adapter) { peft_adapter_case("deepseek_v2"); }
