// model/backward.c — the gradient of the last forward's loss, into every trainable.
#include <string.h>

#include "core/common.h"
#include "model/model_internal.h"
#include "model/ops.h"
#include "moe/moe.h"

// Zeroed work scratch of n floats (counting: reserved, no memory to zero).
static float *scratch(mt_model *m, size_t n) {
    float *p = mt_work_alloc(m->be, n * sizeof(float));
    if (p) m->be->ops->fill_zero(m->be, p, n * sizeof(float));
    return p;
}
static void unscratch(mt_model *m, float *p, size_t n) { mt_work_free(m->be, p, n * sizeof(float)); }

// dx [T, H]: the gradient of layer L's output on entry, of its input on return. Counting
// (null backend): the same scratch is reserved and released, no kernel runs.
static void layer_backward(mt_model *m, int L, float *dx) {
    const mt_model_config *c = &m->cfg;
    mt_layer *ly = &m->layers[L];
    mt_layer_kept *kp = &m->kept[L];
    mt_layer_acts *a = layer_acts(m, L);
    int B = m->B, S = m->S, T = B * S, H = (int)c->hidden, E = (int)c->experts, k = (int)c->top_k;
    int nh = (int)c->heads, nkv = (int)c->kv_heads, hd = (int)c->head_dim, f = (int)c->intermediate;
    int r = m->spec.lora_r, Tk = T * k, qd = nh * hd, kvd = nkv * hd, run = !m->counting;
    const uint8_t *mask = m->has_mask ? m->step_mask : NULL;
    float theta = (float)c->rope_theta;
#define XA(t, i) ((t) ? at(F(t), (int64_t)(i) * r) : NULL)

    // MoE: out = h + Σ weights · expert(ln2(h))
    float *dys = scratch(m, (size_t)Tk * H), *dweights = scratch(m, (size_t)Tk);
    if (run) mt_op_combine_backward(m, dys, dweights, dx, F(a->ys), F(a->weights), I(kp->order), Tk, H, k);
    // EP: the output gradients go to the experts' owners, the input gradients come back.
    int ep = m->par.ep_size > 1;
    int64_t R = ep ? mt_ep_own_rows(m, L) : Tk;
    float *dys_own = dys;
    if (ep) {
        dys_own = scratch(m, (size_t)R * H);
        mt_ep_dispatch(m, L, dys_own, dys, H);
    }
    float *dxs = scratch(m, (size_t)R * H), *da = scratch(m, (size_t)R * f);
    float *dg = scratch(m, (size_t)R * f), *du = scratch(m, (size_t)R * f);
    for (int e = 0; e < E; e++) {
        int64_t o0, n;
        mt_expert_rows(m, L, e, &o0, &n);
        if (n == 0) continue;
        float *xs = at(F(a->xs), o0 * H), *g = at(F(a->g), o0 * f), *u = at(F(a->u), o0 * f);
        float *act = at(F(a->a), o0 * f);
        mt_linear_backward(&ly->w2[e], at(da, o0 * f), at(dys_own, o0 * H), act, XA(a->xa_w2, o0), n);
        if (run) mt_op_swiglu_backward(m, dg + o0 * f, du + o0 * f, da + o0 * f, g, u, n * f);
        mt_linear_backward(&ly->w1[e], at(dxs, o0 * H), at(dg, o0 * f), xs, XA(a->xa_w1, o0), n);
        mt_linear_backward(&ly->w3[e], at(dxs, o0 * H), at(du, o0 * f), xs, XA(a->xa_w3, o0), n);
    }
    unscratch(m, da, (size_t)R * f), unscratch(m, dg, (size_t)R * f), unscratch(m, du, (size_t)R * f);
    if (ep) {
        unscratch(m, dys_own, (size_t)R * H);
        float *dxs_local = scratch(m, (size_t)Tk * H);
        mt_ep_return(m, L, dxs_local, dxs, H);
        unscratch(m, dxs, (size_t)R * H);
        dxs = dxs_local;
    }
    float *dln2 = scratch(m, (size_t)T * H);
    if (run) mt_op_gather_backward(m, dln2, dxs, I(kp->order), Tk, H, k);
    unscratch(m, dxs, (size_t)Tk * H), unscratch(m, dys, (size_t)Tk * H);

    // Router: through the top-k weights, the aux loss and the z-loss.
    float *dlogits = scratch(m, (size_t)T * E);
    if (run) mt_op_router_backward(m, dlogits, dweights, F(a->probs), I(kp->ids), F(a->weights), T, E, k);
    unscratch(m, dweights, (size_t)Tk);
    if (run && m->aux_coef != 0.0f) mt_op_aux_backward(m, dlogits, m->aux_coef, F(a->probs), mask, T);
    if (run && m->z_coef != 0.0f && m->z_rows)
        mt_op_zloss_backward(m, dlogits, m->z_coef / (float)m->z_rows, F(a->logits), mask, T, E);
    mt_linear_backward(&ly->gate, dln2, dlogits, F(a->ln2), XA(a->xa_gate, 0), T);
    unscratch(m, dlogits, (size_t)T * E);
    if (run) mt_op_rmsnorm_backward(m, dx, ly->dln2 ? F(ly->dln2) : NULL, dln2, F(a->h), F(ly->ln2), F(a->rstd2), T, H);
    unscratch(m, dln2, (size_t)T * H);  // dx is now the gradient of h

    // Attention: h = x + o(attention(rope(q(ln1 x)), rope(k(ln1 x)), v(ln1 x)))
    float *datt = scratch(m, (size_t)T * qd);
    mt_linear_backward(&ly->o, datt, dx, F(a->att), XA(a->xa_o, 0), T);
    float *dq = scratch(m, (size_t)T * qd), *dk = scratch(m, (size_t)T * kvd), *dv = scratch(m, (size_t)T * kvd);
    if (run)
        mt_op_attention_backward(m, dq, dk, dv, datt, F(a->q), F(a->k), F(a->v), F(a->att), F(a->lse), mask, B, S,
                                 nh, nkv, hd, (int)c->sliding_window);
    unscratch(m, datt, (size_t)T * qd);
    if (run) {
        mt_op_rope(m, dq, m->step_positions, T, nh, hd, theta, 1);
        mt_op_rope(m, dk, m->step_positions, T, nkv, hd, theta, 1);
    }
    float *dln1 = scratch(m, (size_t)T * H);
    mt_linear_backward(&ly->q, dln1, dq, F(a->ln1), XA(a->xa_q, 0), T);
    mt_linear_backward(&ly->k, dln1, dk, F(a->ln1), XA(a->xa_k, 0), T);
    mt_linear_backward(&ly->v, dln1, dv, F(a->ln1), XA(a->xa_v, 0), T);
    unscratch(m, dq, (size_t)T * qd), unscratch(m, dk, (size_t)T * kvd), unscratch(m, dv, (size_t)T * kvd);
    if (run) mt_op_rmsnorm_backward(m, dx, ly->dln1 ? F(ly->dln1) : NULL, dln1, F(kp->x), F(ly->ln1), F(a->rstd1), T, H);
    unscratch(m, dln1, (size_t)T * H);
#undef XA
}

void mt_model_backward(mt_model *m) {
    const mt_model_config *c = &m->cfg;
    int T = m->B * m->S, H = (int)c->hidden, V = (int)c->vocab, run = !m->counting;
    // The loss's gradient is written over the logits: the step never holds two T×V fp32 buffers.
    float *dlogits = F(m->logits);
    int64_t count;
    if (run)
        mt_op_cross_entropy(m, dlogits, m->ce_count ? 1.0f / (float)m->ce_count : 0.0f, &count, F(m->logits),
                            m->step_targets, T, V);
    float *dxf = scratch(m, (size_t)T * H);
    mt_linear_backward(&m->lm_head, dxf, dlogits, F(m->xf), NULL, T);
    float *dx = scratch(m, (size_t)T * H);
    if (run) mt_op_rmsnorm_backward(m, dx, m->dnorm ? F(m->dnorm) : NULL, dxf, F(m->x_final), F(m->norm), F(m->rstdf), T, H);
    unscratch(m, dxf, (size_t)T * H);
    // Layers below the lowest trainable one have nothing to learn and nothing above them needs
    // their input gradient: backward stops there.
    for (int L = (int)c->layers - 1; L >= m->lowest_trainable; L--) {
        if (m->recompute) mt_layer_forward(m, L, NULL, 1);  // refill the shared set, same routing
        layer_backward(m, L, dx);
    }
    if (run && m->dembed) mt_op_embedding_backward(m, F(m->dembed), dx, m->step_tokens, T, H);
    unscratch(m, dx, (size_t)T * H);
}

static void zero(mt_backend *be, mt_tensor *t) {
    if (t) be->ops->fill_zero(be, t->data, t->nbytes);
}

static void zero_linear(mt_backend *be, mt_linear *l) {
    zero(be, l->dw);
    if (l->lora) zero(be, l->lora->da), zero(be, l->lora->db);
}

void mt_model_zero_grad(mt_model *m) {
    zero(m->be, m->dembed), zero(m->be, m->dnorm);
    zero_linear(m->be, &m->lm_head);
    for (int L = 0; L < m->cfg.layers; L++) {
        mt_layer *ly = &m->layers[L];
        zero(m->be, ly->dln1), zero(m->be, ly->dln2);
        mt_linear *ls[] = {&ly->q, &ly->k, &ly->v, &ly->o, &ly->gate};
        for (int i = 0; i < 5; i++) zero_linear(m->be, ls[i]);
        for (int e = 0; e < m->cfg.experts; e++)
            zero_linear(m->be, &ly->w1[e]), zero_linear(m->be, &ly->w2[e]), zero_linear(m->be, &ly->w3[e]);
    }
}
