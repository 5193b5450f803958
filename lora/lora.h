// lora/ — LoRA adapters: init, forward, backward, dropout, PEFT import/export. Uses core/; used by
// model/ (one adapter per targeted Linear) and trainer/ (merge, eval). This is its main header.
//
// lora/lora.h — one LoRA adapter: y += scale · B · A · dropout(x), PEFT's definition (docs/formats.md "LoRA math").
// Knows nothing of experts or layers: the model attaches one per targeted Linear.
#pragma once
#include <stdint.h>

#include "core/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_lora {
    int64_t in, out;
    int r;
    float scale;          // alpha / r, or alpha / sqrt(r) with rsLoRA
    float dropout;        // probability of dropping an input element (0: none)
    uint64_t dropout_seed;  // the mask is a function of (seed, element), so backward and
                            // recomputation regenerate it instead of storing it
    uint64_t stream;        // this adapter's own stream id (its module name's hash)
    mt_tensor *a, *b;     // A [r, in], B [out, r]: trainable (ledger: train)
    mt_tensor *da, *db;   // their gradients (ledger: grad)
    // mt_lora_init_pair: the first of a pair owns the [2r, in] blocks its and its partner's A and
    // dA lie in (a_block, da_block; NULL otherwise), and both pair members' a and da are views
    // into them (a_view: their structs alone are freed).
    mt_tensor *a_block, *da_block;
    int a_view;
} mt_lora;

// PEFT's default initialisation: A ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform, a = sqrt(5)),
// B = 0, drawn from a stream of (seed, stream). A, B and their gradients are `dtype`: F32 on the
// cpu backend (the only one it computes in), BF16 as a GPU run stores them. 0, or -1 when the
// ledger refuses.
int mt_lora_init(mt_lora *l, mt_backend *be, mt_dtype dtype, int64_t in, int64_t out, int r,
                 double alpha, int rslora, double dropout, uint64_t seed, uint64_t stream);
// Two adapters on Linears of one input (an expert's w1 and w3), each as mt_lora_init makes it
// (its own stream, the same values), with A1 and A3 adjacent in one [2r, in] block, A1's rows
// first, and dA1, dA3 likewise: [A1; A3] is then one matrix (model/experts_gpu.c multiplies x by
// it once). l1 owns the blocks: l3's A and dA live as long as l1 does. The ledger counts the same
// bytes as two mt_lora_init.
int mt_lora_init_pair(mt_lora *l1, mt_lora *l3, mt_backend *be, mt_dtype dtype, int64_t in, int64_t out, int r,
                      double alpha, int rslora, double dropout, uint64_t seed, uint64_t stream1, uint64_t stream3);
// Whether l1's and l3's A, and their dA, are adjacent as mt_lora_init_pair lays them out.
int mt_lora_pair_adjacent(const mt_lora *l1, const mt_lora *l3);
void mt_lora_free(mt_lora *l);

// y [n, out] += scale · (dropout(x) · Aᵀ) · Bᵀ; xa [n, r] receives dropout(x) · Aᵀ for backward.
void mt_lora_forward_cpu(const mt_lora *l, float *y, const float *x, float *xa, int64_t n);
// Its first half alone: xa [n, r] = dropout(x) · Aᵀ (what the backward needs of a forward whose
// output is not wanted again).
void mt_lora_project_cpu(const mt_lora *l, float *xa, const float *x, int64_t n);
// dB += scale · dyᵀ · xa;  dA += (scale · dy · B)ᵀ · dropout(x);  dx += dropout'(scale · dy · B · A).
// dx may be NULL. scratch holds n·r floats.
void mt_lora_backward_cpu(const mt_lora *l, float *dx, const float *dy, const float *x,
                          const float *xa, float *scratch, int64_t n);

// The same for the GPU step (lora/lora_dev.c), on 2-D views (core/backend.h: mt_view2) of the
// adapter's backend: cuda runs it (bf16 A, B, x, xa; y and dy bf16 or f32, and may be column
// blocks of a wider matrix), the null backend makes its allocations and runs nothing. The four
// GEMMs go through the backend's matmul; dropout is regenerated on the device from the CPU's
// hash. dx may be NULL. Scratch (dropout(x), scale·dy·B): the caller's `sc` (at least
// mt_lora_dev_scratch_bytes for these rows; its data NULL on the null backend), or with sc NULL
// taken and returned through the ledger under work for the call.
typedef struct mt_lora_scratch {
    void *data;
    size_t bytes;
} mt_lora_scratch;
size_t mt_lora_dev_scratch_bytes(const mt_lora *l, int64_t n);
void mt_lora_forward_dev(const mt_lora *l, const mt_tensor *y, const mt_tensor *x, const mt_tensor *xa,
                         const mt_lora_scratch *sc);
void mt_lora_backward_dev(const mt_lora *l, const mt_tensor *dx, const mt_tensor *dy, const mt_tensor *x,
                          const mt_tensor *xa, const mt_lora_scratch *sc);

#ifdef __cplusplus
}
#endif
