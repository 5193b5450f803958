// The whole training step on CUDA against the CPU reference: the same tiny checkpoint built on
// both backends (4-bit experts, LoRA everywhere, dropout on, a padded row), one forward and
// backward: loss and every LoRA gradient; then one AdamW step: the weights. The GPU step stores
// weights, activations and gradients in bf16 (8 bits of mantissa: one rounding is 2^-9 relative)
// where the CPU is fp32 throughout, so the tolerances are bf16's: the loss to 1e-2 relative (a
// mean over tokens, where the roundings average out; seen ~1e-3), every gradient's direction to
// cosine 0.999 (a relative L2 error of ~4% still gives 0.999; seen ~1e-2). Skips, saying why,
// in a CPU build or without a GPU (a skip is not a pass).
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "tests/gpu_or_skip.h"
#include "core/common.h"
#include "core/gemm_rows.h"
#include "model/attention_cudnn.h"
#include "model/mixtral.h"
#include "tests/test_compare.h"
#include "tests/test_util.h"
#include "optim/optim.h"
#include "optim/params.h"
#include "quant/qweight.h"
#include "trainer/options.h"


// Every LoRA B of the cpu params pc and the gpu params pg set to the same values, scale ·
// ((j · step) mod m − m/2), bf16-exact on both.
static void set_lora_b(mt_param *pc, mt_param *pg, int n, float scale, int step, int mod) {
    for (int i = 0; i < n; i++) {
        if (!strstr(pc[i].name, "lora_B")) continue;
        int64_t len = mt_tensor_numel(pc[i].w);
        float *h = mt_xmalloc((size_t)len * sizeof(float));
        uint16_t *hb = mt_xmalloc((size_t)len * sizeof(uint16_t));
        for (int64_t j = 0; j < len; j++) h[j] = mt_bf16_to_f32(mt_f32_to_bf16(scale * (float)((j * step) % mod - mod / 2)));
        mt_convert(hb, pg[i].w->dtype, h, MT_F32, (size_t)len);
        mt_tensor_upload(pc[i].w, h), mt_tensor_upload(pg[i].w, hb);
        free(h), free(hb);
    }
}

Test(cuda, whole_step_matches_cpu) {
    mt_backend *gpu = gpu_or_skip();
    char tmp[64], dir[128];
    tiny_checkpoint(tmp, dir, 5);
    mt_run_opts o;
    mt_run_opts_default(&o);
    // r = 8: w1's and w3's LoRA B fold into the experts' base GEMMs (model/experts_gpu.c
    // mt_experts_xs_extra); the family tests' r = 4 keeps them apart.
    o.mode = MT_MODE_LORA, o.lora_r = 8, o.lora_dropout = 0.1, o.targets = MT_TARGET_EXPERTS | MT_TARGET_ATTN | MT_TARGET_GATE;
    mt_backend *cpu = mt_backend_cpu_new();
    mt_model mc, mg;
    cr_assert_eq(mt_model_load(&mc, cpu, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    cr_assert_eq(mt_model_load(&mg, gpu, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    mt_param *pc, *pg;
    int n = mt_model_params(&mc, &pc);
    cr_assert_eq(mt_model_params(&mg, &pg), n);
    set_lora_b(pc, pg, n, 0.01f, 7, 13);  // B = 0 at init would leave A's gradient zero
    enum { B = 2, S = 24 };
    int32_t tokens[B * S], labels[B * S], mask[B * S];
    for (int i = 0; i < B * S; i++) {
        tokens[i] = labels[i] = 3 + (i * 29) % 200;
        mask[i] = !(i >= S && i % S >= 20);  // the second row is padded at its end
    }
    mt_batch b = {B, S, tokens, labels, mask};
    mt_model_set_dropout_seed(&mc, 11, 0, 0), mt_model_set_dropout_seed(&mg, 11, 0, 0);
    mt_loss lc, lg;
    mt_model_zero_grad(&mc), mt_model_zero_grad(&mg);
    cr_assert_eq(mt_model_forward(&mc, &b, &lc), 0);
    cr_assert_eq(mt_model_forward(&mg, &b, &lg), 0);
    cr_log_info("loss: cuda %.9g, cpu %.9g (rel. %.3g); aux: cuda %.9g, cpu %.9g", lg.loss, lc.loss,
                fabs(lg.loss - lc.loss) / fabs(lc.loss), lg.aux, lc.aux);
    cr_expect_leq(fabs(lg.loss - lc.loss), 1e-2 * fabs(lc.loss), "loss: cuda %.9g, cpu %.9g", lg.loss, lc.loss);
    cr_expect_leq(fabs(lg.aux - lc.aux), 1e-2 * fabs(lc.aux), "aux: cuda %.9g, cpu %.9g", lg.aux, lc.aux);
    cr_expect_eq(lg.tokens, lc.tokens);
    mt_model_backward(&mc), mt_model_backward(&mg);
    double worst_cos = 1, worst_l2 = 0;
    for (int i = 0; i < n; i++) {
        float *g = host_copy(pg[i].g);
        int64_t len = mt_tensor_numel(pc[i].g);
        double c = cosine(pc[i].g->data, g, len), e = rel_l2(pc[i].g->data, g, len);
        worst_cos = fmin(worst_cos, c), worst_l2 = fmax(worst_l2, e);
        cr_expect_geq(c, 0.999, "%s: gradient cosine %.6f to the cpu's (rel. L2 %.3g)", pc[i].name, c, e);
        free(g);
    }
    cr_log_info("%d LoRA gradients: worst cosine %.6f, worst rel. L2 %.3g", n, worst_cos, worst_l2);
    mt_adamw oc, og;
    cr_assert_eq(mt_adamw_init(&oc, cpu, pc, n, NULL), 0);
    cr_assert_eq(mt_adamw_init(&og, gpu, pg, n, NULL), 0, "%s", mt_error_get());
    double nc, ng;
    cr_assert_eq(mt_adamw_step(&oc, pc, n, 1e-3, 1.0, &nc), 0);
    cr_assert_eq(mt_adamw_step(&og, pg, n, 1e-3, 1.0, &ng), 0, "%s", mt_error_get());
    cr_expect_leq(fabs(ng - nc), 1e-2 * nc, "grad norm: cuda %.9g, cpu %.9g", ng, nc);
    // bf16 weights updated from their fp32 masters: one rounding each (≤ 2^-9 relative), and the
    // step itself moved by bf16 gradients: 1e-2 relative L2.
    for (int i = 0; i < n; i++) {
        float *w = host_copy(pg[i].w);
        double e = rel_l2(pc[i].w->data, w, mt_tensor_numel(pc[i].w));
        cr_expect_leq(e, 1e-2, "%s: weight after AdamW rel. L2 error %.3g", pc[i].name, e);
        free(w);
    }
    mt_adamw_free(&oc), mt_adamw_free(&og);
    mt_params_free(pc, n), mt_params_free(pg, n);
    mt_model_free(&mc), mt_model_free(&mg);
    mt_backend_free(cpu), mt_backend_free(gpu);
    mt_test_rmrf(tmp);
}

// The GPU step's fused expert MLP and its router, op by op inside a real forward: the tiny model
// with 4-bit experts and LoRA on w1, w2, w3 and the router, no recomputation (every layer keeps
// its activations), on both backends. Per layer: the router's fp32 logits and probabilities
// (from a bf16 GEMM), and per expert row the fused w1‖w3 GEMM's output gu = [g | u] against the
// CPU's separate g and u, SwiGLU's a, w2's LoRA xa (beside a: its B folds into the w2 GEMM) and
// the experts' ys. bf16's tolerance for a value a few
// roundings deep in the network: cosine 0.999 and 3e-2 relative L2 (one rounding is ≤ 2^-8; each
// layer input has been through a handful).
static void expect_close(const char *what, int L, const float *want, const float *got, int64_t n) {
    double c = cosine(want, got, n), e = rel_l2(want, got, n);
    cr_log_info("layer %d %-8s cosine %.6f rel. L2 %.3g", L, what, c, e);
    cr_expect_geq(c, 0.999, "layer %d %s: cosine %.6f", L, what, c);
    cr_expect_leq(e, 3e-2, "layer %d %s: rel. L2 %.3g", L, what, e);
}

Test(cuda, fused_experts_and_router_match_cpu) {
    mt_backend *gpu = gpu_or_skip();
    char tmp[64], dir[128];
    tiny_checkpoint(tmp, dir, 8);
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = MT_MODE_LORA, o.lora_r = 8, o.targets = MT_TARGET_EXPERTS | MT_TARGET_GATE;
    o.lora_alpha = 16;  // scale 2, not 1: the GPU step's w1, w3 LoRA B ride in its base GEMMs scaled
    o.checkpointing = MT_CKPT_NONE;
    mt_backend *cpu = mt_backend_cpu_new();
    mt_model mc, mg;
    cr_assert_eq(mt_model_load(&mc, cpu, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    cr_assert_eq(mt_model_load(&mg, gpu, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    cr_assert_not_null(mg.layers[0].w1[0].q, "the experts are 4-bit");
    mt_param *pc, *pg;
    int n = mt_model_params(&mc, &pc);
    cr_assert_eq(mt_model_params(&mg, &pg), n);
    set_lora_b(pc, pg, n, 0.02f, 5, 11);  // B ≠ 0 so that the LoRAs add something
    enum { B = 2, S = 20 };
    int32_t tokens[B * S], labels[B * S];
    for (int i = 0; i < B * S; i++) tokens[i] = labels[i] = 5 + (i * 37) % 240;
    mt_batch b = {B, S, tokens, labels, NULL};
    mt_loss lc, lg;
    cr_assert_eq(mt_model_forward(&mc, &b, &lc), 0);
    cr_assert_eq(mt_model_forward(&mg, &b, &lg), 0);
    int64_t T = B * S, E = mc.cfg.experts, f = mc.cfg.intermediate, H = mc.cfg.hidden, Tk = T * mc.cfg.top_k;
    for (int L = 0; L < mc.cfg.layers; L++) {
        mt_layer_acts *ac = &mc.acts[L], *ag = &mg.acts[L];
        float *logits = host_copy(ag->logits), *probs = host_copy(ag->probs);
        expect_close("logits", L, ac->logits->data, logits, T * E);
        expect_close("probs", L, ac->probs->data, probs, T * E);
        free(logits), free(probs);
        // The same routing on both (the tiny model's margins are wide): then rows line up.
        int32_t *ids = mt_xmalloc((size_t)Tk * sizeof(int32_t));
        mt_tensor_download(mg.kept[L].ids, ids);
        cr_assert_eq(memcmp(ids, mc.kept[L].ids->data, (size_t)Tk * sizeof(int32_t)), 0, "layer %d: the routing differs", L);
        free(ids);
        float *gu = host_copy(ag->gu), *a = host_copy(ag->a), *ys = host_copy(ag->ys);
        float *gu_cpu = mt_xmalloc((size_t)(Tk * 2 * f) * sizeof(float));
        for (int64_t r = 0; r < Tk; r++) {
            memcpy(gu_cpu + r * 2 * f, (float *)ac->g->data + r * f, (size_t)f * sizeof(float));
            memcpy(gu_cpu + r * 2 * f + f, (float *)ac->u->data + r * f, (size_t)f * sizeof(float));
        }
        expect_close("gu", L, gu_cpu, gu, Tk * 2 * f);
        // r = 8: w2's LoRA xa lives beside a in a's rows (model/experts_gpu.c mt_experts_a_extra)
        const int64_t r = o.lora_r, lda = ag->a->shape[1];
        cr_assert_eq(lda, f + r, "layer %d: a's rows hold [a | xa2]: %lld columns", L, (long long)lda);
        cr_assert_null(ag->xa_w2, "layer %d: no xa of w2's of its own", L);
        float *a_only = mt_xmalloc((size_t)(Tk * f) * sizeof(float)), *xa2 = mt_xmalloc((size_t)(Tk * r) * sizeof(float));
        for (int64_t i = 0; i < Tk; i++) {
            memcpy(a_only + i * f, a + i * lda, (size_t)f * sizeof(float));
            memcpy(xa2 + i * r, a + i * lda + f, (size_t)r * sizeof(float));
        }
        expect_close("swiglu", L, ac->a->data, a_only, Tk * f);
        expect_close("xa w2", L, ac->xa_w2->data, xa2, Tk * r);
        expect_close("ys", L, ac->ys->data, ys, Tk * H);
        free(gu), free(a), free(ys), free(gu_cpu), free(a_only), free(xa2);
    }
    mt_params_free(pc, n), mt_params_free(pg, n);
    mt_model_free(&mc), mt_model_free(&mg);
    mt_backend_free(cpu), mt_backend_free(gpu);
    mt_test_rmrf(tmp);
}

// Two AdamW steps of each of two models on batch b (dropout seeded alike), then the same losses,
// the second step's gradients and the weights after it, bit for bit (close: within bf16's
// rounding of a different order, loss 1e-4, gradients 3e-2 (as expect_close's) and weights 1e-2
// relative): `what` names the pair.
static void expect_two_steps_alike(mt_backend *gpu, mt_model m[2], mt_param *p[2], int n, const mt_batch *b,
                                   const char *what, int close) {
    float loss[2][2];
    mt_adamw opt[2];
    for (int k = 0; k < 2; k++) {
        mt_loss l;
        cr_assert_eq(mt_adamw_init(&opt[k], gpu, p[k], n, NULL), 0, "%s", mt_error_get());
        mt_model_set_dropout_seed(&m[k], 11, 0, 0);
        for (int step = 0; step < 2; step++) {
            mt_model_zero_grad(&m[k]);
            cr_assert_eq(mt_model_forward(&m[k], b, &l), 0);
            loss[k][step] = (float)l.loss;
            mt_model_backward(&m[k]);
            double norm;
            cr_assert_eq(mt_adamw_step(&opt[k], p[k], n, 1e-3, 1.0, &norm), 0, "%s", mt_error_get());
        }
    }
    for (int step = 0; step < 2; step++)
        cr_expect(close ? fabs(loss[1][step] - loss[0][step]) <= 1e-4 * fabs(loss[0][step]) : loss[1][step] == loss[0][step],
                  "%s: step %d loss %.9g against %.9g", what, step, loss[1][step], loss[0][step]);
    for (int i = 0; i < n; i++) {
        float *g0 = host_copy(p[0][i].g), *g1 = host_copy(p[1][i].g), *w0 = host_copy(p[0][i].w), *w1 = host_copy(p[1][i].w);
        int64_t len = mt_tensor_numel(p[0][i].g);
        if (close) {
            cr_expect_leq(rel_l2(g0, g1, len), 3e-2, "%s: %s: gradients rel. L2 %.3g", what, p[0][i].name, rel_l2(g0, g1, len));
            cr_expect_leq(rel_l2(w0, w1, len), 1e-2, "%s: %s: weights rel. L2 %.3g", what, p[0][i].name, rel_l2(w0, w1, len));
        } else {
            cr_expect(memcmp(g0, g1, (size_t)len * sizeof(float)) == 0, "%s: %s: gradients differ", what, p[0][i].name);
            cr_expect(memcmp(w0, w1, (size_t)len * sizeof(float)) == 0, "%s: %s: weights differ", what, p[0][i].name);
        }
        free(g0), free(g1), free(w0), free(w1);
    }
    for (int k = 0; k < 2; k++) mt_adamw_free(&opt[k]);
}

// --expert-cache: the last N MoE layers' experts dequantized once into bf16 matrices that keep
// room for the LoRAs' blocks (model/mixtral.c keep_experts) give the step the same bits as
// dequantizing them into the scratch slots at every use, over two training steps (the LoRAs' B
// and A, written beside and under the kept W at every call, move between them). r = 8 folds
// w1's, w3's and w2's B beside W and w2's A under W2 (both kinds of room in one kept W2); r = 4
// with dropout folds none; one of the two layers kept, then both (no call then holds a slot).
// An adapter loaded after the build may set another dropout (model/adapter.c): kept without room
// for A2 under W2 at dropout 0.1, then run at 0, the step leaves that fold out (the model without
// kept experts takes it) and agrees within rounding.
Test(cuda, expert_cache_gives_the_same_bits) {
    mt_backend *gpu = gpu_or_skip();
    char tmp[64], dir[128];
    tiny_checkpoint(tmp, dir, 6);
    const struct {
        int r, keep;
        double dropout, later;
    } runs[] = {{8, 2, 0.0, 0.0}, {8, 1, 0.0, 0.0}, {4, 2, 0.1, 0.1}, {8, 2, 0.1, 0.0}};
    enum { B = 2, S = 24 };
    int32_t tokens[B * S], labels[B * S];
    for (int i = 0; i < B * S; i++) tokens[i] = labels[i] = 3 + (i * 37) % 200;
    mt_batch b = {B, S, tokens, labels, NULL};
    for (size_t run = 0; run < MT_ARRAY_LEN(runs); run++) {
        mt_run_opts o;
        mt_run_opts_default(&o);
        o.mode = MT_MODE_LORA, o.lora_r = runs[run].r, o.lora_dropout = runs[run].dropout;
        o.targets = MT_TARGET_EXPERTS | MT_TARGET_GATE;
        mt_model m[2];
        mt_param *p[2];
        int n = 0;
        uint64_t base[2];
        for (int k = 0; k < 2; k++) {
            o.expert_cache = k ? runs[run].keep : 0;
            uint64_t before = gpu->ledger.cur[MT_MEM_BASE];
            cr_assert_eq(mt_model_load(&m[k], gpu, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
            base[k] = gpu->ledger.cur[MT_MEM_BASE] - before;
            n = mt_model_params(&m[k], &p[k]);
            set_lora_b(p[k], p[k], n, 0.01f, 7, 13);
            for (int L = 0; L < m[k].cfg.layers; L++)  // as an adapter's own dropout replaces the run's
                for (int e = 0; e < m[k].cfg.experts; e++) {
                    mt_linear *ex[] = {&m[k].layers[L].w1[e], &m[k].layers[L].w2[e], &m[k].layers[L].w3[e]};
                    for (int i = 0; i < 3; i++)
                        if (ex[i]->lora) ex[i]->lora->dropout = (float)runs[run].later;
                }
        }
        // The plan's bytes for the kept layers (plan/plan.c expert_cache) are the ones allocated,
        // less the 4-bit codes they gave back.
        mt_plan plan;
        o.expert_cache = runs[run].keep;
        mt_plan_opts po = mt_run_opts_plan(&o);
        po.cuda = 1;
        cr_assert_eq(mt_plan_compute(&m[0].cfg, &po, &plan), 0, "%s", mt_error_get());
        const uint64_t net = plan.expert_cache_bytes - plan.expert_cache_freed;
        cr_expect_eq(base[1] - base[0], net, "r %d, %d layers kept: %llu bytes, the plan's %llu", runs[run].r,
                     runs[run].keep, (unsigned long long)(base[1] - base[0]), (unsigned long long)net);
        cr_expect_gt(plan.expert_cache_freed, 0);
        cr_expect_gt(net, 0);
        const int top = (int)m[1].cfg.layers - 1;
        cr_expect_not_null(m[1].layers[top].experts_bf16[0], "the last layer keeps its experts");
        cr_expect(!mt_qweight_has_codes(m[1].layers[top].w2[0].q), "a kept expert's codes are given back");
        cr_expect(mt_qweight_has_codes(m[0].layers[top].w2[0].q), "without the cache they stay");
        cr_expect((runs[run].keep == 2) == (m[1].layers[0].experts_bf16[0] != NULL), "layer 0 kept only with 2");
        char what[64];
        snprintf(what, sizeof what, "r %d, %d layers kept", runs[run].r, runs[run].keep);
        // the adapter-like run: the cache-less model folds A2 under W2, the kept one cannot
        expect_two_steps_alike(gpu, m, p, n, &b, what, runs[run].later != runs[run].dropout);
        for (int k = 0; k < 2; k++) mt_params_free(p[k], n), mt_model_free(&m[k]);
    }
    mt_backend_free(gpu);
    mt_test_rmrf(tmp);
}

// The experts' offsets kept on the device (model/expert_rows.c: cuBLASLt's grouped matmul reads
// each expert's rows there) give the step the same bits as downloading them once per MoE layer's
// forward (MT_EXPERT_ROWS=host), with at most 4 host waits a step where the download takes one
// more per MoE layer, and the load log's counts arrive all the same (with the loss statistics).
// r 8 with attention's and the router's LoRAs and dropout (its masks found per row from the
// device offsets); r 16 on the experts alone with both layers' experts kept (--expert-cache). Bit for bit under the emulator (both paths' GEMMs are its reference
// arithmetic); within rounding on a GPU, where the grouped matmul's kernels are not the per-expert
// ones. A LoRA rank that is not a multiple of 8 keeps the download (16-byte rows).
Test(cuda, expert_rows_on_the_device_give_the_same_bits_in_four_waits) {
    mt_backend *gpu = gpu_or_skip();
    char tmp[64], dir[128];
    tiny_checkpoint(tmp, dir, 7);
    char why[240];
    if (!mt_gemm_rows_checked(gpu, why, sizeof why)) {  // this GPU's cuBLASLt: the download, said so
        mt_run_opts o;
        mt_run_opts_default(&o);
        mt_model m;
        cr_assert_eq(mt_model_load(&m, gpu, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
        cr_expect_eq(m.rows_mode, -1, "the offsets stay on the device where %s", why);
        cr_log_info("the offsets are downloaded here: %s", why);
        mt_model_free(&m);
        mt_backend_free(gpu);
        mt_test_rmrf(tmp);
        return;
    }
    const struct {
        int r, keep;
        unsigned targets;
        double dropout;
    } runs[] = {{8, 0, MT_TARGET_EXPERTS | MT_TARGET_GATE | MT_TARGET_ATTN, 0.1}, {16, 2, MT_TARGET_EXPERTS, 0.0}};
    enum { B = 2, S = 24 };
    int32_t tokens[B * S], labels[B * S];
    for (int i = 0; i < B * S; i++) tokens[i] = labels[i] = 3 + (i * 41) % 200;
    mt_batch b = {B, S, tokens, labels, NULL};
    for (size_t run = 0; run < MT_ARRAY_LEN(runs); run++) {
        mt_run_opts o;
        mt_run_opts_default(&o);
        o.mode = MT_MODE_LORA, o.lora_r = runs[run].r, o.lora_dropout = runs[run].dropout, o.targets = runs[run].targets;
        o.expert_cache = runs[run].keep;
        mt_model m[2];
        mt_param *p[2];
        int n = 0;
        for (int k = 0; k < 2; k++) {  // m[0] downloads the offsets, m[1] keeps them on the device
            setenv("MT_EXPERT_ROWS", k ? "device" : "host", 1);
            cr_assert_eq(mt_model_load(&m[k], gpu, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
            unsetenv("MT_EXPERT_ROWS");
            cr_assert_eq(m[k].rows_mode, k ? 1 : -1);
            n = mt_model_params(&m[k], &p[k]);
            set_lora_b(p[k], p[k], n, 0.01f, 7, 13);
        }
        char what[64];
        snprintf(what, sizeof what, "r %d, %d layers kept", runs[run].r, runs[run].keep);
        expect_two_steps_alike(gpu, m, p, n, &b, what, !attention_cudnn_emulated());
        uint64_t waits[2];
        for (int k = 0; k < 2; k++) {  // a third forward and backward: their host waits
            mt_loss l;
            uint64_t w0 = gpu->host_syncs;
            mt_model_zero_grad(&m[k]);
            cr_assert_eq(mt_model_forward(&m[k], &b, &l), 0);
            mt_model_backward(&m[k]);
            waits[k] = gpu->host_syncs - w0;
        }
        const uint64_t moe = (uint64_t)mt_config_moe_layers(&m[0].cfg);
        cr_expect_leq(waits[1], 4, "%s: %llu host waits with the offsets on the device", what, (unsigned long long)waits[1]);
        cr_expect_eq(waits[0], waits[1] + moe, "%s: %llu host waits downloading the offsets, %llu kept on the device, "
                     "%llu MoE layers", what, (unsigned long long)waits[0], (unsigned long long)waits[1],
                     (unsigned long long)moe);
        for (int L = 0; L < m[0].cfg.layers; L++) {
            cr_expect(m[1].kept[L].rows_on_device && !m[0].kept[L].rows_on_device, "%s: layer %d", what, L);
            cr_expect(memcmp(m[0].kept[L].counts, m[1].kept[L].counts, (size_t)m[0].cfg.experts * sizeof(int32_t)) == 0,
                      "%s: layer %d's expert counts differ", what, L);
        }
        for (int k = 0; k < 2; k++) mt_params_free(p[k], n), mt_model_free(&m[k]);
    }
    mt_run_opts o;  // r 4: rows 8 bytes apart in xa and dxa
    mt_run_opts_default(&o);
    o.mode = MT_MODE_LORA, o.lora_r = 4, o.lora_dropout = 0.0, o.targets = MT_TARGET_EXPERTS;
    mt_model m4;
    cr_assert_eq(mt_model_load(&m4, gpu, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    mt_loss l;
    cr_assert_eq(mt_model_forward(&m4, &b, &l), 0);
    for (int L = 0; L < m4.cfg.layers; L++) cr_expect(!m4.kept[L].rows_on_device, "r 4: layer %d kept its rows on the device", L);
    mt_model_free(&m4);
    mt_backend_free(gpu);
    mt_test_rmrf(tmp);
}

// --dequant-cache: the 4-bit weights outside the experts (attention's here) dequantized once at
// load and kept in bf16 give the step the same bits as dequantizing them at every use (the same
// kernel on the same codes), with their bf16 bytes in base instead of a shared scratch in work.
Test(cuda, dequant_cache_gives_the_same_bits) {
    mt_backend *gpu = gpu_or_skip();
    char tmp[64], dir[128];
    tiny_checkpoint(tmp, dir, 5);
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = MT_MODE_LORA, o.lora_r = 8, o.targets = MT_TARGET_EXPERTS | MT_TARGET_ATTN | MT_TARGET_GATE;
    mt_model m[2];
    mt_param *p[2];
    int n = 0;
    uint64_t base[2];
    enum { B = 2, S = 24 };
    int32_t tokens[B * S], labels[B * S];
    for (int i = 0; i < B * S; i++) tokens[i] = labels[i] = 3 + (i * 31) % 200;
    mt_batch b = {B, S, tokens, labels, NULL};
    for (int k = 0; k < 2; k++) {
        o.dequant_cache = k ? MT_DEQUANT_CACHE_ON : MT_DEQUANT_CACHE_OFF;
        uint64_t before = gpu->ledger.cur[MT_MEM_BASE];
        cr_assert_eq(mt_model_load(&m[k], gpu, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
        base[k] = gpu->ledger.cur[MT_MEM_BASE] - before;
        n = mt_model_params(&m[k], &p[k]);
        set_lora_b(p[k], p[k], n, 0.01f, 7, 13);  // the gpu's own params twice: the same values on both
    }
    const mt_model_config *c = &m[0].cfg;
    int64_t attn = c->hidden * (c->heads * c->head_dim) * 2 + c->hidden * (c->kv_heads * c->head_dim) * 2;
    cr_expect_eq(base[1] - base[0], (uint64_t)(2 * c->layers * attn), "the copies: %llu bytes of base",
                 (unsigned long long)(base[1] - base[0]));
    cr_expect_null(m[1].dequant, "no shared dequantization scratch beside the copies");
    expect_two_steps_alike(gpu, m, p, n, &b, "kept copies against dequantized per use", 0);
    for (int k = 0; k < 2; k++) mt_params_free(p[k], n), mt_model_free(&m[k]);
    mt_backend_free(gpu);
    mt_test_rmrf(tmp);
}
