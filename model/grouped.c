// model/grouped.c — model/grouped.h's two calls on every backend: the arguments checked (each
// refusal names the tensor or field), then the null backend does nothing (a counted step), the
// cpu refuses (the grouped GEMM is the GPU step's; the cpu step runs its experts one by one), and
// the cuda backend launches model/grouped_cuda.cu's kernel.
#include <math.h>

#include "core/common.h"
#include "core/profile.h"
#include "model/grouped.h"
#include "model/grouped_cuda.h"

#ifdef MT_CUDA  // only a cuda launch is profiled
// MT_PROFILE: the launch's work from the real rows of each expert. C = A·op(W): 2·n_e·K·N per
// expert with a W; bytes: A's rows, C's (read too when accumulated), W (4-bit as stored, or
// bf16). A 4-bit W is dequantized inside the kernel once per 64-row tile of its expert
// (model/grouped_cuda.cu's BM): 4 ALU FLOPs per element and tile (scripts/step_model.h),
// counted on a row of its own without time (it is inside this launch's).
static void profile_gemm(const mt_tensor *c, const mt_tensor *a, const mt_grouped *g) {
    int64_t K = a->shape[1], N = c->shape[1];
    double flops = 0, bytes = 0, alu = 0, cb = (double)mt_dtype_bytes(c->dtype, 1) * (g->beta != 0.0f ? 2 : 1);
    for (int e = 0; e < g->experts; e++) {
        const mt_qweight *q = g->q ? g->q[e] : NULL;
        const mt_tensor *w = g->w ? g->w[e] : NULL;
        double n = (double)(g->off[e + 1] - g->off[e]);
        if ((!q && !w) || n == 0) continue;
        flops += 2.0 * n * (double)K * (double)N;
        bytes += n * (2.0 * (double)K + cb * (double)N) + (q ? (double)mt_qweight_bytes(q) : 2.0 * (double)K * (double)N);
        if (q) alu += 4.0 * (double)K * (double)N * ceil(n / 64.0);
    }
    mt_prof_count(flops, bytes);
    if (alu > 0) mt_prof_count_untimed("dequant in grouped GEMMs (ALU)", alu, 0);
}

// G_e = X[rows e]ᵀ·Y[rows e]: 2·n_e·M·N per expert with a G; bytes: the rows of X and Y, G read
// and written.
static void profile_gemm_tn(mt_tensor *const *g, const mt_tensor *x, const mt_tensor *y, const mt_grouped *gr) {
    int64_t M = x->shape[1], N = y->shape[1];
    double flops = 0, bytes = 0;
    for (int e = 0; e < gr->experts; e++) {
        double n = (double)(gr->off[e + 1] - gr->off[e]);
        if (!g[e]) continue;
        flops += 2.0 * n * (double)M * (double)N;
        bytes += 2.0 * n * (double)(M + N) + 2.0 * (double)g[e]->nbytes;
    }
    mt_prof_count(flops, bytes);
}
#endif

// Backend kind of a call, refusing the cpu.
static int kind_ok(const mt_tensor *t, const char *fn) {
    if (t->be->ops->kind == MT_BACKEND_CPU) {
        mt_error_set("%s: the grouped GEMM is the GPU step's (cpu backend)", fn);
        return 0;
    }
    return 1;
}

static int is_2d(const mt_tensor *t, const char *fn, const char *name) {
    if (!t || t->ndim != 2) {
        mt_error_set("%s: %s must be a 2-D tensor", fn, name);
        return 0;
    }
    return 1;
}

static int rows_ok(const mt_tensor *t, int64_t need, const char *fn, const char *name) {
    if (t->shape[0] < need) {
        mt_error_set("%s: %s has %lld rows, the experts' offsets reach %lld", fn, name, (long long)t->shape[0],
                     (long long)need);
        return 0;
    }
    return 1;
}

// E, the offsets, beta and the dropout's p.
static int group_ok(const mt_grouped *g, const char *fn) {
    if (!g || g->experts < 1 || g->experts > MT_GROUPED_MAX) {
        mt_error_set("%s: experts = %d, must be 1..%d (split a larger group)", fn, g ? g->experts : 0,
                     MT_GROUPED_MAX);
        return 0;
    }
    if (!g->off || g->off[0] < 0) {
        mt_error_set("%s: off must be set, off[0] >= 0", fn);
        return 0;
    }
    for (int e = 0; e < g->experts; e++)
        if (g->off[e + 1] < g->off[e]) {
            mt_error_set("%s: off[%d] = %lld < off[%d] = %lld: offsets must not decrease", fn, e + 1,
                         (long long)g->off[e + 1], e, (long long)g->off[e]);
            return 0;
        }
    if (g->beta != 0.0f && g->beta != 1.0f) {
        mt_error_set("%s: beta = %g, must be 0 or 1", fn, (double)g->beta);
        return 0;
    }
    if (g->seed && !(g->p >= 0.0f && g->p < 1.0f)) {
        mt_error_set("%s: dropout p = %g, must be in [0, 1)", fn, (double)g->p);
        return 0;
    }
    return 1;
}

// Expert e's W for op(W) [K, N]: exactly one of q[e] and w[e], or none (skipped).
static int weight_ok(const mt_grouped *g, int e, const mt_backend *be, int64_t K, int64_t N) {
    const char *fn = "mt_grouped_gemm";
    const mt_qweight *q = g->q ? g->q[e] : NULL;
    const mt_tensor *w = g->w ? g->w[e] : NULL;
    int64_t rows = g->trans ? N : K, cols = g->trans ? K : N;
    if (q && w) {
        mt_error_set("%s: expert %d has both q[%d] and w[%d]; exactly one W per expert", fn, e, e, e);
        return 0;
    }
    if (q) {
        if (q->type != MT_QUANT_NF4 && q->type != MT_QUANT_FP4 && q->type != MT_QUANT_INT4) {
            mt_error_set("%s: q[%d] is not a 4-bit weight (type %d)", fn, e, (int)q->type);
            return 0;
        }
        if (q->be != be || q->out != rows || q->in != cols) {
            mt_error_set("%s: q[%d] is [%lld, %lld] on %s, must be [%lld, %lld] (trans=%d) on %s", fn, e,
                         (long long)q->out, (long long)q->in, q->be->ops->name, (long long)rows, (long long)cols,
                         g->trans, be->ops->name);
            return 0;
        }
    }
    if (w) {
        if (w->ndim != 2 || w->dtype != MT_BF16 || w->be != be || w->shape[0] != rows || w->shape[1] != cols) {
            mt_error_set("%s: w[%d] is %s %s [%lld, %lld], must be bf16 [%lld, %lld] (trans=%d) on %s", fn, e,
                         mt_dtype_name(w->dtype), w->be->ops->name, (long long)w->shape[0],
                         (long long)(w->ndim > 1 ? w->shape[1] : 0), (long long)rows, (long long)cols, g->trans,
                         be->ops->name);
            return 0;
        }
    }
    return 1;
}

int mt_grouped_gemm(mt_tensor *c, const mt_tensor *a, const mt_grouped *g) {
    const char *fn = "mt_grouped_gemm";
    if (!is_2d(c, fn, "c") || !is_2d(a, fn, "a") || !kind_ok(c, fn) || !group_ok(g, fn)) return -1;
    if (a->dtype != MT_BF16) return mt_error_set("%s: a is %s, must be bf16", fn, mt_dtype_name(a->dtype)), -1;
    if (c->dtype != MT_BF16 && c->dtype != MT_F32)
        return mt_error_set("%s: c is %s, must be bf16 or f32", fn, mt_dtype_name(c->dtype)), -1;
    if (a->be != c->be) return mt_error_set("%s: a and c are on different backends", fn), -1;
    int64_t end = g->off[g->experts], K = a->shape[1], N = c->shape[1];
    if (!rows_ok(a, end, fn, "a") || !rows_ok(c, end, fn, "c")) return -1;
    for (int e = 0; e < g->experts; e++)
        if (!weight_ok(g, e, c->be, K, N)) return -1;
    if (c->be->ops->kind == MT_BACKEND_NULL) return 0;
#ifdef MT_CUDA
    if (mt_prof_active) profile_gemm(c, a, g);
    mt_grouped_gemm_cuda(c->be, c, a, g);
    return 0;
#else
    return mt_error_set("%s: backend %s", fn, c->be->ops->name), -1;
#endif
}

int mt_grouped_gemm_tn(mt_tensor *const *g, const mt_tensor *x, const mt_tensor *y, const mt_grouped *gr) {
    const char *fn = "mt_grouped_gemm_tn";
    if (!is_2d(x, fn, "x") || !is_2d(y, fn, "y") || !kind_ok(x, fn) || !group_ok(gr, fn)) return -1;
    if (!g) return mt_error_set("%s: g must be set", fn), -1;
    if (x->dtype != MT_BF16) return mt_error_set("%s: x is %s, must be bf16", fn, mt_dtype_name(x->dtype)), -1;
    if (y->dtype != MT_BF16) return mt_error_set("%s: y is %s, must be bf16", fn, mt_dtype_name(y->dtype)), -1;
    if (x->be != y->be) return mt_error_set("%s: x and y are on different backends", fn), -1;
    int64_t end = gr->off[gr->experts], M = x->shape[1], N = y->shape[1];
    if (!rows_ok(x, end, fn, "x") || !rows_ok(y, end, fn, "y")) return -1;
    const mt_tensor *first = NULL;
    for (int e = 0; e < gr->experts; e++) {
        const mt_tensor *t = g[e];
        if (!t) continue;
        if (!first) first = t;
        if (t->dtype != first->dtype)
            return mt_error_set("%s: g[%d] is %s, an earlier g is %s: one dtype for every g", fn, e,
                                mt_dtype_name(t->dtype), mt_dtype_name(first->dtype)),
                   -1;
        if (t->ndim != 2 || (t->dtype != MT_BF16 && t->dtype != MT_F32) || t->be != x->be || t->shape[0] != M ||
            t->shape[1] != N || mt_tensor_ld(t) != N)
            return mt_error_set("%s: g[%d] is %s [%lld, %lld], must be a contiguous bf16 or f32 [%lld, %lld] on %s",
                                fn, e, mt_dtype_name(t->dtype), (long long)t->shape[0],
                                (long long)(t->ndim > 1 ? t->shape[1] : 0), (long long)M, (long long)N,
                                x->be->ops->name),
                   -1;
    }
    if (x->be->ops->kind == MT_BACKEND_NULL) return 0;
#ifdef MT_CUDA
    if (mt_prof_active) profile_gemm_tn(g, x, y, gr);
    mt_grouped_gemm_tn_cuda(x->be, g, x, y, gr);
    return 0;
#else
    return mt_error_set("%s: backend %s", fn, x->be->ops->name), -1;
#endif
}
