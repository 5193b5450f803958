// LoRA: PEFT's initialisation, the forward definition, and finite differences of the backward
// (dA, dB, dx), with and without dropout; the frozen Linear's input gradient through LoRA.
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/common.h"
#include "core/rng.h"
#include "lora/lora.h"
#include "model/linear.h"
#include "tests/fd.h"

enum { N = 5, IN = 7, OUT = 6, R = 3 };

typedef struct {
    mt_linear lin;
    mt_lora lora;
    float x[N * IN], g[N * OUT], y[N * OUT], xa[N * R];
} lora_case;

static double objective(void *ctx) {  // Σ g · y(x)
    lora_case *c = ctx;
    mt_linear_forward_cpu(&c->lin, c->y, c->x, c->xa, N);
    double s = 0;
    for (int i = 0; i < N * OUT; i++) s += (double)c->g[i] * c->y[i];
    return s;
}

static void setup(lora_case *c, mt_backend *be, double dropout) {
    memset(c, 0, sizeof *c);
    cr_assert_eq(mt_lora_init(&c->lora, be, MT_F32, IN, OUT, R, 6.0, 0, dropout, 7, 1), 0);
    c->lora.dropout_seed = 1234;
    int64_t ws[2] = {OUT, IN};
    c->lin = (mt_linear){.out = OUT, .in = IN, .w = mt_tensor_new(be, MT_MEM_BASE, MT_F32, 2, ws), .lora = &c->lora};
    mt_rng rng;
    mt_rng_seed(&rng, 99, 0);
    float *w = c->lin.w->data, *b = c->lora.b->data;
    for (int i = 0; i < OUT * IN; i++) w[i] = mt_rng_normal(&rng);
    for (int i = 0; i < OUT * R; i++) b[i] = mt_rng_normal(&rng);  // B non-zero: A gets a gradient
    for (int i = 0; i < N * IN; i++) c->x[i] = mt_rng_normal(&rng);
    for (int i = 0; i < N * OUT; i++) c->g[i] = mt_rng_normal(&rng);
}

static void check_fd(double dropout) {
    mt_backend *be = mt_backend_cpu_new();
    lora_case c;
    setup(&c, be, dropout);
    objective(&c);
    float dx[N * IN] = {0};
    mt_linear_backward_cpu(&c.lin, dx, c.g, c.x, c.xa, N);
    struct { const char *what; float *p; const float *g; int64_t n; } v[] = {
        {"dA", c.lora.a->data, c.lora.da->data, R * IN},
        {"dB", c.lora.b->data, c.lora.db->data, OUT * R},
        {"dx", c.x, dx, N * IN},
    };
    for (int i = 0; i < 3; i++) {
        fd_report r = fd_check_f32(objective, &c, v[i].p, v[i].g, v[i].n, 1e-2f, 1e-2 * fd_max_abs(v[i].g, v[i].n));
        cr_expect_lt(r.worst, 1e-3, "%s (dropout %.1f): " FD_FMT, v[i].what, dropout, FD_ARGS(r));
    }
    mt_tensor_free(c.lin.w);
    mt_lora_free(&c.lora);
    cr_expect_eq(be->ledger.total_cur, 0, "dropout and backward scratch returned to the ledger");
    mt_backend_free(be);
}

Test(lora, finite_differences) { check_fd(0.0); }
Test(lora, finite_differences_with_dropout) { check_fd(0.3); }

Test(lora, init_is_peft_default_and_forward_is_its_definition) {
    mt_backend *be = mt_backend_cpu_new();
    lora_case c;
    setup(&c, be, 0.0);
    cr_assert_float_eq(c.lora.scale, 2.0f, 0, "alpha / r");
    const float *a = c.lora.a->data, bound = 1.0f / sqrtf(IN);
    for (int i = 0; i < R * IN; i++) cr_assert(fabsf(a[i]) <= bound, "A inside U(-1/sqrt(in), 1/sqrt(in))");
    // y = x Wᵀ + scale · x Aᵀ Bᵀ, in double
    objective(&c);
    const float *w = c.lin.w->data, *b = c.lora.b->data;
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OUT; o++) {
            double ref = 0;
            for (int i = 0; i < IN; i++) ref += (double)c.x[n * IN + i] * w[o * IN + i];
            for (int j = 0; j < R; j++) {
                double xa = 0;
                for (int i = 0; i < IN; i++) xa += (double)c.x[n * IN + i] * a[j * IN + i];
                ref += 2.0 * xa * b[o * R + j];
            }
            cr_assert(fabs(c.y[n * OUT + o] - ref) < 1e-4, "y[%d,%d] %f vs %f", n, o, c.y[n * OUT + o], ref);
        }
    mt_lora lr;
    cr_assert_eq(mt_lora_init(&lr, be, MT_F32, IN, OUT, 4, 16.0, 1, 0.0, 1, 2), 0);
    cr_assert_float_eq(lr.scale, 8.0f, 1e-6, "rsLoRA: alpha / sqrt(r)");
    const float *zb = lr.b->data;
    for (int i = 0; i < OUT * 4; i++) cr_assert_eq(zb[i], 0.0f, "B starts at zero");
    mt_lora_free(&lr);
    mt_tensor_free(c.lin.w);
    mt_lora_free(&c.lora);
    mt_backend_free(be);
}

Test(lora, dropout_is_regenerated_identically) {
    mt_backend *be = mt_backend_cpu_new();
    lora_case c;
    setup(&c, be, 0.5);
    objective(&c);
    float y1[N * OUT];
    memcpy(y1, c.y, sizeof y1);
    objective(&c);
    cr_assert_eq(memcmp(y1, c.y, sizeof y1), 0, "same seed, same mask");
    c.lora.dropout_seed++;
    objective(&c);
    cr_assert_neq(memcmp(y1, c.y, sizeof y1), 0, "a new seed draws a new mask");
    mt_tensor_free(c.lin.w);
    mt_lora_free(&c.lora);
    mt_backend_free(be);
}

// A pair (an expert's w1 and w3): each adapter as mt_lora_init makes it from its own stream, A1
// and A3 adjacent in one block (dA1 and dA3 too), the ledger's bytes those of two adapters; free
// gives every byte back (the views' structs alone, the blocks with the first).
Test(lora, pair_is_two_adapters_with_adjacent_a) {
    mt_backend *be = mt_backend_cpu_new();
    enum { IN = 24, OUT = 40, R = 4 };
    mt_lora one[2], pair[2];
    const uint64_t streams[2] = {11, 13};
    for (int i = 0; i < 2; i++)
        cr_assert_eq(mt_lora_init(&one[i], be, MT_F32, IN, OUT, R, 8.0, 0, 0.0, 5, streams[i]), 0, "%s", mt_error_get());
    uint64_t apart[MT_MEM_COUNT];
    memcpy(apart, be->ledger.cur, sizeof apart);
    for (int i = 0; i < 2; i++) mt_lora_free(&one[i]);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(mt_lora_init(&one[i], be, MT_F32, IN, OUT, R, 8.0, 0, 0.0, 5, streams[i]), 0, "%s", mt_error_get());
    uint64_t before[MT_MEM_COUNT];
    memcpy(before, be->ledger.cur, sizeof before);
    cr_assert_eq(mt_lora_init_pair(&pair[0], &pair[1], be, MT_F32, IN, OUT, R, 8.0, 0, 0.0, 5, streams[0], streams[1]), 0,
                 "%s", mt_error_get());
    for (int c = 0; c < MT_MEM_COUNT; c++)
        cr_expect_eq(be->ledger.cur[c] - before[c], apart[c], "%s: a pair's bytes are two adapters'", mt_mem_cat_name(c));
    cr_expect(mt_lora_pair_adjacent(&pair[0], &pair[1]));
    cr_expect(!mt_lora_pair_adjacent(&pair[1], &pair[0]), "the first owns the blocks");
    cr_expect(!mt_lora_pair_adjacent(&one[0], &one[1]));
    for (int i = 0; i < 2; i++) {
        cr_expect_eq(pair[i].a->shape[0], R);
        cr_expect_eq(pair[i].a->nbytes, one[i].a->nbytes);
        cr_expect(memcmp(pair[i].a->data, one[i].a->data, one[i].a->nbytes) == 0, "A%d: the values of its own stream", i);
        cr_expect_eq(pair[i].scale, one[i].scale);
        cr_expect_eq(pair[i].stream, streams[i]);
    }
    cr_expect_eq((char *)pair[1].da->data, (char *)pair[0].da->data + pair[0].da->nbytes, "dA3 right after dA1");
    for (int i = 0; i < 2; i++) mt_lora_free(&one[i]);
    mt_lora_free(&pair[1]), mt_lora_free(&pair[0]);
    for (int c = 0; c < MT_MEM_COUNT; c++) cr_expect_eq(be->ledger.cur[c], 0, "%s given back", mt_mem_cat_name(c));
    mt_backend_free(be);
}
