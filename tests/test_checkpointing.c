// Activation checkpointing with routing replay: the same loss and gradients as keeping every
// activation, bit for bit, for a fraction of the `act` memory.
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/common.h"
#include "model/config.h"
#include "model/mixtral.h"
#include "optim/optim.h"
#include "optim/params.h"
#include "quant/qweight.h"
#include "quant/quant.h"
#include "tests/fd.h"
#include "tests/test_util.h"
#include "trainer/options.h"

typedef struct { double loss; uint64_t act_peak, dequantized, expert_values; float *grads; size_t n; } run_result;

static void collect(mt_model *m, run_result *r) {
    // every LoRA gradient, in model order
    size_t cap = 0;
    r->n = 0;
    r->grads = NULL;
    for (int L = 0; L < m->cfg.layers; L++) {
        mt_layer *ly = &m->layers[L];
        for (int e = 0; e < m->cfg.experts; e++) {
            mt_linear *ls[] = {&ly->w1[e], &ly->w2[e], &ly->w3[e]};
            for (int i = 0; i < 3; i++) {
                mt_tensor *g[] = {ls[i]->lora->da, ls[i]->lora->db};
                for (int j = 0; j < 2; j++) {
                    size_t n = g[j]->nbytes / sizeof(float);
                    if (r->n + n > cap) r->grads = mt_xrealloc(r->grads, (cap = 2 * (r->n + n)) * sizeof(float));
                    memcpy(r->grads + r->n, g[j]->data, g[j]->nbytes);
                    r->n += n;
                }
            }
        }
        mt_tensor *gg[] = {ly->gate.lora->da, ly->gate.lora->db};
        for (int j = 0; j < 2; j++) {
            size_t n = gg[j]->nbytes / sizeof(float);
            if (r->n + n > cap) r->grads = mt_xrealloc(r->grads, (cap = 2 * (r->n + n)) * sizeof(float));
            memcpy(r->grads + r->n, gg[j]->data, gg[j]->nbytes);
            r->n += n;
        }
    }
}

static void run(const char *dir, mt_ckpt ckpt, mt_quant quant, run_result *r) {
    mt_backend *be = mt_backend_cpu_new();
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = MT_MODE_LORA;
    o.lora_r = 4;
    o.targets = MT_TARGET_EXPERTS | MT_TARGET_GATE;
    o.quant = quant;
    o.quant_targets = MT_QTARGET_EXPERTS;  // attention dense: the replay dequantizes nothing
    o.checkpointing = ckpt;
    mt_model m;
    cr_assert_eq(mt_model_load(&m, be, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    // B non-zero, so that A's gradients carry information
    for (int L = 0; L < m.cfg.layers; L++)
        for (int e = 0; e < m.cfg.experts; e++) {
            mt_linear *ls[] = {&m.layers[L].w1[e], &m.layers[L].w2[e], &m.layers[L].w3[e]};
            for (int i = 0; i < 3; i++) {
                float *b = ls[i]->lora->b->data;
                for (int64_t j = 0; j < ls[i]->out * 4; j++) b[j] = 0.01f * (float)((j * 7 + e + L) % 13 - 6);
            }
        }
    enum { B = 2, S = 24 };
    int32_t tokens[B * S], labels[B * S];
    for (int i = 0; i < B * S; i++) tokens[i] = labels[i] = (i * 37 + 11) % 256;
    mt_batch batch = {B, S, tokens, labels, NULL};
    mt_ledger_reset_peak(&be->ledger);
    mt_loss loss;
    mt_model_zero_grad(&m);
    uint64_t dq0 = mt_qweight_cpu_dequantized();
    cr_assert_eq(mt_model_forward(&m, &batch, &loss), 0);
    mt_model_backward(&m);
    r->dequantized = mt_qweight_cpu_dequantized() - dq0;
    r->expert_values = 0;  // w1, w2, w3 of every expert that got tokens
    for (int L = 0; L < m.cfg.layers; L++)
        for (int e = 0; e < m.cfg.experts; e++)
            if (m.kept[L].counts[e]) r->expert_values += 3 * (uint64_t)(m.cfg.intermediate * m.cfg.hidden);
    r->loss = loss.loss;
    r->act_peak = be->ledger.peak[MT_MEM_ACT];
    collect(&m, r);
    mt_model_free(&m);
    mt_backend_free(be);
}

// quant: the experts' base; a 4-bit one is dequantized once per expert for the backward's
// recompute and its gradients (model/experts.c), by tile in the first forward.
static void same_loss_and_gradients(mt_quant quant) {
    char tmp[64], out[4096], dir[128];
    mt_test_tmpdir(tmp, sizeof tmp);
    snprintf(dir, sizeof dir, "%s/tiny4", tmp);
    cr_assert_eq(mt_test_run(out, sizeof out, "init --config %s/tests/data/tiny4.json --out %s", MT_REPO_ROOT, dir), 0,
                 "%s", out);
    run_result full, none;
    run(dir, MT_CKPT_FULL, quant, &full);
    run(dir, MT_CKPT_NONE, quant, &none);
    cr_assert_eq(full.loss, none.loss, "loss %.17g vs %.17g", full.loss, none.loss);
    cr_assert_eq(full.n, none.n);
    size_t differ = 0;
    for (size_t i = 0; i < full.n; i++) differ += full.grads[i] != none.grads[i];
    cr_assert_eq(differ, 0, "%zu of %zu gradient elements differ", differ, full.n);
    double nonzero = 0;
    for (size_t i = 0; i < full.n; i++) nonzero += full.grads[i] != 0;
    cr_assert_gt(nonzero, full.n / 4, "the gradients carry information");
    // One dequantization of each 4-bit W serves the recompute and the backward: two per step for
    // every expert with tokens, as without recomputation (which needs no w1, w3 in the lowest layer).
    if (quant != MT_QUANT_NONE) {
        cr_assert_eq(full.dequantized, 2 * full.expert_values, "values dequantized with recomputation: %llu, not 2 x %llu",
                     (unsigned long long)full.dequantized, (unsigned long long)full.expert_values);
        cr_assert_leq(none.dequantized, full.dequantized);
    }
    cr_assert_geq((double)none.act_peak / full.act_peak, 3.0, "act peak %llu without vs %llu with recomputation",
                  (unsigned long long)none.act_peak, (unsigned long long)full.act_peak);
    cr_log_info("act peak: %llu bytes without, %llu with recomputation (%.2fx)", (unsigned long long)none.act_peak,
                (unsigned long long)full.act_peak, (double)none.act_peak / full.act_peak);
    free(full.grads), free(none.grads);
    mt_test_rmrf(tmp);
}

Test(checkpointing, same_loss_and_gradients_for_a_third_of_the_activations) { same_loss_and_gradients(MT_QUANT_NONE); }
Test(checkpointing, same_with_a_4bit_base_dequantized_once_for_recompute) { same_loss_and_gradients(MT_QUANT_NF4); }

// The cpu's router takes its top-k weight gradient from w2's input gradient (dy·ys = da·a / w,
// model/experts.c), so that the recomputing backward never forms ys again. That holds through
// w2's LoRA and its dropout: every gradient equals (to rounding) that of the way the GPU step
// takes it, from ys, with and without recomputation; and the router's against finite differences.
typedef struct { mt_model *m; mt_batch b; } fd_ctx;

static double fd_train_loss(void *ctx) {
    fd_ctx *c = ctx;
    mt_loss l;
    cr_assert_eq(mt_model_forward_train(c->m, &c->b, &l), 0, "%s", mt_error_get());
    return l.loss;
}

// A two-layer tiny4 with every expert chosen (no top-k switch under ±h), LoRA with dropout on the
// experts and the router, B ≠ 0 everywhere; one forward and backward of `batch`.
static void dropout_run(mt_model *m, mt_backend *be, mt_ckpt ckpt, int from_ys, const mt_batch *batch) {
    mt_model_config cfg;
    cr_assert_eq(mt_model_config_load(MT_REPO_ROOT "/tests/data/tiny4.json", &cfg), 0, "%s", mt_error_get());
    cfg.top_k = cfg.experts, cfg.layers = 2;
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = MT_MODE_LORA, o.lora_r = 4, o.lora_dropout = 0.3, o.quant = MT_QUANT_NONE;
    o.targets = MT_TARGET_EXPERTS | MT_TARGET_GATE;
    o.checkpointing = ckpt;
    cr_assert_eq(mt_model_build(m, be, &cfg, NULL, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    m->dweights_from_ys = from_ys;
    mt_param *p;
    int n = mt_model_params(m, &p);
    for (int i = 0; i < n; i++) {
        if (!strstr(p[i].name, "lora_B")) continue;
        float amp = strstr(p[i].name, ".gate.") ? 0.5f : 0.05f, *b = p[i].w->data;  // a router the loss feels
        for (int64_t j = 0; j < mt_tensor_numel(p[i].w); j++) b[j] = amp * sinf((float)(5 * j + 3 * i));
    }
    mt_params_free(p, n);
    mt_model_set_dropout_seed(m, 11, 0, 0);
    mt_loss l;
    mt_model_zero_grad(m);
    cr_assert_eq(mt_model_forward_train(m, batch, &l), 0);
    mt_model_backward(m);
}

Test(checkpointing, router_gradient_from_w2_input_gradient_with_lora_dropout) {
    static int32_t tok[16], lab[16];
    for (int t = 0; t < 16; t++) tok[t] = lab[t] = (t * 37 + 5) % 256;
    mt_batch batch = {2, 8, tok, lab, NULL};
    mt_backend *be = mt_backend_cpu_new();
    mt_model m, ref[2];
    dropout_run(&m, be, MT_CKPT_FULL, 0, &batch);
    dropout_run(&ref[0], be, MT_CKPT_NONE, 1, &batch);
    dropout_run(&ref[1], be, MT_CKPT_FULL, 1, &batch);  // ys recomputed for it
    mt_param *pm, *pr;
    int n = mt_model_params(&m, &pm), routers = 0;
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(mt_model_params(&ref[k], &pr), n);
        for (int i = 0; i < n; i++) {
            int64_t len = mt_tensor_numel(pm[i].g);
            const float *a = pm[i].g->data, *b = pr[i].g->data;
            double d2 = 0, r2 = 0;
            for (int64_t j = 0; j < len; j++) d2 += (double)(a[j] - b[j]) * (a[j] - b[j]), r2 += (double)b[j] * b[j];
            cr_assert_gt(r2, 0, "%s: a zero gradient tells nothing", pm[i].name);
            cr_expect_lt(sqrt(d2 / r2), 1e-5, "ref %d %s: relative L2 error %.3g", k, pm[i].name, sqrt(d2 / r2));
            routers += k == 0 && strstr(pm[i].name, ".gate.") != NULL;
        }
        mt_params_free(pr, n);
    }
    mt_params_free(pm, n);
    cr_assert_eq(routers, 2 * 2, "A and B of both layers' routers compared");
    fd_ctx c = {&m, batch};
    for (int L = 0; L < 2; L++) {  // fp32 loss differences resolve these only to ~1e-5
        const mt_lora *g = m.layers[L].gate.lora;
        fd_report r = fd_check_f32(fd_train_loss, &c, g->b->data, g->db->data, mt_tensor_numel(g->b), 1e-2f, 1e-4);
        cr_expect_lt(r.worst, 0.15, "layer %d router lora_B: " FD_FMT, L, FD_ARGS(r));
    }
    mt_model_free(&m), mt_model_free(&ref[0]), mt_model_free(&ref[1]);
    mt_backend_free(be);
}

// --recompute attention / experts: the backward recomputes one part of every layer (attention:
// ln1 to h; experts: ln2 onwards) and keeps the other. Every gradient of the model (LoRA on
// attention, the router and the experts, so both parts train) equals that of keeping everything,
// bit for bit: recomputation is deterministic on the cpu. Each selective mode keeps less than
// none and more than full.
typedef struct { double loss; uint64_t act_peak; float *g; size_t n; } mode_result;

static void mode_run(const char *dir, mt_ckpt ckpt, mt_quant quant, mode_result *r) {
    mt_backend *be = mt_backend_cpu_new();
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = MT_MODE_LORA, o.lora_r = 4, o.quant = quant, o.lora_dropout = 0.2;
    o.targets = MT_TARGET_EXPERTS | MT_TARGET_GATE | MT_TARGET_ATTN;
    o.checkpointing = ckpt;
    mt_model m;
    cr_assert_eq(mt_model_load(&m, be, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    mt_param *p;
    int n = mt_model_params(&m, &p);
    for (int i = 0; i < n; i++)  // B ≠ 0: A's gradients carry information
        if (strstr(p[i].name, "lora_B")) {
            float *b = p[i].w->data;
            for (int64_t j = 0; j < mt_tensor_numel(p[i].w); j++) b[j] = 0.02f * sinf((float)(3 * j + i));
        }
    mt_model_set_dropout_seed(&m, 5, 0, 0);
    enum { B = 2, S = 24 };
    int32_t tokens[B * S], labels[B * S];
    for (int i = 0; i < B * S; i++) tokens[i] = labels[i] = (i * 37 + 11) % 256;
    mt_batch batch = {B, S, tokens, labels, NULL};
    mt_ledger_reset_peak(&be->ledger);
    mt_loss loss;
    mt_model_zero_grad(&m);
    cr_assert_eq(mt_model_forward_train(&m, &batch, &loss), 0);
    mt_model_backward(&m);
    r->loss = loss.loss, r->act_peak = be->ledger.peak[MT_MEM_ACT], r->n = 0, r->g = NULL;
    for (int i = 0; i < n; i++) {
        size_t k = (size_t)mt_tensor_numel(p[i].g);
        r->g = mt_xrealloc(r->g, (r->n + k) * sizeof(float));
        memcpy(r->g + r->n, p[i].g->data, k * sizeof(float));
        r->n += k;
    }
    mt_params_free(p, n);
    mt_model_free(&m);
    mt_backend_free(be);
}

static void every_mode_as_none(mt_quant quant) {
    char tmp[64], out[4096], dir[128];
    mt_test_tmpdir(tmp, sizeof tmp);
    snprintf(dir, sizeof dir, "%s/tiny4", tmp);
    cr_assert_eq(mt_test_run(out, sizeof out, "init --config %s/tests/data/tiny4.json --out %s", MT_REPO_ROOT, dir), 0,
                 "%s", out);
    mode_result none, r[3];
    mt_ckpt modes[3] = {MT_CKPT_ATTENTION, MT_CKPT_EXPERTS, MT_CKPT_FULL};
    mode_run(dir, MT_CKPT_NONE, quant, &none);
    size_t nonzero = 0;
    for (size_t i = 0; i < none.n; i++) nonzero += none.g[i] != 0;
    cr_assert_gt(nonzero, none.n / 4, "the gradients carry information (%zu of %zu non-zero)", nonzero, none.n);
    for (int k = 0; k < 3; k++) {
        mode_run(dir, modes[k], quant, &r[k]);
        const char *name = mt_ckpt_name(modes[k]);
        cr_assert_eq(r[k].loss, none.loss, "%s: loss %.17g vs %.17g", name, r[k].loss, none.loss);
        cr_assert_eq(r[k].n, none.n);
        size_t differ = 0;
        for (size_t i = 0; i < none.n; i++) differ += memcmp(&r[k].g[i], &none.g[i], sizeof(float)) != 0;
        cr_assert_eq(differ, 0, "%s: %zu of %zu gradient elements differ from none's", name, differ, none.n);
        cr_log_info("%s: act peak %llu bytes (none %llu)", name, (unsigned long long)r[k].act_peak,
                    (unsigned long long)none.act_peak);
    }
    for (int k = 0; k < 2; k++) {
        cr_assert_lt(r[k].act_peak, none.act_peak, "%s keeps less than none", mt_ckpt_name(modes[k]));
        cr_assert_gt(r[k].act_peak, r[2].act_peak, "%s keeps more than full", mt_ckpt_name(modes[k]));
    }
    free(none.g);
    for (int k = 0; k < 3; k++) free(r[k].g);
    mt_test_rmrf(tmp);
}

Test(checkpointing, attention_and_experts_modes_give_none_gradients_bit_for_bit) { every_mode_as_none(MT_QUANT_NONE); }
Test(checkpointing, attention_and_experts_modes_with_a_4bit_base) { every_mode_as_none(MT_QUANT_NF4); }

// The flag and its aliases (YAML files and scripts written for --checkpointing keep working), and
// auto never reaching a model: the trainer and the planner resolve it.
Test(checkpointing, recompute_flag_aliases_and_auto_resolved_before_the_model) {
    struct { const char *argv[2]; mt_ckpt want; } ok[] = {
        {{"--recompute", "attention"}, MT_CKPT_ATTENTION}, {{"--recompute", "experts"}, MT_CKPT_EXPERTS},
        {{"--ckpt", "none"}, MT_CKPT_NONE}, {{"--checkpointing", "full"}, MT_CKPT_FULL},
        {{"--checkpointing", "experts"}, MT_CKPT_EXPERTS}, {{"--recompute", "auto"}, MT_CKPT_AUTO},
    };
    mt_run_opts o;
    for (size_t i = 0; i < MT_ARRAY_LEN(ok); i++) {
        mt_run_opts_default(&o);
        char *argv[2] = {(char *)ok[i].argv[0], (char *)ok[i].argv[1]};
        cr_assert_eq(mt_run_opts_parse(&o, 2, argv), 0, "%s %s: %s", argv[0], argv[1], mt_error_get());
        cr_expect_eq(o.checkpointing, ok[i].want, "%s %s", argv[0], argv[1]);
    }
    mt_run_opts_default(&o);
    cr_expect_eq(o.checkpointing, MT_CKPT_AUTO, "auto is the default");
    cr_expect_eq(mt_run_opts_model_spec(&o).checkpointing, MT_CKPT_FULL, "unresolved auto builds full");
    char *bad[2] = {"--recompute", "sometimes"};
    cr_expect_neq(mt_run_opts_parse(&o, 2, bad), 0);
    cr_expect(strstr(mt_error_get(), "none, attention, experts"), "%s", mt_error_get());
    mt_model_config cfg;
    cr_assert_eq(mt_model_config_load(MT_REPO_ROOT "/tests/data/tiny4.json", &cfg), 0, "%s", mt_error_get());
    mt_model_spec spec = mt_run_opts_model_spec(&o);
    spec.checkpointing = MT_CKPT_AUTO;
    mt_backend *be = mt_backend_cpu_new();
    mt_model m;
    cr_expect_neq(mt_model_build(&m, be, &cfg, NULL, &spec), 0, "a model refuses auto");
    cr_expect(strstr(mt_error_get(), "--recompute auto"), "%s", mt_error_get());
    mt_backend_free(be);
}
