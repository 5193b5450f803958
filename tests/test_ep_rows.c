// tests/test_ep_rows.c — an expert-parallel rank whose experts get no rows in a layer.
//
// When every token of a layer is routed to another rank's experts, this rank's own layout has no
// rows: its experts' activation buffers are never made (model/acts.c), and the exchange
// (model/expert_parallel.c) moves nothing to it. The forward and backward still run through the
// exchange on it. One process stands in for rank 0 of two (no comm: the exchange then only packs
// and unpacks, the other rank's answer unread), on the cpu, with the routing given.
#include <criterion/criterion.h>
#include <string.h>

#include "core/common.h"
#include "model/mixtral.h"
#include "tests/test_compare.h"
#include "tests/test_util.h"
#include "trainer/options.h"

Test(ep_rows, a_rank_without_rows_runs_its_step) {
    char tmp[64], dir[128];
    tiny_checkpoint(tmp, dir, 3);
    mt_backend *be = mt_backend_cpu_new();
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.quant = MT_QUANT_NONE, o.mode = MT_MODE_LORA, o.lora_r = 8, o.targets = MT_TARGET_EXPERTS;
    mt_model_config cfg;
    cr_assert_eq(mt_model_config_load(dir, &cfg), 0, "%s", mt_error_get());
    mt_model m;
    mt_model_par par = {.ep_rank = 0, .ep_size = 2};
    cr_assert_eq(mt_model_build_par(&m, be, &cfg, dir, MT_MODEL_SPEC_OF(&o), &par), 0, "%s", mt_error_get());
    // Every token to the first two experts rank 1 holds, in every layer.
    int32_t other[2], n = 0;
    for (int e = 0; e < cfg.experts && n < 2; e++)
        if (!mt_expert_is_local(&m, 0, e)) other[n++] = e;
    cr_assert_eq(n, 2, "rank 1 holds two experts");
    enum { B = 2, S = 8, T = B * S };
    int32_t tokens[T], ids[T * 2];
    for (int i = 0; i < T; i++) tokens[i] = 3 + (i * 37) % 200, ids[2 * i] = other[0], ids[2 * i + 1] = other[1];
    const int32_t *given[8];
    cr_assert_leq(cfg.layers, 8);
    for (int L = 0; L < cfg.layers; L++) given[L] = ids;
    m.routing_given = given;
    mt_batch b = {B, S, tokens, tokens, NULL};
    mt_loss loss;
    mt_model_zero_grad(&m);
    cr_assert_eq(mt_model_forward_train(&m, &b, &loss), 0, "%s", mt_error_get());
    for (int L = 0; L < cfg.layers; L++)
        cr_expect_eq(m.kept[L].own_offsets[cfg.experts], 0, "layer %d: no rows come to rank 0's experts", L);
    mt_model_backward(&m);
    mt_model_free(&m);
    mt_backend_free(be);
    mt_test_rmrf(tmp);
}
