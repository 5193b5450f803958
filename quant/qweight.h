// quant/qweight.h — the frozen 4-bit weight (NF4, FP4, INT4, MXFP4): quantize, dequantize, and the two
// matmuls training needs through it. Formats: quant/formats.h; checkpoints and loading:
// quant/quant.h. Memory: every byte on the weight's backend through the ledger.
//
//   mt_qweight q;
//   mt_qweight_quantize(&q, be, "model.layers.0...w1.weight", w, out, in, MT_QUANT_NF4, 64, 1);
//   mt_qweight_matmul_cpu(y, x, &q, n, 0);        // y [n, out] = x [n, in] · Wᵀ
//   mt_qweight_matmul_t_cpu(dx, dy, &q, n);       // dx [n, in] += dy [n, out] · W
//   mt_qweight_free(&q);
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"
#include "quant/formats.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---------------------------------------------------------------------------------------------
// The frozen weight

typedef struct mt_qweight {   // a frozen 4-bit weight [out, in] on a backend, ledger category base
    mt_quant type;            // MT_QUANT_NF4 / FP4 / INT4 / MXFP4
    int blocksize, double_quant;  // MXFP4: 32 and 0, always
    int64_t out, in;
    int64_t nblocks;          // ceil(out·in / blocksize)
    mt_backend *be;
    mt_dtype dtype;           // the unquantized weight's dtype (quant_state "dtype"); f32 unless set
    mt_tensor *packed;        // U8 [ceil(out·in/2)]: codes, element 2j in the high nibble of byte j
                              // MXFP4: U8 [out·in/2], element 2j in the LOW nibble: the bytes of a
                              // checkpoint's `P_blocks` [out, in/32, 16] as stored
    mt_tensor *absmax;        // NF4/FP4: F32 [nblocks]; double quant: U8 [nblocks] (8-bit codes)
                              // INT4: F16 [nblocks], the scales d
                              // MXFP4: U8 [nblocks] = [out, in/32], the e8m0 scales (`P_scales`)
    mt_tensor *zero;          // INT4: F16 [nblocks], the minimums m; NULL otherwise
    mt_tensor *nested_absmax; // double quant: F32 [ceil(nblocks/256)]
    mt_tensor *nested_map;    // double quant: NULL for the canonical dynamic map (a shared
                              // constant, MT_DYNAMIC_MAP_VALUES); F32 [256] only for an import
                              // whose file stores another map (old bitsandbytes CPU builds did)
    float offset;             // double quant: added back to every rebuilt absmax
} mt_qweight;

// Quantize w [out, in] (f32 host memory) onto backend `be`; 0 or -1 with an error naming `name`.
// blocksize <= 0 takes the format's default (64 NF4/FP4, 128 INT4); double_quant is ignored for
// INT4 and MXFP4, which have none. MXFP4 takes blocksize 32 (or <= 0) and in % 32 == 0 only. Refuses NaN/Inf and, for INT4, values beyond fp16's range. On the null
// backend the bytes are counted in the ledger and nothing is computed (w may be NULL). On the
// cuda backend w is uploaded in chunks and quantized by the CUDA kernels (quant/quant.cu).
int mt_qweight_quantize(mt_qweight *q, mt_backend *be, const char *name, const float *w, int64_t out,
                        int64_t in, mt_quant type, int blocksize, int double_quant);
// The same from f32, bf16 or f16 host data. `consumed`, when not NULL, is called with each
// stretch of `w` once it has been read (the loader drops those mmapped pages).
typedef void (*mt_quant_consumed_fn)(const void *p, size_t bytes);
int mt_qweight_quantize_from(mt_qweight *q, mt_backend *be, const char *name, const void *w,
                             mt_dtype wt, int64_t out, int64_t in, mt_quant type, int blocksize,
                             int double_quant, mt_quant_consumed_fn consumed);
void mt_qweight_free(mt_qweight *q);  // releases every tensor; the struct is zeroed
// MXFP4 from a checkpoint's bytes, kept as they are (no re-quantization): blocks [out, in/32, 16]
// (blocks_bytes = out·in/2) and scales [out, in/32] (e8m0) onto `be`, ledger category base. 0, or
// -1 with an error naming `name` for in % 32 != 0 or sizes that do not match [out, in]. On the
// null backend only the bytes are counted (the pointers may be NULL).
int mt_qweight_from_mxfp4(mt_qweight *q, mt_backend *be, const char *name, const uint8_t *blocks,
                          size_t blocks_bytes, const uint8_t *scales, size_t scales_bytes, int64_t out, int64_t in);
// An allocated, unfilled q (the importer fills it); own_map: room for a non-canonical nested map.
int mt_qweight_alloc(mt_qweight *q, mt_backend *be, const char *name, int64_t out, int64_t in,
                     mt_quant type, int blocksize, int double_quant, int own_map);
// A copy of src on src's backend, named `name` in errors: the same bits, copied device to device
// (a random model's experts share their values: one quantization, then copies). 0 or -1.
int mt_qweight_clone(mt_qweight *dst, const mt_qweight *src, const char *name);
// Bytes held on the backend (what the ledger counts under base for it).
uint64_t mt_qweight_bytes(const mt_qweight *q);
// Gives q's codes and block constants back (the ledger's base with them) and keeps its
// description (type, shape, block size), which still marks its Linear frozen 4-bit: for a weight
// kept dequantized elsewhere (model/mixtral.c, --expert-cache). Dequantizing it after is refused
// (mt_qweight_dequantize: -1; the cuda and cpu row paths: a fatal error naming the weight's shape).
void mt_qweight_release_codes(mt_qweight *q);
static inline int mt_qweight_has_codes(const mt_qweight *q) { return q->packed != NULL; }

// Bytes one whole dequantization (mt_qweight_dequantize on cuda: quant/quant.cu) moves through
// device memory: it reads every packed code and every block constant (NF4/FP4 fp32 absmax;
// double quant: the 8-bit codes, the fp32 nested absmax and the 256-entry nested map, 1 KiB;
// INT4: fp16 scale and minimum; MXFP4: the e8m0 byte) once, and writes out·in elements of `dst` (bf16 or f32). The
// 16-entry codebook sits in shared memory and is not counted. For GB/s against the card's copy
// bandwidth (scripts/bench_gpu.c) and the roofline (scripts/roofline.c), which has no weight.
static inline uint64_t mt_qweight_dequant_bytes_of(mt_quant type, int64_t out, int64_t in, int blocksize,
                                                   int double_quant, mt_dtype dst) {
    int64_t n = out * in;
    int dq = type != MT_QUANT_INT4 && type != MT_QUANT_MXFP4 && double_quant;
    return mt_q4_weight_bytes(type, n, mt_q4_blocksize_or_default(type, blocksize), dq) + (dq ? 256u * 4u : 0u) +
           (uint64_t)mt_dtype_bytes(dst, (size_t)n);
}
static inline uint64_t mt_qweight_dequant_bytes(const mt_qweight *q, mt_dtype dst) {
    return mt_qweight_dequant_bytes_of(q->type, q->out, q->in, q->blocksize, q->double_quant, dst);
}

// Values the cpu has dequantized to f32 since the program started (every thread): how tests
// count the dequantizations a training step makes.
uint64_t mt_qweight_cpu_dequantized(void);
// CPU backend. Rows [row0, row0+nrows) dequantized to f32 / bf16 host memory.
void mt_qweight_dequantize_rows_cpu(const mt_qweight *q, float *dst, int64_t row0, int64_t nrows);
void mt_qweight_dequantize_rows_bf16_cpu(const mt_qweight *q, uint16_t *dst, int64_t row0,
                                         int64_t nrows);
// y [n, out] = x [n, in] · Wᵀ (accumulate != 0: y +=). dx [n, in] += dy [n, out] · W.
// Tile by tile: rows of W are dequantized MT_QMATMUL_TILE_BYTES at a time into one f32 tile,
// allocated through the ledger under `work` on the weight's backend and released before
// returning, and multiplied with OpenBLAS; no whole dequantized W ever exists. 0, or -1 when the
// ledger refuses the tile. On the null backend the tile is reserved and released, nothing
// computed (0): a counted step makes the cpu step's allocations.
#define MT_QMATMUL_TILE_BYTES (4u << 20)
int mt_qweight_matmul_cpu(float *y, const float *x, const mt_qweight *q, int64_t n, int accumulate);
int mt_qweight_matmul_t_cpu(float *dx, const float *dy, const mt_qweight *q, int64_t n);

// Any backend. The whole W into dst, a tensor on q's backend of F32 or BF16 with at least
// out·in elements (a reused scratch; its shape is not looked at).
int mt_qweight_dequantize(const mt_qweight *q, mt_tensor *dst);
// W into the first out rows of dst, a 2-D view on q's backend (core/backend.h mt_view2: its row
// stride may exceed in, leaving room beside each row), bf16 or f32 (the cpu: f32 only), at least
// [out, in]; cuda: on the backend's stream, a stride above in a multiple of 8. 0 or -1.
int mt_qweight_dequantize_2d(const mt_qweight *q, const mt_tensor *dst);
// W into `scratch` (as above) and w = a [out, in] view of it, for mt_matmul: a layer dequantized
// once serves the forward recompute and the backward (dx = dy · W with trans_b = 0, never a
// transposed copy).
int mt_qweight_dequantize_view(const mt_qweight *q, mt_tensor *scratch, mt_tensor *w);
// The expert path of every backend: W is dequantized into `scratch` (as above; bf16 on cuda,
// f32 on cpu) and multiplied by the backend's matmul (cuBLASLt on cuda), so that one scratch
// serves every expert in turn and no two experts' dense weights ever coexist.
//   y [n, out] = x [n, in] · Wᵀ + beta · y          (mt_qweight_matmul)
//   dx [n, in] = dy [n, out] · W + beta · dx        (mt_qweight_matmul_t; beta 1 accumulates)
// x/y (dy/dx) are tensors on q's backend in a dtype its matmul takes with the scratch's.
int mt_qweight_matmul(mt_tensor *y, const mt_tensor *x, const mt_qweight *q, mt_tensor *scratch,
                      float beta);
int mt_qweight_matmul_t(mt_tensor *dx, const mt_tensor *dy, const mt_qweight *q, mt_tensor *scratch,
                        float beta);

#ifdef __cplusplus
}
#endif
