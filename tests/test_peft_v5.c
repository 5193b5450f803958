// tests/test_peft_v5.c — the transformers 5 adapter layout (docs/formats.md "Layout v5") against PEFT's own:
// tests/data/peft_v5/ holds a moetrain v4 adapter (2 layers, 6 experts, r 4, --targets all) and
// peft_v5/, what PEFT 0.21 + transformers 5 made of it (load, convert, save_pretrained), written
// by `FIXTURES=1 scripts/interop.sh`. Our v5 writer must give the same tensors byte for byte,
// and our reader must give back the v4 pairs bit for bit.
#include <criterion/criterion.h>
#include <string.h>

#include "core/common.h"
#include "core/safetensors.h"
#include "lora/peft.h"
#include "test_util.h"

#define FX MT_REPO_ROOT "/tests/data/peft_v5"

typedef struct {
    int n;
    char name[128][128];
    int64_t in[128], out[128];
    float *a[128], *b[128];
    int r;
} pairs;

static int collect(void *ctx, const char *module, const mt_st_tensor *a, const mt_st_tensor *b) {
    pairs *p = ctx;
    cr_assert_lt(p->n, 128);
    cr_assert_str_eq(a->dtype, "F32");
    cr_assert_str_eq(b->dtype, "F32");
    int i = p->n++;
    snprintf(p->name[i], sizeof p->name[i], "%s", module);
    p->in[i] = a->shape[1], p->out[i] = b->shape[0], p->r = (int)a->shape[0];
    p->a[i] = mt_xmalloc(a->nbytes), p->b[i] = mt_xmalloc(b->nbytes);
    memcpy(p->a[i], a->data, a->nbytes), memcpy(p->b[i], b->data, b->nbytes);
    return 0;
}

static void pairs_free(pairs *p) {
    for (int i = 0; i < p->n; i++) free(p->a[i]), free(p->b[i]);
}

static int find(const pairs *p, const char *name) {
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->name[i], name)) return i;
    return -1;
}

static void same_tensors(const char *ours, const char *theirs) {
    mt_st_file a, b;
    cr_assert_eq(mt_st_file_open(&a, ours), 0, "%s", mt_error_get());
    cr_assert_eq(mt_st_file_open(&b, theirs), 0, "%s", mt_error_get());
    cr_assert_eq(a.n_tensors, b.n_tensors, "%zu tensors, PEFT's %zu", a.n_tensors, b.n_tensors);
    for (size_t i = 0; i < b.n_tensors; i++) {
        const mt_st_tensor *t = &b.tensors[i], *o = mt_st_file_find(&a, t->name);
        cr_assert(o, "PEFT's '%s' is missing from ours", t->name);
        cr_assert_str_eq(o->dtype, t->dtype, "%s", t->name);
        cr_assert_eq(o->ndim, t->ndim, "%s", t->name);
        for (int d = 0; d < t->ndim; d++) cr_assert_eq(o->shape[d], t->shape[d], "%s dim %d", t->name, d);
        cr_assert_eq(memcmp(o->data, t->data, t->nbytes), 0, "%s: bytes differ", t->name);
    }
    mt_st_file_close(&a), mt_st_file_close(&b);
}

// A model of `layers` layers, `experts` experts under `names` (moe_module, router, gate, down, up)
// whose Linears are the modules given, all adapted (lin and on hold the lists).
static mt_peft_v5_model model_of(const char *const names[5], int layers, int experts, const mt_peft_module *mods,
                                 int n, const char **lin, unsigned char *on) {
    for (int i = 0; i < n; i++) lin[i] = mods[i].module, on[i] = 1;
    return (mt_peft_v5_model){layers, experts, names[0], names[1], {names[2], names[3], names[4]}, lin, on, (size_t)n, 0};
}

static const char *const MIXTRAL[5] = {"block_sparse_moe", "gate", "w1", "w2", "w3"};

Test(peft_v5, writer_matches_peft_byte_for_byte) {
    pairs v4 = {0};
    mt_peft_config cfg;
    cr_assert_eq(mt_peft_read(FX, &cfg, collect, &v4), 0, "%s", mt_error_get());
    cr_assert_gt(v4.n, 40, "the fixture holds every target of 2 layers x 6 experts");
    mt_peft_module mods[128];
    for (int i = 0; i < v4.n; i++) mods[i] = (mt_peft_module){v4.name[i], v4.in[i], v4.out[i], v4.a[i], v4.b[i]};
    char tmp[64], path[256];
    mt_test_tmpdir(tmp, sizeof tmp);
    const char *lin[128];
    unsigned char on[128];
    mt_peft_v5_model md = model_of(MIXTRAL, 2, 6, mods, v4.n, lin, on);
    cr_assert_eq(mt_peft_write_v5(tmp, &cfg, NULL, &md, mods, (size_t)v4.n, NULL, NULL), 0, "%s", mt_error_get());
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", tmp);
    same_tensors(path, FX "/peft_v5/adapter_model.safetensors");

    // both v5 folders (ours and PEFT's) read back as the v4 pairs, bit for bit
    const char *dirs[] = {tmp, FX "/peft_v5"};
    for (int d = 0; d < 2; d++) {
        pairs back = {0};
        mt_peft_config c2;
        cr_assert_eq(mt_peft_read(dirs[d], &c2, collect, &back), 0, "%s: %s", dirs[d], mt_error_get());
        cr_assert_eq(c2.r, cfg.r);
        cr_assert_eq(c2.r_gate_up, 2 * cfg.r, "gate_up_proj at rank 2r");
        cr_assert_eq(back.n, v4.n, "%s: %d pairs, the v4 adapter %d", dirs[d], back.n, v4.n);
        for (int i = 0; i < back.n; i++) {
            int j = find(&v4, back.name[i]);
            cr_assert_geq(j, 0, "%s: module %s is not in the v4 adapter", dirs[d], back.name[i]);
            cr_assert_eq(memcmp(back.a[i], v4.a[j], (size_t)(cfg.r * v4.in[j]) * 4), 0, "%s A", back.name[i]);
            cr_assert_eq(memcmp(back.b[i], v4.b[j], (size_t)(cfg.r * v4.out[j]) * 4), 0, "%s B", back.name[i]);
        }
        pairs_free(&back);
    }
    mt_test_rmrf(tmp);
    pairs_free(&v4);
}

// An expert subset: experts not adapted are exact zeros in the fused tensors and are not
// reported on reading; a rank_pattern that would change the scale is refused by name.
Test(peft_v5, expert_subset_zeros_and_scale_check) {
    pairs v4 = {0};
    mt_peft_config cfg;
    cr_assert_eq(mt_peft_read(FX, &cfg, collect, &v4), 0, "%s", mt_error_get());
    mt_peft_module mods[128];
    int n = 0;
    for (int i = 0; i < v4.n; i++)
        if (!strstr(v4.name[i], "experts.") || strstr(v4.name[i], "experts.3."))
            mods[n++] = (mt_peft_module){v4.name[i], v4.in[i], v4.out[i], v4.a[i], v4.b[i]};
    char tmp[64], path[256];
    mt_test_tmpdir(tmp, sizeof tmp);
    const char *lin[128];
    unsigned char on[128];
    mt_peft_v5_model md = model_of(MIXTRAL, 2, 6, mods, n, lin, on);
    cr_assert_eq(mt_peft_write_v5(tmp, &cfg, NULL, &md, mods, (size_t)n, NULL, NULL), 0, "%s", mt_error_get());
    pairs back = {0};
    mt_peft_config c2;
    cr_assert_eq(mt_peft_read(tmp, &c2, collect, &back), 0, "%s", mt_error_get());
    cr_assert_eq(back.n, n, "only expert 3 comes back (%d pairs, wrote %d)", back.n, n);
    pairs_free(&back);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", tmp);
    mt_st_file f;
    cr_assert_eq(mt_st_file_open(&f, path), 0);
    const mt_st_tensor *a = mt_st_file_find(&f, "base_model.model.model.layers.0.mlp.experts.base_layer.lora_A.weight");
    cr_assert(a);
    const float *x = a->data;
    for (int64_t i = 0; i < a->shape[0] * a->shape[1]; i++)
        if (i / a->shape[1] / (2 * cfg.r) != 3) cr_assert_eq(x[i], 0.0f, "expert %lld is not zero", (long long)(i / a->shape[1] / (2 * cfg.r)));
    mt_st_file_close(&f);

    // alpha_pattern that changes gate_up_proj's scale
    const char *bad = "{\"peft_type\":\"LORA\",\"r\":4,\"lora_alpha\":4,\"rank_pattern\":{\".*\\\\.gate_up_proj\":8},"
                      "\"alpha_pattern\":{\".*\\\\.gate_up_proj\":4}}";
    mt_peft_config c3;
    cr_assert_neq(mt_peft_config_parse(bad, strlen(bad), "x/adapter_config.json", &c3), 0);
    cr_assert(strstr(mt_error_get(), "gate_up_proj") && strstr(mt_error_get(), "x/adapter_config.json"), "%s", mt_error_get());
    const char *other = "{\"peft_type\":\"LORA\",\"r\":4,\"rank_pattern\":{\"q_proj\":8}}";
    cr_assert_neq(mt_peft_config_parse(other, strlen(other), "y.json", &c3), 0);
    cr_assert(strstr(mt_error_get(), "q_proj"), "%s", mt_error_get());
    mt_test_rmrf(tmp);
    pairs_free(&v4);
}

Test(peft_v5, format_auto_follows_the_declared_transformers) {
    char tmp[64], path[256];
    mt_test_tmpdir(tmp, sizeof tmp);
    mt_peft_format f;
    cr_assert_eq(mt_peft_format_parse("auto", tmp, &f), 0);
    cr_assert_eq(f, MT_PEFT_V5, "nothing declared: v5");
    snprintf(path, sizeof path, "%s/config.json", tmp);
    FILE *fp = fopen(path, "w");
    fputs("{\"transformers_version\": \"4.57.6\"}", fp);
    fclose(fp);
    cr_assert_eq(mt_peft_format_parse("auto", tmp, &f), 0);
    cr_assert_eq(f, MT_PEFT_V4);
    cr_assert_eq(mt_peft_format_parse("v5", tmp, &f), 0);
    cr_assert_eq(f, MT_PEFT_V5);
    cr_assert_neq(mt_peft_format_parse("v6", tmp, &f), 0);
    cr_assert(strstr(mt_error_get(), "--peft-format"), "%s", mt_error_get());
    mt_test_rmrf(tmp);
}

// The CLI end to end: the same training written as v4 and as v5 evaluates to the same loss, and
// a v5 adapter given to train --adapter (lr ~0) comes out as the same model in v4.
static void loss_line(const char *out, char *line, size_t n) {
    const char *p = strstr(out, "loss=");
    cr_assert(p, "no loss= in\n%s", out);
    size_t k = strcspn(p, " ");
    snprintf(line, n, "%.*s", (int)k, p);
}

Test(peft_v5, cli_v4_and_v5_same_loss_and_train_from_adapter, .timeout = 120) {
    char tmp[64], model[128], data[128], out[16384], dir[256], l4[64], l5[64], lr[64];
    mt_test_tmpdir(tmp, sizeof tmp);
    cr_assert_eq(mt_test_tiny_run_inputs(tmp, model, data, 6), 0);
    const char *common = "--mode lora --r 4 --targets all --experts 0,2 --quant none --steps 2 --seq 32 --lr 0.02";
    for (int v = 4; v <= 5; v++) {
        cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --out %s/v%d --peft-format v%d", model, data,
                                 common, tmp, v, v), 0, "%s", out);
        cr_assert_eq(mt_test_run(out, sizeof out, "eval --model %s --adapter %s/v%d/adapter --data %s --quant none",
                                 model, tmp, v, data), 0, "%s", out);
        loss_line(out, v == 4 ? l4 : l5, 64);
    }
    cr_expect_str_eq(l4, l5, "v4 and v5 adapters of one training evaluate alike");
    snprintf(dir, sizeof dir, "%s/v5/adapter/adapter_model.safetensors", tmp);
    mt_st_file f;
    cr_assert_eq(mt_st_file_open(&f, dir), 0, "%s", mt_error_get());
    cr_expect_not_null(mt_st_file_find(&f, "base_model.model.model.layers.0.mlp.experts.base_layer.lora_A.weight"));
    mt_st_file_close(&f);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s %s --lr 1e-12 --out %s/again --peft-format v4 "
                             "--adapter %s/v5/adapter", model, data, common, tmp, tmp), 0, "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "eval --model %s --adapter %s/again/adapter --data %s --quant none", model,
                             tmp, data), 0, "%s", out);
    loss_line(out, lr, sizeof lr);
    cr_expect_str_eq(lr, l5, "train --adapter starts from the adapter");
    mt_test_rmrf(tmp);
}

// A fused tensor that does not split into E blocks of the rank is an error naming file and key.
static int zero_fill(void *ctx, size_t index, void *dst, size_t nbytes) {
    (void)ctx, (void)index;
    memset(dst, 0, nbytes);
    return 0;
}

static int refuse_pair(void *ctx, const char *module, const mt_st_tensor *a, const mt_st_tensor *b) {
    (void)ctx, (void)module, (void)a, (void)b;
    return 0;
}

Test(peft_v5, bad_fused_shape_is_named) {
    char tmp[64], path[256];
    mt_test_tmpdir(tmp, sizeof tmp);
    mt_st_entry e[2] = {
        {"base_model.model.model.layers.0.mlp.experts.base_layer.lora_A.weight", "F32", 2, {7, 40}, NULL},
        {"base_model.model.model.layers.0.mlp.experts.base_layer.lora_B.weight", "F32", 2, {112, 7}, NULL},
    };
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", tmp);
    cr_assert_eq(mt_st_write(path, e, 2, NULL, zero_fill, NULL), 0, "%s", mt_error_get());
    snprintf(path, sizeof path, "%s/adapter_config.json", tmp);
    FILE *f = fopen(path, "w");
    fputs("{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 4, \"target_parameters\": [\"gate_up_proj\"]}", f);
    fclose(f);
    mt_peft_config cfg;
    cr_assert_neq(mt_peft_read(tmp, &cfg, refuse_pair, NULL), 0);
    const char *err = mt_error_get();
    cr_expect(strstr(err, "adapter_model.safetensors") && strstr(err, "base_layer.lora_A.weight") &&
              strstr(err, "gate_up_proj"), "%s", err);
    mt_test_rmrf(tmp);
}
