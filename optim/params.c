// optim/params.c — collecting the model's trainables in a fixed order.
#include "optim/params.h"

#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "core/rng.h"

typedef struct { mt_param *p; int n, cap; } plist;

static void add(plist *l, const char *name, mt_tensor *w, mt_tensor *g) {
    if (l->n == l->cap) l->p = mt_xrealloc(l->p, (size_t)(l->cap = l->cap ? 2 * l->cap : 64) * sizeof(mt_param));
    l->p[l->n++] = (mt_param){.name = mt_xstrdup(name), .w = w, .g = g, .decay = mt_param_decays(w)};
}

static void add_linear(plist *l, const char *module, mt_linear *lin) {
    char name[320];
    if (lin->dw) {
        snprintf(name, sizeof name, "%s.weight", module);
        add(l, name, lin->w, lin->dw);
    }
    if (lin->lora) {
        snprintf(name, sizeof name, "base_model.model.%s.lora_A.weight", module);
        add(l, name, lin->lora->a, lin->lora->da);
        snprintf(name, sizeof name, "base_model.model.%s.lora_B.weight", module);
        add(l, name, lin->lora->b, lin->lora->db);
    }
}

int mt_model_params(mt_model *m, mt_param **out) {
    plist l = {0};
    char module[256];
    if (m->dembed) add(&l, "model.embed_tokens.weight", m->embed, m->dembed);
    for (int L = 0; L < m->cfg.layers; L++) {
        mt_layer *ly = &m->layers[L];
        if (ly->dln1) {
            snprintf(module, sizeof module, "model.layers.%d.input_layernorm.weight", L);
            add(&l, module, ly->ln1, ly->dln1);
            snprintf(module, sizeof module, "model.layers.%d.post_attention_layernorm.weight", L);
            add(&l, module, ly->ln2, ly->dln2);
        }
        if (ly->dqn) {
            snprintf(module, sizeof module, "model.layers.%d.self_attn.q_norm.weight", L);
            add(&l, module, ly->qn, ly->dqn);
            snprintf(module, sizeof module, "model.layers.%d.self_attn.k_norm.weight", L);
            add(&l, module, ly->kn, ly->dkn);
        }
        // MLA's biases sit on q_a_proj, kv_a_proj_with_mqa and o_proj (model/mixtral.h)
        static const char *attn[] = {"q_proj", "k_proj", "v_proj", "o_proj"}, *mla[] = {"q_a_proj", "kv_a_proj_with_mqa"};
        for (int i = 0; i < 4; i++)
            if (ly->dbias[i]) {
                snprintf(module, sizeof module, "model.layers.%d.self_attn.%s.bias", L,
                         m->cfg.mla && i < 2 ? mla[i] : attn[i]);
                add(&l, module, ly->bias[i], ly->dbias[i]);
            }
        mt_tensor *mn[] = {ly->q_a_norm, ly->kv_a_norm}, *dmn[] = {ly->dq_a_norm, ly->dkv_a_norm};
        static const char *mnn[] = {"q_a_layernorm", "kv_a_layernorm"};
        for (int i = 0; i < 2; i++)
            if (dmn[i]) {
                snprintf(module, sizeof module, "model.layers.%d.self_attn.%s.weight", L, mnn[i]);
                add(&l, module, mn[i], dmn[i]);
            }
        if (ly->dsinks) {
            snprintf(module, sizeof module, "model.layers.%d.self_attn.sinks", L);
            add(&l, module, ly->sinks, ly->dsinks);
        }
        mt_linear *al[MT_ATTN_LINEARS];
        const char *an[MT_ATTN_LINEARS];
        for (int i = 0, na = mt_layer_attn_linears(ly, &m->cfg, al, an); i < na; i++) {
            snprintf(module, sizeof module, "model.layers.%d.%s", L, an[i]);
            add_linear(&l, module, al[i]);
        }
        const mt_family *fam = mt_config_family(&m->cfg);  // the family's module names
        for (int i = 0; i < 3 && ly->mlp[i].out; i++) {  // a dense layer's MLP or the shared expert
            snprintf(module, sizeof module, "model.layers.%d.%s.%s%s%s", L, fam->moe_module,
                     ly->dense ? "" : fam->shared_expert, ly->dense ? "" : ".", fam->mlp[i]);
            add_linear(&l, module, &ly->mlp[i]);
        }
        if (ly->shared_gate.out) {
            snprintf(module, sizeof module, "model.layers.%d.%s.%s", L, fam->moe_module, fam->shared_gate);
            add_linear(&l, module, &ly->shared_gate);
        }
        if (ly->dense) continue;
        snprintf(module, sizeof module, "model.layers.%d.%s.%s", L, fam->moe_module, fam->router);
        add_linear(&l, module, &ly->gate);
        if (ly->dgate_bias) {  // gpt-oss: trains with the router's weight
            snprintf(module, sizeof module, "model.layers.%d.%s.%s.bias", L, fam->moe_module, fam->router);
            add(&l, module, ly->gate_bias, ly->dgate_bias);
        }
        for (int i = 0; i < 3; i++)
            if (ly->debias[i]) {  // gpt-oss, --mode full: the experts' biases (their slots' names)
                snprintf(module, sizeof module, "model.layers.%d.%s.experts.%s_bias", L, fam->moe_module,
                         fam->expert[i]);
                add(&l, module, ly->ebias[i], ly->debias[i]);
            }
        for (int e = 0; e < m->cfg.experts; e++) {
            mt_linear *ex[] = {&ly->w1[e], &ly->w2[e], &ly->w3[e]};
            for (int i = 0; i < 3; i++) {
                snprintf(module, sizeof module, "model.layers.%d.%s.experts.%d.%s", L, fam->moe_module, e,
                         fam->expert[i]);
                add_linear(&l, module, ex[i]);
            }
        }
    }
    if (m->dnorm) add(&l, "model.norm.weight", m->norm, m->dnorm);
    add_linear(&l, "lm_head", &m->lm_head);
    *out = l.p;
    return l.n;
}

void mt_params_free(mt_param *p, int n) {
    for (int i = 0; i < n; i++) free((char *)p[i].name);
    free(p);
}

uint64_t mt_params_count(const mt_param *p, int n) {
    uint64_t c = 0;
    for (int i = 0; i < n; i++) c += (uint64_t)mt_tensor_numel(p[i].w);
    return c;
}

static void seed_linear(mt_linear *l, uint64_t s) {
    if (l->lora) l->lora->dropout_seed = s ^ l->lora->stream;
}

void mt_model_set_dropout_seed(mt_model *m, uint64_t seed, int64_t step, int micro) {
    mt_rng r;
    mt_rng_seed(&r, seed ^ 0x6c6f7261ull, (uint64_t)step * 4096u + (uint64_t)micro);
    uint64_t s = mt_rng_next(&r);
    for (int L = 0; L < m->cfg.layers; L++) {
        mt_layer *ly = &m->layers[L];
        mt_linear *ls[] = {&ly->q, &ly->k, &ly->v, &ly->o, &ly->gate, &ly->mlp[0], &ly->mlp[1], &ly->mlp[2]};
        for (int i = 0; i < 8; i++) seed_linear(ls[i], s);
        for (int e = 0; e < m->cfg.experts; e++)
            seed_linear(&ly->w1[e], s), seed_linear(&ly->w2[e], s), seed_linear(&ly->w3[e], s);
    }
}

static void drop_linear(mt_linear *l, float p) {
    if (l->lora) l->lora->dropout = p;
}

void mt_model_set_lora_dropout(mt_model *m, float p) {
    for (int L = 0; L < m->cfg.layers; L++) {
        mt_layer *ly = &m->layers[L];
        mt_linear *ls[MT_ATTN_LINEARS + 5];  // MLA's q_a, kv_a, kv_b too
        int n = mt_layer_attn_linears(ly, &m->cfg, ls, NULL);
        mt_linear *rest[] = {&ly->gate, &ly->mlp[0], &ly->mlp[1], &ly->mlp[2], &ly->shared_gate};
        for (int i = 0; i < 5; i++) ls[n++] = rest[i];
        for (int i = 0; i < n; i++) drop_linear(ls[i], p);
        for (int e = 0; e < m->cfg.experts; e++)
            drop_linear(&ly->w1[e], p), drop_linear(&ly->w2[e], p), drop_linear(&ly->w3[e], p);
    }
}

void mt_params_scale_grads(const mt_param *p, int n, float s) {
    for (int i = 0; i < n; i++) {
        mt_backend *be = p[i].g->be;
        be->ops->scale(be, p[i].g->data, p[i].g->dtype, (size_t)mt_tensor_numel(p[i].g), s);
    }
}
