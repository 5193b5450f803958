// Building the model through quant/: a checkpoint written by `moetrain quantize` trains exactly as
// the dense checkpoint quantized on load; what trains must be stored dense; --quant none
// dequantizes a 4-bit checkpoint on load; a block-FP8 checkpoint trains as its f32 dequantization.
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "model/mixtral.h"
#include "quant/quant.h"
#include "trainer/cmd/commands.h"
#include "tests/test_util.h"
#include "optim/optim.h"
#include "optim/params.h"
#include "trainer/options.h"

static char tmp[64];
static char out[16384];

static void setup(void) { mt_test_tmpdir(tmp, sizeof tmp); }
static void teardown(void) { mt_test_rmrf(tmp); }
TestSuite(model_load, .init = setup, .fini = teardown);

// A tiny checkpoint in `dtype` at tmp/name.
static void init_model(const char *name, const char *dtype) {
    cr_assert_eq(mt_test_run(out, sizeof out, "init --config %s/configs/tiny.json --out %s/%s --seed 5 --dtype %s",
                             MT_REPO_ROOT, tmp, name, dtype), 0, "%s", out);
}

static void quantize(const char *from, const char *to, const char *flags) {
    cr_assert_eq(mt_test_run(out, sizeof out, "quantize --model %s/%s --out %s/%s %s", tmp, from, tmp, to, flags), 0,
                 "%s", out);
}

// Run options from flags (as the command line gives them) on top of a LoRA run of rank 4.
static void opts_of(const char *flags, mt_run_opts *o) {
    char buf[512], *argv[32];
    int argc = 0;
    mt_run_opts_default(o);
    o->lora_r = 4;
    o->targets = MT_TARGET_EXPERTS | MT_TARGET_GATE;
    snprintf(buf, sizeof buf, "%s", flags);
    for (char *s, *t = strtok_r(buf, " ", &s); t && argc < 32; t = strtok_r(NULL, " ", &s)) argv[argc++] = t;
    cr_assert_eq(mt_run_opts_parse(o, argc, argv), 0, "%s", mt_error_get());
}

enum { STEPS = 3 };

// Loads tmp/name, trains STEPS steps in-process and returns each step's loss.
static void train_losses(const char *name, const char *flags, double *losses) {
    mt_backend *be = mt_backend_cpu_new();
    mt_run_opts o;
    opts_of(flags, &o);
    char dir[128];
    snprintf(dir, sizeof dir, "%s/%s", tmp, name);
    mt_model m;
    cr_assert_eq(mt_model_load(&m, be, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s: %s", name, mt_error_get());
    mt_param *p;
    int n = mt_model_params(&m, &p);
    for (int i = 0; i < n; i++)  // B = 0 at init: give A's path something to do from step 1
        if (strstr(p[i].name, "lora_B"))
            for (int64_t j = 0; j < mt_tensor_numel(p[i].w); j++) ((float *)p[i].w->data)[j] = 0.01f;
    mt_adamw opt;
    cr_assert_eq(mt_adamw_init(&opt, be, p, n, NULL), 0);
    enum { B = 2, S = 16 };
    int32_t tokens[B * S], labels[B * S];
    for (int i = 0; i < B * S; i++) tokens[i] = labels[i] = 32 + (i * 13) % 90;
    mt_batch b = {B, S, tokens, labels, NULL};
    for (int step = 0; step < STEPS; step++) {
        mt_loss l;
        mt_model_zero_grad(&m);
        cr_assert_eq(mt_model_forward(&m, &b, &l), 0);
        mt_model_backward(&m);
        cr_assert_eq(mt_adamw_step(&opt, p, n, 1e-2, 1.0, NULL), 0);
        losses[step] = l.loss;
    }
    mt_adamw_free(&opt);
    mt_params_free(p, n);
    mt_model_free(&m);
    cr_expect_eq(be->ledger.total_cur, 0, "everything went back to the ledger");
    mt_backend_free(be);
}

static void expect_same_losses(const char *dense, const char *quantized, const char *flags) {
    double a[STEPS], b[STEPS];
    train_losses(dense, flags, a);
    train_losses(quantized, flags, b);
    for (int i = 0; i < STEPS; i++)
        cr_expect(a[i] == b[i], "%s, step %d: %s %.17g, %s %.17g", flags, i + 1, dense, a[i], quantized, b[i]);
    cr_expect(isfinite(a[0]) && a[STEPS - 1] != a[0], "the runs trained (%g -> %g)", a[0], a[STEPS - 1]);
}

Test(model_load, quantized_checkpoint_trains_as_quantize_on_load) {
    init_model("bf16", "bf16");
    init_model("f32", "f32");
    quantize("bf16", "bf16_nf4", "--quant nf4");
    quantize("f32", "f32_int4", "--quant int4");
    quantize("f32", "f32_fp4", "--quant fp4 --no-double-quant --blocksize 128");
    quantize("bf16", "bf16_nf4_all", "--quant nf4 --quant-targets all");
    expect_same_losses("bf16", "bf16_nf4", "--quant nf4");
    expect_same_losses("f32", "f32_int4", "--quant int4");
    expect_same_losses("f32", "f32_fp4", "--quant fp4 --no-double-quant --blocksize 128");
    expect_same_losses("bf16", "bf16_nf4_all", "--quant nf4 --quant-targets all");
    // a dense router in a 4-bit file (at whatever offset the U8 parts leave it) quantized on load
    expect_same_losses("bf16", "bf16_nf4", "--quant nf4 --quant-targets all");
    // a 4-bit router (its LoRA beside it) dequantized on load when the run keeps routers dense:
    // the same values as the 4-bit one, through a dense matmul
    double a[STEPS], b[STEPS];
    train_losses("bf16", "--quant nf4 --quant-targets all", a);
    train_losses("bf16_nf4_all", "--quant nf4", b);
    for (int i = 0; i < STEPS; i++) cr_expect_leq(fabs(a[i] - b[i]), 1e-5 * fabs(a[i]), "step %d: %g vs %g", i, a[i], b[i]);
}

// Block FP8 (tests/data/quant/fp8_tiny, scripts/make_fp8_fixtures.py): quantized on load, kept dense,
// or trained in full, the run is the one on the same weights dequantized by transformers to f32.
Test(model_load, fp8_checkpoint_trains_as_its_f32_dequantization) {
    char a[200], b[200];
    snprintf(a, sizeof a, "%s/fp8", tmp);
    snprintf(b, sizeof b, "%s/fp8_f32", tmp);
    cr_assert_eq(symlink(MT_REPO_ROOT "/tests/data/quant/fp8_tiny", a), 0);
    cr_assert_eq(symlink(MT_REPO_ROOT "/tests/data/quant/fp8_tiny_f32", b), 0);
    expect_same_losses("fp8_f32", "fp8", "--quant nf4");
    expect_same_losses("fp8_f32", "fp8", "--quant none");
    expect_same_losses("fp8_f32", "fp8", "--mode full --quant none");
}

// INT4 takes its own group 128 by default (4.25 bits), and the ledger says so.
Test(model_load, int4_default_group_is_128) {
    init_model("f32", "f32");
    mt_backend *be = mt_backend_cpu_new();
    mt_run_opts o;
    opts_of("--quant int4", &o);
    char dir[128];
    snprintf(dir, sizeof dir, "%s/f32", tmp);
    mt_model m;
    cr_assert_eq(mt_model_load(&m, be, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    const mt_qweight *q = m.layers[0].w1[0].q;
    cr_assert_not_null(q);
    cr_expect_eq(q->type, MT_QUANT_INT4);
    cr_expect_eq(q->blocksize, 128);
    cr_expect_null(m.layers[0].gate.q, "the router stays dense by default");
    mt_model_free(&m);
    mt_backend_free(be);
}

Test(model_load, what_trains_must_be_stored_dense) {
    init_model("bf16", "bf16");
    quantize("bf16", "nf4", "--quant nf4");
    mt_backend *be = mt_backend_cpu_new();
    char dir[128];
    snprintf(dir, sizeof dir, "%s/nf4", tmp);
    mt_run_opts o;
    opts_of("--mode unfreeze --layers 1 --experts 2", &o);
    mt_model m;
    cr_assert_neq(mt_model_load(&m, be, dir, MT_MODEL_SPEC_OF(&o)), 0);
    const char *e = mt_error_get();
    cr_expect(strstr(e, "model.layers.1.block_sparse_moe.experts.2.w") && strstr(e, "stored 4-bit") &&
                  strstr(e, "unquantized"), "%s", e);
    cr_expect_eq(be->ledger.total_cur, 0, "nothing left allocated after the refusal");
    // the router is stored dense there: router mode loads
    opts_of("--mode router", &o);
    cr_assert_eq(mt_model_load(&m, be, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    cr_expect_not_null(m.layers[0].gate.dw);
    cr_expect_not_null(m.layers[0].w1[0].q, "frozen experts imported 4-bit");
    mt_model_free(&m);
    mt_backend_free(be);
}

// --quant none on a 4-bit checkpoint: every frozen weight dequantized to dense f32, and the
// step computes the same loss as the 4-bit model (to the matmul's rounding).
Test(model_load, quant_none_dequantizes_on_load) {
    init_model("bf16", "bf16");
    quantize("bf16", "nf4", "--quant nf4");
    double a[STEPS], b[STEPS];
    train_losses("nf4", "--quant nf4", a);
    train_losses("nf4", "--quant none", b);
    for (int i = 0; i < STEPS; i++) cr_expect_leq(fabs(a[i] - b[i]), 1e-5 * fabs(a[i]), "step %d: %g vs %g", i, a[i], b[i]);
    mt_backend *be = mt_backend_cpu_new();
    char dir[128];
    snprintf(dir, sizeof dir, "%s/nf4", tmp);
    mt_run_opts o;
    opts_of("--quant none", &o);
    mt_model m;
    cr_assert_eq(mt_model_load(&m, be, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    cr_expect(m.layers[0].w2[3].w && !m.layers[0].w2[3].q, "dense");
    mt_model_free(&m);
    mt_backend_free(be);
}

// The run option is the one `moetrain quantize` reads: a bad list is named.
Test(model_load, quant_targets_flag) {
    mt_run_opts o;
    mt_run_opts_default(&o);
    cr_expect_eq(o.quant_targets, (unsigned)(MT_QTARGET_EXPERTS | MT_QTARGET_ATTN));
    cr_expect_eq(o.quant_blocksize, 0, "the format's default");
    char *bad[] = {"--quant-targets", "experts,mlp"};
    cr_expect_neq(mt_run_opts_parse(&o, 2, bad), 0);
    cr_expect(strstr(mt_error_get(), "--quant-targets"), "%s", mt_error_get());
    char *bs[] = {"--blocksize", "48"};
    cr_expect_neq(mt_run_opts_parse(&o, 2, bs), 0);
    cr_expect(strstr(mt_error_get(), "--blocksize"), "%s", mt_error_get());
    char *good[] = {"--quant-targets", "all", "--blocksize", "256"};
    cr_assert_eq(mt_run_opts_parse(&o, 4, good), 0, "%s", mt_error_get());
    cr_expect_eq(o.quant_targets, (unsigned)MT_QTARGET_ALL);
    cr_expect_eq(o.quant_blocksize, 256);
    cr_expect_eq(mt_test_run(out, sizeof out, "quantize --model %s --out %s/x --quant-targets mlp", tmp, tmp),
                 MT_EXIT_USAGE);
    cr_expect(strstr(out, "--quant-targets"), "%s", out);
}

// No checkpoint on a computing backend: random weights of the config's shapes (the GPU benchmark's
// Mixtral-8x7B), frozen experts quantized, a finite loss near ln V, the same from the same seed.
Test(model_load, random_weights_without_a_checkpoint) {
    mt_model_config cfg;
    char path[256];
    snprintf(path, sizeof path, "%s/configs/tiny.json", MT_REPO_ROOT);
    cr_assert_eq(mt_model_config_load(path, &cfg), 0, "%s", mt_error_get());
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = MT_MODE_LORA, o.lora_r = 4;
    double losses[2];
    for (int run = 0; run < 2; run++) {
        mt_backend *be = mt_backend_cpu_new();
        mt_model m;
        cr_assert_eq(mt_model_build(&m, be, &cfg, NULL, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
        cr_expect_not_null(m.layers[0].w1[0].q, "frozen experts are 4-bit");
        int32_t tokens[32], labels[32];
        for (int i = 0; i < 32; i++) tokens[i] = labels[i] = (i * 37) % (int)cfg.vocab;
        mt_batch b = {2, 16, tokens, labels, NULL};
        mt_loss l;
        cr_assert_eq(mt_model_forward(&m, &b, &l), 0);
        losses[run] = l.ce;
        mt_model_free(&m);
        mt_backend_free(be);
    }
    cr_expect(isfinite(losses[0]) && fabs(losses[0] - log((double)cfg.vocab)) < 0.5, "ce %g, ln V %g", losses[0],
              log((double)cfg.vocab));
    cr_expect_eq(losses[0], losses[1], "same seed, same weights");
}
