// scripts/roofline.c — `make bench-gpu` on any machine: a roofline PROJECTION of one QLoRA
// training step on one H100 SXM, op by op (scripts/step_model.h counts FLOPs and bytes), each op
// timed at max(FLOPs / (peak · efficiency), bytes / (bandwidth · efficiency)) and summed (no
// overlap between ops, no launch overhead). Nothing here is measured: every rate below is a
// published peak times an efficiency factor, and each factor says where it comes from.
//
// The case (the brief of issue 12's performance work; note that configs/case-c.yaml puts LoRA on
// the routers instead of attention): Mixtral-8x7B, NF4 double-quant frozen experts and
// attention, LoRA r=16 on every expert's w1, w2, w3 and on q, k, v, o, bf16 activations,
// --checkpointing full (one recompute forward), micro-batch 1, one GPU, no expert parallelism.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "model/config.h"
#include "plan/plan.h"
#include "scripts/step_model.h"
#include "scripts/step_time.h"

typedef struct {
    double step_s, tokens_s, mfu, hfu, hw_flops, model_flops;
} totals;

static totals project(const step_shape *sh, int print) {
    step_ops ops;
    step_build(sh, &ops);
    totals t;
    memset(&t, 0, sizeof t);
    double T = (double)(sh->batch * sh->seq);
    if (print) {
        printf("%-30s %2s %7s %10s %9s %8s %-7s %5s %9s\n", "op", "ph", "calls", "GFLOP", "GB", "FLOP/B", "bound", "eff",
               "ms");
    }
    double by_phase[4] = {0};
    for (int i = 0; i < ops.n; i++) {
        const step_op *o = &ops.op[i];
        int cb;
        double s = op_time(o, &cb);
        t.step_s += s;
        by_phase[o->phase == 'F' ? 0 : o->phase == 'R' ? 1 : o->phase == 'B' ? 2 : 3] += s;
        // eff: of the resource that bounds the op (its peak compute rate, or HBM bandwidth).
        if (print)
            printf("%-30s %2c %7.0f %10.1f %9.2f %8.1f %-7s %4.0f%% %9.2f\n", o->name, o->phase, o->count, o->flops / 1e9,
                   o->bytes / 1e9, o->bytes > 0 ? o->flops / o->bytes : 0.0, cb ? "compute" : "memory",
                   100 * (cb ? op_eff(o) : EFF_MEM), s * 1e3);
    }
    t.hw_flops = step_hw_flops(&ops);
    t.model_flops = step_model_flops_per_token(&sh->cfg, sh->seq) * T;
    t.tokens_s = T / t.step_s;
    t.mfu = t.model_flops / t.step_s / PEAK_BF16;
    t.hfu = t.hw_flops / t.step_s / PEAK_BF16;
    if (print) {
        printf("%-30s %2s %7s %10.1f %9s %8s %-7s %5s %9.2f\n", "total", "", "", t.hw_flops / 1e9, "", "", "", "",
               t.step_s * 1e3);
        printf("by phase (ms): forward %.1f, recompute %.1f, backward %.1f, optimizer %.1f\n", by_phase[0] * 1e3,
               by_phase[1] * 1e3, by_phase[2] * 1e3, by_phase[3] * 1e3);
        printf("LoRA parameters: %.1f M\n", step_lora_params(&ops) / 1e6);
    }
    return t;
}

static void usage(FILE *f) {
    fprintf(f, "usage: moetrain_roofline [--model config.json] [--seq N]\n"
               "  --model  a Mixtral-family config.json (default: Mixtral-8x7B, configs/mixtral-8x7b.json's values)\n"
               "  --seq    sequence length of the detailed table (default 4096)\n");
}

int main(int argc, char **argv) {
    step_shape sh;
    memset(&sh, 0, sizeof sh);
    mt_plan_mixtral_8x7b(&sh.cfg);
    int64_t seqs[8];
    int n_seqs = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return usage(stdout), 0;
        if (!v) return usage(stderr), MT_EXIT_USAGE;
        if (!strcmp(argv[i], "--model")) {
            if (mt_model_config_load(v, &sh.cfg) != 0) return fprintf(stderr, "roofline: %s\n", mt_error_get()), MT_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--seq") && atoll(v) > 0 && n_seqs < 8) {
            seqs[n_seqs++] = atoll(v);
        } else {
            return fprintf(stderr, "roofline: bad flag or value: %s %s\n", argv[i], v), usage(stderr), MT_EXIT_USAGE;
        }
        i++;
    }
    if (!n_seqs) seqs[0] = 4096, n_seqs = 1;
    sh.batch = 1;
    sh.lora_r = 16;
    sh.targets = MT_TARGET_EXPERTS | MT_TARGET_GATE;  // case C (configs/case-c.yaml)
    sh.quant_experts = sh.quant_attn = 1;
    sh.quant = MT_QUANT_NF4, sh.blocksize = 64, sh.double_quant = 1;
    sh.recompute = 1;
    sh.dequants_per_use = 1;

    const mt_model_config *c = &sh.cfg;
    double N = step_matmul_params(c);
    printf("=== ROOFLINE PROJECTION (not a measurement) — one H100 SXM, QLoRA step ===\n");
    printf("model: hidden %lld, %lld layers, %lld experts top-%lld, ffn %lld, heads %lld/%lld x %lld, vocab %lld\n",
           (long long)c->hidden, (long long)c->layers, (long long)c->experts, (long long)c->top_k,
           (long long)c->intermediate, (long long)c->heads, (long long)c->kv_heads, (long long)c->head_dim,
           (long long)c->vocab);
    printf("case C (configs/case-c.yaml): NF4 double-quant (blocksize 64) frozen experts and q,k,v,o; LoRA r=16 on "
           "w1,w2,w3 (all experts) and the routers; bf16 activations; --checkpointing full; micro-batch 1; one GPU, no EP\n");
    printf("N (matmul params per token, input embedding excluded) = %.3f e9 (mt_config_active_params %.3f e9)\n",
           N / 1e9, (double)mt_config_active_params(c) / 1e9);
    printf("peaks (H100 SXM datasheet): bf16 dense %.0f TFLOP/s, fp32 %.0f TFLOP/s, HBM %.2f TB/s; ridge points "
           "%.0f FLOP/B (bf16 tensor), %.0f FLOP/B (fp32)\n", PEAK_BF16 / 1e12, PEAK_FP32 / 1e12, HBM_BW / 1e12,
           PEAK_BF16 / HBM_BW, PEAK_FP32 / HBM_BW);
    printf("efficiencies (see scripts/roofline.c for sources; 'assumed' = no measurement yet): GEMM %.2f x M/(M+%.0f) "
           "(assumed, from docs/design.md's ~800 TFLOP/s), memory-bound %.2f of HBM (assumed, docs/design.md ~3 TB/s), attention "
           "(WMMA tensor cores) %.2f forward, %.2f backward of the bf16 peak (assumed, below FA2's ~35%% on an H100 as "
           "the FA3 paper reports)\n",
           EFF_GEMM, GEMM_HALF_M, EFF_MEM, EFF_ATTN_FWD, EFF_ATTN_BWD);
    printf("dequant: q,k,v,o to bf16 at every use (forward, recompute, backward); the experts' 4-bit W inside "
           "their grouped GEMMs (model/grouped_cuda.cu), a tile per block: once per %d-row tile of an expert's rows "
           "and GEMM, 4 CUDA-core ops an element at %.0f%% of the fp32 peak, added to the step as if it overlapped "
           "nothing (an upper bound: it runs beside the tensor cores)\n",
           STEP_GROUPED_TILE_M, 100 * EFF_ALU);
    printf("phases: F forward, R recompute forward, B backward (dx and LoRA grads), O optimizer\n\n");

    sh.seq = seqs[0];
    printf("--- seq %lld (%lld tokens a step) ---\n", (long long)sh.seq, (long long)(sh.batch * sh.seq));
    totals t = project(&sh, 1);
    printf("PROJECTION seq %lld: step %.3f s, %.0f tokens/s, MFU %.1f%% ((4·N + 6·S·d_attn·L) = %.2f GFLOP/token), "
           "HFU %.1f%% (%.1f TFLOP hardware / step, all against the bf16 peak)\n\n", (long long)sh.seq, t.step_s,
           t.tokens_s, 100 * t.mfu, step_model_flops_per_token(c, sh.seq) / 1e9, 100 * t.hfu, t.hw_flops / 1e12);

    const int64_t cols[3] = {2048, 4096, 16384};
    printf("PROJECTION by sequence length (micro-batch 1; time only: whether it fits is `moetrain plan`'s question)\n");
    printf("%8s %10s %12s %8s %8s %16s %22s\n", "seq", "step s", "tokens/s", "MFU", "HFU", "attention share",
           "step s, dequant hidden");
    for (int i = 0; i < 3; i++) {
        step_shape x = sh;
        x.seq = cols[i];
        totals u = project(&x, 0);
        step_ops ops;
        step_build(&x, &ops);
        double att = 0, alu = 0;
        for (int j = 0; j < ops.n; j++) {
            int cb;
            if (ops.op[j].cls == STEP_ATTN) att += op_time(&ops.op[j], &cb);
            if (ops.op[j].cls == STEP_ALU) alu += op_time(&ops.op[j], &cb);
        }
        printf("%8lld %10.3f %12.0f %7.1f%% %7.1f%% %15.1f%% %22.3f\n", (long long)x.seq, u.step_s, u.tokens_s,
               100 * u.mfu, 100 * u.hfu, 100 * att / u.step_s, u.step_s - alu);
    }
    printf("(the last column: the grouped GEMMs' dequantization entirely under the tensor cores' time, the bound\n"
           " opposite to the step's, which adds it)\n");
    printf("roofline: PROJECTION, not measured; `make CUDA=1 bench-gpu` on an H100 measures the same step\n");
    return 0;
}
