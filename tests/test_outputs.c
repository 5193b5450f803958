// Outputs of a run and the commands that use them: PEFT adapter folders (names, shapes, config,
// the target_modules rule), trained-tensor files, eval, generate and merge.
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "lora/peft.h"
#include "model/mixtral.h"
#include "quant/qweight.h"
#include "tests/test_util.h"
#include "trainer/cmd/commands.h"
#include "data/data.h"
#include "trainer/options.h"

#define G1 MT_REPO_ROOT "/tests/data/golden/g1_top2_gqa_pad"
#define TINY MT_REPO_ROOT "/configs/tiny.json"

// ---------------------------------------------------------------------------------------------
// Helpers

static mt_backend *be;
static char tmp[256];

static void setup(void) {
    be = mt_backend_cpu_new();
    mt_test_tmpdir(tmp, sizeof tmp);
}

static void teardown(void) {
    cr_expect_eq(be->ledger.total_cur, 0, "everything went back to the ledger");
    mt_backend_free(be);
    mt_test_rmrf(tmp);
}

TestSuite(outputs, .init = setup, .fini = teardown);

static void lora_opts(mt_run_opts *o, int r) {
    mt_run_opts_default(o);
    o->mode = MT_MODE_LORA;
    o->lora_r = r;
    o->lora_alpha = 8;
    o->targets = MT_TARGET_EXPERTS | MT_TARGET_ATTN | MT_TARGET_GATE;
    o->quant = MT_QUANT_NONE;
}

static void load(mt_model *m, const char *dir, const mt_run_opts *o) {
    cr_assert_eq(mt_model_load(m, be, dir, MT_MODEL_SPEC_OF(o)), 0, "%s", mt_error_get());
}

// Every Linear of the model in module order, with its module path.
typedef struct {
    int n;
    char name[600][96];
    mt_linear *l[600];
} linears;

static void list_linears(mt_model *m, linears *ls) {
    ls->n = 0;
    static const char *attn[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                 "block_sparse_moe.gate"};
    for (int L = 0; L < m->cfg.layers; L++) {
        for (int i = 0; i < 5; i++) snprintf(ls->name[ls->n++], 96, "model.layers.%d.%s", L, attn[i]);
        for (int e = 0; e < m->cfg.experts; e++)
            for (int w = 1; w <= 3; w++)
                snprintf(ls->name[ls->n++], 96, "model.layers.%d.block_sparse_moe.experts.%d.w%d", L, e, w);
    }
    snprintf(ls->name[ls->n++], 96, "lm_head");
    for (int i = 0; i < ls->n; i++) cr_assert_not_null(ls->l[i] = mt_model_find_linear(m, ls->name[i]), "%s", ls->name[i]);
}

static void randomize(mt_tensor *t, mt_rng *rng, float scale) {
    float *p = t->data;
    for (int64_t i = 0; i < mt_tensor_numel(t); i++) p[i] = scale * mt_rng_normal(rng);
}

// Random A and B on every LoRA, so that a round trip or a merge is not trivially zero.
static void randomize_loras(mt_model *m, uint64_t seed) {
    linears ls;
    list_linears(m, &ls);
    mt_rng rng;
    mt_rng_seed(&rng, seed, 0);
    for (int i = 0; i < ls.n; i++)
        if (ls.l[i]->lora) randomize(ls.l[i]->lora->a, &rng, 0.2f), randomize(ls.l[i]->lora->b, &rng, 0.2f);
}

static cJSON *read_json(const char *path) {
    char *text;
    size_t len;
    cr_assert_eq(mt_read_file(path, 1 << 20, &text, &len), 0, "%s", mt_error_get());
    cJSON *j = cJSON_Parse(text);
    free(text);
    cr_assert_not_null(j, "%s is not JSON", path);
    return j;
}

static void random_batch(int32_t *tokens, int32_t *labels, int n, int vocab, uint64_t seed) {
    mt_rng rng;
    mt_rng_seed(&rng, seed, 1);
    for (int i = 0; i < n; i++) tokens[i] = labels[i] = 3 + (int32_t)(mt_rng_next(&rng) % (uint64_t)(vocab - 3));
}

static double rel_err(const float *got, const float *want, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)got[i] - want[i])), s = fmax(s, fabs((double)want[i]));
    return s > 0 ? d / s : d;
}

// Logits [B·S, V] of a fixed batch.
static float *forward_logits(mt_model *m, mt_loss *loss) {
    enum { B = 2, S = 12 };
    int32_t tokens[B * S], labels[B * S];
    random_batch(tokens, labels, B * S, (int)m->cfg.vocab, 5);
    mt_batch b = {B, S, tokens, labels, NULL};
    cr_assert_eq(mt_model_forward(m, &b, loss), 0, "%s", mt_error_get());
    size_t n = (size_t)B * S * (size_t)m->cfg.vocab;
    float *out = mt_xmalloc(n * sizeof(float));
    cr_assert_eq(mt_model_logits(m, 0, B * S, out), 0, "%s", mt_error_get());
    return out;
}

// ---------------------------------------------------------------------------------------------
// PEFT adapters

Test(outputs, adapter_save_load_round_trip_bit_for_bit) {
    mt_run_opts o;
    lora_opts(&o, 4);
    mt_model a, b;
    load(&a, G1, &o);
    randomize_loras(&a, 11);
    char dir[300];
    snprintf(dir, sizeof dir, "%s/adapter", tmp);
    cr_assert_eq(mt_model_save_adapter(&a, dir, "g1_top2_gqa_pad"), 0, "%s", mt_error_get());
    o.seed = 999;  // another initialisation: every value must come from the file
    load(&b, G1, &o);
    cr_assert_eq(mt_model_load_adapter(&b, dir), 0, "%s", mt_error_get());
    linears la, lb;
    list_linears(&a, &la);
    list_linears(&b, &lb);
    int compared = 0;
    for (int i = 0; i < la.n; i++) {
        mt_lora *x = la.l[i]->lora, *y = lb.l[i]->lora;
        cr_assert_eq(!x, !y, "%s", la.name[i]);
        if (!x) continue;
        cr_expect_eq(memcmp(x->a->data, y->a->data, x->a->nbytes), 0, "%s A", la.name[i]);
        cr_expect_eq(memcmp(x->b->data, y->b->data, x->b->nbytes), 0, "%s B", la.name[i]);
        cr_expect_eq(x->scale, y->scale, "%s scale", la.name[i]);
        compared++;
    }
    cr_expect_eq(compared, 2 * (5 + 3 * 8));
    mt_model_free(&a), mt_model_free(&b);
}

Test(outputs, adapter_config_has_peft_fields_sorted_indent_2) {
    mt_run_opts o;
    lora_opts(&o, 4);
    o.lora_dropout = 0.05;
    mt_model m;
    load(&m, G1, &o);
    char dir[300], path[400];
    snprintf(dir, sizeof dir, "%s/adapter", tmp);
    cr_assert_eq(mt_model_save_adapter(&m, dir, "tiny/base \"model\" é"), 0, "%s", mt_error_get());
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    cJSON *j = read_json(path);
    struct { const char *key; const char *json; } want[] = {
        {"peft_type", "\"LORA\""}, {"task_type", "\"CAUSAL_LM\""}, {"r", "4"}, {"lora_alpha", "8"},
        {"lora_dropout", "0.05"}, {"use_rslora", "false"}, {"bias", "\"none\""}, {"fan_in_fan_out", "false"},
        {"init_lora_weights", "true"}, {"inference_mode", "true"}, {"modules_to_save", "null"},
        {"use_dora", "false"}, {"layers_to_transform", "null"}, {"rank_pattern", "{}"}, {"alpha_pattern", "{}"},
        {"revision", "null"}, {"base_model_name_or_path", "\"tiny/base \\\"model\\\" \\u00e9\""},
    };
    char *text;
    size_t len;
    cr_assert_eq(mt_read_file(path, 1 << 20, &text, &len), 0);
    for (size_t i = 0; i < MT_ARRAY_LEN(want); i++) {
        cr_expect_not_null(cJSON_GetObjectItemCaseSensitive(j, want[i].key), "missing %s", want[i].key);
        char line[256];  // json.dumps(indent=2): two spaces, "key": value
        snprintf(line, sizeof line, "\n  \"%s\": %s", want[i].key, want[i].json);
        cr_expect(strstr(text, line), "no line %s in\n%s", line, text);
    }
    // sorted keys, no trailing newline (json.dumps output as PEFT writes it)
    const cJSON *prev = NULL;
    for (const cJSON *it = j->child; it; prev = it, it = it->next)
        if (prev) cr_expect_lt(strcmp(prev->string, it->string), 0, "%s before %s", prev->string, it->string);
    cr_expect(text[len - 1] == '}', "ends with }");
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(j, "target_modules");
    cr_assert(cJSON_IsArray(tm), "every layer and expert adapted: a list");
    const char *leaves[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate", "w1", "w2", "w3"};
    cr_assert_eq(cJSON_GetArraySize(tm), 8);
    for (int i = 0; i < 8; i++) cr_expect_str_eq(cJSON_GetArrayItem(tm, i)->valuestring, leaves[i]);
    cr_expect(strstr(text, "\n  \"target_modules\": [\n    \"q_proj\",\n    \"k_proj\","), "%s", text);
    // our PEFT reader takes it back
    cr_assert_eq(mt_model_load_adapter(&m, dir), 0, "%s", mt_error_get());
    free(text);
    cJSON_Delete(j);
    mt_model_free(&m);
}

static int pair_count(void *ctx, const char *module, const mt_st_tensor *a, const mt_st_tensor *b) {
    (void)module, (void)a, (void)b;
    ++*(int *)ctx;
    return 0;
}

// docs/formats.md "Layout v4" on configs/tiny.json (hidden 64, intermediate 128, 2 layers, 8 experts), r 16.
Test(outputs, adapter_keys_and_shapes_tiny_r16) {
    char out[8192], model[300], dir[300], path[400];
    snprintf(model, sizeof model, "%s/tiny", tmp);
    cr_assert_eq(mt_test_run(out, sizeof out, "init --config %s --out %s", TINY, model), 0, "%s", out);
    mt_run_opts o;
    mt_run_opts_default(&o);  // lora, r 16, experts all, targets experts, nf4 base
    mt_model m;
    load(&m, model, &o);
    snprintf(dir, sizeof dir, "%s/adapter", tmp);
    cr_assert_eq(mt_model_save_adapter(&m, dir, model), 0, "%s", mt_error_get());
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    mt_st_file f;
    cr_assert_eq(mt_st_file_open(&f, path), 0, "%s", mt_error_get());
    cr_expect_eq(f.n_tensors, 2 * 8 * 3 * 2);
    cr_expect(f.metadata_json && strstr(f.metadata_json, "\"format\"") && strstr(f.metadata_json, "\"pt\""));
    for (int L = 0; L < 2; L++)
        for (int e = 0; e < 8; e++)
            for (int w = 1; w <= 3; w++) {
                int64_t in = w == 2 ? 128 : 64, outd = w == 2 ? 64 : 128;
                char key[200];
                snprintf(key, sizeof key, "base_model.model.model.layers.%d.block_sparse_moe.experts.%d.w%d.lora_A.weight", L, e, w);
                const mt_st_tensor *a = mt_st_file_find(&f, key);
                cr_assert_not_null(a, "%s", key);
                cr_expect_str_eq(a->dtype, "F32");
                cr_expect(a->ndim == 2 && a->shape[0] == 16 && a->shape[1] == in, "%s", key);
                snprintf(key, sizeof key, "base_model.model.model.layers.%d.block_sparse_moe.experts.%d.w%d.lora_B.weight", L, e, w);
                const mt_st_tensor *b = mt_st_file_find(&f, key);
                cr_assert_not_null(b, "%s", key);
                cr_expect(b->ndim == 2 && b->shape[0] == outd && b->shape[1] == 16, "%s", key);
                const float *bv = b->data;  // PEFT's init: B = 0
                for (int64_t i = 0; i < outd * 16; i++) cr_assert_eq(bv[i], 0.0f);
            }
    mt_st_file_close(&f);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    cJSON *j = read_json(path);
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(j, "target_modules");
    cr_assert(cJSON_IsArray(tm) && cJSON_GetArraySize(tm) == 3);
    cr_expect_str_eq(cJSON_GetArrayItem(tm, 0)->valuestring, "w1");
    cr_expect_eq(cJSON_GetObjectItem(j, "lora_alpha")->valuedouble, 16);  // --alpha defaults to r
    cJSON_Delete(j);
    mt_peft_config pc;
    int pairs = 0;
    cr_assert_eq(mt_peft_read(dir, &pc, pair_count, &pairs), 0, "%s", mt_error_get());
    cr_expect_eq(pairs, 48);
    cr_expect_eq(pc.r, 16);
    mt_model_free(&m);
}

// Every module name transformers' MixtralForCausalLM (v4) has, containers included.
static int all_module_names(const mt_model_config *c, char names[][96], int cap) {
    int n = 0;
    const char *top[] = {"", "model", "model.embed_tokens", "model.layers", "model.norm", "model.rotary_emb", "lm_head"};
    for (size_t i = 0; i < MT_ARRAY_LEN(top); i++) snprintf(names[n++], 96, "%s", top[i]);
    const char *in_layer[] = {"", ".self_attn", ".self_attn.q_proj", ".self_attn.k_proj", ".self_attn.v_proj",
                              ".self_attn.o_proj", ".block_sparse_moe", ".block_sparse_moe.gate",
                              ".block_sparse_moe.experts", ".input_layernorm", ".post_attention_layernorm"};
    for (int L = 0; L < c->layers; L++) {
        for (size_t i = 0; i < MT_ARRAY_LEN(in_layer); i++) snprintf(names[n++], 96, "model.layers.%d%s", L, in_layer[i]);
        for (int e = 0; e < c->experts; e++) {
            const char *ex[] = {"", ".w1", ".w2", ".w3", ".act_fn"};
            for (size_t i = 0; i < MT_ARRAY_LEN(ex); i++)
                snprintf(names[n++], 96, "model.layers.%d.block_sparse_moe.experts.%d%s", L, e, ex[i]);
        }
    }
    cr_assert_leq(n, cap);
    return n;
}

// PEFT's list rule: an entry is the whole name or a ".entry" suffix.
static int list_match(char *const *entries, int n, const char *name) {
    for (int k = 0; k < n; k++) {
        size_t ln = strlen(name), lk = strlen(entries[k]);
        if (!strcmp(name, entries[k]) || (ln > lk && name[ln - lk - 1] == '.' && !strcmp(name + ln - lk, entries[k])))
            return 1;
    }
    return 0;
}

static void check_list_adapter(const char *layers, const char *experts, unsigned targets) {
    mt_run_opts o;
    lora_opts(&o, 4);
    o.targets = targets;
    cr_assert_eq(mt_index_set_parse(&o.layers, layers), 0);
    cr_assert_eq(mt_index_set_parse(&o.experts, experts), 0);
    mt_model m;
    load(&m, G1, &o);
    char dir[300], path[400];
    snprintf(dir, sizeof dir, "%s/adapter_%s_%s_%x", tmp, layers, experts, targets);
    cr_assert_eq(mt_model_save_adapter(&m, dir, NULL), 0, "%s", mt_error_get());
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    cJSON *j = read_json(path);
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(j, "target_modules"), *it;
    cr_assert(cJSON_IsArray(tm), "target_modules is always a list (never a regex a converter rewrites)");
    char *entries[4096];
    int ne = 0;
    cJSON_ArrayForEach(it, tm) entries[ne++] = it->valuestring;
    static char names[1000][96];
    int n = all_module_names(&m.cfg, names, 1000), adapted = 0;
    for (int i = 0; i < n; i++) {
        mt_linear *l = mt_model_find_linear(&m, names[i]);
        int want = l && l->lora;
        adapted += want;
        cr_expect_eq(list_match(entries, ne, names[i]), want, "%s: the list says %d, the model %d", names[i], !want, want);
    }
    cr_expect_gt(adapted, 0);
    cJSON_Delete(j);
    // and it loads back
    cr_assert_eq(mt_model_load_adapter(&m, dir), 0, "%s", mt_error_get());
    mt_model_free(&m);
}

Test(outputs, list_target_matches_exactly_the_adapted_modules) {
    check_list_adapter("1", "0,3,5", MT_TARGET_EXPERTS | MT_TARGET_Q | MT_TARGET_GATE);
    check_list_adapter("all", "2", MT_TARGET_W1 | MT_TARGET_W3);      // a subset of experts only
    check_list_adapter("0", "all", MT_TARGET_ATTN);                  // a subset of layers only
    check_list_adapter("0,1", "6,7", MT_TARGET_EXPERTS | MT_TARGET_V);  // attn in every layer, experts not
}

// The rule itself on random subsets, including ones that are not products of layers × experts.
Test(outputs, target_rule_on_random_subsets) {
    mt_model_config c = {.layers = 3, .experts = 4};
    static char names[1000][96];
    int n = all_module_names(&c, names, 1000);
    const char *lin[600];
    int nl = 0;
    for (int i = 0; i < n; i++) {
        const char *leaf = strrchr(names[i], '.');
        leaf = leaf ? leaf + 1 : names[i];
        if (!strcmp(leaf, "q_proj") || !strcmp(leaf, "k_proj") || !strcmp(leaf, "v_proj") || !strcmp(leaf, "o_proj") ||
            !strcmp(leaf, "gate") || !strcmp(leaf, "w1") || !strcmp(leaf, "w2") || !strcmp(leaf, "w3") ||
            !strcmp(leaf, "lm_head"))
            lin[nl++] = names[i];
    }
    mt_rng rng;
    mt_rng_seed(&rng, 3, 0);
    int leaves = 0, paths = 0;
    for (int trial = 0; trial < 60; trial++) {
        unsigned char adapted[600] = {0};
        double p = trial < 10 ? 0.97 : (trial % 5 + 1) * 0.15;
        int any = 0;
        for (int i = 0; i < nl; i++) any |= adapted[i] = mt_rng_uniform(&rng) < p && strcmp(lin[i], "lm_head") != 0;
        if (trial % 7 == 0)  // whole leaves: w2 everywhere, nothing else
            for (int i = 0; i < nl; i++) any |= adapted[i] = strstr(lin[i], ".w2") != NULL;
        if (!any) continue;
        mt_peft_targets t;
        cr_assert_eq(mt_peft_targets_make(&t, lin, (size_t)nl, adapted), 0, "%s", mt_error_get());
        for (int i = 0; i < n; i++) {
            int li = -1;
            for (int k = 0; k < nl; k++)
                if (lin[k] == names[i]) li = k;
            int want = li >= 0 && adapted[li], got = 0;
            got = list_match(t.names, t.n, names[i]);
            cr_assert_eq(got, want, "trial %d: %s (list %s ...)", trial, names[i], t.names[0]);
        }
        for (int k = 0; k < t.n; k++) paths += strchr(t.names[k], '.') != NULL, leaves += !strchr(t.names[k], '.');
        mt_peft_targets_free(&t);
    }
    cr_expect_gt(leaves, 0);
    cr_expect_gt(paths, 0);
    unsigned char none[600] = {0};
    mt_peft_targets t;
    cr_expect_eq(mt_peft_targets_make(&t, lin, (size_t)nl, none), -1, "nothing adapted is an error");
}

// ---------------------------------------------------------------------------------------------
// Trained tensors

static void unfreeze_opts(mt_run_opts *o) {
    mt_run_opts_default(o);
    o->mode = MT_MODE_UNFREEZE;
    o->quant = MT_QUANT_NONE;
    cr_assert_eq(mt_index_set_parse(&o->layers, "1"), 0);
    cr_assert_eq(mt_index_set_parse(&o->experts, "0,2"), 0);
}

// Perturbs every trained weight (w of Linears with a gradient).
static void perturb_trained(mt_model *m, uint64_t seed) {
    linears ls;
    list_linears(m, &ls);
    mt_rng rng;
    mt_rng_seed(&rng, seed, 0);
    for (int i = 0; i < ls.n; i++)
        if (ls.l[i]->dw) randomize(ls.l[i]->w, &rng, 0.1f);
}

Test(outputs, trained_save_load_round_trip_and_errors) {
    mt_run_opts o;
    unfreeze_opts(&o);
    mt_model a, b;
    load(&a, G1, &o);
    perturb_trained(&a, 5);
    char path[300];
    snprintf(path, sizeof path, "%s/trained.safetensors", tmp);
    cr_assert_eq(mt_model_save_trained(&a, path), 0, "%s", mt_error_get());
    mt_st_file f;
    cr_assert_eq(mt_st_file_open(&f, path), 0);
    cr_expect_eq(f.n_tensors, 1 + 2 * 3, "layer 1's gate and experts 0, 2 (w1, w2, w3)");
    cr_expect_not_null(mt_st_file_find(&f, "model.layers.1.block_sparse_moe.gate.weight"));
    cr_expect_not_null(mt_st_file_find(&f, "model.layers.1.block_sparse_moe.experts.2.w2.weight"));
    cr_expect_null(mt_st_file_find(&f, "model.layers.0.block_sparse_moe.gate.weight"));
    cr_expect_str_eq(f.tensors[0].dtype, "F32");
    mt_st_file_close(&f);
    load(&b, G1, &o);
    cr_assert_eq(mt_model_load_trained(&b, path), 0, "%s", mt_error_get());
    linears la, lb;
    list_linears(&a, &la);
    list_linears(&b, &lb);
    for (int i = 0; i < la.n; i++)
        if (la.l[i]->w)
            cr_expect_eq(memcmp(la.l[i]->w->data, lb.l[i]->w->data, la.l[i]->w->nbytes), 0, "%s", la.name[i]);
    mt_model_free(&b);

    // into a router-mode model: the expert tensors are not trained there, and named
    mt_run_opts r;
    mt_run_opts_default(&r);
    r.mode = MT_MODE_ROUTER;
    r.quant = MT_QUANT_NONE;
    load(&b, G1, &r);
    cr_expect_eq(mt_model_load_trained(&b, path), -1);
    cr_expect(strstr(mt_error_get(), "experts.0.w1.weight") && strstr(mt_error_get(), "not trained"), "%s",
              mt_error_get());
    // a router file into an unfreeze model: what it lacks is named
    char rpath[300];
    snprintf(rpath, sizeof rpath, "%s/router.safetensors", tmp);
    cr_assert_eq(mt_model_save_trained(&b, rpath), 0, "%s", mt_error_get());
    mt_model_free(&b);
    load(&b, G1, &o);
    cr_expect_eq(mt_model_load_trained(&b, rpath), -1);
    cr_expect(strstr(mt_error_get(), "model.layers.0.block_sparse_moe.gate.weight"), "%s", mt_error_get());
    // a wrong shape is named
    float zeros[8 * 16] = {0};
    mt_st_entry e = {"model.layers.1.block_sparse_moe.gate.weight", "F32", 2, {16, 8}, zeros};
    char bad[300];
    snprintf(bad, sizeof bad, "%s/bad.safetensors", tmp);
    cr_assert_eq(mt_st_write(bad, &e, 1, NULL, NULL, NULL), 0);
    mt_model_free(&b);
    r.layers.all = 0, r.layers.count = 1, r.layers.items[0] = 1;
    load(&b, G1, &r);
    cr_expect_eq(mt_model_load_trained(&b, bad), -1);
    cr_expect(strstr(mt_error_get(), "gate.weight") && strstr(mt_error_get(), "[16, 8]"), "%s", mt_error_get());
    mt_model_free(&b);
    // lora mode has nothing to save this way
    mt_run_opts lo;
    lora_opts(&lo, 4);
    load(&b, G1, &lo);
    cr_expect_eq(mt_model_save_trained(&b, bad), -1);
    mt_model_free(&b);
    mt_model_free(&a);
}

Test(outputs, trained_full_mode_holds_every_tensor) {
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = MT_MODE_FULL;
    o.quant = MT_QUANT_NONE;
    mt_model m;
    load(&m, G1, &o);
    char path[300];
    snprintf(path, sizeof path, "%s/full.safetensors", tmp);
    cr_assert_eq(mt_model_save_trained(&m, path), 0, "%s", mt_error_get());
    mt_st_file f;
    cr_assert_eq(mt_st_file_open(&f, path), 0);
    cr_expect_eq(f.n_tensors, 3 + 2 * (7 + 3 * 8));  // embed, norm, lm_head + per layer
    cr_expect_not_null(mt_st_file_find(&f, "model.embed_tokens.weight"));
    cr_expect_not_null(mt_st_file_find(&f, "model.layers.0.input_layernorm.weight"));
    cr_expect_not_null(mt_st_file_find(&f, "lm_head.weight"));
    mt_st_file_close(&f);
    cr_assert_eq(mt_model_load_trained(&m, path), 0, "%s", mt_error_get());
    mt_model_free(&m);
}

// ---------------------------------------------------------------------------------------------
// eval

// n samples of random length (some with a partial loss mask) as a token file.
static void write_tokfile(const char *path, int n, int vocab, uint64_t seed) {
    int64_t offsets[64];
    int32_t ids[64 * 24];
    uint8_t mask[64 * 24];
    mt_rng rng;
    mt_rng_seed(&rng, seed, 0);
    offsets[0] = 0;
    for (int i = 0; i < n; i++) {
        int len = 4 + (int)(mt_rng_next(&rng) % 17);
        for (int k = 0; k < len; k++) {
            ids[offsets[i] + k] = 3 + (int32_t)(mt_rng_next(&rng) % (uint64_t)(vocab - 3));
            mask[offsets[i] + k] = i % 3 == 1 && k < len / 2 ? 0 : 1;  // a "prompt" outside the loss
        }
        offsets[i + 1] = offsets[i] + len;
    }
    cr_assert_eq(mt_tokfile_write(path, n, offsets, ids, mask), 0, "%s", mt_error_get());
}

// The mean CE straight from mt_model_forward, one sample per batch.
static double direct_mean_ce(mt_model *m, const char *path, int64_t *tokens) {
    mt_tokenizer tok = {.kind = MT_TOKENIZER_BYTE, .vocab = m->cfg.vocab, .bos = 1, .eos = 2, .add_bos = 1};
    mt_data_opts dopts;
    mt_data_opts_default(&dopts);
    dopts.shuffle = 0;
    mt_dataset d;
    cr_assert_eq(mt_dataset_load(&d, path, &tok, &dopts), 0, "%s", mt_error_get());
    double sum = 0;
    *tokens = 0;
    for (int64_t i = 0; i < d.n; i++) {
        const int32_t *t, *l;
        int64_t len = mt_dataset_sample(&d, i, &t, &l);
        mt_batch b = {1, (int)len, t, l, NULL};
        mt_loss loss;
        cr_assert_eq(mt_model_forward(m, &b, &loss), 0, "%s", mt_error_get());
        sum += loss.ce * (double)loss.tokens;
        *tokens += loss.tokens;
    }
    mt_dataset_free(&d);
    return sum / (double)*tokens;
}

Test(outputs, eval_of_golden_adapter_equals_direct_forward) {
    char data[300], out[8192];
    snprintf(data, sizeof data, "%s/eval.tok", tmp);
    write_tokfile(data, 11, 96, 7);
    mt_run_opts o;
    mt_run_opts_default(&o);
    snprintf(o.model, sizeof o.model, "%s", G1);
    snprintf(o.adapter, sizeof o.adapter, "%s", G1);  // PEFT 0.17's adapter of the fixture
    snprintf(o.data, sizeof o.data, "%s", data);
    o.quant = MT_QUANT_NONE;
    o.batch = 3;
    o.seq = 64;
    mt_eval_result r;
    cr_assert_eq(mt_eval_run(&o, &r), 0, "%s", mt_error_get());
    cr_expect_eq(r.samples, 11);
    cr_expect_eq(r.batches, 4);
    mt_run_opts lo;
    lora_opts(&lo, 4);
    mt_model m;
    load(&m, G1, &lo);
    cr_assert_eq(mt_model_load_adapter(&m, G1), 0, "%s", mt_error_get());
    int64_t tokens;
    double want = direct_mean_ce(&m, data, &tokens);
    mt_model_free(&m);
    cr_expect_eq(r.tokens, tokens);
    cr_expect_leq(fabs(r.loss - want) / want, 1e-6, "eval %.9f, direct %.9f", r.loss, want);
    cr_expect_leq(fabs(r.perplexity - exp(want)) / exp(want), 1e-6);
    // the base alone differs (the adapter is applied)
    o.adapter[0] = 0;
    mt_eval_result base;
    cr_assert_eq(mt_eval_run(&o, &base), 0, "%s", mt_error_get());
    cr_expect_gt(fabs(base.loss - r.loss), 1e-4);
    // the command prints the same loss, key=value
    cr_assert_eq(mt_test_run(out, sizeof out, "eval --model %s --adapter %s --data %s --quant none --batch 3 --seq 64",
                             G1, G1, data), 0, "%s", out);
    char want_line[64];
    snprintf(want_line, sizeof want_line, "loss=%.6f perplexity=", r.loss);
    cr_expect(strstr(out, want_line), "%s not in\n%s", want_line, out);
    char want_aux[64];
    snprintf(want_aux, sizeof want_aux, "aux=%.6f", r.aux);
    cr_expect(r.aux > 0 && isfinite(r.aux), "the router aux loss is reported: %g", r.aux);
    cr_expect(strstr(out, want_aux) && strstr(out, "not included in loss"), "%s not in\n%s", want_aux, out);
    // errors are reported, not crashes
    cr_expect_eq(mt_test_run(out, sizeof out, "eval --model %s --data %s --adapter %s/nowhere", G1, data, tmp), 1);
    cr_expect_eq(mt_test_run(out, sizeof out, "eval --model %s", G1), 2);
}

Test(outputs, eval_of_saved_subset_adapter_and_trained_file) {
    char data[300], dir[300], path[300];
    snprintf(data, sizeof data, "%s/eval.tok", tmp);
    write_tokfile(data, 5, 96, 9);
    // a LoRA on a subset (layer 1, experts 0 and 3, w1 and q), random B
    mt_run_opts lo;
    lora_opts(&lo, 4);
    lo.targets = MT_TARGET_W1 | MT_TARGET_Q;
    cr_assert_eq(mt_index_set_parse(&lo.layers, "1"), 0);
    cr_assert_eq(mt_index_set_parse(&lo.experts, "0,3"), 0);
    mt_model m;
    load(&m, G1, &lo);
    randomize_loras(&m, 4);
    snprintf(dir, sizeof dir, "%s/sub", tmp);
    cr_assert_eq(mt_model_save_adapter(&m, dir, G1), 0, "%s", mt_error_get());
    int64_t tokens;
    double want = direct_mean_ce(&m, data, &tokens);
    mt_model_free(&m);
    mt_run_opts o;
    mt_run_opts_default(&o);
    snprintf(o.model, sizeof o.model, "%s", G1);
    snprintf(o.adapter, sizeof o.adapter, "%s", dir);
    snprintf(o.data, sizeof o.data, "%s", data);
    o.quant = MT_QUANT_NONE;
    mt_eval_result r;
    cr_assert_eq(mt_eval_run(&o, &r), 0, "%s", mt_error_get());
    cr_expect_leq(fabs(r.loss - want) / want, 1e-6, "eval %.9f, direct %.9f", r.loss, want);
    cr_expect_eq(o.targets, MT_TARGET_W1 | MT_TARGET_Q, "the adapter's targets were rebuilt");
    // a trained-tensor file (unfreeze)
    mt_run_opts u;
    unfreeze_opts(&u);
    load(&m, G1, &u);
    perturb_trained(&m, 8);
    snprintf(path, sizeof path, "%s/trained.safetensors", tmp);
    cr_assert_eq(mt_model_save_trained(&m, path), 0, "%s", mt_error_get());
    want = direct_mean_ce(&m, data, &tokens);
    mt_model_free(&m);
    snprintf(o.adapter, sizeof o.adapter, "%s", path);
    cr_assert_eq(mt_eval_run(&o, &r), 0, "%s", mt_error_get());
    cr_expect_eq(o.mode, MT_MODE_UNFREEZE);
    cr_expect_leq(fabs(r.loss - want) / want, 1e-6, "eval %.9f, direct %.9f", r.loss, want);
    // merge of a trained file: its tensors replace the base's, the rest is the base's
    char out[8192], merged[300];
    snprintf(merged, sizeof merged, "%s/merged", tmp);
    cr_assert_eq(mt_test_run(out, sizeof out, "merge --model %s --adapter %s --out %s --dtype f32", G1, path, merged),
                 0, "%s", out);
    mt_st_model st, base;
    mt_st_file tf;
    cr_assert_eq(mt_st_model_open(&st, merged), 0, "%s", mt_error_get());
    cr_assert_eq(mt_st_model_open(&base, G1), 0);
    cr_assert_eq(mt_st_file_open(&tf, path), 0);
    const char *names[] = {"model.layers.1.block_sparse_moe.experts.2.w3.weight", "model.layers.1.block_sparse_moe.gate.weight",
                           "model.layers.1.block_sparse_moe.experts.1.w3.weight", "model.layers.0.block_sparse_moe.gate.weight"};
    for (int i = 0; i < 4; i++) {
        const mt_st_tensor *got = mt_st_model_find(&st, names[i]), *from = mt_st_file_find(&tf, names[i]);
        if (!from) from = mt_st_model_find(&base, names[i]);
        cr_assert(got && from && got->nbytes == from->nbytes, "%s", names[i]);
        cr_expect_eq(memcmp(got->data, from->data, got->nbytes), 0, "%s", names[i]);
    }
    mt_st_file_close(&tf);
    mt_st_model_close(&st), mt_st_model_close(&base);
}

// ---------------------------------------------------------------------------------------------
// generate

Test(outputs, generate_greedy_is_deterministic_and_stops) {
    char out[8192], model[300], out2[8192];
    snprintf(model, sizeof model, "%s/tiny", tmp);
    cr_assert_eq(mt_test_run(out, sizeof out, "init --config %s --out %s --seed 3", TINY, model), 0, "%s", out);
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.quant = MT_QUANT_NONE;
    o.layers.all = 0;  // no LoRA
    mt_model m;
    load(&m, model, &o);
    int32_t prompt[] = {1, 'H', 'i', ' '};
    mt_gen_opts g = {8, 0.0, 1.0, 1, -1};
    mt_ids a = {0}, b = {0};
    int eos;
    cr_assert_eq(mt_generate(&m, prompt, 4, &g, &a, &eos), 0, "%s", mt_error_get());
    cr_assert_eq(mt_generate(&m, prompt, 4, &g, &b, &eos), 0, "%s", mt_error_get());
    cr_expect_eq(a.n, 8, "stops at max_new_tokens");
    cr_expect_eq(eos, 0);
    cr_expect_eq(memcmp(a.v, b.v, a.n * sizeof(int32_t)), 0, "greedy is deterministic");
    // the first token is the argmax of a direct forward
    int32_t labels[4] = {-100, -100, -100, -100};
    mt_batch batch = {1, 4, prompt, labels, NULL};
    mt_loss loss;
    cr_assert_eq(mt_model_forward(&m, &batch, &loss), 0);
    float *row = mt_xmalloc((size_t)m.cfg.vocab * sizeof(float));
    cr_assert_eq(mt_model_logits(&m, 3, 1, row), 0, "%s", mt_error_get());
    int best = 0;
    for (int i = 1; i < m.cfg.vocab; i++)
        if (row[i] > row[best]) best = i;
    free(row);
    cr_expect_eq(a.v[0], best);
    // EOS stops it and is not kept
    g.eos = a.v[0];
    mt_ids c = {0};
    cr_assert_eq(mt_generate(&m, prompt, 4, &g, &c, &eos), 0);
    cr_expect_eq(c.n, 0);
    cr_expect_eq(eos, 1);
    // sampling: reproducible per seed; top-p so small that only the top token is left == greedy
    mt_gen_opts s = {8, 1.0, 1.0, 7, -1};
    mt_ids s1 = {0}, s2 = {0}, s3 = {0}, t1 = {0};
    cr_assert_eq(mt_generate(&m, prompt, 4, &s, &s1, NULL), 0);
    cr_assert_eq(mt_generate(&m, prompt, 4, &s, &s2, NULL), 0);
    s.seed = 8;
    cr_assert_eq(mt_generate(&m, prompt, 4, &s, &s3, NULL), 0);
    cr_expect_eq(memcmp(s1.v, s2.v, 8 * sizeof(int32_t)), 0);
    cr_expect_neq(memcmp(s1.v, s3.v, 8 * sizeof(int32_t)), 0, "another seed, another sample");
    s.top_p = 1e-9;
    cr_assert_eq(mt_generate(&m, prompt, 4, &s, &t1, NULL), 0);
    cr_expect_eq(memcmp(t1.v, a.v, 8 * sizeof(int32_t)), 0);
    s.top_p = 0;
    cr_expect_eq(mt_generate(&m, prompt, 4, &s, &t1, NULL), -1);
    mt_ids_free(&a), mt_ids_free(&b), mt_ids_free(&c), mt_ids_free(&s1), mt_ids_free(&s2), mt_ids_free(&s3);
    mt_ids_free(&t1);
    mt_model_free(&m);
    // the command: same text twice
    const char *args = "generate --model %s --prompt 'Hi ' --max-new-tokens 6 --quant none";
    cr_assert_eq(mt_test_run(out, sizeof out, args, model), 0, "%s", out);
    cr_assert_eq(mt_test_run(out2, sizeof out2, args, model), 0, "%s", out2);
    cr_expect_str_eq(out, out2);
    cr_expect(strstr(out, "stop="), "%s", out);
}

// ---------------------------------------------------------------------------------------------
// merge

Test(outputs, merge_forward_equals_base_plus_adapter) {
    char out[8192], dir[300], path[400];
    snprintf(dir, sizeof dir, "%s/merged", tmp);
    cr_assert_eq(mt_test_run(out, sizeof out, "merge --model %s --adapter %s --out %s --dtype f32", G1, G1, dir), 0,
                 "%s", out);
    mt_run_opts lo;
    lora_opts(&lo, 4);
    mt_model m;
    load(&m, G1, &lo);
    cr_assert_eq(mt_model_load_adapter(&m, G1), 0, "%s", mt_error_get());
    mt_loss l1, l2;
    float *want = forward_logits(&m, &l1);
    size_t n = (size_t)24 * m.cfg.vocab;
    mt_model_free(&m);
    mt_run_opts full;
    mt_run_opts_default(&full);
    full.mode = MT_MODE_FULL;
    full.quant = MT_QUANT_NONE;
    load(&m, dir, &full);
    float *got = forward_logits(&m, &l2);
    double e = rel_err(got, want, n);
    cr_expect_leq(e, 1e-5, "merged logits: relative error %.3g", e);
    cr_expect_leq(fabs(l1.ce - l2.ce) / l1.ce, 1e-5);
    mt_model_free(&m);
    free(got), free(want);
    snprintf(path, sizeof path, "%s/config.json", dir);
    cJSON *j = read_json(path);
    cr_expect_null(cJSON_GetObjectItem(j, "quantization_config"));
    cr_expect_str_eq(cJSON_GetObjectItem(j, "torch_dtype")->valuestring, "float32");
    cJSON_Delete(j);
    // default: the base's dtype (G1 is f32); --dtype bf16 sharded like init
    snprintf(dir, sizeof dir, "%s/merged_default", tmp);
    cr_assert_eq(mt_test_run(out, sizeof out, "merge --model %s --adapter %s --out %s", G1, G1, dir), 0, "%s", out);
    mt_st_model sd;
    cr_assert_eq(mt_st_model_open(&sd, dir), 0, "%s", mt_error_get());
    const mt_st_tensor *td = mt_st_model_find(&sd, "model.layers.0.block_sparse_moe.experts.0.w1.weight");
    cr_assert_not_null(td);
    cr_expect_str_eq(td->dtype, "F32", "an f32 base merges to f32 by default");
    mt_st_model_close(&sd);
    snprintf(dir, sizeof dir, "%s/merged_bf16", tmp);
    cr_assert_eq(mt_test_run(out, sizeof out, "merge --model %s --adapter %s --out %s --shard-size 100KB --dtype bf16", G1,
                             G1, dir), 0, "%s", out);
    mt_st_model st;
    cr_assert_eq(mt_st_model_open(&st, dir), 0, "%s", mt_error_get());
    cr_expect_gt(st.n_files, 1, "sharded");
    const mt_st_tensor *t = mt_st_model_find(&st, "model.layers.0.block_sparse_moe.experts.0.w1.weight");
    cr_assert_not_null(t);
    cr_expect_str_eq(t->dtype, "BF16");
    mt_st_model_close(&st);
    // usage errors
    cr_expect_eq(mt_test_run(out, sizeof out, "merge --model %s --adapter %s --out %s/x --dtype q8", G1, G1, tmp), 2);
    cr_expect_eq(mt_test_run(out, sizeof out, "merge --model %s --adapter %s --out %s", G1, G1, G1), 1, "%s", out);
    cr_expect(strstr(out, "never rewrites the base"), "%s", out);
}

// W' of one adapted Linear against dequant(4-bit W) + scale · B · A in double.
static void expect_merged(const mt_st_model *st, mt_model *q4, const char *module, const mt_model *ad) {
    char name[200];
    snprintf(name, sizeof name, "%s.weight", module);
    const mt_st_tensor *t = mt_st_model_find(st, name);
    cr_assert_not_null(t, "%s", name);
    cr_assert_str_eq(t->dtype, "F32");
    mt_linear *l = mt_model_find_linear(q4, module), *la = mt_model_find_linear((mt_model *)ad, module);
    cr_assert(l && l->q, "%s is 4-bit in the reference", module);
    int64_t out = l->out, in = l->in, r = la->lora->r;
    float *w = mt_xmalloc((size_t)(out * in) * sizeof(float)), *got = mt_xmalloc((size_t)(out * in) * sizeof(float));
    mt_qweight_dequantize_rows_cpu(l->q, w, 0, out);
    memcpy(got, t->data, (size_t)(out * in) * sizeof(float));
    const float *A = la->lora->a->data, *B = la->lora->b->data;
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < out; i++)
        for (int64_t j = 0; j < in; j++) {
            double d = 0;
            for (int64_t k = 0; k < r; k++) d += (double)B[i * r + k] * A[k * in + j];
            double want = w[i * in + j] + (double)la->lora->scale * d;
            worst = fmax(worst, fabs(got[i * in + j] - want));
            scale = fmax(scale, fabs(want));
        }
    cr_expect_leq(worst / scale, 1e-6, "%s: relative error %.3g", module, worst / scale);
    free(w), free(got);
}

static uint64_t file_hash(const char *path) {
    char *d;
    size_t n;
    cr_assert_eq(mt_read_file(path, 1 << 26, &d, &n), 0, "%s", mt_error_get());
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)d[i]) * 1099511628211ull;
    free(d);
    return h;
}

Test(outputs, merge_of_4bit_base_is_dequantized_base_plus_delta) {
    char out[8192], dir[300], qdir[300], dir2[300], path[400];
    // (a) a dense base quantized as training quantizes it (--quant nf4)
    snprintf(dir, sizeof dir, "%s/merged_nf4", tmp);
    cr_assert_eq(mt_test_run(out, sizeof out, "merge --model %s --adapter %s --out %s --dtype f32 --quant nf4", G1, G1,
                             dir), 0, "%s", out);
    mt_run_opts q;
    lora_opts(&q, 4);
    q.quant = MT_QUANT_NF4;
    mt_model ref;  // the 4-bit base + adapter as a run sees it
    load(&ref, G1, &q);
    cr_assert_eq(mt_model_load_adapter(&ref, G1), 0, "%s", mt_error_get());
    mt_st_model st;
    cr_assert_eq(mt_st_model_open(&st, dir), 0, "%s", mt_error_get());
    expect_merged(&st, &ref, "model.layers.0.block_sparse_moe.experts.3.w2", &ref);
    expect_merged(&st, &ref, "model.layers.1.self_attn.k_proj", &ref);
    expect_merged(&st, &ref, "model.layers.1.block_sparse_moe.experts.7.w1", &ref);
    // untouched tensors are copied bit for bit (f32 to f32)
    mt_st_model base;
    cr_assert_eq(mt_st_model_open(&base, G1), 0);
    const mt_st_tensor *e0 = mt_st_model_find(&base, "model.embed_tokens.weight"),
                       *e1 = mt_st_model_find(&st, "model.embed_tokens.weight");
    cr_expect(e0->nbytes == e1->nbytes && memcmp(e0->data, e1->data, e0->nbytes) == 0);
    mt_st_model_close(&base);
    mt_st_model_close(&st);
    // and its forward is the 4-bit run's
    mt_loss l1, l2;
    float *want = forward_logits(&ref, &l1);
    size_t n = (size_t)24 * ref.cfg.vocab;
    mt_model_free(&ref);
    mt_run_opts full;
    mt_run_opts_default(&full);
    full.mode = MT_MODE_FULL;
    full.quant = MT_QUANT_NONE;
    mt_model m;
    load(&m, dir, &full);
    float *got = forward_logits(&m, &l2);
    cr_expect_leq(rel_err(got, want, n), 1e-5, "relative error %.3g", rel_err(got, want, n));
    mt_model_free(&m);
    free(got), free(want);

    // (b) a bnb-4bit checkpoint (moetrain quantize): dequantized, never modified
    snprintf(qdir, sizeof qdir, "%s/g1_nf4", tmp);
    cr_assert_eq(mt_test_run(out, sizeof out, "quantize --model %s --out %s --quant nf4", G1, qdir), 0, "%s", out);
    snprintf(path, sizeof path, "%s/model.safetensors", qdir);
    uint64_t before = file_hash(path);
    snprintf(dir2, sizeof dir2, "%s/merged_bnb", tmp);
    cr_assert_eq(mt_test_run(out, sizeof out, "merge --model %s --adapter %s --out %s --dtype f32", qdir, G1, dir2), 0,
                 "%s", out);
    cr_expect_eq(file_hash(path), before, "the 4-bit base is untouched");
    mt_st_model sa, sb;
    cr_assert_eq(mt_st_model_open(&sa, dir), 0);
    cr_assert_eq(mt_st_model_open(&sb, dir2), 0);
    cr_expect_eq(sa.n_tensors, sb.n_tensors);
    for (size_t i = 0; i < sa.n_tensors; i++) {
        const mt_st_tensor *x = sa.tensors[i], *y = mt_st_model_find(&sb, x->name);
        cr_assert_not_null(y, "%s", x->name);
        cr_expect_str_eq(y->dtype, "F32");
        double err = rel_err(y->data, x->data, x->nbytes / 4);
        cr_expect_leq(err, 1e-6, "%s: bnb merge vs quantize-on-load merge %.3g", x->name, err);
    }
    mt_st_model_close(&sa), mt_st_model_close(&sb);
    snprintf(path, sizeof path, "%s/config.json", dir2);
    cJSON *j = read_json(path);
    cr_expect_null(cJSON_GetObjectItem(j, "quantization_config"), "the merged checkpoint is dense");
    cJSON_Delete(j);
}
