// model/mlp.c — a SwiGLU MLP on every token: the MLP of a dense layer (Qwen's mlp_only_layers and
// decoder_sparse_step) and the shared expert of an MoE layer (Qwen2-MoE), whose output is scaled
// by s = sigmoid(shared_expert_gate(x)) (docs/families.md). CPU reference; the counting backend
// makes the same allocations and runs nothing. y = down(silu(gate(x)) ⊙ up(x)).
#include <math.h>

#include "core/common.h"
#include "model/model_internal.h"

int64_t mt_mlp_size(const mt_model *m, int L) {
    const mt_model_config *c = &m->cfg;
    return !mt_config_layer_is_moe(c, L) ? c->dense_intermediate : c->shared_intermediate;
}

void mt_mlp_forward(mt_model *m, int L) {
    mt_layer *ly = &m->layers[L];
    mt_layer_acts *a = layer_acts(m, L);
    int64_t T = (int64_t)m->B * m->S, f = mt_mlp_size(m, L);
    int run = !m->counting;
    mt_tensor g = mt_view2(m->be, a->mlp_g->data, a->mlp_g->dtype, T, f, 0);  // the set may be wider
    mt_tensor u = mt_view2(m->be, a->mlp_u->data, a->mlp_u->dtype, T, f, 0);
    mt_tensor act = mt_view2(m->be, a->mlp_a->data, a->mlp_a->dtype, T, f, 0);
    mt_linear_forward(&ly->mlp[0], &g, a->ln2, a->xa_mlp[0], NULL);
    mt_linear_forward(&ly->mlp[2], &u, a->ln2, a->xa_mlp[2], NULL);
    if (run) mt_op_swiglu_forward(m, act.data, g.data, u.data, T * f);
    mt_linear_forward(&ly->mlp[1], a->mlp_y, &act, a->xa_mlp[1], NULL);
    if (!ly->dense) {  // the shared expert's gate: one logit per token, then its sigmoid
        mt_tensor sl = mt_view2(m->be, a->mlp_s->data, a->mlp_s->dtype, T, 1, 0);
        mt_linear_forward(&ly->shared_gate, &sl, a->ln2, a->xa_sgate, NULL);
        if (run)
            for (int64_t t = 0; t < T; t++) ((float *)sl.data)[t] = 1.0f / (1.0f + expf(-((float *)sl.data)[t]));
    }
}

void mt_mlp_add_output(mt_model *m, int L, mt_act *x_out) {
    if (m->counting) return;
    mt_layer_acts *a = layer_acts(m, L);
    int64_t T = (int64_t)m->B * m->S, H = m->cfg.hidden;
    const float *s = m->layers[L].dense ? NULL : a->mlp_s->data;
    float *out = x_out;
    const float *y = a->mlp_y->data;
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < H; i++) out[t * H + i] += (s ? s[t] : 1.0f) * y[t * H + i];
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
    if (!ly->dense) {  // y_out = s ⊙ y: dy = s ⊙ dx, ds_logit = s (1 − s) Σ_i dx_i y_i
        dy = step_work(m, adt, T, H, 0), dsl = step_work(m, MT_F32, T, 1, 0);
        if (run) {
            const float *s = a->mlp_s->data, *y = a->mlp_y->data, *d = dx->data;
            float *o = dy.data, *ds = dsl.data;
            for (int64_t t = 0; t < T; t++) {
                double dot = 0;
                for (int64_t i = 0; i < H; i++) o[t * H + i] = s[t] * d[t * H + i], dot += (double)d[t * H + i] * y[t * H + i];
                ds[t] = (float)(dot * s[t] * (1.0f - s[t]));
            }
        }
        mt_linear_backward(&ly->shared_gate, dln2, &dsl, a->ln2, a->xa_sgate, NULL);
    }
    mt_tensor g = mt_view2(m->be, a->mlp_g->data, a->mlp_g->dtype, T, f, 0);
    mt_tensor u = mt_view2(m->be, a->mlp_u->data, a->mlp_u->dtype, T, f, 0);
    mt_tensor act = mt_view2(m->be, a->mlp_a->data, a->mlp_a->dtype, T, f, 0);
    mt_tensor da = step_work(m, adt, T, f, 1), dg = step_work(m, adt, T, f, 1), du = step_work(m, adt, T, f, 1);
    mt_linear_backward(&ly->mlp[1], &da, &dy, &act, a->xa_mlp[1], NULL);
    if (run) mt_op_swiglu_backward(m, dg.data, du.data, da.data, g.data, u.data, T * f);
    mt_linear_backward(&ly->mlp[0], dln2, &dg, a->ln2, a->xa_mlp[0], NULL);
    mt_linear_backward(&ly->mlp[2], dln2, &du, a->ln2, a->xa_mlp[2], NULL);
    step_unwork(m, &da), step_unwork(m, &dg), step_unwork(m, &du);
    if (!ly->dense) step_unwork(m, &dy), step_unwork(m, &dsl);
}
