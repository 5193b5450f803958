// model/experts.c — one expert's MLP, down(silu(w1·x) ⊙ w3·x), forward and backward, on its rows
// of the layer's expert buffers: the cpu's f32 reference, w1 and w3 as two Linears, the experts
// of a layer in parallel. The GPU step (cuda, counted on null) runs a layer's experts together,
// one grouped launch per GEMM kind: model/experts_gpu.c.
#include <stdlib.h>

#include "core/common.h"
#include "core/threads.h"
#include "lora/lora.h"
#include "model/model_internal.h"
#include "model/ops.h"
#include "quant/qweight.h"

#define XA(t) ROWS((t), o0, n)

static void check_rows(const mt_expert_scratch *sc, int L, int e, int64_t n) {
    if (n > sc->rows)
        mt_fatal(MT_EXIT_ERROR, "expert %d of layer %d has %lld rows, its scratch %lld", e, L, (long long)n,
                 (long long)sc->rows);
}

// w1 and w3 apart into g and u. The Linears are given (an expert's own, or
// copies holding its W dequantized once for the backward's recompute). ys NULL: the output is
// not wanted (the recomputing backward), only what w2's backward reads: a, and its LoRA's xa.
// Expert e's rows of the layer's expert biases (gpt-oss): b[i] for w1, w2, w3, or NULL.
static void expert_biases(const mt_model *m, const mt_layer *ly, int e, const float *b[3]) {
    int64_t width[3] = {m->cfg.intermediate, m->cfg.hidden, m->cfg.intermediate};
    for (int i = 0; i < 3; i++) b[i] = ly->ebias[i] ? F(ly->ebias[i]) + e * width[i] : NULL;
}

static void forward_cpu(mt_model *m, const mt_linear *w1, const mt_linear *w2, const mt_linear *w3, const float *b[3],
                        mt_layer_acts *a, int64_t o0, int64_t n, const mt_tensor *ys) {
    int64_t f = m->cfg.intermediate;
    mt_tensor *xs = ROWS(a->xs, o0, n), *g = ROWS(a->g, o0, n), *u = ROWS(a->u, o0, n), *act = ROWS(a->a, o0, n);
    mt_linear_forward(w1, g, xs, XA(a->xa_w1), NULL);
    mt_linear_forward(w3, u, xs, XA(a->xa_w3), NULL);
    if (b[0]) bias_forward_cpu(g->data, b[0], n, f);
    if (b[2]) bias_forward_cpu(u->data, b[2], n, f);
    mt_op_swiglu_forward(m, act->data, g->data, u->data, n * f);
    if (ys) {
        mt_tensor *y = ROWS(ys, o0, n);
        mt_linear_forward(w2, y, act, XA(a->xa_w2), NULL);
        if (b[1]) bias_forward_cpu(y->data, b[1], n, m->cfg.hidden);
    } else if (w2->lora) {
        mt_lora_project_cpu(w2->lora, XA(a->xa_w2)->data, act->data, n);
    }
}

int mt_experts_recompute_in_backward(const mt_model *m) { return m->recompute_mlp && m->par.ep_size == 1; }

int mt_experts_give_dweights(const mt_model *m) {
    return m->be->ops->kind == MT_BACKEND_CPU && m->par.ep_size == 1 && !m->dweights_from_ys;
}

// Rows [o0, o0 + n) of the router's top-k weight gradient, dweight = dy·ys, from w2's backward:
// da = w · (W2ᵀ·dy + LoRA's share) is linear in dy, so da·a = w · (dy·(ys − b2)), LoRA (and its
// dropout) included; w2's bias b2 (gpt-oss) adds dys·b2 = w · (dy·b2). A weight that is exactly 0
// (a probability that underflowed) gets 0: the router's backward multiplies its dweight by that
// probability anyway.
static void dweights_from_da(const mt_model *m, const mt_layer_acts *a, const int32_t *order, float *dweights,
                             const float *da, const float *act, const float *dys, const float *b2, int64_t o0,
                             int64_t n) {
    int64_t f = m->cfg.intermediate, H = m->cfg.hidden;
    const float *w = F(a->weights);
    for (int64_t r = 0; r < n; r++) {
        const float *dr = da + r * f, *ar = act + r * f;
        float dot = 0.0f;
        for (int64_t j = 0; j < f; j++) dot += dr[j] * ar[j];
        if (b2)
            for (int64_t j = 0; j < H; j++) dot += dys[r * H + j] * b2[j];
        int32_t slot = order[o0 + r];
        dweights[slot] += w[slot] != 0.0f ? dot / w[slot] : 0.0f;
    }
}

static void expert_forward(mt_model *m, int L, int e, int64_t o0, int64_t n, const mt_tensor *ys_own,
                           const mt_expert_scratch *sc) {
    mt_layer_acts *a = layer_acts(m, L);
    check_rows(sc, L, e, n);
    const float *b[3];
    expert_biases(m, &m->layers[L], e, b);
    forward_cpu(m, &m->layers[L].w1[e], &m->layers[L].w2[e], &m->layers[L].w3[e], b, a, o0, n, ys_own);
}

// Rows [r0, r0 + n) of an expert scratch, zeroed (the backward accumulates into them).
static mt_tensor zeroed_rows(mt_model *m, const mt_tensor *s, int64_t r0, int64_t n) {
    mt_tensor v = mt_view_rows(s, r0, n);
    if (v.data) m->be->ops->fill_zero(m->be, v.data, v.nbytes);
    return v;
}

// The cpu's copy of Linear l with its W as the f32 [out, in] tensor *w: the dense weight itself,
// or the 4-bit one dequantized into dst (out·in floats, this thread's), once for several uses.
static mt_linear cpu_with_weight(const mt_linear *l, mt_tensor *w, float *dst) {
    mt_linear c = *l;
    if (l->q) {
        mt_qweight_dequantize_rows_cpu(l->q, dst, 0, l->out);
        *w = mt_view2(l->q->be, dst, MT_F32, l->out, l->in, 0);
        c.q = NULL, c.w = w;
    }
    return c;
}

// `recompute`: the replay forward left this expert's rows to the backward, which recomputes g, u
// and a first with W dequantized once for both (into this thread's part of sc->w), as the GPU
// step does: two dequantizations of each 4-bit W per step, not three. ys is recomputed only when
// the router's gradient is taken from it (m->dweights_from_ys); else it comes from da
// (dweights_from_da; dweights NULL: not wanted).
static void backward_cpu(mt_model *m, mt_layer *ly, mt_layer_acts *a, int e, int64_t o0, int64_t n,
                         const mt_tensor *dys, const mt_tensor *dxs, const mt_expert_scratch *sc, int recompute,
                         float *dweights, const int32_t *order) {
    int64_t f = m->cfg.intermediate, H = m->cfg.hidden, s0 = sc->every_row ? o0 : 0;
    mt_linear w1 = ly->w1[e], w2 = ly->w2[e], w3 = ly->w3[e];
    mt_tensor t1, t2, t3;
    const float *b[3];
    expert_biases(m, ly, e, b);
    if (recompute) {
        float *ws = sc->w.data ? (float *)sc->w.data + (size_t)mt_thread_index() * (size_t)(3 * f * H) : NULL;
        w1 = cpu_with_weight(&ly->w1[e], &t1, ws), w3 = cpu_with_weight(&ly->w3[e], &t3, ws ? ws + f * H : NULL);
        w2 = cpu_with_weight(&ly->w2[e], &t2, ws ? ws + 2 * f * H : NULL);
        forward_cpu(m, &w1, &w2, &w3, b, a, o0, n, mt_experts_give_dweights(m) ? NULL : a->ys);
    }
    mt_tensor *xs = ROWS(a->xs, o0, n), *g = ROWS(a->g, o0, n), *u = ROWS(a->u, o0, n), *act = ROWS(a->a, o0, n);
    mt_tensor da = zeroed_rows(m, &sc->da, s0, n), dgu = zeroed_rows(m, &sc->dgu, s0, n);  // [n, 2f]: dg | du
    mt_tensor dg = mt_view2(m->be, dgu.data, MT_F32, n, f, 0);
    mt_tensor du = mt_view2(m->be, dgu.data ? (float *)dgu.data + n * f : NULL, MT_F32, n, f, 0);
    mt_linear_backward(&w2, &da, ROWS(dys, o0, n), act, XA(a->xa_w2), NULL);
    if (dweights) dweights_from_da(m, a, order, dweights, F(&da), F(act), F(ROWS(dys, o0, n)), b[1], o0, n);
    mt_op_swiglu_backward(m, dg.data, du.data, da.data, g->data, u->data, n * f);
    // Trainable expert biases (gpt-oss in --mode full): this expert's row of each, its own thread's.
    if (ly->debias[1]) bias_backward_cpu(F(ly->debias[1]) + e * H, F(ROWS(dys, o0, n)), n, H);
    if (ly->debias[0]) bias_backward_cpu(F(ly->debias[0]) + e * f, dg.data, n, f);
    if (ly->debias[2]) bias_backward_cpu(F(ly->debias[2]) + e * f, du.data, n, f);
    mt_tensor *dx = ROWS(dxs, o0, n);
    mt_linear_backward(&w1, dx, &dg, xs, XA(a->xa_w1), NULL);
    mt_linear_backward(&w3, dx, &du, xs, XA(a->xa_w3), NULL);
}

// every_row: the backward's da and dgu hold every row of the layer's experts, each expert its own
// (the cpu's experts run in parallel); else as many rows as one expert can get, reused by each.
// threads: how many experts run at once. The recomputing backward also takes an f32
// [w1; w3; w2] (3·f·H) for each, when the layer has a 4-bit expert.
static mt_expert_scratch scratch_new(mt_model *m, int L, int64_t rows, int backward, int every_row, int threads) {
    int64_t f = m->cfg.intermediate, H = m->cfg.hidden;
    mt_expert_scratch s = {.rows = rows, .every_row = every_row};
    if (backward) s.da = step_work(m, MT_F32, rows, f, 0), s.dgu = step_work(m, MT_F32, rows, 2 * f, 0);
    mt_layer *ly = &m->layers[L];
    int q4 = 0;
    for (int e = 0; e < m->cfg.experts; e++) q4 |= ly->w1[e].q || ly->w2[e].q || ly->w3[e].q;
    if (backward && q4 && mt_experts_recompute_in_backward(m)) s.w = step_work(m, MT_F32, threads, 3 * f * H, 0);
    return s;
}

static void scratch_free(mt_model *m, mt_expert_scratch *s) {
    if (s->w.ndim) step_unwork(m, &s->w);
    if (s->dgu.ndim) step_unwork(m, &s->dgu), step_unwork(m, &s->da);
}

static void expert_backward(mt_model *m, int L, int e, int64_t o0, int64_t n, const mt_tensor *dys_own,
                            const mt_tensor *dxs, float *dweights, const mt_expert_scratch *sc) {
    mt_layer_acts *a = layer_acts(m, L);
    check_rows(sc, L, e, n);
    backward_cpu(m, &m->layers[L], a, e, o0, n, dys_own, dxs, sc, mt_experts_recompute_in_backward(m), dweights,
                 I(m->kept[L].order));
}

// The cpu runs a layer's experts in parallel, an expert per thread at a time (dynamic: routing
// makes them unequal) with each of its GEMMs on that thread: the experts are independent
// (disjoint rows, their own weights and gradients), and a small GEMM split over threads pays a
// fork and join each time, which top-8 of many small experts multiplies.
// With fewer than two experts per thread (E = 1 is a dense MLP) the threads would idle: the
// experts then run in turn, each GEMM on every thread.
static int experts_in_parallel(int jobs) { return jobs >= 2 * mt_threads_max(); }

// The most rows one expert can get: each token picks k distinct experts, so at most T per rank.
static int64_t expert_rows_max(const mt_model *m, int64_t R) {
    return MT_MIN(R, (int64_t)m->B * m->S * m->par.ep_size);
}

typedef struct { int e; int64_t o0, n; } expert_job;

static int by_rows_desc(const void *a, const void *b) {
    const expert_job *x = a, *y = b;
    return x->n != y->n ? (x->n < y->n) - (x->n > y->n) : x->e - y->e;
}

// The experts of layer L with rows, largest first when they run in parallel: the last to start
// is then the smallest, which keeps the threads' finishing times close.
static int expert_jobs(const mt_model *m, int L, int *par, expert_job *jobs) {
    int count = 0;
    for (int e = 0; e < m->cfg.experts; e++) {
        expert_job j = {e, 0, 0};
        mt_expert_rows(m, L, e, &j.o0, &j.n);
        if (j.n) jobs[count++] = j;  // an expert with no tokens does nothing
    }
    *par = experts_in_parallel(count);
    if (*par) qsort(jobs, (size_t)count, sizeof *jobs, by_rows_desc);
    return count;
}

void mt_experts_forward(mt_model *m, int L, const mt_tensor *ys_own, int64_t R) {
    if (gpu_step(m)) {
        mt_experts_forward_gpu(m, L, ys_own);
        return;
    }
    int par;
    expert_job *jobs = mt_xmalloc((size_t)m->cfg.experts * sizeof *jobs);
    int count = expert_jobs(m, L, &par, jobs);
    mt_expert_scratch sc = scratch_new(m, L, expert_rows_max(m, R), 0, 0, 1);
#pragma omp parallel for schedule(dynamic, 1) if (par)
    for (int i = 0; i < count; i++) expert_forward(m, L, jobs[i].e, jobs[i].o0, jobs[i].n, ys_own, &sc);
    scratch_free(m, &sc);
    free(jobs);
}

void mt_experts_backward(mt_model *m, int L, const mt_tensor *dys_own, const mt_tensor *dxs, float *dweights,
                         int64_t R) {
    if (gpu_step(m)) {
        mt_experts_backward_gpu(m, L, dys_own, dxs, R);
        return;
    }
    if (dxs && dxs->data)  // the cpu's experts add their rows' gradients into it
        m->be->ops->fill_zero(m->be, dxs->data, mt_dtype_bytes(dxs->dtype, (size_t)(dxs->shape[0] * dxs->shape[1])));
    int par;
    expert_job *jobs = mt_xmalloc((size_t)m->cfg.experts * sizeof *jobs);
    int count = expert_jobs(m, L, &par, jobs);
    mt_expert_scratch sc = scratch_new(m, L, par ? R : expert_rows_max(m, R), 1, par, par ? mt_threads_max() : 1);
#pragma omp parallel for schedule(dynamic, 1) if (par)
    for (int i = 0; i < count; i++) expert_backward(m, L, jobs[i].e, jobs[i].o0, jobs[i].n, dys_own, dxs, dweights, &sc);
    scratch_free(m, &sc);
    free(jobs);
}
