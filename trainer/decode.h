// trainer/decode.h — greedy decoding with the model's own forward (no KV cache: each new token
// reruns the whole sequence, which is fine for the tiny models this serves on the CPU).
#pragma once
#include <stdint.h>

#include "model/mixtral.h"

// Appends up to max_new tokens to prompt [n] greedily, stopping after `eos`. Writes them to
// out[] and returns how many (eos included), or -1 with an error.
int mt_greedy_decode(mt_model *m, const int32_t *prompt, int n, int max_new, int32_t eos, int32_t *out);
