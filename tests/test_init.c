// `moetrain init`: the checkpoint it writes reads back bit for bit, sharded or not, and
// `moetrain plan --model` accepts it.
#include <criterion/criterion.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "core/safetensors.h"
#include "model/config.h"
#include "model/weights.h"
#include "tests/test_util.h"

#define TINY MT_REPO_ROOT "/configs/tiny.json"

// Every tensor of the model is present with its shape and dtype, and equals what the seed gives.
static void check_checkpoint(const char *dir, uint64_t seed, mt_dtype dtype) {
    mt_model_config cfg;
    cr_assert_eq(mt_model_config_load(dir, &cfg), 0, "%s", mt_error_get());
    cr_assert_eq(cfg.torch_dtype, dtype);
    mt_st_model m;
    cr_assert_eq(mt_st_model_open(&m, dir), 0, "%s", mt_error_get());
    mt_weight_desc *w;
    size_t n = mt_weights_list(&cfg, &w);
    cr_assert_eq(m.n_tensors, n, "exactly the model's tensors");
    for (size_t i = 0; i < n; i++) {
        const mt_st_tensor *t = mt_st_model_find(&m, w[i].name);
        cr_assert_not_null(t, "missing %s", w[i].name);
        cr_assert_str_eq(t->dtype, mt_st_dtype_of(dtype));
        cr_assert_eq(t->ndim, w[i].ndim, "%s", w[i].name);
        for (int d = 0; d < t->ndim; d++) cr_assert_eq(t->shape[d], w[i].shape[d], "%s", w[i].name);
        void *expect = mt_xmalloc(t->nbytes);
        mt_weights_init_fill(&cfg, &w[i], seed, dtype, expect);
        cr_assert_eq(memcmp(expect, t->data, t->nbytes), 0, "%s differs from its seed", w[i].name);
        free(expect);
    }
    free(w);
    mt_st_model_close(&m);
}

Test(init, tiny_single_file_and_sharded_read_back_bit_for_bit) {
    char tmp[64], out[8192], path[256];
    mt_test_tmpdir(tmp, sizeof tmp);
    cr_assert_eq(mt_test_run(out, sizeof out, "init --config %s --out %s/one --seed 7", TINY, tmp), 0, "%s", out);
    snprintf(path, sizeof path, "%s/one/model.safetensors", tmp);
    cr_assert_eq(access(path, F_OK), 0, "a small model is one file");
    check_checkpoint(strcat(strcpy(path, tmp), "/one"), 7, MT_F32);

    cr_assert_eq(mt_test_run(out, sizeof out, "init --config %s --out %s/sh --seed 7 --shard-size 200KB",
                             TINY, tmp), 0, "%s", out);
    snprintf(path, sizeof path, "%s/sh/model.safetensors.index.json", tmp);
    cr_assert_eq(access(path, F_OK), 0, "above --shard-size the model is sharded with an index");
    char ls[8192];
    snprintf(out, sizeof out, "ls %s/sh | grep -cE '^model-[0-9]{5}-of-[0-9]{5}[.]safetensors$'", tmp);
    FILE *p = popen(out, "r");
    cr_assert(fgets(ls, sizeof ls, p));
    pclose(p);
    cr_assert_geq(atoi(ls), 2, "at least two shards");
    check_checkpoint(strcat(strcpy(path, tmp), "/sh"), 7, MT_F32);

    cr_assert_eq(mt_test_run(out, sizeof out, "init --config %s --out %s/bf --seed 8 --dtype bf16", TINY, tmp), 0,
                 "%s", out);
    check_checkpoint(strcat(strcpy(path, tmp), "/bf"), 8, MT_BF16);

    cr_assert_eq(mt_test_run(out, sizeof out, "plan --model %s/one", tmp), 0, "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "plan --model %s/sh/config.json --mode router", tmp), 0, "%s", out);
    mt_test_rmrf(tmp);
}

Test(init, bad_arguments_are_named) {
    char out[4096];
    cr_assert_eq(mt_test_run(out, sizeof out, "init --config %s", TINY), 2);
    cr_assert(strstr(out, "--out"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "init --config %s --out /tmp/x --dtype f64", TINY), 2);
    cr_assert(strstr(out, "--dtype"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "init --config %s --out /tmp/x --frobnicate 1", TINY), 2);
    cr_assert(strstr(out, "--frobnicate"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "init --config /nonexistent/c.json --out /tmp/x"), 1);
    cr_assert(strstr(out, "/nonexistent/c.json"), "%s", out);
}

Test(cli, help_default_subcommand_and_unbuilt_commands) {
    char out[16384];
    cr_assert_eq(mt_test_run(out, sizeof out, "--help"), 0);
    cr_assert(strstr(out, "plan") && strstr(out, "init") && strstr(out, "train"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "plan --help"), 0);
    cr_assert(strstr(out, "--gpu-mem"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "init --help"), 0);
    cr_assert_eq(mt_test_run(out, sizeof out, "frobnicate"), 2);
    cr_assert(strstr(out, "frobnicate"), "%s", out);
    // train is the default sub-command: bad flags are named, a missing model is an error
    cr_assert_eq(mt_test_run(out, sizeof out, "--mode lora --r 16 --experts all"), 2);
    cr_assert(strstr(out, "--model"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "--mode lorax"), 2);
    cr_assert(strstr(out, "--mode"), "%s", out);
}
