// quant/ — the 4-bit frozen-weight formats (NF4, FP4, INT4): quantize, dequantize, 4-bit
// matmuls, bitsandbytes checkpoints, quantize-on-load. Uses core/; used by model/ (its frozen
// Linears), plan/ (byte counts), trainer/ (quantize, merge). This is its main header.
//
// quant/quant.h — everything of quant/ beyond the weight object (quant/qweight.h): the scalar
// building blocks, bitsandbytes checkpoints (import, export), quantize-on-load, and the CUDA
// kernels' entry points.
#pragma once
#include <stdint.h>

#include "core/backend.h"
#include "core/safetensors.h"
#include "quant/formats.h"
#include "quant/qweight.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---------------------------------------------------------------------------------------------
// Building blocks on flat host arrays: the scalar reference every other path is tested against.
// Element indices are flat indices of the [out, in] weight.

// max |x| of a block (finite x).
float mt_q4_block_absmax(const float *x, int64_t len);
// NF4/FP4: packed [ceil(n/2)] and absmax [ceil(n/bs)] of x [n], by the CUDA rule.
void mt_q4_quantize_ref(mt_quant type, const float *x, int64_t n, int blocksize, uint8_t *packed,
                        float *absmax);
// y [i1 - i0] = map[code_i] · absmax[i / bs] for i in [i0, i1).
void mt_q4_dequantize_ref(const float *map, const uint8_t *packed, const float *absmax,
                          int blocksize, int64_t i0, int64_t i1, float *y);
// The same with scales [b - b0] for the blocks b that [i0, i1) touches (b0 = i0 / bs).
void mt_q4_dequantize_blocks(const float *map, const uint8_t *packed, const float *scales,
                             int blocksize, int64_t i0, int64_t i1, float *y);
// The same without its AVX2 path (tests hold the fast path to it).
void mt_q4_dequantize_blocks_scalar(const float *map, const uint8_t *packed, const float *scales,
                                    int blocksize, int64_t i0, int64_t i1, float *y);
// Double quantization: offset = mean(absmax) (accumulated in double, rounded once);
// codes [nb] and nested_absmax [ceil(nb/256)] of absmax − offset, by the CUDA rule.
float mt_q8_offset(const float *absmax, int64_t nb);
void mt_q8_quantize_ref(const float *map256, const float *absmax, int64_t nb, float offset,
                        uint8_t *codes, float *nested_absmax);
// absmax [b1 - b0] = map256[codes_b] · nested_absmax[b / 256] + offset for b in [b0, b1).
void mt_q8_dequantize_ref(const float *map256, const uint8_t *codes, const float *nested_absmax,
                          float offset, int64_t b0, int64_t b1, float *absmax);
// INT4: packed, scale and minimum (fp16 bits) per group of x [n].
void mt_int4_quantize_ref(const float *x, int64_t n, int group, uint8_t *packed, uint16_t *scale,
                          uint16_t *minimum);
void mt_int4_dequantize_ref(const uint8_t *packed, const uint16_t *scale, const uint16_t *minimum,
                            int group, int64_t i0, int64_t i1, float *y);
// MXFP4 (quant/mxfp4.c): packed [n/2] (element 2j in the low nibble) and e8m0 scales [n/32] of
// x [n], n a multiple of 32, by downcast_to_mxfp_torch's rule; y [i1 - i0] = e2m1[code_i] ·
// 2^(scales[i/32] − 127) for i in [i0, i1).
void mt_mxfp4_quantize_ref(const float *x, int64_t n, uint8_t *packed, uint8_t *scales);
void mt_mxfp4_dequantize_ref(const uint8_t *packed, const uint8_t *scales, int64_t i0, int64_t i1, float *y);

// Block FP8 (quant/fp8.c; docs/formats.md "Block FP8"), read only: y [out, in] = e4m3(w[i][j]) ·
// scale_inv[i / br][j / bc], one fp32 rounding (transformers' dequantization); scale_inv is
// [ceil(out / br), ceil(in / bc)], a ragged edge using its edge block's scale.
void mt_fp8_dequantize_ref(const uint8_t *w, const float *scale_inv, int64_t out, int64_t in, int br, int bc,
                           float *y);
// The f32 values (caller frees) of t, an F8_E4M3 weight "P.weight", with "P.weight_scale_inv" (F32,
// BF16 or F16) from m, blocks of block[0] × block[1] (config.json's weight_block_size). NULL with
// an error naming the file and the tensor: no block size declared, not 2-D, the scale missing, of
// the wrong shape or dtype, or not finite.
float *mt_fp8_dequantize_tensor(const mt_st_model *m, const mt_st_tensor *t, const int block[2]);
// Whether `name` is a block-FP8 scale ("P.weight_scale_inv": read with P.weight, never on its own);
// P.weight into base (n bytes) when it is.
int mt_fp8_scale_base(const char *name, char *base, size_t n);

// ---------------------------------------------------------------------------------------------
// bitsandbytes checkpoints (docs/formats.md "Serialized quant_state"). For a weight "P.weight": P.weight (U8 [n/2, 1]),
// P.weight.absmax, P.weight.quant_map, [P.weight.nested_absmax, P.weight.nested_quant_map],
// P.weight.quant_state.bitsandbytes__nf4|fp4 (JSON bytes). INT4 uses the same layout with
// P.weight.absmax holding the fp16 scales, P.weight.zero the fp16 minimums and
// P.weight.quant_state.moetrain__int4; it is moetrain's own and no other tool reads it.

typedef struct mt_bnb_parts {  // the tensors of one serialised weight, NULL where absent
    const mt_st_tensor *weight, *absmax, *zero, *quant_map, *nested_absmax, *nested_quant_map,
        *quant_state;
    const char *quant_state_key;  // the quant_state tensor's full name (its suffix names the type)
} mt_bnb_parts;

// Finds P.weight's parts in a checkpoint. Returns 1 when `name` carries a quant_state, 0 when it
// is a plain tensor, -1 with an error when parts exist without their quant_state.
int mt_bnb_find_parts(const mt_st_model *m, const char *name, mt_bnb_parts *parts);
// 1 when `name` is one of a serialised weight's companion tensors (".absmax", ".quant_map", ...).
int mt_bnb_is_part_name(const char *name);
// Loads a serialised weight onto `be` without re-quantizing (the maps stored in the file are the
// ones used). 0, or -1 with an error naming the tensor: malformed quant_state JSON, a missing or
// mistyped or misshapen part, a 4-bit map that is not the format's codebook.
int mt_qweight_import(mt_qweight *q, mt_backend *be, const char *name, const mt_bnb_parts *parts);

// The entries that serialise q as weight `name` ("P.weight"), in bitsandbytes' order (MXFP4: "P_blocks"
// U8 [out, in/32, 16] and "P_scales" U8 [out, in/32], gpt-oss's layout, no quant_state). The
// quant_state JSON is what bitsandbytes' json.dumps writes, byte for byte. Entries point into
// host memory owned by `ex` (q is downloaded when it is not on the cpu backend), valid until
// mt_bnb_export_free(ex). Names are allocated too. For q on the null backend the entries are
// the layout alone: names, dtypes, shapes and the quant_state, other data NULL.
typedef struct mt_bnb_entries {
    mt_st_entry entries[6];
    size_t n;
    void *bufs[16];  // owned host copies and names
    int nbufs;
} mt_bnb_entries;
int mt_bnb_export(mt_bnb_entries *ex, const char *name, const mt_qweight *q);
void mt_bnb_export_free(mt_bnb_entries *ex);
// The quant_state JSON of q (NUL-terminated, caller frees); shape is the weight's [out, in].
char *mt_bnb_quant_state_json(const mt_qweight *q);
// Python's repr() of a double, as json.dumps writes floats ("0.0123", "1e-05", "2.5").
void mt_py_float_repr(double v, char *buf, size_t n);

// The double-quant offset that quantizing w [n] (f32, bf16 or f16) would give, without
// quantizing it: the same block absmax and the same mean (`moetrain quantize` needs the
// quant_state's length before it writes the tensor).
float mt_q4_offset_from(const void *w, mt_dtype wt, int64_t n, int blocksize,
                        mt_quant_consumed_fn consumed);
// Drops the pages of [p, p + n) of a read-only mmap from this process (re-read if touched).
void mt_quant_drop_pages(const void *p, size_t n);

// ---------------------------------------------------------------------------------------------
// Loading checkpoints, tensor by tensor

// What a dense checkpoint quantizes (a bnb-4bit checkpoint's own choice is kept, see below).
enum {
    // Every MLP's projections: block_sparse_moe.experts.E.w1/w2/w3 (and *.experts.E.*_proj), and
    // Qwen's shared expert (mlp.shared_expert.*_proj) and dense layers' MLP (mlp.*_proj). The
    // shared expert's gate [1, H] stays dense: one row, nothing to save.
    MT_QTARGET_EXPERTS = 1 << 0,
    MT_QTARGET_ATTN = 1 << 1,     // self_attn.q_proj/k_proj/v_proj/o_proj
    MT_QTARGET_ROUTER = 1 << 2,   // block_sparse_moe.gate (mlp.gate)
    MT_QTARGET_ALL = MT_QTARGET_EXPERTS | MT_QTARGET_ATTN | MT_QTARGET_ROUTER,
    // Default: experts and attention. The router stays in full precision: it is tiny (h·E,
    // 32,768 params per Mixtral layer, 2.1 MB for the model in bf16), its logits decide which
    // experts run, and it is a training target in the router and unfreeze modes, where a
    // frozen 4-bit copy would be useless. bitsandbytes does quantize it (docs/formats.md "Serialized quant_state"), so
    // a bnb-4bit checkpoint arrives with a packed gate: it loads, dequantized to dense, unless
    // the router is among the targets.
    MT_QTARGET_DEFAULT = MT_QTARGET_EXPERTS | MT_QTARGET_ATTN,
};
// Embeddings, norms and lm_head are never quantized: mt_quant_target_of() gives them 0.
unsigned mt_quant_target_of(const char *name);
// "experts,attn,router", "all", "none", "default"; 0 or -1 with an error.
int mt_quant_targets_parse(const char *text, unsigned *out);

// Whether the target `name` is wanted 4-bit (1) or dense (0): a caller's veto per tensor, e.g.
// for a weight that trains in full precision; -1 (asked of every tensor): not wanted at all, so
// it is skipped unread (an expert another rank holds).
typedef int (*mt_quant_want_fn)(void *ctx, const char *name);

typedef struct mt_quant_load_opts {
    mt_quant type;      // format for dense targets; MT_QUANT_NONE: everything arrives dense
    int blocksize;      // <= 0: the format's default
    int double_quant;   // NF4/FP4
    unsigned targets;   // MT_QTARGET_* bits
    mt_quant_want_fn want;  // NULL: every target is wanted; a refused one arrives dense
    void *want_ctx;
    int fp8_block[2];   // block-FP8 checkpoints: config.json's weight_block_size; {0, 0}: none
                        // declared, and an F8_E4M3 weight is refused
} mt_quant_load_opts;
void mt_quant_load_opts_default(mt_quant_load_opts *o);  // NF4, 64, double quant, default targets

// One tensor of the checkpoint, handed to the sink.
typedef struct mt_quant_item {
    const char *name;            // "model.layers.0.block_sparse_moe.experts.0.w1.weight"
    int ndim;
    int64_t shape[MT_ST_MAX_DIMS];  // the unquantized shape
    mt_qweight *q;               // quantized: the sink may take it (copy *q, then zero *q);
                                 // whatever is left is freed after the sink returns
    const void *data;            // dense: the values, valid during the call only (they may point
    mt_dtype dtype;              //   into the file's mmap); F32, BF16 or F16
    int dequantized;             // dense, but stored 4-bit in the file (the values are its
                                 //   dequantization, F32)
    const uint8_t *mx_blocks, *mx_scales;  // "P_blocks" with its "P_scales" (MXFP4 as gpt-oss stores
                                 //   its fused experts, name = "P_blocks"): U8 [..., rows, n/32, 16]
                                 //   and [..., rows, n/32], shape = the blocks'; data is NULL. The
                                 //   sink splits and imports them (mt_qweight_from_mxfp4).
} mt_quant_item;
typedef int (*mt_quant_sink_fn)(void *ctx, mt_quant_item *item);
// Dense values of an item as f32 (numel elements).
void mt_quant_item_to_f32(const mt_quant_item *item, float *dst);

// Streams a checkpoint folder (f32/bf16/f16 safetensors, a bnb-4bit or block-FP8 one) tensor by tensor
// into `sink`, in file order, quantizing targets one at a time onto `be` and dropping each
// tensor's mmapped pages once it is done: peak host memory stays near the largest tensor.
// A "wanted target" is a target (opts->targets) that opts->want, when set, does not refuse.
//   dense tensor, a wanted target, opts->type != NONE    -> quantized (opts' format)
//   serialised 4-bit tensor, a wanted target, type != NONE -> imported as stored (its own format)
//   serialised 4-bit tensor otherwise                    -> dequantized, handed over dense (F32,
//                                                           item->dequantized = 1)
//   block-FP8 weight (F8_E4M3 with its weight_scale_inv) -> dequantized to F32 first, then as a
//                                                           dense tensor (item->dequantized = 0:
//                                                           these releases have no unquantized
//                                                           original to train from instead)
//   anything else                                  -> dense, as stored
// 0, or -1 with an error naming the tensor (a sink's non-zero return stops the load, its error
// kept).
int mt_quant_load(const char *dir, mt_backend *be, const mt_quant_load_opts *opts,
                  mt_quant_sink_fn sink, void *ctx);

// ---------------------------------------------------------------------------------------------
// CUDA kernels (quant/quant.cu; built with CUDA=1). Pointers are device memory of be's GPU.
// Each returns once its work is done (see quant.cu on streams).

#ifdef MT_CUDA
void mt_q4_quantize_cuda(mt_backend *be, mt_quant type, const void *x, mt_dtype xt, int64_t n,
                         int blocksize, uint8_t *packed, float *absmax);
void mt_q8_quantize_cuda(mt_backend *be, const float *map256, const float *absmax, int64_t nb,
                         float offset, uint8_t *codes, float *nested_absmax);
void mt_int4_quantize_cuda(mt_backend *be, const void *x, mt_dtype xt, int64_t n, int group,
                           uint8_t *packed, uint16_t *scale, uint16_t *minimum);
void mt_mxfp4_quantize_cuda(mt_backend *be, const void *x, mt_dtype xt, int64_t n, uint8_t *packed,
                            uint8_t *scales);
// Flat elements [i0, i1) of q into dst (F32 or BF16, device memory, element 0 = i0).
void mt_qweight_dequantize_cuda(const mt_qweight *q, void *dst, mt_dtype dt, int64_t i0, int64_t i1);
// The same on `stream` (a cudaStream_t of q's device; NULL: the backend's), returning at once: the
// caller orders it (the experts' scratch is filled on a second stream while the GEMM runs).
void mt_qweight_dequantize_cuda_on(const mt_qweight *q, void *dst, mt_dtype dt, int64_t i0, int64_t i1,
                                   void *stream);
// The whole weight [out, in] into rows `ldd` elements apart (dst's columns [in, ldd) of each row
// are left as they were: model/grouped_cuda.cu puts a LoRA's B there), on `stream` as above.
// ldd == in is the whole weight as one block (mt_qweight_dequantize_cuda_on); otherwise -1 with
// mt_error set unless in and ldd are multiples of 8, ldd > in, dst is 16-byte aligned and the
// weight has fewer than 2^31 elements.
int mt_qweight_dequantize_rows_cuda_on(const mt_qweight *q, void *dst, mt_dtype dt, int64_t ldd, void *stream);
// The whole-weight dequantization kernel (quant/quant.cu): 0 the coalesced one, 8 elements an item
// (the default); 1 the earlier 32 contiguous elements a thread, kept until a GPU times both
// (scripts/bench_gpu.c prints each one's bandwidth). The same values either way.
void mt_dequant_cuda_kernel(int which);
#endif

#ifdef __cplusplus
}
#endif
