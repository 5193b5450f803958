// gpt-oss's fused experts through `moetrain quantize --quant mxfp4` and `moetrain merge`
// (trainer/cmd/fused_write.c): quantize writes the release's layout (the experts' blocks and scales,
// the rest dense); merge folds each expert's LoRA into the fused tensors, from a dense base or an
// MXFP4 one, dense (exact: eval of the merged model equals eval with the adapter) or re-quantized
// to MXFP4 (the error reported; with no expert delta the experts' values come back unchanged).
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/safetensors.h"
#include "quant/quant.h"
#include "tests/test_util.h"

// A small gpt-oss whose expert widths are multiples of 32 (MXFP4's block), every part on.
static const char *CONFIG =
    "{\"architectures\": [\"GptOssForCausalLM\"], \"model_type\": \"gpt_oss\", \"hidden_size\": 64,\n"
    " \"intermediate_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,\n"
    " \"head_dim\": 16, \"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"vocab_size\": 300,\n"
    " \"layer_types\": [\"sliding_attention\", \"full_attention\"], \"sliding_window\": 5,\n"
    " \"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-05, \"swiglu_limit\": 1.4,\n"
    " \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, \"beta_fast\": 32.0, \"beta_slow\": 1.0,\n"
    "   \"original_max_position_embeddings\": 64, \"truncate\": false}, \"rope_theta\": 10000.0,\n"
    " \"router_aux_loss_coef\": 0.02, \"attention_bias\": true, \"tie_word_embeddings\": false,\n"
    " \"bos_token_id\": 1, \"eos_token_id\": 2, \"pad_token_id\": 0, \"torch_dtype\": \"float32\"}\n";

typedef struct {
    char tmp[64], base[128], data[128], log[16384];
} fixture;

static void setup(fixture *f) {
    mt_test_tmpdir(f->tmp, sizeof f->tmp);
    char cfg[128];
    snprintf(cfg, sizeof cfg, "%s/config.json", f->tmp);
    FILE *c = fopen(cfg, "w");
    cr_assert(c && fputs(CONFIG, c) >= 0 && fclose(c) == 0);
    snprintf(f->base, sizeof f->base, "%s/base", f->tmp);
    snprintf(f->data, sizeof f->data, "%s/data.jsonl", f->tmp);
    FILE *d = fopen(f->data, "w");
    cr_assert(d);
    for (int i = 0; i < 8; i++) fprintf(d, "{\"text\":\"expert %d routes token %03d to the fused rows\"}\n", i, i * 11);
    cr_assert_eq(fclose(d), 0);
    cr_assert_eq(mt_test_run(f->log, sizeof f->log, "init --config %s --out %s --dtype f32 --seed 4", cfg, f->base), 0,
                 "%s", f->log);
}

// `moetrain eval` loss (6 decimals) of `args`.
static double loss_of(fixture *f, const char *args) {
    cr_assert_eq(mt_test_run(f->log, sizeof f->log, "eval %s --data %s --seq 32", args, f->data), 0, "%s", f->log);
    const char *at = strstr(f->log, "loss=");
    cr_assert(at, "%s", f->log);
    return atof(at + 5);
}

static void train(fixture *f, const char *model, const char *out, const char *flags) {
    cr_assert_eq(mt_test_run(f->log, sizeof f->log,
                             "train --model %s --data %s --out %s --mode lora --r 4 --steps 3 --seq 32 --lr 0.05 "
                             "--seed 5 %s", model, f->data, out, flags),
                 0, "%s", f->log);
}

Test(gpt_oss_merge, lora_folds_into_dense_fused_experts) {
    fixture f;
    setup(&f);
    char run[160], merged[160], args[400];
    snprintf(run, sizeof run, "%s/run", f.tmp), snprintf(merged, sizeof merged, "%s/merged", f.tmp);
    train(&f, f.base, run, "--targets all --quant none");
    snprintf(args, sizeof args, "--model %s --adapter %s/adapter --quant none", f.base, run);
    double with_adapter = loss_of(&f, args);
    cr_assert_eq(mt_test_run(f.log, sizeof f.log, "merge --model %s --adapter %s/adapter --out %s --dtype f32", f.base,
                             run, merged), 0, "%s", f.log);
    snprintf(args, sizeof args, "--model %s --quant none", merged);
    double folded = loss_of(&f, args);
    snprintf(args, sizeof args, "--model %s --quant none", f.base);
    double base = loss_of(&f, args);
    cr_expect_float_eq(folded, with_adapter, 2e-6, "merged %.6f, base + adapter %.6f", folded, with_adapter);
    cr_expect_gt(fabs(base - with_adapter), 1e-3, "the adapter changed the loss (%.6f vs %.6f)", base, with_adapter);
    mt_test_rmrf(f.tmp);
}

// Two tensors' bytes equal (each in its folder's model files).
static int same_bytes(const char *dir_a, const char *dir_b, const char *name) {
    mt_st_model a, b;
    cr_assert_eq(mt_st_model_open(&a, dir_a), 0);
    cr_assert_eq(mt_st_model_open(&b, dir_b), 0);
    const mt_st_tensor *ta = mt_st_model_find(&a, name), *tb = mt_st_model_find(&b, name);
    cr_assert(ta && tb, "'%s' in both", name);
    int same = ta->nbytes == tb->nbytes && memcmp(ta->data, tb->data, ta->nbytes) == 0;
    mt_st_model_close(&a), mt_st_model_close(&b);
    return same;
}

// The values of MXFP4 tensor `name` ("P": P_blocks with P_scales) equal in both folders. The
// bytes may differ: a block whose largest code is below 4 re-quantizes to half the scale and
// twice the codes, the same values.
static int same_mxfp4_values(const char *dir_a, const char *dir_b, const char *name) {
    const char *dirs[2] = {dir_a, dir_b};
    float *v[2] = {NULL, NULL};
    int64_t n = 0;
    for (int k = 0; k < 2; k++) {
        mt_st_model m;
        cr_assert_eq(mt_st_model_open(&m, dirs[k]), 0);
        char bn[160], sn[160];
        snprintf(bn, sizeof bn, "%s_blocks", name), snprintf(sn, sizeof sn, "%s_scales", name);
        const mt_st_tensor *b = mt_st_model_find(&m, bn), *s = mt_st_model_find(&m, sn);
        cr_assert(b && s, "%s: blocks and scales", dirs[k]);
        n = (int64_t)b->nbytes * 2;
        v[k] = malloc((size_t)n * sizeof(float));
        mt_mxfp4_dequantize_ref(b->data, s->data, 0, n, v[k]);
        mt_st_model_close(&m);
    }
    int same = memcmp(v[0], v[1], (size_t)n * sizeof(float)) == 0;
    free(v[0]), free(v[1]);
    return same;
}

Test(gpt_oss_merge, mxfp4_base_merges_dense_or_mxfp4) {
    fixture f;
    setup(&f);
    char q[160], run[160], dense[160], mx[160], attn[160], attn_mx[160], args[400];
    snprintf(q, sizeof q, "%s/mxfp4", f.tmp), snprintf(run, sizeof run, "%s/run", f.tmp);
    snprintf(dense, sizeof dense, "%s/dense", f.tmp), snprintf(mx, sizeof mx, "%s/mx", f.tmp);
    snprintf(attn, sizeof attn, "%s/attn", f.tmp), snprintf(attn_mx, sizeof attn_mx, "%s/attn_mx", f.tmp);
    cr_assert_eq(mt_test_run(f.log, sizeof f.log, "quantize --model %s --out %s --quant mxfp4", f.base, q), 0, "%s",
                 f.log);
    // the release's layout: the experts' blocks and scales, attention dense
    mt_st_model m;
    cr_assert_eq(mt_st_model_open(&m, q), 0);
    const mt_st_tensor *b = mt_st_model_find(&m, "model.layers.1.mlp.experts.gate_up_proj_blocks"),
                       *s = mt_st_model_find(&m, "model.layers.1.mlp.experts.down_proj_scales"),
                       *qp = mt_st_model_find(&m, "model.layers.0.self_attn.q_proj.weight");
    cr_assert(b && b->ndim == 4 && b->shape[0] == 4 && b->shape[1] == 64 && b->shape[2] == 2 && b->shape[3] == 16);
    cr_assert(s && s->ndim == 3 && s->shape[0] == 4 && s->shape[1] == 64 && s->shape[2] == 1);
    cr_assert(qp && strcmp(qp->dtype, "F32") == 0, "attention stays dense");
    cr_assert_null(mt_st_model_find(&m, "model.layers.1.mlp.experts.gate_up_proj"));
    mt_st_model_close(&m);

    // LoRA on everything, the experts kept as stored: dense merge exact, MXFP4 merge reported
    train(&f, q, run, "--targets all --quant none");
    snprintf(args, sizeof args, "--model %s --adapter %s/adapter --quant none", q, run);
    double with_adapter = loss_of(&f, args);
    cr_assert_eq(mt_test_run(f.log, sizeof f.log, "merge --model %s --adapter %s/adapter --out %s --dtype f32", q, run,
                             dense), 0, "%s", f.log);
    snprintf(args, sizeof args, "--model %s --quant none", dense);
    double folded = loss_of(&f, args);
    cr_expect_float_eq(folded, with_adapter, 2e-6, "merged %.6f, base + adapter %.6f", folded, with_adapter);
    cr_assert_eq(mt_test_run(f.log, sizeof f.log, "merge --model %s --adapter %s/adapter --out %s --out-quant mxfp4",
                             q, run, mx), 0, "%s", f.log);
    cr_expect(strstr(f.log, "re-quantized to MXFP4: error RMS"), "the error is reported: %s", f.log);
    snprintf(args, sizeof args, "--model %s --quant none", mx);
    double requantized = loss_of(&f, args);
    cr_expect(requantized > 0 && fabs(requantized - with_adapter) < 0.5, "MXFP4 merge %.6f near %.6f", requantized,
              with_adapter);

    // No expert delta: re-quantizing the experts gives back the base's bytes
    train(&f, q, attn, "--targets attn --quant none");
    cr_assert_eq(mt_test_run(f.log, sizeof f.log, "merge --model %s --adapter %s/adapter --out %s --out-quant mxfp4", q,
                             attn, attn_mx), 0, "%s", f.log);
    cr_expect(strstr(f.log, "error RMS 0 "), "nothing rounded: %s", f.log);
    for (int L = 0; L < 2; L++)
        for (int k = 0; k < 2; k++) {
            char name[128];
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%s", L, k ? "down_proj" : "gate_up_proj");
            cr_expect(same_mxfp4_values(q, attn_mx, name), "%s: unchanged by a merge without expert LoRA", name);
        }
    cr_expect(!same_bytes(q, attn_mx, "model.layers.0.self_attn.q_proj.weight"), "the attention delta is merged");
    mt_test_rmrf(f.tmp);
}

Test(gpt_oss_merge, bad_requests_are_refused) {
    fixture f;
    setup(&f);
    char out[160];
    snprintf(out, sizeof out, "%s/out", f.tmp);
    cr_expect_neq(mt_test_run(f.log, sizeof f.log, "merge --model %s --adapter %s --out %s --out-quant nf4", f.base,
                              f.base, out), 0);
    cr_expect(strstr(f.log, "--out-quant 'nf4' is not mxfp4 or none"), "%s", f.log);
    char tiny[160], run[160];
    snprintf(tiny, sizeof tiny, "%s/tiny", f.tmp), snprintf(run, sizeof run, "%s/run", f.tmp);
    cr_assert_eq(mt_test_run(f.log, sizeof f.log, "init --config %s/configs/tiny.json --out %s --seed 3", MT_REPO_ROOT,
                             tiny), 0, "%s", f.log);
    train(&f, tiny, run, "--quant none");
    cr_expect_neq(mt_test_run(f.log, sizeof f.log, "merge --model %s --adapter %s/adapter --out %s --out-quant mxfp4",
                              tiny, run, out), 0);
    cr_expect(strstr(f.log, "only gpt-oss's fused experts are written as MXFP4"), "%s", f.log);
    mt_test_rmrf(f.tmp);
}

// A trained-tensor file of `mode` on `model` (flags: its span): eval with it equals eval of its merge.
static void trained_round_trip(fixture *f, const char *model, const char *mode, const char *flags) {
    char run[160], merged[160], args[400];
    snprintf(run, sizeof run, "%s/%s", f->tmp, mode), snprintf(merged, sizeof merged, "%s/%s-merged", f->tmp, mode);
    cr_assert_eq(mt_test_run(f->log, sizeof f->log,
                             "train --model %s --data %s --out %s --mode %s %s --quant none --steps 3 --seq 32 "
                             "--lr 0.02 --seed 5", model, f->data, run, mode, flags),
                 0, "%s", f->log);
    snprintf(args, sizeof args, "--model %s --adapter %s/trained.safetensors --quant none", model, run);
    double with_trained = loss_of(f, args);
    cr_assert(strstr(f->log, mode), "eval reads the file as --mode %s: %s", mode, f->log);
    cr_assert_eq(mt_test_run(f->log, sizeof f->log, "merge --model %s --adapter %s/trained.safetensors --out %s "
                             "--dtype f32", model, run, merged), 0, "%s", f->log);
    snprintf(args, sizeof args, "--model %s --quant none", merged);
    double folded = loss_of(f, args);
    cr_expect_float_eq(folded, with_trained, 2e-6, "--mode %s: merged %.6f, with the file %.6f", mode, folded,
                       with_trained);
}

// --mode full (every expert and the fused biases) on the dense base; --mode unfreeze (two experts
// of one layer, the per-expert tensors) on the MXFP4 release layout, whose values the experts
// start from.
Test(gpt_oss_merge, full_and_unfreeze_runs_merge_into_the_fused_experts) {
    fixture f;
    setup(&f);
    trained_round_trip(&f, f.base, "full", "");
    mt_st_file t;
    char path[200];
    snprintf(path, sizeof path, "%s/full/trained.safetensors", f.tmp);
    cr_assert_eq(mt_st_file_open(&t, path), 0);
    const mt_st_tensor *b = mt_st_file_find(&t, "model.layers.1.mlp.experts.gate_up_proj_bias");
    cr_expect(b && b->ndim == 2 && b->shape[0] == 4 && b->shape[1] == 64, "the fused bias, whole");
    cr_expect(mt_st_file_find(&t, "model.layers.1.mlp.experts.3.up_proj.weight"), "each expert's Linear");
    mt_st_file_close(&t);
    char q[160];
    snprintf(q, sizeof q, "%s/mxfp4", f.tmp);
    cr_assert_eq(mt_test_run(f.log, sizeof f.log, "quantize --model %s --out %s --quant mxfp4", f.base, q), 0, "%s",
                 f.log);
    trained_round_trip(&f, q, "unfreeze", "--layers 1 --experts 1,3");
    mt_test_rmrf(f.tmp);
}
