// plan/plan.c — the planner's arithmetic (docs/memory.md), per GPU and ledger category.
//
// Choices where docs/memory.md leaves room (each one reported in the plan's output or its tests):
//   * 4-bit bytes are quant/'s own count (mt_q4_weight_bytes): blocks per tensor, rounded up;
//     per-tensor constants (code table, nested map, offset: ~1 KB a tensor) are left out, as
//     docs/memory.md "Bytes per parameter" does and as the ledger does (they are shared constants).
//   * --quant-targets decides which frozen Linears are 4-bit (default experts and attention;
//     routers, embeddings, lm_head and norms bf16, as docs/memory.md "Bytes per parameter").
//   * The workspace guess is 2.0 GB whenever there is more than one GPU (NCCL buffers exist
//     for plain data parallelism too), 1.5 GB on one.
//   * ZeRO shards a weight's optimizer state (and grads at stage 2) over the GPUs that hold a
//     copy of it: all GPUs for replicated weights, gpus/ep for per-expert weights.
//   * Activations follow §3.2 for every layer (L), whatever the lowest trainable layer, with the
//     family's parts added to A_layer (attn_row_bytes, mlp_row_bytes) and none of the router's or experts' rows
//     for a dense layer, as model/acts.c allocates them.
#include "plan/plan.h"
#include "model/expert_scratch.h"

#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "quant/quant.h"  // the 4-bit formats' byte counts and quantization targets

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void mt_plan_mixtral_8x7b(mt_model_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    strcpy(cfg->architecture, "MixtralForCausalLM");
    strcpy(cfg->model_type, "mixtral");
    cfg->hidden = 4096;
    cfg->intermediate = 14336;
    cfg->layers = 32;
    cfg->heads = 32;
    cfg->kv_heads = 8;
    cfg->head_dim = 128;
    cfg->experts = 8;
    cfg->top_k = 2;
    cfg->vocab = 32000;
    cfg->max_positions = 32768;
    cfg->sliding_window = 0;
    cfg->bos_token_id = 1;
    cfg->eos_token_id = 2;
    cfg->rope_theta = 1000000.0;
    cfg->rms_norm_eps = 1e-5;
    cfg->router_aux_loss_coef = 0.02;
    cfg->router_jitter_noise = 0.0;
    cfg->initializer_range = 0.02;
    cfg->tie_word_embeddings = 0;
    cfg->torch_dtype = MT_BF16;
    cfg->family = MT_FAMILY_MIXTRAL;
    cfg->norm_topk_prob = 1;  // Mixtral always renormalises its top-2 weights
    cfg->decoder_sparse_step = 1;
}

int mt_plan_case_settings(char which, int (*set)(void *ctx, const char *key, const char *value), void *ctx) {
    // docs/memory.md "The reference cases": every case is s=1024, b=1, full checkpointing, NF4-DQ base, one 44 GB card
    // (and no bf16 copies of 4-bit weights, nor kept experts: the references keep none).
    static const struct { char which; const char *key, *value; } settings[] = {
        {0, "quant", "nf4"}, {0, "double-quant", "true"}, {0, "seq", "1024"}, {0, "batch", "1"},
        {0, "checkpointing", "full"}, {0, "gpus", "1"}, {0, "ep", "1"}, {0, "gpu-mem", "44GB"},
        {0, "dequant-cache", "off"}, {0, "expert-cache", "off"},
        {'A', "mode", "router"}, {'A', "layers", "all"},
        {'B', "mode", "unfreeze"}, {'B', "layers", "0-5"}, {'B', "experts", "0,1"},
        {'C', "mode", "lora"}, {'C', "r", "16"}, {'C', "targets", "w1,w2,w3,gate"},
        {'C', "layers", "all"}, {'C', "experts", "all"},
    };
    if (which != 'A' && which != 'B' && which != 'C') {
        mt_error_set("--case: '%c' is not a case (A, B or C)", which);
        return -1;
    }
    for (size_t i = 0; i < MT_ARRAY_LEN(settings); i++)
        if ((settings[i].which == 0 || settings[i].which == which) &&
            set(ctx, settings[i].key, settings[i].value) != 0)
            return -1;
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Sizes

// Weights of one layer's Linears: attention q, k, v, o and one expert's w1, w2, w3.
typedef struct {
    int64_t attn[4], attn_in[4], attn_out[4];
    int64_t expert[3], expert_in[3], expert_out[3];
} linear_sizes;

static void linear_sizes_of(const mt_model_config *cfg, linear_sizes *s) {
    int64_t h = cfg->hidden, f = cfg->intermediate;
    int64_t q = cfg->heads * cfg->head_dim, kv = cfg->kv_heads * cfg->head_dim;
    const int64_t ain[4] = {h, h, h, q}, aout[4] = {q, kv, kv, h};
    const int64_t ein[3] = {h, f, h}, eout[3] = {f, h, f};  // w1, w2, w3
    for (int i = 0; i < 4; i++) {
        s->attn_in[i] = ain[i];
        s->attn_out[i] = aout[i];
        s->attn[i] = ain[i] * aout[i];
    }
    if (cfg->mla) {  // MLA's Linears as the targets name them: q (q_a + q_b, or q_proj), k (kv_a), v (kv_b), o.
        // The q path's LoRA is sized as q_a's alone here (q_b's, r·(qr + nh·qk) a layer, is left out of this
        // table; the measured step counts it).
        int64_t nh = cfg->heads, qo = nh * cfg->head_dim, qr = cfg->q_lora_rank, kvr = cfg->kv_lora_rank;
        int64_t in[4] = {h, h, kvr, nh * cfg->v_head_dim}, out[4] = {qr ? qr : qo, kvr + cfg->qk_rope_dim,
                                                                    nh * (cfg->qk_nope_dim + cfg->v_head_dim), h};
        for (int i = 0; i < 4; i++) s->attn_in[i] = in[i], s->attn_out[i] = out[i], s->attn[i] = in[i] * out[i];
        if (qr) s->attn[0] += qr * qo;
    }
    for (int i = 0; i < 3; i++) {
        s->expert_in[i] = ein[i];
        s->expert_out[i] = eout[i];
        s->expert[i] = ein[i] * eout[i];
    }
}

static int64_t sum_of(const int64_t *v, int n) {
    int64_t s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    return s;
}

// Embeddings (and the untied lm_head) plus the final norm: never quantized.
static int64_t outer_params(const mt_model_config *cfg) {
    return cfg->vocab * cfg->hidden * (cfg->tie_word_embeddings ? 1 : 2) + cfg->hidden;
}

// The family's parts beside Mixtral's (docs/families.md): attention biases and q/k norms of every
// layer, the shared expert and its gate of each MoE layer, the MLP of each dense layer. Frozen but
// in --mode full; the step keeps them bf16 (model/mixtral.c) but the MLPs' projections, which are
// 4-bit with the experts (family_mlp_params). 0 for Mixtral.
static int64_t family_extra_params(const mt_model_config *cfg, const linear_sizes *s) {
    int64_t n_moe = mt_config_moe_layers(cfg);
    return cfg->layers * (mt_config_attn_params(cfg) - sum_of(s->attn, 4)) +
           n_moe * mt_config_shared_expert_params(cfg) + (cfg->layers - n_moe) * mt_config_dense_mlp_params(cfg);
}

// The projections of the shared experts and dense layers' MLPs (3·h·mf a layer): frozen, they
// are 4-bit with the experts; the rest of family_extra_params stays bf16.
static int64_t family_mlp_params(const mt_model_config *cfg) {
    int64_t n_moe = mt_config_moe_layers(cfg);
    return 3 * cfg->hidden * (n_moe * cfg->shared_intermediate + (cfg->layers - n_moe) * cfg->dense_intermediate);
}

// The MLP of layer L (a dense layer's, or a MoE layer's shared expert; 0: none) and its three
// Linears' sizes in w1, w2, w3 order (gate_proj, down_proj, up_proj).
static int64_t mlp_width(const mt_model_config *cfg, int64_t L) {
    return mt_config_layer_is_moe(cfg, L) ? cfg->shared_intermediate : cfg->dense_intermediate;
}
static void mlp_sizes(const mt_model_config *cfg, int64_t mf, int64_t *in, int64_t *out) {
    in[0] = cfg->hidden, out[0] = mf, in[1] = mf, out[1] = cfg->hidden, in[2] = cfg->hidden, out[2] = mf;
}

// Layers named by --layers: all of them, and those with routed experts.
static void selected_layers(const mt_model_config *cfg, const mt_plan_opts *o, int64_t *all, int64_t *moe) {
    *all = *moe = 0;
    for (int L = 0; L < cfg->layers; L++)
        if (mt_index_set_contains(&o->layers, L)) ++*all, *moe += mt_config_layer_is_moe(cfg, L);
}

static int64_t model_params(const mt_model_config *cfg) { return mt_config_total_params(cfg); }

uint64_t mt_plan_linear_bytes(int64_t n, const mt_plan_opts *o) {
    if (o->quant == MT_QUANT_NONE) return 2 * (uint64_t)n;  // bf16, whatever the checkpoint's dtype
    // quant/'s own count (packed nibbles + per-block constants), so plan and ledger agree for
    // every format and blocksize: NF4-DQ 4.127 bits, NF4 4.5, INT4 group 128 4.25, MXFP4 4.25 (one e8m0 byte
    // per 32; docs/memory.md "Bytes per parameter").
    int bs = mt_q4_blocksize_or_default(o->quant, o->quant_blocksize);
    return mt_q4_weight_bytes(o->quant, n, bs, o->double_quant);
}

// Frozen Linears of sizes n[0..count) held `copies` times, in bf16 or 4-bit as --quant and
// --quant-targets (`target`) say; adds to the 4-bit or the bf16 tally of the plan. `mxfp4`: the
// checkpoint stores them MXFP4 (gpt-oss), which the loader keeps whatever 4-bit --quant names.
// A 4-bit Linear of n weights as the loader keeps it: --quant's format, or MXFP4 when the
// checkpoint stores it so.
static uint64_t quant_linear_bytes(int64_t n, const mt_plan_opts *o, int mxfp4) {
    mt_plan_opts as_stored = *o;
    if (mxfp4) as_stored.quant = MT_QUANT_MXFP4, as_stored.quant_blocksize = 0, as_stored.double_quant = 0;
    return mt_plan_linear_bytes(n, &as_stored);
}

static uint64_t frozen_linears(mt_plan *p, const mt_plan_opts *o, const int64_t *n, int count, int64_t copies,
                               unsigned target, int mxfp4) {
    int quantized = o->quant != MT_QUANT_NONE && (o->quant_targets & target);
    uint64_t b = 0;
    for (int i = 0; i < count; i++) {
        b += (uint64_t)copies * (quantized ? quant_linear_bytes(n[i], o, mxfp4) : 2 * (uint64_t)n[i]);
        if (quantized) p->frozen_quant_gpu += copies * n[i];
        else p->frozen_bf16_gpu += copies * n[i];
    }
    if (quantized) p->frozen_quant_bytes += b;
    return b;
}

// ---------------------------------------------------------------------------------------------
// Activations (docs/memory.md "Activations")

// A_layer per row of one activation set serving layers L0 .. L0+n-1, in the two parts
// --recompute splits (model/spec.h). The attention part: §3.2's norm1 in (the layer input), qkv
// in, q, k, v, o_proj in, lse, h and rstd1, and the family's (q and k before their norms and one
// rstd per normed row, v before its clamp). The MLP part: norm2 in, router in, rstd2, the router's
// and experts' terms where a layer of the set has them (a dense layer has none), the widest MLP
// of the set (a dense layer's or a shared expert: gate, up, act 3·2mf, output 2h) and, where a
// shared expert is, its gate's sigmoid (4).
static int64_t attn_row_bytes(const mt_model_config *cfg) {
    int64_t h = cfg->hidden, qd = cfg->heads * cfg->head_dim, h_kv = cfg->kv_heads * cfg->head_dim;
    int64_t b = 10 * h + 4 * h_kv + 4 * cfg->heads + 4;
    mt_qk_norm qkn = cfg->qk_norm;
    if (qkn != MT_QK_NORM_NONE) b += 2 * qd + 2 * h_kv + (qkn == MT_QK_NORM_HEAD ? 4 * (cfg->heads + cfg->kv_heads) : 8);
    if (cfg->clip_qkv > 0) b += 2 * h_kv;
    return b;
}

static int64_t mlp_row_bytes(const mt_model_config *cfg, int64_t L0, int64_t n) {
    int64_t h = cfg->hidden, f = cfg->intermediate, k = cfg->top_k, b = 2 * h + 4;
    int moe = 0, shared = 0;
    int64_t mf = 0;
    for (int64_t L = L0; L < L0 + n; L++) {
        int is_moe = mt_config_layer_is_moe(cfg, L);
        moe |= is_moe, shared |= is_moe && mlp_width(cfg, L), mf = MT_MAX(mf, mlp_width(cfg, L));
    }
    if (moe) b += 4 * cfg->experts + 8 * k + k * (4 * h + 6 * f);
    if (mf) b += 6 * mf + 2 * h + 4 * shared;
    return b;
}

uint64_t mt_plan_act_layer_bytes(const mt_model_config *cfg, int64_t seq, int64_t batch) {
    // the set full recomputation shares
    return (uint64_t)(batch * seq * (attn_row_bytes(cfg) + mlp_row_bytes(cfg, 0, cfg->layers)));
}

// The parts the backward recomputes: one set of each for all layers; every other part, one per
// layer. Unresolved auto is full, as the model takes it (trainer/options.c).
static void recomputed_parts(const mt_plan_opts *o, int *attn, int *mlp) {
    mt_ckpt c = o->checkpointing == MT_CKPT_AUTO ? MT_CKPT_FULL : o->checkpointing;
    *attn = mt_ckpt_attention(c), *mlp = mt_ckpt_mlp(c);
}

uint64_t mt_plan_act_bytes(const mt_model_config *cfg, const mt_plan_opts *o) {
    uint64_t sb = (uint64_t)(o->seq * o->batch), L = (uint64_t)cfg->layers;
    uint64_t transient = (uint64_t)cfg->top_k * sb * 6 * (uint64_t)cfg->intermediate;  // grads of g, u, h
    uint64_t logits = 10 * sb * (uint64_t)cfg->vocab;  // bf16 logits, fp32 upcast, fp32 grad
    int ra, rm;
    recomputed_parts(o, &ra, &rm);
    // A recomputed attention part keeps each layer's input beside the one set (whose norm1 in
    // is then counted twice, as docs/memory.md's full-recomputation formula does); a kept one
    // holds the input as its norm1 in.
    uint64_t kept = ra ? L * 2 * sb * (uint64_t)cfg->hidden + sb * (uint64_t)attn_row_bytes(cfg)
                       : L * sb * (uint64_t)attn_row_bytes(cfg);
    if (rm) kept += sb * (uint64_t)mlp_row_bytes(cfg, 0, cfg->layers);
    else
        for (int64_t l = 0; l < cfg->layers; l++) kept += sb * (uint64_t)mlp_row_bytes(cfg, l, 1);
    return kept + transient + logits;
}

// LoRA xa buffers (bf16 [rows, r]) of the activation set serving layers L0 .. L0+n-1: one per
// adapted Linear of a layer of the set: T rows for attention (its part `attn`), the router and
// the MLP (a dense layer's or the shared expert), T·k for the experts' w1, w2, w3 (the MLP part,
// `mlp`).
static int64_t lora_xa_set(const mt_model_config *cfg, const mt_plan_opts *o, int64_t L0, int64_t n, int64_t sb,
                           int attn_part, int mlp_part) {
    static const unsigned attn[] = {MT_TARGET_Q, MT_TARGET_K, MT_TARGET_V, MT_TARGET_O};
    static const unsigned mlp[] = {MT_TARGET_W1, MT_TARGET_W2, MT_TARGET_W3};
    if (o->mode != MT_MODE_LORA) return 0;
    int any = 0, moe = 0, has_mlp = 0;
    for (int64_t L = L0; L < L0 + n; L++)
        if (mt_index_set_contains(&o->layers, (int)L))
            any = 1, moe |= mt_config_layer_is_moe(cfg, L), has_mlp |= mlp_width(cfg, L) > 0;
    int experts = moe && mt_index_set_count(&o->experts, (int)cfg->experts) > 0;
    int64_t b = 0, row = 2 * sb * o->lora_r;
    for (size_t i = 0; attn_part && any && i < MT_ARRAY_LEN(attn); i++) b += (o->targets & attn[i]) ? row : 0;
    if (!mlp_part) return b;
    if (moe && (o->targets & MT_TARGET_GATE)) b += row;
    for (size_t i = 0; i < MT_ARRAY_LEN(mlp); i++)
        if (o->targets & mlp[i]) b += (experts ? cfg->top_k * row : 0) + (has_mlp ? row : 0);
    return b;
}

int mt_plan_act_terms(const mt_model_config *cfg, const mt_plan_opts *o, mt_plan_act_term *t) {
    int64_t sb = o->seq * o->batch, h = cfg->hidden, k = cfg->top_k, E = cfg->experts, V = cfg->vocab;
    int64_t L = cfg->layers, qd = cfg->heads * cfg->head_dim;
    int ra, rm;
    recomputed_parts(o, &ra, &rm);
    // Sets of each part: one shared by recomputation, or one per layer.
    int64_t attn_sets = ra ? 1 : L, n_moe = mt_config_moe_layers(cfg), moe_sets = rm ? n_moe > 0 : n_moe;
    int64_t xa = ra ? lora_xa_set(cfg, o, 0, L, sb, 1, 0) : 0;
    xa += rm ? lora_xa_set(cfg, o, 0, L, sb, 0, 1) : 0;
    for (int64_t l = 0; l < L; l++) xa += lora_xa_set(cfg, o, l, 1, sb, !ra, !rm);
    int n = 0;
    t[n++] = (mt_plan_act_term){"backward transient k·s·b·6f (grads of gate, up, act): none, the GPU step writes them over a and gu",
                                -6 * k * sb * cfg->intermediate};
    t[n++] = (mt_plan_act_term){"logits and loss 10·s·b·V: none kept, the fused loss holds a chunk of rows at a time "
                                "(work: 201 MB at V = 32000)", -10 * sb * V};
    t[n++] = (mt_plan_act_term){"layer input again in A_layer (\"norm1 in\"): kept once, as the layer input",
                                ra ? -2 * h * sb : 0};
    t[n++] = (mt_plan_act_term){"top-k ids 4k per row in A_layer: kept with the routing, below", -4 * k * sb * moe_sets};
    t[n++] = (mt_plan_act_term){"routing kept per MoE layer: ids, expert order (4k + 4k per row), offsets",
                                n_moe * (8 * k * sb + 4 * (E + 1))};
    t[n++] = (mt_plan_act_term){"router logits fp32 4E per row (router backward and z-loss read them)",
                                4 * E * sb * moe_sets};
    t[n++] = (mt_plan_act_term){"q and attention output heads·head_dim wide where A_layer has h", 4 * (qd - h) * sb * attn_sets};
    t[n++] = (mt_plan_act_term){"final norm input and output 2·2h, its rstd 4 per row", (4 * h + 4) * sb};
    t[n++] = (mt_plan_act_term){"LoRA xa = dropout(x)·Aᵀ, 2r per adapted Linear and row", xa};
    t[n++] = (mt_plan_act_term){"the batch on the device (tokens, targets, positions 4 each, mask 1 per row), "
                                "the aux, z-loss and sequence-balance statistics, 8·(2E+5), and RoPE's table, "
                                "4·head_dim/2",
                                13 * sb + 8 * (2 * E + 5) + 4 * (cfg->head_dim / 2)};
    t[n++] = (mt_plan_act_term){"the final hidden states' gradient 2h per row, made by the loss's forward pass for "
                                "the backward (a frozen lm_head)", o->mode == MT_MODE_FULL ? 0 : 2 * h * sb};
    return n;
}

uint64_t mt_plan_act_model_bytes(const mt_model_config *cfg, const mt_plan_opts *o) {
    mt_plan_act_term t[MT_PLAN_MAX_ACT_TERMS];
    int64_t b = (int64_t)mt_plan_act_bytes(cfg, o);
    for (int i = 0, n = mt_plan_act_terms(cfg, o, t); i < n; i++) b += t[i].bytes;
    return (uint64_t)b;
}

// ---------------------------------------------------------------------------------------------
// Checks

static int check_index_set(const mt_index_set *s, int64_t n, const char *flag, const char *what) {
    if (s->all) return 0;
    for (int j = 0; j < s->count; j++)
        if (s->items[j] >= n) {
            mt_error_set("%s: %s %d is beyond the model's %lld %s (0-%lld)", flag, what, s->items[j],
                         (long long)n, what, (long long)n - 1);
            return -1;
        }
    return 0;
}

int mt_plan_check(const mt_model_config *cfg, const mt_plan_opts *o) {
    if (o->gpus < 1) { mt_error_set("--gpus must be at least 1"); return -1; }
    if (o->ep < 1) { mt_error_set("--ep must be at least 1"); return -1; }
    if (o->gpus % o->ep) {
        mt_error_set("--ep %d does not divide --gpus %d", o->ep, o->gpus);
        return -1;
    }
    if (o->ep > cfg->experts) {  // uneven shares are fine: the first E mod ep ranks hold one more
        mt_error_set("--ep %d is more ranks than the model's %lld experts", o->ep, (long long)cfg->experts);
        return -1;
    }
    if (o->zero < 0 || o->zero > 2) { mt_error_set("--zero must be 0, 1 or 2"); return -1; }
    if (o->seq < 1) { mt_error_set("--seq must be at least 1"); return -1; }
    if (o->batch < 1) { mt_error_set("--batch must be at least 1"); return -1; }
    if (o->mode == MT_MODE_LORA && o->lora_r < 1) { mt_error_set("--r must be at least 1"); return -1; }
    if (o->quant_blocksize != 0 && !mt_q4_blocksize_ok(o->quant_blocksize)) {
        mt_error_set("--blocksize must be 0 (the format's default) or a power of two in 32..4096");
        return -1;
    }
    if (o->quant == MT_QUANT_MXFP4 && o->quant_blocksize != 0 && o->quant_blocksize != MT_MXFP4_BLOCK) {
        mt_error_set("--blocksize %d: mxfp4's blocks are always %d (leave --blocksize at 0)", o->quant_blocksize,
                     MT_MXFP4_BLOCK);
        return -1;
    }
    if (!(o->gpu_mem_bytes > 0)) { mt_error_set("--gpu-mem must be positive"); return -1; }
    if (check_index_set(&o->layers, cfg->layers, "--layers", "layers")) return -1;
    if (check_index_set(&o->experts, cfg->experts, "--experts", "experts")) return -1;
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Trainables

typedef struct {
    int64_t unit_params;    // one expert unit: an expert's w1, w2, w3, or their LoRA
    int units_are_experts;  // 1: the unit is the expert itself, so no frozen copy remains
    int64_t router_layers;  // layers whose router is trained in full (no frozen copy)
    int dense_trainable;    // full mode: attention, norms, embeddings are trained too
} trainables;

static void add_part(mt_plan *p, const char *what, int64_t count, int64_t each, int replicated) {
    if (count <= 0 || each <= 0 || p->n_parts >= MT_PLAN_MAX_PARTS) return;
    p->parts[p->n_parts++] = (mt_plan_part){what, count, each, replicated};
    p->trainable_params += count * each;
    if (!replicated) p->units = count;
}

// LoRA A [r, in] and B [out, r] on each targeted Linear.
static int64_t lora_params(int64_t r, const int64_t *in, const int64_t *out, int n, unsigned targets,
                           const unsigned *bits) {
    int64_t s = 0;
    for (int i = 0; i < n; i++)
        if (targets & bits[i]) s += r * (in[i] + out[i]);
    return s;
}

static void count_trainables(const mt_model_config *cfg, const mt_plan_opts *o, const linear_sizes *s,
                             trainables *t, mt_plan *p) {
    static const unsigned attn_bits[4] = {MT_TARGET_Q, MT_TARGET_K, MT_TARGET_V, MT_TARGET_O};
    static const unsigned expert_bits[3] = {MT_TARGET_W1, MT_TARGET_W2, MT_TARGET_W3};
    int64_t L = cfg->layers, E = cfg->experts, h = cfg->hidden, r = o->lora_r, n_moe = mt_config_moe_layers(cfg);
    int64_t nl, nl_moe, ne = mt_index_set_count(&o->experts, (int)E);
    selected_layers(cfg, o, &nl, &nl_moe);
    int64_t expert = sum_of(s->expert, 3), router = h * E, in[3], out[3];
    memset(t, 0, sizeof *t);
    switch (o->mode) {  // a dense layer has no router and no experts
    case MT_MODE_ROUTER:
        t->router_layers = nl_moe;
        add_part(p, "routers", nl_moe, router, 1);
        break;
    case MT_MODE_UNFREEZE:
        t->unit_params = expert;
        t->units_are_experts = 1;
        t->router_layers = nl_moe;
        add_part(p, "experts", nl_moe * ne, expert, 0);
        add_part(p, "routers", nl_moe, router, 1);
        break;
    case MT_MODE_LORA:
        t->unit_params = lora_params(r, s->expert_in, s->expert_out, 3, o->targets, expert_bits);
        add_part(p, "expert LoRA", nl_moe * ne, t->unit_params, 0);
        if (o->targets & MT_TARGET_GATE) add_part(p, "router LoRA", nl_moe, r * (h + E), 1);
        add_part(p, "attention LoRA", nl, lora_params(r, s->attn_in, s->attn_out, 4, o->targets, attn_bits), 1);
        // The experts' targets name the shared expert's and a dense MLP's projections too (model/mixtral.c).
        mlp_sizes(cfg, cfg->shared_intermediate, in, out);
        if (cfg->shared_intermediate)
            add_part(p, "shared expert LoRA", nl_moe, lora_params(r, in, out, 3, o->targets, expert_bits), 1);
        mlp_sizes(cfg, cfg->dense_intermediate, in, out);
        add_part(p, "dense MLP LoRA", nl - nl_moe, lora_params(r, in, out, 3, o->targets, expert_bits), 1);
        break;
    case MT_MODE_FULL:
        t->unit_params = expert;
        t->units_are_experts = 1;
        t->router_layers = n_moe;
        t->dense_trainable = 1;
        add_part(p, "experts", n_moe * E, expert, 0);
        add_part(p, "routers", n_moe, router, 1);
        add_part(p, "attention + norms", L, sum_of(s->attn, 4) + 2 * h, 1);
        add_part(p, "embeddings, lm_head, final norm", 1, outer_params(cfg), 1);
        add_part(p, "shared experts, dense MLPs, biases, q/k norms", 1, family_extra_params(cfg, s), 1);
        break;
    }
}

// Trainable expert units on EP rank 0 (the most loaded), placed as model/mixtral.c's place_experts
// does: round-robin over the MoE layers, each rank taking at most its share of a layer (E/P, the
// first E mod P ranks one more). With uneven shares that can be more than ceil(units / P).
static int64_t units_on_rank0(const mt_model_config *cfg, const mt_plan_opts *o, int64_t units) {
    int P = o->ep, E = (int)cfg->experts;
    if (units == 0 || P == 1) return units;
    int *left = mt_xcalloc((size_t)P, sizeof(int));
    int64_t next = 0, mine = 0;
    for (int L = 0; L < cfg->layers; L++) {
        if (!mt_config_layer_is_moe(cfg, L)) continue;
        for (int p = 0; p < P; p++) left[p] = E / P + (p < E % P);
        for (int e = 0; e < E; e++) {
            int trains = o->mode == MT_MODE_FULL ||
                         (mt_index_set_contains(&o->layers, L) && mt_index_set_contains(&o->experts, e));
            if (!trains) continue;
            while (left[next % P] == 0) next++;
            mine += next % P == 0;
            left[next++ % P]--;
        }
    }
    free(left);
    return mine;
}

// Trainable weights of `n` params held by `copies` GPUs: bf16 W and grad, Adam m, v (fp32, or
// 8-bit), fp32 master. ZeRO-1 shards Adam and master over the copies, ZeRO-2 the grads too.
static void add_state(mt_plan *p, const mt_plan_opts *o, int64_t n, int copies) {
    int64_t shard = o->zero >= 1 ? ceil_div(n, copies) : n;
    int64_t grad = o->zero >= 2 ? ceil_div(n, copies) : n;
    uint64_t optim = (uint64_t)shard * (o->adam_8bit ? 2 : 8);
    uint64_t master = o->master_weights ? (uint64_t)shard * 4 : 0;
    p->bytes[MT_MEM_TRAIN] += 2 * (uint64_t)n;
    p->bytes[MT_MEM_GRAD] += 2 * (uint64_t)grad;
    // ZeRO-1 reduce-scatters a contiguous copy of the grads, padded to whole shards (optim/dist.h)
    if (o->zero == 1 && copies > 1 && n > 0) p->bytes[MT_MEM_COMM] += 2 * (uint64_t)(shard * copies);
    if (o->offload_optimizer) {
        p->host_bytes += optim + master;
    } else {
        p->bytes[MT_MEM_OPTIM] += optim;
        p->bytes[MT_MEM_MASTER] += master;
    }
}

// ---------------------------------------------------------------------------------------------
// The plan

// Frozen weights on the worst GPU: its E/P experts of every MoE layer less the trainable ones it
// holds, attention of every layer, embeddings, norms, frozen routers and the family's dense parts
// (replicated).
static int64_t frozen_experts_gpu(const mt_model_config *cfg, const mt_plan_opts *o, const trainables *t,
                                  const mt_plan *p) {
    int64_t experts_gpu = mt_config_moe_layers(cfg) * ceil_div(cfg->experts, o->ep);
    return experts_gpu - (t->units_are_experts ? p->units_gpu : 0);
}

static void frozen_base(const mt_model_config *cfg, const mt_plan_opts *o, const linear_sizes *s,
                        const trainables *t, mt_plan *p) {
    int64_t n_moe = mt_config_moe_layers(cfg), frozen_experts = frozen_experts_gpu(cfg, o, t, p);
    int64_t attn_layers = t->dense_trainable ? 0 : cfg->layers;
    int64_t router[1] = {cfg->hidden * cfg->experts};
    uint64_t b = frozen_linears(p, o, s->expert, 3, frozen_experts, MT_QTARGET_EXPERTS, cfg->mxfp4);
    const int64_t quant_experts = p->frozen_quant_gpu;
    b += frozen_linears(p, o, s->attn, 4, attn_layers, MT_QTARGET_ATTN, 0);
    b += frozen_linears(p, o, router, 1, n_moe - t->router_layers, MT_QTARGET_ROUTER, 0);
    // The shared experts' and dense MLPs' projections: 4-bit with the experts (quant/quant.h).
    int64_t shared[3], dense[3], mlp_layers = t->dense_trainable ? 0 : 1;
    for (int i = 0; i < 3; i++) shared[i] = cfg->hidden * cfg->shared_intermediate, dense[i] = cfg->hidden * cfg->dense_intermediate;
    b += frozen_linears(p, o, shared, 3, cfg->shared_intermediate ? mlp_layers * n_moe : 0, MT_QTARGET_EXPERTS, 0) +
         frozen_linears(p, o, dense, 3, mlp_layers * (cfg->layers - n_moe), MT_QTARGET_EXPERTS, 0);
    int64_t outer = t->dense_trainable ? 0 : outer_params(cfg) + cfg->layers * 2 * cfg->hidden +
                                                 family_extra_params(cfg, s) - family_mlp_params(cfg);
    p->frozen_bf16_gpu += outer;  // embeddings, lm_head, norms: never 4-bit
    p->quant_bits = p->frozen_quant_gpu ? 8.0 * (double)p->frozen_quant_bytes / (double)p->frozen_quant_gpu : 0;
    // --dequant-cache: a bf16 copy of every 4-bit Linear outside the experts (model/mixtral.c).
    p->dequant_cache_bytes = o->dequant_cache ? 2 * (uint64_t)(p->frozen_quant_gpu - quant_experts) : 0;
    p->bytes[MT_MEM_BASE] = b + 2 * (uint64_t)outer + p->dequant_cache_bytes;  // outer: also the family's extra parts, kept dense
}

// The experts' LoRA blocks that ride in their base GEMMs on the GPU step (model/experts_gpu.c):
// w13_beside columns beside [W1;W3] (w1's and w3's B: mt_experts_xs_extra), w2_beside beside W2
// in the forward (w2's B: mt_experts_a_extra), w2_under rows under W2 in the dx call (w2's A:
// mt_experts_dys_extra). 0 where they do not fold.
typedef struct {
    int64_t w13_beside, w2_beside, w2_under;
} expert_folds;

static expert_folds folds_of(const mt_model_config *cfg, const mt_plan_opts *o, const mt_plan *p) {
    static const unsigned expert_bits = MT_TARGET_W1 | MT_TARGET_W2 | MT_TARGET_W3;
    int64_t h = cfg->hidden, f = cfg->intermediate, r = o->lora_r;
    int q4 = o->quant != MT_QUANT_NONE && (o->quant_targets & MT_QTARGET_EXPERTS);
    int lora = o->mode == MT_MODE_LORA && (o->targets & expert_bits) && p->units_gpu > 0;
    // w2's A under W2 in the dx call: every expert adapted on w2, no dropout (any EP degree: the
    // exchange moves rows into the own layout's room, model/expert_parallel.c).
    int all = mt_index_set_count(&o->experts, (int)cfg->experts) == cfg->experts;
    int fold2 = lora && (o->targets & MT_TARGET_W2) && o->lora_dropout <= 0 && all;
    // B beside W: every expert of every MoE layer adapted (on w1 and w3; on w2), r
    // and h (f) multiples of 8.
    int64_t nl, nl_moe;
    selected_layers(cfg, o, &nl, &nl_moe);
    int every = lora && q4 && all && nl_moe == mt_config_moe_layers(cfg) && r % 8 == 0;
    int fold13 = every && (o->targets & MT_TARGET_W1) && (o->targets & MT_TARGET_W3) && h % 8 == 0;
    int fold2f = every && (o->targets & MT_TARGET_W2) && f % 8 == 0;
    return (expert_folds){fold13 ? 2 * r : 0, fold2f ? r : 0, fold2 ? r : 0};
}

// --expert-cache (model/mixtral.c keep_experts): the last N MoE layers keep their frozen 4-bit
// experts on this GPU (ceil(E/ep) a layer on the most loaded one) in bf16, [W1;W3] [2f, h + room]
// and W2 [h + rows under, f + room], rows with room rounded up to 8 elements, and give their 4-bit
// codes back, one expert after the other: base ends with a kept layer's bf16 less its codes, and
// peaks at that plus the last kept expert's codes (held while its bf16 is made). Only a GPU step
// whose experts are all frozen 4-bit (--mode lora or router) keeps any; a plan is a GPU's unless
// it is a cpu run's.
static void expert_cache(const mt_model_config *cfg, const mt_plan_opts *o, mt_plan *p) {
    int q4 = o->quant != MT_QUANT_NONE && (o->quant_targets & MT_QTARGET_EXPERTS);
    if (o->cpu || !q4 || (o->mode != MT_MODE_LORA && o->mode != MT_MODE_ROUTER) ||
        mt_config_moe_layers(cfg) == 0)
        return;
    expert_folds x = folds_of(cfg, o, p);
    int64_t h = cfg->hidden, f = cfg->intermediate, held = (cfg->experts + o->ep - 1) / o->ep;
    int64_t ld13 = x.w13_beside ? (h + x.w13_beside + 7) / 8 * 8 : h, ld2 = x.w2_beside ? (f + x.w2_beside + 7) / 8 * 8 : f;
    // A2's rows under W2 only in a layer whose w2 LoRA folds: one that trains (--layers).
    const uint64_t codes = 3 * quant_linear_bytes(h * f, o, cfg->mxfp4);  // one expert's w1, w3, w2
    uint64_t with_a = (uint64_t)(held * 2 * (2 * f * ld13 + (h + x.w2_under) * ld2));
    uint64_t without_a = (uint64_t)(held * 2 * (2 * f * ld13 + h * ld2));
    p->expert_cache_layer_bytes = with_a - (uint64_t)held * codes;  // the most a layer adds
    p->expert_cache_layers = (int)MT_MIN(MT_MAX(o->expert_cache, 0), mt_config_moe_layers(cfg));
    for (int L = (int)cfg->layers - 1, n = 0; L >= 0 && n < p->expert_cache_layers; L--) {
        if (!mt_config_layer_is_moe(cfg, L)) continue;
        n++;
        p->expert_cache_bytes += x.w2_under && mt_index_set_contains(&o->layers, L) ? with_a : without_a;
        p->expert_cache_freed += (uint64_t)held * codes;
    }
    p->expert_cache_held = codes;
    p->bytes[MT_MEM_BASE] += p->expert_cache_bytes - p->expert_cache_freed + (p->expert_cache_layers ? codes : 0);
}

// The GPU step's expert scratch (model/expert_scratch.h), held while one grouped call runs: two
// slots of 4-bit experts' W (one large expert's w1‖w3, or as many small ones as fit 64 MiB) when
// this GPU holds a frozen 4-bit expert, and with expert LoRA
// dropout the buffer of the call's routed rows (this rank's T·k, balanced as the plan assumes) at
// the widest operand a call masks (h for w1, w3; f for w2). The cpu step has neither.
static void expert_scratch(const mt_model_config *cfg, const mt_plan_opts *o, const trainables *t, mt_plan *p) {
    static const unsigned expert_bits = MT_TARGET_W1 | MT_TARGET_W2 | MT_TARGET_W3;
    int64_t h = cfg->hidden, f = cfg->intermediate, rows = o->seq * o->batch * cfg->top_k;
    int q4 = o->quant != MT_QUANT_NONE && (o->quant_targets & MT_QTARGET_EXPERTS);
    int lora = o->mode == MT_MODE_LORA && (o->targets & expert_bits) && p->units_gpu > 0;
    expert_folds x = folds_of(cfg, o, p);
    // Every MoE layer's experts kept in bf16 (--expert-cache): no call dequantizes into a slot.
    int all_kept = p->expert_cache_layers == mt_config_moe_layers(cfg);
    p->expert_dequant_bytes = q4 && !all_kept && frozen_experts_gpu(cfg, o, t, p) > 0
                                  ? (uint64_t)mt_expert_dequant_scratch_bytes(h, f, cfg->experts, x.w2_under,
                                                                              x.w13_beside, x.w2_beside)
                                  : 0;
    p->expert_dropout_bytes = lora && o->lora_dropout > 0 ? (uint64_t)mt_expert_dropout_scratch_bytes(rows, MT_MAX(h, f)) : 0;
}

int mt_plan_compute(const mt_model_config *cfg, const mt_plan_opts *o, mt_plan *p) {
    memset(p, 0, sizeof *p);
    if (mt_plan_check(cfg, o)) return -1;
    linear_sizes s;
    linear_sizes_of(cfg, &s);
    trainables t;
    p->model_params = model_params(cfg);
    count_trainables(cfg, o, &s, &t, p);
    p->units_gpu = units_on_rank0(cfg, o, p->units);  // round-robin over the EP ranks

    frozen_base(cfg, o, &s, &t, p);
    expert_cache(cfg, o, p);
    int64_t expert_train = p->units_gpu * t.unit_params, replicated = 0;
    for (int i = 0; i < p->n_parts; i++)
        if (p->parts[i].replicated) replicated += p->parts[i].count * p->parts[i].each;
    p->trainable_gpu = expert_train + replicated;
    add_state(p, o, expert_train, o->gpus / o->ep);  // copies of an expert: one per EP group
    add_state(p, o, replicated, o->gpus);

    p->act_layer = mt_plan_act_layer_bytes(cfg, o->seq, o->batch);
    p->bytes[MT_MEM_ACT] = mt_plan_act_bytes(cfg, o);
    p->act_model = mt_plan_act_model_bytes(cfg, o);
    p->workspace_guessed = o->workspace_bytes < 0;
    // The guess is the CUDA context, cuBLAS/NCCL workspaces and allocator slack: none on the cpu.
    p->bytes[MT_MEM_WORK] = (uint64_t)(!p->workspace_guessed ? o->workspace_bytes
                                       : o->cpu ? 0 : o->gpus > 1 ? 2.0e9 : 1.5e9);
    expert_scratch(cfg, o, &t, p);
    if (o->cuda) p->bytes[MT_MEM_WORK] += p->expert_dequant_bytes + p->expert_dropout_bytes;
    // NCCL's own buffers are inside the workspace guess; `comm` holds ZeRO-1's flat grads.

    for (int c = 0; c < MT_MEM_COUNT; c++) p->total += p->bytes[c];
    p->gpu_mem = o->gpu_mem_bytes;
    p->percent = 100.0 * (double)p->total / p->gpu_mem;
    p->fits = (double)p->total <= p->gpu_mem;
    return 0;
}

// ---------------------------------------------------------------------------------------------
// What would make it fit

typedef struct {
    const mt_model_config *cfg;
    mt_plan_suggestion *out;
    int max, n;
} suggest_ctx;

static void try_change(suggest_ctx *x, const mt_plan_opts *changed, const char *label) {
    mt_plan p;
    if (x->n >= x->max || mt_plan_compute(x->cfg, changed, &p) != 0 || !p.fits) return;
    snprintf(x->out[x->n].change, sizeof x->out[x->n].change, "%s", label);
    x->out[x->n++].plan = p;
}

int mt_plan_suggest(const mt_model_config *cfg, const mt_plan_opts *o, mt_plan_suggestion *out,
                    int max) {
    suggest_ctx x = {cfg, out, max, 0};
    mt_plan_opts c;
    char label[96];
    if (o->expert_cache > 0) {  // the kept experts and the bf16 copies first: they buy the least
        c = *o;
        c.expert_cache = 0;
        try_change(&x, &c, "--expert-cache off");
    }
    if (o->dequant_cache) {
        c = *o;
        c.dequant_cache = 0;
        try_change(&x, &c, "--dequant-cache off");
    }
    if (o->quant == MT_QUANT_NONE) {
        c = *o;
        c.quant = MT_QUANT_NF4;
        c.double_quant = 1;
        try_change(&x, &c, "--quant nf4");
    } else if (o->quant != MT_QUANT_INT4 && o->quant != MT_QUANT_MXFP4 && !o->double_quant) {
        c = *o;
        c.double_quant = 1;
        try_change(&x, &c, "--double-quant");
    }
    for (int P = 2; P <= cfg->experts; P *= 2) {
        if (cfg->experts % P || P <= o->ep) continue;
        c = *o;
        c.ep = P;
        c.gpus = o->gpus % P == 0 ? o->gpus : P;  // keep the GPUs when EP fits in them
        snprintf(label, sizeof label, "--gpus %d --ep %d", c.gpus, P);
        try_change(&x, &c, label);
    }
    if (!o->offload_optimizer && (!o->adam_8bit || o->master_weights)) {
        c = *o;
        c.adam_8bit = 1;
        c.master_weights = 0;
        snprintf(label, sizeof label, "%s%s%s", o->adam_8bit ? "" : "--adam-8bit",
                 !o->adam_8bit && o->master_weights ? " " : "", o->master_weights ? "--no-master-weights" : "");
        try_change(&x, &c, label);
    }
    if (!o->offload_optimizer) {
        c = *o;
        c.offload_optimizer = 1;
        try_change(&x, &c, "--offload-optimizer");
    }
    // More recomputation: the least that fits (in mt_plan_choose_recompute's order), one line.
    static const mt_ckpt more[] = {MT_CKPT_ATTENTION, MT_CKPT_EXPERTS, MT_CKPT_FULL};
    int from = o->checkpointing == MT_CKPT_NONE ? 0 : o->checkpointing == MT_CKPT_ATTENTION ? 1
             : o->checkpointing == MT_CKPT_EXPERTS ? 2 : 3;
    for (int i = from, n0 = x.n; i < 3 && x.n == n0; i++) {
        c = *o;
        c.checkpointing = more[i];
        snprintf(label, sizeof label, "--recompute %s", mt_ckpt_name(more[i]));
        try_change(&x, &c, label);
    }
    if (o->seq >= 2) {
        c = *o;
        c.seq = o->seq / 2;
        snprintf(label, sizeof label, "--seq %lld", (long long)c.seq);
        try_change(&x, &c, label);
    }
    if (o->batch >= 2) {
        c = *o;
        c.batch = o->batch / 2;
        snprintf(label, sizeof label, "--batch %lld", (long long)c.batch);
        try_change(&x, &c, label);
    }
    return x.n;
}
