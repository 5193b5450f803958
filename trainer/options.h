// trainer/options.h — a run's settings, from flags and YAML run configs (flags win).
//
// One table (options.c) names every setting once: its flag, its YAML key (the flag without
// "--"), its type, its default and its help line. Sub-commands read the fields they use.
#pragma once
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MT_MAX_INDEX 1024  // largest layer or expert index a set may name, plus one

typedef enum { MT_MODE_LORA, MT_MODE_ROUTER, MT_MODE_UNFREEZE, MT_MODE_FULL } mt_mode;
typedef enum { MT_QUANT_NF4, MT_QUANT_FP4, MT_QUANT_INT4, MT_QUANT_NONE } mt_quant;
typedef enum { MT_CKPT_FULL, MT_CKPT_NONE } mt_ckpt;

// A set of layer or expert indices: "all", or a list of indices and ranges ("0-5,7").
typedef struct mt_index_set {
    int all;
    int count;
    uint16_t items[MT_MAX_INDEX];  // sorted, unique
} mt_index_set;

// LoRA targets, as bits.
enum {
    MT_TARGET_W1 = 1 << 0, MT_TARGET_W2 = 1 << 1, MT_TARGET_W3 = 1 << 2,
    MT_TARGET_GATE = 1 << 3,  // the router
    MT_TARGET_Q = 1 << 4, MT_TARGET_K = 1 << 5, MT_TARGET_V = 1 << 6, MT_TARGET_O = 1 << 7,
    MT_TARGET_EXPERTS = MT_TARGET_W1 | MT_TARGET_W2 | MT_TARGET_W3,
    MT_TARGET_ATTN = MT_TARGET_Q | MT_TARGET_K | MT_TARGET_V | MT_TARGET_O,
};

typedef struct mt_run_opts {
    // model and data
    char model[1024];         // checkpoint folder or config.json
    char data[1024];
    char out[1024];
    char backend[16];         // cpu | cuda | null
    // what is trained
    mt_mode mode;
    int lora_r;
    double lora_alpha;
    double lora_dropout;
    int use_rslora;
    unsigned targets;         // MT_TARGET_* bits (lora mode)
    mt_index_set layers;
    mt_index_set experts;
    // frozen base
    mt_quant quant;
    int double_quant;
    int quant_blocksize;      // 0: the format's default (64 NF4/FP4, 128 INT4)
    unsigned quant_targets;   // MT_QTARGET_* bits (quant/quant.h): what a dense checkpoint quantizes
    double shard_bytes;       // quantize: largest output shard
    // shape of a step
    int64_t seq;
    int64_t batch;            // micro-batch per GPU
    mt_ckpt checkpointing;
    // parallelism and memory
    int gpus;
    int ep;
    int zero;                 // 0, 1 or 2
    int offload_optimizer;
    int adam_8bit;
    int master_weights;       // fp32 master copy of bf16 trainables
    double gpu_mem_bytes;
    double workspace_bytes;   // < 0: the planner's default guess
    // training
    int64_t steps;            // optimizer steps (0: from --epochs)
    double epochs;            // used when --steps is 0
    int accum;                // micro-batches per optimizer step
    double lr;
    int64_t warmup;           // warmup steps
    char schedule[16];        // cosine | linear | constant
    double clip;              // global grad-norm clip (0: off)
    double weight_decay;
    double aux_coef;          // < 0: router_aux_loss_coef from config.json
    double z_coef;            // router z-loss coefficient
    uint64_t seed;
    int packing;
    char overlong[16];        // truncate | drop | refuse
    int64_t save_every;       // steps between checkpoints (0: only at the end)
    int64_t save_total_limit; // checkpoints kept in --out (0: all); newest and best always
    char eval_data[1024];
    int64_t eval_every;
    char resume[1024];        // checkpoint folder (or an output folder: its latest checkpoint)
    double mem_bytes;         // cpu: refuse a run whose plan exceeds this (0: no check)
    int max_skips;            // stop after this many non-finite steps in a row
    // eval / generate / merge
    char adapter[1024];       // PEFT adapter folder to apply
    char prompt[4096];
    int max_new_tokens;
    double temperature;       // 0: greedy
    double top_p;
    // plan
    char plan_case;           // 0, 'A', 'B' or 'C'
    int json;
    int measure;
} mt_run_opts;

void mt_run_opts_default(mt_run_opts *o);

// Parses argv (flags only; the sub-command already removed) into `o`, after loading any
// --config YAML first so that flags override it. 0, or -1 with an error naming the flag.
int mt_run_opts_parse(mt_run_opts *o, int argc, char **argv);
// Sets one option by key ("r", "mode", ...) from text; used by flags and YAML alike.
int mt_run_opts_set(mt_run_opts *o, const char *key, const char *value);
void mt_run_opts_print_help(FILE *out);
// The documented range of a numeric setting (trainer/option_ranges.c): 0 when `v` (given as
// `text`) lies in it (or the key has none), else -1 with an error saying the range. mt_opt_range_text writes it as
// "[lo, hi]" / "(lo, hi]" and returns 0 for a key without one.
int mt_opt_range_check(const char *key, double v, const char *text);
int mt_opt_range_text(const char *key, char *buf, size_t n);
// 1 when argv holds --help or -h: every sub-command then prints its usage and exits 0.
int mt_args_want_help(int argc, char **argv);

// "all", "3", "0-5", "0,2,4-6"; indices < MT_MAX_INDEX.
int mt_index_set_parse(mt_index_set *s, const char *text);
int mt_index_set_contains(const mt_index_set *s, int i);
// Number of members among 0..n-1.
int mt_index_set_count(const mt_index_set *s, int n);
// Byte counts: "44GB", "44GiB", "44e9", "512MiB"; GB = 1e9, GiB = 2^30.
int mt_parse_bytes(const char *text, double *out);

const char *mt_mode_name(mt_mode m);
// The run's LoRA alpha: --alpha, or r when it was not given (NaN).
double mt_run_opts_lora_alpha(const mt_run_opts *o);
const char *mt_quant_name(mt_quant q);

#ifdef __cplusplus
}
#endif
