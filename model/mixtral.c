// model/mixtral.c — building a Mixtral-family model from a checkpoint for one training mode.
#include "model/mixtral.h"

#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "quant/qweight.h"

// f32 copy of a checkpoint tensor, checked against the expected shape.
static float *read_f32(const mt_st_model *st, const char *name, int ndim, const int64_t *shape) {
    const mt_st_tensor *t = mt_st_model_find(st, name);
    if (!t) {
        mt_error_set("tensor '%s' is missing from the checkpoint", name);
        return NULL;
    }
    int ok = t->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++) ok = t->shape[d] == shape[d];
    if (!ok) {
        mt_error_set("tensor '%s' has shape [%lld%s] where the config implies [%lld%s]", name,
                     (long long)t->shape[0], t->ndim > 1 ? ", ..." : "", (long long)shape[0],
                     ndim > 1 ? ", ..." : "");
        return NULL;
    }
    mt_dtype dt;
    if (strcmp(t->dtype, "F32") == 0) dt = MT_F32;
    else if (strcmp(t->dtype, "BF16") == 0) dt = MT_BF16;
    else if (strcmp(t->dtype, "F16") == 0) dt = MT_F16;
    else {
        mt_error_set("tensor '%s' has dtype %s (expected F32, BF16 or F16)", name, t->dtype);
        return NULL;
    }
    size_t n = 1;
    for (int d = 0; d < ndim; d++) n *= (size_t)shape[d];
    float *out = mt_xmalloc(n * sizeof(float));
    mt_convert(out, MT_F32, t->data, dt, n);
    return out;
}

// A dense f32 tensor on the backend from host data, under `cat`.
static mt_tensor *upload(mt_backend *be, mt_mem_cat cat, const float *host, int ndim, const int64_t *shape) {
    mt_tensor *t = mt_tensor_new(be, cat, MT_F32, ndim, shape);
    if (t) mt_tensor_upload(t, host);
    return t;
}

static mt_tensor *zeros(mt_backend *be, mt_mem_cat cat, int ndim, const int64_t *shape) {
    mt_tensor *t = mt_tensor_new(be, cat, MT_F32, ndim, shape);
    if (t) be->ops->fill_zero(be, t->data, t->nbytes);
    return t;
}

typedef struct {
    mt_backend *be;
    const mt_st_model *st;
    const mt_run_opts *o;
} loader;

typedef enum { FROZEN_DENSE, FROZEN_QUANT, TRAINABLE } weight_role;

// Loads one Linear `name` ("<module>.weight") in its role, with a LoRA when `lora` is set.
static int load_linear(loader *ld, mt_linear *l, const char *module, int64_t out, int64_t in,
                       weight_role role, int lora) {
    char name[256];
    snprintf(name, sizeof name, "%s.weight", module);
    int64_t shape[2] = {out, in};
    l->out = out, l->in = in;
    float *host = read_f32(ld->st, name, 2, shape);
    if (!host) return -1;
    int rc = 0;
    if (role == FROZEN_QUANT) {
        l->q = mt_xcalloc(1, sizeof *l->q);
        rc = mt_qweight_quantize(l->q, ld->be, name, host, out, in, ld->o->quant, ld->o->quant_blocksize,
                                 ld->o->double_quant);
    } else {
        l->w = upload(ld->be, role == TRAINABLE ? MT_MEM_TRAIN : MT_MEM_BASE, host, 2, shape);
        if (!l->w || (role == TRAINABLE && !(l->dw = zeros(ld->be, MT_MEM_GRAD, 2, shape)))) rc = -1;
    }
    free(host);
    if (rc == 0 && lora) {
        l->lora = mt_xcalloc(1, sizeof *l->lora);
        double alpha = ld->o->lora_alpha == ld->o->lora_alpha ? ld->o->lora_alpha : ld->o->lora_r;  // NaN: r
        rc = mt_lora_init(l->lora, ld->be, in, out, ld->o->lora_r, alpha, ld->o->use_rslora,
                          ld->o->lora_dropout, ld->o->seed, mt_hash_string(module));
    }
    if (rc) mt_error_prefix("loading %s", module);
    return rc;
}

// The role of a frozen-or-trainable Linear: trainable, else 4-bit when --quant says so.
static weight_role role_of(const mt_run_opts *o, int trainable) {
    if (trainable) return TRAINABLE;
    return o->quant == MT_QUANT_NONE ? FROZEN_DENSE : FROZEN_QUANT;
}

static int load_layer(loader *ld, const mt_model_config *c, int L, mt_layer *ly) {
    const mt_run_opts *o = ld->o;
    int in_layers = mt_index_set_contains(&o->layers, L), full = o->mode == MT_MODE_FULL;
    int lora = o->mode == MT_MODE_LORA && in_layers;
    char p[160], m[256];
    snprintf(p, sizeof p, "model.layers.%d", L);
    int64_t h = c->hidden, qd = c->heads * c->head_dim, kvd = c->kv_heads * c->head_dim;
    int64_t hs[1] = {h};
    snprintf(m, sizeof m, "%s.input_layernorm.weight", p);
    float *w = read_f32(ld->st, m, 1, hs);
    if (!w || !(ly->ln1 = upload(ld->be, full ? MT_MEM_TRAIN : MT_MEM_BASE, w, 1, hs))) return free(w), -1;
    free(w);
    snprintf(m, sizeof m, "%s.post_attention_layernorm.weight", p);
    w = read_f32(ld->st, m, 1, hs);
    if (!w || !(ly->ln2 = upload(ld->be, full ? MT_MEM_TRAIN : MT_MEM_BASE, w, 1, hs))) return free(w), -1;
    free(w);
    if (full && (!(ly->dln1 = zeros(ld->be, MT_MEM_GRAD, 1, hs)) || !(ly->dln2 = zeros(ld->be, MT_MEM_GRAD, 1, hs))))
        return -1;
    struct { mt_linear *l; const char *name; int64_t out, in; unsigned target; } attn[] = {
        {&ly->q, "q_proj", qd, h, MT_TARGET_Q}, {&ly->k, "k_proj", kvd, h, MT_TARGET_K},
        {&ly->v, "v_proj", kvd, h, MT_TARGET_V}, {&ly->o, "o_proj", h, qd, MT_TARGET_O},
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(attn); i++) {
        snprintf(m, sizeof m, "%s.self_attn.%s", p, attn[i].name);
        if (load_linear(ld, attn[i].l, m, attn[i].out, attn[i].in, role_of(o, full),
                        lora && (o->targets & attn[i].target)))
            return -1;
    }
    // The router stays full precision: tiny (E·H), and trained in router and unfreeze modes.
    int gate_trains = full || ((o->mode == MT_MODE_ROUTER || o->mode == MT_MODE_UNFREEZE) && in_layers);
    snprintf(m, sizeof m, "%s.block_sparse_moe.gate", p);
    if (load_linear(ld, &ly->gate, m, c->experts, h, gate_trains ? TRAINABLE : FROZEN_DENSE,
                    lora && (o->targets & MT_TARGET_GATE)))
        return -1;
    ly->w1 = mt_xcalloc((size_t)c->experts, sizeof(mt_linear));
    ly->w2 = mt_xcalloc((size_t)c->experts, sizeof(mt_linear));
    ly->w3 = mt_xcalloc((size_t)c->experts, sizeof(mt_linear));
    for (int e = 0; e < c->experts; e++) {
        int chosen = in_layers && mt_index_set_contains(&o->experts, e);
        int trains = full || (o->mode == MT_MODE_UNFREEZE && chosen);
        int elora = lora && chosen;
        struct { mt_linear *l; const char *name; int64_t out, in; unsigned target; } ex[] = {
            {&ly->w1[e], "w1", c->intermediate, h, MT_TARGET_W1},
            {&ly->w2[e], "w2", h, c->intermediate, MT_TARGET_W2},
            {&ly->w3[e], "w3", c->intermediate, h, MT_TARGET_W3},
        };
        for (size_t i = 0; i < MT_ARRAY_LEN(ex); i++) {
            snprintf(m, sizeof m, "%s.block_sparse_moe.experts.%d.%s", p, e, ex[i].name);
            if (load_linear(ld, ex[i].l, m, ex[i].out, ex[i].in, role_of(o, trains),
                            elora && (o->targets & ex[i].target)))
                return -1;
        }
    }
    return 0;
}

static int check_opts(const mt_model_config *c, const mt_run_opts *o) {
    for (int i = 0; i < o->layers.count; i++)
        if (!o->layers.all && o->layers.items[i] >= c->layers) {
            mt_error_set("--layers names layer %d but the model has %lld", o->layers.items[i], (long long)c->layers);
            return -1;
        }
    for (int i = 0; i < o->experts.count; i++)
        if (!o->experts.all && o->experts.items[i] >= c->experts) {
            mt_error_set("--experts names expert %d but the model has %lld", o->experts.items[i], (long long)c->experts);
            return -1;
        }
    if (o->mode == MT_MODE_FULL && o->quant != MT_QUANT_NONE) {
        mt_error_set("--mode full trains every weight, so the base cannot be 4-bit: add --quant none");
        return -1;
    }
    if (o->mode == MT_MODE_LORA && o->lora_r < 1) {
        mt_error_set("--r must be at least 1 in lora mode");
        return -1;
    }
    if (c->router_jitter_noise != 0.0) {
        mt_error_set("router_jitter_noise %g is not supported (Mixtral uses 0)", c->router_jitter_noise);
        return -1;
    }
    return 0;
}

static int linear_trains(const mt_linear *l) { return l->dw || l->lora; }

// The lowest layer holding a trainable (0 in full mode, where the embedding trains too).
static int lowest_trainable_layer(const mt_model *m) {
    if (m->dembed) return 0;
    for (int L = 0; L < m->cfg.layers; L++) {
        const mt_layer *ly = &m->layers[L];
        if (ly->dln1 || ly->dln2 || linear_trains(&ly->q) || linear_trains(&ly->k) || linear_trains(&ly->v) ||
            linear_trains(&ly->o) || linear_trains(&ly->gate))
            return L;
        for (int e = 0; e < m->cfg.experts; e++)
            if (linear_trains(&ly->w1[e]) || linear_trains(&ly->w2[e]) || linear_trains(&ly->w3[e])) return L;
    }
    return (int)m->cfg.layers;  // nothing trains below the head
}

int mt_model_load(mt_model *m, mt_backend *be, const char *dir, const mt_run_opts *opts) {
    memset(m, 0, sizeof *m);
    if (mt_model_config_load(dir, &m->cfg) != 0 || check_opts(&m->cfg, opts) != 0) return -1;
    m->be = be;
    m->opts = *opts;
    m->aux_coef = (float)m->cfg.router_aux_loss_coef;
    m->recompute = opts->checkpointing == MT_CKPT_FULL;
    mt_st_model st;
    if (mt_st_model_open(&st, dir) != 0) return -1;
    const mt_model_config *c = &m->cfg;
    loader ld = {be, &st, &m->opts};
    int full = opts->mode == MT_MODE_FULL, rc = -1;
    int64_t emb[2] = {c->vocab, c->hidden}, hs[1] = {c->hidden};
    float *w = read_f32(&st, "model.embed_tokens.weight", 2, emb);
    if (!w || !(m->embed = upload(be, full ? MT_MEM_TRAIN : MT_MEM_BASE, w, 2, emb))) goto done;
    free(w);
    w = read_f32(&st, "model.norm.weight", 1, hs);
    if (!w || !(m->norm = upload(be, full ? MT_MEM_TRAIN : MT_MEM_BASE, w, 1, hs))) goto done;
    if (full && (!(m->dembed = zeros(be, MT_MEM_GRAD, 2, emb)) || !(m->dnorm = zeros(be, MT_MEM_GRAD, 1, hs))))
        goto done;
    if (c->tie_word_embeddings) {
        mt_error_set("tied word embeddings are not supported yet (Mixtral unties them)");
        goto done;
    }
    if (load_linear(&ld, &m->lm_head, "lm_head", c->vocab, c->hidden, full ? TRAINABLE : FROZEN_DENSE, 0))
        goto done;
    m->layers = mt_xcalloc((size_t)c->layers, sizeof(mt_layer));
    for (int L = 0; L < c->layers; L++)
        if (load_layer(&ld, c, L, &m->layers[L]) != 0) goto done;
    m->lowest_trainable = lowest_trainable_layer(m);
    rc = 0;
done:
    free(w);
    mt_st_model_close(&st);
    if (rc) {
        mt_error_prefix("%s", dir);
        mt_model_free(m);
    }
    return rc;
}

static mt_linear *expert_linear(mt_layer *ly, int e, const char *which) {
    return strcmp(which, "w1") == 0 ? &ly->w1[e] : strcmp(which, "w2") == 0 ? &ly->w2[e]
         : strcmp(which, "w3") == 0 ? &ly->w3[e] : NULL;
}

mt_linear *mt_model_find_linear(mt_model *m, const char *module) {
    if (strcmp(module, "lm_head") == 0) return &m->lm_head;
    int L, e, n = 0;
    char rest[64];
    if (sscanf(module, "model.layers.%d.%63s%n", &L, rest, &n) != 2 || L < 0 || L >= m->cfg.layers)
        return NULL;
    mt_layer *ly = &m->layers[L];
    static const char *attn[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"};
    mt_linear *al[] = {&ly->q, &ly->k, &ly->v, &ly->o};
    for (int i = 0; i < 4; i++)
        if (strcmp(rest, attn[i]) == 0) return al[i];
    if (strcmp(rest, "block_sparse_moe.gate") == 0) return &ly->gate;
    char which[8];
    if (sscanf(rest, "block_sparse_moe.experts.%d.%7s", &e, which) == 2 && e >= 0 && e < m->cfg.experts) {
        char check[96];
        snprintf(check, sizeof check, "block_sparse_moe.experts.%d.%s", e, which);
        if (strcmp(check, rest) == 0) return expert_linear(ly, e, which);
    }
    return NULL;
}
