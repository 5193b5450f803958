// --router-bias-update (model/router_balance.c, DeepSeek-V3's aux-loss-free balancing) on
// DeepSeek-V3's tiny config: over 200 steps it brings a deliberately skewed router toward
// balance; and what it moved is kept: in the run's checkpoints (a resumed run equals the
// uninterrupted one, biases included), beside its adapter (router_bias.safetensors, listed in
// SHA256SUMS), read back by mt_model_load_adapter (eval, generate) and folded in by merge.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/common.h"
#include "core/fileio.h"
#include "core/safetensors.h"
#include "model/config.h"
#include "model/mixtral.h"
#include "moe/moe.h"
#include "tests/test_util.h"
#include "trainer/options.h"

#define TINY_V3 MT_REPO_ROOT "/configs/tiny-deepseek-v3.json"

// counts [layers × E] += the experts the last forward chose (every row counted).
static void add_choices(const mt_model *m, double *counts, int T) {
    int E = (int)m->cfg.experts, k = (int)m->cfg.top_k;
    for (int L = 0; L < m->cfg.layers; L++)
        if (!m->layers[L].dense) router_load_accumulate_cpu(counts + L * E, m->kept[L].ids->data, NULL, T, E, k);
}

// The worst MoE layer's max/mean of counts [layers × E].
static double worst_max_over_mean(const mt_model *m, const double *counts) {
    int E = (int)m->cfg.experts;
    double worst = 0;
    for (int L = 0; L < m->cfg.layers; L++)
        if (!m->layers[L].dense) worst = fmax(worst, router_load_max_over_mean(counts + L * E, E));
    return worst;
}

Test(router_balance, two_hundred_steps_balance_a_skewed_router) {
    mt_model_config cfg;
    cr_assert_eq(mt_model_config_load(TINY_V3, &cfg), 0, "%s", mt_error_get());
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = MT_MODE_ROUTER, o.quant = MT_QUANT_NONE;
    mt_backend *be = mt_backend_cpu_new();
    mt_model m;
    cr_assert_eq(mt_model_build(&m, be, &cfg, NULL, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    cr_assert_eq(mt_model_bias_balance_start(&m), 0, "%s", mt_error_get());
    for (int L = 0; L < m.cfg.layers; L++) {  // group 0's experts (0-2) favoured by a quarter
        if (!m.layers[L].score_bias) continue;
        float *b = m.layers[L].score_bias->data;
        for (int e = 0; e < m.cfg.experts; e++) b[e] = e < 3 ? 0.25f : 0.0f;
    }
    // The load over the first ten steps and over the last fifty (one step's 192 choices among 9
    // experts are too few: their max/mean is ~1.5 even from a balanced router).
    enum { B = 4, S = 16, STEPS = 200, FIRST = 10, LAST = 50 };
    int32_t tokens[B * S];
    size_t n = (size_t)(m.cfg.layers * m.cfg.experts);
    double *mm = mt_xcalloc((size_t)m.cfg.layers, sizeof(double)), *early = mt_xcalloc(n, sizeof(double));
    double *late = mt_xcalloc(n, sizeof(double));
    for (int step = 0; step < STEPS; step++) {
        for (int i = 0; i < B * S; i++) tokens[i] = 3 + (int)((i * 29 + step * 131) % 250);
        mt_batch b = {B, S, tokens, tokens, NULL};
        mt_loss l;
        cr_assert_eq(mt_model_forward_train(&m, &b, &l), 0);
        if (step < FIRST) add_choices(&m, early, B * S);
        if (step >= STEPS - LAST) add_choices(&m, late, B * S);
        cr_assert_eq(mt_model_bias_balance_step(&m, NULL, 0.005f, mm), 0);
    }
    double first = worst_max_over_mean(&m, early), last = worst_max_over_mean(&m, late);
    cr_log_info("expert load max/mean: %.3f over the first %d steps, %.3f over the last %d", first, FIRST, last, LAST);
    fprintf(stderr, "router_balance: expert load max/mean %.3f over the first %d steps, %.3f over the last %d\n", first,
            FIRST, last, LAST);
    cr_expect_gt(first, 2.0, "the skew is too mild to test: max/mean %.3f", first);
    cr_expect_lt(last, 1.25, "max/mean load %.3f over the last %d steps (from %.3f)", last, LAST, first);
    free(early), free(late);
    free(mm);
    mt_model_free(&m);
    mt_backend_free(be);
}

// The score biases of the file at path, [layers][E] (0 where a layer has none).
static void biases_of_file(const char *path, const mt_model *m, float *out) {
    mt_st_file f;
    cr_assert_eq(mt_st_file_open(&f, path), 0, "%s", mt_error_get());
    memset(out, 0, (size_t)(m->cfg.layers * m->cfg.experts) * sizeof(float));
    int found = 0;
    for (int L = 0; L < m->cfg.layers; L++) {
        char name[128];
        if (mt_model_score_bias_name(m, L, name, sizeof name) != 0) continue;
        const mt_st_tensor *t = mt_st_file_find(&f, name);
        cr_assert(t && t->nbytes == (size_t)m->cfg.experts * 4, "%s: %s", path, name);
        memcpy(out + L * m->cfg.experts, t->data, t->nbytes);
        found++;
    }
    cr_assert_gt(found, 0, "%s: no score bias", path);
    mt_st_file_close(&f);
}

static char *slurp(const char *path, size_t *n) {
    char *d;
    cr_assert_eq(mt_read_file(path, 1 << 26, &d, n), 0, "%s", mt_error_get());
    return d;
}

Test(router_balance, the_moved_biases_are_kept) {
    char tmp[64], out[16384], model[256], data[256], a[256], b[256], merged[256], path[512], path2[512];
    mt_test_tmpdir(tmp, sizeof tmp);
    snprintf(model, sizeof model, "%s/v3", tmp);
    snprintf(data, sizeof data, "%s/data.jsonl", tmp);
    snprintf(a, sizeof a, "%s/full", tmp), snprintf(b, sizeof b, "%s/split", tmp);
    snprintf(merged, sizeof merged, "%s/merged", tmp);
    cr_assert_eq(mt_test_run(out, sizeof out, "init --config %s --out %s --seed 4", TINY_V3, model), 0, "%s", out);
    FILE *f = fopen(data, "w");
    for (int i = 0; i < 48; i++) fprintf(f, "{\"text\":\"row %d says %d\"}\n", i, (i * 37) % 1000);
    fclose(f);
    const char *common = "--mode lora --r 4 --targets all --quant none --seq 24 --batch 4 --lr 1e-3 "
                         "--router-bias-update 0.02 --seed 5";
    cr_assert_eq(mt_test_run(out, sizeof out, "train --model %s --data %s %s --steps 6 --out %s", model, data, common,
                             a), 0, "%s", out);
    cr_expect(strstr(out, "step 1: router bias update 0.02; expert load max/mean"), "%s", out);
    // stopped after 3 steps, then resumed: the biases come back from the checkpoint
    cr_assert_eq(mt_test_run(out, sizeof out, "train --model %s --data %s %s --steps 6 --save-every 3 --out %s", model,
                             data, common, b), 0, "%s", out);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf %s/checkpoint-6 %s/adapter && echo checkpoint-3 > %s/latest", b, b, b);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(mt_test_run(out, sizeof out, "train --model %s --data %s %s --steps 6 --resume %s --out %s", model,
                             data, common, b, b), 0, "%s", out);
    snprintf(path, sizeof path, "%s/adapter/%s", a, MT_SCORE_BIAS_FILE);
    snprintf(path2, sizeof path2, "%s/adapter/%s", b, MT_SCORE_BIAS_FILE);
    size_t na, nb;
    char *da = slurp(path, &na), *db = slurp(path2, &nb);
    cr_expect(na == nb && memcmp(da, db, na) == 0, "the resumed run's biases differ from the uninterrupted one's");
    free(da), free(db);
    snprintf(path2, sizeof path2, "%s/adapter/SHA256SUMS", a);
    char *sums = slurp(path2, &na);
    cr_expect(strstr(sums, MT_SCORE_BIAS_FILE), "SHA256SUMS does not list %s:\n%s", MT_SCORE_BIAS_FILE, sums);
    free(sums);

    // moved (init's are 0), read back with the adapter, folded in by merge
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = MT_MODE_LORA, o.lora_r = 4, o.quant = MT_QUANT_NONE, o.targets = MT_TARGET_EXPERTS | MT_TARGET_ATTN | MT_TARGET_GATE;
    mt_backend *be = mt_backend_cpu_new();
    mt_model m;
    cr_assert_eq(mt_model_load(&m, be, model, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    size_t nb_all = (size_t)(m.cfg.layers * m.cfg.experts);
    float *want = mt_xmalloc(nb_all * sizeof(float)), *got = mt_xcalloc(nb_all, sizeof(float));
    biases_of_file(path, &m, want);
    double moved = 0;
    for (size_t i = 0; i < nb_all; i++) moved = fmax(moved, fabsf(want[i]));
    cr_expect_gt(moved, 0.01, "the biases did not move (largest %.3g)", moved);
    snprintf(path2, sizeof path2, "%s/adapter", a);
    cr_assert_eq(mt_model_load_adapter(&m, path2), 0, "%s", mt_error_get());
    for (int L = 0; L < m.cfg.layers; L++)
        if (m.layers[L].score_bias) memcpy(got + L * m.cfg.experts, m.layers[L].score_bias->data, m.cfg.experts * 4);
    cr_expect(memcmp(got, want, nb_all * sizeof(float)) == 0, "the adapter's load left the base's biases");
    cr_assert_eq(mt_test_run(out, sizeof out, "merge --model %s --adapter %s --out %s", model, path2, merged), 0, "%s",
                 out);
    snprintf(path2, sizeof path2, "%s/model.safetensors", merged);
    biases_of_file(path2, &m, got);
    cr_expect(memcmp(got, want, nb_all * sizeof(float)) == 0, "merge kept the base's biases");
    free(want), free(got);
    mt_model_free(&m);
    mt_backend_free(be);
    mt_test_rmrf(tmp);
}
