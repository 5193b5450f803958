// Golden parity with transformers + PEFT (scripts/make_goldens.py): the CPU forward's logits and
// losses, and every LoRA, router and unfrozen gradient, on three tiny Mixtrals.
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/safetensors.h"
#include "model/mixtral.h"
#include "trainer/options.h"

#define GOLDEN MT_REPO_ROOT "/tests/data/golden/"

typedef struct {
    char dir[512];
    mt_st_file g;
    cJSON *meta;
    int B, S;
    int32_t *tokens, *labels, *mask;
} fixture;

static const mt_st_tensor *need(const fixture *fx, const char *name) {
    const mt_st_tensor *t = mt_st_file_find(&fx->g, name);
    cr_assert_not_null(t, "%s: golden tensor '%s' missing", fx->dir, name);
    return t;
}

static double scalar(const fixture *fx, const char *name) {
    const mt_st_tensor *t = need(fx, name);
    cr_assert_str_eq(t->dtype, "F64");
    double v;
    memcpy(&v, t->data, sizeof v);
    return v;
}

static void fixture_open(fixture *fx, const char *name) {
    memset(fx, 0, sizeof *fx);
    snprintf(fx->dir, sizeof fx->dir, GOLDEN "%s", name);
    char path[600];
    snprintf(path, sizeof path, "%s/golden.safetensors", fx->dir);
    cr_assert_eq(mt_st_file_open(&fx->g, path), 0, "%s", mt_error_get());
    cr_assert(fx->g.metadata_json && strstr(fx->g.metadata_json, "moetrain-golden"), "not a golden file");
    snprintf(path, sizeof path, "%s/meta.json", fx->dir);
    char *text;
    size_t len;
    cr_assert_eq(mt_read_file(path, 1 << 20, &text, &len), 0);
    fx->meta = cJSON_Parse(text);
    free(text);
    cr_assert_eq(cJSON_GetObjectItem(fx->meta, "version")->valueint, 1, "fixture format version");
    const mt_st_tensor *tok = need(fx, "tokens");
    fx->B = (int)tok->shape[0], fx->S = (int)tok->shape[1];
    size_t n = (size_t)fx->B * fx->S * sizeof(int32_t);
    fx->tokens = mt_xmalloc(n), fx->labels = mt_xmalloc(n), fx->mask = mt_xmalloc(n);
    memcpy(fx->tokens, tok->data, n);
    memcpy(fx->labels, need(fx, "labels")->data, n);
    memcpy(fx->mask, need(fx, "attention_mask")->data, n);
}

static void fixture_close(fixture *fx) {
    mt_st_file_close(&fx->g);
    cJSON_Delete(fx->meta);
    free(fx->tokens), free(fx->labels), free(fx->mask);
}

// max |got - want| / max |want| (absolute when want is all zero: an expert with no tokens)
static double rel_err(const float *got, const float *want, size_t n) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        diff = fmax(diff, fabs((double)got[i] - want[i]));
        scale = fmax(scale, fabs((double)want[i]));
    }
    return scale > 0 ? diff / scale : diff;
}

static void expect_close(const char *what, const float *got, const mt_st_tensor *want, double tol) {
    size_t n = want->nbytes / sizeof(float);
    double e = rel_err(got, want->data, n);
    cr_expect_leq(e, tol, "%s: relative error %.3g > %.1g", what, e, tol);
}

static void build(mt_model *m, mt_backend *be, const fixture *fx, mt_run_opts *o) {
    cr_assert_eq(mt_model_load(m, be, fx->dir, MT_MODEL_SPEC_OF(o)), 0, "%s", mt_error_get());
}

// The last step's logits (the loss never holds them whole: mt_model_logits computes them again).
static float *step_logits;

static void run_step(mt_model *m, const fixture *fx, mt_loss *loss) {
    mt_batch b = {fx->B, fx->S, fx->tokens, fx->labels, fx->mask};
    mt_model_zero_grad(m);
    cr_assert_eq(mt_model_forward(m, &b, loss), 0, "%s", mt_error_get());
    free(step_logits);
    int64_t T = (int64_t)fx->B * fx->S;
    step_logits = mt_xmalloc((size_t)(T * m->cfg.vocab) * sizeof(float));
    cr_assert_eq(mt_model_logits(m, 0, T, step_logits), 0, "%s", mt_error_get());
    mt_model_backward(m);
}

static void check_losses(const fixture *fx, const char *prefix, const mt_model *m, const mt_loss *l) {
    char name[64];
    struct { const char *key; double got; } v[] = {{"ce", l->ce}, {"aux", l->aux}, {"loss", l->loss}};
    for (size_t i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "%s.%s", prefix, v[i].key);
        double want = scalar(fx, name);
        cr_expect_leq(fabs(v[i].got - want) / fabs(want), 1e-4, "%s %s: %.8f vs transformers %.8f", fx->dir,
                      name, v[i].got, want);
    }
    // logits of real tokens (a padded query row is garbage in transformers' eager mask, unused)
    snprintf(name, sizeof name, "%s.logits", prefix);
    const mt_st_tensor *want = need(fx, name);
    int V = (int)m->cfg.vocab, T = fx->B * fx->S;
    const float *w = want->data, *got = step_logits;
    double diff = 0, scale = 0;
    for (int t = 0; t < T; t++)
        for (int j = 0; fx->mask[t] && j < V; j++) {
            diff = fmax(diff, fabs((double)got[(size_t)t * V + j] - w[(size_t)t * V + j]));
            scale = fmax(scale, fabs((double)w[(size_t)t * V + j]));
        }
    cr_expect_leq(diff / scale, 1e-4, "%s %s: relative error %.3g", fx->dir, name, diff / scale);
}

// Every "<prefix>.grad.base_model.model.<module>.lora_{A,B}.weight" against the model's LoRA grads.
static void check_lora_grads(const fixture *fx, const char *prefix, mt_model *m) {
    char head[64];
    int n = snprintf(head, sizeof head, "%s.grad.base_model.model.", prefix), checked = 0;
    for (size_t i = 0; i < fx->g.n_tensors; i++) {
        const mt_st_tensor *t = &fx->g.tensors[i];
        if (strncmp(t->name, head, (size_t)n) != 0) continue;
        char module[256];
        const char *rest = t->name + n, *tail = strstr(rest, ".lora_");
        memcpy(module, rest, (size_t)(tail - rest));
        module[tail - rest] = 0;
        mt_linear *l = mt_model_find_linear(m, module);
        cr_assert(l && l->lora, "%s: no LoRA on %s", fx->dir, module);
        const mt_tensor *g = tail[6] == 'A' ? l->lora->da : l->lora->db;
        cr_assert_eq(g->nbytes, t->nbytes, "%s: %s shape", fx->dir, t->name);
        expect_close(t->name, g->data, t, 1e-3);
        checked++;
    }
    cr_assert_gt(checked, 0);
}

// Every "<prefix>.grad.<module>.weight" against the model's full-precision weight grads.
static int check_weight_grads(const fixture *fx, const char *prefix, mt_model *m) {
    char head[64];
    int n = snprintf(head, sizeof head, "%s.grad.", prefix), checked = 0;
    for (size_t i = 0; i < fx->g.n_tensors; i++) {
        const mt_st_tensor *t = &fx->g.tensors[i];
        if (strncmp(t->name, head, (size_t)n) != 0) continue;
        char module[256];
        size_t len = strlen(t->name + n) - strlen(".weight");
        memcpy(module, t->name + n, len);
        module[len] = 0;
        mt_linear *l = mt_model_find_linear(m, module);
        cr_assert(l && l->dw, "%s: %s does not train in this mode", fx->dir, module);
        expect_close(t->name, l->dw->data, t, 1e-3);
        checked++;
    }
    return checked;
}

static uint64_t lora_grad_bytes(const mt_model *m) {
    uint64_t bytes = 0;
    for (int L = 0; L < m->cfg.layers; L++) {
        const mt_layer *ly = &m->layers[L];
        const mt_linear *ls[] = {&ly->q, &ly->k, &ly->v, &ly->o, &ly->gate, &ly->mlp[0], &ly->mlp[1], &ly->mlp[2]};
        for (int i = 0; i < 8; i++)
            if (ls[i]->lora) bytes += ls[i]->lora->da->nbytes + ls[i]->lora->db->nbytes;
        for (int e = 0; e < m->cfg.experts; e++) {
            const mt_linear *ex[] = {&ly->w1[e], &ly->w2[e], &ly->w3[e]};
            for (int i = 0; i < 3; i++)
                if (ex[i]->lora) bytes += ex[i]->lora->da->nbytes + ex[i]->lora->db->nbytes;
        }
    }
    return bytes;
}

static void lora_opts(mt_run_opts *o) {
    mt_run_opts_default(o);
    o->mode = MT_MODE_LORA;
    o->lora_r = 4;
    o->lora_alpha = 8;
    o->targets = MT_TARGET_EXPERTS | MT_TARGET_ATTN | MT_TARGET_GATE;
    o->quant = MT_QUANT_NONE;
}

static void lora_case(const char *name) {
    fixture fx;
    fixture_open(&fx, name);
    mt_backend *be = mt_backend_cpu_new();
    mt_run_opts o;
    lora_opts(&o);
    mt_model m;
    build(&m, be, &fx, &o);
    cr_assert_eq(mt_model_load_adapter(&m, fx.dir), 0, "%s", mt_error_get());
    mt_loss loss;
    run_step(&m, &fx, &loss);
    check_losses(&fx, "lora", &m, &loss);
    check_lora_grads(&fx, "lora", &m);
    // Frozen weights have no gradient buffers: the ledger's grad is exactly the LoRA grads.
    cr_expect_eq(be->ledger.cur[MT_MEM_GRAD], lora_grad_bytes(&m));
    mt_model_free(&m);
    cr_expect_eq(be->ledger.total_cur, 0, "everything the model took went back to the ledger");
    mt_backend_free(be);
    fixture_close(&fx);
}

static void mode_case(const char *name, mt_mode mode) {
    fixture fx;
    fixture_open(&fx, name);
    mt_backend *be = mt_backend_cpu_new();
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = mode;
    o.quant = MT_QUANT_NONE;
    if (mode == MT_MODE_UNFREEZE) {
        const cJSON *u = cJSON_GetObjectItem(fx.meta, "unfreeze"), *it;
        char layers[64] = "", experts[64] = "";
        cJSON_ArrayForEach(it, cJSON_GetObjectItem(u, "layers"))
            snprintf(layers + strlen(layers), sizeof layers - strlen(layers), "%s%d", *layers ? "," : "", it->valueint);
        cJSON_ArrayForEach(it, cJSON_GetObjectItem(u, "experts"))
            snprintf(experts + strlen(experts), sizeof experts - strlen(experts), "%s%d", *experts ? "," : "", it->valueint);
        cr_assert_eq(mt_index_set_parse(&o.layers, layers), 0);
        cr_assert_eq(mt_index_set_parse(&o.experts, experts), 0);
    }
    mt_model m;
    build(&m, be, &fx, &o);
    mt_loss loss;
    run_step(&m, &fx, &loss);
    const char *prefix = mode == MT_MODE_ROUTER ? "router" : "unfreeze";
    int checked = check_weight_grads(&fx, prefix, &m);
    cr_assert_gt(checked, 0);
    // and nothing else trains: the ledger's grad holds exactly the checked tensors
    uint64_t expect = 0;
    char head[32];
    int n = snprintf(head, sizeof head, "%s.grad.", prefix);
    for (size_t i = 0; i < fx.g.n_tensors; i++)
        if (strncmp(fx.g.tensors[i].name, head, (size_t)n) == 0) expect += fx.g.tensors[i].nbytes;
    cr_expect_eq(be->ledger.cur[MT_MEM_GRAD], expect);
    mt_model_free(&m);
    mt_backend_free(be);
    fixture_close(&fx);
}

Test(golden, lora_top2_gqa_padding_silent_expert) { lora_case("g1_top2_gqa_pad"); }
Test(golden, lora_top1_sliding_window) { lora_case("g2_top1_window"); }
Test(golden, lora_top3_three_layers) { lora_case("g3_top3"); }
Test(golden, router_top2_gqa_padding) { mode_case("g1_top2_gqa_pad", MT_MODE_ROUTER); }
Test(golden, router_top1_window) { mode_case("g2_top1_window", MT_MODE_ROUTER); }
Test(golden, router_top3) { mode_case("g3_top3", MT_MODE_ROUTER); }
Test(golden, unfreeze_top2_gqa_padding) { mode_case("g1_top2_gqa_pad", MT_MODE_UNFREEZE); }
Test(golden, unfreeze_top1_window) { mode_case("g2_top1_window", MT_MODE_UNFREEZE); }
Test(golden, unfreeze_top3) { mode_case("g3_top3", MT_MODE_UNFREEZE); }

Test(golden, silent_expert_gets_zero_tokens) {
    fixture fx;
    fixture_open(&fx, "g1_top2_gqa_pad");
    mt_backend *be = mt_backend_cpu_new();
    mt_run_opts o;
    lora_opts(&o);
    mt_model m;
    build(&m, be, &fx, &o);
    mt_loss loss;
    run_step(&m, &fx, &loss);
    const cJSON *se = cJSON_GetObjectItem(fx.meta, "silent_expert");
    int layer = cJSON_GetArrayItem(se, 0)->valueint, expert = cJSON_GetArrayItem(se, 1)->valueint;
    cr_expect_eq(m.kept[layer].counts[expert], 0, "the fixture's silent expert got tokens");
    cr_expect(isfinite(loss.aux));
    mt_model_free(&m);
    mt_backend_free(be);
    fixture_close(&fx);
}

// The frozen attention and expert Linears in NF4 (double quant, block 64): the same step against
// PyTorch run on bitsandbytes' dequantization of the same weights.
Test(golden, lora_nf4_base) {
    fixture fx;
    fixture_open(&fx, "g1_top2_gqa_pad");
    mt_backend *be = mt_backend_cpu_new();
    mt_run_opts o;
    lora_opts(&o);
    o.quant = MT_QUANT_NF4;
    o.double_quant = 1;
    o.quant_blocksize = 64;
    mt_model m;
    build(&m, be, &fx, &o);
    cr_assert_not_null(m.layers[0].w1[0].q, "expert weights are 4-bit");
    cr_assert_not_null(m.layers[0].q.q, "attention weights are 4-bit");
    cr_assert_eq(mt_model_load_adapter(&m, fx.dir), 0, "%s", mt_error_get());
    mt_loss loss;
    run_step(&m, &fx, &loss);
    check_losses(&fx, "nf4", &m, &loss);
    check_lora_grads(&fx, "nf4", &m);
    mt_model_free(&m);
    cr_expect_eq(be->ledger.total_cur, 0);
    mt_backend_free(be);
    fixture_close(&fx);
}

// Experts-only LoRA: the lowest trainable layer skips its experts' dx and its attention backward
// (model/backward.c: needs_of). Its gradients must equal a run that computes everything: the same
// model with LoRA on attention and router too, whose B = 0 leaves forward and backward unchanged.
static void set_expert_b(mt_model *m) {
    for (int L = 0; L < m->cfg.layers; L++)
        for (int e = 0; e < m->cfg.experts; e++) {
            mt_linear *ex[] = {&m->layers[L].w1[e], &m->layers[L].w2[e], &m->layers[L].w3[e]};
            for (int i = 0; i < 3; i++) {
                float *b = ex[i]->lora->b->data;
                for (int64_t j = 0; j < (int64_t)(ex[i]->lora->b->nbytes / sizeof(float)); j++) b[j] = 0.01f * (float)((j * 7 + L * 3 + e + i) % 13 - 6);
            }
        }
}

static void experts_only_case(const char *name) {
    fixture fx;
    fixture_open(&fx, name);
    mt_backend *be = mt_backend_cpu_new();
    mt_run_opts o;
    mt_model m[2];
    mt_loss loss[2];
    for (int i = 0; i < 2; i++) {
        lora_opts(&o);
        o.targets = i ? (MT_TARGET_EXPERTS | MT_TARGET_ATTN | MT_TARGET_GATE) : MT_TARGET_EXPERTS;
        build(&m[i], be, &fx, &o);
        set_expert_b(&m[i]);
        run_step(&m[i], &fx, &loss[i]);
    }
    cr_expect_eq(loss[0].loss, loss[1].loss);
    int checked = 0;
    for (int L = 0; L < m[0].cfg.layers; L++)
        for (int e = 0; e < m[0].cfg.experts; e++)
            for (int i = 0; i < 3; i++) {
                const mt_linear *a = i == 0 ? &m[0].layers[L].w1[e] : i == 1 ? &m[0].layers[L].w2[e] : &m[0].layers[L].w3[e];
                const mt_linear *b = i == 0 ? &m[1].layers[L].w1[e] : i == 1 ? &m[1].layers[L].w2[e] : &m[1].layers[L].w3[e];
                const mt_tensor *ga[] = {a->lora->da, a->lora->db}, *gb[] = {b->lora->da, b->lora->db};
                for (int j = 0; j < 2; j++) {
                    const float *x = ga[j]->data, *y = gb[j]->data;
                    double diff = 0, scale = 0;
                    for (int64_t n = 0; n < (int64_t)(ga[j]->nbytes / sizeof(float)); n++)
                        diff = fmax(diff, fabs((double)x[n] - y[n])), scale = fmax(scale, fabs((double)y[n]));
                    cr_expect_leq(diff, 1e-6 * scale, "%s layer %d expert %d linear %d %s: %.3g of %.3g", name, L, e, i,
                                  j ? "dB" : "dA", diff, scale);
                    checked += scale > 0;
                }
            }
    cr_expect_gt(checked, 0, "some expert gradient is non-zero");
    mt_model_free(&m[0]), mt_model_free(&m[1]);
    mt_backend_free(be);
    fixture_close(&fx);
}

Test(golden, lora_experts_only_skips_only_unneeded_gradients) {
    experts_only_case("g1_top2_gqa_pad");
    experts_only_case("g3_top3");
}

// ---------------------------------------------------------------------------------------------
// Other families (scripts/make_goldens.py --families, docs/families.md): Qwen3-MoE's per-head
// q/k norm with an explicit head_dim, OLMoE's whole-projection q/k norm and top-k weights
// without renormalising. LoRA on attention, experts (gate/up/down_proj) and router; router-only;
// the q/k norm weights' gradients (they train in --mode full: compared there).
Test(golden, family_lora_qwen3_moe) { lora_case("f_qwen3_moe"); }
Test(golden, family_lora_olmoe) { lora_case("f_olmoe"); }
Test(golden, family_router_qwen3_moe) { mode_case("f_qwen3_moe", MT_MODE_ROUTER); }
Test(golden, family_router_olmoe) { mode_case("f_olmoe", MT_MODE_ROUTER); }

// --mode full (every weight trains) against the fixture's runs where only the q/k norms, or only
// the dense MLPs and the shared expert with its gate, trained: those gradients, to 1e-3.
static void full_case(const char *name, int want_qk, int want_mlp, int want_bias) {
    fixture fx;
    fixture_open(&fx, name);
    mt_backend *be = mt_backend_cpu_new();
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = MT_MODE_FULL;
    o.quant = MT_QUANT_NONE;
    mt_model m;
    build(&m, be, &fx, &o);
    mt_loss loss;
    run_step(&m, &fx, &loss);
    check_losses(&fx, "base", &m, &loss);
    int qk = 0;
    for (size_t i = 0; i < fx.g.n_tensors; i++) {
        const mt_st_tensor *t = &fx.g.tensors[i];
        int L;
        char which;
        if (sscanf(t->name, "qknorm.grad.model.layers.%d.self_attn.%c_norm.weight", &L, &which) != 2) continue;
        cr_assert(L >= 0 && L < m.cfg.layers && (which == 'q' || which == 'k'), "%s", t->name);
        const mt_tensor *g = which == 'q' ? m.layers[L].dqn : m.layers[L].dkn;
        cr_assert_not_null(g, "%s: no gradient", t->name);
        cr_assert_eq(g->nbytes, t->nbytes, "%s: shape", t->name);
        expect_close(t->name, g->data, t, 1e-3);
        qk++;
    }
    cr_assert_eq(qk, want_qk ? 2 * m.cfg.layers : 0, "a q and a k norm per layer");
    int mlp = check_weight_grads(&fx, "mlp", &m);
    cr_assert_eq(mlp, want_mlp, "MLP and shared-expert Linears checked");
    int bias = 0;
    for (size_t i = 0; i < fx.g.n_tensors; i++) {
        const mt_st_tensor *t = &fx.g.tensors[i];
        int L;
        char which;
        if (sscanf(t->name, "bias.grad.model.layers.%d.self_attn.%c_proj.bias", &L, &which) != 2) continue;
        const char *p = strchr("qkvo", which);
        cr_assert(L >= 0 && L < m.cfg.layers && p, "%s", t->name);
        const mt_tensor *g = m.layers[L].dbias[p - "qkvo"];
        cr_assert_not_null(g, "%s: no gradient", t->name);
        cr_assert_eq(g->nbytes, t->nbytes, "%s: shape", t->name);
        expect_close(t->name, g->data, t, 1e-3);
        bias++;
    }
    cr_assert_eq(bias, want_bias, "attention biases checked");
    mt_model_free(&m);
    mt_backend_free(be);
    fixture_close(&fx);
}

Test(golden, family_qk_norm_grads_qwen3_moe) { full_case("f_qwen3_moe", 1, 0, 0); }
Test(golden, family_qk_norm_grads_olmoe) { full_case("f_olmoe", 1, 0, 0); }
// Qwen3-MoE with layer 1 dense: its gate/up/down_proj, and q/k norms everywhere.
Test(golden, family_lora_qwen3_dense_layer) { lora_case("f_qwen3_dense"); }
Test(golden, family_router_qwen3_dense_layer) { mode_case("f_qwen3_dense", MT_MODE_ROUTER); }
Test(golden, family_full_qwen3_dense_layer) { full_case("f_qwen3_dense", 1, 3, 0); }
// Qwen2-MoE: layers 0 and 2 dense (decoder_sparse_step 2), layer 1 MoE with the shared expert.
Test(golden, family_lora_qwen2_shared_expert) { lora_case("f_qwen2_shared"); }
Test(golden, family_router_qwen2_shared_expert) { mode_case("f_qwen2_shared", MT_MODE_ROUTER); }
Test(golden, family_full_qwen2_shared_expert) { full_case("f_qwen2_shared", 0, 3 + 3 + 3 + 1, 0); }
// Qwen2-MoE as released: q/k/v biases, a dense layer 0, layer 1 MoE with the shared expert.
Test(golden, family_lora_qwen2_biases) { lora_case("f_qwen2_bias"); }
Test(golden, family_router_qwen2_biases) { mode_case("f_qwen2_bias", MT_MODE_ROUTER); }
Test(golden, family_full_qwen2_biases) { full_case("f_qwen2_bias", 0, 3 + 3 + 1, 2 * 3); }
// OLMoE with clip_qkv cutting q, k (after their norms) and v, and q/k/v/o biases.
Test(golden, family_lora_olmoe_clip_biases) { lora_case("f_olmoe_clip"); }
Test(golden, family_router_olmoe_clip_biases) { mode_case("f_olmoe_clip", MT_MODE_ROUTER); }
Test(golden, family_full_olmoe_clip_biases) { full_case("f_olmoe_clip", 1, 0, 2 * 4); }
// Unfreeze of layer x expert subsets (the first and last expert of the last MoE layer) per family.
Test(golden, family_unfreeze_qwen3_moe) { mode_case("f_qwen3_moe", MT_MODE_UNFREEZE); }
Test(golden, family_unfreeze_olmoe) { mode_case("f_olmoe", MT_MODE_UNFREEZE); }
Test(golden, family_unfreeze_qwen3_dense_layer) { mode_case("f_qwen3_dense", MT_MODE_UNFREEZE); }
Test(golden, family_unfreeze_qwen2_shared_expert) { mode_case("f_qwen2_shared", MT_MODE_UNFREEZE); }
Test(golden, family_unfreeze_qwen2_biases) { mode_case("f_qwen2_bias", MT_MODE_UNFREEZE); }
Test(golden, family_unfreeze_olmoe_clip_biases) { mode_case("f_olmoe_clip", MT_MODE_UNFREEZE); }
