// quant/ checkpoints: bnb-4bit import and its errors, quantize-on-load, `moetrain quantize`
// round trips, and a checkpoint made by transformers + bitsandbytes (tests/data/quant/hf_micro_*).
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/backend.h"
#include "core/common.h"
#include "core/fileio.h"
#include "core/safetensors.h"
#include "model/config.h"
#include "quant/quant.h"
#include "tests/test_util.h"

#define TINY MT_REPO_ROOT "/configs/tiny.json"
#define HF_BF16 MT_REPO_ROOT "/tests/data/quant/hf_micro_bf16"
#define HF_NF4 MT_REPO_ROOT "/tests/data/quant/hf_micro_nf4"

// ---------------------------------------------------------------------------------------------
// Collecting what a load hands over

typedef struct {
    char name[160];
    int quantized;
    mt_qweight q;      // taken from the loader
    void *data;        // a copy of dense values
    mt_dtype dtype;
    size_t bytes;
    int ndim;
    int64_t shape[MT_ST_MAX_DIMS];
} item;

typedef struct {
    item *items;
    int n, cap;
} collection;

static int collect(void *ctx, mt_quant_item *it) {
    collection *c = ctx;
    if (c->n == c->cap) c->items = mt_xrealloc(c->items, (size_t)(c->cap = c->cap ? 2 * c->cap : 64) * sizeof(item));
    item *x = &c->items[c->n++];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", it->name);
    x->ndim = it->ndim;
    memcpy(x->shape, it->shape, sizeof x->shape);
    if (it->q) {
        x->quantized = 1;
        x->q = *it->q;  // take it
        memset(it->q, 0, sizeof *it->q);
    } else {
        size_t n = 1;
        for (int d = 0; d < it->ndim; d++) n *= (size_t)it->shape[d];
        x->dtype = it->dtype;
        x->bytes = mt_dtype_bytes(it->dtype, n);
        x->data = mt_xmalloc(x->bytes ? x->bytes : 1);
        memcpy(x->data, it->data, x->bytes);
    }
    return 0;
}

static void collection_free(collection *c) {
    for (int i = 0; i < c->n; i++) {
        mt_qweight_free(&c->items[i].q);
        free(c->items[i].data);
    }
    free(c->items);
    memset(c, 0, sizeof *c);
}

static const item *find(const collection *c, const char *name) {
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->items[i].name, name) == 0) return &c->items[i];
    return NULL;
}

static int tensor_equal(const mt_tensor *a, const mt_tensor *b) {
    if (!a || !b) return a == b;
    return a->dtype == b->dtype && a->nbytes == b->nbytes && memcmp(a->data, b->data, a->nbytes) == 0;
}

static void expect_same_qweight(const mt_qweight *a, const mt_qweight *b, const char *what) {
    cr_expect(a->type == b->type && a->blocksize == b->blocksize && a->double_quant == b->double_quant &&
                  a->out == b->out && a->in == b->in && a->dtype == b->dtype,
              "%s: description differs", what);
    cr_expect(memcmp(&a->offset, &b->offset, 4) == 0, "%s: offset %.9g vs %.9g", what, a->offset, b->offset);
    cr_expect(tensor_equal(a->packed, b->packed), "%s: packed codes differ", what);
    cr_expect(tensor_equal(a->absmax, b->absmax), "%s: absmax differs", what);
    cr_expect(tensor_equal(a->zero, b->zero), "%s: zero differs", what);
    cr_expect(tensor_equal(a->nested_absmax, b->nested_absmax), "%s: nested absmax differs", what);
    cr_expect(tensor_equal(a->nested_map, b->nested_map), "%s: nested map differs", what);
}

// Every item of a equals the one of the same name in b.
static void expect_same_load(const collection *a, const collection *b) {
    cr_assert_eq(a->n, b->n, "%d vs %d tensors", a->n, b->n);
    for (int i = 0; i < a->n; i++) {
        const item *x = &a->items[i], *y = find(b, x->name);
        cr_assert_not_null(y, "%s missing", x->name);
        cr_assert_eq(x->quantized, y->quantized, "%s: quantized in one only", x->name);
        if (x->quantized) expect_same_qweight(&x->q, &y->q, x->name);
        else cr_expect(x->dtype == y->dtype && x->bytes == y->bytes && memcmp(x->data, y->data, x->bytes) == 0,
                       "%s: dense values differ", x->name);
    }
}

static void load(const char *dir, mt_backend *be, const mt_quant_load_opts *o, collection *c) {
    memset(c, 0, sizeof *c);
    cr_assert_eq(mt_quant_load(dir, be, o, collect, c), 0, "%s", mt_error_get());
}

static char out[1 << 16];

static void init_tiny(const char *dir) {
    cr_assert_eq(mt_test_run(out, sizeof out, "init --config %s --out %s --dtype bf16 --seed 5", TINY, dir), 0, "%s", out);
}

// ---------------------------------------------------------------------------------------------
// Quantize on load

Test(quant_load, targets_by_name) {
    cr_expect_eq(mt_quant_target_of("model.layers.3.block_sparse_moe.experts.7.w2.weight"), MT_QTARGET_EXPERTS);
    cr_expect_eq(mt_quant_target_of("model.layers.3.mlp.experts.7.down_proj.weight"), MT_QTARGET_EXPERTS);
    cr_expect_eq(mt_quant_target_of("model.layers.0.self_attn.k_proj.weight"), MT_QTARGET_ATTN);
    cr_expect_eq(mt_quant_target_of("model.layers.0.block_sparse_moe.gate.weight"), MT_QTARGET_ROUTER);
    // Qwen's shared expert and a dense layer's MLP are MLPs like the experts; the shared gate is not.
    cr_expect_eq(mt_quant_target_of("model.layers.1.mlp.shared_expert.up_proj.weight"), MT_QTARGET_EXPERTS);
    cr_expect_eq(mt_quant_target_of("model.layers.0.mlp.down_proj.weight"), MT_QTARGET_EXPERTS);
    cr_expect_eq(mt_quant_target_of("model.layers.1.mlp.shared_expert_gate.weight"), 0);
    cr_expect_eq(mt_quant_target_of("model.layers.1.mlp.gate.weight"), MT_QTARGET_ROUTER);
    cr_expect_eq(mt_quant_target_of("model.embed_tokens.weight"), 0);
    cr_expect_eq(mt_quant_target_of("lm_head.weight"), 0);
    cr_expect_eq(mt_quant_target_of("model.layers.0.input_layernorm.weight"), 0);
    unsigned t;
    cr_expect_eq(mt_quant_targets_parse("experts,router", &t), 0);
    cr_expect_eq(t, MT_QTARGET_EXPERTS | MT_QTARGET_ROUTER);
    cr_expect_eq(mt_quant_targets_parse("all", &t), 0);
    cr_expect_eq(t, MT_QTARGET_ALL);
    cr_expect_neq(mt_quant_targets_parse("experts,", &t), 0);
    cr_expect_neq(mt_quant_targets_parse("lm_head", &t), 0);
    cr_expect(strstr(mt_error_get(), "lm_head"), "%s", mt_error_get());
}

// Defaults: experts and attention quantized, each equal to quantizing the tensor directly; the
// router, embeddings, norms and lm_head handed over as stored.
Test(quant_load, default_targets_on_a_tiny_checkpoint) {
    char tmp[64], dir[128];
    mt_test_tmpdir(tmp, sizeof tmp);
    snprintf(dir, sizeof dir, "%s/tiny", tmp);
    init_tiny(dir);
    mt_backend *cpu = mt_backend_cpu_new();
    mt_quant_load_opts o;
    mt_quant_load_opts_default(&o);
    collection c;
    load(dir, cpu, &o, &c);
    mt_st_model m;
    cr_assert_eq(mt_st_model_open(&m, dir), 0, "%s", mt_error_get());
    cr_assert_eq((size_t)c.n, m.n_tensors);
    int quantized = 0;
    uint64_t base = 0;
    for (int i = 0; i < c.n; i++) {
        const item *x = &c.items[i];
        unsigned tgt = mt_quant_target_of(x->name);
        cr_expect_eq(x->quantized, (tgt & MT_QTARGET_DEFAULT) != 0, "%s", x->name);
        const mt_st_tensor *t = mt_st_model_find(&m, x->name);
        if (x->quantized) {
            mt_qweight q;
            cr_assert_eq(mt_qweight_quantize_from(&q, cpu, x->name, t->data, MT_BF16, t->shape[0], t->shape[1],
                                                  MT_QUANT_NF4, 64, 1, NULL), 0);
            expect_same_qweight(&x->q, &q, x->name);
            base += mt_qweight_bytes(&q);
            mt_qweight_free(&q);
            quantized++;
        } else {
            cr_expect_eq(x->dtype, MT_BF16, "%s", x->name);
            cr_expect_eq(memcmp(x->data, t->data, t->nbytes), 0, "%s as stored", x->name);
        }
    }
    cr_expect_eq(quantized, 2 * (4 + 8 * 3), "tiny: 2 layers of 4 attention + 24 expert Linears");
    mt_st_model_close(&m);
    // On the null backend the same load counts the same base bytes and computes nothing.
    mt_backend *null = mt_backend_null_new();
    collection cn;
    load(dir, null, &o, &cn);
    cr_expect_eq(null->ledger.cur[MT_MEM_BASE], base);
    collection_free(&cn);
    collection_free(&c);
    mt_backend_free(null);
    mt_backend_free(cpu);
    mt_test_rmrf(tmp);
}

// ---------------------------------------------------------------------------------------------
// `moetrain quantize` output reloads equal to quantize-on-load

static void roundtrip(const char *src, const char *tmp, const char *flags, mt_quant type, int dq, int bs,
                      unsigned targets) {
    char q[256];
    snprintf(q, sizeof q, "%s/q", tmp);
    mt_test_rmrf(q);
    cr_assert_eq(mt_test_run(out, sizeof out, "quantize --model %s --out %s %s", src, q, flags), 0, "%s", out);
    cr_expect(strstr(out, "quantized_tensors="), "%s", out);
    mt_quant_load_opts o = {.type = type, .blocksize = bs, .double_quant = dq, .targets = targets};
    mt_backend *cpu = mt_backend_cpu_new();
    collection a, b;
    load(q, cpu, &o, &a);
    load(src, cpu, &o, &b);
    expect_same_load(&a, &b);
    collection_free(&a);
    collection_free(&b);
    mt_backend_free(cpu);
    mt_model_config cfg;
    cr_assert_eq(mt_model_config_load(q, &cfg), 0, "%s", mt_error_get());
    cr_expect_eq(cfg.quantized, type != MT_QUANT_INT4);
    if (cfg.quantized) {
        cr_expect_str_eq(cfg.quant_type, mt_qformats[type].name);
        cr_expect_eq(cfg.double_quant, dq);
    }
}

Test(quant_load, quantize_command_round_trips, .timeout = 60) {
    char tmp[64], src[128];
    mt_test_tmpdir(tmp, sizeof tmp);
    snprintf(src, sizeof src, "%s/tiny", tmp);
    init_tiny(src);
    roundtrip(src, tmp, "--quant nf4 --double-quant", MT_QUANT_NF4, 1, 64, MT_QTARGET_DEFAULT);
    // transformers converts every Linear its skip list does not name: the router stays dense.
    char path[256], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/q/config.json", tmp);
    cr_assert_eq(mt_read_file(path, 1 << 20, &text, &len), 0);
    cr_expect(strstr(text, "\"llm_int8_skip_modules\": [\"lm_head\", \"gate\"]"), "%s", text);
    free(text);
    roundtrip(src, tmp, "--quant nf4 --no-double-quant --blocksize 128", MT_QUANT_NF4, 0, 128, MT_QTARGET_DEFAULT);
    roundtrip(src, tmp, "--quant fp4 --double-quant --shard-size 100KB", MT_QUANT_FP4, 1, 64, MT_QTARGET_DEFAULT);
    roundtrip(src, tmp, "--quant int4", MT_QUANT_INT4, 0, 0, MT_QTARGET_DEFAULT);
    roundtrip(src, tmp, "--quant nf4 --quant-targets all", MT_QUANT_NF4, 1, 64, MT_QTARGET_ALL);
    snprintf(path, sizeof path, "%s/q/model.safetensors", tmp);
    cr_expect_eq(access(path, F_OK), 0);
    // That last one has a quantized router; loading it with the default targets hands the router
    // over dense: the dequantization of what quantize-on-load with the router makes.
    mt_backend *cpu = mt_backend_cpu_new();
    mt_quant_load_opts o;
    mt_quant_load_opts_default(&o);
    collection a, b;
    snprintf(path, sizeof path, "%s/q", tmp);
    load(path, cpu, &o, &a);
    o.targets = MT_QTARGET_ALL;
    load(src, cpu, &o, &b);
    const char *gate = "model.layers.1.block_sparse_moe.gate.weight";
    const item *x = find(&a, gate), *y = find(&b, gate);
    cr_assert(x && y && !x->quantized && y->quantized);
    cr_assert_eq(x->dtype, MT_F32);
    float *want = mt_xmalloc((size_t)(y->q.out * y->q.in) * sizeof(float));
    mt_qweight_dequantize_rows_cpu(&y->q, want, 0, y->q.out);
    cr_expect_eq(memcmp(x->data, want, x->bytes), 0, "router dequantized on load");
    free(want);
    collection_free(&a);
    collection_free(&b);
    mt_backend_free(cpu);
    mt_test_rmrf(tmp);
}

Test(quant_load, quantize_command_refuses_bad_flags) {
    char tmp[64];
    mt_test_tmpdir(tmp, sizeof tmp);
    cr_expect_eq(mt_test_run(out, sizeof out, "quantize --model %s --out %s/x --quant int8", tmp, tmp), MT_EXIT_USAGE);
    cr_expect(strstr(out, "int8"), "%s", out);
    cr_expect_eq(mt_test_run(out, sizeof out, "quantize --model %s --out %s --quant nf4", tmp, tmp), MT_EXIT_USAGE);
    cr_expect(strstr(out, "--out"), "%s", out);
    cr_expect_eq(mt_test_run(out, sizeof out, "quantize --model %s/none --out %s/x", tmp, tmp), MT_EXIT_ERROR);
    cr_expect_eq(mt_test_run(out, sizeof out, "quantize --help"), 0);
    cr_expect(strstr(out, "--quant-targets"), "%s", out);
    mt_test_rmrf(tmp);
}

// ---------------------------------------------------------------------------------------------
// A checkpoint made by transformers + bitsandbytes

// `moetrain quantize --quant-targets all` of the same bf16 checkpoint writes the same tensors,
// byte for byte: names, dtypes, shapes, packed codes, constants and quant_state JSON.
Test(quant_load, hf_bnb_checkpoint_reproduced_byte_for_byte) {
    char tmp[64], q[128];
    mt_test_tmpdir(tmp, sizeof tmp);
    snprintf(q, sizeof q, "%s/q", tmp);
    cr_assert_eq(mt_test_run(out, sizeof out, "quantize --model %s --out %s --quant nf4 --quant-targets all", HF_BF16, q),
                 0, "%s", out);
    mt_st_model a, b;
    cr_assert_eq(mt_st_model_open(&a, q), 0, "%s", mt_error_get());
    cr_assert_eq(mt_st_model_open(&b, HF_NF4), 0, "%s", mt_error_get());
    cr_assert_eq(a.n_tensors, b.n_tensors);
    for (size_t i = 0; i < b.n_tensors; i++) {
        const mt_st_tensor *y = b.tensors[i], *x = mt_st_model_find(&a, y->name);
        cr_assert_not_null(x, "%s missing", y->name);
        cr_expect_str_eq(x->dtype, y->dtype, "%s", y->name);
        cr_expect_eq(x->ndim, y->ndim, "%s", y->name);
        cr_expect(x->nbytes == y->nbytes && memcmp(x->data, y->data, x->nbytes) == 0, "%s: bytes differ", y->name);
    }
    mt_st_model_close(&a);
    mt_st_model_close(&b);
    mt_model_config c1, c2;
    cr_assert_eq(mt_model_config_load(q, &c1), 0, "%s", mt_error_get());
    cr_assert_eq(mt_model_config_load(HF_NF4, &c2), 0, "%s", mt_error_get());
    cr_expect(c1.quantized && c2.quantized && strcmp(c1.quant_type, c2.quant_type) == 0 &&
              c1.double_quant == c2.double_quant);
    mt_test_rmrf(tmp);
}

// transformers quantizes the router too; it loads, handed over dense under the default targets.
Test(quant_load, hf_bnb_checkpoint_loads) {
    mt_backend *cpu = mt_backend_cpu_new();
    mt_quant_load_opts o;
    mt_quant_load_opts_default(&o);
    collection c;
    load(HF_NF4, cpu, &o, &c);
    const item *gate = find(&c, "model.layers.0.block_sparse_moe.gate.weight");
    const item *w2 = find(&c, "model.layers.0.block_sparse_moe.experts.1.w2.weight");
    const item *emb = find(&c, "model.embed_tokens.weight");
    cr_assert(gate && w2 && emb);
    cr_expect(!gate->quantized && gate->dtype == MT_F32 && gate->shape[0] == 2 && gate->shape[1] == 32);
    cr_expect(w2->quantized && w2->q.type == MT_QUANT_NF4 && w2->q.double_quant && w2->q.dtype == MT_BF16);
    cr_expect(!emb->quantized && emb->dtype == MT_BF16);
    cr_expect_eq(c.n, 1 + 3 + 4 + 1 + 2 * 3 + 1, "embed, 3 norms, 4 attention, gate, 6 experts, lm_head");
    collection_free(&c);
    mt_backend_free(cpu);
}

// ---------------------------------------------------------------------------------------------
// Bad input: a clear error naming the tensor

#define PNAME "model.layers.0.self_attn.q_proj.weight"

// A serialised NF4-DQ weight [8, 64] as entries the tests then spoil.
typedef struct {
    mt_backend *cpu;
    mt_qweight q;
    mt_bnb_entries ex;
    mt_st_entry e[8];
    size_t n;
    char tmp[64];
} spoil;

static void spoil_init(spoil *s) {
    memset(s, 0, sizeof *s);
    s->cpu = mt_backend_cpu_new();
    float w[512];
    for (int i = 0; i < 512; i++) w[i] = sinf((float)i) * 0.02f;
    cr_assert_eq(mt_qweight_quantize(&s->q, s->cpu, PNAME, w, 8, 64, MT_QUANT_NF4, 64, 1), 0);
    s->q.dtype = MT_BF16;
    mt_bnb_export(&s->ex, PNAME, &s->q);
    memcpy(s->e, s->ex.entries, s->ex.n * sizeof s->e[0]);
    s->n = s->ex.n;
    mt_test_tmpdir(s->tmp, sizeof s->tmp);
}

static mt_st_entry *entry(spoil *s, const char *suffix) {
    char name[200];
    snprintf(name, sizeof name, PNAME "%s", suffix);
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->e[i].name, name) == 0) return &s->e[i];
    cr_assert_fail("no entry %s", name);
    return NULL;
}

static void drop(spoil *s, const char *suffix) {
    mt_st_entry *e = entry(s, suffix);
    size_t i = (size_t)(e - s->e);
    memmove(e, e + 1, (s->n - i - 1) * sizeof *e);
    s->n--;
}

// Writes the entries and loads them; returns the error (empty string: it loaded).
static const char *spoil_load(spoil *s) {
    char path[256];
    snprintf(path, sizeof path, "%s/model.safetensors", s->tmp);
    cr_assert_eq(mt_st_write(path, s->e, s->n, NULL, NULL, NULL), 0, "%s", mt_error_get());
    mt_quant_load_opts o;
    mt_quant_load_opts_default(&o);
    collection c = {0};
    int rc = mt_quant_load(s->tmp, s->cpu, &o, collect, &c);
    collection_free(&c);
    return rc == 0 ? "" : mt_error_get();
}

static void spoil_free(spoil *s) {
    mt_bnb_export_free(&s->ex);
    mt_qweight_free(&s->q);
    mt_backend_free(s->cpu);
    mt_test_rmrf(s->tmp);
}

static void expect_error(spoil *s, const char *needle) {
    const char *err = spoil_load(s);
    cr_expect(strstr(err, PNAME) && strstr(err, needle), "error should name " PNAME " and say '%s': '%s'", needle, err);
}

Test(quant_load, unspoilt_loads) {
    spoil s;
    spoil_init(&s);
    cr_expect_str_eq(spoil_load(&s), "");
    spoil_free(&s);
}

Test(quant_load, malformed_quant_state) {
    static const char *const bad[][2] = {
        {"{\"quant_type\": \"nf4\", \"blocksize\": 64", "malformed quant_state"},
        {"[1, 2]", "not a JSON object"},
        {"{\"quant_type\": \"fp4\", \"blocksize\": 64, \"dtype\": \"bfloat16\", \"shape\": [8, 64]}", "quant_type"},
        {"{\"quant_type\": \"nf4\", \"blocksize\": 48, \"dtype\": \"bfloat16\", \"shape\": [8, 64]}", "blocksize"},
        {"{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"int8\", \"shape\": [8, 64]}", "dtype"},
        {"{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"bfloat16\", \"shape\": [512]}", "shape"},
        {"{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"bfloat16\", \"shape\": [8, 64], \"x\": 1}", "unknown key"},
        {"{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"bfloat16\", \"shape\": [8, 64], "
         "\"nested_blocksize\": 128, \"nested_dtype\": \"float32\", \"nested_offset\": 0.1}", "nested_blocksize"},
        // finite as a double, infinite as the float32 it is stored in (found by fuzz_quant_state)
        {"{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"bfloat16\", \"shape\": [8, 64], "
         "\"nested_blocksize\": 256, \"nested_dtype\": \"float32\", \"nested_offset\": 1e300}", "nested_offset"},
        // the shape in the JSON disagrees with the packed bytes
        {"{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"bfloat16\", \"shape\": [16, 64], "
         "\"nested_blocksize\": 256, \"nested_dtype\": \"float32\", \"nested_offset\": 0.1}", "wrong shape"},
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(bad); i++) {
        spoil s;
        spoil_init(&s);
        mt_st_entry *e = entry(&s, ".quant_state.bitsandbytes__nf4");
        e->data = bad[i][0];
        e->shape[0] = (int64_t)strlen(bad[i][0]);
        expect_error(&s, bad[i][1]);
        spoil_free(&s);
    }
}

Test(quant_load, wrong_shape_and_dtype) {
    spoil s;
    spoil_init(&s);
    mt_st_entry *w = entry(&s, "");
    w->shape[0] = 128, w->shape[1] = 2;  // the same bytes, not bitsandbytes' [n/2, 1]
    expect_error(&s, "wrong shape [128, 2]");
    spoil_free(&s);

    spoil_init(&s);
    entry(&s, ".absmax")->dtype = "I8";
    expect_error(&s, "wrong dtype I8");
    spoil_free(&s);

    spoil_init(&s);
    mt_st_entry *m = entry(&s, ".nested_absmax");
    m->dtype = "F16";  // 4 bytes: two F16 where one F32 was
    m->shape[0] = 2;
    expect_error(&s, "wrong dtype F16");
    spoil_free(&s);

    spoil_init(&s);
    static const float not_nf4[16] = {1, 2, 3};
    entry(&s, ".quant_map")->data = not_nf4;
    expect_error(&s, "codebook");
    spoil_free(&s);

    // a dense target of a dtype nothing can quantize
    spoil_init(&s);
    w = entry(&s, "");
    w->dtype = "I32", w->shape[0] = 64, w->shape[1] = 1;
    s.n = 1;
    expect_error(&s, "wrong dtype I32");
    spoil_free(&s);
}

Test(quant_load, missing_constants) {
    static const char *const parts[] = {".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map"};
    for (size_t i = 0; i < MT_ARRAY_LEN(parts); i++) {
        spoil s;
        spoil_init(&s);
        drop(&s, parts[i]);
        char needle[64];
        snprintf(needle, sizeof needle, "missing " PNAME "%s", parts[i]);
        expect_error(&s, needle);
        spoil_free(&s);
    }
    spoil s;
    spoil_init(&s);
    drop(&s, ".quant_state.bitsandbytes__nf4");
    expect_error(&s, "without a quant_state");
    spoil_free(&s);
    spoil_init(&s);  // a constant whose weight is not there
    drop(&s, "");
    const char *err = spoil_load(&s);
    cr_expect(strstr(err, "without its weight '" PNAME "'"), "%s", err);
    spoil_free(&s);
}

// A nested map other than the canonical one (bitsandbytes' older CPU builds stored code[0] = -1)
// is the one used, in the weight's own copy (1 KiB more under base).
Test(quant_load, own_nested_map_is_used) {
    spoil s;
    spoil_init(&s);
    float map[256];
    memcpy(map, mt_dynamic_map, sizeof map);
    map[0] = -1.0f;
    map[200] *= 0.5f;
    entry(&s, ".nested_quant_map")->data = map;
    char path[256];
    snprintf(path, sizeof path, "%s/model.safetensors", s.tmp);
    cr_assert_eq(mt_st_write(path, s.e, s.n, NULL, NULL, NULL), 0);
    mt_st_model m;
    cr_assert_eq(mt_st_model_open(&m, s.tmp), 0);
    mt_bnb_parts parts;
    cr_assert_eq(mt_bnb_find_parts(&m, PNAME, &parts), 1);
    mt_qweight q;
    cr_assert_eq(mt_qweight_import(&q, s.cpu, PNAME, &parts), 0, "%s", mt_error_get());
    cr_assert_not_null(q.nested_map);
    cr_expect_eq(mt_qweight_bytes(&q), mt_q4_weight_bytes(MT_QUANT_NF4, 512, 64, 1) + 1024);
    float got[512], ref[512], scales[8];
    mt_qweight_dequantize_rows_cpu(&q, got, 0, 8);
    mt_q8_dequantize_ref(map, q.absmax->data, q.nested_absmax->data, q.offset, 0, 8, scales);
    mt_q4_dequantize_ref(mt_nf4_map, q.packed->data, scales, 64, 0, 512, ref);
    cr_expect_eq(memcmp(got, ref, sizeof got), 0);
    mt_qweight_free(&q);
    mt_st_model_close(&m);
    spoil_free(&s);
}

// Qwen2-MoE's shared_expert_gate [1, H] stays dense in a quantized checkpoint, so the skip list
// names it (transformers 4.57 left it a 4-bit Linear without data: "Cannot copy out of meta tensor"),
// with the default targets and with --quant-targets all alike.
Test(quant_load, quantize_names_the_dense_shared_expert_gate, .timeout = 60) {
    char tmp[64], src[128], out[1024], path[256], *text;
    size_t len;
    mt_test_tmpdir(tmp, sizeof tmp);
    snprintf(src, sizeof src, "%s/qwen2", tmp);
    cr_assert_eq(mt_test_run(out, sizeof out, "init --config %s/configs/tiny-qwen2-moe.json --out %s", MT_REPO_ROOT, src),
                 0, "%s", out);
    const char *targets[] = {"", "--quant-targets all"};
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(mt_test_run(out, sizeof out, "quantize --model %s --quant nf4 %s --out %s/q%d", src, targets[i], tmp,
                                 i), 0, "%s", out);
        snprintf(path, sizeof path, "%s/q%d/config.json", tmp, i);
        cr_assert_eq(mt_read_file(path, 1 << 20, &text, &len), 0);
        cr_expect(strstr(text, "\"shared_expert_gate\"]"), "%s: %s", targets[i], strstr(text, "llm_int8_skip_modules"));
        free(text);
    }
    mt_test_rmrf(tmp);
}

// ---------------------------------------------------------------------------------------------
// Block FP8 (DeepSeek-V3, Kimi K2). tests/data/quant/fp8_tiny: configs/tiny.json's attention and
// expert Linears in F8_E4M3, 32 x 48 blocks (ragged on every shape); fp8_tiny_f32: the same
// checkpoint with transformers' f32 dequantization of them (scripts/make_fp8_fixtures.py).

#define FP8_TINY MT_REPO_ROOT "/tests/data/quant/fp8_tiny"
#define FP8_TINY_F32 MT_REPO_ROOT "/tests/data/quant/fp8_tiny_f32"

// Every format, and dense: the FP8 checkpoint hands over what its f32 dequantization does, bit for
// bit, and its scales are consumed, not handed over.
Test(quant_load, fp8_checkpoint_loads_as_its_f32_dequantization) {
    mt_model_config cfg;
    cr_assert_eq(mt_model_config_load(FP8_TINY, &cfg), 0, "%s", mt_error_get());
    mt_backend *cpu = mt_backend_cpu_new();
    static const mt_quant types[] = {MT_QUANT_NF4, MT_QUANT_INT4, MT_QUANT_MXFP4, MT_QUANT_NONE};
    for (size_t k = 0; k < MT_ARRAY_LEN(types); k++) {
        mt_quant_load_opts o;
        mt_quant_load_opts_default(&o);
        o.type = types[k];
        o.fp8_block[0] = cfg.fp8_block[0], o.fp8_block[1] = cfg.fp8_block[1];
        collection a, b;
        load(FP8_TINY, cpu, &o, &a);
        load(FP8_TINY_F32, cpu, &o, &b);
        expect_same_load(&a, &b);
        int quantized = 0, f32 = 0;
        for (int i = 0; i < a.n; i++) quantized += a.items[i].quantized, f32 += a.items[i].dtype == MT_F32;
        cr_expect_eq(types[k] == MT_QUANT_NONE ? f32 : quantized, 2 * (4 + 8 * 3), "%s", mt_quant_name(types[k]));
        cr_expect_null(find(&a, "model.layers.0.self_attn.q_proj.weight_scale_inv"));
        collection_free(&a);
        collection_free(&b);
    }
    mt_backend_free(cpu);
}

// One weight [64, 64] and its scale in a one-file checkpoint, loaded with blocks `block`: the
// error, or NULL when it loaded.
#define FP8_W "model.layers.0.self_attn.q_proj.weight"
static const char *fp8_case(const char *tmp, const char *wdtype, int wdims, const char *sdtype, int64_t s0, int64_t s1,
                            float s00, int with_w, int with_s, int b0, int b1) {
    static uint8_t w[64 * 64 * 2];
    static float s[4 * 4];
    static uint16_t sh[4 * 4];
    memset(w, 0x38, sizeof w);  // 1.0 in e4m3fn (and a finite bf16)
    for (int i = 0; i < 16; i++) s[i] = 0.5f, sh[i] = 0x3f00;  // 0.5 in f32, in bf16
    s[0] = s00;
    mt_st_entry e[2] = {{.name = FP8_W, .dtype = wdtype, .ndim = wdims, .shape = {64, 64}, .data = w},
                        {.name = FP8_W "_scale_inv", .dtype = sdtype, .ndim = 2, .shape = {s0, s1},
                         .data = strcmp(sdtype, "BF16") ? (void *)s : (void *)sh}};
    if (wdims == 1) e[0].shape[0] = 64 * 64;
    char path[200];
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    cr_assert_eq(mt_st_write(path, e + !with_w, (size_t)(with_w + with_s), NULL, NULL, NULL), 0, "%s", mt_error_get());
    mt_backend *cpu = mt_backend_cpu_new();
    mt_quant_load_opts o;
    mt_quant_load_opts_default(&o);
    o.fp8_block[0] = b0, o.fp8_block[1] = b1;
    collection c;
    memset(&c, 0, sizeof c);
    int rc = mt_quant_load(tmp, cpu, &o, collect, &c);
    if (rc == 0) {  // 1.0 · 0.5 everywhere, through NF4
        cr_expect_eq(c.n, 1);
        float got[64 * 64];
        mt_qweight_dequantize_rows_cpu(&c.items[0].q, got, 0, 64);
        cr_expect(fabsf(got[100] - 0.5f) < 0.05f, "%g", got[100]);
    }
    collection_free(&c);
    mt_backend_free(cpu);
    return rc ? mt_error_get() : NULL;
}

Test(quant_load, fp8_refusals_name_the_file_and_the_tensor) {
    char tmp[64];
    mt_test_tmpdir(tmp, sizeof tmp);
    const char *err = fp8_case(tmp, "F8_E4M3", 2, "F32", 2, 2, 0.5f, 1, 1, 32, 48);
    cr_expect_null(err, "a good one loads: %s", err);
    cr_expect_null(fp8_case(tmp, "F8_E4M3", 2, "BF16", 2, 2, 0.5f, 1, 1, 32, 48), "bf16 scales too");
    static const struct {
        const char *wdtype, *sdtype;
        int wdims;
        int64_t s0, s1;
        float s00;
        int with_w, with_s, b0, b1;
        const char *says[3];
    } bad[] = {
        {"F8_E4M3", "F32", 2, 2, 2, 0.5f, 1, 0, 32, 48, {FP8_W "'", "without its scale '" FP8_W "_scale_inv'"}},
        {"F8_E4M3", "F32", 2, 1, 1, 0.5f, 1, 1, 32, 48, {FP8_W "_scale_inv'", "shape [1, 1]", "needs [2, 2]"}},
        // blocks other than what quantization_config says: the scale's shape disagrees
        {"F8_E4M3", "F32", 2, 2, 2, 0.5f, 1, 1, 128, 128, {"_scale_inv'", "weight_block_size", "needs [1, 1]"}},
        {"F8_E4M3", "F32", 2, 2, 2, 0.5f, 1, 1, 0, 0, {FP8_W "'", "quantization_config", "fp8"}},
        {"F8_E4M3", "F32", 2, 2, 2, 0.5f, 0, 1, 32, 48, {FP8_W "_scale_inv'", "without its weight"}},
        {"BF16", "F32", 2, 2, 2, 0.5f, 1, 1, 32, 48, {FP8_W "'", "stored BF16", "_scale_inv"}},
        {"F8_E4M3", "F32", 2, 2, 2, INFINITY, 1, 1, 32, 48, {FP8_W "_scale_inv'", "[0, 0] is inf"}},
        {"F8_E4M3", "U8", 2, 2, 2, 0.5f, 1, 1, 32, 48, {FP8_W "_scale_inv'", "dtype U8"}},
        {"F8_E4M3", "F32", 1, 2, 2, 0.5f, 1, 1, 32, 48, {FP8_W "'", "2-D"}},
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(bad); i++) {
        err = fp8_case(tmp, bad[i].wdtype, bad[i].wdims, bad[i].sdtype, bad[i].s0, bad[i].s1, bad[i].s00, bad[i].with_w,
                       bad[i].with_s, bad[i].b0, bad[i].b1);
        cr_expect_not_null(err, "case %zu loaded", i);
        if (!err) continue;
        cr_expect(strstr(err, "/model.safetensors: tensor '"), "case %zu names no file: %s", i, err);
        for (int k = 0; k < 3 && bad[i].says[k]; k++)
            cr_expect(strstr(err, bad[i].says[k]), "case %zu: '%s' lacks '%s'", i, err, bad[i].says[k]);
    }
    mt_test_rmrf(tmp);
}
