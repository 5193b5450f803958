// model/acts.c — the activations a step keeps, sized for a batch shape, all through the ledger.
#include <string.h>

#include "core/common.h"
#include "model/mixtral.h"
#include "model/model_internal.h"

static mt_tensor *act(mt_model *m, mt_dtype dt, int64_t d0, int64_t d1) {
    int64_t shape[2] = {d0, d1};
    mt_tensor *t = mt_tensor_new(m->be, MT_MEM_ACT, dt, d1 ? 2 : 1, shape);
    if (!t) mt_fatal(MT_EXIT_OOM, "activations for B=%d S=%d: %s", m->B, m->S, mt_error_get());
    return t;
}

static int has_expert_lora(const mt_linear *ls, int E) {
    for (int e = 0; e < E; e++)
        if (ls[e].lora) return 1;
    return 0;
}

static void layer_acts_alloc(mt_model *m, mt_layer *ly, mt_layer_acts *a) {
    const mt_model_config *c = &m->cfg;
    int64_t T = (int64_t)m->B * m->S, Tk = T * c->top_k, H = c->hidden, f = c->intermediate;
    int64_t qd = c->heads * c->head_dim, kvd = c->kv_heads * c->head_dim, r = m->opts.lora_r;
    a->x = act(m, MT_F32, T, H), a->ln1 = act(m, MT_F32, T, H), a->rstd1 = act(m, MT_F32, T, 0);
    a->q = act(m, MT_F32, T, qd), a->k = act(m, MT_F32, T, kvd), a->v = act(m, MT_F32, T, kvd);
    a->att = act(m, MT_F32, T, qd), a->lse = act(m, MT_F32, T, c->heads);
    a->h = act(m, MT_F32, T, H), a->ln2 = act(m, MT_F32, T, H), a->rstd2 = act(m, MT_F32, T, 0);
    a->logits = act(m, MT_F32, T, c->experts), a->probs = act(m, MT_F32, T, c->experts);
    a->ids = act(m, MT_I32, T, c->top_k), a->weights = act(m, MT_F32, T, c->top_k);
    a->order = act(m, MT_I32, Tk, 0), a->offsets = act(m, MT_I32, c->experts + 1, 0);
    a->xs = act(m, MT_F32, Tk, H), a->g = act(m, MT_F32, Tk, f), a->u = act(m, MT_F32, Tk, f);
    a->a = act(m, MT_F32, Tk, f), a->ys = act(m, MT_F32, Tk, H);
    mt_tensor **xa[] = {&a->xa_q, &a->xa_k, &a->xa_v, &a->xa_o, &a->xa_gate};
    const mt_linear *ls[] = {&ly->q, &ly->k, &ly->v, &ly->o, &ly->gate};
    for (int i = 0; i < 5; i++) *xa[i] = ls[i]->lora ? act(m, MT_F32, T, r) : NULL;
    a->xa_w1 = has_expert_lora(ly->w1, (int)c->experts) ? act(m, MT_F32, Tk, r) : NULL;
    a->xa_w2 = has_expert_lora(ly->w2, (int)c->experts) ? act(m, MT_F32, Tk, r) : NULL;
    a->xa_w3 = has_expert_lora(ly->w3, (int)c->experts) ? act(m, MT_F32, Tk, r) : NULL;
    a->counts = mt_xcalloc((size_t)c->experts, sizeof(int32_t));
}

static void layer_acts_free(mt_layer_acts *a) {
    mt_tensor *all[] = {a->x, a->ln1, a->rstd1, a->q, a->k, a->v, a->att, a->lse, a->h, a->ln2, a->rstd2,
                        a->logits, a->probs, a->ids, a->weights, a->order, a->offsets, a->xs, a->g, a->u,
                        a->a, a->ys, a->xa_q, a->xa_k, a->xa_v, a->xa_o, a->xa_gate, a->xa_w1, a->xa_w3,
                        a->xa_w2};
    for (size_t i = 0; i < MT_ARRAY_LEN(all); i++) mt_tensor_free(all[i]);
    free(a->counts);
    memset(a, 0, sizeof *a);
}

void mt_model_acts_free(mt_model *m) {
    if (m->acts)
        for (int L = 0; L < m->cfg.layers; L++) layer_acts_free(&m->acts[L]);
    free(m->acts);
    mt_tensor_free(m->x_final), mt_tensor_free(m->xf), mt_tensor_free(m->rstdf), mt_tensor_free(m->logits);
    free(m->tokens), free(m->targets), free(m->positions), free(m->row_mask);
    m->acts = NULL;
    m->x_final = m->xf = m->rstdf = m->logits = NULL;
    m->tokens = m->targets = m->positions = NULL;
    m->row_mask = NULL;
    m->B = m->S = 0;
}

void mt_model_acts_ensure(mt_model *m, int B, int S) {
    if (m->acts && m->B == B && m->S == S) return;
    mt_model_acts_free(m);
    m->B = B, m->S = S;
    int64_t T = (int64_t)B * S;
    m->acts = mt_xcalloc((size_t)m->cfg.layers, sizeof(mt_layer_acts));
    for (int L = 0; L < m->cfg.layers; L++) layer_acts_alloc(m, &m->layers[L], &m->acts[L]);
    m->x_final = act(m, MT_F32, T, m->cfg.hidden), m->xf = act(m, MT_F32, T, m->cfg.hidden);
    m->rstdf = act(m, MT_F32, T, 0), m->logits = act(m, MT_F32, T, m->cfg.vocab);
    m->tokens = mt_xcalloc((size_t)T, sizeof(int32_t));
    m->targets = mt_xcalloc((size_t)T, sizeof(int32_t));
    m->row_mask = mt_xcalloc((size_t)T, 1);
    m->positions = mt_xcalloc((size_t)T, sizeof(int32_t));
}

static void layer_free(mt_layer *ly, int E) {
    mt_tensor_free(ly->ln1), mt_tensor_free(ly->ln2), mt_tensor_free(ly->dln1), mt_tensor_free(ly->dln2);
    mt_linear *ls[] = {&ly->q, &ly->k, &ly->v, &ly->o, &ly->gate};
    for (int i = 0; i < 5; i++) mt_linear_free(ls[i]);
    for (int e = 0; ly->w1 && e < E; e++) mt_linear_free(&ly->w1[e]), mt_linear_free(&ly->w2[e]), mt_linear_free(&ly->w3[e]);
    free(ly->w1), free(ly->w2), free(ly->w3);
}

void mt_model_free(mt_model *m) {
    mt_model_acts_free(m);
    for (int L = 0; m->layers && L < m->cfg.layers; L++) layer_free(&m->layers[L], (int)m->cfg.experts);
    free(m->layers);
    mt_tensor_free(m->embed), mt_tensor_free(m->dembed), mt_tensor_free(m->norm), mt_tensor_free(m->dnorm);
    mt_linear_free(&m->lm_head);
    memset(m, 0, sizeof *m);
}
