// scripts/bench.c — `make bench`: measured throughput of the ops built so far, on every backend
// this build and machine have. Prints what it measured; no goals are asserted here.
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/backend.h"
#include "core/common.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "quant/quant.h"
#include "trainer/cmd/commands.h"

#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// y [M, N] = x [M, K] · Wᵀ (W [N, K]), the nn.Linear product, in `dt`.
static void bench_matmul(mt_backend *be, mt_dtype dt, int64_t m, int64_t n, int64_t k) {
    int64_t sx[2] = {m, k}, sw[2] = {n, k}, sy[2] = {m, n};
    mt_tensor *x = mt_tensor_new(be, MT_MEM_ACT, dt, 2, sx), *w = mt_tensor_new(be, MT_MEM_BASE, dt, 2, sw);
    mt_tensor *y = mt_tensor_new(be, MT_MEM_ACT, dt == MT_F32 ? MT_F32 : MT_BF16, 2, sy);
    if (!x || !w || !y) mt_fatal(MT_EXIT_OOM, "bench: %s", mt_error_get());
    size_t big = MT_MAX(x->nbytes, w->nbytes);
    char *host = mt_xmalloc(big);
    mt_rng rng;
    mt_rng_seed(&rng, 1, 0);
    for (size_t i = 0; i < big / 2; i++) ((uint16_t *)host)[i] = mt_f32_to_bf16(mt_rng_normal(&rng));
    if (dt == MT_F32) for (size_t i = 0; i < big / 4; i++) ((float *)host)[i] = mt_rng_normal(&rng);
    mt_tensor_upload(x, host);
    mt_tensor_upload(w, host);
    if (mt_matmul(y, x, w, 0, 1, 1.0f, 0.0f) != 0) mt_fatal(MT_EXIT_ERROR, "bench: %s", mt_error_get());
    be->ops->synchronize(be);
    int reps = 0;
    double t0 = now_s(), t;
    do {
        mt_matmul(y, x, w, 0, 1, 1.0f, 0.0f);
        be->ops->synchronize(be);
        reps++;
    } while ((t = now_s() - t0) < 1.0 && reps < 1000);
    double flops = 2.0 * m * n * k * reps / t;
    printf("bench matmul backend=%s dtype=%s M=%lld N=%lld K=%lld reps=%d time_s=%.3f tflops=%.3f\n",
           be->ops->name, mt_dtype_name(dt), (long long)m, (long long)n, (long long)k, reps, t, flops / 1e12);
    free(host);
    mt_tensor_free(x), mt_tensor_free(w), mt_tensor_free(y);
}

// ---------------------------------------------------------------------------------------------
// quant/: quantize and dequantize throughput; peak memory of `moetrain quantize`

// Throughput on a [out, in] weight. GB/s counts the bf16 weight's bytes (2 per parameter): read
// by quantize, written by dequantize; the 4-bit side adds ~0.26 byte per parameter.
static void bench_quant(mt_backend *be, mt_quant type, int dq, int64_t out, int64_t in) {
    int64_t n = out * in;
    uint16_t *w = mt_xmalloc((size_t)n * 2);
    mt_rng rng;
    mt_rng_seed(&rng, 2, 0);
    for (int64_t i = 0; i < n; i++) w[i] = mt_f32_to_bf16(0.02f * mt_rng_normal(&rng));
    mt_qweight q;
    int reps = 0;
    double t0 = now_s(), tq;
    do {
        if (reps) mt_qweight_free(&q);
        if (mt_qweight_quantize_from(&q, be, "bench", w, MT_BF16, out, in, type, 0, dq, NULL) != 0)
            mt_fatal(MT_EXIT_ERROR, "bench: %s", mt_error_get());
        be->ops->synchronize(be);
        reps++;
    } while ((tq = now_s() - t0) < 1.0 && reps < 100);
    double q_gbs = 2.0 * (double)n * reps / tq / 1e9;
    int64_t sh[1] = {n};
    mt_tensor *dst = mt_tensor_new(be, MT_MEM_WORK, MT_BF16, 1, sh);
    if (!dst) mt_fatal(MT_EXIT_OOM, "bench: %s", mt_error_get());
    int dreps = 0;
    double td;
    mt_qweight_dequantize(&q, dst);
    be->ops->synchronize(be);
    t0 = now_s();
    do {
        mt_qweight_dequantize(&q, dst);
        be->ops->synchronize(be);
        dreps++;
    } while ((td = now_s() - t0) < 1.0 && dreps < 1000);
    double d_gbs = 2.0 * (double)n * dreps / td / 1e9;
    double bytes4 = (double)mt_qweight_bytes(&q);
    printf("bench quant backend=%s format=%s double_quant=%d shape=%lldx%lld quantize_gbps=%.2f "
           "dequantize_gbps=%.2f dequantize_total_gbps=%.2f bits_per_param=%.4f\n",
           be->ops->name, mt_qformats[type].name, q.double_quant, (long long)out, (long long)in, q_gbs, d_gbs,
           (2.0 * (double)n + bytes4) * dreps / td / 1e9, 8.0 * bytes4 / (double)n);
    mt_tensor_free(dst);
    mt_qweight_free(&q);
    free(w);
}

// The child of bench_quantize_rss: `moetrain quantize`, then its own VmHWM (the peak RSS of
// this process image; getrusage's ru_maxrss would also count the parent's, whose memory the
// child shared until exec) written to `hwm_path`.
static int quantize_child(const char *hwm_path, int argc, char **argv) {
    int rc = cmd_quantize(argc, argv);
    FILE *st = fopen("/proc/self/status", "r"), *out = fopen(hwm_path, "w");
    char line[256];
    long long kb = -1;
    while (st && fgets(line, sizeof line, st))
        if (sscanf(line, "VmHWM: %lld kB", &kb) == 1) break;
    if (out) fprintf(out, "%lld\n", kb);
    if (st) fclose(st);
    if (out) fclose(out);
    return rc;
}

// Peak RSS of `moetrain quantize` on a multi-shard checkpoint of configs/mid.json (> 1 GB of
// bf16) written by `moetrain init`, measured in a child process (its VmHWM).
static void bench_quantize_rss(const char *self) {
    char dir[] = "/tmp/moetrain-bench-XXXXXX", src[96], dst[96], cfg[1024];
    if (!mkdtemp(dir)) mt_fatal(MT_EXIT_ERROR, "bench: mkdtemp");
    snprintf(src, sizeof src, "%s/mid", dir);
    snprintf(dst, sizeof dst, "%s/mid-nf4", dir);
    snprintf(cfg, sizeof cfg, "%s", "configs/mid.json");
    char *init_argv[] = {"--config", cfg, "--out", src, "--dtype", "bf16", "--shard-size", "300MB"};
    double t0 = now_s();
    if (cmd_init((int)MT_ARRAY_LEN(init_argv), init_argv) != 0) mt_fatal(MT_EXIT_ERROR, "bench: init of %s failed", cfg);
    double t_init = now_s() - t0;
    mt_st_model m;
    if (mt_st_model_open(&m, src) != 0) mt_fatal(MT_EXIT_ERROR, "bench: %s", mt_error_get());
    uint64_t total = 0, largest = 0;
    for (size_t i = 0; i < m.n_tensors; i++) {
        total += m.tensors[i]->nbytes;
        if (m.tensors[i]->nbytes > largest) largest = m.tensors[i]->nbytes;
    }
    size_t shards = m.n_files;
    mt_st_model_close(&m);
    // The child: this very program with "quantize" as its first argument (see main).
    char hwm[128];
    snprintf(hwm, sizeof hwm, "%s/vmhwm.txt", dir);
    char *child_argv[] = {(char *)self, "quantize-rss", hwm, "--model", src, "--out", dst, "--quant", "nf4",
                          "--double-quant", NULL};
    pid_t pid;
    t0 = now_s();
    if (posix_spawn(&pid, "/proc/self/exe", NULL, NULL, child_argv, NULL) != 0) mt_fatal(MT_EXIT_ERROR, "bench: spawn");
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        mt_fatal(MT_EXIT_ERROR, "bench: moetrain quantize failed");
    double t_q = now_s() - t0;
    long long kb = -1;
    FILE *f = fopen(hwm, "r");
    if (!f || fscanf(f, "%lld", &kb) != 1 || kb <= 0) mt_fatal(MT_EXIT_ERROR, "bench: no VmHWM from the child");
    fclose(f);
    uint64_t peak = (uint64_t)kb * 1024, margin = 64ull << 20;
    printf("bench quantize_rss model=configs/mid.json bf16_bytes=%llu shards=%zu largest_tensor_bytes=%llu "
           "peak_rss_bytes=%llu bound_bytes=%llu (2 x largest + %llu MiB margin) within_bound=%s "
           "init_s=%.1f quantize_s=%.1f quantize_gbps=%.2f\n",
           (unsigned long long)total, shards, (unsigned long long)largest, (unsigned long long)peak,
           (unsigned long long)(2 * largest + margin), (unsigned long long)(margin >> 20),
           peak < 2 * largest + margin ? "yes" : "NO", t_init, t_q, (double)total / t_q / 1e9);
    char rm[256];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    if (system(rm) != 0) fprintf(stderr, "bench: could not remove %s\n", dir);
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "quantize-rss") == 0) return quantize_child(argv[2], argc - 3, argv + 3);
    mt_backend *cpu = mt_backend_cpu_new();
    bench_matmul(cpu, MT_F32, 512, 1024, 1024);
    bench_matmul(cpu, MT_BF16, 512, 1024, 1024);
    bench_quant(cpu, MT_QUANT_NF4, 1, 4096, 4096);
    bench_quant(cpu, MT_QUANT_NF4, 0, 4096, 4096);
    bench_quant(cpu, MT_QUANT_FP4, 1, 4096, 4096);
    bench_quant(cpu, MT_QUANT_INT4, 0, 4096, 4096);
    mt_backend_free(cpu);
    bench_quantize_rss(argv[0]);
    if (mt_cuda_device_count() > 0) {
        mt_backend *gpu = mt_backend_cuda_new(0);
        if (!gpu) mt_fatal(MT_EXIT_ERROR, "bench: %s", mt_error_get());
        bench_matmul(gpu, MT_BF16, 4096, 4096, 4096);
        bench_matmul(gpu, MT_BF16, 16384, 14336, 4096);  // a 16k-token batch through Mixtral's w1
        bench_quant(gpu, MT_QUANT_NF4, 1, 14336, 4096);     // Mixtral's w1: dequantize -> bf16 scratch
        bench_quant(gpu, MT_QUANT_INT4, 0, 14336, 4096);
        mt_backend_free(gpu);
    } else {
        printf("bench: no CUDA GPU in this build or machine; CUDA figures not measured\n");
    }
    return 0;
}
