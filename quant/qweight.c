// quant/qweight.c — the frozen 4-bit weight: allocation through the ledger, quantization on
// every backend, dequantization and the two training matmuls on the CPU.
#include <math.h>
#include <string.h>

#include "core/common.h"
#include "core/gemm.h"
#include "quant/quant.h"

// Elements quantized between two calls of the `consumed` hook (and, on cuda, per upload).
#define QUANT_STRETCH ((int64_t)MT_Q4_CHUNK * 4096)  // 16M elements

static size_t elem_bytes(mt_dtype t) { return t == MT_F32 ? 4 : 2; }

// Elements [i0, i0 + len) of src as f32. Loads go through memcpy: src may be a checkpoint's
// mmap, whose tensors have no alignment guarantee.
static void load_f32(float *dst, const void *src, mt_dtype t, int64_t i0, int64_t len) {
    if (t == MT_F32) {
        memcpy(dst, (const char *)src + 4 * i0, (size_t)len * sizeof(float));
    } else if (t == MT_BF16) {
        const char *s = (const char *)src + 2 * i0;
        uint32_t *d = (uint32_t *)(void *)dst;
#pragma omp simd
        for (int64_t i = 0; i < len; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            d[i] = (uint32_t)h << 16;
        }
    } else {
        const char *s = (const char *)src + 2 * i0;
        for (int64_t i = 0; i < len; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = mt_f16_to_f32(h);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Allocation

void mt_qweight_free(mt_qweight *q) {
    if (!q) return;
    mt_tensor_free(q->packed);
    mt_tensor_free(q->absmax);
    mt_tensor_free(q->zero);
    mt_tensor_free(q->nested_absmax);
    mt_tensor_free(q->nested_map);
    memset(q, 0, sizeof *q);
}

void mt_qweight_release_codes(mt_qweight *q) {
    mt_tensor **t[] = {&q->packed, &q->absmax, &q->zero, &q->nested_absmax, &q->nested_map};
    for (size_t i = 0; i < MT_ARRAY_LEN(t); i++) mt_tensor_free(*t[i]), *t[i] = NULL;
}

uint64_t mt_qweight_bytes(const mt_qweight *q) {
    const mt_tensor *t[] = {q->packed, q->absmax, q->zero, q->nested_absmax, q->nested_map};
    uint64_t b = 0;
    for (size_t i = 0; i < MT_ARRAY_LEN(t); i++) b += t[i] ? t[i]->nbytes : 0;
    return b;
}

// Checks the arguments and fills q's description (no memory yet).
static int qweight_describe(mt_qweight *q, mt_backend *be, const char *name, int64_t out, int64_t in,
                            mt_quant type, int blocksize, int double_quant) {
    memset(q, 0, sizeof *q);
    if (type != MT_QUANT_NF4 && type != MT_QUANT_FP4 && type != MT_QUANT_INT4 && type != MT_QUANT_MXFP4) {
        mt_error_set("'%s': quant type %d is not nf4, fp4, int4 or mxfp4", name, (int)type);
        return -1;
    }
    if (blocksize <= 0) blocksize = mt_qformats[type].default_blocksize;
    if (type == MT_QUANT_MXFP4 && blocksize != MT_MXFP4_BLOCK) {
        mt_error_set("'%s': mxfp4's blocks are %d elements, not %d", name, MT_MXFP4_BLOCK, blocksize);
        return -1;
    }
    if (type == MT_QUANT_MXFP4 && in % MT_MXFP4_BLOCK != 0) {  // a block is part of one row
        mt_error_set("'%s': mxfp4 needs the input dimension a multiple of %d; [%lld, %lld] is not", name,
                     MT_MXFP4_BLOCK, (long long)out, (long long)in);
        return -1;
    }
    if (!mt_q4_blocksize_ok(blocksize)) {
        mt_error_set("'%s': blocksize %d is not a power of two in 32..4096", name, blocksize);
        return -1;
    }
    uint64_t n;
    if (out <= 0 || in <= 0 || !mt_mul_ok((uint64_t)out, (uint64_t)in, &n) || n > (UINT64_C(1) << 40)) {
        mt_error_set("'%s': shape [%lld, %lld] is empty, negative or too large", name, (long long)out,
                     (long long)in);
        return -1;
    }
    q->type = type;
    q->blocksize = blocksize;
    q->double_quant = mt_qformats[type].double_quant && double_quant;
    q->out = out;
    q->in = in;
    q->nblocks = mt_q4_blocks((int64_t)n, blocksize);
    q->be = be;
    q->dtype = MT_F32;
    return 0;
}

// Allocates q's tensors on its backend under `base` (the nested map only when own_map).
static int qweight_alloc(mt_qweight *q, const char *name, int own_map) {
    int64_t n = q->out * q->in, nb = q->nblocks;
    int64_t s_packed[1] = {mt_q4_packed_bytes(n)}, s_blocks[1] = {nb};
    int64_t s_nested[1] = {mt_q4_blocks(nb, MT_Q4_NESTED_BLOCKSIZE)}, s_map[1] = {256};
    mt_backend *be = q->be;
    q->packed = mt_tensor_new(be, MT_MEM_BASE, MT_U8, 1, s_packed);
    if (!q->packed) goto fail;
    if (q->type == MT_QUANT_INT4) {
        q->absmax = mt_tensor_new(be, MT_MEM_BASE, MT_F16, 1, s_blocks);
        q->zero = q->absmax ? mt_tensor_new(be, MT_MEM_BASE, MT_F16, 1, s_blocks) : NULL;
        if (!q->zero) goto fail;
    } else if (q->type == MT_QUANT_MXFP4) {
        if (!(q->absmax = mt_tensor_new(be, MT_MEM_BASE, MT_U8, 1, s_blocks))) goto fail;  // e8m0 bytes
    } else if (q->double_quant) {
        q->absmax = mt_tensor_new(be, MT_MEM_BASE, MT_U8, 1, s_blocks);
        q->nested_absmax = q->absmax ? mt_tensor_new(be, MT_MEM_BASE, MT_F32, 1, s_nested) : NULL;
        if (!q->nested_absmax) goto fail;
        if (own_map && !(q->nested_map = mt_tensor_new(be, MT_MEM_BASE, MT_F32, 1, s_map))) goto fail;
    } else {
        q->absmax = mt_tensor_new(be, MT_MEM_BASE, MT_F32, 1, s_blocks);
        if (!q->absmax) goto fail;
    }
    return 0;
fail:
    mt_error_prefix("'%s': %s weight [%lld, %lld]", name, mt_qformats[q->type].name,
                    (long long)q->out, (long long)q->in);
    mt_qweight_free(q);
    return -1;
}

int mt_qweight_alloc(mt_qweight *q, mt_backend *be, const char *name, int64_t out, int64_t in,
                      mt_quant type, int blocksize, int double_quant, int own_map) {
    if (qweight_describe(q, be, name, out, in, type, blocksize, double_quant) != 0) return -1;
    return qweight_alloc(q, name, own_map);
}

int mt_qweight_clone(mt_qweight *dst, const mt_qweight *src, const char *name) {
    if (mt_qweight_alloc(dst, src->be, name, src->out, src->in, src->type, src->blocksize, src->double_quant,
                         src->nested_map != NULL) != 0)
        return -1;
    mt_tensor *const from[] = {src->packed, src->absmax, src->zero, src->nested_absmax, src->nested_map};
    mt_tensor *const to[] = {dst->packed, dst->absmax, dst->zero, dst->nested_absmax, dst->nested_map};
    for (size_t i = 0; i < MT_ARRAY_LEN(from); i++)
        if (from[i]) src->be->ops->copy(src->be, to[i]->data, from[i]->data, from[i]->nbytes);
    dst->dtype = src->dtype, dst->offset = src->offset;
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Quantization

// The first element of x [len] that the format cannot take (NaN, Inf; fp16 overflow for INT4),
// or -1.
static int64_t first_bad(const float *x, int64_t len, mt_quant type) {
    float lim = type == MT_QUANT_INT4 ? 65520.0f : INFINITY;
    int bad = 0;
#pragma omp simd reduction(| : bad)
    for (int64_t i = 0; i < len; i++) bad |= !(fabsf(x[i]) < lim);
    if (!bad) return -1;
    for (int64_t i = 0; i < len; i++)
        if (!(fabsf(x[i]) < lim)) return i;
    return -1;
}

static int report_bad(const char *name, const void *w, mt_dtype wt, int64_t i, mt_quant type) {
    float v;
    load_f32(&v, w, wt, i, 1);
    mt_error_set("'%s': element %lld is %g, which %s cannot represent", name, (long long)i, v,
                 type == MT_QUANT_INT4 ? "int4 (fp16 scales)" : mt_qformats[type].name);
    return -1;
}

static int quantize_cpu(mt_qweight *q, const char *name, const void *w, mt_dtype wt,
                        mt_quant_consumed_fn consumed) {
    int64_t n = q->out * q->in, bs = q->blocksize;
    float *absmax = NULL;  // fp32 absmax: q's own, or a work buffer before double quantization
    if (q->type != MT_QUANT_INT4 && q->type != MT_QUANT_MXFP4) {
        if (!q->double_quant) absmax = q->absmax->data;
        else if (mt_backend_alloc(q->be, MT_MEM_WORK, (size_t)q->nblocks * sizeof(float), (void **)&absmax) != 0)
            return -1;
    }
    uint8_t *packed = q->packed->data;
    int64_t bad = INT64_MAX;
    for (int64_t s0 = 0; s0 < n && bad == INT64_MAX; s0 += QUANT_STRETCH) {
        int64_t s1 = MT_MIN(n, s0 + QUANT_STRETCH);
#pragma omp parallel for schedule(dynamic, 16) reduction(min : bad)
        for (int64_t c = s0; c < s1; c += MT_Q4_CHUNK) {
            float buf[MT_Q4_CHUNK];
            int64_t len = MT_MIN(MT_Q4_CHUNK, s1 - c);
            load_f32(buf, w, wt, c, len);
            int64_t b = first_bad(buf, len, q->type);
            if (b >= 0) {
                bad = MT_MIN(bad, c + b);
                continue;
            }
            if (q->type == MT_QUANT_INT4)
                mt_int4_quantize_ref(buf, len, (int)bs, packed + c / 2, (uint16_t *)q->absmax->data + c / bs,
                                     (uint16_t *)q->zero->data + c / bs);
            else if (q->type == MT_QUANT_MXFP4)
                mt_mxfp4_quantize_ref(buf, len, packed + c / 2, (uint8_t *)q->absmax->data + c / bs);
            else
                mt_q4_quantize_ref(q->type, buf, len, (int)bs, packed + c / 2, absmax + c / bs);
        }
        if (consumed) consumed((const char *)w + (size_t)s0 * elem_bytes(wt), (size_t)(s1 - s0) * elem_bytes(wt));
    }
    int rc = 0;
    if (bad != INT64_MAX) rc = report_bad(name, w, wt, bad, q->type);
    else if (q->double_quant) {
        q->offset = mt_q8_offset(absmax, q->nblocks);
        mt_q8_quantize_ref(mt_dynamic_map, absmax, q->nblocks, q->offset, q->absmax->data,
                           q->nested_absmax->data);
    }
    if (q->double_quant) mt_backend_release(q->be, MT_MEM_WORK, (size_t)q->nblocks * sizeof(float), absmax);
    return rc;
}

#ifdef MT_CUDA
// Uploads stretches of w to a device buffer (in w's own dtype) and quantizes them there; the
// double-quant offset is the same double-precision mean as on the CPU, so both backends give
// the same bytes.
static int quantize_cuda(mt_qweight *q, const char *name, const void *w, mt_dtype wt,
                         mt_quant_consumed_fn consumed) {
    mt_backend *be = q->be;
    int64_t n = q->out * q->in, bs = q->blocksize, stretch = MT_MIN(QUANT_STRETCH, n);
    size_t es = elem_bytes(wt), absmax_bytes = (size_t)q->nblocks * sizeof(float);
    void *dx = NULL;
    float *dabs = NULL, *habs = NULL;
    if (mt_backend_alloc(be, MT_MEM_WORK, (size_t)stretch * es, &dx) != 0) return -1;
    if (q->type != MT_QUANT_INT4 && q->type != MT_QUANT_MXFP4) {
        if (!q->double_quant) dabs = q->absmax->data;
        else if (mt_backend_alloc(be, MT_MEM_WORK, absmax_bytes, (void **)&dabs) != 0) {
            mt_backend_release(be, MT_MEM_WORK, (size_t)stretch * es, dx);
            return -1;
        }
    }
    float *buf = mt_xmalloc(MT_Q4_CHUNK * sizeof(float));
    int rc = 0;
    for (int64_t s0 = 0; s0 < n && rc == 0; s0 += stretch) {
        int64_t len = MT_MIN(stretch, n - s0);
        for (int64_t c = 0; c < len && rc == 0; c += MT_Q4_CHUNK) {  // refuse what cannot be coded
            int64_t l = MT_MIN(MT_Q4_CHUNK, len - c), b;
            load_f32(buf, w, wt, s0 + c, l);
            if ((b = first_bad(buf, l, q->type)) >= 0) rc = report_bad(name, w, wt, s0 + c + b, q->type);
        }
        if (rc) break;
        be->ops->upload(be, dx, (const char *)w + (size_t)s0 * es, (size_t)len * es);
        if (q->type == MT_QUANT_INT4)
            mt_int4_quantize_cuda(be, dx, wt, len, (int)bs, (uint8_t *)q->packed->data + s0 / 2,
                                  (uint16_t *)q->absmax->data + s0 / bs, (uint16_t *)q->zero->data + s0 / bs);
        else if (q->type == MT_QUANT_MXFP4)
            mt_mxfp4_quantize_cuda(be, dx, wt, len, (uint8_t *)q->packed->data + s0 / 2,
                                   (uint8_t *)q->absmax->data + s0 / bs);
        else
            mt_q4_quantize_cuda(be, q->type, dx, wt, len, (int)bs, (uint8_t *)q->packed->data + s0 / 2,
                                dabs + s0 / bs);
        if (consumed) consumed((const char *)w + (size_t)s0 * es, (size_t)len * es);
    }
    free(buf);
    if (rc == 0 && q->double_quant) {
        habs = mt_xmalloc(absmax_bytes);
        be->ops->download(be, habs, dabs, absmax_bytes);
        q->offset = mt_q8_offset(habs, q->nblocks);
        free(habs);
        mt_q8_quantize_cuda(be, NULL, dabs, q->nblocks, q->offset, q->absmax->data, q->nested_absmax->data);
    }
    if (q->double_quant && dabs) mt_backend_release(be, MT_MEM_WORK, absmax_bytes, dabs);
    mt_backend_release(be, MT_MEM_WORK, (size_t)stretch * es, dx);
    return rc;
}
#endif

int mt_qweight_quantize_from(mt_qweight *q, mt_backend *be, const char *name, const void *w,
                             mt_dtype wt, int64_t out, int64_t in, mt_quant type, int blocksize,
                             int double_quant, mt_quant_consumed_fn consumed) {
    if (qweight_describe(q, be, name, out, in, type, blocksize, double_quant) != 0) return -1;
    if (wt != MT_F32 && wt != MT_BF16 && wt != MT_F16) {
        mt_error_set("'%s': cannot quantize from %s (f32, bf16 or f16)", name, mt_dtype_name(wt));
        return -1;
    }
    if (qweight_alloc(q, name, 0) != 0) return -1;
    q->dtype = wt;
    int rc = 0;
    switch (be->ops->kind) {
    case MT_BACKEND_NULL: return 0;  // the ledger has counted it; nothing to compute
    case MT_BACKEND_CPU:
        if (!w) break;
        rc = quantize_cpu(q, name, w, wt, consumed);
        break;
    case MT_BACKEND_CUDA:
        if (!w) break;
#ifdef MT_CUDA
        rc = quantize_cuda(q, name, w, wt, consumed);
#else
        mt_error_set("'%s': cuda backend in a build without CUDA", name);
        rc = -1;
#endif
        break;
    }
    if (!w) {
        mt_error_set("'%s': no weight data to quantize", name);
        rc = -1;
    }
    if (rc != 0) mt_qweight_free(q);
    return rc;
}

int mt_qweight_quantize(mt_qweight *q, mt_backend *be, const char *name, const float *w, int64_t out,
                        int64_t in, mt_quant type, int blocksize, int double_quant) {
    return mt_qweight_quantize_from(q, be, name, w, MT_F32, out, in, type, blocksize, double_quant, NULL);
}

float mt_q4_offset_from(const void *w, mt_dtype wt, int64_t n, int blocksize,
                        mt_quant_consumed_fn consumed) {
    int64_t nb = mt_q4_blocks(n, blocksize);
    float *absmax = mt_xmalloc((size_t)nb * sizeof(float));
    for (int64_t s0 = 0; s0 < n; s0 += QUANT_STRETCH) {
        int64_t s1 = MT_MIN(n, s0 + QUANT_STRETCH);
#pragma omp parallel for schedule(static)
        for (int64_t c = s0; c < s1; c += MT_Q4_CHUNK) {
            float buf[MT_Q4_CHUNK];
            int64_t len = MT_MIN(MT_Q4_CHUNK, s1 - c);
            load_f32(buf, w, wt, c, len);
            for (int64_t b = 0; b * blocksize < len; b++)
                absmax[c / blocksize + b] =
                    mt_q4_block_absmax(buf + b * blocksize, MT_MIN(len - b * blocksize, (int64_t)blocksize));
        }
        if (consumed) consumed((const char *)w + (size_t)s0 * elem_bytes(wt), (size_t)(s1 - s0) * elem_bytes(wt));
    }
    float offset = mt_q8_offset(absmax, nb);
    free(absmax);
    return offset;
}

// ---------------------------------------------------------------------------------------------
// Dequantization on the CPU

static const float *nested_map_of(const mt_qweight *q) {
    return q->nested_map ? (const float *)q->nested_map->data : mt_dynamic_map;
}

// Flat elements [i0, i1) of q (on the cpu backend) into y; i1 - i0 <= MT_Q4_CHUNK and the
// range inside one chunk, so the rebuilt scales fit on the stack.
static void dequant_chunk(const mt_qweight *q, int64_t i0, int64_t i1, float *y) {
    int bs = q->blocksize;
    const uint8_t *packed = q->packed->data;
    if (q->type == MT_QUANT_INT4) {
        mt_int4_dequantize_ref(packed, q->absmax->data, q->zero->data, bs, i0, i1, y);
    } else if (q->type == MT_QUANT_MXFP4) {
        mt_mxfp4_dequantize_ref(packed, q->absmax->data, i0, i1, y);
    } else if (!q->double_quant) {
        mt_q4_dequantize_ref(mt_q4_map(q->type), packed, q->absmax->data, bs, i0, i1, y);
    } else {
        float scales[MT_Q4_CHUNK / 32 + 1];
        int64_t b0 = i0 / bs, b1 = (i1 - 1) / bs + 1;
        mt_q8_dequantize_ref(nested_map_of(q), q->absmax->data, q->nested_absmax->data, q->offset, b0,
                             b1, scales);
        mt_q4_dequantize_blocks(mt_q4_map(q->type), packed, scales, bs, i0, i1, y);
    }
}

static _Atomic uint64_t cpu_dequantized;  // values, for mt_qweight_cpu_dequantized

uint64_t mt_qweight_cpu_dequantized(void) { return cpu_dequantized; }

// [i0, i1) into y, chunk by chunk, in parallel when large.
// The refusal of a weight whose codes were given back (mt_qweight_release_codes).
static int codes_released(const mt_qweight *q) {
    if (mt_qweight_has_codes(q)) return 0;
    mt_error_set("qweight dequantize: the 4-bit [%lld, %lld] weight's codes were released (it is kept dequantized)",
                 (long long)q->out, (long long)q->in);
    return 1;
}

static void dequant_range(const mt_qweight *q, int64_t i0, int64_t i1, float *y) {
    int64_t c_first = i0 / MT_Q4_CHUNK, c_last = (i1 - 1) / MT_Q4_CHUNK;
    if (i1 <= i0) return;
    if (codes_released(q)) mt_fatal(MT_EXIT_ERROR, "%s", mt_error_get());
    cpu_dequantized += (uint64_t)(i1 - i0);
#pragma omp parallel for schedule(static) if (c_last - c_first >= 8)
    for (int64_t c = c_first; c <= c_last; c++) {
        int64_t s = MT_MAX(i0, c * MT_Q4_CHUNK), e = MT_MIN(i1, (c + 1) * MT_Q4_CHUNK);
        dequant_chunk(q, s, e, y + (s - i0));
    }
}

void mt_qweight_dequantize_rows_cpu(const mt_qweight *q, float *dst, int64_t row0, int64_t nrows) {
    if (q->be->ops->kind != MT_BACKEND_CPU) return;  // null: nothing to compute
    dequant_range(q, row0 * q->in, (row0 + nrows) * q->in, dst);
}

void mt_qweight_dequantize_rows_bf16_cpu(const mt_qweight *q, uint16_t *dst, int64_t row0,
                                         int64_t nrows) {
    if (q->be->ops->kind != MT_BACKEND_CPU) return;
    if (codes_released(q)) mt_fatal(MT_EXIT_ERROR, "%s", mt_error_get());
    int64_t i0 = row0 * q->in, i1 = (row0 + nrows) * q->in;
    int64_t c_first = i0 / MT_Q4_CHUNK, c_last = i1 > i0 ? (i1 - 1) / MT_Q4_CHUNK : c_first - 1;
#pragma omp parallel for schedule(static) if (c_last - c_first >= 8)
    for (int64_t c = c_first; c <= c_last; c++) {
        float buf[MT_Q4_CHUNK];
        int64_t s = MT_MAX(i0, c * MT_Q4_CHUNK), e = MT_MIN(i1, (c + 1) * MT_Q4_CHUNK);
        dequant_chunk(q, s, e, buf);
        uint16_t *d = dst + (s - i0);
#pragma omp simd
        for (int64_t i = 0; i < e - s; i++) d[i] = mt_f32_to_bf16(buf[i]);
    }
}

// ---------------------------------------------------------------------------------------------
// Matmuls on the CPU, tile by tile

static int64_t tile_rows(const mt_qweight *q) {
    int64_t r = (int64_t)(MT_QMATMUL_TILE_BYTES / (sizeof(float) * (size_t)q->in));
    return MT_MAX(1, MT_MIN(r, q->out));
}

// The f32 tile both matmuls dequantize into, under `work`. The null backend reserves it too, so
// a counted step has the cpu step's allocations (it computes nothing with it).
static int tile_alloc(const mt_qweight *q, int64_t *rows, size_t *bytes, float **tile) {
    *rows = tile_rows(q);
    *bytes = (size_t)(*rows * q->in) * sizeof(float);
    return mt_backend_alloc(q->be, MT_MEM_WORK, *bytes, (void **)tile);
}

int mt_qweight_matmul_cpu(float *y, const float *x, const mt_qweight *q, int64_t n, int accumulate) {
    if (q->be->ops->kind == MT_BACKEND_CUDA || n == 0) return 0;
    int64_t R, in = q->in, out = q->out;
    size_t tile_bytes;
    float *tile;
    if (tile_alloc(q, &R, &tile_bytes, &tile) != 0) return -1;
    for (int64_t r0 = 0; q->be->ops->kind == MT_BACKEND_CPU && r0 < out; r0 += R) {
        int64_t r = MT_MIN(R, out - r0);
        dequant_range(q, r0 * in, (r0 + r) * in, tile);
        // y[:, r0:r0+r] (= or +=) x [n, in] · tile [r, in]ᵀ
        mt_sgemm(0, 1, (int)n, (int)r, (int)in, 1.0f, x, (int)in, tile, (int)in, accumulate ? 1.0f : 0.0f, y + r0,
                 (int)out);
    }
    mt_backend_release(q->be, MT_MEM_WORK, tile_bytes, tile);
    return 0;
}

int mt_qweight_matmul_t_cpu(float *dx, const float *dy, const mt_qweight *q, int64_t n) {
    if (q->be->ops->kind == MT_BACKEND_CUDA || n == 0) return 0;
    int64_t R, in = q->in, out = q->out;
    size_t tile_bytes;
    float *tile;
    if (tile_alloc(q, &R, &tile_bytes, &tile) != 0) return -1;
    for (int64_t r0 = 0; q->be->ops->kind == MT_BACKEND_CPU && r0 < out; r0 += R) {
        int64_t r = MT_MIN(R, out - r0);
        dequant_range(q, r0 * in, (r0 + r) * in, tile);
        // dx [n, in] += dy[:, r0:r0+r] [n, r] · tile [r, in]
        mt_sgemm(0, 0, (int)n, (int)in, (int)r, 1.0f, dy + r0, (int)out, tile, (int)in, 1.0f, dx, (int)in);
    }
    mt_backend_release(q->be, MT_MEM_WORK, tile_bytes, tile);
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Any backend: whole-weight dequantization into a scratch, then the backend's matmul

int mt_qweight_dequantize(const mt_qweight *q, mt_tensor *dst) {
    int64_t n = q->out * q->in;
    if (codes_released(q)) return -1;
    if (dst->be != q->be) {
        mt_error_set("qweight dequantize: the destination is on another backend");
        return -1;
    }
    if ((dst->dtype != MT_F32 && dst->dtype != MT_BF16) || mt_tensor_numel(dst) < n) {
        mt_error_set("qweight dequantize: destination %s with %lld elements; needs f32 or bf16 with %lld",
                     mt_dtype_name(dst->dtype), (long long)mt_tensor_numel(dst), (long long)n);
        return -1;
    }
    switch (q->be->ops->kind) {
    case MT_BACKEND_NULL: return 0;
    case MT_BACKEND_CPU:
        if (dst->dtype == MT_F32) mt_qweight_dequantize_rows_cpu(q, dst->data, 0, q->out);
        else mt_qweight_dequantize_rows_bf16_cpu(q, dst->data, 0, q->out);
        return 0;
    case MT_BACKEND_CUDA:
#ifdef MT_CUDA
        mt_qweight_dequantize_cuda(q, dst->data, dst->dtype, 0, n);
        return 0;
#else
        break;
#endif
    }
    mt_error_set("qweight dequantize: cuda backend in a build without CUDA");
    return -1;
}

int mt_qweight_dequantize_2d(const mt_qweight *q, const mt_tensor *dst) {
    const int64_t ld = dst->ndim == 2 ? mt_tensor_ld(dst) : 0;
    if (codes_released(q)) return -1;
    if (dst->be != q->be || dst->ndim != 2 || dst->shape[0] < q->out || dst->shape[1] < q->in ||
        (dst->dtype != MT_BF16 && dst->dtype != MT_F32)) {
        mt_error_set("qweight dequantize: a [%lld, %lld] weight into a %d-D %s view of another shape or backend",
                     (long long)q->out, (long long)q->in, dst->ndim, mt_dtype_name(dst->dtype));
        return -1;
    }
    switch (q->be->ops->kind) {
    case MT_BACKEND_NULL: return 0;
    case MT_BACKEND_CPU:
        if (dst->dtype != MT_F32) break;
        for (int64_t r = 0; r < q->out; r++) mt_qweight_dequantize_rows_cpu(q, (float *)dst->data + r * ld, r, 1);
        return 0;
    case MT_BACKEND_CUDA:
#ifdef MT_CUDA
        return mt_qweight_dequantize_rows_cuda_on(q, dst->data, dst->dtype, ld, mt_cuda_backend_stream(q->be));
#else
        break;
#endif
    }
    mt_error_set("qweight dequantize: a %s view on the %s backend", mt_dtype_name(dst->dtype), q->be->ops->name);
    return -1;
}

int mt_qweight_dequantize_view(const mt_qweight *q, mt_tensor *scratch, mt_tensor *view) {
    if (mt_qweight_dequantize(q, scratch) != 0) return -1;
    *view = *scratch;
    view->ndim = 2;
    view->shape[0] = q->out;
    view->shape[1] = q->in;
    view->nbytes = mt_dtype_bytes(scratch->dtype, (size_t)(q->out * q->in));
    return 0;
}

int mt_qweight_matmul(mt_tensor *y, const mt_tensor *x, const mt_qweight *q, mt_tensor *scratch,
                      float beta) {
    mt_tensor w;
    if (mt_qweight_dequantize_view(q, scratch, &w) != 0) return -1;
    return mt_matmul(y, x, &w, 0, 1, 1.0f, beta);  // y [n, out] = x [n, in] · Wᵀ
}

int mt_qweight_matmul_t(mt_tensor *dx, const mt_tensor *dy, const mt_qweight *q, mt_tensor *scratch,
                        float beta) {
    mt_tensor w;
    if (mt_qweight_dequantize_view(q, scratch, &w) != 0) return -1;
    return mt_matmul(dx, dy, &w, 0, 0, 1.0f, beta);  // dx [n, in] = dy [n, out] · W
}
