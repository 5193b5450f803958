// quant/int4.c — moetrain's INT4 (asymmetric min/max, fp16 scale and minimum per group; the
// definition is in quant/formats.h), on flat host arrays: the scalar reference.
#include <math.h>

#include "core/common.h"
#include "core/dtype.h"
#include "quant/quant.h"

void mt_int4_quantize_ref(const float *x, int64_t n, int group, uint8_t *packed, uint16_t *scale,
                          uint16_t *minimum) {
    int64_t ng = mt_q4_blocks(n, group);
    for (int64_t g = 0; g < ng; g++) {
        int64_t s = g * group, e = MT_MIN(n, s + group);
        float lo = x[s], hi = x[s];
#pragma omp simd reduction(min : lo) reduction(max : hi)
        for (int64_t i = s + 1; i < e; i++) {
            lo = x[i] < lo ? x[i] : lo;
            hi = x[i] > hi ? x[i] : hi;
        }
        uint16_t m16 = mt_f32_to_f16(lo), d16 = mt_f32_to_f16((hi - lo) / 15.0f);
        minimum[g] = m16;
        scale[g] = d16;
        float m = mt_f16_to_f32(m16), d = mt_f16_to_f32(d16);
        float inv = d > 0.0f ? 1.0f / d : 0.0f;
        uint8_t c[MT_Q4_CHUNK + 2];
#pragma omp simd
        for (int64_t i = 0; i < e - s; i++) c[i] = (uint8_t)mt_int4_code(x[s + i], m, inv);
        c[e - s] = (uint8_t)mt_int4_code(0.0f, m, inv);  // an odd count's padding
        for (int64_t j = 0; j < (e - s + 1) / 2; j++) packed[(s >> 1) + j] = (uint8_t)(c[2 * j] << 4 | c[2 * j + 1]);
    }
}

void mt_int4_dequantize_ref(const uint8_t *packed, const uint16_t *scale, const uint16_t *minimum,
                            int group, int64_t i0, int64_t i1, float *y) {
    for (int64_t g = i0 / group; g * group < i1; g++) {
        int64_t s = MT_MAX(i0, g * group), e = MT_MIN(i1, (g + 1) * group);
        float d = mt_f16_to_f32(scale[g]), m = mt_f16_to_f32(minimum[g]);
        for (int64_t i = s; i < e; i++) {
            unsigned c = (packed[i >> 1] >> ((~i & 1) << 2)) & 15u;
            y[i - i0] = mt_int4_value(c, d, m);
        }
    }
}
