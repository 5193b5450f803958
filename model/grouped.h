// model/grouped.h — a layer's experts' GEMMs, each kind as ONE call for every expert (CUDA:
// model/grouped_cuda.cu). The rows of expert e are [off[e], off[e+1]) of the layer's permuted
// buffers (expert order); W_e is that expert's weight: 4-bit (NF4/FP4/INT4: dequantized to a
// bf16 scratch slot just before its cuBLASLt GEMM, two slots double-buffered; optionally a second
// 4-bit weight stacked under it, w1‖w3 as one GEMM of N = 2f) or a dense bf16 matrix (an unfrozen
// expert, a LoRA's A or B).
//
//   C[rows e] = alpha · drop(A[rows e]) · op(W_e) + beta · C[rows e]    mt_grouped_gemm, drop_a
//   C[rows e] = alpha · drop(A[rows e] · op(W_e)) + beta · C[rows e]    mt_grouped_gemm
//   G_e       = alpha · X[rows e]ᵀ · drop_y(Y[rows e]) + beta · G_e            mt_grouped_gemm_tn
//
// op(W) = Wᵀ (trans, W is [N, K]) or W (W is [K, N]). The optional dropout is LoRA's
// (lora/lora_dropout.h): expert e's element (r - off[e], j) of a row-major [n_e, width] matrix
// gets mt_lora_dropout_factor(seed[e], p, (r - off[e]) · width + j), the mask mt_lora_dropout_cuda
// gives that expert's rows when they are passed alone: in mt_grouped_gemm on A (drop_a: the
// forward's xa = drop(x)·Aᵀ) or on C (dx += drop(dxa·A)); in mt_grouped_gemm_tn on Y
// (dA += dxaᵀ · drop(x)). A, X, Y are bf16; C and G bf16 or f32;
// products are bf16 × bf16 summed in fp32 (tensor cores). Any tensor may be a 2-D view with a
// row stride (core/backend.h: mt_view2), as the column blocks of gu [R, 2f] are.
//
// Only the cuda backend computes; the null backend (a counted step) returns 0 having done
// nothing but count the call's scratch in the ledger (`work`, model/expert_scratch.h's sizes:
// the dequantization slots when an expert with rows is 4-bit, the dropout buffer when seed is
// set), which both backends hold for the call's duration.
// A refusal (wrong dtype, shape, more than MT_GROUPED_MAX experts) is -1 with mt_error set.
#pragma once
#include <stdint.h>

#include "core/backend.h"
#include "model/expert_scratch.h"  // MT_GROUPED_MAX: experts in one call; callers split a larger group
#include "quant/qweight.h"

#ifdef __cplusplus
extern "C" {
#endif


typedef struct mt_grouped {
    int experts;                  // E, 1..MT_GROUPED_MAX
    const int64_t *off;           // host [E+1], non-decreasing (off[0] need not be 0), or NULL:
    // the offsets on the device instead (doff: int32 [E+1], what off would hold), which the host
    // never reads (core/gemm_rows.h's grouped matmul takes them; the cuda backend only, when
    // mt_gemm_rows_available): every expert is then taken to have rows, and `rows` bounds doff[E]
    // (the row operands hold that many; the dropout buffer is sized for them).
    const int32_t *doff;
    int64_t rows;
    int64_t rows_hint;            // with doff: the rows these experts are expected to hold (balanced;
                                  // 0: rows), the grouped matmul's hint and the profile's count
    // W_e: 4-bit q[e] [out, in] (trans: N = out, K = in; else K = out, N = in) or dense bf16 w[e]
    // ([N, K] trans, [K, N] else). Per expert exactly one of q[e] and w[e] is set (either array
    // may be NULL when no expert uses it: a layer may mix frozen 4-bit experts with unfrozen
    // dense ones); both NULL: expert e is skipped (its rows of A and C are neither read nor
    // written), as an expert without a LoRA in a layer whose others have one.
    const mt_qweight *const *q;
    const mt_qweight *const *q2;  // or NULL; set: W_e is q[e] [out1, in] stacked over q2[e]
                                  // [out2, in] (both 4-bit, same in): [out1 + out2, in]
    // or NULL; under[e] set (with q[e]): a dense bf16 [ru, in] (contiguous) stacked under the
    // 4-bit rows, copied into the slot after them. A LoRA's A under its Linear's W makes
    // dx = [dy | dxa]·[W; A] one GEMM (K = out + ru): the LoRA's share of dx is never a pass of its own.
    const mt_tensor *const *under;
    // or NULL (not with under); beside[e] set (with q[e]): a dense bf16 [q->out, rb] (contiguous)
    // put to the right of q's rows, times beside_scale, and beside2[e] [q2->out, rb2] to the
    // right of q2's rows after beside's columns (zeros wherever a row has no such block): W_e is
    // [out, in + rb + rb2] (row stride mt_grouped_slot_ld). A LoRA's B beside its Linear's W
    // makes y = [x | xa]·[W | s·B]ᵀ one GEMM (trans: K = in + r), and [dx | dxa] = dy·[W | s·B]
    // one GEMM (dxa = s·dy·B, the LoRA's input gradient's first factor: N = in + r): the LoRA's
    // product is never a pass of its own.
    const mt_tensor *const *beside, *const *beside2;
    float beside_scale;
    // or NULL; cached[e] set (with q[e]): expert e's W kept dequantized (--expert-cache), a bf16
    // [R, ld] matrix with R ≥ mt_grouped_slot_rows, ld ≥ mt_grouped_slot_cols and ld q's in or a
    // multiple of 8, used in place of a scratch slot: W is already in it (dequantized when the
    // model was built: q[e] may have no codes left, mt_qweight_release_codes), and under's rows and
    // beside's columns are written into it at each call (the LoRAs change every step; W is
    // frozen). The call holds no slot for a cached expert.
    mt_tensor *const *cached;
    const mt_tensor *const *w;
    int trans;
    float alpha, beta;            // beta 0 or 1
    const uint64_t *seed;         // [E] dropout seeds, or NULL: no dropout
    float p;                      // dropout probability (used when seed is set)
    int drop_a;                   // mt_grouped_gemm: 1 dropout on A (prologue), 0 on C (epilogue)
} mt_grouped;

// Expert e's W in its scratch slot: rows (q's, q2's, under's) and columns (in, beside's,
// beside2's); the row stride is the columns rounded up to 8 (16-byte rows for the dequantization
// and cuBLASLt). 0 rows: expert e has no 4-bit W.
static inline int64_t mt_grouped_slot_rows(const mt_grouped *g, int e) {
    const mt_qweight *q = g->q ? g->q[e] : NULL, *q2 = g->q2 ? g->q2[e] : NULL;
    const mt_tensor *u = g->under ? g->under[e] : NULL;
    return q ? q->out + (q2 ? q2->out : 0) + (u ? u->shape[0] : 0) : 0;
}
static inline int64_t mt_grouped_slot_cols(const mt_grouped *g, int e) {
    const mt_qweight *q = g->q ? g->q[e] : NULL;
    const mt_tensor *b = g->beside ? g->beside[e] : NULL, *b2 = g->beside2 ? g->beside2[e] : NULL;
    return q ? q->in + (b ? b->shape[1] : 0) + (b2 ? b2->shape[1] : 0) : 0;
}
static inline int64_t mt_grouped_slot_ld(const mt_grouped *g, int e) {
    const mt_tensor *b = g->beside ? g->beside[e] : NULL;
    return b ? (mt_grouped_slot_cols(g, e) + 7) / 8 * 8 : mt_grouped_slot_cols(g, e);
}

// c [R, N] (rows off[0]..off[E]) as above from a [R, K]. Rows outside every expert's range are
// not touched.
int mt_grouped_gemm(mt_tensor *c, const mt_tensor *a, const mt_grouped *g);
// g_e [M, N] (each expert its own tensor, bf16 or f32, contiguous) from x [R, M] and y [R, N];
// mt_grouped's q/w/trans are not used. g[e] NULL: expert e's gradient is not wanted (skipped). An
// expert with no rows leaves beta·G_e (beta 1: unchanged; beta 0: zeroed).
int mt_grouped_gemm_tn(mt_tensor *const *g, const mt_tensor *x, const mt_tensor *y, const mt_grouped *gr);

#ifdef __cplusplus
}
#endif
