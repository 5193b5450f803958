// The whole training step of each non-Mixtral family on CUDA against the CPU reference
// (docs/families.md): Qwen2-MoE (q/k/v biases, the shared expert and its sigmoid gate, dense
// layers, norm_topk_prob false), Qwen3-MoE (per-head q/k RMSNorm, a dense layer, q/k/v/o biases),
// OLMoE (whole-projection q/k RMSNorm, clip_qkv that cuts, q/k/v/o biases, norm_topk_prob
// false) and gpt-oss (router and expert biases, the clamped SwiGLU cutting, attention sinks,
// sliding/full layers, YaRN; also with MXFP4 experts) and the DeepSeek-style families (grouped
// routing with a score bias, shared experts, a dense first layer, MLA; GLM-4.5), each from its
// tiny config, with and without recomputation. LoRA on every target
// (attention, router, experts, and so the shared expert's and dense MLPs' projections): the loss
// and every LoRA gradient; --mode full: every weight's gradient, biases and q/k norms included;
// --mode unfreeze: two dense experts training among 4-bit frozen ones in the same grouped
// launches. Qwen3-MoE with 32 experts too (many without rows), and the device ops of a step
// counted for 4 and 32 experts (the experts' grouped launches, model/experts_gpu.c).
// Tolerances are bf16's, as tests/test_cuda_step.c explains: loss 1e-2 relative, gradients
// cosine 0.999 and rel. L2 0.1 (behind_clamp below for clip_qkv's). CF_PRINT=1 prints every
// gradient's figures. Skips, saying why, in a CPU build or without a GPU.
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "tests/gpu_or_skip.h"
#include "core/common.h"
#include "model/config.h"
#include "model/expert_scratch.h"  // MT_GROUPED_MAX
#include "model/mixtral.h"
#include "model/model_internal.h"
#include "moe/moe.h"
#include "tests/test_compare.h"
#include "tests/test_util.h"
#include "optim/params.h"
#include "quant/qweight.h"
#include "quant/quant.h"
#include "trainer/options.h"

#define CONFIGS MT_REPO_ROOT "/configs/"

// Uploads h (n f32 values) into t in t's dtype, and frees h.
static void upload_f32(mt_tensor *t, float *h, int64_t n) {
    void *d = mt_xmalloc((size_t)n * 4);
    mt_convert(d, t->dtype, h, MT_F32, (size_t)n);
    mt_tensor_upload(t, d);
    free(h), free(d);
}

// t (f32 on the cpu, bf16 on cuda) = base + amp · sin(7j + salt), rounded to bf16 so that both
// backends hold the same values.
static void fill(mt_tensor *t, float base, float amp, int salt) {
    if (!t) return;
    int64_t n = mt_tensor_numel(t);
    float *h = mt_xmalloc((size_t)n * sizeof(float));
    for (int64_t j = 0; j < n; j++) h[j] = mt_bf16_to_f32(mt_f32_to_bf16(base + amp * sinf((float)(7 * j + salt))));
    upload_f32(t, h, n);
}

// t = uniform in [-amp, amp] from a hash of (salt, j), bf16-rounded: rows that differ everywhere.
// fill's sine shifts each row of a [E, 44] router by only 0.09 rad (44·7 mod 2π), so with many
// experts neighbours are near twins and their logits near ties that bf16 breaks either way.
static void fill_hashed(mt_tensor *t, float amp, int salt) {
    int64_t n = mt_tensor_numel(t);
    float *h = mt_xmalloc((size_t)n * sizeof(float));
    for (int64_t j = 0; j < n; j++) {
        uint64_t z = (uint64_t)salt * 0x9e3779b97f4a7c15ull + (uint64_t)(j + 1) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 31)) * 0x94d049bb133111ebull, z ^= z >> 29;
        h[j] = mt_bf16_to_f32(mt_f32_to_bf16(amp * (2.0f * (float)(z >> 40) / 16777216.0f - 1.0f)));
    }
    upload_f32(t, h, n);
}

// gpt-oss's gate and up biases [E, f]: −2.5, 0 or 2.5 by column, ± 0.2. The projections add
// at most ~±0.5 here, so the clamped SwiGLU (limit 1.4) cuts g in a third of the columns and u
// in two thirds (half of all values; the test wants over a tenth), and no value comes near
// ±limit: there bf16's rounding of g or u (2^-7 at 1.4) would cut an element on one backend
// only, and with an expert's few rows one such element moves its LoRA gradients far (seen:
// cosine 0.75 with biases spread evenly over ±2). The ops tests cuda/op_swiglu_clamped_* check
// values exactly at and around ±limit.
static void fill_clamp_bands(mt_tensor *t, int salt) {
    if (!t) return;
    int64_t n = mt_tensor_numel(t);
    float *h = mt_xmalloc((size_t)n * sizeof(float));
    for (int64_t j = 0; j < n; j++) {
        float band = 2.5f * (float)((j + salt) % 3 - 1);
        h[j] = mt_bf16_to_f32(mt_f32_to_bf16(band + 0.2f * sinf((float)(7 * j + salt))));
    }
    upload_f32(t, h, n);
}

// The parts init leaves at 0 or 1 (biases, q/k norm weights) set away from them, and every LoRA
// B non-zero (B = 0 would leave A's gradient zero). Biases stay small beside q and k (~0.1 here):
// a large k bias, common to every key, cancels in dq (softmax rows sum to zero) and leaves only
// bf16's rounding of k (seen with 0.2: cosine 0.9990 for a q_proj LoRA B).
// gpt-oss's parts too: its sinks (a logit per head, ~1), its router bias, and its expert biases
// (fill_clamp_bands: the clamped SwiGLU cuts g and u often, never near its limit).
static void set_parts(mt_model *m, mt_param *p, int n) {
    for (int L = 0; L < m->cfg.layers; L++) {
        mt_layer *ly = &m->layers[L];
        for (int i = 0; i < 4; i++) fill(ly->bias[i], 0.0f, 0.05f, 3 * L + i);
        fill(ly->sinks, 0.0f, 1.0f, L + 23), fill(ly->gate_bias, 0.0f, 0.15f, L + 29);
        fill_clamp_bands(ly->ebias[0], L), fill(ly->ebias[1], 0.0f, 0.1f, L + 31), fill_clamp_bands(ly->ebias[2], L + 1);
        fill(ly->qn, 1.0f, 0.3f, L + 11), fill(ly->kn, 1.0f, 0.3f, L + 13);
        // gpt-oss (a router bias): logits of ~±2 plus the bias's ±0.15, so the softmax is not
        // saturated. A saturated router's gradient is a small difference of nearly equal terms,
        // which bf16's rounding of ys (in dweights = dy·ys) moves by percents: 0.98 for the router
        // bias's gradient (Σ_t dlogits, near zero) with amplitude 1.6/√H and other salts.
        float amp = ly->gate_bias ? 0.8f / sqrtf((float)m->cfg.hidden) : 0.5f;
        if (!ly->dense && m->cfg.experts <= 9) fill(ly->gate.w, 0.0f, amp, L + 17);  // wide routing margins
        else if (!ly->dense) fill_hashed(ly->gate.w, 1.0f, L + 17);
        if (ly->shared_gate.w) fill(ly->shared_gate.w, 0.0f, 0.5f, L + 19);  // s from ~0.1 to ~0.9
    }
    for (int i = 0; i < n; i++)
        if (strstr(p[i].name, "lora_B")) fill(p[i].w, 0.0f, 0.02f, i);
}

// configs/NAME with `edit` applied, written by `moetrain init` into tmp/NAME (dir).
static void family_checkpoint(const char *tmp, const char *name, void (*edit)(mt_model_config *), char *dir) {
    mt_model_config c;
    char src[512], cfg[512], out[8192];
    snprintf(src, sizeof src, CONFIGS "%s", name);
    cr_assert_eq(mt_model_config_load(src, &c), 0, "%s", mt_error_get());
    if (edit) edit(&c);
    snprintf(cfg, sizeof cfg, "%s/%s", tmp, name);
    cr_assert_eq(mt_model_config_write(&c, cfg), 0, "%s", mt_error_get());
    snprintf(dir, 512, "%s/%s.d", tmp, name);
    cr_assert_eq(mt_test_run(out, sizeof out, "init --config %s --out %s --seed 5", cfg, dir), 0, "%s", out);
}

static void qwen3_biases(mt_model_config *c) { c->qkv_bias = c->o_bias = 1; }
static void olmoe_clip_biases(mt_model_config *c) { c->clip_qkv = 0.9, c->qkv_bias = c->o_bias = 1; }

// Whether a trainable's gradient passes through clip_qkv's clamp (q/k/v_proj and their LoRA and
// biases, the q/k norms). There a value within bf16's rounding of ±clip is cut on one backend and
// not on the other, and each such element passes or stops its whole gradient: those get cosine
// 0.95 and rel. L2 0.3 (seen: 0.977 and 0.22 at worst; with the clamp's backward left out,
// 0.24 and 2). Everything else: cosine 0.999 and, since a cosine misses a wrong scale (a missing
// sigmoid, a lost factor), rel. L2 0.1 (seen: 0.05 at worst).
static int behind_clamp(const mt_model_config *c, const char *name) {
    const char *behind[] = {"q_proj", "k_proj", "v_proj", "q_norm", "k_norm"};
    for (size_t i = 0; c->clip_qkv > 0 && i < MT_ARRAY_LEN(behind); i++)
        if (strstr(name, behind[i])) return 1;
    return 0;
}

// The share of layer 0's expert g and u values (the CPU's, biases added) that the clamped
// SwiGLU's limit cuts: g above it, u outside ±limit.
static double clamped_share(const mt_model *m) {
    const mt_layer_acts *a = &m->acts[0];
    const float *g = a->g->data, *u = a->u->data, lim = (float)m->cfg.swiglu_limit;
    int64_t n = m->B * m->S * m->cfg.top_k * m->cfg.intermediate, cut = 0;
    for (int64_t j = 0; j < n; j++) cut += (g[j] > lim) + (u[j] > lim || u[j] < -lim);
    return (double)cut / (double)(2 * n);
}

// Whether id is among a token's k choices.
static int chosen(const int32_t *choices, int k, int32_t id) {
    for (int i = 0; i < k; i++)
        if (choices[i] == id) return 1;
    return 0;
}

// How many tokens of MoE layer L the GPU model g sends to the same set of experts as: the cpu
// model c (logits NULL), or the grouped router's rule on g's own router logits of L (with c's
// score bias; the cpu's rule, moe/router_grouped.c).
static int same_choices(const mt_model *c, const mt_model *g, int L, const mt_tensor *logits) {
    int T = c->B * c->S, k = (int)c->cfg.top_k, E = (int)c->cfg.experts, same = 0;
    int32_t *ids = mt_xmalloc((size_t)T * k * sizeof(int32_t)), *want = mt_xmalloc((size_t)T * k * sizeof(int32_t));
    mt_tensor_download(g->kept[L].ids, ids);
    if (!logits) memcpy(want, c->kept[L].ids->data, (size_t)T * k * sizeof(int32_t));
    else {
        float *lg = host_copy(logits), *w = mt_xmalloc((size_t)T * k * sizeof(float));
        float *scores = mt_xmalloc((size_t)T * E * sizeof(float));
        const mt_tensor *bias = c->layers[L].score_bias;
        router_grouped_forward_cpu(want, w, scores, lg, bias ? bias->data : NULL, T, E, k, route_rule(c));
        free(lg), free(w), free(scores);
    }
    for (int t = 0; t < T; t++) {
        int all = 1;
        for (int j = 0; j < k; j++) all &= chosen(ids + t * k, k, want[t * k + j]);
        same += all;
    }
    free(ids), free(want);
    return same;
}

// The gradient cosine an expert's and any other trainable's gradient must reach, and the rel. L2
// none may pass, where no clamp cuts; tests/test_cuda_step.c says why these are bf16's.
typedef struct {
    double cos, cos_expert, rel_l2, rel_l2_expert;
} grad_tol;
static const grad_tol BF16_TOL = {0.999, 0.998, 0.1, 0.1};

// One forward and backward of the checkpoint at dir on both backends; the loss and every
// trainable's gradient compared. quant: the frozen experts' format (MT_QUANT_MXFP4: quantized on
// load, or an MXFP4 checkpoint's kept as stored); -1: the run's default (NF4). lora_experts: the
// experts LoRA adapts (an --experts list), NULL for all. r: the LoRA rank (4: no B folds into the
// experts' base GEMMs, model/experts_gpu.c; 8: every fold where h and f are multiples of 8).
static void step_matches_cpu_q(const char *dir, mt_mode mode, mt_ckpt ckpt, int quant, grad_tol tol,
                               const char *lora_experts, int r) {
    mt_backend *gpu = gpu_or_skip();
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = mode, o.lora_r = r, o.checkpointing = ckpt;
    o.targets = MT_TARGET_EXPERTS | MT_TARGET_ATTN | MT_TARGET_GATE;
    if (quant >= 0) o.quant = (mt_quant)quant, o.quant_targets = MT_QTARGET_EXPERTS;
    if (mode == MT_MODE_FULL) o.quant = MT_QUANT_NONE;
    if (mode == MT_MODE_UNFREEZE)  // experts 0 and 1 train dense beside 4-bit frozen ones in a layer
        cr_assert(mt_index_set_parse(&o.layers, "0,2") == 0 && mt_index_set_parse(&o.experts, "0,1") == 0);
    if (lora_experts) cr_assert(mt_index_set_parse(&o.experts, lora_experts) == 0);
    mt_backend *cpu = mt_backend_cpu_new();
    uint64_t dev0 = gpu->ledger.total_cur;  // the backend's own (cuBLASLt workspace)
    mt_model mc, mg;
    cr_assert_eq(mt_model_load(&mc, cpu, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    cr_assert_eq(mt_model_load(&mg, gpu, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s: %s", dir, mt_error_get());
    if (r == 8) {  // the tiny Mixtral's h and f are multiples of 8: every fold on, and w1's and w3's A paired
        cr_expect(mt_experts_xs_extra(&mg) && mt_experts_a_extra(&mg), "%s: r 8 folds B beside W", dir);
        cr_expect(mt_lora_pair_adjacent(mg.layers[0].w1[0].lora, mg.layers[0].w3[0].lora), "%s: [A1; A3] one matrix", dir);
        cr_expect(!mt_lora_pair_adjacent(mc.layers[0].w1[0].lora, mc.layers[0].w3[0].lora), "%s: not on the cpu", dir);
    }
    if (quant == MT_QUANT_MXFP4)  // the GPU step keeps its experts in MXFP4
        cr_assert(mg.layers[0].w1[0].q && mg.layers[0].w1[0].q->type == MT_QUANT_MXFP4, "%s: MXFP4 experts", dir);
    mt_param *pc, *pg;
    int n = mt_model_params(&mc, &pc);
    cr_assert_eq(mt_model_params(&mg, &pg), n);
    set_parts(&mc, pc, n), set_parts(&mg, pg, n);
    enum { B = 2, S = 13 };
    int32_t tokens[B * S], labels[B * S], mask[B * S];
    for (int i = 0; i < B * S; i++) {
        tokens[i] = labels[i] = 3 + (i * 29) % (int)MT_MIN(200, mc.cfg.vocab - 3);  // the fixtures' vocab is 97
        mask[i] = !(i >= S && i % S >= 10);  // the second row is padded at its end
    }
    mt_batch b = {B, S, tokens, labels, mask};
    mt_loss lc, lg;
    mt_model_zero_grad(&mc), mt_model_zero_grad(&mg);
    cr_assert_eq(mt_model_forward_train(&mc, &b, &lc), 0);
    cr_assert_eq(mt_model_forward_train(&mg, &b, &lg), 0);
    // The same routing on both, or the gradients of whole experts differ (a near-tie that bf16
    // tips the other way would show here first, not as a gradient error). Each token's chosen
    // set: two chosen experts whose logits nearly tie may come in either order, which moves no row
    // to another expert. A DeepSeek-style router (sigmoid scores near 0.5 plus a score bias, the
    // top-2 sums of groups) holds near ties on any weights these tests fill, and bf16's logits tip
    // some of them: there the GPU's choices must be its rule's on its own logits (fp32 on both
    // backends; moe/router_grouped.c), and the step then runs again on the cpu's choices
    // (m->routing_given), so that what follows compares the same computation. Hundreds of experts
    // (beyond one grouped call) hold near ties in a softmax router too: the same there.
    int given_routing = grouped_router(&mc) || mc.cfg.experts > MT_GROUPED_MAX, T = B * S;
    const int32_t **given = mt_xcalloc((size_t)mc.cfg.layers, sizeof *given);
    for (int L = 0; L < mc.cfg.layers; L++) {
        if (mc.layers[L].dense) continue;
        given[L] = mc.kept[L].ids->data;
        if (!given_routing) cr_expect_eq(same_choices(&mc, &mg, L, NULL), T, "%s layer %d: routing differs", dir, L);
        else if (!mt_ckpt_mlp(ckpt)) {  // (with the MLP recomputed, the logits are one buffer for every layer)
            int tipped = T - same_choices(&mc, &mg, L, NULL);
            cr_log_info("%s layer %d: %d tokens' choices tipped by bf16 (near ties)", dir, L, tipped);
            cr_expect_eq(same_choices(&mc, &mg, L, mg.acts[L].logits), T, "%s layer %d: the GPU's choices are not its "
                         "rule's on its logits", dir, L);
        }
    }
    if (given_routing) {
        mg.routing_given = given;
        mt_model_zero_grad(&mg);
        cr_assert_eq(mt_model_forward_train(&mg, &b, &lg), 0);
    }
    cr_log_info("%s: loss cuda %.9g, cpu %.9g; aux cuda %.9g, cpu %.9g", dir, lg.loss, lc.loss, lg.aux, lc.aux);
    cr_expect_leq(fabs(lg.loss - lc.loss), 1e-2 * fabs(lc.loss), "%s: loss cuda %.9g, cpu %.9g", dir, lg.loss, lc.loss);
    cr_expect_leq(fabs(lg.aux - lc.aux), 1e-2 * fabs(lc.aux), "%s: aux cuda %.9g, cpu %.9g", dir, lg.aux, lc.aux);
    cr_expect_leq(fabs(lg.seq_aux - lc.seq_aux), 1e-2 * fabs(lc.seq_aux), "%s: seq_aux cuda %.9g, cpu %.9g", dir,
                  lg.seq_aux, lc.seq_aux);
    if (mc.seq_aux_coef != 0.0f) cr_expect_gt(lc.seq_aux, 0.5, "%s: the balance loss is on (%.9g)", dir, lc.seq_aux);
    cr_expect_eq(lg.tokens, lc.tokens);
    if (mc.cfg.clip_qkv > 0 && !mt_ckpt_attention(ckpt)) {  // the clamp cuts: q_norm's outputs beyond ±clip
        const mt_layer_acts *a = &mc.acts[0];
        const float *x = a->q_raw->data, *r = a->rstd_q->data, *w = mc.layers[0].qn->data, cl = (float)mc.cfg.clip_qkv;
        int64_t cut = 0, nq = mt_tensor_numel(a->q_raw), width = nq / T;
        for (int64_t j = 0; j < nq; j++) cut += fabsf(w[j % width] * (x[j] * r[j / width])) > cl;
        cr_log_info("%s: %lld of %lld q values clamped", dir, (long long)cut, (long long)nq);
        cr_expect_gt(cut, nq / 20, "%s: clip_qkv %g cuts only %lld of %lld", dir, cl, (long long)cut, (long long)nq);
    }
    if (mc.cfg.swiglu_limit > 0 && !mt_ckpt_mlp(ckpt)) {  // the clamps cut (the CPU's g, u kept)
        double share = clamped_share(&mc);
        cr_log_info("%s: %.1f%% of layer 0's g and u values clamped", dir, 100 * share);
        cr_expect_gt(share, 0.1, "%s: swiglu_limit %g cuts only %.1f%%", dir, mc.cfg.swiglu_limit, 100 * share);
    }
    mt_model_backward(&mc), mt_model_backward(&mg);
    free(given);
    double worst = 1, worst_rel = 0;
    int compared = 0;
    for (int i = 0; i < n; i++) {
        float *g = host_copy(pg[i].g);
        int64_t len = mt_tensor_numel(pc[i].g);
        double c = cosine(pc[i].g->data, g, len), e = rel_l2(pc[i].g->data, g, len);
        worst = fmin(worst, c), worst_rel = fmax(worst_rel, e), compared++;
        if (getenv("CF_PRINT")) fprintf(stderr, "%-70s cos %.6f rel %.3g\n", pc[i].name, c, e);
        int clamped = behind_clamp(&mc.cfg, pc[i].name);
        // An expert's LoRA gradient sums over its few rows of bf16 activations (the GPU dtype
        // rule); where the terms nearly cancel, that rounding shows: 0.99876 and 0.99882 for two
        // experts of the tiny OLMoE and Qwen3 configs, the same on the WMMA and the cuBLAS
        // expert paths (so not a kernel's error). The rel. L2 bound below stays.
        const int expert = strstr(pc[i].name, ".experts.") != NULL;
        double want = clamped ? 0.95 : expert ? tol.cos_expert : tol.cos;
        cr_expect_geq(c, want, "%s: %s: gradient cosine %.6f to the cpu's", dir, pc[i].name, c);
        cr_expect_leq(e, clamped ? 0.3 : expert ? tol.rel_l2_expert : tol.rel_l2, "%s: %s: gradient rel. L2 %.3g to the cpu's",
                      dir, pc[i].name, e);
        free(g);
    }
    cr_log_info("%s: loss rel. diff %.3g; %d gradients, worst cosine %.6f, worst rel. L2 %.3g", dir,
                fabs(lg.loss - lc.loss) / fabs(lc.loss), compared, worst, worst_rel);
    if (getenv("CF_PRINT"))
        fprintf(stderr, "%s mode %d ckpt %d: loss rel. diff %.3g; %d gradients, worst cosine %.6f, worst rel. L2 %.3g\n",
                dir, (int)mode, (int)ckpt, fabs(lg.loss - lc.loss) / fabs(lc.loss), compared, worst, worst_rel);
    cr_expect_gt(compared, 0, "%s: no gradient compared", dir);
    mt_params_free(pc, n), mt_params_free(pg, n);
    mt_model_free(&mc), mt_model_free(&mg);
    cr_expect_eq(gpu->ledger.total_cur, dev0, "%s: every device byte went back to the ledger", dir);
    mt_backend_free(cpu), mt_backend_free(gpu);
}

static void step_matches_cpu(const char *dir, mt_mode mode, mt_ckpt ckpt) {
    step_matches_cpu_q(dir, mode, ckpt, -1, BF16_TOL, NULL, 4);
}

// `selective`: --recompute attention and experts too: the attention part (q/k norms, the clamp)
// or the MLP part (router, experts, shared expert, a dense layer's MLP) recomputed, the rest kept
// per layer. (Inside these tests, not beside them: tests/cudasim/run.sh's filter of every CUDA
// test by name takes at most 99, Criterion's limit on a pattern's alternatives.)
static void family_step_modes(const char *name, void (*edit)(mt_model_config *), mt_mode mode, int selective) {
    char tmp[64], dir[512];
    mt_test_tmpdir(tmp, sizeof tmp);
    family_checkpoint(tmp, name, edit, dir);
    step_matches_cpu(dir, mode, MT_CKPT_NONE);
    step_matches_cpu(dir, mode, MT_CKPT_FULL);  // recomputation: replayed routing, parts rebuilt
    if (selective) {
        step_matches_cpu(dir, mode, MT_CKPT_ATTENTION);
        step_matches_cpu(dir, mode, MT_CKPT_EXPERTS);
    }
    mt_test_rmrf(tmp);
}

static void family_step(const char *name, void (*edit)(mt_model_config *), mt_mode mode) {
    family_step_modes(name, edit, mode, 0);
}

// DeepSeek-style families (configs/tiny-{glm4-moe,deepseek-v3,deepseek-v2}.json, the golden
// fixtures' shapes): the grouped sigmoid router (softmax and max-group for V2) with its fp32 score
// bias, the ungated shared expert, the dense first layer, MLA (q_lora_rank or q_proj; the latent's
// copy, the shared rope key, interleaved RoPE, YaRN's mscale, qk head dim 20 ≠ v head dim 10) and
// GLM-4.5's per-head q/k norm, partial RoPE and q/k/v biases; with every recompute choice. Then
// full and unfreeze training, and router-only.
Test(cuda, glm4_moe_step_matches_cpu) { family_step_modes("tiny-glm4-moe.json", NULL, MT_MODE_LORA, 1); }
Test(cuda, deepseek_v3_step_matches_cpu) { family_step_modes("tiny-deepseek-v3.json", NULL, MT_MODE_LORA, 1); }
Test(cuda, deepseek_v2_step_matches_cpu) { family_step_modes("tiny-deepseek-v2.json", NULL, MT_MODE_LORA, 1); }
Test(cuda, deepseek_v3_full_step_matches_cpu) { family_step("tiny-deepseek-v3.json", NULL, MT_MODE_FULL); }
Test(cuda, glm4_moe_full_step_matches_cpu) { family_step("tiny-glm4-moe.json", NULL, MT_MODE_FULL); }
Test(cuda, deepseek_v2_unfreeze_step_matches_cpu) { family_step("tiny-deepseek-v2.json", NULL, MT_MODE_UNFREEZE); }
Test(cuda, deepseek_v3_router_step_matches_cpu) { family_step("tiny-deepseek-v3.json", NULL, MT_MODE_ROUTER); }
// GLM-4.7-Flash (configs/tiny-glm4-moe-lite.json): V3's MLA with attention biases (q_a, kv_a, o),
// default RoPE, dense layers 0 and 2 between MoE layers 1 and 3 (mlp_layer_types).
Test(cuda, glm4_moe_lite_step_matches_cpu) { family_step_modes("tiny-glm4-moe-lite.json", NULL, MT_MODE_LORA, 1); }
Test(cuda, glm4_moe_lite_full_step_matches_cpu) { family_step("tiny-glm4-moe-lite.json", NULL, MT_MODE_FULL); }
// DeepSeek's sequence-wise balance loss on (seq_aux with aux_loss_alpha 0.3 in the config): its
// statistics in the step's device copy, its backward into the router's, sigmoid (V3) and softmax (V2).
static void seq_aux_on(mt_model_config *c) { c->seq_aux = 1, c->aux_loss_alpha = 0.3; }
Test(cuda, deepseek_seq_aux_step_matches_cpu) {
    family_step("tiny-deepseek-v3.json", seq_aux_on, MT_MODE_ROUTER);
    family_step("tiny-deepseek-v2.json", seq_aux_on, MT_MODE_LORA);
}

// The golden fixtures' own checkpoints (tests/data/golden, tests/test_deepseek.c; transformers'
// weights drawn with std 0.2, ten times the tiny configs'): the same step, kept and recomputed.
// Their larger weights carry bf16's rounding further through the layers (hidden states 1% from
// the cpu's at the last layer, 0.3% at the first): gradient cosines down to 0.996 (seen: 0.9962
// for V2, 0.9969 for V3, 0.9983 for GLM), where the same configs at std 0.02 reach 0.9994; rel. L2
// near 0.1 on an expert's LoRA A of few rows (seen: GLM-4.7-Flash's 0.098 with the experts' base
// GEMM written first and their LoRA added, 0.101 with the LoRA written first and the base added,
// model/experts_gpu.c's lora_first: bf16's rounding order, not a bias), hence 0.12 for experts;
// and an expert's cosine to 0.9948 (GLM-4.7-Flash's layer 1 expert 4 once the backward's w1 LoRA
// writes dxs first: 0.9955 before, while the mean over the four checkpoints' 1288 gradients
// improved, 1 - cos 0.000683 -> 0.000679, rel. L2 0.0362 -> 0.0361), hence 0.994 for experts.
// Their attention is far from uniform, so the gradients
// through the scores count: leaving one head out of the shared rope key's gradient sum fails V2's
// case here (kv_a_proj cosine 0.965), and no case of the tiny configs.
#define GOLDEN MT_REPO_ROOT "/tests/data/golden/"
static const grad_tol GOLDEN_TOL = {0.995, 0.994, 0.1, 0.12};
static void golden_step(const char *dir) {
    step_matches_cpu_q(dir, MT_MODE_LORA, MT_CKPT_NONE, -1, GOLDEN_TOL, NULL, 4);
    step_matches_cpu_q(dir, MT_MODE_LORA, MT_CKPT_FULL, -1, GOLDEN_TOL, NULL, 4);
}
Test(cuda, glm4_moe_golden_step_matches_cpu) { golden_step(GOLDEN "glm4_moe"); }
Test(cuda, deepseek_v3_golden_step_matches_cpu) { golden_step(GOLDEN "deepseek_v3"); }
Test(cuda, deepseek_v2_golden_step_matches_cpu) { golden_step(GOLDEN "deepseek_v2"); }
Test(cuda, glm4_moe_lite_golden_step_matches_cpu) { golden_step(GOLDEN "glm4_moe_lite"); }

// LoRA on some experts only (--experts 0,2): the experts' GEMMs add each LoRA after the base
// product (model/experts_gpu.c's lora_first holds only when every expert with rows has one;
// taken for all experts, the others' rows would keep what the buffer held).
Test(cuda, lora_on_some_experts_step_matches_cpu) {
    char tmp[64], dir[512];
    mt_test_tmpdir(tmp, sizeof tmp);
    family_checkpoint(tmp, "tiny-qwen2-moe.json", NULL, dir);
    step_matches_cpu_q(dir, MT_MODE_LORA, MT_CKPT_NONE, -1, BF16_TOL, "0,2", 4);
    step_matches_cpu_q(dir, MT_MODE_LORA, MT_CKPT_FULL, -1, BF16_TOL, "0,2", 4);
    mt_test_rmrf(tmp);
}

Test(cuda, qwen2_moe_step_matches_cpu) { family_step_modes("tiny-qwen2-moe.json", NULL, MT_MODE_LORA, 1); }
Test(cuda, qwen3_moe_step_matches_cpu) { family_step("tiny-qwen3-moe.json", qwen3_biases, MT_MODE_LORA); }
Test(cuda, olmoe_step_matches_cpu) { family_step_modes("tiny-olmoe.json", olmoe_clip_biases, MT_MODE_LORA, 1); }
// gpt-oss (configs/tiny-gpt-oss.json: 3 layers sliding/full/sliding with window 5, 6 experts
// top-3, head_dim 24 ≠ hidden/heads, YaRN, swiglu_limit 1.4): LoRA on every target, then
// router-only training (the router's weight and bias gradients), with and without
// recomputation; --mode full (every weight, the experts' fused biases and the sinks) and --mode
// unfreeze (two experts dense among 4-bit ones, their biases frozen).
Test(cuda, gpt_oss_step_matches_cpu) { family_step_modes("tiny-gpt-oss.json", NULL, MT_MODE_LORA, 1); }
Test(cuda, gpt_oss_router_step_matches_cpu) { family_step("tiny-gpt-oss.json", NULL, MT_MODE_ROUTER); }
Test(cuda, gpt_oss_full_step_matches_cpu) { family_step("tiny-gpt-oss.json", NULL, MT_MODE_FULL); }
Test(cuda, gpt_oss_unfreeze_step_matches_cpu) { family_step("tiny-gpt-oss.json", NULL, MT_MODE_UNFREEZE); }
// MXFP4 experts (gpt-oss's release format; --quant mxfp4 quantizes the tiny config's experts on
// load, hidden 64 and expert size 32 for its 32-element blocks): the GPU step dequantizes them per
// use (quant/quant.cu) as it does NF4. LoRA with and without recomputation, and router-only.
// (tests/test_gpt_oss.c's MXFP4 fixture, weights drawn N(0, 0.2²), puts many g and u values
// within bf16's rounding of the clamp's limit and its routing near ties: the cpu's golden case.)
static void oss_mxfp4_dims(mt_model_config *c) { c->hidden = 64, c->intermediate = 32; }
// --mode full at those sizes (rows 16 bytes apart): the experts' offsets stay on the device
// (model/expert_rows.c, where the library has the grouped matmul), and the experts' biases and
// their gradients find each row's expert from them.
Test(cuda, gpt_oss_full_step_offsets_on_device_matches_cpu) {
    family_step("tiny-gpt-oss.json", oss_mxfp4_dims, MT_MODE_FULL);
}
Test(cuda, gpt_oss_mxfp4_step_matches_cpu) {
    char tmp[64], dir[512];
    mt_test_tmpdir(tmp, sizeof tmp);
    family_checkpoint(tmp, "tiny-gpt-oss.json", oss_mxfp4_dims, dir);
    step_matches_cpu_q(dir, MT_MODE_LORA, MT_CKPT_NONE, MT_QUANT_MXFP4, BF16_TOL, NULL, 4);
    step_matches_cpu_q(dir, MT_MODE_LORA, MT_CKPT_FULL, MT_QUANT_MXFP4, BF16_TOL, NULL, 4);
    step_matches_cpu_q(dir, MT_MODE_ROUTER, MT_CKPT_FULL, MT_QUANT_MXFP4, BF16_TOL, NULL, 4);
    mt_test_rmrf(tmp);
}

// Many small experts, several of them without a row (78 routed rows over 32): the grouped
// launches' tile scan and their skipped experts. One layer: with 32 experts a deeper layer's
// logits hold near ties that the two backends' roundings break differently.
static void qwen3_many_experts(mt_model_config *c) { c->experts = 32, c->layers = 1, c->n_mlp_only = 0; }
Test(cuda, qwen3_moe_many_experts_step_matches_cpu) { family_step("tiny-qwen3-moe.json", qwen3_many_experts, MT_MODE_LORA); }
// More experts than one grouped call takes (MT_GROUPED_MAX: Kimi-K2's 384), with every LoRA fold
// on (r 8; the tiny Mixtral's h 64, f 128): each call of the layer goes out in two launches, the
// second's per-expert arrays (W, the B beside, the A under) from expert 256 on. One layer, as above.
static void beyond_one_call(mt_model_config *c) { c->experts = MT_GROUPED_MAX + 44, c->layers = 1; }
Test(cuda, experts_beyond_one_grouped_call_folded_step_matches_cpu) {
    char tmp[64], dir[512];
    mt_test_tmpdir(tmp, sizeof tmp);
    family_checkpoint(tmp, "tiny.json", beyond_one_call, dir);
    step_matches_cpu_q(dir, MT_MODE_LORA, MT_CKPT_NONE, -1, BF16_TOL, NULL, 8);
    step_matches_cpu_q(dir, MT_MODE_LORA, MT_CKPT_FULL, -1, BF16_TOL, NULL, 8);
    mt_test_rmrf(tmp);
}
Test(cuda, qwen3_moe_unfreeze_step_matches_cpu) { family_step("tiny-qwen3-moe.json", NULL, MT_MODE_UNFREEZE); }
Test(cuda, qwen2_moe_full_step_matches_cpu) { family_step("tiny-qwen2-moe.json", NULL, MT_MODE_FULL); }
Test(cuda, qwen3_moe_full_step_matches_cpu) { family_step("tiny-qwen3-moe.json", qwen3_biases, MT_MODE_FULL); }
Test(cuda, olmoe_full_step_matches_cpu) { family_step("tiny-olmoe.json", olmoe_clip_biases, MT_MODE_FULL); }

// The GPU step (model/grouped_cuda.cu) runs a layer's experts as one grouped cuBLAS call per
// GEMM kind: the LoRA products and weight gradients, and the 4-bit base GEMMs of small experts
// (as many dequantized W as a 64 MiB slot holds), so the device ops of a step do not grow with
// the number of experts: Qwen3-MoE's tiny config with 4 and with 32 experts (top-3, NF4 base,
// LoRA on every target) issues as many. A call per expert would be ~30 more per added expert.
static void four_experts(mt_model_config *c) { qwen3_many_experts(c), c->experts = 4; }

static uint64_t step_device_ops(mt_backend *gpu, const char *dir) {
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.mode = MT_MODE_LORA, o.lora_r = 4, o.checkpointing = MT_CKPT_FULL;
    o.targets = MT_TARGET_EXPERTS | MT_TARGET_ATTN | MT_TARGET_GATE;
    mt_model m;
    cr_assert_eq(mt_model_load(&m, gpu, dir, MT_MODEL_SPEC_OF(&o)), 0, "%s: %s", dir, mt_error_get());
    cr_assert_not_null(m.layers[0].w1[0].q, "%s: the experts are 4-bit", dir);
    enum { B = 2, S = 13 };
    int32_t tokens[B * S], mask[B * S];
    for (int i = 0; i < B * S; i++) tokens[i] = 3 + (i * 29) % 200, mask[i] = 1;
    mt_batch b = {B, S, tokens, tokens, mask};
    mt_loss l;
    mt_model_zero_grad(&m);
    uint64_t before = gpu->device_ops;
    cr_assert_eq(mt_model_forward_train(&m, &b, &l), 0);
    mt_model_backward(&m);
    uint64_t ops = gpu->device_ops - before;
    mt_model_free(&m);
    return ops;
}

Test(cuda, experts_cost_the_same_device_ops_for_any_number_of_experts) {
    mt_backend *gpu = gpu_or_skip();
    char tmp[64], few[512], many[512];
    mt_test_tmpdir(tmp, sizeof tmp);
    family_checkpoint(tmp, "tiny-qwen3-moe.json", four_experts, few);
    uint64_t ops_few = step_device_ops(gpu, few);
    mt_test_rmrf(tmp);
    mt_test_tmpdir(tmp, sizeof tmp);
    family_checkpoint(tmp, "tiny-qwen3-moe.json", qwen3_many_experts, many);
    uint64_t ops_many = step_device_ops(gpu, many);
    mt_test_rmrf(tmp);
    cr_log_info("device ops of a step: %llu with 4 experts, %llu with 32", (unsigned long long)ops_few,
                (unsigned long long)ops_many);
    cr_expect_gt(ops_few, 50, "the count saw the step");
    cr_expect_eq(ops_many, ops_few, "device ops: %llu with 32 experts, %llu with 4", (unsigned long long)ops_many,
                 (unsigned long long)ops_few);
    mt_backend_free(gpu);
}
