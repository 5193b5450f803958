// trainer/options.c — the table of run settings: flags, YAML keys, defaults and help.
#include "trainer/options.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <string.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/common.h"
#include "core/yaml.h"
#include "data/data.h"     // MT_MAX_LINE_BYTES_DEFAULT
#include "model/config.h"  // --allow-unknown-config
#include "quant/quant.h"  // quantization targets and blocksizes

typedef enum { OPT_STR, OPT_INT, OPT_I64, OPT_U64, OPT_F64, OPT_BOOL, OPT_BYTES, OPT_SPECIAL } opt_type;

typedef struct {
    const char *key;    // flag without "--", and the YAML key
    opt_type type;
    size_t offset;      // into mt_run_opts
    size_t size;        // for OPT_STR
    const char *help;
} opt_def;

#define F(field) offsetof(mt_run_opts, field)
#define S(field) sizeof(((mt_run_opts *)0)->field)
static const opt_def opt_table[] = {
    {"config", OPT_SPECIAL, 0, 0, "YAML run config; flags given on the command line override it (default: none)"},
    {"model", OPT_STR, F(model), S(model), "checkpoint folder or config.json"},
    {"data", OPT_STR, F(data), S(data), "training data file"},
    {"out", OPT_STR, F(out), S(out), "output folder (train: default ./moetrain-out)"},
    {"backend", OPT_STR, F(backend), S(backend), "cpu | cuda | null"},
    {"mode", OPT_SPECIAL, F(mode), 0, "lora | router | unfreeze | full"},
    {"r", OPT_INT, F(lora_r), 0, "LoRA rank"},
    {"alpha", OPT_F64, F(lora_alpha), 0, "LoRA alpha (scale alpha/r; alpha/sqrt(r) with --rslora); default: r"},
    {"dropout", OPT_F64, F(lora_dropout), 0, "LoRA dropout on the adapter input"},
    {"rslora", OPT_BOOL, F(use_rslora), 0, "rank-stabilised LoRA scaling"},
    {"targets", OPT_SPECIAL, F(targets), 0, "LoRA targets: w1,w2,w3,gate,q,k,v,o, experts, attn, all"},
    {"layers", OPT_SPECIAL, F(layers), 0, "layers to train: all, or e.g. 0-5,7"},
    {"experts", OPT_SPECIAL, F(experts), 0, "experts to train: all, or e.g. 0,1"},
    {"quant", OPT_SPECIAL, F(quant), 0, "frozen base format: nf4 | fp4 | int4 | mxfp4 | none (the checkpoint's own dtype); a dense checkpoint is quantized on load"},
    {"double-quant", OPT_BOOL, F(double_quant), 0, "double-quantize NF4/FP4 absmax (default on)"},
    {"blocksize", OPT_SPECIAL, F(quant_blocksize), 0,
     "4-bit block size: 32..4096, a power of two; 0 = the format's (64 nf4/fp4, 128 int4)"},
    {"quant-targets", OPT_SPECIAL, F(quant_targets), 0,
     "what is 4-bit in the base: experts,attn,router | all | none (default experts,attn)"},
    {"shard-size", OPT_BYTES, F(shard_bytes), 0, "quantize: largest output shard (default 5GB)"},
    {"seq", OPT_I64, F(seq), 0, "sequence length"},
    {"batch", OPT_I64, F(batch), 0, "micro-batch per GPU"},
    {"recompute", OPT_SPECIAL, F(checkpointing), 0,
     "what the backward recomputes instead of keeping: none | attention | experts (the MLP part: router, experts, "
     "dense MLP) | full | auto (the least that fits --gpu-mem, the host's memory on the cpu; docs/memory.md)"},
    {"checkpointing", OPT_SPECIAL, F(checkpointing), 0, "the same as --recompute (full | none, and its other values)"},
    {"dequant-cache", OPT_SPECIAL, F(dequant_cache), 0,
     "GPU step: keep a bf16 copy of each frozen 4-bit weight outside the experts (attention, MLA's projections; "
     "the router, shared experts and dense MLPs when 4-bit), made once at load, instead of dequantizing it at every use: on | off | auto (on "
     "when the run still fits after --recompute's choice; Mixtral-8x7B: 2.7 GB, 1.3% of a step by the roofline)"},
    {"expert-cache", OPT_SPECIAL, F(expert_cache), 0,
     "GPU step: keep the frozen 4-bit experts of the last N MoE layers in bf16, dequantized once, instead of at every "
     "use (forward, backward, recompute): a count N | all | off | auto (the most layers that still fit after "
     "--recompute and --dequant-cache; Mixtral-8x7B: +2.1 GB a layer, its bf16 less the 4-bit codes it gives "
     "back, and ~0.7% of a step by the roofline)"},
    {"gpus", OPT_INT, F(gpus), 0, "number of GPUs"},
    {"ep", OPT_INT, F(ep), 0, "expert-parallel degree"},
    {"zero", OPT_INT, F(zero), 0, "ZeRO stage for replicated trainables: 0, 1 or 2"},
    {"offload-optimizer", OPT_BOOL, F(offload_optimizer), 0, "Adam state and master weights in host memory"},
    {"adam-8bit", OPT_BOOL, F(adam_8bit), 0, "8-bit Adam state"},
    {"master-weights", OPT_BOOL, F(master_weights), 0, "fp32 master copy of bf16 trainables (default on)"},
    {"gpu-mem", OPT_BYTES, F(gpu_mem_bytes), 0, "memory per GPU, e.g. 44GB or 40GiB (default: a cuda run the card's, plan 44GB)"},
    {"workspace", OPT_BYTES, F(workspace_bytes), 0, "workspace per GPU (default: the planner's guess)"},
    {"device", OPT_STR, F(backend), S(backend), "cpu | cuda (same as --backend)"},
    {"steps", OPT_I64, F(steps), 0, "optimizer steps (0: from --epochs)"},
    {"epochs", OPT_F64, F(epochs), 0, "passes over the data when --steps is 0"},
    {"accum", OPT_INT, F(accum), 0, "micro-batches per optimizer step (gradient accumulation)"},
    {"lr", OPT_F64, F(lr), 0, "peak learning rate"},
    {"warmup", OPT_I64, F(warmup), 0, "warmup steps"},
    {"schedule", OPT_STR, F(schedule), S(schedule), "learning-rate schedule: cosine | linear | constant"},
    {"clip", OPT_F64, F(clip), 0, "clip the global gradient norm to this (0: off)"},
    {"weight-decay", OPT_F64, F(weight_decay), 0, "AdamW decoupled weight decay"},
    {"aux-coef", OPT_F64, F(aux_coef), 0, "router aux-loss coefficient (default: config.json's)"},
    {"z-coef", OPT_F64, F(z_coef), 0, "router z-loss coefficient"},
    {"seq-aux-coef", OPT_F64, F(seq_aux_coef), 0,
     "DeepSeek's sequence-wise balance loss coefficient (default: config.json's aux_loss_alpha where seq_aux "
     "is true, else 0; transformers applies none)"},
    {"router-bias-update", OPT_F64, F(router_bias_update), 0,
     "after each step, e_score_correction_bias += RATE x sign(mean load - load) per expert (DeepSeek-V3's "
     "aux-loss-free balancing; families with that bias; default 0: frozen)"},
    {"ckpt", OPT_SPECIAL, F(checkpointing), 0, "the same as --recompute"},
    {"seed", OPT_U64, F(seed), 0, "random seed"},
    {"packing", OPT_BOOL, F(packing), 0, "pack several samples per row (attention may cross them; the loss does not)"},
    {"overlong", OPT_STR, F(overlong), S(overlong), "a sample longer than --seq: truncate | drop | refuse"},
    {"chat-template", OPT_STR, F(chat_template), S(chat_template),
     "template of \"messages\" samples: auto (tokenizer_config.json's chat_template) | mixtral | chatml | qwen | qwen2 | qwen3 | tulu | olmo | harmony"},
    {"chat-date", OPT_STR, F(chat_date), S(chat_date),
     "the date the harmony template (gpt-oss) prints, YYYY-MM-DD (default: today's local date, as transformers)"},
    {"instruction-template", OPT_STR, F(instruction_template), S(instruction_template),
     "prompt of \"instruction\" rows: alpaca (Stanford Alpaca's preamble and ### headers) | none (the instruction "
     "and input alone) | chat (a user turn through the chat template)"},
    {"report-to", OPT_STR, F(report_to), S(report_to),
     "none | tensorboard (event files in OUT/runs beside metrics.jsonl)"},
    {"save-every", OPT_I64, F(save_every), 0, "steps between checkpoints (0: only at the end)"},
    {"save-total-limit", OPT_I64, F(save_total_limit), 0,
     "checkpoints kept in --out, the newest and the best (lowest eval loss) always among them; 0: all (default 3)"},
    {"eval-data", OPT_STR, F(eval_data), S(eval_data), "held-out data for periodic evaluation"},
    {"eval-every", OPT_I64, F(eval_every), 0, "steps between evaluations (0: only at the end)"},
    {"resume", OPT_STR, F(resume), S(resume),
     "continue a run from its output folder (its latest checkpoint) or a checkpoint folder, with the paths and "
     "settings it was started with; flags beside it that change the run are refused"},
    {"resume-override", OPT_BOOL, F(resume_override), 0,
     "--resume: take flags that change the run (--steps, --lr, ...) and log each change in metrics.jsonl"},
    {"overwrite", OPT_BOOL, F(overwrite), 0,
     "train into a non-empty --out: remove the earlier run's outputs there first (otherwise refused)"},
    {"early-stop-patience", OPT_I64, F(early_stop_patience), 0,
     "stop after this many evaluations (--eval-every) without a lower eval loss; the best checkpoint's "
     "weights are written (0: off)"},
    {"mem", OPT_BYTES, F(mem_bytes), 0, "cpu: refuse a run whose planned memory exceeds this"},
    {"max-line-bytes", OPT_BYTES, F(max_line_bytes), 0,
     "a JSONL line keeping more than this is refused naming the line; its strings are kept only to what --seq can use (the rest is read in bounded pieces and checked); default 64MiB"},
    {"max-skips", OPT_INT, F(max_skips), 0, "stop after this many non-finite steps in a row"},
    {"adapter", OPT_STR, F(adapter), S(adapter), "eval/generate/merge: a PEFT adapter folder to apply; train: the LoRAs start from it (v4 or v5 layout)"},
    {"save-tokens", OPT_STR, F(save_tokens), S(save_tokens), "eval: also write the samples it reads, tokenized and loss-masked, as a token file (MTTOK1) for scripts/check_peft.py"},
    {"peft-format", OPT_SPECIAL, F(peft_format), S(peft_format),
     "adapter layout train writes: v4 (transformers 4.x, per-expert w1/w2/w3) | v5 (transformers 5.x, fused "
     "experts) | auto (the transformers_version in --model's config.json; v5 when none)"},
    {"verbose", OPT_BOOL, F(verbose), 0, "train: print the planner's full memory block"},
    {"allow-unknown-config", OPT_BOOL, F(allow_unknown_config), 0,
     "read a config.json with fields moetrain does not know (each warned and ignored; the model may differ "
     "from transformers')"},
    {"prompt", OPT_STR, F(prompt), S(prompt), "generate: the prompt text"},
    {"raw", OPT_BOOL, F(raw), 0,
     "generate: the prompt as given (no chat or instruction template, whatever the adapter was trained on)"},
    {"max-new-tokens", OPT_INT, F(max_new_tokens), 0, "generate: tokens to produce"},
    {"temperature", OPT_F64, F(temperature), 0, "generate: sampling temperature (0: greedy)"},
    {"top-p", OPT_F64, F(top_p), 0, "generate: nucleus sampling threshold"},
    {"case", OPT_SPECIAL, F(plan_case), 0, "plan: reproduce case A, B or C of docs/memory.md"},
    {"json", OPT_BOOL, F(json), 0, "plan: print JSON"},
    {"measure", OPT_BOOL, F(measure), 0, "plan: run one step on the null backend and compare"},
    {"max-seq", OPT_BOOL, F(max_seq), 0, "plan: the longest --seq that fits --gpu-mem (measured with --measure)"},
};
#undef F
#undef S

void mt_run_opts_default(mt_run_opts *o) {
    memset(o, 0, sizeof *o);
    strcpy(o->backend, "cpu");
    o->mode = MT_MODE_LORA;
    o->lora_r = 16;
    o->lora_alpha = NAN;  // resolved to r when unset
    o->targets = MT_TARGET_EXPERTS;
    o->layers.all = 1;
    o->experts.all = 1;
    o->quant = MT_QUANT_NF4;
    o->double_quant = 1;
    o->quant_blocksize = 0;
    o->quant_targets = MT_QTARGET_DEFAULT;
    o->shard_bytes = 5e9;
    o->seq = 1024;
    o->batch = 1;
    o->checkpointing = MT_CKPT_AUTO;
    o->dequant_cache = MT_DEQUANT_CACHE_AUTO;
    o->expert_cache = MT_EXPERT_CACHE_AUTO;
    o->gpus = 1;
    o->ep = 1;
    o->master_weights = 1;
    o->gpu_mem_bytes = 44e9;
    o->max_line_bytes = (double)MT_MAX_LINE_BYTES_DEFAULT;
    o->workspace_bytes = -1;
    o->steps = 0;
    o->epochs = 1;
    o->accum = 1;
    o->lr = 2e-4;
    strcpy(o->schedule, "cosine");
    o->clip = 1.0;
    o->aux_coef = -1;
    o->seq_aux_coef = -1;
    o->seed = 42;
    strcpy(o->overlong, "truncate");
    strcpy(o->chat_template, "auto");
    strcpy(o->instruction_template, "alpaca");
    strcpy(o->report_to, "none");
    o->max_skips = 10;
    o->save_total_limit = 3;
    o->max_new_tokens = 64;
    o->top_p = 1.0;
    strcpy(o->peft_format, "auto");
}

int mt_parse_bytes(const char *text, double *out) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || errno || !isfinite(v) || v < 0) goto bad;
    static const struct { const char *suffix; double mult; } units[] = {
        {"", 1},     {"B", 1},      {"KB", 1e3},  {"MB", 1e6},  {"GB", 1e9},  {"TB", 1e12},
        {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(units); i++)
        if (strcasecmp(end, units[i].suffix) == 0 && (units[i].suffix[0] || !*end)) {
            // Case-insensitive, but "gib" vs "gb" still differ by their letters.
            *out = v * units[i].mult;
            return 0;
        }
bad:
    mt_error_set("'%s' is not a size (e.g. 44GB, 40GiB, 512MiB)", text);
    return -1;
}

static int parse_int64(const char *text, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (end == text || *end || errno || v < lo || v > hi) {
        mt_error_set("'%s' is not an integer in %lld..%lld", text, (long long)lo, (long long)hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_bool(const char *text, int *out) {
    static const char *yes[] = {"1", "true", "yes", "on"}, *no[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < MT_ARRAY_LEN(yes); i++) {
        if (strcasecmp(text, yes[i]) == 0) { *out = 1; return 0; }
        if (strcasecmp(text, no[i]) == 0) { *out = 0; return 0; }
    }
    mt_error_set("'%s' is not a boolean (true/false)", text);
    return -1;
}

static int set_from_list(const char *text, const char *const *names, int count, int *out) {
    for (int i = 0; i < count; i++)
        if (strcmp(text, names[i]) == 0) { *out = i; return 0; }
    char expected[256] = "";
    for (int i = 0; i < count; i++)
        snprintf(expected + strlen(expected), sizeof expected - strlen(expected), "%s%s", i ? ", " : "", names[i]);
    mt_error_set("'%s' is not one of %s", text, expected);
    return -1;
}

static int parse_targets(const char *text, unsigned *out) {
    static const struct { const char *name; unsigned bits; } names[] = {
        {"w1", MT_TARGET_W1}, {"w2", MT_TARGET_W2}, {"w3", MT_TARGET_W3}, {"gate", MT_TARGET_GATE},
        {"router", MT_TARGET_GATE}, {"q", MT_TARGET_Q}, {"k", MT_TARGET_K}, {"v", MT_TARGET_V},
        {"o", MT_TARGET_O}, {"q_proj", MT_TARGET_Q}, {"k_proj", MT_TARGET_K}, {"v_proj", MT_TARGET_V},
        {"o_proj", MT_TARGET_O}, {"experts", MT_TARGET_EXPERTS}, {"attn", MT_TARGET_ATTN},
        {"all", MT_TARGET_EXPERTS | MT_TARGET_ATTN | MT_TARGET_GATE},
    };
    unsigned bits = 0;
    char buf[256];
    if (strlen(text) >= sizeof buf) { mt_error_set("target list too long"); return -1; }
    strcpy(buf, text);
    for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        size_t i;
        for (i = 0; i < MT_ARRAY_LEN(names); i++)
            if (strcmp(tok, names[i].name) == 0) break;
        if (i == MT_ARRAY_LEN(names)) {
            mt_error_set("unknown LoRA target '%s' (w1, w2, w3, gate, q, k, v, o, experts, attn, all)", tok);
            return -1;
        }
        bits |= names[i].bits;
    }
    if (!bits) { mt_error_set("empty target list"); return -1; }
    *out = bits;
    return 0;
}

// 0 (the format's default) or a blocksize every 4-bit format takes.
static int parse_blocksize(const char *text, int *out) {
    int64_t v;
    if (parse_int64(text, 0, 4096, &v) != 0 || (v != 0 && !mt_q4_blocksize_ok((int)v))) {
        mt_error_set("'%s' is not 0 (the format's default) or a power of two in 32..4096", text);
        return -1;
    }
    *out = (int)v;
    return 0;
}

// --expert-cache: off, auto, all, or a count of MoE layers (the model's number is checked later).
static int parse_expert_cache(const char *text, int *out) {
    static const char *const names[] = {"off", "auto", "all"};
    static const int values[] = {0, MT_EXPERT_CACHE_AUTO, MT_EXPERT_CACHE_ALL};
    for (int i = 0; i < 3; i++)
        if (strcmp(text, names[i]) == 0) return *out = values[i], 0;
    int64_t v;
    if (parse_int64(text, 0, 1 << 20, &v) != 0) {
        mt_error_set("'%s' is not off, auto, all or a number of MoE layers (0 to %d)", text, 1 << 20);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int set_opt(void *o, const char *key, const char *value) { return mt_run_opts_set(o, key, value); }

int mt_plan_case_apply(mt_run_opts *o, char which) {
    if (mt_plan_case_settings(which, set_opt, o) != 0) return -1;
    o->plan_case = which;
    return 0;
}

mt_plan_opts mt_run_opts_plan(const mt_run_opts *o) {
    // The data loader's host memory, for tokens of up to 256 bytes (real BPE vocabularies' longest).
    uint64_t data_typical, data_bound = mt_data_work_bytes(o->seq, (uint64_t)o->max_line_bytes, 256, &data_typical);
    return (mt_plan_opts){
        .data_host_bytes = data_typical, .data_host_bound = data_bound,
        .mode = o->mode, .lora_r = o->lora_r, .targets = o->targets, .layers = o->layers, .experts = o->experts,
        .quant = o->quant, .double_quant = o->double_quant, .quant_blocksize = o->quant_blocksize,
        .quant_targets = o->quant_targets, .seq = o->seq, .batch = o->batch, .checkpointing = o->checkpointing,
        .dequant_cache = o->dequant_cache == MT_DEQUANT_CACHE_ON,
        .expert_cache = MT_MAX(o->expert_cache, 0),  // auto or all unresolved: none, the least memory
        .gpus = o->gpus, .ep = o->ep, .zero = o->zero, .offload_optimizer = o->offload_optimizer,
        .adam_8bit = o->adam_8bit, .master_weights = o->master_weights, .gpu_mem_bytes = o->gpu_mem_bytes,
        .workspace_bytes = o->workspace_bytes, .lr = o->lr, .clip = o->clip, .plan_case = o->plan_case,
        .lora_dropout = o->lora_dropout, .cuda = strcmp(o->backend, "cuda") == 0,
    };
}

// --dequant-cache auto on a GPU: on when the step with the copies (at the recompute mode now set)
// fits `limit`, by the measured step as --recompute auto decides, and the plan's verdict stays
// what it was without them (the trainer refuses a run the plan's total does not fit: the copies
// must not turn a yes into a no), else off. Appends to `note` what was decided when the copies
// are on or auto left them off; auto's `choice`, measured, then holds the step with them.
static int resolve_dequant_cache(mt_run_opts *o, const mt_model_config *cfg, double limit, double reserve,
                                 char *note, size_t n, mt_plan_recompute_choice *choice) {
    size_t used = strlen(note);
    int was_auto = o->dequant_cache == MT_DEQUANT_CACHE_AUTO;
    mt_plan_opts po = mt_run_opts_plan(o);
    po.dequant_cache = 1;
    mt_plan p;
    if (mt_plan_compute(cfg, &po, &p) != 0) return -1;
    if (p.dequant_cache_bytes == 0) {  // no 4-bit weight outside the experts: nothing to keep
        o->dequant_cache = MT_DEQUANT_CACHE_OFF;
        return 0;
    }
    if (was_auto) {
        mt_model_spec spec = mt_run_opts_model_spec(o);
        spec.dequant_cache = 1;
        mt_plan_measurement m;
        int measured = mt_plan_measure(cfg, NULL, &po, &spec, &m) == 0;
        double total = measured ? (double)m.total_peak : (double)p.total;
        mt_plan without;
        po.dequant_cache = 0;
        if (mt_plan_compute(cfg, &po, &without) != 0) return -1;
        int fits = total + reserve <= limit && ((double)p.total <= limit || (double)without.total > limit);
        o->dequant_cache = fits ? MT_DEQUANT_CACHE_ON : MT_DEQUANT_CACHE_OFF;
        if (fits && measured && choice && choice->measured) choice->total = m.total_peak;
    }
    if (o->dequant_cache == MT_DEQUANT_CACHE_ON)
        snprintf(note + used, n - used, "; 4-bit weights outside the experts kept in bf16 (%s: %.3g GB)",
                 was_auto ? "--dequant-cache auto" : "--dequant-cache on", p.dequant_cache_bytes / 1e9);
    else if (was_auto)
        snprintf(note + used, n - used, "; 4-bit weights outside the experts dequantized per use (--dequant-cache "
                 "auto: their %.3g GB of bf16 copies would not fit)", p.dequant_cache_bytes / 1e9);
    return 0;
}

// --expert-cache on a GPU, after the recompute mode and --dequant-cache: all becomes the model's
// MoE layers; auto the most layers whose kept experts still fit `limit` both by the measured step
// and by the plan's total (each layer adds the same bytes to base), 0 when none does, when the
// plan's total does not fit even without them, or when the run has no frozen 4-bit experts to
// keep; a count above the model's MoE layers is refused. Appends what was decided to `note`; auto's `choice`, measured, then holds
// the step with the kept experts.
static int resolve_expert_cache(mt_run_opts *o, const mt_model_config *cfg, double limit, double reserve, char *note,
                                size_t n, mt_plan_recompute_choice *choice) {
    size_t used = strlen(note);
    const int moe = (int)mt_config_moe_layers(cfg), asked = o->expert_cache, was_auto = asked == MT_EXPERT_CACHE_AUTO;
    if (asked == MT_EXPERT_CACHE_ALL) o->expert_cache = moe;
    if (o->expert_cache > moe) {
        mt_error_set("--expert-cache %d: the model has %d MoE layers", o->expert_cache, moe);
        return -1;
    }
    mt_plan_opts po = mt_run_opts_plan(o);
    po.expert_cache = 0;
    mt_plan without;
    if (mt_plan_compute(cfg, &po, &without) != 0) return -1;
    const double layer = (double)without.expert_cache_layer_bytes;
    if (layer == 0) {  // nothing to keep: no frozen 4-bit experts on a GPU step, or experts that train
        if (o->expert_cache > 0)
            snprintf(note + used, n - used, "; --expert-cache %d: no frozen 4-bit experts to keep (it takes --mode "
                     "lora or router with 4-bit experts on a GPU)", o->expert_cache);
        o->expert_cache = 0;
        return 0;
    }
    if (was_auto) {
        mt_model_spec spec = mt_run_opts_model_spec(o);
        spec.expert_cache = 0;
        mt_plan_measurement m;
        int measured = choice && choice->measured;
        double total = measured ? (double)choice->total : (double)without.total;
        if (!measured && mt_plan_measure(cfg, NULL, &po, &spec, &m) == 0) measured = 1, total = (double)m.total_peak;
        // Each layer kept adds `layer` to base (its bf16 less its 4-bit codes), which the whole step
        // holds: the measured peak and the plan's total grow by it (keeping every layer also drops
        // the dequantization slots); the plan's base also holds one expert's codes at its peak
        // once any layer is kept.
        double room = limit - reserve - total, plan_room = limit - (double)without.total - (double)without.expert_cache_held;
        int by_step = room > 0 ? (int)MT_MIN(floor(room / layer), moe) : 0;
        int by_plan = plan_room > 0 ? (int)MT_MIN(floor(plan_room / layer), moe) : 0;  // the plan says no: none
        o->expert_cache = MT_MIN(by_step, by_plan);
        if (o->expert_cache > 0 && measured && choice && choice->measured) {
            po.expert_cache = spec.expert_cache = o->expert_cache;
            if (mt_plan_measure(cfg, NULL, &po, &spec, &m) == 0) choice->total = m.total_peak;
        }
    }
    if (o->expert_cache > 0)
        snprintf(note + used, n - used, "; the last %d of %d MoE layers' experts kept in bf16 (--expert-cache %s: +%.3g GB, "
                 "their 4-bit codes given back)",
                 o->expert_cache, moe, was_auto ? "auto" : asked == MT_EXPERT_CACHE_ALL ? "all" : "as set",
                 (double)o->expert_cache * layer / 1e9);
    else if (was_auto)
        snprintf(note + used, n - used, "; experts dequantized per use (--expert-cache auto: a layer's +%.3g GB, its bf16 "
                 "experts less their codes, would not fit)", layer / 1e9);
    return 0;
}

int mt_run_opts_resolve_recompute(mt_run_opts *o, const mt_model_config *cfg, int gpu, char *note, size_t n,
                                  mt_plan_recompute_choice *choice) {
    if (choice) memset(choice, 0, sizeof *choice), choice->mode = o->checkpointing;
    int cuda = gpu;
    double phys = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    double limit = cuda ? o->gpu_mem_bytes : o->mem_bytes > 0 ? o->mem_bytes : phys;
    double scale = cuda ? 1.0 : 2.0, reserve = cuda ? MT_PLAN_CUDA_RESERVE : 0.0;
    // The cpu step multiplies the 4-bit tiles: it keeps no copies, and the recompute mode is
    // chosen without them.
    int cpu_asked = !gpu && o->dequant_cache == MT_DEQUANT_CACHE_ON;
    if (!gpu) o->dequant_cache = MT_DEQUANT_CACHE_OFF;
    if (o->checkpointing != MT_CKPT_AUTO) {
        snprintf(note, n, "%s (as set)", mt_ckpt_name(o->checkpointing));
    } else {
        // Auto's copies come after the recompute mode, chosen without them: recomputing costs far
        // more time than dequantizing does (Mixtral-8x7B at s 4096 by the roofline: recomputing
        // attention costs 31 ms a step, every layer 254 ms; the copies save 7 ms).
        int cache = o->dequant_cache;
        if (cache == MT_DEQUANT_CACHE_AUTO) o->dequant_cache = MT_DEQUANT_CACHE_OFF;
        mt_plan_opts po = mt_run_opts_plan(o);
        mt_model_spec spec = mt_run_opts_model_spec(o);
        o->dequant_cache = cache;
        mt_plan_recompute_choice c;
        if (mt_plan_choose_recompute(cfg, &po, &spec, limit, scale, reserve, &c) != 0) return -1;
        o->checkpointing = c.mode;
        if (choice) *choice = c;
        const char *by = c.measured ? "the measured step" : "the plan";
        const char *where = gpu == MT_GPU_MEM_OF_CARD ? "the card" : cuda ? "--gpu-mem" : o->mem_bytes > 0 ? "--mem" : "host memory";
        double need = (double)c.total * scale + reserve;
        if (c.fits)
            snprintf(note, n, "%s (auto: fits %.0f GB of %s by %s: %.3g GB%s)", mt_ckpt_name(c.mode), limit / 1e9,
                     where, by, need / 1e9, cuda ? " with 1 GB for the CUDA context" : ", the GPU step's bytes twice for f32");
        else
            snprintf(note, n, "%s (auto: nothing fits %.0f GB of %s; full needs %.1f GB by %s)", mt_ckpt_name(c.mode),
                     limit / 1e9, where, need / 1e9, by);
    }
    if (cpu_asked) {
        size_t used = strlen(note);
        snprintf(note + used, n - used, "; --dequant-cache on: the cpu step keeps no bf16 copies (it multiplies the "
                 "4-bit tiles)");
    }
    if (!gpu) {
        if (o->expert_cache != 0 && o->expert_cache != MT_EXPERT_CACHE_AUTO) {
            size_t used = strlen(note);
            snprintf(note + used, n - used, "; --expert-cache: the cpu step keeps no bf16 experts");
        }
        o->expert_cache = 0;
        return 0;
    }
    if (resolve_dequant_cache(o, cfg, limit, reserve, note, n, choice) != 0) return -1;
    return resolve_expert_cache(o, cfg, limit, reserve, note, n, choice);
}

mt_model_spec mt_run_opts_model_spec(const mt_run_opts *o) {
    return (mt_model_spec){
        .mode = o->mode, .lora_r = o->lora_r, .lora_alpha = o->lora_alpha, .lora_dropout = o->lora_dropout,
        .use_rslora = o->use_rslora, .targets = o->targets, .layers = o->layers, .experts = o->experts,
        .quant = o->quant, .double_quant = o->double_quant, .quant_blocksize = o->quant_blocksize,
        .quant_targets = o->quant_targets, .seed = o->seed,
        // auto is resolved by the trainer (mt_plan_resolve_recompute) before it builds the model;
        // a model built from unresolved options (eval, generate, tests) recomputes every layer,
        // the least memory, as every run did before auto existed.
        .checkpointing = o->checkpointing == MT_CKPT_AUTO ? MT_CKPT_FULL : o->checkpointing,
        .dequant_cache = o->dequant_cache == MT_DEQUANT_CACHE_ON,  // auto unresolved: off, the least memory
        // auto and all unresolved: none; a count only where experts are all frozen (the model's rule)
        .expert_cache = o->mode == MT_MODE_LORA || o->mode == MT_MODE_ROUTER ? MT_MAX(o->expert_cache, 0) : 0,
    };
}

static const opt_def *find_opt(const char *key) {
    for (size_t i = 0; i < MT_ARRAY_LEN(opt_table); i++)
        if (strcmp(opt_table[i].key, key) == 0) return &opt_table[i];
    return NULL;
}

static int set_special(mt_run_opts *o, const char *key, const char *value) {
    if (strcmp(key, "mode") == 0) {
        static const char *n[] = {"lora", "router", "unfreeze", "full"};
        int v;
        if (set_from_list(value, n, 4, &v)) return -1;
        o->mode = (mt_mode)v;
        return 0;
    }
    if (strcmp(key, "quant") == 0) {
        static const char *n[] = {"nf4", "fp4", "int4", "mxfp4", "none"};  // mt_quant's order
        int v;
        if (set_from_list(value, n, 5, &v)) return -1;
        o->quant = (mt_quant)v;
        return 0;
    }
    if (strcmp(key, "recompute") == 0 || strcmp(key, "checkpointing") == 0 || strcmp(key, "ckpt") == 0) {
        static const char *n[] = {"full", "none", "attention", "experts", "auto"};  // mt_ckpt's order
        int v;
        if (set_from_list(value, n, 5, &v)) return -1;
        o->checkpointing = (mt_ckpt)v;
        return 0;
    }
    if (strcmp(key, "dequant-cache") == 0) {
        static const char *n[] = {"off", "on", "auto"};  // MT_DEQUANT_CACHE_*'s order
        return set_from_list(value, n, 3, &o->dequant_cache);
    }
    if (strcmp(key, "expert-cache") == 0) return parse_expert_cache(value, &o->expert_cache);
    if (strcmp(key, "targets") == 0) return parse_targets(value, &o->targets);
    if (strcmp(key, "peft-format") == 0) {
        static const char *n[] = {"v4", "v5", "auto"};
        int v;
        if (set_from_list(value, n, 3, &v)) return -1;
        strcpy(o->peft_format, n[v]);
        return 0;
    }
    if (strcmp(key, "quant-targets") == 0) return mt_quant_targets_parse(value, &o->quant_targets);
    if (strcmp(key, "blocksize") == 0) return parse_blocksize(value, &o->quant_blocksize);
    if (strcmp(key, "layers") == 0) return mt_index_set_parse(&o->layers, value);
    if (strcmp(key, "experts") == 0) return mt_index_set_parse(&o->experts, value);
    if (strcmp(key, "case") == 0) {
        if (strlen(value) != 1 || !strchr("ABCabc", value[0])) {
            mt_error_set("'%s' is not a case (A, B or C)", value);
            return -1;
        }
        o->plan_case = (char)toupper((unsigned char)value[0]);
        return 0;
    }
    mt_error_set("option '%s' cannot be set here", key);
    return -1;
}

int mt_run_opts_set(mt_run_opts *o, const char *key, const char *value) {
    const opt_def *d = find_opt(key);
    if (!d) {
        char hint[96];
        mt_opt_suggest(key, "", hint, sizeof hint);
        mt_error_set("unknown option '%s'%s (see --help)", key, hint);
        return -1;
    }
    char *field = (char *)o + d->offset;
    int64_t i64;
    double f;
    int rc = 0;
    switch (d->type) {
    case OPT_STR: {
        // Settings with a fixed set of values are checked here, so a typo is a usage error (exit 2).
        static const char *const report[] = {"none", "tensorboard"}, *const inst[] = {"alpaca", "none", "chat"};
        int v;
        if (strlen(value) >= d->size) { mt_error_set("value too long (%zu bytes max)", d->size - 1); rc = -1; }
        else if (strcmp(key, "report-to") == 0 && set_from_list(value, report, 2, &v)) rc = -1;
        else if (strcmp(key, "instruction-template") == 0 && set_from_list(value, inst, 3, &v)) rc = -1;
        else strcpy(field, value);
        break;
    }
    case OPT_INT:
        rc = parse_int64(value, 0, 1 << 30, &i64);
        if (!rc) *(int *)field = (int)i64;
        break;
    case OPT_I64:
        rc = parse_int64(value, 0, INT64_MAX / 2, &i64);
        if (!rc) *(int64_t *)field = i64;
        break;
    case OPT_U64:
        rc = parse_int64(value, 0, INT64_MAX, &i64);
        if (!rc) *(uint64_t *)field = (uint64_t)i64;
        break;
    case OPT_F64: {
        char *end;
        errno = 0;
        f = strtod(value, &end);
        if (end == value || *end || errno || !isfinite(f)) { mt_error_set("'%s' is not a number", value); rc = -1; }
        else *(double *)field = f;
        break;
    }
    case OPT_BOOL: rc = parse_bool(value, (int *)field); break;
    case OPT_BYTES: rc = mt_parse_bytes(value, (double *)field); break;
    case OPT_SPECIAL: rc = set_special(o, key, value); break;
    }
    if (!rc && d->type != OPT_STR && d->type != OPT_BOOL && d->type != OPT_SPECIAL)
        rc = mt_opt_range_check(key, d->type == OPT_INT ? *(int *)field : d->type == OPT_F64 || d->type == OPT_BYTES
                                                               ? *(double *)field : (double)*(int64_t *)field, value);
    if (rc) mt_error_prefix("--%s", key);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// What a command was given

void mt_opt_pairs_add(mt_opt_pairs *p, const char *key, const char *value) {
    if (!p) return;
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 32;
        p->kv = mt_xrealloc(p->kv, (size_t)p->cap * 2 * sizeof(char *));
    }
    p->kv[2 * p->n] = mt_xstrdup(key), p->kv[2 * p->n + 1] = mt_xstrdup(value);
    p->n++;
}

void mt_opt_pairs_free(mt_opt_pairs *p) {
    for (int i = 0; i < 2 * p->n; i++) free(p->kv[i]);
    free(p->kv);
    memset(p, 0, sizeof *p);
}

const char *mt_opt_pairs_get(const mt_opt_pairs *p, const char *key) {
    for (int i = p->n - 1; i >= 0; i--)
        if (strcmp(p->kv[2 * i], key) == 0) return p->kv[2 * i + 1];
    return NULL;
}

// Paths are kept absolute, so that --resume works from any folder.
static int is_path_key(const char *key) {
    static const char *const keys[] = {"model", "data", "eval-data", "adapter", "out", "save-tokens"};
    for (size_t i = 0; i < MT_ARRAY_LEN(keys); i++)
        if (strcmp(keys[i], key) == 0) return 1;
    return 0;
}

static void add_given(mt_opt_pairs *given, const char *key, const char *value) {
    if (!given || strcmp(key, "resume") == 0 || strcmp(key, "resume-override") == 0 || strcmp(key, "overwrite") == 0)
        return;
    char abs[4200], cwd[4096], real[PATH_MAX];
    if (is_path_key(key) && value[0] && realpath(value, real)) value = real;  // ./x and x alike
    else if (is_path_key(key) && value[0] && value[0] != '/' && getcwd(cwd, sizeof cwd)) {
        snprintf(abs, sizeof abs, "%s/%s", cwd, value);
        value = abs;
    }
    mt_opt_pairs_add(given, key, value);
}

// The settings that only say how a run is carried out, saved or reported: a resumed run may change them.
int mt_opt_changes_run(const char *key) {
    static const char *const how[] = {
        "config", "out", "backend", "device", "workspace", "gpu-mem", "mem", "save-every", "save-total-limit",
        "eval-every", "resume", "resume-override", "overwrite", "max-line-bytes", "max-skips", "verbose",
        "allow-unknown-config", "peft-format", "offload-optimizer", "early-stop-patience", "report-to",
        "recompute", "checkpointing", "ckpt",  // recomputation gives the same bits (tests/test_checkpointing.c)
        "dequant-cache",  // the same dequantization, kept or redone: the same bits
        "expert-cache",   // the same, for the experts (CPU-emulated: the same bits; tests/test_cuda_step.c)
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(how); i++)
        if (strcmp(how[i], key) == 0) return 0;
    return find_opt(key) != NULL;
}

// The bytes of the field a key sets (aliases share one).
static size_t field_size(const opt_def *d) {
    switch (d->type) {
    case OPT_STR: return d->size;
    case OPT_INT: case OPT_BOOL: return sizeof(int);
    case OPT_I64: case OPT_U64: case OPT_F64: case OPT_BYTES: return 8;
    case OPT_SPECIAL: break;
    }
    static const struct { const char *key; size_t size; } special[] = {
        {"mode", sizeof(mt_mode)}, {"quant", sizeof(mt_quant)}, {"checkpointing", sizeof(mt_ckpt)},
        {"recompute", sizeof(mt_ckpt)},
        {"ckpt", sizeof(mt_ckpt)}, {"targets", sizeof(unsigned)}, {"quant-targets", sizeof(unsigned)},
        {"blocksize", sizeof(int)}, {"layers", sizeof(mt_index_set)}, {"experts", sizeof(mt_index_set)},
        {"peft-format", 8}, {"case", 1}, {"dequant-cache", sizeof(int)}, {"expert-cache", sizeof(int)},
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(special); i++)
        if (strcmp(special[i].key, d->key) == 0) return special[i].size;
    return 0;
}

int mt_run_opts_differs(const mt_run_opts *o, const char *key, const char *value) {
    const opt_def *d = find_opt(key);
    if (!d || !field_size(d)) return 0;
    mt_run_opts *copy = mt_xmalloc(sizeof *copy);
    memcpy(copy, o, sizeof *copy);
    int rc = mt_run_opts_set(copy, key, value);
    if (rc == 0) rc = memcmp((const char *)o + d->offset, (const char *)copy + d->offset, field_size(d)) != 0;
    free(copy);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// Which sub-commands read a flag. Not listed: train alone. `plan` takes every train flag too (it
// plans the run they describe).
static const struct { const char *key, *cmds; } scope[] = {
    {"config", "*"},
    {"model", "train plan eval generate merge quantize"},
    {"allow-unknown-config", "train plan eval generate merge quantize"},
    {"quant", "train plan eval generate merge quantize"},
    {"double-quant", "train plan eval generate merge quantize"},
    {"blocksize", "train plan eval generate merge quantize"},
    {"quant-targets", "train plan eval generate merge quantize"},
    {"backend", "train plan eval generate quantize"},
    {"device", "train plan eval generate quantize"},
    {"data", "train eval"},
    {"out", "train merge quantize"},
    {"adapter", "train eval generate merge"},
    {"seq", "train eval"},
    {"batch", "train eval"},
    {"packing", "train eval"},
    {"overlong", "train eval"},
    {"instruction-template", "train eval"},
    {"max-line-bytes", "train eval"},
    {"chat-template", "train eval generate"},
    {"chat-date", "train eval generate"},
    {"seed", "train eval generate"},
    {"shard-size", "quantize"},
    {"save-tokens", "eval"},
    {"prompt", "generate"},
    {"max-new-tokens", "generate"},
    {"temperature", "generate"},
    {"top-p", "generate"},
    {"raw", "generate"},
    {"case", "plan"},
    {"json", "plan"},
    {"measure", "plan"},
    {"max-seq", "plan"},
};

static const char *scope_of(const char *key) {
    for (size_t i = 0; i < MT_ARRAY_LEN(scope); i++)
        if (strcmp(scope[i].key, key) == 0) return scope[i].cmds;
    return "train";
}

static int in_list(const char *list, const char *word) {
    size_t n = strlen(word);
    for (const char *p = list; (p = strstr(p, word)); p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == 0 || p[n] == ' ')) return 1;
    return 0;
}

static int applies(const char *key, const char *cmd) {
    const char *cmds = scope_of(key);
    if (!cmd || strcmp(cmds, "*") == 0 || in_list(cmds, cmd)) return 1;
    return strcmp(cmd, "plan") == 0 && in_list(cmds, "train");
}

// ---------------------------------------------------------------------------------------------
// "did you mean"

static int edit_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > 63 || m > 63) return 99;
    int row[64];
    for (size_t j = 0; j <= m; j++) row[j] = (int)j;
    for (size_t i = 1; i <= n; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= m; j++) {
            int up = row[j], cost = a[i - 1] != b[j - 1];
            int best = MT_MIN(up + 1, row[j - 1] + 1);
            row[j] = MT_MIN(best, diag + cost);
            diag = up;
        }
    }
    return row[m];
}

void mt_opt_suggest(const char *key, const char *prefix, char *buf, size_t n) {
    // The names transformers' TrainingArguments, PEFT's LoraConfig and axolotl give the same settings.
    static const struct { const char *theirs, *ours; } known[] = {
        {"learning-rate", "lr"}, {"num-train-epochs", "epochs"}, {"num-epochs", "epochs"},
        {"max-steps", "steps"}, {"lora-r", "r"}, {"rank", "r"}, {"lora-alpha", "alpha"},
        {"lora-dropout", "dropout"}, {"per-device-train-batch-size", "batch"}, {"micro-batch-size", "batch"},
        {"batch-size", "batch"}, {"gradient-accumulation-steps", "accum"}, {"warmup-steps", "warmup"},
        {"lr-scheduler-type", "schedule"}, {"lr-scheduler", "schedule"}, {"max-grad-norm", "clip"},
        {"sequence-len", "seq"}, {"max-seq-length", "seq"}, {"max-length", "seq"}, {"seq-len", "seq"},
        {"output-dir", "out"}, {"base-model", "model"}, {"model-name-or-path", "model"}, {"dataset", "data"},
        {"datasets", "data"}, {"train-file", "data"}, {"target-modules", "targets"},
        {"lora-target-modules", "targets"}, {"save-steps", "save-every"}, {"eval-steps", "eval-every"},
        {"gradient-checkpointing", "checkpointing"}, {"load-in-4bit", "quant"}, {"bnb-4bit-quant-type", "quant"},
        {"use-rslora", "rslora"}, {"resume-from-checkpoint", "resume"}, {"early-stopping-patience", "early-stop-patience"},
        {"eval-file", "eval-data"}, {"val-set", "eval-data"}, {"adapter-path", "adapter"}, {"lora-model-dir", "adapter"},
    };
    char norm[64];
    size_t len = strlen(key);
    buf[0] = 0;
    if (len >= sizeof norm) return;
    for (size_t i = 0; i <= len; i++) norm[i] = key[i] == '_' ? '-' : (char)tolower((unsigned char)key[i]);
    const char *best = NULL;
    for (size_t i = 0; i < MT_ARRAY_LEN(known) && !best; i++)
        if (strcmp(norm, known[i].theirs) == 0) best = known[i].ours;
    int best_d = 99;
    if (!best)
        for (size_t i = 0; i < MT_ARRAY_LEN(opt_table); i++) {
            int d = edit_distance(norm, opt_table[i].key);
            if (d < best_d) best_d = d, best = opt_table[i].key;
        }
    // close enough: a third of the name, at least one edit (a swapped pair counts as two)
    if (best && (best_d == 99 || best_d <= MT_MAX(2, (int)len / 3)))
        snprintf(buf, n, " (did you mean %s%s?)", prefix, best);
}

typedef struct { mt_run_opts *o; const char *path; mt_opt_pairs *given; } yaml_ctx;

static int yaml_pair(void *ctx, const char *key, const char *value, int line, int column) {
    yaml_ctx *y = ctx;
    if (strcmp(key, "config") == 0) {
        mt_error_set("%s:%d:%d: a run config cannot include another", y->path, line, column);
        return -1;
    }
    if (mt_run_opts_set(y->o, key, value) != 0) {
        mt_error_prefix("%s:%d:%d", y->path, line, column);
        return -1;
    }
    add_given(y->given, key, value);
    return 0;
}

int mt_run_opts_parse_cmd(mt_run_opts *o, int argc, char **argv, const char *cmd, mt_opt_pairs *given) {
    // Pass 1: --config first, so that every flag overrides it whatever the order.
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--config", 8) == 0 && (a[8] == 0 || a[8] == '=')) {
            const char *path = a[8] == '=' ? a + 9 : (i + 1 < argc ? argv[i + 1] : NULL);
            if (!path) { mt_error_set("--config: needs a file"); return -1; }
            yaml_ctx y = {o, path, given};
            if (mt_yaml_read_flat(path, yaml_pair, &y) != 0) return -1;
        }
    }
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0 || !a[2]) {
            mt_error_set("unexpected argument '%s' (flags start with --)", a);
            return -1;
        }
        char key[64];
        const char *eq = strchr(a + 2, '='), *value;
        size_t klen = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        if (klen >= sizeof key) { mt_error_set("unknown flag '%s'", a); return -1; }
        memcpy(key, a + 2, klen);
        key[klen] = 0;
        const opt_def *d = find_opt(key);
        int negated = 0;
        if (!d && strncmp(key, "no-", 3) == 0 && (d = find_opt(key + 3)) && d->type == OPT_BOOL) negated = 1;
        else if (!d || (strncmp(key, "no-", 3) == 0 && !find_opt(key))) {
            char hint[96];
            mt_opt_suggest(key, "--", hint, sizeof hint);
            mt_error_set("unknown flag '--%s'%s (see --help)", key, hint);
            return -1;
        }
        if (!applies(d->key, cmd)) {
            const char *cmds = scope_of(d->key);
            mt_error_set("--%s does not apply to `moetrain %s`: it is a flag of %s%s (see moetrain %s --help)", d->key,
                         cmd, cmds, in_list(cmds, "train") && !in_list(cmds, "plan") ? " and plan" : "", cmd);
            return -1;
        }
        if (d->type == OPT_BOOL && !eq) value = negated ? "false" : "true";
        else if (negated) { mt_error_set("--%s takes no value", key); return -1; }
        else if (eq) value = eq + 1;
        else if (i + 1 < argc) value = argv[++i];
        else { mt_error_set("--%s: needs a value", key); return -1; }
        if (strcmp(d->key, "config") == 0) continue;  // loaded in pass 1
        if (mt_run_opts_set(o, d->key, value) != 0) return -1;
        add_given(given, d->key, value);
    }
    mt_config_allow_unknown(o->allow_unknown_config);  // before any command reads a config.json
    // --model ORG/NAME: the Hugging Face cache's copy (never a download)
    char dir[4096];
    int hf = o->model[0] ? mt_hf_cache_resolve(o->model, dir, sizeof dir) : 1;
    if (hf < 0) return mt_error_prefix("--model"), -1;
    if (hf == 0) {
        if (strlen(dir) >= sizeof o->model) { mt_error_set("--model: %s: path too long", dir); return -1; }
        mt_info("--model %s: the Hugging Face cache's %s", o->model, dir);
        strcpy(o->model, dir);
        if (given) add_given(given, "model", dir);
    }
    return 0;
}

int mt_run_opts_parse(mt_run_opts *o, int argc, char **argv) { return mt_run_opts_parse_cmd(o, argc, argv, NULL, NULL); }

const mt_exit_code_doc mt_exit_codes[] = {
    {MT_EXIT_OK, "done"},
    {MT_EXIT_ERROR, "an error: bad input, a file that cannot be read or written (the message names it)"},
    {MT_EXIT_USAGE, "a bad flag or value: unknown, out of its range, not for this sub-command or this model, "
                    "a missing required flag, a non-empty --out"},
    {MT_EXIT_NOFIT, "the plan does not fit --gpu-mem or --mem (nothing was trained)"},
    {MT_EXIT_OOM, "out of memory: a host or device allocation failed"},
    {130, "stopped by SIGINT (Ctrl-C) after saving a checkpoint: --resume OUT continues it"},
    {143, "stopped by SIGTERM after saving a checkpoint: --resume OUT continues it"},
};
const int mt_exit_codes_n = (int)MT_ARRAY_LEN(mt_exit_codes);

void mt_exit_codes_print(FILE *out) {
    fprintf(out, "exit codes:\n");
    for (int i = 0; i < mt_exit_codes_n; i++) fprintf(out, "  %3d  %s\n", mt_exit_codes[i].code, mt_exit_codes[i].meaning);
}

// The default of option d as --help shows it, or "" when it has none (a required path) or its
// help text already says it.
static void default_text(const mt_run_opts *def, const opt_def *d, char *buf, size_t n) {
    const char *field = (const char *)def + d->offset;
    buf[0] = 0;
    if (strstr(d->help, "default")) return;
    switch (d->type) {
    case OPT_STR:
        snprintf(buf, n, "%s", field[0] ? field : "none");
        break;
    case OPT_INT: snprintf(buf, n, "%d", *(const int *)field); break;
    case OPT_I64: snprintf(buf, n, "%lld", (long long)*(const int64_t *)field); break;
    case OPT_U64: snprintf(buf, n, "%llu", (unsigned long long)*(const uint64_t *)field); break;
    case OPT_F64: snprintf(buf, n, "%g", *(const double *)field); break;
    case OPT_BOOL: snprintf(buf, n, "%s", *(const int *)field ? "on" : "off"); break;
    case OPT_BYTES: {
        double v = *(const double *)field;
        if (v >= 1e9 && fmod(v, 1e9) == 0) snprintf(buf, n, "%gGB", v / 1e9);
        else snprintf(buf, n, "%g", v);
        break;
    }
    case OPT_SPECIAL: {
        static const struct { const char *key, *text; } special[] = {
            {"mode", "lora"}, {"targets", "experts"}, {"layers", "all"}, {"experts", "all"}, {"quant", "nf4"},
            {"recompute", "auto"}, {"checkpointing", "auto"}, {"ckpt", "auto"}, {"blocksize", "0"}, {"peft-format", "auto"}, {"case", "none"},
            {"dequant-cache", "auto"}, {"expert-cache", "auto"},
        };
        for (size_t i = 0; i < MT_ARRAY_LEN(special); i++)
            if (strcmp(special[i].key, d->key) == 0) snprintf(buf, n, "%s", special[i].text);
        break;
    }
    }
}

void mt_run_opts_print_help(FILE *out) {
    mt_run_opts def;
    mt_run_opts_default(&def);
    fprintf(out, "flags (each also a YAML key of a --config file; boolean flags take --no-NAME):\n");
    for (size_t i = 0; i < MT_ARRAY_LEN(opt_table); i++) {
        const opt_def *d = &opt_table[i];
        char range[96], dflt[96], tail[256] = "";
        if (mt_opt_range_text(d->key, range, sizeof range)) snprintf(tail, sizeof tail, "; range %s", range);
        default_text(&def, d, dflt, sizeof dflt);
        if (dflt[0]) snprintf(tail + strlen(tail), sizeof tail - strlen(tail), " (default %s)", dflt);
        fprintf(out, "  --%-18s %s%s\n", d->key, d->help, tail);
    }
}

int mt_args_want_help(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return 1;
    return 0;
}
