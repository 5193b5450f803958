// core/rng.c — xoshiro256** (Blackman & Vigna) with splitmix64 seeding.
#include "core/rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void mt_rng_seed(mt_rng *r, uint64_t seed, uint64_t stream) {
    uint64_t x = seed ^ (stream * 0xd1b54a32d192ed03ull);
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t mt_rng_next(mt_rng *r) {
    uint64_t *s = r->s, result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float mt_rng_uniform(mt_rng *r) { return (float)(mt_rng_next(r) >> 40) * (1.0f / 16777216.0f); }

float mt_rng_normal(mt_rng *r) {
    // 1 - u keeps the log argument in (0, 1].
    float u1 = 1.0f - mt_rng_uniform(r), u2 = mt_rng_uniform(r);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853071795864f * u2);
}

uint64_t mt_hash_string(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}
