// The fused, chunked lm_head + cross-entropy (model/loss.c): logits [T, V] never exist whole.
// On the cpu the chunked loss equals the unchunked one to fp32 rounding, and both equal the
// cross-entropy of the whole logits; on cuda (CPU-emulated under `make SIM=1`) the chunked step
// matches the cpu's to bf16 tolerance; on the null backend the loss's scratch stays under
// 256 MB while T·V grows to Mixtral's V at 16k tokens and beyond.
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/common.h"
#include "model/config.h"
#include "model/mixtral.h"
#include "model/ops.h"
#include "optim/params.h"
#include "tests/gpu_or_skip.h"
#include "tests/test_compare.h"
#include "tests/test_util.h"
#include "trainer/options.h"

enum { B = 2, S = 24, T = B * S };

// Two rows, the second padded at its end, and a stretch of the second without labels: with
// 5-row chunks, chunks [30, 35) and [35, 40) have no counted target (skipped), others some.
static mt_batch test_batch(int32_t *tokens, int32_t *labels, int32_t *mask) {
    for (int i = 0; i < T; i++) {
        tokens[i] = labels[i] = 3 + (i * 29) % 200;
        mask[i] = !(i >= S && i % S >= 20);
        if (i >= 30 && i <= 41) labels[i] = -100;
    }
    return (mt_batch){B, S, tokens, labels, mask};
}

// Full mode: the lm_head itself trains, so its dW is one of the gradients compared.
static void full_opts(mt_run_opts *o) {
    mt_run_opts_default(o);
    o->mode = MT_MODE_FULL, o->quant = MT_QUANT_NONE;
}

// One forward and backward with `chunk` loss rows (0: the default, one chunk for T = 48).
static mt_loss step(mt_model *m, const mt_batch *b, int64_t chunk) {
    m->loss_chunk_rows = chunk;
    mt_loss l;
    mt_model_zero_grad(m);
    cr_assert_eq(mt_model_forward(m, b, &l), 0, "%s", mt_error_get());
    mt_model_backward(m);
    return l;
}

// Every gradient of the params as host f32, concatenated.
static float *all_grads(mt_param *p, int n, int64_t *len) {
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += mt_tensor_numel(p[i].g);
    float *g = mt_xmalloc((size_t)total * sizeof(float));
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        float *h = host_copy(p[i].g);
        memcpy(g + off, h, (size_t)mt_tensor_numel(p[i].g) * sizeof(float));
        off += mt_tensor_numel(p[i].g);
        free(h);
    }
    *len = total;
    return g;
}

// The chunked loss (5-row chunks, the last one partial, two skipped) against one chunk and
// against cross_entropy_cpu over the whole logits: the loss to 1e-5 relative (fp32 logits, double
// sums: only the GEMM's blocking and the sums' grouping differ), every gradient to 1e-5 relative
// L2 (fp32 GEMMs over other row blocks).
Test(loss, chunked_equals_unchunked_on_cpu) {
    char tmp[64], dir[128];
    tiny_checkpoint(tmp, dir, 3);
    mt_run_opts o;
    full_opts(&o);
    mt_backend *cpu = mt_backend_cpu_new();
    mt_model m;
    cr_assert_eq(mt_model_load(&m, cpu, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    mt_param *p;
    int n = mt_model_params(&m, &p);
    int32_t tokens[T], labels[T], mask[T];
    mt_batch b = test_batch(tokens, labels, mask);
    int64_t len;
    cr_assert_eq(mt_loss_chunk_rows(&m, T), T, "V = 256: the default is one chunk here");
    mt_loss whole = step(&m, &b, 0);
    float *g_whole = all_grads(p, n, &len);
    // the whole logits, once, and the loss of the plain cross-entropy over them
    int V = (int)m.cfg.vocab;
    float *logits = mt_xmalloc((size_t)T * V * sizeof(float));
    cr_assert_eq(mt_model_logits(&m, 0, T, logits), 0, "%s", mt_error_get());
    int64_t count;
    double ref = cross_entropy_cpu(NULL, 0, &count, logits, m.targets, T, V, -100) / (double)count;
    mt_loss chunked = step(&m, &b, 5);
    float *g_chunked = all_grads(p, n, &len);
    cr_expect_eq(chunked.tokens, count);
    cr_expect_eq(whole.tokens, count);
    cr_expect_leq(fabs(chunked.ce - ref), 1e-5 * ref, "chunked ce %.9g, cross_entropy_cpu %.9g", chunked.ce, ref);
    cr_expect_leq(fabs(whole.ce - ref), 1e-5 * ref, "one-chunk ce %.9g, cross_entropy_cpu %.9g", whole.ce, ref);
    double e = rel_l2(g_whole, g_chunked, len);
    cr_log_info("cpu: ce chunked %.9g, whole %.9g, reference %.9g; gradients rel. L2 %.3g", chunked.ce, whole.ce,
                ref, e);
    cr_expect_leq(e, 1e-5, "gradients: chunked against one chunk, rel. L2 %.3g", e);
    // the lm_head's own gradient is among those compared, and not zero
    double dw = 0;
    for (int64_t i = 0; i < mt_tensor_numel(m.lm_head.dw); i++) dw += fabs(((float *)m.lm_head.dw->data)[i]);
    cr_expect_gt(dw, 0, "lm_head trains in full mode");
    free(logits), free(g_whole), free(g_chunked);
    mt_params_free(p, n);
    mt_model_free(&m);
    mt_backend_free(cpu);
}

// The cuda step with 5-row chunks against the cpu's unchunked one: the tolerances of the GPU
// step (tests/test_cuda_step.c): the loss to 1e-2 relative, each gradient to cosine 0.999. Against
// its own one-chunk step: the loss to 1e-5 (the same bf16 logits row by row, fp32 softmax, double
// sums) and the same number of host waits (one for the loss, whatever the chunks).
Test(loss, cuda_chunked_matches_cpu) {
    mt_backend *gpu = gpu_or_skip();
    char tmp[64], dir[128];
    tiny_checkpoint(tmp, dir, 3);
    mt_run_opts o;
    full_opts(&o);
    mt_backend *cpu = mt_backend_cpu_new();
    mt_model mc, mg;
    cr_assert_eq(mt_model_load(&mc, cpu, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    cr_assert_eq(mt_model_load(&mg, gpu, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    mt_param *pc, *pg;
    int n = mt_model_params(&mc, &pc);
    cr_assert_eq(mt_model_params(&mg, &pg), n);
    int32_t tokens[T], labels[T], mask[T];
    mt_batch b = test_batch(tokens, labels, mask);
    mt_loss lc = step(&mc, &b, 0);
    uint64_t w0 = gpu->host_syncs;  // after the load (its first-use checks wait: model/expert_rows.c)
    mt_loss lg1 = step(&mg, &b, 0);
    uint64_t waits_one = gpu->host_syncs - w0;
    mt_loss lg = step(&mg, &b, 5);
    uint64_t waits_five = gpu->host_syncs - w0 - waits_one;
    // the chunks' losses are summed on the device: as many host waits as with one chunk
    cr_expect_eq(waits_five, waits_one, "host waits of a step: %llu with 5-row chunks, %llu with one chunk",
                 (unsigned long long)waits_five, (unsigned long long)waits_one);
    cr_expect_leq(fabs(lg.ce - lg1.ce), 1e-5 * lg1.ce, "cuda ce: 5-row chunks %.9g, one chunk %.9g", lg.ce, lg1.ce);
    cr_log_info("ce: cuda (5-row chunks) %.9g, cpu (one chunk) %.9g", lg.ce, lc.ce);
    cr_expect_leq(fabs(lg.ce - lc.ce), 1e-2 * lc.ce, "ce: cuda %.9g, cpu %.9g", lg.ce, lc.ce);
    cr_expect_eq(lg.tokens, lc.tokens);
    double worst = 1;
    const char *worst_name = "";
    for (int i = 0; i < n; i++) {
        float *g = host_copy(pg[i].g);
        int64_t len = mt_tensor_numel(pc[i].g);
        double c = cosine(pc[i].g->data, g, len);
        cr_expect_geq(c, 0.999, "%s: gradient cosine %.6f to the cpu's (rel. L2 %.3g)", pc[i].name, c,
                      rel_l2(pc[i].g->data, g, len));
        if (c < worst) worst = c, worst_name = pc[i].name;
        if (strcmp(pc[i].name, "lm_head.weight") == 0)
            cr_log_info("lm_head.weight gradient: cosine %.6f, rel. L2 %.3g", c, rel_l2(pc[i].g->data, g, len));
        free(g);
    }
    cr_log_info("%d gradients: worst cosine %.6f (%s)", n, worst, worst_name);
    // the logits of a forward, as the cpu computes them (bf16 GEMM: 1e-2 relative L2)
    int V = (int)mc.cfg.vocab;
    float *a = mt_xmalloc((size_t)T * V * sizeof(float)), *c = mt_xmalloc((size_t)T * V * sizeof(float));
    cr_assert_eq(mt_model_logits(&mc, 0, T, a), 0);
    cr_assert_eq(mt_model_logits(&mg, 0, T, c), 0, "%s", mt_error_get());
    cr_expect_leq(rel_l2(a, c, (int64_t)T * V), 1e-2, "logits rel. L2 %.3g", rel_l2(a, c, (int64_t)T * V));
    free(a), free(c);
    mt_params_free(pc, n), mt_params_free(pg, n);
    mt_model_free(&mc), mt_model_free(&mg);
    mt_backend_free(cpu), mt_backend_free(gpu);
}

// The loss's scratch on the null backend (the GPU step's allocations, counted): the peak of
// `work` over the forward and the backward's loss pass stays under 256 MB while T·V grows to
// 32k tokens at Mixtral's V (the old whole fp32 logits: 4.2 GB there), and `act` holds nothing
// of size T·V.
Test(loss, scratch_bounded_as_t_times_v_grows) {
    char path[1024];
    snprintf(path, sizeof path, "%s/configs/tiny.json", MT_REPO_ROOT);
    mt_model_config cfg;
    cr_assert_eq(mt_model_config_load(path, &cfg), 0, "%s", mt_error_get());
    cfg.vocab = 32000, cfg.max_positions = 1 << 16;
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = MT_MODE_FULL, o.quant = MT_QUANT_NONE;  // a trainable lm_head: dW beside dxf
    static const int seqs[] = {1024, 4096, 16384, 32768};
    uint64_t last = 0;
    for (size_t i = 0; i < MT_ARRAY_LEN(seqs); i++) {
        int s = seqs[i];
        mt_backend *be = mt_backend_null_new();
        mt_model m;
        cr_assert_eq(mt_model_build(&m, be, &cfg, NULL, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
        int32_t *tok = mt_xcalloc((size_t)s, sizeof(int32_t)), *lab = mt_xcalloc((size_t)s, sizeof(int32_t));
        mt_batch b = {1, s, tok, lab, NULL};
        mt_loss l;
        mt_model_zero_grad(&m);
        uint64_t work0 = be->ledger.cur[MT_MEM_WORK];
        mt_ledger_reset_peak(&be->ledger);
        cr_assert_eq(mt_model_forward(&m, &b, &l), 0, "%s", mt_error_get());
        mt_model_backward(&m);
        uint64_t work = be->ledger.peak[MT_MEM_WORK] - work0, act = be->ledger.peak[MT_MEM_ACT];
        uint64_t tv = (uint64_t)s * (uint64_t)cfg.vocab, chunk = 4 * (uint64_t)mt_loss_chunk_rows(&m, s) * cfg.vocab;
        cr_log_info("T = %5d, V = 32000: work peak %.1f MB (the loss's fp32 chunk %.1f MB), act %.1f MB; "
                    "whole fp32 logits would be %.1f MB", s, work / 1e6, chunk / 1e6, act / 1e6, 4 * tv / 1e6);
        cr_expect_leq(work, (uint64_t)256000000, "T = %d: work peak %llu bytes over 256 MB", s, (unsigned long long)work);
        cr_expect_geq(work, chunk, "T = %d: the loss's chunk is counted", s);
        cr_expect_lt(act, 4 * tv, "T = %d: act %llu holds no [T, V] fp32", s, (unsigned long long)act);
        if (s >= 4096) cr_expect_eq(chunk, 4 * 1048 * (uint64_t)cfg.vocab, "T = %d: 1048 rows at V = 32000", s);
        cr_expect_geq(work, last, "grows at most by the layers' scratch");
        last = work;
        free(tok), free(lab);
        mt_model_free(&m);
        mt_backend_free(be);
    }
}

// A training forward (mt_model_forward_train) makes the hidden states' gradient in the loss's own
// pass, unscaled, and the backward scales it; an evaluation forward leaves the backward to
// recompute the logits. Both give the same gradients: on the cpu to 1e-6 relative L2 (the 1/count
// scale applied after the GEMM instead of before it), on cuda (bf16, CPU-emulated) to cosine
// 0.9999 (two roundings of dxf instead of one). LoRA on the experts and router, frozen lm_head,
// 5-row chunks (two of them skipped), padding, on both backends it runs.
static void early_equals_recomputed(mt_backend *be, double tol_l2, double min_cos) {
    char tmp[64], dir[128];
    tiny_checkpoint(tmp, dir, 4);
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = MT_MODE_LORA, o.lora_r = 4, o.targets = MT_TARGET_EXPERTS | MT_TARGET_GATE | MT_TARGET_ATTN;
    mt_model m;
    cr_assert_eq(mt_model_load(&m, be, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    mt_param *p;
    int n = mt_model_params(&m, &p);
    for (int i = 0; i < n; i++)  // B = 0 at init would leave the gradients of A zero
        if (strstr(p[i].name, "lora_B")) {
            int64_t len = mt_tensor_numel(p[i].w);
            float *h = mt_xmalloc((size_t)len * sizeof(float));
            for (int64_t j = 0; j < len; j++) h[j] = 0.01f * (float)((j * 7) % 13 - 6);
            mt_tensor_upload_f32(p[i].w, h);
            free(h);
        }
    int32_t tokens[T], labels[T], mask[T];
    mt_batch b = test_batch(tokens, labels, mask);
    m.loss_chunk_rows = 5;
    mt_loss l1, l2;
    int64_t len;
    mt_model_zero_grad(&m);
    cr_assert_eq(mt_model_forward(&m, &b, &l1), 0);
    mt_model_backward(&m);
    float *recomputed = all_grads(p, n, &len);
    mt_model_zero_grad(&m);
    cr_assert_eq(mt_model_forward_train(&m, &b, &l2), 0);
    cr_assert_not_null(m.dxf_early, "a training forward with a frozen lm_head makes the gradient early");
    mt_model_backward(&m);
    cr_expect_null(m.dxf_early, "the backward releases it");
    float *early = all_grads(p, n, &len);
    cr_expect_eq(l1.loss, l2.loss, "the loss is the loss: %.9g vs %.9g", l1.loss, l2.loss);
    double e = rel_l2(recomputed, early, len), c = cosine(recomputed, early, len);
    cr_log_info("%s: early vs recomputed gradients: rel. L2 %.3g, cosine %.7f", be->ops->name, e, c);
    cr_expect_leq(e, tol_l2, "%s: rel. L2 %.3g", be->ops->name, e);
    cr_expect_geq(c, min_cos, "%s: cosine %.7f", be->ops->name, c);
    free(recomputed), free(early);
    mt_params_free(p, n);
    mt_model_free(&m);
    mt_test_rmrf(tmp);
}

Test(loss, gradient_in_the_training_forward_on_cpu) {
    mt_backend *cpu = mt_backend_cpu_new();
    early_equals_recomputed(cpu, 1e-6, 0.999999);
    mt_backend_free(cpu);
}

Test(loss, gradient_in_the_training_forward_on_cuda) {
    mt_backend *gpu = gpu_or_skip();
    early_equals_recomputed(gpu, 3e-2, 0.9999);
    mt_backend_free(gpu);
}
