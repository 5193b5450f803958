// model/grouped.c — model/grouped.h's two calls on every backend: the arguments checked (each
// refusal names the tensor or field), the call's scratch reserved through the ledger (the null
// backend counts it and does nothing else: a counted step), the cpu refuses (the grouped GEMM is
// the GPU step's; the cpu step runs its experts one by one), and the cuda backend runs
// model/grouped_cuda.cu. The profile's FLOPs and bytes are counted by each cuBLASLt call and
// each dequantization where they run.
#include "core/common.h"
#include "model/expert_scratch.h"
#include "model/grouped.h"
#include "model/grouped_cuda.h"

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
    if (!g->off && g->doff) {  // on the device: nothing of them to check here
        if (g->rows < 0) return mt_error_set("%s: rows = %lld with doff", fn, (long long)g->rows), 0;
    } else if (!g->off || g->off[0] < 0) {
        mt_error_set("%s: off must be set, off[0] >= 0", fn);
        return 0;
    }
    for (int e = 0; g->off && e < g->experts; e++)
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
    const mt_qweight *q2 = g->q2 ? g->q2[e] : NULL;
    if (!q != !q2 && g->q2) {
        mt_error_set("%s: expert %d has %s but not %s: a stacked W needs both", fn, e, q ? "q" : "q2", q ? "q2" : "q");
        return 0;
    }
    const mt_tensor *u = g->under ? g->under[e] : NULL;
    if (u && (!q || u->ndim != 2 || u->dtype != MT_BF16 || u->be != be || u->shape[1] != q->in ||
              mt_tensor_ld(u) != u->shape[1])) {
        mt_error_set("%s: under[%d] is %s %s [%lld, %lld], must be a contiguous bf16 [rows, %lld] under a 4-bit q[%d] on %s",
                     fn, e, mt_dtype_name(u->dtype), u->be->ops->name, (long long)u->shape[0],
                     (long long)(u->ndim > 1 ? u->shape[1] : 0), (long long)(q ? q->in : 0), e, be->ops->name);
        return 0;
    }
    const mt_tensor *bs[2] = {g->beside ? g->beside[e] : NULL, g->beside2 ? g->beside2[e] : NULL};
    for (int i = 0; i < 2; i++) {
        const mt_tensor *b = bs[i];
        const mt_qweight *beside_of = i ? q2 : q;
        if (b && (!beside_of || beside_of->in % 8 || u || (i && !bs[0]) || b->ndim != 2 || b->dtype != MT_BF16 ||
                  b->be != be || b->shape[0] != beside_of->out || mt_tensor_ld(b) != b->shape[1])) {
            mt_error_set("%s: beside%s[%d] must be a contiguous bf16 [%lld, rb] on %s beside a 4-bit %s[%d]%s (no under "
                         "rows, in a multiple of 8)",
                         fn, i ? "2" : "", e, (long long)(beside_of ? beside_of->out : 0), be->ops->name, i ? "q2" : "q",
                         e, i ? " and a beside" : "");
            return 0;
        }
    }
    const mt_tensor *cw = q && g->cached ? g->cached[e] : NULL;
    if (cw && (cw->ndim != 2 || cw->dtype != MT_BF16 || cw->be != be ||
               cw->shape[0] < mt_grouped_slot_rows(g, e) || cw->shape[1] < mt_grouped_slot_cols(g, e) ||
               mt_tensor_ld(cw) != cw->shape[1] || (cw->shape[1] != q->in && cw->shape[1] % 8))) {
        mt_error_set("%s: cached[%d] must be a contiguous bf16 [>= %lld, >= %lld] on %s, its row length q's in or a "
                     "multiple of 8",
                     fn, e, (long long)mt_grouped_slot_rows(g, e), (long long)mt_grouped_slot_cols(g, e), be->ops->name);
        return 0;
    }
    if (q) {
        const mt_qweight *part[2] = {q, q2};
        int64_t out = mt_grouped_slot_rows(g, e), in = mt_grouped_slot_cols(g, e);
        for (int i = 0; i < (q2 ? 2 : 1); i++)
            if (part[i]->type != MT_QUANT_NF4 && part[i]->type != MT_QUANT_FP4 && part[i]->type != MT_QUANT_INT4 &&
                part[i]->type != MT_QUANT_MXFP4) {
                mt_error_set("%s: %s[%d] is not a 4-bit weight (type %d)", fn, i ? "q2" : "q", e, (int)part[i]->type);
                return 0;
            }
        if (q->be != be || (q2 && (q2->be != be || q2->in != q->in)) || out != rows || in != cols) {
            mt_error_set("%s: q[%d]%s%s%s is [%lld, %lld] on %s, must be [%lld, %lld] (trans=%d) on %s", fn, e,
                         q2 ? " over q2" : "", u ? " over under" : "", bs[0] ? " with beside" : "", (long long)out,
                         (long long)in,
                         q->be->ops->name, (long long)rows,
                         (long long)cols, g->trans, be->ops->name);
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

// The call's scratch (model/expert_scratch.h): bf16 elements of one dequantization slot (sized by
// the largest 4-bit W of an expert with rows that is not kept dequantized, and the call's experts;
// 0: no such expert) and the dropout buffer's bytes.
static size_t slot_elems(const mt_grouped *g) {
    int64_t most = 0;
    for (int e = 0; g->q && e < g->experts; e++)
        if ((!g->off || g->off[e + 1] != g->off[e]) && !(g->cached && g->cached[e]))
            most = MT_MAX(most, mt_grouped_slot_rows(g, e) * mt_grouped_slot_ld(g, e));
    return most ? (size_t)mt_expert_slot_elems(most, g->experts) : 0;
}

static size_t drop_bytes(const mt_grouped *g, int64_t width) {
    if (!g->seed) return 0;
    return (size_t)mt_expert_dropout_scratch_bytes(g->off ? g->off[g->experts] - g->off[0] : g->rows, width);
}

// The rows the experts' offsets reach (doff: what the caller says the operands hold).
static int64_t rows_end(const mt_grouped *g) { return g->off ? g->off[g->experts] : g->rows; }

int mt_grouped_gemm(mt_tensor *c, const mt_tensor *a, const mt_grouped *g) {
    const char *fn = "mt_grouped_gemm";
    if (!is_2d(c, fn, "c") || !is_2d(a, fn, "a") || !kind_ok(c, fn) || !group_ok(g, fn)) return -1;
    if (a->dtype != MT_BF16) return mt_error_set("%s: a is %s, must be bf16", fn, mt_dtype_name(a->dtype)), -1;
    if (c->dtype != MT_BF16 && c->dtype != MT_F32)
        return mt_error_set("%s: c is %s, must be bf16 or f32", fn, mt_dtype_name(c->dtype)), -1;
    if (a->be != c->be) return mt_error_set("%s: a and c are on different backends", fn), -1;
    int64_t end = rows_end(g), K = a->shape[1], N = c->shape[1];
    if (!rows_ok(a, end, fn, "a") || !rows_ok(c, end, fn, "c")) return -1;
    for (int e = 0; e < g->experts; e++)
        if (!weight_ok(g, e, c->be, K, N)) return -1;
    mt_backend *be = c->be;
    size_t slot = slot_elems(g), deq = MT_EXPERT_SCRATCH_SLOTS * slot * 2, drop = drop_bytes(g, g->drop_a ? K : N);
    mt_grouped_scratch s = {deq ? mt_work_alloc(be, deq) : NULL, drop ? mt_work_alloc(be, drop) : NULL,
                            mt_work_alloc(be, MT_GROUPED_PTR_BYTES), slot};
#ifdef MT_CUDA
    if (be->ops->kind == MT_BACKEND_CUDA) mt_grouped_gemm_cuda(be, c, a, g, &s);
#endif
    mt_work_free(be, s.ptrs, MT_GROUPED_PTR_BYTES);
    if (drop) mt_work_free(be, s.drop, drop);
    if (deq) mt_work_free(be, s.deq, deq);
    return 0;
}

int mt_grouped_gemm_tn(mt_tensor *const *g, const mt_tensor *x, const mt_tensor *y, const mt_grouped *gr) {
    const char *fn = "mt_grouped_gemm_tn";
    if (!is_2d(x, fn, "x") || !is_2d(y, fn, "y") || !kind_ok(x, fn) || !group_ok(gr, fn)) return -1;
    if (!g) return mt_error_set("%s: g must be set", fn), -1;
    if (x->dtype != MT_BF16) return mt_error_set("%s: x is %s, must be bf16", fn, mt_dtype_name(x->dtype)), -1;
    if (y->dtype != MT_BF16) return mt_error_set("%s: y is %s, must be bf16", fn, mt_dtype_name(y->dtype)), -1;
    if (x->be != y->be) return mt_error_set("%s: x and y are on different backends", fn), -1;
    int64_t end = rows_end(gr), M = x->shape[1], N = y->shape[1];
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
    mt_backend *be = x->be;
    size_t drop = first ? drop_bytes(gr, N) : 0;
    mt_grouped_scratch s = {NULL, drop ? mt_work_alloc(be, drop) : NULL, mt_work_alloc(be, MT_GROUPED_PTR_BYTES), 0};
#ifdef MT_CUDA
    if (be->ops->kind == MT_BACKEND_CUDA) mt_grouped_gemm_tn_cuda(be, g, x, y, gr, &s);
#endif
    mt_work_free(be, s.ptrs, MT_GROUPED_PTR_BYTES);
    if (drop) mt_work_free(be, s.drop, drop);
    return 0;
}
