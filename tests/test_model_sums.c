// tests/test_model_sums.c — what init, merge and quantize write beside their tensors, and merge's
// default base (issue 28, snag 8): SHA256SUMS that `moetrain verify` checks (and that catches a
// changed byte), and a merge that reproduces the trained model without being told --quant.
#include <criterion/criterion.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

static double loss_in(const char *out) {
    const char *l = strstr(out, "loss=");
    cr_assert_not_null(l, "%s", out);
    return atof(l + 5);
}

Test(model_sums, merge_defaults_to_the_trained_base_and_every_output_verifies, .timeout = 180) {
    static char out[32768];
    char tmp[64], model[128], data[128];
    mt_test_tmpdir(tmp, sizeof tmp);
    cr_assert_eq(mt_test_tiny_run_inputs(tmp, model, data, 16), 0);
    // init, quantize: SHA256SUMS that verify checks
    cr_assert_eq(mt_test_run(out, sizeof out, "verify %s", model), 0, "%s", out);
    cr_expect(strstr(out, "checksums hold") && strstr(out, "ok  model.safetensors"), "init: %s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "quantize --model %s --out %s/q", model, tmp), 0, "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "verify %s/q", tmp), 0, "%s", out);
    cr_expect(strstr(out, "checksums hold"), "quantize: %s", out);
    // A run on the default NF4 base (quantized on load) records it beside the adapter ...
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s --steps 12 --seq 32 --lr 0.02 --out %s/run", model,
                             data, tmp), 0, "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "eval --model %s --adapter %s/run/adapter --data %s --seq 32", model, tmp,
                             data), 0, "%s", out);
    double trained = loss_in(out);
    // ... which merge defaults to, saying so: the merged model is the trained one.
    cr_assert_eq(mt_test_run(out, sizeof out, "merge --model %s --adapter %s/run/adapter --out %s/m", model, tmp, tmp), 0,
                 "%s", out);
    cr_expect(strstr(out, "quantized to nf4 on load") && strstr(out, "moetrain_base.json"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "verify %s/m", tmp), 0, "%s", out);
    cr_expect(strstr(out, "checksums hold"), "merge: %s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "eval --model %s/m --data %s --seq 32 --quant none", tmp, data), 0, "%s", out);
    double merged = loss_in(out);
    cr_expect_leq(fabs(merged - trained), 1e-4 * trained, "merged %.6f, trained %.6f", merged, trained);
    // --quant none still merges into the stored weights: another model.
    cr_assert_eq(mt_test_run(out, sizeof out, "merge --model %s --adapter %s/run/adapter --out %s/m0 --quant none", model,
                             tmp, tmp), 0, "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "eval --model %s/m0 --data %s --seq 32 --quant none", tmp, data), 0, "%s",
                 out);
    cr_expect_gt(fabs(loss_in(out) - trained), 1e-4 * trained, "--quant none is the dense base: %s", out);
    // verify catches a changed byte of a merged shard.
    char path[200];
    snprintf(path, sizeof path, "%s/m/model.safetensors", tmp);
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f);
    fseek(f, -3, SEEK_END);
    int c = fgetc(f);
    fseek(f, -3, SEEK_END);
    fputc(c ^ 0x40, f);
    fclose(f);
    cr_expect_eq(mt_test_run(out, sizeof out, "verify %s/m", tmp), 1, "%s", out);
    cr_expect(strstr(out, "model.safetensors"), "names the file: %s", out);
    mt_test_rmrf(tmp);
}

Test(model_sums, an_adapter_from_elsewhere_merges_as_stored_and_says_so, .timeout = 120) {
    static char out[32768];
    char tmp[64], model[128], data[128];
    mt_test_tmpdir(tmp, sizeof tmp);
    cr_assert_eq(mt_test_tiny_run_inputs(tmp, model, data, 4), 0);
    cr_assert_eq(mt_test_run(out, sizeof out, "--model %s --data %s --steps 1 --seq 32 --quant none --out %s/run", model,
                             data, tmp), 0, "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "merge --model %s --adapter %s/run/adapter --out %s/m", model, tmp, tmp), 0,
                 "%s", out);
    cr_expect(strstr(out, "trained on the base as stored"), "%s", out);
    char rec[200];
    snprintf(rec, sizeof rec, "%s/run/adapter/moetrain_base.json", tmp);
    cr_assert_eq(remove(rec), 0);
    cr_assert_eq(mt_test_run(out, sizeof out, "merge --model %s --adapter %s/run/adapter --out %s/m2", model, tmp, tmp), 0,
                 "%s", out);
    cr_expect(strstr(out, "records no base quantization") && strstr(out, "--quant nf4"), "%s", out);
    mt_test_rmrf(tmp);
}
