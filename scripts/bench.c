// scripts/bench.c — `make bench`: measured throughput of the ops built so far, on every backend
// this build and machine have. Prints what it measured; no goals are asserted here.
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/backend.h"
#include "core/common.h"
#include "core/gemm.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "core/threads.h"
#include "model/ops.h"
#include "quant/quant.h"
#include "trainer/cmd/commands.h"

#include <fcntl.h>
#include <signal.h>
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
// CPU attention against the machine's sgemm

// sgemm GFLOP/s on an [n, n] · [n, n] product with every thread, through mt_sgemm as every
// GEMM of the program: the yardstick the attention figure below is read against.
static double bench_sgemm_gflops(int n) {
    float *a = mt_xmalloc(sizeof(float) * n * n), *b = mt_xmalloc(sizeof(float) * n * n), *c = mt_xmalloc(sizeof(float) * n * n);
    for (int64_t i = 0; i < (int64_t)n * n; i++) a[i] = b[i] = 0.001f * (float)(i % 97);
    mt_sgemm(0, 1, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    int reps = 0;
    double t0 = now_s(), t;
    do {
        mt_sgemm(0, 1, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        reps++;
    } while ((t = now_s() - t0) < 1.0);
    free(a), free(b), free(c);
    return 2.0 * n * n * n * reps / t / 1e9;
}

// Forward + backward of causal attention at configs/mid.json's heads (8 query, 2 kv, hd 64),
// batch 1. FLOPs counted as flash-attention does: the forward's two products and the backward's
// five (its recomputed scores included) over the causal half, 7 · 2 · S²/2 · hd per head.
static void bench_attention(int S, double sgemm_gflops, int ref) {
    const int nh = 8, nkv = 2, hd = 64;
    int64_t nq = (int64_t)S * nh * hd, nk = (int64_t)S * nkv * hd;
    float *q = mt_xmalloc(4 * nq), *k = mt_xmalloc(4 * nk), *v = mt_xmalloc(4 * nk), *o = mt_xmalloc(4 * nq);
    float *g = mt_xmalloc(4 * nq), *dq = mt_xcalloc(nq, 4), *dk = mt_xcalloc(nk, 4), *dv = mt_xcalloc(nk, 4);
    float *lse = mt_xmalloc(4 * (size_t)S * nh);
    mt_rng rng;
    mt_rng_seed(&rng, 3, 0);
    for (int64_t i = 0; i < nq; i++) q[i] = mt_rng_normal(&rng), g[i] = mt_rng_normal(&rng);
    for (int64_t i = 0; i < nk; i++) k[i] = mt_rng_normal(&rng), v[i] = mt_rng_normal(&rng);
    int reps = 0;
    const float scale = 1.0f / sqrtf((float)hd);
    double t0 = now_s(), t, tf = 0;
    do {  // ref: the scalar kernels (model/attention_ref.c) the tiled ones replaced
        double a = now_s();
        (ref ? attention_forward_ref : attention_forward_cpu)(o, lse, q, k, v, NULL, NULL, 1, S, nh, nkv, hd, hd, scale,
                                                              0);
        tf += now_s() - a;
        (ref ? attention_backward_ref : attention_backward_cpu)(dq, dk, dv, NULL, g, q, k, v, o, lse, NULL, NULL, 1, S, nh,
                                                                nkv, hd, hd, scale, 0);
        reps++;
    } while ((t = now_s() - t0) < 2.0 || reps < 2);
    double mm = 2.0 * S * (double)S / 2 * hd * nh, gf = 7 * mm * reps / t / 1e9;
    printf("bench attention_%s seq=%d heads=%d kv_heads=%d head_dim=%d reps=%d fwd_ms=%.1f fwd_bwd_ms=%.1f "
           "fwd_bwd_gflops=%.1f sgemm_gflops=%.1f ratio=%.2f", ref ? "ref" : "cpu",
           S, nh, nkv, hd, reps, 1e3 * tf / reps, 1e3 * t / reps, gf, sgemm_gflops, gf / sgemm_gflops);
    printf(ref ? "\n" : " goal=0.30 %s\n", gf >= 0.3 * sgemm_gflops ? "met" : "NOT MET");
    free(q), free(k), free(v), free(o), free(g), free(dq), free(dk), free(dv), free(lse);
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

// ---------------------------------------------------------------------------------------------
// A busy machine: the same training run with one CPU-burning process beside it

// A child that spins until killed: the "other job" on the machine.
static pid_t burner_start(void) {
    pid_t pid = fork();
    if (pid == 0) {
        volatile unsigned long x = 0;
        for (;;) x++;
    }
    if (pid < 0) mt_fatal(MT_EXIT_ERROR, "bench: fork");
    return pid;
}

static void burner_stop(pid_t pid) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static double load1(void) {
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f && fscanf(f, "%lf", &l) != 1) l = -1;
    if (f) fclose(f);
    return l;
}

// The thread counts mt_threads_adapt chose since `before` (then brought up to now), as
// "count:times" pairs: e.g. "2:38 1:2".
static void threads_since(long long before[MT_THREADS_COUNTED], char *buf, size_t size) {
    long long now[MT_THREADS_COUNTED];
    mt_threads_chosen(now);
    size_t used = 0;
    buf[0] = 0;
    for (int n = 1; n < MT_THREADS_COUNTED; n++)
        if (now[n] > before[n] && used < size)
            used += (size_t)snprintf(buf + used, size - used, "%s%d:%lld", used ? " " : "", n, now[n] - before[n]);
    for (int n = 0; n < MT_THREADS_COUNTED; n++) before[n] = now[n];
}

// Wall time of cmd(argc, argv), quiet or beside a burner.
static double timed_cmd(const char *name, int (*cmd)(int, char **), int argc, char **argv, int busy) {
    pid_t burner = busy ? burner_start() : 0;
    double t0 = now_s();
    int rc = cmd(argc, argv);
    double t = now_s() - t0;
    if (busy) burner_stop(burner);
    if (rc != 0) mt_fatal(MT_EXIT_ERROR, "bench: moetrain %s failed", name);
    return t;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// A token file (MTTOK1) of `rows` rows of `seq` random ids in [3, 3 + span).
static void write_tokens(const char *path, int rows, int seq, int span) {
    FILE *f = fopen(path, "wb");
    if (!f) mt_fatal(MT_EXIT_ERROR, "bench: %s", path);
    uint16_t flags = 0;
    uint64_t n = (uint64_t)rows;
    fwrite("MTTOK1", 1, 6, f), fwrite(&flags, 2, 1, f), fwrite(&n, 8, 1, f);
    mt_rng rng;
    mt_rng_seed(&rng, 4, 0);
    for (int r = 0; r < rows; r++) {
        uint32_t len = (uint32_t)seq;
        fwrite(&len, 4, 1, f);
        for (int i = 0; i < seq; i++) {
            int32_t id = 3 + (int32_t)(mt_rng_next(&rng) % (uint64_t)span);
            fwrite(&id, 4, 1, f);
        }
    }
    if (fclose(f) != 0) mt_fatal(MT_EXIT_ERROR, "bench: writing %s", path);
}

// LoRA training of configs/tiny.json at seq 128 (many short parallel regions: where a spinning
// wait policy hurts most), quiet and busy in interleaved pairs; the bound is busy ≥ 0.4 × quiet
// tok/s (one other job on the machine may take its fair share, no more). Then `moetrain demo`'s
// wall time, quiet and busy. The runs' own output goes to a log in the temporary folder (named by
// a failure's message, and left there).
static void bench_busy(int demo) {
    char dir[] = "/tmp/moetrain-bench-busy-XXXXXX", model[96], data[96], out[96], log[96], cfg[] = "configs/tiny.json";
    if (!mkdtemp(dir)) mt_fatal(MT_EXIT_ERROR, "bench: mkdtemp");
    snprintf(model, sizeof model, "%s/tiny", dir);
    snprintf(data, sizeof data, "%s/tokens.bin", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    snprintf(log, sizeof log, "%s/runs.log", dir);
    enum { SEQ = 128, ROWS = 64, STEPS = 40, PAIRS = 3 };
    write_tokens(data, ROWS, SEQ, 253);
    fflush(stdout);
    int saved = dup(1), logfd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    char *init_argv[] = {"--config", cfg, "--out", model};
    dup2(logfd, 1), dup2(logfd, 2);
    if (cmd_init((int)MT_ARRAY_LEN(init_argv), init_argv) != 0)
        mt_fatal(MT_EXIT_ERROR, "bench: init of %s (see %s)", cfg, log);
    char steps[16];
    snprintf(steps, sizeof steps, "%d", STEPS);
    char *train_argv[] = {"--model", model, "--data", data, "--mode", "lora", "--r", "16",
                          "--targets", "experts", "--seq", "128", "--batch", "1", "--steps", steps, "--out", out};
    double quiet[PAIRS], busy[PAIRS], ratio[PAIRS], load_start = load1();
    char chosen[PAIRS][2][96];  // the thread counts each run's steps chose (core/threads.h)
    for (int p = 0; p < PAIRS; p++) {
        long long before[MT_THREADS_COUNTED];
        mt_threads_chosen(before);
        quiet[p] = (double)SEQ * STEPS / timed_cmd("train", cmd_train, (int)MT_ARRAY_LEN(train_argv), train_argv, 0);
        threads_since(before, chosen[p][0], sizeof chosen[p][0]);
        busy[p] = (double)SEQ * STEPS / timed_cmd("train", cmd_train, (int)MT_ARRAY_LEN(train_argv), train_argv, 1);
        threads_since(before, chosen[p][1], sizeof chosen[p][1]);
        ratio[p] = busy[p] / quiet[p];
    }
    double demo_quiet = 0, demo_busy = 0;
    if (demo) {
        char demo_out[112];
        snprintf(demo_out, sizeof demo_out, "%s/demo", dir);
        char *demo_argv[] = {"--out", demo_out};
        demo_quiet = timed_cmd("demo", cmd_demo, (int)MT_ARRAY_LEN(demo_argv), demo_argv, 0);
        char rm[160];
        snprintf(rm, sizeof rm, "rm -rf '%s'", demo_out);
        if (system(rm) != 0) mt_fatal(MT_EXIT_ERROR, "bench: %s", rm);
        demo_busy = timed_cmd("demo", cmd_demo, (int)MT_ARRAY_LEN(demo_argv), demo_argv, 1);
    }
    fflush(stdout), fflush(stderr);
    dup2(saved, 1), dup2(saved, 2);
    close(saved), close(logfd);
    printf("bench busy_machine pairs (quiet, busy tok/s):");
    for (int p = 0; p < PAIRS; p++) printf(" (%.0f, %.0f)", quiet[p], busy[p]);
    printf("\n");
    printf("bench busy_machine threads chosen (threads:steps) quiet, busy:");
    for (int p = 0; p < PAIRS; p++) printf(" (%s, %s)", chosen[p][0], chosen[p][1]);
    printf("\n");
    qsort(quiet, PAIRS, sizeof(double), cmp_double);
    qsort(busy, PAIRS, sizeof(double), cmp_double);
    qsort(ratio, PAIRS, sizeof(double), cmp_double);
    const char *policy = getenv("OMP_WAIT_POLICY"), *spin = getenv("GOMP_SPINCOUNT");
    printf("bench busy_machine model=configs/tiny.json lora seq=%d steps=%d pairs=%d wait_policy=%s spincount=%s "
           "quiet_tok_s=%.0f busy_tok_s=%.0f busy_over_quiet=%.2f (median of pairs) bound=0.40 %s load_start=%.2f "
           "load_end=%.2f\n",
           SEQ, STEPS, PAIRS, policy ? policy : "default", spin ? spin : "default", quiet[PAIRS / 2], busy[PAIRS / 2],
           ratio[PAIRS / 2], ratio[PAIRS / 2] >= 0.4 ? "held" : "NOT HELD", load_start, load1());
    if (demo)
        printf("bench demo wall_s_quiet=%.1f wall_s_busy=%.1f busy_over_quiet=%.2f\n", demo_quiet, demo_busy,
               demo_busy / demo_quiet);
    char rm[160];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    if (system(rm) != 0) fprintf(stderr, "bench: could not remove %s\n", dir);
}

// Seconds from the end of step 1 to the end of the last step, from a run's metrics.jsonl.
static double steps_after_first_s(const char *out_dir, int steps) {
    static char line[1 << 16];  // a step line holds every expert's load
    char path[160];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out_dir);
    FILE *f = fopen(path, "r");
    if (!f) mt_fatal(MT_EXIT_ERROR, "bench: %s", path);
    double first = -1, last = -1;
    int seen = 0;
    while (fgets(line, sizeof line, f)) {
        const char *e = strstr(line, "\"elapsed_s\":");
        if (!strstr(line, "\"type\":\"step\"") || !e) continue;
        double t = strtod(e + strlen("\"elapsed_s\":"), NULL);
        if (++seen == 1) first = t;
        last = t;
    }
    fclose(f);
    if (seen != steps || last <= first) mt_fatal(MT_EXIT_ERROR, "bench: %s has %d steps, want %d", path, seen, steps);
    return last - first;
}

// Many small experts against one dense MLP of the same FLOPs per token (issue 16): top-8 of 128
// experts of intermediate 256 beside one "expert" of 2048 (E = 1, top-1), two layers of
// hidden 512 and a 1024-token vocabulary, so the MLP dominates the step. Both train LoRA on
// attention only (the MLP frozen, its input gradient still made), seq 512, in interleaved
// pairs; the goal is the MoE at no more than 1.5x the dense model's time per token, in the
// steps after the first (metrics.jsonl's elapsed_s). The whole command's wall time is printed
// beside it: it adds the load, where the MoE converts 16x the dense model's weights (2 layers x
// 128 x 3 x 512 x 256 bf16 values), which a short run does not amortize.
static void bench_moe_vs_dense(void) {
    char dir[] = "/tmp/moetrain-bench-moe-XXXXXX", data[96], log[96];
    if (!mkdtemp(dir)) mt_fatal(MT_EXIT_ERROR, "bench: mkdtemp");
    snprintf(data, sizeof data, "%s/tokens.bin", dir);
    snprintf(log, sizeof log, "%s/runs.log", dir);
    enum { SEQ = 512, STEPS = 8, PAIRS = 3 };
    write_tokens(data, 8, SEQ, 1000);
    const struct { const char *name; int experts, top_k, ffn; } kinds[2] = {{"moe", 128, 8, 256}, {"dense", 1, 1, 2048}};
    char model[2][96], out[2][96];
    fflush(stdout);
    int saved = dup(1), logfd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(logfd, 1), dup2(logfd, 2);
    for (int i = 0; i < 2; i++) {
        char cfg[96];
        snprintf(cfg, sizeof cfg, "%s/%s.json", dir, kinds[i].name);
        snprintf(model[i], sizeof model[i], "%s/%s", dir, kinds[i].name);
        snprintf(out[i], sizeof out[i], "%s/out-%s", dir, kinds[i].name);
        FILE *f = fopen(cfg, "w");
        if (!f) mt_fatal(MT_EXIT_ERROR, "bench: %s", cfg);
        fprintf(f, "{\"architectures\": [\"MixtralForCausalLM\"], \"model_type\": \"mixtral\", \"hidden_size\": 512, "
                   "\"intermediate_size\": %d, \"num_hidden_layers\": 2, \"num_attention_heads\": 8, "
                   "\"num_key_value_heads\": 2, \"num_local_experts\": %d, \"num_experts_per_tok\": %d, "
                   "\"vocab_size\": 1024, \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-05, "
                   "\"rope_theta\": 1000000.0, \"router_aux_loss_coef\": 0.02, \"bos_token_id\": 1, "
                   "\"eos_token_id\": 2, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\"}\n",
                kinds[i].ffn, kinds[i].experts, kinds[i].top_k);
        if (fclose(f) != 0) mt_fatal(MT_EXIT_ERROR, "bench: writing %s", cfg);
        char *init_argv[] = {"--config", cfg, "--out", model[i]};
        if (cmd_init((int)MT_ARRAY_LEN(init_argv), init_argv) != 0)
            mt_fatal(MT_EXIT_ERROR, "bench: init of %s (see %s)", cfg, log);
    }
    char steps[16];
    snprintf(steps, sizeof steps, "%d", STEPS);
    double tps[2][PAIRS], ratio[PAIRS], wall[2][PAIRS], wall_ratio[PAIRS], load_start = load1();
    for (int p = 0; p < PAIRS; p++) {
        for (int j = 0; j < 2; j++) {
            int i = p % 2 ? 1 - j : j;  // alternate which runs first
            char *argv[] = {"--model", model[i], "--data", data, "--mode", "lora", "--r", "16", "--targets", "attn",
                            "--quant", "none", "--seq", "512", "--batch", "1", "--steps", steps, "--out", out[i]};
            wall[i][p] = timed_cmd("train", cmd_train, (int)MT_ARRAY_LEN(argv), argv, 0);
            tps[i][p] = (double)SEQ * (STEPS - 1) / steps_after_first_s(out[i], STEPS);
        }
        ratio[p] = tps[1][p] / tps[0][p];  // the MoE's time per token over the dense model's
        wall_ratio[p] = wall[0][p] / wall[1][p];
    }
    fflush(stdout), fflush(stderr);
    dup2(saved, 1), dup2(saved, 2);
    close(saved), close(logfd);
    qsort(tps[0], PAIRS, sizeof(double), cmp_double);
    qsort(tps[1], PAIRS, sizeof(double), cmp_double);
    qsort(ratio, PAIRS, sizeof(double), cmp_double);
    qsort(wall_ratio, PAIRS, sizeof(double), cmp_double);
    printf("bench moe_vs_dense top8_of_128_ffn256 vs dense_ffn2048 hidden=512 layers=2 seq=%d lora=attn pairs=%d "
           "steps=%d moe_tok_s=%.0f dense_tok_s=%.0f (steps 2..%d) moe_time_over_dense=%.2f (median of pairs) "
           "goal<=1.50 %s whole_command_wall_ratio=%.2f (with the load) load_start=%.2f load_end=%.2f\n",
           SEQ, PAIRS, STEPS, tps[0][PAIRS / 2], tps[1][PAIRS / 2], STEPS, ratio[PAIRS / 2],
           ratio[PAIRS / 2] <= 1.5 ? "met" : "NOT MET", wall_ratio[PAIRS / 2], load_start, load1());
    char rm[160];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    if (system(rm) != 0) fprintf(stderr, "bench: could not remove %s\n", dir);
}

int main(int argc, char **argv) {
    mt_threads_init(argv);  // the policy moetrain runs with
    if (argc >= 3 && strcmp(argv[1], "quantize-rss") == 0) return quantize_child(argv[2], argc - 3, argv + 3);
    const char *only = getenv("MT_BENCH_ONLY");  // e.g. attention: that group alone
    if (only && strcmp(only, "attention") == 0) {
        double sg = bench_sgemm_gflops(1024);
        bench_attention(512, sg, 1);
        bench_attention(512, sg, 0);
        bench_attention(2048, sg, 0);
        return 0;
    }
    if (only && strcmp(only, "busy") == 0) {
        bench_busy(getenv("MT_BENCH_NO_DEMO") == NULL);
        return 0;
    }
    if (only && strcmp(only, "moe") == 0) {
        bench_moe_vs_dense();
        return 0;
    }
    double sg = bench_sgemm_gflops(1024);
    printf("bench sgemm n=1024 threads=all gflops=%.1f\n", sg);
    bench_attention(512, sg, 1);
    bench_attention(512, sg, 0);
    bench_attention(2048, sg, 0);
    mt_backend *cpu = mt_backend_cpu_new();
    bench_matmul(cpu, MT_F32, 512, 1024, 1024);
    bench_matmul(cpu, MT_BF16, 512, 1024, 1024);
    bench_quant(cpu, MT_QUANT_NF4, 1, 4096, 4096);
    bench_quant(cpu, MT_QUANT_NF4, 0, 4096, 4096);
    bench_quant(cpu, MT_QUANT_FP4, 1, 4096, 4096);
    bench_quant(cpu, MT_QUANT_INT4, 0, 4096, 4096);
    mt_backend_free(cpu);
    bench_quantize_rss(argv[0]);
    bench_busy(1);
    bench_moe_vs_dense();
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
