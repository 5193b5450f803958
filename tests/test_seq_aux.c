// DeepSeek's sequence-wise balance loss in the training step (config: aux_loss_alpha with seq_aux;
// trainer: --seq-aux-coef): on DeepSeek-V3's tiny config (sigmoid scores) and V2's (softmax, groups
// by their max), router-only training, a padded row. The loss adds α · Σ over MoE layers of the mean
// over sequences of Σ_e f_e·P_e, recomputed here from the step's kept choices and scores in double;
// the rest of the loss is unchanged; and the router's gradient, with the loss's share in it, equals
// central finite differences. The routing is pinned to the first forward's choices
// (mt_model.routing_given), so that ±h moves no token to another expert and the loss is smooth.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/common.h"
#include "model/config.h"
#include "model/mixtral.h"
#include "tests/fd.h"
#include "trainer/options.h"

typedef struct {
    mt_model *m;
    mt_batch b;
} seq_ctx;

static double train_loss(void *ctx) {
    seq_ctx *c = ctx;
    mt_loss l;
    cr_assert_eq(mt_model_forward_train(c->m, &c->b, &l), 0, "%s", mt_error_get());
    return l.loss;
}

// The balance loss of the last forward, from its kept choices and scores: per MoE layer and
// unpadded sequence, f_e = E/(k·n)·(rows choosing e), P_e = mean over the rows of s_te / Σ_j s_tj;
// the sequences' Σ_e f_e·P_e averaged, summed over the layers.
static double naive_seq_aux(const mt_model *m, const mt_batch *b) {
    int E = (int)m->cfg.experts, k = (int)m->cfg.top_k;
    double total = 0;
    for (int L = 0; L < m->cfg.layers; L++) {
        if (m->layers[L].dense) continue;
        const int32_t *ids = m->kept[L].ids->data;
        const float *s = m->acts[L].probs->data;
        double layer = 0;
        int seqs = 0;
        for (int q = 0; q < b->B; q++) {
            double f[64] = {0}, P[64] = {0};
            int n = 0;
            for (int t = q * b->S; t < (q + 1) * b->S; t++) {
                if (!b->mask[t]) continue;
                n++;
                double z = 0;
                for (int e = 0; e < E; e++) z += s[(size_t)t * E + e];
                for (int e = 0; e < E; e++) P[e] += s[(size_t)t * E + e] / z;
                for (int j = 0; j < k; j++) f[ids[t * k + j]] += 1;
            }
            if (!n) continue;
            double Lq = 0;
            for (int e = 0; e < E; e++) Lq += (double)E / (k * n) * f[e] * (P[e] / n);
            layer += Lq, seqs++;
        }
        total += layer / seqs;
    }
    return total;
}

static void seq_aux_case(const char *config, float alpha) {
    mt_model_config cfg;
    cr_assert_eq(mt_model_config_load(config, &cfg), 0, "%s", mt_error_get());
    cfg.seq_aux = 1, cfg.aux_loss_alpha = alpha;
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = MT_MODE_ROUTER, o.quant = MT_QUANT_NONE, o.checkpointing = MT_CKPT_NONE;
    mt_backend *be = mt_backend_cpu_new();
    mt_model m;
    cr_assert_eq(mt_model_build(&m, be, &cfg, NULL, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    cr_expect_float_eq(m.seq_aux_coef, alpha, 0, "the config's aux_loss_alpha with seq_aux");
    int moe_layer = -1;
    for (int L = 0; L < m.cfg.layers; L++) {  // routers the loss feels: logits of ~±2
        if (m.layers[L].dense) continue;
        float *w = m.layers[L].gate.w->data;
        for (int64_t j = 0; j < mt_tensor_numel(m.layers[L].gate.w); j++) w[j] = 0.4f * sinf((float)(7 * j + 3 * L));
        moe_layer = L;
    }
    enum { B = 3, S = 11 };
    int32_t tokens[B * S], mask[B * S];
    for (int i = 0; i < B * S; i++) tokens[i] = 3 + (i * 29) % 250, mask[i] = !(i >= 2 * S && i % S >= 7);
    seq_ctx c = {&m, {B, S, tokens, tokens, mask}};

    mt_loss l1, l0;
    cr_assert_eq(mt_model_forward_train(&m, &c.b, &l1), 0);
    const int32_t **given = mt_xcalloc((size_t)m.cfg.layers, sizeof *given);
    int32_t *pinned = mt_xmalloc((size_t)m.cfg.layers * B * S * m.cfg.top_k * sizeof(int32_t));
    for (int L = 0; L < m.cfg.layers; L++) {
        if (m.layers[L].dense) continue;
        int32_t *p = pinned + (size_t)L * B * S * m.cfg.top_k;
        memcpy(p, m.kept[L].ids->data, (size_t)B * S * m.cfg.top_k * sizeof(int32_t));
        given[L] = p;
    }
    m.routing_given = given;
    double want = naive_seq_aux(&m, &c.b);
    cr_expect_gt(want, 0.5, "%s: a balance loss near its floor (1 for uniform scores) tells nothing", config);
    cr_expect_leq(fabs(l1.seq_aux - want), 1e-6 * want, "%s: seq_aux %.9g, recomputed %.9g", config, l1.seq_aux, want);
    cr_expect_leq(fabs(l1.loss - (l1.ce + m.aux_coef * l1.aux + m.z_coef * l1.z + alpha * want)), 1e-6 * l1.loss,
                  "%s: loss %.9g is not ce + aux + z + alpha · seq_aux", config, l1.loss);

    // The gradient with the loss (α) and without (0): the balance loss's share is a large part of it.
    const mt_linear *gate = &m.layers[moe_layer].gate;
    int64_t n = mt_tensor_numel(gate->w);
    float *g1 = mt_xmalloc((size_t)n * sizeof(float));
    mt_model_zero_grad(&m);
    cr_assert_eq(mt_model_forward_train(&m, &c.b, &l1), 0);
    mt_model_backward(&m);
    memcpy(g1, gate->dw->data, (size_t)n * sizeof(float));
    m.seq_aux_coef = 0;
    mt_model_zero_grad(&m);
    cr_assert_eq(mt_model_forward_train(&m, &c.b, &l0), 0);
    mt_model_backward(&m);
    cr_expect_eq(l0.ce, l1.ce, "%s: the balance loss changed the rest of the loss", config);
    cr_expect_eq(l0.seq_aux, 0.0, "%s: seq_aux reported with its coefficient 0", config);
    const float *g0 = gate->dw->data;
    double d2 = 0, n2 = 0;
    for (int64_t j = 0; j < n; j++) d2 += (double)(g1[j] - g0[j]) * (g1[j] - g0[j]), n2 += (double)g1[j] * g1[j];
    cr_expect_gt(sqrt(d2 / n2), 0.1, "%s: the balance loss moves the router's gradient by only %.3g", config,
                 sqrt(d2 / n2));
    m.seq_aux_coef = alpha;
    // h = 0.05: the routing is pinned, so the loss is smooth in the router; fp32 losses of ~5 differ
    // by ~5e-7 of noise, 5e-6 of a gradient element at this h (seen: 0.02 worst at -O2, 0.064 at
    // h = 0.01 in the ASan build); a gradient 1.3 times the balance loss's share gives 0.4.
    fd_report r = fd_check_f32(train_loss, &c, gate->w->data, g1, n, 5e-2f, 1e-4);
    fprintf(stderr, "seq_aux: %s layer %d router against finite differences: " FD_FMT "\n", config, moe_layer,
            FD_ARGS(r));
    cr_expect_lt(r.worst, 0.15, "%s layer %d router: " FD_FMT, config, moe_layer, FD_ARGS(r));
    free(g1), free(pinned), free(given);
    mt_model_free(&m);
    mt_backend_free(be);
}

Test(seq_aux, deepseek_v3_sigmoid_scores) { seq_aux_case(MT_REPO_ROOT "/configs/tiny-deepseek-v3.json", 0.3f); }
Test(seq_aux, deepseek_v2_softmax_scores) { seq_aux_case(MT_REPO_ROOT "/configs/tiny-deepseek-v2.json", 0.3f); }
