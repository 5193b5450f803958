// model/attention_mla.c — multi-head latent attention (DeepSeek-V2/V3; docs/families.md
// "DeepSeek-style"), from ln1's output to the attention output a->att, and back:
//   q      = q_b(norm_qa(q_a(x)))  or q_proj(x) without q_lora_rank       [T, nh, nope + rope]
//   kv_a   = kv_a_proj_with_mqa(x) = [latent (kvr) | shared rope key (rope)]
//   kvb    = kv_b(norm_kva(latent)) = per head [k_nope (nope) | v (vd)]
//   k      = per head [k_nope | rope(shared key)],  q's rope part turned in place
//   att    = softmax(scale · q·kᵀ) v, scale = (nope + rope)^-0.5 · mscale² (mt_config_attn_scale)
// RoPE turns pairs (2j, 2j+1) where rope_interleave says (model/ops.h rope_forward_cpu). The latent
// is a column block of kv_a's rows: it is copied out (copy2d) for its RMSNorm, which wants whole rows.
#include "core/common.h"
#include "core/profile.h"
#include "model/model_internal.h"

typedef struct {
    int B, S, T, H, nh, nope, rope, vd, qk, kvr, kva, qr;
} mla_dims;

static mla_dims dims_of(const mt_model *m) {
    const mt_model_config *c = &m->cfg;
    mla_dims d = {.B = m->B, .S = m->S, .T = m->B * m->S, .H = (int)c->hidden, .nh = (int)c->heads,
                  .nope = (int)c->qk_nope_dim, .rope = (int)c->qk_rope_dim, .vd = (int)c->v_head_dim,
                  .qk = (int)c->head_dim, .kvr = (int)c->kv_lora_rank, .qr = (int)c->q_lora_rank};
    d.kva = d.kvr + d.rope;
    return d;
}

// Columns [0, kvr) of kv_a's rows [T, kva] <-> a contiguous [T, kvr] (to_block 1: out of kv_a).
static void latent_copy(mt_model *m, mt_act *block, mt_act *rows, const mla_dims *d, int to_block) {
    size_t w = mt_dtype_bytes(act_dtype(m), 1);
    if (to_block) m->be->ops->copy2d(m->be, block, w * d->kvr, rows, w * d->kva, w * d->kvr, (size_t)d->T);
    else m->be->ops->copy2d(m->be, rows, w * d->kva, block, w * d->kvr, w * d->kvr, (size_t)d->T);
}

// The shared rope key: kv_a's columns [kvr, kva), rows kva apart.
static mt_act *rope_key(mt_model *m, const mt_tensor *kv_a, const mla_dims *d) {
    return kv_a->data ? (char *)kv_a->data + mt_dtype_bytes(act_dtype(m), (size_t)d->kvr) : NULL;
}

void mt_mla_forward(mt_model *m, int L) {
    const mt_model_config *c = &m->cfg;
    mt_layer *ly = &m->layers[L];
    mt_layer_acts *a = layer_acts(m, L);
    mla_dims d = dims_of(m);
    int run = !m->counting;
    float eps = (float)c->rms_norm_eps;
    const uint8_t *mask = m->has_mask ? m->step_mask : NULL;
    mt_dtype adt = act_dtype(m);

    mt_prof_push2("q,k,v GEMMs", "LoRA q,k,v,o");
    if (d.qr) {  // the compressed query
        mt_linear_forward(&ly->q_a, a->q_a, a->ln1, a->xa_qa, NULL);
        if (ly->bias[0]) mt_bias_forward(m, A(a->q_a), A(ly->bias[0]), d.T, d.qr);
        if (run) mt_op_rmsnorm_forward(m, A(a->q_an), F(a->rstd_qa), A(a->q_a), A(ly->q_a_norm), d.T, d.qr, eps);
        mt_linear_forward(&ly->q, a->q, a->q_an, a->xa_q, NULL);
    } else {
        mt_linear_forward(&ly->q, a->q, a->ln1, a->xa_q, NULL);
    }
    mt_linear_forward(&ly->kv_a, a->kv_a, a->ln1, a->xa_kva, NULL);
    if (ly->bias[1]) mt_bias_forward(m, A(a->kv_a), A(ly->bias[1]), d.T, d.kva);
    mt_tensor lat = step_work(m, adt, d.T, d.kvr, 0);
    if (run) {
        latent_copy(m, lat.data, A(a->kv_a), &d, 1);
        mt_op_rmsnorm_forward(m, A(a->kv_an), F(a->rstd_kva), lat.data, A(ly->kv_a_norm), d.T, d.kvr, eps);
    }
    step_unwork(m, &lat);
    mt_linear_forward(&ly->kv_b, a->kvb, a->kv_an, a->xa_kvb, NULL);
    mt_prof_pop();
    if (!run) {
        mt_op_attention_count(m, 0, 0, mask, d.B, d.S, d.nh, d.nh, d.qk, d.vd, 0);
        return;
    }
    int il = c->rope_interleave;
    mt_op_rope(m, A(a->q), m->step_positions, d.T, d.nh, d.qk, d.nope, d.rope, il, 0);
    mt_op_rope(m, rope_key(m, a->kv_a, &d), m->step_positions, d.T, 1, d.kva, 0, d.rope, il, 0);
    mt_op_mla_kv_forward(m, A(a->k), A(a->v), A(a->kvb), rope_key(m, a->kv_a, &d), d.kva, d.T, d.nh, d.nope, d.rope,
                         d.vd);
    mt_op_attention_forward(m, A(a->att), F(a->lse), A(a->q), A(a->k), A(a->v), NULL, mask, d.B, d.S, d.nh, d.nh, d.qk,
                            d.vd, (float)mt_config_attn_scale(c), 0);
}

// From datt [T, nh·vd] (the attention output's gradient): every MLA weight's and LoRA's gradient,
// and dln1 (NULL: not wanted) accumulated.
void mt_mla_backward(mt_model *m, int L, const mt_tensor *datt, const mt_tensor *dln1) {
    const mt_model_config *c = &m->cfg;
    mt_layer *ly = &m->layers[L];
    mt_layer_acts *a = layer_acts(m, L);
    mla_dims d = dims_of(m);
    int run = !m->counting, il = c->rope_interleave;
    const uint8_t *mask = m->has_mask ? m->step_mask : NULL;
    mt_dtype adt = act_dtype(m);

    mt_tensor dq = step_work(m, adt, d.T, (int64_t)d.nh * d.qk, 1), dk = step_work(m, adt, d.T, (int64_t)d.nh * d.qk, 1);
    mt_tensor dv = step_work(m, adt, d.T, (int64_t)d.nh * d.vd, 1);
    if (run)
        mt_op_attention_backward(m, dq.data, dk.data, dv.data, NULL, A(datt), A(a->q), A(a->k), A(a->v), A(a->att),
                                 F(a->lse), NULL, mask, d.B, d.S, d.nh, d.nh, d.qk, d.vd,
                                 (float)mt_config_attn_scale(c), 0);
    else mt_op_attention_count(m, 1, 0, mask, d.B, d.S, d.nh, d.nh, d.qk, d.vd, 0);
    // k and v back to kv_b's output and the shared rope key (summed over the heads), both unrotated
    mt_tensor dkvb = step_work(m, adt, d.T, (int64_t)d.nh * (d.nope + d.vd), 1), dkva = step_work(m, adt, d.T, d.kva, 1);
    if (run) {
        mt_op_rope(m, dq.data, m->step_positions, d.T, d.nh, d.qk, d.nope, d.rope, il, 1);
        mt_op_mla_kv_backward(m, dkvb.data, rope_key(m, &dkva, &d), dk.data, dv.data, d.kva, d.T, d.nh, d.nope, d.rope,
                              d.vd);
        mt_op_rope(m, rope_key(m, &dkva, &d), m->step_positions, d.T, 1, d.kva, 0, d.rope, il, 1);
    }
    step_unwork(m, &dk), step_unwork(m, &dv);
    mt_prof_push2("q,k,v GEMMs (dx)", "LoRA q,k,v,o");
    mt_tensor dkvan = step_work(m, adt, d.T, d.kvr, 1);
    mt_linear_backward(&ly->kv_b, &dkvan, &dkvb, a->kv_an, a->xa_kvb, NULL);
    step_unwork(m, &dkvb);
    mt_tensor lat = step_work(m, adt, d.T, d.kvr, 0), dlat = step_work(m, adt, d.T, d.kvr, 1);
    if (run) {  // through the latent's RMSNorm into kv_a's first kvr columns
        latent_copy(m, lat.data, A(a->kv_a), &d, 1);
        mt_op_rmsnorm_backward(m, dlat.data, A(ly->dkv_a_norm), dkvan.data, lat.data, A(ly->kv_a_norm),
                               F(a->rstd_kva), d.T, d.kvr);
        latent_copy(m, dlat.data, dkva.data, &d, 0);
    }
    step_unwork(m, &lat), step_unwork(m, &dlat), step_unwork(m, &dkvan);
    if (ly->bias[1]) mt_bias_backward(m, A(ly->dbias[1]), dkva.data, d.T, d.kva);
    mt_linear_backward(&ly->kv_a, dln1, &dkva, a->ln1, a->xa_kva, NULL);
    step_unwork(m, &dkva);
    if (d.qr) {  // q_b, the query's norm, q_a
        mt_tensor dqan = step_work(m, adt, d.T, d.qr, 1), dqa = step_work(m, adt, d.T, d.qr, 1);
        mt_linear_backward(&ly->q, &dqan, &dq, a->q_an, a->xa_q, NULL);
        if (run)
            mt_op_rmsnorm_backward(m, dqa.data, A(ly->dq_a_norm), dqan.data, A(a->q_a), A(ly->q_a_norm), F(a->rstd_qa),
                                   d.T, d.qr);
        if (ly->bias[0]) mt_bias_backward(m, A(ly->dbias[0]), dqa.data, d.T, d.qr);
        mt_linear_backward(&ly->q_a, dln1, &dqa, a->ln1, a->xa_qa, NULL);
        step_unwork(m, &dqan), step_unwork(m, &dqa);
    } else {
        mt_linear_backward(&ly->q, dln1, &dq, a->ln1, a->xa_q, NULL);
    }
    mt_prof_pop();
    step_unwork(m, &dq);
}
