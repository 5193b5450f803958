// quant/quant.cu — CUDA twins of quant/nf4.c, quant/int4.c and quant/mxfp4.c: the quantize kernels (load-time
// quantization on the GPU) and the dequantize kernel that feeds cuBLASLt.
//
// Same rules as the CPU reference, bit for bit (quant/formats.h): reciprocal absmax multiplied
// in, the decision functions shared with the C side, every product and sum with __fmul_rn /
// __fadd_rn so that nvcc fuses nothing, the double-quant offset computed on the host.
//
// Dequantize (bandwidth-bound): dequant8_kernel, the default, gives each thread items of 8
// elements a block's width apart, so that a warp's 4-byte code loads and 16-byte stores are
// contiguous; each item's block constants (the double-quant absmax rebuilt right there from the
// 8-bit code, the nested absmax and the offset) are read once, each byte looked up in a
// 256-entry table of value pairs in shared memory. dequant32_kernel (32 contiguous elements a
// thread) is kept until a GPU times both. Ranges that do not start on a 32-element boundary, and
// the tail, go through a one-element-per-thread kernel.
//
// Streams: work goes on the backend's own stream (mt_cuda_backend_stream), so it is ordered with
// the backend's copies and matmuls without any host synchronisation.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "core/cuda_check.h"  // first: it makes core/common.h digestible for nvcc
#include "core/backend.h"
#include "core/common.h"
#include "quant/dequant_cuda.cuh"  // the codebooks and one element's value
#include "quant/quant.h"

enum { WARPS_PER_CTA = 8, DEQ_THREADS = 256, DEQ_ITEMS = 8 };

// ---------------------------------------------------------------------------------------------
// Streams

// Makes the device that owns `dev_ptr` current and returns the stream to launch on.
static cudaStream_t q_begin(mt_backend *be, const void *dev_ptr) {
    cudaPointerAttributes attr;
    MT_CHECK_CUDA(cudaPointerGetAttributes(&attr, dev_ptr));
    MT_CHECK_CUDA(cudaSetDevice(attr.device));
    return (cudaStream_t)mt_cuda_backend_stream(be);
}

static void q_end(cudaStream_t s) {
    (void)s;
    MT_CHECK_CUDA(cudaGetLastError());
}

// ---------------------------------------------------------------------------------------------
// Kernels

static __device__ __forceinline__ float load_f32(const float *x, int64_t i) { return x[i]; }
static __device__ __forceinline__ float load_f32(const __nv_bfloat16 *x, int64_t i) { return __bfloat162float(x[i]); }
static __device__ __forceinline__ float load_f32(const __half *x, int64_t i) { return __half2float(x[i]); }

static __device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
static __device__ __forceinline__ float warp_min(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// x [n] -> packed [ceil(n/2)], absmax [ceil(n/bs)]; one warp per block, lanes on byte pairs.
template <typename T, int TYPE>
static __global__ void q4_quantize_kernel(const T *__restrict__ x, int64_t n, int bs,
                                          uint8_t *__restrict__ packed, float *__restrict__ absmax) {
    int lane = threadIdx.x & 31;
    int64_t b = (int64_t)blockIdx.x * WARPS_PER_CTA + (threadIdx.x >> 5), nb = (n + bs - 1) / bs;
    if (b >= nb) return;
    int64_t s = b * bs, e = s + bs < n ? s + bs : n;
    float a = 0.0f;
    for (int64_t i = s + lane; i < e; i += 32) a = fmaxf(a, fabsf(load_f32(x, i)));
    a = warp_max(a);
    if (lane == 0) absmax[b] = a;
    float inv = __fdiv_rn(1.0f, a);  // 0 -> inf; 0 · inf = NaN -> code 0, as bitsandbytes
    for (int64_t i = s + 2 * lane; i < e; i += 64) {
        float x0 = load_f32(x, i), x1 = i + 1 < e ? load_f32(x, i + 1) : 0.0f;
        unsigned hi = TYPE == MT_QUANT_FP4 ? mt_fp4_code(__fmul_rn(x0, inv)) : mt_nf4_code(__fmul_rn(x0, inv));
        unsigned lo = TYPE == MT_QUANT_FP4 ? mt_fp4_code(__fmul_rn(x1, inv)) : mt_nf4_code(__fmul_rn(x1, inv));
        packed[i >> 1] = (uint8_t)(hi << 4 | lo);
    }
}

// MXFP4: x [n] (n a multiple of 32) -> packed [n/2] (element 2j in the low nibble), e8m0
// scales [n/32]; one warp per block, a lane per element, the odd lane's code shuffled down.
template <typename T>
static __global__ void mxfp4_quantize_kernel(const T *__restrict__ x, int64_t n, uint8_t *__restrict__ packed,
                                             uint8_t *__restrict__ scales) {
    int lane = threadIdx.x & 31;
    int64_t b = (int64_t)blockIdx.x * WARPS_PER_CTA + (threadIdx.x >> 5);
    if (b >= n / MT_MXFP4_BLOCK) return;  // whole warps: the shuffle below has all 32 lanes
    float v = load_f32(x, b * MT_MXFP4_BLOCK + lane);
    unsigned e = mt_mxfp4_scale_of(warp_max(fabsf(v)));
    unsigned c = mt_e2m1_code(__fmul_rn(v, mt_mxfp4_inv_scale(e)));
    unsigned odd = __shfl_down_sync(0xffffffffu, c, 1);
    if (!(lane & 1)) packed[b * (MT_MXFP4_BLOCK / 2) + lane / 2] = (uint8_t)(c | odd << 4);
    if (lane == 0) scales[b] = (uint8_t)e;
}

// absmax [nb] − offset -> codes [nb], nested_absmax [ceil(nb/256)]; one CTA of 256 per block.
static __global__ void q8_quantize_kernel(const float *__restrict__ map, const float *__restrict__ absmax,
                                          int64_t nb, float offset, uint8_t *__restrict__ codes,
                                          float *__restrict__ nested_absmax) {
    __shared__ float smap[256], red[256 / 32];
    int t = threadIdx.x;
    smap[t] = map[t];
    int64_t i = (int64_t)blockIdx.x * 256 + t;
    float v = i < nb ? __fsub_rn(absmax[i], offset) : 0.0f;
    float a = warp_max(fabsf(v));
    if ((t & 31) == 0) red[t >> 5] = a;
    __syncthreads();
    if (t < 32) {
        a = t < 256 / 32 ? red[t] : 0.0f;
        a = warp_max(a);
        if (t == 0) red[0] = a;
    }
    __syncthreads();
    a = red[0];
    if (t == 0) nested_absmax[blockIdx.x] = a;
    if (i < nb) codes[i] = (uint8_t)mt_q8_code(smap, __fmul_rn(v, __fdiv_rn(1.0f, a)));
}

// x [n] -> packed, fp16 scale and minimum per group; one warp per group.
template <typename T>
static __global__ void int4_quantize_kernel(const T *__restrict__ x, int64_t n, int g, uint8_t *__restrict__ packed,
                                            __half *__restrict__ scale, __half *__restrict__ minimum) {
    int lane = threadIdx.x & 31;
    int64_t grp = (int64_t)blockIdx.x * WARPS_PER_CTA + (threadIdx.x >> 5), ng = (n + g - 1) / g;
    if (grp >= ng) return;
    int64_t s = grp * g, e = s + g < n ? s + g : n;
    float lo = load_f32(x, s), hi = lo;
    for (int64_t i = s + lane; i < e; i += 32) {
        float v = load_f32(x, i);
        lo = fminf(lo, v);
        hi = fmaxf(hi, v);
    }
    lo = warp_min(lo);
    hi = warp_max(hi);
    __half m16 = __float2half_rn(lo), d16 = __float2half_rn(__fdiv_rn(__fsub_rn(hi, lo), 15.0f));
    if (lane == 0) {
        minimum[grp] = m16;
        scale[grp] = d16;
    }
    float m = __half2float(m16), d = __half2float(d16), inv = d > 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    for (int64_t i = s + 2 * lane; i < e; i += 64) {
        float x0 = load_f32(x, i), x1 = i + 1 < e ? load_f32(x, i + 1) : 0.0f;
        packed[i >> 1] = (uint8_t)(mt_int4_code(x0, m, inv) << 4 | mt_int4_code(x1, m, inv));
    }
}

static __device__ __forceinline__ void store(float *dst, int64_t i, float v) { dst[i] = v; }
static __device__ __forceinline__ void store(__nv_bfloat16 *dst, int64_t i, float v) { dst[i] = __float2bfloat16_rn(v); }

static __device__ __forceinline__ void load_lut(const mt_deq_args &a, float *lut) {
    if (threadIdx.x < 16) lut[threadIdx.x] = mt_deq_lut(a.type, threadIdx.x);
    __syncthreads();
}

// 32 elements per thread, from element i0 (a multiple of 32) to i0 + 32·groups: the path every
// whole weight takes (the experts' scratch, q/k/v/o per use), so it is written to cost memory
// bandwidth, not instructions (issue 27: ≤ 8 SASS instructions per element; `make bench-gpu`
// counts them). Specialised on the format and double quant (no branch per element); the block
// index is a shift (blocksize a power of two ≥ 32, so one block per thread: checked by the
// launcher); the block's scale, double quant resolved, is computed once per thread. The codes go
// through a 256-entry table of byte → (value of the high code, value of the low code): one
// shared load per byte. INT4's table holds the codes themselves as floats.
// Values are those of mt_deq_value: lut·s (NF4/FP4/MXFP4) or c·d + m (INT4), each rounded as the CPU
// does. MXFP4's table is of byte → (2 × low code's value, 2 × high code's): its element 2k is the low
// nibble, and 2v · 2^(e−128) is ldexp(v, e − 127) for every e (mt_mxfp4_value).
static __device__ __forceinline__ void store_pair(__nv_bfloat16 *v, int k, float x0, float x1) {
    ((__nv_bfloat162 *)v)[k] = __floats2bfloat162_rn(x0, x1);  // .x (element 2k) at the lower address
}
static __device__ __forceinline__ void store_pair(float *v, int k, float x0, float x1) {
    ((float2 *)v)[k] = make_float2(x0, x1);
}

// Where element e (from the range's first) goes when the output's rows are wider than the
// weight's (a row stride ldd > in: model/grouped_cuda.cu puts a LoRA's B beside W): e +
// (e / in)·(ldd − in). The division is a multiply-high by a magic number (Granlund and Montgomery,
// exact for e < 2^31: the launcher checks), once per 16-byte store (8 bf16 or 4 f32 elements).
// The whole-weight kernels come in two instantiations (ROWS), so that the contiguous ones, the
// default everywhere else, compile as if this did not exist.
struct rowmap {
    uint32_t pad, magic, shift;
};
static __device__ __forceinline__ uint32_t out_index(const rowmap &r, int64_t e) {  // 32-bit: out·ldd < 2^31
    const uint32_t n = (uint32_t)e, q = (__umulhi(n, r.magic) + n) >> r.shift;
    return n + q * r.pad;
}

// The byte → value-pair table (above) in shared memory; every thread of the block fills some.
template <int TYPE> static __device__ __forceinline__ void fill_pairs(float2 *pair) {
    for (int t = threadIdx.x; t < 256; t += blockDim.x) {
        const unsigned hi = (unsigned)t >> 4, lo = (unsigned)t & 15u;
        pair[t] = TYPE == MT_QUANT_INT4    ? make_float2((float)hi, (float)lo)
                  : TYPE == MT_QUANT_MXFP4 ? make_float2(2.0f * mt_deq_lut(TYPE, lo), 2.0f * mt_deq_lut(TYPE, hi))
                                           : make_float2(mt_deq_lut(TYPE, hi), mt_deq_lut(TYPE, lo));
    }
    __syncthreads();
}

// Block b's scale (INT4: and minimum m), double quant resolved.
template <int TYPE, bool DQ>
static __device__ __forceinline__ float block_scale(const mt_deq_args &a, int64_t b, float *m) {
    *m = 0.0f;
    if (TYPE == MT_QUANT_INT4) {
        *m = __half2float(a.zero[b]);
        return __half2float(((const __half *)a.absmax)[b]);
    }
    if (TYPE == MT_QUANT_MXFP4) return mt_e8m0_half(((const uint8_t *)a.absmax)[b]);  // the table holds 2·e2m1
    if (DQ) {
        const uint8_t c = ((const uint8_t *)a.absmax)[b];
        return __fadd_rn(__fmul_rn(a.nested_map[c], a.nested_absmax[b / MT_Q4_NESTED_BLOCKSIZE]), a.offset);
    }
    return ((const float *)a.absmax)[b];
}

// The first N bytes of the codes in w (2N elements) into v's first N value pairs.
template <int TYPE, typename OUT, int N>
static __device__ __forceinline__ void decode(OUT *v, const uint32_t *w, const float2 *pair, float s, float m) {
#pragma unroll
    for (int k = 0; k < N; k++) {
        const float2 c = pair[(w[k >> 2] >> (8 * (k & 3))) & 255u];  // byte k: elements 2k, 2k + 1
        if (TYPE == MT_QUANT_INT4) store_pair(v, k, __fadd_rn(__fmul_rn(c.x, s), m), __fadd_rn(__fmul_rn(c.y, s), m));
        else store_pair(v, k, __fmul_rn(c.x, s), __fmul_rn(c.y, s));
    }
}

// 32 elements a thread, contiguous: one 16-byte load of codes, the block scale once, 64 bytes of
// bf16 out. A warp's stores are 16 bytes a lane 64 bytes apart, each 32-byte sector written by two
// instructions: measured at 0.61 (H100) and 0.50 (H200) of the copy bandwidth in 2026-11-27's runs.
// Kept beside dequant8_kernel until a GPU times both (mt_dequant_cuda_kernel).
template <int TYPE, bool DQ, typename OUT, bool ROWS>
static __device__ __forceinline__ void dequant32_thread(const mt_deq_args &a, int64_t i0, int64_t groups, int bs_shift,
                                                        const rowmap &rm, OUT *__restrict__ dst, const float2 *pair) {
    const int64_t gi = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (gi >= groups) return;
    const int64_t e = i0 + 32 * gi;
    const uint4 raw = __ldg((const uint4 *)(a.packed + (e >> 1)));  // 16 bytes = 32 codes, 16-byte aligned
    float m;
    const float s = block_scale<TYPE, DQ>(a, e >> bs_shift, &m);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    __align__(16) OUT v[32];
    decode<TYPE, OUT, 16>(v, w, pair, s, m);
    constexpr int PER = 16 / sizeof(OUT);  // elements a 16-byte store: never across a row (in % 8 == 0)
#pragma unroll
    for (int k = 0; k < (int)(32 / PER); k++)
        *(uint4 *)(dst + (ROWS ? out_index(rm, e - i0 + k * PER) : e - i0 + k * PER)) = ((const uint4 *)v)[k];
}

template <int TYPE, bool DQ, typename OUT>
static __global__ void dequant32_kernel(mt_deq_args a, int64_t i0, int64_t groups, int bs_shift, OUT *__restrict__ dst) {
    __shared__ float2 pair[256];
    fill_pairs<TYPE>(pair);
    dequant32_thread<TYPE, DQ, OUT, false>(a, i0, groups, bs_shift, rowmap{0, 0, 0}, dst, pair);
}

template <int TYPE, bool DQ, typename OUT>
static __global__ void dequant32_rows_kernel(mt_deq_args a, int64_t i0, int64_t groups, int bs_shift, rowmap rm,
                                             OUT *__restrict__ dst) {
    __shared__ float2 pair[256];
    fill_pairs<TYPE>(pair);
    dequant32_thread<TYPE, DQ, OUT, true>(a, i0, groups, bs_shift, rm, dst, pair);
}

// The default: 8 elements an item, DEQ_ITEMS items a thread DEQ_THREADS items apart, so a warp
// reads 4 bytes a lane and writes 16 (bf16) a lane, each contiguous across the warp (whole
// sectors per instruction); every item's loads are issued before any is decoded. The items'
// codes, outputs and blocks are at fixed strides from the thread's first (the launcher takes this
// kernel only when 8 · DEQ_THREADS is a multiple of the blocksize): the codes' and outputs'
// offsets are immediates, the blocks' one add an item. Same values as dequant32_kernel;
// scripts/sass_count.sh counts this one (and, apart, its rows instantiation).
template <int TYPE, bool DQ, typename OUT, bool ROWS>
static __device__ __forceinline__ void dequant8_thread(const mt_deq_args &a, int64_t i0, int64_t items, int bs_shift,
                                                       const rowmap &rm, OUT *__restrict__ dst, const float2 *pair) {
    constexpr int STRIDE = 8 * DEQ_THREADS;  // elements from one of a thread's items to the next
    const int64_t first = (int64_t)blockIdx.x * DEQ_THREADS * DEQ_ITEMS + threadIdx.x;
    if (first >= items) return;
    const int64_t e0 = i0 + 8 * first, b0 = e0 >> bs_shift;
    const int bstep = STRIDE >> bs_shift, n = (int)MT_MIN((int64_t)DEQ_ITEMS, (items - first + DEQ_THREADS - 1) / DEQ_THREADS);
    const uint32_t *codes = (const uint32_t *)(a.packed + (e0 >> 1));  // 8 codes an item, 4-byte aligned
    uint32_t w[DEQ_ITEMS];
    float s[DEQ_ITEMS], m[DEQ_ITEMS];
#pragma unroll
    for (int j = 0; j < DEQ_ITEMS; j++)
        if (j < n) w[j] = __ldg(codes + j * (STRIDE / 8)), s[j] = block_scale<TYPE, DQ>(a, b0 + j * bstep, &m[j]);
#pragma unroll
    for (int j = 0; j < DEQ_ITEMS; j++) {
        if (j >= n) break;
        __align__(16) OUT v[8];
        decode<TYPE, OUT, 4>(v, &w[j], pair, s[j], m[j]);
        // an item never crosses a row (in % 8 == 0)
        OUT *out = dst + (ROWS ? out_index(rm, e0 - i0 + j * STRIDE) : e0 - i0 + j * STRIDE);
#pragma unroll
        for (int k = 0; k < (int)(8 * sizeof(OUT) / 16); k++) ((uint4 *)out)[k] = ((const uint4 *)v)[k];
    }
}

template <int TYPE, bool DQ, typename OUT>
static __global__ void __launch_bounds__(DEQ_THREADS)
    dequant8_kernel(mt_deq_args a, int64_t i0, int64_t items, int bs_shift, OUT *__restrict__ dst) {
    __shared__ float2 pair[256];
    fill_pairs<TYPE>(pair);
    dequant8_thread<TYPE, DQ, OUT, false>(a, i0, items, bs_shift, rowmap{0, 0, 0}, dst, pair);
}

template <int TYPE, bool DQ, typename OUT>
static __global__ void __launch_bounds__(DEQ_THREADS)
    dequant8_rows_kernel(mt_deq_args a, int64_t i0, int64_t items, int bs_shift, rowmap rm, OUT *__restrict__ dst) {
    __shared__ float2 pair[256];
    fill_pairs<TYPE>(pair);
    dequant8_thread<TYPE, DQ, OUT, true>(a, i0, items, bs_shift, rm, dst, pair);
}

// One element per thread: [from, i1) of the range that starts at i0 into dst (dst[0] = element i0).
template <typename OUT>
static __global__ void dequant1_kernel(mt_deq_args a, int64_t i0, int64_t from, int64_t i1, rowmap rm,
                                       OUT *__restrict__ dst) {
    __shared__ float lut[16];
    load_lut(a, lut);
    int64_t i = from + (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= i1) return;
    float m = 0.0f, s = mt_deq_block_scale(a, i / a.bs, &m);
    unsigned c = mt_deq_code(a.type, a.packed, i);
    store(dst, rm.pad ? out_index(rm, i - i0) : i - i0, mt_deq_value(a, lut, c, s, m));
}

// ---------------------------------------------------------------------------------------------
// Launchers

static unsigned ctas(int64_t items, int64_t per_cta) { return (unsigned)((items + per_cta - 1) / per_cta); }

extern "C" void mt_q4_quantize_cuda(mt_backend *be, mt_quant type, const void *x, mt_dtype xt, int64_t n,
                                    int blocksize, uint8_t *packed, float *absmax) {
    if (n <= 0) return;
    cudaStream_t st = q_begin(be, packed);
    unsigned grid = ctas((n + blocksize - 1) / blocksize, WARPS_PER_CTA), block = 32 * WARPS_PER_CTA;
#define Q4_LAUNCH(T)                                                                                     \
    if (type == MT_QUANT_FP4)                                                                            \
        q4_quantize_kernel<T, MT_QUANT_FP4><<<grid, block, 0, st>>>((const T *)x, n, blocksize, packed, absmax); \
    else                                                                                                 \
        q4_quantize_kernel<T, MT_QUANT_NF4><<<grid, block, 0, st>>>((const T *)x, n, blocksize, packed, absmax);
    switch (xt) {
    case MT_F32: Q4_LAUNCH(float) break;
    case MT_BF16: Q4_LAUNCH(__nv_bfloat16) break;
    case MT_F16: Q4_LAUNCH(__half) break;
    default: mt_fatal(MT_EXIT_ERROR, "quantize (cuda): source dtype %s", mt_dtype_name(xt));
    }
#undef Q4_LAUNCH
    q_end(st);
}

extern "C" void mt_mxfp4_quantize_cuda(mt_backend *be, const void *x, mt_dtype xt, int64_t n, uint8_t *packed,
                                       uint8_t *scales) {
    if (n <= 0) return;
    cudaStream_t st = q_begin(be, packed);
    unsigned grid = ctas(n / MT_MXFP4_BLOCK, WARPS_PER_CTA), block = 32 * WARPS_PER_CTA;
    switch (xt) {
    case MT_F32: mxfp4_quantize_kernel<float><<<grid, block, 0, st>>>((const float *)x, n, packed, scales); break;
    case MT_BF16:
        mxfp4_quantize_kernel<__nv_bfloat16><<<grid, block, 0, st>>>((const __nv_bfloat16 *)x, n, packed, scales);
        break;
    case MT_F16: mxfp4_quantize_kernel<__half><<<grid, block, 0, st>>>((const __half *)x, n, packed, scales); break;
    default: mt_fatal(MT_EXIT_ERROR, "quantize (cuda): source dtype %s", mt_dtype_name(xt));
    }
    q_end(st);
}

extern "C" void mt_q8_quantize_cuda(mt_backend *be, const float *map256, const float *absmax, int64_t nb,
                                    float offset, uint8_t *codes, float *nested_absmax) {
    if (nb <= 0) return;
    cudaStream_t st = q_begin(be, codes);
    const float *map = map256;
    if (!map) MT_CHECK_CUDA(cudaGetSymbolAddress((void **)&map, mt_d_dynamic_map));
    q8_quantize_kernel<<<ctas(nb, 256), 256, 0, st>>>(map, absmax, nb, offset, codes, nested_absmax);
    q_end(st);
}

extern "C" void mt_int4_quantize_cuda(mt_backend *be, const void *x, mt_dtype xt, int64_t n, int group,
                                      uint8_t *packed, uint16_t *scale, uint16_t *minimum) {
    if (n <= 0) return;
    cudaStream_t st = q_begin(be, packed);
    unsigned grid = ctas((n + group - 1) / group, WARPS_PER_CTA), block = 32 * WARPS_PER_CTA;
    __half *sc = (__half *)scale, *mn = (__half *)minimum;
    switch (xt) {
    case MT_F32: int4_quantize_kernel<float><<<grid, block, 0, st>>>((const float *)x, n, group, packed, sc, mn); break;
    case MT_BF16:
        int4_quantize_kernel<__nv_bfloat16><<<grid, block, 0, st>>>((const __nv_bfloat16 *)x, n, group, packed, sc, mn);
        break;
    case MT_F16: int4_quantize_kernel<__half><<<grid, block, 0, st>>>((const __half *)x, n, group, packed, sc, mn); break;
    default: mt_fatal(MT_EXIT_ERROR, "quantize (cuda): source dtype %s", mt_dtype_name(xt));
    }
    q_end(st);
}

// log2(bs) when bs is a power of two ≥ 32 (a 32-element group then lies in one block), else -1.
static int block_shift(int bs) {
    if (bs < 32 || (bs & (bs - 1))) return -1;
    int sh = 0;
    while ((1 << sh) < bs) sh++;
    return sh;
}

// Which whole-weight kernel runs: 0 dequant8_kernel (the default), 1 dequant32_kernel.
static int deq_kernel;
extern "C" void mt_dequant_cuda_kernel(int which) { deq_kernel = which; }

template <int TYPE, bool DQ, typename OUT>
static void dequant32_launch(const mt_deq_args &a, int64_t i0, int64_t groups, int sh, rowmap rm, OUT *dst,
                             cudaStream_t st) {
    const unsigned grid32 = ctas(groups, DEQ_THREADS), grid8 = ctas(4 * groups, (int64_t)DEQ_THREADS * DEQ_ITEMS);
    if (deq_kernel == 1 || (8 * DEQ_THREADS) % (1 << sh)) {  // dequant8_kernel: blocks at a fixed stride
        if (rm.pad) dequant32_rows_kernel<TYPE, DQ, OUT><<<grid32, DEQ_THREADS, 0, st>>>(a, i0, groups, sh, rm, dst);
        else dequant32_kernel<TYPE, DQ, OUT><<<grid32, DEQ_THREADS, 0, st>>>(a, i0, groups, sh, dst);
    } else {  // 8 elements an item
        if (rm.pad) dequant8_rows_kernel<TYPE, DQ, OUT><<<grid8, DEQ_THREADS, 0, st>>>(a, i0, 4 * groups, sh, rm, dst);
        else dequant8_kernel<TYPE, DQ, OUT><<<grid8, DEQ_THREADS, 0, st>>>(a, i0, 4 * groups, sh, dst);
    }
}

template <typename OUT>
static void dequant_launch(const mt_deq_args &a, int64_t i0, int64_t i1, rowmap rm, OUT *dst, cudaStream_t st) {
    int64_t vec_end = i0;
    const int sh = block_shift(a.bs);
    if (i0 % 32 == 0 && ((uintptr_t)dst & 15) == 0 && sh >= 0) {
        int64_t groups = (i1 - i0) / 32;
        if (groups > 0) {
            if (a.type == MT_QUANT_INT4) dequant32_launch<MT_QUANT_INT4, false>(a, i0, groups, sh, rm, dst, st);
            else if (a.type == MT_QUANT_MXFP4) dequant32_launch<MT_QUANT_MXFP4, false>(a, i0, groups, sh, rm, dst, st);
            else if (a.type == MT_QUANT_FP4 && a.dq) dequant32_launch<MT_QUANT_FP4, true>(a, i0, groups, sh, rm, dst, st);
            else if (a.type == MT_QUANT_FP4) dequant32_launch<MT_QUANT_FP4, false>(a, i0, groups, sh, rm, dst, st);
            else if (a.dq) dequant32_launch<MT_QUANT_NF4, true>(a, i0, groups, sh, rm, dst, st);
            else dequant32_launch<MT_QUANT_NF4, false>(a, i0, groups, sh, rm, dst, st);
        }
        vec_end = i0 + 32 * groups;
    }
    if (vec_end < i1)
        dequant1_kernel<OUT><<<ctas(i1 - vec_end, DEQ_THREADS), DEQ_THREADS, 0, st>>>(a, i0, vec_end, i1, rm, dst);
}

// Elements [i0, i1) of W into dst. The bytes a whole weight moves here: mt_qweight_dequant_bytes
// (quant/qweight.h), which must follow any change to what this reads or writes.
static void dequantize_on(const mt_qweight *q, void *dst, mt_dtype dt, int64_t i0, int64_t i1, rowmap rm,
                          void *stream) {
    if (i1 <= i0) return;
    if (!mt_qweight_has_codes(q))
        mt_fatal(MT_EXIT_ERROR, "dequantize (cuda): the 4-bit [%lld, %lld] weight's codes were released (it is kept "
                 "dequantized)", (long long)q->out, (long long)q->in);
    cudaStream_t st = q_begin(q->be, q->packed->data);
    if (stream) st = (cudaStream_t)stream;
    mt_deq_args a = mt_deq_args_of(q);
    if (dt == MT_BF16) dequant_launch(a, i0, i1, rm, (__nv_bfloat16 *)dst, st);
    else if (dt == MT_F32) dequant_launch(a, i0, i1, rm, (float *)dst, st);
    else mt_fatal(MT_EXIT_ERROR, "dequantize (cuda): target dtype %s", mt_dtype_name(dt));
    q_end(st);
}

extern "C" void mt_qweight_dequantize_cuda_on(const mt_qweight *q, void *dst, mt_dtype dt, int64_t i0, int64_t i1,
                                              void *stream) {
    dequantize_on(q, dst, dt, i0, i1, rowmap{0, 0, 0}, stream);
}

extern "C" int mt_qweight_dequantize_rows_cuda_on(const mt_qweight *q, void *dst, mt_dtype dt, int64_t ldd,
                                                  void *stream) {
    const int64_t in = q->in, n = q->out * q->in;
    if (ldd == in) {  // rows without room: the whole weight as one block, as mt_qweight_dequantize_cuda_on
        mt_qweight_dequantize_cuda_on(q, dst, dt, 0, n, stream);
        return 0;
    }
    if (in <= 0 || ldd < in || in % 8 || ldd % 8 || q->out * ldd >= ((int64_t)1 << 31) || ((uintptr_t)dst & 15)) {
        mt_error_set("dequantize rows (cuda): [%lld, %lld] at a row stride of %lld: the stride must be >= in, both "
                     "multiples of 8, out · stride below 2^31, dst 16-byte aligned",
                     (long long)q->out, (long long)in, (long long)ldd);
        return -1;
    }
    rowmap rm = {(uint32_t)(ldd - in), 0, 0};
    while (((int64_t)1 << rm.shift) < in) rm.shift++;
    rm.magic = (uint32_t)((((uint64_t)1 << 32) * (((uint64_t)1 << rm.shift) - (uint64_t)in)) / (uint64_t)in + 1);
    dequantize_on(q, dst, dt, 0, n, rm, stream);
    return 0;
}

extern "C" void mt_qweight_dequantize_cuda(const mt_qweight *q, void *dst, mt_dtype dt, int64_t i0, int64_t i1) {
    mt_qweight_dequantize_cuda_on(q, dst, dt, i0, i1, NULL);
}
