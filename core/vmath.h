// core/vmath.h — element-wise math that GCC vectorizes, and the attribute that builds a hot
// function twice (x86-64-v3: AVX2 + FMA, and the portable baseline) with a runtime pick.
//
// mt_vexpf is written without calls or branches (selects, a magic-number rounding, integer
// shifts), so a loop over it under `#pragma omp simd` becomes vector code on any x86-64 level.
#pragma once
#include <stdint.h>

// MT_HOT: built for x86-64-v3 and for the baseline, chosen at load time by an ifunc resolver
// (GCC's target_clones). Off under the sanitizers (ifuncs and ASan's interceptors don't mix)
// and on other architectures, where it is the plain function.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(MT_NO_CLONES)
#define MT_HOT __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define MT_HOT
#endif

// exp(x) in fp32 to ~2 ulp for x in [−87, 88.37]; 0 below −87 (and for −inf); above 88.37 it
// saturates at exp(88.37) ≈ 2.4e38 (callers only need 'huge' there: a sigmoid's 1/(1 + e)).
// NaN in gives an unspecified finite or NaN value: callers never pass one.
// exp(x) = 2^n · e^r with n = round(x / ln 2), r = x − n ln 2 (two-part ln 2), e^r by Cephes'
// degree-6 polynomial on |r| ≤ ln2/2.
static inline float mt_vexpf(float x) {
    const float hi = 88.37f, lo = -87.0f;  // 2^n stays a normal float: n ≤ 127
    float xc = x > hi ? hi : x;
    xc = xc < lo ? lo : xc;
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    // 2^n built in the exponent bits; 0 below lo. (An integer select: GCC if-converts it inside
    // a vector loop, where a float select after a multiply stays a branch under -ftrapping-math.)
    int32_t bits = ((int32_t)n + 127) << 23;
    bits = x < lo ? 0 : bits;
    union { int32_t i; float f; } scale = {.i = bits};
    return p * scale.f;
}
