// quant/ on the GPU against its CPU reference: quantize and dequantize bit for bit, the expert
// matmul path (dequantize into a bf16 scratch + cuBLASLt) to bf16 accuracy. Every test skips,
// saying why, in a CPU build or without a GPU.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tests/gpu_or_skip.h"
#include "core/backend.h"
#include "core/common.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "quant/quant.h"


static void *host_copy(const mt_tensor *t) {
    if (!t) return NULL;
    void *h = mt_xmalloc(t->nbytes ? t->nbytes : 1);
    mt_tensor_download(t, h);
    return h;
}

// The first differing byte of two tensors of two backends, or -1.
static int64_t first_diff(const mt_tensor *a, const mt_tensor *b) {
    if (!a || !b) return a == b ? -1 : 0;
    if (a->nbytes != b->nbytes) return 0;
    uint8_t *x = host_copy(a), *y = host_copy(b);
    int64_t at = -1;
    for (size_t i = 0; i < a->nbytes && at < 0; i++)
        if (x[i] != y[i]) at = (int64_t)i;
    free(x), free(y);
    return at;
}

static void *source(int64_t n, mt_dtype dt, uint64_t seed) {
    mt_rng r;
    mt_rng_seed(&r, seed, 0);
    float *f = mt_xmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) f[i] = mt_rng_normal(&r) * 0.02f;
    if (n > 70) f[70] = 0.3f;  // an outlier
    if (dt == MT_F32) return f;
    void *h = mt_xmalloc((size_t)n * 2);
    mt_convert(h, dt, f, MT_F32, (size_t)n);
    free(f);
    return h;
}

#ifdef MT_CUDA
enum { DEQ_KERNELS = 2 };
#else
enum { DEQ_KERNELS = 1 };
#endif

Test(quant_cuda, quantize_and_dequantize_bit_for_bit, .timeout = 120) {
    mt_backend *gpu = gpu_or_skip(), *cpu = mt_backend_cpu_new();
    static const int64_t shapes[][2] = {{77, 91}, {512, 1024}, {4096, 4097}};  // odd; aligned; > one upload
    for (size_t s = 0; s < MT_ARRAY_LEN(shapes); s++)
        for (int t = 0; t < 3; t++)
            for (int dq = 0; dq < 2; dq++)
                for (int src = 0; src < 2; src++) {
                    if (t == MT_QUANT_INT4 && dq) continue;
                    if (s == 2 && (src || dq)) continue;  // the big one: once per format
                    int64_t out = shapes[s][0], in = shapes[s][1], n = out * in;
                    mt_dtype dt = src ? MT_BF16 : MT_F32;
                    void *w = source(n, dt, 100 + s);
                    mt_qweight a, b;
                    char what[96];
                    snprintf(what, sizeof what, "%s dq=%d %s [%lld, %lld]", mt_qformats[t].name, dq, mt_dtype_name(dt),
                             (long long)out, (long long)in);
                    cr_assert_eq(mt_qweight_quantize_from(&a, cpu, "w", w, dt, out, in, (mt_quant)t, 0, dq, NULL), 0);
                    cr_assert_eq(mt_qweight_quantize_from(&b, gpu, "w", w, dt, out, in, (mt_quant)t, 0, dq, NULL), 0,
                                 "%s: %s", what, mt_error_get());
                    int64_t d;
                    cr_expect_eq(d = first_diff(a.packed, b.packed), -1, "%s: packed byte %lld", what, (long long)d);
                    cr_expect_eq(d = first_diff(a.absmax, b.absmax), -1, "%s: absmax byte %lld", what, (long long)d);
                    cr_expect_eq(first_diff(a.zero, b.zero), -1, "%s: zero", what);
                    cr_expect_eq(first_diff(a.nested_absmax, b.nested_absmax), -1, "%s: nested absmax", what);
                    cr_expect(memcmp(&a.offset, &b.offset, 4) == 0, "%s: offset", what);
                    cr_expect_eq(gpu->ledger.cur[MT_MEM_BASE], mt_qweight_bytes(&b), "%s: ledger", what);
                    // Dequantize: whole (16-byte vector path) and from an odd element (scalar path),
                    // by each whole-weight kernel (quant/quant.h mt_dequant_cuda_kernel).
                    for (int o = 0; o < 2 * DEQ_KERNELS; o++) {
#ifdef MT_CUDA
                        mt_dequant_cuda_kernel(o / 2);
#endif
                        mt_dtype odt = o % 2 ? MT_BF16 : MT_F32;
                        size_t es = o % 2 ? 2 : 4;
                        int64_t sh[1] = {n};
                        mt_tensor *dst = mt_tensor_new(gpu, MT_MEM_WORK, odt, 1, sh);
                        cr_assert_not_null(dst);
                        cr_assert_eq(mt_qweight_dequantize(&b, dst), 0, "%s", mt_error_get());
                        uint8_t *got = host_copy(dst), *want = mt_xmalloc((size_t)n * es);
                        if (o % 2) mt_qweight_dequantize_rows_bf16_cpu(&a, (uint16_t *)want, 0, out);
                        else mt_qweight_dequantize_rows_cpu(&a, (float *)want, 0, out);
                        int64_t bad = -1;
                        for (int64_t i = 0; i < n && bad < 0; i++)
                            if (memcmp(got + i * es, want + i * es, es) != 0) bad = i;
                        cr_expect_eq(bad, -1, "%s -> %s (kernel %d): element %lld differs", what, mt_dtype_name(odt), o / 2,
                                     (long long)bad);
#ifdef MT_CUDA
                        mt_qweight_dequantize_cuda(&b, dst->data, odt, 5, n - 3);
                        free(got);
                        got = host_copy(dst);
                        cr_expect_eq(memcmp(got, want + 5 * es, (size_t)(n - 8) * es), 0, "%s: range [5, n-3)", what);
#endif
                        free(got), free(want);
                        mt_tensor_free(dst);
                    }
#ifdef MT_CUDA
                    mt_dequant_cuda_kernel(0);
#endif
                    mt_qweight_free(&a), mt_qweight_free(&b);
                    free(w);
                }
    mt_backend_free(cpu);
    mt_backend_free(gpu);
}

// A whole weight into rows wider than its own (mt_qweight_dequantize_rows_cuda_on: the experts'
// slot with a LoRA's B beside W): every format, each whole-weight kernel, bf16 and f32, rows of
// 40 (not a power of two; 120 elements: the tail kernel's part), 768 and 1024 at strides 8 and
// 32 wider; each row's first `in` values bit for bit with the CPU, the room beside untouched.
// Refusals name the shape.
Test(quant_cuda, dequant_into_wider_rows_bit_for_bit, .timeout = 120) {
#ifdef MT_CUDA
    mt_backend *gpu = gpu_or_skip(), *cpu = mt_backend_cpu_new();
    static const int64_t shapes[][2] = {{3, 40}, {24, 768}, {40, 1024}};
    static const int types[][2] = {{MT_QUANT_NF4, 1}, {MT_QUANT_FP4, 0}, {MT_QUANT_INT4, 0}, {MT_QUANT_MXFP4, 0}};
    for (size_t s = 0; s < MT_ARRAY_LEN(shapes); s++)
        for (size_t t = 0; t < MT_ARRAY_LEN(types); t++)
            for (int wide = 8; wide <= 32; wide += 24)
                for (int o = 0; o < 4; o++) {
                    const int64_t out = shapes[s][0], in = shapes[s][1], ldd = in + wide, n = out * in;
                    if (types[t][0] == MT_QUANT_MXFP4 && in % 32) continue;  // MXFP4's blocks are 32 wide
                    mt_dtype odt = o % 2 ? MT_BF16 : MT_F32;
                    const size_t es = o % 2 ? 2 : 4;
                    float *w = source(n, MT_F32, 300 + s);
                    mt_qweight a, g;
                    cr_assert_eq(mt_qweight_quantize_from(&a, cpu, "w", w, MT_F32, out, in, (mt_quant)types[t][0], 0,
                                                          types[t][1], NULL), 0, "%s", mt_error_get());
                    cr_assert_eq(mt_qweight_quantize_from(&g, gpu, "w", w, MT_F32, out, in, (mt_quant)types[t][0], 0,
                                                          types[t][1], NULL), 0, "%s", mt_error_get());
                    uint8_t *want = mt_xmalloc((size_t)n * es), *init = mt_xmalloc((size_t)(out * ldd) * es);
                    if (o % 2) mt_qweight_dequantize_rows_bf16_cpu(&a, (uint16_t *)want, 0, out);
                    else mt_qweight_dequantize_rows_cpu(&a, (float *)want, 0, out);
                    for (size_t i = 0; i < (size_t)(out * ldd) * es; i++) init[i] = (uint8_t)(0x5a ^ i);
                    int64_t sh[1] = {out * ldd};
                    mt_tensor *dst = mt_tensor_new(gpu, MT_MEM_WORK, odt, 1, sh);
                    cr_assert_not_null(dst);
                    mt_tensor_upload(dst, init);
                    mt_dequant_cuda_kernel(o / 2);
                    cr_assert_eq(mt_qweight_dequantize_rows_cuda_on(&g, dst->data, odt, ldd, NULL), 0, "%s",
                                 mt_error_get());
                    uint8_t *got = host_copy(dst);
                    int64_t bad = -1;
                    for (int64_t i = 0; i < out * ldd && bad < 0; i++) {
                        int64_t r = i / ldd, c = i % ldd;
                        const uint8_t *ref = c < in ? want + (size_t)(r * in + c) * es : init + (size_t)i * es;
                        if (memcmp(got + (size_t)i * es, ref, es) != 0) bad = i;
                    }
                    cr_expect_eq(bad, -1, "%s [%lld, %lld] at stride %lld -> %s, kernel %d: element %lld (row %lld, col %lld)",
                                 mt_qformats[types[t][0]].name, (long long)out, (long long)in, (long long)ldd,
                                 mt_dtype_name(odt), o / 2, (long long)bad, (long long)(bad / ldd), (long long)(bad % ldd));
                    mt_dequant_cuda_kernel(0);
                    free(got), free(want), free(init), free(w);
                    mt_tensor_free(dst);
                    mt_qweight_free(&a), mt_qweight_free(&g);
                }
    mt_qweight g;
    float *w = source(24 * 40, MT_F32, 9);
    cr_assert_eq(mt_qweight_quantize_from(&g, gpu, "w", w, MT_F32, 24, 40, MT_QUANT_NF4, 0, 1, NULL), 0);
    int64_t sh[1] = {24 * 64};
    mt_tensor *dst = mt_tensor_new(gpu, MT_MEM_WORK, MT_BF16, 1, sh);
    cr_assert_eq(mt_qweight_dequantize_rows_cuda_on(&g, dst->data, MT_BF16, 44, NULL), -1);
    cr_expect(strstr(mt_error_get(), "[24, 40] at a row stride of 44") != NULL, "%s", mt_error_get());
    cr_assert_eq(mt_qweight_dequantize_rows_cuda_on(&g, dst->data, MT_BF16, 32, NULL), -1);
    mt_tensor_free(dst);
    mt_qweight_free(&g);
    free(w);
    mt_backend_free(cpu);
    mt_backend_free(gpu);
#else
    cr_skip_test("a CPU build: the CUDA dequantization kernels are not built");
#endif
}

// The whole-weight kernels at other blocksizes (128 and 2048: dequant8_kernel's item strides
// cross blocks differently; 4096: the launcher's fall-back to dequant32_kernel, as 8 · 256 is not
// a multiple of it) and from element 64 (the vector path with i0 > 0): bit for bit with the CPU.
Test(quant_cuda, dequant_blocksizes_and_offsets_bit_for_bit, .timeout = 120) {
#ifdef MT_CUDA
    mt_backend *gpu = gpu_or_skip(), *cpu = mt_backend_cpu_new();
    const int64_t out = 64, in = 4096, n = out * in, i0 = 64;
    float *w = source(n, MT_F32, 7);
    uint16_t *want = mt_xmalloc((size_t)n * 2);
    int64_t sh[1] = {n};
    mt_tensor *dst = mt_tensor_new(gpu, MT_MEM_WORK, MT_BF16, 1, sh);
    cr_assert_not_null(dst);
    static const int sizes[] = {128, 2048, 4096};
    for (size_t b = 0; b < MT_ARRAY_LEN(sizes); b++)
        for (int t = 0; t < 2; t++) {  // NF4 with double quant, FP4 without
            mt_qweight a, g;
            cr_assert_eq(mt_qweight_quantize_from(&a, cpu, "w", w, MT_F32, out, in, (mt_quant)t, sizes[b], !t, NULL), 0,
                         "%s", mt_error_get());
            cr_assert_eq(mt_qweight_quantize_from(&g, gpu, "w", w, MT_F32, out, in, (mt_quant)t, sizes[b], !t, NULL), 0,
                         "%s", mt_error_get());
            mt_qweight_dequantize_rows_bf16_cpu(&a, want, 0, out);
            for (int k = 0; k < 2; k++) {
                mt_dequant_cuda_kernel(k);
                mt_qweight_dequantize_cuda(&g, dst->data, MT_BF16, i0, n);
                uint16_t *got = host_copy(dst);
                int64_t bad = -1;
                for (int64_t i = 0; i < n - i0 && bad < 0; i++)
                    if (got[i] != want[i0 + i]) bad = i0 + i;
                cr_expect_eq(bad, -1, "%s blocksize %d, kernel %d: element %lld differs", mt_qformats[t].name, sizes[b],
                             k, (long long)bad);
                free(got);
            }
            mt_dequant_cuda_kernel(0);
            mt_qweight_free(&a), mt_qweight_free(&g);
        }
    mt_tensor_free(dst);
    free(w), free(want);
    mt_backend_free(cpu);
    mt_backend_free(gpu);
#else
    cr_skip_test("a CPU build: the CUDA dequantization kernels are not built");
#endif
}

// Expert path: y = x·Wᵀ and dx = dy·W + dx through one bf16 scratch and cuBLASLt, against the
// CPU's fp32 product with the same bf16-rounded weights: bf16 accuracy.
Test(quant_cuda, expert_matmul_through_scratch) {
    mt_backend *gpu = gpu_or_skip(), *cpu = mt_backend_cpu_new();
    int64_t out = 1024, in = 512, n = 64;
    float *w = source(out * in, MT_F32, 7), *x = source(n * in, MT_F32, 8);
    for (int64_t i = 0; i < n * in; i++) x[i] = mt_bf16_to_f32(mt_f32_to_bf16(x[i] * 50));
    mt_qweight qc, qg;
    cr_assert_eq(mt_qweight_quantize(&qc, cpu, "w1", w, out, in, MT_QUANT_NF4, 64, 1), 0);
    cr_assert_eq(mt_qweight_quantize(&qg, gpu, "w1", w, out, in, MT_QUANT_NF4, 64, 1), 0, "%s", mt_error_get());
    uint16_t *xb = mt_xmalloc((size_t)(n * in) * 2);
    mt_convert(xb, MT_BF16, x, MT_F32, (size_t)(n * in));
    int64_t sx[2] = {n, in}, sy[2] = {n, out}, ss[1] = {out * in};
    mt_tensor *gx = mt_tensor_new(gpu, MT_MEM_ACT, MT_BF16, 2, sx), *gy = mt_tensor_new(gpu, MT_MEM_ACT, MT_F32, 2, sy);
    mt_tensor *scratch = mt_tensor_new(gpu, MT_MEM_WORK, MT_BF16, 1, ss);
    mt_tensor_upload(gx, xb);
    cr_assert_eq(mt_qweight_matmul(gy, gx, &qg, scratch, 0.0f), 0, "%s", mt_error_get());
    float *y = host_copy(gy), *wd = mt_xmalloc((size_t)(out * in) * 4);
    uint16_t *wb = mt_xmalloc((size_t)(out * in) * 2);
    mt_qweight_dequantize_rows_bf16_cpu(&qc, wb, 0, out);
    for (int64_t i = 0; i < out * in; i++) wd[i] = mt_bf16_to_f32(wb[i]);
    double worst = 0;
    for (int64_t t = 0; t < n; t++)
        for (int64_t o = 0; o < out; o++) {
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < in; k++) ref += (double)x[t * in + k] * wd[o * in + k], mag += fabs((double)x[t * in + k] * wd[o * in + k]);
            double err = fabs(y[t * out + o] - ref) / (mag + 1e-20);
            worst = fmax(worst, err);
        }
    cr_log_info("expert matmul (cuda, bf16 scratch): worst |error| / Σ|x·w| = %.3g", worst);
    cr_expect_lt(worst, 1e-5, "fp32 accumulation of exact bf16 products");
    free(y);
    mt_tensor_free(gx), mt_tensor_free(gy), mt_tensor_free(scratch);
    mt_qweight_free(&qc), mt_qweight_free(&qg);
    free(w), free(x), free(xb), free(wd), free(wb);
    mt_backend_free(cpu);
    mt_backend_free(gpu);
}

// A bitsandbytes serialisation imported straight onto the GPU dequantizes as bitsandbytes does.
Test(quant_cuda, imported_fixture_dequantizes_as_bitsandbytes) {
    mt_backend *gpu = gpu_or_skip();
    mt_st_file f;
    cr_assert_eq(mt_st_file_open(&f, MT_REPO_ROOT "/tests/data/quant/nf4_bs64_dq.safetensors"), 0, "%s", mt_error_get());
    mt_bnb_parts p = {.weight = mt_st_file_find(&f, "weight"), .absmax = mt_st_file_find(&f, "absmax"),
                      .quant_map = mt_st_file_find(&f, "quant_map"), .nested_absmax = mt_st_file_find(&f, "nested_absmax"),
                      .nested_quant_map = mt_st_file_find(&f, "nested_quant_map"),
                      .quant_state = mt_st_file_find(&f, "quant_state.bitsandbytes__nf4"),
                      .quant_state_key = "quant_state.bitsandbytes__nf4"};
    mt_qweight q;
    cr_assert_eq(mt_qweight_import(&q, gpu, "fixture", &p), 0, "%s", mt_error_get());
    int64_t n = q.out * q.in, sh[1] = {n};
    mt_tensor *dst = mt_tensor_new(gpu, MT_MEM_WORK, MT_F32, 1, sh);
    cr_assert_eq(mt_qweight_dequantize(&q, dst), 0);
    float *got = host_copy(dst);
    const mt_st_tensor *want = mt_st_file_find(&f, "dequant_f32");
    cr_expect_eq(memcmp(got, want->data, (size_t)n * 4), 0, "dequantized on the GPU = bitsandbytes");
    free(got);
    mt_tensor_free(dst);
    mt_qweight_free(&q);
    mt_st_file_close(&f);
    mt_backend_free(gpu);
}
