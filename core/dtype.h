// core/dtype.h — element types moetrain computes with, and their conversions.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MT_F32,
    MT_BF16,
    MT_F16,
    MT_U8,
    MT_I32,
    MT_I64,
    MT_Q4,  // packed 4-bit codes, two per byte (even element in the high nibble, as bitsandbytes)
    MT_F8_E4M3,  // float8 e4m3fn (safetensors F8_E4M3): read only, as block-FP8 checkpoints store weights
    MT_F8_E5M2,  // float8 e5m2 (safetensors F8_E5M2): read only
    MT_DTYPE_COUNT
} mt_dtype;

// A bf16 element as plain C sees it (device code casts to __nv_bfloat16): what a GPU step
// stores activations, dense weights, LoRA and their gradients in (model/model_internal.h).
typedef uint16_t mt_bf16;

const char *mt_dtype_name(mt_dtype t);           // "f32", "bf16", ...
int mt_dtype_parse(const char *s, mt_dtype *out);  // accepts our names and "bfloat16"/"float32"/...
// Bytes for n elements (MT_Q4: ceil(n/2)).
size_t mt_dtype_bytes(mt_dtype t, size_t n);

// bf16/f16 <-> f32. f32 -> bf16 rounds to nearest even; NaN stays NaN.
static inline float mt_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = {.u = (uint32_t)h << 16};
    return v.f;
}
static inline uint16_t mt_f32_to_bf16(float f) {
    union { uint32_t u; float f; } v = {.f = f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);  // quiet NaN
    uint32_t rounding = 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)((v.u + rounding) >> 16);
}
float mt_f16_to_f32(uint16_t h);
uint16_t mt_f32_to_f16(float f);
// float8 -> f32, exact, the bits torch's .to(torch.float32) gives. e4m3fn: sign, 4 exponent bits
// (bias 7), 3 mantissa bits; no infinities, S.1111.111 is NaN (its mantissa kept, 0x7ff00000),
// largest ±448, subnormals m·2^-9. e5m2: the top byte of an f16 (infinities; NaNs quiet).
float mt_f8e4m3_to_f32(uint8_t b);
float mt_f8e5m2_to_f32(uint8_t b);

// Convert n elements between f32/bf16/f16 buffers (src and dst may not overlap); f8 sources too.
void mt_convert(void *dst, mt_dtype dst_t, const void *src, mt_dtype src_t, size_t n);

#ifdef __cplusplus
}
#endif
