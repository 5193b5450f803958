// model/acts.c — the activations a step keeps, sized for a batch shape, all through the ledger.
#include <stddef.h>
#include <string.h>

#include "core/common.h"
#include "model/mixtral.h"
#include "model/model_internal.h"
#include "moe/moe_cuda.h"

// dt is a GPU run's storage (bf16, or fp32 where precision needs it); the cpu keeps f32.
static mt_tensor *act(mt_model *m, mt_dtype dt, int64_t d0, int64_t d1) {
    int64_t shape[2] = {d0, d1};
    mt_tensor *t = mt_tensor_new(m->be, MT_MEM_ACT, step_dtype(m, dt), d1 ? 2 : 1, shape);
    if (!t) mt_fatal(MT_EXIT_OOM, "activations for B=%d S=%d: %s", m->B, m->S, mt_error_get());
    return t;
}

// The layer's input, and (a MoE layer) its routing on the device: a dense layer has none. The
// host's per-expert counts exist for every layer (a dense one's stay 0 in the load log).
static void layer_kept_alloc(mt_model *m, int L, mt_layer_kept *kp) {
    const mt_model_config *c = &m->cfg;
    int64_t T = (int64_t)m->B * m->S;
    kp->x = act(m, MT_BF16, T, c->hidden);
    if (!m->layers[L].dense) {
        kp->ids = act(m, MT_I32, T, c->top_k);
        kp->order = act(m, MT_I32, T * c->top_k, 0), kp->offsets = act(m, MT_I32, c->experts + 1, 0);
    }
    kp->counts = mt_xcalloc((size_t)c->experts, sizeof(int32_t));
    kp->host_offsets = mt_xcalloc((size_t)c->experts + 1, sizeof(int32_t));
    if (m->par.ep_size > 1) {
        kp->peer_counts = mt_xcalloc((size_t)(m->par.ep_size * c->experts), sizeof(int64_t));
        kp->own_offsets = mt_xcalloc((size_t)c->experts + 1, sizeof(int64_t));
    }
}

static void layer_kept_free(mt_layer_kept *kp) {
    mt_tensor_free(kp->x), mt_tensor_free(kp->ids), mt_tensor_free(kp->order), mt_tensor_free(kp->offsets);
    free(kp->counts), free(kp->host_offsets), free(kp->peer_counts), free(kp->own_offsets);
    memset(kp, 0, sizeof *kp);
}

// Buffers for the LoRA xa of `set` layers' Linears: present when any of those layers has one.
static int any_lora(const mt_model *m, int L0, int n, size_t off) {
    for (int L = L0; L < L0 + n; L++)
        if (((const mt_linear *)((const char *)&m->layers[L] + off))->lora) return 1;
    return 0;
}

static int any_expert_lora(const mt_model *m, int L0, int n, int which) {
    for (int L = L0; L < L0 + n; L++)
        for (int e = 0; e < m->cfg.experts; e++) {
            const mt_layer *ly = &m->layers[L];
            const mt_linear *l = which == 1 ? &ly->w1[e] : which == 2 ? &ly->w2[e] : &ly->w3[e];
            if (l->lora) return 1;
        }
    return 0;
}

// The two parts of a layer's activation set, as --recompute splits them (model/spec.h): the
// attention part (ln1 to h) and the MLP part (ln2 onwards: router, experts, dense MLP or shared
// expert). A part the backward recomputes is one set shared by every layer (m->shared owns its
// tensors; each layer's mt_layer_acts holds copies of the pointers), a kept part is each layer's own.
enum { PART_ATTN = 1, PART_MLP = 2, PART_ALL = 3 };
#define AF(x) offsetof(mt_layer_acts, x)
static const size_t attn_fields[] = {AF(ln1), AF(rstd1), AF(q), AF(k), AF(v), AF(att), AF(lse), AF(h), AF(v_raw),
                                     AF(q_raw), AF(k_raw), AF(rstd_q), AF(rstd_k), AF(xa_q), AF(xa_k), AF(xa_v),
                                     AF(xa_o), AF(q_a), AF(q_an), AF(rstd_qa), AF(kv_a), AF(kv_an), AF(rstd_kva),
                                     AF(kvb), AF(xa_qa), AF(xa_kva), AF(xa_kvb)};
static const size_t mlp_fields[] = {AF(ln2), AF(rstd2), AF(mlp_g), AF(mlp_u), AF(mlp_gu), AF(mlp_a), AF(mlp_y),
                                    AF(mlp_s), AF(xa_mlp[0]), AF(xa_mlp[1]), AF(xa_mlp[2]), AF(xa_sgate),
                                    AF(logits), AF(probs), AF(weights), AF(ys), AF(xa_gate), AF(xs), AF(g), AF(u),
                                    AF(gu), AF(a), AF(xa_w1), AF(xa_w2), AF(xa_w3)};
#undef AF
#define FIELD(a, off) (*(mt_tensor **)((char *)(a) + (off)))

// MLA's attention part (model/attention_mla.c): q [T, nh·qk], k [T, nh·qk] (the shared rope key
// repeated per head, as the attention reads it), v and the attention output [T, nh·vd]; q_a_proj's
// output and its norm; kv_a's [T, kvr + rope] (its rope part turned in place), the latent's norm
// and kv_b's output.
static void mla_acts_alloc(mt_model *m, int L0, int n, mt_layer_acts *a) {
    const mt_model_config *c = &m->cfg;
    int64_t T = (int64_t)m->B * m->S, H = c->hidden, r = m->spec.lora_r, nh = c->heads;
    int64_t qd = nh * c->head_dim, vd = nh * c->v_head_dim, qr = c->q_lora_rank, kvr = c->kv_lora_rank;
    a->ln1 = act(m, MT_BF16, T, H), a->rstd1 = act(m, MT_F32, T, 0);
    a->q = act(m, MT_BF16, T, qd), a->k = act(m, MT_BF16, T, qd), a->v = act(m, MT_BF16, T, vd);
    a->att = act(m, MT_BF16, T, vd), a->lse = act(m, MT_F32, T, nh);
    a->h = act(m, MT_BF16, T, H);
    if (qr) a->q_a = act(m, MT_BF16, T, qr), a->q_an = act(m, MT_BF16, T, qr), a->rstd_qa = act(m, MT_F32, T, 0);
    a->kv_a = act(m, MT_BF16, T, kvr + c->qk_rope_dim), a->kv_an = act(m, MT_BF16, T, kvr);
    a->rstd_kva = act(m, MT_F32, T, 0);
    a->kvb = act(m, MT_BF16, T, nh * (c->qk_nope_dim + c->v_head_dim));
    mt_tensor **xa[] = {&a->xa_qa, &a->xa_q, &a->xa_kva, &a->xa_kvb, &a->xa_o};
    size_t offs[] = {offsetof(mt_layer, q_a), offsetof(mt_layer, q), offsetof(mt_layer, kv_a), offsetof(mt_layer, kv_b),
                     offsetof(mt_layer, o)};
    for (int i = 0; i < 5; i++) *xa[i] = any_lora(m, L0, n, offs[i]) ? act(m, MT_BF16, T, r) : NULL;
}

// Activations for layers L0 .. L0+n-1 (one layer, or all of them sharing one set), the parts
// `parts` names.
static void layer_acts_alloc(mt_model *m, int L0, int n, mt_layer_acts *a, int parts) {
    const mt_model_config *c = &m->cfg;
    int64_t T = (int64_t)m->B * m->S, Tk = T * c->top_k, H = c->hidden;
    int64_t qd = c->heads * c->head_dim, kvd = c->kv_heads * c->head_dim, r = m->spec.lora_r;
    // fp32 where docs/memory.md "Activations" keeps fp32: rstd, lse, router probs (and the router logits and
    // top-k weights beside them); bf16 for the rest.
    if ((parts & PART_ATTN) && c->mla) mla_acts_alloc(m, L0, n, a);
    if ((parts & PART_ATTN) && !c->mla) {
        a->ln1 = act(m, MT_BF16, T, H), a->rstd1 = act(m, MT_F32, T, 0);
        a->q = act(m, MT_BF16, T, qd), a->k = act(m, MT_BF16, T, kvd), a->v = act(m, MT_BF16, T, kvd);
        a->att = act(m, MT_BF16, T, qd), a->lse = act(m, MT_F32, T, c->heads);
        a->h = act(m, MT_BF16, T, H);
        a->v_raw = c->clip_qkv > 0 ? act(m, MT_BF16, T, kvd) : NULL;
        mt_qk_norm qkn = c->qk_norm;
        if (qkn != MT_QK_NORM_NONE) {  // the projections before the norm, and one rstd per normed row
            int64_t per_q = qkn == MT_QK_NORM_HEAD ? c->heads : 1, per_k = qkn == MT_QK_NORM_HEAD ? c->kv_heads : 1;
            a->q_raw = act(m, MT_BF16, T, qd), a->k_raw = act(m, MT_BF16, T, kvd);
            a->rstd_q = act(m, MT_F32, T * per_q, 0), a->rstd_k = act(m, MT_F32, T * per_k, 0);
        }
        mt_tensor **xa[] = {&a->xa_q, &a->xa_k, &a->xa_v, &a->xa_o};
        size_t offs[] = {offsetof(mt_layer, q), offsetof(mt_layer, k), offsetof(mt_layer, v), offsetof(mt_layer, o)};
        for (int i = 0; i < 4; i++) *xa[i] = any_lora(m, L0, n, offs[i]) ? act(m, MT_BF16, T, r) : NULL;
    }
    if (!(parts & PART_MLP)) return;
    a->ln2 = act(m, MT_BF16, T, H), a->rstd2 = act(m, MT_F32, T, 0);
    int64_t mf = 0;  // the widest MLP (dense layer or shared expert) of these layers
    int shared = 0;
    for (int L = L0; L < L0 + n; L++) mf = MT_MAX(mf, mt_mlp_size(m, L)), shared |= m->layers[L].shared_gate.out != 0;
    if (mf) {
        if (gpu_step(m)) a->mlp_gu = act(m, MT_BF16, T, 2 * mf);  // one buffer for the fused SwiGLU
        else a->mlp_g = act(m, MT_BF16, T, mf), a->mlp_u = act(m, MT_BF16, T, mf);
        a->mlp_a = act(m, MT_BF16, T, mf);
        a->mlp_y = act(m, MT_BF16, T, H);
        a->mlp_s = shared ? act(m, MT_F32, T, 0) : NULL;
        size_t mo[] = {offsetof(mt_layer, mlp[0]), offsetof(mt_layer, mlp[1]), offsetof(mt_layer, mlp[2])};
        for (int i = 0; i < 3; i++) a->xa_mlp[i] = any_lora(m, L0, n, mo[i]) ? act(m, MT_BF16, T, r) : NULL;
        a->xa_sgate = any_lora(m, L0, n, offsetof(mt_layer, shared_gate)) ? act(m, MT_BF16, T, r) : NULL;
    }
    int moe = 0;  // the router's and experts' buffers: only where a layer of the set has them
    for (int L = L0; L < L0 + n; L++) moe |= !m->layers[L].dense;
    if (moe) {
        a->logits = act(m, MT_F32, T, c->experts), a->probs = act(m, MT_F32, T, c->experts);
        a->weights = act(m, MT_F32, T, c->top_k);
        a->ys = act(m, MT_BF16, Tk, H);
    }
    a->xa_gate = any_lora(m, L0, n, offsetof(mt_layer, gate)) ? act(m, MT_BF16, T, r) : NULL;
    a->expert_lora[0] = any_expert_lora(m, L0, n, 1);
    a->expert_lora[1] = any_expert_lora(m, L0, n, 2);
    a->expert_lora[2] = any_expert_lora(m, L0, n, 3);
    // One rank: T·k rows, whatever the routing. EP: sized by the first routing (balanced when
    // counting), regrown when a later one sends this rank's experts more.
    mt_model_expert_acts_ensure(m, a, m->par.ep_size > 1 || !moe ? 0 : Tk);
}

static void expert_acts_free(mt_layer_acts *a) {
    mt_tensor *all[] = {a->xs, a->g, a->u, a->gu, a->a, a->xa_w1, a->xa_w2, a->xa_w3};
    for (size_t i = 0; i < MT_ARRAY_LEN(all); i++) mt_tensor_free(all[i]);
    a->xs = a->g = a->u = a->gu = a->a = a->xa_w1 = a->xa_w2 = a->xa_w3 = NULL;
    a->expert_rows = 0;
}

// The shared set's part `parts` into every layer's set (pointers: the shared set owns them).
static void share_parts(mt_model *m, int parts) {
    for (int L = 0; m->acts && L < m->cfg.layers; L++) {
        mt_layer_acts *a = &m->acts[L];
        for (size_t i = 0; (parts & PART_ATTN) && i < MT_ARRAY_LEN(attn_fields); i++)
            FIELD(a, attn_fields[i]) = FIELD(&m->shared, attn_fields[i]);
        if (!(parts & PART_MLP)) continue;
        for (size_t i = 0; i < MT_ARRAY_LEN(mlp_fields); i++) FIELD(a, mlp_fields[i]) = FIELD(&m->shared, mlp_fields[i]);
        a->expert_rows = m->shared.expert_rows;
        memcpy(a->expert_lora, m->shared.expert_lora, sizeof a->expert_lora);
    }
}

static void expert_bufs_ensure(mt_model *m, mt_layer_acts *a, int64_t rows) {
    if (a->xs && rows <= a->expert_rows) return;
    expert_acts_free(a);
    int64_t H = m->cfg.hidden, f = m->cfg.intermediate, r = m->spec.lora_r;
    a->expert_rows = rows;
    if (rows == 0) return;
    // w1's and w3's LoRA xa live beside x in xs's rows when they fold, w2's beside the SwiGLU
    // output in a's (model/experts_gpu.c).
    int64_t beside = mt_experts_xs_extra(m), beside2 = mt_experts_a_extra(m);
    a->xs = act(m, MT_BF16, rows, H + beside), a->a = act(m, MT_BF16, rows, f + beside2);
    if (gpu_step(m)) a->gu = act(m, MT_BF16, rows, 2 * f);
    else a->g = act(m, MT_BF16, rows, f), a->u = act(m, MT_BF16, rows, f);
    a->xa_w1 = a->expert_lora[0] && !beside ? act(m, MT_BF16, rows, r) : NULL;
    a->xa_w2 = a->expert_lora[1] && !beside2 ? act(m, MT_BF16, rows, r) : NULL;
    a->xa_w3 = a->expert_lora[2] && !beside ? act(m, MT_BF16, rows, r) : NULL;
}

// A recomputed MLP part is the shared set's: regrown there, every layer then pointing at it.
void mt_model_expert_acts_ensure(mt_model *m, mt_layer_acts *a, int64_t rows) {
    if (!m->recompute_mlp || a == &m->shared) {
        expert_bufs_ensure(m, a, rows);
        return;
    }
    expert_bufs_ensure(m, &m->shared, rows);
    share_parts(m, PART_MLP);
}

// Frees the tensors of `parts` that `a` owns, and forgets every pointer.
static void layer_acts_free(mt_layer_acts *a, int parts) {
    for (size_t i = 0; (parts & PART_ATTN) && i < MT_ARRAY_LEN(attn_fields); i++)
        mt_tensor_free(FIELD(a, attn_fields[i]));
    for (size_t i = 0; (parts & PART_MLP) && i < MT_ARRAY_LEN(mlp_fields); i++) mt_tensor_free(FIELD(a, mlp_fields[i]));
    memset(a, 0, sizeof *a);
}

static int shared_parts(const mt_model *m) { return (m->recompute_attn ? PART_ATTN : 0) | (m->recompute_mlp ? PART_MLP : 0); }

void mt_model_acts_free(mt_model *m) {
    m->xs_extra_known = m->a_extra_known = 0;  // xs's and a's room are decided again with the next activations
    int shared = shared_parts(m);
    for (int i = 0; m->acts && i < m->cfg.layers; i++) layer_acts_free(&m->acts[i], PART_ALL & ~shared);
    if (m->acts) layer_acts_free(&m->shared, shared);
    for (int L = 0; m->kept && L < m->cfg.layers; L++) layer_kept_free(&m->kept[L]);
    free(m->acts), free(m->kept);
    mt_tensor_free(m->x_final), mt_tensor_free(m->xf), mt_tensor_free(m->rstdf), mt_tensor_free(m->dxf_early);
    m->dxf_early = NULL;
    mt_tensor_free(m->batch_dev), mt_tensor_free(m->aux_dev);
    m->batch_dev = m->aux_dev = NULL;
    free(m->tokens), free(m->targets), free(m->positions), free(m->row_mask);
    m->acts = NULL;
    m->kept = NULL;
    m->x_final = m->xf = m->rstdf = NULL;
    m->tokens = m->targets = m->positions = NULL;
    m->row_mask = NULL;
    m->B = m->S = 0;
}

void mt_model_acts_ensure(mt_model *m, int B, int S) {
    if (m->acts && m->B == B && m->S == S) return;
    mt_model_acts_free(m);
    m->B = B, m->S = S;
    int64_t T = (int64_t)B * S;
    int L = (int)m->cfg.layers, shared = shared_parts(m);
    m->kept = mt_xcalloc((size_t)L, sizeof(mt_layer_kept));
    for (int i = 0; i < L; i++) layer_kept_alloc(m, i, &m->kept[i]);
    if (shared) layer_acts_alloc(m, 0, L, &m->shared, shared);  // the recomputed part: one set, the widest
    m->acts = mt_xcalloc((size_t)L, sizeof(mt_layer_acts));
    for (int i = 0; i < L; i++) layer_acts_alloc(m, i, 1, &m->acts[i], PART_ALL & ~shared);
    share_parts(m, shared);
    // No logits: the loss computes them a chunk at a time from xf (model/loss.c).
    m->x_final = act(m, MT_BF16, T, m->cfg.hidden), m->xf = act(m, MT_BF16, T, m->cfg.hidden);
    m->rstdf = act(m, MT_F32, T, 0);
    m->tokens = mt_xcalloc((size_t)T, sizeof(int32_t));
    m->targets = mt_xcalloc((size_t)T, sizeof(int32_t));
    m->positions = mt_xcalloc((size_t)T, sizeof(int32_t));
    m->row_mask = mt_xcalloc((size_t)T, 1);
    m->step_tokens = m->tokens, m->step_targets = m->targets, m->step_positions = m->positions;
    m->step_mask = m->row_mask;
    if (gpu_step(m)) {  // the kernels read device copies (the null backend counts them)
        m->batch_dev = act(m, MT_U8, T * (3 * (int64_t)sizeof(int32_t) + 1), 0);
        m->aux_dev = act(m, MT_U8, MT_AUX_STATS_LEN(m->cfg.experts) * (int64_t)sizeof(double), 0);  // doubles
    }
    if (m->be->ops->kind == MT_BACKEND_CUDA) {
        int32_t *d = m->batch_dev->data;
        m->step_tokens = d, m->step_targets = d + T, m->step_positions = d + 2 * T;
        m->step_mask = (uint8_t *)(d + 3 * T);
    }
}

static void layer_free(mt_layer *ly, int E) {
    mt_tensor_free(ly->ln1), mt_tensor_free(ly->ln2), mt_tensor_free(ly->dln1), mt_tensor_free(ly->dln2);
    mt_tensor_free(ly->qn), mt_tensor_free(ly->kn), mt_tensor_free(ly->dqn), mt_tensor_free(ly->dkn);
    for (int i = 0; i < 4; i++) mt_tensor_free(ly->bias[i]), mt_tensor_free(ly->dbias[i]);
    for (int i = 0; i < 3; i++) mt_tensor_free(ly->ebias[i]), mt_tensor_free(ly->debias[i]);
    mt_tensor_free(ly->sinks), mt_tensor_free(ly->dsinks), mt_tensor_free(ly->gate_bias), mt_tensor_free(ly->dgate_bias);
    mt_tensor_free(ly->q_a_norm), mt_tensor_free(ly->kv_a_norm), mt_tensor_free(ly->dq_a_norm);
    mt_tensor_free(ly->dkv_a_norm), mt_tensor_free(ly->score_bias);
    mt_linear *ls[] = {&ly->q, &ly->k, &ly->v, &ly->o, &ly->gate, &ly->mlp[0], &ly->mlp[1], &ly->mlp[2], &ly->shared_gate,
                       &ly->q_a, &ly->kv_a, &ly->kv_b};
    for (size_t i = 0; i < MT_ARRAY_LEN(ls); i++) mt_linear_free(ls[i]);
    for (int e = 0; ly->w1 && e < E; e++) mt_linear_free(&ly->w1[e]), mt_linear_free(&ly->w2[e]), mt_linear_free(&ly->w3[e]);
    free(ly->w1), free(ly->w2), free(ly->w3);
    for (int i = 0; i < 2; i++) {
        for (int e = 0; ly->experts_bf16[i] && e < E; e++) mt_tensor_free(ly->experts_bf16[i][e]);
        free(ly->experts_bf16[i]);
    }
}

void mt_model_free(mt_model *m) {
    mt_model_acts_free(m);
    for (int L = 0; m->layers && L < m->cfg.layers; L++) layer_free(&m->layers[L], (int)m->cfg.experts);
    free(m->layers), free(m->owner);
    mt_tensor_free(m->dequant), mt_tensor_free(m->rope_inv_freq_dev), mt_tensor_free(m->bias_load_t);
    free(m->rope_inv_freq);
    mt_tensor_free(m->embed), mt_tensor_free(m->dembed), mt_tensor_free(m->norm), mt_tensor_free(m->dnorm);
    mt_linear_free(&m->lm_head);
    memset(m, 0, sizeof *m);
}
