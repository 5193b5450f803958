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

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MT_Q4_AVX2 1
// 16 codes (8 bytes) a step: both halves of the block's 16-entry table as two 8-lane permutes,
// picked by the code's bit 3. Gathers (what `omp simd` makes of lut[code]) are several times
// slower on Zen 3. The values are the table's, so the result is the scalar loop's, bit for bit.
// Returns the pairs done (a multiple of 8); the caller finishes the rest.
__attribute__((target("avx2"))) static int64_t q4_pairs_avx2(const float *lut, const uint8_t *p, float *o,
                                                             int64_t pairs) {
    __m256 lo = _mm256_loadu_ps(lut), hi = _mm256_loadu_ps(lut + 8);
    const __m128i nibble = _mm_set1_epi8(15);
    int64_t j = 0;
    for (; j + 8 <= pairs; j += 8) {
        __m128i v = _mm_loadl_epi64((const __m128i *)(p + j));
        // element 2j is byte j's high nibble, 2j + 1 its low one
        __m128i codes = _mm_unpacklo_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), nibble), _mm_and_si128(v, nibble));
        for (int h = 0; h < 2; h++) {
            __m256i idx = _mm256_cvtepu8_epi32(h ? _mm_srli_si128(codes, 8) : codes);
            __m256 x = _mm256_permutevar8x32_ps(lo, idx), y = _mm256_permutevar8x32_ps(hi, idx);
            __m256 pick_hi = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));  // bit 3 -> sign
            _mm256_storeu_ps(o + 2 * j + 8 * h, _mm256_blendv_ps(x, y, pick_hi));
        }
    }
    return j;
}
#endif

// The pair loop is `omp simd` where the AVX2 permutes are not taken (simd = 0).
MT_HOT static void dequantize_blocks(const float *map, const uint8_t *packed, const float *scales, int blocksize,
                                     int64_t i0, int64_t i1, float *y, int simd) {
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
        int64_t pairs = (e - i) / 2, j0 = 0;
#ifdef MT_Q4_AVX2
        if (simd) j0 = q4_pairs_avx2(lut, p, o, pairs);
#endif
#pragma omp simd
        for (int64_t j = j0; j < pairs; j++) {
            o[2 * j] = lut[p[j] >> 4];
            o[2 * j + 1] = lut[p[j] & 15];
        }
        i += 2 * pairs;
        if (i < e) y[i - i0] = lut[packed[i >> 1] >> 4];
    }
}

void mt_q4_dequantize_blocks(const float *map, const uint8_t *packed, const float *scales, int blocksize,
                             int64_t i0, int64_t i1, float *y) {
#ifdef MT_Q4_AVX2
    dequantize_blocks(map, packed, scales, blocksize, i0, i1, y, __builtin_cpu_supports("avx2"));
#else
    dequantize_blocks(map, packed, scales, blocksize, i0, i1, y, 0);
#endif
}

void mt_q4_dequantize_blocks_scalar(const float *map, const uint8_t *packed, const float *scales, int blocksize,
                                    int64_t i0, int64_t i1, float *y) {
    dequantize_blocks(map, packed, scales, blocksize, i0, i1, y, 0);
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
