// AdamW, clipping, skips, the grad norm, LR schedules and the optimizer state file.
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "core/backend.h"
#include "core/common.h"
#include "core/safetensors.h"
#include "test_util.h"
#include "optim/optim.h"
#include "optim/schedule.h"

static mt_tensor *tensor_f32(mt_backend *be, mt_mem_cat cat, int ndim, const int64_t *shape,
                             const float *vals) {
    mt_tensor *t = mt_tensor_new(be, cat, MT_F32, ndim, shape);
    cr_assert_not_null(t, "%s", mt_error_get());
    if (vals) mt_tensor_upload(t, vals);
    else memset(t->data, 0, t->nbytes);
    return t;
}

static float *fdata(const mt_tensor *t) { return (float *)t->data; }

// ---------------------------------------------------------------------------------------------
// Hand reference: torch.optim.AdamW's arithmetic in double.
// ---------------------------------------------------------------------------------------------

typedef struct ref_state { double w[3], m[3], v[3]; } ref_state;

static void ref_adamw_step(ref_state *s, const double *g, int t, double lr, double b1, double b2,
                           double eps, double wd) {
    for (int i = 0; i < 3; i++) {
        s->w[i] *= 1.0 - lr * wd;                         // decoupled decay: param.mul_(1 - lr*wd)
        s->m[i] = b1 * s->m[i] + (1.0 - b1) * g[i];        // exp_avg.lerp_(grad, 1 - beta1)
        s->v[i] = b2 * s->v[i] + (1.0 - b2) * g[i] * g[i]; // exp_avg_sq.mul_(b2).addcmul_(g, g, 1-b2)
        double bc1 = 1.0 - pow(b1, t), bc2 = 1.0 - pow(b2, t);
        double step_size = lr / bc1;
        double denom = sqrt(s->v[i]) / sqrt(bc2) + eps;
        s->w[i] -= step_size * s->m[i] / denom;            // param.addcdiv_(exp_avg, denom, -step_size)
    }
}

Test(optim, adamw_matches_hand_reference_for_3_steps) {
    mt_backend *be = mt_backend_cpu_new();
    const float w0[3] = {0.5f, -1.0f, 2.0f};
    const float grads[3][3] = {{0.1f, -0.2f, 0.3f}, {-0.05f, 0.4f, 0.25f}, {0.3f, 0.0f, -0.6f}};
    const double lrs[3] = {0.01, 0.02, 0.005};
    int64_t shape[1] = {3};
    // Two params with the same data: one with weight decay, one without.
    mt_param p[2];
    for (int k = 0; k < 2; k++) {
        p[k].name = k ? "nodecay" : "decay";
        p[k].w = tensor_f32(be, MT_MEM_TRAIN, 1, shape, w0);
        p[k].g = tensor_f32(be, MT_MEM_GRAD, 1, shape, NULL);
        p[k].decay = !k;
    }
    mt_adamw_opts opts = mt_adamw_opts_default();
    opts.weight_decay = 0.1;
    mt_adamw o;
    cr_assert_eq(mt_adamw_init(&o, be, p, 2, &opts), 0, "%s", mt_error_get());
    ref_state ref[2];
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 3; i++) ref[k].w[i] = w0[i], ref[k].m[i] = ref[k].v[i] = 0;
    for (int t = 1; t <= 3; t++) {
        for (int k = 0; k < 2; k++) mt_tensor_upload(p[k].g, grads[t - 1]);
        double gn;
        cr_assert_eq(mt_adamw_step(&o, p, 2, lrs[t - 1], 0.0, &gn), 0, "%s", mt_error_get());
        double g[3], ss = 0;
        for (int i = 0; i < 3; i++) g[i] = grads[t - 1][i], ss += 2 * g[i] * g[i];
        cr_assert_float_eq(gn, sqrt(ss), 1e-12);
        for (int k = 0; k < 2; k++) {
            ref_adamw_step(&ref[k], g, t, lrs[t - 1], 0.9, 0.999, 1e-8, k ? 0.0 : 0.1);
            for (int i = 0; i < 3; i++) {
                cr_assert_float_eq(fdata(p[k].w)[i], ref[k].w[i], 2e-6, "step %d %s w[%d]: %.9g vs %.9g",
                                   t, p[k].name, i, fdata(p[k].w)[i], ref[k].w[i]);
                cr_assert_float_eq(fdata(o.m[k])[i], ref[k].m[i], 1e-7);
                cr_assert_float_eq(fdata(o.v[k])[i], ref[k].v[i], 1e-9);
            }
        }
        cr_assert_eq(o.step, t);
    }
    // Decay made a measurable difference (guards the test itself).
    cr_assert(fabs(fdata(p[0].w)[2] - fdata(p[1].w)[2]) > 1e-5);
    mt_adamw_free(&o);
    for (int k = 0; k < 2; k++) mt_tensor_free(p[k].w), mt_tensor_free(p[k].g);
    mt_backend_free(be);
}

// Worked by hand: with bias correction, step 1 moves each weight by lr·sign(g)
// (m̂ = g, √v̂ = |g|), after the decay factor 1 − lr·wd.
Test(optim, first_step_moves_by_lr_times_sign) {
    mt_backend *be = mt_backend_cpu_new();
    int64_t shape[1] = {3};
    const float w0[3] = {1.0f, 1.0f, 1.0f}, g[3] = {0.001f, -5.0f, 0.0f};
    mt_param p = {"w", tensor_f32(be, MT_MEM_TRAIN, 1, shape, w0),
                  tensor_f32(be, MT_MEM_GRAD, 1, shape, g), 1};
    mt_adamw_opts opts = mt_adamw_opts_default();
    opts.weight_decay = 0.5;
    mt_adamw o;
    cr_assert_eq(mt_adamw_init(&o, be, &p, 1, &opts), 0);
    cr_assert_eq(mt_adamw_step(&o, &p, 1, 0.1, 0.0, NULL), 0);
    // w = 1·(1 − 0.1·0.5) = 0.95, then ∓ 0.1 (ε shrinks the first by |g|/(|g|+ε) ≈ 1 − 1e-5).
    cr_assert_float_eq(fdata(p.w)[0], 0.95 - 0.1 * (0.001 / (0.001 + 1e-8)), 1e-6);
    cr_assert_float_eq(fdata(p.w)[1], 1.05, 1e-6);
    cr_assert_float_eq(fdata(p.w)[2], 0.95, 1e-7, "zero grad: only the decay");
    mt_adamw_free(&o);
    mt_tensor_free(p.w), mt_tensor_free(p.g);
    mt_backend_free(be);
}

// ---------------------------------------------------------------------------------------------
// Clipping and skips
// ---------------------------------------------------------------------------------------------

// Params x [3] (decay) and y [2, 2] (no decay), built from w0 with grads g.
static void clip_make(mt_backend *be, mt_param *p, const float *gx, const float *gy) {
    static const int64_t s1[1] = {3}, s2[2] = {2, 2};
    static const float wx[3] = {0.1f, 0.2f, 0.3f}, wy[4] = {1, 2, 3, 4};
    p[0] = (mt_param){"x", tensor_f32(be, MT_MEM_TRAIN, 1, s1, wx), tensor_f32(be, MT_MEM_GRAD, 1, s1, gx), 1};
    p[1] = (mt_param){"y", tensor_f32(be, MT_MEM_TRAIN, 2, s2, wy), tensor_f32(be, MT_MEM_GRAD, 2, s2, gy), 0};
}

Test(optim, clipping_scales_grads_exactly) {
    mt_backend *be = mt_backend_cpu_new();
    const float gx[3] = {3.0f, 0.0f, -4.0f}, gy[4] = {1.0f, 2.0f, -2.0f, 4.0f};  // ‖g‖ = √50
    const double norm = sqrt(50.0), clip = 1.5;
    const float sc = (float)(clip / norm);
    float sx[3], sy[4];
    for (int i = 0; i < 3; i++) sx[i] = gx[i] * sc;
    for (int i = 0; i < 4; i++) sy[i] = gy[i] * sc;
    // A: clipped by the optimizer. B: grads scaled beforehand, no clipping.
    // C: clip above the norm. D: no clipping.
    mt_param a[2], b[2], c[2], d[2];
    clip_make(be, a, gx, gy), clip_make(be, b, sx, sy), clip_make(be, c, gx, gy), clip_make(be, d, gx, gy);
    mt_adamw_opts opts = mt_adamw_opts_default();
    opts.weight_decay = 0.01;
    mt_adamw oa, ob, oc, od;
    cr_assert_eq(mt_adamw_init(&oa, be, a, 2, &opts), 0);
    cr_assert_eq(mt_adamw_init(&ob, be, b, 2, &opts), 0);
    cr_assert_eq(mt_adamw_init(&oc, be, c, 2, &opts), 0);
    cr_assert_eq(mt_adamw_init(&od, be, d, 2, &opts), 0);
    for (int step = 0; step < 3; step++) {
        double na, nb;
        cr_assert_eq(mt_adamw_step(&oa, a, 2, 1e-2, clip, &na), 0);
        cr_assert_eq(mt_adamw_step(&ob, b, 2, 1e-2, 0.0, &nb), 0);
        cr_assert_eq(mt_adamw_step(&oc, c, 2, 1e-2, 100.0, NULL), 0);
        cr_assert_eq(mt_adamw_step(&od, d, 2, 1e-2, 0.0, NULL), 0);
        cr_assert_float_eq(na, norm, 1e-12, "the norm before clipping is reported");
        cr_assert_float_eq(nb, clip, 1e-6, "the scaled grads have norm clip");
    }
    for (int k = 0; k < 2; k++) {
        size_t nbytes = a[k].w->nbytes;
        cr_assert_eq(memcmp(a[k].w->data, b[k].w->data, nbytes), 0, "clip = scaling by clip/norm");
        cr_assert_eq(memcmp(oa.m[k]->data, ob.m[k]->data, nbytes), 0);
        cr_assert_eq(memcmp(oa.v[k]->data, ob.v[k]->data, nbytes), 0);
        cr_assert_eq(memcmp(c[k].w->data, d[k].w->data, nbytes), 0, "clip above the norm: no-op");
        cr_assert_eq(memcmp(a[k].g->data, k ? (const void *)gy : (const void *)gx, nbytes), 0,
                     "grads are left untouched");
        cr_assert_neq(memcmp(oa.v[k]->data, od.v[k]->data, nbytes), 0, "clipping did something");
    }
    // v after three steps of the same scaled grad: (1 − β2³)·(g·s)².
    double g0 = (double)sx[0];
    cr_assert_float_eq(fdata(oa.v[0])[0], (1 - pow(0.999, 3)) * g0 * g0, 1e-8);
    mt_adamw_free(&oa), mt_adamw_free(&ob), mt_adamw_free(&oc), mt_adamw_free(&od);
    mt_param *all[4] = {a, b, c, d};
    for (int j = 0; j < 4; j++)
        for (int k = 0; k < 2; k++) mt_tensor_free(all[j][k].w), mt_tensor_free(all[j][k].g);
    mt_backend_free(be);
}

Test(optim, non_finite_grad_skips_the_step_untouched) {
    mt_backend *be = mt_backend_cpu_new();
    int64_t s[1] = {3};
    const float w[3] = {1, 2, 3}, g[3] = {0.1f, 0.2f, 0.3f};
    mt_param p[2] = {{"a", tensor_f32(be, MT_MEM_TRAIN, 1, s, w), tensor_f32(be, MT_MEM_GRAD, 1, s, g), 1},
                     {"b", tensor_f32(be, MT_MEM_TRAIN, 1, s, w), tensor_f32(be, MT_MEM_GRAD, 1, s, g), 0}};
    mt_adamw o;
    mt_adamw_opts opts = mt_adamw_opts_default();
    opts.weight_decay = 0.1;
    cr_assert_eq(mt_adamw_init(&o, be, p, 2, &opts), 0);
    cr_assert_eq(mt_adamw_step(&o, p, 2, 1e-2, 1.0, NULL), 0);  // m, v now non-zero
    float snap_w[2][3], snap_m[2][3], snap_v[2][3];
    for (int k = 0; k < 2; k++) {
        memcpy(snap_w[k], p[k].w->data, sizeof snap_w[k]);
        memcpy(snap_m[k], o.m[k]->data, sizeof snap_m[k]);
        memcpy(snap_v[k], o.v[k]->data, sizeof snap_v[k]);
    }
    const float bad[2] = {NAN, INFINITY};
    for (int j = 0; j < 2; j++) {
        fdata(p[1].g)[2] = bad[j];  // one element of one param's grad
        double gn = 0;
        cr_assert_eq(mt_adamw_step(&o, p, 2, 1e-2, 1.0, &gn), 1, "a %s grad must skip", j ? "inf" : "NaN");
        cr_assert(!isfinite(gn), "the non-finite norm is reported");
        cr_assert_eq(o.step, 1, "a skipped step is not counted");
        for (int k = 0; k < 2; k++) {
            cr_assert_eq(memcmp(snap_w[k], p[k].w->data, sizeof snap_w[k]), 0);
            cr_assert_eq(memcmp(snap_m[k], o.m[k]->data, sizeof snap_m[k]), 0);
            cr_assert_eq(memcmp(snap_v[k], o.v[k]->data, sizeof snap_v[k]), 0);
        }
    }
    fdata(p[1].g)[2] = 0.3f;  // recovers
    cr_assert_eq(mt_adamw_step(&o, p, 2, 1e-2, 1.0, NULL), 0);
    cr_assert_eq(o.step, 2);
    cr_assert_eq(mt_adamw_step(&o, p, 2, NAN, 1.0, NULL), -1, "a NaN lr is an error, not a skip");
    cr_assert(strstr(mt_error_get(), "learning rate"), "got: %s", mt_error_get());
    cr_assert_eq(o.step, 2);
    mt_adamw_free(&o);
    for (int k = 0; k < 2; k++) mt_tensor_free(p[k].w), mt_tensor_free(p[k].g);
    mt_backend_free(be);
}

// ---------------------------------------------------------------------------------------------
// Grad norm
// ---------------------------------------------------------------------------------------------

Test(optim, grad_norm_is_exact_and_independent_of_threads) {
    mt_backend *be = mt_backend_cpu_new();
    int64_t s0[1] = {2}, s1[2] = {1000, 1237}, s2[1] = {70001};
    const float g0[2] = {3.0f, 4.0f};
    mt_param p[3] = {{"a", NULL, tensor_f32(be, MT_MEM_GRAD, 1, s0, g0), 1},
                     {"b", NULL, tensor_f32(be, MT_MEM_GRAD, 2, s1, NULL), 1},
                     {"c", NULL, tensor_f32(be, MT_MEM_GRAD, 1, s2, NULL), 1}};
    cr_assert_float_eq(mt_grad_norm(p, 1), 5.0, 0.0);
    uint64_t x = 0x9e3779b97f4a7c15ull;  // xorshift: values of mixed magnitude and sign
    for (int k = 1; k < 3; k++)
        for (int64_t i = 0; i < mt_tensor_numel(p[k].g); i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            fdata(p[k].g)[i] = (float)((double)(x >> 11) / 9007199254740992.0 - 0.5) *
                               (float)(1 << (x % 20));
        }
    double naive = 0;
    for (int k = 0; k < 3; k++)
        for (int64_t i = 0; i < mt_tensor_numel(p[k].g); i++)
            naive += (double)fdata(p[k].g)[i] * fdata(p[k].g)[i];
    int saved = omp_get_max_threads();
    double r[4];
    const int threads[4] = {1, 2, 3, 7};
    for (int j = 0; j < 4; j++) {
        omp_set_num_threads(threads[j]);
        r[j] = mt_grad_norm(p, 3);
    }
    omp_set_num_threads(saved);
    for (int j = 1; j < 4; j++)
        cr_assert_eq(memcmp(&r[0], &r[j], sizeof r[0]), 0, "threads %d: %.17g vs %.17g",
                     threads[j], r[j], r[0]);
    cr_assert_float_eq(r[0], sqrt(naive), 1e-12 * sqrt(naive));
    for (int k = 0; k < 3; k++) mt_tensor_free(p[k].g);
    mt_backend_free(be);
}

// ---------------------------------------------------------------------------------------------
// Schedules: transformers' lr_lambda functions, transcribed, times the peak.
// ---------------------------------------------------------------------------------------------

static double hf_max1(int64_t n) { return (double)(n > 1 ? n : 1); }
static double hf_cosine(int64_t step, int64_t warmup, int64_t total) {
    if (step < warmup) return (double)step / hf_max1(warmup);
    double progress = (double)(step - warmup) / hf_max1(total - warmup);
    return fmax(0.0, 0.5 * (1.0 + cos(M_PI * 0.5 * 2.0 * progress)));
}
static double hf_linear(int64_t step, int64_t warmup, int64_t total) {
    if (step < warmup) return (double)step / hf_max1(warmup);
    return fmax(0.0, (double)(total - step) / hf_max1(total - warmup));
}
static double hf_constant(int64_t step, int64_t warmup) {
    if (step < warmup) return (double)step / fmax(1.0, (double)warmup);
    return 1.0;
}

Test(optim, schedules_match_transformers_at_key_points) {
    const double peak = 3e-4;
    const int64_t W = 10, T = 110;  // mid-decay at step 60
    // Hand values: warmup starts at 0 (first update has lr 0), reaches peak at step W.
    struct { int64_t step; double cos, lin, con; } key[] = {
        {0, 0.0, 0.0, 0.0},
        {5, 0.5, 0.5, 0.5},
        {9, 0.9, 0.9, 0.9},
        {10, 1.0, 1.0, 1.0},   // end of warmup
        {60, 0.5, 0.5, 1.0},   // middle of the decay
        {85, 0.5 * (1 + cos(M_PI * 0.75)), 0.25, 1.0},
        {109, 0.5 * (1 + cos(M_PI * 0.99)), 0.01, 1.0},  // last update of the run
        {110, 0.0, 0.0, 1.0},  // end
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(key); i++) {
        int64_t s = key[i].step;
        double c = mt_lr_at(s, T, W, peak, MT_SCHED_COSINE);
        double l = mt_lr_at(s, T, W, peak, MT_SCHED_LINEAR);
        double k = mt_lr_at(s, T, W, peak, MT_SCHED_CONSTANT);
        cr_assert_float_eq(c, peak * key[i].cos, 1e-18, "cosine step %lld: %.17g", (long long)s, c);
        cr_assert_float_eq(l, peak * key[i].lin, 1e-18, "linear step %lld: %.17g", (long long)s, l);
        cr_assert_float_eq(k, peak * key[i].con, 1e-18, "constant step %lld", (long long)s);
    }
    // Every step, several shapes: equal to the transcription to the last bit.
    const int64_t shapes[][2] = {{10, 110}, {0, 50}, {1, 7}, {100, 100}, {5, 3}};
    for (size_t j = 0; j < MT_ARRAY_LEN(shapes); j++) {
        int64_t w = shapes[j][0], t = shapes[j][1];
        for (int64_t s = 0; s <= t + 2; s++) {
            cr_assert_eq(mt_lr_at(s, t, w, peak, MT_SCHED_COSINE), peak * hf_cosine(s, w, t));
            cr_assert_eq(mt_lr_at(s, t, w, peak, MT_SCHED_LINEAR), peak * hf_linear(s, w, t));
            cr_assert_eq(mt_lr_at(s, t, w, peak, MT_SCHED_CONSTANT), peak * hf_constant(s, w));
        }
    }
    cr_assert_eq(mt_lr_at(0, 100, 0, peak, MT_SCHED_COSINE), peak, "no warmup: peak at once");
    mt_schedule sc;
    cr_assert_eq(mt_schedule_parse("linear", &sc), 0);
    cr_assert_eq(sc, MT_SCHED_LINEAR);
    cr_assert_str_eq(mt_schedule_name(MT_SCHED_CONSTANT), "constant");
    cr_assert_neq(mt_schedule_parse("step", &sc), 0);
    cr_assert(strstr(mt_error_get(), "cosine, linear or constant"), "got: %s", mt_error_get());
}

// ---------------------------------------------------------------------------------------------
// State file and resume
// ---------------------------------------------------------------------------------------------

// Three params: f32 [4,5] (decay), f32 [7] (no decay), bf16 [3,3] (decay, fp32 master).
#define NP 3
static const int64_t rs_shape[NP][2] = {{4, 5}, {7, 0}, {3, 3}};
static const int rs_ndim[NP] = {2, 1, 2};
static const char *const rs_name[NP] = {"model.layers.0.mlp.w", "model.norm.weight", "lm_head.weight"};

static void rs_make(mt_backend *be, mt_param *p) {
    for (int k = 0; k < NP; k++) {
        mt_dtype dt = k == 2 ? MT_BF16 : MT_F32;
        p[k].name = rs_name[k];
        p[k].w = mt_tensor_new(be, MT_MEM_TRAIN, dt, rs_ndim[k], rs_shape[k]);
        p[k].g = mt_tensor_new(be, MT_MEM_GRAD, dt, rs_ndim[k], rs_shape[k]);
        p[k].decay = mt_param_decays(p[k].w);
        int64_t n = mt_tensor_numel(p[k].w);
        for (int64_t i = 0; i < n; i++) {
            float v = 0.1f * (float)(i + 1) * (k % 2 ? -1.0f : 1.0f);
            if (dt == MT_F32) fdata(p[k].w)[i] = v;
            else ((uint16_t *)p[k].w->data)[i] = mt_f32_to_bf16(v);
        }
    }
}

static void rs_grads(mt_param *p, int step) {
    for (int k = 0; k < NP; k++) {
        int64_t n = mt_tensor_numel(p[k].g);
        for (int64_t i = 0; i < n; i++) {
            float v = (float)sin(0.37 * (double)(i + 1) * (step + 1) + k) * (step == 4 ? 9.0f : 0.5f);
            if (p[k].g->dtype == MT_F32) fdata(p[k].g)[i] = v;
            else ((uint16_t *)p[k].g->data)[i] = mt_f32_to_bf16(v);
        }
    }
}

static void rs_free(mt_param *p) {
    for (int k = 0; k < NP; k++) mt_tensor_free(p[k].w), mt_tensor_free(p[k].g);
}

static void rs_run(mt_adamw *o, mt_param *p, int from, int to) {
    for (int s = from; s < to; s++) {
        rs_grads(p, s);
        double lr = mt_lr_at(s, 6, 2, 1e-2, MT_SCHED_COSINE);
        cr_assert_eq(mt_adamw_step(o, p, NP, lr, 1.0, NULL), 0, "%s", mt_error_get());
    }
}

static int rs_state_equal(const mt_adamw *a, const mt_param *pa, const mt_adamw *b, const mt_param *pb) {
    if (a->step != b->step) return 0;
    for (int k = 0; k < NP; k++) {
        if (memcmp(pa[k].w->data, pb[k].w->data, pa[k].w->nbytes)) return 0;
        if (memcmp(a->m[k]->data, b->m[k]->data, a->m[k]->nbytes)) return 0;
        if (memcmp(a->v[k]->data, b->v[k]->data, a->v[k]->nbytes)) return 0;
        if (!a->master[k] != !b->master[k]) return 0;
        if (a->master[k] && memcmp(a->master[k]->data, b->master[k]->data, a->master[k]->nbytes))
            return 0;
    }
    return 1;
}

Test(optim, save_load_continue_is_bit_exact) {
    char dir[256], path[400];
    mt_test_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    mt_backend *be = mt_backend_cpu_new();
    mt_adamw_opts opts = mt_adamw_opts_default();
    opts.weight_decay = 0.05;

    // Uninterrupted: 6 steps.
    mt_param pa[NP];
    mt_adamw oa;
    rs_make(be, pa);
    cr_assert_eq(mt_adamw_init(&oa, be, pa, NP, &opts), 0, "%s", mt_error_get());
    cr_assert_not_null(oa.master[2], "bf16 weights get a master copy");
    cr_assert_null(oa.master[0]);
    rs_run(&oa, pa, 0, 6);

    // Interrupted: 3 steps, save, and a fresh process image: new tensors holding only the
    // saved trainables (bf16 bytes for the bf16 one), a new optimizer, load, 3 more steps.
    mt_param pb[NP];
    mt_adamw ob;
    rs_make(be, pb);
    cr_assert_eq(mt_adamw_init(&ob, be, pb, NP, &opts), 0);
    rs_run(&ob, pb, 0, 3);
    cr_assert_eq(mt_adamw_save(&ob, pb, NP, path), 0, "%s", mt_error_get());
    mt_param pc[NP];
    rs_make(be, pc);
    for (int k = 0; k < NP; k++) memcpy(pc[k].w->data, pb[k].w->data, pb[k].w->nbytes);
    mt_adamw_free(&ob);
    rs_free(pb);
    mt_adamw oc;
    cr_assert_eq(mt_adamw_init(&oc, be, pc, NP, &opts), 0);
    cr_assert_eq(mt_adamw_load(&oc, pc, NP, path), 0, "%s", mt_error_get());
    cr_assert_eq(oc.step, 3);
    rs_run(&oc, pc, 3, 6);
    cr_assert(rs_state_equal(&oa, pa, &oc, pc), "resumed run differs from the uninterrupted one");

    // The check can fail: resuming without the optimizer state differs.
    mt_param pd[NP];
    rs_make(be, pd);
    mt_adamw od;
    cr_assert_eq(mt_adamw_init(&od, be, pd, NP, &opts), 0);
    rs_run(&od, pd, 0, 3);
    mt_adamw od2;
    cr_assert_eq(mt_adamw_init(&od2, be, pd, NP, &opts), 0);  // state lost
    od2.step = 3;
    rs_run(&od2, pd, 3, 6);
    cr_assert(!rs_state_equal(&oa, pa, &od2, pd));

    // The file's names and metadata.
    mt_st_file f;
    cr_assert_eq(mt_st_file_open(&f, path), 0, "%s", mt_error_get());
    cr_assert_eq(f.n_tensors, 7);
    cr_assert_not_null(mt_st_file_find(&f, "model.norm.weight.exp_avg"));
    cr_assert_not_null(mt_st_file_find(&f, "model.norm.weight.exp_avg_sq"));
    cr_assert_not_null(mt_st_file_find(&f, "lm_head.weight.master"));
    cr_assert_null(mt_st_file_find(&f, "model.norm.weight.master"), "f32 weights have no master");
    cr_assert(strstr(f.metadata_json, "\"step\":\"3\""), "%s", f.metadata_json);
    mt_st_file_close(&f);

    mt_adamw_free(&oa), mt_adamw_free(&oc), mt_adamw_free(&od), mt_adamw_free(&od2);
    rs_free(pa), rs_free(pc), rs_free(pd);
    mt_backend_free(be);
    mt_test_rmrf(dir);
}

Test(optim, load_errors_name_the_tensor) {
    char dir[256], path[400], other[400];
    mt_test_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/opt.safetensors", dir);
    snprintf(other, sizeof other, "%s/model.safetensors", dir);
    mt_backend *be = mt_backend_cpu_new();
    int64_t sa[1] = {3}, sb[2] = {2, 2}, sb_bad[2] = {2, 3};
    mt_param two[2] = {{"a", tensor_f32(be, MT_MEM_TRAIN, 1, sa, NULL), tensor_f32(be, MT_MEM_GRAD, 1, sa, NULL), 0},
                       {"b", tensor_f32(be, MT_MEM_TRAIN, 2, sb, NULL), tensor_f32(be, MT_MEM_GRAD, 2, sb, NULL), 1}};
    mt_param bad[2] = {two[0],
                       {"b", tensor_f32(be, MT_MEM_TRAIN, 2, sb_bad, NULL), tensor_f32(be, MT_MEM_GRAD, 2, sb_bad, NULL), 1}};
    mt_adamw o2, o1, obad;
    cr_assert_eq(mt_adamw_init(&o2, be, two, 2, NULL), 0);
    cr_assert_eq(mt_adamw_init(&o1, be, two, 1, NULL), 0);
    cr_assert_eq(mt_adamw_init(&obad, be, bad, 2, NULL), 0);
    o1.step = 17;
    cr_assert_eq(mt_adamw_save(&o2, two, 2, path), 0, "%s", mt_error_get());

    // Mis-shaped.
    cr_assert_neq(mt_adamw_load(&obad, bad, 2, path), 0);
    cr_assert(strstr(mt_error_get(), "'b.exp_avg'") && strstr(mt_error_get(), "[2, 2]") &&
                  strstr(mt_error_get(), "[2, 3]"), "got: %s", mt_error_get());
    // A tensor the run does not have.
    cr_assert_neq(mt_adamw_load(&o1, two, 1, path), 0);
    cr_assert(strstr(mt_error_get(), "'b.exp_avg") && strstr(mt_error_get(), "no trainable"),
              "got: %s", mt_error_get());
    cr_assert_eq(o1.step, 17, "a failed load changes nothing");
    // Missing: a file with only 'a', loaded into a run with 'a' and 'b'.
    cr_assert_eq(mt_adamw_save(&o1, two, 1, path), 0, "%s", mt_error_get());
    cr_assert_neq(mt_adamw_load(&o2, two, 2, path), 0);
    cr_assert(strstr(mt_error_get(), "'b.exp_avg' is missing"), "got: %s", mt_error_get());
    cr_assert(strstr(mt_error_get(), path), "the error names the file: %s", mt_error_get());
    // Not an optimizer file.
    float z[3] = {0};
    mt_st_entry e = {.name = "a.exp_avg", .dtype = "F32", .ndim = 1, .shape = {3}, .data = z};
    cr_assert_eq(mt_st_write(other, &e, 1, NULL, NULL, NULL), 0);
    cr_assert_neq(mt_adamw_load(&o1, two, 1, other), 0);
    cr_assert(strstr(mt_error_get(), "not an optimizer state"), "got: %s", mt_error_get());
    // Params that do not match the optimizer's.
    cr_assert_eq(mt_adamw_step(&o2, bad, 2, 1e-3, 0, NULL), -1);
    cr_assert(strstr(mt_error_get(), "'b'"), "got: %s", mt_error_get());

    mt_adamw_free(&o2), mt_adamw_free(&o1), mt_adamw_free(&obad);
    for (int k = 0; k < 2; k++) mt_tensor_free(two[k].w), mt_tensor_free(two[k].g);
    mt_tensor_free(bad[1].w), mt_tensor_free(bad[1].g);
    mt_backend_free(be);
    mt_test_rmrf(dir);
}

Test(optim, init_rejects_bad_params_naming_them) {
    mt_backend *be = mt_backend_cpu_new();
    int64_t s3[1] = {3}, s4[1] = {4};
    mt_param p = {"x.weight", tensor_f32(be, MT_MEM_TRAIN, 1, s3, NULL), tensor_f32(be, MT_MEM_GRAD, 1, s4, NULL), 1};
    mt_adamw o;
    cr_assert_neq(mt_adamw_init(&o, be, &p, 1, NULL), 0);
    cr_assert(strstr(mt_error_get(), "'x.weight'") && strstr(mt_error_get(), "shape"), "got: %s",
              mt_error_get());
    cr_assert_eq(be->ledger.cur[MT_MEM_OPTIM], 0);
    mt_tensor *h = mt_tensor_new(be, MT_MEM_GRAD, MT_F16, 1, s3);
    mt_tensor *hw = mt_tensor_new(be, MT_MEM_TRAIN, MT_F16, 1, s3);
    mt_param q = {"h", hw, h, 1};
    cr_assert_neq(mt_adamw_init(&o, be, &q, 1, NULL), 0);
    cr_assert(strstr(mt_error_get(), "'h'") && strstr(mt_error_get(), "f16"), "got: %s", mt_error_get());
    mt_adamw_opts bad = mt_adamw_opts_default();
    bad.beta2 = 1.0;
    mt_param ok = {"ok", p.w, tensor_f32(be, MT_MEM_GRAD, 1, s3, NULL), 1};
    cr_assert_neq(mt_adamw_init(&o, be, &ok, 1, &bad), 0);
    cr_assert(strstr(mt_error_get(), "betas"), "got: %s", mt_error_get());
    // A ledger refusal half way: nothing stays allocated.
    be->ledger.limit = be->ledger.total_cur + 12 + 12 + 8;
    mt_param two[2] = {ok, ok};
    two[1].name = "second";
    cr_assert_neq(mt_adamw_init(&o, be, two, 2, NULL), 0);
    cr_assert(strstr(mt_error_get(), "'second'"), "got: %s", mt_error_get());
    cr_assert_eq(be->ledger.cur[MT_MEM_OPTIM], 0);
    mt_tensor_free(p.w), mt_tensor_free(p.g), mt_tensor_free(ok.g), mt_tensor_free(h), mt_tensor_free(hw);
    mt_backend_free(be);
}

// Updates smaller than half a bf16 ulp (2^-8 at 1.0) vanish when applied to bf16 weights
// directly; the fp32 master keeps them.
Test(optim, bf16_weights_accumulate_in_the_master) {
    mt_backend *be = mt_backend_cpu_new();
    int64_t s[1] = {2};
    mt_param p = {"w", mt_tensor_new(be, MT_MEM_TRAIN, MT_BF16, 1, s),
                  mt_tensor_new(be, MT_MEM_GRAD, MT_BF16, 1, s), 0};
    uint16_t *w = p.w->data, *g = p.g->data;
    w[0] = w[1] = mt_f32_to_bf16(1.0f);
    g[0] = mt_f32_to_bf16(0.5f), g[1] = mt_f32_to_bf16(-0.5f);
    mt_adamw o;
    cr_assert_eq(mt_adamw_init(&o, be, &p, 1, NULL), 0);
    for (int t = 0; t < 10; t++) cr_assert_eq(mt_adamw_step(&o, &p, 1, 1e-3, 0.0, NULL), 0);
    // A constant gradient moves the weight by lr every step: 10 · 1e-3.
    cr_assert_float_eq(fdata(o.master[0])[0], 0.99, 1e-5);
    cr_assert_float_eq(fdata(o.master[0])[1], 1.01, 1e-5);
    cr_assert_eq(w[0], mt_f32_to_bf16(0.99f), "got %g", mt_bf16_to_f32(w[0]));
    cr_assert_eq(w[1], mt_f32_to_bf16(1.01f), "got %g", mt_bf16_to_f32(w[1]));
    cr_assert_neq(w[0], mt_f32_to_bf16(1.0f));
    mt_adamw_free(&o);
    mt_tensor_free(p.w), mt_tensor_free(p.g);
    mt_backend_free(be);
}

Test(optim, ledger_counts_state_and_free_returns_it) {
    mt_backend *be = mt_backend_cpu_new();
    mt_param p[NP];
    rs_make(be, p);
    mt_adamw o;
    cr_assert_eq(mt_adamw_init(&o, be, p, NP, NULL), 0);
    uint64_t elems = 20 + 7 + 9;
    cr_assert_eq(be->ledger.cur[MT_MEM_OPTIM], 2 * 4 * elems, "m and v in fp32 under optim");
    cr_assert_eq(be->ledger.cur[MT_MEM_MASTER], 4 * 9, "fp32 master of the bf16 param only");
    // The master starts as the bf16 weight, exactly.
    for (int i = 0; i < 9; i++)
        cr_assert_eq(fdata(o.master[2])[i], mt_bf16_to_f32(((uint16_t *)p[2].w->data)[i]));
    rs_run(&o, p, 0, 2);
    // bf16 weights follow the master.
    for (int i = 0; i < 9; i++)
        cr_assert_eq(((uint16_t *)p[2].w->data)[i], mt_f32_to_bf16(fdata(o.master[2])[i]));
    mt_adamw_free(&o);
    cr_assert_eq(be->ledger.cur[MT_MEM_OPTIM], 0);
    cr_assert_eq(be->ledger.cur[MT_MEM_MASTER], 0);
    mt_adamw_free(&o);  // twice is harmless
    rs_free(p);
    cr_assert_eq(be->ledger.total_cur, 0);
    mt_backend_free(be);

    // The null backend counts the same bytes and computes nothing.
    mt_backend *nb = mt_backend_null_new();
    int64_t big[2] = {14336, 4096};
    mt_param q = {"w1", mt_tensor_new(nb, MT_MEM_TRAIN, MT_BF16, 2, big),
                  mt_tensor_new(nb, MT_MEM_GRAD, MT_BF16, 2, big), 1};
    cr_assert_eq(mt_adamw_init(&o, nb, &q, 1, NULL), 0, "%s", mt_error_get());
    cr_assert_eq(nb->ledger.cur[MT_MEM_OPTIM], 8ull * 14336 * 4096);
    cr_assert_eq(nb->ledger.cur[MT_MEM_MASTER], 4ull * 14336 * 4096);
    cr_assert_eq(mt_adamw_step(&o, &q, 1, 1e-3, 1.0, NULL), 0);
    mt_adamw_free(&o);
    mt_tensor_free(q.w), mt_tensor_free(q.g);
    cr_assert_eq(nb->ledger.total_cur, 0);
    mt_backend_free(nb);
}
