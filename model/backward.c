// model/backward.c — the gradient of the last forward's loss, into every trainable.
#include <string.h>

#include "core/common.h"
#include "core/profile.h"
#include "model/model_internal.h"
#include "model/ops.h"
#include "moe/moe.h"

static int linear_trains(const mt_linear *l) { return l->dw || l->lora; }

// Whether anything between ln1's output and the attention trains: q, k, v (weights, LoRA,
// biases) or the q/k norms. Then the attention's own backward must run.
static int qkv_trains(const mt_layer *ly) {
    return linear_trains(&ly->q) || linear_trains(&ly->k) || linear_trains(&ly->v) || ly->dqn || ly->dkn ||
           ly->dbias[0] || ly->dbias[1] || ly->dbias[2] || linear_trains(&ly->q_a) || linear_trains(&ly->kv_a) ||
           linear_trains(&ly->kv_b) || ly->dq_a_norm || ly->dkv_a_norm;  // MLA's
}

// What layer L's backward must produce beyond its own experts' gradients. Autograd's rule: a
// gradient is made only where something trainable lies at or below it. The input's gradient is
// wanted when a layer below trains or the embedding does; h's (the attention block's output)
// also when the attention block trains; ln2's output's also when ln2's weight trains. So the
// lowest trainable layer of an experts-only LoRA skips its experts' dx GEMMs and its whole
// attention backward, as PyTorch does for a layer whose input needs no gradient.
typedef struct { int dx_in, dh, dln2, dlogits; } layer_needs;

static layer_needs needs_of(const mt_model *m, int L) {
    const mt_layer *ly = &m->layers[L];
    layer_needs n;
    n.dx_in = L > m->lowest_trainable || m->dembed;
    int attn = ly->dln1 || qkv_trains(ly) || linear_trains(&ly->o) || ly->dbias[3] || ly->dsinks;
    n.dh = n.dx_in || attn;
    n.dln2 = n.dh || ly->dln2;
    n.dlogits = !ly->dense && (n.dln2 || linear_trains(&ly->gate) || ly->dgate_bias);  // a dense layer has no router
    return n;
}

// The MoE block's backward from dx (the layer output's gradient): the experts, the shared expert
// and the router; the gradient of ln2's output when need->dln2 (step work: the caller releases
// it), else an empty tensor.
static mt_tensor moe_backward(mt_model *m, int L, const mt_tensor *dx, const layer_needs *need) {
    const mt_model_config *c = &m->cfg;
    mt_layer *ly = &m->layers[L];
    mt_layer_kept *kp = &m->kept[L];
    mt_layer_acts *a = layer_acts(m, L);
    int T = m->B * m->S, H = (int)c->hidden, E = (int)c->experts, k = (int)c->top_k;
    int Tk = T * k, run = !m->counting;
    const uint8_t *mask = m->has_mask ? m->step_mask : NULL;
    mt_dtype adt = act_dtype(m);

    // MoE: out = h + Σ weights · expert(ln2(h))
    // dweights needs ys, which the GPU step's experts recompute in their backward when
    // recomputation is theirs (mt_experts_recompute_in_backward): then it is taken after them.
    // The cpu's experts give it themselves (mt_experts_give_dweights).
    int by_experts = mt_experts_give_dweights(m), late = !by_experts && mt_experts_recompute_in_backward(m);
    // dys and dxs are written whole (the combine's backward, the experts), not added to: not zeroed.
    // dys's rows leave the experts room beside them (mt_experts_dys_extra): the rows the experts
    // take (EP: the own layout's, below; the local ones need none).
    int ep = m->par.ep_size > 1;
    int64_t ldd = H + mt_experts_dys_extra(m, L), ldl = ep ? H : ldd;
    mt_tensor dys_rows = step_work(m, adt, Tk, ldl, 0), dweights = step_work(m, MT_F32, Tk, 1, 1);
    mt_tensor dys = mt_view2(m->be, dys_rows.data, adt, Tk, H, ldl);
    float *dw_early = late || by_experts || !need->dlogits ? NULL : F(&dweights);
    if (run) mt_op_combine_backward(m, dys.data, ldl, dw_early, A(dx), A(a->ys), F(a->weights), I(kp->order), Tk, H, k);
    // EP: the output gradients go to the experts' owners, the input gradients come back.
    int64_t R = ep ? mt_ep_own_rows(m, L) : Tk;
    mt_tensor dys_own = dys, dys_own_rows = {0};
    if (ep) {  // into rows with the experts' room beside them
        dys_own_rows = step_work(m, adt, R, ldd, 1);
        dys_own = mt_view2(m->be, dys_own_rows.data, adt, R, H, ldd);
        mt_ep_dispatch(m, L, dys_own.data, ldd, dys.data, ldl, H);
    }
    // dxs's rows leave room for w1's and w3's LoRA dxa when they fold (mt_experts_xs_extra).
    mt_tensor dxs = need->dln2 ? step_work(m, adt, R, H + mt_experts_xs_extra(m), 0) : (mt_tensor){0};
    mt_experts_backward(m, L, &dys_own, need->dln2 ? &dxs : NULL, by_experts && need->dlogits ? F(&dweights) : NULL, R);
    if (run && late && need->dlogits)
        mt_op_combine_backward(m, NULL, H, F(&dweights), A(dx), A(a->ys), F(a->weights), I(kp->order), Tk, H, k);
    if (ep) step_unwork(m, &dys_own_rows);
    mt_tensor dln2 = {0};
    if (need->dln2) {
        if (ep) {
            mt_tensor dxs_local = step_work(m, adt, Tk, H, 1);
            mt_ep_return(m, L, dxs_local.data, H, dxs.data, dxs.shape[1], H);  // dxs: room for the folded dxa
            step_unwork(m, &dxs);
            dxs = dxs_local;
        }
        dln2 = step_work(m, adt, T, H, 0);  // the gather's backward writes it whole
        if (run) mt_op_gather_backward(m, dln2.data, dxs.data, dxs.shape[1], I(kp->order), Tk, H, k);
        step_unwork(m, &dxs);
    }
    step_unwork(m, &dys_rows);
    if (ly->mlp[0].out) mt_mlp_backward(m, L, dx, need->dln2 ? &dln2 : NULL);  // the shared expert and its gate

    // Router: through the top-k weights, the aux loss and the z-loss.
    if (need->dlogits) {
        mt_tensor dlogits = step_work(m, MT_F32, T, E, 1);
        if (run && grouped_router(m))
            mt_op_router_grouped_backward(m, F(&dlogits), F(&dweights), F(a->probs), I(kp->ids), F(a->weights), T, E,
                                          k, route_rule(m));
        else if (run)
            mt_op_router_backward(m, F(&dlogits), F(&dweights), F(a->probs), I(kp->ids), F(a->weights), T, E, k);
        if (run && m->aux_coef != 0.0f) mt_op_aux_backward(m, F(&dlogits), m->aux_coef, F(a->probs), mask, T);
        if (run && m->z_coef != 0.0f && m->z_rows)
            mt_op_zloss_backward(m, F(&dlogits), m->z_coef / (float)m->z_rows, F(a->logits), mask, T, E);
        if (run && m->seq_aux_coef != 0.0f && m->seq_aux[1] > 0)
            mt_op_router_seq_aux_backward(m, F(&dlogits), (float)(m->seq_aux_coef / mt_model_seq_aux_seqs(m)),
                                          F(a->probs), I(kp->ids), mask, m->B, m->S, E, k, route_rule(m).sigmoid);
        if (ly->dgate_bias) mt_op_logit_bias_backward(m, A(ly->dgate_bias), F(&dlogits), T, E);
        mt_prof_push2("router GEMM (dx)", "LoRA gate");
        mt_linear_backward(&ly->gate, need->dln2 ? &dln2 : NULL, &dlogits, a->ln2, a->xa_gate, NULL);
        mt_prof_pop();
        step_unwork(m, &dlogits);
    }
    step_unwork(m, &dweights);
    return dln2;
}

// dx [T, H]: the gradient of layer L's output on entry, of its input on return (unchanged when
// nothing below needs it: needs_of). Counting
// (null backend): the same scratch is reserved and released, no kernel runs. Gradient scratch
// is the step's storage dtype (bf16 on the GPU step), fp32 for the router's.
static void layer_backward(mt_model *m, int L, const mt_tensor *dx) {
    const mt_model_config *c = &m->cfg;
    mt_layer *ly = &m->layers[L];
    mt_layer_kept *kp = &m->kept[L];
    mt_layer_acts *a = layer_acts(m, L);
    int B = m->B, S = m->S, T = B * S, H = (int)c->hidden;
    int nh = (int)c->heads, nkv = (int)c->kv_heads, hd = (int)c->head_dim;
    int qd = nh * hd, kvd = nkv * hd, run = !m->counting;
    const uint8_t *mask = m->has_mask ? m->step_mask : NULL;
    mt_dtype adt = act_dtype(m);
    layer_needs need = needs_of(m, L);

    mt_tensor dln2;
    if (ly->dense) {  // a dense layer: out = h + mlp(ln2(h))
        dln2 = need.dln2 ? step_work(m, adt, T, H, 1) : (mt_tensor){0};
        mt_mlp_backward(m, L, dx, need.dln2 ? &dln2 : NULL);
    } else {
        dln2 = moe_backward(m, L, dx, &need);
    }
    if (!need.dln2) return;
    if (run) mt_op_rmsnorm_backward(m, A(dx), A(ly->dln2), dln2.data, A(a->h), A(ly->ln2), F(a->rstd2), T, H);
    step_unwork(m, &dln2);  // dx is now the gradient of h
    if (!need.dh) return;

    // Attention: h = x + o(attention(rope(q(ln1 x)), rope(k(ln1 x)), v(ln1 x)))
    int want_dln1 = need.dx_in || ly->dln1 != NULL;
    int want_datt = want_dln1 || qkv_trains(ly) || ly->dsinks;
    int64_t att_width = c->mla ? (int64_t)nh * c->v_head_dim : qd;
    mt_tensor datt = want_datt ? step_work(m, adt, T, att_width, 1) : (mt_tensor){0};
    if (ly->bias[3]) mt_bias_backward(m, A(ly->dbias[3]), A(dx), T, H);
    mt_prof_push2("o GEMM (dx)", "LoRA q,k,v,o");
    mt_linear_backward(&ly->o, want_datt ? &datt : NULL, dx, a->att, a->xa_o, NULL);
    mt_prof_pop();
    if (!want_datt) return;
    if (c->mla) {
        mt_tensor dln1 = want_dln1 ? step_work(m, adt, T, H, 1) : (mt_tensor){0};
        mt_mla_backward(m, L, &datt, want_dln1 ? &dln1 : NULL);
        step_unwork(m, &datt);
        if (!want_dln1) return;
        if (run) mt_op_rmsnorm_backward(m, A(dx), A(ly->dln1), dln1.data, A(kp->x), A(ly->ln1), F(a->rstd1), T, H);
        step_unwork(m, &dln1);
        return;
    }
    mt_tensor dq = step_work(m, adt, T, qd, 1), dk = step_work(m, adt, T, kvd, 1), dv = step_work(m, adt, T, kvd, 1);
    if (run)
        mt_op_attention_backward(m, dq.data, dk.data, dv.data, ly->dsinks ? A(ly->dsinks) : NULL, datt.data, A(a->q),
                                 A(a->k), A(a->v), A(a->att), F(a->lse), ly->sinks ? A(ly->sinks) : NULL, mask, B, S, nh,
                                 nkv, hd, hd, (float)mt_config_attn_scale(c), (int)mt_config_layer_window(c, L));
    else mt_op_attention_count(m, 1, ly->sinks != NULL, mask, B, S, nh, nkv, hd, hd, (int)mt_config_layer_window(c, L));
    step_unwork(m, &datt);
    if (run) {
        int rot = (int)mt_config_rotary_dim(c);
        mt_op_rope(m, dq.data, m->step_positions, T, nh, hd, 0, rot, 0, 1);
        mt_op_rope(m, dk.data, m->step_positions, T, nkv, hd, 0, rot, 0, 1);
    }
    int ph = c->qk_norm == MT_QK_NORM_HEAD;
    if (c->clip_qkv > 0) {  // through the clamps: no gradient where a value was cut
        float cl = (float)c->clip_qkv;
        mt_clip_backward_normed(m, dq.data, A(a->q_raw), F(a->rstd_q), A(ly->qn), ph ? T * nh : T, ph ? hd : qd, cl);
        mt_clip_backward_normed(m, dk.data, A(a->k_raw), F(a->rstd_k), A(ly->kn), ph ? T * nkv : T, ph ? hd : kvd, cl);
        mt_clip_backward(m, dv.data, A(a->v_raw), (int64_t)T * kvd, cl);
    }
    if (a->q_raw) {  // through the q/k RMSNorm: dq, dk become the projections' gradients
        mt_tensor dq_raw = step_work(m, adt, T, qd, 1), dk_raw = step_work(m, adt, T, kvd, 1);
        if (run) {
            mt_op_rmsnorm_backward(m, dq_raw.data, A(ly->dqn), dq.data, A(a->q_raw), A(ly->qn), F(a->rstd_q),
                                   ph ? T * nh : T, ph ? hd : qd);
            mt_op_rmsnorm_backward(m, dk_raw.data, A(ly->dkn), dk.data, A(a->k_raw), A(ly->kn), F(a->rstd_k),
                                   ph ? T * nkv : T, ph ? hd : kvd);
        }
        step_unwork(m, &dq), step_unwork(m, &dk);
        dq = dq_raw, dk = dk_raw;
    }
    mt_tensor *dqkv[3] = {&dq, &dk, &dv};
    for (int i = 0; i < 3; i++)
        if (ly->bias[i]) mt_bias_backward(m, A(ly->dbias[i]), dqkv[i]->data, T, dqkv[i]->shape[1]);
    mt_tensor dln1 = want_dln1 ? step_work(m, adt, T, H, 1) : (mt_tensor){0};
    const mt_tensor *d1 = want_dln1 ? &dln1 : NULL;
    mt_prof_push2("q,k,v GEMMs (dx)", "LoRA q,k,v,o");
    mt_linear_backward(&ly->q, d1, &dq, a->ln1, a->xa_q, NULL);
    mt_linear_backward(&ly->k, d1, &dk, a->ln1, a->xa_k, NULL);
    mt_linear_backward(&ly->v, d1, &dv, a->ln1, a->xa_v, NULL);
    mt_prof_pop();
    step_unwork(m, &dq), step_unwork(m, &dk), step_unwork(m, &dv);
    if (!want_dln1) return;
    if (run) mt_op_rmsnorm_backward(m, A(dx), A(ly->dln1), dln1.data, A(kp->x), A(ly->ln1), F(a->rstd1), T, H);
    step_unwork(m, &dln1);
}

void mt_model_backward(mt_model *m) {
    const mt_model_config *c = &m->cfg;
    int T = m->B * m->S, H = (int)c->hidden, run = !m->counting;
    mt_dtype adt = act_dtype(m);
    char phase = mt_prof_set_phase(MT_PROF_BWD);
    // The loss's gradient of xf: made by a training forward (scaled here), or the logits
    // recomputed a chunk at a time, never [T, V] whole.
    mt_tensor *early = m->dxf_early;
    mt_tensor dxf = early ? mt_view2(m->be, early->data, early->dtype, T, H, 0) : step_work(m, adt, T, H, 1);
    if (early && run && m->ce_count) {
        mt_prof_push("loss gradient scale");  // by 1/count, known only after the forward
        mt_prof_count((double)T * H, 2.0 * (double)mt_dtype_bytes(early->dtype, (size_t)T * H));
        m->be->ops->scale(m->be, early->data, early->dtype, (size_t)T * H, 1.0f / (float)m->ce_count);
        mt_prof_pop();
    }
    if (!early) mt_model_loss_backward(m, &dxf);
    mt_tensor dx = step_work(m, adt, T, H, 1);
    if (run) mt_op_rmsnorm_backward(m, dx.data, A(m->dnorm), dxf.data, A(m->x_final), A(m->norm), F(m->rstdf), T, H);
    if (early) mt_tensor_free(early), m->dxf_early = NULL;
    else step_unwork(m, &dxf);
    // Layers below the lowest trainable one have nothing to learn and nothing above them needs
    // their input gradient: backward stops there.
    for (int L = (int)c->layers - 1; L >= m->lowest_trainable; L--) {
        // refill the shared parts, same routing
        if (m->recompute_attn || m->recompute_mlp) mt_layer_forward(m, L, NULL, 1);
        layer_backward(m, L, &dx);
    }
    if (run && m->dembed) mt_op_embedding_backward(m, A(m->dembed), dx.data, m->step_tokens, T, H);
    step_unwork(m, &dx);
    mt_prof_set_phase(phase);
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
        zero(m->be, ly->dln1), zero(m->be, ly->dln2), zero(m->be, ly->dqn), zero(m->be, ly->dkn);
        for (int i = 0; i < 4; i++) zero(m->be, ly->dbias[i]);
        for (int i = 0; i < 3; i++) zero(m->be, ly->debias[i]);
        zero(m->be, ly->dsinks), zero(m->be, ly->dgate_bias);
        zero(m->be, ly->dq_a_norm), zero(m->be, ly->dkv_a_norm);
        mt_linear *ls[] = {&ly->q, &ly->k, &ly->v, &ly->o, &ly->gate, &ly->mlp[0], &ly->mlp[1], &ly->mlp[2],
                           &ly->shared_gate, &ly->q_a, &ly->kv_a, &ly->kv_b};
        for (size_t i = 0; i < MT_ARRAY_LEN(ls); i++) zero_linear(m->be, ls[i]);
        for (int e = 0; e < m->cfg.experts; e++)
            zero_linear(m->be, &ly->w1[e]), zero_linear(m->be, &ly->w2[e]), zero_linear(m->be, &ly->w3[e]);
    }
}
