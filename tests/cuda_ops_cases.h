// tests/cuda_ops_cases.h — the CUDA-vs-CPU parity cases of model/ops_cuda.h, written once for the
// Criterion suite (tests/test_cuda_ops.c) and the standalone program (scripts/cuda_parity.c).
//
// Each case draws fresh random inputs (a fixed seed per case, so a failure reproduces), runs the
// CPU twin and the CUDA op on the same values, and returns the worst normalised error over its
// outputs: max |got − want| / max |want| per output (integer outputs: the count of mismatches;
// the bf16 cases of model/ops.h: error / tolerance, see there).
// Include only in CUDA builds (MT_CUDA). Define CUDA_OPS_NO_HOST_LIBS where lora/lora.c and
// optim/optim.c are not linked (no OpenBLAS / cJSON): the LoRA and AdamW cases then report
// themselves skipped.
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/common.h"
#include "model/ops.h"
#include "model/ops_cuda.h"
#include "model/rope.h"
#include "model/attention_cudnn.h"
#include "optim/optim_cuda.h"
#include "moe/moe.h"
#ifndef CUDA_OPS_NO_HOST_LIBS
#include "lora/lora.h"
#include "optim/optim.h"
#endif

#define CUDA_OPS_TOL 1e-4  // fp32 paths (docs/design.md, "What counts as right")

typedef struct {
    char what[160];  // the worst output and where
    double err;      // worst normalised error (or mismatch count) over the outputs
    double tol;
    int skipped;     // 1: not run (why in `what`)
    int outputs;     // outputs compared so far
} co_result;

static co_result co_begin(void) {
    co_result r;
    memset(&r, 0, sizeof r);
    r.tol = CUDA_OPS_TOL;
    snprintf(r.what, sizeof r.what, "no output");
    return r;
}

// ---------------------------------------------------------------------------------------------
// Host data and device copies

static uint64_t co_rng = 1;
static void co_seed(uint64_t s) { co_rng = s * 0x9e3779b97f4a7c15ull + 1; }
static uint32_t co_next(void) {
    co_rng = co_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(co_rng >> 32);
}
static float co_uniform(float lo, float hi) { return lo + (hi - lo) * (float)((co_next() >> 8) * (1.0 / 16777216.0)); }
static int co_int(int n) { return (int)(co_next() % (uint32_t)n); }

static float *co_rand(size_t n, float lo, float hi) {
    float *x = mt_xmalloc(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; i++) x[i] = co_uniform(lo, hi);
    return x;
}
static float *co_copy(const float *x, size_t n) {
    float *y = mt_xmalloc(n * sizeof(float) + 1);
    memcpy(y, x, n * sizeof(float));
    return y;
}

// Device memory of `be` holding `bytes` of host (or zeros when host is NULL).
static void *co_up(mt_backend *be, const void *host, size_t bytes) {
    void *d = NULL;
    if (mt_backend_alloc(be, MT_MEM_ACT, bytes ? bytes : 1, &d) != 0) mt_fatal(MT_EXIT_OOM, "%s", mt_error_get());
    if (host) be->ops->upload(be, d, host, bytes);
    else be->ops->fill_zero(be, d, bytes ? bytes : 1);
    return d;
}
static void co_down(mt_backend *be, void *host, const void *dev, size_t bytes) { be->ops->download(be, host, dev, bytes); }
static void co_free(mt_backend *be, void *dev, size_t bytes) { mt_backend_release(be, MT_MEM_ACT, bytes ? bytes : 1, dev); }

// Downloads n floats of `dev` and compares them with `want`; keeps the worst output in r.
static void co_cmp_dev(co_result *r, mt_backend *be, const char *label, const void *dev, const float *want, size_t n) {
    float *got = mt_xmalloc(n * sizeof(float) + 1);
    co_down(be, got, dev, n * sizeof(float));
    double maxd = 0, maxw = 0;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d;
        if (isinf(want[i]) || isinf(got[i])) d = got[i] == want[i] ? 0.0 : INFINITY;  // lse = -inf must match
        else d = fabs((double)got[i] - want[i]);
        if (!(d <= maxd)) maxd = d, worst = i;  // NaN counts as worst
        if (isfinite(want[i]) && fabs(want[i]) > maxw) maxw = fabs(want[i]);
    }
    double err = maxd / (maxw > 0 ? maxw : 1.0);
    if (r->outputs++ == 0 || !(err <= r->err)) {
        r->err = err;
        snprintf(r->what, sizeof r->what, "%s[%zu] got %.7g want %.7g", label, worst, n ? got[worst] : 0.0f,
                 n ? want[worst] : 0.0f);
    }
    free(got);
}

// Integer outputs must match exactly: the error is the number of mismatches.
static void co_cmp_dev_i32(co_result *r, mt_backend *be, const char *label, const void *dev, const int32_t *want,
                           size_t n) {
    int32_t *got = mt_xmalloc(n * sizeof(int32_t) + 1);
    co_down(be, got, dev, n * sizeof(int32_t));
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i] && bad++ == 0) first = i;
    if (r->outputs++ == 0 || (double)bad > r->err) {
        r->err = (double)bad;
        if (bad) snprintf(r->what, sizeof r->what, "%s: %zu mismatches, first [%zu] got %d want %d", label, bad, first,
                          got[first], want[first]);
        else snprintf(r->what, sizeof r->what, "%s exact", label);
    }
    free(got);
}

static void co_cmp_scalar(co_result *r, const char *label, double got, double want) {
    double err = fabs(got - want) / (fabs(want) > 0 ? fabs(want) : 1.0);
    if (r->outputs++ == 0 || !(err <= r->err)) {
        r->err = err;
        snprintf(r->what, sizeof r->what, "%s got %.10g want %.10g", label, got, want);
    }
}

// ---------------------------------------------------------------------------------------------
// model/ops.h, on bf16 storage (the dtype rule): the CUDA op runs on bf16 buffers, its fp32 CPU
// twin on the same bf16-rounded values (as f32). bf16 keeps 8 significant bits (7 stored), so
// one rounding to nearest errs by at most half an ulp: 2^-8 ≈ 3.9e-3 relative at worst (just
// above a power of two), about 1.6e-3 in relative RMS over uniformly spread values (seen: 1.6e-3
// to 1.8e-3 in these cases). (2^-9 ≈ 2e-3 is the typical error, not the bound.)
//
// Each output is checked against a tolerance `tol` stated at its case by two measures that must
// both be ≤ tol: the relative L2 error ‖got − want‖ / ‖want‖, and the worst element |got − want|
// / max |want| (so that one wrong element among many is not averaged away). These cases set
// r.tol = 1 and r.err to the worst measure / tolerance. tol 0: bit for bit (a NaN matches any NaN).

// One rounding of each output element: both measures ≤ 2^-8 ≈ 3.9e-3 by the bound above, on top
// of fp32 results that differ from the CPU's by summation order only (< 1e-4 in the fp32 tests):
// 5e-3. A wrong formula, a lost accumulation or a sum rounded term by term gives far more.
#define CB_ONE_ROUNDING 5e-3
#define CB_FP32 CUDA_OPS_TOL  // fp32 outputs (rstd, lse) from the same bf16 inputs: order only
#define CB_EXACT 0.0          // copies, and a single add or cast of the same fp32 values

static float cb_r(float x) { return mt_bf16_to_f32(mt_f32_to_bf16(x)); }
static uint32_t cb_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
// n random values in [lo, hi), rounded to bf16 (held as f32).
static float *cb_rand(size_t n, float lo, float hi) {
    float *x = co_rand(n, lo, hi);
    for (size_t i = 0; i < n; i++) x[i] = cb_r(x[i]);
    return x;
}
// A bf16 device copy of n floats (rounded to nearest even).
static void *cb_up(mt_backend *be, const float *x, size_t n) {
    uint16_t *h = mt_xmalloc(n * 2 + 2);
    for (size_t i = 0; i < n; i++) h[i] = mt_f32_to_bf16(x[i]);
    void *d = co_up(be, h, n * 2);
    free(h);
    return d;
}
// n elements of a bf16 (bf16 = 1) or f32 device buffer, as f32.
static float *cb_down(mt_backend *be, const void *dev, size_t n, int bf16) {
    float *f = mt_xmalloc(n * 4 + 4);
    if (bf16) {
        uint16_t *h = mt_xmalloc(n * 2 + 2);
        co_down(be, h, dev, n * 2);
        for (size_t i = 0; i < n; i++) f[i] = mt_bf16_to_f32(h[i]);
        free(h);
    } else {
        co_down(be, f, dev, n * 4);
    }
    return f;
}
// The scale of a gradient for its non-zero starting values: its root mean square, at least 1e-3
// (a gradient that is zero in exact arithmetic, e.g. dq with window 1, is fp32 noise of ~1e-8
// on either side: starting values of 1e-3 keep that noise at ~1e-5 relative).
static float cb_scale(const float *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return (float)fmax(n ? sqrt(s / (double)n) : 0.0, 1e-3);
}

static void cb_check(co_result *r, const char *label, const float *got, const float *want, size_t n, double tol) {
    double d2 = 0, w2 = 0, maxd = 0, maxw = 0, err;
    size_t worst = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        double d;
        if (isnan(want[i]) || isnan(got[i])) d = isnan(want[i]) && isnan(got[i]) ? 0.0 : INFINITY;
        else if (isinf(want[i]) || isinf(got[i])) d = got[i] == want[i] ? 0.0 : INFINITY;  // lse = -inf must match
        else d = fabs((double)got[i] - want[i]);
        if (tol == 0 && d != 0 && bad++ == 0) worst = i;
        if (tol != 0 && !(d <= maxd)) maxd = d, worst = i;
        if (isfinite(d)) d2 += d * d;
        else d2 = INFINITY;
        if (isfinite(want[i])) w2 += (double)want[i] * want[i], maxw = fmax(maxw, fabs(want[i]));
    }
    double l2 = sqrt(d2) / (w2 > 0 ? sqrt(w2) : 1.0), mx = maxd / (maxw > 0 ? maxw : 1.0);
    err = tol == 0 ? (bad ? INFINITY : 0.0) : fmax(l2, mx) / tol;
    if (r->outputs++ == 0 || !(err <= r->err)) {
        r->err = err;
        if (tol == 0)
            snprintf(r->what, sizeof r->what, "%s: %zu of %zu not bit for bit, first [%zu] got %.7g want %.7g", label,
                     bad, n, worst, n ? got[worst] : 0.0f, n ? want[worst] : 0.0f);
        else
            snprintf(r->what, sizeof r->what, "%s: rel L2 %.2e, max %.2e (tol %.0e) [%zu] got %.7g want %.7g",
                     label, l2, mx, tol, worst, n ? got[worst] : 0.0f, n ? want[worst] : 0.0f);
    }
}
// Downloads a bf16 (bf16 = 1) or f32 device output and checks it.
static void cb_cmp(co_result *r, mt_backend *be, const char *label, const void *dev, const float *want, size_t n,
                   int bf16, double tol) {
    float *got = cb_down(be, dev, n, bf16);
    cb_check(r, label, got, want, n, tol);
    free(got);
}
static co_result cb_begin(uint64_t seed) {
    co_result r = co_begin();
    r.tol = 1.0;  // r.err is error / tolerance
    co_seed(seed);
    return r;
}

// Forward: a copy (bit for bit). Backward: the rows of a repeated token summed in fp32 in row
// order onto the starting dwte, as the CPU does, then rounded once: rn(CPU's sum), bit for bit.
// V − 2 < T: tokens repeat (across blocks of 256 rows when T is larger), rows V − 1 of wte gets
// none, V − 2 one only (on the last row).
static co_result co_embedding(mt_backend *g, int T, int H, int V, uint64_t seed) {
    co_result r = cb_begin(seed);
    int32_t *tok = mt_xmalloc((size_t)T * 4);
    for (int t = 0; t < T; t++) tok[t] = co_int(V - 2);
    tok[T - 1] = V - 2;
    size_t nw = (size_t)V * H, no = (size_t)T * H;
    float *wte = cb_rand(nw, -1, 1), *dout = cb_rand(no, -1, 1), *dwte = cb_rand(nw, -1, 1), *out = co_rand(no, 0, 0);
    void *TK = co_up(g, tok, (size_t)T * 4), *W = cb_up(g, wte, nw), *DO = cb_up(g, dout, no), *O = co_up(g, NULL, no * 2);
    void *DW = cb_up(g, dwte, nw);
    embedding_forward_cpu(out, tok, wte, T, H);
    embedding_backward_cpu(dwte, dout, tok, T, H);
    for (size_t i = 0; i < nw; i++) dwte[i] = cb_r(dwte[i]);
    embedding_forward_cuda(g, O, TK, W, T, H);
    embedding_backward_cuda(g, DW, DO, TK, T, H);
    embedding_backward_cuda(g, NULL, DO, TK, T, H);  // a frozen embedding: nothing to do
    cb_cmp(&r, g, "out", O, out, no, 1, CB_EXACT);
    cb_cmp(&r, g, "dwte", DW, dwte, nw, 1, CB_EXACT);
    co_free(g, TK, (size_t)T * 4), co_free(g, W, nw * 2), co_free(g, DO, no * 2), co_free(g, O, no * 2);
    co_free(g, DW, nw * 2);
    free(tok), free(wte), free(dout), free(dwte), free(out);
    return r;
}

// y, dx, dw: one rounding each (dw reduced over T in fp32 first). rstd fp32. Then dw alone
// (dx = NULL) must give the same bits as with dx.
static co_result co_rmsnorm(mt_backend *g, int T, int H, uint64_t seed) {
    co_result r = cb_begin(seed);
    size_t n = (size_t)T * H;
    float *x = cb_rand(n, -2, 2), *w = cb_rand(H, 0.5f, 1.5f), *dy = cb_rand(n, -1, 1);
    float *y = co_rand(n, 0, 0), *rstd = co_rand(T, 0, 0), *dx = cb_rand(n, -1, 1), *dw = cb_rand(H, -1, 1);
    void *X = cb_up(g, x, n), *W = cb_up(g, w, H), *DY = cb_up(g, dy, n), *Y = co_up(g, NULL, n * 2);
    void *R = co_up(g, NULL, T * 4), *DX = cb_up(g, dx, n), *DW = cb_up(g, dw, H), *DW2 = cb_up(g, dw, H);
    rmsnorm_forward_cpu(y, rstd, x, w, T, H, 1e-5f);
    rmsnorm_backward_cpu(dx, dw, dy, x, w, rstd, T, H);
    rmsnorm_forward_cuda(g, Y, R, X, W, T, H, 1e-5f);
    rmsnorm_backward_cuda(g, DX, DW, DY, X, W, R, T, H);
    rmsnorm_backward_cuda(g, NULL, DW2, DY, X, W, R, T, H);
    rmsnorm_backward_cuda(g, NULL, NULL, DY, X, W, R, T, H);  // both skipped
    cb_cmp(&r, g, "y", Y, y, n, 1, CB_ONE_ROUNDING);
    cb_cmp(&r, g, "rstd", R, rstd, T, 0, CB_FP32);
    cb_cmp(&r, g, "dx", DX, dx, n, 1, CB_ONE_ROUNDING);
    cb_cmp(&r, g, "dw", DW, dw, H, 1, CB_ONE_ROUNDING);
    float *dw1 = cb_down(g, DW, H, 1);
    cb_cmp(&r, g, "dw (dx = NULL) vs dw", DW2, dw1, H, 1, CB_EXACT);
    co_free(g, X, n * 2), co_free(g, W, H * 2), co_free(g, DY, n * 2), co_free(g, Y, n * 2);
    co_free(g, R, T * 4), co_free(g, DX, n * 2), co_free(g, DW, H * 2), co_free(g, DW2, H * 2);
    free(x), free(w), free(dy), free(y), free(rstd), free(dx), free(dw), free(dw1);
    return r;
}

// A rotation: one rounding per element. yarn: gpt-oss's YaRN table (factor 32, scale ≈ 1.35),
// else the default one of theta 1e6 (model/rope.h). nh heads of `stride` dims, of which [off, off +
// rot) turn, pairs (j, j + rot/2) or interleaved (2j, 2j + 1); the rest stay (bit for bit on both).
static co_result co_rope_part(mt_backend *g, int yarn, int nh, int stride, int off, int rot, int inter,
                              uint64_t seed) {
    co_result r = cb_begin(seed);
    const int T = 19;
    size_t n = (size_t)T * nh * stride;
    int32_t pos[19];
    for (int t = 0; t < T; t++) pos[t] = co_int(yarn ? 131072 : 4096);
    mt_rope_params p = {.yarn = yarn, .hd = rot, .theta = yarn ? 150000.0 : 1e6, .factor = 32, .beta_fast = 32,
                        .beta_slow = 1, .original_max = 4096, .truncate = 0};
    float inv[128], scale;
    if (rot > 256 || mt_rope_table(&p, inv, &scale) != 0) mt_fatal(MT_EXIT_ERROR, "%s", mt_error_get());
    const size_t ni = (size_t)rot / 2 * sizeof(float);
    float *x = cb_rand(n, -1, 1), *dx = cb_rand(n, -1, 1);
    void *P = co_up(g, pos, sizeof pos), *X = cb_up(g, x, n), *DX = cb_up(g, dx, n), *I = co_up(g, inv, ni);
    rope_forward_cpu(x, pos, T, nh, stride, off, rot, inter, inv, scale);
    rope_backward_cpu(dx, pos, T, nh, stride, off, rot, inter, inv, scale);
    rope_forward_cuda(g, X, P, T, nh, stride, off, rot, inter, I, scale);
    rope_backward_cuda(g, DX, P, T, nh, stride, off, rot, inter, I, scale);
    cb_cmp(&r, g, "x", X, x, n, 1, CB_ONE_ROUNDING);
    cb_cmp(&r, g, "dx", DX, dx, n, 1, CB_ONE_ROUNDING);
    co_free(g, P, sizeof pos), co_free(g, X, n * 2), co_free(g, DX, n * 2), co_free(g, I, ni);
    free(x), free(dx);
    return r;
}
static co_result co_rope_table(mt_backend *g, int yarn, uint64_t seed) { return co_rope_part(g, yarn, 3, 64, 0, 64, 0, seed); }
static co_result co_rope(mt_backend *g) { return co_rope_table(g, 0, 3); }
static co_result co_rope_yarn(mt_backend *g) { return co_rope_table(g, 1, 4); }

// Attention on tensor cores (model/ops_cuda.cu): S = Q Kᵀ and dP = dO Vᵀ are fp32 sums of exact
// bf16 products (order only), but P (forward, dV) and dS (dQ, dK) are rounded to bf16 before
// their GEMM, as FlashAttention-2 does: each term of Σ_j P_ij v_j gets a relative error ≤ 2^-9
// (random in sign), which costs at most 2^-9 ≈ 2e-3 of Σ_j |P_ij v_j| and in L2 about 2^-9/√n of
// it; with the output's own rounding (≤ 2^-8 of the max by the bound above) both measures stay
// under 2^-8 + 2^-9 ≈ 5.9e-3. The measured worst over the cases is ~4e-3 (dS rounding, where
// Σ_j dS_ij k_j cancels most). 1e-2: a wrong mask, a lost tile, a wrong rescale or a missing
// accumulation gives errors of order 1.
#define CB_ATTN_TC 1e-2

// Attention on one configuration; mask_kind 0: none, 1: padding at each sequence's end, 2: the
// first keys of sequence 0 masked too (its first queries see nothing: out 0, lse -inf), 3: left
// padding, the first 2 + 3b keys of sequence b masked (the first queries of every sequence see
// nothing). out, dq, dk, dv: CB_ATTN_TC; lse fp32. The backward of both backends starts from the CUDA forward's
// out (bf16) and lse, so that they differ by the backward alone; the gradients start non-zero
// (accumulation), at the scale of the gradient itself (so that a wrong gradient is not hidden
// under a large starting value), and end with one rounding each.
// via: the path. 0: attention_*_cuda as the model calls them (cuDNN where MT_ATTENTION and the
// shape allow, else WMMA), 1: the WMMA kernel forced, 2: cuDNN forced, the key mask (kinds 0 and 1
// only: right padding) given as sequence lengths; a refusal is a failure there, not a fallback.
// With sinks (SK, a bf16 [nh], and DS its gradient) the op itself runs the WMMA kernels whatever
// the mode (via 3: under MT_ATTENTION=cudnn, which must not refuse).
// hd: q and k's head dim, hv: v and out's (MLA's differ), scale the scores'.
static int co_attention_fwd(mt_backend *g, int via, void *O, void *L, void *Q, void *K, void *V, void *SK, void *M,
                            void *LEN, int B, int S, int nh, int nkv, int hd, int hv, float scale, int window) {
    if (via == 2) return attention_cudnn_forward(g, O, L, Q, K, V, M, LEN, B, S, nh, nkv, hd, hv, scale, window);
    attention_forward_cuda(g, O, L, Q, K, V, SK, M, LEN, B, S, nh, nkv, hd, hv, scale, window);
    return 1;
}
static int co_attention_bwd(mt_backend *g, int via, void *DQ, void *DK, void *DV, void *DS, void *DO, void *Q, void *K,
                            void *V, void *O, void *L, void *SK, void *M, void *LEN, int B, int S, int nh, int nkv,
                            int hd, int hv, float scale, int window) {
    if (via == 2)
        return attention_cudnn_backward(g, DQ, DK, DV, DO, Q, K, V, O, L, M, LEN, B, S, nh, nkv, hd, hv, scale, window);
    attention_backward_cuda(g, DQ, DK, DV, DS, DO, Q, K, V, O, L, SK, M, LEN, B, S, nh, nkv, hd, hv, scale, window);
    return 1;
}

static co_result co_attention_mla(mt_backend *g, int B, int S, int nh, int nkv, int hd, int hv, float scale,
                                  int window, int mask_kind, uint64_t seed, int via, int sinks);
static co_result co_attention_sinks(mt_backend *g, int B, int S, int nh, int nkv, int hd, int window, int mask_kind,
                                    uint64_t seed, int via, int sinks) {
    return co_attention_mla(g, B, S, nh, nkv, hd, hd, 1.0f / sqrtf((float)hd), window, mask_kind, seed, via, sinks);
}
static co_result co_attention(mt_backend *g, int B, int S, int nh, int nkv, int hd, int window, int mask_kind,
                              uint64_t seed, int via) {
    return co_attention_sinks(g, B, S, nh, nkv, hd, window, mask_kind, seed, via, 0);
}
// sinks: learned sinks in [-1, 3] (lse includes them; a query with no key gets out 0, lse = its
// sink) and their gradient dsinks, from a non-zero start like the others (fp32 reduction, one
// rounding: CB_ONE_ROUNDING). hv ≠ hd and any scale: MLA's attention (the same tolerances: the
// roundings are the same, only the dot products' lengths differ).
static co_result co_attention_mla(mt_backend *g, int B, int S, int nh, int nkv, int hd, int hv, float scale,
                                  int window, int mask_kind, uint64_t seed, int via, int sinks) {
    co_result r = cb_begin(seed);
    // Forced cuDNN: a graph the library refuses is this case's failure, said here; the forced mode
    // would make it fatal and end the run before the other cases.
    for (int bwd = 0; via == 2 && bwd < 2; bwd++) {
        char why[256];
        if (attention_cudnn_check(bwd, B, S, nh, nkv, hd, hv, window, mask_kind != 0, why, sizeof why) == 0) {
            r.err = INFINITY;
            snprintf(r.what, sizeof r.what, "%.150s", why);
            return r;
        }
    }
    const mt_attention_mode mode0 = attention_get_mode();
    if (via == 1) attention_set_mode(MT_ATTENTION_WMMA);
    if (via == 2 || via == 3) attention_set_mode(MT_ATTENTION_CUDNN);
    const int T = B * S;
    size_t nq = (size_t)T * nh * hd, nk = (size_t)T * nkv * hd, nl = (size_t)T * nh;
    size_t no = (size_t)T * nh * hv, nv = (size_t)T * nkv * hv;  // out and v: rows of hv
    float *q = cb_rand(nq, -1, 1), *k = cb_rand(nk, -1, 1), *v = cb_rand(nv, -1, 1), *dout = cb_rand(no, -1, 1);
    float *out = co_rand(no, 0, 0), *lse = co_rand(nl, 0, 0);
    float *gq = co_rand(nq, 0, 0), *gk = co_rand(nk, 0, 0), *gv = co_rand(nv, 0, 0);  // zeros
    uint8_t *mask = NULL;
    if (mask_kind) {
        mask = mt_xmalloc((size_t)T);
        for (int b = 0; b < B; b++)
            for (int j = 0; j < S; j++) mask[b * S + j] = mask_kind == 3 ? j >= 2 + 3 * b : j < S - 3 * b - 2;
        if (mask_kind == 2)
            for (int j = 0; j < 3 && j < S; j++) mask[j] = 0;
    }
    void *Q = cb_up(g, q, nq), *K = cb_up(g, k, nk), *Vd = cb_up(g, v, nv), *DO = cb_up(g, dout, no);
    void *O = co_up(g, NULL, no * 2), *L = co_up(g, NULL, nl * 4), *M = mask ? co_up(g, mask, (size_t)T) : NULL;
    int32_t lens[64];  // via 2: right padding as lengths (mask kind 1: key j of b visible iff j < S − 3b − 2)
    for (int b = 0; b < B && b < 64; b++) lens[b] = mask_kind == 1 ? S - 3 * b - 2 : S;
    void *LEN = via == 2 && mask ? co_up(g, lens, (size_t)B * 4) : NULL;
    float *snk = sinks ? cb_rand((size_t)nh, -1, 3) : NULL, *ds = sinks ? cb_rand((size_t)nh, -1, 1) : NULL;
    float *gs = sinks ? co_rand((size_t)nh, 0, 0) : NULL;
    void *SK = sinks ? cb_up(g, snk, (size_t)nh) : NULL;
    attention_forward_cpu(out, lse, q, k, v, snk, mask, B, S, nh, nkv, hd, hv, scale, window);
    if (!co_attention_fwd(g, via, O, L, Q, K, Vd, SK, M, LEN, B, S, nh, nkv, hd, hv, scale, window))
        r.err = INFINITY, snprintf(r.what, sizeof r.what, "attention_cudnn_forward declined");
    cb_cmp(&r, g, "out", O, out, no, 1, CB_ATTN_TC);
    cb_cmp(&r, g, "lse", L, lse, nl, 0, CB_FP32);
    float *gout = cb_down(g, O, no, 1), *glse = cb_down(g, L, nl, 0);
    attention_backward_cpu(gq, gk, gv, gs, dout, q, k, v, gout, glse, snk, mask, B, S, nh, nkv, hd, hv, scale, window);
    float *dq = cb_rand(nq, -1, 1), *dk = cb_rand(nk, -1, 1), *dv = cb_rand(nv, -1, 1);
    const float sq = cb_scale(gq, nq), sk = cb_scale(gk, nk), sv = cb_scale(gv, nv);
    for (size_t i = 0; i < nq; i++) dq[i] = cb_r(dq[i] * sq);
    for (size_t i = 0; i < nk; i++) dk[i] = cb_r(dk[i] * sk);
    for (size_t i = 0; i < nv; i++) dv[i] = cb_r(dv[i] * sv);
    if (sinks) {
        const float ss = cb_scale(gs, (size_t)nh);
        for (int h = 0; h < nh; h++) ds[h] = cb_r(ds[h] * ss);
    }
    void *DQ = cb_up(g, dq, nq), *DK = cb_up(g, dk, nk), *DV = cb_up(g, dv, nv);
    void *DS = sinks ? cb_up(g, ds, (size_t)nh) : NULL;
    int ran = co_attention_bwd(g, via, DQ, DK, DV, DS, DO, Q, K, Vd, O, L, SK, M, LEN, B, S, nh, nkv, hd, hv, scale,
                               window);
    ran &= co_attention_bwd(g, via, NULL, NULL, NULL, NULL, DO, Q, K, Vd, O, L, SK, M, LEN, B, S, nh, nkv, hd, hv,
                            scale, window);  // nothing
    for (size_t i = 0; i < nq; i++) dq[i] += gq[i];  // the CPU twin's accumulation, in fp32
    for (size_t i = 0; i < nk; i++) dk[i] += gk[i];
    for (size_t i = 0; i < nv; i++) dv[i] += gv[i];
    if (sinks) {
        for (int h = 0; h < nh; h++) ds[h] += gs[h];
        cb_cmp(&r, g, "dsinks", DS, ds, (size_t)nh, 1, CB_ONE_ROUNDING);
        co_free(g, SK, (size_t)nh * 2), co_free(g, DS, (size_t)nh * 2);
        free(snk), free(ds), free(gs);
    }
    cb_cmp(&r, g, "dq", DQ, dq, nq, 1, CB_ATTN_TC);
    cb_cmp(&r, g, "dk", DK, dk, nk, 1, CB_ATTN_TC);
    cb_cmp(&r, g, "dv", DV, dv, nv, 1, CB_ATTN_TC);
    if (!ran) r.err = INFINITY, snprintf(r.what, sizeof r.what, "attention_cudnn_backward declined");
    if (LEN) co_free(g, LEN, (size_t)B * 4);
    attention_set_mode(mode0);
    co_free(g, Q, nq * 2), co_free(g, K, nk * 2), co_free(g, Vd, nv * 2), co_free(g, DO, no * 2);
    co_free(g, O, no * 2), co_free(g, L, nl * 4), co_free(g, DQ, nq * 2), co_free(g, DK, nk * 2), co_free(g, DV, nv * 2);
    if (M) co_free(g, M, (size_t)T);
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(gq), free(gk), free(gv), free(mask);
    free(gout), free(glse), free(dq), free(dk), free(dv);
    return r;
}

// MLA's key and value assembly (model/mla.c): the forward copies (bit for bit); the backward adds
// the same fp32 values as the twin (dk's no-rope part or dv onto dkvb; the heads' rope parts summed
// in head order onto dkrot) and rounds once: the twin's result rounded, bit for bit. krot is a
// slice of wider rows (kv_a_proj_with_mqa's [T, lora + rope]); the rest of dkrot's rows untouched.
static co_result co_mla_kv(mt_backend *g, int T, int nh, int nope, int rope, int vd, int lora, uint64_t seed) {
    co_result r = cb_begin(seed);
    const int ld = lora + rope;
    const size_t na = (size_t)T * ld, nb = (size_t)T * nh * (nope + vd), nk = (size_t)T * nh * (nope + rope);
    const size_t nv = (size_t)T * nh * vd;
    float *kva = cb_rand(na, -1, 1), *kvb = cb_rand(nb, -1, 1), *k = co_rand(nk, 0, 0), *v = co_rand(nv, 0, 0);
    float *dk = cb_rand(nk, -1, 1), *dv = cb_rand(nv, -1, 1), *dkvb = cb_rand(nb, -1, 1), *dkva = cb_rand(na, -1, 1);
    void *KA = cb_up(g, kva, na), *KB = cb_up(g, kvb, nb), *K = co_up(g, NULL, nk * 2), *V = co_up(g, NULL, nv * 2);
    void *DK = cb_up(g, dk, nk), *DV = cb_up(g, dv, nv), *DKB = cb_up(g, dkvb, nb), *DKA = cb_up(g, dkva, na);
    mla_kv_forward_cpu(k, v, kvb, kva + lora, ld, T, nh, nope, rope, vd);
    mla_kv_backward_cpu(dkvb, dkva + lora, dk, dv, ld, T, nh, nope, rope, vd);
    for (size_t i = 0; i < nb; i++) dkvb[i] = cb_r(dkvb[i]);
    for (size_t i = 0; i < na; i++) dkva[i] = cb_r(dkva[i]);
    mla_kv_forward_cuda(g, K, V, KB, (const mt_bf16 *)KA + lora, ld, T, nh, nope, rope, vd);
    mla_kv_backward_cuda(g, NULL, NULL, DK, DV, ld, T, nh, nope, rope, vd);  // nothing wanted
    mla_kv_backward_cuda(g, DKB, (mt_bf16 *)DKA + lora, DK, DV, ld, T, nh, nope, rope, vd);
    cb_cmp(&r, g, "k", K, k, nk, 1, CB_EXACT);
    cb_cmp(&r, g, "v", V, v, nv, 1, CB_EXACT);
    cb_cmp(&r, g, "dkvb", DKB, dkvb, nb, 1, CB_EXACT);
    cb_cmp(&r, g, "dkrot (whole rows)", DKA, dkva, na, 1, CB_EXACT);
    co_free(g, KA, na * 2), co_free(g, KB, nb * 2), co_free(g, K, nk * 2), co_free(g, V, nv * 2);
    co_free(g, DK, nk * 2), co_free(g, DV, nv * 2), co_free(g, DKB, nb * 2), co_free(g, DKA, na * 2);
    free(kva), free(kvb), free(k), free(v), free(dk), free(dv), free(dkvb), free(dkva);
    return r;
}

// Cross-entropy with ignored rows; in_place: the gradient replaces the logits (ignored rows
// zeroed), on both backends, as the model's backward uses it.
static co_result co_cross_entropy(mt_backend *g, int in_place) {
    co_result r = co_begin();
    co_seed(5 + in_place);
    const int T = 21, V = 1000;
    size_t n = (size_t)T * V;
    int32_t tgt[21];
    for (int t = 0; t < T; t++) tgt[t] = t % 5 == 3 ? -100 : co_int(V);
    float *logits = co_rand(n, -8, 8), *dl = in_place ? co_copy(logits, n) : co_rand(n, -1, 1);
    float *want_dl = co_copy(dl, n);
    void *TG = co_up(g, tgt, sizeof tgt), *LG = co_up(g, logits, n * 4), *DL = in_place ? LG : co_up(g, dl, n * 4);
    int64_t cnt_cpu = 0, cnt_gpu = 0;
    const float dscale = 1.0f / 17.0f;
    double want = cross_entropy_cpu(want_dl, dscale, &cnt_cpu, in_place ? want_dl : logits, tgt, T, V, -100);
    double got = cross_entropy_cuda(g, DL, dscale, &cnt_gpu, LG, TG, T, V, -100);
    co_cmp_scalar(&r, "loss", got, want);
    if (cnt_cpu != cnt_gpu) co_cmp_scalar(&r, "count", (double)cnt_gpu, (double)cnt_cpu);
    co_cmp_dev(&r, g, in_place ? "dlogits (in place)" : "dlogits", DL, want_dl, n);
    co_free(g, TG, sizeof tgt), co_free(g, LG, n * 4);
    if (!in_place) co_free(g, DL, n * 4);
    free(logits), free(dl), free(want_dl);
    return r;
}

// y = a + b: one add of the same fp32 values and one rounding, so rn(a + b) bit for bit; n not a
// multiple of 8 (the 16-byte path and its tail), then at an offset of one element (misaligned:
// the element path), which must leave y[0] alone.
static co_result co_add(mt_backend *g) {
    co_result r = cb_begin(7);
    const size_t n = 1003;
    float *a = cb_rand(n, -4, 4), *b = cb_rand(n, -1, 1), *y = co_rand(n, 0, 0);
    for (size_t i = 0; i < n; i++) y[i] = cb_r(a[i] + b[i]);
    void *A = cb_up(g, a, n), *Bd = cb_up(g, b, n), *Y = co_up(g, NULL, n * 2), *Y1 = co_up(g, NULL, n * 2);
    mt_add_cuda(g, Y, A, Bd, (int64_t)n);
    mt_add_cuda(g, (mt_bf16 *)Y1 + 1, (const mt_bf16 *)A + 1, (const mt_bf16 *)Bd + 1, (int64_t)n - 1);
    cb_cmp(&r, g, "y", Y, y, n, 1, CB_EXACT);
    y[0] = 0.0f;
    cb_cmp(&r, g, "y (offset 1)", Y1, y, n, 1, CB_EXACT);
    co_free(g, A, n * 2), co_free(g, Bd, n * 2), co_free(g, Y, n * 2), co_free(g, Y1, n * 2);
    free(a), free(b), free(y);
    return r;
}

// mt_f32_to_bf16_cuda against mt_f32_to_bf16 (core/dtype.h), bit for bit: ties to even, the
// carry into the exponent, overflow to inf, subnormals, ±0, ±inf; a NaN must stay a NaN (its
// payload may differ: the device gives the canonical one). Aligned, then at an offset of one.
static co_result co_f32_to_bf16(mt_backend *g) {
    co_result r = cb_begin(8);
    r.tol = 0.5;  // r.err: the number of mismatches
    const size_t n = 1003;
    static const uint32_t special[] = {
        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u,  // NaNs
        0x3f808000u, 0x3f818000u, 0xbf808000u, 0x3f808001u, 0x3f807fffu,  // ties to even, just off a tie
        0x3fffffffu, 0x3fff8000u, 0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u,   // carries, overflow to inf
        0x00000001u, 0x00008000u, 0x00018000u, 0x807fffffu, 0x00800000u};  // subnormals, the smallest normal
    const size_t ns = sizeof special / sizeof special[0];
    float *src = mt_xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        uint32_t u = i < ns ? special[i] : co_next();  // all exponents, NaNs and infs included
        memcpy(&src[i], &u, 4);
    }
    uint16_t *want = mt_xmalloc(n * 2), *got = mt_xmalloc(n * 2);
    for (size_t i = 0; i < n; i++) want[i] = mt_f32_to_bf16(src[i]);
    void *S = co_up(g, src, n * 4), *D = co_up(g, NULL, n * 2), *D1 = co_up(g, NULL, n * 2);
    mt_f32_to_bf16_cuda(g, D, S, (int64_t)n);
    mt_f32_to_bf16_cuda(g, (mt_bf16 *)D1 + 1, (const float *)S + 1, (int64_t)n - 1);
    for (int pass = 0; pass < 2; pass++) {
        co_down(g, got, pass ? D1 : D, n * 2);
        if (pass) want[0] = 0;  // untouched
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < n; i++) {
            int nan_w = (want[i] & 0x7fff) > 0x7f80, nan_g = (got[i] & 0x7fff) > 0x7f80;
            if ((nan_w ? !nan_g : got[i] != want[i]) && bad++ == 0) first = i;
        }
        if (r.outputs++ == 0 || (double)bad > r.err) {
            r.err = (double)bad;
            snprintf(r.what, sizeof r.what, "%s: %zu mismatches, first [%zu] src 0x%08x got 0x%04x want 0x%04x",
                     pass ? "offset 1" : "aligned", bad, first, bad ? cb_bits(src[first]) : 0u,
                     bad ? got[first] : 0u, bad ? want[first] : 0u);
        }
    }
    co_free(g, S, n * 4), co_free(g, D, n * 2), co_free(g, D1, n * 2);
    free(src), free(want), free(got);
    return r;
}

// ---------------------------------------------------------------------------------------------
// moe/moe.h

// The MoE cases judge each output against its own tolerance: r.err is the worst of err / tol
// (r.tol = 1; tol 0: exact), and `what` says which output, its error and its tolerance.
//
// bf16 tolerances, from bf16's 8 significant bits: one round-to-nearest moves a value by at most
// half an ulp, 2^-8 of the top of its binade (2^-9 of the binade's top value on average), so one
// rounding costs at most 2^-8 ≈ 3.9e-3 of max |want|: CO_MOE_TOL_ROUND1 = 4e-3 (fp32 noise
// before the rounding is ~1e-6 of that). Where the device does the CPU's fp32 operations in the
// CPU's order (the scatters), its output is also compared with the CPU's rounded to bf16: exact.
#define CO_MOE_TOL_ROUND1 4e-3
#define CO_MOE_TOL_F32 1e-4  // fp32 outputs (dweights, dlogits): order of fp32 sums only

static void co_moe_note(co_result *r, double err, double tol, const char *label, size_t i, double got, double want) {
    double scaled = err == 0.0 ? 0.0 : tol > 0.0 ? err / tol : INFINITY;
    if (isnan(err)) scaled = NAN;
    if (r->outputs++ == 0 || (!isnan(r->err) && !(scaled <= r->err))) {  // a NaN stays the worst
        r->err = scaled;
        snprintf(r->what, sizeof r->what, "%s: err %.3g (tol %.0e) [%zu] got %.9g want %.9g", label, err, tol, i, got,
                 want);
    }
    r->tol = 1.0;
}

// got, want [n] on the host: max |got − want| / max |want| (NaN counts as worst).
static void co_moe_cmp(co_result *r, const char *label, const float *got, const float *want, size_t n, double tol) {
    double maxd = 0, maxw = 0;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs(want[i]) > maxw) maxw = fabs(want[i]);
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= maxd)) maxd = d, worst = i;
        if (isnan(d)) break;
    }
    co_moe_note(r, maxd / (maxw > 0 ? maxw : 1.0), tol, label, worst, n ? got[worst] : 0.0, n ? want[worst] : 0.0);
}

// The host values rounded to bf16 in place (what the CPU twin then reads is what the device
// holds) and a device copy of them as bf16.
static void *co_moe_up_bf16(mt_backend *be, float *host, size_t n) {
    mt_bf16 *h = mt_xmalloc(n * sizeof(mt_bf16) + 2);
    for (size_t i = 0; i < n; i++) h[i] = mt_f32_to_bf16(host[i]), host[i] = mt_bf16_to_f32(h[i]);
    void *d = co_up(be, h, n * sizeof(mt_bf16));
    free(h);
    return d;
}

// The device's n bf16 as f32 against want (fp32 CPU result) with tol, and, when `exact`, against
// want rounded to bf16 with no difference allowed.
static void co_moe_cmp_bf16(co_result *r, mt_backend *be, const char *label, const void *dev, const float *want,
                            size_t n, double tol, int exact) {
    mt_bf16 *h = mt_xmalloc(n * sizeof(mt_bf16) + 2);
    float *got = mt_xmalloc(n * sizeof(float) + 4), *rounded = mt_xmalloc(n * sizeof(float) + 4);
    co_down(be, h, dev, n * sizeof(mt_bf16));
    for (size_t i = 0; i < n; i++) got[i] = mt_bf16_to_f32(h[i]), rounded[i] = mt_bf16_to_f32(mt_f32_to_bf16(want[i]));
    co_moe_cmp(r, label, got, want, n, tol);
    if (exact) {
        char l2[80];
        snprintf(l2, sizeof l2, "%s vs bf16(cpu)", label);
        co_moe_cmp(r, l2, got, rounded, n, 0.0);
    }
    free(h), free(got), free(rounded);
}

static void co_moe_cmp_f32(co_result *r, mt_backend *be, const char *label, const void *dev, const float *want,
                           size_t n, double tol) {
    float *got = mt_xmalloc(n * sizeof(float) + 4);
    co_down(be, got, dev, n * sizeof(float));
    co_moe_cmp(r, label, got, want, n, tol);
    free(got);
}

static void co_moe_scalar(co_result *r, const char *label, double got, double want, double tol) {
    co_moe_note(r, fabs(got - want) / (fabs(want) > 0 ? fabs(want) : 1.0), tol, label, 0, got, want);
}

// Router logits with ties: row 0 all equal, row 1 two equal maxima, rows 2.. random.
static float *co_router_logits(int T, int E) {
    float *l = co_rand((size_t)T * E, -3, 3);
    for (int e = 0; e < E; e++) l[e] = 0.5f;
    if (T > 1 && E > 2) l[E + 1] = l[E + 2] = 4.0f;
    return l;
}

static co_result co_router(mt_backend *g, int T, int E, int k, int norm) {
    co_result r = co_begin();
    co_seed(7 + (uint64_t)k * 10 + (uint64_t)norm);
    size_t nl = (size_t)T * E, nk = (size_t)T * k;
    float *logits = co_router_logits(T, E), *probs = co_rand(nl, 0, 0), *w = co_rand(nk, 0, 0);
    float *dw = co_rand(nk, -1, 1), *dl = co_rand(nl, -1, 1);
    int32_t *ids = mt_xmalloc(nk * 4);
    void *LG = co_up(g, logits, nl * 4), *P = co_up(g, NULL, nl * 4), *W = co_up(g, NULL, nk * 4);
    void *I = co_up(g, NULL, nk * 4), *DW = co_up(g, dw, nk * 4), *DL = co_up(g, dl, nl * 4);
    router_forward_cpu(ids, w, probs, logits, T, E, k, norm);
    router_backward_cpu(dl, dw, probs, ids, w, T, E, k, norm);
    router_forward_cuda(g, I, W, P, LG, T, E, k, norm);
    router_backward_cuda(g, DL, DW, P, I, W, T, E, k, norm);
    co_cmp_dev(&r, g, "probs", P, probs, nl);
    co_cmp_dev(&r, g, "weights", W, w, nk);
    co_cmp_dev(&r, g, "dlogits", DL, dl, nl);
    co_cmp_dev_i32(&r, g, "ids", I, ids, nk);
    co_free(g, LG, nl * 4), co_free(g, P, nl * 4), co_free(g, W, nk * 4), co_free(g, I, nk * 4);
    co_free(g, DW, nk * 4), co_free(g, DL, nl * 4);
    free(logits), free(probs), free(w), free(dw), free(dl), free(ids);
    return r;
}

// The DeepSeek-style router (router_grouped_*_cuda) against its CPU twin. The twin's per-row
// code is the kernel's, so only expf (CUDA's is within 2 ulp of glibc's) and contracted
// multiply-adds in the backward differ: scores, weights and dlogits to CUDA_OPS_TOL, ids exact.
// For ids to be exact on a GPU no two choice scores (or group scores) of a random row may be
// within an expf rounding of each other: rows with any pair closer than 1e-5 relative are drawn
// again (exactly equal values come from equal inputs and are equal on both sides). Row 0 is all
// equal (exact ties: the bias's order, or the lower index), row 1 a ladder with two equal maxima
// (drawn again where the bias brings two choices close). The bias is a shuffled ladder 0.01 apart.
static int co_grouped_row_apart(const float *l, const float *bias, int E, moe_route_rule r) {
    double c[1024], gs[64], m = -INFINITY, sum = 0.0;
    for (int e = 0; e < E; e++) m = fmax(m, l[e]);
    for (int e = 0; e < E; e++) sum += exp((double)l[e] - m);
    for (int e = 0; e < E; e++)
        c[e] = (r.sigmoid ? 1.0 / (1.0 + exp(-(double)l[e])) : exp((double)l[e] - m) / sum) + (bias ? bias[e] : 0.0);
    const int G = r.n_group > 1 ? r.n_group : 1, n = E / G;
    for (int g = 0; g < G; g++) {
        double a = -INFINITY, b = -INFINITY;
        for (int e = g * n; e < (g + 1) * n; e++) {
            if (c[e] > a) b = a, a = c[e];
            else if (c[e] > b) b = c[e];
        }
        gs[g] = r.group_top2 ? a + b : a;
    }
    // equal values come from equal inputs: the same on both sides
    for (int a = 0; a < E; a++)
        for (int b = 0; b < a; b++)
            if (c[a] != c[b] && fabs(c[a] - c[b]) <= 1e-5 * fmax(fabs(c[a]), fabs(c[b]))) return 0;
    for (int a = 0; a < G; a++)
        for (int b = 0; b < a; b++)
            if (gs[a] != gs[b] && fabs(gs[a] - gs[b]) <= 1e-5 * fmax(fabs(gs[a]), fabs(gs[b]))) return 0;
    return 1;
}

static co_result co_router_grouped(mt_backend *g, int T, int E, int k, moe_route_rule rule, int with_bias,
                                   uint64_t seed) {
    co_result r = co_begin();
    co_seed(seed);
    size_t nl = (size_t)T * E, nk = (size_t)T * k;
    float *bias = NULL;
    if (with_bias) {
        bias = co_rand((size_t)E, 0, 0);
        for (int e = 0; e < E; e++) bias[e] = 0.01f * (float)e - 0.005f * (float)E;
        for (int e = E - 1; e > 0; e--) {
            int j = co_int(e + 1);
            float t = bias[e];
            bias[e] = bias[j], bias[j] = t;
        }
    }
    float *logits = co_rand(nl, 0, 0);
    for (int t = 0; t < T; t++) {
        float *l = logits + (size_t)t * E;
        for (int e = 0; e < E; e++) l[e] = t == 0 ? 0.5f : -3.0f + 6.0f * (float)e / (float)E;
        if (t == 1) l[1] = l[2] = 4.0f;
        for (int fresh = t > 1; fresh || !co_grouped_row_apart(l, bias, E, rule); fresh = 0)
            for (int e = 0; e < E; e++) l[e] = co_uniform(-3, 3);
    }
    float *scores = co_rand(nl, 0, 0), *w = co_rand(nk, 0, 0), *w2 = co_rand(nk, 0, 0);
    float *dw = co_rand(nk, -1, 1), *dl = co_rand(nl, -1, 1);
    int32_t *ids = mt_xmalloc(nk * 4);
    void *LG = co_up(g, logits, nl * 4), *S = co_up(g, NULL, nl * 4), *W = co_up(g, NULL, nk * 4);
    void *W2 = co_up(g, NULL, nk * 4), *I = co_up(g, NULL, nk * 4), *DW = co_up(g, dw, nk * 4);
    void *DL = co_up(g, dl, nl * 4), *B = bias ? co_up(g, bias, (size_t)E * 4) : NULL;
    router_grouped_forward_cpu(ids, w, scores, logits, bias, T, E, k, rule);
    router_grouped_backward_cpu(dl, dw, scores, ids, w, T, E, k, rule);
    router_grouped_weights_of_choices_cpu(w2, scores, ids, T, E, k, rule);
    router_grouped_forward_cuda(g, I, W, S, LG, B, T, E, k, rule);
    router_grouped_backward_cuda(g, DL, DW, S, I, W, T, E, k, rule);
    router_grouped_weights_of_choices_cuda(g, W2, S, I, T, E, k, rule);
    co_cmp_dev(&r, g, "scores", S, scores, nl);
    co_cmp_dev(&r, g, "weights", W, w, nk);
    co_cmp_dev(&r, g, "replayed weights", W2, w2, nk);
    co_cmp_dev(&r, g, "dlogits", DL, dl, nl);
    co_cmp_dev_i32(&r, g, "ids", I, ids, nk);
    co_free(g, LG, nl * 4), co_free(g, S, nl * 4), co_free(g, W, nk * 4), co_free(g, W2, nk * 4);
    co_free(g, I, nk * 4), co_free(g, DW, nk * 4), co_free(g, DL, nl * 4);
    if (B) co_free(g, B, (size_t)E * 4);
    free(bias), free(logits), free(scores), free(w), free(w2), free(dw), free(dl), free(ids);
    return r;
}

// Aux loss over two "layers" with a row mask: statistics, loss and backward. 300 rows of 8
// experts (10 chunks of partial sums), and 4133 of 128 (130 chunks: the sums' strided loop and
// every warp of their tree; 257 statistics: the partials' loop past 256 threads).
static void aux_loss_case(co_result *r, mt_backend *g, int T, int E, int k) {
    size_t nl = (size_t)T * E, nk = (size_t)T * k;
    uint8_t *mask = mt_xmalloc((size_t)T);
    for (int t = 0; t < T; t++) mask[t] = t % 7 != 0;
    float *logits = co_router_logits(T, E), *probs = co_rand(nl, 0, 0), *w = co_rand(nk, 0, 0);
    float *dl = co_rand(nl, -1, 1);
    int32_t *ids = mt_xmalloc(nk * 4);
    router_forward_cpu(ids, w, probs, logits, T, E, k, 1);
    moe_aux_stats s, sg;
    moe_aux_init(&s, E, k);
    moe_aux_init(&sg, E, k);
    size_t sb = MT_AUX_STATS_LEN(E) * sizeof(double);
    void *P = co_up(g, probs, nl * 4), *I = co_up(g, ids, nk * 4), *M = co_up(g, mask, T), *DL = co_up(g, dl, nl * 4);
    void *ST = co_up(g, NULL, sb);
    for (int layer = 0; layer < 2; layer++) {
        moe_aux_accumulate_cpu(&s, probs, ids, mask, T);
        moe_aux_accumulate_cuda(g, ST, P, I, M, T, E, k);
    }
    double zs = -1.0;
    int64_t zr = -1;
    moe_aux_stats_download_cuda(g, &sg, ST, &zs, &zr, NULL, NULL, NULL, 0);
    co_cmp_scalar(r, "aux loss", moe_aux_loss(&sg), moe_aux_loss(&s));
    if (zs != 0.0 || zr != 0) co_cmp_scalar(r, "z fields (the aux statistics must not touch them)", zs + zr, 0.0);
    if (sg.rows != s.rows) co_cmp_scalar(r, "rows", (double)sg.rows, (double)s.rows);
    for (int e = 0; e < E; e++) {
        if (sg.counts[e] != s.counts[e]) co_cmp_scalar(r, "counts", sg.counts[e], s.counts[e]);
        co_cmp_scalar(r, "prob sums", sg.prob_sums[e], s.prob_sums[e]);
    }
    moe_aux_backward_cpu(dl, 0.02f, &s, probs, mask, T);
    moe_aux_backward_cuda(g, DL, 0.02f, ST, P, M, T, E);
    co_cmp_dev(r, g, "dlogits", DL, dl, nl);
    co_free(g, P, nl * 4), co_free(g, I, nk * 4), co_free(g, M, T), co_free(g, DL, nl * 4), co_free(g, ST, sb);
    free(logits), free(probs), free(w), free(dl), free(ids), free(mask);
}

static co_result co_aux_loss(mt_backend *g) {
    co_result r = co_begin();
    co_seed(11);
    aux_loss_case(&r, g, 300, 8, 2);
    aux_loss_case(&r, g, 4133, 128, 8);
    return r;
}

// z-loss over two "layers" (different logits and masks; 700 rows: three full blocks of partial
// sums and a partial one) into statistics that start non-zero: the sum and rows add to what was
// there, the aux fields stay as they were; a second run from the same start gives the same bits.
// Then the backward (fp32) on layer 0's logits.
static co_result co_zloss(mt_backend *g) {
    co_result r = co_begin();
    co_seed(12);
    const int T = 700, E = 8, L = MT_AUX_STATS_LEN(E);
    size_t nl = (size_t)T * E, sb = (size_t)L * sizeof(double);
    uint8_t mask[2][700];
    for (int t = 0; t < T; t++) mask[0][t] = t % 5 != 1, mask[1][t] = t % 3 != 0;
    float *logits[2] = {co_rand(nl, -6, 6), co_rand(nl, -3, 9)}, *dl = co_rand(nl, -1, 1);
    double init[MT_AUX_STATS_LEN(8)];
    for (int i = 0; i < L; i++) init[i] = i == 2 * E || i == 2 * E + 2 ? 100.0 + i : 1.5 + i;  // rows: integers
    void *LG[2] = {co_up(g, logits[0], nl * 4), co_up(g, logits[1], nl * 4)};
    void *M[2] = {co_up(g, mask[0], T), co_up(g, mask[1], T)}, *DL = co_up(g, dl, nl * 4);
    void *ST[2] = {co_up(g, init, sb), co_up(g, init, sb)};
    int64_t rows_cpu = 0;
    double want = 0.0;
    for (int layer = 0; layer < 2; layer++) want += moe_zloss_sum_cpu(&rows_cpu, logits[layer], mask[layer], T, E);
    double zs[2];
    int64_t zr[2];
    moe_aux_stats sg;
    for (int run = 0; run < 2; run++) {
        for (int layer = 0; layer < 2; layer++) moe_zloss_accumulate_cuda(g, ST[run], LG[layer], M[layer], T, E);
        moe_aux_init(&sg, E, 1);
        moe_aux_stats_download_cuda(g, &sg, ST[run], &zs[run], &zr[run], NULL, NULL, NULL, 0);
    }
    // Both sums in double of the same lse² values (each to an ulp or so: exp and log on two
    // machines), in different orders: 1e-12 relative would do, 1e-9 leaves room.
    co_moe_scalar(&r, "z sum (two layers, added to the start)", zs[0], init[2 * E + 1] + want, 1e-9);
    co_moe_scalar(&r, "z rows", (double)zr[0], init[2 * E + 2] + (double)rows_cpu, 0.0);
    co_moe_scalar(&r, "z sum run to run", zs[1], zs[0], 0.0);
    for (int e = 0; e < E; e++) {
        co_moe_scalar(&r, "aux counts untouched", sg.counts[e], init[e], 0.0);
        co_moe_scalar(&r, "aux prob sums untouched", sg.prob_sums[e], init[E + e], 0.0);
    }
    co_moe_scalar(&r, "aux rows untouched", (double)sg.rows, (double)(int64_t)init[2 * E], 0.0);
    moe_zloss_backward_cpu(dl, 0.001f / (float)rows_cpu, logits[0], mask[0], T, E);
    moe_zloss_backward_cuda(g, DL, 0.001f / (float)rows_cpu, LG[0], M[0], T, E);
    co_moe_cmp_f32(&r, g, "dlogits", DL, dl, nl, CO_MOE_TOL_F32);
    for (int i = 0; i < 2; i++) co_free(g, LG[i], nl * 4), co_free(g, M[i], T), co_free(g, ST[i], sb), free(logits[i]);
    co_free(g, DL, nl * 4);
    free(dl);
    return r;
}

// ids [T, k] of T tokens: distinct experts per token, never expert `empty` (−1: any), all on
// expert 0 when `one_expert`.
static int32_t *co_ids(int T, int E, int k, int empty, int one_expert) {
    int32_t *ids = mt_xmalloc((size_t)T * k * 4);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            int32_t e;
            int again;
            do {
                e = one_expert ? j : co_int(E);
                again = e == empty;
                for (int i = 0; i < j; i++) again |= ids[t * k + i] == e;
            } while (again);
            ids[t * k + j] = e;
        }
    return ids;
}

static co_result co_permute(mt_backend *g, int T, int E, int k, int empty, int one_expert, uint64_t seed) {
    co_result r = co_begin();
    co_seed(seed);
    const int n = T * k;
    int32_t *ids = co_ids(T, E, k, empty, one_expert);
    int32_t *order = mt_xmalloc((size_t)n * 4 + 4), *off = mt_xmalloc((size_t)(E + 1) * 4), *cnt = mt_xmalloc((size_t)E * 4);
    void *I = co_up(g, ids, (size_t)n * 4), *O = co_up(g, NULL, (size_t)n * 4);
    void *OF = co_up(g, NULL, (size_t)(E + 1) * 4), *C = co_up(g, NULL, (size_t)E * 4);
    moe_permute_cpu(order, off, cnt, ids, T, E, k);
    moe_permute_cuda(g, O, OF, C, I, T, E, k);
    r.tol = 0.5;  // integers: no mismatch allowed
    co_cmp_dev_i32(&r, g, "order", O, order, (size_t)n);
    co_cmp_dev_i32(&r, g, "offsets", OF, off, (size_t)E + 1);
    co_cmp_dev_i32(&r, g, "counts", C, cnt, (size_t)E);
    co_free(g, I, (size_t)n * 4), co_free(g, O, (size_t)n * 4), co_free(g, OF, (size_t)(E + 1) * 4), co_free(g, C, (size_t)E * 4);
    free(ids), free(order), free(off), free(cnt);
    return r;
}

// The bias update's load over two "layers" of ids with a row mask (700 rows: 21 full chunks
// and a part) into counts that start non-zero, then the update: counts and bias exact (whole
// numbers; ±rate or nothing).
static co_result co_router_bias_update(mt_backend *g) {
    co_result r = co_begin();
    co_seed(71);
    const int T = 700, E = 16, k = 4;
    int32_t *ids[2] = {co_ids(T, E, k, 3, 0), co_ids(T, E, k, -1, 0)};
    uint8_t mask[700];
    for (int t = 0; t < T; t++) mask[t] = t % 5 != 2;
    double counts[16];
    float *bias = co_rand((size_t)E, -0.1f, 0.1f), *bias_gpu = co_rand((size_t)E, 0, 0);
    for (int e = 0; e < E; e++) counts[e] = (double)(e % 3);  // a step already under way
    void *C = co_up(g, counts, sizeof counts), *B = co_up(g, bias, (size_t)E * 4), *M = co_up(g, mask, (size_t)T);
    void *I[2] = {co_up(g, ids[0], (size_t)T * k * 4), co_up(g, ids[1], (size_t)T * k * 4)};
    for (int layer = 0; layer < 2; layer++) {
        router_load_accumulate_cpu(counts, ids[layer], layer ? NULL : mask, T, E, k);
        router_load_accumulate_cuda(g, C, I[layer], layer ? NULL : M, T, E, k);
    }
    double got[16];
    co_down(g, got, C, sizeof got);
    for (int e = 0; e < E; e++) co_moe_scalar(&r, "counts", got[e], counts[e], 0.0);
    router_bias_update_cpu(bias, counts, E, 0.001f);
    router_bias_update_cuda(g, B, C, E, 0.001f);
    co_down(g, bias_gpu, B, (size_t)E * 4);
    for (int e = 0; e < E; e++) co_moe_scalar(&r, "bias", bias_gpu[e], bias[e], 0.0);
    co_free(g, C, sizeof counts), co_free(g, B, (size_t)E * 4), co_free(g, M, (size_t)T);
    for (int i = 0; i < 2; i++) co_free(g, I[i], (size_t)T * k * 4), free(ids[i]);
    free(bias), free(bias_gpu);
    return r;
}

// The sequence-wise balance loss over two "layers" (B 5 sequences of 300 rows: a thread per
// expert walks a sequence; one sequence all padding, others partly) into a start that is not
// zero: the sum to 1e-9 (double sums of the same fp32 quotients, orders differ), the count exact;
// then the backward (fp32) for sigmoid and softmax scores.
static co_result co_router_seq_aux(mt_backend *g) {
    co_result r = co_begin();
    co_seed(91);
    const int B = 5, S = 300, E = 16, k = 4, T = B * S;
    size_t nl = (size_t)T * E, nk = (size_t)T * k;
    uint8_t *mask = mt_xmalloc((size_t)T);
    for (int t = 0; t < T; t++) mask[t] = t / S == 3 ? 0 : t % 7 != 2;
    float *logits = co_rand(nl, -3, 3), *scores[2] = {co_rand(nl, 0, 0), co_rand(nl, 0, 0)};
    float *w = co_rand(nk, 0, 0), *dl = co_rand(nl, -1, 1);
    int32_t *ids[2] = {mt_xmalloc(nk * 4), mt_xmalloc(nk * 4)};
    const moe_route_rule rules[2] = {{1, 4, 2, 1, 1, 2.5f}, {0, 1, 1, 0, 0, 1.0f}};
    for (int i = 0; i < 2; i++) router_grouped_forward_cpu(ids[i], w, scores[i], logits, NULL, T, E, k, rules[i]);
    double acc[2] = {0.25, 3.0}, got[2];
    void *ACC = co_up(g, acc, sizeof acc), *M = co_up(g, mask, (size_t)T), *DL = co_up(g, dl, nl * 4);
    void *SC[2] = {co_up(g, scores[0], nl * 4), co_up(g, scores[1], nl * 4)};
    void *I[2] = {co_up(g, ids[0], nk * 4), co_up(g, ids[1], nk * 4)};
    for (int i = 0; i < 2; i++) {
        int64_t n = 0;
        acc[0] += router_seq_aux_sum_cpu(&n, scores[i], ids[i], mask, B, S, E, k);
        acc[1] += (double)n;
        router_seq_aux_accumulate_cuda(g, ACC, SC[i], I[i], M, B, S, E, k);
    }
    co_down(g, got, ACC, sizeof got);
    co_moe_scalar(&r, "seq aux sum (two layers, added to the start)", got[0], acc[0], 1e-9);
    co_moe_scalar(&r, "sequences", got[1], acc[1], 0.0);
    for (int i = 0; i < 2; i++) {
        router_seq_aux_backward_cpu(dl, 0.01f, scores[i], ids[i], mask, B, S, E, k, rules[i].sigmoid);
        router_seq_aux_backward_cuda(g, DL, 0.01f, SC[i], I[i], M, B, S, E, k, rules[i].sigmoid);
    }
    co_moe_cmp_f32(&r, g, "dlogits", DL, dl, nl, CO_MOE_TOL_F32);
    co_free(g, ACC, sizeof acc), co_free(g, M, (size_t)T), co_free(g, DL, nl * 4);
    for (int i = 0; i < 2; i++) co_free(g, SC[i], nl * 4), co_free(g, I[i], nk * 4), free(scores[i]), free(ids[i]);
    free(mask), free(logits), free(w), free(dl);
    return r;
}

// gather, gather backward, combine and combine backward on the CPU's permutation, bf16
// activations (fp32 weights and dweights). Expert 1 gets no rows (E > 2). xs, dx and dys start as
// garbage (written, not added to), the combine's out as values it adds onto. H % 8 == 0 takes the 16-byte path, other H
// the scalar one. xs is a copy (exact); dx, out and dys are the CPU's fp32 operations in its
// order, rounded once (CO_MOE_TOL_ROUND1 against the fp32 result, exact against it rounded);
// dweights fp32 (CO_MOE_TOL_F32). xs's, dxs's and dys's rows are ldd apart (≥ H): the columns
// beyond H must come back as they went (compared whole, with the rows), dxs's are never read.
static co_result co_gather_combine(mt_backend *g, int T, int E, int k, int H, int ldd, uint64_t seed) {
    co_result r = co_begin();
    co_seed(seed);
    const int n = T * k;
    int32_t *ids = co_ids(T, E, k, E > 2 ? 1 : -1, 0), *order = mt_xmalloc((size_t)n * 4 + 4);
    int32_t off[1025];
    moe_permute_cpu(order, off, NULL, ids, T, E, k);
    if (E > 2 && off[2] != off[1]) mt_fatal(MT_EXIT_ERROR, "co_gather_combine: expert 1 was meant to be empty");
    size_t nx = (size_t)T * H, ns = (size_t)n * H, nd = (size_t)n * ldd, b2 = sizeof(mt_bf16);
    float *x = co_rand(nx, -1, 1), *xs = co_rand(nd, -3, 3), *dxs = co_rand(nd, -1, 1), *dx = co_rand(nx, -1, 1);
    float *ys = co_rand(ns, -1, 1), *w = co_rand((size_t)n, 0, 1), *out = co_rand(nx, -1, 1);
    float *dout = co_rand(nx, -1, 1), *dys = co_rand(nd, -1, 1), *dw = co_rand((size_t)n, -1, 1);
    void *OR = co_up(g, order, (size_t)n * 4), *X = co_moe_up_bf16(g, x, nx), *XS = co_moe_up_bf16(g, xs, nd);
    void *DXS = co_moe_up_bf16(g, dxs, nd), *DX = co_moe_up_bf16(g, dx, nx), *YS = co_moe_up_bf16(g, ys, ns);
    void *W = co_up(g, w, (size_t)n * 4), *OUT = co_moe_up_bf16(g, out, nx), *DOUT = co_moe_up_bf16(g, dout, nx);
    void *DYS = co_moe_up_bf16(g, dys, nd), *DW = co_up(g, dw, (size_t)n * 4);
    moe_gather_cpu(xs, ldd, x, order, n, H, k);
    moe_gather_backward_cpu(dx, dxs, ldd, order, n, H, k);
    moe_combine_cpu(out, ys, w, order, n, H, k);
    moe_combine_backward_cpu(dys, ldd, dw, dout, ys, w, order, n, H, k);
    moe_gather_cuda(g, XS, ldd, X, OR, n, H, k);
    moe_gather_backward_cuda(g, DX, DXS, ldd, OR, n, H, k);
    moe_combine_cuda(g, OUT, YS, W, OR, n, H, k);
    moe_combine_backward_cuda(g, DYS, ldd, DW, DOUT, YS, W, OR, n, H, k);
    co_moe_cmp_bf16(&r, g, "xs", XS, xs, nd, 0.0, 0);
    co_moe_cmp_bf16(&r, g, "dx", DX, dx, nx, CO_MOE_TOL_ROUND1, 1);
    co_moe_cmp_bf16(&r, g, "combine out", OUT, out, nx, CO_MOE_TOL_ROUND1, 1);
    co_moe_cmp_bf16(&r, g, "dys", DYS, dys, nd, CO_MOE_TOL_ROUND1, 1);
    co_moe_cmp_f32(&r, g, "dweights", DW, dw, (size_t)n, CO_MOE_TOL_F32);
    co_free(g, OR, (size_t)n * 4), co_free(g, X, nx * b2), co_free(g, XS, nd * b2), co_free(g, DXS, nd * b2);
    co_free(g, DX, nx * b2), co_free(g, YS, ns * b2), co_free(g, W, (size_t)n * 4), co_free(g, OUT, nx * b2);
    co_free(g, DOUT, nx * b2), co_free(g, DYS, nd * b2), co_free(g, DW, (size_t)n * 4);
    free(ids), free(order), free(x), free(xs), free(dxs), free(dx), free(ys), free(w), free(out), free(dout);
    free(dys), free(dw);
    return r;
}

// Fused SwiGLU: gu [rows, 2f] bf16 → a [rows, f] (starts as garbage), dgu += (starts non-zero).
// Each stored value is fp32 arithmetic rounded once: CO_MOE_TOL_ROUND1 against the fp32 twin on
// the same bf16 inputs (expf against the CPU's mt_vexpf: ~1e-6 before the rounding). f % 8 == 0
// takes the 16-byte path, other f the scalar one. Gates in [-gate, gate]: 500 saturates the
// sigmoid both ways (e^500 overflows fp32), where a NaN or inf would be the worst output.
// a and da have row stride ld ≥ f (w2's LoRA xa beside a, model/experts_gpu.c): the columns past
// f keep a's starting values (compared with the rest).
static co_result co_swiglu_fused(mt_backend *g, int64_t rows, int64_t f, int64_t ld, float gate, uint64_t seed) {
    co_result r = co_begin();
    co_seed(seed);
    size_t na = (size_t)(rows * ld), ng = (size_t)(2 * rows * f), b2 = sizeof(mt_bf16);
    float *gu = co_rand(ng, -gate, gate), *da = co_rand(na, -1, 1), *a = co_rand(na, -5, 5), *dgu = co_rand(ng, -1, 1);
    for (int64_t i = 0; i < rows; i++)  // the up half on a smaller scale than the gate half
        for (int64_t c = 0; c < f; c++) gu[i * 2 * f + f + c] *= 0.25f;
    void *GU = co_moe_up_bf16(g, gu, ng), *DA = co_moe_up_bf16(g, da, na), *A = co_moe_up_bf16(g, a, na);
    void *DGU = co_moe_up_bf16(g, dgu, ng), *INPLACE = co_moe_up_bf16(g, gu, ng);
    swiglu_fused_forward_cpu(a, ld, gu, rows, f);
    swiglu_fused_backward_cpu(dgu, da, ld, gu, rows, f);
    swiglu_fused_forward_cuda(g, A, ld, GU, rows, f);
    swiglu_fused_backward_cuda(g, DGU, DA, ld, GU, rows, f);  // written over dgu's other values
    swiglu_fused_backward_cuda(g, INPLACE, DA, ld, INPLACE, rows, f);  // and over gu itself
    co_moe_cmp_bf16(&r, g, "a", A, a, na, CO_MOE_TOL_ROUND1, 0);
    co_moe_cmp_bf16(&r, g, "dgu", DGU, dgu, ng, CO_MOE_TOL_ROUND1, 0);
    co_moe_cmp_bf16(&r, g, "dgu in place", INPLACE, dgu, ng, CO_MOE_TOL_ROUND1, 0);
    co_free(g, GU, ng * b2), co_free(g, DA, na * b2), co_free(g, A, na * b2), co_free(g, DGU, ng * b2);
    co_free(g, INPLACE, ng * b2);
    free(gu), free(da), free(a), free(dgu);
    return r;
}

// gpt-oss's clamped SwiGLU over the fused layout against its fp32 twin on the same bf16 inputs:
// each stored value one rounding (CO_MOE_TOL_ROUND1), dgu written over other values and in place.
// limit 1.375 is a bf16 value, so every fifth input is exactly ±limit, a bf16 neighbour of it
// (1.375 ± 2^-7) or far outside (±500): the clamps' masks must agree element for element (a mask
// that cut at the bound itself, < for ≤, leaves a whole element out, far beyond the tolerance).
static co_result co_swiglu_clamped_fused(mt_backend *g, int64_t rows, int64_t f, int64_t ld, uint64_t seed) {
    co_result r = co_begin();
    co_seed(seed);
    const float lim = 1.375f, alpha = 1.702f, ulp = 0.0078125f;
    const float special[] = {lim, -lim, lim + ulp, -lim - ulp, lim - ulp, -lim + ulp, 500.0f, -500.0f};
    size_t na = (size_t)(rows * ld), ng = (size_t)(2 * rows * f), b2 = sizeof(mt_bf16);
    float *gu = co_rand(ng, -3, 3), *da = co_rand(na, -1, 1), *a = co_rand(na, -5, 5), *dgu = co_rand(ng, -1, 1);
    for (size_t i = 0, j = 0; i < ng; i += 5, j++) gu[i] = special[(j + i / 7) % MT_ARRAY_LEN(special)];
    void *GU = co_moe_up_bf16(g, gu, ng), *DA = co_moe_up_bf16(g, da, na), *A = co_moe_up_bf16(g, a, na);
    void *DGU = co_moe_up_bf16(g, dgu, ng), *INPLACE = co_moe_up_bf16(g, gu, ng);
    swiglu_clamped_fused_forward_cpu(a, ld, gu, rows, f, alpha, lim);
    swiglu_clamped_fused_backward_cpu(dgu, da, ld, gu, rows, f, alpha, lim);
    swiglu_clamped_fused_forward_cuda(g, A, ld, GU, rows, f, alpha, lim);
    swiglu_clamped_fused_backward_cuda(g, DGU, DA, ld, GU, rows, f, alpha, lim);
    swiglu_clamped_fused_backward_cuda(g, INPLACE, DA, ld, INPLACE, rows, f, alpha, lim);
    co_moe_cmp_bf16(&r, g, "a", A, a, na, CO_MOE_TOL_ROUND1, 0);
    co_moe_cmp_bf16(&r, g, "dgu", DGU, dgu, ng, CO_MOE_TOL_ROUND1, 0);
    co_moe_cmp_bf16(&r, g, "dgu in place", INPLACE, dgu, ng, CO_MOE_TOL_ROUND1, 0);
    co_free(g, GU, ng * b2), co_free(g, DA, na * b2), co_free(g, A, na * b2), co_free(g, DGU, ng * b2);
    co_free(g, INPLACE, ng * b2);
    free(gu), free(da), free(a), free(dgu);
    return r;
}

// ---------------------------------------------------------------------------------------------
// The parts some families add (model/parts_cuda.cu against model/bias.c), on bf16 storage.

// Biases: y [T, n] += b (one add of the same values, rounded once: bit for bit); db [n] += the
// column sums of dy over T (fp32 sums in another order than the CPU's double, rounded once onto
// the starting db). n = 70: three column blocks, the last one partial; T = 301: row groups of
// unequal length. Then T·n launched on one row (T = 1).
static co_result co_bias(mt_backend *g) {
    co_result r = cb_begin(61);
    const int64_t T = 301, n = 70;
    const size_t ny = (size_t)(T * n);
    float *y = cb_rand(ny, -2, 2), *b = cb_rand(n, -1, 1), *dy = cb_rand(ny, -1, 1), *db = cb_rand(n, -1, 1);
    void *Y = cb_up(g, y, ny), *Bd = cb_up(g, b, n), *DY = cb_up(g, dy, ny), *DB = cb_up(g, db, n);
    bias_forward_cpu(y, b, T, n), bias_backward_cpu(db, dy, T, n);
    for (size_t i = 0; i < ny; i++) y[i] = cb_r(y[i]);
    bias_forward_cuda(g, Y, Bd, T, n), bias_backward_cuda(g, DB, DY, T, n);
    cb_cmp(&r, g, "y", Y, y, ny, 1, CB_EXACT);
    cb_cmp(&r, g, "db", DB, db, n, 1, CB_ONE_ROUNDING);
    bias_backward_cuda(g, NULL, DY, T, n);  // a frozen bias: nothing to do
    co_free(g, Y, ny * 2), co_free(g, Bd, n * 2), co_free(g, DY, ny * 2), co_free(g, DB, n * 2);
    free(y), free(b), free(dy), free(db);
    return r;
}

// gpt-oss's router bias on the fp32 logits [T, E]: one fp32 add of the same values (bit for bit);
// db (bf16) += the column sums of dlogits (fp32, in another order than the CPU's double), rounded
// once onto the starting db. E = 70: three column blocks, the last partial; E = 6 the tiny config's.
static co_result co_logit_bias(mt_backend *g, int64_t T, int64_t E, uint64_t seed) {
    co_result r = cb_begin(seed);
    const size_t n = (size_t)(T * E);
    float *x = co_rand(n, -8, 8), *b = cb_rand((size_t)E, -1, 1), *dl = co_rand(n, -1e-2f, 1e-2f);
    float *db = cb_rand((size_t)E, -1e-2f, 1e-2f);
    void *X = co_up(g, x, n * 4), *Bd = cb_up(g, b, (size_t)E), *DL = co_up(g, dl, n * 4), *DB = cb_up(g, db, (size_t)E);
    bias_forward_cpu(x, b, T, E), bias_backward_cpu(db, dl, T, E);
    logit_bias_forward_cuda(g, X, Bd, T, E), logit_bias_backward_cuda(g, DB, DL, T, E);
    cb_cmp(&r, g, "logits", X, x, n, 0, CB_EXACT);
    cb_cmp(&r, g, "db", DB, db, (size_t)E, 1, CB_ONE_ROUNDING);
    logit_bias_backward_cuda(g, NULL, DL, T, E);  // a frozen bias: nothing to do
    co_free(g, X, n * 4), co_free(g, Bd, (size_t)E * 2), co_free(g, DL, n * 4), co_free(g, DB, (size_t)E * 2);
    free(x), free(b), free(dl), free(db);
    return r;
}

// gpt-oss's expert biases over one grouped call's rows (model/experts_gpu.c): E experts with random
// row counts, some without rows (every `empty`-th, and the first), the call's rows starting at
// off[0] = 5 (the offsets are a layer's, not the call's); y a column block [rows, n] of a buffer
// of row stride 2n + 3 (g and u are blocks of gu [rows, 2f]). Forward: one add of the same values
// rounded once: the CPU's fp32 sum rounded, bit for bit, the other columns untouched. Backward:
// each expert's column sums over its rows (fp32, fixed order) rounded once onto its row of db
// (experts without rows: unchanged).
static co_result co_expert_bias(mt_backend *g, int E, int64_t n, int empty, uint64_t seed) {
    co_result r = cb_begin(seed);
    mt_expert_offsets off = {.experts = E};
    off.off[0] = 5;
    for (int e = 0; e < E; e++) {
        int32_t c = e == 0 || e % empty == empty - 1 ? 0 : 1 + co_int(8);
        off.off[e + 1] = off.off[e] + c;
    }
    const int64_t rows = off.off[E] - off.off[0], ld = 2 * n + 3;
    const size_t ny = (size_t)(rows * ld), nb = (size_t)E * (size_t)n;
    float *y = cb_rand(ny, -2, 2), *b = cb_rand(nb, -1, 1), *dy = cb_rand(ny, -1, 1), *db = cb_rand(nb, -1, 1);
    void *Y = cb_up(g, y, ny), *Bd = cb_up(g, b, nb), *DY = cb_up(g, dy, ny), *DB = cb_up(g, db, nb);
    expert_bias_forward_cpu(y + n, ld, b, n, n, &off), expert_bias_backward_cpu(db, n, dy + n, ld, n, &off);
    for (size_t i = 0; i < ny; i++) y[i] = cb_r(y[i]);
    expert_bias_forward_cuda(g, (mt_bf16 *)Y + n, ld, Bd, n, n, &off);
    expert_bias_backward_cuda(g, DB, n, (const mt_bf16 *)DY + n, ld, n, &off);
    cb_cmp(&r, g, "y", Y, y, ny, 1, CB_EXACT);
    cb_cmp(&r, g, "db", DB, db, nb, 1, CB_ONE_ROUNDING);
    expert_bias_backward_cuda(g, NULL, n, DY, ld, n, &off);  // frozen biases: nothing to do
    co_free(g, Y, ny * 2), co_free(g, Bd, nb * 2), co_free(g, DY, ny * 2), co_free(g, DB, nb * 2);
    free(y), free(b), free(dy), free(db);
    return r;
}

// clip_qkv: the clamp (a clamped value is ±c rounded once: the CPU's, rounded, bit for bit) and
// its two backwards, which zero dy where the value before clamping was outside [−c, c]: x itself,
// or RMSNorm's output w · (x · rstd) (rows of `width`), which the GPU rounds to bf16 as its forward
// stored it before comparing. An element whose fp32 value lies within bf16's rounding of ±c can be
// cut on one side only, so dy is 0 there on both (the whole-step test covers that boundary).
static co_result co_clip(mt_backend *g) {
    co_result r = cb_begin(62);
    const int64_t rows = 41, width = 24;
    const size_t n = (size_t)(rows * width);
    const float c = 0.7f;
    float *x = cb_rand(n, -2, 2), *dy = cb_rand(n, -1, 1), *dyn = cb_rand(n, -1, 1), *w = cb_rand(width, 0.5f, 1.5f);
    float *rstd = co_rand(rows, 0, 0), *yn = co_rand(n, 0, 0);
    rmsnorm_forward_cpu(yn, rstd, x, w, (int)rows, (int)width, 1e-5f);
    for (size_t i = 0; i < n; i++)
        if (fabsf(fabsf(yn[i]) - c) < c / 128) dyn[i] = 0.0f;
    void *X = cb_up(g, x, n), *DY = cb_up(g, dy, n), *DYN = cb_up(g, dyn, n), *W = cb_up(g, w, width);
    void *R = co_up(g, rstd, (size_t)rows * 4);
    clip_backward_cuda(g, DY, X, (int64_t)n, c);
    clip_backward_normed_cuda(g, DYN, X, R, W, rows, width, c);
    clip_forward_cuda(g, X, (int64_t)n, c);
    clip_backward_cpu(dy, x, (int64_t)n, c);
    clip_backward_normed_cpu(dyn, x, rstd, w, rows, width, c);
    clip_forward_cpu(x, (int64_t)n, c);
    for (size_t i = 0; i < n; i++) x[i] = cb_r(x[i]);
    cb_cmp(&r, g, "x clamped", X, x, n, 1, CB_EXACT);
    cb_cmp(&r, g, "dy", DY, dy, n, 1, CB_EXACT);
    cb_cmp(&r, g, "dy (normed)", DYN, dyn, n, 1, CB_EXACT);
    co_free(g, X, n * 2), co_free(g, DY, n * 2), co_free(g, DYN, n * 2), co_free(g, W, (size_t)width * 2);
    co_free(g, R, (size_t)rows * 4);
    free(x), free(dy), free(dyn), free(w), free(rstd), free(yn);
    return r;
}

// The shared expert's gate: s = sigmoid(logit) in fp32 (logits to ±100, where e^100 overflows:
// expf's last bits only); out += s ⊙ y (with s, one rounding; without, one add: bit for bit);
// its backward dy = s · dx (one rounding) and ds = s (1 − s) Σ_i dx·y (fp32 row sums in another
// order than the CPU's double). H = 70: a row over several warps, not a multiple of the block.
static co_result co_shared_gate(mt_backend *g) {
    co_result r = cb_begin(63);
    const int64_t T = 19, H = 70;
    const size_t n = (size_t)(T * H);
    float *s = co_rand(T, -12, 12), *out = cb_rand(n, -2, 2), *y = cb_rand(n, -1, 1), *dx = cb_rand(n, -1, 1);
    s[0] = 100.0f, s[1] = -100.0f;
    float *out1 = co_copy(out, n), *dy = co_rand(n, 0, 0), *ds = co_rand(T, 0, 0);
    void *S = co_up(g, s, (size_t)T * 4), *O = cb_up(g, out, n), *O1 = cb_up(g, out, n), *Y = cb_up(g, y, n);
    void *DX = cb_up(g, dx, n), *DY = co_up(g, NULL, n * 2), *DS = co_up(g, NULL, (size_t)T * 4);
    sigmoid_cpu(s, T), sigmoid_cuda(g, S, T);
    cb_cmp(&r, g, "s", S, s, (size_t)T, 0, CB_FP32);
    g->ops->upload(g, S, s, (size_t)T * 4);  // the same s on both from here
    scaled_add_cpu(out, y, s, T, H), scaled_add_cpu(out1, y, NULL, T, H);
    scaled_add_cuda(g, O, Y, S, T, H), scaled_add_cuda(g, O1, Y, NULL, T, H);
    for (size_t i = 0; i < n; i++) out1[i] = cb_r(out1[i]);
    cb_cmp(&r, g, "out += s y", O, out, n, 1, CB_ONE_ROUNDING);
    cb_cmp(&r, g, "out += y", O1, out1, n, 1, CB_EXACT);
    gate_backward_cpu(dy, ds, dx, y, s, T, H), gate_backward_cuda(g, DY, DS, DX, Y, S, T, H);
    cb_cmp(&r, g, "dy", DY, dy, n, 1, CB_ONE_ROUNDING);
    cb_cmp(&r, g, "ds", DS, ds, (size_t)T, 0, CB_FP32);
    co_free(g, S, (size_t)T * 4), co_free(g, O, n * 2), co_free(g, O1, n * 2), co_free(g, Y, n * 2);
    co_free(g, DX, n * 2), co_free(g, DY, n * 2), co_free(g, DS, (size_t)T * 4);
    free(s), free(out), free(out1), free(y), free(dx), free(dy), free(ds);
    return r;
}

// The replay's weights of recorded choices (moe_weights_of_choices_cuda): the chosen
// probabilities, divided by their sum when norm (norm_topk_prob), as they are when not. fp32.
static co_result co_weights_of_choices(mt_backend *g, int norm) {
    co_result r = co_begin();
    co_seed(64 + (uint64_t)norm);
    const int T = 37, E = 7, k = 3;
    float *p = co_rand((size_t)T * E, 0.01f, 1), *want = co_rand((size_t)T * k, 0, 0);
    int32_t *ids = mt_xmalloc((size_t)T * k * 4);
    for (int t = 0; t < T; t++) {
        float sum = 0;
        for (int j = 0; j < k; j++) ids[t * k + j] = (t + 2 * j) % E, sum += p[t * E + ids[t * k + j]];
        for (int j = 0; j < k; j++) want[t * k + j] = p[t * E + ids[t * k + j]] / (norm ? sum : 1.0f);
    }
    void *P = co_up(g, p, (size_t)T * E * 4), *I = co_up(g, ids, (size_t)T * k * 4), *W = co_up(g, NULL, (size_t)T * k * 4);
    moe_weights_of_choices_cuda(g, W, P, I, T, E, k, norm);
    co_cmp_dev(&r, g, "weights", W, want, (size_t)T * k);
    co_free(g, P, (size_t)T * E * 4), co_free(g, I, (size_t)T * k * 4), co_free(g, W, (size_t)T * k * 4);
    free(p), free(want), free(ids);
    return r;
}

// ---------------------------------------------------------------------------------------------
// LoRA and AdamW (need lora/lora.c and optim/optim.c, hence OpenBLAS and cJSON)

__attribute__((unused)) static co_result co_skipped(const char *why) {
    co_result r = co_begin();
    r.skipped = 1;
    snprintf(r.what, sizeof r.what, "%.150s", why);
    return r;
}

#ifdef CUDA_OPS_NO_HOST_LIBS
static co_result co_lora(mt_backend *g, double dropout, int y_f32) {
    (void)g, (void)dropout, (void)y_f32;
    return co_skipped("built without lora/lora.c (no OpenBLAS)");
}
static co_result co_adamw(mt_backend *g, int master) {
    (void)g, (void)master;
    return co_skipped("built without optim/optim.c (no cJSON)");
}
#else
// The GPU step's LoRA (lora/lora_dev.c) on bf16 A, B, x: xa = dropout(x)·Aᵀ is one rounding of an
// fp32 sum of exact products (CB_ONE_ROUNDING); y, dA, dB and dx come one GEMM after a rounded
// bf16 intermediate (xa, or the scratch scale·dy·B), so two roundings in a chain: 1e-2 (2 × 5e-3).
// y is a column block of a wider matrix (ld) in bf16, or f32 as the router's logits are; the
// gradients start non-zero (they accumulate). The CPU twin runs on the same bf16-rounded values.
static co_result co_lora(mt_backend *g, double dropout, int y_f32) {
    co_result r = cb_begin(17 + (uint64_t)(dropout * 100) + (uint64_t)y_f32);
    mt_backend *cpu = mt_backend_cpu_new();
    const int64_t in = 48, out = 40, n = 33, ldy = out + 24;
    const int rank = 8;
    mt_lora lc, lg;
    if (mt_lora_init(&lc, cpu, MT_F32, in, out, rank, 16.0, 0, dropout, 5, 9) != 0 ||
        mt_lora_init(&lg, g, MT_BF16, in, out, rank, 16.0, 0, dropout, 5, 9) != 0)
        mt_fatal(MT_EXIT_ERROR, "lora init: %s", mt_error_get());
    lc.dropout_seed = lg.dropout_seed = 0x1234567ull;
    size_t na_w = (size_t)(rank * in), nb_w = (size_t)(out * rank);
    float *a = cb_rand(na_w, -0.3f, 0.3f), *b = cb_rand(nb_w, -0.5f, 0.5f);  // B = 0 at init: make it count
    float *da = cb_rand(na_w, -1, 1), *db = cb_rand(nb_w, -1, 1);
    memcpy(lc.a->data, a, lc.a->nbytes), memcpy(lc.b->data, b, lc.b->nbytes);
    memcpy(lc.da->data, da, lc.da->nbytes), memcpy(lc.db->data, db, lc.db->nbytes);
    void *ga = cb_up(g, a, na_w), *gb = cb_up(g, b, nb_w), *gda = cb_up(g, da, na_w), *gdb = cb_up(g, db, nb_w);
    g->ops->copy(g, lg.a->data, ga, na_w * 2), g->ops->copy(g, lg.b->data, gb, nb_w * 2);
    g->ops->copy(g, lg.da->data, gda, na_w * 2), g->ops->copy(g, lg.db->data, gdb, nb_w * 2);
    size_t nx = (size_t)(n * in), nyw = (size_t)(n * ldy), ny = (size_t)(n * out), na = (size_t)(n * rank);
    float *x = cb_rand(nx, -1, 1), *yw = cb_rand(nyw, -1, 1), *dy = cb_rand(ny, -1, 1), *dx = cb_rand(nx, -1, 1);
    float *y = mt_xmalloc(ny * 4), *xa = co_rand(na, 0, 0), *scratch = co_rand(na, 0, 0);
    for (int64_t i = 0; i < n; i++) memcpy(y + i * out, yw + i * ldy, (size_t)out * 4);  // y: the first out columns
    mt_dtype ydt = y_f32 ? MT_F32 : MT_BF16;
    void *X = cb_up(g, x, nx), *DY = cb_up(g, dy, ny), *DX = cb_up(g, dx, nx), *XA = co_up(g, NULL, na * 2);
    void *Y = y_f32 ? co_up(g, yw, nyw * 4) : cb_up(g, yw, nyw);
    mt_tensor tx = mt_view2(g, X, MT_BF16, n, in, 0), ty = mt_view2(g, Y, ydt, n, out, ldy);
    mt_tensor txa = mt_view2(g, XA, MT_BF16, n, rank, 0), tdy = mt_view2(g, DY, MT_BF16, n, out, 0);
    mt_tensor tdx = mt_view2(g, DX, MT_BF16, n, in, 0);
    mt_lora_forward_cpu(&lc, y, x, xa, n);
    mt_lora_backward_cpu(&lc, dx, dy, x, xa, scratch, n);
    mt_lora_forward_dev(&lg, &ty, &tx, &txa, NULL);
    mt_lora_backward_dev(&lg, &tdx, &tdy, &tx, &txa, NULL);
    float *yg = cb_down(g, Y, nyw, !y_f32), *yblock = mt_xmalloc(ny * 4);
    int untouched = 1;  // the columns beyond the block are left as they were
    for (int64_t i = 0; i < n; i++) {
        memcpy(yblock + i * out, yg + i * ldy, (size_t)out * 4);
        for (int64_t j = out; j < ldy; j++) untouched &= cb_bits(yg[i * ldy + j]) == cb_bits(yw[i * ldy + j]);
    }
    cb_check(&r, "y (column block)", yblock, y, ny, 1e-2);
    if (!untouched) r.err = INFINITY, snprintf(r.what, sizeof r.what, "y: columns beyond the block were written");
    cb_cmp(&r, g, "xa", XA, xa, na, 1, CB_ONE_ROUNDING);
    cb_cmp(&r, g, "dx", DX, dx, nx, 1, 1e-2);
    cb_cmp(&r, g, "dA", lg.da->data, lc.da->data, na_w, 1, 1e-2);
    cb_cmp(&r, g, "dB", lg.db->data, lc.db->data, nb_w, 1, 1e-2);
    co_free(g, X, nx * 2), co_free(g, Y, nyw * (y_f32 ? 4 : 2)), co_free(g, DY, ny * 2), co_free(g, DX, nx * 2);
    co_free(g, XA, na * 2), co_free(g, ga, na_w * 2), co_free(g, gb, nb_w * 2), co_free(g, gda, na_w * 2);
    co_free(g, gdb, nb_w * 2);
    mt_lora_free(&lc), mt_lora_free(&lg);
    mt_backend_free(cpu);
    free(a), free(b), free(da), free(db), free(x), free(yw), free(y), free(dy), free(dx), free(xa), free(scratch);
    free(yg), free(yblock);
    return r;
}

// Three AdamW steps (clipping active on the first) of an f32 matrix (decay), an f32 vector (no
// decay) and a bf16 matrix (with or without an fp32 master): CPU mt_adamw_step against
// mt_grad_norm_cuda + mt_adamw_scalars_make + adamw_update_cuda.
static co_result co_adamw(mt_backend *g, int master) {
    co_result r = co_begin();
    co_seed(19 + (uint64_t)master);
    mt_backend *cpu = mt_backend_cpu_new();
    enum { NP = 3 };
    const int64_t shapes[NP][2] = {{37, 70}, {1, 300}, {20, 33}};
    const mt_dtype dts[NP] = {MT_F32, MT_F32, MT_BF16};
    mt_param pc[NP], pg[NP];
    for (int i = 0; i < NP; i++) {
        int nd = shapes[i][0] == 1 ? 1 : 2;
        const int64_t *sh = nd == 1 ? &shapes[i][1] : shapes[i];
        pc[i] = (mt_param){.name = "p", .w = mt_tensor_new(cpu, MT_MEM_TRAIN, dts[i], nd, sh),
                           .g = mt_tensor_new(cpu, MT_MEM_GRAD, dts[i], nd, sh), .decay = nd == 2};
        pg[i] = (mt_param){.name = "p", .w = mt_tensor_new(g, MT_MEM_TRAIN, dts[i], nd, sh),
                           .g = mt_tensor_new(g, MT_MEM_GRAD, dts[i], nd, sh), .decay = nd == 2};
        size_t n = (size_t)mt_tensor_numel(pc[i].w);
        float *w = co_rand(n, -1, 1);
        mt_convert(pc[i].w->data, dts[i], w, MT_F32, n);
        mt_tensor_upload(pg[i].w, pc[i].w->data);
        free(w);
    }
    mt_adamw_opts o = mt_adamw_opts_default();
    o.weight_decay = 0.1;
    o.master_weights = master;
    mt_adamw oc, og;
    if (mt_adamw_init(&oc, cpu, pc, NP, &o) != 0 || mt_adamw_init(&og, g, pg, NP, &o) != 0)
        mt_fatal(MT_EXIT_ERROR, "adamw init: %s", mt_error_get());
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < NP; i++) {
            size_t n = (size_t)mt_tensor_numel(pc[i].g);
            float *gr = co_rand(n, -2, 2);
            mt_convert(pc[i].g->data, dts[i], gr, MT_F32, n);
            mt_tensor_upload(pg[i].g, pc[i].g->data);
            free(gr);
        }
        double lr = 1e-3 * (step + 1), clip = 5.0, norm_cpu = 0;
        if (mt_adamw_step(&oc, pc, NP, lr, clip, &norm_cpu) != 0) mt_fatal(MT_EXIT_ERROR, "adamw: %s", mt_error_get());
        double norm_gpu = mt_grad_norm_cuda(g, pg, NP);
        co_cmp_scalar(&r, "grad norm", norm_gpu, norm_cpu);
        // The update on the CPU's scalars: the element rule is then compared bit for bit (a last-bit
        // difference of the norms could flip a bf16 rounding, which is not what this checks).
        mt_adamw_scalars k = mt_adamw_scalars_make(&og.opts, og.step + 1, lr, clip, norm_cpu);
        if (adamw_update_cuda(g, &og, pg, NP, &k) != 0) mt_fatal(MT_EXIT_ERROR, "adamw cuda: %s", mt_error_get());
        og.step++;
    }
    for (int i = 0; i < NP; i++) {
        size_t n = (size_t)mt_tensor_numel(pc[i].w);
        co_cmp_dev(&r, g, "m", og.m[i]->data, oc.m[i]->data, n);
        co_cmp_dev(&r, g, "v", og.v[i]->data, oc.v[i]->data, n);
        if (oc.master[i]) co_cmp_dev(&r, g, "master", og.master[i]->data, oc.master[i]->data, n);
        if (dts[i] == MT_F32) {
            co_cmp_dev(&r, g, "w", pg[i].w->data, pc[i].w->data, n);
        } else {  // bf16 weights: compared as f32 values
            float *want = mt_xmalloc(n * 4), *got16 = mt_xmalloc(n * 2), *got = mt_xmalloc(n * 4);
            mt_convert(want, MT_F32, pc[i].w->data, MT_BF16, n);
            mt_tensor_download(pg[i].w, got16);
            mt_convert(got, MT_F32, got16, MT_BF16, n);
            void *G = co_up(g, got, n * 4);
            co_cmp_dev(&r, g, "w (bf16)", G, want, n);
            co_free(g, G, n * 4);
            free(want), free(got16), free(got);
        }
    }
    mt_adamw_free(&oc), mt_adamw_free(&og);
    for (int i = 0; i < NP; i++) mt_tensor_free(pc[i].w), mt_tensor_free(pc[i].g), mt_tensor_free(pg[i].w), mt_tensor_free(pg[i].g);
    mt_backend_free(cpu);
    return r;
}
#endif

// ---------------------------------------------------------------------------------------------
// The list both runners walk.

typedef struct {
    const char *name;
    co_result (*run)(mt_backend *g);
} co_case;

static co_result co_embedding_h100(mt_backend *g) { return co_embedding(g, 37, 100, 16, 1); }
static co_result co_embedding_h128(mt_backend *g) { return co_embedding(g, 700, 128, 300, 11); }
static co_result co_rmsnorm_h257(mt_backend *g) { return co_rmsnorm(g, 300, 257, 2); }
static co_result co_rmsnorm_h256(mt_backend *g) { return co_rmsnorm(g, 600, 256, 12); }
static co_result co_attention_causal(mt_backend *g) { return co_attention(g, 2, 37, 4, 2, 64, 0, 0, 21, 0); }
static co_result co_attention_window_mask(mt_backend *g) { return co_attention(g, 2, 70, 2, 1, 32, 5, 2, 22, 0); }
static co_result co_attention_hd128_padding(mt_backend *g) { return co_attention(g, 1, 45, 2, 2, 128, 0, 1, 23, 0); }
static co_result co_attention_hd40_window1(mt_backend *g) { return co_attention(g, 3, 20, 3, 1, 40, 1, 1, 24, 0); }
static co_result co_attention_hd128_gqa_window(mt_backend *g) { return co_attention(g, 2, 24, 4, 1, 128, 9, 2, 25, 0); }
static co_result co_attention_hd36_padding(mt_backend *g) { return co_attention(g, 2, 19, 2, 2, 36, 0, 1, 26, 0); }
// Tensor-core tiles: 16 rows per warp, 32 keys per tile, 64 (hd ≤ 128) or 32 (hd > 128) queries
// per block; S below is not a multiple of any of them.
static co_result co_attention_gqa4_hd64_left_pad(mt_backend *g) { return co_attention(g, 2, 75, 8, 2, 64, 0, 3, 27, 0); }
static co_result co_attention_gqa8_hd128(mt_backend *g) { return co_attention(g, 1, 130, 8, 1, 128, 0, 1, 28, 0); }
static co_result co_attention_mqa_window_left_pad(mt_backend *g) { return co_attention(g, 2, 100, 3, 1, 64, 40, 3, 29, 0); }
static co_result co_attention_hd256_left_pad(mt_backend *g) { return co_attention(g, 1, 50, 2, 1, 256, 0, 3, 30, 0); }
// The configurations of the CPU twin's finite-difference tests (tests/test_model_ops.c,
// attention_backward_fd_*: B 2, S 9, hd 8): the CUDA op matches the twin there, which FD checks.
static co_result co_attention_fd_gqa_window(mt_backend *g) { return co_attention(g, 2, 9, 4, 2, 8, 4, 3, 31, 0); }
static co_result co_attention_fd_mqa_window(mt_backend *g) { return co_attention(g, 2, 9, 4, 1, 8, 3, 3, 32, 0); }
static co_result co_attention_fd_mha(mt_backend *g) { return co_attention(g, 2, 9, 4, 4, 8, 0, 0, 33, 0); }
// Each path forced on the shapes both take: causal, GQA, sliding window, right padding (cuDNN
// takes it as sequence lengths).
static co_result co_attention_wmma_gqa(mt_backend *g) { return co_attention(g, 2, 37, 4, 2, 64, 0, 0, 21, 1); }
static co_result co_attention_cudnn_gqa(mt_backend *g) { return co_attention(g, 2, 37, 4, 2, 64, 0, 0, 21, 2); }
static co_result co_attention_auto_window(mt_backend *g) { return co_attention(g, 2, 40, 6, 2, 32, 7, 0, 34, 0); }
static co_result co_attention_wmma_window(mt_backend *g) { return co_attention(g, 2, 40, 6, 2, 32, 7, 0, 34, 1); }
static co_result co_attention_cudnn_window(mt_backend *g) { return co_attention(g, 2, 40, 6, 2, 32, 7, 0, 34, 2); }
static co_result co_attention_cudnn_padding_lens(mt_backend *g) { return co_attention(g, 3, 33, 4, 1, 64, 0, 1, 35, 2); }
static co_result co_attention_cudnn_window_lens(mt_backend *g) { return co_attention(g, 2, 45, 2, 2, 128, 9, 1, 36, 2); }
static co_result co_attention_cudnn_mqa_hd256(mt_backend *g) { return co_attention(g, 1, 50, 2, 1, 256, 0, 0, 37, 2); }
// Learned sinks (gpt-oss): with a window and left padding (rows with no key: out 0, lse the
// sink), GQA, a head size of the fixture's (24: element loads), and under MT_ATTENTION=cudnn,
// which must fall back to the WMMA kernels rather than refuse.
static co_result co_attention_sinks_gqa(mt_backend *g) { return co_attention_sinks(g, 2, 37, 4, 2, 64, 0, 0, 51, 0, 1); }
static co_result co_attention_sinks_window_pad(mt_backend *g) {
    return co_attention_sinks(g, 2, 70, 4, 1, 32, 5, 3, 52, 0, 1);
}
static co_result co_attention_sinks_hd24(mt_backend *g) { return co_attention_sinks(g, 2, 7, 4, 2, 24, 5, 2, 53, 0, 1); }
static co_result co_attention_sinks_cudnn_mode(mt_backend *g) {
    return co_attention_sinks(g, 2, 40, 6, 2, 64, 7, 1, 54, 3, 1);
}
// MLA (DeepSeek V2/V3): q, k of nope + rope dims, v and out of their own, the scale hd^-0.5 · mscale²
// (mscale = 0.1 · ln 40 + 1, V3's). hd 20 | 10 (neither a multiple of 16: zero-padded tiles) with a
// scale of neither dim, hd_v > hd, the real 192 | 128 (2 warps) and it scaled down to 48 | 32
// (one kv head per query head, as MLA expands them); each path forced on 48 | 32 and 24 | 16
// (cuDNN: d_qk ≠ d_v in its graph); and sinks beside hd ≠ hd_v.
static float co_mla_scale(int hd) {
    float m = 0.1f * logf(40.0f) + 1.0f;
    return 1.0f / sqrtf((float)hd) * m * m;
}
static co_result co_attention_mla_hd20_v10(mt_backend *g) {
    return co_attention_mla(g, 2, 37, 4, 2, 20, 10, 0.37f, 0, 0, 61, 0, 0);
}
static co_result co_attention_mla_hd20_v10_window_mask(mt_backend *g) {
    return co_attention_mla(g, 2, 70, 4, 1, 20, 10, 0.37f, 5, 2, 62, 0, 0);
}
static co_result co_attention_mla_hd10_v20(mt_backend *g) {
    return co_attention_mla(g, 1, 40, 2, 1, 10, 20, 0.37f, 9, 1, 63, 0, 0);
}
static co_result co_attention_mla_hd48_v32(mt_backend *g) {
    return co_attention_mla(g, 2, 45, 4, 4, 48, 32, co_mla_scale(48), 0, 3, 64, 0, 0);
}
static co_result co_attention_mla_hd192_v128(mt_backend *g) {
    return co_attention_mla(g, 1, 40, 2, 2, 192, 128, co_mla_scale(192), 0, 1, 65, 0, 0);
}
static co_result co_attention_mla_wmma_hd48_v32(mt_backend *g) {
    return co_attention_mla(g, 2, 45, 4, 4, 48, 32, co_mla_scale(48), 0, 1, 66, 1, 0);
}
static co_result co_attention_mla_cudnn_hd48_v32(mt_backend *g) {
    return co_attention_mla(g, 2, 45, 4, 4, 48, 32, co_mla_scale(48), 0, 1, 66, 2, 0);
}
static co_result co_attention_mla_cudnn_gqa_window_hd24_v16(mt_backend *g) {
    return co_attention_mla(g, 2, 40, 6, 2, 24, 16, 0.37f, 7, 0, 67, 2, 0);
}
static co_result co_attention_mla_sinks_hd20_v10(mt_backend *g) {
    return co_attention_mla(g, 2, 37, 4, 2, 20, 10, 0.37f, 5, 2, 68, 0, 1);
}
// RoPE on part of a head: GLM's partial rotary (off 0, half the head), MLA's interleaved rope part
// of q (nope 8 | rope 16, YaRN's scale) and of the shared key (one head: a slice of kv_a's rows).
static co_result co_rope_glm_partial(mt_backend *g) { return co_rope_part(g, 0, 3, 24, 0, 12, 0, 5); }
static co_result co_rope_mla_interleaved(mt_backend *g) { return co_rope_part(g, 1, 3, 24, 8, 16, 1, 6); }
static co_result co_rope_mla_key_slice(mt_backend *g) { return co_rope_part(g, 0, 1, 40, 32, 8, 1, 9); }
static co_result co_mla_kv_small(mt_backend *g) { return co_mla_kv(g, 37, 3, 5, 4, 6, 9, 16); }
static co_result co_mla_kv_v3_like(mt_backend *g) { return co_mla_kv(g, 9, 4, 128, 64, 128, 512, 17); }
static co_result co_ce_accumulate(mt_backend *g) { return co_cross_entropy(g, 0); }
static co_result co_ce_in_place(mt_backend *g) { return co_cross_entropy(g, 1); }
static co_result co_router_k2(mt_backend *g) { return co_router(g, 50, 8, 2, 1); }
static co_result co_router_k1(mt_backend *g) { return co_router(g, 50, 8, 1, 0); }
static co_result co_router_e64_k8(mt_backend *g) { return co_router(g, 40, 64, 8, 1); }
static moe_route_rule co_rule(int sigmoid, int n_group, int topk_group, int top2, int norm, float scaling) {
    return (moe_route_rule){sigmoid, n_group, topk_group, top2, norm, scaling};
}
static co_result co_router_grouped_v3(mt_backend *g) { return co_router_grouped(g, 60, 64, 8, co_rule(1, 8, 4, 1, 1, 2.5f), 1, 81); }
static co_result co_router_grouped_glm(mt_backend *g) { return co_router_grouped(g, 60, 32, 4, co_rule(1, 1, 1, 1, 1, 1.0f), 1, 82); }
static co_result co_router_grouped_v2(mt_backend *g) { return co_router_grouped(g, 60, 16, 6, co_rule(0, 4, 2, 0, 0, 16.0f), 0, 83); }
static co_result co_router_grouped_sigmoid_no_norm(mt_backend *g) {
    return co_router_grouped(g, 40, 12, 3, co_rule(1, 6, 3, 1, 0, 1.5f), 1, 84);
}
static co_result co_permute_k2_empty(mt_backend *g) { return co_permute(g, 300, 8, 2, 5, 0, 31); }
static co_result co_permute_k1(mt_backend *g) { return co_permute(g, 700, 8, 1, -1, 0, 32); }
static co_result co_permute_one_expert(mt_backend *g) { return co_permute(g, 200, 8, 1, -1, 1, 33); }
static co_result co_permute_e64(mt_backend *g) { return co_permute(g, 1000, 64, 4, 7, 0, 34); }
static co_result co_gather_combine_k2(mt_backend *g) { return co_gather_combine(g, 60, 8, 2, 104, 104, 41); }
static co_result co_gather_combine_k1(mt_backend *g) { return co_gather_combine(g, 45, 4, 1, 33, 33, 42); }
static co_result co_gather_combine_k8(mt_backend *g) { return co_gather_combine(g, 40, 16, 8, 64, 64, 43); }
static co_result co_gather_combine_k8_h50(mt_backend *g) { return co_gather_combine(g, 21, 12, 8, 50, 50, 44); }
// xs, dxs, dys with room beside their rows (the experts' folded LoRAs): the 16-byte path, the
// scalar one, and rows 16-byte wide whose stride is not (the scalar path again)
static co_result co_gather_combine_k2_ld(mt_backend *g) { return co_gather_combine(g, 60, 8, 2, 104, 120, 45); }
static co_result co_gather_combine_k8_h50_ld(mt_backend *g) { return co_gather_combine(g, 21, 12, 8, 50, 53, 46); }
static co_result co_gather_combine_k2_ld_odd(mt_backend *g) { return co_gather_combine(g, 60, 8, 2, 104, 108, 47); }
static co_result co_swiglu(mt_backend *g) { return co_swiglu_fused(g, 37, 64, 64, 8.0f, 13); }
static co_result co_swiglu_f37(mt_backend *g) { return co_swiglu_fused(g, 23, 37, 37, 8.0f, 14); }
static co_result co_swiglu_large_gates(mt_backend *g) { return co_swiglu_fused(g, 9, 40, 40, 500.0f, 15); }
// a, da with room beside their rows: the 16-byte path (ld 72), the scalar one (ld 68: 16-byte
// wide rows whose stride is not)
static co_result co_swiglu_ld(mt_backend *g) { return co_swiglu_fused(g, 29, 64, 72, 8.0f, 18); }
static co_result co_swiglu_ld_odd(mt_backend *g) { return co_swiglu_fused(g, 29, 64, 68, 8.0f, 19); }
static co_result co_swiglu_clamped(mt_backend *g) { return co_swiglu_clamped_fused(g, 37, 64, 64, 16); }
static co_result co_swiglu_clamped_f37(mt_backend *g) { return co_swiglu_clamped_fused(g, 23, 37, 37, 17); }
static co_result co_swiglu_clamped_ld(mt_backend *g) { return co_swiglu_clamped_fused(g, 23, 40, 48, 20); }
static co_result co_logit_bias_e70(mt_backend *g) { return co_logit_bias(g, 301, 70, 63); }
static co_result co_logit_bias_e6(mt_backend *g) { return co_logit_bias(g, 26, 6, 64); }
static co_result co_expert_bias_e7(mt_backend *g) { return co_expert_bias(g, 7, 20, 3, 65); }
static co_result co_expert_bias_e256(mt_backend *g) { return co_expert_bias(g, MT_EXPERT_OFFSETS_MAX, 40, 2, 66); }
static co_result co_weights_norm(mt_backend *g) { return co_weights_of_choices(g, 1); }
static co_result co_weights_no_norm(mt_backend *g) { return co_weights_of_choices(g, 0); }
static co_result co_lora_plain(mt_backend *g) { return co_lora(g, 0.0, 0); }
static co_result co_lora_dropout(mt_backend *g) { return co_lora(g, 0.25, 0); }
static co_result co_lora_f32_out(mt_backend *g) { return co_lora(g, 0.1, 1); }
static co_result co_adamw_master(mt_backend *g) { return co_adamw(g, 1); }
static co_result co_adamw_direct(mt_backend *g) { return co_adamw(g, 0); }

__attribute__((unused)) static const co_case co_cases[] = {
    {"embedding H=100", co_embedding_h100},
    {"embedding H=128 T=700", co_embedding_h128},
    {"rmsnorm H=257", co_rmsnorm_h257},
    {"rmsnorm H=256", co_rmsnorm_h256},
    {"rope", co_rope},
    {"rope yarn table (gpt-oss)", co_rope_yarn},
    {"attention causal gqa", co_attention_causal},
    {"attention window+mask (empty rows)", co_attention_window_mask},
    {"attention hd128 padding", co_attention_hd128_padding},
    {"attention hd40 window=1", co_attention_hd40_window1},
    {"attention hd128 gqa window+mask", co_attention_hd128_gqa_window},
    {"attention hd36 (element loads) padding", co_attention_hd36_padding},
    {"attention gqa 4:1 hd64 left padding", co_attention_gqa4_hd64_left_pad},
    {"attention gqa 8:1 hd128 S=130", co_attention_gqa8_hd128},
    {"attention mqa window 40 left padding", co_attention_mqa_window_left_pad},
    {"attention hd256 (2 warps) left padding", co_attention_hd256_left_pad},
    {"attention fd config gqa window", co_attention_fd_gqa_window},
    {"attention fd config mqa window", co_attention_fd_mqa_window},
    {"attention fd config mha", co_attention_fd_mha},
    {"attention wmma forced, gqa", co_attention_wmma_gqa},
    {"attention cudnn forced, gqa", co_attention_cudnn_gqa},
    {"attention auto, gqa window", co_attention_auto_window},
    {"attention wmma forced, gqa window", co_attention_wmma_window},
    {"attention cudnn forced, gqa window", co_attention_cudnn_window},
    {"attention cudnn, padding as lengths, mqa", co_attention_cudnn_padding_lens},
    {"attention cudnn, window + padding as lengths, hd128", co_attention_cudnn_window_lens},
    {"attention cudnn, mqa hd256", co_attention_cudnn_mqa_hd256},
    {"attention sinks, gqa", co_attention_sinks_gqa},
    {"attention sinks, window 5 + left padding (empty rows)", co_attention_sinks_window_pad},
    {"attention sinks, hd24 window + mask", co_attention_sinks_hd24},
    {"attention sinks under MT_ATTENTION=cudnn (WMMA fallback)", co_attention_sinks_cudnn_mode},
    {"attention MLA hd 20 | hd_v 10, scale 0.37", co_attention_mla_hd20_v10},
    {"attention MLA hd 20 | 10, window + mask (empty rows)", co_attention_mla_hd20_v10_window_mask},
    {"attention hd 10 | hd_v 20", co_attention_mla_hd10_v20},
    {"attention MLA 48 | 32 left padding", co_attention_mla_hd48_v32},
    {"attention MLA 192 | 128 (2 warps)", co_attention_mla_hd192_v128},
    {"attention MLA 48 | 32, wmma forced", co_attention_mla_wmma_hd48_v32},
    {"attention MLA 48 | 32, cudnn forced, padding as lengths", co_attention_mla_cudnn_hd48_v32},
    {"attention 24 | 16, cudnn forced, gqa window", co_attention_mla_cudnn_gqa_window_hd24_v16},
    {"attention sinks, hd 20 | 10", co_attention_mla_sinks_hd20_v10},
    {"rope GLM partial (half the head)", co_rope_glm_partial},
    {"rope MLA interleaved part (yarn)", co_rope_mla_interleaved},
    {"rope MLA shared key (a row slice)", co_rope_mla_key_slice},
    {"mla k, v assembly", co_mla_kv_small},
    {"mla k, v assembly, V3's dims", co_mla_kv_v3_like},
    {"cross_entropy", co_ce_accumulate},
    {"cross_entropy in place", co_ce_in_place},
    {"add (bf16)", co_add},
    {"f32 -> bf16", co_f32_to_bf16},
    {"router k=2 ties", co_router_k2},
    {"router k=1 no norm", co_router_k1},
    {"router E=64 k=8", co_router_e64_k8},
    {"router grouped DeepSeek-V3 E=64 8 groups top-4 k=8, bias", co_router_grouped_v3},
    {"router grouped GLM-4.5 E=32 k=4 no groups, bias", co_router_grouped_glm},
    {"router grouped DeepSeek-V2 softmax E=16 4 groups max k=6", co_router_grouped_v2},
    {"router grouped sigmoid no norm E=12 6 groups k=3, bias", co_router_grouped_sigmoid_no_norm},
    {"router load and bias update (masked rows)", co_router_bias_update},
    {"router sequence-wise balance loss (masked rows, an empty sequence)", co_router_seq_aux},
    {"aux loss (masked rows)", co_aux_loss},
    {"z-loss (masked rows)", co_zloss},
    {"permute k=2, an empty expert", co_permute_k2_empty},
    {"permute k=1", co_permute_k1},
    {"permute all on one expert", co_permute_one_expert},
    {"permute E=64 k=4 (many chunks)", co_permute_e64},
    {"gather/combine k=2 H=104, an empty expert", co_gather_combine_k2},
    {"gather/combine k=1 H=33 (scalar path)", co_gather_combine_k1},
    {"gather/combine k=8 H=64", co_gather_combine_k8},
    {"gather/combine k=8 H=50 (scalar path)", co_gather_combine_k8_h50},
    {"gather/combine k=2 H=104, dys rows 120 apart", co_gather_combine_k2_ld},
    {"gather/combine k=8 H=50, dys rows 53 apart (scalar path)", co_gather_combine_k8_h50_ld},
    {"gather/combine k=2 H=104, rows 108 apart (scalar path)", co_gather_combine_k2_ld_odd},
    {"swiglu fused f=64", co_swiglu},
    {"swiglu fused f=37 (scalar path)", co_swiglu_f37},
    {"swiglu fused, a and da 72 apart", co_swiglu_ld},
    {"swiglu fused, a and da 68 apart (scalar path)", co_swiglu_ld_odd},
    {"swiglu clamped fused, a and da 48 apart", co_swiglu_clamped_ld},
    {"swiglu fused, gates to ±500", co_swiglu_large_gates},
    {"swiglu clamped fused f=64 (gpt-oss; at, beside and far past ±limit)", co_swiglu_clamped},
    {"swiglu clamped fused f=37 (scalar path)", co_swiglu_clamped_f37},
    {"bias T=301 n=70", co_bias},
    {"router logit bias T=301 E=70 (fp32 logits)", co_logit_bias_e70},
    {"router logit bias T=26 E=6", co_logit_bias_e6},
    {"expert biases E=7 (empty experts, strided rows)", co_expert_bias_e7},
    {"expert biases E=256 (one call's most)", co_expert_bias_e256},
    {"clip_qkv (plain and after rmsnorm)", co_clip},
    {"shared expert gate (sigmoid, s*y, backward)", co_shared_gate},
    {"replay weights, renormalised", co_weights_norm},
    {"replay weights, norm_topk_prob false", co_weights_no_norm},
    {"lora", co_lora_plain},
    {"lora dropout", co_lora_dropout},
    {"lora into f32 (router logits)", co_lora_f32_out},
    {"adamw master", co_adamw_master},
    {"adamw bf16 direct", co_adamw_direct},
};
