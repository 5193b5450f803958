// trainer/cmd/fused_write.h — gpt-oss's fused experts (model/fused_experts.h) written by `merge` and
// `quantize`: each expert's Linears gathered from the base (dense, or the release's MXFP4 rows),
// changed by the caller (merge: re-quantized as training's load did, replaced by a trained tensor,
// plus a LoRA delta; quantize: unchanged), and put back, dense in the output dtype or quantized to
// MXFP4 with the error counted.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/safetensors.h"
#include "model/family.h"
#include "model/weights.h"

// Changes expert `e`'s Linear `module` (its name without ".weight"), W [out, in] in f32, in place.
// `mxfp4_base`: W came from MXFP4 bytes (nothing to re-quantize). 0, or -1 with an error.
typedef int (*mt_fused_apply_fn)(void *ctx, const char *module, float *w, int64_t out, int64_t in, int mxfp4_base);

// What re-quantizing the merged experts to MXFP4 cost, over every fused tensor written so.
typedef struct {
    double err2, w2, delta2;  // Σ (q(W') − W')², Σ W'², Σ (W' − W)²
    double max_err;
    int64_t n;
} mt_fused_mxfp4_error;

typedef struct {
    const mt_st_model *st;
    const mt_family *fam;
    int64_t hidden, inter;
    mt_fused_apply_fn apply;  // NULL: the experts as the base holds them
    void *ctx;
    mt_fused_mxfp4_error err;
    uint8_t *scales;  // the MXFP4 scales of the tensor whose blocks were written last
    size_t scales_bytes;
} mt_fused_write;

// The base holds fused tensor `d` (dense with its shape, or MXFP4 "_blocks" / "_scales"): 0, or -1
// with an error naming the tensor.
int mt_fused_write_check(const mt_fused_write *f, const mt_weight_desc *d);
// 1 when the base stores `d` as MXFP4.
int mt_fused_write_is_mxfp4(const mt_fused_write *f, const mt_weight_desc *d);
// The output entries of `d`: one dense [E, in, rows] in `dtype`, or (mxfp4) "_blocks" U8
// [E, rows, in/32, 16] then "_scales" U8 [E, rows, in/32]. Names are kept in `names` (2 × 160 bytes).
int mt_fused_write_entries(const mt_weight_desc *d, int mxfp4, const char *dtype, char names[2][160],
                           mt_st_entry *e);
// Fills entry `part` of `d` (0: the dense tensor or the blocks, 1: the scales written with them).
int mt_fused_write_fill(mt_fused_write *f, const mt_weight_desc *d, int mxfp4_out, mt_dtype out_dtype, int part,
                        void *dst, size_t nbytes);
void mt_fused_write_free(mt_fused_write *f);
