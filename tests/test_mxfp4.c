// MXFP4 (quant/mxfp4.c, quant/formats.h): dequantization bit for bit against transformers'
// convert_moe_packed_tensors, quantization byte for byte against downcast_to_mxfp_torch's rule
// (tests/data/quant/mxfp4_*.safetensors, made by scripts/make_mxfp4_fixtures.py), round-trip
// bounds, the matmuls, refusals, the planner's 4.25 bits, the flag and the export names; and the
// CUDA twins against the CPU (suite quant_cuda: skipped, saying why, without a GPU).
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tests/fixture_file.h"
#include "tests/gpu_or_skip.h"
#include "core/backend.h"
#include "core/common.h"
#include "core/gemm.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "plan/plan.h"
#include "quant/quant.h"
#include "trainer/options.h"

#define FIXTURES MT_REPO_ROOT "/tests/data/quant/"

// The first element where got and want differ as fp32 bit patterns (NaN matching any NaN), or -1.
static int64_t first_bit_diff(const float *got, const float *want, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (isnan(got[i]) ? !isnan(want[i]) : f32_bits(got[i]) != f32_bits(want[i])) return i;
    return -1;
}

static float *gaussian(int64_t n, float sd, uint64_t seed) {
    mt_rng r;
    mt_rng_seed(&r, seed, 0);
    float *x = mt_xmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = mt_rng_normal(&r) * sd;
    return x;
}

// ---------------------------------------------------------------------------------------------
// Definition

Test(mxfp4, e8m0_and_e2m1_definitions) {
    // ldexp(v, e − 127) for every byte, against the C library's ldexpf (exact, or ±inf)
    for (unsigned e = 0; e < 256; e++)
        for (int k = 0; k < 16; k++) {
            float want = ldexpf(mt_e2m1_map[k], (int)e - 127), got = mt_mxfp4_value(mt_e2m1_map[k], e);
            cr_assert_eq(f32_bits(got), f32_bits(want), "e=%u code %d: %a vs ldexpf's %a", e, k, got, want);
        }
    cr_expect(isinf(mt_mxfp4_value(1.0f, 255)) && mt_mxfp4_value(0.5f, 255) == 0x1p127f);
    cr_expect(mt_mxfp4_value(0.5f, 0) == 0x1p-128f && signbit(mt_mxfp4_value(-0.0f, 255)));
    // the quantizer's decisions: nearest, ties away from zero, saturating, the sign of zero kept
    static const struct { float q; unsigned code; } c[] = {
        {0.0f, 0}, {-0.0f, 8}, {0.2499f, 0}, {0.25f, 1}, {-0.25f, 9}, {0.75f, 2}, {1.25f, 3}, {1.2499f, 2},
        {1.75f, 4}, {2.5f, 5}, {3.5f, 6}, {5.0f, 7}, {4.99f, 6}, {6.0f, 7}, {6.5f, 7}, {1e30f, 7}, {-1e-30f, 8},
        {0x1p-140f, 0}};
    for (size_t i = 0; i < MT_ARRAY_LEN(c); i++)
        cr_expect_eq(mt_e2m1_code(c[i].q), c[i].code, "code of %a: %u, not %u", c[i].q, mt_e2m1_code(c[i].q), c[i].code);
    cr_expect_eq(mt_mxfp4_scale_of(0.0f), 0u);
    cr_expect_eq(mt_mxfp4_scale_of(6.0f), 127u);      // exactly 6 · 2^0
    cr_expect_eq(mt_mxfp4_scale_of(6.0001f), 128u);   // just above: rounded up
    cr_expect_eq(mt_mxfp4_scale_of(0x1p-140f), 1u);   // a subnormal amax / 6 -> 2^-126
    cr_expect_eq(mt_mxfp4_scale_of(3.4e38f), 253u);   // never 255
    cr_expect(mt_mxfp4_inv_scale(127) == 1.0f && mt_mxfp4_inv_scale(1) == 0x1p126f && mt_mxfp4_inv_scale(0) == 0.0f);
    cr_expect_eq(mt_q4_weight_bytes(MT_QUANT_MXFP4, 4096, 32, 1), 2048u + 128u, "no double quant, 4.25 bits");
}

// ---------------------------------------------------------------------------------------------
// Against transformers

Test(mxfp4, dequantization_is_transformers_bit_for_bit) {
    mt_st_file f;
    cr_assert_eq(mt_st_file_open(&f, FIXTURES "mxfp4_dequant.safetensors"), 0, "%s", mt_error_get());
    const mt_st_tensor *tb = st_need(&f, "blocks"), *ts = st_need(&f, "scales");
    const mt_st_tensor *tf = st_need(&f, "deq_f32"), *th = st_need(&f, "deq_bf16");
    cr_assert_eq(tb->ndim, 4);
    int64_t E = tb->shape[0], out = tb->shape[1], in = tb->shape[2] * 32, per = out * in;
    uint8_t *blocks = st_copy(tb), *scales = st_copy(ts);
    float *want = st_copy(tf);
    uint16_t *want_h = st_copy(th);
    mt_backend *cpu = mt_backend_cpu_new();
    int nan = 0, inf = 0, sub = 0;
    for (int64_t e = 0; e < E; e++) {
        mt_qweight q;
        char name[64];
        snprintf(name, sizeof name, "model.layers.0.mlp.experts.%lld.down_proj.weight", (long long)e);
        cr_assert_eq(mt_qweight_from_mxfp4(&q, cpu, name, blocks + e * per / 2, (size_t)per / 2, scales + e * per / 32,
                                           (size_t)per / 32, out, in), 0, "%s", mt_error_get());
        cr_expect_eq(memcmp(q.packed->data, blocks + e * per / 2, (size_t)per / 2), 0, "bytes kept as stored");
        float *got = mt_xmalloc((size_t)per * sizeof(float));
        uint16_t *got_h = mt_xmalloc((size_t)per * 2);
        mt_qweight_dequantize_rows_cpu(&q, got, 0, out);
        mt_qweight_dequantize_rows_bf16_cpu(&q, got_h, 0, out);
        int64_t d = first_bit_diff(got, want + e * per, per);
        cr_expect_eq(d, -1, "expert %lld element %lld: %a, transformers %a", (long long)e, (long long)d,
                     d >= 0 ? got[d] : 0.0, d >= 0 ? want[e * per + d] : 0.0);
        for (int64_t i = 0; i < per; i++) {
            nan += isnan(got[i]), inf += isinf(got[i]), sub += got[i] != 0 && fabsf(got[i]) < 0x1p-126f;
            uint16_t w = want_h[e * per + i];
            int same = (got_h[i] & 0x7fff) > 0x7f80 ? (w & 0x7fff) > 0x7f80 : got_h[i] == w;
            if (!same) {
                cr_expect(0, "expert %lld element %lld: bf16 %04x, transformers %04x", (long long)e, (long long)i,
                          got_h[i], w);
                break;
            }
        }
        // the scalar reference over an odd range (a low-nibble start, a partial block)
        mt_mxfp4_dequantize_ref(q.packed->data, q.absmax->data, 33, per - 7, got);
        d = first_bit_diff(got, want + e * per + 33, per - 40);
        cr_expect_eq(d, -1, "range [33, n-7): element %lld", (long long)d);
        free(got), free(got_h);
        mt_qweight_free(&q);
    }
    cr_expect(inf > 0 && sub > 0 && nan == 0, "the fixture covers inf (%d) and subnormals (%d); e8m0 255 gives no NaN (%d)",
              inf, sub, nan);
    free(blocks), free(scales), free(want), free(want_h);
    mt_backend_free(cpu);
    mt_st_file_close(&f);
}

Test(mxfp4, quantization_is_the_references_byte_for_byte) {
    mt_st_file f;
    cr_assert_eq(mt_st_file_open(&f, FIXTURES "mxfp4_quant.safetensors"), 0, "%s", mt_error_get());
    const mt_st_tensor *tw = st_need(&f, "w");
    int64_t out = tw->shape[0], in = tw->shape[1], n = out * in;
    uint16_t *w = st_copy(tw);
    uint8_t *blocks = st_copy(st_need(&f, "blocks")), *scales = st_copy(st_need(&f, "scales"));
    float *w32 = mt_xmalloc((size_t)n * sizeof(float));
    mt_convert(w32, MT_F32, w, MT_BF16, (size_t)n);
    mt_backend *cpu = mt_backend_cpu_new();
    for (int src = 0; src < 2; src++) {  // bf16 as stored, and the same values as f32
        mt_qweight q;
        cr_assert_eq(mt_qweight_quantize_from(&q, cpu, "w", src ? (const void *)w32 : w, src ? MT_F32 : MT_BF16, out, in,
                                              MT_QUANT_MXFP4, 0, 1, NULL), 0, "%s", mt_error_get());
        cr_expect_eq(q.blocksize, 32);
        cr_expect_eq(q.double_quant, 0);
        for (int64_t i = 0; i < n / 2; i++)
            if (((uint8_t *)q.packed->data)[i] != blocks[i]) {
                cr_expect(0, "src %d: byte %lld is %02x, the reference's %02x", src, (long long)i,
                          ((uint8_t *)q.packed->data)[i], blocks[i]);
                break;
            }
        cr_expect_eq(memcmp(q.absmax->data, scales, (size_t)n / 32), 0, "src %d: the e8m0 scales", src);
        mt_qweight_free(&q);
    }
    free(w), free(w32), free(blocks), free(scales);
    mt_backend_free(cpu);
    mt_st_file_close(&f);
}

// ---------------------------------------------------------------------------------------------
// Round trip, matmuls

Test(mxfp4, round_trip_within_half_the_largest_gap) {
    int64_t out = 64, in = 256, n = out * in;
    float *w = gaussian(n, 0.02f, 5);
    w[77] = 0.4f;  // an outlier block
    mt_backend *cpu = mt_backend_cpu_new();
    mt_qweight q;
    cr_assert_eq(mt_qweight_quantize(&q, cpu, "w", w, out, in, MT_QUANT_MXFP4, 32, 0), 0, "%s", mt_error_get());
    float *x = mt_xmalloc((size_t)n * sizeof(float));
    mt_qweight_dequantize_rows_cpu(&q, x, 0, out);
    double se = 0, ss = 0;
    for (int64_t i = 0; i < n; i++) {
        // |x - x̂| <= scale (half of e2m1's widest gap, 4 -> 6, times the scale); x/scale <= 6
        float scale = ldexpf(1.0f, ((uint8_t *)q.absmax->data)[i / 32] - 127);
        cr_assert(fabsf(x[i] - w[i]) <= scale, "element %lld: %g -> %g (scale %g)", (long long)i, w[i], x[i], scale);
        se += (double)(x[i] - w[i]) * (x[i] - w[i]), ss += (double)w[i] * w[i];
    }
    double rel = sqrt(se / ss);
    cr_expect(rel > 0.05 && rel < 0.2, "relative RMS error %.4f (gaussian weights: about 0.1)", rel);
    mt_qweight_free(&q);
    free(w), free(x);
    mt_backend_free(cpu);
}

Test(mxfp4, matmuls_equal_the_dequantized_weights) {
    int64_t out = 48, in = 96, n = 5;
    float *w = gaussian(out * in, 0.05f, 9), *x = gaussian(n * in, 1.0f, 10), *dy = gaussian(n * out, 1.0f, 11);
    mt_backend *cpu = mt_backend_cpu_new();
    mt_qweight q;
    cr_assert_eq(mt_qweight_quantize(&q, cpu, "w", w, out, in, MT_QUANT_MXFP4, 0, 0), 0, "%s", mt_error_get());
    float *W = mt_xmalloc((size_t)(out * in) * sizeof(float));
    mt_qweight_dequantize_rows_cpu(&q, W, 0, out);
    float *y = mt_xcalloc((size_t)(n * out), sizeof(float)), *y_ref = mt_xcalloc((size_t)(n * out), sizeof(float));
    float *dx = mt_xcalloc((size_t)(n * in), sizeof(float)), *dx_ref = mt_xcalloc((size_t)(n * in), sizeof(float));
    cr_assert_eq(mt_qweight_matmul_cpu(y, x, &q, n, 0), 0);
    cr_assert_eq(mt_qweight_matmul_t_cpu(dx, dy, &q, n), 0);
    // one tile holds all of W here: the same sgemm calls on the same values
    mt_sgemm(0, 1, (int)n, (int)out, (int)in, 1.0f, x, (int)in, W, (int)in, 0.0f, y_ref, (int)out);
    mt_sgemm(0, 0, (int)n, (int)in, (int)out, 1.0f, dy, (int)out, W, (int)in, 1.0f, dx_ref, (int)in);
    cr_expect_eq(memcmp(y, y_ref, (size_t)(n * out) * 4), 0, "y = x·Wᵀ");
    cr_expect_eq(memcmp(dx, dx_ref, (size_t)(n * in) * 4), 0, "dx += dy·W");
    cr_expect_eq(cpu->ledger.cur[MT_MEM_WORK], 0, "the tile is released");
    mt_qweight_free(&q);
    free(w), free(x), free(dy), free(W), free(y), free(y_ref), free(dx), free(dx_ref);
    mt_backend_free(cpu);
}

// ---------------------------------------------------------------------------------------------
// Refusals, sizes, flags, export

Test(mxfp4, bad_sizes_are_refused_naming_the_tensor) {
    mt_backend *cpu = mt_backend_cpu_new();
    uint8_t blocks[4 * 50] = {0}, scales[16] = {0};
    mt_qweight q;
    cr_expect_eq(mt_qweight_from_mxfp4(&q, cpu, "gate_up_proj", blocks, 200, scales, 12, 4, 100), -1);
    cr_expect(strstr(mt_error_get(), "gate_up_proj") && strstr(mt_error_get(), "multiple of 32"), "%s", mt_error_get());
    cr_expect_eq(mt_qweight_from_mxfp4(&q, cpu, "down_proj", blocks, 200, scales, 16, 4, 64), -1);  // 128 + 8 wanted
    cr_expect(strstr(mt_error_get(), "down_proj") && strstr(mt_error_get(), "got 200 and 16"), "%s", mt_error_get());
    cr_expect_eq(mt_qweight_from_mxfp4(&q, cpu, "down_proj", NULL, 128, scales, 8, 4, 64), -1);
    cr_expect_eq(cpu->ledger.cur[MT_MEM_BASE], 0, "nothing allocated");
    float w[4 * 33] = {0};
    cr_expect_eq(mt_qweight_quantize(&q, cpu, "w33", w, 4, 33, MT_QUANT_MXFP4, 0, 0), -1);
    cr_expect(strstr(mt_error_get(), "w33") != NULL, "%s", mt_error_get());
    cr_expect_eq(mt_qweight_quantize(&q, cpu, "w64", w, 2, 64, MT_QUANT_MXFP4, 64, 0), -1);
    cr_expect(strstr(mt_error_get(), "w64") && strstr(mt_error_get(), "32"), "%s", mt_error_get());
    w[40] = NAN;
    cr_expect_eq(mt_qweight_quantize(&q, cpu, "wnan", w, 2, 64, MT_QUANT_MXFP4, 0, 0), -1);
    cr_expect(strstr(mt_error_get(), "wnan") && strstr(mt_error_get(), "element 40"), "%s", mt_error_get());
    cr_expect_eq(cpu->ledger.cur[MT_MEM_BASE], 0);
    mt_backend_free(cpu);
}

Test(mxfp4, planner_counts_4_25_bits_as_the_ledger) {
    int64_t out = 2880, in = 2880;  // a gpt-oss-20b expert's down_proj
    mt_backend *null = mt_backend_null_new();
    mt_qweight q;
    cr_assert_eq(mt_qweight_quantize(&q, null, "w", NULL, out, in, MT_QUANT_MXFP4, 0, 1), 0, "%s", mt_error_get());
    mt_run_opts o;
    mt_run_opts_default(&o);
    o.quant = MT_QUANT_MXFP4;  // double quant stays on in the options: mxfp4 has none
    uint64_t plan = mt_plan_linear_bytes(out * in, MT_PLAN_OPTS_OF(&o)), want = (uint64_t)(out * in) / 2 + (uint64_t)(out * in) / 32;
    cr_expect_eq(plan, want, "planner %llu, want %llu (4.25 bits)", (unsigned long long)plan, (unsigned long long)want);
    cr_expect_eq(null->ledger.cur[MT_MEM_BASE], plan);
    cr_expect_eq(mt_qweight_bytes(&q), plan);
    cr_expect_eq(8.0 * (double)plan / (double)(out * in), 4.25);
    mt_qweight_free(&q);
    mt_backend_free(null);
}

Test(mxfp4, the_flag_and_the_export_names) {
    mt_run_opts o;
    mt_run_opts_default(&o);
    char a0[] = "--quant", a1[] = "mxfp4", *argv[] = {a0, a1};
    cr_assert_eq(mt_run_opts_parse(&o, 2, argv), 0, "%s", mt_error_get());
    cr_expect_eq(o.quant, MT_QUANT_MXFP4);
    cr_expect_str_eq(mt_quant_name(MT_QUANT_MXFP4), "mxfp4");
    cr_expect_str_eq(mt_quant_name(MT_QUANT_NONE), "none");

    mt_backend *cpu = mt_backend_cpu_new();
    float *w = gaussian(8 * 64, 1.0f, 3);
    mt_qweight q;
    cr_assert_eq(mt_qweight_quantize(&q, cpu, "w", w, 8, 64, MT_QUANT_MXFP4, 0, 0), 0, "%s", mt_error_get());
    mt_bnb_entries ex;
    cr_assert_eq(mt_bnb_export(&ex, "model.layers.0.mlp.experts.1.gate_proj.weight", &q), 0);
    cr_assert_eq(ex.n, 2);
    cr_expect_str_eq(ex.entries[0].name, "model.layers.0.mlp.experts.1.gate_proj_blocks");
    cr_expect_str_eq(ex.entries[1].name, "model.layers.0.mlp.experts.1.gate_proj_scales");
    cr_expect(ex.entries[0].ndim == 3 && ex.entries[0].shape[0] == 8 && ex.entries[0].shape[1] == 2 &&
              ex.entries[0].shape[2] == 16);
    cr_expect(ex.entries[1].ndim == 2 && ex.entries[1].shape[0] == 8 && ex.entries[1].shape[1] == 2);
    cr_expect(ex.entries[0].data == q.packed->data && ex.entries[1].data == q.absmax->data, "the bytes as held");
    mt_bnb_export_free(&ex);
    mt_qweight_free(&q);
    free(w);
    mt_backend_free(cpu);
}

// ---------------------------------------------------------------------------------------------
// CUDA against the CPU

static void *host_copy(const mt_tensor *t) {
    void *h = mt_xmalloc(t->nbytes ? t->nbytes : 1);
    mt_tensor_download(t, h);
    return h;
}

// W of q (any backend) as f32 and bf16 on the host, through mt_qweight_dequantize.
static void dequant_both(const mt_qweight *q, float *f, uint16_t *h) {
    int64_t n = q->out * q->in, sh[1] = {n};
    for (int o = 0; o < 2; o++) {
        mt_tensor *dst = mt_tensor_new(q->be, MT_MEM_WORK, o ? MT_BF16 : MT_F32, 1, sh);
        cr_assert_not_null(dst);
        cr_assert_eq(mt_qweight_dequantize(q, dst), 0, "%s", mt_error_get());
        mt_tensor_download(dst, o ? (void *)h : (void *)f);
        mt_tensor_free(dst);
    }
}

Test(quant_cuda, mxfp4_bit_for_bit_with_the_cpu, .timeout = 120) {
    mt_backend *gpu = gpu_or_skip(), *cpu = mt_backend_cpu_new();
    // quantize on both (f32, bf16, f16 sources), then dequantize on both
    int64_t out = 40, in = 96, n = out * in;
    float *w = gaussian(n, 0.02f, 21);
    w[3] = 0.0f, w[4] = -0.0f, w[50] = 3.0e38f, w[200] = 1e-40f;
    for (int i = 256; i < 288; i++) w[i] = 0.0f;  // an all-zero block
    for (int src = 0; src < 3; src++) {
        mt_dtype dt = src == 0 ? MT_F32 : src == 1 ? MT_BF16 : MT_F16;
        void *h = w;
        if (src) {
            h = mt_xmalloc((size_t)n * 2);
            for (int64_t i = 0; i < n; i++) w[i] = src == 2 && fabsf(w[i]) > 60000.0f ? 60000.0f : w[i];
            mt_convert(h, dt, w, MT_F32, (size_t)n);
        }
        mt_qweight a, b;
        cr_assert_eq(mt_qweight_quantize_from(&a, cpu, "w", h, dt, out, in, MT_QUANT_MXFP4, 0, 0, NULL), 0, "%s",
                     mt_error_get());
        cr_assert_eq(mt_qweight_quantize_from(&b, gpu, "w", h, dt, out, in, MT_QUANT_MXFP4, 0, 0, NULL), 0, "%s",
                     mt_error_get());
        uint8_t *pb = host_copy(b.packed), *sb = host_copy(b.absmax);
        cr_expect_eq(memcmp(pb, a.packed->data, (size_t)n / 2), 0, "%s: packed", mt_dtype_name(dt));
        cr_expect_eq(memcmp(sb, a.absmax->data, (size_t)n / 32), 0, "%s: scales", mt_dtype_name(dt));
        cr_expect_eq(gpu->ledger.cur[MT_MEM_BASE], mt_qweight_bytes(&b));
        free(pb), free(sb);
        mt_qweight_free(&a), mt_qweight_free(&b);
        if (src) free(h);
    }
    // dequantize transformers' fixture (e8m0 0 and 255 included) on the GPU: whole and a range
    mt_st_file f;
    cr_assert_eq(mt_st_file_open(&f, FIXTURES "mxfp4_dequant.safetensors"), 0, "%s", mt_error_get());
    const mt_st_tensor *tb = st_need(&f, "blocks");
    int64_t E = tb->shape[0], o2 = tb->shape[1], i2 = tb->shape[2] * 32, per = o2 * i2;
    uint8_t *blocks = st_copy(tb), *scales = st_copy(st_need(&f, "scales"));
    float *want = st_copy(st_need(&f, "deq_f32"));
    for (int64_t e = 0; e < E; e++) {
        mt_qweight a, b;
        cr_assert_eq(mt_qweight_from_mxfp4(&a, cpu, "x", blocks + e * per / 2, (size_t)per / 2, scales + e * per / 32,
                                           (size_t)per / 32, o2, i2), 0);
        cr_assert_eq(mt_qweight_from_mxfp4(&b, gpu, "x", blocks + e * per / 2, (size_t)per / 2, scales + e * per / 32,
                                           (size_t)per / 32, o2, i2), 0, "%s", mt_error_get());
        float *fg = mt_xmalloc((size_t)per * 4), *fc = mt_xmalloc((size_t)per * 4);
        uint16_t *hg = mt_xmalloc((size_t)per * 2), *hc = mt_xmalloc((size_t)per * 2);
        dequant_both(&b, fg, hg);
        dequant_both(&a, fc, hc);
        int64_t d = first_bit_diff(fg, want + e * per, per);
        cr_expect_eq(d, -1, "expert %lld: element %lld, cuda %a, transformers %a", (long long)e, (long long)d,
                     d >= 0 ? fg[d] : 0.0, d >= 0 ? want[e * per + d] : 0.0);
        cr_expect_eq(memcmp(hg, hc, (size_t)per * 2), 0, "bf16: cuda = cpu");
#ifdef MT_CUDA
        // the one-element kernel: from an odd element to a partial block
        int64_t sh[1] = {per};
        mt_tensor *dst = mt_tensor_new(gpu, MT_MEM_WORK, MT_F32, 1, sh);
        mt_qweight_dequantize_cuda(&b, dst->data, MT_F32, 5, per - 3);
        float *r = host_copy(dst);
        cr_expect_eq(first_bit_diff(r, want + e * per + 5, per - 8), -1, "range [5, n-3)");
        free(r);
        mt_tensor_free(dst);
#endif
        free(fg), free(fc), free(hg), free(hc);
        mt_qweight_free(&a), mt_qweight_free(&b);
    }
    free(blocks), free(scales), free(want), free(w);
    mt_st_file_close(&f);
    mt_backend_free(cpu);
    mt_backend_free(gpu);
}
