// core/rng.h — reproducible random numbers: xoshiro256** seeded through splitmix64.
// Streams are derived from (seed, stream id), so a tensor's values do not depend on which
// other tensors were drawn before it (sharding, ranks and resume cannot change them).
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_rng { uint64_t s[4]; } mt_rng;

void mt_rng_seed(mt_rng *r, uint64_t seed, uint64_t stream);
uint64_t mt_rng_next(mt_rng *r);
float mt_rng_uniform(mt_rng *r);               // [0, 1), 24 random bits
float mt_rng_normal(mt_rng *r);                // N(0, 1), Box-Muller
uint64_t mt_hash_string(const char *s);        // FNV-1a, for stream ids from names

#ifdef __cplusplus
}
#endif
