// model/router_balance.c — DeepSeek-V3's auxiliary-loss-free balancing (--router-bias-update):
// each MoE layer's e_score_correction_bias moves by rate · sign(mean load − load[e]) after every
// step, no gradient involved (docs/families.md "DeepSeek-style"). The forward counts each expert's
// unmasked tokens on the device (route() in model/forward.c); the step's update runs on the host:
// E numbers a layer, summed over the data-parallel ranks first so every rank moves its copy alike.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/safetensors.h"
#include "model/model_internal.h"

int mt_model_bias_balance_start(mt_model *m) {
    const mt_model_config *c = &m->cfg;
    if (!mt_config_family(c)->score_bias) {
        mt_error_set("--router-bias-update: model_type %s has no e_score_correction_bias to move", c->model_type);
        return -1;
    }
    int64_t n = c->layers * c->experts * (int64_t)sizeof(double);
    if (!(m->bias_load_t = mt_tensor_new(m->be, MT_MEM_ACT, MT_U8, 1, &n))) return -1;
    m->bias_load = m->bias_load_t->data;
    m->be->ops->fill_zero(m->be, m->bias_load, (size_t)n);
    return 0;
}

int mt_model_bias_balance_step(mt_model *m, mt_comm *ranks, float rate, double *max_over_mean) {
    const mt_model_config *c = &m->cfg;
    size_t E = (size_t)c->experts, n = (size_t)c->layers * E;
    double *load = mt_xmalloc(n * sizeof(double));
    float *bias = mt_xmalloc(E * sizeof(float));
    m->be->ops->download(m->be, load, m->bias_load, n * sizeof(double));
    if (ranks) mt_comm_host_all_reduce(ranks, load, n, MT_COMM_F64, MT_COMM_SUM, MT_COMM_EXACT);
    for (int L = 0; L < c->layers; L++) {
        mt_layer *ly = &m->layers[L];
        max_over_mean[L] = router_load_max_over_mean(load + L * E, (int)E);
        if (!ly->score_bias || m->counting) continue;
        m->be->ops->download(m->be, bias, ly->score_bias->data, E * sizeof(float));
        router_bias_update_cpu(bias, load + L * E, (int)E, rate);
        m->be->ops->upload(m->be, ly->score_bias->data, bias, E * sizeof(float));
    }
    m->be->ops->fill_zero(m->be, m->bias_load, n * sizeof(double));  // the next step counts afresh
    free(load), free(bias);
    return 0;
}

// ---------------------------------------------------------------------------------------------
// The moved biases kept: what --router-bias-update changed lives only in the score biases, so a
// run's checkpoints and its product carry them (docs/families.md "DeepSeek-style").

int mt_model_score_bias_name(const mt_model *m, int L, char *name, size_t n) {
    const mt_family *fam = mt_config_family(&m->cfg);
    if (L < 0 || L >= m->cfg.layers || !m->layers[L].score_bias) return -1;
    snprintf(name, n, "model.layers.%d.%s.%s.%s", L, fam->moe_module, fam->router, fam->score_bias);
    return 0;
}

mt_tensor *mt_model_score_bias_named(mt_model *m, const char *name) {
    char own[128];
    for (int L = 0; L < m->cfg.layers; L++)
        if (mt_model_score_bias_name(m, L, own, sizeof own) == 0 && strcmp(own, name) == 0) return m->layers[L].score_bias;
    return NULL;
}

typedef struct {
    mt_model *m;
    int *layer;  // [entries] the layer of each
} bias_fill;

static int fill_bias(void *ctx, size_t i, void *dst, size_t nbytes) {
    const bias_fill *f = ctx;
    const mt_tensor *t = f->m->layers[f->layer[i]].score_bias;
    if (nbytes != t->nbytes) {
        mt_error_set("score bias of layer %d: %zu bytes, %zu in the file", f->layer[i], (size_t)t->nbytes, nbytes);
        return -1;
    }
    mt_tensor_download(t, dst);
    return 0;
}

int mt_model_save_score_biases(mt_model *m, const char *path) {
    int L_n = (int)m->cfg.layers, n = 0;
    mt_st_entry *e = mt_xcalloc((size_t)L_n, sizeof *e);
    char (*names)[128] = mt_xcalloc((size_t)L_n, sizeof *names);
    bias_fill f = {m, mt_xcalloc((size_t)L_n, sizeof(int))};
    for (int L = 0; L < L_n; L++) {
        if (mt_model_score_bias_name(m, L, names[n], sizeof names[n]) != 0) continue;
        e[n] = (mt_st_entry){.name = names[n], .dtype = "F32", .ndim = 1, .shape = {m->cfg.experts}};
        f.layer[n++] = L;
    }
    int rc = mt_st_write(path, e, (size_t)n, "{\"format\":\"pt\"}", fill_bias, &f);
    free(e), free(names), free(f.layer);
    return rc;
}

int mt_model_load_score_biases(mt_model *m, const char *path) {
    mt_st_file f;
    if (mt_st_file_open(&f, path) != 0) return -1;
    int rc = 0;
    for (size_t i = 0; i < f.n_tensors && rc == 0; i++) {
        const mt_st_tensor *t = &f.tensors[i];
        mt_tensor *b = mt_model_score_bias_named(m, t->name);
        if (!b) {
            mt_error_set("%s: tensor '%s' is not a score bias (e_score_correction_bias) of this model", path, t->name);
            rc = -1;
        } else if (strcmp(t->dtype, "F32") != 0 || t->ndim != 1 || t->shape[0] != m->cfg.experts) {
            mt_error_set("%s: tensor '%s' is not F32 [%lld]", path, t->name, (long long)m->cfg.experts);
            rc = -1;
        } else {
            float *h = mt_xmalloc(t->nbytes);
            memcpy(h, t->data, t->nbytes);  // an mmap'd tensor need not be aligned
            mt_tensor_upload(b, h);
            free(h);
        }
    }
    mt_st_file_close(&f);
    return rc;
}
