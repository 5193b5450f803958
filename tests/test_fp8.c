// Block FP8 (DeepSeek-V3, Kimi K2): the e4m3fn / e5m2 tables against torch's casts, ragged-block
// dequantization bit for bit against transformers' (tests/data/quant/fp8.safetensors, made by
// scripts/make_fp8_fixtures.py), quantization_config quant_method "fp8" read, refused and written,
// and a run on a block-FP8 checkpoint: it trains, and a broken one exits 1 naming file and tensor.
// The loader's side (same base as the f32 dequantization, its refusals) is in test_quant_load.c.
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/safetensors.h"
#include "model/config.h"
#include "quant/quant.h"
#include "tests/fixture_file.h"
#include "tests/test_util.h"

#define FIXTURES MT_REPO_ROOT "/tests/data/quant/"
#define FP8_TINY FIXTURES "fp8_tiny"

Test(fp8, tables_are_torchs_for_every_byte) {
    mt_st_file f;
    cr_assert_eq(mt_st_file_open(&f, FIXTURES "fp8.safetensors"), 0, "%s", mt_error_get());
    float *e4 = st_copy(st_need(&f, "e4m3_f32")), *e5 = st_copy(st_need(&f, "e5m2_f32"));
    const uint8_t *b = st_need(&f, "bytes")->data;
    float conv4[256], conv5[256];
    mt_convert(conv4, MT_F32, b, MT_F8_E4M3, 256);
    mt_convert(conv5, MT_F32, b, MT_F8_E5M2, 256);
    for (int i = 0; i < 256; i++) {  // exact bits, NaN payloads included
        float x4 = mt_f8e4m3_to_f32(b[i]), x5 = mt_f8e5m2_to_f32(b[i]);
        cr_expect_eq(f32_bits(x4), f32_bits(e4[i]), "e4m3 %#04x: %a, torch %a", b[i], x4, e4[i]);
        cr_expect_eq(f32_bits(x5), f32_bits(e5[i]), "e5m2 %#04x: %a, torch %a", b[i], x5, e5[i]);
        cr_expect_eq(f32_bits(conv4[i]), f32_bits(e4[i]), "mt_convert e4m3 %#04x", b[i]);
        cr_expect_eq(f32_bits(conv5[i]), f32_bits(e5[i]), "mt_convert e5m2 %#04x", b[i]);
    }
    // e4m3fn's landmarks: the largest, the smallest subnormal, -0, the only NaNs, no infinity
    cr_expect(mt_f8e4m3_to_f32(0x7e) == 448.0f && mt_f8e4m3_to_f32(0x01) == 0x1p-9f);
    cr_expect(mt_f8e4m3_to_f32(0x08) == 0x1p-6f && mt_f8e4m3_to_f32(0xb8) == -1.0f);
    cr_expect(signbit(mt_f8e4m3_to_f32(0x80)) && isnan(mt_f8e4m3_to_f32(0x7f)) && isnan(mt_f8e4m3_to_f32(0xff)));
    cr_expect(isinf(mt_f8e5m2_to_f32(0x7c)) && mt_f8e5m2_to_f32(0x7b) == 57344.0f);
    cr_expect_str_eq(mt_st_dtype_of(MT_F8_E4M3), "F8_E4M3");
    cr_expect_str_eq(mt_dtype_name(MT_F8_E5M2), "f8_e5m2");
    cr_expect_eq(mt_dtype_bytes(MT_F8_E4M3, 7), 7u);
    free(e4), free(e5);
    mt_st_file_close(&f);
}

// "w" [200, 130] in 128 x 128 blocks and "w2" [100, 90] in 48 x 40: ragged edges both ways.
static void expect_transformers_dequant(const mt_st_file *f, const char *w, const char *s, const char *deq, int br,
                                        int bc) {
    const mt_st_tensor *tw = st_need(f, w), *ts = st_need(f, s), *td = st_need(f, deq);
    cr_assert_str_eq(tw->dtype, "F8_E4M3");
    int64_t out = tw->shape[0], in = tw->shape[1];
    cr_assert(ts->shape[0] == (out + br - 1) / br && ts->shape[1] == (in + bc - 1) / bc, "%s: scale grid", s);
    float *scale = st_copy(ts), *want = st_copy(td), *got = mt_xmalloc((size_t)(out * in) * sizeof(float));
    mt_fp8_dequantize_ref(tw->data, scale, out, in, br, bc, got);
    int nan = 0, sub = 0;
    for (int64_t i = 0; i < out * in; i++) {
        int same = isnan(want[i]) ? isnan(got[i]) : f32_bits(got[i]) == f32_bits(want[i]);
        nan += isnan(got[i]), sub += got[i] != 0 && fabsf(got[i]) < 0x1p-126f;
        if (!same) {
            cr_expect(0, "%s [%lld, %lld]: %a, transformers %a", w, (long long)(i / in), (long long)(i % in), got[i],
                      want[i]);
            break;
        }
    }
    cr_expect(nan > 0, "%s: the NaN bytes are covered", w);
    if (br == 128) cr_expect(sub > 0, "%s: products among the subnormals are covered", w);
    free(scale), free(want), free(got);
}

Test(fp8, ragged_blocks_dequantize_as_transformers_bit_for_bit) {
    mt_st_file f;
    cr_assert_eq(mt_st_file_open(&f, FIXTURES "fp8.safetensors"), 0, "%s", mt_error_get());
    expect_transformers_dequant(&f, "w", "w_scale_inv", "deq", 128, 128);
    expect_transformers_dequant(&f, "w2", "w2_scale_inv", "deq2", 48, 40);
    mt_st_file_close(&f);
}

// ---------------------------------------------------------------------------------------------
// config.json

// The fixture's config.json with quantization_config replaced by `qc` (JSON text; NULL: removed).
static int parse_with(const char *qc, mt_model_config *cfg) {
    char *text;
    size_t len;
    cr_assert_eq(mt_read_file(FP8_TINY "/config.json", 1 << 20, &text, &len), 0);
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    cr_assert_not_null(root);
    cJSON_DeleteItemFromObject(root, "quantization_config");
    if (qc) {
        cJSON *q = cJSON_Parse(qc);
        cr_assert_not_null(q, "%s", qc);
        cJSON_AddItemToObject(root, "quantization_config", q);
    }
    char *s = cJSON_PrintUnformatted(root);
    int rc = mt_model_config_parse(s, strlen(s), "config.json", cfg);
    cJSON_free(s);
    cJSON_Delete(root);
    return rc;
}

Test(fp8, quantization_config_read_refused_and_written) {
    mt_model_config c;
    cr_assert_eq(mt_model_config_load(FP8_TINY, &c), 0, "%s", mt_error_get());
    cr_expect(c.fp8_block[0] == 32 && c.fp8_block[1] == 48 && !c.quantized && !c.mxfp4);
    // FineGrainedFP8Config's defaults when absent; modules_to_not_convert needs no reading
    cr_assert_eq(parse_with("{\"quant_method\": \"fp8\", \"modules_to_not_convert\": [\"lm_head\"]}", &c), 0, "%s",
                 mt_error_get());
    cr_expect(c.fp8_block[0] == 128 && c.fp8_block[1] == 128);
    cr_assert_eq(parse_with(NULL, &c), 0, "%s", mt_error_get());
    cr_expect(c.fp8_block[0] == 0 && c.fp8_block[1] == 0, "not FP8 without it");
    // DeepSeek-V3.1's scale_fmt "ue8m0": its kernels' activation scales; the weights' scale_inv are
    // still F32 (powers of two), read as V3's; written back
    cr_assert_eq(parse_with("{\"quant_method\": \"fp8\", \"scale_fmt\": \"ue8m0\"}", &c), 0, "%s", mt_error_get());
    cr_expect(c.fp8_scale_ue8m0 && c.fp8_block[0] == 128);
    {
        char t1[64], p1[128];
        mt_test_tmpdir(t1, sizeof t1);
        snprintf(p1, sizeof p1, "%s/config.json", t1);
        cr_assert_eq(mt_model_config_write(&c, p1), 0, "%s", mt_error_get());
        mt_model_config back;
        cr_assert_eq(mt_model_config_load(p1, &back), 0, "%s", mt_error_get());
        cr_expect(back.fp8_scale_ue8m0, "scale_fmt written back");
        mt_test_rmrf(t1);
    }
    static const struct { const char *qc, *field; } bad[] = {
        {"{\"quant_method\": \"fp8\", \"fmt\": \"e5m2\"}", "fmt"},
        {"{\"quant_method\": \"fp8\", \"activation_scheme\": \"static\"}", "activation_scheme"},
        {"{\"quant_method\": \"fp8\", \"weight_block_size\": [0, 128]}", "weight_block_size"},
        {"{\"quant_method\": \"fp8\", \"weight_block_size\": [128]}", "weight_block_size"},
        {"{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128, 1]}", "weight_block_size"},
        {"{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 1.5]}", "weight_block_size"},
        {"{\"quant_method\": \"fp8\", \"weight_block_size\": null}", "weight_block_size"},
        {"{\"quant_method\": \"fp8\", \"scale_fmt\": \"e4m3\"}", "scale_fmt"},
        {"{\"quant_method\": \"fp9\"}", "fp9"},
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(bad); i++) {
        cr_expect_neq(parse_with(bad[i].qc, &c), 0, "%s accepted", bad[i].qc);
        cr_expect(strstr(mt_error_get(), "quantization_config") && strstr(mt_error_get(), bad[i].field),
                  "%s: '%s' does not name %s", bad[i].qc, mt_error_get(), bad[i].field);
    }
    // written back as read (and what DeepSeek-V3's config.json holds)
    char tmp[64], path[128];
    mt_test_tmpdir(tmp, sizeof tmp);
    snprintf(path, sizeof path, "%s/config.json", tmp);
    cr_assert_eq(mt_model_config_load(FP8_TINY, &c), 0);
    cr_assert_eq(mt_model_config_write(&c, path), 0, "%s", mt_error_get());
    mt_model_config back;
    cr_assert_eq(mt_model_config_load(path, &back), 0, "%s", mt_error_get());
    cr_expect(back.fp8_block[0] == 32 && back.fp8_block[1] == 48);
    char *text;
    size_t len;
    cr_assert_eq(mt_read_file(path, 1 << 20, &text, &len), 0);
    cJSON *root = cJSON_Parse(text);
    char *qc = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(root, "quantization_config"));
    cr_expect_str_eq(qc, "{\"activation_scheme\":\"dynamic\",\"fmt\":\"e4m3\",\"quant_method\":\"fp8\","
                         "\"weight_block_size\":[32,48]}");
    cJSON_free(qc);
    cJSON_Delete(root);
    free(text);
    mt_test_rmrf(tmp);
}

// ---------------------------------------------------------------------------------------------
// A run

// dir/model.safetensors: the fixture's tensors without `drop`.
// FP8_TINY's tensors into dir/model.safetensors, `name` dropped (dtype NULL) or relabelled `dtype`.
static void write_broken(const char *dir, const char *name, const char *dtype) {
    mt_st_file f;
    cr_assert_eq(mt_st_file_open(&f, FP8_TINY "/model.safetensors"), 0, "%s", mt_error_get());
    mt_st_entry *e = mt_xcalloc(f.n_tensors, sizeof *e);
    size_t n = 0;
    for (size_t i = 0; i < f.n_tensors; i++) {
        const mt_st_tensor *t = &f.tensors[i];
        int hit = strcmp(t->name, name) == 0;
        if (hit && !dtype) continue;
        e[n] = (mt_st_entry){.name = t->name, .dtype = hit ? dtype : t->dtype, .ndim = t->ndim, .data = t->data};
        memcpy(e[n].shape, t->shape, sizeof t->shape);
        n++;
    }
    cr_assert_eq(n + !dtype, f.n_tensors, "%s is in the fixture", name);
    char path[200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    cr_assert_eq(mt_st_write(path, e, n, "{\"format\":\"pt\"}", NULL, NULL), 0, "%s", mt_error_get());
    free(e);
    mt_st_file_close(&f);
}

Test(fp8, a_run_trains_and_a_broken_checkpoint_exits_1, .timeout = 120) {
    char tmp[64], model[128], data[128], bad[160];
    static char log[1 << 16];
    mt_test_tmpdir(tmp, sizeof tmp);
    cr_assert_eq(mt_test_tiny_run_inputs(tmp, model, data, 8), 0);
    const char *run = "--mode lora --r 2 --quant nf4 --seq 16 --steps 2";
    cr_expect_eq(mt_test_run(log, sizeof log, "--model %s --data %s %s --out %s/ok", FP8_TINY, data, run, tmp), 0, "%s",
                 log);
    snprintf(bad, sizeof bad, "%s/bad", tmp);
    cr_assert_eq(mt_mkdir_p(bad), 0);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "cp %s/config.json %s/", FP8_TINY, bad);
    cr_assert_eq(system(cmd), 0);
    const char *w = "model.layers.1.block_sparse_moe.experts.5.w2.weight";
    char scale[160];
    snprintf(scale, sizeof scale, "%s_scale_inv", w);
    write_broken(bad, scale, NULL);
    cr_expect_eq(mt_test_run(log, sizeof log, "--model %s --data %s %s --out %s/no", bad, data, run, tmp), 1, "%s",
                 log);
    cr_expect(strstr(log, "/bad/model.safetensors") && strstr(log, w) && strstr(log, "weight_scale_inv"),
              "the error names the file, the tensor and its missing scale: %s", log);
    mt_test_rmrf(tmp);
}

// ---------------------------------------------------------------------------------------------
// quantize and merge of an FP8 base

// Every tensor of dir_a/model.safetensors equals dir_b's of the same name, bit for bit; both hold
// the same names. Returns how many.
static size_t same_tensors(const char *dir_a, const char *dir_b) {
    char pa[200], pb[200];
    snprintf(pa, sizeof pa, "%s/model.safetensors", dir_a);
    snprintf(pb, sizeof pb, "%s/model.safetensors", dir_b);
    mt_st_file a, b;
    cr_assert_eq(mt_st_file_open(&a, pa), 0, "%s", mt_error_get());
    cr_assert_eq(mt_st_file_open(&b, pb), 0, "%s", mt_error_get());
    cr_assert_eq(a.n_tensors, b.n_tensors, "%s: %zu tensors, %s: %zu", pa, a.n_tensors, pb, b.n_tensors);
    for (size_t i = 0; i < a.n_tensors; i++) {
        const mt_st_tensor *x = &a.tensors[i], *y = mt_st_file_find(&b, x->name);
        cr_assert(y, "%s: '%s' missing", pb, x->name);
        cr_expect(!strcmp(x->dtype, y->dtype) && x->nbytes == y->nbytes && !memcmp(x->data, y->data, x->nbytes),
                  "'%s' differs", x->name);
        cr_expect(!strstr(x->name, "_scale_inv"), "'%s' written", x->name);
    }
    size_t n = a.n_tensors;
    mt_st_file_close(&a), mt_st_file_close(&b);
    return n;
}

// `quantize` reads an FP8 base as training does (each weight dequantized, then quantized like a
// dense one): the same 4-bit checkpoint as from transformers' own dequantization of it
// (fp8_tiny_f32), every tensor bit for bit, no scale written; with attention left out of the
// targets, attention comes out dense in the model's dtype. `merge` of an adapter trained on it:
// the same merged model as merging into the dequantized twin. A scale without its weight is an
// error naming both.
Test(fp8, quantize_and_merge_read_the_base_as_training_does, .timeout = 120) {
    char tmp[64], model[128], data[128];
    static char log[1 << 16];
    mt_test_tmpdir(tmp, sizeof tmp);
    cr_assert_eq(mt_test_tiny_run_inputs(tmp, model, data, 8), 0);
    cr_assert_eq(mt_test_run(log, sizeof log, "quantize --model %s --out %s/q8", FP8_TINY, tmp), 0, "%s", log);
    cr_assert_eq(mt_test_run(log, sizeof log, "quantize --model %s --out %s/qf", FIXTURES "fp8_tiny_f32", tmp), 0,
                 "%s", log);
    char a[160], b[160];
    snprintf(a, sizeof a, "%s/q8", tmp), snprintf(b, sizeof b, "%s/qf", tmp);
    cr_expect_gt(same_tensors(a, b), 300);
    cr_assert_eq(mt_test_run(log, sizeof log, "quantize --model %s --out %s/qe --quant-targets experts", FP8_TINY, tmp),
                 0, "%s", log);
    snprintf(a, sizeof a, "%s/qe/model.safetensors", tmp);
    mt_st_file f;
    cr_assert_eq(mt_st_file_open(&f, a), 0, "%s", mt_error_get());
    const mt_st_tensor *q = mt_st_file_find(&f, "model.layers.0.self_attn.q_proj.weight");
    cr_expect(q && !strcmp(q->dtype, "BF16") && q->ndim == 2, "attention dense in bf16");
    mt_st_file_close(&f);

    const char *run = "--mode lora --r 2 --quant nf4 --seq 16 --steps 2";
    cr_assert_eq(mt_test_run(log, sizeof log, "--model %s --data %s %s --out %s/run", FP8_TINY, data, run, tmp), 0,
                 "%s", log);
    cr_assert_eq(mt_test_run(log, sizeof log, "merge --model %s --adapter %s/run/adapter --out %s/m8", FP8_TINY, tmp,
                             tmp), 0, "%s", log);
    cr_expect(!strstr(log, "not copied"), "no scale left behind: %s", log);
    cr_assert_eq(mt_test_run(log, sizeof log, "merge --model %s --adapter %s/run/adapter --out %s/mf",
                             FIXTURES "fp8_tiny_f32", tmp, tmp), 0, "%s", log);
    snprintf(a, sizeof a, "%s/m8", tmp), snprintf(b, sizeof b, "%s/mf", tmp);
    cr_expect_gt(same_tensors(a, b), 60);

    char bad[160], cmd[600];
    snprintf(bad, sizeof bad, "%s/bad", tmp);
    cr_assert_eq(mt_mkdir_p(bad), 0);
    snprintf(cmd, sizeof cmd, "cp %s/config.json %s/", FP8_TINY, bad);
    cr_assert_eq(system(cmd), 0);
    write_broken(bad, "model.layers.1.block_sparse_moe.experts.5.w2.weight", NULL);
    cr_expect_eq(mt_test_run(log, sizeof log, "quantize --model %s --out %s/qb", bad, tmp), 1, "%s", log);
    cr_expect(strstr(log, "experts.5.w2.weight_scale_inv") && strstr(log, "without its weight"), "%s", log);
    // a tensor of a dtype no dense checkpoint holds: the file and the tensor named
    write_broken(bad, "model.embed_tokens.weight", "I16");
    cr_expect_eq(mt_test_run(log, sizeof log, "quantize --model %s --out %s/qb", bad, tmp), 1, "%s", log);
    cr_expect(strstr(log, "/bad/model.safetensors: 'model.embed_tokens.weight': wrong dtype I16"), "%s", log);
    mt_test_rmrf(tmp);
}
