// dtype conversions: bf16 and f16 round to nearest even, specials survive.
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/dtype.h"

Test(dtype, bf16_round_to_nearest_even) {
    cr_assert_eq(mt_f32_to_bf16(1.0f), 0x3f80);
    // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
    cr_assert_eq(mt_f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);
    // 1 + 3·2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even): rounds up.
    cr_assert_eq(mt_f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
    cr_assert_eq(mt_f32_to_bf16(-2.0f), 0xc000);
    cr_assert(isnan(mt_bf16_to_f32(mt_f32_to_bf16(NAN))));
    cr_assert(isinf(mt_bf16_to_f32(mt_f32_to_bf16(INFINITY))));
    cr_assert_eq(mt_bf16_to_f32(0x3f80), 1.0f);
}

Test(dtype, f16_exact_values_and_rounding) {
    cr_assert_eq(mt_f32_to_f16(1.0f), 0x3c00);
    cr_assert_eq(mt_f32_to_f16(-2.5f), 0xc100);
    cr_assert_eq(mt_f32_to_f16(65504.0f), 0x7bff);
    cr_assert_eq(mt_f32_to_f16(1e6f), 0x7c00);
    cr_assert_eq(mt_f32_to_f16(5.9604645e-08f), 0x0001, "smallest subnormal");
    cr_assert_eq(mt_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00, "tie to even");
    for (uint32_t h = 0; h < 0x7c00; h += 7)  // every 7th finite positive half round-trips
        cr_assert_eq(mt_f32_to_f16(mt_f16_to_f32((uint16_t)h)), h, "h=%#x", h);
}

Test(dtype, names_and_sizes) {
    mt_dtype t;
    cr_assert_eq(mt_dtype_parse("bfloat16", &t), 0);
    cr_assert_eq(t, MT_BF16);
    cr_assert_neq(mt_dtype_parse("float64", &t), 0);
    cr_assert_eq(mt_dtype_bytes(MT_Q4, 7), 4);
    cr_assert_eq(mt_dtype_bytes(MT_BF16, 7), 14);
}

// mt_convert's vector loops (bf16 <-> f32) give each element's bits exactly as the scalar
// functions do: ties, NaN, inf, subnormals, signed zero, from an unaligned source, odd lengths,
// and a length past 2^15 elements, where the loops split over the threads.
Test(dtype, convert_buffers_match_element_functions) {
    enum { N = (1 << 15) + 1027 };
    static const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x7fc00000u, 0xff800001u, 0x7f800000u,
                                       0x00000001u, 0x80000000u, 0x7f7fffffu, 0x3f80ffffu};
    static float f[N];
    static uint16_t h[N];
    for (int i = 0; i < N; i++) {
        uint32_t u = (uint32_t)i * 2654435761u;  // spread over exponents and mantissas
        if (i < (int)(sizeof special / sizeof *special)) u = special[i];
        memcpy(&f[i], &u, 4);
        h[i] = (uint16_t)(u >> 7);
    }
    static unsigned char src[4 * N + 1];
    static uint16_t got_h[N];
    static float got_f[N];
    for (int len = 0; len <= N; len += len < 40 ? 1 : len < 1024 ? 331 : len < N ? N - len : 1) {
        memcpy(src + 1, f, 4 * (size_t)len);  // + 1: the mmapped source has no alignment
        mt_convert(got_h, MT_BF16, src + 1, MT_F32, (size_t)len);
        int bad = -1;  // the first element that differs (one assertion a buffer: Criterion reports each)
        for (int i = 0; i < len && bad < 0; i++)
            if (got_h[i] != mt_f32_to_bf16(f[i])) bad = i;
        cr_assert_eq(bad, -1, "f32 -> bf16, len %d: element %d differs", len, bad);
        memcpy(src + 1, h, 2 * (size_t)len);
        mt_convert(got_f, MT_F32, src + 1, MT_BF16, (size_t)len);
        for (int i = 0; i < len && bad < 0; i++) {
            float want = mt_bf16_to_f32(h[i]);
            if (memcmp(&got_f[i], &want, 4) != 0) bad = i;
        }
        cr_assert_eq(bad, -1, "bf16 -> f32, len %d: element %d differs", len, bad);
    }
}
