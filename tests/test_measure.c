// `moetrain plan --measure`: one real training step on the null backend, its ledger peaks against
// the planner. base, train, grad, optim, master and act (the model's set, mt_plan_act_terms)
// agree to the byte for every mode; the CLI reproduces case C within 2% in a few seconds.
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>
#include <time.h>

#include "core/common.h"
#include "model/config.h"
#include "tests/test_util.h"
#include "trainer/options.h"
#include "plan/plan.h"

static int opts_of(char which, const char *flags, mt_run_opts *o) {
    char buf[512], *argv[32];
    int argc = 0;
    mt_run_opts_default(o);
    if (which && mt_plan_case_apply(o, which) != 0) return -1;
    snprintf(buf, sizeof buf, "%s", flags);
    for (char *s, *t = strtok_r(buf, " ", &s); t && argc < 32; t = strtok_r(NULL, " ", &s)) argv[argc++] = t;
    return mt_run_opts_parse(o, argc, argv);
}

static const mt_mem_cat exact[] = {MT_MEM_BASE, MT_MEM_TRAIN, MT_MEM_GRAD, MT_MEM_OPTIM, MT_MEM_MASTER};

// Plan and measurement of `flags` on `cfg`: every state category and act to the byte.
static void expect_exact(const mt_model_config *cfg, char which, const char *flags) {
    mt_run_opts o;
    cr_assert_eq(opts_of(which, flags, &o), 0, "%s: %s", flags, mt_error_get());
    mt_plan p;
    mt_plan_measurement m;
    cr_assert_eq(mt_plan_compute(cfg, MT_PLAN_OPTS_OF(&o), &p), 0, "%s: %s", flags, mt_error_get());
    cr_assert_eq(mt_plan_measure(cfg, NULL, MT_PLAN_OPTS_OF(&o), MT_MODEL_SPEC_OF(&o), &m), 0, "%s: %s", flags, mt_error_get());
    for (size_t i = 0; i < MT_ARRAY_LEN(exact); i++)
        cr_expect_eq(m.peak[exact[i]], p.bytes[exact[i]], "case %c %s: %s measured %llu, planned %llu", which ? which : '-',
                     flags, mt_mem_cat_name(exact[i]), (unsigned long long)m.peak[exact[i]],
                     (unsigned long long)p.bytes[exact[i]]);
    cr_expect_eq(m.peak[MT_MEM_ACT], p.act_model, "case %c %s: act measured %llu, the model's set planned %llu",
                 which ? which : '-', flags, (unsigned long long)m.peak[MT_MEM_ACT], (unsigned long long)p.act_model);
    cr_expect_gt(m.peak[MT_MEM_WORK], 0, "the step's scratch is counted");
    cr_expect_eq(m.peak[MT_MEM_COMM], p.bytes[MT_MEM_COMM], "case %c %s: comm measured %llu, planned %llu",
                 which ? which : '-', flags, (unsigned long long)m.peak[MT_MEM_COMM],
                 (unsigned long long)p.bytes[MT_MEM_COMM]);
}

Test(measure, mixtral_every_case_to_the_byte) {
    mt_model_config cfg;
    mt_plan_mixtral_8x7b(&cfg);
    expect_exact(&cfg, 'A', "");
    expect_exact(&cfg, 'B', "");
    expect_exact(&cfg, 'C', "");
    expect_exact(&cfg, 'C', "--seq 512 --batch 2 --checkpointing none");
    expect_exact(&cfg, 'C', "--seq 512 --recompute attention");
    expect_exact(&cfg, 'C', "--seq 512 --recompute experts --targets all");
    expect_exact(&cfg, 'C', "--quant int4");
    expect_exact(&cfg, 'C', "--no-double-quant --blocksize 128 --quant-targets all");
    expect_exact(&cfg, 'C', "--targets all --layers 4-9 --experts 1,5 --r 8 --dropout 0.1");
    expect_exact(&cfg, 'A', "--quant none --layers 30,31 --seq 256");
    // the bf16 copies of the 4-bit weights outside the experts: attention's; the router's too
    expect_exact(&cfg, 'C', "--dequant-cache on");
    expect_exact(&cfg, 'C', "--dequant-cache on --quant-targets all --targets w1,w2,w3");
    expect_exact(&cfg, 'B', "--dequant-cache on");
    // the experts of the last layers kept in bf16, with room for their LoRAs' blocks (every fold
    // at r = 16; none at r = 12 with dropout), and of every layer (no dequantization slots then)
    expect_exact(&cfg, 'C', "--expert-cache 3");
    expect_exact(&cfg, 'C', "--expert-cache 2 --r 12 --dropout 0.1 --seq 512");
    expect_exact(&cfg, 'A', "--expert-cache 32 --dequant-cache on");
    expect_exact(&cfg, 'C', "--expert-cache 4 --layers 0-5");  // kept layers without LoRA: no rows for A
}

// The family configs: Qwen2-MoE (dense layers 0 and 2, a shared expert in layer 1, q/k/v
// biases), Qwen3-MoE (a dense layer, per-head q/k norms), OLMoE (whole-projection q/k norms,
// clip_qkv). Their LoRA on the shared expert and dense MLPs, their activations and the dense
// layers' lack of router and experts, to the byte as for Mixtral.
Test(measure, small_configs_every_mode) {
    static const char *names[] = {"tiny.json", "mid.json", "tiny-qwen2-moe.json", "tiny-qwen3-moe.json", "tiny-olmoe.json"};
    static const char *runs[] = {
        "--mode lora --targets all --r 4", "--mode router --checkpointing none", "--mode unfreeze --layers 1 --experts 0,3",
        "--mode full --quant none", "--mode lora --targets q,o,w2 --quant fp4 --seq 100 --batch 3",
        "--mode lora --targets all --checkpointing none --layers 0,1", "--mode lora --targets w1,w3 --layers 0 --r 3",
        "--mode lora --targets gate,w2 --layers 1 --gpus 4 --zero 1", "--mode full --quant none --checkpointing none",
        "--mode lora --targets all --r 4 --recompute attention", "--mode lora --targets all --r 4 --recompute experts",
        "--mode lora --targets q,w2 --layers 1 --recompute attention", "--mode full --quant none --recompute experts",
        "--mode lora --targets all --r 4 --dequant-cache on --quant-targets all",
        "--mode unfreeze --layers 1 --experts 0,3 --dequant-cache on",
        "--mode lora --targets all --r 8 --expert-cache 1", "--mode router --expert-cache 1 --checkpointing none",
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(names); i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/configs/%s", MT_REPO_ROOT, names[i]);
        mt_model_config cfg;
        cr_assert_eq(mt_model_config_load(path, &cfg), 0, "%s", mt_error_get());
        for (size_t r = 0; r < MT_ARRAY_LEN(runs); r++) expect_exact(&cfg, 0, runs[r]);
    }
}

// The bf16 copies (--dequant-cache) of the DeepSeek-style families' 4-bit Linears outside the
// experts (MLA's q_a, q_b, kv_a, kv_b and o, the shared expert, the dense first layer's MLP) and
// gpt-oss's: what they add to base, measured against planned to the byte (the plans of these
// families are within 2% elsewhere: cuda_run_equals_the_plan_for_each_family).
static uint64_t base_with_copies(const mt_model_config *cfg, const char *flags, int measured) {
    mt_run_opts o;
    cr_assert_eq(opts_of(0, flags, &o), 0, "%s: %s", flags, mt_error_get());
    if (!measured) {
        mt_plan p;
        cr_assert_eq(mt_plan_compute(cfg, MT_PLAN_OPTS_OF(&o), &p), 0, "%s", mt_error_get());
        return p.bytes[MT_MEM_BASE];
    }
    mt_plan_measurement m;
    cr_assert_eq(mt_plan_measure(cfg, NULL, MT_PLAN_OPTS_OF(&o), MT_MODEL_SPEC_OF(&o), &m), 0, "%s", mt_error_get());
    return m.peak[MT_MEM_BASE];
}

Test(measure, dequant_cache_of_each_family_to_the_byte) {
    static const char *names[] = {"tiny-deepseek-v3.json", "tiny-deepseek-v2.json", "tiny-glm4-moe-lite.json",
                                  "tiny-gpt-oss.json", "tiny-qwen2-moe.json"};
    static const char *runs[] = {"--mode lora --targets all --r 4", "--mode router --quant-targets all"};
    for (size_t i = 0; i < MT_ARRAY_LEN(names); i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/configs/%s", MT_REPO_ROOT, names[i]);
        mt_model_config cfg;
        cr_assert_eq(mt_model_config_load(path, &cfg), 0, "%s", mt_error_get());
        for (size_t r = 0; r < MT_ARRAY_LEN(runs); r++) {
            char on[256], off[256];
            snprintf(on, sizeof on, "%s --dequant-cache on", runs[r]);
            snprintf(off, sizeof off, "%s --dequant-cache off", runs[r]);
            uint64_t planned = base_with_copies(&cfg, on, 0) - base_with_copies(&cfg, off, 0);
            uint64_t measured = base_with_copies(&cfg, on, 1) - base_with_copies(&cfg, off, 1);
            cr_expect_gt(planned, 0, "%s %s: no copies planned", names[i], runs[r]);
            cr_expect_eq(measured, planned, "%s %s: the copies measured %llu bytes, planned %llu", names[i], runs[r],
                         (unsigned long long)measured, (unsigned long long)planned);
        }
    }
}

// Rank 0 of EP over the family configs: its experts of the MoE layers only (a dense layer has
// none to place), the replicated shared experts and dense MLPs beside them. Experts 7 and 9 do
// not divide by 2, so the activations are not the balanced plan's (as for Mixtral over 3); the
// states are exact.
Test(measure, family_configs_under_ep_per_rank) {
    static const char *names[] = {"tiny-qwen2-moe.json", "tiny-qwen3-moe.json", "tiny-olmoe.json"};
    static const char *runs[] = {"--mode unfreeze --experts 0,1,2 --gpus 2 --ep 2",
                                 "--mode lora --targets all --r 4 --gpus 4 --ep 2 --zero 1"};
    for (size_t i = 0; i < MT_ARRAY_LEN(names); i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/configs/%s", MT_REPO_ROOT, names[i]);
        mt_model_config cfg;
        cr_assert_eq(mt_model_config_load(path, &cfg), 0, "%s", mt_error_get());
        for (size_t r = 0; r < MT_ARRAY_LEN(runs); r++) {
            mt_run_opts o;
            mt_plan p;
            mt_plan_measurement m;
            cr_assert_eq(opts_of(0, runs[r], &o), 0, "%s", mt_error_get());
            cr_assert_eq(mt_plan_compute(&cfg, MT_PLAN_OPTS_OF(&o), &p), 0, "%s", mt_error_get());
            cr_assert_eq(mt_plan_measure(&cfg, NULL, MT_PLAN_OPTS_OF(&o), MT_MODEL_SPEC_OF(&o), &m), 0, "%s",
                         mt_error_get());
            for (size_t c = 0; c < MT_ARRAY_LEN(exact); c++)
                cr_expect_eq(m.peak[exact[c]], p.bytes[exact[c]], "%s %s: %s measured %llu, planned %llu", names[i],
                             runs[r], mt_mem_cat_name(exact[c]), (unsigned long long)m.peak[exact[c]],
                             (unsigned long long)p.bytes[exact[c]]);
            cr_expect_eq(m.peak[MT_MEM_COMM], p.bytes[MT_MEM_COMM], "%s %s: comm", names[i], runs[r]);
        }
    }
}

// Rank 0 of a parallel run, the most loaded: its experts (trainable ones round-robin over the
// ranks, as the plan spreads them), its ZeRO-1 shards and their flat gradient copy, to the byte.
Test(measure, parallel_runs_per_rank_to_the_byte) {
    mt_model_config cfg;
    mt_plan_mixtral_8x7b(&cfg);
    expect_exact(&cfg, 'B', "--gpus 2 --ep 2");
    expect_exact(&cfg, 'B', "--gpus 8 --ep 8");
    expect_exact(&cfg, 'B', "--gpus 4 --ep 2 --zero 1");
    expect_exact(&cfg, 'B', "--gpus 2 --ep 2 --zero 1 --offload-optimizer");
    expect_exact(&cfg, 'C', "--gpus 4 --ep 2 --zero 1");
    expect_exact(&cfg, 'C', "--gpus 8 --ep 8 --zero 1");
    expect_exact(&cfg, 'C', "--gpus 4 --zero 1");
    expect_exact(&cfg, 'A', "--gpus 4 --ep 4 --quant none");
    // Uneven shares (3, 3, 2 experts): rank 0 gets 9/8 of the balanced expert rows, which the
    // plan's activation figure (docs/memory.md's, for P dividing E) does not scale; the states agree.
    mt_run_opts o;
    mt_plan p;
    mt_plan_measurement m;
    cr_assert_eq(opts_of('A', "--gpus 3 --ep 3 --layers 0-31", &o), 0);
    cr_assert_eq(mt_plan_compute(&cfg, MT_PLAN_OPTS_OF(&o), &p), 0, "%s", mt_error_get());
    cr_assert_eq(mt_plan_measure(&cfg, NULL, MT_PLAN_OPTS_OF(&o), MT_MODEL_SPEC_OF(&o), &m), 0, "%s", mt_error_get());
    for (size_t i = 0; i < MT_ARRAY_LEN(exact); i++)
        cr_expect_eq(m.peak[exact[i]], p.bytes[exact[i]], "EP 3: %s", mt_mem_cat_name(exact[i]));
    cr_expect_gt(m.peak[MT_MEM_ACT], p.act_model, "rank 0 holds 3 of 8 experts: more rows than 1/3");
}

// ZeRO-1's saving per rank, measured against the plan's: the optimizer state and masters of
// replicated trainables shrink to 1/N, their gradients gain a flat copy under comm.
Test(measure, zero_saving_per_rank_matches_the_plan) {
    mt_model_config cfg;
    mt_plan_mixtral_8x7b(&cfg);
    mt_run_opts o;
    mt_plan p0, p1;
    mt_plan_measurement m0, m1;
    cr_assert_eq(opts_of('C', "--gpus 4", &o), 0);
    cr_assert_eq(mt_plan_compute(&cfg, MT_PLAN_OPTS_OF(&o), &p0), 0);
    cr_assert_eq(mt_plan_measure(&cfg, NULL, MT_PLAN_OPTS_OF(&o), MT_MODEL_SPEC_OF(&o), &m0), 0, "%s", mt_error_get());
    cr_assert_eq(opts_of('C', "--gpus 4 --zero 1", &o), 0);
    cr_assert_eq(mt_plan_compute(&cfg, MT_PLAN_OPTS_OF(&o), &p1), 0);
    cr_assert_eq(mt_plan_measure(&cfg, NULL, MT_PLAN_OPTS_OF(&o), MT_MODEL_SPEC_OF(&o), &m1), 0, "%s", mt_error_get());
    double planned = (double)(p0.bytes[MT_MEM_OPTIM] + p0.bytes[MT_MEM_MASTER]) -
                     (double)(p1.bytes[MT_MEM_OPTIM] + p1.bytes[MT_MEM_MASTER]);
    double measured = (double)(m0.peak[MT_MEM_OPTIM] + m0.peak[MT_MEM_MASTER]) -
                      (double)(m1.peak[MT_MEM_OPTIM] + m1.peak[MT_MEM_MASTER]);
    cr_expect_gt(planned, 2e9, "case C on 4 GPUs saves 3/4 of 12 B/param: %.3f GB", planned / 1e9);
    cr_expect_leq(fabs(measured - planned), 0.02 * planned, "saving measured %.4f GB, planned %.4f GB", measured / 1e9,
                  planned / 1e9);
}

Test(measure, refuses_what_the_step_cannot_do) {
    mt_model_config cfg;
    mt_plan_mixtral_8x7b(&cfg);
    static const struct { const char *flags, *needle; } bad[] = {
        {"--gpus 2 --zero 2", "--zero 2"},
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(bad); i++) {
        mt_run_opts o;
        mt_plan_measurement m;
        cr_assert_eq(opts_of('C', bad[i].flags, &o), 0);
        cr_expect_neq(mt_plan_measure(&cfg, NULL, MT_PLAN_OPTS_OF(&o), MT_MODEL_SPEC_OF(&o), &m), 0, "%s", bad[i].flags);
        cr_expect(strstr(mt_error_get(), bad[i].needle), "%s: %s", bad[i].flags, mt_error_get());
    }
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static double number(cJSON *o, const char *key) {
    cJSON *x = cJSON_GetObjectItem(o, key);
    cr_assert(cJSON_IsNumber(x), "%s missing", key);
    return x->valuedouble;
}

// The acceptance: Mixtral-8x7B case C, s=1024, on this machine's null backend, each category
// within 2% of the plan (act: of the model's set; docs/memory.md's own act differs by the terms the
// report lists, checked to add up).
Test(measure, cli_case_c_within_two_percent) {
    static char out[1 << 17];
    double t0 = now_s();
    cr_assert_eq(mt_test_run(out, sizeof out, "plan --case C --measure --seq 1024 --json"), MT_EXIT_OK, "%s", out);
    double wall = now_s() - t0;
    cr_expect_lt(wall, 5.0, "plan --measure took %.2f s", wall);
    cJSON *j = cJSON_Parse(out);
    cr_assert_not_null(j, "not JSON: %s", out);
    cJSON *m = cJSON_GetObjectItem(j, "measured");
    cr_assert_not_null(m);
    cJSON *peak = cJSON_GetObjectItem(m, "bytes"), *planned = cJSON_GetObjectItem(m, "planned_bytes");
    static const char *cats[] = {"base", "train", "grad", "optim", "master", "act"};
    for (size_t i = 0; i < MT_ARRAY_LEN(cats); i++) {
        double p = number(planned, cats[i]), x = number(peak, cats[i]);
        cr_expect_leq(fabs(x - p), 0.02 * p, "%s: measured %.0f, planned %.0f", cats[i], x, p);
    }
    cJSON *bytes = cJSON_GetObjectItem(j, "bytes");
    for (size_t i = 0; i < 5; i++)
        cr_expect_eq(number(planned, cats[i]), number(bytes, cats[i]), "%s: compared with the plan's own", cats[i]);
    double act = number(m, "act_budgets_bytes"), sum = act;
    cr_expect_eq(act, number(bytes, "act"));
    cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(m, "act_terms")) sum += number(t, "bytes");
    cr_expect_eq(sum, number(planned, "act"), "docs/memory.md's act plus the terms is the model's set");
    cr_expect(fabs(number(bytes, "act") / 1e9 - 1.04) < 0.005, "the plan's act stays docs/memory.md's 1.04 GB");
    cr_expect_eq(number(m, "rows_per_expert"), 256, "balanced routing: 1024·2/8");
    cJSON_Delete(j);
    // the text form says the same, with routing and the terms
    cr_assert_eq(mt_test_run(out, sizeof out, "plan --case C --measure --seq 1024"), MT_EXIT_OK, "%s", out);
    cr_expect(strstr(out, "measured GB") && strstr(out, "balanced") && strstr(out, "backward transient"), "%s", out);
    cr_expect(strstr(out, "master          0.914        0.914     0.00%"), "%s", out);
}

Test(measure, cli_model_config_and_refusal) {
    static char out[1 << 16];
    cr_assert_eq(mt_test_run(out, sizeof out, "plan --model %s/configs/tiny.json --mode unfreeze --quant int4 --measure",
                             MT_REPO_ROOT), MT_EXIT_OK, "%s", out);
    cr_expect(strstr(out, "measured GB"), "%s", out);
    cr_expect_eq(mt_test_run(out, sizeof out, "plan --case B --gpus 2 --ep 2 --measure"), MT_EXIT_OK, "%s", out);
    cr_expect(strstr(out, "optim           8.457        8.457     0.00%"), "EP=2 measured as rank 0: %s", out);
    cr_expect_eq(mt_test_run(out, sizeof out, "plan --case B --gpus 2 --zero 2 --measure"), MT_EXIT_USAGE);
    cr_expect(strstr(out, "--zero 2") && strstr(out, "not implemented"), "%s", out);
    // a plan that does not fit still measures; the measured total decides the exit: 3 here too
    cr_expect_eq(mt_test_run(out, sizeof out, "plan --case B --measure"), MT_EXIT_NOFIT, "%s", out);
    cr_expect(strstr(out, "NO (136%)") && strstr(out, "measured GB"), "%s", out);
    cr_expect(strstr(out, "by the measured total (with --measure it decides): NO (133%)"), "%s", out);
}

// Case C at 16k tokens: the plan's total (docs/memory.md's act with 10·s·b·V of logits, a guessed
// workspace) does not fit 44 GB, the step measured does (the logits are never whole); with
// --measure the measured total decides, and says that the two disagree.
Test(measure, case_c_at_16k_fits_by_the_measured_total) {
    static char out[1 << 17];
    cr_expect_eq(mt_test_run(out, sizeof out, "plan --case C --seq 16384"), MT_EXIT_NOFIT, "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "plan --case C --seq 16384 --measure"), MT_EXIT_OK, "%s", out);
    cr_expect(strstr(out, "by the measured total (with --measure it decides): yes (86%); the plan's total says no"),
              "%s", out);
    cr_expect(strstr(out, "act             8.807        8.807     0.00%"), "%s", out);
}

// --max-seq: the longest sequence whose deciding total fits, by the plan and by the measurement;
// one token more does not fit.
Test(measure, max_seq_is_the_longest_that_fits) {
    mt_model_config cfg;
    mt_plan_mixtral_8x7b(&cfg);
    mt_run_opts o;
    cr_assert_eq(opts_of('C', "", &o), 0);
    uint64_t total;
    int64_t s = mt_plan_max_seq(&cfg, MT_PLAN_OPTS_OF(&o), NULL, cfg.max_positions, &total);
    cr_assert_gt(s, 1024, "%s", mt_error_get());
    mt_plan p;
    o.seq = s;
    cr_assert_eq(mt_plan_compute(&cfg, MT_PLAN_OPTS_OF(&o), &p), 0);
    cr_expect(p.fits && p.total == total, "--seq %lld fits by the plan", (long long)s);
    o.seq = s + 1;
    cr_assert_eq(mt_plan_compute(&cfg, MT_PLAN_OPTS_OF(&o), &p), 0);
    cr_expect(!p.fits, "--seq %lld does not", (long long)s + 1);
    o.seq = 1024;
    int64_t sm = mt_plan_max_seq(&cfg, MT_PLAN_OPTS_OF(&o), MT_MODEL_SPEC_OF(&o), cfg.max_positions, &total);
    cr_expect_gt(sm, 16384, "measured: 16k fits, got %lld", (long long)sm);
    mt_plan_measurement m;
    o.seq = sm + 1;
    cr_assert_eq(mt_plan_measure(&cfg, NULL, MT_PLAN_OPTS_OF(&o), MT_MODEL_SPEC_OF(&o), &m), 0);
    cr_expect(!mt_plan_measured_fits(&m, o.gpu_mem_bytes), "--seq %lld does not fit by the measurement", (long long)sm + 1);
    static char out[1 << 12];
    cr_assert_eq(mt_test_run(out, sizeof out, "plan --case C --max-seq"), MT_EXIT_OK, "%s", out);
    char want[128];
    snprintf(want, sizeof want, "max-seq: %lld tokens (batch 1) fit a 44 GB card by the plan's total", (long long)s);
    cr_expect(strstr(out, want), "%s", out);
    cr_expect_eq(mt_test_run(out, sizeof out, "plan --case C --gpu-mem 20GB --max-seq"), MT_EXIT_NOFIT, "%s", out);
    cr_expect(strstr(out, "not even --seq 1 fits"), "%s", out);
}

Test(measure, optimizer_options_measured_against_the_plan) {
    static char out[1 << 16];
    // 8-bit Adam keeps an fp32 absmax per 256 elements beside the 2 B/param docs/memory.md counts:
    // +1.56%, inside the 2% the plan promises; offload leaves nothing of the optimizer on the GPU.
    cr_assert_eq(mt_test_run(out, sizeof out, "plan --case B --measure --adam-8bit --no-master-weights"), MT_EXIT_OK,
                 "%s", out);
    cr_expect(strstr(out, "optim           4.228        4.294     1.56%"), "%s", out);
    cr_expect(strstr(out, "master          0.000        0.000     0.00%"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "plan --case B --measure --offload-optimizer"), MT_EXIT_OK, "%s", out);
    cr_expect(strstr(out, "optim           0.000        0.000     0.00%"), "%s", out);
}

// The plan equals the run: the same step on the cuda backend (CPU-emulated under `make
// test-sim`), its ledger's peaks per category against plan --measure's (the null backend), every
// category within 2% (act and work included). The GPU step's dtype rule and allocations are one
// code path on both, so a difference here is a buffer one of them takes and the other does not.
#include "tests/gpu_or_skip.h"
#ifdef MT_CUDA
#include "model/attention_cudnn.h"
#endif

static void expect_cfg_run_equals_plan(mt_backend *gpu, const mt_model_config *c, const char *config,
                                       const char *flags) {
    mt_model_config cfg = *c;
    mt_run_opts o;
    cr_assert_eq(opts_of(0, flags, &o), 0, "%s: %s", flags, mt_error_get());
    mt_plan_measurement planned, ran;
    cr_assert_eq(mt_plan_measure(&cfg, NULL, MT_PLAN_OPTS_OF(&o), MT_MODEL_SPEC_OF(&o), &planned), 0, "%s", mt_error_get());
    cr_assert_eq(mt_plan_measure_on(gpu, &cfg, NULL, MT_PLAN_OPTS_OF(&o), MT_MODEL_SPEC_OF(&o), &ran), 0, "%s",
                 mt_error_get());
    for (int c = 0; c < MT_MEM_COUNT; c++) {
        double p = (double)planned.peak[c], r = (double)ran.peak[c];
        cr_log_info("%s %s: %-6s plan --measure %12.0f  cuda %12.0f  (%+.3f%%)", config, flags, mt_mem_cat_name(c), p, r,
                    p > 0 ? 100 * (r - p) / p : 0.0);
        cr_expect_leq(fabs(r - p), 0.02 * p, "%s %s: %s: plan --measure %.0f bytes, the cuda run %.0f", config, flags,
                      mt_mem_cat_name(c), p, r);
    }
    cr_expect_leq(fabs((double)ran.total_peak - (double)planned.total_peak), 0.02 * (double)planned.total_peak,
                  "%s %s: total peak: plan --measure %llu, cuda %llu", config, flags,
                  (unsigned long long)planned.total_peak, (unsigned long long)ran.total_peak);
}

static void expect_run_equals_plan(mt_backend *gpu, const char *config, const char *flags) {
    char path[1024];
    snprintf(path, sizeof path, "%s/configs/%s", MT_REPO_ROOT, config);
    mt_model_config cfg;
    cr_assert_eq(mt_model_config_load(path, &cfg), 0, "%s", mt_error_get());
    expect_cfg_run_equals_plan(gpu, &cfg, config, flags);
}

Test(measure, cuda_run_equals_the_plan) {
    mt_backend *gpu = gpu_or_skip();
    expect_run_equals_plan(gpu, "tiny.json", "--mode lora --targets all --r 4 --seq 48 --batch 2");
    expect_run_equals_plan(gpu, "tiny.json", "--mode lora --targets all --r 8 --dropout 0.1 --seq 40 --checkpointing none");
    expect_run_equals_plan(gpu, "tiny.json", "--mode unfreeze --layers 1 --experts 0,3 --seq 32");
    expect_run_equals_plan(gpu, "mid.json", "--mode lora --targets all --r 8 --quant none --layers 22,23 --seq 32 --batch 2");
    expect_run_equals_plan(gpu, "tiny.json", "--mode lora --targets all --r 8 --seq 48 --dequant-cache on --quant-targets all");
    expect_run_equals_plan(gpu, "tiny-deepseek-v3.json", "--mode lora --targets all --r 4 --seq 24 --dequant-cache on");
    // kept experts: one layer of two (the other's calls hold slots), then both (no call does)
    expect_run_equals_plan(gpu, "tiny.json", "--mode lora --targets all --r 8 --seq 48 --expert-cache 1");
    expect_run_equals_plan(gpu, "tiny.json", "--mode lora --targets all --r 8 --seq 48 --expert-cache 2 --dropout 0.1");
    expect_run_equals_plan(gpu, "tiny-qwen3-moe.json", "--mode lora --targets all --r 8 --seq 24 --expert-cache 1");
    mt_backend_free(gpu);
}

// Long sequences, wide attention, small experts: the attention's own scratch (cuDNN's statistics,
// Σ rows, fp32 dQ accumulator, staged gradients and plan workspace; the WMMA backward's rows) is
// the step's largest, and the counting step makes it as the run does (mt_op_attention_count).
Test(measure, cuda_run_equals_the_plan_when_attention_scratch_leads) {
    mt_backend *gpu = gpu_or_skip();
    char path[1024];
    snprintf(path, sizeof path, "%s/configs/tiny.json", MT_REPO_ROOT);
    mt_model_config cfg;
    cr_assert_eq(mt_model_config_load(path, &cfg), 0, "%s", mt_error_get());
    cfg.heads = 8, cfg.kv_heads = 2, cfg.head_dim = 64, cfg.intermediate = 32;
    expect_cfg_run_equals_plan(gpu, &cfg, "tiny.json, 8/2 heads of 64", "--mode lora --targets all --r 4 --seq 768");
    expect_cfg_run_equals_plan(gpu, &cfg, "tiny.json, 8/2 heads of 64",
                               "--mode lora --targets w1,w2,w3 --r 4 --seq 520 --checkpointing none");
#ifdef MT_CUDA  // the WMMA kernels' own rows
    attention_set_mode(MT_ATTENTION_WMMA);
    expect_cfg_run_equals_plan(gpu, &cfg, "tiny.json, 8/2 heads of 64, WMMA", "--mode lora --targets all --r 4 --seq 640");
    attention_set_mode(MT_ATTENTION_AUTO);
#endif
    mt_backend_free(gpu);
}

// The same for the families' parts on the GPU step (q/k norms, biases, clip_qkv, dense layers,
// the shared expert and its gate, gpt-oss's parts: docs/families.md), recomputing and not.
Test(measure, cuda_run_equals_the_plan_for_each_family) {
    mt_backend *gpu = gpu_or_skip();
    const char *configs[] = {"tiny-qwen2-moe.json", "tiny-qwen3-moe.json", "tiny-olmoe.json"};
    for (size_t i = 0; i < MT_ARRAY_LEN(configs); i++) {
        expect_run_equals_plan(gpu, configs[i], "--mode lora --targets all --r 4 --seq 24 --batch 2");
        expect_run_equals_plan(gpu, configs[i], "--mode full --quant none --seq 16 --checkpointing none");
    }
    // gpt-oss (router and expert biases, the clamped SwiGLU, sinks: no scratch of their own), in
    // the modes it trains in (full and unfreeze refuse its fused experts).
    expect_run_equals_plan(gpu, "tiny-gpt-oss.json", "--mode lora --targets all --r 4 --seq 24 --batch 2");
    expect_run_equals_plan(gpu, "tiny-gpt-oss.json", "--mode router --seq 16 --checkpointing none");
    // DeepSeek-style: MLA's latents and its value head unlike the query's, the shared expert,
    // a dense first layer, the grouped router's fp32 score bias.
    const char *deepseek[] = {"tiny-deepseek-v3.json", "tiny-deepseek-v2.json", "tiny-glm4-moe.json",
                              "tiny-glm4-moe-lite.json"};
    for (size_t i = 0; i < MT_ARRAY_LEN(deepseek); i++) {
        expect_run_equals_plan(gpu, deepseek[i], "--mode lora --targets all --r 4 --seq 24 --batch 2");
        expect_run_equals_plan(gpu, deepseek[i], "--mode full --quant none --seq 16 --checkpointing none");
    }
    mt_backend_free(gpu);
}

// The planner's expert scratch follows the run's folds (model/experts_gpu.c): w1's and w3's LoRA B
// beside [W1;W3] (mt_experts_xs_extra) only when every expert of every MoE layer has both LoRAs,
// r a multiple of 8, on any EP degree (another rank's experts count by their LoRA there); w2's B
// beside W2 (mt_experts_a_extra) on the same terms for w2;
// w2's A under W2 (mt_experts_dys_extra) without dropout. The
// model is built on the null backend as plan --measure builds it; the plan's slot bytes are the
// ones its folds give. (DeepSeek's first layer is dense: --layers 1,2 adapts every MoE layer.)
#include "model/expert_scratch.h"
#include "model/model_internal.h"
Test(measure, plan_scratch_follows_the_runs_folds) {
    const struct {
        const char *config, *flags;
        int fold13, fold2f;
    } runs[] = {
        {"tiny.json", "--mode lora --targets all --r 8", 1, 1},
        {"tiny.json", "--mode lora --targets all --r 12", 0, 0},
        {"tiny.json", "--mode lora --targets all --r 8 --experts 0,1", 0, 0},
        {"tiny.json", "--mode lora --targets w1,w2 --r 8", 0, 1},
        {"tiny.json", "--mode lora --targets w1,w3 --r 8", 1, 0},
        {"tiny.json", "--mode lora --targets all --r 16 --dropout 0.1", 1, 1},
        {"tiny.json", "--mode lora --targets all --r 8 --quant none", 0, 0},
        {"tiny.json", "--mode lora --targets all --r 8 --ep 2 --gpus 2", 1, 1},
        {"tiny.json", "--mode lora --targets all --r 8 --ep 2 --gpus 2 --experts 0,1", 0, 0},
        {"tiny-deepseek-v3.json", "--mode lora --targets all --r 8 --layers 1,2", 1, 0},  // f = 14
        {"tiny-deepseek-v3.json", "--mode lora --targets all --r 8 --layers 2", 0, 0},
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(runs); i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/configs/%s", MT_REPO_ROOT, runs[i].config);
        mt_model_config cfg;
        cr_assert_eq(mt_model_config_load(path, &cfg), 0, "%s", mt_error_get());
        mt_run_opts o;
        cr_assert_eq(opts_of(0, runs[i].flags, &o), 0, "%s: %s", runs[i].flags, mt_error_get());
        mt_plan p;
        cr_assert_eq(mt_plan_compute(&cfg, MT_PLAN_OPTS_OF(&o), &p), 0, "%s: %s", runs[i].flags, mt_error_get());
        mt_backend *nb = mt_backend_null_new();
        mt_model m;
        mt_model_par par = {.ep_rank = 0, .ep_size = o.ep};
        cr_assert_eq(mt_model_build_par(&m, nb, &cfg, NULL, MT_MODEL_SPEC_OF(&o), &par), 0, "%s", mt_error_get());
        int L = 0;
        while (L < cfg.layers && m.layers[L].dense) L++;
        int64_t beside = mt_experts_xs_extra(&m), under = mt_experts_dys_extra(&m, L) ? o.lora_r : 0;
        int64_t beside2 = mt_experts_a_extra(&m);
        cr_expect_eq(beside != 0, runs[i].fold13, "%s %s: the run folds w1's and w3's B: %lld columns", runs[i].config,
                     runs[i].flags, (long long)beside);
        cr_expect_eq(beside2 != 0, runs[i].fold2f, "%s %s: the run folds w2's B: %lld columns", runs[i].config,
                     runs[i].flags, (long long)beside2);
        uint64_t want = o.quant == MT_QUANT_NONE ? 0
                                                 : (uint64_t)mt_expert_dequant_scratch_bytes(cfg.hidden, cfg.intermediate,
                                                                                             cfg.experts, under, beside, beside2);
        cr_expect_eq(p.expert_dequant_bytes, want, "%s %s: the plan's slots %llu bytes, the run's folds give %llu",
                     runs[i].config, runs[i].flags, (unsigned long long)p.expert_dequant_bytes, (unsigned long long)want);
        mt_model_free(&m);
        mt_backend_free(nb);
    }
}
