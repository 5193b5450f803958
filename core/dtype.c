// core/dtype.c — dtype names, sizes and float conversions.
#include "core/dtype.h"

#include <math.h>
#include <string.h>

#include "core/common.h"
#include "core/vmath.h"

static const struct {
    const char *name;
    size_t bits;
} dtype_info[MT_DTYPE_COUNT] = {
    [MT_F32] = {"f32", 32}, [MT_BF16] = {"bf16", 16}, [MT_F16] = {"f16", 16}, [MT_U8] = {"u8", 8},
    [MT_I32] = {"i32", 32}, [MT_I64] = {"i64", 64},   [MT_Q4] = {"q4", 4},
    [MT_F8_E4M3] = {"f8_e4m3", 8}, [MT_F8_E5M2] = {"f8_e5m2", 8},
};

const char *mt_dtype_name(mt_dtype t) { return t < MT_DTYPE_COUNT ? dtype_info[t].name : "?"; }

int mt_dtype_parse(const char *s, mt_dtype *out) {
    static const struct { const char *name; mt_dtype t; } aliases[] = {
        {"f32", MT_F32},      {"float32", MT_F32}, {"fp32", MT_F32},    {"bf16", MT_BF16},
        {"bfloat16", MT_BF16}, {"f16", MT_F16},    {"float16", MT_F16}, {"fp16", MT_F16},
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(aliases); i++)
        if (strcmp(s, aliases[i].name) == 0) { *out = aliases[i].t; return 0; }
    mt_error_set("unknown dtype '%s' (expected f32, bf16 or f16)", s);
    return -1;
}

size_t mt_dtype_bytes(mt_dtype t, size_t n) { return (n * dtype_info[t].bits + 7) / 8; }

float mt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    union { uint32_t u; float f; } v;
    if (exp == 0x1f) v.u = sign | 0x7f800000u | (man << 13);  // inf / nan
    else if (exp == 0) {
        float f = ldexpf((float)man, -24);  // zero or subnormal
        return sign ? -f : f;
    } else v.u = sign | ((exp + 112) << 23) | (man << 13);
    return v.f;
}

uint16_t mt_f32_to_f16(float f) {
    union { uint32_t u; float f; } v = {.f = f};
    uint16_t sign = (uint16_t)((v.u >> 16) & 0x8000);
    float a = fabsf(f);
    if (isnan(f)) return sign | 0x7e00;
    if (a >= 65520.0f) return sign | 0x7c00;  // rounds to inf
    if (a < 6.103515625e-05f) {               // subnormal: multiple of 2^-24, round to even
        return sign | (uint16_t)lrintf(a * 16777216.0f);
    }
    uint32_t u = v.u & 0x7fffffffu;
    uint32_t exp = (u >> 23) - 112, man = u & 0x7fffff;
    uint32_t h = (exp << 10) | (man >> 13);
    uint32_t rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return sign | (uint16_t)h;
}

float mt_f8e4m3_to_f32(uint8_t b) {
    uint32_t sign = (uint32_t)(b & 0x80) << 24, exp = (b >> 3) & 15, man = b & 7;
    union { uint32_t u; float f; } v;
    if (exp == 0) {  // zero or subnormal: man · 2^-9, exact
        v.f = (float)man * 0x1p-9f;
        v.u |= sign;
    } else {  // S.1111.111 is the only NaN: exponent 255 with the mantissa carried, as torch does
        v.u = sign | (exp == 15 && man == 7 ? 0x7f800000u : (exp + 120) << 23) | man << 20;
    }
    return v.f;
}

float mt_f8e5m2_to_f32(uint8_t b) {
    float f = mt_f16_to_f32((uint16_t)(b << 8));
    union { uint32_t u; float f; } v = {.f = f};
    if (isnan(f)) v.u |= 0x00400000u;  // quiet, as torch's cast
    return v.f;
}

// Element i of src, by memcpy: sources may be mmapped safetensors data, which has no alignment
// guarantee (a 4-bit checkpoint's U8 parts leave the next tensor at any offset).
static float load_one(const void *src, mt_dtype t, size_t i) {
    const char *p = src;
    float f;
    uint16_t h;
    switch (t) {
    case MT_F32: memcpy(&f, p + 4 * i, 4); return f;
    case MT_BF16: memcpy(&h, p + 2 * i, 2); return mt_bf16_to_f32(h);
    case MT_F16: memcpy(&h, p + 2 * i, 2); return mt_f16_to_f32(h);
    case MT_F8_E4M3: return mt_f8e4m3_to_f32((uint8_t)p[i]);
    case MT_F8_E5M2: return mt_f8e5m2_to_f32((uint8_t)p[i]);
    default: mt_fatal(MT_EXIT_ERROR, "mt_convert: unsupported source dtype %s", mt_dtype_name(t));
    }
}

// The two conversions every load and every bf16 step make, as loops GCC vectorizes (a model's
// load spent a quarter of a short run in the general loop below, one element and switch at a
// time). Same bits as mt_bf16_to_f32 / mt_f32_to_bf16; the source is read by memcpy (unaligned).
// Large buffers are split over the threads: their first touch (page faults on the destination
// and on the mmapped source) costs more than the arithmetic.
enum { CONVERT_PARALLEL_MIN = 1 << 15 };

MT_HOT static void bf16_to_f32_n(float *restrict dst, const unsigned char *restrict src, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= CONVERT_PARALLEL_MIN)
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        dst[i] = mt_bf16_to_f32(h);
    }
}

MT_HOT static void f32_to_bf16_n(uint16_t *restrict dst, const unsigned char *restrict src, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= CONVERT_PARALLEL_MIN)
    for (size_t i = 0; i < n; i++) {
        float f;
        memcpy(&f, src + 4 * i, 4);
        dst[i] = mt_f32_to_bf16(f);
    }
}

void mt_convert(void *dst, mt_dtype dst_t, const void *src, mt_dtype src_t, size_t n) {
    if (dst_t == src_t) { memcpy(dst, src, mt_dtype_bytes(dst_t, n)); return; }
    if (src_t == MT_BF16 && dst_t == MT_F32) { bf16_to_f32_n(dst, src, n); return; }
    if (src_t == MT_F32 && dst_t == MT_BF16) { f32_to_bf16_n(dst, src, n); return; }
    for (size_t i = 0; i < n; i++) {
        float x = load_one(src, src_t, i);
        switch (dst_t) {
        case MT_F32: ((float *)dst)[i] = x; break;
        case MT_BF16: ((uint16_t *)dst)[i] = mt_f32_to_bf16(x); break;
        case MT_F16: ((uint16_t *)dst)[i] = mt_f32_to_f16(x); break;
        default: mt_fatal(MT_EXIT_ERROR, "mt_convert: unsupported target dtype %s", mt_dtype_name(dst_t));
        }
    }
}
