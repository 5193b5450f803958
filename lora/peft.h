// lora/peft.h — reading PEFT LoRA adapter folders (FORMATS.md §2): adapter_config.json and
// adapter_model.safetensors with keys "base_model.model.<module>.lora_{A,B}.weight".
#pragma once
#include "core/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_peft_config {
    int r;
    double lora_alpha;
    double lora_dropout;
    int use_rslora;
} mt_peft_config;

// Called once per adapted module with its A [r, in] and B [out, r] tensors (any float dtype).
// Return non-zero (with mt_error_set) to stop.
typedef int (*mt_peft_pair_fn)(void *ctx, const char *module, const mt_st_tensor *a,
                               const mt_st_tensor *b);

// Reads the folder's config and walks its adapter pairs. Errors name the file and the key:
// a lora_A without its lora_B, an unknown key form, a rank that differs from the config's r
// (rank_pattern is not supported), DoRA or bias terms.
int mt_peft_read(const char *dir, mt_peft_config *cfg, mt_peft_pair_fn fn, void *ctx);

#ifdef __cplusplus
}
#endif
