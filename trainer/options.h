// trainer/ — the moetrain program: main, the run options (this header), the training loop
// (train.c), training-state checkpoints, metrics, and the sub-commands in trainer/cmd/. Uses
// every folder below it; used by nobody but tests/ and scripts/.
//
// trainer/options.h — a run's settings, from flags and YAML run configs (flags win).
//
// One table (options.c) names every setting once: its flag, its YAML key (the flag without
// "--"), its type, its default and its help line. Sub-commands read the fields they use.
#pragma once
#include <stdint.h>
#include <stdio.h>

#include "model/spec.h"  // mt_mode, mt_ckpt, MT_TARGET_*, mt_model_spec; mt_index_set, mt_quant
#include "plan/plan.h"  // mt_plan_opts

#ifdef __cplusplus
extern "C" {
#endif

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
    int dequant_cache;        // MT_DEQUANT_CACHE_*: off, on, or auto (resolved with --recompute's auto)
    int expert_cache;         // MoE layers whose experts are kept in bf16: 0 off, N, or MT_EXPERT_CACHE_AUTO
                              // / _ALL (resolved with --recompute's auto)
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
    double seq_aux_coef;      // < 0: aux_loss_alpha from config.json where seq_aux is true, else 0
    double router_bias_update;  // DeepSeek-V3's balancing rate for e_score_correction_bias (0: frozen)
    uint64_t seed;
    int packing;
    char overlong[16];        // truncate | drop | refuse
    char chat_template[16];   // auto (tokenizer_config.json's) | mixtral | chatml | qwen | qwen2 | tulu | harmony
    char chat_date[16];       // harmony's "Current date" (YYYY-MM-DD); "": today's local date
    char instruction_template[16];  // alpaca | none | chat: how instruction rows become prompts
    char report_to[16];       // none | tensorboard: also write TensorBoard event files in OUT/runs
    int64_t save_every;       // steps between checkpoints (0: only at the end)
    int64_t save_total_limit; // checkpoints kept in --out (0: all); newest and best always
    char eval_data[1024];
    int64_t eval_every;
    char resume[1024];        // checkpoint folder (or an output folder: its latest checkpoint)
    int resume_override;      // --resume: flags that change the run are taken (and logged), not refused
    int overwrite;            // a non-empty --out is cleared of moetrain's outputs first
    int64_t early_stop_patience; // stop after this many evals without a lower eval loss (0: off)
    double mem_bytes;         // cpu: refuse a run whose plan exceeds this (0: no check)
    double max_line_bytes;    // a JSONL line keeping more than this (besides its long strings' cut text) is refused
    int max_skips;            // stop after this many non-finite steps in a row
    // eval / generate / merge
    char adapter[1024];       // PEFT adapter folder to apply
    char save_tokens[1024];   // eval: also write the rows it reads as a token file (MTTOK1)
    char peft_format[8];      // adapter layout written: v4 | v5 | auto (lora/peft.h)
    int verbose;              // train: the planner's full block
    int allow_unknown_config; // config.json fields moetrain does not know: warned and ignored
    char prompt[4096];
    int max_new_tokens;
    int raw;                  // generate: the prompt as given, no chat or instruction template
    double temperature;       // 0: greedy
    double top_p;
    // plan
    char plan_case;           // 0, 'A', 'B' or 'C'
    int json;
    int measure;
    int max_seq;              // plan: search the longest --seq that fits
} mt_run_opts;

void mt_run_opts_default(mt_run_opts *o);

// Parses argv (flags only; the sub-command already removed) into `o`, after loading any
// --config YAML first so that flags override it. 0, or -1 with an error naming the flag.
int mt_run_opts_parse(mt_run_opts *o, int argc, char **argv);
// The settings a command was given, in order ("key", "value" pairs: the --config file's, then
// the flags'); the trainer keeps them in state.json so that --resume OUT alone continues a run.
typedef struct mt_opt_pairs {
    int n, cap;
    char **kv;  // kv[2i] the key, kv[2i+1] the value (owned)
} mt_opt_pairs;
void mt_opt_pairs_add(mt_opt_pairs *p, const char *key, const char *value);
void mt_opt_pairs_free(mt_opt_pairs *p);
// The value given for `key` (the last one), or NULL.
const char *mt_opt_pairs_get(const mt_opt_pairs *p, const char *key);

// mt_run_opts_parse for sub-command `cmd` ("train", "eval", ...; NULL: any): a flag that `cmd`
// does not read is refused naming it (a --config file may hold keys for other commands); what
// was given is added to `given` (may be NULL), paths made absolute. A --model of the form
// ORG/NAME that is not a folder here is looked up in the Hugging Face cache (trainer/hf_cache.c).
int mt_run_opts_parse_cmd(mt_run_opts *o, int argc, char **argv, const char *cmd, mt_opt_pairs *given);
// Whether a setting changes what a run computes (steps, schedule, model, data, r, ...), so that
// --resume refuses it unless --resume-override; 0 for how it is run, saved or logged.
int mt_opt_changes_run(const char *key);
// 1 when setting key=value on `o` changes it (the value parsed as a flag would be); -1 on a bad value.
int mt_run_opts_differs(const mt_run_opts *o, const char *key, const char *value);
// "did you mean --lr?" for an unknown key (edit distance, and the names transformers, PEFT and
// axolotl use for the same setting): writes "" when nothing is close.
void mt_opt_suggest(const char *key, const char *prefix, char *buf, size_t n);

// The exit codes, as `--help` and README's table list them.
typedef struct { int code; const char *meaning; } mt_exit_code_doc;
extern const mt_exit_code_doc mt_exit_codes[];
extern const int mt_exit_codes_n;
void mt_exit_codes_print(FILE *out);

// --model ORG/NAME: the local Hugging Face cache's snapshot folder (trainer/hf_cache.c): $HF_HUB_CACHE,
// else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub; then
// models--ORG--NAME/snapshots/<refs/main>. Nothing is downloaded. 0 with dir filled, 1 when `name`
// is not of that form (or is a path here), -1 with an error naming the folder looked in.
int mt_hf_cache_resolve(const char *name, char *dir, size_t n);

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

// Byte counts: "44GB", "44GiB", "44e9", "512MiB"; GB = 1e9, GiB = 2^30.
int mt_parse_bytes(const char *text, double *out);

// Case 'A', 'B' or 'C' of docs/memory.md "The reference cases" (plan/plan.c) set on `o`, flags parsed afterwards override it.
int mt_plan_case_apply(mt_run_opts *o, char which);
// What the planner reads (plan/plan.h): the fields of `o` of the same names.
mt_plan_opts mt_run_opts_plan(const mt_run_opts *o);
// The model the run builds (model/spec.h): the fields of `o` the model reads.
mt_model_spec mt_run_opts_model_spec(const mt_run_opts *o);
// --recompute auto resolved for this run (plan/plan.h mt_plan_choose_recompute): for a GPU
// (`gpu`: a cuda run, and `moetrain plan`, which plans a card) against --gpu-mem less 1 GB that
// the ledger cannot see (the CUDA context, library workspaces); on the cpu against --mem, else
// the host's physical memory, with the measured GPU step's total doubled (the cpu keeps f32
// where it keeps bf16). Sets o->checkpointing to the choice and writes what the one-line plan
// says of it into `note` ("none (auto: fits 80 GB of --gpu-mem by the measured step: 63.4
// GB ...)"); a mode set by a flag or a case is kept ("experts (as set)"). 0, or -1 with an error.
// gpu: 0 the cpu, 1 a card of --gpu-mem, MT_GPU_MEM_OF_CARD a card whose own memory the trainer
// put in --gpu-mem (the note says "of the card"). choice (NULL: not wanted) gets auto's choice
// (zero but its mode when the mode was set).
// --dequant-cache auto is resolved here too, after the recompute mode (set or chosen): on when
// the GPU step holds a bf16 copy of its 4-bit weights outside the experts (model/spec.h) and
// still fits the same limit, else off; the note then also says so. The cpu keeps it off (its
// step dequantizes nothing: it multiplies the 4-bit tiles).
enum { MT_GPU_MEM_OF_CARD = 2 };
enum { MT_DEQUANT_CACHE_OFF, MT_DEQUANT_CACHE_ON, MT_DEQUANT_CACHE_AUTO };
// --expert-cache auto and all, resolved here too (after --dequant-cache): auto keeps the last N
// MoE layers' experts in bf16 for the largest N that still fits the same limit (0 where a GPU step
// has no frozen 4-bit experts to keep, and always on the cpu), all every MoE layer's.
enum { MT_EXPERT_CACHE_AUTO = -1, MT_EXPERT_CACHE_ALL = -2 };
int mt_run_opts_resolve_recompute(mt_run_opts *o, const mt_model_config *cfg, int gpu, char *note, size_t n,
                                  mt_plan_recompute_choice *choice);
// Both as a pointer for one call, e.g. mt_model_load(m, be, dir, MT_MODEL_SPEC_OF(o)) in tests:
// a compound literal, alive until the end of the enclosing block.
#define MT_MODEL_SPEC_OF(o) ((mt_model_spec[1]){mt_run_opts_model_spec(o)})
#define MT_PLAN_OPTS_OF(o) ((mt_plan_opts[1]){mt_run_opts_plan(o)})

#ifdef __cplusplus
}
#endif
