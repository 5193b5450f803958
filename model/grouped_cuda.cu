// model/grouped_cuda.cu — model/grouped.h's GEMMs on the cuda backend: the heavy math in cuBLASLt
// (core/backend_cuda.cu's matmul), this file only the orchestration and two memory-bound kernels.
// Launchers: model/grouped_cuda.h; the checks of the arguments and the scratch: model/grouped.c.
//
// Why not one hand-written grouped kernel (this file's earlier WMMA version): a static review
// put its in-kernel 4-bit dequantization at ~75 SASS instructions per weight element, redone for
// every 64-row tile, and its 2-byte staging near 15–20% of the tensor cores' peak; nobody here
// can time a kernel to tune it. cuBLASLt's GEMMs are tuned and verified by NVIDIA.
//
//   * A 4-bit expert's W (and, with q2, a second W stacked under it: w1‖w3) is dequantized to
//     bf16 into one of two scratch slots (quant/quant.cu's dequantize: 16-byte loads and stores,
//     the block scale once per 32 elements), then C[rows e] = alpha·A[rows e]·op(W) + beta·C is
//     one cuBLASLt call. The dequantization runs on the backend's second stream: expert e+1's
//     fills the other slot while expert e's GEMM runs. Events order the two streams: a slot is
//     refilled only after the GEMM that read it (slot_free), a GEMM starts only after its slot is
//     filled (slot_ready). With MT_PROFILE on, everything runs on the main stream so that each
//     profile row times its own work.
//   * LoRA's dropout (lora/lora_dropout.h's mask, element (r − off[e], j) of expert e's rows):
//     on A, a masked bf16 copy of the expert's rows feeds the GEMM; on C, the GEMM writes an f32
//     product that a kernel masks, scales and adds into C (one rounding); on Y (the weight
//     gradient's operand), a masked bf16 copy.
//   * Dense weights (LoRA's A and B, unfrozen experts) and the weight gradients of every expert
//     go as ONE cublasGemmGroupedBatchedEx call (core/backend_cuda.cu's mt_cuda_gemm_grouped):
//     with 128 small experts a call per expert would be mostly launch overhead. So do the 4-bit
//     base GEMMs of small experts: a slot holds as many dequantized W as fit in 64 MiB
//     (model/expert_scratch.h), one grouped call runs them while the other slot fills. A large
//     expert (Mixtral's w1‖w3 is 235 MB in bf16) fills a slot alone: one cuBLASLt call each.
//   * The host knows each expert's rows (the routing's counts, downloaded once per layer in the
//     forward and kept for the backward); cuBLAS and cuBLASLt take their shapes from the host.
//   * Or it does not (grouped.h's doff: the offsets stay on the device, no host wait per layer):
//     then runs of experts whose W are alike go as one cuBLASLt grouped matmul each, which reads
//     each expert's rows on the device (core/gemm_rows.h): the dense W of a LoRA all at once, the
//     kept ones all at once, the others as many as a slot holds, dequantized into it as above.
//     LoRA's dropout then masks the call's rows in one launch, each row finding its expert among
//     the device offsets (the same mask elements as the per-expert launches).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "core/cuda_util.cuh"  // first: it makes core/common.h digestible for nvcc
#include "core/common.h"
#include "core/profile.h"
#include "lora/lora_cuda.h"
#include "lora/lora_dropout.h"
#include "core/gemm_rows.h"
#include "model/grouped_cuda.h"
#include "model/row_expert.cuh"
#include "quant/quant.h"

typedef __nv_bfloat16 bf16;

enum { THREADS = 256 };

// ---------------------------------------------------------------------------------------------
// Kernel (rows over blocks, columns over threads: no division per element)

static __device__ __forceinline__ float load(const float *p) { return *p; }
static __device__ __forceinline__ float load(const bf16 *p) { return __bfloat162float(*p); }
static __device__ __forceinline__ void put(float *p, float v) { *p = v; }
static __device__ __forceinline__ void put(bf16 *p, float v) { *p = __float2bfloat16_rn(v); }

// c [n, w] (ldc) = alpha · mask · t [n, w] (dense f32) + beta · c, beta 0 or 1: one rounding.
template <typename C>
static __global__ void drop_add_kernel(C *__restrict__ c, int64_t ldc, const float *__restrict__ t, int64_t n, int64_t w,
                                       uint64_t seed, float p, float alpha, float beta) {
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x)
        for (int64_t j = threadIdx.x; j < w; j += blockDim.x) {
            float v = alpha * (t[r * w + j] * mt_lora_dropout_factor(seed, p, (uint64_t)(r * w + j)));
            C *o = c + r * ldc + j;
            put(o, beta != 0.0f ? load(o) + v : v);
        }
}

static unsigned row_blocks(int64_t n) { return (unsigned)(n < 1 ? 1 : n > 65535 ? 65535 : n); }

static void drop_add(cudaStream_t s, mt_tensor *c, const float *t, int64_t n, int64_t w, uint64_t seed, float p,
                     float alpha, float beta) {
    if (c->dtype == MT_F32)
        drop_add_kernel<float><<<row_blocks(n), THREADS, 0, s>>>((float *)c->data, mt_tensor_ld(c), t, n, w, seed, p, alpha, beta);
    else
        drop_add_kernel<bf16><<<row_blocks(n), THREADS, 0, s>>>((bf16 *)c->data, mt_tensor_ld(c), t, n, w, seed, p, alpha, beta);
    MT_CHECK_LAUNCH();
}

// Columns [in, ld) of the slot's rows [0, r1 + r2) (row stride ld): row i < r1 gets s·b1[i] in its
// first w1 of them, a row r1 + i gets s·b2[i] in the w2 after those, every other column 0 (one
// bf16 rounding of s·b).
static __global__ void beside_kernel(bf16 *__restrict__ w, int64_t ld, int64_t in, int64_t r1, int64_t w1,
                                     const bf16 *__restrict__ b1, int64_t r2, int64_t w2, const bf16 *__restrict__ b2,
                                     float s) {
    for (int64_t i = blockIdx.x; i < r1 + r2; i += gridDim.x)
        for (int64_t j = threadIdx.x; j < ld - in; j += blockDim.x) {
            float v = 0.0f;
            if (i < r1 && j < w1) v = s * __bfloat162float(b1[i * w1 + j]);
            else if (i >= r1 && j >= w1 && j < w1 + w2) v = s * __bfloat162float(b2[(i - r1) * w2 + (j - w1)]);
            w[i * ld + in + j] = __float2bfloat16_rn(v);
        }
}

// dst [rows, cols] (row stride ld) = src [rows, cols] (contiguous): rows under W in a kept W whose
// rows are longer than theirs.
static __global__ void rows_copy_kernel(bf16 *__restrict__ dst, int64_t ld, const bf16 *__restrict__ src, int64_t rows,
                                        int64_t cols) {
    for (int64_t i = blockIdx.x; i < rows; i += gridDim.x)
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) dst[i * ld + j] = src[i * cols + j];
}

// out [rows of in, w] (row stride ldo) = drop(in): lora/lora_cuda.h's masked copy, on be's stream.
static void drop_copy(mt_backend *be, bf16 *out, int64_t ldo, const mt_tensor *in, int64_t w, uint64_t seed, float p) {
    mt_lora_dropout_cuda(be, (mt_bf16 *)out, ldo, (const mt_bf16 *)in->data, mt_tensor_ld(in), in->shape[0], w, seed, p, 0);
}

// ---------------------------------------------------------------------------------------------
// Orchestration

static void matmul(mt_tensor *c, const mt_tensor *a, const mt_tensor *b, int ta, int tb, float alpha, float beta) {
    if (mt_matmul(c, a, b, ta, tb, alpha, beta) != 0)
        mt_fatal(MT_EXIT_ERROR, "grouped GEMM (cuda): %s", mt_error_get());
}

// The two scratch slots and the events that hand them between the streams.
typedef struct {
    mt_backend *be;
    cudaStream_t main, deq;  // deq == main when profiling (or no 4-bit expert): no events then
    bf16 *slot[2];
    cudaEvent_t ready[2], freed[2];
    int used[2], next;
} slots;

// The four events that hand the slots between the streams: made once per device and reused by
// every call (a wait takes the event's latest record when it is issued), not made and destroyed
// per call on the step's path.
static cudaEvent_t *slot_events(void) {
    enum { MAX_DEVICES = 64 };
    static cudaEvent_t ev[MAX_DEVICES][4];
    static int made[MAX_DEVICES];
    int d;
    MT_CHECK_CUDA(cudaGetDevice(&d));
    if (d < 0 || d >= MAX_DEVICES) mt_fatal(MT_EXIT_ERROR, "grouped GEMM (cuda): device %d beyond %d", d, MAX_DEVICES);
    for (int i = 0; !made[d] && i < 4; i++) MT_CHECK_CUDA(cudaEventCreateWithFlags(&ev[d][i], cudaEventDisableTiming));
    made[d] = 1;
    return ev[d];
}

static void slots_open(slots *S, mt_backend *be, cudaStream_t main, void *scratch, size_t slot_elems) {
    S->be = be, S->main = main, S->deq = main, S->next = 0;
    S->used[0] = S->used[1] = 0;
    S->slot[0] = (bf16 *)scratch, S->slot[1] = scratch ? (bf16 *)scratch + slot_elems : NULL;
    if (!scratch || mt_prof_active) return;
    S->deq = (cudaStream_t)mt_cuda_backend_side_stream(be);
    cudaEvent_t *ev = slot_events();  // the backend's device is current (mt_cuda_begin)
    S->ready[0] = ev[0], S->ready[1] = ev[1], S->freed[0] = ev[2], S->freed[1] = ev[3];
    // the scratch was allocated on the main stream: the side waits for that, and so for everything
    // queued there before this call (the rows under W and the B beside it were last written by the
    // optimizer, on the main stream, before any of it)
    MT_CHECK_CUDA(cudaEventRecord(S->freed[1], main));
    MT_CHECK_CUDA(cudaStreamWaitEvent(S->deq, S->freed[1], 0));
}

// The next slot, once the GEMM that last read it is past (its refill waits for that).
static bf16 *slot_begin(slots *S) {
    int i = S->next;
    if (S->used[i] && S->deq != S->main) MT_CHECK_CUDA(cudaStreamWaitEvent(S->deq, S->freed[i], 0));
    return S->slot[i];
}

// Expert e's W (grouped.h: q stacked over q2 when set) at dst, row stride ld, on stream st:
// dequantized when `fill`, then the dense rows `under` copied after them and the blocks `beside`
// put to their right: the bf16 [mt_grouped_slot_rows, mt_grouped_slot_cols] matrix. A slot is
// filled at every call; a kept W (grouped.h's cached) was filled when the model was built (W is
// frozen), its LoRA blocks are still written at every call (they change between steps).
static mt_tensor put_w(mt_backend *be, cudaStream_t st, bf16 *dst, int64_t ld, const mt_grouped *g, int e, int fill) {
    const mt_qweight *q = g->q[e], *q2 = g->q2 ? g->q2[e] : NULL;
    const mt_tensor *u = g->under ? g->under[e] : NULL, *b1 = g->beside ? g->beside[e] : NULL,
                    *b2 = b1 && g->beside2 ? g->beside2[e] : NULL;
    const int64_t q_rows = q->out + (q2 ? q2->out : 0);
    mt_tensor W = mt_view2(be, dst, MT_BF16, mt_grouped_slot_rows(g, e), mt_grouped_slot_cols(g, e), ld);
    if (!fill && !b1 && !u) return W;
    mt_prof_push("expert dequant 4-bit->bf16");
    if (mt_prof_active) {  // under: read and written; beside: read, and written with its zeros
        double el = fill ? (double)q_rows * (double)q->in : 0, copied = u ? 2.0 * (double)u->nbytes : 0;
        if (b1) copied += (double)b1->nbytes + (b2 ? (double)b2->nbytes : 0) + 2.0 * (double)q_rows * (double)(ld - q->in);
        double deq = fill ? (double)mt_qweight_dequant_bytes(q, MT_BF16) + (q2 ? (double)mt_qweight_dequant_bytes(q2, MT_BF16) : 0) : 0;
        mt_prof_count(el, deq + copied);
    }
    if (fill && (mt_qweight_dequantize_rows_cuda_on(q, dst, MT_BF16, ld, st) != 0 ||
                 (q2 && mt_qweight_dequantize_rows_cuda_on(q2, dst + q->out * ld, MT_BF16, ld, st) != 0))) {
        mt_fatal(MT_EXIT_ERROR, "grouped GEMM (cuda), expert %d: %s", e, mt_error_get());
    }
    if (b1) {
        beside_kernel<<<row_blocks(q_rows), 64, 0, st>>>(dst, ld, q->in, q->out, b1->shape[1], (const bf16 *)b1->data,
                                                        q2 ? q2->out : 0, b2 ? b2->shape[1] : 0,
                                                        b2 ? (const bf16 *)b2->data : NULL, g->beside_scale);
        MT_CHECK_LAUNCH();
    }
    if (u && ld == q->in) {
        MT_CHECK_CUDA(cudaMemcpyAsync(dst + q_rows * ld, u->data, u->nbytes, cudaMemcpyDeviceToDevice, st));
    } else if (u) {
        rows_copy_kernel<<<row_blocks(u->shape[0]), 256, 0, st>>>(dst + q_rows * ld, ld, (const bf16 *)u->data,
                                                                 u->shape[0], u->shape[1]);
        MT_CHECK_LAUNCH();
    }
    mt_prof_pop();
    return W;
}

// Expert e's W in a slot, on the dequantization stream.
static mt_tensor slot_put(slots *S, bf16 *dst, const mt_grouped *g, int e) {
    return put_w(S->be, S->deq, dst, mt_grouped_slot_ld(g, e), g, e, 1);
}

// Expert e's W kept dequantized (grouped.h's cached), on the main stream: no slot, no event.
static mt_tensor cached_put(mt_backend *be, cudaStream_t st, const mt_grouped *g, int e) {
    mt_tensor *cw = g->cached[e];
    return put_w(be, st, (bf16 *)cw->data, cw->shape[1], g, e, 0);
}

// The slot filled: the main stream waits for its dequantization.
static void slot_ready(slots *S) {
    int i = S->next;
    if (S->deq != S->main) {
        MT_CHECK_CUDA(cudaEventRecord(S->ready[i], S->deq));
        MT_CHECK_CUDA(cudaStreamWaitEvent(S->main, S->ready[i], 0));
    }
}

// One expert's W into the next slot, ready for the main stream.
static mt_tensor slot_fill(slots *S, const mt_grouped *g, int e) {
    mt_tensor W = slot_put(S, slot_begin(S), g, e);
    slot_ready(S);
    return W;
}

// After the GEMM that read the slot: it may be refilled once the main stream is past here.
static void slot_done(slots *S) {
    int i = S->next;
    if (S->deq != S->main) MT_CHECK_CUDA(cudaEventRecord(S->freed[i], S->main));
    S->used[i] = 1, S->next ^= 1;
}

// Dense W (a LoRA's A or B, an unfrozen expert) for every expert with rows: the products as one
// cublasGemmGroupedBatchedEx call. Dropout as in the per-expert path: A's masked copies first, or
// the f32 products masked into C after. Returns 0 (nothing done) when the call does not qualify:
// a 4-bit expert, fewer than two products, weights of different row strides.
static int gemm_dense_grouped(mt_backend *be, cudaStream_t st, mt_tensor *c, const mt_tensor *a, const mt_grouped *g,
                              const mt_grouped_scratch *sc) {
    void *drop_scratch = sc->drop;
    const int64_t K = a->shape[1], N = c->shape[1], row0 = g->off[0];
    int n = 0;
    int64_t ldw = -1, m[MT_GROUPED_MAX], k[MT_GROUPED_MAX];
    const void *pa[MT_GROUPED_MAX], *pb[MT_GROUPED_MAX];
    void *pc[MT_GROUPED_MAX];
    int ex[MT_GROUPED_MAX];
    for (int e = 0; e < g->experts; e++) {
        if (g->q && g->q[e]) return 0;
        const mt_tensor *w = g->w ? g->w[e] : NULL;
        if (!w || g->off[e + 1] == g->off[e]) continue;
        if (ldw >= 0 && mt_tensor_ld(w) != ldw) return 0;
        ldw = mt_tensor_ld(w), ex[n++] = e;
    }
    if (n < 2) return 0;
    const bool copy_a = g->seed && g->drop_a, drop_c = g->seed && !g->drop_a;
    for (int i = 0; i < n; i++) {
        int e = ex[i];
        int64_t r0 = g->off[e], rows = g->off[e + 1] - r0;
        mt_tensor A = mt_view_rows(a, r0, rows), C = mt_view_rows(c, r0, rows);
        m[i] = rows, k[i] = K, pb[i] = g->w[e]->data;
        if (copy_a) {
            bf16 *D = (bf16 *)drop_scratch + (r0 - row0) * K;
            drop_copy(be, D, K, &A, K, g->seed[e], g->p);
            pa[i] = D;
        } else {
            pa[i] = A.data;
        }
        pc[i] = drop_c ? (void *)((float *)drop_scratch + (r0 - row0) * N) : C.data;
    }
    mt_gemm_group gg = {.count = n, .m = m, .k = k, .n = N, .lda = copy_a ? K : mt_tensor_ld(a), .ldb = ldw,
                        .ldc = drop_c ? N : mt_tensor_ld(c), .trans_a = 0, .trans_b = g->trans,
                        .tc = drop_c ? MT_F32 : c->dtype, .alpha = drop_c ? 1.0f : g->alpha,
                        .beta = drop_c ? 0.0f : g->beta, .a = pa, .b = pb, .c = pc, .ptrs = sc->ptrs};
    if (mt_cuda_gemm_grouped(be, &gg) != 0) mt_fatal(MT_EXIT_ERROR, "grouped GEMM (cuda): %s", mt_error_get());
    for (int i = 0; drop_c && i < n; i++) {
        int e = ex[i];
        int64_t r0 = g->off[e], rows = m[i];
        mt_tensor C = mt_view_rows(c, r0, rows);
        drop_add(st, &C, (const float *)pc[i], rows, N, g->seed[e], g->p, g->alpha, g->beta);
    }
    return 1;
}

// Small 4-bit experts, every one with rows 4-bit and no dropout (the base GEMMs): as many W as a
// slot holds dequantized into it, then one grouped call for them, the next slot filling
// meanwhile. Returns 0 (nothing done) when the call does not qualify: a slot holds one W only,
// a dense expert, dropout.
static int gemm_4bit_grouped(mt_backend *be, cudaStream_t st, mt_tensor *c, const mt_tensor *a, const mt_grouped *g,
                             const mt_grouped_scratch *sc) {
    void *deq_scratch = sc->deq;
    const size_t slot_elems = sc->slot_elems;
    if (g->seed || !g->q || (!deq_scratch && !g->cached)) return 0;
    const int64_t K = a->shape[1], N = c->shape[1];
    int n = 0, ex[MT_GROUPED_MAX];
    int64_t welems = 0, kept_ld = 0;
    for (int e = 0; e < g->experts; e++) {
        if (g->off[e + 1] == g->off[e] || (!g->q[e] && !(g->w && g->w[e]))) continue;
        if (!g->q[e]) return 0;
        int64_t we = mt_grouped_slot_rows(g, e) * mt_grouped_slot_ld(g, e);
        if (welems && we != welems) return 0;
        if (g->cached && g->cached[e]) {  // one call takes one row stride of W: else the per-expert path
            if (kept_ld && g->cached[e]->shape[1] != kept_ld) return 0;
            kept_ld = g->cached[e]->shape[1];
        }
        welems = we, ex[n++] = e;
    }
    // Kept dequantized (a layer keeps all its experts or none: grouped.c sizes no slot then), small
    // as a slot's would be: one call for all, no slot; large kept experts go one cuBLASLt call
    // each, as from a slot (the caller's path).
    const int kept = g->cached && n && g->cached[ex[0]];
    const int per = kept ? (MT_EXPERT_SLOT_ELEMS / (welems ? welems : 1) < 2 ? 0 : n)
                         : (int)((int64_t)slot_elems / (welems ? welems : 1));
    if (n < 2 || per < 2) return 0;
    slots S;
    if (!kept) slots_open(&S, be, st, deq_scratch, slot_elems);
    for (int c0 = 0; c0 < n; c0 += per) {
        int cn = MT_MIN(per, n - c0);
        int64_t m[MT_GROUPED_MAX], k[MT_GROUPED_MAX];
        const void *pa[MT_GROUPED_MAX], *pb[MT_GROUPED_MAX];
        void *pc[MT_GROUPED_MAX];
        bf16 *dst = kept ? NULL : slot_begin(&S);
        int64_t ldw = 0;
        for (int i = 0; i < cn; i++) {
            int e = ex[c0 + i];
            if (kept && !g->cached[e]) mt_fatal(MT_EXIT_ERROR, "grouped GEMM (cuda): expert %d of a kept layer is not kept", e);
            mt_tensor W = kept ? cached_put(be, st, g, e) : slot_put(&S, dst + (int64_t)i * welems, g, e);
            int64_t r0 = g->off[e], rows = g->off[e + 1] - r0;
            mt_tensor A = mt_view_rows(a, r0, rows), C = mt_view_rows(c, r0, rows);
            m[i] = rows, k[i] = K, pa[i] = A.data, pb[i] = W.data, pc[i] = C.data, ldw = mt_tensor_ld(&W);
        }
        if (!kept) slot_ready(&S);
        mt_gemm_group gg = {.count = cn, .m = m, .k = k, .n = N, .lda = mt_tensor_ld(a), .ldb = ldw,
                            .ldc = mt_tensor_ld(c), .trans_a = 0, .trans_b = g->trans, .tc = c->dtype,
                            .alpha = g->alpha, .beta = g->beta, .a = pa, .b = pb, .c = pc, .ptrs = sc->ptrs};
        if (mt_cuda_gemm_grouped(be, &gg) != 0) mt_fatal(MT_EXIT_ERROR, "grouped GEMM (cuda): %s", mt_error_get());
        if (!kept) slot_done(&S);
    }
    return 1;
}

// ---------------------------------------------------------------------------------------------
// The offsets on the device (grouped.h's doff)

// What expert e's W is, for grouping experts into one grouped matmul.
enum { W_NONE, W_DENSE, W_KEPT, W_SLOT };
static int w_kind(const mt_grouped *g, int e) {
    if (g->q && g->q[e]) return g->cached && g->cached[e] ? W_KEPT : W_SLOT;
    return g->w && g->w[e] ? W_DENSE : W_NONE;
}

// Whether experts e and f may share one grouped matmul: one kind, and W of one shape and stride.
static bool w_alike(const mt_grouped *g, int e, int f) {
    int k = w_kind(g, e);
    if (w_kind(g, f) != k) return false;
    if (k == W_DENSE)
        return g->w[e]->shape[0] == g->w[f]->shape[0] && g->w[e]->shape[1] == g->w[f]->shape[1] &&
               mt_tensor_ld(g->w[e]) == mt_tensor_ld(g->w[f]);
    bool same = mt_grouped_slot_rows(g, e) == mt_grouped_slot_rows(g, f) &&
                mt_grouped_slot_cols(g, e) == mt_grouped_slot_cols(g, f);
    return k == W_KEPT ? same && g->cached[e]->shape[1] == g->cached[f]->shape[1]
                       : same && mt_grouped_slot_ld(g, e) == mt_grouped_slot_ld(g, f);
}

// LoRA's dropout with the offsets on the device: each row finds its expert among the offsets (a
// binary search in shared memory), then masks as the per-expert kernels do (element
// (r − off[e], j) of expert e's rows, its seed): one launch for the call's rows.
struct drop_rows {
    uint64_t seed[MT_GROUPED_MAX];
    uint8_t on[MT_GROUPED_MAX];  // drop_add: the experts whose product was written (the others' rows stay)
};

// out [rows, w] (ldo) = drop(x [rows, w] (ldx)), as dropout_kernel (lora/lora_cuda.cu) per expert.
static __global__ void drop_copy_rows_kernel(bf16 *__restrict__ out, int64_t ldo, const bf16 *__restrict__ x, int64_t ldx,
                                             int64_t rows, int64_t w, const int32_t *__restrict__ doff, int E,
                                             const __grid_constant__ drop_rows D, float p) {
    __shared__ int32_t o[MT_GROUPED_MAX + 1];
    for (int i = threadIdx.x; i <= E; i += blockDim.x) o[i] = doff[i];
    __syncthreads();
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int e = row_expert(o, E, r);
        if (e < 0) continue;
        const uint64_t base = (uint64_t)(r - o[e]) * (uint64_t)w;
        for (int64_t j = threadIdx.x; j < w; j += blockDim.x)
            out[r * ldo + j] = __float2bfloat16_rn(__bfloat162float(x[r * ldx + j]) *
                                                   mt_lora_dropout_factor(D.seed[e], p, base + (uint64_t)j));
    }
}

// c [rows, w] (ldc) = alpha · drop(t [rows, w], f32) + beta · c for the rows of experts with D.on,
// as drop_add_kernel per expert (one rounding).
template <typename C>
static __global__ void drop_add_rows_kernel(C *__restrict__ c, int64_t ldc, const float *__restrict__ t, int64_t rows,
                                            int64_t w, const int32_t *__restrict__ doff, int E,
                                            const __grid_constant__ drop_rows D, float p, float alpha, float beta) {
    __shared__ int32_t o[MT_GROUPED_MAX + 1];
    for (int i = threadIdx.x; i <= E; i += blockDim.x) o[i] = doff[i];
    __syncthreads();
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int e = row_expert(o, E, r);
        if (e < 0 || !D.on[e]) continue;
        const int64_t local = r - o[e];
        for (int64_t j = threadIdx.x; j < w; j += blockDim.x) {
            float v = alpha * (t[r * w + j] * mt_lora_dropout_factor(D.seed[e], p, (uint64_t)(local * w + j)));
            C *q = c + r * ldc + j;
            put(q, beta != 0.0f ? load(q) + v : v);
        }
    }
}

static drop_rows drop_rows_of(const mt_grouped *g) {
    drop_rows D;
    memset(&D, 0, sizeof D);
    for (int e = 0; e < g->experts; e++) D.seed[e] = g->seed[e];
    return D;
}

// A [g->rows, w] masked copy of x's rows (row stride w) at dst.
static mt_tensor drop_copy_rows(mt_backend *be, cudaStream_t st, void *dst, const mt_tensor *x, int64_t w,
                                const mt_grouped *g) {
    mt_tensor out = mt_view2(be, dst, MT_BF16, g->rows, w, w);
    drop_copy_rows_kernel<<<row_blocks(g->rows), THREADS, 0, st>>>((bf16 *)dst, w, (const bf16 *)x->data, mt_tensor_ld(x),
                                                                    g->rows, w, g->doff, g->experts, drop_rows_of(g), g->p);
    MT_CHECK_LAUNCH();
    return out;
}

// The rows a run of n of the call's experts is expected to hold, balanced: the grouped matmul's
// heuristic hint and the profile's count (the host does not know the real ones).
static int64_t run_rows(const mt_grouped *g, int n) { return (g->rows_hint ? g->rows_hint : g->rows) * n / g->experts; }

// The run's arrays go into the call's ptrs scratch: each run's kernel writes them after the
// previous run's matmul has read them (one stream).
static void rows_gemm(mt_backend *be, mt_tensor *c, const mt_tensor *a, const mt_tensor *const *w, const mt_grouped *g,
                      int e0, int n, float alpha, float beta, void *arrays) {
    if (mt_gemm_rows(be, c, a, w, g->trans, n, g->doff + e0, run_rows(g, n), alpha, beta, arrays) != 0)
        mt_fatal(MT_EXIT_ERROR, "grouped GEMM (cuda), experts %d..%d: %s", e0, e0 + n - 1, mt_error_get());
}

// Dropout: on A, the runs read A's masked copy (all the call's rows at once); on C, they write
// f32 products that one launch then masks into C for the experts that had a W.
static void gemm_device_rows(mt_backend *be, cudaStream_t st, mt_tensor *c_all, const mt_tensor *a_all,
                             const mt_grouped *g, const mt_grouped_scratch *sc) {
    // the operands' first g->rows rows: what the offsets may reach, and what the masked copies hold
    mt_tensor a_rows = mt_view_rows(a_all, 0, g->rows), c_rows = mt_view_rows(c_all, 0, g->rows);
    mt_tensor *c = &c_rows;
    const mt_tensor *a = &a_rows;
    const int64_t K = a->shape[1], N = c->shape[1];
    mt_tensor a_masked, t_f32, *out = c;
    const mt_tensor *in = a;
    float alpha = g->alpha, beta = g->beta;
    if (g->seed && g->drop_a) a_masked = drop_copy_rows(be, st, sc->drop, a, K, g), in = &a_masked;
    if (g->seed && !g->drop_a) t_f32 = mt_view2(be, sc->drop, MT_F32, g->rows, N, N), out = &t_f32, alpha = 1, beta = 0;
    drop_rows D = g->seed ? drop_rows_of(g) : drop_rows{};
    slots S;
    slots_open(&S, be, st, sc->deq, sc->slot_elems);
    mt_tensor views[MT_GROUPED_MAX];
    const mt_tensor *wp[MT_GROUPED_MAX];
    for (int e0 = 0, e1; e0 < g->experts; e0 = e1) {
        const int kind = w_kind(g, e0);
        e1 = e0 + 1;
        if (kind == W_NONE) continue;
        const int64_t welems = kind == W_SLOT ? mt_grouped_slot_rows(g, e0) * mt_grouped_slot_ld(g, e0) : 0;
        const int per = kind == W_SLOT ? (int)MT_MAX((int64_t)1, (int64_t)sc->slot_elems / welems) : MT_GROUPED_MAX;
        while (e1 < g->experts && e1 - e0 < per && w_alike(g, e0, e1)) e1++;
        bf16 *dst = kind == W_SLOT ? slot_begin(&S) : NULL;
        for (int e = e0; e < e1; e++) {
            views[e - e0] = kind == W_DENSE ? *g->w[e]
                            : kind == W_KEPT ? cached_put(be, st, g, e)
                                             : slot_put(&S, dst + (int64_t)(e - e0) * welems, g, e);
            wp[e - e0] = &views[e - e0];
        }
        if (kind == W_SLOT) slot_ready(&S);
        rows_gemm(be, out, in, wp, g, e0, e1 - e0, alpha, beta, sc->ptrs);
        if (kind == W_SLOT) slot_done(&S);
        for (int e = e0; e < e1; e++) D.on[e] = 1;
    }
    if (out != c) {
        const unsigned blocks = row_blocks(g->rows);
        if (c->dtype == MT_F32)
            drop_add_rows_kernel<float><<<blocks, THREADS, 0, st>>>((float *)c->data, mt_tensor_ld(c), (const float *)t_f32.data,
                                                                    g->rows, N, g->doff, g->experts, D, g->p, g->alpha, g->beta);
        else
            drop_add_rows_kernel<bf16><<<blocks, THREADS, 0, st>>>((bf16 *)c->data, mt_tensor_ld(c), (const float *)t_f32.data,
                                                                   g->rows, N, g->doff, g->experts, D, g->p, g->alpha, g->beta);
        MT_CHECK_LAUNCH();
    }
}

extern "C" void mt_grouped_gemm_cuda(mt_backend *be, mt_tensor *c, const mt_tensor *a, const mt_grouped *g,
                                     const mt_grouped_scratch *sc) {
    cudaStream_t st = mt_cuda_begin(be);
    if (!g->off) {
        gemm_device_rows(be, st, c, a, g, sc);
        return;
    }
    if (gemm_dense_grouped(be, st, c, a, g, sc)) return;
    if (gemm_4bit_grouped(be, st, c, a, g, sc)) return;
    void *deq_scratch = sc->deq, *drop_scratch = sc->drop;
    const size_t slot_elems = sc->slot_elems;
    const int64_t K = a->shape[1], N = c->shape[1];
    slots S;
    slots_open(&S, be, st, deq_scratch, slot_elems);
    for (int e = 0; e < g->experts; e++) {
        const mt_qweight *q = g->q ? g->q[e] : NULL;
        const mt_tensor *w = g->w ? g->w[e] : NULL;
        int64_t r0 = g->off[e], n = g->off[e + 1] - r0;
        if ((!q && !w) || n == 0) continue;
        const int kept = q && g->cached && g->cached[e];
        mt_tensor W = kept ? cached_put(be, st, g, e) : q ? slot_fill(&S, g, e) : *w;
        mt_tensor A = mt_view_rows(a, r0, n), C = mt_view_rows(c, r0, n);
        if (g->seed && g->drop_a) {  // C = alpha·drop(A)·op(W) + beta·C
            mt_tensor D = mt_view2(be, drop_scratch, MT_BF16, n, K, 0);
            drop_copy(be, (bf16 *)D.data, K, &A, K, g->seed[e], g->p);
            matmul(&C, &D, &W, 0, g->trans, g->alpha, g->beta);
        } else if (g->seed) {  // C = alpha·drop(A·op(W)) + beta·C
            mt_tensor T = mt_view2(be, drop_scratch, MT_F32, n, N, 0);
            matmul(&T, &A, &W, 0, g->trans, 1.0f, 0.0f);
            drop_add(st, &C, (const float *)T.data, n, N, g->seed[e], g->p, g->alpha, g->beta);
        } else {
            matmul(&C, &A, &W, 0, g->trans, g->alpha, g->beta);
        }
        if (q && !kept) slot_done(&S);
    }
}

// G_e = alpha·X[rows e]ᵀ·drop(Y[rows e]) + beta·G_e for every expert with a G: the experts with
// rows as one grouped call (one cuBLASLt call when only one has rows), the others beta·G_e.
extern "C" void mt_grouped_gemm_tn_cuda(mt_backend *be, mt_tensor *const *g, const mt_tensor *x, const mt_tensor *y,
                                        const mt_grouped *gr, const mt_grouped_scratch *sc) {
    void *drop_scratch = sc->drop;
    cudaStream_t st = mt_cuda_begin(be);
    if (!gr->off) {  // the offsets on the device: each run of experts with a G as one grouped matmul
        int any = 0;
        for (int e = 0; e < gr->experts; e++) any |= g[e] != NULL;
        if (!any) return;  // no gradient wanted (grouped.c sized no dropout buffer then)
        mt_tensor x_rows = mt_view_rows(x, 0, gr->rows), y_rows = mt_view_rows(y, 0, gr->rows), y_masked;
        x = &x_rows, y = &y_rows;
        if (gr->seed) y_masked = drop_copy_rows(be, st, drop_scratch, y, y->shape[1], gr), y = &y_masked;
        for (int e0 = 0, e1; e0 < gr->experts; e0 = e1) {
            for (e1 = e0; e1 < gr->experts && g[e1]; e1++) {}
            if (e1 > e0 && mt_gemm_rows_tn(be, g + e0, x, y, e1 - e0, gr->doff + e0, run_rows(gr, e1 - e0), gr->alpha,
                                           gr->beta, sc->ptrs) != 0)
                mt_fatal(MT_EXIT_ERROR, "grouped weight gradient (cuda), experts %d..%d: %s", e0, e1 - 1, mt_error_get());
            e1 += e1 == e0;
        }
        return;
    }
    const int64_t M = x->shape[1], N = y->shape[1], row0 = gr->off[0];
    int n = 0;
    int64_t m[MT_GROUPED_MAX], k[MT_GROUPED_MAX];
    const void *pa[MT_GROUPED_MAX], *pb[MT_GROUPED_MAX];
    void *pc[MT_GROUPED_MAX];
    mt_tensor X1, Y1;
    mt_tensor *G1 = NULL;
    for (int e = 0; e < gr->experts; e++) {
        mt_tensor *G = g[e];
        if (!G) continue;
        int64_t r0 = gr->off[e], rows = gr->off[e + 1] - r0;
        if (rows == 0) {  // an empty sum: beta·G
            if (gr->beta == 0.0f) MT_CHECK_CUDA(cudaMemsetAsync(G->data, 0, G->nbytes, st));
            continue;
        }
        mt_tensor X = mt_view_rows(x, r0, rows), Y = mt_view_rows(y, r0, rows);
        if (gr->seed) {
            bf16 *D = (bf16 *)drop_scratch + (r0 - row0) * N;
            drop_copy(be, D, N, &Y, N, gr->seed[e], gr->p);
            Y = mt_view2(be, D, MT_BF16, rows, N, 0);
        }
        m[n] = M, k[n] = rows, pa[n] = X.data, pb[n] = Y.data, pc[n] = G->data;
        X1 = X, Y1 = Y, G1 = G, n++;
    }
    if (n == 1) {
        matmul(G1, &X1, &Y1, 1, 0, gr->alpha, gr->beta);
        return;
    }
    if (n == 0) return;
    mt_gemm_group gg = {.count = n, .m = m, .k = k, .n = N, .lda = mt_tensor_ld(x), .ldb = gr->seed ? N : mt_tensor_ld(y),
                        .ldc = N, .trans_a = 1, .trans_b = 0, .tc = G1->dtype, .alpha = gr->alpha, .beta = gr->beta,
                        .a = pa, .b = pb, .c = pc, .ptrs = sc->ptrs};
    if (mt_cuda_gemm_grouped(be, &gg) != 0) mt_fatal(MT_EXIT_ERROR, "grouped weight gradient (cuda): %s", mt_error_get());
}
