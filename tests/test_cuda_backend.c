// tests/test_cuda_backend.c — the cuda backend against its cpu twin.
//
// Every GPU test skips, saying why, in a CPU build or on a machine without a GPU; a skip is
// reported as a skip, never as a pass. `cuda/new_reports_missing_gpu` runs everywhere.
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu_or_skip.h"
#include "core/backend.h"
#include "core/common.h"
#include "core/dtype.h"
#include "model/mixtral.h"
#include "quant/qweight.h"
#include "trainer/options.h"

#ifdef MT_CUDA
#include <cuda_runtime.h>
#endif


Test(cuda, new_reports_missing_gpu) {
    mt_error_clear();
#ifndef MT_CUDA
    cr_assert_null(mt_backend_cuda_new(0));
    cr_assert(strstr(mt_error_get(), "CUDA=1"), "error should say how to build with CUDA: %s", mt_error_get());
    cr_assert_eq(mt_cuda_device_count(), 0);
#else
    int n = mt_cuda_device_count();
    cr_assert_geq(n, 0);
    // Without a GPU device 0 is missing; with one, device n is. Either way: NULL and a message.
    mt_backend *be = mt_backend_cuda_new(n);
    cr_assert_null(be, "device %d of %d should not exist", n, n);
    cr_assert(strstr(mt_error_get(), "CUDA"), "error should name CUDA: %s", mt_error_get());
    mt_error_clear();
    cr_assert_null(mt_backend_cuda_new(-1));
    cr_assert(strstr(mt_error_get(), "CUDA"), "error should name CUDA: %s", mt_error_get());
#endif
}

// ---------------------------------------------------------------------------------------------
// Matmul parity

static uint64_t rng_state;
static float rnd_uniform(void) {  // [-1, 1)
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 41) * (1.0 / 8388608.0)) * 2.0f - 1.0f;  // 23 bits: [0, 1)
}

// Host values of n elements of `dt`, random in [-1, 1), and the same values as f32
// (bf16/f16 rounded first, so both backends see identical inputs).
static void *random_host(mt_dtype dt, size_t n, float *as_f32) {
    void *h = mt_xmalloc(mt_dtype_bytes(dt, n));
    for (size_t i = 0; i < n; i++) as_f32[i] = rnd_uniform();
    if (dt == MT_F32) {
        memcpy(h, as_f32, n * sizeof(float));
    } else {
        mt_convert(h, dt, as_f32, MT_F32, n);
        mt_convert(as_f32, MT_F32, h, dt, n);
    }
    return h;
}

static mt_tensor *tensor2(mt_backend *be, mt_dtype dt, int64_t r, int64_t c) {
    int64_t shape[2] = {r, c};
    mt_tensor *t = mt_tensor_new(be, MT_MEM_ACT, dt, 2, shape);
    cr_assert_not_null(t, "tensor [%lld, %lld] %s: %s", (long long)r, (long long)c, mt_dtype_name(dt),
                       mt_error_get());
    return t;
}

typedef struct {
    double err;     // max |got - want| / max |want|
    size_t worst;   // flat index of the worst element
    float got, want;
} parity;

// Runs c = alpha·op(a)·op(b) + beta·c on the GPU (inputs `in`, output `out`) and on the cpu
// backend in fp32 from the same rounded inputs (and the same rounded initial c).
static parity matmul_parity(mt_backend *gpu, mt_backend *cpu, int64_t m, int64_t n, int64_t k,
                            int ta, int tb, mt_dtype in, mt_dtype out, float alpha, float beta) {
    int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    size_t na = (size_t)(ar * ac), nb = (size_t)(br * bc), nc = (size_t)(m * n);
    float *fa = mt_xmalloc(na * sizeof(float) + 1), *fb = mt_xmalloc(nb * sizeof(float) + 1);
    float *fc = mt_xmalloc(nc * sizeof(float) + 1), *got = mt_xmalloc(nc * sizeof(float) + 1);
    void *ha = random_host(in, na, fa), *hb = random_host(in, nb, fb), *hc = random_host(out, nc, fc);

    mt_tensor *ga = tensor2(gpu, in, ar, ac), *gb = tensor2(gpu, in, br, bc), *gc = tensor2(gpu, out, m, n);
    mt_tensor_upload(ga, ha);
    mt_tensor_upload(gb, hb);
    mt_tensor_upload(gc, hc);
    cr_assert_eq(mt_matmul(gc, ga, gb, ta, tb, alpha, beta), 0, "cuda matmul: %s", mt_error_get());
    void *hgot = mt_xmalloc(gc->nbytes + 1);
    mt_tensor_download(gc, hgot);
    if (out == MT_F32) memcpy(got, hgot, nc * sizeof(float));
    else mt_convert(got, MT_F32, hgot, out, nc);

    mt_tensor *ca = tensor2(cpu, MT_F32, ar, ac), *cb = tensor2(cpu, MT_F32, br, bc), *cc = tensor2(cpu, MT_F32, m, n);
    mt_tensor_upload(ca, fa);
    mt_tensor_upload(cb, fb);
    mt_tensor_upload(cc, fc);
    cr_assert_eq(mt_matmul(cc, ca, cb, ta, tb, alpha, beta), 0, "cpu matmul: %s", mt_error_get());
    const float *want = cc->data;

    parity p = {0, 0, 0, 0};
    double max_diff = 0, max_ref = 0;
    for (size_t i = 0; i < nc; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= max_diff)) {  // NaN counts as the worst
            max_diff = d;
            p.worst = i;
        }
        if (fabs(want[i]) > max_ref) max_ref = fabs(want[i]);
    }
    p.err = max_diff / (max_ref > 0 ? max_ref : 1.0);
    if (nc) p.got = got[p.worst], p.want = want[p.worst];

    mt_tensor_free(ga), mt_tensor_free(gb), mt_tensor_free(gc);
    mt_tensor_free(ca), mt_tensor_free(cb), mt_tensor_free(cc);
    free(fa), free(fb), free(fc), free(got), free(ha), free(hb), free(hc), free(hgot);
    return p;
}

static const int64_t shapes[][3] = {{1, 1, 1}, {7, 13, 5}, {64, 128, 96}, {257, 33, 129}, {3, 1, 200}};

// Every shape × every transpose combination for one dtype pairing; fails on the worst case.
static void parity_all(mt_dtype in, mt_dtype out, double tol, float alpha, float beta) {
    mt_backend *gpu = gpu_or_skip();
    mt_backend *cpu = mt_backend_cpu_new();
    rng_state = 12345;
    for (size_t s = 0; s < MT_ARRAY_LEN(shapes); s++)
        for (int t = 0; t < 4; t++) {
            int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
            int ta = t & 1, tb = t >> 1;
            parity p = matmul_parity(gpu, cpu, m, n, k, ta, tb, in, out, alpha, beta);
            cr_log_info("matmul %s->%s M=%lld N=%lld K=%lld ta=%d tb=%d: err=%.3g worst [%zu,%zu] got %g want %g",
                        mt_dtype_name(in), mt_dtype_name(out), (long long)m, (long long)n, (long long)k,
                        ta, tb, p.err, p.worst / (size_t)n, p.worst % (size_t)n, p.got, p.want);
            cr_expect(p.err < tol,
                      "matmul %s->%s M=%lld N=%lld K=%lld ta=%d tb=%d: normalised error %.3g >= %g; "
                      "worst element [%zu, %zu]: got %.8g, want %.8g",
                      mt_dtype_name(in), mt_dtype_name(out), (long long)m, (long long)n, (long long)k, ta,
                      tb, p.err, tol, p.worst / (size_t)n, p.worst % (size_t)n, p.got, p.want);
        }
    mt_backend_free(cpu);
    mt_backend_free(gpu);
}

Test(cuda, matmul_bf16_to_bf16) { parity_all(MT_BF16, MT_BF16, 1e-2, 1.0f, 0.0f); }
// bf16 inputs with an fp32 output differ from the fp32 reference only by summation order.
Test(cuda, matmul_bf16_to_f32) { parity_all(MT_BF16, MT_F32, 1e-3, 1.0f, 0.0f); }
Test(cuda, matmul_f32) { parity_all(MT_F32, MT_F32, 1e-4, 1.0f, 0.0f); }
Test(cuda, matmul_alpha_beta) {
    parity_all(MT_F32, MT_F32, 1e-4, 0.5f, 1.5f);
    parity_all(MT_BF16, MT_BF16, 1e-2, -2.0f, 0.25f);
}

// mt_cuda_gemm_sm_reserve: GEMMs planned for fewer SMs are new plans (the SM target is part of
// a plan's key) with the same products; back at 0 the earlier plans serve again; a reserve out
// of [0, SMs) and a non-cuda backend are refused with an error.
Test(cuda, gemm_sm_reserve_plans_anew_and_keeps_products) {
    mt_backend *gpu = gpu_or_skip();
    mt_backend *cpu = mt_backend_cpu_new();
    rng_state = 777;
    parity p = matmul_parity(gpu, cpu, 64, 128, 96, 0, 1, MT_BF16, MT_BF16, 1.0f, 0.0f);
    cr_expect(p.err < 1e-2, "all SMs: error %.3g", p.err);
    uint64_t b0 = mt_cuda_matmul_plans_built(gpu);
    cr_assert_eq(mt_cuda_gemm_sm_reserve(gpu, 16), 0, "%s", mt_error_get());
    p = matmul_parity(gpu, cpu, 64, 128, 96, 0, 1, MT_BF16, MT_BF16, 1.0f, 0.0f);
    cr_expect(p.err < 1e-2, "all SMs but 16: error %.3g", p.err);
    uint64_t b1 = mt_cuda_matmul_plans_built(gpu);
    cr_expect_eq(b1, b0 + 1, "a plan for the new SM target (%llu -> %llu)", (unsigned long long)b0, (unsigned long long)b1);
    cr_expect_eq(mt_cuda_gemm_sm_reserved(gpu), 16);
    cr_assert_eq(mt_cuda_gemm_sm_reserve(gpu, 0), 0, "%s", mt_error_get());
    cr_expect_eq(mt_cuda_gemm_sm_reserved(gpu), 0);
    matmul_parity(gpu, cpu, 64, 128, 96, 0, 1, MT_BF16, MT_BF16, 1.0f, 0.0f);
    cr_expect_eq(mt_cuda_matmul_plans_built(gpu), b1, "all SMs again: the first plan serves");
    cr_expect_eq(mt_cuda_gemm_sm_reserve(gpu, -1), -1);
    cr_expect(strstr(mt_error_get(), "multiprocessors"), "%s", mt_error_get());
    cr_expect_eq(mt_cuda_gemm_sm_reserve(gpu, 100000), -1);
    cr_expect_eq(mt_cuda_gemm_sm_reserve(cpu, 8), -1);
    cr_expect(strstr(mt_error_get(), "not a cuda backend") || strstr(mt_error_get(), "CPU build"), "%s", mt_error_get());
    mt_backend_free(cpu);
    mt_backend_free(gpu);
}

// mt_download_begin / mt_download_end: the copy takes the source as the stream has it at begin
// (work queued after begin does not reach it), the host's buffer is filled only at end, which is
// the one host wait (begin waits for nothing); the staging grows for a larger copy; end with
// nothing begun does nothing. On the cpu backend begin copies at once.
Test(cuda, deferred_download_is_ordered_and_waits_once) {
    mt_backend *gpu = gpu_or_skip();
    enum { N = 300, BIG = 5000 };
    int32_t host[BIG], got[BIG];
    for (int i = 0; i < BIG; i++) host[i] = 3 * i + 1;
    int32_t *dev;
    cr_assert_eq(gpu->ops->alloc(gpu, sizeof host, (void **)&dev), 0, "%s", mt_error_get());
    gpu->ops->upload(gpu, dev, host, N * sizeof(int32_t));
    for (int i = 0; i < BIG; i++) got[i] = -7;
    uint64_t s0 = gpu->host_syncs;
    mt_download_begin(gpu, got, dev, N * sizeof(int32_t));
    gpu->ops->fill_zero(gpu, dev, sizeof host);  // queued after the copy: must not reach it
    cr_expect_eq(gpu->host_syncs, s0, "begin waits for nothing");
    cr_expect_eq(got[0], -7, "the host's buffer is filled at end, not before");
    mt_download_end(gpu);
    cr_expect_eq(gpu->host_syncs, s0 + 1, "end is one host wait");
    int bad = 0;
    for (int i = 0; i < N; i++) bad += got[i] != 3 * i + 1;
    cr_expect_eq(bad, 0, "%d of %d values differ from the source as queued at begin", bad, N);
    cr_expect_eq(got[N], -7, "no byte past the copy");
    mt_download_end(gpu);
    cr_expect_eq(gpu->host_syncs, s0 + 1, "end with nothing begun does nothing");
    gpu->ops->upload(gpu, dev, host, sizeof host);  // a larger copy: the staging grows
    mt_download_begin(gpu, got, dev, sizeof host);
    mt_download_end(gpu);
    cr_expect_eq(memcmp(got, host, sizeof host), 0, "the larger copy");
    gpu->ops->free(gpu, dev);
    mt_backend_free(gpu);

    mt_backend *cpu = mt_backend_cpu_new();
    int32_t src[4] = {5, 6, 7, 8}, dst[4] = {0};
    mt_download_begin(cpu, dst, src, sizeof src);
    cr_expect_eq(memcmp(dst, src, sizeof src), 0, "the cpu copies at begin");
    mt_download_end(cpu);
    mt_backend_free(cpu);
}

// MT_GEMM_SM_RESERVE sets the reserve at creation; a value that is not one is refused naming it.
Test(cuda, gemm_sm_reserve_from_the_environment) {
    mt_backend_free(gpu_or_skip());
    static const char *const bad[] = {"x", "16x", "-1", "100000"};
    for (size_t i = 0; i < MT_ARRAY_LEN(bad); i++) {
        setenv("MT_GEMM_SM_RESERVE", bad[i], 1);
        mt_backend *be = mt_backend_cuda_new(0);
        cr_expect_null(be, "MT_GEMM_SM_RESERVE=%s accepted", bad[i]);
        if (be) mt_backend_free(be);
        else cr_expect(strstr(mt_error_get(), "MT_GEMM_SM_RESERVE"), "%s", mt_error_get());
    }
    setenv("MT_GEMM_SM_RESERVE", "16", 1);
    mt_backend *be = mt_backend_cuda_new(0), *cpu = mt_backend_cpu_new();
    cr_assert_not_null(be, "%s", mt_error_get());
    cr_expect_eq(mt_cuda_gemm_sm_reserved(be), 16);
    // planned for all SMs but 16 from the start: asking for that again makes no new plan
    matmul_parity(be, cpu, 64, 128, 96, 0, 1, MT_BF16, MT_BF16, 1.0f, 0.0f);
    uint64_t b0 = mt_cuda_matmul_plans_built(be);
    cr_assert_eq(mt_cuda_gemm_sm_reserve(be, 16), 0);
    matmul_parity(be, cpu, 64, 128, 96, 0, 1, MT_BF16, MT_BF16, 1.0f, 0.0f);
    cr_expect_eq(mt_cuda_matmul_plans_built(be), b0, "the environment's reserve was not in force");
    mt_backend_free(be), mt_backend_free(cpu);
    unsetenv("MT_GEMM_SM_RESERVE");
}

// More distinct shapes than the plan cache holds (512 slots; N is never bucketed, so 600 values
// of N are 600 plans): the second round finds its plans evicted, rebuilds them, and the results
// stay right.
Test(cuda, matmul_plan_cache_eviction) {
    mt_backend *gpu = gpu_or_skip();
    mt_backend *cpu = mt_backend_cpu_new();
    rng_state = 777;
    uint64_t built[2];
    for (int round = 0; round < 2; round++) {
        uint64_t before = mt_cuda_matmul_plans_built(gpu);
        for (int64_t n = 1; n <= 600; n++) {
            parity p = matmul_parity(gpu, cpu, 3, n, 5, (int)(n & 1), 0, MT_BF16, MT_F32, 1.0f, 0.0f);
            cr_expect(p.err < 1e-3, "round %d N=%lld: error %.3g (got %g want %g)", round, (long long)n, p.err, p.got,
                      p.want);
        }
        built[round] = mt_cuda_matmul_plans_built(gpu) - before;
    }
    cr_expect_eq(built[0], 600, "round 1: %llu plans built for 600 shapes", (unsigned long long)built[0]);
    cr_expect_gt(built[1], 0, "round 2 rebuilt nothing: the cache never evicted (600 shapes)");
    mt_backend_free(cpu);
    mt_backend_free(gpu);
}

// Expert matmuls: an expert's token count changes every call, as M of its forward and dx GEMMs
// and as K of its weight (LoRA) gradients, while the other two sizes stay. Plans are cached per
// power-of-two bucket of M and of K, so `calls` matmuls with the varying size in 1..300 build one
// plan per bucket met (at most 10: 1, 2, 4, ..., 512), and each result matches the fp32
// reference at that exact size (bf16 inputs, f32 output: summation order only, as
// matmul_bf16_to_f32). Not M with trans_a: a dense a stored [K, M] has row stride M, part of the
// key, so there every M is its own plan by design (the model's trans_a calls, weight gradients,
// have a fixed M and vary K).
static void plan_buckets_check(char vary, int trans_a, int trans_b, int calls) {
    mt_backend *gpu = gpu_or_skip();
    mt_backend *cpu = mt_backend_cpu_new();
    rng_state = 4242u + (unsigned)(trans_a * 2 + trans_b) + (unsigned)vary;
    uint64_t built0 = mt_cuda_matmul_plans_built(gpu);
    int seen[16] = {0}, buckets = 0;
    for (int i = 0; i < calls; i++) {
        int64_t x = 1 + (int64_t)((rnd_uniform() + 1.0f) * 150.0f);  // 1..300
        if (x > 300) x = 300;
        int b = 0;
        while (((int64_t)1 << b) < x) b++;
        if (!seen[b]) seen[b] = 1, buckets++;
        int64_t m = vary == 'm' ? x : 24, k = vary == 'k' ? x : 40;
        parity p = matmul_parity(gpu, cpu, m, 24, k, trans_a, trans_b, MT_BF16, MT_F32, 1.0f, 0.0f);
        cr_expect(p.err < 1e-3, "call %d M=%lld K=%lld ta=%d tb=%d: error %.3g (got %g want %g)", i, (long long)m,
                  (long long)k, trans_a, trans_b, p.err, p.got, p.want);
    }
    uint64_t built = mt_cuda_matmul_plans_built(gpu) - built0;
    cr_log_info("%d matmuls varying %c (ta=%d tb=%d), %d buckets met, %llu plans built", calls, vary, trans_a, trans_b,
                buckets, (unsigned long long)built);
    cr_expect(built >= 1 && built <= (uint64_t)buckets,
              "%d matmuls with %c in 1..300: %llu plans built, expected at most one per bucket (%d)", calls, vary,
              (unsigned long long)built, buckets);
    cr_expect(buckets <= 10, "1..300 spans at most 10 power-of-two buckets, saw %d", buckets);
    mt_backend_free(cpu);
    mt_backend_free(gpu);
}

Test(cuda, matmul_plans_by_m_bucket) { plan_buckets_check('m', 0, 0, 200); }
// x · Wᵀ, the expert forward's layout.
Test(cuda, matmul_plans_by_m_bucket_trans_b) { plan_buckets_check('m', 0, 1, 100); }
// dB += dyᵀ · xa, a LoRA gradient's layout: K is the expert's token count.
Test(cuda, matmul_plans_by_k_bucket_trans_a) { plan_buckets_check('k', 1, 0, 100); }

// Steps whose shapes were all met before re-plan nothing: the tiny model (LoRA on the experts
// and routers, NF4 base, full recomputation, as case C) runs forward and backward on three
// random batches (each expert's token count differs between them), then on the same three again
// (no update in between, so the same routing). The second pass must build no plan: the cache
// holds every (call site, bucket) of a step, and the keys do not depend on where the work
// buffers land. With 64 slots and uncapped alignment the second pass rebuilt ~100 plans a step.
Test(cuda, training_steps_replan_nothing_when_warm) {
    mt_backend *gpu = gpu_or_skip();
    mt_model_config cfg;
    cr_assert_eq(mt_model_config_load(MT_REPO_ROOT "/configs/tiny.json", &cfg), 0, "%s", mt_error_get());
    mt_run_opts o;
    mt_run_opts_default(&o);
    cr_assert_eq(mt_plan_case_apply(&o, 'C'), 0, "%s", mt_error_get());
    cr_assert_eq(mt_run_opts_set(&o, "seq", "64"), 0, "%s", mt_error_get());
    cr_assert_eq(mt_run_opts_set(&o, "batch", "2"), 0, "%s", mt_error_get());
    mt_model m;
    cr_assert_eq(mt_model_build(&m, gpu, &cfg, NULL, MT_MODEL_SPEC_OF(&o)), 0, "%s", mt_error_get());
    int32_t tokens[3][128];
    rng_state = 99;
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 128; i++) tokens[k][i] = (int32_t)((rnd_uniform() + 1.0f) * 0.5f * (float)(m.cfg.vocab - 1));
    uint64_t built[2] = {0, 0};
    double loss[2][3];
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < 3; k++) {
            mt_batch b = {2, 64, tokens[k], tokens[k], NULL};
            uint64_t before = mt_cuda_matmul_plans_built(gpu);
            mt_loss l;
            mt_model_zero_grad(&m);
            cr_assert_eq(mt_model_forward(&m, &b, &l), 0, "%s", mt_error_get());
            mt_model_backward(&m);
            gpu->ops->synchronize(gpu);
            built[pass] += mt_cuda_matmul_plans_built(gpu) - before;
            loss[pass][k] = l.loss;
            cr_log_info("pass %d batch %d: loss %.6f, %llu plans built", pass, k, l.loss,
                        (unsigned long long)(mt_cuda_matmul_plans_built(gpu) - before));
        }
    cr_expect_gt(built[0], 0, "the first pass built no plan");
    cr_expect_eq(built[1], 0, "the second pass over the same batches built %llu plans (the first %llu)",
                 (unsigned long long)built[1], (unsigned long long)built[0]);
    for (int k = 0; k < 3; k++)
        cr_expect_eq(loss[1][k], loss[0][k], "batch %d: loss %.9g, then %.9g (same weights, same tokens)", k,
                     loss[0][k], loss[1][k]);
    mt_model_free(&m);
    mt_backend_free(gpu);
}

#ifdef MT_CUDA
// Under the emulator, CUDASIM_ALGOCHECK=refuse makes cuBLASLt refuse every cached algorithm at
// a new M or K (a real device may refuse one chosen for another size): every such call must fall
// back to a fresh heuristic and still give the right result.
Test(cuda, matmul_algo_check_refusal_falls_back) {
    struct cudaDeviceProp prop;
    if (mt_cuda_device_count() == 0 || cudaGetDeviceProperties(&prop, 0) != cudaSuccess || !strstr(prop.name, "cudasim"))
        cr_skip_test("needs the cudasim emulator, whose cuBLASLt stand-in can be told to refuse algorithms");
    setenv("CUDASIM_ALGOCHECK", "refuse", 1);
    setenv("CUDASIM_QUIET_CUBLAS", "1", 1);
    plan_buckets_check('m', 0, 0, 30);
    plan_buckets_check('k', 1, 0, 30);
}
#endif

// K = 0 is an empty sum: c = beta · c.
Test(cuda, matmul_empty_k) {
    mt_backend *gpu = gpu_or_skip();
    mt_tensor *a = tensor2(gpu, MT_BF16, 4, 0), *b = tensor2(gpu, MT_BF16, 0, 3), *c = tensor2(gpu, MT_F32, 4, 3);
    float ones[12], got[12];
    for (int i = 0; i < 12; i++) ones[i] = 1.0f + (float)i;
    mt_tensor_upload(c, ones);
    cr_assert_eq(mt_matmul(c, a, b, 0, 0, 1.0f, 2.0f), 0, "%s", mt_error_get());
    mt_tensor_download(c, got);
    for (int i = 0; i < 12; i++) cr_expect_float_eq(got[i], 2.0f * ones[i], 1e-6, "c[%d]", i);
    cr_assert_eq(mt_matmul(c, a, b, 0, 0, 1.0f, 0.0f), 0, "%s", mt_error_get());
    mt_tensor_download(c, got);
    for (int i = 0; i < 12; i++) cr_expect_eq(got[i], 0.0f, "c[%d] = %g", i, got[i]);
    mt_tensor_free(a), mt_tensor_free(b), mt_tensor_free(c);
    mt_backend_free(gpu);
}

Test(cuda, matmul_rejects_bad_shapes_and_dtypes) {
    mt_backend *gpu = gpu_or_skip();
    mt_tensor *a = tensor2(gpu, MT_BF16, 4, 8), *b = tensor2(gpu, MT_BF16, 7, 3), *c = tensor2(gpu, MT_F32, 4, 3);
    mt_error_clear();
    cr_assert_eq(mt_matmul(c, a, b, 0, 0, 1.0f, 0.0f), -1, "K mismatch (8 vs 7) must fail");
    cr_assert(strstr(mt_error_get(), "shapes"), "error: %s", mt_error_get());
    cr_assert_eq(mt_matmul(c, a, b, 0, 1, 1.0f, 0.0f), -1, "trans_b: [7,3]^T is [3,7], K mismatch");

    mt_tensor *bf = tensor2(gpu, MT_F32, 8, 3), *bi = tensor2(gpu, MT_I32, 8, 3), *cb = tensor2(gpu, MT_BF16, 4, 3);
    mt_tensor *af = tensor2(gpu, MT_F32, 4, 8);
    mt_error_clear();
    cr_assert_eq(mt_matmul(c, a, bf, 0, 0, 1.0f, 0.0f), -1, "bf16 x f32 is unsupported");
    cr_assert(strstr(mt_error_get(), "unsupported"), "error: %s", mt_error_get());
    cr_assert_eq(mt_matmul(c, a, bi, 0, 0, 1.0f, 0.0f), -1, "bf16 x i32 is unsupported");
    cr_assert_eq(mt_matmul(cb, af, bf, 0, 0, 1.0f, 0.0f), -1, "f32 x f32 -> bf16 is unsupported");
    mt_tensor_free(a), mt_tensor_free(b), mt_tensor_free(c), mt_tensor_free(bf), mt_tensor_free(bi);
    mt_tensor_free(cb), mt_tensor_free(af);
    mt_backend_free(gpu);
}

// ---------------------------------------------------------------------------------------------
// Memory

Test(cuda, upload_download_fill_zero) {
    mt_backend *gpu = gpu_or_skip();
    int64_t shape[1] = {1000003};
    mt_tensor *t = mt_tensor_new(gpu, MT_MEM_ACT, MT_U8, 1, shape);
    cr_assert_not_null(t, "%s", mt_error_get());
    uint8_t *src = mt_xmalloc(t->nbytes), *dst = mt_xmalloc(t->nbytes);
    for (size_t i = 0; i < t->nbytes; i++) src[i] = (uint8_t)(i * 131u + 7u);
    mt_tensor_upload(t, src);
    mt_tensor_download(t, dst);
    cr_assert_eq(memcmp(src, dst, t->nbytes), 0, "round trip changed the bytes");
    gpu->ops->fill_zero(gpu, t->data, t->nbytes);
    mt_tensor_download(t, dst);
    size_t nonzero = 0;
    for (size_t i = 0; i < t->nbytes; i++) nonzero += dst[i] != 0;
    cr_assert_eq(nonzero, 0, "%zu bytes not zero after fill_zero", nonzero);
    free(src), free(dst);
    mt_tensor_free(t);
    mt_backend_free(gpu);
}

Test(cuda, ledger_counts_and_returns) {
    mt_backend *gpu = gpu_or_skip();
    mt_ledger before = gpu->ledger;
    cr_assert_gt(before.cur[MT_MEM_WORK], 0, "the cuBLASLt workspace should show under work");
    cr_assert_eq(before.total_cur, before.cur[MT_MEM_WORK], "only the workspace is held at creation");

    int64_t s1[2] = {1024, 1024}, s2[1] = {12345}, s3[3] = {3, 5, 7};
    mt_tensor *t1 = mt_tensor_new(gpu, MT_MEM_BASE, MT_BF16, 2, s1);
    mt_tensor *t2 = mt_tensor_new(gpu, MT_MEM_GRAD, MT_F32, 1, s2);
    mt_tensor *t3 = mt_tensor_new(gpu, MT_MEM_ACT, MT_BF16, 3, s3);
    cr_assert(t1 && t2 && t3, "%s", mt_error_get());
    cr_assert_eq(gpu->ledger.cur[MT_MEM_BASE], before.cur[MT_MEM_BASE] + 1024 * 1024 * 2);
    cr_assert_eq(gpu->ledger.cur[MT_MEM_GRAD], before.cur[MT_MEM_GRAD] + 12345 * 4);
    cr_assert_eq(gpu->ledger.total_cur, before.total_cur + t1->nbytes + t2->nbytes + t3->nbytes);
    mt_tensor_free(t2);
    mt_tensor_free(t1);
    mt_tensor_free(t3);
    for (int c = 0; c < MT_MEM_COUNT; c++)
        cr_expect_eq(gpu->ledger.cur[c], before.cur[c], "category %s: %llu after, %llu before",
                     mt_mem_cat_name((mt_mem_cat)c), (unsigned long long)gpu->ledger.cur[c],
                     (unsigned long long)before.cur[c]);
    cr_assert_eq(gpu->ledger.total_cur, before.total_cur);
    mt_backend_free(gpu);
}

#ifdef MT_CUDA
// The ledger and the driver agree: a 256 MiB tensor takes 256 MiB (up to the allocator's
// rounding) of the driver's free memory. Where the device has memory pools, the backend's pool
// keeps freed memory (release threshold UINT64_MAX): after the free and a synchronisation the
// driver still counts it as used, a second allocation of the same size reuses it (the driver's
// free memory does not fall again), and cudaMemPoolTrimTo(pool, 0) gives it back.
Test(cuda, ledger_matches_driver) {
    mt_backend *gpu = gpu_or_skip();
    const size_t slack = 8u << 20;  // allocator granules (2 MiB pool steps, 512 B cudaMalloc)
    int pools = 0;
    cr_assert_eq(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, 0), cudaSuccess);
    if (getenv("MT_CUDA_SYNC_ALLOC")) pools = 0;
    size_t free0, free1, free2, free3, total;
    cr_assert_eq(cudaMemGetInfo(&free0, &total), cudaSuccess);
    int64_t shape[1] = {64 << 20};
    mt_tensor *t = mt_tensor_new(gpu, MT_MEM_ACT, MT_F32, 1, shape);
    cr_assert_not_null(t, "%s", mt_error_get());
    cr_assert_eq(cudaMemGetInfo(&free1, &total), cudaSuccess);
    cr_assert_eq(gpu->ledger.cur[MT_MEM_ACT], t->nbytes);
    size_t taken = free0 - free1;
    cr_expect(taken >= t->nbytes && taken <= t->nbytes + slack,
              "ledger says %zu bytes, the driver's free memory fell by %zu", t->nbytes, taken);
    mt_tensor_free(t);
    // A stream-ordered free (cudaFreeAsync) gives the bytes to the pool when the stream reaches
    // it: the synchronisation makes sure it has.
    gpu->ops->synchronize(gpu);
    cr_assert_eq(gpu->ledger.cur[MT_MEM_ACT], 0);
    cr_assert_eq(cudaMemGetInfo(&free2, &total), cudaSuccess);
    if (pools) {
        cr_expect(free2 + t->nbytes <= free0 + slack,
                  "the pool should keep the freed %zu bytes: %zu free before the allocation, %zu after the free",
                  t->nbytes, free0, free2);
        mt_tensor *again = mt_tensor_new(gpu, MT_MEM_ACT, MT_F32, 1, shape);
        cr_assert_not_null(again, "%s", mt_error_get());
        cr_assert_eq(cudaMemGetInfo(&free3, &total), cudaSuccess);
        cr_expect(free3 + slack >= free2, "a second allocation of the freed size should reuse the pool's memory: the "
                  "driver's free memory fell from %zu to %zu", free2, free3);
        mt_tensor_free(again);  // queued on the stream: mt_cuda_mem_trim waits for it, then trims
        cr_assert_eq(mt_cuda_mem_trim(gpu), 0, "%s", mt_error_get());
        cr_assert_eq(cudaMemGetInfo(&free2, &total), cudaSuccess);
    }
    cr_expect(free2 + slack >= free0, "the driver did not get the memory back: %zu free before, %zu after", free0,
              free2);
    mt_backend_free(gpu);
}
#endif

// A refused device allocation: -1 with the bytes, the ledger and the driver's figures, and the
// ledger unchanged.
Test(cuda, alloc_failure_reports_and_leaves_ledger) {
    mt_backend *gpu = gpu_or_skip();
    mt_ledger before = gpu->ledger;
    int64_t shape[1] = {(int64_t)1 << 50};  // 1 PiB
    mt_error_clear();
    mt_tensor *t = mt_tensor_new(gpu, MT_MEM_ACT, MT_U8, 1, shape);
    cr_assert_null(t, "a 1 PiB allocation should fail");
    const char *msg = mt_error_get();
    cr_expect(strstr(msg, "1125899906842624"), "message should give the bytes asked: %s", msg);
    cr_expect(strstr(msg, "ledger"), "message should give the ledger figures: %s", msg);
    cr_expect(strstr(msg, "free of"), "message should give the driver's free/total: %s", msg);
    cr_assert_eq(gpu->ledger.total_cur, before.total_cur, "ledger changed by a failed allocation");
    // The device still works afterwards (the failure was not sticky).
    int64_t small[1] = {16};
    mt_tensor *ok = mt_tensor_new(gpu, MT_MEM_ACT, MT_F32, 1, small);
    cr_assert_not_null(ok, "%s", mt_error_get());
    mt_tensor_free(ok);
    mt_backend_free(gpu);
}

// ---------------------------------------------------------------------------------------------
// The dequantize kernel's traffic (quant/qweight.h): every byte the weight holds on its backend
// (the ledger's count, from the tensors really allocated), the shared 1 KiB nested map with
// double quantization, and the elements written. Runs on the cpu backend: a count, no kernel.
Test(cuda, dequant_bytes_match_the_weight) {
    mt_backend *cpu = mt_backend_cpu_new();
    const int64_t out = 96, in = 200, n = out * in;  // 300 blocks of 64: two nested blocks, the last partial
    float *w = mt_xmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) w[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    const struct { mt_quant type; int dq; mt_dtype dst; uint64_t extra; } cases[] = {
        {MT_QUANT_NF4, 1, MT_BF16, 1024 + 2 * (uint64_t)n},
        {MT_QUANT_NF4, 0, MT_F32, 4 * (uint64_t)n},
        {MT_QUANT_INT4, 0, MT_BF16, 2 * (uint64_t)n},
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(cases); i++) {
        mt_qweight q;
        cr_assert_eq(mt_qweight_quantize(&q, cpu, "t", w, out, in, cases[i].type, 0, cases[i].dq), 0, "%s",
                     mt_error_get());
        uint64_t got = mt_qweight_dequant_bytes(&q, cases[i].dst), want = mt_qweight_bytes(&q) + cases[i].extra;
        cr_expect_eq(got, want, "%s dq=%d -> %s: %llu bytes, the weight holds %llu (+ %llu map and output)",
                     mt_quant_name(cases[i].type), cases[i].dq, mt_dtype_name(cases[i].dst), (unsigned long long)got,
                     (unsigned long long)mt_qweight_bytes(&q), (unsigned long long)cases[i].extra);
        mt_qweight_free(&q);
    }
    // Mixtral's w2 [4096, 14336], NF4 double quant, bf16: codes n/2, one 8-bit code per 64-block,
    // one fp32 nested absmax per 256 blocks, the map, 2 bytes an element.
    uint64_t N = 4096ull * 14336ull, blocks = N / 64;
    cr_expect_eq(mt_qweight_dequant_bytes_of(MT_QUANT_NF4, 4096, 14336, 64, 1, MT_BF16),
                 N / 2 + blocks + 4 * ((blocks + 255) / 256) + 1024 + 2 * N);
    free(w);
    mt_backend_free(cpu);
}
