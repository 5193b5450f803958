// scripts/gpu_probe.c — the GPU check's first step (scripts/gpu_check.sh): what the device and the
// libraries are, then a 1-rank NCCL communicator through core/comm (the path `--device cuda`
// takes) doing a sum and an EXACT all-reduce whose results are checked. Short, so that a machine
// whose driver, NCCL or cuBLASLt does not work is found in seconds, not inside a training step.
//
//   moetrain_gpu_probe          exit 0 all well; 1 a check failed; 2 no usable GPU
//
// Every line is printed, and appended as JSON to $MT_GPU_JSONL when set (scripts/json_line.h).
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <math.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/backend.h"
#include "core/comm.h"
#include "core/common.h"
#include "core/gemm_rows.h"
#include "model/attention_cudnn.h"
#include "scripts/json_line.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

// The versions the program was built against and runs with: a mismatch explains many failures.
static void versions(void) {
    int drv = 0, rt = 0, nccl = 0;
    if (cudaDriverGetVersion(&drv) != cudaSuccess || cudaRuntimeGetVersion(&rt) != cudaSuccess) {
        (void)cudaGetLastError();
        printf("probe: the CUDA driver or runtime did not say its version\n");
    }
    if (ncclGetVersion(&nccl) != ncclSuccess) nccl = 0;
    size_t lt = cublasLtGetVersion();
    printf("probe: CUDA driver %d.%d%s, runtime %d.%d (built with %d.%d); cuBLASLt %zu; NCCL %d (built with %d)\n",
           drv / 1000, drv % 1000 / 10, drv ? "" : " (no driver)", rt / 1000, rt % 1000 / 10, CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10,
           lt, nccl, NCCL_VERSION_CODE);
    json_line("versions", "\"driver\":%d,\"runtime\":%d,\"runtime_built\":%d,\"cublaslt\":%zu,\"nccl\":%d,"
              "\"nccl_built\":%d", drv, rt, CUDART_VERSION, lt, nccl, NCCL_VERSION_CODE);
}

// cuDNN, loaded at run time (model/attention_cudnn.h): its version, and which attention Mixtral's
// shape (32 query heads, 8 KV heads, hd 128) runs on here; the reason is printed when not cuDNN.
// Run before the device check, so that a machine without a GPU (the rehearsal) still has the
// library finalize every descriptor of the graphs.
static void cudnn_probe(void) {
    const char *path = attention_path(0, 0, 32, 8, 128, 128);
    size_t v = attention_cudnn_version();
    if (v)
        printf("probe: cuDNN %zu.%zu.%zu%s; Mixtral's attention runs on %s\n", v / 10000, v % 10000 / 100, v % 100,
               attention_cudnn_emulated() ? " (the emulator's stand-in)" : "", path);
    else
        printf("probe: cuDNN not loadable; Mixtral's attention runs on %s\n", path);
    // Whether the library takes the graphs (only a GPU's heuristics can say): case C's shape.
    int ok[2] = {-1, -1};
    for (int bwd = 0; v && bwd < 2; bwd++) {
        char msg[400];
        ok[bwd] = attention_cudnn_check(bwd, 1, 4096, 32, 8, 128, 128, 0, 0, msg, sizeof msg);
        printf("probe: cuDNN SDPA %s graph at B 1, S 4096, 32/8 heads, hd 128: %s\n", bwd ? "backward" : "forward", msg);
    }
    json_line("cudnn", "\"version\":%zu,\"attention\":\"%s\",\"fwd_plan\":%d,\"bwd_plan\":%d", v, path, ok[0], ok[1]);
}

static int device(void) {
    struct cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, 0);
    if (e != cudaSuccess) {
        printf("probe: cudaGetDeviceProperties: %s\n", cudaGetErrorString(e));
        return -1;
    }
    printf("probe: device 0: %s, compute capability %d.%d, %d SMs, %.2f GB, L2 %.1f MB, %zu KB shared memory per "
           "block (opt-in)\n", p.name, p.major, p.minor, p.multiProcessorCount, p.totalGlobalMem / 1e9,
           p.l2CacheSize / 1e6, p.sharedMemPerBlockOptin / 1024);
    json_line("device", "\"name\":\"%s\",\"cc\":\"%d.%d\",\"sms\":%d,\"mem_gb\":%.3f,\"l2_mb\":%.1f", p.name, p.major,
              p.minor, p.multiProcessorCount, p.totalGlobalMem / 1e9, p.l2CacheSize / 1e6);
    return 0;
}

// Whether the experts' offsets can stay on the device here (core/gemm_rows.h): cuBLASLt's grouped
// matmul, and its first use's check against per-group GEMMs, run on this GPU. A "no" is not a
// failure: the step then downloads them once per MoE layer.
static void rows_probe(mt_backend *be) {
    char why[240];
    int ok = mt_gemm_rows_checked(be, why, sizeof why);
    printf("probe: experts' rows on the device: %s (%s)\n", ok ? "yes" : "no, downloaded per MoE layer", why);
    json_line("expert_rows", "\"device\":%s,\"why\":\"%s\"", ok ? "true" : "false", why);
}

// A 1-rank NCCL world (core/comm's own path), a plain SUM and an EXACT all-reduce of n floats:
// with one rank both must give back the input bits.
static int nccl_check(mt_backend *be) {
    enum { N = 1 << 20 };
    double t0 = now_s();
    mt_comm *world = mt_comm_init(MT_COMM_NCCL, be);
    if (!world) {
        printf("probe: NCCL: %s\n", mt_error_get());
        json_line("nccl", "\"ok\":false");
        return -1;
    }
    double t_init = now_s() - t0;
    float *host = mt_xmalloc(N * sizeof(float)), *back = mt_xmalloc(N * sizeof(float));
    for (int i = 0; i < N; i++) host[i] = (float)i * 0.5f - 1000.0f;
    void *dev = NULL;
    int bad = 0;
    double t_sum = 0, t_exact = 0;
    if (mt_backend_alloc(be, MT_MEM_WORK, N * sizeof(float), &dev) != 0) {
        printf("probe: NCCL: %s\n", mt_error_get());
        bad = 1;
    }
    for (int exact = 0; exact < 2 && !bad; exact++) {
        be->ops->upload(be, dev, host, N * sizeof(float));
        be->ops->synchronize(be);
        double t = now_s();
        mt_comm_all_reduce(world, dev, N, MT_COMM_F32, MT_COMM_SUM, exact ? MT_COMM_EXACT : 0);
        be->ops->download(be, back, dev, N * sizeof(float));  // waits for the collective
        *(exact ? &t_exact : &t_sum) = now_s() - t;
        if (memcmp(back, host, N * sizeof(float)) != 0) {
            printf("probe: NCCL: the 1-rank %s all-reduce changed the data\n", exact ? "EXACT" : "SUM");
            bad = 1;
        }
    }
    if (dev) mt_backend_release(be, MT_MEM_WORK, N * sizeof(float), dev);
    free(host), free(back);
    mt_comm_free(world);
    printf("probe: NCCL 1-rank world: init %.2f s, all-reduce of %d floats: sum %.2f ms, exact %.2f ms: %s\n",
           t_init, N, t_sum * 1e3, t_exact * 1e3, bad ? "FAILED" : "ok");
    json_line("nccl", "\"ok\":%s,\"init_s\":%.3f,\"sum_ms\":%.3f,\"exact_ms\":%.3f", bad ? "false" : "true", t_init,
              t_sum * 1e3, t_exact * 1e3);
    return bad ? -1 : 0;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    versions();
    cudnn_probe();
    mt_backend *be = mt_backend_cuda_new(0);
    if (!be) {
        printf("probe: %s\n", mt_error_get());  // "no CUDA GPU: ..." where there is none
        json_line("device", "\"ok\":false,\"error\":\"no usable CUDA GPU\"");
        return 2;
    }
    int rc = device() != 0;
    if (!rc) rows_probe(be);
    rc = rc || nccl_check(be) != 0;
    mt_backend_free(be);
    return rc;
}
