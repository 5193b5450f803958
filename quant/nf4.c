// quant/nf4.c — bitsandbytes' 4-bit formats (NF4, FP4) and the 8-bit double quantization of
// their absmax, on flat host arrays: the scalar reference (quant/formats.h has the rules).
#include <math.h>
#include <string.h>

#include "core/common.h"
#include "core/vmath.h"
#include "quant/quant.h"

// One block x [len] (len even, or odd for the very last block): absmax, then the codes of
// x · (1/absmax), two per byte; an odd count's last low nibble codes 0 · (1/absmax), as the
// CUDA kernel's zero padding does. Written as flat loops that `omp simd` vectorises.
float mt_q4_block_absmax(const float *x, int64_t len) {
    float a = 0.0f;
#pragma omp simd reduction(max : a)
    for (int64_t i = 0; i < len; i++) {
        float v = fabsf(x[i]);
        a = v > a ? v : a;
    }
    return a;
}

static void q4_block(mt_quant type, const float *x, int64_t len, float *absmax, uint8_t *packed) {
    float a = mt_q4_block_absmax(x, len);
    *absmax = a;
    float inv = 1.0f / a;  // 0 -> inf, and 0 · inf = NaN -> code 0, as on CUDA
    uint8_t c[MT_Q4_CHUNK + 2];
    if (type == MT_QUANT_FP4) {
#pragma omp simd
        for (int64_t i = 0; i < len; i++) c[i] = (uint8_t)mt_fp4_code(x[i] * inv);
    } else {
#pragma omp simd
        for (int64_t i = 0; i < len; i++) c[i] = (uint8_t)mt_nf4_code(x[i] * inv);
    }
    c[len] = (uint8_t)mt_q4_code(type, 0.0f * inv);
#pragma omp simd
    for (int64_t j = 0; j < (len + 1) / 2; j++) packed[j] = (uint8_t)(c[2 * j] << 4 | c[2 * j + 1]);
}

void mt_q4_quantize_ref(mt_quant type, const float *x, int64_t n, int blocksize, uint8_t *packed,
                        float *absmax) {
    for (int64_t b = 0, s = 0; s < n; b++, s += blocksize)
        q4_block(type, x + s, MT_MIN(n - s, (int64_t)blocksize), absmax + b, packed + s / 2);
}

void mt_q4_dequantize_ref(const float *map, const uint8_t *packed, const float *absmax,
                          int blocksize, int64_t i0, int64_t i1, float *y) {
    if (i1 > i0) mt_q4_dequantize_blocks(map, packed, absmax + i0 / blocksize, blocksize, i0, i1, y);
}

// The pair loop is `omp simd` (AVX2 gathers from the 16-entry table in the x86-64-v3 build).
MT_HOT void mt_q4_dequantize_blocks(const float *map, const uint8_t *packed, const float *scales,
                                    int blocksize, int64_t i0, int64_t i1, float *y) {
    int64_t b0 = i0 / blocksize;
    for (int64_t b = b0; b * blocksize < i1; b++) {
        int64_t s = MT_MAX(i0, b * blocksize), e = MT_MIN(i1, (b + 1) * blocksize);
        float lut[16];  // map · absmax: the same product per element, made once per block
        for (int k = 0; k < 16; k++) lut[k] = map[k] * scales[b - b0];
        int64_t i = s;
        if (i < e && (i & 1)) {  // a range that starts on a low nibble
            y[i - i0] = lut[packed[i >> 1] & 15];
            i++;
        }
        const uint8_t *p = packed + (i >> 1);
        float *o = y + (i - i0);
        int64_t pairs = (e - i) / 2;
#pragma omp simd
        for (int64_t j = 0; j < pairs; j++) {
            o[2 * j] = lut[p[j] >> 4];
            o[2 * j + 1] = lut[p[j] & 15];
        }
        i += 2 * pairs;
        if (i < e) y[i - i0] = lut[packed[i >> 1] >> 4];
    }
}

float mt_q8_offset(const float *absmax, int64_t nb) {
    double sum = 0;
    for (int64_t i = 0; i < nb; i++) sum += absmax[i];
    return nb ? (float)(sum / (double)nb) : 0.0f;
}

void mt_q8_quantize_ref(const float *map256, const float *absmax, int64_t nb, float offset,
                        uint8_t *codes, float *nested_absmax) {
    const int64_t bs = MT_Q4_NESTED_BLOCKSIZE;
    float v[MT_Q4_NESTED_BLOCKSIZE];
    for (int64_t c = 0; c * bs < nb; c++) {
        int64_t s = c * bs, e = MT_MIN(nb, s + bs);
        for (int64_t i = s; i < e; i++) v[i - s] = absmax[i] - offset;
        float a = mt_q4_block_absmax(v, e - s);
        nested_absmax[c] = a;
        float inv = 1.0f / a;
        for (int64_t i = s; i < e; i++) codes[i] = (uint8_t)mt_q8_code(map256, v[i - s] * inv);
    }
}

void mt_q8_dequantize_ref(const float *map256, const uint8_t *codes, const float *nested_absmax,
                          float offset, int64_t b0, int64_t b1, float *absmax) {
    for (int64_t b = b0; b < b1; b++)
        absmax[b - b0] = map256[codes[b]] * nested_absmax[b / MT_Q4_NESTED_BLOCKSIZE] + offset;
}
