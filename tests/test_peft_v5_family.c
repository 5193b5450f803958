// tests/test_peft_v5_family.c — the transformers 5 adapter layout of Qwen2-MoE, Qwen3-MoE and
// OLMoE (docs/families.md "Adapters"): a two-layer model of 2 experts, r 1, with every kind of
// Linear the family has, written through mt_peft_write_v5 under the family table's names. The
// fused expert tensors are checked against values worked out by hand, the names and
// adapter_config.json's target lists against transformers 5's modules, and reading the folder
// back gives every module's A and B bit for bit.
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <string.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/safetensors.h"
#include "lora/peft.h"
#include "model/family.h"
#include "test_util.h"

enum { H = 2, I = 3, E = 2, MAXM = 40 };

typedef struct {
    int n;                         // Linears of the model
    char name[MAXM][96];
    int64_t in[MAXM], out[MAXM];
    unsigned char adapted[MAXM];
    float a[MAXM][8], b[MAXM][8];  // r = 1: A [1, in], B [out, 1]
} toy;

static int add(toy *t, const char *name, int64_t in, int64_t out, int adapted) {
    cr_assert_lt(t->n, MAXM);
    int i = t->n++;
    snprintf(t->name[i], sizeof t->name[i], "%s", name);
    t->in[i] = in, t->out[i] = out, t->adapted[i] = (unsigned char)adapted;
    return i;
}

// Layer 0 dense when the family has dense layers, else MoE; layer 1 MoE, with the shared expert
// when the family has one. Adapted: q_proj, the dense MLP and shared expert, the router, every
// expert; not: k/v/o_proj, the shared expert's gate, lm_head. Expert e's projection p (0 gate,
// 1 down, 2 up) has A[j] = 100(e+1) + 10(p+1) + j and B[i] = -(100(e+1) + 10(p+1) + i); other
// modules 1000 + 10·index + j and their negatives.
static void toy_build(toy *t, const mt_family *f) {
    memset(t, 0, sizeof *t);
    char s[96];
    for (int L = 0; L < 2; L++) {
        static const char *attn[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
        for (int k = 0; k < 4; k++) snprintf(s, sizeof s, "model.layers.%d.self_attn.%s", L, attn[k]), add(t, s, H, H, k == 0);
        int dense = L == 0 && (f->has_dense_layers || f->first_k_dense);
        if (dense || (L == 1 && f->shared_expert)) {
            for (int p = 0; p < 3; p++) {
                snprintf(s, sizeof s, "model.layers.%d.%s.%s%s%s", L, f->moe_module, dense ? "" : f->shared_expert,
                         dense ? "" : ".", f->mlp[p]);
                add(t, s, p == 1 ? 4 : H, p == 1 ? H : 4, 1);
            }
        }
        if (!dense && f->shared_gate) snprintf(s, sizeof s, "model.layers.%d.%s.%s", L, f->moe_module, f->shared_gate), add(t, s, H, 1, 0);
        if (dense) continue;
        snprintf(s, sizeof s, "model.layers.%d.%s.%s", L, f->moe_module, f->router), add(t, s, H, E, 1);
        for (int e = 0; e < E; e++)
            for (int p = 0; p < 3; p++) {
                snprintf(s, sizeof s, "model.layers.%d.%s.experts.%d.%s", L, f->moe_module, e, f->expert[p]);
                int i = add(t, s, p == 1 ? I : H, p == 1 ? H : I, 1);
                for (int j = 0; j < t->in[i]; j++) t->a[i][j] = (float)(100 * (e + 1) + 10 * (p + 1) + j);
                for (int j = 0; j < t->out[i]; j++) t->b[i][j] = -(float)(100 * (e + 1) + 10 * (p + 1) + j);
            }
    }
    add(t, "lm_head", H, 5, 0);
    for (int i = 0; i < t->n; i++)
        if (!strstr(t->name[i], ".experts."))
            for (int j = 0; j < 8; j++) t->a[i][j] = (float)(1000 + 10 * i + j), t->b[i][j] = -t->a[i][j];
}

static const float *tensor(const mt_st_file *f, const char *key, int64_t rows, int64_t cols) {
    const mt_st_tensor *t = mt_st_file_find(f, key);
    cr_assert(t, "no '%s'", key);
    cr_assert_str_eq(t->dtype, "F32", "%s", key);
    cr_assert(t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols, "%s is [%lld, %lld], want [%lld, %lld]", key,
              (long long)t->shape[0], (long long)t->shape[1], (long long)rows, (long long)cols);
    return t->data;
}

static void same(const float *got, const float *want, int n, const char *what) {
    for (int i = 0; i < n; i++) cr_assert_eq(got[i], want[i], "%s[%d] = %g, want %g", what, i, got[i], want[i]);
}

static int listed(const cJSON *list, const char *name) {
    const cJSON *it;
    cJSON_ArrayForEach(it, list) if (cJSON_IsString(it) && strcmp(it->valuestring, name) == 0) return 1;
    return 0;
}

typedef struct {
    const toy *t;
    const mt_family *f;
    int seen[MAXM];
} back_ctx;

// Each module read back, under the family's names, equals what was written.
static int check_back(void *ctx, const char *module, const mt_st_tensor *a, const mt_st_tensor *b) {
    back_ctx *c = ctx;
    char renamed[300];
    module = mt_family_module_name(c->f, module, renamed, sizeof renamed);
    int i = 0;
    while (i < c->t->n && strcmp(c->t->name[i], module) != 0) i++;
    cr_assert_lt(i, c->t->n, "read back '%s', which is no module of the model", module);
    cr_assert(c->t->adapted[i], "read back '%s', which was not adapted", module);
    cr_assert(a->shape[0] == 1 && a->shape[1] == c->t->in[i] && b->shape[0] == c->t->out[i] && b->shape[1] == 1, "%s shapes", module);
    same(a->data, c->t->a[i], (int)c->t->in[i], module);
    same(b->data, c->t->b[i], (int)c->t->out[i], module);
    c->seen[i]++;
    return 0;
}

static void family_case(const char *model_type) {
    const mt_family *f = mt_family_find(model_type);
    cr_assert(f, "%s", model_type);
    toy t;
    toy_build(&t, f);
    mt_peft_module mods[MAXM];
    const char *lin[MAXM];
    size_t n = 0;
    for (int i = 0; i < t.n; i++) {
        lin[i] = t.name[i];
        if (t.adapted[i]) mods[n++] = (mt_peft_module){t.name[i], t.in[i], t.out[i], t.a[i], t.b[i]};
    }
    mt_peft_v5_model md = {2, E, f->moe_module, f->router, {f->expert[0], f->expert[1], f->expert[2]}, lin, t.adapted,
                           (size_t)t.n, f->fused_experts};
    mt_peft_config cfg = {.r = 1, .lora_alpha = 2};
    char tmp[64], path[256];
    mt_test_tmpdir(tmp, sizeof tmp);
    cr_assert_eq(mt_peft_write_v5(tmp, &cfg, NULL, &md, mods, n, NULL, NULL), 0, "%s", mt_error_get());

    // the fused experts of layer 1, by hand (gate rows then up rows; B's columns k·E + e)
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", tmp);
    mt_st_file st;
    cr_assert_eq(mt_st_file_open(&st, path), 0, "%s", mt_error_get());
    const char *gu = "base_model.model.model.layers.1.mlp.experts.base_layer.lora_", *dn = "base_model.model.model.layers.1.mlp.experts.lora_";
    char key[160];
    static const float gu_a[4 * H] = {110, 111, 130, 131, 210, 211, 230, 231};
    static const float gu_b[2 * I * 2 * E] = {-110, -210, 0, 0, -111, -211, 0, 0, -112, -212, 0, 0,
                                              0, 0, -130, -230, 0, 0, -131, -231, 0, 0, -132, -232};
    static const float dn_a[E * I] = {120, 121, 122, 220, 221, 222};
    static const float dn_b[H * E] = {-120, -220, -121, -221};
    snprintf(key, sizeof key, "%sA.weight", gu), same(tensor(&st, key, 2 * E, H), gu_a, 4 * H, key);
    snprintf(key, sizeof key, "%sB.weight", gu), same(tensor(&st, key, 2 * I, 2 * E), gu_b, 4 * I * E, key);
    snprintf(key, sizeof key, "%sA.weight", dn), same(tensor(&st, key, E, I), dn_a, E * I, key);
    snprintf(key, sizeof key, "%sB.weight", dn), same(tensor(&st, key, H, E), dn_b, H * E, key);
    // the router and the Linears that stay modules: their own names, as written
    tensor(&st, "base_model.model.model.layers.1.mlp.gate.lora_A.weight", 1, H);
    // per MoE layer 2 fused pairs and the router's; a dense layer 0 has its MLP's 3 pairs instead
    int has_dense = f->has_dense_layers || f->first_k_dense;
    size_t want = has_dense ? (4 + 2) + 2 * 3 : 2 * (4 + 2);
    want += 2 * 2 + (f->shared_expert ? 2 * 3 : 0);  // q_proj of both layers, shared expert
    cr_assert_eq(st.n_tensors, want, "%s: %zu tensors, want %zu", model_type, st.n_tensors, want);
    for (size_t i = 0; i < st.n_tensors; i++) {
        const char *k = st.tensors[i].name;
        cr_assert(!strstr(k, "experts.0") && !strstr(k, "experts.1") && !strstr(k, "block_sparse_moe"), "v4 key %s", k);
    }
    if (f->shared_expert) {
        char key2[160];
        snprintf(key2, sizeof key2, "base_model.model.model.layers.1.mlp.%s.up_proj.lora_A.weight", f->shared_expert);
        const float *a = tensor(&st, key2, 1, H);
        int idx = 0;
        while (!strstr(t.name[idx], ".up_proj") || !strstr(t.name[idx], f->shared_expert)) idx++;
        same(a, t.a[idx], H, "the shared expert's up_proj A");
    }
    mt_st_file_close(&st);

    // adapter_config.json: attention as modules; router, experts and the Linears whose leaf
    // PEFT's converter rewrites (gate_proj, up_proj, down_proj) as parameters
    char *text;
    size_t len;
    snprintf(path, sizeof path, "%s/adapter_config.json", tmp);
    cr_assert_eq(mt_read_file(path, 1 << 20, &text, &len), 0);
    cJSON *root = cJSON_ParseWithLength(text, len);
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(root, "target_modules");
    const cJSON *tp = cJSON_GetObjectItemCaseSensitive(root, "target_parameters");
    cr_assert(cJSON_GetArraySize(tm) == 1 && listed(tm, "q_proj"), "%s: target_modules\n%s", model_type, text);
    int moe_everywhere = !has_dense;
    cr_assert(listed(tp, moe_everywhere ? "gate.weight" : "model.layers.1.mlp.gate.weight"), "%s", text);
    cr_assert(listed(tp, moe_everywhere ? "gate_up_proj" : "model.layers.1.mlp.experts.gate_up_proj"), "%s", text);
    cr_assert(listed(tp, moe_everywhere ? "down_proj" : "model.layers.1.mlp.experts.down_proj"), "%s", text);
    int mlps = has_dense || f->shared_expert;
    for (int p = 0; p < 3; p++) {
        char w[64];
        snprintf(w, sizeof w, "%s.weight", f->mlp[p]);
        cr_assert_eq(listed(tp, w), mlps, "%s: %s in target_parameters\n%s", model_type, w, text);
    }
    cr_assert_eq(cJSON_GetArraySize(tp), 3 + 3 * mlps, "%s", text);
    cJSON_Delete(root);
    free(text);

    // read back: every adapted module once, bit for bit
    back_ctx c = {&t, f, {0}};
    mt_peft_config c2;
    cr_assert_eq(mt_peft_read(tmp, &c2, check_back, &c), 0, "%s", mt_error_get());
    cr_assert_eq(c2.r_gate_up, 2, "gate_up_proj at rank 2r");
    for (int i = 0; i < t.n; i++) cr_assert_eq(c.seen[i], t.adapted[i], "%s read back %d times", t.name[i], c.seen[i]);
    mt_test_rmrf(tmp);
}

Test(peft_v5_family, qwen2_moe_dense_layer_and_shared_expert) { family_case("qwen2_moe"); }
Test(peft_v5_family, qwen3_moe_dense_layer) { family_case("qwen3_moe"); }
Test(peft_v5_family, olmoe) { family_case("olmoe"); }
// DeepSeek-style: a dense first layer (first_k_dense_replace), the shared experts (no gate)
Test(peft_v5_family, deepseek_v2) { family_case("deepseek_v2"); }
Test(peft_v5_family, deepseek_v3) { family_case("deepseek_v3"); }
Test(peft_v5_family, glm4_moe) { family_case("glm4_moe"); }
Test(peft_v5_family, glm4_moe_lite) { family_case("glm4_moe_lite"); }

// v4 of a family whose transformers-4 router is a bare weight (DeepSeek-style): the router under its
// own key, targeted as a parameter ("gate.weight" when every MoE layer's is adapted, full paths
// otherwise); the per-expert Linears, the shared experts and the dense MLP as modules.
Test(peft_v5_family, deepseek_v4_router_as_parameter) {
    const mt_family *f = mt_family_find("deepseek_v3");
    cr_assert(f && f->router_param);
    toy t;
    toy_build(&t, f);
    mt_peft_module mods[MAXM];
    const char *lin[MAXM];
    size_t n = 0;
    for (int i = 0; i < t.n; i++) {
        lin[i] = t.name[i];
        if (t.adapted[i]) mods[n++] = (mt_peft_module){t.name[i], t.in[i], t.out[i], t.a[i], t.b[i]};
    }
    mt_peft_config cfg = {.r = 1, .lora_alpha = 2};
    char tmp[64], path[256], *text;
    size_t len;
    mt_test_tmpdir(tmp, sizeof tmp);
    cr_assert_eq(mt_peft_write_v4(tmp, &cfg, NULL, lin, t.adapted, (size_t)t.n, f->router, mods, n, NULL, NULL), 0, "%s",
                 mt_error_get());
    snprintf(path, sizeof path, "%s/adapter_config.json", tmp);
    cr_assert_eq(mt_read_file(path, 1 << 20, &text, &len), 0);
    cJSON *root = cJSON_ParseWithLength(text, len);
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(root, "target_modules");
    const cJSON *tp = cJSON_GetObjectItemCaseSensitive(root, "target_parameters");
    // the toy's layer 0 is dense: the router exists in layer 1 only, and is adapted there: the leaf
    cr_assert(cJSON_GetArraySize(tp) == 1 && listed(tp, "gate.weight"), "%s", text);
    cr_assert(listed(tm, "q_proj") && listed(tm, "gate_proj") && listed(tm, "down_proj") && listed(tm, "up_proj") &&
              !listed(tm, "gate") && cJSON_GetArraySize(tm) == 4, "%s", text);
    cJSON_Delete(root);
    free(text);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", tmp);
    mt_st_file st;
    cr_assert_eq(mt_st_file_open(&st, path), 0, "%s", mt_error_get());
    tensor(&st, "base_model.model.model.layers.1.mlp.gate.lora_B.weight", E, 1);
    tensor(&st, "base_model.model.model.layers.1.mlp.experts.1.up_proj.lora_A.weight", 1, H);
    tensor(&st, "base_model.model.model.layers.1.mlp.shared_experts.down_proj.lora_A.weight", 1, 4);
    cr_assert_eq(st.n_tensors, 2 * n, "%zu tensors for %zu modules", st.n_tensors, n);
    mt_st_file_close(&st);
    back_ctx c = {&t, f, {0}};
    mt_peft_config c2;
    cr_assert_eq(mt_peft_read(tmp, &c2, check_back, &c), 0, "%s", mt_error_get());
    for (int i = 0; i < t.n; i++) cr_assert_eq(c.seen[i], t.adapted[i], "%s read back %d times", t.name[i], c.seen[i]);
    // without the family's router leaf the router is a module, which PEFT refuses for this family
    mt_test_rmrf(tmp);
    mt_test_tmpdir(tmp, sizeof tmp);
    cr_assert_eq(mt_peft_write_v4(tmp, &cfg, NULL, lin, t.adapted, (size_t)t.n, NULL, mods, n, NULL, NULL), 0);
    snprintf(path, sizeof path, "%s/adapter_config.json", tmp);
    cr_assert_eq(mt_read_file(path, 1 << 20, &text, &len), 0);
    root = cJSON_ParseWithLength(text, len);
    cr_assert(listed(cJSON_GetObjectItemCaseSensitive(root, "target_modules"), "gate"), "%s", text);
    cr_assert_null(cJSON_GetObjectItemCaseSensitive(root, "target_parameters"), "%s", text);
    cJSON_Delete(root);
    free(text);
    mt_test_rmrf(tmp);
}

// A module the family's names do not place (an expert index past the model's, a leaf that is no
// expert projection) is refused, naming it.
Test(peft_v5_family, unplaced_expert_is_named) {
    const mt_family *f = mt_family_find("qwen3_moe");
    float a[H] = {1, 2}, b[I] = {3, 4, 5};
    const char *bad[] = {"model.layers.0.mlp.experts.2.gate_proj", "model.layers.0.mlp.experts.0.w1"};
    for (int k = 0; k < 2; k++) {
        mt_peft_module m = {bad[k], H, I, a, b};
        const char *lin[] = {bad[k]};
        unsigned char on[] = {1};
        mt_peft_v5_model md = {1, E, f->moe_module, f->router, {f->expert[0], f->expert[1], f->expert[2]}, lin, on, 1, 0};
        mt_peft_config cfg = {.r = 1, .lora_alpha = 1};
        char tmp[64];
        mt_test_tmpdir(tmp, sizeof tmp);
        cr_assert_neq(mt_peft_write_v5(tmp, &cfg, NULL, &md, &m, 1, NULL, NULL), 0, "%s was written", bad[k]);
        cr_assert(strstr(mt_error_get(), bad[k]) && strstr(mt_error_get(), "gate_proj"), "%s", mt_error_get());
        mt_test_rmrf(tmp);
    }
}

// The CLI end to end on Qwen2-MoE (dense layers 0 and 2, a shared expert in layer 1): one
// training written as v4 and as v5 evaluates alike, and train --adapter (lr ~0) from the v5
// folder gives the same model back.
static void loss_of(const char *out, char *line, size_t n) {
    const char *p = strstr(out, "loss=");
    cr_assert(p, "no loss= in\n%s", out);
    snprintf(line, n, "%.*s", (int)strcspn(p, " \n"), p);
}

Test(peft_v5_family, cli_qwen2_moe_v4_v5_same_loss, .timeout = 180) {
    char tmp[64], model[128], data[128], out[16384], l4[64], l5[64], lr[64];
    mt_test_tmpdir(tmp, sizeof tmp);
    snprintf(model, sizeof model, "%s/q2", tmp);
    snprintf(data, sizeof data, "%s/data.jsonl", tmp);
    // configs/tiny-qwen2-moe.json as shipped: its vocabulary fits the byte-level tokenizer
    char cfg[1024];
    snprintf(cfg, sizeof cfg, "%s", MT_REPO_ROOT "/configs/tiny-qwen2-moe.json");
    FILE *f;
    cr_assert_eq(mt_test_run(out, sizeof out, "init --config %s --out %s --seed 3", cfg, model), 0, "%s", out);
    f = fopen(data, "w");
    for (int i = 0; i < 6; i++) fprintf(f, "{\"text\":\"sample %d of the tiny set %03d\"}\n", i, i * 7);
    fclose(f);
    const char *common = "--mode lora --r 4 --targets all --layers 0,1 --experts 0,2 --quant none --steps 2 --seq 32 --lr 0.02";
    for (int v = 4; v <= 5; v++) {
        cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --out %s/v%d --peft-format v%d", model, data,
                                 common, tmp, v, v), 0, "%s", out);
        cr_assert_eq(mt_test_run(out, sizeof out, "eval --model %s --adapter %s/v%d/adapter --data %s --quant none",
                                 model, tmp, v, data), 0, "%s", out);
        loss_of(out, v == 4 ? l4 : l5, 64);
    }
    cr_expect_str_eq(l4, l5, "v4 and v5 adapters of one training evaluate alike");
    char path[256];
    snprintf(path, sizeof path, "%s/v5/adapter/adapter_model.safetensors", tmp);
    mt_st_file st;
    cr_assert_eq(mt_st_file_open(&st, path), 0, "%s", mt_error_get());
    cr_expect_not_null(mt_st_file_find(&st, "base_model.model.model.layers.1.mlp.experts.base_layer.lora_A.weight"));
    cr_expect_not_null(mt_st_file_find(&st, "base_model.model.model.layers.1.mlp.shared_expert.down_proj.lora_B.weight"));
    cr_expect_not_null(mt_st_file_find(&st, "base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight"));
    mt_st_file_close(&st);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --lr 1e-12 --out %s/again --peft-format v4 "
                             "--adapter %s/v5/adapter", model, data, common, tmp, tmp), 0, "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "eval --model %s --adapter %s/again/adapter --data %s --quant none", model,
                             tmp, data), 0, "%s", out);
    loss_of(out, lr, sizeof lr);
    cr_expect_str_eq(lr, l5, "train --adapter starts from the v5 adapter");
    mt_test_rmrf(tmp);
}
