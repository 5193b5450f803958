// quant/formats.h — the frozen-weight formats, defined once for C and nvcc (docs/design.md, "Layers and folders").
//
// Four formats (mt_quant, below), all 4-bit codes packed two per byte. NF4, FP4, INT4: element 2j
// in the HIGH nibble of byte j and 2j+1 in the low one; an odd count pads the last low nibble
// with the code of 0.0. MXFP4: the other way round (element 2j in the LOW nibble), as the
// checkpoints that carry it store it. Blocks are runs of `blocksize` consecutive elements of the row-major
// [out, in] weight (a block may span rows; the last may be partial).
//
//   NF4, FP4  bitsandbytes' 4-bit formats, bit for bit (docs/formats.md "bitsandbytes 4-bit"). Per block an fp32
//             absmax; code = the CUDA kernel's decision on x · (1/absmax) (the canonical rule:
//             the Hub's bnb-4bit checkpoints were made by it); value = map[code] · absmax.
//             Double quantization (optional): offset = mean(absmax); the 256-blocks of
//             absmax − offset coded 8-bit on the signed dynamic map with an fp32 nested absmax;
//             absmax_b = nested_map[q_b] · nested_absmax[b/256] + offset (two roundings, no FMA).
//   INT4      moetrain's own (bitsandbytes has none): asymmetric min/max, groups of 128 by
//             default, an fp16 scale d and an fp16 minimum m per group:
//                 m = fp16(min x), d = fp16((max x − min x) / 15)      (round to nearest even)
//                 q = clamp(rint((x − m) · (1/d)), 0, 15)  (q = 0 when d = 0), x̂ = q · d + m
//             with d and m used as their fp16 values. Bits per weight: 4 + 32/128 = 4.25, the
//             planner's figure (plan/plan.c). No double quantization.
//   MXFP4     OCP Microscaling FP4, as gpt-oss checkpoints store it (docs/formats.md "MXFP4"): blocks of
//             32 elements of one row (in % 32 == 0), e2m1 codes (sign, 2 exponent bits, 1 mantissa
//             bit: ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}) and one e8m0 byte e per block:
//                 x̂ = e2m1[code] · 2^(e − 127), the exact product rounded once to fp32
//             as transformers' torch.ldexp gives it: exact, a subnormal for small e (e = 0:
//             2^-127 · {0.5 .. 6}), ±inf past FLT_MAX. e = 255 is no NaN (the OCP spec's reading):
//             ±0 stays ±0, ±0.5 is ±2^127, the rest ±inf. Computed as (2·e2m1) · 2^(e − 128), two
//             factors exact in fp32 for every e (2^128 is not), one rounding. Quantization is triton_kernels' downcast_to_mxfp_torch, the
//             rule transformers' quantize_to_mxfp4 calls (mt_mxfp4_scale_of, mt_e2m1_code below).
//             Bits per weight: 4 + 8/32 = 4.25. No double quantization.
//
// Everything numeric here is fp32 with one rounding per operation: the CUDA side uses __fmul_rn
// / __fadd_rn (nvcc would otherwise fuse a·b + c into an FMA), the C side relies on ISO C mode
// (-std=c11 turns FP contraction off in GCC). The golden tests would catch a fused build.
#pragma once
#include <stdint.h>


// The frozen base's format (--quant); MT_QUANT_NONE: bf16, nothing quantized.
typedef enum { MT_QUANT_NF4, MT_QUANT_FP4, MT_QUANT_INT4, MT_QUANT_MXFP4, MT_QUANT_NONE } mt_quant;
static inline const char *mt_quant_name(mt_quant q) {
    static const char *const n[] = {"nf4", "fp4", "int4", "mxfp4", "none"};
    return q <= MT_QUANT_NONE ? n[q] : "?";
}

#ifdef __CUDACC__
#define MT_QF_FN static inline __host__ __device__
#else
#include <assert.h>  // static_assert
#include <math.h>
#define MT_QF_FN static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

// ---------------------------------------------------------------------------------------------
// Codebooks, as bitsandbytes stores them in `quant_map` (docs/formats.md "Codebooks"). As initialiser
// lists, so that C (static const) and CUDA (__constant__) tables are made from the same text.

// NF4: create_normal_map(offset=0.9677083, use_extra_value=True), sorted; code 7 is 0.0.
#define MT_NF4_MAP_VALUES                                                                       \
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,                  \
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,                 \
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,    \
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f
// FP4 (sign, 2 exponent bits, 1 mantissa bit; values / 12), in code order, not value order, as
// bitsandbytes' kernels dequantize it (CUDA and CPU alike: code 8 is sign · 0 = -0.0). The
// quant_map bitsandbytes stores differs in that one sign only (get_4bit_type's `-0` is a Python
// int, so +0.0): MT_FP4_QUANT_MAP_VALUES, written on export and accepted on import.
#define MT_FP4_MAP_VALUES                                                                       \
    0.0f, 0x1.555556p-8f, 0x1.555556p-1f, 1.0f, 0x1.555556p-2f, 0.5f, 0x1.555556p-3f, 0.25f,   \
    -0.0f, -0x1.555556p-8f, -0x1.555556p-1f, -1.0f, -0x1.555556p-2f, -0.5f, -0x1.555556p-3f, -0.25f
#define MT_FP4_QUANT_MAP_VALUES                                                                 \
    0.0f, 0x1.555556p-8f, 0x1.555556p-1f, 1.0f, 0x1.555556p-2f, 0.5f, 0x1.555556p-3f, 0.25f,   \
    0.0f, -0x1.555556p-8f, -0x1.555556p-1f, -1.0f, -0x1.555556p-2f, -0.5f, -0x1.555556p-3f, -0.25f

// The signed dynamic 8-bit map of double quantization, create_dynamic_map(signed=True,
// max_exponent_bits=7, total_bits=8) (docs/formats.md "Double quantization"): 127 negative values, 0.0 at 127, 127
// positive, 1.0 at 255. Dumped from bitsandbytes 0.50.2 by scripts/make_quant_goldens.py
// --print-dynamic-map (torch's fp32 linspace rounding is not worth re-deriving). Files carry
// their own copy (nested_quant_map), which is what an imported weight uses.
#define MT_DYNAMIC_MAP_VALUES \
    -0x1.fc6666p-1f, -0x1.f53334p-1f, -0x1.eep-1f, -0x1.e6ccccp-1f, \
    -0x1.df999ap-1f, -0x1.d86666p-1f, -0x1.d13334p-1f, -0x1.cap-1f, \
    -0x1.c2ccccp-1f, -0x1.bb999ap-1f, -0x1.b46666p-1f, -0x1.ad3334p-1f, \
    -0x1.a6p-1f, -0x1.9eccccp-1f, -0x1.97999ap-1f, -0x1.906666p-1f, \
    -0x1.893334p-1f, -0x1.82p-1f, -0x1.7accccp-1f, -0x1.73999ap-1f, \
    -0x1.6c6668p-1f, -0x1.653334p-1f, -0x1.5ep-1f, -0x1.56ccccp-1f, \
    -0x1.4f999ap-1f, -0x1.486668p-1f, -0x1.413334p-1f, -0x1.3ap-1f, \
    -0x1.32ccccp-1f, -0x1.2b999ap-1f, -0x1.246668p-1f, -0x1.1d3334p-1f, \
    -0x1.16p-1f, -0x1.0eccccp-1f, -0x1.079998p-1f, -0x1.006666p-1f, \
    -0x1.f26664p-2f, -0x1.e4p-2f, -0x1.d59998p-2f, -0x1.c73334p-2f, \
    -0x1.b8ccccp-2f, -0x1.aa6666p-2f, -0x1.9cp-2f, -0x1.8d9998p-2f, \
    -0x1.7f3334p-2f, -0x1.70ccccp-2f, -0x1.626666p-2f, -0x1.54p-2f, \
    -0x1.459998p-2f, -0x1.373334p-2f, -0x1.28ccccp-2f, -0x1.1a6668p-2f, \
    -0x1.0cp-2f, -0x1.fb3332p-3f, -0x1.de6666p-3f, -0x1.c1999ap-3f, \
    -0x1.a4ccccp-3f, -0x1.88p-3f, -0x1.6b3334p-3f, -0x1.4e6666p-3f, \
    -0x1.31999ap-3f, -0x1.14ccccp-3f, -0x1.fp-4f, -0x1.b66668p-4f, \
    -0x1.93d70ap-4f, -0x1.8851eep-4f, -0x1.7ccccep-4f, -0x1.7147aep-4f, \
    -0x1.65c29p-4f, -0x1.5a3d7p-4f, -0x1.4eb854p-4f, -0x1.433334p-4f, \
    -0x1.37ae14p-4f, -0x1.2c28f6p-4f, -0x1.20a3d6p-4f, -0x1.151ebap-4f, \
    -0x1.09999ap-4f, -0x1.fc28f6p-5f, -0x1.e51ebap-5f, -0x1.ce147ap-5f, \
    -0x1.b70a3ep-5f, -0x1.ap-5f, -0x1.88f5c2p-5f, -0x1.71eb86p-5f, \
    -0x1.5ae146p-5f, -0x1.43d70ap-5f, -0x1.2ccccep-5f, -0x1.15c29p-5f, \
    -0x1.fd70a4p-6f, -0x1.cf5c2ap-6f, -0x1.a147aep-6f, -0x1.733334p-6f, \
    -0x1.451ebap-6f, -0x1.170a3ep-6f, -0x1.d1eb86p-7f, -0x1.75c29p-7f, \
    -0x1.3e76c8p-7f, -0x1.2c083p-7f, -0x1.19999ap-7f, -0x1.072b02p-7f, \
    -0x1.e978d4p-8f, -0x1.c49ba6p-8f, -0x1.9fbe76p-8f, -0x1.7ae148p-8f, \
    -0x1.56041ap-8f, -0x1.3126e8p-8f, -0x1.0c49bap-8f, -0x1.ced914p-9f, \
    -0x1.851eb8p-9f, -0x1.3b645ap-9f, -0x1.e353f8p-10f, -0x1.4fdf3ap-10f, \
    -0x1.eecbfep-11f, -0x1.b3d07cp-11f, -0x1.78d5p-11f, -0x1.3dd982p-11f, \
    -0x1.02de02p-11f, -0x1.8fc506p-12f, -0x1.19ce0ap-12f, -0x1.47ae16p-13f, \
    -0x1.743e96p-14f, -0x1.15df66p-14f, -0x1.6f0068p-15f, -0x1.64840cp-16f, \
    -0x1.040bfep-17f, -0x1.b43528p-19f, -0x1.27476ep-21f, 0x0p+0f, \
    0x1.27476ep-21f, 0x1.b43528p-19f, 0x1.040bfep-17f, 0x1.64840cp-16f, \
    0x1.6f0068p-15f, 0x1.15df66p-14f, 0x1.743e96p-14f, 0x1.47ae16p-13f, \
    0x1.19ce0ap-12f, 0x1.8fc506p-12f, 0x1.02de02p-11f, 0x1.3dd982p-11f, \
    0x1.78d5p-11f, 0x1.b3d07cp-11f, 0x1.eecbfep-11f, 0x1.4fdf3ap-10f, \
    0x1.e353f8p-10f, 0x1.3b645ap-9f, 0x1.851eb8p-9f, 0x1.ced914p-9f, \
    0x1.0c49bap-8f, 0x1.3126e8p-8f, 0x1.56041ap-8f, 0x1.7ae148p-8f, \
    0x1.9fbe76p-8f, 0x1.c49ba6p-8f, 0x1.e978d4p-8f, 0x1.072b02p-7f, \
    0x1.19999ap-7f, 0x1.2c083p-7f, 0x1.3e76c8p-7f, 0x1.75c29p-7f, \
    0x1.d1eb86p-7f, 0x1.170a3ep-6f, 0x1.451ebap-6f, 0x1.733334p-6f, \
    0x1.a147aep-6f, 0x1.cf5c2ap-6f, 0x1.fd70a4p-6f, 0x1.15c29p-5f, \
    0x1.2ccccep-5f, 0x1.43d70ap-5f, 0x1.5ae146p-5f, 0x1.71eb86p-5f, \
    0x1.88f5c2p-5f, 0x1.ap-5f, 0x1.b70a3ep-5f, 0x1.ce147ap-5f, \
    0x1.e51ebap-5f, 0x1.fc28f6p-5f, 0x1.09999ap-4f, 0x1.151ebap-4f, \
    0x1.20a3d6p-4f, 0x1.2c28f6p-4f, 0x1.37ae14p-4f, 0x1.433334p-4f, \
    0x1.4eb854p-4f, 0x1.5a3d7p-4f, 0x1.65c29p-4f, 0x1.7147aep-4f, \
    0x1.7ccccep-4f, 0x1.8851eep-4f, 0x1.93d70ap-4f, 0x1.b66668p-4f, \
    0x1.fp-4f, 0x1.14ccccp-3f, 0x1.31999ap-3f, 0x1.4e6666p-3f, \
    0x1.6b3334p-3f, 0x1.88p-3f, 0x1.a4ccccp-3f, 0x1.c1999ap-3f, \
    0x1.de6666p-3f, 0x1.fb3332p-3f, 0x1.0cp-2f, 0x1.1a6668p-2f, \
    0x1.28ccccp-2f, 0x1.373334p-2f, 0x1.459998p-2f, 0x1.54p-2f, \
    0x1.626666p-2f, 0x1.70ccccp-2f, 0x1.7f3334p-2f, 0x1.8d9998p-2f, \
    0x1.9cp-2f, 0x1.aa6666p-2f, 0x1.b8ccccp-2f, 0x1.c73334p-2f, \
    0x1.d59998p-2f, 0x1.e4p-2f, 0x1.f26664p-2f, 0x1.006666p-1f, \
    0x1.079998p-1f, 0x1.0eccccp-1f, 0x1.16p-1f, 0x1.1d3334p-1f, \
    0x1.246668p-1f, 0x1.2b999ap-1f, 0x1.32ccccp-1f, 0x1.3ap-1f, \
    0x1.413334p-1f, 0x1.486668p-1f, 0x1.4f999ap-1f, 0x1.56ccccp-1f, \
    0x1.5ep-1f, 0x1.653334p-1f, 0x1.6c6668p-1f, 0x1.73999ap-1f, \
    0x1.7accccp-1f, 0x1.82p-1f, 0x1.893334p-1f, 0x1.906666p-1f, \
    0x1.97999ap-1f, 0x1.9eccccp-1f, 0x1.a6p-1f, 0x1.ad3334p-1f, \
    0x1.b46666p-1f, 0x1.bb999ap-1f, 0x1.c2ccccp-1f, 0x1.cap-1f, \
    0x1.d13334p-1f, 0x1.d86666p-1f, 0x1.df999ap-1f, 0x1.e6ccccp-1f, \
    0x1.eep-1f, 0x1.f53334p-1f, 0x1.fc6666p-1f, 0x1p+0f

// MXFP4's e2m1 values in code order (bit 3 the sign; code 8 is -0.0): transformers' FP4_VALUES.
#define MT_E2M1_VALUES                                                                          \
    0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f
#define MT_MXFP4_BLOCK 32            // fixed by the format: one e8m0 scale per 32 elements of a row

#define MT_Q4_NESTED_BLOCKSIZE 256   // bitsandbytes' quantize_4bit always nests in 256-blocks
#define MT_Q4_CHUNK 4096             // a multiple of every blocksize: the unit of parallel work

// ---------------------------------------------------------------------------------------------
// One rounding per operation, on both sides.

MT_QF_FN float mt_qf_mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
MT_QF_FN float mt_qf_add(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
MT_QF_FN float mt_qf_sub(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}

// ---------------------------------------------------------------------------------------------
// Codes (bitsandbytes csrc: dQuantizeNF4, dQuantizeFP4, dQuantize<0>)

// NF4 code of a scaled value: the number of midpoint thresholds strictly below it (a tie goes
// to the lower code; NaN, from an all-zero block's 0 · (1/0), gives code 0).
MT_QF_FN unsigned mt_nf4_code(float x) {
    return (unsigned)(x > -0.8480964004993439f) + (x > -0.6106329262256622f) +
           (x > -0.4599952697753906f) + (x > -0.33967943489551544f) +
           (x > -0.23460740596055984f) + (x > -0.13791173323988914f) +
           (x > -0.045525018125772476f) + (x > 0.03979014977812767f) +
           (x > 0.1202552504837513f) + (x > 0.2035212516784668f) + (x > 0.2920137718319893f) +
           (x > 0.3893125355243683f) + (x > 0.5016634166240692f) + (x > 0.6427869200706482f) +
           (x > 0.8614784181118011f);
}

// FP4 code: sign bit 0b1000 when x < 0; on |x| the code of the highest threshold strictly
// exceeded. The thresholds are the CUDA kernel's literals (not exact midpoints).
MT_QF_FN unsigned mt_fp4_code(float x) {
    float a = x < 0.0f ? -x : x;  // fabsf, without a math-library call on either side
    unsigned rank = (unsigned)(a > 0.00260417f) + (a > 0.0859375f) + (a > 0.20833333f) +
                    (a > 0.29166667f) + (a > 0.4166667f) + (a > 0.583333f) + (a > 0.8333333f);
    // codes by magnitude rank: 0b000, 0b001, 0b110, 0b111, 0b100, 0b101, 0b010, 0b011
    return ((0x32547610u >> (4 * rank)) & 15u) | (x < 0.0f ? 8u : 0u);
}

MT_QF_FN unsigned mt_q4_code(mt_quant type, float x) {
    return type == MT_QUANT_FP4 ? mt_fp4_code(x) : mt_nf4_code(x);
}

// 8-bit code of x on a sorted 256-entry map: bitsandbytes' CUDA binary search, then the nearer
// of the two neighbours by midpoint (an exact tie stays on the pivot).
MT_QF_FN unsigned mt_q8_code(const float *map, float x) {
    int pivot = 127, upper_pivot = 255, lower_pivot = 0;
    float lower = -1.0f, upper = 1.0f, val = map[pivot];
    for (int i = 64; i > 0; i >>= 1) {
        if (x > val) {
            lower_pivot = pivot;
            lower = val;
            pivot += i;
        } else {
            upper_pivot = pivot;
            upper = val;
            pivot -= i;
        }
        val = map[pivot];
    }
    if (upper_pivot == 255) upper = map[255];
    if (lower_pivot == 0) lower = map[0];
    if (x > val) return x > mt_qf_mul(mt_qf_add(upper, val), 0.5f) ? (unsigned)upper_pivot : (unsigned)pivot;
    return x < mt_qf_mul(mt_qf_add(lower, val), 0.5f) ? (unsigned)lower_pivot : (unsigned)pivot;
}

// INT4 code of x in a group with minimum m and reciprocal scale inv (0 when the scale is 0).
MT_QF_FN unsigned mt_int4_code(float x, float m, float inv) {
    float t = mt_qf_mul(mt_qf_sub(x, m), inv);
    if (!(t > 0.0f)) return 0;  // also NaN
    if (t >= 15.0f) return 15;
    return (unsigned)rintf(t);  // round half to even, as the default FP mode on both sides
}

MT_QF_FN float mt_int4_value(unsigned q, float d, float m) {
    return mt_qf_add(mt_qf_mul((float)q, d), m);
}

// MXFP4. Bit patterns through a union: the same text compiles for the host and the device.
MT_QF_FN uint32_t mt_f32_bits(float x) {
    union { float f; uint32_t u; } v;
    v.f = x;
    return v.u;
}
MT_QF_FN float mt_f32_of_bits(uint32_t u) {
    union { float f; uint32_t u; } v;
    v.u = u;
    return v.f;
}

// e8m0 byte e → 2^(e − 128), half the scale, exact in fp32 for every byte: exponent field e − 1,
// or the subnormals 2^-128 (e = 0, 0x00200000) and 2^-127 (e = 1, 0x00400000).
MT_QF_FN float mt_e8m0_half(unsigned e) { return mt_f32_of_bits(e >= 2u ? (e - 1u) << 23 : 0x00200000u << e); }
// An e2m1 value v (or 2v already doubled: the tables) under e8m0 byte e: ldexp(v, e − 127).
MT_QF_FN float mt_mxfp4_value2(float v2, unsigned e) { return mt_qf_mul(v2, mt_e8m0_half(e)); }
MT_QF_FN float mt_mxfp4_value(float v, unsigned e) { return mt_mxfp4_value2(mt_qf_mul(v, 2.0f), e); }

// The e8m0 byte of a block with max |x| = amax (finite): amax / 6 rounded UP to a power of two
// (its exponent field, the mantissa carried in), downcast_to_mxfp_torch's ROUND_UP. amax = 0
// gives 0, whose reciprocal scale is taken as 0 (mt_mxfp4_inv_scale). amax / 6 < 2^126, so the
// carry never reaches 255.
MT_QF_FN unsigned mt_mxfp4_scale_of(float amax) {
    float d = amax / 6.0f;  // one correctly rounded division on both sides
    return ((mt_f32_bits(d) + 0x007fffffu) & 0x7f800000u) >> 23;
}
// The factor the block's values are multiplied by: 1 / 2^(e − 127) for the scale the rule
// chose (exact: a power of two), 0 for e = 0.
MT_QF_FN float mt_mxfp4_inv_scale(unsigned e) { return e ? mt_f32_of_bits((254u - e) << 23) : 0.0f; }

// e2m1 code of q = x · inv_scale, from q's bits: the exponent and the top two mantissa bits
// (subnormal e2m1 values shifted in below 1.0), plus one and halved: round to nearest with
// ties AWAY from zero, lower bits ignored; saturated at code 7 (6.0); the sign bit kept, so a
// negative value that rounds to zero gives code 8 (-0). Exactly downcast_to_mxfp_torch's bit
// manipulation (not the OCP spec's round-half-even).
MT_QF_FN unsigned mt_e2m1_code(float q) {
    uint32_t b = mt_f32_bits(q), ex = (b >> 23) & 0xffu, m = b & 0x7fffffu;
    if (ex < 127u) {  // |q| < 1: the implicit bit at 22, shifted to e2m1's exponent 0
        uint32_t sh = 126u - ex;
        m = sh > 23u ? 0u : (0x400000u | (m >> 1)) >> sh;
    }
    ex = (ex > 126u ? ex : 126u) - 126u;
    uint32_t c = (((ex << 2) | (m >> 21)) + 1u) >> 1;
    return (c < 7u ? c : 7u) | ((b >> 28) & 8u);
}

// ---------------------------------------------------------------------------------------------
// Geometry and sizes

MT_QF_FN int64_t mt_q4_blocks(int64_t n, int blocksize) { return (n + blocksize - 1) / blocksize; }
MT_QF_FN int64_t mt_q4_packed_bytes(int64_t n) { return (n + 1) / 2; }

// The traits table, indexed by mt_quant (NF4, FP4, INT4, MXFP4).
typedef struct mt_qformat {
    const char *name;        // "nf4", "fp4", "int4", "mxfp4"
    int default_blocksize;   // 64, 64, 128, 32 (MXFP4: the only one)
    int bnb;                 // 1: serialised as bitsandbytes' QuantState (docs/formats.md "Serialized quant_state")
    int double_quant;        // 1: double quantization of absmax is available
    int block_bytes;         // constants per block without double quant (fp32 absmax; fp16 d + m; e8m0)
    int block_bytes_dq;      // per block with double quant (the 8-bit code), 0 when unavailable
} mt_qformat;

static const mt_qformat mt_qformats[4] = {
    {"nf4", 64, 1, 1, 4, 1},
    {"fp4", 64, 1, 1, 4, 1},
    {"int4", 128, 0, 0, 4, 0},
    {"mxfp4", MT_MXFP4_BLOCK, 0, 0, 1, 0},
};

// The blocksize a run uses: `blocksize`, or the format's default when it is <= 0 (--blocksize 0).
// MXFP4's is always 32 (the planner refuses another --blocksize with it).
static inline int mt_q4_blocksize_or_default(mt_quant type, int blocksize) {
    if (type == MT_QUANT_MXFP4) return MT_MXFP4_BLOCK;
    if (blocksize > 0 || type > MT_QUANT_INT4) return blocksize;
    return mt_qformats[type].default_blocksize;
}

// Blocksizes every format accepts: bitsandbytes' {32, 64, ..., 4096} (32 since 0.50.0).
MT_QF_FN int mt_q4_blocksize_ok(int bs) {
    return bs >= 32 && bs <= 4096 && (bs & (bs - 1)) == 0;
}

// Bytes of the quantized weight on its backend, `base` in the ledger: packed codes, per-block
// constants, and with double quantization the fp32 nested absmax. The same arithmetic as the
// planner's (plan/plan.c, mt_plan_linear_bytes). The maps are shared constants and not
// counted; only an imported weight whose nested map is not the canonical one carries its own
// copy (+1 KiB, see mt_qweight.nested_map).
MT_QF_FN uint64_t mt_q4_weight_bytes(mt_quant type, int64_t n, int blocksize, int double_quant) {
    int64_t blocks = mt_q4_blocks(n, blocksize);
    uint64_t b = (uint64_t)mt_q4_packed_bytes(n);
    if (type == MT_QUANT_MXFP4) return b + (uint64_t)blocks;  // one e8m0 byte a block: 4.25 bits
    if (type == MT_QUANT_INT4 || !double_quant) return b + 4 * (uint64_t)blocks;
    return b + (uint64_t)blocks + 4 * (uint64_t)mt_q4_blocks(blocks, MT_Q4_NESTED_BLOCKSIZE);
}

// ---------------------------------------------------------------------------------------------
// Host tables and the checks on them

// (Host memory: device code uses __constant__ copies made from the same lists, quant/quant.cu.)
static const float mt_nf4_map[] = {MT_NF4_MAP_VALUES};
static const float mt_fp4_map[] = {MT_FP4_MAP_VALUES};
static const float mt_fp4_quant_map[] = {MT_FP4_QUANT_MAP_VALUES};
static const float mt_dynamic_map[] = {MT_DYNAMIC_MAP_VALUES};
static const float mt_e2m1_map[] = {MT_E2M1_VALUES};
static_assert(sizeof(float) == 4 && sizeof(uint16_t) == 2, "fp32 and fp16 storage");
static_assert(sizeof mt_nf4_map == 16 * sizeof(float), "NF4 codebook: 16 entries");
static_assert(sizeof mt_fp4_map == 16 * sizeof(float), "FP4 codebook: 16 entries");
static_assert(sizeof mt_fp4_quant_map == sizeof mt_fp4_map, "FP4 stored map: 16 entries");
static_assert(sizeof mt_dynamic_map == 256 * sizeof(float), "dynamic map: 256 entries");
static_assert(sizeof mt_e2m1_map == 16 * sizeof(float), "e2m1 table: 16 entries");
static_assert(MT_QUANT_NF4 == 0 && MT_QUANT_FP4 == 1 && MT_QUANT_INT4 == 2 && MT_QUANT_MXFP4 == 3,
              "mt_qformats[] is indexed by mt_quant");
static_assert(MT_Q4_CHUNK % 4096 == 0, "a chunk holds whole blocks of every blocksize");

// The dequantization table, and the quant_map as bitsandbytes stores it (equal as values).
static inline const float *mt_q4_map(mt_quant type) {
    return type == MT_QUANT_FP4 ? mt_fp4_map : mt_nf4_map;
}
static inline const float *mt_q4_quant_map(mt_quant type) {
    return type == MT_QUANT_FP4 ? mt_fp4_quant_map : mt_nf4_map;
}

#ifdef __cplusplus
}
#endif
