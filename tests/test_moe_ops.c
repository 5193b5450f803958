// moe/ CPU reference kernels: router, aux and z-loss, permute/gather/combine, SwiGLU.
// Forwards against naive double references or hand-computed values; every backward against
// central finite differences of the forward (or, for the linear gather/combine, exact adjoint
// identities). Gradient tolerances: |analytic − fd| ≤ FD_ATOL + FD_RTOL·|fd| with h = 1e-2 on
// O(1) inputs (truncation ~h² ≈ 1e-5, fp32 rounding ~1e-7/h ≈ 1e-5), against gradients of
// order 0.1–1; every FD test also asserts its gradients are not all tiny.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe/moe.h"

#define FD_H 1e-2f
#define FD_ATOL 2e-4
#define FD_RTOL 1e-3

// ---- helpers ------------------------------------------------------------------------------

static uint64_t rng_state;
static void rng_seed(uint64_t s) { rng_state = s * 0x9E3779B97F4A7C15ull + 1; }
static float rng_uniform(float lo, float hi) {  // xorshift64*, uniform in [lo, hi)
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    uint64_t r = rng_state * 0x2545F4914F6CDD1Dull;
    return lo + (hi - lo) * (float)((r >> 40) * (1.0 / 16777216.0));
}
static void fill(float *x, int64_t n, float lo, float hi) {
    for (int64_t i = 0; i < n; i++) x[i] = rng_uniform(lo, hi);
}
// Router logits whose experts sit at least `gap` apart in each row (a shuffled ladder plus
// jitter below gap/4): a perturbation of ±FD_H can never change the top-k.
static void fill_spaced_logits(float *l, int T, int E, float gap) {
    for (int t = 0; t < T; t++) {
        float *r = l + (int64_t)t * E;
        for (int e = 0; e < E; e++) r[e] = gap * (float)e - gap * (float)E / 2;
        for (int e = E - 1; e > 0; e--) {  // Fisher–Yates
            int j = (int)rng_uniform(0.0f, (float)(e + 1));
            if (j > e) j = e;
            float tmp = r[e];
            r[e] = r[j];
            r[j] = tmp;
        }
        for (int e = 0; e < E; e++) r[e] += rng_uniform(-gap / 4, gap / 4);
    }
}

// Central difference of f at x[i]; the step actually taken (after fp32 rounding) divides.
static double fd_central(double (*f)(void *), void *ctx, float *x, int64_t i, float h) {
    const float x0 = x[i], xp = x0 + h, xm = x0 - h;
    x[i] = xp;
    const double fp = f(ctx);
    x[i] = xm;
    const double fm = f(ctx);
    x[i] = x0;
    return (fp - fm) / ((double)xp - (double)xm);
}

// Every analytic gradient entry against the FD of f over x[0..n); returns max |analytic|.
static double check_fd(const char *what, double (*f)(void *), void *ctx, float *x,
                       const float *grad, int64_t n) {
    double gmax = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double fd = fd_central(f, ctx, x, i, FD_H);
        cr_assert(fabs(grad[i] - fd) <= FD_ATOL + FD_RTOL * fabs(fd),
                  "%s: d[%ld] analytic %.8g vs finite difference %.8g", what, (long)i, grad[i], fd);
        gmax = fmax(gmax, fabs(grad[i]));
    }
    return gmax;
}

// ---- router -------------------------------------------------------------------------------

// Naive double reference: softmax, then a full ranking (prob desc, index asc), first k.
static void router_ref(int32_t *ids, double *w, double *p, const float *l, int E, int k, int norm) {
    double m = -INFINITY, s = 0.0;
    for (int e = 0; e < E; e++) m = fmax(m, l[e]);
    for (int e = 0; e < E; e++) s += (p[e] = exp((double)l[e] - m));
    for (int e = 0; e < E; e++) p[e] /= s;
    int rank[1024];
    for (int e = 0; e < E; e++) rank[e] = e;
    for (int a = 1; a < E; a++)  // insertion sort, stable: equal probs keep index order
        for (int b = a; b > 0 && p[rank[b]] > p[rank[b - 1]]; b--) {
            int tmp = rank[b];
            rank[b] = rank[b - 1];
            rank[b - 1] = tmp;
        }
    double ws = 0.0;
    for (int j = 0; j < k; j++) ws += (w[j] = p[ids[j] = rank[j]]);
    if (norm)
        for (int j = 0; j < k; j++) w[j] /= ws;
}

static void check_router_against_ref(int T, int E, int k, int norm, float scale) {
    float *l = malloc(sizeof(float) * T * E), *p = malloc(sizeof(float) * T * E);
    float *w = malloc(sizeof(float) * T * k);
    int32_t *ids = malloc(sizeof(int32_t) * T * k);
    fill(l, (int64_t)T * E, -scale, scale);
    router_forward_cpu(ids, w, p, l, T, E, k, norm);
    for (int t = 0; t < T; t++) {
        int32_t rid[64];
        double rw[64], rp[1024], wsum = 0.0, rtol[1024];
        router_ref(rid, rw, rp, l + t * E, E, k, norm);
        // fp32 computes exp(l − max) with l − max rounded (half an ulp: 6e-8 relative), which
        // moves e^x by 6e-8·|x| relative: the tolerance grows with the distance from the max.
        float m = -INFINITY;
        for (int e = 0; e < E; e++) m = fmaxf(m, l[t * E + e]);
        for (int e = 0; e < E; e++) rtol[e] = 2e-6 + 6e-8 * (m - l[t * E + e]);
        for (int e = 0; e < E; e++)
            cr_assert(fabs(p[t * E + e] - rp[e]) <= rtol[e] * rp[e], "probs[%d,%d] %.9g vs %.9g",
                      t, e, p[t * E + e], rp[e]);
        for (int j = 0; j < k; j++) {
            cr_assert_eq(ids[t * k + j], rid[j], "E=%d k=%d ids[%d,%d]", E, k, t, j);
            cr_assert(fabs(w[t * k + j] - rw[j]) <= rtol[rid[j]] * rw[j], "weights[%d,%d] %.9g vs %.9g",
                      t, j, w[t * k + j], rw[j]);
            wsum += w[t * k + j];
        }
        if (norm) cr_assert(fabs(wsum - 1.0) < 1e-6);
    }
    free(l), free(p), free(w), free(ids);
}

Test(moe_ops, router_forward_matches_double_reference) {
    rng_seed(1);
    check_router_against_ref(37, 8, 2, 1, 3.0f);   // Mixtral
    check_router_against_ref(37, 8, 2, 0, 3.0f);   // norm_topk off: the raw probabilities
    check_router_against_ref(19, 60, 4, 0, 5.0f);  // Qwen-MoE-like
    check_router_against_ref(19, 16, 1, 1, 2.0f);  // k = 1: the weight is 1
    check_router_against_ref(5, 8, 8, 1, 30.0f);   // k = E, peaked softmax
}

Test(moe_ops, router_ties_pick_the_lower_index) {
    const int E = 6;
    // row 0 all equal; row 1 a three-way tie for first; row 2 a tie for second behind 5
    const float l[3 * 6] = {0, 0, 0, 0, 0, 0, 1, 3, 3, 0, 3, 2, 0, 1, 0, 1, -1, 2};
    int32_t ids[3 * 3];
    float w[3 * 3], p[3 * 6];
    router_forward_cpu(ids, w, p, l, 3, E, 3, 1);
    const int32_t want[9] = {0, 1, 2, 1, 2, 4, 5, 1, 3};
    for (int i = 0; i < 9; i++) cr_assert_eq(ids[i], want[i], "ids[%d] = %d, want %d", i, ids[i], want[i]);
    for (int j = 0; j < 3; j++) cr_assert_float_eq(w[j], 1.0f / 3, 1e-7);
    router_forward_cpu(ids, w, p, l, 3, E, 3, 0);
    for (int j = 0; j < 3; j++) cr_assert_float_eq(w[j], 1.0f / 6, 1e-7);
    // NaN logits order nothing, yet the ids stay distinct and in range
    const float bad[4] = {NAN, NAN, NAN, NAN};
    int32_t bid[2];
    router_forward_cpu(bid, w, p, bad, 1, 4, 2, 1);
    cr_assert(bid[0] >= 0 && bid[0] < 4 && bid[1] >= 0 && bid[1] < 4 && bid[0] != bid[1]);
}

typedef struct {
    float *l, *p, *w, *c;
    int32_t *ids, *ids0;
    int T, E, k, norm;
} router_fd_ctx;

static double router_objective(void *vc) {  // Σ c_tj · weights_tj, top-k asserted fixed
    router_fd_ctx *c = vc;
    router_forward_cpu(c->ids, c->w, c->p, c->l, c->T, c->E, c->k, c->norm);
    double L = 0.0;
    for (int i = 0; i < c->T * c->k; i++) {
        cr_assert_eq(c->ids[i], c->ids0[i], "the perturbation changed the top-k");
        L += (double)c->c[i] * c->w[i];
    }
    return L;
}

static void check_router_backward(int T, int E, int k, int norm) {
    float l[8 * 16], p[8 * 16], w[8 * 16], c[8 * 16], w0[8 * 16], p0[8 * 16], dl[8 * 16];
    int32_t ids[8 * 16], ids0[8 * 16];
    fill_spaced_logits(l, T, E, 0.4f);
    fill(c, T * k, -1.0f, 1.0f);
    router_forward_cpu(ids0, w0, p0, l, T, E, k, norm);
    for (int i = 0; i < T * E; i++) dl[i] = 0.25f;  // backward accumulates
    router_backward_cpu(dl, c, p0, ids0, w0, T, E, k, norm);
    for (int i = 0; i < T * E; i++) dl[i] -= 0.25f;
    router_fd_ctx ctx = {l, p, w, c, ids, ids0, T, E, k, norm};
    double gmax = check_fd("router", router_objective, &ctx, l, dl, T * E);
    cr_assert(gmax > 0.05, "gradients too small to test (%g)", gmax);
}

Test(moe_ops, router_backward_finite_differences) {
    rng_seed(2);
    check_router_backward(5, 8, 2, 1);
    check_router_backward(5, 8, 2, 0);
    check_router_backward(4, 16, 3, 1);
    check_router_backward(3, 6, 1, 0);
}

// ---- aux loss -----------------------------------------------------------------------------

// T=4, E=4, k=2 by hand. probs rows and their top-2 (ties to the lower index):
//   r0 .40 .30 .20 .10 → 0,1     r1 .10 .50 .30 .10 → 1,2
//   r2 .25 .25 .25 .25 → 0,1     r3 .10 .10 .10 .70 → 3,0
// counts = 3 3 1 1, prob_sums = .85 1.15 .85 1.15, rows = 4:
//   L = 4 · Σ_e (c_e/4)(P_e/4) = (3·.85 + 3·1.15 + .85 + 1.15) / 4 = 8 / 4 = 2.
// With r1 masked: counts = 3 2 0 1 (expert 2 has no token), prob_sums = .75 .65 .55 1.05,
//   rows = 3: L = 4/9 · (3·.75 + 2·.65 + 0·.55 + 1·1.05) = 4/9 · 4.6 = 2.04444…
static const float aux_probs[16] = {.40f, .30f, .20f, .10f, .10f, .50f, .30f, .10f,
                                    .25f, .25f, .25f, .25f, .10f, .10f, .10f, .70f};
static const int32_t aux_ids[8] = {0, 1, 1, 2, 0, 1, 3, 0};

Test(moe_ops, aux_hand_computed) {
    // the ids above are what the router's top-k makes of these probabilities
    float l[16], p[16], w[8];
    int32_t ids[8];
    for (int i = 0; i < 16; i++) l[i] = logf(aux_probs[i]);
    router_forward_cpu(ids, w, p, l, 4, 4, 2, 1);
    for (int i = 0; i < 8; i++) cr_assert_eq(ids[i], aux_ids[i], "ids[%d]", i);

    moe_aux_stats s;
    moe_aux_init(&s, 4, 2);
    moe_aux_accumulate_cpu(&s, aux_probs, aux_ids, NULL, 4);
    cr_assert_eq(s.rows, 4);
    cr_assert_float_eq(moe_aux_loss(&s), 2.0, 1e-6, "L = %.9g", moe_aux_loss(&s));

    const uint8_t mask[4] = {1, 0, 1, 1};
    moe_aux_init(&s, 4, 2);
    moe_aux_accumulate_cpu(&s, aux_probs, aux_ids, mask, 4);
    cr_assert_eq(s.rows, 3);
    cr_assert_eq(s.counts[2], 0.0);
    cr_assert_float_eq(moe_aux_loss(&s), 4.0 / 9 * 4.6, 1e-6, "L = %.9g", moe_aux_loss(&s));
}

Test(moe_ops, aux_masked_rows_are_left_out) {
    // A masked row holding NaN probabilities and invalid ids changes nothing: the result equals
    // the three unmasked rows alone, and the masked row's gradient stays exactly 0.
    float probs[16], kept[12];
    int32_t ids[8], kept_ids[6];
    memcpy(probs, aux_probs, sizeof probs);
    memcpy(ids, aux_ids, sizeof ids);
    for (int e = 0; e < 4; e++) probs[4 + e] = NAN;
    ids[2] = -1, ids[3] = 99;
    const uint8_t mask[4] = {1, 0, 1, 1};
    for (int t = 0, r = 0; t < 4; t++)
        if (mask[t]) {
            memcpy(kept + 4 * r, aux_probs + 4 * t, 4 * sizeof(float));
            memcpy(kept_ids + 2 * r, aux_ids + 2 * t, 2 * sizeof(int32_t));
            r++;
        }
    moe_aux_stats a, b;
    moe_aux_init(&a, 4, 2);
    moe_aux_init(&b, 4, 2);
    moe_aux_accumulate_cpu(&a, probs, ids, mask, 4);
    moe_aux_accumulate_cpu(&b, kept, kept_ids, NULL, 3);
    cr_assert(isfinite(moe_aux_loss(&a)));
    cr_assert_eq(moe_aux_loss(&a), moe_aux_loss(&b));
    float da[16] = {0}, db[12] = {0};
    moe_aux_backward_cpu(da, 0.5f, &a, probs, mask, 4);
    moe_aux_backward_cpu(db, 0.5f, &b, kept, NULL, 3);
    for (int e = 0; e < 4; e++) cr_assert_eq(da[4 + e], 0.0f, "masked row's gradient");
    for (int t = 0, r = 0; t < 4; t++)
        if (mask[t]) {
            for (int e = 0; e < 4; e++) cr_assert_eq(da[4 * t + e], db[4 * r + e]);
            r++;
        }
    // every row masked: loss 0, gradient 0 (transformers would divide 0/0 here)
    const uint8_t none[4] = {0, 0, 0, 0};
    moe_aux_init(&a, 4, 2);
    moe_aux_accumulate_cpu(&a, aux_probs, aux_ids, none, 4);
    cr_assert_eq(a.rows, 0);
    cr_assert_eq(moe_aux_loss(&a), 0.0);
    memset(da, 0, sizeof da);
    moe_aux_backward_cpu(da, 1.0f, &a, aux_probs, none, 4);
    moe_aux_backward_cpu(da, 1.0f, &a, aux_probs, NULL, 4);  // rows == 0 even without a mask
    for (int i = 0; i < 16; i++) cr_assert_eq(da[i], 0.0f);
}

Test(moe_ops, aux_two_layers_equal_one_concatenated_call) {
    rng_seed(3);
    enum { TA = 6, TB = 9, E = 8, K = 2 };
    float l[(TA + TB) * E], p[(TA + TB) * E], w[(TA + TB) * K];
    int32_t ids[(TA + TB) * K];
    uint8_t mask[TA + TB];
    fill(l, (TA + TB) * E, -2.0f, 2.0f);
    for (int t = 0; t < TA + TB; t++) mask[t] = t % 4 != 1;
    router_forward_cpu(ids, w, p, l, TA + TB, E, K, 1);
    moe_aux_stats layers, concat;
    moe_aux_init(&layers, E, K);
    moe_aux_init(&concat, E, K);
    moe_aux_accumulate_cpu(&layers, p, ids, mask, TA);
    moe_aux_accumulate_cpu(&layers, p + TA * E, ids + TA * K, mask + TA, TB);
    moe_aux_accumulate_cpu(&concat, p, ids, mask, TA + TB);
    cr_assert_eq(layers.rows, concat.rows);
    cr_assert_eq(moe_aux_loss(&layers), moe_aux_loss(&concat));
    float dl[(TA + TB) * E] = {0}, dc[(TA + TB) * E] = {0};
    moe_aux_backward_cpu(dl, 0.01f, &layers, p, mask, TA);
    moe_aux_backward_cpu(dl + TA * E, 0.01f, &layers, p + TA * E, mask + TA, TB);
    moe_aux_backward_cpu(dc, 0.01f, &concat, p, mask, TA + TB);
    for (int i = 0; i < (TA + TB) * E; i++) cr_assert_eq(dl[i], dc[i], "dlogits[%d]", i);
}

Test(moe_ops, aux_degenerate_routing_is_finite) {
    enum { T = 5, E = 4 };
    float p[T * E] = {0}, d[T * E] = {0};
    int32_t ids[T * 2];
    // every token certain of expert 0, k = 1: f = (1,0,0,0), P = (1,0,0,0), L = E · 1 · 1 = 4
    for (int t = 0; t < T; t++) p[t * E] = 1.0f, ids[t] = 0;
    moe_aux_stats s;
    moe_aux_init(&s, E, 1);
    moe_aux_accumulate_cpu(&s, p, ids, NULL, T);
    cr_assert_float_eq(moe_aux_loss(&s), 4.0, 1e-12);
    moe_aux_backward_cpu(d, 1.0f, &s, p, NULL, T);
    for (int i = 0; i < T * E; i++) cr_assert(isfinite(d[i]));
    // k = 2 from the router with every token preferring experts 0 then 1: experts 2, 3 idle
    float l[T * E], w[T * 2];
    for (int t = 0; t < T; t++) l[t * E] = 20, l[t * E + 1] = 10, l[t * E + 2] = -30, l[t * E + 3] = -30;
    router_forward_cpu(ids, w, p, l, T, E, 2, 1);
    moe_aux_init(&s, E, 2);
    moe_aux_accumulate_cpu(&s, p, ids, NULL, T);
    cr_assert_eq(s.counts[2] + s.counts[3], 0.0);
    const double L = moe_aux_loss(&s);
    cr_assert(isfinite(L) && fabs(L - 4.0) < 1e-3, "L = %g", L);  // ≈ E · (1·1 + 1·0)
    memset(d, 0, sizeof d);
    moe_aux_backward_cpu(d, 1.0f, &s, p, NULL, T);
    for (int i = 0; i < T * E; i++) cr_assert(isfinite(d[i]));
    // no rows at all
    moe_aux_init(&s, E, 2);
    cr_assert_eq(moe_aux_loss(&s), 0.0);
}

typedef struct {
    float *l, *p, *w;
    int32_t *ids, *ids0;
    const float *pb;  // a second layer's rows, held fixed
    const int32_t *idsb;
    const uint8_t *mask;
    int T, Tb, E, k;
} aux_fd_ctx;

static double aux_objective(void *vc) {  // L over this layer (recomputed) + the fixed layer
    aux_fd_ctx *c = vc;
    router_forward_cpu(c->ids, c->w, c->p, c->l, c->T, c->E, c->k, 1);
    for (int i = 0; i < c->T * c->k; i++)
        cr_assert_eq(c->ids[i], c->ids0[i], "the perturbation changed the top-k");
    moe_aux_stats s;
    moe_aux_init(&s, c->E, c->k);
    moe_aux_accumulate_cpu(&s, c->p, c->ids, c->mask, c->T);
    moe_aux_accumulate_cpu(&s, c->pb, c->idsb, NULL, c->Tb);
    return moe_aux_loss(&s);
}

Test(moe_ops, aux_backward_finite_differences) {
    rng_seed(4);
    enum { T = 6, TB = 7, E = 8, K = 2 };
    float l[T * E], p[T * E], w[T * K], lb[TB * E], pb[TB * E], wb[TB * K], d[T * E];
    int32_t ids[T * K], ids0[T * K], idsb[TB * K];
    const uint8_t mask[T] = {1, 1, 0, 1, 1, 1};
    fill_spaced_logits(l, T, E, 0.4f);
    fill(lb, TB * E, -2.0f, 2.0f);
    router_forward_cpu(idsb, wb, pb, lb, TB, E, K, 1);
    router_forward_cpu(ids0, w, p, l, T, E, K, 1);
    moe_aux_stats s;
    moe_aux_init(&s, E, K);
    moe_aux_accumulate_cpu(&s, p, ids0, mask, T);
    moe_aux_accumulate_cpu(&s, pb, idsb, NULL, TB);
    const float coef = 3.0f;  // large enough that the gradients are well above FD_ATOL
    for (int i = 0; i < T * E; i++) d[i] = 1.0f;
    moe_aux_backward_cpu(d, coef, &s, p, mask, T);
    for (int i = 0; i < T * E; i++) d[i] = (d[i] - 1.0f) / coef;
    aux_fd_ctx ctx = {l, p, w, ids, ids0, pb, idsb, mask, T, TB, E, K};
    double gmax = check_fd("aux", aux_objective, &ctx, l, d, T * E);
    cr_assert(gmax > 0.01, "gradients too small to test (%g)", gmax);
    for (int e = 0; e < E; e++) cr_assert_eq(d[2 * E + e], 0.0f, "masked row");
}

// ---- z-loss -------------------------------------------------------------------------------

Test(moe_ops, zloss_value) {
    // rows: lse(0,0,0) = ln 3; lse(1000,1000,1000) = 1000 + ln 3 (no overflow); third masked
    const float l[9] = {0, 0, 0, 1000, 1000, 1000, 7, 8, 9};
    const uint8_t mask[3] = {1, 1, 0};
    int64_t rows = 5;  // adds to what is there
    const double z = moe_zloss_sum_cpu(&rows, l, mask, 3, 3);
    const double want = log(3.0) * log(3.0) + (1000 + log(3.0)) * (1000 + log(3.0));
    cr_assert_eq(rows, 7);
    cr_assert(fabs(z - want) <= 1e-9 * want, "z = %.15g, want %.15g", z, want);
    rows = 0;
    // lse(ln 1, ln 2, ln 3, ln 4) = ln 10
    const float m[4] = {0, logf(2), logf(3), logf(4)};
    const double z10 = moe_zloss_sum_cpu(&rows, m, NULL, 1, 4);
    cr_assert_float_eq(z10, log(10.0) * log(10.0), 1e-6);
    cr_assert_eq(rows, 1);
    // gradient of the huge row is finite: 2·lse·softmax = 2·(1000 + ln 3)/3 per expert
    float d[9] = {0};
    moe_zloss_backward_cpu(d, 1.0f, l, mask, 3, 3);
    cr_assert_float_eq(d[3], 2 * (1000 + log(3.0)) / 3, 1e-3);
    for (int i = 6; i < 9; i++) cr_assert_eq(d[i], 0.0f);
}

typedef struct {
    float *l;
    const uint8_t *mask;
    int T, E;
    float dscale;
} z_fd_ctx;

static double z_objective(void *vc) {
    z_fd_ctx *c = vc;
    int64_t rows = 0;
    return c->dscale * moe_zloss_sum_cpu(&rows, c->l, c->mask, c->T, c->E);
}

Test(moe_ops, zloss_backward_finite_differences) {
    rng_seed(5);
    enum { T = 5, E = 6 };
    float l[T * E], d[T * E];
    const uint8_t mask[T] = {1, 0, 1, 1, 1};
    fill(l, T * E, -3.0f, 3.0f);
    for (int i = 0; i < T * E; i++) d[i] = -0.5f;
    const float dscale = 0.25f;
    moe_zloss_backward_cpu(d, dscale, l, mask, T, E);
    for (int i = 0; i < T * E; i++) d[i] += 0.5f;
    z_fd_ctx ctx = {l, mask, T, E, dscale};
    double gmax = check_fd("zloss", z_objective, &ctx, l, d, T * E);
    cr_assert(gmax > 0.1, "gradients too small to test (%g)", gmax);
    for (int e = 0; e < E; e++) cr_assert_eq(d[E + e], 0.0f, "masked row");
}

// ---- permute, gather, combine ------------------------------------------------------------

// What the stable sort must give: assignments expert by expert, each in ascending order.
static void permute_ref(int32_t *order, int32_t *offsets, const int32_t *ids, int n, int E) {
    int i = 0;
    for (int e = 0; e < E; e++) {
        offsets[e] = i;
        for (int a = 0; a < n; a++)
            if (ids[a] == e) order[i++] = a;
    }
    offsets[E] = i;
}

static void check_permute(const int32_t *ids, int T, int E, int k) {
    const int n = T * k;
    int32_t *order = malloc(sizeof(int32_t) * n), *ref = malloc(sizeof(int32_t) * n);
    int32_t *off = malloc(sizeof(int32_t) * (E + 1)), *roff = malloc(sizeof(int32_t) * (E + 1));
    int32_t *cnt = malloc(sizeof(int32_t) * E);
    moe_permute_cpu(order, off, cnt, ids, T, E, k);
    permute_ref(ref, roff, ids, n, E);
    for (int e = 0; e <= E; e++) cr_assert_eq(off[e], roff[e], "offsets[%d]", e);
    for (int e = 0; e < E; e++) cr_assert_eq(cnt[e], roff[e + 1] - roff[e], "counts[%d]", e);
    for (int i = 0; i < n; i++) cr_assert_eq(order[i], ref[i], "order[%d]", i);
    moe_permute_cpu(order, off, NULL, ids, T, E, k);  // counts may be NULL
    for (int i = 0; i < n; i++) cr_assert_eq(order[i], ref[i]);
    free(order), free(ref), free(off), free(roff), free(cnt);
}

Test(moe_ops, permute_counts_offsets_stable_order) {
    // T=7, k=2, E=5; expert 3 gets no token; expert 4 is every token's second choice but one
    const int32_t ids[14] = {0, 4, 2, 4, 0, 4, 1, 4, 2, 0, 0, 4, 1, 4};
    int32_t order[14], off[6], cnt[5];
    moe_permute_cpu(order, off, cnt, ids, 7, 5, 2);
    const int32_t want_order[14] = {0, 4, 9, 10, 6, 12, 2, 8, 1, 3, 5, 7, 11, 13};
    const int32_t want_off[6] = {0, 4, 6, 8, 8, 14}, want_cnt[5] = {4, 2, 2, 0, 6};
    for (int i = 0; i < 14; i++) cr_assert_eq(order[i], want_order[i], "order[%d]", i);
    for (int e = 0; e <= 5; e++) cr_assert_eq(off[e], want_off[e], "offsets[%d]", e);
    for (int e = 0; e < 5; e++) cr_assert_eq(cnt[e], want_cnt[e], "counts[%d]", e);
    check_permute(ids, 7, 5, 2);
    // every token on one expert (k = 1): identity order, all other experts empty
    const int32_t one[6] = {2, 2, 2, 2, 2, 2};
    moe_permute_cpu(order, off, cnt, one, 6, 4, 1);
    for (int i = 0; i < 6; i++) cr_assert_eq(order[i], i);
    const int32_t one_off[5] = {0, 0, 0, 6, 6};
    for (int e = 0; e <= 4; e++) cr_assert_eq(off[e], one_off[e]);
    // router output at a realistic size
    rng_seed(6);
    enum { T = 300, E = 8, K = 2 };
    static float l[T * E], p[T * E], w[T * K];
    static int32_t rid[T * K];
    fill(l, T * E, -2.0f, 2.0f);
    router_forward_cpu(rid, w, p, l, T, E, K, 1);
    check_permute(rid, T, E, K);
}

// A routing for the gather/combine tests: router top-k of random logits, then the sort.
typedef struct {
    int T, E, k, H, n;
    int32_t *ids, *order, *off;
    float *w;
} routing;

static routing make_routing(int T, int E, int k, int H) {
    routing r = {T, E, k, H, T * k, malloc(sizeof(int32_t) * T * k), malloc(sizeof(int32_t) * T * k),
                 malloc(sizeof(int32_t) * (E + 1)), malloc(sizeof(float) * T * k)};
    float *l = malloc(sizeof(float) * T * E), *p = malloc(sizeof(float) * T * E);
    fill(l, (int64_t)T * E, -2.0f, 2.0f);
    router_forward_cpu(r.ids, r.w, p, l, T, E, k, 1);
    moe_permute_cpu(r.order, r.off, NULL, r.ids, T, E, k);
    free(l), free(p);
    return r;
}
static void free_routing(routing *r) { free(r->ids), free(r->order), free(r->off), free(r->w); }

static double dot(const float *a, const float *b, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

Test(moe_ops, gather_then_combine_is_the_identity) {
    rng_seed(7);
    enum { T = 9, H = 70 };  // H > 64: more than one column block in the scatters
    float x[T * H], xs[2 * T * H], out[T * H], ones[2 * T];
    fill(x, T * H, -1.0f, 1.0f);
    for (int i = 0; i < 2 * T; i++) ones[i] = 1.0f;
    // k = 1, weights 1: exactly x back
    routing r = make_routing(T, 4, 1, H);
    moe_gather_cpu(xs, H, x, r.order, r.n, H, 1);
    memset(out, 0, sizeof out);
    moe_combine_cpu(out, xs, ones, r.order, r.n, H, 1);
    for (int i = 0; i < T * H; i++) cr_assert_eq(out[i], x[i], "out[%d]", i);
    free_routing(&r);
    // k = 2 with the router's renormalised weights (summing to 1): x back to rounding
    r = make_routing(T, 8, 2, H);
    moe_gather_cpu(xs, H, x, r.order, r.n, H, 2);
    for (int i = 0; i < r.n; i++)  // row i holds token order[i] / k
        cr_assert_eq(memcmp(xs + i * H, x + (r.order[i] / 2) * H, H * sizeof(float)), 0);
    memset(out, 0, sizeof out);
    moe_combine_cpu(out, xs, r.w, r.order, r.n, H, 2);
    for (int i = 0; i < T * H; i++) cr_assert_float_eq(out[i], x[i], 1e-6, "out[%d]", i);
    free_routing(&r);
}

Test(moe_ops, gather_and_combine_backward_adjoints) {
    rng_seed(8);
    enum { T = 11, E = 6, K = 2, H = 70, N = T * K };
    static float x[T * H], y[N * H], dx[T * H], xs[N * H], ys[N * H], dout[T * H], out[T * H],
        dys[N * H], dw[N], basis[N];
    routing r = make_routing(T, E, K, H);
    fill(x, T * H, -1.0f, 1.0f);
    fill(y, N * H, -1.0f, 1.0f);
    fill(ys, N * H, -1.0f, 1.0f);
    fill(dout, T * H, -1.0f, 1.0f);

    // gather: <gather(x), y> = <x, gather_backward(y)>, and the backward accumulates
    moe_gather_cpu(xs, H, x, r.order, N, H, K);
    for (int i = 0; i < T * H; i++) dx[i] = NAN;  // written, never read: its old values must not show
    moe_gather_backward_cpu(dx, y, H, r.order, N, H, K);
    const double g1 = dot(xs, y, N * H), g2 = dot(x, dx, T * H);
    cr_assert(fabs(g1 - g2) <= 1e-5 * (1 + fabs(g1)), "<Gx,y> %.9g vs <x,G'y> %.9g", g1, g2);

    // combine is linear in ys: <combine(ys), dout> = <ys, dys>
    memset(out, 0, sizeof out);
    moe_combine_cpu(out, ys, r.w, r.order, N, H, K);
    for (int i = 0; i < N * H; i++) dys[i] = NAN;  // written, never read: its old values must not show
    for (int i = 0; i < N; i++) dw[i] = 0.5f;      // accumulated
    moe_combine_backward_cpu(dys, H, dw, dout, ys, r.w, r.order, N, H, K);
    for (int i = 0; i < N; i++) dw[i] -= 0.5f;
    const double c1 = dot(out, dout, T * H), c2 = dot(ys, dys, N * H);
    cr_assert(fabs(c1 - c2) <= 1e-5 * (1 + fabs(c1)), "<C ys,dout> %.9g vs <ys,C'dout> %.9g", c1, c2);
    // ... and linear in the weights: dweights[a] = <combine(ys, one-hot a), dout>, entry by entry
    for (int a = 0; a < N; a++) {
        memset(basis, 0, sizeof basis);
        basis[a] = 1.0f;
        memset(out, 0, sizeof out);
        moe_combine_cpu(out, ys, basis, r.order, N, H, K);
        const double want = dot(out, dout, T * H);
        cr_assert(fabs(dw[a] - want) <= 1e-5 * (1 + fabs(want)), "dweights[%d] %.9g vs %.9g", a,
                  dw[a], want);
    }
    // NULL gradients are skipped
    moe_combine_backward_cpu(NULL, H, dw, dout, ys, r.w, r.order, N, H, K);
    moe_combine_backward_cpu(dys, H, NULL, dout, ys, r.w, r.order, N, H, K);
    free_routing(&r);
}

// ---- SwiGLU -------------------------------------------------------------------------------

typedef struct {
    float *g, *u, *a, *c;
    int n;
} swiglu_fd_ctx;

static double swiglu_objective(void *vc) {  // Σ c · silu(g) · u
    swiglu_fd_ctx *s = vc;
    swiglu_forward_cpu(s->a, s->g, s->u, s->n);
    return dot(s->a, s->c, s->n);
}

Test(moe_ops, swiglu_forward_and_backward_finite_differences) {
    rng_seed(9);
    enum { N = 64 };
    float g[N], u[N], a[N], c[N], dg[N], du[N];
    fill(g, N, -5.0f, 5.0f);
    fill(u, N, -2.0f, 2.0f);
    fill(c, N, -1.0f, 1.0f);
    swiglu_forward_cpu(a, g, u, N);
    for (int i = 0; i < N; i++) {
        const double want = g[i] / (1 + exp(-(double)g[i])) * u[i];
        cr_assert(fabs(a[i] - want) <= 1e-6 * (1 + fabs(want)), "a[%d] %.9g vs %.9g", i, a[i], want);
    }
    for (int i = 0; i < N; i++) dg[i] = du[i] = 1.0f;
    swiglu_backward_cpu(dg, du, c, g, u, N);
    for (int i = 0; i < N; i++) dg[i] -= 1.0f, du[i] -= 1.0f;
    swiglu_fd_ctx ctx = {g, u, a, c, N};
    cr_assert(check_fd("swiglu dg", swiglu_objective, &ctx, g, dg, N) > 0.1);
    cr_assert(check_fd("swiglu du", swiglu_objective, &ctx, u, du, N) > 0.1);
}

Test(moe_ops, swiglu_large_gates_stay_finite) {
    const float g[6] = {100, -100, 1000, -1000, 88.8f, -88.8f}, u[6] = {2, 2, 2, 2, 2, 2},
                da[6] = {1, 1, 1, 1, 1, 1};
    float a[6], dg[6] = {0}, du[6] = {0};
    swiglu_forward_cpu(a, g, u, 6);
    swiglu_backward_cpu(dg, du, da, g, u, 6);
    for (int i = 0; i < 6; i++)
        cr_assert(isfinite(a[i]) && isfinite(dg[i]) && isfinite(du[i]), "g=%g: a %g dg %g du %g",
                  g[i], a[i], dg[i], du[i]);
    cr_assert_float_eq(a[0], 200.0f, 1e-4);  // silu(100) = 100
    cr_assert_float_eq(a[2], 2000.0f, 1e-3);
    cr_assert(fabsf(a[1]) < 1e-30f && fabsf(a[3]) < 1e-30f);  // silu(−100) ≈ −3.7e-42
    cr_assert_float_eq(dg[0], 2.0f, 1e-6);  // silu'(100) = 1, times u
    cr_assert(fabsf(dg[1]) < 1e-30f && fabsf(dg[3]) < 1e-30f);
    cr_assert_float_eq(du[0], 100.0f, 1e-4);  // du = silu(g)
}

// The fused layout (row r of gu = [g_r | u_r], the GPU step's one w1‖w3 GEMM) against the split
// kernels on the same values, bit for bit (same expressions, element for element). f = 37 and
// rows = 5: column counts that are no multiple of any vector width. The fused backward writes
// (the split one adds, here to zeros) over a dgu full of other values, and again in place, over
// gu itself.
Test(moe_ops, swiglu_fused_equals_split_exactly) {
    rng_seed(10);
    enum { R = 5, F = 37 };
    float gu[R * 2 * F], g[R * F], u[R * F], da[R * F];
    float a_fused[R * F], a_split[R * F], dgu[R * 2 * F], inplace[R * 2 * F], dg[R * F] = {0}, du[R * F] = {0};
    fill(gu, R * 2 * F, -12.0f, 12.0f);
    fill(da, R * F, -1.0f, 1.0f);
    fill(dgu, R * 2 * F, -1.0f, 1.0f);
    memcpy(inplace, gu, sizeof gu);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < F; c++) g[r * F + c] = gu[r * 2 * F + c], u[r * F + c] = gu[r * 2 * F + F + c];
    swiglu_forward_cpu(a_split, g, u, R * F);
    swiglu_fused_forward_cpu(a_fused, F, gu, R, F);
    swiglu_backward_cpu(dg, du, da, g, u, R * F);
    swiglu_fused_backward_cpu(dgu, da, F, gu, R, F);
    swiglu_fused_backward_cpu(inplace, da, F, inplace, R, F);
    cr_assert(memcmp(inplace, dgu, sizeof dgu) == 0, "in place, the fused backward differs from its own out of place");
    int moved = 0;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < F; c++) {
            const int i = r * F + c;
            cr_assert(memcmp(&a_fused[i], &a_split[i], sizeof(float)) == 0, "a[%d,%d] %.9g vs %.9g", r, c,
                      a_fused[i], a_split[i]);
            cr_assert(memcmp(&dgu[r * 2 * F + c], &dg[i], sizeof(float)) == 0, "dg[%d,%d] %.9g vs %.9g", r, c,
                      dgu[r * 2 * F + c], dg[i]);
            cr_assert(memcmp(&dgu[r * 2 * F + F + c], &du[i], sizeof(float)) == 0, "du[%d,%d] %.9g vs %.9g", r, c,
                      dgu[r * 2 * F + F + c], du[i]);
            moved += a_split[i] != 0.0f;
        }
    cr_assert(moved > R * F / 2, "the forward gave mostly zeros: the comparison proves nothing");
}

// gpt-oss's clamped SwiGLU: the fused twins (the CPU side of swiglu_clamped_fused_*_cuda)
// against the split kernels the cpu step runs, bit for bit, with every fifth input exactly at
// ±limit, a float next to it or far outside (±1e4); both clamps cut some, and pass at the bound.
Test(moe_ops, swiglu_clamped_fused_equals_split_exactly) {
    rng_seed(11);
    enum { R = 5, F = 37 };
    const float lim = 1.375f, alpha = 1.702f;
    const float special[] = {lim, -lim, nextafterf(lim, 2), nextafterf(-lim, -2), nextafterf(lim, 0),
                             nextafterf(-lim, 0), 1e4f, -1e4f};
    float gu[R * 2 * F], g[R * F], u[R * F], da[R * F];
    float a_fused[R * F], a_split[R * F], dgu[R * 2 * F], inplace[R * 2 * F], dg[R * F] = {0}, du[R * F] = {0};
    fill(gu, R * 2 * F, -4.0f, 4.0f);
    for (int i = 0, j = 0; i < R * 2 * F; i += 5, j++) gu[i] = special[(j + i / 7) % 8];
    fill(da, R * F, -1.0f, 1.0f);
    fill(dgu, R * 2 * F, -1.0f, 1.0f);
    memcpy(inplace, gu, sizeof gu);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < F; c++) g[r * F + c] = gu[r * 2 * F + c], u[r * F + c] = gu[r * 2 * F + F + c];
    swiglu_clamped_forward_cpu(a_split, g, u, R * F, alpha, lim);
    swiglu_clamped_fused_forward_cpu(a_fused, F, gu, R, F, alpha, lim);
    swiglu_clamped_backward_cpu(dg, du, da, g, u, R * F, alpha, lim);
    swiglu_clamped_fused_backward_cpu(dgu, da, F, gu, R, F, alpha, lim);
    swiglu_clamped_fused_backward_cpu(inplace, da, F, inplace, R, F, alpha, lim);
    cr_assert(memcmp(inplace, dgu, sizeof dgu) == 0, "in place, the fused backward differs from its own out of place");
    int cut_g = 0, cut_u = 0, at_bound = 0;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < F; c++) {
            const int i = r * F + c;
            cr_assert(memcmp(&a_fused[i], &a_split[i], sizeof(float)) == 0, "a[%d,%d] %.9g vs %.9g", r, c,
                      a_fused[i], a_split[i]);
            cr_assert(memcmp(&dgu[r * 2 * F + c], &dg[i], sizeof(float)) == 0, "dg[%d,%d] %.9g vs %.9g", r, c,
                      dgu[r * 2 * F + c], dg[i]);
            cr_assert(memcmp(&dgu[r * 2 * F + F + c], &du[i], sizeof(float)) == 0, "du[%d,%d] %.9g vs %.9g", r, c,
                      dgu[r * 2 * F + F + c], du[i]);
            cut_g += g[i] > lim, cut_u += u[i] > lim || u[i] < -lim;
            at_bound += (g[i] == lim && dg[i] != 0.0f) + ((u[i] == lim || u[i] == -lim) && du[i] != 0.0f);
        }
    cr_assert(cut_g > 10 && cut_u > 10 && at_bound > 2, "cut g %d, u %d; gradients passed at the bound %d", cut_g,
              cut_u, at_bound);
}
