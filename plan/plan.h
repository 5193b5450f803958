// plan/ — the memory planner: docs/memory.md's analytic budget, its report (text, JSON), and
// --measure, one real step on the null backend. Uses core/, quant/, model/, optim/ (the
// measured step); used by trainer/ (moetrain plan, and the plan printed before training).
//
// plan/plan.h — the analytic memory planner: docs/memory.md's arithmetic, per GPU, by the
// ledger's categories (core/ledger.h), for a model config and a run's options.
//
// Every figure is for the most loaded GPU: with expert parallelism (EP) the rank that holds
// the most trainable experts (they go round-robin over the EP ranks, so ceil(n/P)).
#pragma once
#include <stdint.h>
#include <stdio.h>

#include "core/ledger.h"
#include "core/backend.h"
#include "model/config.h"
#include "model/spec.h"

#ifdef __cplusplus
extern "C" {
#endif

// What the planner reads of a run (trainer/options.c: mt_run_opts_plan fills it from the flags of
// the same names): the model as built, the shape of a step, parallelism and memory.
typedef struct mt_plan_opts {
    mt_mode mode;
    int lora_r;
    unsigned targets;         // MT_TARGET_* bits (lora mode)
    mt_index_set layers;
    mt_index_set experts;
    mt_quant quant;
    int double_quant;
    int quant_blocksize;      // 0: the format's default
    unsigned quant_targets;   // MT_QTARGET_* bits (quant/quant.h)
    int64_t seq;
    int64_t batch;            // micro-batch per GPU
    mt_ckpt checkpointing;    // MT_CKPT_AUTO: taken as full until mt_plan_choose_recompute resolves it
    int dequant_cache;        // 1: the bf16 copies of model/spec.h's dequant_cache (in base)
    int expert_cache;         // MoE layers whose frozen 4-bit experts are kept in bf16 (model/spec.h's
                              // expert_cache, in base); < 0 (unresolved auto): 0
    double lora_dropout;      // > 0: the GPU step's expert calls hold a dropout buffer (work)
    int cuda;                 // the run is the GPU step (--device cuda): its experts' scratch is in work
    int gpus;
    int ep;
    int zero;                 // 0, 1 or 2
    int offload_optimizer;
    int adam_8bit;
    int master_weights;
    double gpu_mem_bytes;
    double workspace_bytes;   // < 0: the planner's default guess
    int cpu;                  // 1: the run is on the cpu backend: no CUDA context or library workspace
    double lr, clip;          // --measure's AdamW step
    char plan_case;           // 0, 'A', 'B' or 'C'
    // The data loader's host memory per rank (data.h mt_data_work_bytes, filled by the trainer,
    // which may read data/): typical and bound; 0: not counted. Not in the GPU total.
    uint64_t data_host_bytes, data_host_bound;
} mt_plan_opts;

#define MT_PLAN_MAX_PARTS 6
#define MT_PLAN_MAX_SUGGESTIONS 16

// One kind of trainable weight: `count` copies of `each` params ("12 × 176,160,768 experts").
typedef struct mt_plan_part {
    const char *what;
    int64_t count, each;
    int replicated;  // 1: every GPU holds it (data parallel); 0: per expert, spread over EP ranks
} mt_plan_part;

typedef struct mt_plan {
    // Parameter counts behind the bytes.
    int64_t model_params;       // the checkpoint's weights
    int64_t trainable_params;   // the whole run, each weight once (LoRA weights are new ones)
    mt_plan_part parts[MT_PLAN_MAX_PARTS];
    int n_parts;
    int64_t units, units_gpu;   // trainable expert units (an expert, or its LoRA set): run, worst GPU
    int64_t trainable_gpu;      // trainable params on the worst GPU
    int64_t frozen_quant_gpu;   // frozen Linear weights on the worst GPU in the 4-bit format
    int64_t frozen_bf16_gpu;    // frozen weights on the worst GPU in bf16
    uint64_t frozen_quant_bytes;
    uint64_t dequant_cache_bytes;  // --dequant-cache: bf16 copies of the 4-bit Linears outside the experts (in base)
    // --expert-cache: the experts kept in bf16 on this GPU (in base): layers, bytes, and one
    // layer's bytes (what each more layer kept would cost; 0: nothing to keep, the run has no
    // frozen 4-bit experts on a GPU step, or it trains experts: --mode unfreeze or full)
    int expert_cache_layers;
    // --expert-cache: the kept layers' bf16 experts; the 4-bit codes they give back; one expert's
    // codes, which base's peak still holds when any layer is kept (the last expert's, while its
    // bf16 is made: plan.c expert_cache); what one more layer adds to base (its bf16 less its codes).
    uint64_t expert_cache_bytes, expert_cache_freed, expert_cache_held, expert_cache_layer_bytes;
    double quant_bits;          // effective bits per 4-bit weight, constants included (0: none)
    // Bytes on the worst GPU, by category, and their sum.
    uint64_t bytes[MT_MEM_COUNT];
    uint64_t total;
    uint64_t host_bytes;        // Adam state + master moved to host memory (per GPU rank)
    uint64_t act_layer;         // A_layer of docs/memory.md "Activations": one layer's kept activations
    uint64_t act_model;         // the activations the model allocates (ledger `act`), see
                                // mt_plan_act_terms; bytes[MT_MEM_ACT] stays docs/memory.md's
    int workspace_guessed;      // 1: the default guess, not --workspace or a measurement
    // The GPU step's expert scratch (model/expert_scratch.h), in work on cuda beside the guess:
    // the two dequantization slots while a call runs 4-bit experts, and the LoRA dropout buffer
    // of a call's routed rows (expert LoRA with dropout). 0 where the run has none.
    uint64_t expert_dequant_bytes, expert_dropout_bytes;
    double gpu_mem;
    double percent;             // total / gpu_mem · 100
    int fits;
} mt_plan;

// A change to the run and the plan it gives.
typedef struct mt_plan_suggestion {
    char change[96];  // the flags to add, e.g. "--gpus 2 --ep 2"
    mt_plan plan;
} mt_plan_suggestion;

// Mixtral-8x7B's config.json (docs/formats.md "Hugging Face checkpoints"), for --case without --model.
void mt_plan_mixtral_8x7b(mt_model_config *cfg);
// Case 'A', 'B' or 'C' of docs/memory.md "The reference cases" as settings: calls set(ctx, key, value) for each, keys
// being the flags' names ("mode", "layers", ...); trainer/options.c applies them to the run
// options (mt_plan_case_apply). 0, or -1 (bad case, or the first non-zero set()).
int mt_plan_case_settings(char which, int (*set)(void *ctx, const char *key, const char *value), void *ctx);

// Bytes of one frozen Linear of `n` weights in the run's base format (--quant).
uint64_t mt_plan_linear_bytes(int64_t n, const mt_plan_opts *o);
// docs/memory.md "Activations": one layer's kept activations, and the step's whole activation memory. With
// the family's parts: A_layer is the set recomputation shares (the widest MLP of any layer, the
// router's and experts' rows where a MoE layer is); without recomputation each layer keeps its
// own (a dense layer no router or experts).
uint64_t mt_plan_act_layer_bytes(const mt_model_config *cfg, int64_t seq, int64_t batch);
uint64_t mt_plan_act_bytes(const mt_model_config *cfg, const mt_plan_opts *o);

// The model's own activation set (model/acts.c, with a GPU run's dtypes) against docs/memory.md
// §3.2's whole-step figure: the terms, signed, that turn mt_plan_act_bytes into what the
// ledger's `act` holds (the backward's transients are `work` there, no logits at all, the
// routing kept per layer, ...). Returns how many; their sum plus mt_plan_act_bytes is
// mt_plan_act_model_bytes. Terms that are zero for this run are included (print what you like).
#define MT_PLAN_MAX_ACT_TERMS 12
typedef struct mt_plan_act_term {
    const char *what;
    int64_t bytes;
} mt_plan_act_term;
int mt_plan_act_terms(const mt_model_config *cfg, const mt_plan_opts *o, mt_plan_act_term *terms);
uint64_t mt_plan_act_model_bytes(const mt_model_config *cfg, const mt_plan_opts *o);

// Checks the options against the model (errors name the flag): 0, or -1 with mt_error_set().
int mt_plan_check(const mt_model_config *cfg, const mt_plan_opts *o);
// Checks the options against the model (errors name the flag) and computes the plan.
// 0, or -1 with mt_error_set().
int mt_plan_compute(const mt_model_config *cfg, const mt_plan_opts *o, mt_plan *p);

// Single changes to `o` that make the run fit, each with its plan: a 4-bit base, EP over 2, 4,
// 8, ... GPUs, 8-bit Adam without master weights, optimizer offload, full checkpointing,
// half the sequence, half the batch. Returns how many were written (0: none fits).
int mt_plan_suggest(const mt_model_config *cfg, const mt_plan_opts *o, mt_plan_suggestion *out,
                    int max);

// `--measure` (plan/plan_measure.c): one training step of the real code on the null backend.
typedef struct mt_plan_measurement {
    uint64_t peak[MT_MEM_COUNT];  // the ledger's peak per category over build + step
    uint64_t total_peak;          // peak of the sum
    int64_t rows_per_expert;      // balanced routing: T·k/E rows each, the first rows_extra one more
    int64_t rows_extra;
    double seconds;
} mt_plan_measurement;

// Builds the model of `cfg` for `o` on a fresh null backend (checkpoint: its folder or
// config.json, for messages only; nothing is read), then runs zero_grad, forward, backward and
// an AdamW step. Refuses, naming the flag, what the step cannot do yet (EP, DP, ZeRO, offload,
// 8-bit Adam, no master weights). 0, or -1 with an error.
// `spec` is the model the run builds (its mode and quantization as in `o`).
int mt_plan_measure(const mt_model_config *cfg, const char *checkpoint, const mt_plan_opts *o,
                    const mt_model_spec *spec, mt_plan_measurement *out);
// The same step on a backend of the caller's (cuda: the run the plan is checked against; its
// weights random, drawn from spec->seed): the peaks are the step's, above what the backend held
// on entry (its cuBLASLt workspace).
int mt_plan_measure_on(mt_backend *be, const mt_model_config *cfg, const char *checkpoint, const mt_plan_opts *o,
                       const mt_model_spec *spec, mt_plan_measurement *out);

// --measure's verdict: the measured peak of the sum on a card of gpu_mem bytes. With --measure
// it decides (exit 3 when it does not fit), also where the plan's total, an upper bound built on
// docs/memory.md's act ("Activations") and a guessed workspace, says otherwise.
static inline int mt_plan_measured_fits(const mt_plan_measurement *m, double gpu_mem) {
    return (double)m->total_peak <= gpu_mem;
}

// --recompute auto: the least recomputation whose step fits. Candidates in order of the FLOPs
// they recompute: none < attention < experts < full (plan/plan_measure.c says why that order).
// Each is measured (mt_plan_measure: the null backend's step, as `plan --measure`; where the
// measurement refuses the run, the plan's total), its total times `scale` (the cpu keeps f32
// where the measured GPU step keeps bf16: 2 bounds it) plus `reserve` (what the ledger cannot
// see: the CUDA context, library workspaces) against `limit` bytes. The first that fits is
// chosen, else full (the least memory; the plan then says it does not fit).
// What a GPU's total must leave for what the ledger cannot see (the CUDA context, library
// workspaces): --recompute auto's reserve, and the verdicts that quote it.
#define MT_PLAN_CUDA_RESERVE 1e9
typedef struct mt_plan_recompute_choice {
    mt_ckpt mode;
    uint64_t total;   // the chosen mode's deciding total, before scale and reserve
    int measured;     // 1: by the null-backend step; 0: by the plan's total
    int fits;
} mt_plan_recompute_choice;
int mt_plan_choose_recompute(const mt_model_config *cfg, const mt_plan_opts *o, const mt_model_spec *spec,
                             double limit, double scale, double reserve, mt_plan_recompute_choice *out);

// `plan --max-seq`: the longest --seq in [1, limit] whose total fits o->gpu_mem_bytes, by binary
// search (totals grow with the sequence): the plan's total when spec is NULL, else the measured
// one (one null-backend step per probe, spec the model the run builds). *total gets the deciding
// total at the answer. 0: not even one token fits; -1: an error (mt_error_get).
int64_t mt_plan_max_seq(const mt_model_config *cfg, const mt_plan_opts *o, const mt_model_spec *spec, int64_t limit,
                        uint64_t *total);

// What the report prints: the run, its plan, and the suggestions when it does not fit.
typedef struct mt_plan_report {
    const char *model_name;
    const mt_model_config *cfg;
    const mt_plan_opts *opts;
    const mt_plan *plan;
    const mt_plan_suggestion *suggestions;
    int n_suggestions;
    const mt_plan *case_plan;  // --case: the case on its own settings, beside the source's figures
    const mt_plan_measurement *measured;  // --measure: printed beside the plan, or NULL
    const char *recompute;                // how --recompute was chosen (auto's reason), or NULL
    const mt_plan_recompute_choice *auto_choice;  // --recompute auto's choice by the measured step, or NULL
} mt_plan_report;

// The text table; for --case also the source document's figures beside ours.
void mt_plan_print(FILE *out, const mt_plan_report *r);
// The same as JSON (bytes as integers, GB as numbers); the caller frees the string.
char *mt_plan_json(const mt_plan_report *r);

#ifdef __cplusplus
}
#endif
