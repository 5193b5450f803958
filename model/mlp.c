// model/mlp.c — a SwiGLU MLP on every token: the MLP of a dense layer (Qwen's mlp_only_layers and
// decoder_sparse_step, DeepSeek's first_k_dense_replace) and the shared expert of an MoE layer,
// whose output Qwen2-MoE scales by s = sigmoid(shared_expert_gate(x)) and DeepSeek-style families
// add as it is (docs/families.md). y = down(silu(gate(x)) ⊙ up(x)).
// As an expert's (model/experts.c): the cpu runs gate and up apart into g and u (the f32
// reference); the GPU step writes them into the column blocks of gu [T, 2f] and runs the fused
// SwiGLU over it. The counting backend makes the GPU step's allocations and runs nothing.
#include "core/common.h"
#include "model/model_internal.h"

int64_t mt_mlp_size(const mt_model *m, int L) {
    const mt_model_config *c = &m->cfg;
    return !mt_config_layer_is_moe(c, L) ? c->dense_intermediate : c->shared_intermediate;
}

// The MLP's gate and up outputs [T, f] (the kept set may be wider: a layer's f is its own): g, u
// apart on the cpu, or *gu [T, 2f] and its column blocks on the GPU step.
typedef struct { mt_tensor g, u, gu; } mlp_gu;

static mlp_gu mlp_views(mt_model *m, mt_layer_acts *a, int64_t T, int64_t f) {
    mlp_gu v = {0};
    if (a->mlp_gu) {
        mt_act *d = a->mlp_gu->data;
        v.gu = mt_view2(m->be, d, a->mlp_gu->dtype, T, 2 * f, 0);
        v.g = mt_view2(m->be, d, a->mlp_gu->dtype, T, f, 2 * f);
        v.u = mt_view2(m->be, d ? (char *)d + mt_dtype_bytes(a->mlp_gu->dtype, (size_t)f) : NULL, a->mlp_gu->dtype, T,
                       f, 2 * f);
    } else {
        v.g = mt_view2(m->be, a->mlp_g->data, a->mlp_g->dtype, T, f, 0);
        v.u = mt_view2(m->be, a->mlp_u->data, a->mlp_u->dtype, T, f, 0);
    }
    return v;
}

void mt_mlp_forward(mt_model *m, int L) {
    mt_layer *ly = &m->layers[L];
    mt_layer_acts *a = layer_acts(m, L);
    int64_t T = (int64_t)m->B * m->S, f = mt_mlp_size(m, L);
    int run = !m->counting;
    mlp_gu v = mlp_views(m, a, T, f);
    mt_tensor act = mt_view2(m->be, a->mlp_a->data, a->mlp_a->dtype, T, f, 0);
    mt_linear_forward(&ly->mlp[0], &v.g, a->ln2, a->xa_mlp[0], NULL);
    mt_linear_forward(&ly->mlp[2], &v.u, a->ln2, a->xa_mlp[2], NULL);
    if (run && a->mlp_gu) mt_op_swiglu_fused_forward(m, act.data, f, v.gu.data, T, f);
    else if (run) mt_op_swiglu_forward(m, act.data, v.g.data, v.u.data, T * f);
    mt_linear_forward(&ly->mlp[1], a->mlp_y, &act, a->xa_mlp[1], NULL);
    if (ly->shared_gate.out) {  // the shared expert's gate: one logit per token, then its sigmoid
        mt_tensor sl = mt_view2(m->be, a->mlp_s->data, a->mlp_s->dtype, T, 1, 0);
        mt_linear_forward(&ly->shared_gate, &sl, a->ln2, a->xa_sgate, NULL);
        if (run) mt_op_sigmoid(m, sl.data, T);
    }
}

void mt_mlp_add_output(mt_model *m, int L, mt_act *x_out) {
    if (m->counting) return;
    mt_layer_acts *a = layer_acts(m, L);
    int64_t T = (int64_t)m->B * m->S, H = m->cfg.hidden;
    mt_op_scaled_add(m, x_out, a->mlp_y->data, m->layers[L].shared_gate.out ? F(a->mlp_s) : NULL, T, H);
}

void mt_mlp_backward(mt_model *m, int L, const mt_tensor *dx, const mt_tensor *dln2) {
    mt_layer *ly = &m->layers[L];
    int trains = ly->shared_gate.dw || ly->shared_gate.lora;
    for (int i = 0; i < 3; i++) trains |= ly->mlp[i].dw || ly->mlp[i].lora;
    if (!dln2 && !trains) return;  // nothing below wants ln2's gradient, nothing here learns
    mt_layer_acts *a = layer_acts(m, L);
    int64_t T = (int64_t)m->B * m->S, H = m->cfg.hidden, f = mt_mlp_size(m, L);
    int run = !m->counting;
    mt_dtype adt = act_dtype(m);
    mt_tensor dy = *dx, dsl = {0};
    int gated = ly->shared_gate.out != 0;
    if (gated) {  // y_out = s ⊙ y: dy = s ⊙ dx, ds_logit = s (1 − s) Σ_i dx_i y_i
        dy = step_work(m, adt, T, H, 0), dsl = step_work(m, MT_F32, T, 1, 0);
        if (run) mt_op_gate_backward(m, dy.data, F(&dsl), dx->data, a->mlp_y->data, F(a->mlp_s), T, H);
        mt_linear_backward(&ly->shared_gate, dln2, &dsl, a->ln2, a->xa_sgate, NULL);
    }
    mlp_gu v = mlp_views(m, a, T, f);
    mt_tensor act = mt_view2(m->be, a->mlp_a->data, a->mlp_a->dtype, T, f, 0);
    // dg | du side by side [T, 2f] (the fused SwiGLU's layout on the GPU step; two halves on the cpu)
    mt_tensor da = step_work(m, adt, T, f, 1), dgu = step_work(m, adt, T, 2 * f, 1);
    mt_tensor dg, du;
    if (a->mlp_gu) {
        dg = mt_view2(m->be, dgu.data, adt, T, f, 2 * f);
        du = mt_view2(m->be, dgu.data ? (char *)dgu.data + mt_dtype_bytes(adt, (size_t)f) : NULL, adt, T, f, 2 * f);
    } else {
        dg = mt_view2(m->be, dgu.data, adt, T, f, 0);
        du = mt_view2(m->be, dgu.data ? (char *)dgu.data + mt_dtype_bytes(adt, (size_t)(T * f)) : NULL, adt, T, f, 0);
    }
    mt_linear_backward(&ly->mlp[1], &da, &dy, &act, a->xa_mlp[1], NULL);
    if (run && a->mlp_gu) mt_op_swiglu_fused_backward(m, dgu.data, da.data, f, v.gu.data, T, f);
    else if (run) mt_op_swiglu_backward(m, dg.data, du.data, da.data, v.g.data, v.u.data, T * f);
    mt_linear_backward(&ly->mlp[0], dln2, &dg, a->ln2, a->xa_mlp[0], NULL);
    mt_linear_backward(&ly->mlp[2], dln2, &du, a->ln2, a->xa_mlp[2], NULL);
    step_unwork(m, &da), step_unwork(m, &dgu);
    if (gated) step_unwork(m, &dy), step_unwork(m, &dsl);
}
