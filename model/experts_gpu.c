// model/experts_gpu.c — the GPU step's experts (cuda; the null backend counts the same
// allocations): a layer's experts as one grouped call per GEMM kind (model/grouped.h), each a
// cuBLASLt GEMM per expert on its W dequantized to a bf16 scratch slot.
//
// Forward, on the rows of every expert (expert order, rows [off[e], off[e+1])):
//   gu = xs·[W1;W3]ᵀ   (4-bit w1 and w3 stacked: one GEMM of N = 2f; gu's halves are g and u)
//   each LoRA: xa = drop(x)·Aᵀ, y += s·xa·Bᵀ  (experts without one are skipped; when every
//     expert with rows has one, y = s·xa·Bᵀ comes first and the base GEMM adds onto it: see
//     lora_first). When every expert of the model has w1's and w3's, their B ride in the base
//     GEMM instead: xa1, xa3 are written beside x in xs's rows and
//     gu = [x | xa1 | xa3]·[[W1 | s·B1 | 0]; [W3 | 0 | s·B3]]ᵀ (mt_experts_xs_extra); with their
//     A made as one matrix (lora/lora.h's pair) and no dropout, [xa1 | xa3] = x·[A1; A3]ᵀ is one
//     product, as are their dA and dx in the backward (a13_paired)
//   gpt-oss: each row's expert's biases added to g, u (after their LoRAs) and ys
//   a = SwiGLU(gu) (clamped for gpt-oss); ys = a·W2ᵀ (+ w2's LoRA: when every expert of the model
//     has one, its B rides in the base GEMM as w1's and w3's do: xa2 is written beside a in a's
//     rows and ys = [a | xa2]·[W2 | s·B2]ᵀ, mt_experts_a_extra)
// Backward: da = dys·W2 (+ w2's LoRA: folded under W2 when it may be, see mt_experts_dys_extra,
// else first when it may be), dgu = SwiGLU'(da), dxs = dgu·[W1;W3] (one GEMM of K = 2f, written
// by its first writer, zeroed first only where the rows do not cover it; when w1's and w3's B fold it also makes their dxa beside
// dx) + the LoRAs' drop(dxa·A), a trainable (unfrozen) expert's dW += dyᵀ·x and each LoRA's dA,
// dB over its rows (and, with trainable expert biases, their column sums of dys, dg, du).
// A dequantized W lives only in the call's two scratch slots (model/expert_scratch.h), or in the
// layer's kept bf16 experts (--expert-cache, dequantized when the model was built), and the
// backward writes da and dgu over the activations a and gu (docs/memory.md's k·s·b·6f transient
// takes no memory of its own). Unfrozen (dense) experts run w1 and w3 as two GEMMs.
#include <stdlib.h>

#include "core/common.h"
#include "core/profile.h"
#include "model/grouped.h"
#include "model/model_internal.h"

enum { W1, W2, W3 };

// The expert rows of layer L as one offsets array [E+1] from *row0, the first expert's first row:
// each expert's rows follow the previous one's (expert order), which the grouped launch needs.
static int64_t *layer_offsets(const mt_model *m, int L, int64_t *row0) {
    int E = (int)m->cfg.experts;
    int64_t *off = mt_xmalloc((size_t)(E + 1) * sizeof *off);
    for (int e = 0; e < E; e++) {
        int64_t r0, n;
        mt_expert_rows(m, L, e, &r0, &n);
        if (e == 0) *row0 = r0;
        if (e > 0 && r0 - *row0 != off[e])
            mt_fatal(MT_EXIT_ERROR, "layer %d: expert %d's rows start at %lld, not after expert %d's", L, e,
                     (long long)r0, e - 1);
        off[e] = r0 - *row0, off[e + 1] = r0 - *row0 + n;
    }
    return off;
}

static mt_linear *linears(mt_layer *ly, int which) { return which == W1 ? ly->w1 : which == W2 ? ly->w2 : ly->w3; }

// One layer's grouped calls: its offsets (from row0 of the layer's buffers: every tensor they
// get is a view from there) and the per-expert arrays they pass (E entries each). With the
// offsets on the device (mt_rows_on_device): off NULL, doff the routing's device offsets, rows
// every routed row (T·k), row0 0.
typedef struct {
    mt_model *m;
    int L, E;
    int64_t row0, *off, rows;
    const int32_t *doff;
    const mt_qweight **q;
    const mt_tensor **w;
    mt_tensor **g;
    uint64_t *seed;
} group;

static group group_new(mt_model *m, int L) {
    int E = (int)m->cfg.experts;
    group gr = {m, L, E, 0, NULL, 0, NULL, mt_xcalloc((size_t)E, sizeof(void *)),
                mt_xcalloc((size_t)E, sizeof(void *)), mt_xcalloc((size_t)E, sizeof(void *)),
                mt_xcalloc((size_t)E, sizeof(uint64_t))};
    if (m->kept[L].rows_on_device) gr.doff = m->kept[L].offsets->data, gr.rows = (int64_t)m->B * m->S * m->cfg.top_k;
    else gr.off = layer_offsets(m, L, &gr.row0);
    return gr;
}

static void group_free(group *gr) {
    free(gr->off), free(gr->q), free(gr->w), free(gr->g), free(gr->seed);
}

static int64_t group_rows(const group *gr) { return gr->off ? gr->off[gr->E] : gr->rows; }

// The launch of experts [e0, e0 + n): their offsets, host or device.
static mt_grouped part_of(const group *gr, mt_grouped g, int e0) {
    g.experts = MT_MIN(MT_GROUPED_MAX, gr->E - e0);
    g.off = gr->off ? gr->off + e0 : NULL, g.doff = gr->doff ? gr->doff + e0 : NULL, g.rows = gr->rows;
    g.rows_hint = gr->rows * g.experts / gr->E;
    g.seed = g.seed ? g.seed + e0 : NULL;
    return g;
}

// c = the grouped product, in launches of at most MT_GROUPED_MAX experts.
static void gemm(const group *gr, mt_grouped g, const mt_tensor *c, const mt_tensor *a) {
    for (int e0 = 0; e0 < gr->E; e0 += MT_GROUPED_MAX) {
        mt_grouped part = part_of(gr, g, e0);
        part.q = g.q ? g.q + e0 : NULL, part.q2 = g.q2 ? g.q2 + e0 : NULL, part.w = g.w ? g.w + e0 : NULL;
        part.under = g.under ? g.under + e0 : NULL;
        part.beside = g.beside ? g.beside + e0 : NULL, part.beside2 = g.beside2 ? g.beside2 + e0 : NULL;
        part.cached = g.cached ? g.cached + e0 : NULL;
        mt_tensor cv = *c;
        if (mt_grouped_gemm(&cv, a, &part) != 0)
            mt_fatal(MT_EXIT_ERROR, "layer %d experts: grouped GEMM: %s", gr->L, mt_error_get());
    }
}

static void gemm_tn(const group *gr, mt_grouped g, mt_tensor **grads, const mt_tensor *x, const mt_tensor *y) {
    for (int e0 = 0; e0 < gr->E; e0 += MT_GROUPED_MAX) {
        mt_grouped part = part_of(gr, g, e0);
        if (mt_grouped_gemm_tn(grads + e0, x, y, &part) != 0)
            mt_fatal(MT_EXIT_ERROR, "layer %d experts: grouped weight gradient: %s", gr->L, mt_error_get());
    }
}

// c = a·op(W_e) + beta·c with each expert's own base weight (4-bit or dense; an expert another
// EP rank holds has neither, and no rows).
// The profile's rows (scripts/step_model.h's names): trans is the forward's a·Wᵀ, else dx = dy·W.
static const char *base_row(int which, int trans) {
    if (which == W2) return trans ? "expert GEMM w2 (cuBLAS)" : "expert GEMM w2 (dx, cuBLAS)";
    return trans ? "expert GEMM w1+w3 (cuBLAS)" : "expert GEMM w1+w3 (dx, cuBLAS)";
}

static const char *const LORA_ROW = "LoRA experts w1,w3,w2 (cuBLAS)";

// The layer's experts kept dequantized (--expert-cache: model/mixtral.c keep_experts) as a grouped
// call's cached: [W1;W3] (kind 0) or W2 (kind 1); none when the layer keeps none.
static mt_grouped kept(const group *gr, int kind, mt_grouped g) {
    mt_layer *ly = &gr->m->layers[gr->L];
    g.cached = ly->experts_bf16[kind];
    return g;
}

// under: each expert's rows stacked under its W (grouped.h), or NULL.
static void base_under(group *gr, int which, int trans, float beta, const mt_tensor *c, const mt_tensor *a,
                       const mt_tensor *const *under) {
    const mt_linear *l = linears(&gr->m->layers[gr->L], which);
    for (int e = 0; e < gr->E; e++) gr->q[e] = l[e].q, gr->w[e] = l[e].q ? NULL : l[e].w;
    mt_prof_push(base_row(which, trans));
    mt_grouped g = {.q = gr->q, .w = gr->w, .under = under, .trans = trans, .alpha = 1.0f, .beta = beta};
    gemm(gr, which == W2 ? kept(gr, 1, g) : g, c, a);  // w1 and w3 alone (not stacked) are never kept
    mt_prof_pop();
}

static void base(group *gr, int which, int trans, float beta, const mt_tensor *c, const mt_tensor *a) {
    base_under(gr, which, trans, beta, c, a, NULL);
}

// gu's column block of w1 (0) or w3 (1), [rows, f] with row stride 2f.
static mt_tensor half(const mt_tensor *gu, int64_t f, int which) {
    return mt_view2(gu->be, gu->data ? (char *)gu->data + mt_dtype_bytes(gu->dtype, (size_t)(which * f)) : NULL,
                    gu->dtype, gu->shape[0], f, 2 * f);
}

// Whether every expert holding w1 and w3 holds both 4-bit: then [W1;W3] is one stacked W.
static int stackable(const group *gr) {
    const mt_layer *ly = &gr->m->layers[gr->L];
    for (int e = 0; e < gr->E; e++) {
        const mt_linear *a = &ly->w1[e], *b = &ly->w3[e];
        if ((a->q || a->w || b->q || b->w) && !(a->q && b->q)) return 0;
    }
    return 1;
}

// gu = xs·[W1;W3]ᵀ (trans) or dxs += dgu·[W1;W3]: one GEMM per expert on the stacked 4-bit
// weights, else two on each half of gu.
static void base13(group *gr, int trans, float beta, const mt_tensor *gu, const mt_tensor *x) {
    const mt_layer *ly = &gr->m->layers[gr->L];
    int64_t f = gr->m->cfg.intermediate;
    if (!stackable(gr)) {
        mt_tensor g = half(gu, f, 0), u = half(gu, f, 1);
        if (trans) base(gr, W1, 1, beta, &g, x), base(gr, W3, 1, beta, &u, x);
        else base(gr, W1, 0, beta, x, &g), base(gr, W3, 0, 1.0f, x, &u);
        return;
    }
    const mt_qweight **q2 = mt_xcalloc((size_t)gr->E, sizeof *q2);
    for (int e = 0; e < gr->E; e++) gr->q[e] = ly->w1[e].q, q2[e] = ly->w3[e].q, gr->w[e] = NULL;
    mt_prof_push(base_row(W1, trans));
    mt_grouped g = kept(gr, 0, (mt_grouped){.q = gr->q, .q2 = q2, .w = gr->w, .trans = trans, .alpha = 1.0f, .beta = beta});
    if (trans) gemm(gr, g, gu, x);
    else gemm(gr, g, x, gu);
    mt_prof_pop();
    free(q2);
}

// The experts' LoRAs of Linear `which`: the first one (all share r, scale and dropout: one run's
// options), or NULL when none has one. Their A (use_b 0) or B into gr->w, NULL where absent.
static const mt_lora *loras(group *gr, int which, int use_b) {
    const mt_linear *l = linears(&gr->m->layers[gr->L], which);
    const mt_lora *first = NULL;
    for (int e = 0; e < gr->E; e++) {
        const mt_lora *lo = l[e].lora;
        gr->w[e] = lo ? (use_b ? lo->b : lo->a) : NULL, gr->seed[e] = lo ? lo->dropout_seed : 0;
        if (lo && !first) first = lo;
        if (lo && (lo->r != first->r || lo->scale != first->scale || lo->dropout != first->dropout))
            mt_fatal(MT_EXIT_ERROR, "layer %d: expert %d's LoRA differs from expert 0's in r, scale or dropout",
                     gr->L, e);
    }
    return first;
}

static mt_grouped dropout_of(const group *gr, const mt_lora *lo, mt_grouped g) {
    if (lo->dropout > 0.0f) g.seed = gr->seed, g.p = lo->dropout;
    return g;
}

// Whether every expert with rows has a LoRA on Linear `which`: then its product can be written
// first (beta 0) and the base GEMM accumulate onto it (beta 1), so that the skinny, memory-bound
// LoRA GEMM writes its [rows, out] result once instead of reading and writing it; the read moves
// into the base GEMM's epilogue, which is compute-bound. (Otherwise an expert without one would
// have its base product added to whatever its rows held.)
static int lora_first(const group *gr, int which) {
    const mt_linear *l = linears(&gr->m->layers[gr->L], which);
    int any = 0;
    for (int e = 0; e < gr->E; e++) {
        if (gr->off && gr->off[e + 1] == gr->off[e]) continue;  // on the device: every expert counts
        if (!l[e].lora) return 0;
        any = 1;
    }
    return any;
}

// y = s·(drop(x)·Aᵀ)·Bᵀ + beta·y, xa = drop(x)·Aᵀ kept for the backward.
static void lora_forward(group *gr, int which, const mt_tensor *y, const mt_tensor *x, const mt_tensor *xa, float beta) {
    const mt_lora *lo = loras(gr, which, 0);
    if (!lo) return;
    mt_grouped g = dropout_of(gr, lo, (mt_grouped){.w = gr->w, .trans = 1, .alpha = 1.0f, .drop_a = 1});
    mt_prof_push(LORA_ROW);
    gemm(gr, g, xa, x);
    loras(gr, which, 1);
    gemm(gr, (mt_grouped){.w = gr->w, .trans = 1, .alpha = lo->scale, .beta = beta}, y, xa);
    mt_prof_pop();
}

// dB += s·dyᵀ·xa; dxa = s·dy·B; dA += dxaᵀ·drop(x): the LoRA's gradients, and dxa [rows, r]
// (in *dxa_scratch's storage) for lora_dx; dxa_made: the base dx GEMM made dxa there already
// (base13_beside, beside dx); da 0: dA left to the caller (a13_backward, for a pair). 0: the
// layer has no LoRA on `which`.
static int lora_backward_da(group *gr, int which, const mt_tensor *dy, const mt_tensor *x, const mt_tensor *xa,
                            mt_tensor *dxa_scratch, int dxa_made, int da) {
    const mt_lora *lo = loras(gr, which, 1);
    if (!lo) return 0;
    const mt_linear *l = linears(&gr->m->layers[gr->L], which);
    mt_tensor dxa = mt_view2(gr->m->be, dxa_scratch->data, MT_BF16, dxa_scratch->shape[0], lo->r, mt_tensor_ld(dxa_scratch));
    mt_prof_push(LORA_ROW);
    for (int e = 0; e < gr->E; e++) gr->g[e] = l[e].lora ? l[e].lora->db : NULL;
    gemm_tn(gr, (mt_grouped){.alpha = lo->scale, .beta = 1.0f}, gr->g, dy, xa);
    if (!dxa_made) gemm(gr, (mt_grouped){.w = gr->w, .trans = 0, .alpha = lo->scale}, &dxa, dy);  // w: the Bs of loras()
    if (da) {
        for (int e = 0; e < gr->E; e++) gr->g[e] = l[e].lora ? l[e].lora->da : NULL;
        gemm_tn(gr, dropout_of(gr, lo, (mt_grouped){.alpha = 1.0f, .beta = 1.0f}), gr->g, &dxa, x);
    }
    mt_prof_pop();
    return 1;
}

static int lora_backward(group *gr, int which, const mt_tensor *dy, const mt_tensor *x, const mt_tensor *xa,
                         mt_tensor *dxa_scratch, int dxa_made) {
    return lora_backward_da(gr, which, dy, x, xa, dxa_scratch, dxa_made, 1);
}

// Whether every expert of the layer with w1's and w3's LoRA here holds them as a pair (lora/lora.h
// mt_lora_init_pair: [A1; A3] one [2r, h] matrix, [dA1; dA3] too), neither with dropout (each
// masks x with its own seed), and their xa and dxa lie beside x and dx (mt_experts_xs_extra):
// then xa = x·[A1; A3]ᵀ, [dA1; dA3] += [dxa1 | dxa3]ᵀ·x and dx += [dxa1 | dxa3]·[A1; A3] are one
// product each, reading x (and dx) once where the two LoRAs' own would read them twice.
static int a13_paired(group *gr) {
    if (!mt_experts_xs_extra(gr->m)) return 0;
    const mt_layer *ly = &gr->m->layers[gr->L];
    int any = 0;
    for (int e = 0; e < gr->E; e++) {
        const mt_lora *l1 = ly->w1[e].lora, *l3 = ly->w3[e].lora;
        if (!l1 && !l3) continue;  // another EP rank's expert
        if (!mt_lora_pair_adjacent(l1, l3) || l1->dropout > 0.0f || l3->dropout > 0.0f) return 0;
        any = 1;
    }
    return any;
}

// Each expert's [A1; A3] (grad 0: into gr->w) or [dA1; dA3] (grad 1: into gr->g) as one [2r, h]
// view (views: E of them).
static void a13_views(group *gr, mt_tensor *views, int grad) {
    const mt_layer *ly = &gr->m->layers[gr->L];
    for (int e = 0; e < gr->E; e++) {
        const mt_lora *l1 = ly->w1[e].lora;
        mt_tensor *t = l1 ? (grad ? l1->da : l1->a) : NULL;
        if (t) views[e] = mt_view2(t->be, t->data, t->dtype, 2 * t->shape[0], t->shape[1], 0);
        if (grad) gr->g[e] = t ? &views[e] : NULL;
        else gr->w[e] = t ? &views[e] : NULL;
    }
}

// [dA1; dA3] += [dxa1 | dxa3]ᵀ·x, then dx = [dxa1 | dxa3]·[A1; A3] + beta·dx (dx NULL: not
// wanted) for a13_paired layers: dxa13 the 2r columns beside dx.
static void a13_backward(group *gr, const mt_tensor *x, const mt_tensor *dxa13, const mt_tensor *dx, float beta) {
    mt_tensor *views = mt_xcalloc((size_t)gr->E, sizeof *views);
    mt_prof_push(LORA_ROW);
    a13_views(gr, views, 1);
    gemm_tn(gr, (mt_grouped){.alpha = 1.0f, .beta = 1.0f}, gr->g, dxa13, x);
    if (dx) {
        a13_views(gr, views, 0);
        gemm(gr, (mt_grouped){.w = gr->w, .trans = 0, .alpha = 1.0f, .beta = beta}, dx, dxa13);
    }
    mt_prof_pop();
    free(views);
}

// dx = drop(dxa·A) + beta·dx, the LoRA's share of its input's gradient (dx NULL: not wanted).
static void lora_dx(group *gr, int which, const mt_tensor *dx, const mt_tensor *dxa_scratch, float beta) {
    const mt_lora *lo = loras(gr, which, 0);
    if (!lo || !dx) return;
    mt_tensor dxa = mt_view2(gr->m->be, dxa_scratch->data, MT_BF16, dxa_scratch->shape[0], lo->r, mt_tensor_ld(dxa_scratch));
    mt_prof_push(LORA_ROW);
    gemm(gr, dropout_of(gr, lo, (mt_grouped){.w = gr->w, .trans = 0, .alpha = 1.0f, .beta = beta}), dx, &dxa);
    mt_prof_pop();
}

// A trainable (unfrozen) expert's dW += dyᵀ·x; frozen ones are skipped.
static void weight_grads(group *gr, int which, const mt_tensor *dy, const mt_tensor *x) {
    const mt_linear *l = linears(&gr->m->layers[gr->L], which);
    int any = 0;
    for (int e = 0; e < gr->E; e++) gr->g[e] = l[e].dw, any |= l[e].dw != NULL;
    if (!any) return;
    mt_prof_push("expert GEMMs dW (grouped)");
    gemm_tn(gr, (mt_grouped){.alpha = 1.0f, .beta = 1.0f}, gr->g, dy, x);
    mt_prof_pop();
}

// The experts' biases of Linear `which` (gpt-oss: ly->ebias[which], [E, n]) on y, a column block
// [rows, n] of the group's rows: y += the bias of each row's expert, in calls of at most
// MT_EXPERT_OFFSETS_MAX experts whose row offsets go by value in the launch, or stay on the device
// (model/expert_rows.c; the kernels read them there). grad: their gradient
// instead, db_e += the column sums of y over expert e's rows (ly->debias: --mode full only).
static void biases(group *gr, int which, const mt_tensor *y, int grad) {
    const mt_layer *ly = &gr->m->layers[gr->L];
    const mt_tensor *b = grad ? ly->debias[which] : ly->ebias[which];
    if (!b || !group_rows(gr) || gr->m->counting) return;  // counting: no kernel, no scratch
    const int64_t n = y->shape[1];
    for (int e0 = 0; e0 < gr->E; e0 += MT_EXPERT_OFFSETS_MAX) {
        mt_expert_offsets rows = {.experts = MT_MIN(MT_EXPERT_OFFSETS_MAX, gr->E - e0)};
        char *be0 = (char *)b->data + mt_dtype_bytes(b->dtype, (size_t)(e0 * n));
        if (!gr->off) {  // on the device (model/expert_rows.c): y from the offsets' row 0
            rows.dev = gr->doff + e0, rows.dev_rows = group_rows(gr);
            if (grad) mt_op_expert_bias_backward(gr->m, be0, n, y->data, mt_tensor_ld(y), n, &rows);
            else mt_op_expert_bias_forward(gr->m, y->data, mt_tensor_ld(y), be0, n, n, &rows);
            continue;
        }
        for (int i = 0; i <= rows.experts; i++) rows.off[i] = (int32_t)gr->off[e0 + i];
        if (rows.off[rows.experts] == rows.off[0]) continue;
        mt_tensor yv = mt_view_rows(y, gr->off[e0], rows.off[rows.experts] - rows.off[0]);
        if (grad) mt_op_expert_bias_backward(gr->m, be0, n, yv.data, mt_tensor_ld(&yv), n, &rows);
        else mt_op_expert_bias_forward(gr->m, yv.data, mt_tensor_ld(&yv), be0, n, n, &rows);
    }
}

// The group's rows of a layer buffer (NULL stays NULL).
#define GROUP_ROWS(gr, t) ROWS((t), (gr)->row0, group_rows(gr))

// Columns [c0, c0 + w) of t's rows (NULL stays NULL's view: no data).
static mt_tensor cols(const mt_tensor *t, int64_t c0, int64_t w) {
    return mt_view2(t->be, t->data ? (char *)t->data + mt_dtype_bytes(t->dtype, (size_t)c0) : NULL, t->dtype,
                    t->shape[0], w, mt_tensor_ld(t));
}

// The layer's xs [rows, h] (a view: its rows may hold xa1, xa3 beside x) and, for Linear w1
// (W1) or w3, its LoRA's xa [rows, r]: beside x when the LoRAs fold (mt_experts_xs_extra),
// else its own activation (none: an empty tensor, the Linear has no LoRA).
static mt_tensor xs_of(const group *gr) {
    const mt_tensor *xs = layer_acts(gr->m, gr->L)->xs;
    const int64_t H = gr->m->cfg.hidden, extra = mt_experts_xs_extra(gr->m);
    if (xs->shape[1] != H + extra)
        mt_fatal(MT_EXIT_ERROR, "layer %d experts: xs has %lld columns, the LoRAs' fold wants %lld", gr->L,
                 (long long)xs->shape[1], (long long)(H + extra));
    return cols(GROUP_ROWS(gr, xs), 0, H);
}
// The layer's a [rows, f] (SwiGLU's output; the backward's da over it) and w2's LoRA xa [rows, r]:
// beside a in a's rows when w2's B folds (mt_experts_a_extra), else its own activation.
static mt_tensor act_of(const group *gr) {
    const mt_tensor *a = layer_acts(gr->m, gr->L)->a;
    const int64_t f = gr->m->cfg.intermediate, extra = mt_experts_a_extra(gr->m);
    if (a->shape[1] != f + extra)
        mt_fatal(MT_EXIT_ERROR, "layer %d experts: a has %lld columns, w2's LoRA fold wants %lld", gr->L,
                 (long long)a->shape[1], (long long)(f + extra));
    return cols(GROUP_ROWS(gr, a), 0, f);
}
static mt_tensor xa2_of(const group *gr) {
    mt_layer_acts *a = layer_acts(gr->m, gr->L);
    int64_t extra = mt_experts_a_extra(gr->m);
    if (extra) return cols(GROUP_ROWS(gr, a->a), gr->m->cfg.intermediate, extra);
    return a->xa_w2 ? mt_view_rows(a->xa_w2, gr->row0, group_rows(gr)) : (mt_tensor){0};
}
static mt_tensor xa13_of(const group *gr, int which) {
    mt_layer_acts *a = layer_acts(gr->m, gr->L);
    int64_t extra = mt_experts_xs_extra(gr->m), r = extra / 2;
    if (extra) return cols(GROUP_ROWS(gr, a->xs), gr->m->cfg.hidden + (which == W3 ? r : 0), r);
    mt_tensor *xa = which == W1 ? a->xa_w1 : a->xa_w3;
    return xa ? mt_view_rows(xa, gr->row0, group_rows(gr)) : (mt_tensor){0};
}

// The stacked 4-bit [W1;W3] with w1's and w3's LoRA s·B beside its rows (grouped.h's beside):
// c = a·[[W1 | s·B1 | 0]; [W3 | 0 | s·B3]]ᵀ (trans: the forward, a = [x | xa1 | xa3]) or
// c = [dx | dxa1 | dxa3] = a·[[W1 | s·B1 | 0]; [W3 | 0 | s·B3]] (a = dgu: dx, and the LoRAs'
// dxa = s·dy·B as 2r more columns), + beta·c.
static void base13_beside(group *gr, int trans, float beta, const mt_tensor *c, const mt_tensor *a) {
    const mt_layer *ly = &gr->m->layers[gr->L];
    const int E = gr->E;
    const mt_qweight **q2 = mt_xcalloc((size_t)E, sizeof *q2);
    const mt_tensor **b1 = mt_xcalloc((size_t)E, sizeof *b1), **b3 = mt_xcalloc((size_t)E, sizeof *b3);
    const mt_lora *lo = loras(gr, W1, 1);  // the scale; an expert another EP rank holds has no LoRA here
    for (int e = 0; e < E; e++) {
        const mt_lora *l1 = ly->w1[e].lora, *l3 = ly->w3[e].lora;
        gr->q[e] = ly->w1[e].q, q2[e] = ly->w3[e].q, gr->w[e] = NULL;
        b1[e] = l1 ? l1->b : NULL, b3[e] = l3 ? l3->b : NULL;
    }
    mt_prof_push(base_row(W1, trans));
    gemm(gr, kept(gr, 0, (mt_grouped){.q = gr->q, .q2 = q2, .w = gr->w, .beside = b1, .beside2 = b3,
                                      .beside_scale = lo->scale, .trans = trans, .alpha = 1.0f, .beta = beta}),
         c, a);
    mt_prof_pop();
    free(q2), free(b1), free(b3);
}

// gu = [x | xa1 | xa3]·[[W1 | s·B1 | 0]; [W3 | 0 | s·B3]]ᵀ (mt_experts_xs_extra): xa1, xa3 written
// beside x, then one GEMM.
static void forward13_folded(group *gr, const mt_tensor *gu) {
    const int64_t H = gr->m->cfg.hidden, extra = mt_experts_xs_extra(gr->m);
    mt_tensor x = xs_of(gr), xa1 = xa13_of(gr, W1), xa3 = xa13_of(gr, W3);
    mt_tensor xx = cols(GROUP_ROWS(gr, layer_acts(gr->m, gr->L)->xs), 0, H + extra);
    const int paired = a13_paired(gr);
    if (paired) {  // [xa1 | xa3] = x·[A1; A3]ᵀ: x read once
        mt_tensor xa13 = cols(&xx, H, extra);
        mt_tensor *views = mt_xcalloc((size_t)gr->E, sizeof *views);
        a13_views(gr, views, 0);
        mt_prof_push(LORA_ROW);
        gemm(gr, (mt_grouped){.w = gr->w, .trans = 1, .alpha = 1.0f}, &xa13, &x);
        mt_prof_pop();
        free(views);
    }
    const int lin[2] = {W1, W3};
    for (int i = 0; i < 2 && !paired; i++) {  // xa = drop(x)·Aᵀ
        const mt_lora *lo = loras(gr, lin[i], 0);
        mt_prof_push(LORA_ROW);
        gemm(gr, dropout_of(gr, lo, (mt_grouped){.w = gr->w, .trans = 1, .alpha = 1.0f, .drop_a = 1}), i ? &xa3 : &xa1, &x);
        mt_prof_pop();
    }
    base13_beside(gr, 1, 0.0f, gu, &xx);
}

// ys = [a | xa2]·[W2 | s·B2]ᵀ (mt_experts_a_extra): xa2 = drop(a)·A2ᵀ written beside a, then one
// GEMM (K = f + r), where the LoRA's own product would write ys and the base GEMM read it back.
static void forward2_folded(group *gr, const mt_tensor *y, const mt_tensor *act) {
    const mt_layer *ly = &gr->m->layers[gr->L];
    const int64_t f = gr->m->cfg.intermediate, r = mt_experts_a_extra(gr->m);
    mt_tensor xa2 = xa2_of(gr), ax = mt_view2(act->be, act->data, MT_BF16, act->shape[0], f + r, mt_tensor_ld(act));
    const mt_lora *lo = loras(gr, W2, 0);
    mt_prof_push(LORA_ROW);
    gemm(gr, dropout_of(gr, lo, (mt_grouped){.w = gr->w, .trans = 1, .alpha = 1.0f, .drop_a = 1}), &xa2, act);
    mt_prof_pop();
    const mt_tensor **b2 = mt_xcalloc((size_t)gr->E, sizeof *b2);
    for (int e = 0; e < gr->E; e++) {
        const mt_lora *l2 = ly->w2[e].lora;  // none here: another EP rank's expert
        gr->q[e] = ly->w2[e].q, gr->w[e] = NULL, b2[e] = l2 ? l2->b : NULL;
    }
    mt_prof_push(base_row(W2, 1));
    gemm(gr, kept(gr, 1, (mt_grouped){.q = gr->q, .w = gr->w, .beside = b2, .beside_scale = lo->scale, .trans = 1,
                                      .alpha = 1.0f}),
         y, &ax);
    mt_prof_pop();
    free(b2);
}

static void forward_group(group *gr, const mt_tensor *ys) {
    mt_model *m = gr->m;
    mt_layer_acts *a = layer_acts(m, gr->L);
    int64_t f = m->cfg.intermediate, n = group_rows(gr);
    mt_tensor xsv = xs_of(gr), xa1 = xa13_of(gr, W1), xa3 = xa13_of(gr, W3), actv = act_of(gr), xa2 = xa2_of(gr);
    mt_tensor *xs = &xsv, *gu = GROUP_ROWS(gr, a->gu), *act = &actv;
    mt_tensor g = half(gu, f, 0), u = half(gu, f, 1);
    if (mt_experts_xs_extra(m)) {
        forward13_folded(gr, gu);
    } else if (lora_first(gr, W1) && lora_first(gr, W3)) {  // the LoRAs write gu, the base adds to it
        lora_forward(gr, W1, &g, xs, &xa1, 0.0f);
        lora_forward(gr, W3, &u, xs, &xa3, 0.0f);
        base13(gr, 1, 1.0f, gu, xs);
    } else {
        base13(gr, 1, 0.0f, gu, xs);
        lora_forward(gr, W1, &g, xs, &xa1, 1.0f);
        lora_forward(gr, W3, &u, xs, &xa3, 1.0f);
    }
    biases(gr, W1, &g, 0), biases(gr, W3, &u, 0);
    if (!m->counting) mt_op_swiglu_fused_forward(m, act->data, mt_tensor_ld(act), gu->data, n, f);
    mt_tensor *y = GROUP_ROWS(gr, ys);
    if (mt_experts_a_extra(m)) {
        forward2_folded(gr, y, act);
    } else if (lora_first(gr, W2)) {
        lora_forward(gr, W2, y, act, &xa2, 0.0f);
        base(gr, W2, 1, 1.0f, y, act);
    } else {
        base(gr, W2, 1, 0.0f, y, act);
        lora_forward(gr, W2, y, act, &xa2, 1.0f);
    }
    biases(gr, W2, y, 0);  // in ys: the router's weight gradient dy·ys takes dy·b2 with it
}

void mt_experts_forward_gpu(mt_model *m, int L, const mt_tensor *ys_own) {
    group gr = group_new(m, L);
    if (group_rows(&gr)) forward_group(&gr, ys_own);
    group_free(&gr);
}

// An expert's Linear as the folds below see it: 1 held here, 4-bit, with a LoRA; 0 held by another
// EP rank, with a LoRA there (that rank folds it; this one's own rows arrive in its own layout's
// wider rows, model/expert_parallel.c, whoever sent them); -1 anything else (no fold).
static int fold_kind(const mt_linear *l) {
    if (l->remote) return l->remote == MT_REMOTE_LORA ? 0 : -1;
    return l->q && l->lora ? 1 : -1;
}

// w1's and w3's LoRA B fold into the experts' base GEMMs (the forward's and dx's) when every
// expert of every MoE layer has 4-bit w1 and w3, each with a LoRA (on whichever EP rank holds
// it), on the GPU step, with r and h multiples of 8 (xa1's and
// xa3's blocks, and so xs's rows, 16-byte aligned: cuBLAS's grouped call takes them; r = 4 or 12
// would send every expert's xa3 product through a call of its own): xs's rows then hold
// [x | xa1 | xa3] (2r columns beside x), and gu = [x | xa1 | xa3]·[[W1 | s·B1 | 0]; [W3 | 0 | s·B3]]ᵀ
// is one GEMM of K = h + 2r (grouped.h's beside). Model-wide, not per layer: a recomputed MLP's
// layers share one set of activations, and the planner decides the same from the run's options
// (plan/plan.c). Dropout needs no exception: xa is drop(x)·Aᵀ either way. Asked several times a
// layer, answered once (the LoRAs are attached at load; mt_model_acts_free forgets it).
static int64_t xs_extra_of(const mt_model *m) {
    const int64_t H = m->cfg.hidden;
    if (!gpu_step(m) || H % 8) return 0;
    int r = 0, moe = 0;
    for (int L = 0; L < m->cfg.layers; L++) {
        const mt_layer *ly = &m->layers[L];
        if (ly->dense) continue;
        if (!ly->w1 || !ly->w3) return 0;
        for (int e = 0; e < m->cfg.experts; e++) {
            const mt_linear *a = &ly->w1[e], *b = &ly->w3[e];
            int ka = fold_kind(a), kb = fold_kind(b);
            if (ka < 0 || kb < 0) return 0;
            if (ka) r = a->lora->r;
        }
        moe = 1;
    }
    return moe && r % 8 == 0 ? 2 * (int64_t)r : 0;
}

int64_t mt_experts_xs_extra(mt_model *m) {
    if (!m->xs_extra_known) m->xs_extra = xs_extra_of(m), m->xs_extra_known = 1;
    return m->xs_extra;
}

// w2's LoRA B folds into the forward's w2 GEMM, ys = [a | xa2]·[W2 | s·B2]ᵀ (K = f + r), when
// every expert of every MoE layer has a 4-bit w2 with a LoRA (on whichever EP rank holds it), on
// the GPU step, with r
// and f multiples of 8 (a's rows, [a | xa2], 16-byte aligned): a's rows then hold xa2 beside the
// SwiGLU output (r columns), and the backward's da, written over a, keeps that row stride.
// Dropout needs no exception: xa2 is drop(a)·A2ᵀ either way. Model-wide, as xs's room
// (recomputed layers share one a), and decided the same by the planner (plan/plan.c).
static int64_t a_extra_of(const mt_model *m) {
    if (!gpu_step(m) || m->cfg.intermediate % 8) return 0;
    int r = 0, moe = 0;
    for (int L = 0; L < m->cfg.layers; L++) {
        const mt_layer *ly = &m->layers[L];
        if (ly->dense) continue;
        if (!ly->w2) return 0;
        for (int e = 0; e < m->cfg.experts; e++) {
            const mt_linear *l = &ly->w2[e];
            int k = fold_kind(l);
            if (k < 0) return 0;
            if (k) r = l->lora->r;
        }
        moe = 1;
    }
    return moe && r % 8 == 0 ? (int64_t)r : 0;
}

int64_t mt_experts_a_extra(mt_model *m) {
    if (!m->a_extra_known) m->a_extra = a_extra_of(m), m->a_extra_known = 1;
    return m->a_extra;
}

// w2's LoRA folds into the dx GEMM when every expert of the layer has a 4-bit w2 with a LoRA
// without dropout (a mask on dxa·A2 cannot ride in the GEMM's sum; another EP rank's expert: with
// a LoRA there, the run's dropout), on the GPU step (the null backend counts the same), and,
// where the layer keeps its experts in bf16 (--expert-cache), when the kept W2 has
// the rows for A2 (sized by the dropout at build: an adapter loaded after may set another).
// Static over the step, so that the planner and the counted step agree with the run.
int64_t mt_experts_dys_extra(const mt_model *m, int L) {
    const mt_layer *ly = &m->layers[L];
    if (!gpu_step(m) || ly->dense || !ly->w2) return 0;
    int r = 0;
    for (int e = 0; e < m->cfg.experts; e++) {
        const mt_linear *l = &ly->w2[e];
        int k = fold_kind(l);
        if (k < 0 || (k == 0 && m->spec.lora_dropout > 0.0f)) return 0;
        if (k == 0) continue;
        if (l->lora->dropout > 0.0f) return 0;
        r = l->lora->r;
        const mt_tensor *kw = ly->experts_bf16[1] ? ly->experts_bf16[1][e] : NULL;
        if (kw && kw->shape[0] < m->cfg.hidden + r) return 0;
    }
    return (r + 7) / 8 * 8;  // dys's rows stay 16-byte aligned when h is a multiple of 8
}

// w2's backward folded (mt_experts_dys_extra): dB2, dxa2 = s·dys·B2 into the room beside dys
// (row stride ldd), dA2, then da = [dys | dxa2]·[W2; A2] with each expert's A2 copied under its
// dequantized W2: one GEMM writes da, where the LoRA's own product would write it and the base
// GEMM read it back.
static void w2_backward_folded(group *gr, const mt_tensor *da, const mt_tensor *dys, const mt_tensor *act,
                               const mt_tensor *xa, int64_t ldd) {
    mt_model *m = gr->m;
    const mt_layer *ly = &m->layers[gr->L];
    const int64_t H = m->cfg.hidden, n = group_rows(gr), r = loras(gr, W2, 0)->r;
    char *tail = dys->data ? (char *)dys->data + mt_dtype_bytes(MT_BF16, (size_t)H) : NULL;
    mt_tensor dxa2 = mt_view2(m->be, tail, MT_BF16, n, r, ldd);
    lora_backward(gr, W2, dys, act, xa, &dxa2, 0);
    const mt_tensor **under = mt_xcalloc((size_t)gr->E, sizeof *under);
    for (int e = 0; e < gr->E; e++) under[e] = ly->w2[e].lora ? ly->w2[e].lora->a : NULL;  // none: another rank's
    mt_tensor dys_dxa = mt_view2(m->be, dys->data, MT_BF16, n, H + r, ldd);
    base_under(gr, W2, 0, 0.0f, da, &dys_dxa, under);
    free(under);
}

// The largest r of the layer's expert LoRAs (0: none), for the dxa scratch.
static int lora_r_max(const mt_layer *ly, int E) {
    int r = 0;
    for (int e = 0; e < E; e++) {
        const mt_linear *ls[] = {&ly->w1[e], &ly->w2[e], &ly->w3[e]};
        for (int i = 0; i < 3; i++) r = ls[i]->lora ? MT_MAX(r, ls[i]->lora->r) : r;
    }
    return r;
}

// Storage: the backward's da is written over a (a's last readers, w2's gradients, go first) and
// dgu over gu (the SwiGLU backward reads each element before it writes it): no [rows, 3f]
// scratch, only the LoRAs' dxa [R, r] (w1's and w3's, when they fold, beside dx in dxs_all's rows).
void mt_experts_backward_gpu(mt_model *m, int L, const mt_tensor *dys_own, const mt_tensor *dxs_all, int64_t R) {
    group gr = group_new(m, L);
    int64_t f = m->cfg.intermediate, n = group_rows(&gr);
    mt_layer_acts *a = layer_acts(m, L);
    int r = lora_r_max(&m->layers[L], gr.E);
    mt_tensor dxa_all = r ? step_work(m, MT_BF16, R, r, 0) : (mt_tensor){0};  // every row: whatever the routing
    // The experts' rows cover dxs [R, H + mt_experts_xs_extra] (each row is some expert's): their GEMMs write it. Where
    // they would not (no rows, or rows outside the group's), it is zeroed first and added to.
    int dx_zeroed = 0;
    if (dxs_all && dxs_all->data && (gr.row0 != 0 || n != dxs_all->shape[0])) {
        m->be->ops->fill_zero(m->be, dxs_all->data, mt_dtype_bytes(dxs_all->dtype, (size_t)(dxs_all->shape[0] * dxs_all->shape[1])));
        dx_zeroed = 1;
    }
    if (n) {
        if (mt_experts_recompute_in_backward(m)) {  // gu, a, ys, xa again
            char phase = mt_prof_set_phase(MT_PROF_RECOMPUTE);
            forward_group(&gr, a->ys);
            mt_prof_set_phase(phase);
        }
        mt_tensor xsv = xs_of(&gr), xa1 = xa13_of(&gr, W1), xa3 = xa13_of(&gr, W3), actv = act_of(&gr), xa2 = xa2_of(&gr);
        mt_tensor *dys = GROUP_ROWS(&gr, dys_own), *xs = &xsv, *act = &actv;
        // dxs_all's rows leave room for w1's and w3's dxa when the LoRAs fold (backward.c sizes it
        // by mt_experts_xs_extra): dxs is its first h columns.
        mt_tensor *gu = GROUP_ROWS(&gr, a->gu), *dxs_w = GROUP_ROWS(&gr, dxs_all);
        mt_tensor dxs_v = dxs_w ? cols(dxs_w, 0, m->cfg.hidden) : (mt_tensor){0}, *dxs = dxs_w ? &dxs_v : NULL;
        mt_tensor dxa = r ? mt_view_rows(&dxa_all, 0, n) : (mt_tensor){0};
        weight_grads(&gr, W2, dys, act);
        biases(&gr, W2, dys, 1);
        mt_tensor *da = act;  // a is not read after w2's gradients
        int64_t extra = mt_experts_dys_extra(m, L), H = m->cfg.hidden;
        if (extra && mt_tensor_ld(dys) != H + extra)
            mt_fatal(MT_EXIT_ERROR, "layer %d experts: dys rows %lld apart, the fold wants %lld", L,
                     (long long)mt_tensor_ld(dys), (long long)(H + extra));
        if (extra) {
            w2_backward_folded(&gr, da, dys, act, &xa2, H + extra);
        } else {
            int w2_lora = lora_backward(&gr, W2, dys, act, &xa2, &dxa, 0);
            if (w2_lora && lora_first(&gr, W2)) {  // da = drop(dxa·A2), then da += dys·W2
                lora_dx(&gr, W2, da, &dxa, 0.0f);
                base(&gr, W2, 0, 1.0f, da, dys);
            } else {
                base(&gr, W2, 0, 0.0f, da, dys);  // da = dys·W2
                if (w2_lora) lora_dx(&gr, W2, da, &dxa, 1.0f);
            }
        }
        if (!m->counting) mt_op_swiglu_fused_backward(m, gu->data, da->data, mt_tensor_ld(da), gu->data, n, f);
        mt_tensor dg = half(gu, f, 0), du = half(gu, f, 1);  // gu now holds dgu
        // dxs's first writer sets its rows (beta 0: nobody zeroed them): w1's LoRA when every
        // expert with rows has one, as in the forward (its skinny product writes dxs once; the
        // base GEMM, compute-bound, adds in its epilogue), else the base GEMM.
        // Folded (mt_experts_xs_extra, and dx wanted): the base dx GEMM writes [dx | dxa1 | dxa3]
        // first, the LoRAs' dx += drop(dxa·A) follow.
        float dx_beta = dx_zeroed ? 1.0f : 0.0f;
        const int64_t r13 = mt_experts_xs_extra(m) / 2;
        int fold_dx = dxs && r13, dx_lora_first = dxs && !fold_dx && lora_first(&gr, W1);
        if (fold_dx) base13_beside(&gr, 0, dx_beta, dxs_w, gu), dx_beta = 1.0f;
        else if (dxs && !dx_lora_first) base13(&gr, 0, dx_beta, gu, dxs), dx_beta = 1.0f;
        weight_grads(&gr, W1, &dg, xs);
        weight_grads(&gr, W3, &du, xs);
        biases(&gr, W1, &dg, 1), biases(&gr, W3, &du, 1);
        mt_tensor dxa1 = fold_dx ? cols(dxs_w, H, r13) : dxa, dxa3 = fold_dx ? cols(dxs_w, H + r13, r13) : dxa;
        if (fold_dx && a13_paired(&gr)) {  // dB1, dB3, then dA and dx of both as one product each
            lora_backward_da(&gr, W1, &dg, xs, &xa1, &dxa1, 1, 0), lora_backward_da(&gr, W3, &du, xs, &xa3, &dxa3, 1, 0);
            mt_tensor dxa13 = cols(dxs_w, H, 2 * r13);
            a13_backward(&gr, xs, &dxa13, dxs, dx_beta);
        } else {
            if (lora_backward(&gr, W1, &dg, xs, &xa1, &dxa1, fold_dx)) lora_dx(&gr, W1, dxs, &dxa1, dx_beta);
            if (dx_lora_first) dx_beta = 1.0f;  // w1's LoRA ran: lora_first found one on every expert with rows
            if (lora_backward(&gr, W3, &du, xs, &xa3, &dxa3, fold_dx)) lora_dx(&gr, W3, dxs, &dxa3, dx_beta);
        }
        if (dx_lora_first) base13(&gr, 0, 1.0f, gu, dxs);
    }
    if (r) step_unwork(m, &dxa_all);
    group_free(&gr);
}
