// model/ops.h CPU reference kernels: forwards against naive double-precision references written
// here, every backward against central finite differences (tests/fd.h), edge cases of masking.
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "core/common.h"
#include "core/gemm.h"
#include "core/rng.h"
#include "model/ops.h"
#include "model/rope.h"
#include "tests/fd.h"

// fp32 forwards: with h = 1e-2 the worst normalised error of a right gradient is < 1e-3 here
// (rounding noise ~1e-4/h·1e-3, truncation ~h²), about 5e-3 with h = 1e-3; a wrong formula gives
// O(1). FD_FLOOR is relative to the largest |gradient|. MT_FD_VERBOSE=1 prints every report.
#define FD_H 1e-2f
#define FD_TOL 1e-2
#define FD_FLOOR 3e-2

// Attention's usual scale 1/sqrt(hd), as the model passes it (mt_config_attn_scale); MLA's scale for
// a q/k head of hd dims, hd^-0.5 · mscale² (mscale = 0.1 · ln(factor 40) + 1, DeepSeek V3's); and
// a scale unlike either for hd 20 | hd_v 10 (1/sqrt(20) ≈ 0.224, 1/sqrt(10) ≈ 0.316).
#define SC(hd) (1.0f / sqrtf((float)(hd)))
#define MLA_SCALE 0.37f
static float mla_scale(int hd) {
    float m = 0.1f * logf(40.0f) + 1.0f;
    return SC(hd) * m * m;
}

static float *randn(int64_t n, uint64_t seed, float scale) {
    mt_rng r;
    mt_rng_seed(&r, seed, 0);
    float *x = mt_xmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = scale * mt_rng_normal(&r);
    return x;
}

static float *zeros(int64_t n) { return mt_xcalloc((size_t)n, sizeof(float)); }

static double dot_fd(const float *a, const float *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

// Checks one gradient by FD and asserts; `what` names it in the failure message.
static void check_grad(fd_fn f, void *ctx, float *x, const float *g, int64_t n, const char *what) {
    fd_report r = fd_check_f32(f, ctx, x, g, n, FD_H, FD_FLOOR * fd_max_abs(g, n));
    if (getenv("MT_FD_VERBOSE")) fprintf(stderr, "%s: " FD_FMT "\n", what, FD_ARGS(r));
    cr_assert(r.checked == n && r.worst < FD_TOL, "%s: " FD_FMT, what, FD_ARGS(r));
}

// ---------------------------------------------------------------------------------------------
// embedding

typedef struct { int T, H, V; const int32_t *tok; float *wte, *out; const float *g; } emb_ctx;
static double emb_loss(void *p) {
    emb_ctx *c = p;
    embedding_forward_cpu(c->out, c->tok, c->wte, c->T, c->H);
    return dot_fd(c->out, c->g, (int64_t)c->T * c->H);
}

Test(model_ops, embedding_gathers_and_backward_accumulates_repeated_tokens) {
    enum { T = 7, H = 5, V = 6 };
    int32_t tok[T] = {3, 0, 3, 5, 3, 1, 0};  // 3 three times, 0 twice, 2 and 4 never
    float *wte = randn(V * H, 1, 1), *out = zeros(T * H), *g = randn(T * H, 2, 1);
    embedding_forward_cpu(out, tok, wte, T, H);
    for (int t = 0; t < T; t++)
        cr_assert_eq(memcmp(out + t * H, wte + tok[t] * H, H * sizeof(float)), 0, "row %d", t);
    float *dwte = zeros(V * H);
    embedding_backward_cpu(dwte, g, tok, T, H);
    for (int i = 0; i < H; i++) {
        cr_assert_float_eq(dwte[3 * H + i], g[0 * H + i] + g[2 * H + i] + g[4 * H + i], 1e-6);
        cr_assert_eq(dwte[2 * H + i], 0.0f);
        cr_assert_eq(dwte[4 * H + i], 0.0f);
    }
    emb_ctx c = {T, H, V, tok, wte, out, g};
    check_grad(emb_loss, &c, wte, dwte, V * H, "embedding dwte");
    embedding_backward_cpu(NULL, g, tok, T, H);  // frozen: skipped
    free(wte), free(out), free(g), free(dwte);
}

// ---------------------------------------------------------------------------------------------
// rmsnorm

typedef struct { int T, H; float eps; float *x, *w, *y, *rstd; const float *g; } rms_ctx;
static double rms_loss(void *p) {
    rms_ctx *c = p;
    rmsnorm_forward_cpu(c->y, c->rstd, c->x, c->w, c->T, c->H, c->eps);
    return dot_fd(c->y, c->g, (int64_t)c->T * c->H);
}

Test(model_ops, rmsnorm_forward_matches_double_reference) {
    enum { T = 6, H = 37 };
    float eps = 1e-5f;
    float *x = randn(T * H, 3, 2), *w = randn(H, 4, 1), *y = zeros(T * H), *rstd = zeros(T);
    for (int i = 0; i < H; i++) x[5 * H + i] = 0;  // an all-zero row: rstd = 1/sqrt(eps), y = 0
    rmsnorm_forward_cpu(y, rstd, x, w, T, H, eps);
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int i = 0; i < H; i++) ss += (double)x[t * H + i] * x[t * H + i];
        double r = 1.0 / sqrt(ss / H + eps);
        cr_assert(fabs(rstd[t] - r) <= 1e-6 * r, "rstd[%d] %g vs %g", t, rstd[t], r);
        for (int i = 0; i < H; i++) {
            double ref = x[t * H + i] * r * w[i];
            cr_assert(fabs(y[t * H + i] - ref) <= 1e-6 * (fabs(ref) + 1e-3), "y[%d,%d] %g vs %g", t,
                      i, y[t * H + i], ref);
        }
    }
    free(x), free(w), free(y), free(rstd);
}

Test(model_ops, rmsnorm_backward_fd_dx_and_dw) {
    enum { T = 5, H = 16 };
    float *x = randn(T * H, 5, 1.5f), *w = randn(H, 6, 1), *y = zeros(T * H), *rstd = zeros(T);
    float *g = randn(T * H, 7, 1), *dx = zeros(T * H), *dw = zeros(H);
    rms_ctx c = {T, H, 1e-5f, x, w, y, rstd, g};
    rms_loss(&c);
    rmsnorm_backward_cpu(dx, dw, g, x, w, rstd, T, H);
    check_grad(rms_loss, &c, x, dx, T * H, "rmsnorm dx");
    check_grad(rms_loss, &c, w, dw, H, "rmsnorm dw");
    float *dx2 = zeros(T * H);  // dw NULL (frozen weight) still gives dx
    rmsnorm_backward_cpu(dx2, NULL, g, x, w, rstd, T, H);
    cr_assert_eq(memcmp(dx, dx2, sizeof(float) * T * H), 0);
    free(x), free(w), free(y), free(rstd), free(g), free(dx), free(dw), free(dx2);
}

// ---------------------------------------------------------------------------------------------
// rope

// The default table of theta (model/rope.h), in a buffer per call site's lifetime (tests are
// single-threaded here).
static const float *rope_tbl(float theta, int hd) {
    static float inv[256];
    float scale;
    mt_rope_params p = {.hd = hd, .theta = theta};
    cr_assert_eq(mt_rope_table(&p, inv, &scale), 0, "%s", mt_error_get());
    cr_assert_eq(scale, 1.0f);
    return inv;
}

// The HF fp32 angle (see model/rope.c), then cos/sin and the rotation in double.
static void rope_ref(double *out, const float *x, const int32_t *pos, int T, int nh, int hd,
                     float theta, int fp32_angles) {
    int half = hd / 2;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < half; j++) {
            double angle;
            if (fp32_angles) {
                float inv_freq = 1.0f / powf(theta, (float)(2 * j) / (float)hd);
                angle = (float)pos[t] * inv_freq;
            } else {
                angle = pos[t] * pow((double)theta, -2.0 * j / hd);
            }
            for (int h = 0; h < nh; h++) {
                const float *xh = x + ((int64_t)t * nh + h) * hd;
                double *o = out + ((int64_t)t * nh + h) * hd;
                o[j] = xh[j] * cos(angle) - xh[j + half] * sin(angle);
                o[j + half] = xh[j + half] * cos(angle) + xh[j] * sin(angle);
            }
        }
}

static double rope_max_err(const float *a, const double *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(a[i] - b[i]));
    return m;
}

Test(model_ops, rope_forward_matches_cos_sin_formula) {
    enum { T = 6, NH = 3, HD = 16, N = T * NH * HD };
    int32_t pos[T] = {0, 1, 2, 7, 100, 4000};
    float *x = randn(N, 8, 1), *y = mt_xmalloc(N * sizeof(float));
    double ref[N];
    memcpy(y, x, N * sizeof(float));
    rope_forward_cpu(y, pos, T, NH, HD, 0, HD, 0, rope_tbl(10000.0f, HD), 1.0f);
    rope_ref(ref, x, pos, T, NH, HD, 10000.0f, 1);
    cr_assert(rope_max_err(y, ref, N) < 2e-6, "vs HF fp32 angles: %g", rope_max_err(y, ref, N));
    for (int i = 0; i < NH * HD; i++) cr_assert_eq(y[i], x[i], "position 0 is the identity");
    // Small positions: the fp32 angles are the exact ones to ~1e-7.
    rope_ref(ref, x, pos, 4, NH, HD, 10000.0f, 0);
    cr_assert(rope_max_err(y, ref, 4 * NH * HD) < 2e-6);
    free(x), free(y);
}

Test(model_ops, rope_uses_fp32_angles_like_transformers) {
    // At large positions fp32 angles differ from exact ones by ~ulp(angle): we follow HF's fp32.
    enum { T = 2, NH = 1, HD = 128, N = T * NH * HD };
    int32_t pos[T] = {31999, 123457};
    float *x = randn(N, 9, 1), *y = mt_xmalloc(N * sizeof(float));
    double ref[N];
    memcpy(y, x, N * sizeof(float));
    rope_forward_cpu(y, pos, T, NH, HD, 0, HD, 0, rope_tbl(1e6f, HD), 1.0f);
    rope_ref(ref, x, pos, T, NH, HD, 1e6f, 1);
    cr_assert(rope_max_err(y, ref, N) < 2e-6, "vs HF fp32 angles: %g", rope_max_err(y, ref, N));
    rope_ref(ref, x, pos, T, NH, HD, 1e6f, 0);
    cr_assert(rope_max_err(y, ref, N) > 1e-4, "exact angles should differ here: %g",
              rope_max_err(y, ref, N));
    free(x), free(y);
}

typedef struct { int T, NH, HD; const int32_t *pos; float *x, *y; const float *g; } rope_ctx;
static double rope_loss(void *p) {
    rope_ctx *c = p;
    int64_t n = (int64_t)c->T * c->NH * c->HD;
    memcpy(c->y, c->x, n * sizeof(float));
    rope_forward_cpu(c->y, c->pos, c->T, c->NH, c->HD, 0, c->HD, 0, rope_tbl(10000.0f, c->HD), 1.0f);
    return dot_fd(c->y, c->g, n);
}

Test(model_ops, rope_backward_is_the_transpose_and_fd) {
    enum { T = 5, NH = 2, HD = 8, N = T * NH * HD };
    int32_t pos[T] = {0, 3, 1, 50, 9};
    float *x = randn(N, 10, 1), *y = randn(N, 11, 1), *rx = mt_xmalloc(N * 4), *rty = mt_xmalloc(N * 4);
    memcpy(rx, x, N * 4);
    memcpy(rty, y, N * 4);
    rope_forward_cpu(rx, pos, T, NH, HD, 0, HD, 0, rope_tbl(10000.0f, HD), 1.0f);
    rope_backward_cpu(rty, pos, T, NH, HD, 0, HD, 0, rope_tbl(10000.0f, HD), 1.0f);
    double a = dot_fd(rx, y, N), b = dot_fd(x, rty, N);
    cr_assert(fabs(a - b) < 1e-5 * (fabs(a) + 1), "<Rx,y> %.9g vs <x,R'y> %.9g", a, b);
    rope_backward_cpu(rx, pos, T, NH, HD, 0, HD, 0, rope_tbl(10000.0f, HD), 1.0f);  // RᵀR = I
    for (int i = 0; i < N; i++) cr_assert(fabs(rx[i] - x[i]) < 1e-6, "R'R x [%d]", i);
    // FD: the gradient of <y, R x> with respect to x is Rᵀ y.
    float *buf = zeros(N);
    rope_ctx c = {T, NH, HD, pos, x, buf, y};
    check_grad(rope_loss, &c, x, rty, N, "rope dx");
    free(x), free(y), free(rx), free(rty), free(buf);
}

// RoPE on part of a head, both pair layouts, written out: in a head of `stride` dims, dims
// [off, off + rot) turn in pairs (off + j, off + j + rot/2), or (off + 2j, off + 2j + 1) when
// interleaved, by transformers' fp32 angle pos · inv_freq[j]; cos and sin times scale.
static void rope_part_ref(double *out, const float *x, const int32_t *pos, int T, int nh, int stride, int off, int rot,
                          int inter, const float *inv, float scale) {
    for (int64_t i = 0; i < (int64_t)T * nh * stride; i++) out[i] = x[i];
    for (int t = 0; t < T; t++)
        for (int j = 0; j < rot / 2; j++) {
            double angle = (float)pos[t] * inv[j], c = cos(angle) * scale, s = sin(angle) * scale;
            int a = off + (inter ? 2 * j : j), b = inter ? a + 1 : a + rot / 2;
            for (int h = 0; h < nh; h++) {
                const float *xh = x + ((int64_t)t * nh + h) * stride;
                double *o = out + ((int64_t)t * nh + h) * stride;
                o[a] = xh[a] * c - xh[b] * s;
                o[b] = xh[b] * c + xh[a] * s;
            }
        }
}

typedef struct { int T, NH, stride, off, rot, inter; const int32_t *pos; const float *inv; float scale; float *x, *y; const float *g; } rope_part_ctx;
static double rope_part_loss(void *p) {
    rope_part_ctx *c = p;
    int64_t n = (int64_t)c->T * c->NH * c->stride;
    memcpy(c->y, c->x, n * sizeof(float));
    rope_forward_cpu(c->y, c->pos, c->T, c->NH, c->stride, c->off, c->rot, c->inter, c->inv, c->scale);
    return dot_fd(c->y, c->g, n);
}

// GLM's partial rotary (off 0, rot = head_dim · 0.5), DeepSeek's interleaved rope part (off =
// nope), whole heads interleaved, and a part in the middle; with transformers' attention_scaling
// (YaRN's) on some. Dims outside the part stay bit for bit; the backward is the transpose (and
// scale²·I after the forward), and finite differences agree.
Test(model_ops, rope_partial_and_interleaved_match_the_formula) {
    enum { T = 5, NH = 3, STRIDE = 24, N = T * NH * STRIDE };
    const struct { int off, rot, inter; float scale; } cases[] = {
        {0, 12, 0, 1.0f}, {8, 16, 1, 1.3f}, {0, 24, 1, 1.0f}, {8, 16, 0, 1.0f}, {4, 6, 0, 0.8f}, {2, 20, 1, 1.0f},
    };
    int32_t pos[T] = {0, 3, 17, 400, 4001};
    for (size_t n = 0; n < MT_ARRAY_LEN(cases); n++) {
        const int off = cases[n].off, rot = cases[n].rot, inter = cases[n].inter;
        const float sc = cases[n].scale;
        float inv[16];
        memcpy(inv, rope_tbl(10000.0f, rot), sizeof(float) * rot / 2);
        float *x = randn(N, 300 + n, 1), *y = zeros(N), *g = randn(N, 310 + n, 1), *rty = zeros(N);
        double ref[N];
        memcpy(y, x, sizeof(float) * N);
        rope_forward_cpu(y, pos, T, NH, STRIDE, off, rot, inter, inv, sc);
        rope_part_ref(ref, x, pos, T, NH, STRIDE, off, rot, inter, inv, sc);
        for (int i = 0; i < N; i++) {
            int d = i % STRIDE;
            if (d < off || d >= off + rot) cr_assert_eq(y[i], x[i], "case %zu: dim %d outside the part moved", n, d);
            else cr_assert(fabs(y[i] - ref[i]) < 3e-6, "case %zu: [%d] %.9g vs %.9g", n, i, y[i], ref[i]);
        }
        memcpy(rty, g, sizeof(float) * N);
        rope_backward_cpu(rty, pos, T, NH, STRIDE, off, rot, inter, inv, sc);
        double a = dot_fd(y, g, N), b = dot_fd(x, rty, N);
        cr_assert(fabs(a - b) < 1e-5 * (fabs(a) + 1), "case %zu: <Rx,y> %.9g vs <x,R'y> %.9g", n, a, b);
        rope_backward_cpu(y, pos, T, NH, STRIDE, off, rot, inter, inv, sc);  // RᵀR = scale²·I on the part
        for (int i = 0; i < N; i++) {
            int d = i % STRIDE;
            double want = d < off || d >= off + rot ? x[i] : (double)sc * sc * x[i];
            cr_assert(fabs(y[i] - want) < 2e-6, "case %zu: R'R x [%d] %.9g vs %.9g", n, i, y[i], want);
        }
        if (n == 1) {  // FD through the scaled, interleaved part
            float *buf = zeros(N);
            rope_part_ctx c = {T, NH, STRIDE, off, rot, inter, pos, inv, sc, x, buf, g};
            check_grad(rope_part_loss, &c, x, rty, N, "rope (part, interleaved) dx");
            free(buf);
        }
        free(x), free(y), free(g), free(rty);
    }
}

// DeepSeek V3's rope_interleave in transformers (apply_rotary_pos_emb_interleave) turns the pairs
// (2j, 2j + 1) of the rope part and writes pair j's results to dims j and j + rot/2 of it; ours
// (interleave 1) leaves them at 2j and 2j + 1 (as V2's complex form does). The values are the same
// bit for bit under that permutation, which q and k share: every score q·k, and attention's
// output, equal transformers'. Heads of nope 8 | rope 16 (off = nope), k expanded to every head.
Test(model_ops, rope_interleaved_gives_transformers_attention_scores) {
    enum { S = 11, NH = 2, NOPE = 8, ROPE = 16, HD = NOPE + ROPE, N = S * NH * HD };
    int32_t pos[S];
    for (int t = 0; t < S; t++) pos[t] = 3 * t + 1000;
    float inv[ROPE / 2];
    memcpy(inv, rope_tbl(10000.0f, ROPE), sizeof inv);
    const float sc = 1.2f;  // YaRN's attention_scaling, on cos and sin
    float *q = randn(N, 320, 1), *k = randn(N, 321, 1), *v = randn(N, 322, 1);
    float *oq = zeros(N), *ok = zeros(N), *hq = zeros(N), *hk = zeros(N);
    memcpy(oq, q, sizeof(float) * N), memcpy(ok, k, sizeof(float) * N);
    rope_forward_cpu(oq, pos, S, NH, HD, NOPE, ROPE, 1, inv, sc);
    rope_forward_cpu(ok, pos, S, NH, HD, NOPE, ROPE, 1, inv, sc);
    // transformers: cos, sin = cos(emb) · scaling, sin(emb) · scaling (emb = cat(freqs, freqs), its
    // first half taken); x1, x2 = x[0::2], x[1::2]; cat(x1·cos − x2·sin, x2·cos + x1·sin); q_pass first.
    const float *src[2] = {q, k};
    float *dst[2] = {hq, hk};
    for (int w = 0; w < 2; w++)
        for (int t = 0; t < S; t++)
            for (int h = 0; h < NH; h++) {
                const float *x = src[w] + (t * NH + h) * HD;
                float *o = dst[w] + (t * NH + h) * HD;
                memcpy(o, x, sizeof(float) * NOPE);
                for (int j = 0; j < ROPE / 2; j++) {
                    float f = (float)pos[t] * inv[j], c = cosf(f) * sc, s = sinf(f) * sc;
                    float x1 = x[NOPE + 2 * j], x2 = x[NOPE + 2 * j + 1];
                    o[NOPE + j] = x1 * c - x2 * s;
                    o[NOPE + ROPE / 2 + j] = x2 * c + x1 * s;
                }
            }
    for (int t = 0; t < S; t++)
        for (int h = 0; h < NH; h++) {
            const float *a = oq + (t * NH + h) * HD, *b = hq + (t * NH + h) * HD;
            for (int e = 0; e < NOPE; e++) cr_assert_eq(a[e], b[e], "q_pass moved");
            for (int j = 0; j < ROPE / 2; j++) {
                cr_assert_eq(a[NOPE + 2 * j], b[NOPE + j], "t %d h %d pair %d: even dim", t, h, j);
                cr_assert_eq(a[NOPE + 2 * j + 1], b[NOPE + ROPE / 2 + j], "t %d h %d pair %d: odd dim", t, h, j);
            }
        }
    for (int h = 0; h < NH; h++)
        for (int i = 0; i < S; i++)
            for (int j = 0; j < S; j++) {
                double so = 0, sh = 0;
                for (int e = 0; e < HD; e++) {
                    so += (double)oq[(i * NH + h) * HD + e] * ok[(j * NH + h) * HD + e];
                    sh += (double)hq[(i * NH + h) * HD + e] * hk[(j * NH + h) * HD + e];
                }
                cr_assert(fabs(so - sh) < 1e-9 * (1 + fabs(sh)), "score h %d (%d, %d): %.12g vs transformers %.12g", h,
                          i, j, so, sh);
            }
    float *o1 = zeros(N), *o2 = zeros(N), *l1 = zeros(S * NH), *l2 = zeros(S * NH);
    attention_forward_cpu(o1, l1, oq, ok, v, NULL, NULL, 1, S, NH, NH, HD, HD, mla_scale(HD), 0);
    attention_forward_cpu(o2, l2, hq, hk, v, NULL, NULL, 1, S, NH, NH, HD, HD, mla_scale(HD), 0);
    for (int i = 0; i < N; i++) cr_assert(fabsf(o1[i] - o2[i]) < 1e-5f, "out[%d] %g vs %g", i, o1[i], o2[i]);
    for (int i = 0; i < S * NH; i++) cr_assert(fabsf(l1[i] - l2[i]) < 1e-5f, "lse[%d] %g vs %g", i, l1[i], l2[i]);
    free(q), free(k), free(v), free(oq), free(ok), free(hq), free(hk), free(o1), free(o2), free(l1), free(l2);
}

// ---------------------------------------------------------------------------------------------
// attention

typedef struct {
    int B, S, nh, nkv, hd, window;
    const uint8_t *mask;
    float *q, *k, *v, *out, *lse;
    const float *g;
    float *sinks;  // [nh] or NULL (gpt-oss's learned sinks)
    int hd_v;      // v and out's head dim (MLA's differs from q and k's hd)
    float scale;
} attn_ctx;

static attn_ctx attn_make_v(int B, int S, int nh, int nkv, int hd, int hd_v, float scale, int window,
                            const uint8_t *mask, uint64_t seed) {
    int64_t T = (int64_t)B * S;
    attn_ctx c = {B, S, nh, nkv, hd, window, mask, randn(T * nh * hd, seed, 1),
                  randn(T * nkv * hd, seed + 1, 1), randn(T * nkv * hd_v, seed + 2, 1),
                  zeros(T * nh * hd_v), zeros(T * nh), randn(T * nh * hd_v, seed + 3, 1), NULL, hd_v, scale};
    return c;
}

static attn_ctx attn_make(int B, int S, int nh, int nkv, int hd, int window, const uint8_t *mask,
                          uint64_t seed) {
    return attn_make_v(B, S, nh, nkv, hd, hd, SC(hd), window, mask, seed);
}

static void attn_free(attn_ctx *c) {
    free(c->q), free(c->k), free(c->v), free(c->out), free(c->lse), free((void *)c->g);
}

static double attn_loss(void *p) {
    attn_ctx *c = p;
    attention_forward_cpu(c->out, c->lse, c->q, c->k, c->v, c->sinks, c->mask, c->B, c->S, c->nh, c->nkv,
                          c->hd, c->hd_v, c->scale, c->window);
    return dot_fd(c->out, c->g, (int64_t)c->B * c->S * c->nh * c->hd_v);
}

// The whole S×S score matrix in double, masked as transformers builds it:
// allowed = causal (kv ≤ q) ∧ sliding (kv > q − window) ∧ padding (mask[kv]).
static void attn_ref(double *out, double *lse, const attn_ctx *c) {
    int S = c->S, nh = c->nh, hd = c->hd, hv = c->hd_v;
    double *s = mt_xmalloc(sizeof(double) * S * S);
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < nh; h++) {
            int kvh = h / (nh / c->nkv);
            for (int qi = 0; qi < S; qi++)
                for (int kv = 0; kv < S; kv++) {
                    int ok = kv <= qi && (c->window == 0 || kv > qi - c->window) &&
                             (!c->mask || c->mask[b * S + kv]);
                    double d = 0;
                    for (int e = 0; e < hd; e++)
                        d += (double)c->q[((b * S + qi) * nh + h) * hd + e] *
                             c->k[((b * S + kv) * c->nkv + kvh) * hd + e];
                    s[qi * S + kv] = ok ? d * c->scale : -INFINITY;
                }
            for (int qi = 0; qi < S; qi++) {
                double m = -INFINITY, z = 0;
                for (int kv = 0; kv < S; kv++) m = fmax(m, s[qi * S + kv]);
                double *o = out + ((int64_t)(b * S + qi) * nh + h) * hv;
                for (int e = 0; e < hv; e++) o[e] = 0;
                if (m == -INFINITY) {
                    lse[(b * S + qi) * nh + h] = -INFINITY;
                    continue;
                }
                for (int kv = 0; kv < S; kv++) z += exp(s[qi * S + kv] - m);
                for (int kv = 0; kv < S; kv++) {
                    double p = exp(s[qi * S + kv] - m) / z;
                    for (int e = 0; e < hv; e++) o[e] += p * c->v[((b * S + kv) * c->nkv + kvh) * hv + e];
                }
                lse[(b * S + qi) * nh + h] = m + log(z);
            }
        }
    free(s);
}

static void attn_check_forward(attn_ctx *c, const char *what) {
    int64_t T = (int64_t)c->B * c->S, no = T * c->nh * c->hd_v;
    double *ro = mt_xmalloc(sizeof(double) * no), *rl = mt_xmalloc(sizeof(double) * T * c->nh);
    attn_loss(c);
    attn_ref(ro, rl, c);
    for (int64_t i = 0; i < no; i++)
        cr_assert(fabs(c->out[i] - ro[i]) < 1e-5, "%s: out[%lld] %g vs %g", what, (long long)i,
                  c->out[i], ro[i]);
    for (int64_t i = 0; i < T * c->nh; i++) {
        if (rl[i] == -INFINITY) {
            cr_assert(c->lse[i] == -INFINITY, "%s: lse[%lld] %g, want -inf", what, (long long)i, c->lse[i]);
            continue;
        }
        cr_assert(fabs(c->lse[i] - rl[i]) < 1e-5 * (1 + fabs(rl[i])), "%s: lse[%lld] %g vs %g", what,
                  (long long)i, c->lse[i], rl[i]);
    }
    free(ro), free(rl);
}

// Sequence 1 is left-padded by 3, sequence 0 not; S = 9.
static const uint8_t PAD_MASK[18] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1};

Test(model_ops, attention_forward_matches_full_softmax_reference) {
    struct { int nh, nkv, window; const uint8_t *mask; } cases[] = {
        {4, 2, 0, NULL},     {4, 2, 4, NULL},     {4, 2, 3, PAD_MASK}, {4, 4, 0, PAD_MASK},
        {4, 1, 5, PAD_MASK}, {4, 1, 0, NULL},     {2, 2, 100, NULL},   {4, 2, 9, NULL},
    };
    for (size_t n = 0; n < MT_ARRAY_LEN(cases); n++) {
        attn_ctx c = attn_make(2, 9, cases[n].nh, cases[n].nkv, 8, cases[n].window, cases[n].mask, 20 + n);
        char what[64];
        snprintf(what, sizeof what, "nh=%d nkv=%d window=%d mask=%d", c.nh, c.nkv, c.window, !!c.mask);
        attn_check_forward(&c, what);
        attn_free(&c);
    }
}

Test(model_ops, attention_window_1_sees_only_itself) {
    attn_ctx c = attn_make(2, 6, 4, 2, 8, 1, NULL, 40);
    attn_loss(&c);
    for (int t = 0; t < 12; t++)
        for (int h = 0; h < 4; h++) {
            const float *o = c.out + (t * 4 + h) * 8, *v = c.v + (t * 2 + h / 2) * 8;
            for (int e = 0; e < 8; e++) cr_assert_float_eq(o[e], v[e], 1e-6, "t=%d h=%d", t, h);
            double s = dot_fd(c.q + (t * 4 + h) * 8, c.k + (t * 2 + h / 2) * 8, 8) / sqrt(8);
            cr_assert(fabs(c.lse[t * 4 + h] - s) < 1e-5, "lse is the own score");
        }
    attn_free(&c);
}

Test(model_ops, attention_fully_masked_rows_give_zero_and_no_nan) {
    // Left padding: sequence 1's first 3 queries see no key at all.
    attn_ctx c = attn_make(2, 9, 4, 2, 8, 0, PAD_MASK, 50);
    int64_t T = 18, nq = T * 4 * 8, nk = T * 2 * 8;
    float *dq = zeros(nq), *dk = zeros(nk), *dv = zeros(nk);
    attn_loss(&c);
    attention_backward_cpu(dq, dk, dv, NULL, c.g, c.q, c.k, c.v, c.out, c.lse, NULL, c.mask, 2, 9, 4, 2, 8, 8, SC(8), 0);
    for (int t = 9; t < 12; t++)
        for (int h = 0; h < 4; h++) {
            cr_assert(c.lse[t * 4 + h] == -INFINITY);
            for (int e = 0; e < 8; e++) {
                cr_assert_eq(c.out[(t * 4 + h) * 8 + e], 0.0f);
                cr_assert_eq(dq[(t * 4 + h) * 8 + e], 0.0f);
            }
        }
    for (int t = 9; t < 12; t++)  // padded keys get no gradient either
        for (int e = 0; e < 16; e++) cr_assert(dk[t * 16 + e] == 0.0f && dv[t * 16 + e] == 0.0f);
    for (int64_t i = 0; i < nq; i++) cr_assert(isfinite(c.out[i]) && isfinite(dq[i]), "[%lld]", (long long)i);
    for (int64_t i = 0; i < nk; i++) cr_assert(isfinite(dk[i]) && isfinite(dv[i]), "[%lld]", (long long)i);
    // Every key masked: all rows empty.
    uint8_t none[18] = {0};
    c.mask = none;
    attn_loss(&c);
    for (int64_t i = 0; i < nq; i++) cr_assert_eq(c.out[i], 0.0f);
    memset(dq, 0, nq * 4);
    attention_backward_cpu(dq, dk, NULL, NULL, c.g, c.q, c.k, c.v, c.out, c.lse, NULL, c.mask, 2, 9, 4, 2, 8, 8, SC(8), 0);
    for (int64_t i = 0; i < nq; i++) cr_assert_eq(dq[i], 0.0f);
    free(dq), free(dk), free(dv);
    attn_free(&c);
}

static void attn_check_backward(int nh, int nkv, int window, const uint8_t *mask, uint64_t seed) {
    attn_ctx c = attn_make(2, 9, nh, nkv, 8, window, mask, seed);
    int64_t nq = 18 * nh * 8, nk = 18 * nkv * 8;
    float *dq = zeros(nq), *dk = zeros(nk), *dv = zeros(nk);
    attn_loss(&c);
    attention_backward_cpu(dq, dk, dv, NULL, c.g, c.q, c.k, c.v, c.out, c.lse, NULL, mask, 2, 9, nh, nkv, 8, 8, SC(8), window);
    char what[80];
    snprintf(what, sizeof what, "attention nh=%d nkv=%d window=%d: dq", nh, nkv, window);
    check_grad(attn_loss, &c, c.q, dq, nq, what);
    snprintf(what, sizeof what, "attention nh=%d nkv=%d window=%d: dk", nh, nkv, window);
    check_grad(attn_loss, &c, c.k, dk, nk, what);
    snprintf(what, sizeof what, "attention nh=%d nkv=%d window=%d: dv", nh, nkv, window);
    check_grad(attn_loss, &c, c.v, dv, nk, what);
    free(dq), free(dk), free(dv);
    attn_free(&c);
}

Test(model_ops, attention_backward_fd_gqa_window_left_padding) {
    attn_check_backward(4, 2, 4, PAD_MASK, 60);
}

Test(model_ops, attention_backward_fd_mha_and_single_kv_head) {
    attn_check_backward(4, 4, 0, NULL, 70);
    attn_check_backward(4, 1, 3, PAD_MASK, 80);
}

// The tiled kernels (64-row blocks, chunks of 512 keys or queries) against the scalar reference
// at sizes that cut blocks: one row, a block less one, a block, a block plus one, several blocks,
// several chunks; windows inside a block, across blocks and chunks and wider than the sequence;
// left padding longer than a block or a chunk, and scattered holes.
// Forward outputs and all three gradients, elementwise, relative to the largest |reference|.
// hv, scale: v and out's head dim and the scores' scale (MLA's differ from hd and 1/sqrt(hd)).
static void attn_vs_ref_mla(int B, int S, int nh, int nkv, int hd, int hv, float scale, int window,
                            const uint8_t *mask, uint64_t seed, int sinks) {
    attn_ctx c = attn_make_v(B, S, nh, nkv, hd, hv, scale, window, mask, seed);
    float *ds = NULL, *rs = NULL;
    if (sinks) {  // logits about the scores' size, one large; dsinks from the same non-zero start
        c.sinks = randn(nh, seed + 5, 1.5f), c.sinks[0] = 4.0f;
        ds = randn(nh, seed + 6, 0.5f), rs = zeros(nh);
        memcpy(rs, ds, sizeof(float) * nh);
    }
    int64_t T = (int64_t)B * S, nq = T * nh * hd, nk = T * nkv * hd, no = T * nh * hv, nv = T * nkv * hv;
    float *ro = zeros(no), *rl = zeros(T * nh);
    attn_loss(&c);
    attention_forward_ref(ro, rl, c.q, c.k, c.v, c.sinks, mask, B, S, nh, nkv, hd, hv, scale, window);
    char what[128];
    snprintf(what, sizeof what, "B=%d S=%d nh=%d nkv=%d hd=%d hv=%d scale=%g window=%d mask=%d sinks=%d", B, S, nh, nkv,
             hd, hv, scale, window, !!mask, sinks);
    for (int64_t i = 0; i < no; i++)
        cr_assert(fabsf(c.out[i] - ro[i]) < 2e-5f * (1 + fabsf(ro[i])), "%s: out[%lld] %g vs ref %g", what,
                  (long long)i, c.out[i], ro[i]);
    for (int64_t i = 0; i < T * nh; i++)
        cr_assert(rl[i] == -INFINITY ? c.lse[i] == -INFINITY : fabsf(c.lse[i] - rl[i]) < 2e-5f * (1 + fabsf(rl[i])),
                  "%s: lse[%lld] %g vs ref %g", what, (long long)i, c.lse[i], rl[i]);
    // Gradients start from the same nonzero values: both kernels accumulate.
    float *g[3] = {randn(nq, seed + 7, 0.5f), randn(nk, seed + 8, 0.5f), randn(nv, seed + 9, 0.5f)};
    float *r[3] = {zeros(nq), zeros(nk), zeros(nv)};
    int64_t n[3] = {nq, nk, nv};
    for (int t = 0; t < 3; t++) memcpy(r[t], g[t], sizeof(float) * n[t]);
    attention_backward_cpu(g[0], g[1], g[2], ds, c.g, c.q, c.k, c.v, c.out, c.lse, c.sinks, mask, B, S, nh, nkv, hd, hv,
                           scale, window);
    attention_backward_ref(r[0], r[1], r[2], rs, c.g, c.q, c.k, c.v, ro, rl, c.sinks, mask, B, S, nh, nkv, hd, hv, scale,
                           window);
    if (sinks) {
        float big = fd_max_abs(rs, nh);
        for (int h = 0; h < nh; h++)
            cr_assert(fabsf(ds[h] - rs[h]) < 1e-4f * (1 + big), "%s: dsinks[%d] %g vs ref %g", what, h, ds[h], rs[h]);
        free(ds), free(rs), free(c.sinks);
    }
    static const char *names[3] = {"dq", "dk", "dv"};
    for (int t = 0; t < 3; t++) {
        float big = fd_max_abs(r[t], n[t]);
        for (int64_t i = 0; i < n[t]; i++)
            cr_assert(fabsf(g[t][i] - r[t][i]) < 1e-4f * (1 + big), "%s: %s[%lld] %g vs ref %g", what, names[t],
                      (long long)i, g[t][i], r[t][i]);
        free(g[t]), free(r[t]);
    }
    free(ro), free(rl);
    attn_free(&c);
}

static void attn_vs_ref_sinks(int B, int S, int nh, int nkv, int hd, int window, const uint8_t *mask, uint64_t seed,
                              int sinks) {
    attn_vs_ref_mla(B, S, nh, nkv, hd, hd, SC(hd), window, mask, seed, sinks);
}

static void attn_vs_ref(int B, int S, int nh, int nkv, int hd, int window, const uint8_t *mask, uint64_t seed) {
    attn_vs_ref_sinks(B, S, nh, nkv, hd, window, mask, seed, 0);
}

Test(model_ops, attention_tiled_matches_scalar_reference) {
    enum { S = 200 };
    uint8_t pad[2 * S], holes[2 * S];
    for (int i = 0; i < 2 * S; i++) {
        pad[i] = !(i >= S && i < S + 70);  // sequence 1 left-padded by 70 (more than a block)
        holes[i] = (i * 7 + 3) % 11 != 0;  // scattered masked keys in both sequences
    }
    for (int s = 0; s < 4; s++) {  // a row, a block less one, a block, a block plus one
        static const int sizes[4] = {1, 63, 64, 65};
        attn_vs_ref(2, sizes[s], 4, 2, 16, 0, NULL, 100 + s);
    }
    attn_vs_ref(1, S, 4, 2, 16, 0, NULL, 110);
    attn_vs_ref(2, S, 4, 2, 16, 0, pad, 111);
    attn_vs_ref(2, S, 4, 4, 16, 0, holes, 112);
    attn_vs_ref(2, S, 4, 1, 16, 5, NULL, 113);    // window inside a block
    attn_vs_ref(2, S, 4, 2, 16, 70, pad, 114);    // window across blocks, padding
    attn_vs_ref(2, S, 4, 2, 16, 130, holes, 115);
    attn_vs_ref(1, S, 2, 2, 16, 1, NULL, 116);    // sees only itself
    attn_vs_ref(1, S, 2, 1, 16, 500, NULL, 117);  // wider than the sequence
    attn_vs_ref(1, 130, 2, 1, 40, 64, holes, 118);  // head size not a multiple of 8
    uint8_t none[2 * S] = {0};
    attn_vs_ref(2, S, 4, 2, 16, 0, none, 119);  // every key masked
    enum { L = 1100 };  // two chunks and a part
    static uint8_t lpad[2 * L];
    for (int i = 0; i < 2 * L; i++) lpad[i] = !(i >= L && i < L + 600) && i % 17 != 4;
    attn_vs_ref(1, L, 2, 1, 8, 0, NULL, 120);
    attn_vs_ref(2, L, 2, 2, 8, 600, lpad, 121);   // padding longer than a chunk, window across chunks
    attn_vs_ref(1, 1025, 2, 1, 8, 513, NULL, 122);  // a window one key wider than a chunk
}

// The tiled kernels give the same bits at any thread count: every output row has one writer and
// the GQA partials are summed in head order.
Test(model_ops, attention_tiled_same_bits_at_any_thread_count) {
    enum { B = 2, S = 150, NH = 4, NKV = 2, HD = 16 };
    attn_ctx c = attn_make(B, S, NH, NKV, HD, 70, NULL, 140);
    int64_t nq = (int64_t)B * S * NH * HD, nk = (int64_t)B * S * NKV * HD;
    float *g[2][3];
    float *out[2];
    int saved = omp_get_max_threads();
    for (int r = 0; r < 2; r++) {
        omp_set_num_threads(r == 0 ? 1 : 3);
        attn_loss(&c);
        out[r] = zeros(nq);
        memcpy(out[r], c.out, sizeof(float) * nq);
        g[r][0] = zeros(nq), g[r][1] = zeros(nk), g[r][2] = zeros(nk);
        attention_backward_cpu(g[r][0], g[r][1], g[r][2], NULL, c.g, c.q, c.k, c.v, c.out, c.lse, NULL, NULL, B, S, NH, NKV, HD, HD, SC(HD), 70);
    }
    omp_set_num_threads(saved);
    cr_assert(memcmp(out[0], out[1], sizeof(float) * nq) == 0, "forward differs between 1 and 3 threads");
    int64_t n[3] = {nq, nk, nk};
    for (int t = 0; t < 3; t++) cr_assert(memcmp(g[0][t], g[1][t], sizeof(float) * n[t]) == 0, "gradient %d differs", t);
    for (int r = 0; r < 2; r++) free(out[r]), free(g[r][0]), free(g[r][1]), free(g[r][2]);
    attn_free(&c);
}

// Learned sinks (gpt-oss): the tiled kernels against the scalar reference at block-cutting sizes,
// with windows and padding longer than a block (rows with no key: out 0, lse = the sink).
Test(model_ops, attention_sinks_tiled_matches_scalar_reference) {
    enum { S = 200 };
    uint8_t pad[2 * S], none[2 * S] = {0};
    for (int i = 0; i < 2 * S; i++) pad[i] = !(i >= S && i < S + 70) && i % 11 != 3;
    attn_vs_ref_sinks(2, 7, 4, 2, 24, 5, NULL, 150, 1);
    attn_vs_ref_sinks(2, 65, 4, 2, 16, 0, NULL, 151, 1);
    attn_vs_ref_sinks(2, S, 4, 1, 16, 70, pad, 152, 1);
    attn_vs_ref_sinks(1, S, 2, 2, 40, 0, pad, 153, 1);
    attn_vs_ref_sinks(2, S, 4, 2, 16, 0, none, 154, 1);  // every key masked: out 0, lse = sink
}

// Finite differences through the sinks: dq, dk, dv and dsinks (GQA, a window, left padding whose
// first queries see only the sink).
static void attn_check_backward_sinks(int nh, int nkv, int window, const uint8_t *mask, uint64_t seed) {
    attn_ctx c = attn_make(2, 9, nh, nkv, 8, window, mask, seed);
    c.sinks = randn(nh, seed + 4, 1.0f);
    int64_t nq = 18 * nh * 8, nk = 18 * nkv * 8;
    float *dq = zeros(nq), *dk = zeros(nk), *dv = zeros(nk), *ds = zeros(nh);
    attn_loss(&c);
    attention_backward_cpu(dq, dk, dv, ds, c.g, c.q, c.k, c.v, c.out, c.lse, c.sinks, mask, 2, 9, nh, nkv, 8, 8, SC(8), window);
    check_grad(attn_loss, &c, c.q, dq, nq, "sinks: dq");
    check_grad(attn_loss, &c, c.k, dk, nk, "sinks: dk");
    check_grad(attn_loss, &c, c.v, dv, nk, "sinks: dv");
    check_grad(attn_loss, &c, c.sinks, ds, nh, "sinks: dsinks");
    float *ds2 = zeros(nh);  // the reference's dsinks, and the fast one's again: accumulated
    attn_loss(&c);           // out and lse of the unperturbed inputs again (FD left its last ones)
    attention_backward_ref(NULL, NULL, NULL, ds2, c.g, c.q, c.k, c.v, c.out, c.lse, c.sinks, mask, 2, 9, nh, nkv, 8, 8, SC(8),
                           window);
    attention_backward_cpu(NULL, NULL, NULL, ds, c.g, c.q, c.k, c.v, c.out, c.lse, c.sinks, mask, 2, 9, nh, nkv, 8, 8, SC(8),
                           window);
    for (int h = 0; h < nh; h++)
        cr_assert(fabsf(ds[h] - 2 * ds2[h]) < 1e-5f * (1 + fabsf(ds2[h])), "dsinks[%d] += : %g vs 2 × ref %g", h, ds[h],
                  ds2[h]);
    free(dq), free(dk), free(dv), free(ds), free(ds2), free(c.sinks);
    attn_free(&c);
}

Test(model_ops, attention_sinks_backward_fd) {
    attn_check_backward_sinks(4, 2, 4, PAD_MASK, 160);
    attn_check_backward_sinks(4, 4, 0, NULL, 161);
}

// A query with no visible key: out 0, lse = its head's sink, no NaN, no gradient to q.
Test(model_ops, attention_sinks_empty_rows) {
    attn_ctx c = attn_make(2, 9, 4, 2, 8, 0, PAD_MASK, 170);
    float sinks[4] = {0.5f, -2.0f, 3.0f, 0.0f};
    c.sinks = sinks;
    attn_loss(&c);
    for (int t = 9; t < 12; t++)
        for (int h = 0; h < 4; h++) {
            cr_assert_eq(c.lse[t * 4 + h], sinks[h]);
            for (int e = 0; e < 8; e++) cr_assert_eq(c.out[(t * 4 + h) * 8 + e], 0.0f);
        }
    float *ro = zeros(18 * 32), *rl = zeros(18 * 4);
    attention_forward_ref(ro, rl, c.q, c.k, c.v, c.sinks, c.mask, 2, 9, 4, 2, 8, 8, SC(8), 0);
    for (int t = 9; t < 12; t++)
        for (int h = 0; h < 4; h++) cr_assert_eq(rl[t * 4 + h], sinks[h]);
    free(ro), free(rl);
    c.sinks = NULL;
    attn_free(&c);
}

// Finite differences on multi-block cases, over the rows of the last query block and of the
// block boundary (all rows would take minutes): x and g offset to those rows.
static void attn_fd_tiled(int S, int nh, int nkv, int window, const uint8_t *mask, uint64_t seed) {
    const int B = 2, hd = 8;
    attn_ctx c = attn_make(B, S, nh, nkv, hd, window, mask, seed);
    int64_t T = (int64_t)B * S, nq = T * nh * hd, nk = T * nkv * hd;
    float *dq = zeros(nq), *dk = zeros(nk), *dv = zeros(nk);
    attn_loss(&c);
    attention_backward_cpu(dq, dk, dv, NULL, c.g, c.q, c.k, c.v, c.out, c.lse, NULL, mask, B, S, nh, nkv, hd, hd, SC(hd), window);
    static const int rows[] = {62, 65, 127, 128};  // around block edges, then the last ones of batch 1
    char what[96];
    for (size_t r = 0; r < MT_ARRAY_LEN(rows); r++) {
        int64_t t = rows[r] < S ? rows[r] : S - 1;
        t += S;  // sequence 1 (padded when a mask is given)
        snprintf(what, sizeof what, "attention S=%d window=%d row %lld: dq", S, window, (long long)t);
        check_grad(attn_loss, &c, c.q + t * nh * hd, dq + t * nh * hd, nh * hd, what);
        snprintf(what, sizeof what, "attention S=%d window=%d row %lld: dk", S, window, (long long)t);
        check_grad(attn_loss, &c, c.k + t * nkv * hd, dk + t * nkv * hd, nkv * hd, what);
        snprintf(what, sizeof what, "attention S=%d window=%d row %lld: dv", S, window, (long long)t);
        check_grad(attn_loss, &c, c.v + t * nkv * hd, dv + t * nkv * hd, nkv * hd, what);
    }
    free(dq), free(dk), free(dv);
    attn_free(&c);
}

Test(model_ops, attention_tiled_backward_fd_across_blocks) {
    enum { S = 150 };
    uint8_t pad[2 * S];
    for (int i = 0; i < 2 * S; i++) pad[i] = !(i >= S && i < S + 40) && i % 13 != 5;
    attn_fd_tiled(S, 4, 2, 0, NULL, 130);
    attn_fd_tiled(S, 4, 2, 70, pad, 131);
    attn_fd_tiled(S, 2, 1, 3, pad, 132);
}

// ---------------------------------------------------------------------------------------------
// attention with separate head dims and an explicit scale (DeepSeek's MLA: q and k of nope + rope
// dims, v and out of their own, scale hd^-0.5 · mscale²)

Test(model_ops, attention_separate_head_dims_match_full_softmax_reference) {
    struct { int nh, nkv, hd, hv, window; const uint8_t *mask; } cases[] = {
        {4, 2, 20, 10, 0, NULL}, {4, 4, 20, 10, 3, PAD_MASK}, {4, 1, 20, 10, 0, PAD_MASK}, {2, 2, 10, 20, 4, NULL},
    };
    for (size_t n = 0; n < MT_ARRAY_LEN(cases); n++) {
        attn_ctx c = attn_make_v(2, 9, cases[n].nh, cases[n].nkv, cases[n].hd, cases[n].hv, MLA_SCALE,
                                 cases[n].window, cases[n].mask, 200 + n);
        char what[96];
        snprintf(what, sizeof what, "nh=%d nkv=%d hd=%d hv=%d window=%d mask=%d", c.nh, c.nkv, c.hd, c.hd_v, c.window,
                 !!c.mask);
        attn_check_forward(&c, what);
        attn_free(&c);
    }
}

// hd_v < hd is the attention of hd_v = hd with v and dout zero-padded to hd: out's first hd_v
// columns, lse, dq, dk and dv's first hd_v columns agree (to rounding: the products run over
// other lengths), and the padded columns of out and dv stay 0.
Test(model_ops, attention_separate_head_dims_equal_zero_padded_v) {
    const int B = 2, S = 70, nh = 4, nkv = 2, hd = 20, hv = 10, T = B * S;
    attn_ctx c = attn_make_v(B, S, nh, nkv, hd, hv, MLA_SCALE, 0, NULL, 210);
    float *vp = zeros((int64_t)T * nkv * hd), *gp = zeros((int64_t)T * nh * hd);
    for (int r = 0; r < T * nkv; r++) memcpy(vp + (int64_t)r * hd, c.v + (int64_t)r * hv, sizeof(float) * hv);
    for (int r = 0; r < T * nh; r++) memcpy(gp + (int64_t)r * hd, c.g + (int64_t)r * hv, sizeof(float) * hv);
    float *op = zeros((int64_t)T * nh * hd), *lp = zeros(T * nh);
    attn_loss(&c);
    attention_forward_cpu(op, lp, c.q, c.k, vp, NULL, NULL, B, S, nh, nkv, hd, hd, MLA_SCALE, 0);
    float *dq = zeros((int64_t)T * nh * hd), *dk = zeros((int64_t)T * nkv * hd), *dv = zeros((int64_t)T * nkv * hv);
    float *dqp = zeros((int64_t)T * nh * hd), *dkp = zeros((int64_t)T * nkv * hd), *dvp = zeros((int64_t)T * nkv * hd);
    attention_backward_cpu(dq, dk, dv, NULL, c.g, c.q, c.k, c.v, c.out, c.lse, NULL, NULL, B, S, nh, nkv, hd, hv,
                           MLA_SCALE, 0);
    attention_backward_cpu(dqp, dkp, dvp, NULL, gp, c.q, c.k, vp, op, lp, NULL, NULL, B, S, nh, nkv, hd, hd, MLA_SCALE,
                           0);
    for (int r = 0; r < T * nh; r++) {
        cr_assert(fabsf(c.lse[r] - lp[r]) < 1e-5f * (1 + fabsf(lp[r])), "lse[%d] %g vs padded %g", r, c.lse[r], lp[r]);
        for (int e = 0; e < hd; e++) {
            float pad = op[(int64_t)r * hd + e];
            if (e >= hv) cr_assert_eq(pad, 0.0f, "out[%d, %d] past hd_v", r, e);
            else cr_assert(fabsf(c.out[(int64_t)r * hv + e] - pad) < 1e-5f, "out[%d, %d]", r, e);
        }
    }
    float bq = fd_max_abs(dqp, (int64_t)T * nh * hd), bk = fd_max_abs(dkp, (int64_t)T * nkv * hd);
    float bv = fd_max_abs(dvp, (int64_t)T * nkv * hd);
    for (int64_t i = 0; i < (int64_t)T * nh * hd; i++) cr_assert(fabsf(dq[i] - dqp[i]) < 1e-5f * bq, "dq[%lld]", (long long)i);
    for (int64_t i = 0; i < (int64_t)T * nkv * hd; i++) cr_assert(fabsf(dk[i] - dkp[i]) < 1e-5f * bk, "dk[%lld]", (long long)i);
    for (int r = 0; r < T * nkv; r++)
        for (int e = 0; e < hd; e++) {
            float pad = dvp[(int64_t)r * hd + e];
            if (e >= hv) cr_assert_eq(pad, 0.0f, "dv[%d, %d] past hd_v", r, e);
            else cr_assert(fabsf(dv[(int64_t)r * hv + e] - pad) < 1e-5f * bv, "dv[%d, %d]", r, e);
        }
    free(vp), free(gp), free(op), free(lp), free(dq), free(dk), free(dv), free(dqp), free(dkp), free(dvp);
    attn_free(&c);
}

// The tiled kernels against the scalar reference with hd ≠ hd_v at block-cutting sizes: MLA's
// 192 | 128 scaled down to 48 | 32 (one kv head per query head, as MLA expands them), hd_v > hd,
// windows, padding longer than a block, and sinks.
Test(model_ops, attention_separate_head_dims_tiled_matches_scalar_reference) {
    enum { S = 200 };
    uint8_t pad[2 * S];
    for (int i = 0; i < 2 * S; i++) pad[i] = !(i >= S && i < S + 70) && i % 11 != 3;
    attn_vs_ref_mla(2, 65, 4, 2, 20, 10, MLA_SCALE, 0, NULL, 220, 0);
    attn_vs_ref_mla(2, S, 4, 4, 48, 32, mla_scale(48), 70, pad, 221, 0);
    attn_vs_ref_mla(1, S, 2, 1, 10, 20, MLA_SCALE, 5, NULL, 222, 0);
    attn_vs_ref_mla(2, S, 4, 2, 20, 10, MLA_SCALE, 0, pad, 223, 1);
}

// Finite differences with hd = 20, hd_v = 10 and the scale 0.37: dq, dk, dv (and dsinks).
static void attn_check_backward_mla(int nh, int nkv, int window, const uint8_t *mask, uint64_t seed, int sinks) {
    const int hd = 20, hv = 10;
    attn_ctx c = attn_make_v(2, 9, nh, nkv, hd, hv, MLA_SCALE, window, mask, seed);
    if (sinks) c.sinks = randn(nh, seed + 4, 1.0f);
    int64_t nq = 18 * nh * hd, nk = 18 * nkv * hd, nv = 18 * nkv * hv;
    float *dq = zeros(nq), *dk = zeros(nk), *dv = zeros(nv), *ds = zeros(nh);
    attn_loss(&c);
    attention_backward_cpu(dq, dk, dv, sinks ? ds : NULL, c.g, c.q, c.k, c.v, c.out, c.lse, c.sinks, mask, 2, 9, nh, nkv,
                           hd, hv, MLA_SCALE, window);
    char what[80];
    snprintf(what, sizeof what, "hd 20 hd_v 10 nh=%d nkv=%d window=%d sinks=%d: dq", nh, nkv, window, sinks);
    check_grad(attn_loss, &c, c.q, dq, nq, what);
    snprintf(what, sizeof what, "hd 20 hd_v 10 nh=%d nkv=%d window=%d sinks=%d: dk", nh, nkv, window, sinks);
    check_grad(attn_loss, &c, c.k, dk, nk, what);
    snprintf(what, sizeof what, "hd 20 hd_v 10 nh=%d nkv=%d window=%d sinks=%d: dv", nh, nkv, window, sinks);
    check_grad(attn_loss, &c, c.v, dv, nv, what);
    if (sinks) check_grad(attn_loss, &c, c.sinks, ds, nh, "hd 20 hd_v 10: dsinks");
    free(dq), free(dk), free(dv), free(ds), free(c.sinks);
    attn_free(&c);
}

Test(model_ops, attention_separate_head_dims_backward_fd) {
    attn_check_backward_mla(4, 2, 4, PAD_MASK, 230, 0);
    attn_check_backward_mla(4, 4, 0, NULL, 231, 0);
    attn_check_backward_mla(2, 1, 0, PAD_MASK, 232, 1);
}

// ---------------------------------------------------------------------------------------------
// MLA's key and value assembly (model/mla.c)

// k = kvb's no-rope part | krot (one vector per token for every head), v = kvb's rest, with krot a
// slice of wider rows (kv_a_proj_with_mqa's [T, kv_lora_rank + rope]): copies, bit for bit. The
// backward against the hand loops, bit for bit (heads summed in order, then added), onto non-zero
// starting gradients; the rest of dkrot's rows untouched; NULL gradients skipped.
Test(model_ops, mla_kv_assembly_forward_backward_against_loops) {
    enum { T = 7, NH = 3, NOPE = 5, ROPE = 4, VD = 6, LORA = 9, LD = LORA + ROPE };
    float *kva = randn(T * LD, 240, 1), *kvb = randn(T * NH * (NOPE + VD), 241, 1);
    float *k = zeros(T * NH * (NOPE + ROPE)), *v = zeros(T * NH * VD);
    mla_kv_forward_cpu(k, v, kvb, kva + LORA, LD, T, NH, NOPE, ROPE, VD);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < NH; h++) {
            const float *src = kvb + (t * NH + h) * (NOPE + VD), *kr = k + (t * NH + h) * (NOPE + ROPE);
            for (int e = 0; e < NOPE; e++) cr_assert_eq(kr[e], src[e], "k[%d, %d, %d]", t, h, e);
            for (int e = 0; e < ROPE; e++) cr_assert_eq(kr[NOPE + e], kva[t * LD + LORA + e], "k[%d, %d, rope %d]", t, h, e);
            for (int e = 0; e < VD; e++) cr_assert_eq(v[(t * NH + h) * VD + e], src[NOPE + e], "v[%d, %d, %d]", t, h, e);
        }
    float *dk = randn(T * NH * (NOPE + ROPE), 242, 1), *dv = randn(T * NH * VD, 243, 1);
    float *dkvb = randn(T * NH * (NOPE + VD), 244, 1), *dkva = randn(T * LD, 245, 1);
    float *want_kvb = zeros(T * NH * (NOPE + VD)), *want_kva = zeros(T * LD);
    memcpy(want_kvb, dkvb, sizeof(float) * T * NH * (NOPE + VD));
    memcpy(want_kva, dkva, sizeof(float) * T * LD);
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < NH; h++) {
            float *g = want_kvb + (t * NH + h) * (NOPE + VD);
            for (int e = 0; e < NOPE; e++) g[e] += dk[(t * NH + h) * (NOPE + ROPE) + e];
            for (int e = 0; e < VD; e++) g[NOPE + e] += dv[(t * NH + h) * VD + e];
        }
        for (int e = 0; e < ROPE; e++) {
            float s = 0.0f;
            for (int h = 0; h < NH; h++) s += dk[(t * NH + h) * (NOPE + ROPE) + NOPE + e];
            want_kva[t * LD + LORA + e] += s;
        }
    }
    mla_kv_backward_cpu(NULL, NULL, dk, dv, LD, T, NH, NOPE, ROPE, VD);  // nothing wanted
    mla_kv_backward_cpu(dkvb, dkva + LORA, dk, dv, LD, T, NH, NOPE, ROPE, VD);
    cr_assert(memcmp(dkvb, want_kvb, sizeof(float) * T * NH * (NOPE + VD)) == 0, "dkvb differs from the loops");
    cr_assert(memcmp(dkva, want_kva, sizeof(float) * T * LD) == 0, "dkrot (or the rest of its rows) differs");
    free(kva), free(kvb), free(k), free(v), free(dk), free(dv), free(dkvb), free(dkva), free(want_kvb), free(want_kva);
}

// ---------------------------------------------------------------------------------------------
// cross-entropy

Test(model_ops, cross_entropy_uniform_logits_give_log_v) {
    enum { T = 4, V = 50 };
    float logits[T * V], dl[T * V] = {0};
    for (int i = 0; i < T * V; i++) logits[i] = 3.25f;
    int32_t tgt[T] = {0, 49, -100, 7};
    int64_t n = -1;
    double loss = cross_entropy_cpu(dl, 1.0f, &n, logits, tgt, T, V, -100);
    cr_assert_eq(n, 3);
    cr_assert(fabs(loss - 3 * log(V)) < 1e-5, "loss %.9g vs 3 log V %.9g", loss, 3 * log(V));
    for (int v = 0; v < V; v++) cr_assert_float_eq(dl[3 * V + v], v == 7 ? 1.0 / V - 1 : 1.0 / V, 1e-7);
}

// Row by row in double, skipping ignored rows.
static double ce_ref(const float *logits, const int32_t *tgt, int T, int V, int ignore) {
    double loss = 0;
    for (int t = 0; t < T; t++) {
        if (tgt[t] == ignore) continue;
        double m = -INFINITY, z = 0;
        for (int v = 0; v < V; v++) m = fmax(m, logits[t * V + v]);
        for (int v = 0; v < V; v++) z += exp(logits[t * V + v] - m);
        loss += m + log(z) - logits[t * V + tgt[t]];
    }
    return loss;
}

Test(model_ops, cross_entropy_matches_reference_ignored_rows_contribute_nothing) {
    enum { T = 6, V = 33 };
    float *logits = randn(T * V, 90, 3), *dl = zeros(T * V);
    for (int v = 0; v < V; v++) logits[2 * V + v] += 1e4f;  // large offset: stays finite
    int32_t tgt[T] = {5, -1, 32, 0, -1, 17};
    int64_t n;
    double loss = cross_entropy_cpu(dl, 0.5f, &n, logits, tgt, T, V, -1);
    cr_assert_eq(n, 4);
    double ref = ce_ref(logits, tgt, T, V, -1);
    cr_assert(fabs(loss - ref) < 1e-5 * (1 + fabs(ref)), "loss %.9g vs %.9g", loss, ref);
    for (int v = 0; v < V; v++) cr_assert(dl[1 * V + v] == 0 && dl[4 * V + v] == 0, "ignored rows untouched");
    for (int t = 0; t < T; t++) {  // each counted row's gradient sums to 0: dscale·(1 − 1)
        double s = 0;
        for (int v = 0; v < V; v++) s += dl[t * V + v];
        cr_assert(fabs(s) < 1e-6, "row %d sums to %g", t, s);
    }
    // Changing an ignored row changes nothing; NULL dlogits just computes the loss.
    for (int v = 0; v < V; v++) logits[4 * V + v] = 1e30f;
    cr_assert_eq(cross_entropy_cpu(NULL, 0.5f, &n, logits, tgt, T, V, -1), loss);
    int32_t none[T] = {-1, -1, -1, -1, -1, -1};
    cr_assert_eq(cross_entropy_cpu(dl, 1.0f, &n, logits, none, T, V, -1), 0.0);
    cr_assert_eq(n, 0);
    free(logits), free(dl);
}

typedef struct { int T, V; float *logits; const int32_t *tgt; float dscale; } ce_ctx;
static double ce_loss(void *p) {
    ce_ctx *c = p;
    int64_t n;
    return c->dscale * cross_entropy_cpu(NULL, 0, &n, c->logits, c->tgt, c->T, c->V, -100);
}

Test(model_ops, cross_entropy_backward_fd_with_ignored_targets) {
    enum { T = 5, V = 11 };
    float *logits = randn(T * V, 91, 2), *dl = zeros(T * V);
    int32_t tgt[T] = {3, -100, 10, 0, -100};
    int64_t n;
    cross_entropy_cpu(dl, 1.0f / 3, &n, logits, tgt, T, V, -100);
    cr_assert_eq(n, 3);
    ce_ctx c = {T, V, logits, tgt, 1.0f / 3};
    check_grad(ce_loss, &c, logits, dl, T * V, "cross-entropy dlogits");
    free(logits), free(dl);
}

// In place (the model's backward): the gradient replaces the logits, ignored rows become 0; the
// same loss and the same gradient bits as into a zeroed buffer of its own.
Test(model_ops, cross_entropy_in_place_replaces_the_logits) {
    enum { T = 5, V = 37 };
    float logits[T * V], inplace[T * V], dl[T * V];
    int32_t tgt[T] = {3, -100, 36, 0, -100};
    for (int i = 0; i < T * V; i++) logits[i] = inplace[i] = (float)((i * 7919) % 101) / 13.0f - 3.0f, dl[i] = 0;
    int64_t n1, n2;
    double a = cross_entropy_cpu(dl, 0.25f, &n1, logits, tgt, T, V, -100);
    double b = cross_entropy_cpu(inplace, 0.25f, &n2, inplace, tgt, T, V, -100);
    cr_assert_eq(a, b);
    cr_assert_eq(n1, 3);
    cr_assert_eq(n2, 3);
    cr_assert_eq(memcmp(dl, inplace, sizeof dl), 0, "the in-place gradient differs from the separate one");
}

Test(model_ops, cross_entropy_target_out_of_range_is_fatal, .exit_code = MT_EXIT_ERROR) {
    float logits[2 * 4] = {0};
    int32_t tgt[2] = {1, 4};
    int64_t n;
    cr_log_info("expect a fatal error about row 1, target 4");
    cross_entropy_cpu(NULL, 1, &n, logits, tgt, 2, 4, -100);
}

// ---------------------------------------------------------------------------------------------
// every backward ACCUMULATES: running it twice gives twice the gradient

Test(model_ops, backwards_accumulate) {
    enum { T = 4, H = 8 };
    float *x = randn(T * H, 100, 1), *w = randn(H, 101, 1), *g = randn(T * H, 102, 1);
    float y[T * H], rstd[T], dx1[T * H] = {0}, dw1[H] = {0}, dx2[T * H] = {0}, dw2[H] = {0};
    rmsnorm_forward_cpu(y, rstd, x, w, T, H, 1e-6f);
    rmsnorm_backward_cpu(dx1, dw1, g, x, w, rstd, T, H);
    rmsnorm_backward_cpu(dx2, dw2, g, x, w, rstd, T, H);
    rmsnorm_backward_cpu(dx2, dw2, g, x, w, rstd, T, H);
    for (int i = 0; i < T * H; i++) cr_assert_float_eq(dx2[i], 2 * dx1[i], 1e-5);
    for (int i = 0; i < H; i++) cr_assert_float_eq(dw2[i], 2 * dw1[i], 1e-5);

    attn_ctx c = attn_make(1, 5, 2, 1, 4, 0, NULL, 103);  // q [5, 2, 4], k and v [5, 1, 4]
    float dq1[40] = {0}, dk1[20] = {0}, dv1[20] = {0}, dq2[40] = {0}, dk2[20] = {0}, dv2[20] = {0};
    attn_loss(&c);
    attention_backward_cpu(dq1, dk1, dv1, NULL, c.g, c.q, c.k, c.v, c.out, c.lse, NULL, NULL, 1, 5, 2, 1, 4, 4, SC(4), 0);
    for (int r = 0; r < 2; r++)
        attention_backward_cpu(dq2, dk2, dv2, NULL, c.g, c.q, c.k, c.v, c.out, c.lse, NULL, NULL, 1, 5, 2, 1, 4, 4, SC(4), 0);
    for (int i = 0; i < 40; i++) cr_assert_float_eq(dq2[i], 2 * dq1[i], 1e-5);
    for (int i = 0; i < 20; i++) {
        cr_assert_float_eq(dk2[i], 2 * dk1[i], 1e-5);
        cr_assert_float_eq(dv2[i], 2 * dv1[i], 1e-5);
    }
    attn_free(&c);

    int32_t tgt[T] = {1, 2, 3, 4};
    float dl1[T * H] = {0}, dl2[T * H] = {0};
    int64_t n;
    cross_entropy_cpu(dl1, 1, &n, x, tgt, T, H, -100);
    cross_entropy_cpu(dl2, 1, &n, x, tgt, T, H, -100);
    cross_entropy_cpu(dl2, 1, &n, x, tgt, T, H, -100);
    for (int i = 0; i < T * H; i++) cr_assert_float_eq(dl2[i], 2 * dl1[i], 1e-6);
    free(x), free(w), free(g);
}

// ---------------------------------------------------------------------------------------------
// core/vmath.h

// mt_vexpf against libm's exp in double: within 3e-7 relative over the range the kernels use,
// exactly 0 for −inf and below −87, saturated past 88.37, and vectorized loops give the scalar bits.
#include "core/vmath.h"

Test(model_ops, vexpf_matches_exp) {
    double worst = 0;
    for (int i = -870000; i <= 883700; i++) {
        float x = i * 1e-4f;
        double want = exp((double)x), got = mt_vexpf(x);
        if (x < -87.0f) continue;
        double rel = fabs(got - want) / want;
        if (rel > worst) worst = rel;
    }
    cr_assert(worst < 3e-7, "worst relative error %g", worst);
    cr_assert_eq(mt_vexpf(-INFINITY), 0.0f);
    cr_assert_eq(mt_vexpf(-87.5f), 0.0f);
    cr_assert_eq(mt_vexpf(-1e30f), 0.0f);
    cr_assert_eq(mt_vexpf(0.0f), 1.0f);
    cr_assert(mt_vexpf(89.0f) > 1e38f && mt_vexpf(INFINITY) > 1e38f && mt_vexpf(1e30f) > 1e38f);
    enum { N = 1000 };
    float x[N], y[N];
    for (int i = 0; i < N; i++) x[i] = -100.0f + 0.19f * i;
#pragma omp simd
    for (int i = 0; i < N; i++) y[i] = mt_vexpf(x[i]);
    for (int i = 0; i < N; i++) cr_assert_eq(y[i], mt_vexpf(x[i]), "x=%g", x[i]);
}

// core/gemm.h: every CPU GEMM gives the same bits at 1, 2 and 3 threads, and the right product.
// Odd shapes (edges that are not multiples of the block alignment), every transpose, strided
// operands, beta 0 and 1; cut into blocks along rows and along columns (in 2, and in 4 for 3
// threads), and not cut (one sgemm large enough that OpenBLAS would split it over its threads).
Test(model_ops, gemm_same_bits_at_any_thread_count_on_odd_shapes) {
    const struct { int m, n, k, ta, tb, pad; float beta; } cases[] = {
        {1037, 301, 29, 0, 1, 0, 0.0f}, {515, 1531, 67, 1, 0, 3, 1.0f}, {777, 555, 57, 0, 0, 5, 1.0f},
        {263, 2049, 33, 1, 1, 1, 0.0f}, {2051, 17, 301, 0, 1, 0, 1.0f}, {300, 203, 101, 0, 1, 2, 1.0f},
        {509, 64, 200, 1, 0, 0, 0.0f}, {16411, 9, 120, 1, 1, 3, 1.0f},
    };
    mt_rng rng;
    mt_rng_seed(&rng, 77, 0);
    int saved = omp_get_max_threads(), cut_rows = 0, cut_cols = 0, whole = 0, many = 0;
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        int m = cases[ci].m, n = cases[ci].n, k = cases[ci].k, ta = cases[ci].ta, tb = cases[ci].tb;
        int lda = (ta ? m : k) + cases[ci].pad, ldb = (tb ? k : n) + cases[ci].pad, ldc = n + cases[ci].pad;
        size_t na = (size_t)(ta ? k : m) * lda, nb = (size_t)(tb ? n : k) * ldb, nc = (size_t)m * ldc;
        float *a = zeros((int64_t)na), *b = zeros((int64_t)nb), *c0 = zeros((int64_t)nc), *c[3];
        for (size_t i = 0; i < na; i++) a[i] = mt_rng_uniform(&rng) * 2 - 1;
        for (size_t i = 0; i < nb; i++) b[i] = mt_rng_uniform(&rng) * 2 - 1;
        for (size_t i = 0; i < nc; i++) c0[i] = mt_rng_uniform(&rng) * 2 - 1;
        for (int t = 0; t < 3; t++) {
            omp_set_num_threads(t + 1);
            c[t] = zeros((int64_t)nc);
            memcpy(c[t], c0, nc * sizeof(float));
            mt_sgemm(ta, tb, m, n, k, 0.5f, a, lda, b, ldb, cases[ci].beta, c[t], ldc);
        }
        omp_set_num_threads(saved);
        int by_rows, blocks, step;
        mt_sgemm_blocks(m, n, k, &by_rows, &blocks, &step);
        cut_rows += blocks > 1 && by_rows, cut_cols += blocks > 1 && !by_rows, whole += blocks == 1, many += blocks > 3;
        for (int t = 1; t < 3; t++)
            cr_assert(memcmp(c[0], c[t], nc * sizeof(float)) == 0, "case %zu (%dx%dx%d): bits differ at %d threads", ci,
                      m, n, k, t + 1);
        double worst = 0;
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                double s = 0;
                for (int p = 0; p < k; p++)
                    s += (double)(ta ? a[(size_t)p * lda + i] : a[(size_t)i * lda + p]) *
                         (tb ? b[(size_t)j * ldb + p] : b[(size_t)p * ldb + j]);
                double want = 0.5 * s + cases[ci].beta * c0[(size_t)i * ldc + j];
                worst = fmax(worst, fabs(c[0][(size_t)i * ldc + j] - want));
            }
        cr_assert_lt(worst, 1e-4 * k, "case %zu: worst error %g", ci, worst);
        for (int i = 0; i < m; i++)  // the padding past n is left alone
            for (int j = n; j < ldc; j++) cr_assert_eq(c[0][(size_t)i * ldc + j], c0[(size_t)i * ldc + j]);
        free(a), free(b), free(c0);
        for (int t = 0; t < 3; t++) free(c[t]);
    }
    cr_assert(cut_rows && cut_cols && whole && many, "cut along rows in %d cases, columns in %d, not cut in %d, in 4+ in %d",
              cut_rows, cut_cols, whole, many);
}
