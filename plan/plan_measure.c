// plan/plan_measure.c — `moetrain plan --measure`: one real training step (model build, AdamW
// state, forward, backward, update) of the same code on the null backend, whose ledger counts
// every byte while nothing is allocated or computed, and its peaks beside the plan's figures.
#include <string.h>
#include <time.h>

#include "core/common.h"
#include "model/mixtral.h"
#include "optim/dist.h"
#include "optim/optim.h"
#include "optim/params.h"
#include "plan/plan.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

// What the step cannot do yet is refused by name rather than measured as something else.
static int measurable(const mt_plan_opts *o) {
    if (o->zero < 2) return 0;
    mt_error_set("--measure runs the step that exists; --zero 2 is planned, not implemented: measure --zero 1");
    return -1;
}

// One step of B·S tokens on rank 0 (the most loaded: the first of the round-robin experts, the
// first and largest ZeRO shard) of a run over --gpus ranks with --ep: zero_grad, forward,
// backward, AdamW on the optimizer's params of optim/dist.h. No rank exists beside it, so
// every other rank is taken to route as this one does (balanced) and nothing is exchanged. The
// tokens are never read on the null backend beyond their range check.
static int one_step(mt_model *m, const mt_plan_opts *o) {
    mt_param *params;
    int n = mt_model_params(m, &params);
    mt_dist dist;
    mt_dist_ranks ranks = {.world_rank = 0, .world_size = o->gpus, .dp_rank = 0, .dp_size = o->gpus / o->ep};
    if (mt_dist_init(&dist, m->be, params, n, &ranks, o->zero) != 0) return mt_params_free(params, n), -1;
    mt_adamw opt;
    mt_adamw_opts aopts = mt_adamw_opts_default();
    aopts.adam_8bit = o->adam_8bit, aopts.master_weights = o->master_weights, aopts.offload = o->offload_optimizer;
    if (mt_adamw_init(&opt, m->be, dist.opt, dist.n_opt, &aopts) != 0)
        return mt_dist_free(&dist), mt_params_free(params, n), -1;
    size_t T = (size_t)(o->batch * o->seq);
    int32_t *tokens = mt_xcalloc(T, sizeof(int32_t)), *labels = mt_xcalloc(T, sizeof(int32_t));
    mt_batch b = {(int)o->batch, (int)o->seq, tokens, labels, NULL};
    mt_loss loss;
    mt_model_zero_grad(m);
    int rc = mt_model_forward_train(m, &b, &loss);
    if (rc == 0) {
        mt_model_backward(m);
        mt_dist_reduce_grads(&dist);
        rc = mt_adamw_step_norm(&opt, dist.opt, dist.n_opt, o->lr, o->clip, mt_dist_grad_norm(&dist)) < 0 ? -1 : 0;
        mt_dist_share_weights(&dist);
    }
    free(tokens), free(labels);
    mt_adamw_free(&opt);
    mt_dist_free(&dist);
    mt_params_free(params, n);
    return rc;
}

int mt_plan_measure_on(mt_backend *be, const mt_model_config *cfg, const char *checkpoint, const mt_plan_opts *o,
                       const mt_model_spec *spec, mt_plan_measurement *out) {
    memset(out, 0, sizeof *out);
    // --ep that does not divide --gpus would leave the step no DP group (and divide by zero)
    if (mt_plan_check(cfg, o) != 0 || measurable(o) != 0) return -1;
    if (o->seq > INT32_MAX / 2 || o->batch * o->seq > INT32_MAX / 64) {
        mt_error_set("--seq %lld × --batch %lld is beyond what one step indexes", (long long)o->seq,
                     (long long)o->batch);
        return -1;
    }
    double t0 = now_s();
    // The backend's own (a cuBLASLt workspace) is held throughout: the step's peaks are above it.
    mt_ledger start = be->ledger;
    mt_ledger_reset_peak(&be->ledger);
    mt_model m;
    mt_model_par par = {.ep_rank = 0, .ep_size = o->ep};
    int rc = mt_model_build_par(&m, be, cfg, checkpoint, spec, &par);
    if (rc == 0) {
        rc = one_step(&m, o);
        for (int c = 0; c < MT_MEM_COUNT; c++) out->peak[c] = be->ledger.peak[c] - start.cur[c];
        out->total_peak = be->ledger.total_peak - start.total_cur;
        mt_model_free(&m);
    }
    int64_t Tk = o->batch * o->seq * cfg->top_k;
    out->rows_per_expert = Tk / cfg->experts;
    out->rows_extra = Tk % cfg->experts;
    out->seconds = now_s() - t0;
    return rc;
}

int mt_plan_measure(const mt_model_config *cfg, const char *checkpoint, const mt_plan_opts *o,
                    const mt_model_spec *spec, mt_plan_measurement *out) {
    mt_backend *be = mt_backend_null_new();
    int rc = mt_plan_measure_on(be, cfg, checkpoint, o, spec, out);
    mt_backend_free(be);
    return rc;
}

// The deciding total of a run at sequence `seq`: 0 fits, 1 does not, -1 error.
static int total_at(const mt_model_config *cfg, const mt_plan_opts *o, const mt_model_spec *spec, int64_t seq,
                    uint64_t *total) {
    mt_plan_opts at = *o;
    at.seq = seq;
    if (!spec) {
        mt_plan p;
        if (mt_plan_compute(cfg, &at, &p) != 0) return -1;
        *total = p.total;
        return p.fits ? 0 : 1;
    }
    mt_plan_measurement m;
    if (mt_plan_measure(cfg, NULL, &at, spec, &m) != 0) return -1;
    *total = m.total_peak;
    return mt_plan_measured_fits(&m, o->gpu_mem_bytes) ? 0 : 1;
}

int64_t mt_plan_max_seq(const mt_model_config *cfg, const mt_plan_opts *o, const mt_model_spec *spec, int64_t limit,
                        uint64_t *total) {
    int64_t lo = 0, hi = limit + 1;  // fits at lo (0: nothing yet), not at hi (or beyond the limit)
    uint64_t t = 0, at_lo = 0;
    int rc = total_at(cfg, o, spec, limit, &t);
    if (rc < 0) return -1;
    if (rc == 0) lo = limit, at_lo = t;
    else hi = limit;
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if ((rc = total_at(cfg, o, spec, mid, &t)) < 0) return -1;
        if (rc == 0) lo = mid, at_lo = t;
        else hi = mid;
    }
    *total = at_lo;
    return lo;
}

// The order of the candidates, least recomputation first. Per token and layer of Mixtral at
// s = 4096, the attention part recomputes 2·(h·(qd + 2·h_kv) + qd·h) = 84 MFLOP of projections
// and 4·(s/2)·hd·a = 34 MFLOP of causal attention, 118 MFLOP, and frees 8h + 4h_kv + 4a + 4 =
// 37 KB; the MLP part recomputes k·3·2·h·f = 705 MFLOP of experts and frees k·(4h + 6f) + 2h + ...
// = 213 KB. Both free about 3 bytes per kFLOP, so bytes saved per FLOP does not order them; the
// FLOPs recomputed do, and each later candidate also saves more: attention before experts.
static const mt_ckpt recompute_order[] = {MT_CKPT_NONE, MT_CKPT_ATTENTION, MT_CKPT_EXPERTS, MT_CKPT_FULL};

int mt_plan_choose_recompute(const mt_model_config *cfg, const mt_plan_opts *o, const mt_model_spec *spec,
                             double limit, double scale, double reserve, mt_plan_recompute_choice *out) {
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < MT_ARRAY_LEN(recompute_order); i++) {
        mt_plan_opts at = *o;
        mt_model_spec sp = *spec;
        at.checkpointing = sp.checkpointing = recompute_order[i];
        mt_plan_measurement m;
        mt_plan p;
        if (mt_plan_measure(cfg, NULL, &at, &sp, &m) == 0) {
            out->total = m.total_peak, out->measured = 1;
        } else {  // a run the step cannot measure yet (--zero 2): the plan's total
            if (mt_plan_compute(cfg, &at, &p) != 0) return -1;
            out->total = p.total, out->measured = 0;
        }
        out->mode = recompute_order[i];
        out->fits = (double)out->total * scale + reserve <= limit;
        if (out->fits) return 0;
    }
    return 0;  // nothing fits: full, the least memory
}
