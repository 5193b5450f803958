// tests/cudasim/cudnn.cc — a cuDNN stand-in: the backend graph API (cudnn_graph.h) as moetrain's
// attention uses it (model/attention_cudnn.cu), the documented refusals, and an fp32 interpreter
// of the operation graph behind cudnnBackendExecute.
//
// It keeps every descriptor's attributes as set, checks them as the cuDNN Backend API reference
// (docs.nvidia.com/deeplearning/cudnn/backend/latest/api/cudnn-graph-library.html, "cudnnBackend*"
// and "Backend Descriptor Types") says the library does — an attribute the descriptor type does
// not have, a wrong attribute type or element count, a set after finalization, a finalization with
// required attributes missing — and checks the graph as the fused flash attention engine's
// support surface ("Supported Graph Patterns", "Scaled Dot Product Attention" of the Graph API
// page: bf16 Q/K/V/O and their gradients, fp32 statistics, the innermost dimension packed,
// 16-byte aligned strides, GQA by a whole ratio of heads) requires. Things the real library would
// not catch but that would compute garbage are refused too: tensors whose strides overlap, a UID
// bound to two different tensors, a variant pack that binds other UIDs than the graph's, a
// workspace smaller than the plan reported, a non-finite or non-positive scale, a window < 1,
// sequence lengths outside [1, S]. Execution (queued on the handle's stream) interprets the graph
// op by op in fp32 (sums in double), rounding each tensor to its declared type: a bf16
// intermediate (P, dS) is rounded like the engine's. It does not model NVIDIA's kernels: their
// tiling, accumulation order, speed, or which graphs their heuristics really accept (only a GPU
// shows that: scripts/gpu_check.sh).
#include <cuda_bf16.h>
#include <cudnn_graph.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "runtime.h"

struct cudnnContext {
    cudaStream_t stream = nullptr;
};

namespace {

cudnnStatus_t refuse(cudnnStatus_t st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
cudnnStatus_t refuse(cudnnStatus_t st, const char *fmt, ...) {
    if (getenv("CUDASIM_QUIET_CUDNN")) return st;
    va_list ap;
    va_start(ap, fmt);
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cudasim cuDNN: %s (%s)\n", msg, cudnnGetErrorString(st));
    return st;
}

struct Attr {
    cudnnBackendAttributeType_t type;
    std::vector<char> bytes;
    int64_t count;
};

struct Desc;
using DescP = Desc *;

struct Tensor {
    cudnnDataType_t type;
    int n;
    int64_t dim[4], stride[4], uid, align;
    bool is_virtual, by_value;
};

struct Op {
    cudnnBackendDescriptorType_t kind;
    int mode;  // pointwise mode or reduction operator
    int64_t axis;
    DescP in[3], out;  // in: x, b, t (pointwise), a, b (matmul), x (reduction, reshape)
};

struct Desc {
    cudnnBackendDescriptorType_t type;
    bool final = false;
    std::map<int, Attr> attrs;
    Tensor t{};               // TENSOR
    Op op{};                  // OPERATION_*
    std::vector<DescP> ops;   // OPERATIONGRAPH (in execution order), ENGINECFG / PLAN: the graph's
    cudnnHandle_t handle = nullptr;
    DescP graph = nullptr;    // ENGINEHEUR, ENGINECFG, EXECUTION_PLAN
    int64_t ws = 0;           // EXECUTION_PLAN
    // VARIANT_PACK
    std::vector<int64_t> uids;
    std::vector<void *> ptrs;
    void *workspace = nullptr;
};

std::set<DescP> live;  // every descriptor not destroyed: a stale one is refused

DescP as_desc(cudnnBackendDescriptor_t d) { return live.count((DescP)d) ? (DescP)d : nullptr; }

// The attributes moetrain sets: (descriptor type, attribute) → (attribute type, least and most
// elements). The Backend Descriptor Types page lists them per descriptor.
struct Rule {
    cudnnBackendDescriptorType_t desc;
    cudnnBackendAttributeName_t name;
    cudnnBackendAttributeType_t type;
    int64_t min, max;
};
const Rule RULES[] = {
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, 1},
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 1, 8},
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 1, 8},
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, 1},
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, 1},
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, 1},
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, 1},
    {CUDNN_BACKEND_POINTWISE_DESCRIPTOR, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, 1},
    {CUDNN_BACKEND_POINTWISE_DESCRIPTOR, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, 1},
    {CUDNN_BACKEND_POINTWISE_DESCRIPTOR, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, 1},
    {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_MATMUL_DESCRIPTOR, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, 1},
    {CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_REDUCTION_DESCRIPTOR, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, 1},
    {CUDNN_BACKEND_REDUCTION_DESCRIPTOR, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, 1},
    {CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 4096},
    {CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, 1},
    {CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, 1},
    {CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, 1},
    {CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1},
    {CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 0, 4096},
    {CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 0, 4096},
    {CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, 1},
};

size_t type_bytes(cudnnBackendAttributeType_t t) {
    switch (t) {
    case CUDNN_TYPE_HANDLE: return sizeof(cudnnHandle_t);
    case CUDNN_TYPE_DATA_TYPE: return sizeof(cudnnDataType_t);
    case CUDNN_TYPE_BOOLEAN: return sizeof(bool);
    case CUDNN_TYPE_INT64: return sizeof(int64_t);
    case CUDNN_TYPE_VOID_PTR: return sizeof(void *);
    case CUDNN_TYPE_POINTWISE_MODE: return sizeof(cudnnPointwiseMode_t);
    case CUDNN_TYPE_BACKEND_DESCRIPTOR: return sizeof(cudnnBackendDescriptor_t);
    case CUDNN_TYPE_REDUCTION_OPERATOR_TYPE: return sizeof(cudnnReduceTensorOp_t);
    case CUDNN_TYPE_HEUR_MODE: return sizeof(cudnnBackendHeurMode_t);
    default: return 0;
    }
}

template <typename T> T scalar(const Desc *d, int name, T dflt) {
    auto it = d->attrs.find(name);
    if (it == d->attrs.end()) return dflt;
    T v;
    memcpy(&v, it->second.bytes.data(), sizeof v);
    return v;
}
bool has(const Desc *d, int name) { return d->attrs.count(name) != 0; }

// A descriptor attribute that must name a finalized descriptor of one of `types`.
DescP sub(const Desc *d, int name, std::initializer_list<cudnnBackendDescriptorType_t> types, const char *what,
          cudnnStatus_t *st) {
    if (!has(d, name)) {
        *st = refuse(CUDNN_STATUS_BAD_PARAM, "finalize: %s not set", what);
        return nullptr;
    }
    DescP s = as_desc(scalar<cudnnBackendDescriptor_t>(d, name, nullptr));
    bool ok = false;
    for (auto t : types) ok |= s && s->type == t;
    if (!ok || !s->final) {
        *st = refuse(CUDNN_STATUS_BAD_PARAM, "finalize: %s is not a finalized descriptor of the right type", what);
        return nullptr;
    }
    return s;
}

int64_t numel(const Tensor &t) {
    int64_t n = 1;
    for (int i = 0; i < t.n; i++) n *= t.dim[i];
    return n;
}
int64_t extent(const Tensor &t) {  // elements spanned in memory
    int64_t e = 1;
    for (int i = 0; i < t.n; i++) e += (t.dim[i] - 1) * t.stride[i];
    return e;
}
size_t elem_bytes(cudnnDataType_t t) {
    switch (t) {
    case CUDNN_DATA_FLOAT:
    case CUDNN_DATA_INT32: return 4;
    case CUDNN_DATA_BFLOAT16: return 2;
    case CUDNN_DATA_BOOLEAN: return 1;
    default: return 0;
    }
}

// Distinct indices at distinct offsets: sorted by stride, each stride at least the span of the
// dimensions below it (dims of extent 1 are free).
bool no_overlap(const Tensor &t) {
    int idx[4] = {0, 1, 2, 3};
    for (int i = 1; i < t.n && i < 4; i++)  // insertion sort by stride
        for (int j = i; j > 0 && t.stride[idx[j]] < t.stride[idx[j - 1]]; j--) std::swap(idx[j], idx[j - 1]);
    int64_t span = 1;
    for (int k = 0; k < t.n; k++) {
        int i = idx[k];
        if (t.dim[i] == 1) continue;
        if (t.stride[i] < span) return false;
        span = t.stride[i] * t.dim[i];
    }
    return true;
}

cudnnStatus_t finalize_tensor(Desc *d) {
    Tensor &t = d->t;
    for (int a : {CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_ATTR_TENSOR_STRIDES,
                  CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT})
        if (!has(d, a)) return refuse(CUDNN_STATUS_BAD_PARAM, "tensor: required attribute %d not set", a);
    const Attr &dims = d->attrs[CUDNN_ATTR_TENSOR_DIMENSIONS], &strides = d->attrs[CUDNN_ATTR_TENSOR_STRIDES];
    if (dims.count != strides.count)
        return refuse(CUDNN_STATUS_BAD_PARAM, "tensor: %lld dimensions, %lld strides", (long long)dims.count,
                      (long long)strides.count);
    if (dims.count > 4) return refuse(CUDNN_STATUS_NOT_SUPPORTED, "tensor: more than 4 dimensions (this stand-in)");
    t.n = (int)dims.count;
    memcpy(t.dim, dims.bytes.data(), 8 * t.n);
    memcpy(t.stride, strides.bytes.data(), 8 * t.n);
    t.type = scalar<cudnnDataType_t>(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_DATA_FLOAT);
    t.uid = scalar<int64_t>(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, 0);
    t.align = scalar<int64_t>(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 0);
    t.is_virtual = scalar<bool>(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, false);
    t.by_value = scalar<bool>(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, false);
    for (int i = 0; i < t.n; i++)
        if (t.dim[i] <= 0 || t.stride[i] <= 0)
            return refuse(CUDNN_STATUS_BAD_PARAM, "tensor %lld: dimension %d is %lld with stride %lld", (long long)t.uid,
                          i, (long long)t.dim[i], (long long)t.stride[i]);
    if (!elem_bytes(t.type)) return refuse(CUDNN_STATUS_NOT_SUPPORTED, "tensor %lld: data type %d", (long long)t.uid, t.type);
    if (t.is_virtual && t.by_value)
        return refuse(CUDNN_STATUS_BAD_PARAM, "tensor %lld: virtual and by value", (long long)t.uid);
    if (t.align <= 0 || (t.align & (t.align - 1)))
        return refuse(CUDNN_STATUS_BAD_PARAM, "tensor %lld: byte alignment %lld", (long long)t.uid, (long long)t.align);
    return CUDNN_STATUS_SUCCESS;
}

int pw_inputs(int mode) {
    switch (mode) {
    case CUDNN_POINTWISE_EXP:
    case CUDNN_POINTWISE_LOG:
    case CUDNN_POINTWISE_IDENTITY:
    case CUDNN_POINTWISE_GEN_INDEX: return 1;
    case CUDNN_POINTWISE_BINARY_SELECT: return 3;
    case CUDNN_POINTWISE_ADD:
    case CUDNN_POINTWISE_SUB:
    case CUDNN_POINTWISE_MUL:
    case CUDNN_POINTWISE_DIV:
    case CUDNN_POINTWISE_CMP_GE:
    case CUDNN_POINTWISE_CMP_GT:
    case CUDNN_POINTWISE_CMP_LT:
    case CUDNN_POINTWISE_LOGICAL_AND: return 2;
    default: return 0;
    }
}

bool broadcastable(const Tensor &in, const Tensor &out) {
    if (in.n != out.n) return false;
    for (int i = 0; i < in.n; i++)
        if (in.dim[i] != out.dim[i] && in.dim[i] != 1) return false;
    return true;
}

cudnnStatus_t finalize_op(Desc *d) {
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    Op &op = d->op;
    op.kind = d->type;
    const auto T = CUDNN_BACKEND_TENSOR_DESCRIPTOR;
    switch (d->type) {
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: {
        DescP pw = sub(d, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, {CUDNN_BACKEND_POINTWISE_DESCRIPTOR}, "pointwise mode", &st);
        op.in[0] = sub(d, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, {T}, "X", &st);
        op.out = sub(d, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, {T}, "Y", &st);
        if (st) return st;
        op.mode = scalar<int>(pw, CUDNN_ATTR_POINTWISE_MODE, -1);
        op.axis = scalar<int64_t>(pw, CUDNN_ATTR_POINTWISE_AXIS, -1);
        const int n = pw_inputs(op.mode);
        if (!n) return refuse(CUDNN_STATUS_NOT_SUPPORTED, "pointwise mode %d (not one this stand-in knows)", op.mode);
        if (n >= 2) op.in[1] = sub(d, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, {T}, "B", &st);
        if (n == 3) op.in[2] = sub(d, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, {T}, "T", &st);
        if (st) return st;
        if ((n < 2 && has(d, CUDNN_ATTR_OPERATION_POINTWISE_BDESC)) || (n < 3 && has(d, CUDNN_ATTR_OPERATION_POINTWISE_TDESC)))
            return refuse(CUDNN_STATUS_BAD_PARAM, "pointwise mode %d: more inputs than it takes", op.mode);
        if (op.mode == CUDNN_POINTWISE_GEN_INDEX && (op.axis < 0 || op.axis >= op.out->t.n))
            return refuse(CUDNN_STATUS_BAD_PARAM, "GEN_INDEX: axis %lld of a %d-d tensor", (long long)op.axis, op.out->t.n);
        for (int i = 0; i < n; i++)
            if (!broadcastable(op.in[i]->t, op.out->t))
                return refuse(CUDNN_STATUS_BAD_PARAM, "pointwise mode %d: input %d does not broadcast to Y", op.mode, i);
        return st;
    }
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: {
        sub(d, CUDNN_ATTR_OPERATION_MATMUL_DESC, {CUDNN_BACKEND_MATMUL_DESCRIPTOR}, "matmul descriptor", &st);
        op.in[0] = sub(d, CUDNN_ATTR_OPERATION_MATMUL_ADESC, {T}, "A", &st);
        op.in[1] = sub(d, CUDNN_ATTR_OPERATION_MATMUL_BDESC, {T}, "B", &st);
        op.out = sub(d, CUDNN_ATTR_OPERATION_MATMUL_CDESC, {T}, "C", &st);
        if (st) return st;
        const Tensor &a = op.in[0]->t, &b = op.in[1]->t, &c = op.out->t;
        if (a.n != 4 || b.n != 4 || c.n != 4) return refuse(CUDNN_STATUS_NOT_SUPPORTED, "matmul: 4-d tensors only");
        // M, N, K overrides (per-batch lengths: rows beyond them are padding, which the graph's
        // masks hide, so the interpreter computes them in full): int32 [B, 1, 1, 1] in memory.
        for (int name : {CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC,
                         CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC}) {
            if (!has(d, name)) continue;
            DescP l = sub(d, (cudnnBackendAttributeName_t)name, {T}, "override", &st);
            if (st) return st;
            if (l->t.type != CUDNN_DATA_INT32 || l->t.is_virtual || l->t.by_value || l->t.n != 4 || l->t.dim[0] != c.dim[0] ||
                l->t.dim[1] != 1 || l->t.dim[2] != 1 || l->t.dim[3] != 1)
                return refuse(CUDNN_STATUS_BAD_PARAM, "matmul override %d: not int32 [B, 1, 1, 1] lengths in memory", name);
        }
        if (a.dim[3] != b.dim[2] || a.dim[2] != c.dim[2] || b.dim[3] != c.dim[3])
            return refuse(CUDNN_STATUS_BAD_PARAM, "matmul: A [%lld, %lld] · B [%lld, %lld] → C [%lld, %lld]",
                          (long long)a.dim[2], (long long)a.dim[3], (long long)b.dim[2], (long long)b.dim[3],
                          (long long)c.dim[2], (long long)c.dim[3]);
        // Batch dims broadcast by whole ratios (GQA: K/V's heads divide Q's, each serving a
        // contiguous group of query heads; "the number of Q heads must be a multiple of K's").
        for (int i = 0; i < 2; i++)
            if (c.dim[i] % a.dim[i] || c.dim[i] % b.dim[i])
                return refuse(CUDNN_STATUS_BAD_PARAM, "matmul: batch dimension %d: A %lld and B %lld do not divide C %lld",
                              i, (long long)a.dim[i], (long long)b.dim[i], (long long)c.dim[i]);
        return st;
    }
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: {
        DescP r = sub(d, CUDNN_ATTR_OPERATION_REDUCTION_DESC, {CUDNN_BACKEND_REDUCTION_DESCRIPTOR}, "reduction descriptor", &st);
        op.in[0] = sub(d, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, {T}, "X", &st);
        op.out = sub(d, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, {T}, "Y", &st);
        if (st) return st;
        op.mode = scalar<int>(r, CUDNN_ATTR_REDUCTION_OPERATOR, -1);
        if (op.mode != CUDNN_REDUCE_TENSOR_ADD && op.mode != CUDNN_REDUCE_TENSOR_MAX)
            return refuse(CUDNN_STATUS_NOT_SUPPORTED, "reduction operator %d", op.mode);
        const Tensor &x = op.in[0]->t, &y = op.out->t;
        if (x.n != y.n) return refuse(CUDNN_STATUS_BAD_PARAM, "reduction: X and Y ranks differ");
        for (int i = 0; i < x.n; i++)
            if (x.dim[i] % y.dim[i])
                return refuse(CUDNN_STATUS_BAD_PARAM, "reduction: Y dimension %d (%lld) does not divide X's (%lld)", i,
                              (long long)y.dim[i], (long long)x.dim[i]);
        return st;
    }
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR:
        op.in[0] = sub(d, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, {T}, "X", &st);
        op.out = sub(d, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, {T}, "Y", &st);
        if (st) return st;
        if (numel(op.in[0]->t) != numel(op.out->t) || extent(op.in[0]->t) != extent(op.out->t))
            return refuse(CUDNN_STATUS_BAD_PARAM, "reshape: X and Y do not view the same elements");
        return st;
    default: return refuse(CUDNN_STATUS_NOT_SUPPORTED, "operation type %d", d->type);
    }
}

// The operation graph: well formed, then within the fused attention engine's surface.
// CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, finalization: "CUDNN_STATUS_BAD_PARAM: invalid or
// inconsistent attribute values are encountered"; a virtual tensor is "an intermediate of the
// graph", written by one operation; UIDs identify tensors in the variant pack, so one UID names
// one tensor.
cudnnStatus_t finalize_graph(Desc *d) {
    if (!has(d, CUDNN_ATTR_OPERATIONGRAPH_OPS) || !has(d, CUDNN_ATTR_OPERATIONGRAPH_HANDLE))
        return refuse(CUDNN_STATUS_BAD_PARAM, "operation graph: OPS and HANDLE are required");
    d->handle = scalar<cudnnHandle_t>(d, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, nullptr);
    const Attr &a = d->attrs[CUDNN_ATTR_OPERATIONGRAPH_OPS];
    std::vector<cudnnBackendDescriptor_t> raw((size_t)a.count);
    memcpy(raw.data(), a.bytes.data(), a.bytes.size());
    std::map<int64_t, DescP> by_uid;
    std::set<DescP> produced;
    d->ops.clear();
    for (auto r : raw) {
        DescP o = as_desc(r);
        if (!o || !o->final || o->op.kind != o->type || o->op.out == nullptr)
            return refuse(CUDNN_STATUS_BAD_PARAM, "operation graph: an operation is not a finalized operation descriptor");
        d->ops.push_back(o);
    }
    // Each tensor: one UID, one descriptor; written by at most one op; a virtual one written before
    // it is read (the ops in an order that computes them).
    for (DescP o : d->ops) {
        for (DescP in : o->op.in) {
            if (!in) continue;
            if (in->t.is_virtual && !produced.count(in))
                return refuse(CUDNN_STATUS_BAD_PARAM, "operation graph: virtual tensor %lld read before it is written",
                              (long long)in->t.uid);
        }
        if (produced.count(o->op.out))
            return refuse(CUDNN_STATUS_BAD_PARAM, "operation graph: tensor %lld written twice", (long long)o->op.out->t.uid);
        if (o->op.out->t.by_value)
            return refuse(CUDNN_STATUS_BAD_PARAM, "operation graph: by-value tensor %lld written", (long long)o->op.out->t.uid);
        produced.insert(o->op.out);
        for (DescP t : {o->op.in[0], o->op.in[1], o->op.in[2], o->op.out}) {
            if (!t) continue;
            auto it = by_uid.find(t->t.uid);
            if (it != by_uid.end() && it->second != t)
                return refuse(CUDNN_STATUS_BAD_PARAM, "operation graph: UID %lld names two tensors", (long long)t->t.uid);
            by_uid[t->t.uid] = t;
        }
    }
    // The fused attention engine's surface: every tensor in memory is bf16 (Q, K, V, O, dO, dQ,
    // dK, dV) or fp32 (Stats) or int32 (sequence lengths); its strides do not overlap; a matmul
    // operand in memory has a packed innermost dimension (stride 1, one of the last two) and
    // 16-byte aligned other strides.
    for (auto &[uid, t] : by_uid) {
        const Tensor &x = t->t;
        if (x.is_virtual || x.by_value) continue;
        if (x.type != CUDNN_DATA_BFLOAT16 && x.type != CUDNN_DATA_FLOAT && x.type != CUDNN_DATA_INT32)
            return refuse(CUDNN_STATUS_NOT_SUPPORTED, "tensor %lld: data type %d in memory", (long long)uid, x.type);
        if (!no_overlap(x))
            return refuse(CUDNN_STATUS_BAD_PARAM, "tensor %lld: strides [%lld %lld %lld %lld] overlap its elements",
                          (long long)uid, (long long)x.stride[0], (long long)x.stride[1], (long long)x.stride[2],
                          (long long)x.stride[3]);
    }
    for (DescP o : d->ops) {
        if (o->op.kind != CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR) continue;
        for (DescP t : {o->op.in[0], o->op.in[1], o->op.out}) {
            const Tensor &x = t->t;
            if (x.is_virtual) continue;
            // bf16, or the fp32 dQ accumulator the flash backward writes (an output)
            if (x.type != CUDNN_DATA_BFLOAT16 && !(t == o->op.out && x.type == CUDNN_DATA_FLOAT))
                return refuse(CUDNN_STATUS_NOT_SUPPORTED, "matmul operand %lld: not bf16", (long long)x.uid);
            int inner = x.stride[3] == 1 ? 3 : x.stride[2] == 1 ? 2 : -1;
            if (inner < 0)
                return refuse(CUDNN_STATUS_NOT_SUPPORTED, "matmul operand %lld: neither of the last two dims is packed",
                              (long long)x.uid);
            for (int i = 0; i < 4; i++)
                if (i != inner && x.dim[i] > 1 && (x.stride[i] * 2) % 16)
                    return refuse(CUDNN_STATUS_NOT_SUPPORTED, "matmul operand %lld: stride %d (%lld) not 16-byte aligned",
                                  (long long)x.uid, i, (long long)x.stride[i]);
            if (inner == 3 ? x.dim[3] % 8 : x.dim[2] % 8)
                return refuse(CUDNN_STATUS_NOT_SUPPORTED, "matmul operand %lld: packed dim not a multiple of 8",
                              (long long)x.uid);
        }
    }
    return CUDNN_STATUS_SUCCESS;
}

// The flash attention engine's recognizer, as far as it was seen (cuDNN 9.14 on the H100,
// 2026-11-27, its log refusing a backward graph): a backward (more than two matmuls) must have
// exactly two matmuls whose operands no operation produces, Q·Kᵀ and dO·Vᵀ
// ("matmulEntranceNodes.size() != 2"). False: no engine is offered.
bool flash_pattern(DescP g) {
    if (!g) return false;
    std::set<DescP> produced;
    int matmuls = 0, entrances = 0;
    for (DescP o : g->ops) produced.insert(o->op.out);
    for (DescP o : g->ops) {
        if (o->op.kind != CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR) continue;
        matmuls++;
        if (!produced.count(o->op.in[0]) && !produced.count(o->op.in[1])) entrances++;
    }
    if (matmuls > 2 && entrances != 2) {
        if (!getenv("CUDASIM_QUIET_CUDNN"))
            fprintf(stderr, "cudasim cuDNN: flash backward not recognized: %d matmuls without producers, not 2\n", entrances);
        return false;
    }
    return true;
}

// The plan's workspace: the engine keeps its per-row statistics there (fp32 per reduction row).
int64_t workspace_of(const Desc *g) {
    int64_t ws = 0;
    for (DescP o : g->ops)
        if (o->op.kind == CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR) ws += numel(o->op.out->t) * 4;
    return (ws + 255) / 256 * 256;
}

// ---------------------------------------------------------------------------------------------
// Execution: each tensor as fp32 values in the logical order of its dims.
using Vals = std::vector<float>;

float bf16_round(float v) { return __bfloat162float(__float2bfloat16(v)); }
float to_type(float v, cudnnDataType_t t) {
    switch (t) {
    case CUDNN_DATA_BFLOAT16: return bf16_round(v);
    case CUDNN_DATA_INT32: return (float)(int32_t)v;
    case CUDNN_DATA_BOOLEAN: return v != 0.0f;
    default: return v;
    }
}

void coords(const Tensor &t, int64_t lin, int64_t c[4]) {
    for (int i = t.n - 1; i >= 0; i--) c[i] = lin % t.dim[i], lin /= t.dim[i];
}
int64_t offset(const Tensor &t, const int64_t c[4]) {
    int64_t o = 0;
    for (int i = 0; i < t.n; i++) o += c[i] * t.stride[i];
    return o;
}
float load(const void *p, cudnnDataType_t t, int64_t o) {
    switch (t) {
    case CUDNN_DATA_BFLOAT16: return __bfloat162float(((const __nv_bfloat16 *)p)[o]);
    case CUDNN_DATA_INT32: return (float)((const int32_t *)p)[o];
    default: return ((const float *)p)[o];
    }
}

Vals gather(const Tensor &t, const void *p) {
    Vals v((size_t)numel(t));
    int64_t c[4];
    for (int64_t i = 0; i < (int64_t)v.size(); i++) coords(t, i, c), v[i] = load(p, t.type, offset(t, c));
    return v;
}
void scatter(const Tensor &t, void *p, const Vals &v) {
    int64_t c[4];
    for (int64_t i = 0; i < (int64_t)v.size(); i++) {
        coords(t, i, c);
        int64_t o = offset(t, c);
        if (t.type == CUDNN_DATA_BFLOAT16) ((__nv_bfloat16 *)p)[o] = __float2bfloat16(v[i]);
        else if (t.type == CUDNN_DATA_INT32) ((int32_t *)p)[o] = (int32_t)v[i];
        else ((float *)p)[o] = v[i];
    }
}

// Input `in` read at the output's coordinates c (broadcast dims of extent 1).
int64_t bcast(const Tensor &in, const int64_t c[4]) {
    int64_t lin = 0;
    for (int i = 0; i < in.n; i++) lin = lin * in.dim[i] + (in.dim[i] == 1 ? 0 : c[i]);
    return lin;
}

void run_op(const Op &op, std::map<DescP, Vals> &val) {
    const Tensor &y = op.out->t;
    Vals out((size_t)numel(y));
    int64_t c[4];
    switch (op.kind) {
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: {
        const Vals *in[3] = {};
        for (int i = 0; i < 3; i++)
            if (op.in[i]) in[i] = &val.at(op.in[i]);
        for (int64_t i = 0; i < (int64_t)out.size(); i++) {
            coords(y, i, c);
            float a = (*in[0])[bcast(op.in[0]->t, c)], b = in[1] ? (*in[1])[bcast(op.in[1]->t, c)] : 0.0f;
            float r = 0.0f;
            switch (op.mode) {
            case CUDNN_POINTWISE_ADD: r = a + b; break;
            case CUDNN_POINTWISE_SUB: r = a - b; break;
            case CUDNN_POINTWISE_MUL: r = a * b; break;
            case CUDNN_POINTWISE_DIV: r = a / b; break;
            case CUDNN_POINTWISE_EXP: r = expf(a); break;
            case CUDNN_POINTWISE_LOG: r = logf(a); break;
            case CUDNN_POINTWISE_IDENTITY: r = a; break;
            case CUDNN_POINTWISE_CMP_GE: r = a >= b; break;
            case CUDNN_POINTWISE_CMP_GT: r = a > b; break;
            case CUDNN_POINTWISE_CMP_LT: r = a < b; break;
            case CUDNN_POINTWISE_LOGICAL_AND: r = a != 0.0f && b != 0.0f; break;
            case CUDNN_POINTWISE_GEN_INDEX: r = (float)c[op.axis]; break;
            case CUDNN_POINTWISE_BINARY_SELECT: r = (*in[2])[bcast(op.in[2]->t, c)] != 0.0f ? a : b; break;
            }
            out[i] = to_type(r, y.type);
        }
        break;
    }
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: {
        const Tensor &ta = op.in[0]->t, &tb = op.in[1]->t;
        const Vals &A = val.at(op.in[0]), &B = val.at(op.in[1]);
        const int64_t M = y.dim[2], N = y.dim[3], K = ta.dim[3];
        for (int64_t b0 = 0; b0 < y.dim[0]; b0++)
            for (int64_t b1 = 0; b1 < y.dim[1]; b1++) {
                // the A and B batch serving this C batch: a contiguous group per A/B head
                const int64_t a0 = b0 / (y.dim[0] / ta.dim[0]), a1 = b1 / (y.dim[1] / ta.dim[1]);
                const int64_t q0 = b0 / (y.dim[0] / tb.dim[0]), q1 = b1 / (y.dim[1] / tb.dim[1]);
                const float *pa = &A[(size_t)((a0 * ta.dim[1] + a1) * M * K)];
                const float *pb = &B[(size_t)((q0 * tb.dim[1] + q1) * K * N)];
                float *pc = &out[(size_t)((b0 * y.dim[1] + b1) * M * N)];
                for (int64_t m = 0; m < M; m++)
                    for (int64_t n = 0; n < N; n++) {
                        double s = 0.0;
                        for (int64_t k = 0; k < K; k++) s += (double)pa[m * K + k] * pb[k * N + n];
                        pc[m * N + n] = to_type((float)s, y.type);
                    }
            }
        break;
    }
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: {
        const Tensor &x = op.in[0]->t;
        const Vals &X = val.at(op.in[0]);
        std::vector<double> acc(out.size(), op.mode == CUDNN_REDUCE_TENSOR_MAX ? -INFINITY : 0.0);
        for (int64_t i = 0; i < (int64_t)X.size(); i++) {
            coords(x, i, c);
            int64_t lin = 0;
            for (int k = 0; k < y.n; k++) lin = lin * y.dim[k] + c[k] / (x.dim[k] / y.dim[k]);
            if (op.mode == CUDNN_REDUCE_TENSOR_MAX) acc[lin] = std::max(acc[lin], (double)X[i]);
            else acc[lin] += X[i];
        }
        for (size_t i = 0; i < out.size(); i++) out[i] = to_type((float)acc[i], y.type);
        break;
    }
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: {  // Y views X's memory through Y's strides
        const Tensor &x = op.in[0]->t;
        const Vals &X = val.at(op.in[0]);
        Vals mem((size_t)extent(x));
        for (int64_t i = 0; i < (int64_t)X.size(); i++) coords(x, i, c), mem[offset(x, c)] = X[i];
        for (int64_t i = 0; i < (int64_t)out.size(); i++) coords(y, i, c), out[i] = to_type(mem[offset(y, c)], y.type);
        break;
    }
    default: break;
    }
    val[op.out] = std::move(out);
}

const char *status_name(cudnnStatus_t st) {
    switch (st) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_INTERNAL_ERROR: return "CUDNN_STATUS_INTERNAL_ERROR";
    case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
    default: return "CUDNN_STATUS_(other)";
    }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
extern "C" {

// The GPU machine's cuDNN (9.14), whose backward needs the lengths' mask at S % 128 ≠ 0;
// CUDASIM_CUDNN_VERSION sets another.
size_t cudnnGetVersion(void) {
    const char *e = getenv("CUDASIM_CUDNN_VERSION");
    return e && *e ? (size_t)strtoul(e, NULL, 10) : 91400;
}
const char *cudnnGetErrorString(cudnnStatus_t st) { return status_name(st); }

cudnnStatus_t cudnnCreate(cudnnHandle_t *h) {
    cudasim::LibCall lock;
    if (!h) return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnCreate: handle is NULL");
    *h = new cudnnContext();
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t h) {
    cudasim::LibCall lock;
    delete h;
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s) {
    cudasim::LibCall lock;
    if (!h) return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnSetStream: handle is NULL");
    h->stream = s;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t t, cudnnBackendDescriptor_t *d) {
    cudasim::LibCall lock;
    if (!d) return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendCreateDescriptor: NULL output");
    DescP p = new Desc();
    p->type = t;
    live.insert(p);
    *d = p;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t d) {
    cudasim::LibCall lock;
    DescP p = as_desc(d);
    if (!p) return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendDestroyDescriptor: not a live descriptor");
    live.erase(p);
    delete p;
    return CUDNN_STATUS_SUCCESS;
}

// "CUDNN_STATUS_NOT_INITIALIZED: the descriptor is already finalized"; "CUDNN_STATUS_BAD_PARAM:
// the attribute name, type or element count is not valid for the descriptor".
cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t count, const void *val) {
    cudasim::LibCall lock;
    DescP p = as_desc(d);
    if (!p) return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute: not a live descriptor");
    if (p->final) return refuse(CUDNN_STATUS_NOT_INITIALIZED, "cudnnBackendSetAttribute(%d): descriptor already finalized", name);
    const Rule *r = nullptr;
    for (const Rule &x : RULES)
        if (x.desc == p->type && x.name == name) r = &x;
    if (!r) return refuse(CUDNN_STATUS_BAD_PARAM, "attribute %d on descriptor type %d (not one it has here)", name, p->type);
    if (type != r->type) return refuse(CUDNN_STATUS_BAD_PARAM, "attribute %d: type %d, expected %d", name, type, r->type);
    if (count < r->min || count > r->max)
        return refuse(CUDNN_STATUS_BAD_PARAM, "attribute %d: %lld elements, expected %lld..%lld", name, (long long)count,
                      (long long)r->min, (long long)r->max);
    if (count && !val) return refuse(CUDNN_STATUS_BAD_PARAM, "attribute %d: NULL value", name);
    Attr a{type, std::vector<char>((size_t)count * type_bytes(type)), count};
    if (count) memcpy(a.bytes.data(), val, a.bytes.size());
    p->attrs[name] = a;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t d) {
    cudasim::LibCall lock;
    DescP p = as_desc(d);
    if (!p) return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize: not a live descriptor");
    if (p->final) return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize: already finalized");
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    switch (p->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: st = finalize_tensor(p); break;
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR:
        if (!has(p, CUDNN_ATTR_POINTWISE_MODE) || !has(p, CUDNN_ATTR_POINTWISE_MATH_PREC))
            st = refuse(CUDNN_STATUS_BAD_PARAM, "pointwise: MODE and MATH_PREC are required");
        else if (scalar<int>(p, CUDNN_ATTR_POINTWISE_MODE, 0) == CUDNN_POINTWISE_GEN_INDEX && !has(p, CUDNN_ATTR_POINTWISE_AXIS))
            st = refuse(CUDNN_STATUS_BAD_PARAM, "pointwise GEN_INDEX: AXIS is required");
        break;
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR:
        if (!has(p, CUDNN_ATTR_MATMUL_COMP_TYPE)) st = refuse(CUDNN_STATUS_BAD_PARAM, "matmul: COMP_TYPE is required");
        break;
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
        if (!has(p, CUDNN_ATTR_REDUCTION_OPERATOR) || !has(p, CUDNN_ATTR_REDUCTION_COMP_TYPE))
            st = refuse(CUDNN_STATUS_BAD_PARAM, "reduction: OPERATOR and COMP_TYPE are required");
        break;
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: st = finalize_op(p); break;
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: st = finalize_graph(p); break;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: {
        DescP g = sub(p, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, {CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR}, "operation graph", &st);
        if (!st && !has(p, CUDNN_ATTR_ENGINEHEUR_MODE)) st = refuse(CUDNN_STATUS_BAD_PARAM, "engine heuristics: MODE is required");
        p->graph = g;
        break;
    }
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: {
        DescP cfg = as_desc(scalar<cudnnBackendDescriptor_t>(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, nullptr));
        if (!has(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE) || !cfg || cfg->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR || !cfg->graph)
            st = refuse(CUDNN_STATUS_BAD_PARAM, "execution plan: HANDLE and an engine config from the heuristics are required");
        else {
            p->graph = cfg->graph;
            p->handle = scalar<cudnnHandle_t>(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, nullptr);
            p->ws = workspace_of(p->graph);
        }
        break;
    }
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: {
        int64_t nu = has(p, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS) ? p->attrs[CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS].count : -1;
        int64_t np = has(p, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS) ? p->attrs[CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS].count : -2;
        if (nu != np) {
            st = refuse(CUDNN_STATUS_BAD_PARAM, "variant pack: %lld UIDs, %lld pointers", (long long)nu, (long long)np);
            break;
        }
        p->uids.resize((size_t)nu), p->ptrs.resize((size_t)np);
        memcpy(p->uids.data(), p->attrs[CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS].bytes.data(), 8 * (size_t)nu);
        memcpy(p->ptrs.data(), p->attrs[CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS].bytes.data(), sizeof(void *) * (size_t)np);
        p->workspace = scalar<void *>(p, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, nullptr);
        break;
    }
    default: st = refuse(CUDNN_STATUS_NOT_SUPPORTED, "cudnnBackendFinalize: descriptor type %d (not in this stand-in)", p->type);
    }
    if (!st) p->final = true;
    return st;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const d, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t requested, int64_t *count, void *out) {
    cudasim::LibCall lock;
    DescP p = as_desc(d);
    if (!p || !count) return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendGetAttribute: bad descriptor or count");
    if (!p->final) return refuse(CUDNN_STATUS_NOT_INITIALIZED, "cudnnBackendGetAttribute(%d): descriptor not finalized", name);
    if (p->type == CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR && name == CUDNN_ATTR_ENGINEHEUR_RESULTS) {
        if (type != CUDNN_TYPE_BACKEND_DESCRIPTOR) return refuse(CUDNN_STATUS_BAD_PARAM, "heuristics' results: wrong type");
        // one engine: the fused flash attention (this stand-in); none under CUDASIM_CUDNN_NO_ENGINE,
        // as a real library answers a graph no engine of it supports (tests of the fallback)
        *count = getenv("CUDASIM_CUDNN_NO_ENGINE") || !flash_pattern(p->graph) ? 0 : 1;
        if (*count == 0) return CUDNN_STATUS_SUCCESS;
        if (requested >= 1) {
            DescP cfg = as_desc(((cudnnBackendDescriptor_t *)out)[0]);
            if (!cfg || cfg->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)
                return refuse(CUDNN_STATUS_BAD_PARAM, "heuristics' results: the array must hold created ENGINECFG descriptors");
            cfg->graph = p->graph, cfg->final = true;
        }
        return CUDNN_STATUS_SUCCESS;
    }
    if (p->type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR && name == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) {
        if (type != CUDNN_TYPE_INT64 || requested < 1) return refuse(CUDNN_STATUS_BAD_PARAM, "workspace size: INT64, one element");
        *count = 1;
        *(int64_t *)out = p->ws;
        return CUDNN_STATUS_SUCCESS;
    }
    return refuse(CUDNN_STATUS_NOT_SUPPORTED, "cudnnBackendGetAttribute(%d) on descriptor type %d (not in this stand-in)", name,
                  p->type);
}

// Checks the plan and the pack against the graph, then queues the interpretation on the stream.
// cudnnBackendExecute: "CUDNN_STATUS_BAD_PARAM: an incorrect or inconsistent value is encountered
// (for example, the required data pointers are invalid)"; the variant pack's UIDs are "the unique
// identifiers of the tensors the data pointers are for", so a graph tensor left unbound is refused.
cudnnStatus_t cudnnBackendExecute(cudnnHandle_t h, cudnnBackendDescriptor_t plan_, cudnnBackendDescriptor_t pack_) {
    cudasim::LibCall lock;
    DescP plan = as_desc(plan_), pack = as_desc(pack_);
    if (!h) return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: handle is NULL");
    if (!plan || plan->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR || !plan->final)
        return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: the plan is not a finalized execution plan");
    if (!pack || pack->type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR || !pack->final)
        return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: the variant pack is not finalized");
    const Desc *g = plan->graph;
    // The graph's tensors in memory (and by value), by UID: the pack binds exactly these.
    std::map<int64_t, const Tensor *> need;
    for (DescP o : g->ops)
        for (DescP t : {o->op.in[0], o->op.in[1], o->op.in[2], o->op.out})
            if (t && !t->t.is_virtual) need[t->t.uid] = &t->t;
    std::map<int64_t, void *> bound;
    for (size_t i = 0; i < pack->uids.size(); i++) {
        if (!need.count(pack->uids[i]))
            return refuse(CUDNN_STATUS_BAD_PARAM, "variant pack: UID %lld is not a tensor of the graph", (long long)pack->uids[i]);
        if (!pack->ptrs[i]) return refuse(CUDNN_STATUS_BAD_PARAM, "variant pack: UID %lld bound to NULL", (long long)pack->uids[i]);
        bound[pack->uids[i]] = pack->ptrs[i];
    }
    for (auto &[uid, t] : need)
        if (!bound.count(uid)) return refuse(CUDNN_STATUS_BAD_PARAM, "variant pack: UID %lld of the graph unbound", (long long)uid);
    if (plan->ws > 0 && !pack->workspace)
        return refuse(CUDNN_STATUS_BAD_PARAM, "variant pack: no workspace, the plan needs %lld bytes", (long long)plan->ws);
    if (plan->ws > 0) cudasim::lib_check_device(pack->workspace, (size_t)plan->ws, "cuDNN workspace");
    // By-value tensors are read now (host memory); the rest are device memory of their extent.
    std::map<int64_t, Vals> by_value;
    for (auto &[uid, t] : need) {
        if (t->by_value) {
            by_value[uid] = gather(*t, bound[uid]);
            continue;
        }
        cudasim::lib_check_device(bound[uid], (size_t)extent(*t) * elem_bytes(t->type), "cuDNN tensor");
        if ((uintptr_t)bound[uid] % (uintptr_t)t->align)
            return refuse(CUDNN_STATUS_BAD_PARAM, "variant pack: UID %lld not aligned to the %lld bytes declared",
                          (long long)uid, (long long)t->align);
    }
    // The values the attention graph's by-value scalars must hold to compute anything sensible.
    for (DescP o : g->ops) {
        if (o->op.kind != CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR) continue;
        const DescP s = o->op.in[1];
        if (!s || !s->t.by_value) continue;
        float v = by_value[s->t.uid][0];
        if (o->op.mode == CUDNN_POINTWISE_MUL && !(std::isfinite(v) && v > 0.0f))
            return refuse(CUDNN_STATUS_BAD_PARAM, "scale (UID %lld) is %g: not a positive finite number", (long long)s->t.uid, v);
        if ((o->op.mode == CUDNN_POINTWISE_CMP_LT || o->op.mode == CUDNN_POINTWISE_ADD) && v < 1.0f)
            return refuse(CUDNN_STATUS_BAD_PARAM, "window (UID %lld) is %g: it would hide every key", (long long)s->t.uid, v);
    }
    // The graph as it is now, copied: the caller may destroy its descriptors once this returns
    // (the real library's kernels hold their parameters), before the stream runs the work.
    auto snap = std::make_shared<std::vector<std::unique_ptr<Desc>>>();
    std::map<DescP, DescP> remap;
    auto copy = [&](DescP t) -> DescP {
        if (!t) return nullptr;
        auto it = remap.find(t);
        if (it != remap.end()) return it->second;
        snap->push_back(std::make_unique<Desc>());
        DescP n = snap->back().get();
        n->type = t->type, n->t = t->t;
        return remap[t] = n;
    };
    std::vector<Op> ops;
    for (DescP o : g->ops) {
        Op op = o->op;
        for (DescP &in : op.in) in = copy(in);
        op.out = copy(op.out);
        ops.push_back(op);
    }
    void *ws = pack->workspace;
    cudasim::lib_enqueue(h->stream, "cudnnBackendExecute", [snap, ops, bound, by_value, ws] {
        std::map<DescP, Vals> val;
        std::set<DescP> produced;  // in memory but written by the graph (Σ rows, the dQ accumulator)
        for (const Op &o : ops) produced.insert(o.out);
        for (const Op &o : ops)
            for (DescP t : {o.in[0], o.in[1], o.in[2]}) {
                if (!t || t->t.is_virtual || val.count(t) || produced.count(t)) continue;
                val[t] = t->t.by_value ? by_value.at(t->t.uid) : gather(t->t, bound.at(t->t.uid));
                // sequence lengths (an int32 input of a comparison with the column index)
                if (t->t.type == CUDNN_DATA_INT32 && !t->t.by_value)
                    for (float v : val[t])
                        if (v < 1.0f || v > (float)o.out->t.dim[3])
                            cudasim::fail("cuDNN: sequence length %g outside [1, %lld]", v, (long long)o.out->t.dim[3]);
            }
        size_t ws_off = 0;
        for (const Op &o : ops) {
            run_op(o, val);
            const Tensor &y = o.out->t;
            if (o.kind == CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR && ws) {  // row statistics in the workspace
                memcpy((char *)ws + ws_off, val[o.out].data(), val[o.out].size() * 4);
                ws_off += val[o.out].size() * 4;
            }
            if (!y.is_virtual) scatter(y, bound.at(y.uid), val[o.out]);
        }
    }, false);
    return CUDNN_STATUS_SUCCESS;
}

}  // extern "C"
