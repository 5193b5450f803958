// lora/lora_dropout.h — LoRA's inverted-dropout factor, one definition for C and CUDA: the mask
// is a pure function of (seed, element index), so the CPU, the GPU, backward and recomputation
// all regenerate the same mask instead of storing it.
#pragma once
#include <stdint.h>

#ifdef __CUDACC__
#define MT_LORA_HD __host__ __device__
#else
#define MT_LORA_HD
#endif

// 0 or 1/(1-p) for element i (splitmix64 of seed + (i+1)·golden; 24 bits against p).
static inline MT_LORA_HD float mt_lora_dropout_factor(uint64_t seed, float p, uint64_t i) {
    uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f) < p ? 0.0f : 1.0f / (1.0f - p);
}
