// The memory planner: every cell of the reference cases' tables (docs/memory.md "The reference cases", and
// the bf16 and EP rows it leaves out), the parameter counts, activations,
// the suggestions, the checks, and the `moetrain plan` command's exit codes and output.
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "model/config.h"
#include "tests/test_util.h"
#include "trainer/options.h"
#include "plan/plan.h"
#include "model/expert_scratch.h"

// Options of case `which` (docs/memory.md "The reference cases"), then `flags` (space-separated) on top.
static int case_opts(char which, const char *flags, mt_run_opts *o) {
    char buf[512], *argv[32];
    int argc = 0;
    mt_run_opts_default(o);
    if (which && mt_plan_case_apply(o, which) != 0) return -1;
    snprintf(buf, sizeof buf, "%s", flags);
    for (char *s, *t = strtok_r(buf, " ", &s); t && argc < 32; t = strtok_r(NULL, " ", &s)) argv[argc++] = t;
    return mt_run_opts_parse(o, argc, argv);
}

static int plan_of(char which, const char *flags, mt_plan *p) {
    mt_model_config cfg;
    mt_run_opts o;
    mt_plan_mixtral_8x7b(&cfg);
    if (case_opts(which, flags, &o) != 0) return -1;
    return mt_plan_compute(&cfg, MT_PLAN_OPTS_OF(&o), p);
}

static double gb(uint64_t b) { return (double)b / 1e9; }

// ---------------------------------------------------------------------------------------------
// The reference cases (docs/memory.md "The reference cases"), cell by cell. A cell matches when ours rounds to it at the table's precision.

enum { COLS = 8 };
static const char *col_names[COLS] = {"base", "train", "grad", "optim", "master", "act", "work", "total"};
static const int col_decimals[COLS] = {2, 3, 3, 3, 3, 2, 1, 2};

typedef struct {
    const char *config;      // the table's row label
    const char *flags;
    double gb[COLS];
    int fits;
    int percent;             // -1 where the table gives none
} table_row;

static void check_rows(char which, const table_row *rows, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const table_row *r = &rows[i];
        mt_plan p;
        cr_assert_eq(plan_of(which, r->flags, &p), 0, "case %c '%s': %s", which, r->flags, mt_error_get());
        uint64_t ours[COLS] = {p.bytes[MT_MEM_BASE], p.bytes[MT_MEM_TRAIN], p.bytes[MT_MEM_GRAD],
                               p.bytes[MT_MEM_OPTIM], p.bytes[MT_MEM_MASTER], p.bytes[MT_MEM_ACT],
                               p.bytes[MT_MEM_WORK], p.total};
        for (int c = 0; c < COLS; c++) {
            double tol = 0.5 * pow(10, -col_decimals[c]) + 1e-9;
            cr_expect(fabs(gb(ours[c]) - r->gb[c]) <= tol, "case %c, %s, %s: ours %.4f GB, table %.*f", which,
                      r->config, col_names[c], gb(ours[c]), col_decimals[c], r->gb[c]);
        }
        cr_expect_eq(p.bytes[MT_MEM_COMM], 0);
        uint64_t sum = 0;
        for (int c = 0; c < MT_MEM_COUNT; c++) sum += p.bytes[c];
        cr_expect_eq(sum, p.total, "the total is the sum of the categories");
        cr_expect_eq(p.fits, r->fits, "case %c, %s: fits %d", which, r->config, p.fits);
        if (r->percent >= 0)
            cr_expect_eq(lround(p.percent), r->percent, "case %c, %s: %.1f%%", which, r->config, p.percent);
    }
}

Test(plan, case_a_table) {
    static const table_row rows[] = {
        {"1 card, NF4-DQ base", "", {24.48, 0.002, 0.002, 0.008, 0.004, 1.04, 1.5, 27.03}, 1, 61},
        {"1 card, bf16 base", "--quant none", {93.40, 0.002, 0.002, 0.008, 0.004, 1.04, 1.5, 95.96}, 0, -1},
        {"EP=2, bf16", "--quant none --gpus 2 --ep 2", {48.31, 0.002, 0.002, 0.008, 0.004, 1.04, 2.0, 51.36}, 0, -1},
        {"EP=4, bf16", "--quant none --gpus 4 --ep 4", {25.76, 0.002, 0.002, 0.008, 0.004, 1.04, 2.0, 28.81}, 1, -1},
        {"EP=8, bf16", "--quant none --gpus 8 --ep 8", {14.48, 0.002, 0.002, 0.008, 0.004, 1.04, 2.0, 17.54}, 1, -1},
    };
    check_rows('A', rows, MT_ARRAY_LEN(rows));
}

Test(plan, case_b_table) {
    static const table_row rows[] = {
        {"1 card, NF4-DQ base", "", {23.39, 4.228, 4.228, 16.913, 8.457, 1.04, 1.5, 59.76}, 0, -1},
        {"1 card, bf16 base", "--quant none", {89.18, 4.228, 4.228, 16.913, 8.457, 1.04, 1.5, 125.54}, 0, -1},
        {"1 card, NF4-DQ, 8-bit Adam, no master", "--adam-8bit --no-master-weights",
         {23.39, 4.228, 4.228, 4.228, 0, 1.04, 1.5, 38.61}, 1, 88},
        {"EP=2, NF4-DQ", "--gpus 2 --ep 2", {12.31, 2.114, 2.114, 8.457, 4.229, 1.04, 2.0, 32.26}, 1, 73},
        {"EP=2, bf16", "--gpus 2 --ep 2 --quant none", {46.19, 2.114, 2.114, 8.457, 4.229, 1.04, 2.0, 66.15}, 0, -1},
        {"EP=4, bf16", "--gpus 4 --ep 4 --quant none", {24.70, 1.057, 1.057, 4.229, 2.115, 1.04, 2.0, 36.20}, 1, -1},
        {"EP=8, NF4-DQ", "--gpus 8 --ep 8", {3.95, 0.705, 0.705, 2.820, 1.410, 1.04, 2.0, 12.62}, 1, -1},
        {"EP=8, bf16", "--gpus 8 --ep 8 --quant none", {13.78, 0.705, 0.705, 2.820, 1.410, 1.04, 2.0, 22.46}, 1, -1},
    };
    check_rows('B', rows, MT_ARRAY_LEN(rows));
}

Test(plan, case_c_table) {
    static const table_row rows[] = {
        {"1 card, NF4-DQ", "", {24.48, 0.457, 0.457, 1.829, 0.914, 1.04, 1.5, 30.68}, 1, 70},
        {"1 card, NF4 without DQ", "--no-double-quant", {26.65, 0.457, 0.457, 1.829, 0.914, 1.04, 1.5, 32.84}, 1, 75},
        {"1 card, NF4-DQ, s=4096", "--seq 4096", {24.48, 0.457, 0.457, 1.829, 0.914, 4.15, 1.5, 33.79}, 1, 77},
        {"1 card, NF4-DQ, no ckpt", "--checkpointing none", {24.48, 0.457, 0.457, 1.829, 0.914, 8.97, 1.5, 38.61}, 1, 88},
    };
    check_rows('C', rows, MT_ARRAY_LEN(rows));
}

// ---------------------------------------------------------------------------------------------
// Counts, formats, activations

Test(plan, parameter_counts) {
    mt_plan p;
    cr_assert_eq(plan_of('A', "", &p), 0);
    cr_expect_eq(p.trainable_params, 1048576);
    cr_expect_eq(p.model_params, 46702792704LL);
    cr_assert_eq(plan_of('B', "", &p), 0);
    cr_expect_eq(p.trainable_params, 2114125824LL);
    cr_expect_eq(p.units, 12);
    cr_expect_eq(p.parts[0].each, 176160768);
    cr_assert_eq(plan_of('C', "", &p), 0);
    cr_expect_eq(p.trainable_params, 228593664LL);
    cr_assert_eq(p.n_parts, 2);
    cr_expect_eq(p.parts[0].count * p.parts[0].each, 226492416LL, "expert LoRA");
    cr_expect_eq(p.parts[0].each, 884736, "3·16·(4096+14336) per expert");
    cr_expect_eq(p.parts[1].count * p.parts[1].each, 2101248LL, "router LoRA");
    // The model's own counts (model/config.c) agree with the planner's.
    mt_model_config cfg;
    mt_plan_mixtral_8x7b(&cfg);
    cr_expect_eq(mt_config_total_params(&cfg), 46702792704LL);
    cr_expect_eq(mt_config_expert_params(&cfg), 176160768);
    cr_expect_eq(mt_config_router_params(&cfg), 32768);
    cr_expect_eq(mt_config_attn_params(&cfg), 41943040);
}

Test(plan, frozen_base_formats) {
    // docs/memory.md "Bytes per parameter": 46,439,333,888 quantized Linear weights; 4.127/4.5/4.25 bits; bf16 rest.
    static const struct { const char *flags; double bits, base_gb; } rows[] = {
        {"", 4.126953125, 24.48}, {"--no-double-quant", 4.5, 26.65}, {"--quant int4", 4.25, 25.20},
        {"--quant fp4", 4.126953125, 24.48}, {"--quant none", 0, 93.41},
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(rows); i++) {
        mt_plan p;
        cr_assert_eq(plan_of('C', rows[i].flags, &p), 0, "%s", mt_error_get());
        cr_expect_eq(p.quant_bits, rows[i].bits, "%s: %.9f bits", rows[i].flags, p.quant_bits);
        cr_expect(fabs(gb(p.bytes[MT_MEM_BASE]) - rows[i].base_gb) <= 0.005, "%s: base %.4f", rows[i].flags,
                  gb(p.bytes[MT_MEM_BASE]));
        if (rows[i].bits > 0) cr_expect_eq(p.frozen_quant_gpu, 46439333888LL);
    }
    mt_run_opts o;
    mt_run_opts_default(&o);
    cr_expect_eq(mt_plan_linear_bytes(14336LL * 4096, MT_PLAN_OPTS_OF(&o)), 14336ull * 4096 / 2 + 917504 + 3584 * 4,
                 "an expert's w1: nibbles, uint8 absmax, fp32 nested absmax (docs/formats.md 'Serialized quant_state')");
}

Test(plan, activations) {
    mt_model_config cfg;
    mt_plan_mixtral_8x7b(&cfg);
    static const struct { int64_t seq; double ckpt_gb, none_gb; } rows[] = {
        {1024, 1.04, 8.97}, {2048, 2.07, 17.93}, {4096, 4.15, 35.86},
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(rows); i++) {
        mt_run_opts o;
        mt_run_opts_default(&o);
        o.seq = rows[i].seq;
        cr_expect_eq(mt_plan_act_layer_bytes(&cfg, o.seq, 1), 258232ull * (uint64_t)o.seq, "docs/memory.md 'Activations'");
        double ckpt = gb(mt_plan_act_bytes(&cfg, MT_PLAN_OPTS_OF(&o)));
        o.checkpointing = MT_CKPT_NONE;
        double none = gb(mt_plan_act_bytes(&cfg, MT_PLAN_OPTS_OF(&o)));
        cr_expect(fabs(ckpt - rows[i].ckpt_gb) <= 0.005, "s=%lld full ckpt: %.4f", (long long)o.seq, ckpt);
        cr_expect(fabs(none - rows[i].none_gb) <= 0.005, "s=%lld no ckpt: %.4f", (long long)o.seq, none);
    }
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.batch = 2;
    cr_expect_eq(mt_plan_act_bytes(&cfg, MT_PLAN_OPTS_OF(&o)), 2 * 1036705792ull, "linear in the batch");
}

// ---------------------------------------------------------------------------------------------
// Parallelism, ZeRO, offload, other modes

Test(plan, zero_shards_over_the_copies) {
    // Case C on 4 GPUs, plain data parallel: every weight has 4 copies.
    const uint64_t n = 228593664, expert = 226492416, router = 2101248;
    mt_plan p;
    cr_assert_eq(plan_of('C', "--gpus 4", &p), 0);
    cr_expect_eq(p.bytes[MT_MEM_OPTIM], 8 * n);
    cr_assert_eq(plan_of('C', "--gpus 4 --zero 1", &p), 0);
    cr_expect_eq(p.bytes[MT_MEM_OPTIM], 8 * (expert / 4 + router / 4));
    cr_expect_eq(p.bytes[MT_MEM_MASTER], 4 * (expert / 4 + router / 4));
    cr_expect_eq(p.bytes[MT_MEM_GRAD], 2 * n, "ZeRO-1 keeps whole grads");
    cr_assert_eq(plan_of('C', "--gpus 4 --zero 2", &p), 0);
    cr_expect_eq(p.bytes[MT_MEM_GRAD], 2 * (expert / 4 + router / 4));
    cr_expect_eq(p.bytes[MT_MEM_TRAIN], 2 * n, "weights stay whole");
    // With EP=4 on 4 GPUs an expert has one copy: only the router LoRA shards.
    cr_assert_eq(plan_of('C', "--gpus 4 --ep 4 --zero 1", &p), 0);
    cr_expect_eq(p.units_gpu, 64);
    cr_expect_eq(p.bytes[MT_MEM_OPTIM], 8 * (expert / 4 + router / 4));
    cr_assert_eq(plan_of('C', "--gpus 4 --ep 4", &p), 0);
    cr_expect_eq(p.bytes[MT_MEM_OPTIM], 8 * (expert / 4 + router));
}

Test(plan, offload_moves_state_to_host) {
    mt_plan p;
    cr_assert_eq(plan_of('B', "--offload-optimizer", &p), 0);
    cr_expect_eq(p.bytes[MT_MEM_OPTIM], 0);
    cr_expect_eq(p.bytes[MT_MEM_MASTER], 0);
    cr_expect_eq(p.host_bytes, 12ull * 2114125824);
    cr_expect(fabs(gb(p.total) - 34.39) <= 0.005, "%.4f", gb(p.total));
    cr_expect(p.fits);
}

Test(plan, ep_round_robin_worst_gpu) {
    // 12 trainable experts over EP=8: the worst rank holds 2, so 30 frozen experts of its 32.
    mt_plan p;
    cr_assert_eq(plan_of('B', "--gpus 8 --ep 8", &p), 0);
    cr_expect_eq(p.units_gpu, 2);
    cr_expect_eq(p.trainable_gpu, 2 * 176160768LL + 6 * 32768);
    cr_expect_eq(p.frozen_quant_gpu, 30 * 176160768LL + 32 * 41943040LL);
    // EP over 4 of 8 GPUs: two copies of each expert; the workspace guess is the multi-GPU one.
    cr_assert_eq(plan_of('B', "--gpus 8 --ep 4", &p), 0);
    cr_expect_eq(p.units_gpu, 3);
    cr_expect_eq(p.bytes[MT_MEM_WORK], 2000000000ull);
}

Test(plan, full_mode_and_attention_lora) {
    mt_plan p;
    cr_assert_eq(plan_of(0, "--mode full --gpus 8 --ep 8", &p), 0);
    cr_expect_eq(p.trainable_params, 46702792704LL);
    cr_expect_eq(p.bytes[MT_MEM_BASE], 0, "nothing frozen");
    cr_expect_eq(p.units_gpu, 32);
    cr_expect_eq(p.trainable_gpu, 46702792704LL - 7 * 32 * 176160768LL);
    cr_expect(!p.fits);
    cr_assert_eq(plan_of(0, "--mode lora --r 8 --targets attn", &p), 0);
    cr_expect_eq(p.trainable_params, 32LL * 8 * (2 * (4096 + 4096) + 2 * (4096 + 1024)));
    cr_expect_eq(p.units, 0);
    cr_assert_eq(plan_of(0, "--mode router --layers 16-31", &p), 0);
    cr_expect_eq(p.trainable_params, 16 * 32768);
}

Test(plan, workspace_flag_overrides_the_guess) {
    mt_plan p;
    cr_assert_eq(plan_of('C', "--workspace 3GB", &p), 0);
    cr_expect_eq(p.bytes[MT_MEM_WORK], 3000000000ull);
    cr_expect(!p.workspace_guessed);
    cr_assert_eq(plan_of('C', "--gpu-mem 30GiB", &p), 0);
    cr_expect(p.fits, "30.68 GB < 32.21 GB");
    cr_assert_eq(plan_of('C', "--gpu-mem 30GB", &p), 0);
    cr_expect(!p.fits);
}

// The GPU step's expert scratch (model/expert_scratch.h) in work, on cuda only: two slots of one
// large expert's w1‖w3 in bf16 while a call runs frozen 4-bit experts, with w1's and w3's LoRA B
// (2r = 32 columns) beside each row (Mixtral: 2·2·14336·(4096 + 32)·2 = 473,432,064 B), and with expert LoRA dropout the f32 buffer of a call's T·k rows at f columns.
Test(plan, expert_scratch_in_work_on_cuda) {
    mt_plan cpu, gpu, drop, dense;
    cr_assert_eq(plan_of('C', "--seq 4096", &cpu), 0);
    cr_assert_eq(plan_of('C', "--seq 4096 --device cuda", &gpu), 0);
    cr_expect_eq(gpu.expert_dequant_bytes, 473432064ull);
    cr_expect_eq(gpu.expert_dequant_bytes, (uint64_t)mt_expert_dequant_scratch_bytes(4096, 14336, 8, 16, 32, 16));
    cr_expect_eq(gpu.expert_dropout_bytes, 0, "no dropout: no buffer");
    cr_expect_eq(gpu.bytes[MT_MEM_WORK] - cpu.bytes[MT_MEM_WORK], gpu.expert_dequant_bytes, "only cuda counts it");
    cr_expect_eq(cpu.bytes[MT_MEM_WORK], 1500000000ull);
    cr_assert_eq(plan_of('C', "--seq 4096 --device cuda --dropout 0.1", &drop), 0);
    cr_expect_eq(drop.expert_dropout_bytes, 4096ull * 2 * 14336 * 4, "T·k rows × f columns, f32");
    cr_expect_eq(drop.bytes[MT_MEM_WORK], gpu.bytes[MT_MEM_WORK] + drop.expert_dropout_bytes);
    cr_assert_eq(plan_of('C', "--device cuda --quant-targets attn", &dense), 0);
    cr_expect_eq(dense.expert_dequant_bytes, 0, "bf16 experts need no dequantization");
    cr_assert_eq(plan_of('A', "--device cuda --mode full --quant none", &dense), 0);
    cr_expect_eq(dense.expert_dequant_bytes + dense.expert_dropout_bytes, 0, "every expert trains: none frozen");
    char out[32768];
    cr_assert_eq(mt_test_run(out, sizeof out, "plan --case C --device cuda"), MT_EXIT_OK, "%s", out);
    cr_expect(strstr(out, "experts' dequantization scratch") && strstr(out, "0.473 GB (in work"), "%s", out);
}

// --expert-cache: auto keeps the last layers' experts in bf16 as far as the card holds them by
// the plan's total and the measured step, after --recompute and --dequant-cache have chosen (case C
// at s = 4096: none recomputed; 2.838 GB of bf16 a layer, 2.111 GB net of the 4-bit codes it gives
// back: 5 layers on 80 GB, all 32 on 141 GB, 1 on 44 GB and none on 42 GB, which recompute the
// experts); all keeps every MoE layer's and then no call holds the
// dequantization slots; a count beyond the model's MoE layers is refused naming the flag; a run
// that trains its experts or a cpu run keeps none.
Test(plan, expert_cache_keeps_what_fits) {
    char out[32768];
    const char *c4k = "plan --case C --seq 4096 --device cuda --recompute auto --dequant-cache auto --expert-cache auto";
    cr_assert_eq(mt_test_run(out, sizeof out, "%s --gpu-mem 80GB", c4k), MT_EXIT_OK, "%s", out);
    cr_expect(strstr(out, "recompute none (auto"), "%s", out);
    cr_expect(strstr(out, "the last 5 of 32 MoE layers' experts kept in bf16 (--expert-cache auto: +10.6 GB, their 4-bit "
                          "codes given back)"), "%s", out);
    cr_expect(strstr(out, "→ 14.190 GB (--expert-cache: the last 5 MoE layers' experts, kept in bf16; their 3.635 GB of "
                          "4-bit codes given back, the last expert's 0.091 GB still held at base's peak: 2.111 GB a layer "
                          "net)"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "%s --gpu-mem 80GB --measure", c4k), MT_EXIT_OK, "%s", out);
    cr_expect(strstr(out, "fits on a 80 GB card by the measured total (with --measure it decides): yes"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "%s --gpu-mem 141GB", c4k), MT_EXIT_OK, "%s", out);
    cr_expect(strstr(out, "the last 32 of 32 MoE layers' experts kept in bf16"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "%s --gpu-mem 44GB", c4k), MT_EXIT_OK, "%s", out);
    cr_expect(strstr(out, "recompute experts (auto"), "%s", out);
    cr_expect(strstr(out, "the last 1 of 32 MoE layers' experts kept in bf16"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "%s --gpu-mem 44GB --measure", c4k), MT_EXIT_OK, "%s", out);
    cr_expect(strstr(out, "fits on a 44 GB card by the measured total (with --measure it decides): yes"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "%s --gpu-mem 42GB", c4k), MT_EXIT_OK, "%s", out);
    cr_expect(strstr(out, "recompute experts (auto"), "%s", out);
    cr_expect(strstr(out, "experts dequantized per use (--expert-cache auto: a layer's +2.11 GB, its bf16 experts less "
                          "their codes, would not fit)"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "plan --case C --device cuda --expert-cache all --gpu-mem 200GB"), MT_EXIT_OK,
                 "%s", out);
    cr_expect(strstr(out, "the last 32 of 32 MoE layers' experts kept in bf16 (--expert-cache all: +67.6 GB, their 4-bit "
                          "codes given back)"), "%s", out);
    cr_expect(!strstr(out, "experts' dequantization scratch"), "every layer kept: no slots: %s", out);
    // --max-seq: all counts every layer's, as 32 does (not none, as auto's resolution to nothing)
    char all[4096];
    cr_assert_eq(mt_test_run(all, sizeof all, "plan --case C --device cuda --gpu-mem 100GB --expert-cache all --max-seq"),
                 MT_EXIT_OK, "%s", all);
    cr_assert_eq(mt_test_run(out, sizeof out, "plan --case C --device cuda --gpu-mem 100GB --expert-cache 32 --max-seq"),
                 MT_EXIT_OK, "%s", out);
    cr_expect_str_eq(all, out);
    cr_expect(strstr(out, "max-seq: 2683 tokens (batch 1) fit a 100 GB card"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "plan --case C --device cuda --expert-cache 33"), MT_EXIT_USAGE, "%s", out);
    cr_expect(strstr(out, "--expert-cache 33: the model has 32 MoE layers"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "plan --case C --device cuda --expert-cache many"), MT_EXIT_USAGE, "%s", out);
    cr_expect(strstr(out, "expert-cache") && strstr(out, "'many' is not off, auto, all or a number"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "plan --case B --device cuda --expert-cache 2"), MT_EXIT_NOFIT, "%s", out);
    cr_expect(strstr(out, "--expert-cache 2: no frozen 4-bit experts to keep"), "%s", out);
    cr_expect(!strstr(out, "and kept experts"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "plan --case C --device cpu --expert-cache 2"), MT_EXIT_OK, "%s", out);
    cr_expect(strstr(out, "a cpu run keeps no bf16 experts") && !strstr(out, "and kept experts"), "%s", out);
}

// --recompute auto: the least recomputation whose measured step fits --gpu-mem (less 1 GB for
// what the ledger cannot see). Case C at s = 4096 keeps everything on an 80 GB card (62.4 GB
// measured) and recomputes on a 44 GB one, each choice fitting by --measure.
// auto chooses by the measured step; where that fits and the plan's analytic total does not
// (Qwen3-30B-A3B at s = 4096 on 44 GB), the verdict says both, and the plan's total still decides
// the exit status without --measure. A mode set by hand says nothing more.
Test(plan, auto_measured_fit_is_said_beside_the_plans_no) {
    char out[32768];
    const char *run = "plan --model " MT_REPO_ROOT "/configs/qwen3-30b-a3b.json --mode lora --r 16 --experts all --seq 4096 "
                      "--dequant-cache off";
    cr_assert_eq(mt_test_run(out, sizeof out, "%s", run), MT_EXIT_NOFIT, "%s", out);
    cr_expect(strstr(out, "card: NO (101%)"), "%s", out);
    cr_expect(strstr(out, "by the measured step --recompute auto chose from: yes ("), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "%s --measure", run), MT_EXIT_OK, "%s", out);
    cr_expect(!strstr(out, "auto chose from"), "--measure prints the measured verdict itself: %s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "%s --recompute experts", run), MT_EXIT_NOFIT, "%s", out);
    cr_expect(!strstr(out, "auto chose from"), "%s", out);
}

Test(plan, recompute_auto_picks_the_least_that_fits) {
    mt_model_config cfg;
    mt_plan_mixtral_8x7b(&cfg);
    struct { const char *flags; mt_ckpt want; } runs[] = {
        {"--seq 4096 --gpu-mem 80GB --recompute auto", MT_CKPT_NONE},
        {"--seq 4096 --gpu-mem 44GB --recompute auto", MT_CKPT_EXPERTS},
        {"--seq 4096 --gpu-mem 60GB --recompute auto", MT_CKPT_ATTENTION},
        {"--seq 4096 --gpu-mem 44GB --recompute attention", MT_CKPT_ATTENTION},  // given: kept
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(runs); i++) {
        mt_run_opts o;
        char note[256];
        cr_assert_eq(case_opts('C', runs[i].flags, &o), 0, "%s", mt_error_get());
        cr_assert_eq(mt_run_opts_resolve_recompute(&o, &cfg, 1, note, sizeof note, NULL), 0, "%s", mt_error_get());
        cr_expect_eq(o.checkpointing, runs[i].want, "%s: %s", runs[i].flags, note);
        cr_log_info("%s: %s", runs[i].flags, note);
        if (i == 3) {
            cr_expect(strstr(note, "attention (as set)"), "%s", note);
            continue;
        }
        mt_plan_measurement m;
        cr_assert_eq(mt_plan_measure(&cfg, NULL, MT_PLAN_OPTS_OF(&o), MT_MODEL_SPEC_OF(&o), &m), 0, "%s", mt_error_get());
        cr_expect(mt_plan_measured_fits(&m, o.gpu_mem_bytes), "%s: %.2f GB measured", runs[i].flags, m.total_peak / 1e9);
        // The one before it in the order does not fit (with the 1 GB reserve).
        static const mt_ckpt order[] = {MT_CKPT_NONE, MT_CKPT_ATTENTION, MT_CKPT_EXPERTS, MT_CKPT_FULL};
        for (int k = 0; order[k] != runs[i].want; k++) {
            o.checkpointing = order[k];
            cr_assert_eq(mt_plan_measure(&cfg, NULL, MT_PLAN_OPTS_OF(&o), MT_MODEL_SPEC_OF(&o), &m), 0);
            cr_expect_gt((double)m.total_peak + 1e9, o.gpu_mem_bytes, "%s: %s would fit", runs[i].flags,
                         mt_ckpt_name(order[k]));
        }
    }
    char out[32768];
    cr_assert_eq(mt_test_run(out, sizeof out, "plan --case C --seq 4096 --gpu-mem 80GB --recompute auto --measure"),
                 MT_EXIT_OK, "%s", out);
    cr_expect(strstr(out, "recompute none (auto: fits 80 GB"), "%s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "plan --case C --seq 4096 --gpu-mem 44GB --recompute auto --measure"),
                 MT_EXIT_OK, "%s", out);
    cr_expect(strstr(out, "recompute experts (auto: fits 44 GB"), "%s", out);
}

// --dequant-cache auto: after the recompute mode, the bf16 copies of the 4-bit weights outside the
// experts (Mixtral: attention's q, k, v, o, 32 × 41,943,040 params) where the measured step with
// them still fits; off where they would not, on the cpu, and in the reference cases.
Test(plan, dequant_cache_auto_keeps_copies_where_they_fit) {
    mt_model_config cfg;
    mt_plan_mixtral_8x7b(&cfg);
    const uint64_t copies = 2ull * 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024);
    struct { const char *flags; int gpu; mt_ckpt recompute; int want; const char *says; } runs[] = {
        {"--seq 4096 --gpu-mem 80GB --recompute auto --dequant-cache auto", 1, MT_CKPT_NONE, MT_DEQUANT_CACHE_ON,
         "kept in bf16 (--dequant-cache auto: 2.68 GB)"},
        // none fits 66 GB (63.8 GB with the 1 GB reserve), none with the copies (66.5) does not
        {"--seq 4096 --gpu-mem 66GB --recompute auto --dequant-cache auto", 1, MT_CKPT_NONE, MT_DEQUANT_CACHE_OFF,
         "would not fit"},
        // the measured step with them fits 67 GB (66.5), the plan's total no longer would (65.5 -> 68.2 GB):
        // the trainer would refuse what it ran without them
        {"--seq 4096 --gpu-mem 67GB --recompute none --dequant-cache auto", 1, MT_CKPT_NONE, MT_DEQUANT_CACHE_OFF,
         "would not fit"},
        {"--seq 4096 --gpu-mem 66GB --recompute none --dequant-cache on", 1, MT_CKPT_NONE, MT_DEQUANT_CACHE_ON,
         "(--dequant-cache on: 2.68 GB)"},
        {"--seq 4096 --gpu-mem 80GB --recompute none --dequant-cache auto", 0, MT_CKPT_NONE, MT_DEQUANT_CACHE_OFF, ""},
        {"--seq 4096 --gpu-mem 80GB --recompute auto", 1, MT_CKPT_NONE, MT_DEQUANT_CACHE_OFF, ""},  // the case's off
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(runs); i++) {
        mt_run_opts o;
        char note[512];
        cr_assert_eq(case_opts('C', runs[i].flags, &o), 0, "%s", mt_error_get());
        cr_assert_eq(mt_run_opts_resolve_recompute(&o, &cfg, runs[i].gpu, note, sizeof note, NULL), 0, "%s", mt_error_get());
        cr_log_info("%s: %s", runs[i].flags, note);
        cr_expect_eq(o.checkpointing, runs[i].recompute, "%s: %s", runs[i].flags, note);
        cr_expect_eq(o.dequant_cache, runs[i].want, "%s: %s", runs[i].flags, note);
        cr_expect(strstr(note, runs[i].says), "%s: %s", runs[i].flags, note);
        if (!runs[i].says[0]) cr_expect(!strstr(note, "dequant-cache"), "%s: %s", runs[i].flags, note);
        // The plan's base holds the copies exactly when they are on.
        mt_plan with, without;
        mt_plan_opts po = mt_run_opts_plan(&o);
        cr_assert_eq(mt_plan_compute(&cfg, &po, &with), 0);
        po.dequant_cache = 0;
        cr_assert_eq(mt_plan_compute(&cfg, &po, &without), 0);
        cr_expect_eq(with.bytes[MT_MEM_BASE] - without.bytes[MT_MEM_BASE], o.dequant_cache == MT_DEQUANT_CACHE_ON ? copies : 0,
                     "%s", runs[i].flags);
        cr_expect_eq(with.dequant_cache_bytes, o.dequant_cache == MT_DEQUANT_CACHE_ON ? copies : 0, "%s", runs[i].flags);
    }
    // auto's choice, measured, holds the step with the copies (what `plan` prints beside its no).
    mt_run_opts o;
    mt_plan_recompute_choice choice;
    char note[512];
    cr_assert_eq(case_opts('C', "--seq 4096 --gpu-mem 80GB --recompute auto --dequant-cache auto", &o), 0);
    cr_assert_eq(mt_run_opts_resolve_recompute(&o, &cfg, 1, note, sizeof note, &choice), 0, "%s", mt_error_get());
    mt_plan_measurement m;
    cr_assert_eq(mt_plan_measure(&cfg, NULL, MT_PLAN_OPTS_OF(&o), MT_MODEL_SPEC_OF(&o), &m), 0, "%s", mt_error_get());
    cr_expect(choice.measured && o.dequant_cache == MT_DEQUANT_CACHE_ON, "%s", note);
    cr_expect_eq(choice.total, m.total_peak, "auto's figure %llu, the step with the copies %llu",
                 (unsigned long long)choice.total, (unsigned long long)m.total_peak);
    // The cpu keeps none, and chooses its recompute mode without them: on 128 GB of --mem the
    // measured step twice fits with nothing recomputed (125.5 GB), the copies' would not (130.9).
    cr_assert_eq(case_opts('C', "--seq 4096 --mem 128GB --recompute auto --dequant-cache on", &o), 0);
    cr_assert_eq(mt_run_opts_resolve_recompute(&o, &cfg, 0, note, sizeof note, NULL), 0, "%s", mt_error_get());
    cr_expect_eq(o.checkpointing, MT_CKPT_NONE, "%s", note);
    cr_expect_eq(o.dequant_cache, MT_DEQUANT_CACHE_OFF, "%s", note);
    cr_expect(strstr(note, "the cpu step keeps no bf16 copies"), "%s", note);
    // A plan that does not fit with them names the copies first among its fixes.
    cr_assert_eq(case_opts('C', "--seq 4096 --gpu-mem 66GB --recompute none --dequant-cache on", &o), 0);
    mt_plan p;
    mt_plan_opts po = mt_run_opts_plan(&o);
    cr_assert_eq(mt_plan_compute(&cfg, &po, &p), 0);
    cr_expect(!p.fits);
    mt_plan_suggestion sug[MT_PLAN_MAX_SUGGESTIONS];
    int ns = mt_plan_suggest(&cfg, &po, sug, MT_PLAN_MAX_SUGGESTIONS);
    cr_expect(ns > 0 && strcmp(sug[0].change, "--dequant-cache off") == 0, "%d suggestions, first %s", ns,
              ns ? sug[0].change : "-");
    cr_expect_neq(case_opts(0, "--dequant-cache sometimes", &o), 0);
    cr_expect(strstr(mt_error_get(), "dequant-cache") && strstr(mt_error_get(), "off, on, auto"), "%s", mt_error_get());
}

Test(plan, checks_name_the_flag) {
    static const struct { const char *flags, *needle; } bad[] = {
        {"--gpus 16 --ep 16", "--ep"}, {"--ep 3", "--ep"},          {"--gpus 2 --ep 4", "--gpus"},
        {"--layers 32", "--layers"},   {"--experts 0,8", "--experts"}, {"--zero 3", "--zero"},
        {"--seq 0", "--seq"},          {"--r 0", "--r"},
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(bad); i++) {
        mt_plan p;
        cr_expect_neq(plan_of('C', bad[i].flags, &p), 0, "%s accepted", bad[i].flags);
        cr_expect(strstr(mt_error_get(), bad[i].needle), "%s: got '%s'", bad[i].flags, mt_error_get());
    }
}

// ---------------------------------------------------------------------------------------------
// Suggestions

static const mt_plan_suggestion *find_change(const mt_plan_suggestion *s, int n, const char *change) {
    for (int i = 0; i < n; i++)
        if (strcmp(s[i].change, change) == 0) return &s[i];
    return NULL;
}

static int suggest(char which, const char *flags, mt_plan_suggestion *out) {
    mt_model_config cfg;
    mt_run_opts o;
    mt_plan_mixtral_8x7b(&cfg);
    cr_assert_eq(case_opts(which, flags, &o), 0);
    return mt_plan_suggest(&cfg, MT_PLAN_OPTS_OF(&o), out, MT_PLAN_MAX_SUGGESTIONS);
}

Test(plan, suggestions_are_recomputed_plans_that_fit) {
    mt_plan_suggestion s[MT_PLAN_MAX_SUGGESTIONS];
    int n = suggest('B', "", s);
    const mt_plan_suggestion *ep2 = find_change(s, n, "--gpus 2 --ep 2");
    cr_assert_not_null(ep2);
    cr_expect(fabs(gb(ep2->plan.total) - 32.26) <= 0.005);
    const mt_plan_suggestion *adam = find_change(s, n, "--adam-8bit --no-master-weights");
    cr_assert_not_null(adam);
    cr_expect(fabs(gb(adam->plan.total) - 38.61) <= 0.005);
    cr_assert_not_null(find_change(s, n, "--offload-optimizer"));
    cr_expect_null(find_change(s, n, "--seq 512"), "half the sequence saves 0.5 GB: not enough");
    for (int i = 0; i < n; i++) cr_expect(s[i].plan.fits, "%s listed but does not fit", s[i].change);

    n = suggest('A', "--quant none", s);
    const mt_plan_suggestion *q = find_change(s, n, "--quant nf4");
    cr_assert_not_null(q);
    cr_expect(fabs(gb(q->plan.total) - 27.03) <= 0.005);
    cr_expect_null(find_change(s, n, "--gpus 2 --ep 2"), "51.36 GB does not fit");
    cr_expect_not_null(find_change(s, n, "--gpus 4 --ep 4"));

    n = suggest('C', "--checkpointing none --gpu-mem 38GB", s);  // 38.61 GB without recomputation
    const mt_plan_suggestion *rc = find_change(s, n, "--recompute attention");
    cr_assert_not_null(rc, "the least recomputation that fits: attention (1.2 GB less)");
    cr_expect_lt(gb(rc->plan.total), 38.0);
    cr_expect_null(find_change(s, n, "--recompute full"), "one recomputation line, the least that fits");
    n = suggest('C', "--checkpointing none --gpu-mem 36GB", s);
    cr_expect_not_null(find_change(s, n, "--recompute experts"), "attention alone saves too little for 36 GB");
    cr_expect_eq(suggest('A', "--gpu-mem 5GB", s), 0, "nothing single fits 5 GB");
}

// ---------------------------------------------------------------------------------------------
// The built-in config against configs/mixtral-8x7b.json

Test(plan, builtin_config_matches_configs_json) {
    const char *path = MT_REPO_ROOT "/configs/mixtral-8x7b.json";
    if (access(path, R_OK) != 0) cr_skip_test("%s is not written yet", path);
    mt_model_config file, builtin;
    cr_assert_eq(mt_model_config_load(path, &file), 0, "%s", mt_error_get());
    mt_plan_mixtral_8x7b(&builtin);
    cr_expect_eq(file.hidden, builtin.hidden);
    cr_expect_eq(file.intermediate, builtin.intermediate);
    cr_expect_eq(file.layers, builtin.layers);
    cr_expect_eq(file.heads, builtin.heads);
    cr_expect_eq(file.kv_heads, builtin.kv_heads);
    cr_expect_eq(file.head_dim, builtin.head_dim);
    cr_expect_eq(file.experts, builtin.experts);
    cr_expect_eq(file.top_k, builtin.top_k);
    cr_expect_eq(file.vocab, builtin.vocab);
    cr_expect_eq(file.tie_word_embeddings, builtin.tie_word_embeddings);
    cr_expect_eq(mt_config_total_params(&file), mt_config_total_params(&builtin));
    for (const char *c = "ABC"; *c; c++) {
        mt_run_opts o;
        mt_plan a, b;
        cr_assert_eq(case_opts(*c, "", &o), 0);
        cr_assert_eq(mt_plan_compute(&file, MT_PLAN_OPTS_OF(&o), &a), 0);
        cr_assert_eq(mt_plan_compute(&builtin, MT_PLAN_OPTS_OF(&o), &b), 0);
        cr_expect_eq(a.total, b.total, "case %c", *c);
    }
}

Test(plan, model_count_matches_config_for_other_shapes) {
    static const char *names[] = {"tiny.json", "mid.json", "mixtral-8x7b.json"};
    int seen = 0;
    for (size_t i = 0; i < MT_ARRAY_LEN(names); i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/configs/%s", MT_REPO_ROOT, names[i]);
        if (access(path, R_OK) != 0) continue;
        mt_model_config cfg;
        cr_assert_eq(mt_model_config_load(path, &cfg), 0, "%s", mt_error_get());
        mt_run_opts o;
        mt_plan p;
        cr_assert_eq(case_opts(0, "--mode full", &o), 0);
        cr_assert_eq(mt_plan_compute(&cfg, MT_PLAN_OPTS_OF(&o), &p), 0, "%s: %s", names[i], mt_error_get());
        cr_expect_eq(p.model_params, mt_config_total_params(&cfg), "%s", names[i]);
        cr_expect_eq(p.trainable_params, p.model_params, "%s: full mode trains everything", names[i]);
        seen++;
    }
    if (!seen) cr_skip_test("no configs/*.json written yet");
}

// ---------------------------------------------------------------------------------------------
// The command

static char out[1 << 16];

Test(plan, cli_case_b_does_not_fit_and_says_what_would) {
    cr_assert_eq(mt_test_run(out, sizeof out, "plan --case B"), MT_EXIT_NOFIT, "%s", out);
    cr_expect(strstr(out, "NO (136%)"), "%s", out);
    cr_expect(strstr(out, "--gpus 2 --ep 2") && strstr(out, "32.26"), "%s", out);
    cr_expect(strstr(out, "33.8 GB"), "the source's figures beside ours: %s", out);
}

Test(plan, cli_case_b_on_two_gpus_fits) {
    cr_assert_eq(mt_test_run(out, sizeof out, "plan --case B --gpus 2 --ep 2"), MT_EXIT_OK, "%s", out);
    cr_expect(strstr(out, "32.26"), "%s", out);
    cr_expect(strstr(out, "yes (73%)"), "%s", out);
    cr_expect(strstr(out, "33.83 GB"), "the source comparison stays on the case's own settings: %s", out);
    cr_assert_eq(mt_test_run(out, sizeof out, "plan --case A --quant none --gpus 4 --ep 4"), MT_EXIT_OK, "%s", out);
    cr_expect(strstr(out, "28.81"), "%s", out);
}

Test(plan, cli_json) {
    cr_assert_eq(mt_test_run(out, sizeof out, "plan --case C --json"), MT_EXIT_OK, "%s", out);
    cJSON *j = cJSON_Parse(out);
    cr_assert_not_null(j, "not JSON: %s", out);
    cJSON *g = cJSON_GetObjectItem(j, "gb"), *b = cJSON_GetObjectItem(j, "bytes");
    cr_assert(g && b);
    cr_expect(fabs(cJSON_GetObjectItem(g, "total")->valuedouble - 30.68) <= 0.005);
    mt_plan p;
    cr_assert_eq(plan_of('C', "", &p), 0);
    cr_expect_eq((uint64_t)cJSON_GetObjectItem(b, "total")->valuedouble, p.total);
    cr_expect_eq((uint64_t)cJSON_GetObjectItem(b, "base")->valuedouble, p.bytes[MT_MEM_BASE]);
    cr_expect(cJSON_IsTrue(cJSON_GetObjectItem(j, "fits")));
    cr_expect_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "params"), "trainable")->valuedouble, 228593664.0);
    cJSON *src = cJSON_GetObjectItem(j, "source");
    cr_expect(cJSON_IsArray(src) && cJSON_GetArraySize(src) > 0);
    cJSON_Delete(j);

    cr_assert_eq(mt_test_run(out, sizeof out, "plan --case B --json"), MT_EXIT_NOFIT);
    j = cJSON_Parse(out);
    cr_assert_not_null(j, "not JSON: %s", out);
    cr_expect(cJSON_IsFalse(cJSON_GetObjectItem(j, "fits")));
    cr_expect(cJSON_GetArraySize(cJSON_GetObjectItem(j, "suggestions")) >= 1);
    cJSON_Delete(j);
}

Test(plan, cli_bad_input) {
    cr_expect_eq(mt_test_run(out, sizeof out, "plan --case B --bogus 1"), MT_EXIT_USAGE);
    cr_expect(strstr(out, "--bogus"), "%s", out);
    cr_expect_eq(mt_test_run(out, sizeof out, "plan --case C --gpus 16 --ep 16"), MT_EXIT_USAGE);
    cr_expect(strstr(out, "--ep") && strstr(out, "8 experts"), "%s", out);
    cr_expect_eq(mt_test_run(out, sizeof out, "plan --case C --ep 3"), MT_EXIT_USAGE);
    cr_expect(strstr(out, "--ep"), "%s", out);
    cr_expect_eq(mt_test_run(out, sizeof out, "plan --mode lora"), MT_EXIT_USAGE);
    cr_expect(strstr(out, "--model"), "%s", out);
    cr_expect_eq(mt_test_run(out, sizeof out, "plan --model /nonexistent/moetrain-model"), MT_EXIT_ERROR);
    cr_expect_eq(mt_test_run(out, sizeof out, "plan --case A --gpus 2 --zero 2 --measure"), MT_EXIT_USAGE);
    cr_expect(strstr(out, "--zero 2"), "--measure names what it cannot measure: %s", out);
    cr_expect_eq(mt_test_run(out, sizeof out, "plan --case C --blocksize 48"), MT_EXIT_USAGE);
    cr_expect(strstr(out, "--blocksize"), "%s", out);
    cr_expect_eq(mt_test_run(out, sizeof out, "plan --help"), MT_EXIT_OK);
    cr_expect(strstr(out, "usage: moetrain plan") && strstr(out, "--gpu-mem"), "%s", out);
}

Test(plan, cli_model_file_with_run_config) {
    const char *model = MT_REPO_ROOT "/configs/mixtral-8x7b.json", *run = MT_REPO_ROOT "/configs/case-b.yaml";
    if (access(model, R_OK) != 0 || access(run, R_OK) != 0) cr_skip_test("configs not written yet");
    cr_assert_eq(mt_test_run(out, sizeof out, "plan --model %s --config %s", model, run), MT_EXIT_OK, "%s", out);
    cr_expect(strstr(out, "32.26"), "%s", out);
}

// --ep that does not divide --gpus is the flag's error, whatever runs first: --recompute auto
// measured a step with no DP group before the options were checked (SIGFPE).
Test(plan, ep_not_dividing_gpus_is_refused_before_measuring) {
    char out[4096];
    cr_assert_eq(mt_test_run(out, sizeof out, "plan --model %s/configs/tiny.json --ep 2", MT_REPO_ROOT), MT_EXIT_USAGE,
                 "%s", out);
    cr_expect(strstr(out, "--ep 2 does not divide --gpus 1"), "%s", out);
}

// gpt-oss's experts count at the checkpoint's MXFP4 (4.25 bits), which the loader keeps whatever
// 4-bit --quant names, and the report says so.
Test(plan, gpt_oss_experts_count_as_their_mxfp4) {
    char nf4[8192], mx[8192];
    const char *run = "plan --model %s/configs/gpt-oss-20b.json --mode lora --r 16 --recompute full --quant %s";
    cr_assert_eq(mt_test_run(nf4, sizeof nf4, run, MT_REPO_ROOT, "nf4"), MT_EXIT_OK, "%s", nf4);
    cr_assert_eq(mt_test_run(mx, sizeof mx, run, MT_REPO_ROOT, "mxfp4"), MT_EXIT_OK, "%s", mx);
    cr_expect(strstr(nf4, "the experts in the checkpoint's own MXFP4"), "%s", nf4);
    const char *a = strstr(nf4, "frozen weights + quant constants"), *b = strstr(mx, "frozen weights + quant constants");
    cr_assert(a && b);
    // experts at 4.25 bits in both; only attention's NF4-DQ (4.127) vs MXFP4 (4.25) differs
    double base_nf4 = atof(a + strlen("frozen weights + quant constants")),
           base_mx = atof(b + strlen("frozen weights + quant constants"));
    cr_expect(base_mx > base_nf4 && base_mx - base_nf4 < 0.05, "base %.3f (nf4) vs %.3f (mxfp4)", base_nf4, base_mx);
}
