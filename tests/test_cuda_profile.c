// MT_PROFILE's per-op table (core/profile.h) on one case-C-like step of the tiny Mixtral: LoRA
// on every expert's w1, w2, w3 and on the routers, NF4 double-quant experts and attention, full
// recomputation, then AdamW. Asserts every expected row, the FLOPs against scripts/step_model.h
// op by op (with the exact differences the real step has, each explained), the rows' times
// against the step's, the JSON, and that profiling changes nothing: the same device ops and host
// waits, bit-identical loss, gradients and updated weights. Under tests/cudasim the times are
// CPU-emulated (the table says so); every count is real.
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "tests/gpu_or_skip.h"
#include "core/common.h"
#include "core/fileio.h"
#include "core/profile.h"
#include "model/attention_cudnn.h"
#include "model/mixtral.h"
#include "model/model_internal.h"  // mt_experts_xs_extra: whether the LoRAs fold
#include "optim/optim.h"
#include "optim/params.h"
#include "scripts/profile_table.h"
#include "scripts/step_model.h"
#include "tests/test_compare.h"
#include "tests/test_util.h"
#include "trainer/options.h"

enum { B = 2, S = 16, R = 8 };  // r = 8: w1's and w3's LoRA B fold (mt_experts_xs_extra)

typedef struct {
    mt_model m;
    mt_param *p;
    int n;
    mt_adamw opt;
} run;

static void run_build(run *r, mt_backend *be, const char *dir, const mt_run_opts *o) {
    cr_assert_eq(mt_model_load(&r->m, be, dir, MT_MODEL_SPEC_OF(o)), 0, "%s", mt_error_get());
    r->n = mt_model_params(&r->m, &r->p);
    cr_assert_eq(mt_adamw_init(&r->opt, be, r->p, r->n, NULL), 0, "%s", mt_error_get());
}

static void run_free(run *r) {
    mt_adamw_free(&r->opt), mt_params_free(r->p, r->n), mt_model_free(&r->m);
}

// One training step as bench_gpu.c times it; the device ops and host waits it issued.
static double step(run *r, const mt_batch *b, uint64_t *ops, uint64_t *syncs) {
    mt_backend *be = r->m.be;
    uint64_t o0 = be->device_ops, s0 = be->host_syncs;
    mt_loss l;
    double gnorm;
    mt_model_zero_grad(&r->m);
    mt_model_set_dropout_seed(&r->m, 3, 0, 0);
    cr_assert_eq(mt_model_forward_train(&r->m, b, &l), 0, "%s", mt_error_get());
    mt_model_backward(&r->m);
    cr_assert_eq(mt_adamw_step(&r->opt, r->p, r->n, 1e-3, 1.0, &gnorm), 0, "%s", mt_error_get());
    be->ops->synchronize(be);
    *ops = be->device_ops - o0, *syncs = be->host_syncs - s0;
    return l.loss;
}

static const mt_prof_row *find(const mt_prof_table *t, const char *name, char phase) {
    for (int i = 0; i < t->n; i++)
        if (t->row[i].phase == phase && !strcmp(t->row[i].name, name)) return &t->row[i];
    return NULL;
}

// What the real step does differently from scripts/step_model.h, in FLOPs per (op, phase); the
// model has layer 0's early stop (no adapter in attention: its RMSNorms, attention backward,
// the router's and w1‖w3's dx, and on the cuBLAS path w1‖w3's dequantization, skipped), and the
// step also runs:
//   * in layer 0, no dx product of the router's LoRA, of the gather's backward or of the
//     w1/w3 LoRAs (nothing below wants it: model/backward.c, needs_of), nor the grouped
//     kernel's in-kernel dequantization for the w1/w3 dx;
//   * the second residual add is h copied, then combine accumulating onto it (its adds are
//     combine's): one add kernel per layer forward, not two (a recomputed layer makes h only, as
//     the model has it, and combines nothing);
//   * the experts' in-kernel dequantization runs once per 64-row tile of each expert's real
//     rows, where the model assumes T·k/E rows for every expert;
//   * the backward scales the loss's gradient by 1/count (T·H), which the model does not count.
static double delta(const char *name, char ph, const mt_model *m) {
    const mt_model_config *c = &m->cfg;
    double T = B * S, h = c->hidden, f = c->intermediate, E = c->experts, K = c->top_k, L = c->layers;
    double r = R, Tk = T * K;
    double idle = 0, rows0 = 0;  // (layer, expert) pairs without rows; layer 0's experts with rows
    for (int l = 0; l < c->layers; l++)
        for (int e = 0; e < c->experts; e++) idle += m->kept[l].counts[e] == 0, rows0 += l == 0 && m->kept[l].counts[e];
    int B_ = ph == 'B', F_ = ph == 'F';
#define IS(s) (!strcmp(name, s))
    // The cuBLAS path dequantizes an expert's W only when it has rows, and layer 0's backward
    // skips w1‖w3's dx: the model skips it for all E experts of layer 0, the step for those with rows.
    if (IS("expert dequant 4-bit->bf16")) return -3 * h * f * idle - (B_ ? 2 * h * f * (rows0 - E) : 0);
    if (IS("residual adds") && F_) return -T * h * L;
    if (IS("loss gradient scale") && B_) return T * h;
    if (!B_) return 0;
    if (IS("LoRA gate")) return -2 * T * r * h;
    if (IS("permute/gather + combine")) return -Tk * h;
    // Layer 0 makes no dx: w1's and w3's LoRAs skip dx += dxa·A, and (their B folded beside W,
    // model/experts_gpu.c mt_experts_xs_extra) make dxa = s·dy·B themselves, as no dx GEMM does.
    if (IS("LoRA experts w1,w3,w2 (cuBLAS)")) return -2 * 2 * Tk * r * h + (mt_experts_xs_extra((mt_model *)m) ? 2 * 2 * Tk * r * f : 0);
#undef IS
    return 0;
}

Test(cuda, profile_table_case_c) {
    mt_backend *gpu = gpu_or_skip();
    char tmp[64], dir[128], json[160];
    tiny_checkpoint(tmp, dir, 9);
    mt_run_opts o;
    mt_run_opts_default(&o);  // NF4 double-quant experts and attention
    o.mode = MT_MODE_LORA, o.lora_r = R, o.targets = MT_TARGET_EXPERTS | MT_TARGET_GATE;
    o.checkpointing = MT_CKPT_FULL;  // the projection below recomputes every layer
    run plain, prof;
    run_build(&plain, gpu, dir, &o), run_build(&prof, gpu, dir, &o);
    cr_assert_not_null(prof.m.layers[0].q.q, "attention is 4-bit");
    int32_t tokens[B * S];
    for (int i = 0; i < B * S; i++) tokens[i] = 3 + (i * 41) % 250;
    mt_batch b = {B, S, tokens, tokens, NULL};

    uint64_t ops0, syncs0, ops1, syncs1;
    mt_prof_enable(0);
    double loss0 = step(&plain, &b, &ops0, &syncs0);
    cr_assert_eq(mt_prof_active, 0);
    mt_prof_enable(1);
    mt_prof_reset();
    cr_assert_eq(mt_prof_step_begin(gpu), 0, "%s", mt_error_get());
    double loss1 = step(&prof, &b, &ops1, &syncs1);
    mt_prof_step_end(gpu);
    mt_prof_enable(0);
    cr_expect_eq(ops1, ops0, "device ops: %llu profiled, %llu not", (unsigned long long)ops1, (unsigned long long)ops0);
    cr_expect_eq(syncs1, syncs0, "host waits: %llu profiled, %llu not", (unsigned long long)syncs1,
                 (unsigned long long)syncs0);
    cr_expect_eq(memcmp(&loss0, &loss1, sizeof loss0), 0, "loss %.17g profiled, %.17g not", loss1, loss0);
    for (int i = 0; i < plain.n; i++) {  // gradients, then the weights AdamW wrote: bit for bit
        const mt_tensor *t0[2] = {plain.p[i].g, plain.p[i].w}, *t1[2] = {prof.p[i].g, prof.p[i].w};
        for (int j = 0; j < 2; j++) {
            char *h0 = mt_xmalloc(t0[j]->nbytes), *h1 = mt_xmalloc(t1[j]->nbytes);
            mt_tensor_download(t0[j], h0), mt_tensor_download(t1[j], h1);
            cr_expect_eq(memcmp(h0, h1, t0[j]->nbytes), 0, "%s: %s differs with profiling", plain.p[i].name,
                         j ? "weight" : "gradient");
            free(h0), free(h1);
        }
    }

    const mt_prof_table *t = mt_prof_table_get();
    mt_prof_print(stdout, "tiny Mixtral, case C shape (test)");
    cr_assert_eq(t->steps, 1);
    cr_expect_eq(t->emulated, mt_prof_cuda_emulated(), "the table's device label");
    // Every op of the step's model appears, in its phase (the model's names are the rows').
    step_shape sh;
    memset(&sh, 0, sizeof sh);
    sh.cfg = prof.m.cfg, sh.batch = B, sh.seq = S, sh.lora_r = R, sh.targets = o.targets;
    sh.quant = o.quant, sh.quant_experts = sh.quant_attn = 1, sh.blocksize = o.quant_blocksize;
    sh.double_quant = o.double_quant, sh.recompute = 1, sh.dequants_per_use = 1;
    sh.recompute_attn = sh.recompute_mlp = 1, sh.lora_dropout = o.lora_dropout;
#ifdef MT_CUDA  // the attention rows: cuDNN's where it loads (the emulator's stand-in does) and takes the shape
    sh.attn_cudnn = !strcmp(attention_path(0, 0, (int)sh.cfg.heads, (int)sh.cfg.kv_heads, (int)sh.cfg.head_dim,
                                            (int)sh.cfg.head_dim), "cudnn");
#endif
    step_ops model;
    step_build(&sh, &model);
    profile_table_print(stdout, t, &model);
    for (int i = 0; i < model.n; i++) {
        const step_op *op = &model.op[i];
        const mt_prof_row *r = find(t, op->name, op->phase);
        if (!r) {
            cr_expect_fail("row %s (%c) is missing", op->name, op->phase);
            continue;
        }
        double want = op->flops + delta(op->name, op->phase, &prof.m);
        cr_expect_leq(fabs(r->flops - want), 1e-9 * fmax(want, 1.0), "%s (%c): %.17g FLOPs, step_model %.17g + %.17g",
                      op->name, op->phase, r->flops, op->flops, delta(op->name, op->phase, &prof.m));
        cr_expect(r->calls > 0, "%s (%c) counted no call", op->name, op->phase);
    }
    // No FLOP outside the model's ops but the one the model leaves out, and the rows sum to the total.
    double sum = 0, ms = 0, model_sum = step_hw_flops(&model), deltas = 0;
    for (int i = 0; i < t->n; i++) {
        const mt_prof_row *r = &t->row[i];
        sum += r->flops, ms += r->ms;
        int known = profile_table_model_op(&model, r->name, r->phase) != NULL || !strcmp(r->name, "loss gradient scale");
        cr_expect(known || r->flops == 0, "%s (%c): %.17g FLOPs the step model does not count", r->name, r->phase,
                  r->flops);
        cr_expect_geq(r->ms, 0.0, "%s (%c): negative time", r->name, r->phase);
        cr_expect(r->untimed || r->calls == 0 || r->ms > 0 || !strcmp(r->name, "other (unlabelled)"),
                  "%s (%c): %llu calls and no time", r->name, r->phase, (unsigned long long)r->calls);
        deltas += delta(r->name, r->phase, &prof.m);
    }
    cr_expect_eq(sum, t->flops, "rows sum to %.17g FLOPs, the total says %.17g", sum, t->flops);
    cr_expect_leq(fabs(t->flops - (model_sum + deltas)), 1e-9 * model_sum,
                  "total %.17g FLOPs = step_hw_flops %.17g + the differences %.17g", t->flops, model_sum, deltas);
    cr_expect(find(t, "host waits", 'F') != NULL, "the forward's host waits (routing offsets, loss)");
    // Times: the rows partition the events' span, inside the synchronized step's host clock.
    cr_expect_leq(fabs(ms - t->rows_ms), 1e-9 * t->rows_ms, "rows %.9g ms, rows_ms %.9g", ms, t->rows_ms);
    cr_expect_gt(t->rows_ms, 0.0);
    cr_expect_leq(t->rows_ms, t->step_ms * 1.001 + 0.01, "rows %.6g ms > the step's %.6g ms", t->rows_ms, t->step_ms);

    // JSON: the same rows, times plus unattributed equal to the step's.
    char jdir[64];
    mt_test_tmpdir(jdir, sizeof jdir);
    snprintf(json, sizeof json, "%s/prof.json", jdir);
    cr_assert_eq(mt_prof_write_json(json, "test"), 0, "%s", mt_error_get());
    size_t len = 0;
    char *text = NULL;
    cr_assert_eq(mt_read_file(json, 1 << 20, &text, &len), 0, "%s", mt_error_get());
    cJSON *root = cJSON_Parse(text);
    cr_assert_not_null(root, "%s is not JSON", json);
    cJSON *rows = cJSON_GetObjectItem(root, "rows"), *tot = cJSON_GetObjectItem(root, "totals");
    cr_assert_eq(cJSON_GetArraySize(rows), t->n);
    double jms = 0, jfl = 0;
    for (cJSON *r = rows->child; r; r = r->next)
        jms += cJSON_GetObjectItem(r, "ms")->valuedouble, jfl += cJSON_GetObjectItem(r, "flops")->valuedouble;
    double step_ms = cJSON_GetObjectItem(tot, "step_ms")->valuedouble;
    double un = cJSON_GetObjectItem(tot, "unattributed_ms")->valuedouble;
    cr_expect_leq(fabs(jms + un - step_ms), 1e-9 * step_ms, "rows %.9g + unattributed %.9g != step %.9g", jms, un, step_ms);
    cr_expect_leq(fabs(jfl - cJSON_GetObjectItem(tot, "flops")->valuedouble), 1e-9 * jfl);
    cr_expect_eq(cJSON_IsTrue(cJSON_GetObjectItem(root, "emulated")), t->emulated);
    cJSON_Delete(root);
    free(text);

    run_free(&plain), run_free(&prof);
    mt_backend_free(gpu);
    mt_test_rmrf(tmp), mt_test_rmrf(jdir);
}
