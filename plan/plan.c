// plan/plan.c — the planner's arithmetic (BUDGETS.md §1–4), per GPU and ledger category.
//
// Choices where BUDGETS.md leaves room (each one reported in the plan's output or its tests):
//   * 4-bit bytes are quant/'s own count (mt_q4_weight_bytes): blocks per tensor, rounded up;
//     per-tensor constants (code table, nested map, offset: ~1 KB a tensor) are left out, as
//     BUDGETS.md §2 does and as the ledger does (they are shared constants).
//   * --quant-targets decides which frozen Linears are 4-bit (default experts and attention;
//     routers, embeddings, lm_head and norms bf16, as BUDGETS.md §2).
//   * The workspace guess is 2.0 GB whenever there is more than one GPU (NCCL buffers exist
//     for plain data parallelism too), 1.5 GB on one.
//   * ZeRO shards a weight's optimizer state (and grads at stage 2) over the GPUs that hold a
//     copy of it: all GPUs for replicated weights, gpus/ep for per-expert weights.
//   * Activations follow §3.2 for every layer (L), whatever the lowest trainable layer.
#include "plan/plan.h"

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
    // BUDGETS.md §4: every case is s=1024, b=1, full checkpointing, NF4-DQ base, one 44 GB card.
    static const struct { char which; const char *key, *value; } settings[] = {
        {0, "quant", "nf4"}, {0, "double-quant", "true"}, {0, "seq", "1024"}, {0, "batch", "1"},
        {0, "checkpointing", "full"}, {0, "gpus", "1"}, {0, "ep", "1"}, {0, "gpu-mem", "44GB"},
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

static int64_t mixtral_params(const mt_model_config *cfg, const linear_sizes *s) {
    int64_t layer = sum_of(s->attn, 4) + 2 * cfg->hidden + cfg->hidden * cfg->experts +
                    cfg->experts * sum_of(s->expert, 3);
    return cfg->layers * layer + outer_params(cfg);
}

// The family's parts beside Mixtral's (docs/families.md): shared experts and their gates,
// attention biases, q/k norms. The step keeps them dense (bf16 on the GPU), frozen but in --mode
// full; their LoRA and activations are not counted yet (0 for Mixtral). Dense layers are counted
// as MoE layers (router and experts, more than their MLP): an overestimate, so nothing is said
// to fit that does not; then the extra parts are taken as none.
static int64_t family_extra_params(const mt_model_config *cfg, const linear_sizes *s) {
    return MT_MAX(mt_config_total_params(cfg) - mixtral_params(cfg, s), (int64_t)0);
}

static int64_t model_params(const mt_model_config *cfg) { return mt_config_total_params(cfg); }

uint64_t mt_plan_linear_bytes(int64_t n, const mt_plan_opts *o) {
    if (o->quant == MT_QUANT_NONE) return 2 * (uint64_t)n;  // bf16, whatever the checkpoint's dtype
    // quant/'s own count (packed nibbles + per-block constants), so plan and ledger agree for
    // every format and blocksize: NF4-DQ 4.127 bits, NF4 4.5, INT4 group 128 4.25 (BUDGETS.md §2).
    int bs = mt_q4_blocksize_or_default(o->quant, o->quant_blocksize);
    return mt_q4_weight_bytes(o->quant, n, bs, o->double_quant);
}

// Frozen Linears of sizes n[0..count) held `copies` times, in bf16 or 4-bit as --quant and
// --quant-targets (`target`) say; adds to the 4-bit or the bf16 tally of the plan.
static uint64_t frozen_linears(mt_plan *p, const mt_plan_opts *o, const int64_t *n, int count, int64_t copies,
                               unsigned target) {
    int quantized = o->quant != MT_QUANT_NONE && (o->quant_targets & target);
    uint64_t b = 0;
    for (int i = 0; i < count; i++) {
        b += (uint64_t)copies * (quantized ? mt_plan_linear_bytes(n[i], o) : 2 * (uint64_t)n[i]);
        if (quantized) p->frozen_quant_gpu += copies * n[i];
        else p->frozen_bf16_gpu += copies * n[i];
    }
    if (quantized) p->frozen_quant_bytes += b;
    return b;
}

// ---------------------------------------------------------------------------------------------
// Activations (BUDGETS.md §3.2)

uint64_t mt_plan_act_layer_bytes(const mt_model_config *cfg, int64_t seq, int64_t batch) {
    int64_t h = cfg->hidden, f = cfg->intermediate, k = cfg->top_k;
    int64_t h_kv = cfg->kv_heads * cfg->head_dim;
    int64_t per_token = 12 * h + 4 * h_kv + 4 * cfg->heads + 4 * cfg->experts + 8 * k + 8 +
                        k * (4 * h + 6 * f);
    return (uint64_t)(batch * seq * per_token);
}

uint64_t mt_plan_act_bytes(const mt_model_config *cfg, const mt_plan_opts *o) {
    uint64_t sb = (uint64_t)(o->seq * o->batch);
    uint64_t layer = mt_plan_act_layer_bytes(cfg, o->seq, o->batch);
    uint64_t transient = (uint64_t)cfg->top_k * sb * 6 * (uint64_t)cfg->intermediate;  // grads of g, u, h
    uint64_t logits = 10 * sb * (uint64_t)cfg->vocab;  // bf16 logits, fp32 upcast, fp32 grad
    uint64_t L = (uint64_t)cfg->layers;
    uint64_t kept = o->checkpointing == MT_CKPT_FULL
                        ? L * 2 * sb * (uint64_t)cfg->hidden + layer  // layer inputs + one recompute
                        : L * layer;
    return kept + transient + logits;
}

// LoRA xa buffers of one activation set: [T, r] per adapted attention Linear and router,
// [T·k, r] per adapted expert weight (w1, w2, w3), bf16.
static uint64_t lora_xa_bytes(const mt_model_config *cfg, const mt_plan_opts *o, int64_t sb) {
    static const unsigned per_row[] = {MT_TARGET_Q, MT_TARGET_K, MT_TARGET_V, MT_TARGET_O, MT_TARGET_GATE};
    static const unsigned per_copy[] = {MT_TARGET_W1, MT_TARGET_W2, MT_TARGET_W3};
    if (o->mode != MT_MODE_LORA) return 0;
    uint64_t b = 0;
    for (size_t i = 0; i < MT_ARRAY_LEN(per_row); i++)
        if (o->targets & per_row[i]) b += 2 * (uint64_t)(sb * o->lora_r);
    int ne = mt_index_set_count(&o->experts, (int)cfg->experts);
    for (size_t i = 0; ne && i < MT_ARRAY_LEN(per_copy); i++)
        if (o->targets & per_copy[i]) b += 2 * (uint64_t)(sb * cfg->top_k * o->lora_r);
    return b;
}

int mt_plan_act_terms(const mt_model_config *cfg, const mt_plan_opts *o, mt_plan_act_term *t) {
    int64_t sb = o->seq * o->batch, h = cfg->hidden, k = cfg->top_k, E = cfg->experts, V = cfg->vocab;
    int64_t L = cfg->layers, qd = cfg->heads * cfg->head_dim, full = o->checkpointing == MT_CKPT_FULL;
    int64_t sets = full ? 1 : L;  // activation sets: one shared by recomputation, or one per layer
    int64_t lora_sets = full ? mt_index_set_count(&o->layers, (int)L) > 0
                             : mt_index_set_count(&o->layers, (int)L);
    int n = 0;
    t[n++] = (mt_plan_act_term){"backward transient k·s·b·6f (grads of gate, up, act): work in the model",
                                -6 * k * sb * cfg->intermediate};
    t[n++] = (mt_plan_act_term){"logits and loss 10·s·b·V: none kept, the fused loss holds a chunk of rows at a time "
                                "(work: 201 MB at V = 32000)", -10 * sb * V};
    t[n++] = (mt_plan_act_term){"layer input again in A_layer (\"norm1 in\"): kept once, as the layer input",
                                full ? -2 * h * sb : 0};
    t[n++] = (mt_plan_act_term){"top-k ids 4k per row in A_layer: kept with the routing, below", -4 * k * sb * sets};
    t[n++] = (mt_plan_act_term){"routing kept per layer: ids, expert order (4k + 4k per row), offsets",
                                L * (8 * k * sb + 4 * (E + 1))};
    t[n++] = (mt_plan_act_term){"router logits fp32 4E per row (router backward and z-loss read them)",
                                4 * E * sb * sets};
    t[n++] = (mt_plan_act_term){"q and attention output heads·head_dim wide where A_layer has h", 4 * (qd - h) * sb * sets};
    t[n++] = (mt_plan_act_term){"final norm input and output 2·2h, its rstd 4 per row", (4 * h + 4) * sb};
    t[n++] = (mt_plan_act_term){"LoRA xa = dropout(x)·Aᵀ, 2r per adapted Linear and row", (int64_t)lora_xa_bytes(cfg, o, sb) * lora_sets};
    t[n++] = (mt_plan_act_term){"the batch on the device (tokens, targets, positions 4 each, mask 1 per row) and "
                                "the aux and z-loss statistics, 8·(2E+3)", 13 * sb + 8 * (2 * E + 3)};
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

static int plan_check(const mt_model_config *cfg, const mt_plan_opts *o) {
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
    int64_t L = cfg->layers, E = cfg->experts, h = cfg->hidden, r = o->lora_r;
    int64_t nl = mt_index_set_count(&o->layers, (int)L), ne = mt_index_set_count(&o->experts, (int)E);
    int64_t expert = sum_of(s->expert, 3), router = h * E;
    memset(t, 0, sizeof *t);
    switch (o->mode) {
    case MT_MODE_ROUTER:
        t->router_layers = nl;
        add_part(p, "routers", nl, router, 1);
        break;
    case MT_MODE_UNFREEZE:
        t->unit_params = expert;
        t->units_are_experts = 1;
        t->router_layers = nl;
        add_part(p, "experts", nl * ne, expert, 0);
        add_part(p, "routers", nl, router, 1);
        break;
    case MT_MODE_LORA:
        t->unit_params = lora_params(r, s->expert_in, s->expert_out, 3, o->targets, expert_bits);
        add_part(p, "expert LoRA", nl * ne, t->unit_params, 0);
        if (o->targets & MT_TARGET_GATE) add_part(p, "router LoRA", nl, r * (h + E), 1);
        add_part(p, "attention LoRA", nl, lora_params(r, s->attn_in, s->attn_out, 4, o->targets, attn_bits), 1);
        break;
    case MT_MODE_FULL:
        t->unit_params = expert;
        t->units_are_experts = 1;
        t->router_layers = L;
        t->dense_trainable = 1;
        add_part(p, "experts", L * E, expert, 0);
        add_part(p, "routers", L, router, 1);
        add_part(p, "attention + norms", L, sum_of(s->attn, 4) + 2 * h, 1);
        add_part(p, "embeddings, lm_head, final norm", 1, outer_params(cfg), 1);
        add_part(p, "shared experts, biases, q/k norms", 1, family_extra_params(cfg, s), 1);
        break;
    }
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

// Frozen weights on the worst GPU: its E/P experts of every layer less the trainable ones it
// holds, attention of every layer, embeddings, norms and frozen routers (replicated).
static void frozen_base(const mt_model_config *cfg, const mt_plan_opts *o, const linear_sizes *s,
                        const trainables *t, mt_plan *p) {
    int64_t experts_gpu = cfg->layers * ceil_div(cfg->experts, o->ep);
    int64_t frozen_experts = experts_gpu - (t->units_are_experts ? p->units_gpu : 0);
    int64_t attn_layers = t->dense_trainable ? 0 : cfg->layers;
    int64_t router[1] = {cfg->hidden * cfg->experts};
    uint64_t b = frozen_linears(p, o, s->expert, 3, frozen_experts, MT_QTARGET_EXPERTS) +
                 frozen_linears(p, o, s->attn, 4, attn_layers, MT_QTARGET_ATTN) +
                 frozen_linears(p, o, router, 1, cfg->layers - t->router_layers, MT_QTARGET_ROUTER);
    int64_t outer = t->dense_trainable ? 0 : outer_params(cfg) + cfg->layers * 2 * cfg->hidden +
                                                 family_extra_params(cfg, s);
    p->frozen_bf16_gpu += outer;  // embeddings, lm_head, norms: never 4-bit
    p->quant_bits = p->frozen_quant_gpu ? 8.0 * (double)p->frozen_quant_bytes / (double)p->frozen_quant_gpu : 0;
    p->bytes[MT_MEM_BASE] = b + 2 * (uint64_t)outer;  // outer: also the family's extra parts, kept dense
}

int mt_plan_compute(const mt_model_config *cfg, const mt_plan_opts *o, mt_plan *p) {
    memset(p, 0, sizeof *p);
    if (plan_check(cfg, o)) return -1;
    linear_sizes s;
    linear_sizes_of(cfg, &s);
    trainables t;
    p->model_params = model_params(cfg);
    count_trainables(cfg, o, &s, &t, p);
    p->units_gpu = ceil_div(p->units, o->ep);  // round-robin over the EP ranks

    frozen_base(cfg, o, &s, &t, p);
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
    p->bytes[MT_MEM_WORK] = (uint64_t)(p->workspace_guessed ? (o->gpus > 1 ? 2.0e9 : 1.5e9)
                                                            : o->workspace_bytes);
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
    if (o->quant == MT_QUANT_NONE) {
        c = *o;
        c.quant = MT_QUANT_NF4;
        c.double_quant = 1;
        try_change(&x, &c, "--quant nf4");
    } else if (o->quant != MT_QUANT_INT4 && !o->double_quant) {
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
    if (o->checkpointing != MT_CKPT_FULL) {
        c = *o;
        c.checkpointing = MT_CKPT_FULL;
        try_change(&x, &c, "--checkpointing full");
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
