// quant/mxfp4.c — MXFP4 (e2m1 codes, one e8m0 scale per 32 elements of a row; the definition is
// in quant/formats.h) on flat host arrays: the scalar reference, and the weight built from a
// checkpoint's stored bytes (gpt-oss's `*_blocks` / `*_scales`) without re-quantizing.
#include <math.h>
#include <string.h>

#include "core/common.h"
#include "quant/quant.h"

// One block x [32]: max |x|, its e8m0 byte, then the codes of x · (1 / scale), element 2j in the
// low nibble of byte j. The product is exact (a power of two) unless it falls below fp32's
// normal range, where it rounds as downcast_to_mxfp_torch's multiply does.
static void mxfp4_block(const float *x, uint8_t *packed, uint8_t *scale) {
    float a = mt_q4_block_absmax(x, MT_MXFP4_BLOCK);
    unsigned e = mt_mxfp4_scale_of(a);
    float inv = mt_mxfp4_inv_scale(e);
    uint8_t c[MT_MXFP4_BLOCK];
#pragma omp simd
    for (int i = 0; i < MT_MXFP4_BLOCK; i++) c[i] = (uint8_t)mt_e2m1_code(x[i] * inv);
    for (int j = 0; j < MT_MXFP4_BLOCK / 2; j++) packed[j] = (uint8_t)(c[2 * j] | c[2 * j + 1] << 4);
    *scale = (uint8_t)e;
}

void mt_mxfp4_quantize_ref(const float *x, int64_t n, uint8_t *packed, uint8_t *scales) {
    for (int64_t b = 0; b * MT_MXFP4_BLOCK < n; b++)
        mxfp4_block(x + b * MT_MXFP4_BLOCK, packed + b * (MT_MXFP4_BLOCK / 2), scales + b);
}

void mt_mxfp4_dequantize_ref(const uint8_t *packed, const uint8_t *scales, int64_t i0, int64_t i1, float *y) {
    for (int64_t b = i0 / MT_MXFP4_BLOCK; b * MT_MXFP4_BLOCK < i1; b++) {
        int64_t s = MT_MAX(i0, b * MT_MXFP4_BLOCK), e = MT_MIN(i1, (b + 1) * MT_MXFP4_BLOCK);
        float lut[16];  // the block's 16 values, made once per block
        for (int k = 0; k < 16; k++) lut[k] = mt_mxfp4_value(mt_e2m1_map[k], scales[b]);
        for (int64_t i = s; i < e; i++) y[i - i0] = lut[(packed[i >> 1] >> ((i & 1) << 2)) & 15u];
    }
}

int mt_qweight_from_mxfp4(mt_qweight *q, mt_backend *be, const char *name, const uint8_t *blocks,
                          size_t blocks_bytes, const uint8_t *scales, size_t scales_bytes, int64_t out, int64_t in) {
    memset(q, 0, sizeof *q);
    if (out <= 0 || in <= 0 || in % MT_MXFP4_BLOCK != 0) {
        mt_error_set("'%s': mxfp4 weight [%lld, %lld]: the input dimension must be a positive multiple of %d "
                     "(one e8m0 scale per %d elements of a row)", name, (long long)out, (long long)in,
                     MT_MXFP4_BLOCK, MT_MXFP4_BLOCK);
        return -1;
    }
    uint64_t n;
    if (!mt_mul_ok((uint64_t)out, (uint64_t)in, &n) || n > (UINT64_C(1) << 40)) {
        mt_error_set("'%s': mxfp4 weight [%lld, %lld] is too large", name, (long long)out, (long long)in);
        return -1;
    }
    uint64_t want_blocks = n / 2, want_scales = n / MT_MXFP4_BLOCK;
    if (blocks_bytes != want_blocks || scales_bytes != want_scales) {
        mt_error_set("'%s': mxfp4 weight [%lld, %lld] needs %llu bytes of blocks [%lld, %lld, 16] and %llu of "
                     "scales [%lld, %lld]; got %zu and %zu", name, (long long)out, (long long)in,
                     (unsigned long long)want_blocks, (long long)out, (long long)(in / MT_MXFP4_BLOCK),
                     (unsigned long long)want_scales, (long long)out, (long long)(in / MT_MXFP4_BLOCK), blocks_bytes,
                     scales_bytes);
        return -1;
    }
    if (be->ops->kind != MT_BACKEND_NULL && (!blocks || !scales)) {
        mt_error_set("'%s': mxfp4 weight without its blocks or scales", name);
        return -1;
    }
    if (mt_qweight_alloc(q, be, name, out, in, MT_QUANT_MXFP4, MT_MXFP4_BLOCK, 0, 0) != 0) return -1;
    q->dtype = MT_BF16;  // gpt-oss's dense dtype; only a later export reads it
    if (be->ops->kind != MT_BACKEND_NULL) {  // the bytes as stored: same layout, same nibble order
        be->ops->upload(be, q->packed->data, blocks, (size_t)want_blocks);
        be->ops->upload(be, q->absmax->data, scales, (size_t)want_scales);
    }
    return 0;
}
