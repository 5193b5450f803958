// model/attention_cudnn.h — attention through cuDNN's fused SDPA (forward and backward), the
// alternative to the WMMA kernels of model/ops_cuda.h with the same arguments and results.
//
// cuDNN is loaded at run time (dlopen "libcudnn.so.9"; in SIM builds the emulator's stand-in,
// tests/cudasim/cudnn.cc, is bound instead): a build runs without it, on the WMMA kernels. The
// graph is cuDNN's backend API (cudnn_graph.h): Q·Kᵀ, the scale, the causal mask (with the sliding
// window and the key lengths as further masks), the softmax with its fp32 statistics, P·V; the
// backward recomputes P from the statistics. K and V keep their nkv heads (GQA by the matmul's
// head broadcast, never repeated). Layouts are the model's: q [B, S, nh, hd], k [B, S, nkv, hd],
// v [B, S, nkv, hd_v], out [B, S, nh, hd_v] (hd_v ≠ hd for MLA; cuDNN's dims [B, h, S, d] with the
// strides of that layout), the scale the caller's; lse [B, S, nh] fp32: the natural log-sum-exp
// of the scaled scores, which is cuDNN's "Stats" (max + log Σ exp), kept by the engine as
// [B, nh, S] and converted around each call, so the WMMA and cuDNN passes can share it. The graphs
// are the ones cudnn-frontend's composite SDPA node builds, which cuDNN's fused flash engines
// recognize: the backward's Σ dO·O rows and its fp32 dQ accumulator in memory (our scratch), the
// masks after the statistics with the frontend's constants, lengths as matmul overrides, and
// (cuDNN ≤ 9.15) a length mask of S in the backward when S is not a multiple of 128. Plans are
// cached per shape; workspace and scratch go through mt_work_alloc. The backward ACCUMULATES like
// its twin: cuDNN writes the gradients into work scratch, added after.
//
// The choice (attention_path): MT_ATTENTION=auto (default) takes cuDNN where it loads and takes
// the shape (hd, hd_v ≤ 256 and multiples of 8, nh a multiple of nkv, 16-byte aligned rows, no key
// mask unless given as lengths) and both directions' graphs are accepted, else the WMMA kernels
// with the reason printed once. On an H200 (cuDNN 9.14, 2026-11-27, docs/gpu-results.md) every
// cuDNN case matched its CPU twin and Mixtral's step at seq 4096 ran 1.8x faster than on the WMMA
// kernels (4x at 16384). MT_ATTENTION=cudnn makes any refusal fatal (how the GPU check knows
// cuDNN ran); wmma forces the kernel. Every cuDNN call is checked, its failure named with
// cudnnGetErrorString: a graph the library refuses while building its plan (per shape,
// remembered) is a refusal like the others; a failing execution is fatal.
// Learned attention sinks (gpt-oss) are not in this graph: with sinks, attention_forward_cuda and
// attention_backward_cuda never call these and run the WMMA kernels, even under
// MT_ATTENTION=cudnn (a one-line note, not a refusal). cuDNN's frontend has a sink-token SDPA
// in its newer releases; expressing it in this backend graph is left undone.
//
// Plain C, CUDA builds only (MT_CUDA), like model/ops_cuda.h.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MT_ATTENTION_AUTO = 0, MT_ATTENTION_WMMA, MT_ATTENTION_CUDNN } mt_attention_mode;
// The mode: MT_ATTENTION read at the first call unless set; tests set it.
void attention_set_mode(mt_attention_mode mode);
mt_attention_mode attention_get_mode(void);

// "cudnn" or "wmma": the path attention_forward_cuda / attention_backward_cuda take for these
// arguments (loads cuDNN at the first call; prints a refusal's reason once; fatal in mode cudnn).
const char *attention_path(int has_key_mask, int has_kv_len, int nh, int nkv, int hd, int hd_v);

// cuDNN SDPA. kv_len [B] int32 (device) or NULL: sequence b's keys are [0, kv_len[b]) (right
// padding, 1 ≤ kv_len[b] ≤ S; every query sees key 0), the key mask as cuDNN takes it. Returns 1
// when cuDNN computed the result, 0 when the caller must run the WMMA kernel (attention_path's
// answer "wmma"). The backward's NULL gradients are skipped, as in the twin.
int attention_cudnn_forward(mt_backend *be, mt_bf16 *out, float *lse, const mt_bf16 *q, const mt_bf16 *k,
                            const mt_bf16 *v, const uint8_t *key_mask, const int32_t *kv_len, int B, int S, int nh,
                            int nkv, int hd, int hd_v, float scale, int window);
int attention_cudnn_backward(mt_backend *be, mt_bf16 *dq, mt_bf16 *dk, mt_bf16 *dv, const mt_bf16 *dout,
                             const mt_bf16 *q, const mt_bf16 *k, const mt_bf16 *v, const mt_bf16 *out,
                             const float *lse, const uint8_t *key_mask, const int32_t *kv_len, int B, int S, int nh,
                             int nkv, int hd, int hd_v, float scale, int window);

// The cuDNN version loaded (cudnnGetVersion; also where it loads but cudnnCreate fails: no GPU),
// 0 when none.
size_t attention_cudnn_version(void);
// 1 in emulated builds (make SIM=1), where "cuDNN" is the emulator's stand-in.
int attention_cudnn_emulated(void);

// The graphs of one shape built as far as this machine allows (the probe; a refusal is reported,
// never fatal): 1: the plan finalized (a device: cached for the step), 2: no device, but every
// tensor and operation descriptor finalized by the library, 0: refused (why in msg), -1: cuDNN
// not loadable.
int attention_cudnn_check(int bwd, int B, int S, int nh, int nkv, int hd, int hd_v, int window, int lens, char *msg,
                          size_t msg_len);

// plan --measure's counting step (model/dispatch.c mt_op_attention_count): whether cuDNN would run
// this shape (1) or not (0: its library not loadable, MT_ATTENTION=wmma, a shape it refuses, or,
// where a device exists, a plan refused: printed once, never fatal), the scratch it takes beside
// its workspace, and the workspace its plan asks for (-1: the library loads but no device can
// build the plan). kv: the caller passes key lengths.
int attention_cudnn_count(int bwd, int has_key_mask, int B, int S, int nh, int nkv, int hd, int hd_v, int window,
                          int kv, size_t *scratch, int64_t *ws);
// Tests: the forward graph built with one planted bug (hd_v = hd, scale 1/sqrt(hd)), run (never
// cached, never fatal). Returns the
// first failing cuDNN status (0: all accepted) and its call in msg. bug 1: Q's head stride wrong
// (overlapping heads), 2: execute without the workspace the plan reported, 3: K with a head count
// that does not divide Q's (GQA mismatch), 4: a variant pack missing the statistics' UID,
// 5: execute before the plan is finalized, 0: none.
int attention_cudnn_planted(mt_backend *be, int bug, mt_bf16 *out, float *lse, const mt_bf16 *q, const mt_bf16 *k,
                            const mt_bf16 *v, int B, int S, int nh, int nkv, int hd, char *msg, size_t msg_len);

#ifdef __cplusplus
}
#endif
