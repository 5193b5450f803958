// The DeepSeek-style router (moe/router_grouped.c): hand-computed routes (groups, a correction
// bias, ulp-close scores, DeepSeek-V2's softmax and max-group), a naive double reference on
// random rows, the backward against central finite differences (sigmoid and softmax, with and
// without normalisation, scores small enough for the 1e-20 to count), replay, NaN, the rule's
// checks, and the aux-loss-free bias update. The CUDA twins: tests/cuda_ops_cases.h.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "moe/moe.h"
#include "tests/fd.h"

static uint64_t rng_state;
static void rng_seed(uint64_t s) { rng_state = s * 0x9E3779B97F4A7C15ull + 1; }
static float rng_uniform(float lo, float hi) {  // xorshift64*, uniform in [lo, hi)
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    uint64_t r = rng_state * 0x2545F4914F6CDD1Dull;
    return lo + (hi - lo) * (float)((r >> 40) * (1.0 / 16777216.0));
}

static float logit(float s) { return logf(s / (1.0f - s)); }

// DeepSeek-V3 / GLM-4.5 (sigmoid, top-2 group score, normalised) and DeepSeek-V2 (softmax, max).
static moe_route_rule v3_rule(int n_group, int topk_group, float scaling) {
    return (moe_route_rule){.sigmoid = 1, .n_group = n_group, .topk_group = topk_group, .group_top2 = 1,
                            .norm_topk = 1, .scaling = scaling};
}
static moe_route_rule v2_rule(int n_group, int topk_group, float scaling) {
    return (moe_route_rule){.sigmoid = 0, .n_group = n_group, .topk_group = topk_group, .group_top2 = 0,
                            .norm_topk = 0, .scaling = scaling};
}

static void expect_route(const int32_t *ids, const float *w, const int32_t *want_ids, const double *want_w, int k,
                         const char *what) {
    for (int j = 0; j < k; j++) {
        cr_assert_eq(ids[j], want_ids[j], "%s: ids[%d] = %d, want %d", what, j, ids[j], want_ids[j]);
        cr_assert(fabs(w[j] - want_w[j]) <= 2e-6 * fabs(want_w[j]), "%s: weights[%d] = %.9g, want %.9g", what, j,
                  w[j], want_w[j]);
    }
}

// E = 9 in 3 groups of 3, topk_group 2, k 3, scaling 2.5; scores (logits = their logits):
//   group 0: .90 .10 .80 → top-2 sum 1.70     group 1: .95 .20 .30 → 1.25
//   group 2: .60 .70 .50 → 1.30
// No bias: groups 0 and 2 are kept (expert 3, the best score, is out with its group); the top-3
// of {.90 .10 .80 .60 .70 .50} is experts 0, 2, 7: weights 2.5·(.9, .8, .7)/2.4.
// bias +.25 on expert 8: its choice score .75 beats expert 7's .70 (group 2 stays kept at 1.45):
//   ids 0, 2, 8, weights from the UNBIASED scores: 2.5·(.9, .8, .5)/2.2.
// bias +.65 on expert 4: group 1 scores .95 + .85 = 1.80 and replaces group 2; the top-3 of
//   {.90 .10 .80 .95 .85 .30} is experts 3, 0, 4: weights 2.5·(.95, .90, .20)/2.05.
Test(router_grouped, hand_computed_groups_and_bias) {
    const float s[9] = {.90f, .10f, .80f, .95f, .20f, .30f, .60f, .70f, .50f};
    float l[9], sc[9], w[3], bias[9];
    for (int e = 0; e < 9; e++) l[e] = logit(s[e]);
    int32_t ids[3];
    const moe_route_rule r = v3_rule(3, 2, 2.5f);

    router_grouped_forward_cpu(ids, w, sc, l, NULL, 1, 9, 3, r);
    for (int e = 0; e < 9; e++) cr_assert(fabs(sc[e] - s[e]) < 1e-6, "scores[%d] = %.9g", e, sc[e]);
    expect_route(ids, w, (int32_t[]){0, 2, 7}, (double[]){2.5 * .9 / 2.4, 2.5 * .8 / 2.4, 2.5 * .7 / 2.4}, 3,
                 "no bias");

    memset(bias, 0, sizeof bias);
    bias[8] = .25f;
    router_grouped_forward_cpu(ids, w, sc, l, bias, 1, 9, 3, r);
    expect_route(ids, w, (int32_t[]){0, 2, 8}, (double[]){2.5 * .9 / 2.2, 2.5 * .8 / 2.2, 2.5 * .5 / 2.2}, 3,
                 "bias on expert 8");
    for (int e = 0; e < 9; e++) cr_assert(fabs(sc[e] - s[e]) < 1e-6, "scores stay unbiased: [%d] = %.9g", e, sc[e]);

    memset(bias, 0, sizeof bias);
    bias[4] = .65f;
    router_grouped_forward_cpu(ids, w, sc, l, bias, 1, 9, 3, r);
    expect_route(ids, w, (int32_t[]){3, 0, 4}, (double[]){2.5 * .95 / 2.05, 2.5 * .9 / 2.05, 2.5 * .2 / 2.05}, 3,
                 "bias moves group 1 in");

    // without groups (GLM-4.5's n_group 1) and without normalisation: the plain top-3
    moe_route_rule flat = r;
    flat.n_group = 1, flat.topk_group = 1, flat.norm_topk = 0;
    router_grouped_forward_cpu(ids, w, sc, l, NULL, 1, 9, 3, flat);
    expect_route(ids, w, (int32_t[]){3, 0, 2}, (double[]){2.5 * .95, 2.5 * .9, 2.5 * .8}, 3, "no groups, no norm");
}

// Scores a few ulps apart: the higher wins, however close, for experts and for groups.
//   group 0: experts 0 and 1 at logit 2 (s ≈ .881), expert 1 nudged up until its score is the
//            larger; expert 2 at -3.
//   groups 1 and 2: (1, .5, -3) each, expert 7 nudged up until group 2's top-2 sum is larger.
// Groups 0 and 2 are kept (the tie-to-lower rule would have kept group 1); ids 1, 0, 6.
Test(router_grouped, ulp_close_scores_pick_the_higher) {
    float l[9] = {2.0f, 2.0f, -3.0f, 1.0f, 0.5f, -3.0f, 1.0f, 0.5f, -3.0f}, s[9], w[3];
    int32_t ids[3];
    const moe_route_rule r = v3_rule(3, 2, 1.0f);
    int steps1 = 0, steps7 = 0;
    for (;;) {  // expert 1 just above expert 0
        router_grouped_forward_cpu(ids, w, s, l, NULL, 1, 9, 3, r);
        if (s[1] > s[0]) break;
        l[1] = nextafterf(l[1], INFINITY), steps1++;
    }
    for (;;) {  // group 2's sum just above group 1's (as the router adds them, in fp32)
        router_grouped_forward_cpu(ids, w, s, l, NULL, 1, 9, 3, r);
        if (s[6] + s[7] > s[3] + s[4]) break;
        l[7] = nextafterf(l[7], INFINITY), steps7++;
    }
    router_grouped_forward_cpu(ids, w, s, l, NULL, 1, 9, 3, r);
    cr_assert(s[1] - s[0] <= 4 * (nextafterf(s[0], 1.0f) - s[0]), "scores 0 and 1 are %g apart: not a near-tie",
              s[1] - s[0]);
    cr_assert((s[6] + s[7]) - (s[3] + s[4]) <= 4 * (nextafterf(s[3] + s[4], 4.0f) - (s[3] + s[4])));
    cr_assert_eq(ids[0], 1, "ids[0] = %d: expert 1 scores %a > expert 0's %a (%d logit steps)", ids[0], s[1], s[0],
                 steps1);
    cr_assert_eq(ids[1], 0);
    cr_assert_eq(ids[2], 6, "ids[2] = %d: group 2 (%a) must beat group 1 (%a)", ids[2], s[6] + s[7], s[3] + s[4]);
    // exact ties go to the lower index: expert 1 back level with expert 0
    l[1] = l[0];
    router_grouped_forward_cpu(ids, w, s, l, NULL, 1, 9, 3, r);
    cr_assert_eq(ids[0], 0);
    cr_assert_eq(ids[1], 1);
}

// DeepSeek-V2's group_limited_greedy: softmax scores, a group's score its max, no normalisation,
// scaling 16. E 8 in 4 groups of 2, topk_group 2, k 3. Logits
//   [2.0 -1.0 | 0.5 1.5 | 2.2 -2.0 | 1.0 1.8]: group maxima (in logit order) 2.0 1.5 2.2 1.8
// keep groups 2 and 0, so the top-3 is experts 4, 0 and 1 (1 at logit -1, ahead of 3 and 7,
// which are out with their groups); weights 16·softmax. Greedy (no groups): 4, 0, 7.
Test(router_grouped, deepseek_v2_softmax_max_group) {
    const float l[8] = {2.0f, -1.0f, 0.5f, 1.5f, 2.2f, -2.0f, 1.0f, 1.8f};
    double p[8], sum = 0.0;
    for (int e = 0; e < 8; e++) sum += p[e] = exp(l[e]);
    for (int e = 0; e < 8; e++) p[e] /= sum;
    float s[8], w[3];
    int32_t ids[3];
    router_grouped_forward_cpu(ids, w, s, l, NULL, 1, 8, 3, v2_rule(4, 2, 16.0f));
    for (int e = 0; e < 8; e++) cr_assert(fabs(s[e] - p[e]) < 1e-6 * p[e] + 1e-9, "scores[%d]", e);
    expect_route(ids, w, (int32_t[]){4, 0, 1}, (double[]){16 * p[4], 16 * p[0], 16 * p[1]}, 3, "v2 groups");
    router_grouped_forward_cpu(ids, w, s, l, NULL, 1, 8, 3, v2_rule(1, 1, 16.0f));
    expect_route(ids, w, (int32_t[]){4, 0, 7}, (double[]){16 * p[4], 16 * p[0], 16 * p[7]}, 3, "v2 greedy");
}

// ---- a naive double reference on random rows ------------------------------------------------

// One row in double: the full ranking by a stable sort, groups first.
static void route_ref(int32_t *ids, double *w, const float *l, const float *bias, int E, int k, moe_route_rule r) {
    double s[256], c[256], gs[64];
    int order[256], kept[64] = {0};
    if (r.sigmoid) {
        for (int e = 0; e < E; e++) s[e] = 1.0 / (1.0 + exp(-(double)l[e]));
    } else {
        double m = -INFINITY, sum = 0.0;
        for (int e = 0; e < E; e++) m = fmax(m, l[e]);
        for (int e = 0; e < E; e++) sum += s[e] = exp(l[e] - m);
        for (int e = 0; e < E; e++) s[e] /= sum;
    }
    for (int e = 0; e < E; e++) c[e] = s[e] + (bias ? bias[e] : 0.0);
    const int G = r.n_group > 1 ? r.n_group : 1, n = E / G, tg = r.n_group > 1 ? r.topk_group : 1;
    for (int g = 0; g < G; g++) {  // the group's two best by a sort of its members
        double a = -INFINITY, b = -INFINITY;
        for (int e = g * n; e < (g + 1) * n; e++) {
            if (c[e] > a) b = a, a = c[e];
            else if (c[e] > b) b = c[e];
        }
        gs[g] = r.group_top2 ? a + b : a;
    }
    for (int i = 0; i < tg; i++) {
        int best = -1;
        for (int g = 0; g < G; g++)
            if (!kept[g] && (best < 0 || gs[g] > gs[best])) best = g;
        kept[best] = 1;
    }
    int m = 0;
    for (int e = 0; e < E; e++)
        if (kept[e / n]) order[m++] = e;
    for (int a = 1; a < m; a++)  // insertion sort, stable: ties keep index order
        for (int b = a; b > 0 && c[order[b]] > c[order[b - 1]]; b--) {
            int t = order[b];
            order[b] = order[b - 1], order[b - 1] = t;
        }
    double sum = 0.0;
    for (int j = 0; j < k; j++) sum += w[j] = s[ids[j] = order[j]];
    for (int j = 0; j < k; j++) w[j] = (r.norm_topk ? w[j] / (sum + 1e-20) : w[j]) * r.scaling;
}

static void check_against_ref(int T, int E, int k, moe_route_rule r, int with_bias, uint64_t seed) {
    rng_seed(seed);
    float *l = malloc(sizeof(float) * T * E), *s = malloc(sizeof(float) * T * E), *w = malloc(sizeof(float) * T * k);
    int32_t *ids = malloc(sizeof(int32_t) * T * k);
    float bias[256];
    for (int i = 0; i < T * E; i++) l[i] = rng_uniform(-4.0f, 4.0f);
    for (int e = 0; e < E; e++) bias[e] = rng_uniform(-0.3f, 0.3f);
    router_grouped_forward_cpu(ids, w, s, l, with_bias ? bias : NULL, T, E, k, r);
    for (int t = 0; t < T; t++) {
        int32_t rid[64];
        double rw[64];
        route_ref(rid, rw, l + t * E, with_bias ? bias : NULL, E, k, r);
        for (int j = 0; j < k; j++) {
            cr_assert_eq(ids[t * k + j], rid[j], "E=%d k=%d row %d choice %d: %d, reference %d", E, k, t, j,
                         ids[t * k + j], rid[j]);
            cr_assert(fabs(w[t * k + j] - rw[j]) <= 3e-6 * fabs(rw[j]) + 1e-12, "row %d weight %d: %.9g vs %.9g", t,
                      j, w[t * k + j], rw[j]);
        }
    }
    free(l), free(s), free(w), free(ids);
}

Test(router_grouped, random_rows_match_a_double_reference) {
    check_against_ref(40, 64, 8, v3_rule(8, 4, 2.5f), 1, 1);    // DeepSeek-V3's shape, scaled down
    check_against_ref(40, 32, 4, v3_rule(1, 1, 1.0f), 1, 2);    // GLM-4.5: no groups, a bias
    check_against_ref(40, 16, 6, v2_rule(4, 2, 16.0f), 0, 3);   // DeepSeek-V2
    check_against_ref(40, 16, 2, v2_rule(1, 1, 1.0f), 0, 4);    // V2 greedy
    check_against_ref(20, 12, 12, v3_rule(1, 1, 1.0f), 1, 5);   // k = E
    moe_route_rule odd = v3_rule(6, 6, 1.5f);                   // every group kept, no norm
    odd.norm_topk = 0;
    check_against_ref(20, 12, 3, odd, 1, 6);
    moe_route_rule soft_norm = v2_rule(4, 1, 1.0f);            // softmax, normalised, top-2 groups
    soft_norm.norm_topk = 1, soft_norm.group_top2 = 1;
    check_against_ref(20, 16, 4, soft_norm, 0, 7);
}

// ---- backward ----------------------------------------------------------------------------

typedef struct {
    float *l, *s, *w, *c, *bias;
    int32_t *ids, *ids0;
    int T, E, k;
    moe_route_rule r;
} fd_ctx;

static double objective(void *vc) {  // Σ c_tj · weights_tj; the choice must not move
    fd_ctx *c = vc;
    router_grouped_forward_cpu(c->ids, c->w, c->s, c->l, c->bias, c->T, c->E, c->k, c->r);
    double L = 0.0;
    for (int i = 0; i < c->T * c->k; i++) {
        cr_assert_eq(c->ids[i], c->ids0[i], "the perturbation changed the choice");
        L += (double)c->c[i] * c->w[i];
    }
    return L;
}

// Logits on a shuffled ladder `gap` apart around `centre` (jitter gap/4): a step of ±h moves no
// choice. The bias is a smaller ladder, so choice scores stay apart too.
static void check_backward(int T, int E, int k, moe_route_rule r, int with_bias, float centre, float gap,
                           uint64_t seed) {
    rng_seed(seed);
    float l[8 * 32], s[8 * 32], w[8 * 8], c[8 * 8], w0[8 * 8], s0[8 * 32], dl[8 * 32], bias[32];
    int32_t ids[8 * 8], ids0[8 * 8];
    for (int t = 0; t < T; t++) {
        float *row = l + t * E;
        for (int e = 0; e < E; e++) row[e] = centre + gap * (e - E / 2.0f);
        for (int e = E - 1; e > 0; e--) {
            int j = (int)rng_uniform(0.0f, (float)e + 0.999f);
            float tmp = row[e];
            row[e] = row[j], row[j] = tmp;
        }
        for (int e = 0; e < E; e++) row[e] += rng_uniform(-gap / 4, gap / 4);
    }
    for (int e = 0; e < E; e++) bias[e] = 0.003f * (float)((e * 7) % E);
    for (int i = 0; i < T * k; i++) c[i] = rng_uniform(-1.0f, 1.0f);
    float *b = with_bias ? bias : NULL;
    router_grouped_forward_cpu(ids0, w0, s0, l, b, T, E, k, r);
    for (int i = 0; i < T * E; i++) dl[i] = 0.25f;  // backward accumulates
    router_grouped_backward_cpu(dl, c, s0, ids0, w0, T, E, k, r);
    for (int i = 0; i < T * E; i++) dl[i] -= 0.25f;
    fd_ctx ctx = {l, s, w, c, b, ids, ids0, T, E, k, r};
    const double gmax = fd_max_abs(dl, T * E);
    fd_report rep = fd_check_f32(objective, &ctx, l, dl, T * E, 1e-2f, 0.02 * gmax);
    cr_assert(gmax > 0.02, "gradients too small to test (%g)", gmax);
    cr_assert(rep.worst < 2e-3, "sigmoid=%d norm=%d groups=%d: " FD_FMT, r.sigmoid, r.norm_topk, r.n_group,
              FD_ARGS(rep));
    if (r.sigmoid)  // only the chosen experts' logits get a gradient
        for (int t = 0; t < T; t++)
            for (int e = 0; e < E; e++) {
                int chosen = 0;
                for (int j = 0; j < k; j++) chosen |= ids0[t * k + j] == e;
                if (!chosen) cr_assert_eq(dl[t * E + e], 0.0f);
            }
}

Test(router_grouped, backward_sigmoid_finite_differences) {
    check_backward(4, 16, 4, v3_rule(4, 2, 2.5f), 1, 0.0f, 0.3f, 11);  // V3: groups, bias, norm, scaling
    moe_route_rule no_norm = v3_rule(4, 2, 2.5f);
    no_norm.norm_topk = 0;
    check_backward(4, 16, 4, no_norm, 1, 0.0f, 0.3f, 12);
    check_backward(3, 8, 2, v3_rule(1, 1, 1.0f), 0, 0.0f, 0.5f, 13);  // no groups, no bias
    moe_route_rule one = v3_rule(1, 1, 1.0f);
    one.norm_topk = 0;
    check_backward(3, 8, 1, one, 0, 0.0f, 0.5f, 15);  // k = 1 (normalised, its weight would be 1)
}

// Sigmoid scores around 1e-20 (logits near -46): the denominator's 1e-20 is a third of it, and
// the backward must carry it (weights then sum to well under 1).
Test(router_grouped, backward_tiny_scores_carry_the_epsilon) {
    check_backward(4, 8, 3, v3_rule(2, 1, 2.5f), 0, -46.0f, 0.2f, 14);
    float l[4] = {-46.0f, -46.5f, -47.0f, -60.0f}, s[4], w[2];
    int32_t ids[2];
    router_grouped_forward_cpu(ids, w, s, l, NULL, 1, 4, 2, v3_rule(1, 1, 1.0f));
    double s0 = 1.0 / (1.0 + exp(46.0)), s1 = 1.0 / (1.0 + exp(46.5));
    cr_assert(fabs(w[0] - s0 / (s0 + s1 + 1e-20)) < 1e-6, "w[0] = %.9g, want %.9g", w[0], s0 / (s0 + s1 + 1e-20));
    cr_assert(w[0] + w[1] < 0.7f, "the 1e-20 must show: weights sum to %g", w[0] + w[1]);
}

Test(router_grouped, backward_softmax_finite_differences) {
    check_backward(4, 16, 3, v2_rule(4, 2, 16.0f), 0, 0.0f, 0.3f, 21);  // V2: every logit gets a gradient
    check_backward(4, 16, 3, v2_rule(1, 1, 1.0f), 0, 0.0f, 0.3f, 22);
    moe_route_rule norm = v2_rule(4, 2, 2.0f);
    norm.norm_topk = 1;
    check_backward(4, 16, 3, norm, 0, 0.0f, 0.3f, 23);
    check_backward(4, 16, 3, norm, 1, 0.0f, 0.3f, 24);  // a bias with softmax: the choice only
}

// ---- replay, NaN, the rule's checks --------------------------------------------------------

Test(router_grouped, replay_gives_the_forward_weights) {
    rng_seed(31);
    const int T = 20, E = 16, k = 4;
    float l[20 * 16], s[20 * 16], w[20 * 4], w2[20 * 4], bias[16];
    int32_t ids[20 * 4];
    for (int i = 0; i < T * E; i++) l[i] = rng_uniform(-3, 3);
    for (int e = 0; e < E; e++) bias[e] = rng_uniform(-0.2f, 0.2f);
    const moe_route_rule rules[2] = {v3_rule(4, 2, 2.5f), v2_rule(4, 2, 16.0f)};
    for (int i = 0; i < 2; i++) {
        router_grouped_forward_cpu(ids, w, s, l, i == 0 ? bias : NULL, T, E, k, rules[i]);
        router_grouped_weights_of_choices_cpu(w2, s, ids, T, E, k, rules[i]);
        cr_assert(memcmp(w, w2, sizeof w) == 0, "rule %d: the replay's weights differ from the forward's", i);
    }
}

Test(router_grouped, nan_scores_keep_ids_distinct_and_in_range) {
    const int E = 8, k = 4;
    float l[4 * 8], s[4 * 8], w[4 * 4], bias[8] = {0, 0, 0, INFINITY, 0, 0, -INFINITY, 0};
    int32_t ids[4 * 4];
    for (int e = 0; e < E; e++) {
        l[e] = NAN;                             // row 0: all NaN
        l[E + e] = e % 3 == 0 ? NAN : (float)e;  // row 1: some NaN
        l[2 * E + e] = (float)-e;               // row 2: finite
        l[3 * E + e] = e == 5 ? INFINITY : 0;   // row 3: an infinite logit (softmax: NaN)
    }
    const moe_route_rule rules[3] = {v3_rule(4, 2, 1.0f), v2_rule(4, 2, 1.0f), v3_rule(1, 1, 1.0f)};
    for (int i = 0; i < 3; i++)
        for (int b = 0; b < 2; b++) {
            router_grouped_forward_cpu(ids, w, s, l, b ? bias : NULL, 4, E, k, rules[i]);
            for (int t = 0; t < 4; t++)
                for (int j = 0; j < k; j++) {
                    int32_t e = ids[t * k + j];
                    cr_assert(e >= 0 && e < E, "rule %d bias %d row %d: id %d", i, b, t, e);
                    for (int q = 0; q < j; q++) cr_assert_neq(ids[t * k + q], e, "row %d: id %d twice", t, e);
                }
        }
}

Test(router_grouped, rule_k_beyond_the_kept_experts_is_refused, .exit_code = MT_EXIT_ERROR) {
    float l[8] = {0}, s[8], w[5];
    int32_t ids[5];
    router_grouped_forward_cpu(ids, w, s, l, NULL, 1, 8, 5, v3_rule(4, 2, 1.0f));  // 2 groups of 2 < 5
}

Test(router_grouped, rule_groups_must_divide_the_experts, .exit_code = MT_EXIT_ERROR) {
    float l[9] = {0}, s[9], w[2];
    int32_t ids[2];
    router_grouped_forward_cpu(ids, w, s, l, NULL, 1, 9, 2, v3_rule(2, 1, 1.0f));
}

Test(router_grouped, rule_top2_needs_two_experts_a_group, .exit_code = MT_EXIT_ERROR) {
    float l[4] = {0}, s[4], w[2];
    int32_t ids[2];
    router_grouped_forward_cpu(ids, w, s, l, NULL, 1, 4, 2, v3_rule(4, 2, 1.0f));
}

// ---- aux-loss-free bias update --------------------------------------------------------------

Test(router_grouped, bias_update_signs_and_load_counts) {
    // 3 rows, k 2, the middle one padding; an id out of range is not counted
    const int32_t ids[6] = {0, 1, 2, 3, 0, 9};
    const uint8_t mask[3] = {1, 0, 1};
    double counts[4] = {0};
    router_load_accumulate_cpu(counts, ids, mask, 3, 4, 2);
    cr_assert(counts[0] == 2 && counts[1] == 1 && counts[2] == 0 && counts[3] == 0);
    router_load_accumulate_cpu(counts, ids, NULL, 3, 4, 2);  // adds
    cr_assert(counts[0] == 4 && counts[1] == 2 && counts[2] == 1 && counts[3] == 1);
    // loads 4 2 1 1, mean 2: lowered, unchanged (sign 0), raised, raised
    float bias[4] = {0.5f, 0.5f, 0.5f, -0.25f};
    router_bias_update_cpu(bias, counts, 4, 0.125f);
    cr_assert(bias[0] == 0.375f && bias[1] == 0.5f && bias[2] == 0.625f && bias[3] == -0.125f,
              "bias %g %g %g %g", bias[0], bias[1], bias[2], bias[3]);
    cr_assert_float_eq(router_load_max_over_mean(counts, 4), 2.0, 1e-12);
    const double none[3] = {0, 0, 0};
    cr_assert_eq(router_load_max_over_mean(none, 3), 0.0);
    router_bias_update_cpu(bias, none, 3, 1.0f);  // no load: nothing moves
    cr_assert(bias[0] == 0.375f && bias[1] == 0.5f && bias[2] == 0.625f);
}

// Logits skewed toward the low experts (+1.5 … −1.5 by expert): routing by the bias alone, a
// step at a time, brings the max/mean load from over 2 to near 1, and the weights never see it.
Test(router_grouped, bias_update_balances_a_skewed_load) {
    rng_seed(41);
    enum { T = 512, E = 8, K = 2 };
    float *l = malloc(sizeof(float) * T * E), s[T * E], w[T * K], w_nobias[T * K], bias[E] = {0};
    int32_t ids[T * K];
    for (int t = 0; t < T; t++)
        for (int e = 0; e < E; e++) l[t * E + e] = rng_uniform(-1.0f, 1.0f) + 1.5f - 3.0f * e / (E - 1);
    const moe_route_rule r = v3_rule(1, 1, 1.0f);
    double counts[E], first = 0.0, last = 0.0;
    for (int step = 0; step < 300; step++) {
        router_grouped_forward_cpu(ids, w, s, l, bias, T, E, K, r);
        memset(counts, 0, sizeof counts);
        router_load_accumulate_cpu(counts, ids, NULL, T, E, K);
        last = router_load_max_over_mean(counts, E);
        if (step == 0) first = last;
        router_bias_update_cpu(bias, counts, E, 0.005f);
    }
    cr_assert(first > 2.0, "the skew is too mild to test: max/mean %g", first);
    cr_assert(last < 1.15, "max/mean load %g after 300 updates (from %g)", last, first);
    // the weights are the unbiased scores of the chosen experts
    router_grouped_forward_cpu(ids, w, s, l, bias, T, E, K, r);
    router_grouped_weights_of_choices_cpu(w_nobias, s, ids, T, E, K, r);
    cr_assert(memcmp(w, w_nobias, sizeof w) == 0);
    free(l);
}

// ---- sequence-wise balance loss -------------------------------------------------------------

// B 3 sequences of S 2 rows, E 4, k 2; the scores are given, not computed:
//   sequence 0: s = .4 .3 .2 .1 (sum 1), ids 0 1;  s = .2 .2 .6 1 (sum 2: s' = .1 .1 .3 .5), ids 3 2.
//     Each expert chosen once: f_e = 4/(2·2)·1 = 1; P = (.25 .2 .25 .3): L = 1 (balanced).
//   sequence 1: s = .7 .1 .1 .1, ids 0 1; its second row is padding (NaN scores, ids 0 0).
//     n = 1: f = 4/(2·1)·(1 1 0 0) = (2 2 0 0), P = s: L = 2·.7 + 2·.1 = 1.6.
//   sequence 2: both rows padding: not counted.
// Sum 2.6 over 2 sequences.
Test(router_grouped, seq_aux_hand_computed) {
    const float s[6 * 4] = {.4f, .3f, .2f, .1f, .2f, .2f, .6f, 1.0f, .7f, .1f, .1f, .1f,
                            NAN, NAN, NAN, NAN, .5f, .5f, .5f, .5f, .5f, .5f, .5f, .5f};
    const int32_t ids[6 * 2] = {0, 1, 3, 2, 0, 1, 0, 0, 0, 1, 2, 3};
    const uint8_t mask[6] = {1, 1, 1, 0, 0, 0};
    int64_t seqs = 5;  // adds
    const double sum = router_seq_aux_sum_cpu(&seqs, s, ids, mask, 3, 2, 4, 2);
    cr_assert(fabs(sum - 2.6) < 1e-6, "sum %.9g, want 2.6", sum);
    cr_assert_eq(seqs, 7);
    float dl[6 * 4] = {0};
    router_seq_aux_backward_cpu(dl, 1.0f, s, ids, mask, 3, 2, 4, 2, 1);
    for (int i = 12; i < 24; i++) cr_assert_eq(dl[i], 0.0f, "padding row gradient [%d] = %g", i, dl[i]);
    for (int i = 0; i < 12; i++) cr_assert(isfinite(dl[i]));
}

typedef struct {
    float *l, *s, *w;
    int32_t *ids, *ids0;
    const uint8_t *mask;
    int B, S, E, k;
    moe_route_rule r;
    float alpha;
} seq_ctx;

static double seq_objective(void *vc) {  // α · Σ_b L_b of a fresh forward; the choice must not move
    seq_ctx *c = vc;
    const int T = c->B * c->S;
    router_grouped_forward_cpu(c->ids, c->w, c->s, c->l, NULL, T, c->E, c->k, c->r);
    for (int i = 0; i < T * c->k; i++) cr_assert_eq(c->ids[i], c->ids0[i], "the perturbation changed the choice");
    int64_t n = 0;
    return c->alpha * router_seq_aux_sum_cpu(&n, c->s, c->ids, c->mask, c->B, c->S, c->E, c->k);
}

static void check_seq_aux_backward(moe_route_rule r, uint64_t seed) {
    rng_seed(seed);
    enum { B = 3, S = 4, E = 8, K = 2, T = B * S };
    float l[T * E], s[T * E], w[T * K], dl[T * E];
    int32_t ids[T * K], ids0[T * K];
    const uint8_t mask[T] = {1, 1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0};  // a full, a padded, an empty sequence
    for (int t = 0; t < T; t++) {  // a shuffled ladder: ±h moves no choice
        float *row = l + t * E;
        for (int e = 0; e < E; e++) row[e] = 0.4f * (e - E / 2.0f);
        for (int e = E - 1; e > 0; e--) {
            int j = (int)rng_uniform(0.0f, (float)e + 0.999f);
            float tmp = row[e];
            row[e] = row[j], row[j] = tmp;
        }
        for (int e = 0; e < E; e++) row[e] += rng_uniform(-0.1f, 0.1f);
    }
    router_grouped_forward_cpu(ids0, w, s, l, NULL, T, E, K, r);
    for (int i = 0; i < T * E; i++) dl[i] = 0.25f;
    router_seq_aux_backward_cpu(dl, 0.7f, s, ids0, mask, B, S, E, K, r.sigmoid);
    for (int i = 0; i < T * E; i++) dl[i] -= 0.25f;
    seq_ctx ctx = {l, s, w, ids, ids0, mask, B, S, E, K, r, 0.7f};
    const double gmax = fd_max_abs(dl, T * E);
    fd_report rep = fd_check_f32(seq_objective, &ctx, l, dl, T * E, 1e-2f, 0.02 * gmax);
    cr_assert(gmax > 0.01, "gradients too small to test (%g)", gmax);
    cr_assert(rep.worst < 2e-3, "sigmoid=%d: " FD_FMT, r.sigmoid, FD_ARGS(rep));
    for (int i = 5 * E; i < 6 * E; i++) cr_assert_eq(dl[i], 0.0f, "a padding row has a gradient");
}

Test(router_grouped, seq_aux_backward_finite_differences) {
    check_seq_aux_backward(v3_rule(2, 1, 2.5f), 51);  // sigmoid: the per-row normalisation matters
    check_seq_aux_backward(v2_rule(1, 1, 1.0f), 52);  // softmax
}
