// model/forward.c — one micro-batch through the model, keeping what backward needs.
#include <string.h>

#include "core/common.h"
#include "core/profile.h"
#include "model/model_internal.h"
#include "model/ops.h"
#include "moe/moe.h"

// Balanced routing of this rank's T·k rows: T·k/E each, the first (T·k mod E) one more.
static void balanced_rows(const mt_model *m, int e, int64_t *row0, int64_t *rows) {
    int64_t Tk = (int64_t)m->B * m->S * m->cfg.top_k, E = m->cfg.experts, base = Tk / E, extra = Tk % E;
    *row0 = e * base + MT_MIN((int64_t)e, extra);
    *rows = base + (e < extra);
}

void mt_expert_rows(const mt_model *m, int L, int e, int64_t *row0, int64_t *rows) {
    if (m->par.ep_size > 1) {
        const int64_t *off = m->kept[L].own_offsets;
        *row0 = off[e], *rows = off[e + 1] - off[e];
    } else if (!m->counting) {
        if (m->kept[L].offsets_pending)
            mt_fatal(MT_EXIT_ERROR, "layer %d: expert rows read before the offsets' download was collected", L);
        if (m->kept[L].rows_on_device)  // the host copy comes only with the loss statistics
            mt_fatal(MT_EXIT_ERROR, "layer %d: expert rows read on the host, but they stay on the device", L);
        const int32_t *off = m->kept[L].host_offsets;
        *row0 = off[e], *rows = off[e + 1] - off[e];
    } else {
        balanced_rows(m, e, row0, rows);
    }
}

// Counting: the tokens per expert that balanced routing gives (for the load log and EP).
static void balanced_counts(mt_model *m, int L) {
    for (int e = 0; e < m->cfg.experts; e++) {
        int64_t r0, n;
        balanced_rows(m, e, &r0, &n);
        m->kept[L].counts[e] = (int32_t)n;
    }
}

// The weights of the choices in kept[L].ids from fresh scores (the router's top-k is recomputed
// but not used).
static void weights_of_kept_choices(mt_model *m, int L) {
    const mt_model_config *c = &m->cfg;
    mt_layer_kept *kp = &m->kept[L];
    mt_layer_acts *a = layer_acts(m, L);
    int T = m->B * m->S, E = (int)c->experts, k = (int)c->top_k;
    const float *score_bias = m->layers[L].score_bias ? F(m->layers[L].score_bias) : NULL;
    size_t ids_bytes = (size_t)T * k * sizeof(int32_t);
    int32_t *fresh = mt_work_alloc(m->be, ids_bytes);
    if (!m->counting && grouped_router(m)) {
        mt_op_router_grouped_forward(m, fresh, F(a->weights), F(a->probs), F(a->logits), score_bias, T, E, k,
                                     route_rule(m));
        mt_op_router_grouped_weights_of_choices(m, F(a->weights), F(a->probs), I(kp->ids), T, E, k, route_rule(m));
    } else if (!m->counting) {
        mt_op_router_forward(m, fresh, F(a->weights), F(a->probs), F(a->logits), T, E, k);
        mt_op_weights_of_choices(m, F(a->weights), F(a->probs), I(kp->ids), T, E, k);
    }
    mt_work_free(m->be, fresh, ids_bytes);
}

// Routing of layer L: top-k (or the choices given, m->routing_given), aux statistics and the
// expert order, or (replay) the recorded choices' weights recomputed from fresh scores.
static void route(mt_model *m, int L, int replay) {
    const mt_model_config *c = &m->cfg;
    mt_layer_kept *kp = &m->kept[L];
    mt_layer_acts *a = layer_acts(m, L);
    int T = m->B * m->S, E = (int)c->experts, k = (int)c->top_k;
    const uint8_t *mask = m->has_mask ? m->step_mask : NULL;
    const float *score_bias = m->layers[L].score_bias ? F(m->layers[L].score_bias) : NULL;
    if (replay) {
        weights_of_kept_choices(m, L);
        return;
    }
    if (m->counting) {
        balanced_counts(m, L);
        return;
    }
    if (m->routing_given && m->routing_given[L]) {
        mt_tensor_upload(kp->ids, m->routing_given[L]);
        weights_of_kept_choices(m, L);
    } else if (grouped_router(m))
        mt_op_router_grouped_forward(m, I(kp->ids), F(a->weights), F(a->probs), F(a->logits), score_bias, T, E, k,
                                     route_rule(m));
    else mt_op_router_forward(m, I(kp->ids), F(a->weights), F(a->probs), F(a->logits), T, E, k);
    if (m->bias_load) mt_op_router_load_accumulate(m, m->bias_load + (size_t)L * E, I(kp->ids), mask, T, E, k);
    mt_op_aux_accumulate(m, F(a->probs), I(kp->ids), mask, T);
    if (m->z_coef != 0.0f) mt_op_zloss_accumulate(m, F(a->logits), mask, T, E);
    if (m->seq_aux_coef != 0.0f) mt_op_router_seq_aux_accumulate(m, F(a->probs), I(kp->ids), mask, m->B, m->S, E, k);
    mt_op_permute(m, L);
}

// q, k, v from ln1, their biases, q/k norms and clamps, RoPE, and the attention into a->att.
static void attention_core(mt_model *m, int L) {
    const mt_model_config *c = &m->cfg;
    mt_layer *ly = &m->layers[L];
    mt_layer_acts *a = layer_acts(m, L);
    int B = m->B, S = m->S, T = B * S;
    int nh = (int)c->heads, nkv = (int)c->kv_heads, hd = (int)c->head_dim, run = !m->counting;
    const uint8_t *mask = m->has_mask ? m->step_mask : NULL;
    float eps = (float)c->rms_norm_eps;
    mt_dtype adt = act_dtype(m);
    int rot = (int)mt_config_rotary_dim(c);  // GLM-4.5 turns the first rot dims of each head
    mt_tensor *qo = a->q_raw ? a->q_raw : a->q, *ko = a->k_raw ? a->k_raw : a->k, *vo = a->v_raw ? a->v_raw : a->v;
    mt_prof_push2("q,k,v GEMMs", "LoRA q,k,v,o");
    mt_linear_forward(&ly->q, qo, a->ln1, a->xa_q, NULL);
    mt_linear_forward(&ly->k, ko, a->ln1, a->xa_k, NULL);
    mt_linear_forward(&ly->v, vo, a->ln1, a->xa_v, NULL);
    mt_prof_pop();
    mt_tensor *qkv[3] = {qo, ko, vo};
    for (int i = 0; i < 3; i++)
        if (ly->bias[i]) mt_bias_forward(m, A(qkv[i]), A(ly->bias[i]), T, qkv[i]->shape[1]);
    if (run && a->q_raw) {  // q/k RMSNorm before RoPE (docs/families.md): rows of a head or of the projection
        int ph = c->qk_norm == MT_QK_NORM_HEAD;
        mt_op_rmsnorm_forward(m, A(a->q), F(a->rstd_q), A(a->q_raw), A(ly->qn), ph ? T * nh : T, ph ? hd : nh * hd, eps);
        mt_op_rmsnorm_forward(m, A(a->k), F(a->rstd_k), A(a->k_raw), A(ly->kn), ph ? T * nkv : T, ph ? hd : nkv * hd,
                              eps);
    }
    if (c->clip_qkv > 0) {  // OLMoE: q, k (after their norm) and v clamped, before RoPE
        float cl = (float)c->clip_qkv;
        mt_clip_forward(m, A(a->q), (int64_t)T * nh * hd, cl);
        mt_clip_forward(m, A(a->k), (int64_t)T * nkv * hd, cl);
        if (run) m->be->ops->copy(m->be, A(a->v), A(a->v_raw), mt_dtype_bytes(adt, (size_t)T * nkv * hd));
        mt_clip_forward(m, A(a->v), (int64_t)T * nkv * hd, cl);
    }
    if (run) {
        mt_op_rope(m, A(a->q), m->step_positions, T, nh, hd, 0, rot, 0, 0);
        mt_op_rope(m, A(a->k), m->step_positions, T, nkv, hd, 0, rot, 0, 0);
        mt_op_attention_forward(m, A(a->att), F(a->lse), A(a->q), A(a->k), A(a->v), ly->sinks ? A(ly->sinks) : NULL,
                                mask, B, S, nh, nkv, hd, hd, (float)mt_config_attn_scale(c),
                                (int)mt_config_layer_window(c, L));
    } else {
        mt_op_attention_count(m, 0, ly->sinks != NULL, mask, B, S, nh, nkv, hd, hd, (int)mt_config_layer_window(c, L));
    }
}

// The attention part of layer L: its input kept[L].x -> h = x + o(attention(...)), keeping
// ln1, q, k, v, the attention output and lse (and the family's extras) for the backward.
static void attention_forward(mt_model *m, int L) {
    const mt_model_config *c = &m->cfg;
    mt_layer *ly = &m->layers[L];
    mt_layer_kept *kp = &m->kept[L];
    mt_layer_acts *a = layer_acts(m, L);
    int T = m->B * m->S, H = (int)c->hidden, run = !m->counting;
    float eps = (float)c->rms_norm_eps;
    mt_dtype adt = act_dtype(m);

    if (run) mt_op_rmsnorm_forward(m, A(a->ln1), F(a->rstd1), A(kp->x), A(ly->ln1), T, H, eps);
    if (c->mla) mt_mla_forward(m, L);
    else attention_core(m, L);
    mt_tensor o = step_work(m, adt, T, H, 0);
    mt_prof_push2("o GEMM", "LoRA q,k,v,o");
    mt_linear_forward(&ly->o, &o, a->att, a->xa_o, NULL);
    mt_prof_pop();
    if (ly->bias[3]) mt_bias_forward(m, o.data, A(ly->bias[3]), T, H);
    if (run) mt_op_add(m, A(a->h), A(kp->x), o.data, (int64_t)T * H);
    step_unwork(m, &o);
}

// Layer L's input kept[L].x -> x_out [T, H] (pre-norm attention, then the sparse MoE). With
// `replay` the layer is being recomputed for backward: the routing recorded by the first
// forward is reused, never recomputed, so a recomputed layer cannot pick different experts; and
// the aux statistics are not counted twice. Counting (null backend), the same buffers are
// allocated and no kernel runs.
static void layer_forward(mt_model *m, int L, mt_act *x_out, int replay) {
    const mt_model_config *c = &m->cfg;
    mt_layer *ly = &m->layers[L];
    mt_layer_kept *kp = &m->kept[L];
    mt_layer_acts *a = layer_acts(m, L);
    int T = m->B * m->S, H = (int)c->hidden, k = (int)c->top_k;
    int Tk = T * k, run = !m->counting;
    float eps = (float)c->rms_norm_eps;
    mt_dtype adt = act_dtype(m);
    // A replay recomputes only the parts --recompute shares; the rest the layer still holds.
    if (!replay || m->recompute_attn) attention_forward(m, L);
    if (replay && !m->recompute_mlp) return;

    if (run) mt_op_rmsnorm_forward(m, A(a->ln2), F(a->rstd2), A(a->h), A(ly->ln2), T, H, eps);
    if (ly->dense) {  // no router, no experts
        if (ly->mlp[0].out) mt_mlp_forward(m, L);
        if (!x_out || !run) return;
        m->be->ops->copy(m->be, x_out, A(a->h), mt_dtype_bytes(adt, (size_t)T * H));
        mt_mlp_add_output(m, L, x_out);
        return;
    }
    mt_prof_push2("router GEMM + top-k", "LoRA gate");
    mt_linear_forward(&ly->gate, a->logits, a->ln2, a->xa_gate, NULL);
    if (ly->gate_bias) mt_op_logit_bias_forward(m, F(a->logits), A(ly->gate_bias), T, (int)c->experts);
    mt_prof_pop();
    route(m, L, replay);
    // What needs no expert counts goes to the device before the host waits for them (the
    // routing began their download): the shared expert, and without EP the gather.
    if (ly->mlp[0].out) mt_mlp_forward(m, L);  // the shared expert
    int ep = m->par.ep_size > 1;
    if (!ep && run) mt_op_gather(m, A(a->xs), a->xs->shape[1], A(a->ln2), I(kp->order), Tk, H, k);
    mt_op_permute_wait(m, L);
    // The experts' input rows: gathered in expert order above, or (EP) sent to their owners.
    int64_t R = Tk;
    if (ep) {
        if (!replay) mt_ep_exchange_counts(m, L);
        R = mt_ep_own_rows(m, L);
        mt_model_expert_acts_ensure(m, a, R);
        mt_tensor xl = step_work(m, adt, Tk, H, 0);
        if (run) mt_op_gather(m, xl.data, H, A(a->ln2), I(kp->order), Tk, H, k);
        // xs: room beside x when B folds; none at all when no rows come to this rank's experts
        mt_ep_dispatch(m, L, A(a->xs), a->xs ? a->xs->shape[1] : H, xl.data, H, H);
        step_unwork(m, &xl);
    }
    if (replay && mt_experts_recompute_in_backward(m)) return;  // the backward recomputes them
    mt_tensor ys_own = ep ? step_work(m, adt, R, H, 0) : *a->ys;
    mt_experts_forward(m, L, &ys_own, R);
    if (ep) {  // the outputs go back to the ranks their tokens came from
        mt_ep_return(m, L, A(a->ys), H, ys_own.data, H, H);
        step_unwork(m, &ys_own);
    }
    if (!x_out || !run) return;  // recomputation for backward needs no layer output
    // The second residual: h copied, then combine accumulates the experts onto it (its adds
    // are combine's FLOPs): this row counts the copy's bytes and no FLOP.
    mt_prof_push("residual adds");
    mt_prof_count(0, 2.0 * (double)mt_dtype_bytes(adt, (size_t)T * H));
    m->be->ops->copy(m->be, x_out, A(a->h), mt_dtype_bytes(adt, (size_t)T * H));
    mt_prof_pop();
    mt_op_combine(m, x_out, A(a->ys), F(a->weights), I(kp->order), Tk, H, k);
    if (ly->mlp[0].out) mt_mlp_add_output(m, L, x_out);  // + sigmoid(shared_gate(x)) · shared_expert(x)
}

void mt_layer_forward(mt_model *m, int L, mt_act *x_out, int replay) {
    char phase = mt_prof_set_phase(replay ? MT_PROF_RECOMPUTE : MT_PROF_FWD);  // the profile's phase
    layer_forward(m, L, x_out, replay);
    mt_prof_set_phase(phase);
}

// Several ranks with a slice of the batch each: the loss's sums (CE, the aux statistics of every
// layer, the z-loss) become the whole batch's, so every rank's loss is the global one and its
// backward gives its own tokens' part of the global gradient. Fixed rank order: the same bits
// on every rank.
static void sum_over_ranks(mt_model *m, double *ce_sum, int64_t *count) {
    int E = (int)m->cfg.experts;
    size_t n = 6 + 2 * (size_t)E + 1;
    double *v = mt_xcalloc(n, sizeof(double));
    v[0] = *ce_sum, v[1] = (double)*count, v[2] = m->z_sum, v[3] = (double)m->z_rows;
    v[4] = m->seq_aux[0], v[5] = m->seq_aux[1];
    memcpy(v + 6, m->aux.counts, (size_t)E * sizeof(double));
    memcpy(v + 6 + E, m->aux.prob_sums, (size_t)E * sizeof(double));
    v[6 + 2 * E] = (double)m->aux.rows;
    mt_comm_host_all_reduce(m->par.data, v, n, MT_COMM_F64, MT_COMM_SUM, MT_COMM_EXACT);
    *ce_sum = v[0], *count = (int64_t)v[1], m->z_sum = v[2], m->z_rows = (int64_t)v[3];
    m->seq_aux[0] = v[4], m->seq_aux[1] = v[5];
    memcpy(m->aux.counts, v + 6, (size_t)E * sizeof(double));
    memcpy(m->aux.prob_sums, v + 6 + E, (size_t)E * sizeof(double));
    m->aux.rows = (int64_t)v[6 + 2 * E];
    free(v);
    mt_op_aux_upload(m);  // the backward of the aux loss reads the device copy on cuda
}

static int check_batch(const mt_model *m, const mt_batch *b) {
    if (b->B < 1 || b->S < 1) {
        mt_error_set("batch shape B=%d S=%d is empty", b->B, b->S);
        return -1;
    }
    for (int i = 0; i < b->B * b->S; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= m->cfg.vocab) {
            mt_error_set("token id %d at sequence %d position %d is outside the vocabulary (0..%lld)",
                         b->tokens[i], i / b->S, i % b->S, (long long)m->cfg.vocab - 1);
            return -1;
        }
        if (b->labels[i] != -100 && (b->labels[i] < 0 || b->labels[i] >= m->cfg.vocab)) {
            mt_error_set("label %d at sequence %d position %d is neither -100 nor a token id",
                         b->labels[i], i / b->S, i % b->S);
            return -1;
        }
    }
    return 0;
}

static int forward(mt_model *m, const mt_batch *b, mt_loss *out, int train) {
    if (check_batch(m, b) != 0) return -1;
    const mt_model_config *c = &m->cfg;
    mt_model_acts_ensure(m, b->B, b->S);
    int T = b->B * b->S, H = (int)c->hidden;
    m->has_mask = 0;
    for (int t = 0; t < T; t++) {
        int s = t % b->S;
        m->tokens[t] = b->tokens[t];
        m->positions[t] = s;  // as transformers without position_ids: 0..S-1 whatever the padding
        m->row_mask[t] = b->mask ? b->mask[t] != 0 : 1;
        // Predict the next token, but never from a padded position: its output means nothing.
        m->targets[t] = s + 1 < b->S && m->row_mask[t] ? b->labels[t + 1] : -100;
        m->has_mask |= !m->row_mask[t];
    }
    m->pad_right = 1;
    for (int t = 0; t < T; t++) {
        int s = t % b->S;
        if (s == 0 ? !m->row_mask[t] : m->row_mask[t] && !m->row_mask[t - 1]) m->pad_right = 0;
    }
    if (m->batch_dev) {  // one upload of the batch: tokens, targets, positions, mask
        size_t n = (size_t)T * sizeof(int32_t);
        m->be->ops->upload(m->be, m->step_tokens, m->tokens, n);
        m->be->ops->upload(m->be, m->step_targets, m->targets, n);
        m->be->ops->upload(m->be, m->step_positions, m->positions, n);
        m->be->ops->upload(m->be, m->step_mask, m->row_mask, (size_t)T);
    }
    m->z_sum = 0, m->z_rows = 0, m->seq_aux[0] = m->seq_aux[1] = 0;
    mt_op_aux_start(m);
    int run = !m->counting;
    if (run) mt_op_embedding_forward(m, A(m->kept[0].x), m->step_tokens, A(m->embed), T, H);
    for (int L = 0; L < c->layers; L++)
        mt_layer_forward(m, L, L + 1 < c->layers ? A(m->kept[L + 1].x) : A(m->x_final), 0);
    if (run) mt_op_rmsnorm_forward(m, A(m->xf), F(m->rstdf), A(m->x_final), A(m->norm), T, H, (float)c->rms_norm_eps);
    int64_t count = 0;  // counting: no loss, and no token counted
    double ce_sum = mt_model_loss_forward(m, &count, train);
    if (run) mt_op_aux_finish(m);
    if (m->par.data) sum_over_ranks(m, &ce_sum, &count);
    m->ce_count = count;
    out->tokens = count;
    out->ce = count ? ce_sum / (double)count : 0.0;
    out->aux = moe_aux_loss(&m->aux);
    out->z = m->z_rows ? m->z_sum / (double)m->z_rows : 0.0;
    out->seq_aux = m->seq_aux[1] > 0 ? m->seq_aux[0] / mt_model_seq_aux_seqs(m) : 0.0;
    out->loss = out->ce + m->aux_coef * out->aux + m->z_coef * out->z + m->seq_aux_coef * out->seq_aux;
    return 0;  // a non-finite loss is the trainer's to skip and report
}

int mt_model_forward(mt_model *m, const mt_batch *b, mt_loss *out) { return forward(m, b, out, 0); }
int mt_model_forward_train(mt_model *m, const mt_batch *b, mt_loss *out) { return forward(m, b, out, 1); }
