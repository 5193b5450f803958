// scripts/bench_gpu.c — `make CUDA=1 bench-gpu`: the CUDA training step at Mixtral-8x7B's size
// (issue 6), on GPU 0, with random weights and tokens (nothing to download):
//   * the card's bf16 matmul peak, its device-to-device copy bandwidth, and the NF4 -> bf16
//     dequantize kernel's GB/s on an expert-sized weight against that copy bandwidth;
//   * how much of the experts' dequantization the second stream hides beside their GEMMs, with
//     the GEMMs on all SMs and on all but 8, 16, 32 (overlap_bench);
//   * case C of docs/memory.md "The reference cases" (LoRA r=16 on every expert and router, NF4 double-quant base,
//     batch 1, full recomputation) at --seq 2048 and 4096: step time, tokens/s, ledger peak per
//     category, the ledger's total peak against the driver's used memory, MFU and HFU;
//   * cases A (routers) and B (6 layers × 2 experts unfrozen, optimizer offloaded) at s=1024, or
//     at the first --seq given.
// MFU = (4·N + 6·S·d_attn·L) per token × tokens/s ÷ 989 TFLOP/s (H100 SXM dense bf16), as
// docs/design.md ("GPU performance conventions") defines it; HFU = the hardware FLOPs of the step (recompute,
// LoRA, attention as today's kernels run it, dequantization) over the same peak. Both from
// scripts/step_model.h, which the roofline projection (scripts/roofline.c) uses too.
// --layers N cuts the model to its first N layers (the GPU check's time budget): every figure is
// measured on that model; the step time at 32 layers is then scaled by the step model's hardware
// FLOPs (t_32 = t_N · F_32 / F_N: the embedding, lm_head and loss are assumed to run at the layers'
// efficiency) and labelled a projection, and the 32-layer memory is the planner's --measure.
// Each run's ledger peak is set beside the driver's peak and beside `plan --measure` of the same
// model and flags (the null backend's step), category by category.
// One `bench_gpu: case=...` line per run at the end, for scripts, and one JSON line per result in
// $MT_GPU_JSONL when set (scripts/json_line.h). Exit 0; 1 when a run failed or the experts' two
// streams computed another product than one stream; 2 without a usable GPU
// (or on a bad flag).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>  // the default pool, trimmed between runs (this program is CUDA-only)

#include "core/backend.h"
#include "core/common.h"
#include "core/fileio.h"
#include "core/profile.h"
#include "core/rng.h"
#include "model/config.h"
#include "model/attention_cudnn.h"
#include "model/grouped.h"
#include "model/mixtral.h"
#include "optim/optim.h"
#include "trainer/options.h"
#include "optim/params.h"
#include "plan/plan.h"
#include "quant/qweight.h"
#include "quant/quant.h"
#include "scripts/json_line.h"
#include "scripts/profile_table.h"
#include "scripts/step_model.h"
#include "scripts/step_time.h"

// H100 SXM dense bf16 tensor-core peak (NVIDIA datasheet): the MFU and HFU denominator.
#define PEAK_BF16_H100 989e12

enum { MAX_RUNS = 16 };

typedef struct {
    char which;
    int64_t seq;
    int ok;
    char error[512];
    double step_s, tokens_s, mfu, hfu;  // hfu < 0: not modelled for this case
    double ledger_gb, driver_gb;  // the ledger's total peak; the driver's used peak less the baseline
    double plan_gb;               // plan --measure's total peak for the same model and flags
    double run_gb;                // the ledger's peak less what the backend held before the run
    double step32_s, plan32_gb;   // --layers < 32: the step time scaled to 32 layers; the plan's peak there
    int attn_cudnn;               // the attention ran on cuDNN's SDPA (else the WMMA kernels)
} result;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

// What the driver says is used on the device (every context on it, not only ours).
static size_t used_bytes(mt_backend *be) {
    size_t free_b, total_b;
    if (mt_cuda_mem_info(be, &free_b, &total_b) != 0) mt_fatal(MT_EXIT_ERROR, "bench_gpu: %s", mt_error_get());
    return total_b - free_b;
}

// The backend's pool keeps freed memory for reuse (core/backend_cuda.cu); between runs it is
// handed back, so that each run's baseline and driver peak count only that run. Returns the
// bytes the pool gave back.
static double trim_pool(mt_backend *be) {
    size_t before = used_bytes(be);
    be->ops->synchronize(be);
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, 0) == cudaSuccess) {
        cudaError_t e = cudaMemPoolTrimTo(pool, 0);
        if (e != cudaSuccess) mt_fatal(MT_EXIT_ERROR, "bench_gpu: cudaMemPoolTrimTo: %s", cudaGetErrorString(e));
    } else {
        (void)cudaGetLastError();  // no pools on this device: nothing held
    }
    return ((double)before - (double)used_bytes(be)) / 1e9;
}

// Bytes the default pool holds freed for reuse (reserved less used); 0 without pools.
static double pool_held_bytes(void) {
    cudaMemPool_t pool;
    uint64_t reserved = 0, used = 0;
    if (cudaDeviceGetDefaultMemPool(&pool, 0) != cudaSuccess ||
        cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved) != cudaSuccess ||
        cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return reserved > used ? (double)(reserved - used) : 0.0;
}

// GB/s of a device-to-device copy of `bytes` (read + write counted): the card's copy bandwidth.
static double copy_bandwidth(mt_backend *be, size_t bytes) {
    enum { WARMUP = 2, TIMED = 10 };
    void *a, *b;
    if (mt_backend_alloc(be, MT_MEM_WORK, bytes, &a) != 0 || mt_backend_alloc(be, MT_MEM_WORK, bytes, &b) != 0)
        mt_fatal(MT_EXIT_OOM, "bench_gpu: copy bandwidth: %s", mt_error_get());
    be->ops->fill_zero(be, a, bytes);
    for (int i = 0; i < WARMUP; i++) be->ops->copy(be, b, a, bytes);
    be->ops->synchronize(be);
    double t0 = now_s();
    for (int i = 0; i < TIMED; i++) be->ops->copy(be, b, a, bytes);
    be->ops->synchronize(be);
    double t = now_s() - t0, gbs = 2.0 * (double)bytes * TIMED / t / 1e9;
    printf("copy bandwidth: %.0f MB device to device, %d timed: %.3f ms each, %.0f GB/s (read + write)\n", bytes / 1e6,
           TIMED, t / TIMED * 1e3, gbs);
    mt_backend_release(be, MT_MEM_WORK, bytes, b);
    mt_backend_release(be, MT_MEM_WORK, bytes, a);
    json_line("copy", "\"bytes\":%zu,\"ms\":%.4f,\"gbs\":%.1f", bytes, t / TIMED * 1e3, gbs);
    return gbs;
}

// GB/s of the NF4 (double quant, blocksize 64) -> bf16 dequantize kernel on one Mixtral w2-sized
// weight [hidden, ffn], bytes as mt_qweight_dequant_bytes counts them; against the copy bandwidth.
static double dequant_bandwidth(mt_backend *be, const mt_model_config *cfg, double copy_gbs) {
    enum { WARMUP = 2, TIMED = 10 };
    int64_t out = cfg->hidden, in = cfg->intermediate, n = out * in;
    float *w = mt_xmalloc((size_t)n * sizeof(float));
    mt_rng rng;
    mt_rng_seed(&rng, 3, 0);
    for (int64_t i = 0; i < n; i++) w[i] = 0.02f * mt_rng_normal(&rng);
    mt_qweight q;
    if (mt_qweight_quantize(&q, be, "bench.w2", w, out, in, MT_QUANT_NF4, 64, 1) != 0)
        mt_fatal(MT_EXIT_ERROR, "bench_gpu: dequant: %s", mt_error_get());
    free(w);
    mt_tensor *dst = mt_tensor_new(be, MT_MEM_WORK, MT_BF16, 1, &n);
    if (!dst) mt_fatal(MT_EXIT_OOM, "bench_gpu: dequant: %s", mt_error_get());
    // Each whole-weight kernel (quant/quant.h mt_dequant_cuda_kernel): 0 the default, 1 the
    // earlier one, until these figures say which to keep. Returns the default's.
    static const char *names[2] = {"8 elements an item, coalesced (default)", "32 contiguous a thread"};
    double bytes = (double)mt_qweight_dequant_bytes(&q, MT_BF16), gbs0 = 0;
    for (int k = 0; k < 2; k++) {
        mt_dequant_cuda_kernel(k);
        for (int i = 0; i < WARMUP; i++)
            if (mt_qweight_dequantize(&q, dst) != 0) mt_fatal(MT_EXIT_ERROR, "bench_gpu: dequant: %s", mt_error_get());
        be->ops->synchronize(be);
        double t0 = now_s();
        for (int i = 0; i < TIMED; i++) mt_qweight_dequantize(&q, dst);
        be->ops->synchronize(be);
        double t = now_s() - t0, gbs = bytes * TIMED / t / 1e9;
        if (k == 0) gbs0 = gbs;
        printf("dequant NF4 -> bf16, kernel %d (%s): [%lld, %lld] double quant, %.1f MB moved (codes %.1f MB + block "
               "constants + bf16 %.1f MB), %d timed: %.3f ms each, %.0f GB/s = %.0f%% of the copy bandwidth\n", k,
               names[k], (long long)out, (long long)in, bytes / 1e6, (double)((n + 1) / 2) / 1e6, 2.0 * (double)n / 1e6,
               TIMED, t / TIMED * 1e3, gbs, 100 * gbs / copy_gbs);
        json_line("dequant_nf4", "\"kernel\":%d,\"out\":%lld,\"in\":%lld,\"bytes\":%.0f,\"ms\":%.4f,\"gbs\":%.1f,"
                  "\"of_copy\":%.3f", k, (long long)out, (long long)in, bytes, t / TIMED * 1e3, gbs, gbs / copy_gbs);
    }
    mt_dequant_cuda_kernel(0);
    mt_tensor_free(dst);
    mt_qweight_free(&q);
    return gbs0;
}

// The experts' base GEMMs beside their dequantization, as model/grouped_cuda.cu runs them: one
// layer's w1‖w3 forward over E experts of `rows` rows each (Mixtral: 8 x 1024 at seq 4096), each
// expert's 4-bit W dequantized into a slot on the side stream while the previous expert's GEMM
// runs on the main one. Timed: the dequantizations alone, the GEMMs alone (on W dequantized before),
// the grouped call as the step makes it, and that call with the GEMMs planned for fewer SMs
// (mt_cuda_gemm_sm_reserve: the rest left to the dequantization beside them). "Hidden" is the
// share of the dequantization's own time that the overlap saves: (deq + gemm - grouped) / deq.
// Expert e's W is matrix e % 3 of three: where a slot holds one expert (Mixtral's size, what
// the GPU check runs) it always held another matrix before its refill, so a GEMM that read it
// early shows in the product check. (Small experts share a slot; there a refill may bring the
// same matrices back to the same places, and the check sees less.)
// MT_GEMM_SM_RESERVE (core/backend.h) set: the figures are at that reserve, no sweep, and it
// stays in force for the step runs after.
enum { OV_DEQ, OV_GEMM, OV_GROUPED, OV_MATS = 3 };
typedef struct {
    mt_backend *be;
    const mt_qweight *q;     // [OV_MATS]
    mt_tensor *a, *c, *w;    // w: the OV_MATS matrices dequantized, [OV_MATS][2f, d]
    mt_grouped g;
    int64_t rows;
} overlap_ctx;

static void overlap_once(const overlap_ctx *x, int what) {
    const int64_t f = x->q->out;
    for (int e = 0; what != OV_GROUPED && e < x->g.experts; e++) {
        const int i = e % OV_MATS;
        mt_tensor w = mt_view_rows(x->w, i * 2 * f, 2 * f);
        if (what == OV_DEQ) {  // w1 and w3 of expert e: its matrix twice, stacked
            for (int h = 0; h < 2; h++) {
                mt_tensor half = mt_view_rows(&w, h * f, f);
                if (mt_qweight_dequantize(&x->q[i], &half) != 0)
                    mt_fatal(MT_EXIT_ERROR, "bench_gpu: overlap: %s", mt_error_get());
            }
        } else {
            mt_tensor ae = mt_view_rows(x->a, e * x->rows, x->rows), ce = mt_view_rows(x->c, e * x->rows, x->rows);
            if (mt_matmul(&ce, &ae, &w, 0, 1, 1.0f, 0.0f) != 0)
                mt_fatal(MT_EXIT_ERROR, "bench_gpu: overlap: %s", mt_error_get());
        }
    }
    if (what == OV_GROUPED && mt_grouped_gemm(x->c, x->a, &x->g) != 0)
        mt_fatal(MT_EXIT_ERROR, "bench_gpu: overlap: %s", mt_error_get());
}

static double overlap_ms(const overlap_ctx *x, int what) {
    enum { WARMUP = 1, TIMED = 3 };
    for (int i = 0; i < WARMUP; i++) overlap_once(x, what);
    x->be->ops->synchronize(x->be);
    double t0 = now_s();
    for (int i = 0; i < TIMED; i++) overlap_once(x, what);
    x->be->ops->synchronize(x->be);
    return (now_s() - t0) / TIMED * 1e3;
}

static int overlap_bench(mt_backend *be, const mt_model_config *cfg, int small) {
    enum { MAX_E = 8 };
    static const int reserves[] = {8, 16, 32};
    const int reserve0 = mt_cuda_gemm_sm_reserved(be);  // MT_GEMM_SM_RESERVE's, if set
    const int E = (int)MT_MIN(cfg->experts, MAX_E);
    const int64_t d = cfg->hidden, f = cfg->intermediate, rows = small ? 64 : 1024, R = rows * E;
    float *host = mt_xmalloc((size_t)(f * d) * sizeof(float));
    mt_rng rng;
    mt_rng_seed(&rng, 5, 0);
    mt_qweight q[OV_MATS];
    for (int m = 0; m < OV_MATS; m++) {
        for (int64_t i = 0; i < f * d; i++) host[i] = 0.02f * mt_rng_normal(&rng);
        if (mt_qweight_quantize(&q[m], be, "bench.w1", host, f, d, MT_QUANT_NF4, 64, 1) != 0)
            mt_fatal(MT_EXIT_ERROR, "bench_gpu: overlap: %s", mt_error_get());
    }
    free(host);
    int64_t sa[2] = {R, d}, sc[2] = {R, 2 * f}, sw[2] = {OV_MATS * 2 * f, d};
    overlap_ctx x = {.be = be, .q = q, .rows = rows};
    x.a = mt_tensor_new(be, MT_MEM_WORK, MT_BF16, 2, sa), x.c = mt_tensor_new(be, MT_MEM_WORK, MT_BF16, 2, sc);
    x.w = mt_tensor_new(be, MT_MEM_WORK, MT_BF16, 2, sw);
    if (!x.a || !x.c || !x.w) mt_fatal(MT_EXIT_OOM, "bench_gpu: overlap: %s", mt_error_get());
    uint16_t *ha = mt_xmalloc((size_t)(R * d) * sizeof *ha);
    for (int64_t i = 0; i < R * d; i++) ha[i] = mt_f32_to_bf16(mt_rng_normal(&rng));
    mt_tensor_upload(x.a, ha);
    free(ha);
    int64_t off[MAX_E + 1];
    const mt_qweight *qs[MAX_E];
    for (int e = 0; e <= E; e++) off[e] = e * rows;
    for (int e = 0; e < E; e++) qs[e] = &q[e % OV_MATS];
    x.g = (mt_grouped){.experts = E, .off = off, .q = qs, .q2 = qs, .trans = 1, .alpha = 1.0f, .beta = 0.0f};
    overlap_once(&x, OV_DEQ);  // W for the GEMMs alone
    // The two streams' product against the one stream's: equal bit for bit where both run the
    // same cuBLASLt plan (Mixtral's experts: a slot each), within bf16's rounding where the slot
    // holds several experts for cuBLAS's grouped call; a GEMM that read a slot before its refill
    // got another matrix's values (relative error ~1).
    float *c1 = mt_xmalloc((size_t)(R * 2 * f) * sizeof(float)), *c2 = mt_xmalloc((size_t)(R * 2 * f) * sizeof(float));
    overlap_once(&x, OV_GEMM);
    mt_tensor_download_f32(x.c, c1);
    be->ops->fill_zero(be, x.c->data, x.c->nbytes);
    overlap_once(&x, OV_GROUPED);
    mt_tensor_download_f32(x.c, c2);
    double num = 0, den = 0;
    int64_t unequal = 0;
    for (int64_t i = 0; i < R * 2 * f; i++) {
        double dd = (double)c1[i] - (double)c2[i];
        num += dd * dd, den += (double)c1[i] * c1[i], unequal += c1[i] != c2[i];
    }
    const double rel = sqrt(num / (den > 0 ? den : 1));
    const int same = rel <= 1e-2 && isfinite(rel);
    free(c1), free(c2);
    double deq = overlap_ms(&x, OV_DEQ), gemm = overlap_ms(&x, OV_GEMM), grouped = overlap_ms(&x, OV_GROUPED);
    printf("experts beside their dequantization (GEMMs on all SMs but %d): %d experts x %lld rows, w1||w3 [%lld, %lld] NF4: dequant alone "
           "%.3f ms, GEMMs alone %.3f ms (%.0f TFLOP/s), grouped (two streams) %.3f ms: %.0f%% of the dequant hidden; "
           "its product against the one stream's: %lld elements differ, rel. L2 %.2g%s\n", reserve0, E, (long long)rows,
           (long long)(2 * f), (long long)d, deq, gemm, 2.0 * R * 2 * f * d / gemm / 1e9, grouped,
           100 * (deq + gemm - grouped) / deq, (long long)unequal, rel,
           same ? "" : " -- DIFFERENT (a GEMM read its slot before the refill?)");
    json_line("overlap", "\"experts\":%d,\"rows\":%lld,\"reserve\":%d,\"deq_ms\":%.4f,\"gemm_ms\":%.4f,"
              "\"grouped_ms\":%.4f,\"hidden\":%.3f,\"unequal\":%lld,\"rel_l2\":%.3g,\"ok\":%s", E, (long long)rows,
              reserve0, deq, gemm, grouped, (deq + gemm - grouped) / deq, (long long)unequal, rel, same ? "true" : "false");
    for (size_t i = 0; !reserve0 && i < MT_ARRAY_LEN(reserves); i++) {
        if (mt_cuda_gemm_sm_reserve(be, reserves[i]) != 0) {
            printf("  GEMMs on fewer SMs: %s\n", mt_error_get());
            break;
        }
        double gm = overlap_ms(&x, OV_GEMM), gr = overlap_ms(&x, OV_GROUPED);
        printf("  GEMMs planned for all SMs but %d: GEMMs alone %.3f ms (%+.1f%%), grouped %.3f ms (%+.1f%% against all "
               "SMs)\n", reserves[i], gm, 100 * (gm / gemm - 1), gr, 100 * (gr / grouped - 1));
        json_line("overlap", "\"experts\":%d,\"rows\":%lld,\"reserve\":%d,\"deq_ms\":%.4f,\"gemm_ms\":%.4f,"
                  "\"grouped_ms\":%.4f,\"hidden\":%.3f", E, (long long)rows, reserves[i], deq, gm, gr,
                  (deq + gm - gr) / deq);
    }
    if (mt_cuda_gemm_sm_reserve(be, reserve0) != 0) mt_fatal(MT_EXIT_ERROR, "bench_gpu: overlap: %s", mt_error_get());
    mt_tensor_free(x.a), mt_tensor_free(x.c), mt_tensor_free(x.w);
    for (int m = 0; m < OV_MATS; m++) mt_qweight_free(&q[m]);
    return same ? 0 : -1;
}

// TFLOP/s of c [n, n] f32 = a [n, n] · bᵀ with a, b in `dt` (nn.Linear's layout, as the model's).
static double matmul_peak(mt_backend *be, mt_dtype dt, int64_t n) {
    enum { WARMUP = 3, TIMED = 20 };
    int64_t shape[2] = {n, n};
    mt_tensor *a = mt_tensor_new(be, MT_MEM_WORK, dt, 2, shape), *b = mt_tensor_new(be, MT_MEM_WORK, dt, 2, shape);
    mt_tensor *c = mt_tensor_new(be, MT_MEM_WORK, MT_F32, 2, shape);
    if (!a || !b || !c) mt_fatal(MT_EXIT_OOM, "bench_gpu: matmul peak: %s", mt_error_get());
    // Random values: tensor-core throughput is the same for any finite data, but uninitialised
    // memory may hold NaN or subnormal patterns that some kernels treat slowly.
    void *host = mt_xmalloc(a->nbytes);
    mt_rng rng;
    mt_rng_seed(&rng, 1, 0);
    for (int64_t i = 0; i < n * n; i++) {
        float x = mt_rng_normal(&rng);
        if (dt == MT_F32) ((float *)host)[i] = x;
        else ((uint16_t *)host)[i] = mt_f32_to_bf16(x);
    }
    mt_tensor_upload(a, host), mt_tensor_upload(b, host);
    free(host);
    for (int i = 0; i < WARMUP; i++)
        if (mt_matmul(c, a, b, 0, 1, 1.0f, 0.0f) != 0) mt_fatal(MT_EXIT_ERROR, "bench_gpu: matmul peak: %s", mt_error_get());
    be->ops->synchronize(be);
    double t0 = now_s();
    for (int i = 0; i < TIMED; i++) mt_matmul(c, a, b, 0, 1, 1.0f, 0.0f);  // the warm-ups checked this call
    be->ops->synchronize(be);
    double t = now_s() - t0, tflops = 2.0 * (double)n * n * n * TIMED / t / 1e12;
    printf("%s matmul peak: %lld x %lld x %lld, %s·%s -> f32, %d timed after %d warm-ups: %.3f ms each, %.1f TFLOP/s\n",
           mt_dtype_name(dt), (long long)n, (long long)n, (long long)n, mt_dtype_name(dt), mt_dtype_name(dt), TIMED,
           WARMUP, t / TIMED * 1e3, tflops);
    mt_tensor_free(a), mt_tensor_free(b), mt_tensor_free(c);
    json_line("matmul", "\"dtype\":\"%s\",\"n\":%lld,\"ms\":%.4f,\"tflops\":%.2f", mt_dtype_name(dt), (long long)n,
              t / TIMED * 1e3, tflops);
    return tflops;
}

// One training step as trainer/train.c runs it on one rank: forward, backward, AdamW, then
// wait for the device so that the step's time is all of it. The loss goes to *loss.
static int train_step(mt_model *m, mt_adamw *opt, const mt_param *p, int n, const mt_batch *b,
                      const mt_run_opts *o, int64_t step, double *loss) {
    mt_loss l;
    double gnorm;
    mt_model_zero_grad(m);
    mt_model_set_dropout_seed(m, o->seed, step, 0);
    if (mt_model_forward_train(m, b, &l) != 0) return -1;
    mt_model_backward(m);
    int rc = mt_adamw_step(opt, p, n, o->lr, o->clip, &gnorm);
    if (rc < 0) return -1;
    m->be->ops->synchronize(m->be);
    if (rc == 1) mt_warn("bench_gpu: step %lld skipped: gradient norm %g", (long long)step, gnorm);
    *loss = l.loss;
    return 0;
}

// The warm-up step, then `steps` timed ones; the figures into *r and printed. The driver is
// sampled during the warm-up only: each sample is a cudaMemGetInfo in the step's path.
// The step model of this run (scripts/step_model.h), for HFU: LoRA mode only (the model counts a
// frozen base with adapters); 0 otherwise.
static int step_shape_of(const mt_run_opts *o, const mt_model_config *cfg, step_shape *sh) {
    if (o->mode != MT_MODE_LORA) return 0;
    memset(sh, 0, sizeof *sh);
    sh->cfg = *cfg;
    sh->batch = o->batch, sh->seq = o->seq;
    sh->lora_r = o->lora_r;
    sh->targets = o->targets;
    sh->quant = o->quant;
    sh->quant_experts = o->quant != MT_QUANT_NONE && (o->quant_targets & MT_QTARGET_EXPERTS);
    sh->quant_attn = o->quant != MT_QUANT_NONE && (o->quant_targets & MT_QTARGET_ATTN);
    sh->dequant_cache = o->dequant_cache == MT_DEQUANT_CACHE_ON;
    sh->expert_cache = MT_MAX(o->expert_cache, 0);
    sh->blocksize = o->quant_blocksize, sh->double_quant = o->double_quant;
    // --recompute's parts; unresolved auto builds full (trainer/options.c mt_run_opts_model_spec)
    sh->recompute = o->checkpointing == MT_CKPT_FULL || o->checkpointing == MT_CKPT_AUTO;
    sh->recompute_attn = mt_ckpt_attention(o->checkpointing), sh->recompute_mlp = mt_ckpt_mlp(o->checkpointing);
    sh->dequants_per_use = 1;
    // attention: cuDNN's SDPA where it loads and takes the shape (the bench's batches are unpadded)
    sh->attn_cudnn =
        !strcmp(attention_path(0, 0, (int)cfg->heads, (int)cfg->kv_heads, (int)cfg->head_dim, (int)cfg->head_dim), "cudnn");
    sh->lora_dropout = o->lora_dropout;
    return 1;
}

// MT_PROFILE=1: one more step, profiled (the timed ones stay unprofiled): the per-op table, the
// same rows beside the step model's projection, and the table as JSON in $MT_PROFILE_DIR when set.
static int profile_step(mt_model *m, mt_adamw *opt, const mt_param *params, int n, const mt_batch *b,
                        const mt_run_opts *o, int64_t step) {
    char title[96];
    double loss;
    snprintf(title, sizeof title, "case %c, seq %lld, %lld layers", o->plan_case, (long long)b->S,
             (long long)m->cfg.layers);
    mt_prof_reset();
    if (mt_prof_step_begin(m->be) != 0 || train_step(m, opt, params, n, b, o, step, &loss) != 0) return -1;
    mt_prof_step_end(m->be);
    mt_prof_print(stdout, title);
    step_shape sh;
    step_ops ops;
    if (step_shape_of(o, &m->cfg, &sh)) {
        step_build(&sh, &ops);
        profile_table_print(stdout, mt_prof_table_get(), &ops);
    }
    // The table as JSON: in $MT_PROFILE_DIR when set, and as one line of $MT_GPU_JSONL (the GPU
    // check's one results file).
    const char *dir = getenv("MT_PROFILE_DIR");
    char path[4200];
    if (dir && *dir) snprintf(path, sizeof path, "%s/profile-%c-%lld.json", dir, o->plan_case, (long long)b->S);
    else snprintf(path, sizeof path, "/tmp/moetrain-profile-%d.json", (int)getpid());
    if (mt_prof_write_json(path, title) != 0) {
        mt_warn("bench_gpu: %s", mt_error_get());
        return 0;
    }
    char *text;
    size_t len;
    if (mt_read_file(path, 16u << 20, &text, &len) == 0) {
        for (size_t i = 0; i < len; i++)
            if (text[i] == '\n') text[i] = ' ';
        while (len && text[len - 1] == ' ') text[--len] = 0;
        json_line("profile", "\"case\":\"%c\",\"seq\":%lld,\"layers\":%lld,\"table\":%s", o->plan_case,
                  (long long)b->S, (long long)m->cfg.layers, text);
        free(text);
    }
    if (!(dir && *dir)) remove(path);
    return 0;
}

static int measure(mt_model *m, mt_adamw *opt, const mt_param *params, int n, const mt_batch *b,
                   const mt_run_opts *o, int steps, double peak_tflops, size_t baseline, result *r) {
    mt_backend *be = m->be;
    double loss = 0, sum = 0, lo = INFINITY, hi = 0, t0 = now_s();
    size_t driver_peak = 0;
    if (mt_cuda_mem_peak_start(be) != 0) return -1;
    int rc = train_step(m, opt, params, n, b, o, 0, &loss);
    if (mt_cuda_mem_peak_stop(be, &driver_peak) != 0 || rc != 0) return -1;
    // Driver memory the ledger does not hold, grown since the baseline: kernels loaded at their
    // first launch, library caches, or an allocation that bypasses the ledger; what the pool
    // keeps freed for the next step is not part of it (and is printed beside it).
    double held = pool_held_bytes();
    double extra = ((double)used_bytes(be) - (double)be->ledger.total_cur - (double)baseline - held) / 1e9;
    printf("warm-up step: %.2f s, loss %.4f; driver memory outside the ledger grew %+.3f GB (the pool keeps %.3f GB "
           "freed for reuse besides)\n", now_s() - t0, loss, extra, held / 1e9);
    for (int s = 1; s <= steps; s++) {
        t0 = now_s();
        if (train_step(m, opt, params, n, b, o, s, &loss) != 0) return -1;
        double dt = now_s() - t0;
        sum += dt, lo = fmin(lo, dt), hi = fmax(hi, dt);
        printf("step %d: %.3f s, loss %.4f\n", s, dt, loss);
    }
    if (mt_prof_enabled() && profile_step(m, opt, params, n, b, o, steps + 1) != 0) return -1;
    int64_t T = (int64_t)b->B * b->S;
    double per_token = step_model_flops_per_token(&m->cfg, b->S);
    r->step_s = sum / steps;
    r->tokens_s = (double)T / r->step_s;
    r->mfu = per_token * (double)T / r->step_s / PEAK_BF16_H100;
    step_shape sh;
    step_ops ops;
    double hw = -1;
    if (step_shape_of(o, &m->cfg, &sh)) {
        step_build(&sh, &ops);
        hw = step_hw_flops(&ops);
    }
    r->hfu = hw < 0 ? -1 : hw / r->step_s / PEAK_BF16_H100;
    r->ledger_gb = be->ledger.total_peak / 1e9;
    r->driver_gb = ((double)driver_peak - (double)baseline) / 1e9;
    printf("step: %.3f s mean of %d (%.3f .. %.3f), %.1f tokens/s\n", r->step_s, steps, lo, hi, r->tokens_s);
    printf("ledger peak by category (GB):");
    for (int c = 0; c < MT_MEM_COUNT; c++) printf(" %s %.3f", mt_mem_cat_name((mt_mem_cat)c), be->ledger.peak[c] / 1e9);
    printf("\nledger total peak %.3f GB; driver used peak %.3f GB less the baseline %.3f GB = %.3f GB (%+.2f%% of "
           "the ledger's)\n", r->ledger_gb, driver_peak / 1e9, baseline / 1e9, r->driver_gb,
           (r->driver_gb / r->ledger_gb - 1) * 100);
    printf("MFU %.2f%% = (4 × %.4g N + 6 × %lld S × %lld d_attn × %lld layers = %.4g FLOP/token) × %.1f tokens/s / "
           "989 TFLOP/s (H100 SXM bf16 dense; N = active params less the input embedding; 4 = 2 forward + 2 backward dx, "
           "frozen base; no credit for the recompute or LoRA); against this run's measured bf16 matmul peak %.1f "
           "TFLOP/s: %.2f%%\n", r->mfu * 100, step_matmul_params(&m->cfg), (long long)b->S,
           (long long)(m->cfg.heads * m->cfg.head_dim), (long long)m->cfg.layers, per_token, r->tokens_s, peak_tflops,
           r->mfu * PEAK_BF16_H100 / (peak_tflops * 1e12) * 100);
    if (r->hfu >= 0)
        printf("HFU %.2f%% = %.4g hardware FLOP/step / %.3f s / 989 TFLOP/s (forward + recompute forward + backward dx, "
               "LoRA's GEMMs, attention as today's kernels run it: 2 + 2 + 7 units of S·d_attn per token and layer, "
               "one FLOP per dequantized element per use, elementwise ops; scripts/step_model.h)\n",
               r->hfu * 100, hw, r->step_s);
    else
        printf("HFU: not modelled for mode %s (scripts/step_model.h counts a frozen base with LoRA)\n", mt_mode_name(o->mode));
    return 0;
}

// --dequant-cache: the case's off, or on (attention's 4-bit weights kept in bf16); --expert-cache:
// the case's off, or all (every layer's experts kept in bf16).
static const char *dequant_cache = "off", *expert_cache = "off";

static int set_opts(mt_run_opts *o, const mt_model_config *cfg, char which, int64_t seq) {
    char s[32];
    snprintf(s, sizeof s, "%lld", (long long)seq);
    mt_run_opts_default(o);
    if (mt_plan_case_apply(o, which) != 0 || mt_run_opts_set(o, "seq", s) != 0 || mt_run_opts_set(o, "device", "cuda") != 0 ||
        mt_run_opts_set(o, "dequant-cache", dequant_cache) != 0 || mt_run_opts_set(o, "expert-cache", expert_cache) != 0)
        return -1;
    if (o->expert_cache == MT_EXPERT_CACHE_ALL)  // as the trainer resolves it: only frozen experts are kept
        o->expert_cache = o->mode == MT_MODE_LORA || o->mode == MT_MODE_ROUTER ? (int)mt_config_moe_layers(cfg) : 0;
    // Case B's states (2.1 B params × 16 B) do not fit a 44 GB card beside the base: Adam m, v
    // and the masters go to host memory, one of the fixes `moetrain plan --case B` names.
    if (which == 'B' && mt_run_opts_set(o, "offload-optimizer", "true") != 0) return -1;
    return 0;
}

// plan --measure for the run's model and flags (the null backend's step): its peaks beside the
// ledger's of the run just measured, category by category, less what the backend held before the
// run (`held`: its cuBLASLt workspace, which the null backend has not); then, for a cut model, the step time
// and the measured plan at the full layer count. Figures into *r (0 where not known).
static void compare_plan(mt_backend *be, const mt_ledger *held, const mt_model_config *cfg, int64_t full_layers,
                         const mt_run_opts *o, result *r) {
    mt_plan_opts po = mt_run_opts_plan(o);
    mt_plan_measurement pm;
    if (mt_plan_measure(cfg, NULL, &po, MT_MODEL_SPEC_OF(o), &pm) != 0) {
        printf("plan --measure: not comparable: %s\n", mt_error_get());
    } else {
        r->plan_gb = pm.total_peak / 1e9;
        double run_gb = r->run_gb = (double)(be->ledger.total_peak - held->total_cur) / 1e9;
        printf("the run's peak by category, GB (cuda ledger less the backend's own / plan --measure):");
        for (int c = 0; c < MT_MEM_COUNT; c++)
            printf(" %s %.3f/%.3f", mt_mem_cat_name((mt_mem_cat)c), (double)(be->ledger.peak[c] - held->cur[c]) / 1e9,
                   pm.peak[c] / 1e9);
        printf("\nthe run's total: cuda ledger %.3f GB, plan --measure %.3f GB (%+.2f%%); driver %.3f GB\n", run_gb,
               r->plan_gb, (run_gb / r->plan_gb - 1) * 100, r->driver_gb);
    }
    if (cfg->layers >= full_layers) return;
    mt_model_config full = *cfg;
    full.layers = full_layers;
    step_shape sh_cut, sh_full;
    step_ops ops_cut, ops_full;
    double ratio;
    const char *by;
    if (step_shape_of(o, cfg, &sh_cut) && step_shape_of(o, &full, &sh_full)) {
        step_build(&sh_cut, &ops_cut), step_build(&sh_full, &ops_full);
        ratio = step_hw_flops(&ops_full) / step_hw_flops(&ops_cut), by = "hardware FLOPs";
    } else {
        ratio = step_model_flops_per_token(&full, o->seq) / step_model_flops_per_token(cfg, o->seq), by = "model FLOPs";
    }
    r->step32_s = r->step_s * ratio;
    printf("PROJECTION at %lld layers: step %.3f s = %.3f s x %.3f (the step model's %s, %lld / %lld layers), "
           "%.1f tokens/s\n", (long long)full_layers, r->step32_s, r->step_s, ratio, by, (long long)full_layers,
           (long long)cfg->layers, (double)(o->batch * o->seq) / r->step32_s);
    if (mt_plan_measure(&full, NULL, &po, MT_MODEL_SPEC_OF(o), &pm) == 0) {
        r->plan32_gb = pm.total_peak / 1e9;
        printf("plan --measure at %lld layers: %.3f GB\n", (long long)full_layers, r->plan32_gb);
    }
}

// Builds the case's model once, then for each sequence length runs 1 warm-up and `steps` timed
// steps, prints the figures into rs[i] and frees the model.
static int run_case(mt_backend *be, const mt_model_config *cfg, int64_t full_layers, char which, const int64_t *seqs,
                    int n_seqs, int steps, double peak_tflops, result *rs) {
    mt_run_opts o;
    if (set_opts(&o, cfg, which, seqs[0]) != 0) return -1;
    printf("\n--- case %c, batch %lld, --checkpointing full, %s%s, %lld of %lld layers\n", which, (long long)o.batch,
           mt_mode_name(o.mode), o.offload_optimizer ? ", --offload-optimizer (to fit one card)" : "",
           (long long)cfg->layers, (long long)full_layers);
    // The driver's used memory that is not the ledger's (context, cuBLASLt, kernels loaded so far):
    // taken off the driver's peak so that the two count the same bytes. The pool's kept memory
    // is handed back first: it would count in the baseline and then serve this run unseen.
    trim_pool(be);
    size_t baseline = used_bytes(be) - (size_t)be->ledger.total_cur;
    const mt_ledger held = be->ledger;  // the backend's own (workspace), before the run
    double t0 = now_s();
    mt_model m;
    if (mt_model_build(&m, be, cfg, NULL, MT_MODEL_SPEC_OF(&o)) != 0) return mt_error_prefix("build"), -1;
    be->ops->synchronize(be);
    mt_param *params;
    int n = mt_model_params(&m, &params);
    mt_adamw opt;
    mt_adamw_opts aopts = mt_adamw_opts_default();
    aopts.lr = o.lr, aopts.weight_decay = o.weight_decay;
    aopts.adam_8bit = o.adam_8bit, aopts.master_weights = o.master_weights, aopts.offload = o.offload_optimizer;
    if (mt_adamw_init(&opt, be, params, n, &aopts) != 0) {
        mt_error_prefix("AdamW");
        mt_params_free(params, n), mt_model_free(&m);
        return -1;
    }
    printf("built in %.1f s: %llu trainable params in %d tensors\n", now_s() - t0,
           (unsigned long long)mt_params_count(params, n), n);
    if (o.offload_optimizer)
        printf("optimizer state in host memory: %.3f GB\n", mt_adamw_host_bytes(&opt) / 1e9);

    int failed = 0;
    for (int i = 0; i < n_seqs; i++) {
        result *r = &rs[i];
        if (set_opts(&o, cfg, which, seqs[i]) != 0) return -1;  // the same model; seq is the step's shape
        printf("\n--- case %c, seq %lld\n", which, (long long)o.seq);
        size_t T = (size_t)(o.batch * o.seq);
        int32_t *tokens = mt_xmalloc(T * sizeof(int32_t));
        mt_rng rng;
        mt_rng_seed(&rng, o.seed, 7);
        for (size_t t = 0; t < T; t++) tokens[t] = (int32_t)(mt_rng_next(&rng) % (uint64_t)cfg->vocab);
        mt_batch b = {(int)o.batch, (int)o.seq, tokens, tokens, NULL};  // the model shifts labels by one
        if (i) trim_pool(be);  // the last length's activations, kept by the pool, are not this one's
        mt_ledger_reset_peak(&be->ledger);
        r->ok = measure(&m, &opt, params, n, &b, &o, steps, peak_tflops, baseline, r) == 0;
        if (r->ok) compare_plan(be, &held, cfg, full_layers, &o, r);
        else snprintf(r->error, sizeof r->error, "%s", mt_error_get()), failed++;
        free(tokens);
        if (r->ok)
            json_line("step", "\"case\":\"%c\",\"seq\":%lld,\"layers\":%lld,\"step_s\":%.4f,\"tokens_per_s\":%.1f,"
                      "\"mfu\":%.4f,\"hfu\":%.4f,\"ledger_gb\":%.3f,\"ledger_run_gb\":%.3f,\"driver_gb\":%.3f,"
                      "\"plan_measure_gb\":%.3f,\"step32_s_projected\":%.3f,\"plan32_gb\":%.3f", which,
                      (long long)o.seq, (long long)cfg->layers, r->step_s, r->tokens_s, r->mfu, r->hfu, r->ledger_gb,
                      r->run_gb, r->driver_gb, r->plan_gb, r->step32_s, r->plan32_gb);
        else
            json_line("step", "\"case\":\"%c\",\"seq\":%lld,\"layers\":%lld,\"ok\":false", which, (long long)o.seq,
                      (long long)cfg->layers);
    }
    mt_adamw_free(&opt);
    mt_params_free(params, n);
    mt_model_free(&m);
    // Everything of the run is freed: the pool keeps it for reuse until trimmed; what the driver
    // still holds beyond the baseline after the trim is a leak or memory a library keeps (it
    // becomes part of the next run's baseline).
    double kept = trim_pool(be);
    printf("after free: ledger %.3f GB held; the pool had kept %.3f GB for reuse; after trimming it, driver %+.3f GB "
           "against the baseline\n", be->ledger.total_cur / 1e9, kept,
           ((double)used_bytes(be) - (double)be->ledger.total_cur - (double)baseline) / 1e9);
    return failed ? -1 : 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: moetrain_bench_gpu [--case A|B|C]... [--seq N]... [--steps N] [--layers N] [--dequant-cache on|off]\n"
               "                          [--expert-cache all|off]\n"
               "  --case   which of docs/memory.md's cases to run (repeatable; default C, A, B)\n"
               "  --seq    case C's sequence length (repeatable; default 2048 and 4096); A and B run\n"
               "           the first --seq given, or 1024\n"
               "  --steps  timed steps after the warm-up (default 3)\n"
               "  --layers the model cut to its first N layers (default all 32); 32-layer figures projected\n"
               "  --config another model's config.json instead of Mixtral-8x7B (the emulator's rehearsal)\n"
               "  --small  small peak-matmul and copy sizes (256, 16 MB): for the emulator, not for figures\n"
               "  --no-overlap  skip the experts-beside-their-dequantization figures (host time: three\n"
               "           expert-sized weights quantized)\n"
               "  --dequant-cache on|off  attention's 4-bit weights kept in bf16 from the load (default off,\n"
               "           the cases' setting)\n"
               "  --expert-cache all|off  every layer's experts kept in bf16, dequantized when the model is built (default\n"
               "           off, the cases' setting)\n");
}

int main(int argc, char **argv) {
    char cases[8] = {0};
    int64_t seqs[8];
    int n_cases = 0, n_seqs = 0, steps = 3;
    int64_t layers = 0;
    const char *config = NULL;
    int small = 0, overlap = 1;
    setvbuf(stdout, NULL, _IOLBF, 0);  // progress shows through a pipe (gpu_check.sh tees it)
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return usage(stdout), 0;
        if (!strcmp(argv[i], "--small")) {
            small = 1;
            continue;
        }
        if (!strcmp(argv[i], "--no-overlap")) {
            overlap = 0;
            continue;
        }
        if (!v) return usage(stderr), MT_EXIT_USAGE;
        if (!strcmp(argv[i], "--case") && strlen(v) == 1 && strchr("ABC", v[0]) && n_cases < 3)
            cases[n_cases++] = v[0];
        else if (!strcmp(argv[i], "--seq") && atoll(v) > 0 && n_seqs < 8)
            seqs[n_seqs++] = atoll(v);
        else if (!strcmp(argv[i], "--steps") && atoi(v) > 0)
            steps = atoi(v);
        else if (!strcmp(argv[i], "--layers") && atoll(v) > 0)
            layers = atoll(v);
        else if (!strcmp(argv[i], "--config"))
            config = v;
        else if (!strcmp(argv[i], "--dequant-cache") && (!strcmp(v, "on") || !strcmp(v, "off")))
            dequant_cache = v;
        else if (!strcmp(argv[i], "--expert-cache") && (!strcmp(v, "all") || !strcmp(v, "off")))
            expert_cache = v;
        else
            return fprintf(stderr, "bench_gpu: bad flag or value: %s %s\n", argv[i], v), usage(stderr), MT_EXIT_USAGE;
        i++;
    }
    if (!n_cases) strcpy(cases, "CAB"), n_cases = 3;
    int seq_given = n_seqs > 0;
    if (!n_seqs) seqs[0] = 2048, seqs[1] = 4096, n_seqs = 2;

    mt_backend *be = mt_backend_cuda_new(0);
    if (!be) {
        fprintf(stderr, "bench_gpu: %s\n", mt_error_get());  // "no CUDA GPU: ..." on a machine without one
        return 2;
    }
    // The projection beside the profile is the card's (scripts/step_time.h: H100 SXM or H200).
    struct cudaDeviceProp prop;
    cudaError_t pe = cudaGetDeviceProperties(&prop, 0);
    if (pe != cudaSuccess) mt_fatal(MT_EXIT_ERROR, "bench_gpu: cudaGetDeviceProperties: %s", cudaGetErrorString(pe));
    if (step_device_set(prop.name) != 0)
        printf("bench_gpu: %s: no model of this card; the projection is the H100 SXM's\n", prop.name);
    size_t free_b, total_b;
    if (mt_cuda_mem_info(be, &free_b, &total_b) != 0) mt_fatal(MT_EXIT_ERROR, "bench_gpu: %s", mt_error_get());
    // Created = the CUDA context, the stream, the cuBLASLt handle and its workspace (the one
    // allocation the ledger holds here): the part of the card no model can use.
    printf("device memory %.3f GB; used after creating the backend: %.3f GB (of which the cuBLASLt workspace "
           "%.3f GB, in the ledger; the rest is the CUDA context and libraries)\n", total_b / 1e9,
           (total_b - free_b) / 1e9, be->ledger.total_cur / 1e9);
    double peak = matmul_peak(be, MT_BF16, small ? 256 : 8192);
    // The step's activations are f32 on cuda today, so its Linears run f32 x f32 on cuBLASLt (no
    // TF32): this is the ceiling they have now. MFU stays against the bf16 peak, the card's.
    double peak_f32 = matmul_peak(be, MT_F32, small ? 256 : 4096);

    mt_model_config cfg;
    if (!config) mt_plan_mixtral_8x7b(&cfg);
    else if (mt_model_config_load(config, &cfg) != 0) mt_fatal(MT_EXIT_USAGE, "bench_gpu: %s", mt_error_get());
    int64_t full_layers = cfg.layers;
    if (layers > full_layers) return fprintf(stderr, "bench_gpu: --layers %lld: the model has %lld\n", (long long)layers,
                                             (long long)full_layers), MT_EXIT_USAGE;
    if (layers) cfg.layers = layers;
    double copy_gbs = copy_bandwidth(be, (size_t)1 << (small ? 24 : 30));
    double deq_gbs = dequant_bandwidth(be, &cfg, copy_gbs);
    int overlap_failed = overlap && overlap_bench(be, &cfg, small) != 0;
    result res[MAX_RUNS];
    int n_res = 0, failed = 0;
    // One model per case, every sequence length run on it (C: each --seq; A and B: one).
    for (int c = 0; c < n_cases && n_res < MAX_RUNS; c++) {
        int64_t ab_seq = seq_given ? seqs[0] : 1024;
        const int64_t *cs = cases[c] == 'C' ? seqs : &ab_seq;
        int ns = cases[c] == 'C' ? MT_MIN(n_seqs, MAX_RUNS - n_res) : 1;
        result *rs = &res[n_res];
        memset(rs, 0, (size_t)ns * sizeof *rs);
        // the path Mixtral's unpadded batches take (model/attention_cudnn.h)
        const int cudnn =
            !strcmp(attention_path(0, 0, (int)cfg.heads, (int)cfg.kv_heads, (int)cfg.head_dim, (int)cfg.head_dim), "cudnn");
        for (int s = 0; s < ns; s++) rs[s].which = cases[c], rs[s].seq = cs[s], rs[s].attn_cudnn = cudnn;
        if (run_case(be, &cfg, full_layers, cases[c], cs, ns, steps, peak, rs) != 0)
            for (int s = 0; s < ns; s++)
                if (!rs[s].ok) {
                    if (!rs[s].error[0]) snprintf(rs[s].error, sizeof rs[s].error, "%s", mt_error_get());
                    printf("case %c seq %lld FAILED: %s\n", rs[s].which, (long long)rs[s].seq, rs[s].error);
                    failed++;
                }
        n_res += ns;
    }
    mt_backend_free(be);

    printf("\n");
    for (int i = 0; i < n_res; i++) {
        const result *r = &res[i];
        if (r->ok)
            printf("bench_gpu: case=%c seq=%lld attention=%s tokens_per_s=%.1f step_s=%.3f peak_gb=%.3f mfu=%.4f "
                   "hfu=%.4f driver_gb=%.3f ledger_vs_driver=%+.2f%%\n", r->which, (long long)r->seq,
                   r->attn_cudnn ? "cudnn" : "wmma", r->tokens_s, r->step_s,
                   r->ledger_gb, r->mfu, r->hfu, r->driver_gb, (r->driver_gb / r->ledger_gb - 1) * 100);
        else
            printf("bench_gpu: case=%c seq=%lld FAILED: %s\n", r->which, (long long)r->seq, r->error);
    }
    printf("bench_gpu: matmul_bf16_tflops=%.1f matmul_f32_tflops=%.1f copy_gbs=%.0f dequant_nf4_bf16_gbs=%.0f\n", peak,
           peak_f32, copy_gbs, deq_gbs);
    if (overlap_failed) printf("bench_gpu: the experts' two-stream product differed from the one-stream one\n");
    return failed || overlap_failed ? MT_EXIT_ERROR : 0;
}
