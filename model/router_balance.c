// model/router_balance.c — DeepSeek-V3's auxiliary-loss-free balancing (--router-bias-update):
// each MoE layer's e_score_correction_bias moves by rate · sign(mean load − load[e]) after every
// step, no gradient involved (docs/families.md "DeepSeek-style"). The forward counts each expert's
// unmasked tokens on the device (route() in model/forward.c); the step's update runs on the host:
// E numbers a layer, summed over the data-parallel ranks first so every rank moves its copy alike.
#include <string.h>

#include "core/common.h"
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
