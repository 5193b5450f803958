// scripts/bench.c — `make bench`: measured throughput of the ops built so far, on every backend
// this build and machine have. Prints what it measured; no goals are asserted here.
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/backend.h"
#include "core/common.h"
#include "core/rng.h"

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

int main(void) {
    mt_backend *cpu = mt_backend_cpu_new();
    bench_matmul(cpu, MT_F32, 512, 1024, 1024);
    bench_matmul(cpu, MT_BF16, 512, 1024, 1024);
    mt_backend_free(cpu);
    if (mt_cuda_device_count() > 0) {
        mt_backend *gpu = mt_backend_cuda_new(0);
        if (!gpu) mt_fatal(MT_EXIT_ERROR, "bench: %s", mt_error_get());
        bench_matmul(gpu, MT_BF16, 4096, 4096, 4096);
        bench_matmul(gpu, MT_BF16, 16384, 14336, 4096);  // a 16k-token batch through Mixtral's w1
        mt_backend_free(gpu);
    } else {
        printf("bench: no CUDA GPU in this build or machine; CUDA figures not measured\n");
    }
    return 0;
}
