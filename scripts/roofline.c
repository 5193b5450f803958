// scripts/roofline.c — `make bench-gpu` on any machine: a roofline PROJECTION of one QLoRA
// training step on one H100 SXM (--device h200: an H200), op by op (scripts/step_model.h counts FLOPs and bytes), each op
// timed at max(FLOPs / (peak · efficiency), bytes / (bandwidth · efficiency)) plus a launch gap
// per call, and summed (no overlap between ops). Nothing here is measured: every rate is a
// published or once-measured figure times a stated efficiency, printed with its source before the
// table (scripts/step_time.h holds the values). The rows carry the step's profile names
// (core/profile.h), so the GPU check's measured table (scripts/profile_table.h) sits beside this
// one line by line.
//
// The case: configs/case-c.yaml (Mixtral-8x7B, NF4 double-quant frozen experts and attention,
// LoRA r=16 on every expert's w1, w2, w3 and on the routers), bf16 activations, micro-batch 1,
// one GPU, no expert parallelism; by default the step issue 27 builds (experts dequantized to bf16
// and run through cuBLASLt, attention through cuDNN's SDPA) and --recompute auto resolved as the
// trainer would on an 80 GB card.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "model/config.h"
#include "plan/plan.h"
#include "quant/quant.h"
#include "scripts/step_model.h"
#include "scripts/step_time.h"
#include "trainer/options.h"  // mt_parse_bytes, case C's run options

typedef struct {
    double step_s, tokens_s, mfu, hfu, hw_flops, model_flops;
} totals;

static const char *bound_name(const step_op *o, int cb) {
    if (!cb) return "memory";
    return o->cls == STEP_DEQUANT ? "issue" : "compute";
}

static totals project(const step_shape *sh, int print) {
    step_ops ops;
    step_build(sh, &ops);
    totals t;
    memset(&t, 0, sizeof t);
    double T = (double)(sh->batch * sh->seq);
    if (print)
        printf("%-36s %2s %6s %9s %8s %8s %-7s %5s %9s\n", "op (profile row)", "ph", "calls", "GFLOP", "GB", "FLOP/B",
               "bound", "eff", "ms");
    double by_phase[4] = {0};
    for (int i = 0; i < ops.n; i++) {
        const step_op *o = &ops.op[i];
        int cb;
        double s = op_time(o, &cb);
        t.step_s += s;
        by_phase[o->phase == 'F' ? 0 : o->phase == 'R' ? 1 : o->phase == 'B' ? 2 : 3] += s;
        // eff: of the resource that bounds the op (its compute rate, the card's copy bandwidth, or
        // the issue slots).
        double eff = !cb ? mem_eff(o) : o->cls == STEP_DEQUANT ? 1.0 : op_eff(o);
        if (print)
            printf("%-36s %2c %6.0f %9.1f %8.2f %8.1f %-7s %4.0f%% %9.2f\n", o->name, o->phase, o->count, o->flops / 1e9,
                   o->bytes / 1e9, o->bytes > 0 ? o->flops / o->bytes : 0.0, bound_name(o, cb), 100 * eff, s * 1e3);
    }
    t.hw_flops = step_hw_flops(&ops);
    t.model_flops = step_model_flops_per_token(&sh->cfg, sh->seq) * T;
    t.tokens_s = T / t.step_s;
    t.mfu = t.model_flops / t.step_s / PEAK_BF16;
    t.hfu = t.hw_flops / t.step_s / PEAK_BF16;
    if (print) {
        printf("%-36s %2s %6s %9.1f %8s %8s %-7s %5s %9.2f\n", "total", "", "", t.hw_flops / 1e9, "", "", "", "",
               t.step_s * 1e3);
        printf("by phase (ms): forward %.1f, recompute %.1f, backward %.1f, optimizer %.1f\n", by_phase[0] * 1e3,
               by_phase[1] * 1e3, by_phase[2] * 1e3, by_phase[3] * 1e3);
        printf("LoRA parameters: %.1f M\n", step_lora_params(&ops) / 1e6);
    }
    return t;
}

static void usage(FILE *f) {
    fprintf(f, "usage: moetrain_roofline [--model config.json] [--seq N]... [--recompute MODE] [--gpu-mem BYTES]\n"
               "                         [--dequant-cache MODE] [--expert-cache N] [--dequant-instr N] [--attention cudnn|wmma]\n"
               "                         [--dropout P] [--device h100|h200] [--layers N]\n"
               "  --model          a Mixtral-family config.json (default: Mixtral-8x7B, configs/mixtral-8x7b.json's values)\n"
               "  --seq            sequence length of the detailed table (default 4096)\n"
               "  --recompute      none | attention | experts | full | auto (default auto: the least that fits\n"
               "                   --gpu-mem by the planner's measured step, as the trainer picks it)\n"
               "  --gpu-mem        the card auto plans for (default 80GB: an H100 SXM 80 GB)\n"
               "  --dequant-cache  off | on | auto: attention's 4-bit weights kept in bf16 (default auto: where they\n"
               "                   fit after the recompute mode, as the trainer decides)\n"
               "  --expert-cache   N | all | off | auto: the last N layers' experts kept in bf16 (default auto: as\n"
               "                   many as fit after the two above, as the trainer decides)\n"
               "  --dequant-instr  SASS instructions per element of the 4-bit -> bf16 kernel (default 8;\n"
               "                   make bench-gpu passes the count read from the kernel's SASS)\n"
               "  --attention      cudnn: cuDNN's SDPA (default); wmma: the WMMA flash kernels\n"
               "  --dropout        the experts' LoRA dropout (default 0, as case C)\n"
               "  --device         the card (default h100: the H100 SXM; h200: its measured copy, GEMM and kernel rates)\n"
               "  --layers         layers of the model (default the config's; the GPU check runs 4)\n");
}

static void set_recompute(step_shape *sh, mt_ckpt mode) {
    sh->recompute = 0;
    sh->recompute_attn = mt_ckpt_attention(mode), sh->recompute_mlp = mt_ckpt_mlp(mode);
}

// Case C's run as the trainer resolves it (trainer/options.c mt_run_opts_resolve_recompute), at
// sh->seq on a card of gpu_mem bytes: the recompute mode (`mode`, or auto's choice), the bf16
// copies of --dequant-cache (`cache`: off, on or auto) and the kept experts of --expert-cache
// (`experts`: a count, or auto or all) into sh, what the one-line plan says into note. -1: the
// options or the measured step failed (the error set).
static int resolve_run(step_shape *sh, mt_ckpt mode, int cache, int experts, double gpu_mem, char *note, size_t n) {
    mt_run_opts o;
    mt_run_opts_default(&o);
    char seq[32];
    snprintf(seq, sizeof seq, "%lld", (long long)sh->seq);
    if (mt_plan_case_apply(&o, 'C') != 0 || mt_run_opts_set(&o, "seq", seq) != 0 || mt_run_opts_set(&o, "device", "cuda") != 0)
        return -1;
    o.gpu_mem_bytes = gpu_mem, o.checkpointing = mode, o.dequant_cache = cache, o.lora_dropout = sh->lora_dropout;
    o.expert_cache = experts;
    if (mt_run_opts_resolve_recompute(&o, &sh->cfg, 1, note, n, NULL) != 0) return -1;
    set_recompute(sh, o.checkpointing);
    sh->dequant_cache = o.dequant_cache == MT_DEQUANT_CACHE_ON;
    sh->expert_cache = o.expert_cache;
    return 0;
}

static void print_assumptions(const step_shape *sh) {
    printf("assumptions (value: source)\n");
    printf("  card: %s (--device); peaks: bf16 dense %.0f TFLOP/s, HBM %.2f TB/s: NVIDIA's datasheet; a device copy\n"
           "    (read + write) %.0f GB/s: measured on the GPU machine (docs/gpu-results.md, 2026-11-27)\n",
           step_dev->name, PEAK_BF16 / 1e12, HBM_BW / 1e12, step_dev->copy_bw / 1e9);
    printf("  issue rate: %.2f e12 thread instructions/s = %d SMs x 4 schedulers x 32 lanes x %.2f GHz: Hopper whitepaper's\n"
           "    SM; the clock the datasheet's 989 TFLOP/s implies at 4096 dense bf16 FLOP/clock/SM\n",
           ISSUE_RATE / 1e12, H100_SMS, H100_CLOCK / 1e9);
    printf("  cuBLASLt bf16 GEMM: %.0f TFLOP/s at 8192^3: measured on the GPU machine's %s; other shapes\n"
           "    (assumed): the same core rate (%.3f of peak) x tile use of the better of 128x256 / 128x128 tiles over\n"
           "    %d SMs x K/(K+%.0f) (pipeline fill and epilogue); e.g. M=1024 rows per expert: w1+w3 %.0f%%, w2 %.0f%%,\n"
           "    dx %.0f%% / %.0f%%; q,k,v at T=4096 %.0f%%; skinny GEMMs (N or K <= %.0f: LoRA, the router) %.0f%%\n"
           "    (assumed: narrow or split-K tiles at half the core rate; memory-bound at it, their bytes at %.2f TB/s:\n"
           "    measured, the expert LoRA products, 2026-11-27); expert GEMMs' rows spread +-%.0f%% around T*k/E (routing\n"
           "    is never balanced: assumed), averaging their tile use: w1+w3 at M=1024 %.0f%%, w2 %.0f%%; the H200's\n"
           "    cuBLASLt ran 56-72%% there (2026-11-27)\n",
           CUBLAS_8192_FLOPS / 1e12, step_dev->name, cublas_core(), H100_SMS, GEMM_K_OVERHEAD,
           100 * cublas_eff(1024, 2.0 * (double)sh->cfg.intermediate, (double)sh->cfg.hidden),
           100 * cublas_eff(1024, (double)sh->cfg.hidden, (double)sh->cfg.intermediate),
           100 * cublas_eff(1024, (double)sh->cfg.hidden, 2.0 * (double)sh->cfg.intermediate),
           100 * cublas_eff(1024, (double)sh->cfg.intermediate, (double)sh->cfg.hidden),
           100 * cublas_eff(4096, 4096, 4096), GEMM_SKINNY, 100 * cublas_eff(1024, 16, 4096), step_dev->skinny_bw / 1e12,
           100 * STEP_ROUTING_SPREAD,
           100 * cublas_eff_spread(1024, 2.0 * (double)sh->cfg.intermediate, (double)sh->cfg.hidden, STEP_ROUTING_SPREAD),
           100 * cublas_eff_spread(1024, (double)sh->cfg.hidden, (double)sh->cfg.intermediate, STEP_ROUTING_SPREAD));
    if (sh->attn_cudnn)
        printf("  cuDNN SDPA bf16, head dim 128, seq 4k: %.0f TFLOP/s forward, %.0f backward: cuDNN's bars in the\n"
               "    FlashAttention-3 paper (Shah et al. 2024, arXiv 2407.08608, Figs. 5-6, no causal mask); causal x %.2f\n"
               "    (assumed: diagonal tiles half masked); backward FLOPs 2.5x forward (FlashAttention-2's 5 GEMMs)\n",
               SDPA_FWD_FLOPS / 1e12, SDPA_BWD_FLOPS / 1e12, SDPA_CAUSAL);
    else
        printf("  WMMA flash attention: %.3f backward of peak: measured on the H100 (2026-11-27, seq 4096, hd 128);\n"
               "    %.2f forward: assumed, not measured (issue 27's review says 15-20%%: likely optimistic)\n",
               EFF_ATTN_BWD, EFF_ATTN_FWD);
    printf("  memory-bound kernels, as fractions of the copy: measured on the H200 (run 6, 2026-11-27, case C at seq 4096\n"
           "    and 16384, the mean), the same fraction assumed on other cards; rows not measured %.2f (the median):\n   ",
           EFF_MEM);
    for (size_t i = 0; i < MT_ARRAY_LEN(STEP_MEASURED); i++) {
        const step_measured *x = &STEP_MEASURED[i];
        char v[32];
        if (x->bw > 0) snprintf(v, sizeof v, "%.2f TB/s", x->bw / 1e12);
        else snprintf(v, sizeof v, "%.2f", x->frac);
        printf(" %s%s%s %s%s", x->name, x->phase ? " " : "", x->phase ? (char[2]){x->phase, 0} : "", v,
               i + 1 < MT_ARRAY_LEN(STEP_MEASURED) ? (i % 4 == 3 ? ",\n   " : ",") : "\n");
    }
    printf("    (the lm_head rows' figures are of the bf16 peak: chunked GEMMs, measured 0.41-0.52; the TB/s are\n"
           "    the skinny GEMMs' byte rates on the H200, a call's fixed cost beside them (scripts/step_time.h); on\n"
           "    other cards their skinny rate)\n");
    printf("  expert dequantization 4-bit -> bf16: %.3f B in (0.5 + block constants) and 2 B out per element at %.3f\n"
               "    of the copy bandwidth: measured on the %s (2026-11-27; the goal is 0.85); or %.2f SASS\n"
               "    instructions per element at the issue rate, whichever is slower (%s)\n",
               (double)mt_qweight_dequant_bytes_of(sh->quant, 1 << 20, 1024, sh->blocksize, sh->double_quant, MT_BF16) /
                       (1024.0 * 1024 * 1024) - 2.0,
               EFF_DEQUANT, step_dev->name, sh->dequant_instr > 0 ? sh->dequant_instr : STEP_DEQUANT_INSTR_DEFAULT,
               sh->dequant_instr > 0 ? "--dequant-instr: `make bench-gpu` passes scripts/sass_count.sh's count of the kernel"
                                     : "not counted: the default, issue 27's ceiling");
    printf("  launches: %.0f us a call between kernels (one stream, no CUDA Graphs): assumed\n", LAUNCH_GAP_S * 1e6);
    printf("  routing: every expert gets T*k/E rows (balanced: assumed, as the planner)\n");
    printf("  no overlap between ops: each op's time is added (an upper bound where streams would overlap)\n\n");
}

int main(int argc, char **argv) {
    step_shape sh;
    memset(&sh, 0, sizeof sh);
    mt_plan_mixtral_8x7b(&sh.cfg);
    int64_t seqs[8];
    int n_seqs = 0;
    mt_ckpt mode = MT_CKPT_AUTO;
    int cache = MT_DEQUANT_CACHE_AUTO, experts = MT_EXPERT_CACHE_AUTO;
    double gpu_mem = 80e9;
    int64_t layers = 0;
    sh.attn_cudnn = 1;  // attention: MT_ATTENTION=auto's cuDNN SDPA
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout), 0;
        if (!v) return usage(stderr), MT_EXIT_USAGE;
        int ok = 1;
        if (!strcmp(a, "--model")) {
            if (mt_model_config_load(v, &sh.cfg) != 0) return fprintf(stderr, "roofline: %s\n", mt_error_get()), MT_EXIT_USAGE;
        } else if (!strcmp(a, "--seq")) {
            ok = atoll(v) > 0 && n_seqs < 8;
            if (ok) seqs[n_seqs++] = atoll(v);
        } else if (!strcmp(a, "--recompute")) {
            static const char *names[] = {"full", "none", "attention", "experts", "auto"};  // mt_ckpt's order
            ok = 0;
            for (int k = 0; k < 5; k++)
                if (!strcmp(v, names[k])) mode = (mt_ckpt)k, ok = 1;
        } else if (!strcmp(a, "--dequant-cache")) {  // the trainer's own parse of the flag
            mt_run_opts parsed;
            mt_run_opts_default(&parsed);
            ok = mt_run_opts_set(&parsed, "dequant-cache", v) == 0, cache = parsed.dequant_cache;
        } else if (!strcmp(a, "--expert-cache")) {
            mt_run_opts parsed;
            mt_run_opts_default(&parsed);
            ok = mt_run_opts_set(&parsed, "expert-cache", v) == 0, experts = parsed.expert_cache;
        } else if (!strcmp(a, "--gpu-mem")) {
            ok = mt_parse_bytes(v, &gpu_mem) == 0 && gpu_mem > 0;
        } else if (!strcmp(a, "--dequant-instr")) {
            sh.dequant_instr = atof(v), ok = sh.dequant_instr > 0;
        } else if (!strcmp(a, "--attention")) {
            ok = !strcmp(v, "cudnn") || !strcmp(v, "wmma"), sh.attn_cudnn = !strcmp(v, "cudnn");
        } else if (!strcmp(a, "--device")) {
            ok = step_device_set(v) == 0;
        } else if (!strcmp(a, "--layers")) {
            ok = atoll(v) > 0, layers = atoll(v);
        } else if (!strcmp(a, "--dropout")) {
            sh.lora_dropout = atof(v), ok = sh.lora_dropout >= 0 && sh.lora_dropout < 1;
        } else {
            ok = 0;
        }
        if (!ok) return fprintf(stderr, "roofline: bad flag or value: %s %s\n", a, v), usage(stderr), MT_EXIT_USAGE;
        i++;
    }
    if (!n_seqs) seqs[0] = 4096, n_seqs = 1;
    if (layers > sh.cfg.layers)
        return fprintf(stderr, "roofline: --layers %lld: the model has %lld\n", (long long)layers,
                       (long long)sh.cfg.layers), MT_EXIT_USAGE;
    if (layers) sh.cfg.layers = layers;
    sh.batch = 1;
    sh.lora_r = 16;
    sh.targets = MT_TARGET_EXPERTS | MT_TARGET_GATE;  // case C (configs/case-c.yaml)
    sh.quant_experts = sh.quant_attn = 1;
    sh.quant = MT_QUANT_NF4, sh.blocksize = 64, sh.double_quant = 1;
    sh.dequants_per_use = 1;
    sh.seq = seqs[0];
    char note[512];
    if (resolve_run(&sh, mode, cache, experts, gpu_mem, note, sizeof note) != 0)
        return fprintf(stderr, "roofline: case C's run: %s\n", mt_error_get()), MT_EXIT_ERROR;

    const mt_model_config *c = &sh.cfg;
    double N = step_matmul_params(c);
    printf("=== ROOFLINE PROJECTION (not a measurement) — one %s, QLoRA step ===\n", step_dev->name);
    printf("model: hidden %lld, %lld layers, %lld experts top-%lld, ffn %lld, heads %lld/%lld x %lld, vocab %lld\n",
           (long long)c->hidden, (long long)c->layers, (long long)c->experts, (long long)c->top_k,
           (long long)c->intermediate, (long long)c->heads, (long long)c->kv_heads, (long long)c->head_dim,
           (long long)c->vocab);
    printf("case C (configs/case-c.yaml): NF4 double-quant (blocksize 64) frozen experts and q,k,v,o; LoRA r=16 on "
           "w1,w2,w3 (all experts) and the routers, dropout %g; bf16 activations; micro-batch 1; one GPU, no EP\n",
           sh.lora_dropout);
    printf("step: experts 4-bit W dequantized to bf16 scratch, then cuBLASLt per expert (w1+w3 one GEMM, N = 2f, "
           "their LoRAs' B beside W); attention %s; recompute %s\n",
           sh.attn_cudnn ? "cuDNN SDPA" : "WMMA flash kernels", note);
    printf("N (matmul params per token, input embedding excluded) = %.3f e9 (mt_config_active_params %.3f e9)\n",
           N / 1e9, (double)mt_config_active_params(c) / 1e9);
    print_assumptions(&sh);
    printf("phases: F forward, R recompute (the parts --recompute names), B backward (dx and LoRA grads; the\n"
           "experts' second dequantization serves their recompute too), O optimizer\n\n");

    printf("--- seq %lld (%lld tokens a step) ---\n", (long long)sh.seq, (long long)(sh.batch * sh.seq));
    totals t = project(&sh, 1);
    printf("PROJECTION seq %lld: step %.3f s, %.0f tokens/s, MFU %.1f%% ((4·N + 6·S·d_attn·L) = %.2f GFLOP/token), "
           "HFU %.1f%% (%.1f TFLOP hardware / step, all against the bf16 peak)\n\n", (long long)sh.seq, t.step_s,
           t.tokens_s, 100 * t.mfu, step_model_flops_per_token(c, sh.seq) / 1e9, 100 * t.hfu, t.hw_flops / 1e12);

    const int64_t cols[3] = {2048, 4096, 16384};
    printf("PROJECTION by sequence length and recomputation (micro-batch 1, %d layers' experts kept as above; time\n"
           "only: whether it fits is `moetrain plan`'s question)\n", sh.expert_cache);
    printf("%8s %-10s %10s %12s %8s %8s %16s\n", "seq", "recompute", "step s", "tokens/s", "MFU", "HFU",
           "attention share");
    const mt_ckpt modes[4] = {MT_CKPT_NONE, MT_CKPT_ATTENTION, MT_CKPT_EXPERTS, MT_CKPT_FULL};
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++) {
            step_shape x = sh;
            x.seq = cols[i];
            set_recompute(&x, modes[k]);
            totals u = project(&x, 0);
            step_ops ops;
            step_build(&x, &ops);
            double att = 0;
            for (int j = 0; j < ops.n; j++) {
                int cb;
                if (ops.op[j].cls == STEP_ATTN || ops.op[j].cls == STEP_SDPA) att += op_time(&ops.op[j], &cb);
            }
            printf("%8lld %-10s %10.3f %12.0f %7.1f%% %7.1f%% %15.1f%%\n", (long long)x.seq, mt_ckpt_name(modes[k]),
                   u.step_s, u.tokens_s, 100 * u.mfu, 100 * u.hfu, 100 * att / u.step_s);
        }
    printf("roofline: PROJECTION, not measured; `make CUDA=1 bench-gpu` on an H100 measures the same step, and its\n"
           "profile table (scripts/profile_table.h) sets each measured row beside these\n");
    return 0;
}
