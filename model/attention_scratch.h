// model/attention_scratch.h — the device bytes the GPU step's attention takes beside its inputs
// and outputs, by path: one formula for the CUDA code that allocates them
// (model/attention_cudnn.cu, model/ops_cuda.cu) and for plan --measure's counting step, which
// allocates the same on the null backend (mt_op_attention_count, model/ops.h). Plain C, every build.
#pragma once
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif

// cuDNN's SDPA, beside its workspace: the lengths (seq_q; seq_kv unless the caller's), the
// statistics, and in the backward the Σ dO·O rows and the fp32 dQ accumulator; each part
// 256-byte aligned. lens: the graph masks by lengths; kv_given: the caller passes seq_kv.
size_t mt_att_cudnn_scratch_bytes(int bwd, int B, int S, int nh, int hd, int lens, int kv_given);
// The backward's bf16 gradients as cuDNN writes them (ours accumulate: added after).
size_t mt_att_cudnn_staging_bytes(int B, int S, int nh, int nkv, int hd, int hd_v);
// The WMMA backward's fp32 Σ dO·O rows (the forward takes nothing).
size_t mt_att_wmma_scratch_bytes(int bwd, int B, int S, int nh);
// Whether cuDNN's graph masks by lengths: with key lengths, and (cudnn-frontend's workaround for
// cuDNN ≤ 9.15, version as cudnnGetVersion: 91400 for 9.14) in the backward whenever S is not a
// multiple of 128.
int mt_att_cudnn_needs_lens(int bwd, int S, int kv_given, size_t version);
// Why cuDNN's SDPA cannot take these arguments (its bf16 limits; NULL: it can): head dims
// multiples of 8 up to 256, query heads a multiple of key heads, a key mask only as lengths.
const char *mt_att_cudnn_shape_refusal(int has_key_mask, int has_kv_len, int nh, int nkv, int hd, int hd_v);

// cuDNN's own workspace where no plan can be asked (no device, or a build without CUDA): the
// backward's as an fp32 dQ-shaped buffer, 4·B·S·nh·hd + 256 bytes: exactly the 67 109 120 the
// plan asked for with cuDNN 9.14 on an H200 at B 1, S 4096, 32/8 heads, hd 128 (docs/gpu-results.md,
// run 5), and at S 16384 what the run's work peak held beyond the counting step's (0.070 GB, run 6);
// the forward's, none.
size_t mt_att_cudnn_workspace_guess(int bwd, int B, int S, int nh, int hd);
// The cuDNN version assumed then: the GPU machine's.
#define MT_ATT_CUDNN_VERSION_GUESS ((size_t)91400)
#ifdef __cplusplus
}
#endif
