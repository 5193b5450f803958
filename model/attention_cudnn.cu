// model/attention_cudnn.cu — attention through cuDNN's SDPA graph (model/attention_cudnn.h):
// the run-time loading of libcudnn.so.9, the backend-API graphs of the forward and the backward,
// their plans cached per shape, and the choice between them and the WMMA kernels.
//
// The graphs follow the operation pattern of cuDNN's fused flash attention ("Scaled Dot Product
// Attention", cuDNN developer guide, and the graphs cudnn-frontend's sdpa nodes build): matmul
// Q·Kᵀ (fp32), × scale, the mask as generated indices compared (causal row ≥ col; window
// row − col < w; lengths col < kv_len[b]) and a select of −inf, softmax as max / sub / exp / sum,
// the statistics max + log Σ, P = exp / Σ in bf16, matmul P·V. The backward: Σ_d dO·O, P =
// exp(S − Stats), dV = Pᵀ·dO, dP = dO·Vᵀ, dS = P·(dP − Σ)·scale, dQ = dS·K, dK = dSᵀ·Q; with
// GQA, dK and dV are made per query head and summed over each group (a reduction). The
// transposes are reshape operations (a view with swapped strides).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudnn_graph.h>
#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cuda_util.cuh"  // first: it makes core/common.h digestible for nvcc
#include "core/common.h"
#include "model/attention_cudnn.h"
#include "model/attention_scratch.h"
#include "model/ops_cuda.h"

// ---------------------------------------------------------------------------------------------
// The library, loaded once.
namespace {

struct cudnn_api {
    size_t (*GetVersion)(void);
    const char *(*GetErrorString)(cudnnStatus_t);
    cudnnStatus_t (*Create)(cudnnHandle_t *);
    cudnnStatus_t (*SetStream)(cudnnHandle_t, cudaStream_t);
    cudnnStatus_t (*CreateDescriptor)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *);
    cudnnStatus_t (*DestroyDescriptor)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*Finalize)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*SetAttribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                                  int64_t, const void *);
    cudnnStatus_t (*GetAttribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                                  int64_t, int64_t *, void *);
    cudnnStatus_t (*Execute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t);
};
cudnn_api api;
int api_state;  // 0: not tried, 1: loaded, -1: unavailable (api_why says why)
int api_syms;   // 1: the symbols resolved and the version is 9 (even where cudnnCreate failed)
char api_why[256];
enum { MAX_DEV = 64 };
cudnnHandle_t handles[MAX_DEV];  // one per device: a handle (and its plans) belongs to the device
cudnnHandle_t handle;            // current at its creation; this is the current device's
int mode_set;
mt_attention_mode mode;

const char *st_name(cudnnStatus_t st) { return api.GetErrorString ? api.GetErrorString(st) : "?"; }

int load(void) {
    if (api_state) return api_state > 0;
    api_state = -1;
#ifdef MT_CUDASIM
    // The emulator's stand-in (tests/cudasim/cudnn.cc) is linked in: bind it where a CUDA build
    // resolves the library's symbols.
    api.GetVersion = cudnnGetVersion, api.GetErrorString = cudnnGetErrorString, api.Create = cudnnCreate;
    api.SetStream = cudnnSetStream, api.CreateDescriptor = cudnnBackendCreateDescriptor;
    api.DestroyDescriptor = cudnnBackendDestroyDescriptor, api.Finalize = cudnnBackendFinalize;
    api.SetAttribute = cudnnBackendSetAttribute, api.GetAttribute = cudnnBackendGetAttribute;
    api.Execute = cudnnBackendExecute;
#else
    void *lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(api_why, sizeof api_why, "cuDNN not found (libcudnn.so.9)");
        return 0;
    }
    struct {
        void **slot;
        const char *name;
    } syms[] = {{(void **)&api.GetVersion, "cudnnGetVersion"},
                {(void **)&api.GetErrorString, "cudnnGetErrorString"},
                {(void **)&api.Create, "cudnnCreate"},
                {(void **)&api.SetStream, "cudnnSetStream"},
                {(void **)&api.CreateDescriptor, "cudnnBackendCreateDescriptor"},
                {(void **)&api.DestroyDescriptor, "cudnnBackendDestroyDescriptor"},
                {(void **)&api.Finalize, "cudnnBackendFinalize"},
                {(void **)&api.SetAttribute, "cudnnBackendSetAttribute"},
                {(void **)&api.GetAttribute, "cudnnBackendGetAttribute"},
                {(void **)&api.Execute, "cudnnBackendExecute"}};
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++)
        if (!(*syms[i].slot = dlsym(lib, syms[i].name))) {
            snprintf(api_why, sizeof api_why, "libcudnn.so.9 lacks %s", syms[i].name);
            memset(&api, 0, sizeof api);
            return 0;
        }
#endif
    // The graphs need cuDNN 9 (the library's major must match the headers the graphs use).
    if (api.GetVersion() / 10000 != CUDNN_MAJOR) {
        snprintf(api_why, sizeof api_why, "cuDNN %zu is not version %d", api.GetVersion(), CUDNN_MAJOR);
        return 0;
    }
    api_syms = 1;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess || dev < 0 || dev >= MAX_DEV) {
        (void)cudaGetLastError();
        snprintf(api_why, sizeof api_why, "no CUDA device for cuDNN (cudaGetDevice: %s, device %d)",
                 cudaGetErrorString(e), dev);
        return 0;
    }
    cudnnStatus_t st = api.Create(&handles[dev]);
    if (st != CUDNN_STATUS_SUCCESS) {
        snprintf(api_why, sizeof api_why, "cudnnCreate: %s", st_name(st));
        return 0;
    }
    handle = handles[dev];
    api_state = 1;
    return 1;
}

// The current device's handle (made at its first use there); returns the device.
int use_device(void) {
    int dev = 0;
    MT_CHECK_CUDA(cudaGetDevice(&dev));
    if (dev < 0 || dev >= MAX_DEV) mt_fatal(MT_EXIT_ERROR, "attention_cudnn: device %d (at most %d)", dev, MAX_DEV);
    if (!handles[dev]) {
        cudnnStatus_t st = api.Create(&handles[dev]);
        if (st) mt_fatal(MT_EXIT_ERROR, "attention_cudnn: cudnnCreate on device %d: %s", dev, st_name(st));
    }
    handle = handles[dev];
    return dev;
}

// A refusal's reason, printed once per distinct reason.
void decline(const char *why) {
    static char seen[8][160];
    static int n;
    if (mode == MT_ATTENTION_CUDNN) mt_fatal(MT_EXIT_ERROR, "attention: MT_ATTENTION=cudnn, but %s", why);
    for (int i = 0; i < n; i++)
        if (!strcmp(seen[i], why)) return;
    if (n < 8) snprintf(seen[n++], sizeof seen[0], "%s", why);
    fprintf(stderr, "attention: %s: using the WMMA kernel\n", why);
}

void read_mode(void) {
    if (mode_set) return;
    mode_set = 1;
    const char *e = getenv("MT_ATTENTION");
    if (!e || !*e || !strcmp(e, "auto")) mode = MT_ATTENTION_AUTO;
    else if (!strcmp(e, "wmma")) mode = MT_ATTENTION_WMMA;
    else if (!strcmp(e, "cudnn")) mode = MT_ATTENTION_CUDNN;
    else mt_fatal(MT_EXIT_USAGE, "MT_ATTENTION=%s: expected auto, wmma or cudnn", e);
}

// ---------------------------------------------------------------------------------------------
// Graph building: every call checked; the first failure is kept (status and call) and the later
// calls of that build are skipped.
enum { MAX_DESC = 160 };
struct Build {
    cudnnBackendDescriptor_t d[MAX_DESC];
    int n;
    cudnnStatus_t st;
    char what[200];
    int64_t next_virtual;
};

void fail_at(Build *b, cudnnStatus_t st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void fail_at(Build *b, cudnnStatus_t st, const char *fmt, ...) {
    if (b->st != CUDNN_STATUS_SUCCESS) return;
    b->st = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->what, sizeof b->what, fmt, ap);
    va_end(ap);
}

cudnnBackendDescriptor_t mk(Build *b, cudnnBackendDescriptorType_t t) {
    if (b->st) return NULL;
    if (b->n == MAX_DESC) mt_fatal(MT_EXIT_ERROR, "attention_cudnn: more than %d descriptors", MAX_DESC);
    cudnnBackendDescriptor_t d = NULL;
    cudnnStatus_t st = api.CreateDescriptor(t, &d);
    if (st) fail_at(b, st, "cudnnBackendCreateDescriptor(type %d)", (int)t);
    else b->d[b->n++] = d;
    return d;
}

void set(Build *b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
         int64_t count, const void *val) {
    if (b->st) return;
    cudnnStatus_t st = api.SetAttribute(d, name, type, count, val);
    if (st) fail_at(b, st, "cudnnBackendSetAttribute(attribute %d)", (int)name);
}

void fin(Build *b, cudnnBackendDescriptor_t d, const char *what) {
    if (b->st) return;
    cudnnStatus_t st = api.Finalize(d);
    if (st) fail_at(b, st, "cudnnBackendFinalize(%s)", what);
}

void destroy_all(cudnnBackendDescriptor_t *d, int n) {
    for (int i = n - 1; i >= 0; i--) {
        cudnnStatus_t st = api.DestroyDescriptor(d[i]);
        if (st) mt_fatal(MT_EXIT_ERROR, "attention_cudnn: cudnnBackendDestroyDescriptor: %s", st_name(st));
    }
}

struct Dims {
    int64_t d[4], s[4];
};

// A tensor: uid 0 makes it virtual (an intermediate the engine keeps to itself).
cudnnBackendDescriptor_t tensor(Build *b, int64_t uid, cudnnDataType_t type, Dims t, bool by_value = false) {
    cudnnBackendDescriptor_t d = mk(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    bool is_virtual = uid == 0;
    if (is_virtual) uid = b->next_virtual++;
    int64_t align = 16;
    set(b, d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    set(b, d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, t.d);
    set(b, d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, t.s);
    set(b, d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(b, d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    set(b, d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value) set(b, d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    fin(b, d, "tensor");
    return d;
}

// Packed dims (the virtual intermediates).
Dims packed(int64_t a, int64_t h, int64_t r, int64_t c) { return Dims{{a, h, r, c}, {h * r * c, r * c, c, 1}}; }

cudnnBackendDescriptor_t *ops_out;  // the graph's operations, in order
int *nops_out;

void add_op(Build *b, cudnnBackendDescriptor_t op) {
    if (!b->st) ops_out[(*nops_out)++] = op;
}

// y = mode(x, [bb], [t]) computed in fp32 (axis: GEN_INDEX's dimension).
void pw(Build *b, cudnnPointwiseMode_t m, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t bb,
        cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis = -1) {
    cudnnBackendDescriptor_t p = mk(b, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    set(b, p, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &m);
    set(b, p, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) set(b, p, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    fin(b, p, "pointwise");
    cudnnBackendDescriptor_t op = mk(b, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p);
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (bb) set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &bb);
    if (t) set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    fin(b, op, "pointwise operation");
    add_op(b, op);
}

// c = a·b; rows of M, N or K beyond a batch's length are padding (the lengths' tensors, as
// cudnn-frontend passes them; NULL: none).
void matmul_len(Build *b, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t bb, cudnnBackendDescriptor_t c,
                cudnnBackendDescriptor_t m_len, cudnnBackendDescriptor_t n_len, cudnnBackendDescriptor_t k_len) {
    cudnnBackendDescriptor_t m = mk(b, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(b, m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    fin(b, m, "matmul");
    cudnnBackendDescriptor_t op = mk(b, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &bb);
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m);
    if (m_len) set(b, op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m_len);
    if (n_len) set(b, op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n_len);
    if (k_len) set(b, op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &k_len);
    fin(b, op, "matmul operation");
    add_op(b, op);
}

void reduce(Build *b, cudnnReduceTensorOp_t r, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t d = mk(b, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(b, d, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &r);
    set(b, d, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    fin(b, d, "reduction");
    cudnnBackendDescriptor_t op = mk(b, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d);
    fin(b, op, "reduction operation");
    add_op(b, op);
}

void reshape(Build *b, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = mk(b, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set(b, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(b, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    fin(b, op, "reshape operation");
    add_op(b, op);
}

// The UIDs of the tensors the caller binds (the variant pack's). SEQ_Q/SEQ_KV: int32 [B] per
// batch lengths (device); SUM: the backward's fp32 Σ dO·O rows, DQ_ACC: its fp32 dQ accumulator,
// both in memory as the fused backward engine writes them (cudnn-frontend's composite SDPA
// backward keeps both non-virtual, in its workspace).
enum {
    U_Q = 1, U_K, U_V, U_O, U_STATS, U_SCALE, U_LOWEST, U_WINDOW_NEG, U_WINDOW, U_SEQ_Q, U_SEQ_KV, U_DO, U_DQ, U_DK,
    U_DV, U_SUM, U_DQ_ACC, U_ONE, U_COUNT
};

// hd: q and k's head dim, hdv: v and out's (MLA's differ). lens: the graph masks by per-batch
// lengths (keys: kv_len, or S where cuDNN ≤ 9.15's backward needs the mask: S % 128 ≠ 0).
struct Shape {
    int bwd, B, S, nh, nkv, hd, hdv, window, kv, lens, bug, dev;
};

// [B, h, S, d] in the model's [B, S, h, d] memory; transposed: [B, h, d, S].
Dims bshd(const Shape &s, int64_t h, int64_t d, int64_t heads_stride, bool transposed = false) {
    int64_t S = s.S;
    if (transposed) return Dims{{s.B, h, d, S}, {S * h * d, heads_stride, 1, h * d}};
    return Dims{{s.B, h, S, d}, {S * h * d, heads_stride, h * d, 1}};
}

// The statistics (and the backward's Σ rows) as the engine reads them: [B, nh, S, 1] packed. The
// model's lse is [B, S, nh]: converted around each call (model/attention_cudnn.h says why).
Dims rows_bhs(const Shape &s) { return packed(s.B, s.nh, s.S, 1); }

const Dims ONE = {{1, 1, 1, 1}, {1, 1, 1, 1}};

// The masks on the scores x [B, nh, S, S] fp32, in cudnn-frontend's order and constants:
// padding (row < seq_q[b] and col < seq_kv[b]), causal (row ≥ col), the sliding window's left
// bound (col + window > row); masked entries become the lowest float (the window's −2³⁰).
cudnnBackendDescriptor_t masks(Build *b, const Shape &s, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t seq_q,
                               cudnnBackendDescriptor_t seq_kv) {
    const Dims sc = packed(s.B, s.nh, s.S, s.S);
    cudnnBackendDescriptor_t lowest = tensor(b, U_LOWEST, CUDNN_DATA_FLOAT, ONE, true);
    if (s.lens) {
        cudnnBackendDescriptor_t row = tensor(b, 0, CUDNN_DATA_INT32, sc), col = tensor(b, 0, CUDNN_DATA_INT32, sc);
        pw(b, CUDNN_POINTWISE_GEN_INDEX, x, NULL, NULL, row, 2);
        pw(b, CUDNN_POINTWISE_GEN_INDEX, x, NULL, NULL, col, 3);
        cudnnBackendDescriptor_t inr = tensor(b, 0, CUDNN_DATA_BOOLEAN, sc), inc = tensor(b, 0, CUDNN_DATA_BOOLEAN, sc);
        cudnnBackendDescriptor_t both = tensor(b, 0, CUDNN_DATA_BOOLEAN, sc), y = tensor(b, 0, CUDNN_DATA_FLOAT, sc);
        pw(b, CUDNN_POINTWISE_CMP_LT, row, seq_q, NULL, inr);
        pw(b, CUDNN_POINTWISE_CMP_LT, col, seq_kv, NULL, inc);
        pw(b, CUDNN_POINTWISE_LOGICAL_AND, inr, inc, NULL, both);
        pw(b, CUDNN_POINTWISE_BINARY_SELECT, x, lowest, both, y);
        x = y;
    }
    {  // causal: key j ≤ query i
        cudnnBackendDescriptor_t row = tensor(b, 0, CUDNN_DATA_INT32, sc), col = tensor(b, 0, CUDNN_DATA_INT32, sc);
        pw(b, CUDNN_POINTWISE_GEN_INDEX, x, NULL, NULL, row, 2);
        pw(b, CUDNN_POINTWISE_GEN_INDEX, x, NULL, NULL, col, 3);
        cudnnBackendDescriptor_t vis = tensor(b, 0, CUDNN_DATA_BOOLEAN, sc), y = tensor(b, 0, CUDNN_DATA_FLOAT, sc);
        pw(b, CUDNN_POINTWISE_CMP_GE, row, col, NULL, vis);
        pw(b, CUDNN_POINTWISE_BINARY_SELECT, x, lowest, vis, y);
        x = y;
    }
    if (s.window > 0) {  // and i − j < window: j + window > i
        cudnnBackendDescriptor_t row = tensor(b, 0, CUDNN_DATA_FLOAT, sc), col = tensor(b, 0, CUDNN_DATA_FLOAT, sc);
        pw(b, CUDNN_POINTWISE_GEN_INDEX, x, NULL, NULL, row, 2);
        pw(b, CUDNN_POINTWISE_GEN_INDEX, x, NULL, NULL, col, 3);
        cudnnBackendDescriptor_t w = tensor(b, U_WINDOW, CUDNN_DATA_FLOAT, ONE, true);
        cudnnBackendDescriptor_t colw = tensor(b, 0, CUDNN_DATA_FLOAT, sc), inw = tensor(b, 0, CUDNN_DATA_BOOLEAN, sc);
        pw(b, CUDNN_POINTWISE_ADD, col, w, NULL, colw);
        pw(b, CUDNN_POINTWISE_CMP_GT, colw, row, NULL, inw);
        cudnnBackendDescriptor_t neg = tensor(b, U_WINDOW_NEG, CUDNN_DATA_FLOAT, ONE, true);
        cudnnBackendDescriptor_t y = tensor(b, 0, CUDNN_DATA_FLOAT, sc);
        pw(b, CUDNN_POINTWISE_BINARY_SELECT, x, neg, inw, y);
        x = y;
    }
    return x;
}

// The lengths' tensors (NULL without a padding mask).
void lengths(Build *b, const Shape &s, cudnnBackendDescriptor_t *seq_q, cudnnBackendDescriptor_t *seq_kv) {
    *seq_q = *seq_kv = NULL;
    if (!s.lens) return;
    const Dims l = {{s.B, 1, 1, 1}, {1, 1, 1, 1}};
    *seq_q = tensor(b, U_SEQ_Q, CUDNN_DATA_INT32, l);
    *seq_kv = tensor(b, U_SEQ_KV, CUDNN_DATA_INT32, l);
}

// The scaled scores [B, nh, S, S] fp32, Q·Kᵀ × scale: the part both graphs share.
cudnnBackendDescriptor_t scaled_scores(Build *b, const Shape &s, cudnnBackendDescriptor_t tq, cudnnBackendDescriptor_t tkt,
                                       cudnnBackendDescriptor_t scale, cudnnBackendDescriptor_t seq_q,
                                       cudnnBackendDescriptor_t seq_kv) {
    const Dims sc = packed(s.B, s.nh, s.S, s.S);
    cudnnBackendDescriptor_t raw = tensor(b, 0, CUDNN_DATA_FLOAT, sc), scaled = tensor(b, 0, CUDNN_DATA_FLOAT, sc);
    matmul_len(b, tq, tkt, raw, seq_q, seq_kv, NULL);
    pw(b, CUDNN_POINTWISE_MUL, raw, scale, NULL, scaled);
    return scaled;
}

void graph_forward(Build *b, const Shape &s) {
    const int64_t hd = s.hd, hdv = s.hdv;
    // Planted bug 1: a head stride of hd / 2 makes the heads of Q overlap.
    cudnnBackendDescriptor_t tq = tensor(b, U_Q, CUDNN_DATA_BFLOAT16, bshd(s, s.nh, hd, s.bug == 1 ? hd / 2 : hd));
    const int64_t nkv = s.bug == 3 ? s.nkv + 1 : s.nkv;  // planted bug 3: nkv + 1 heads of K
    cudnnBackendDescriptor_t tkt = tensor(b, U_K, CUDNN_DATA_BFLOAT16, bshd(s, nkv, hd, hd, true));
    cudnnBackendDescriptor_t tv = tensor(b, U_V, CUDNN_DATA_BFLOAT16, bshd(s, s.nkv, hdv, hdv));
    cudnnBackendDescriptor_t to = tensor(b, U_O, CUDNN_DATA_BFLOAT16, bshd(s, s.nh, hdv, hdv));
    const Dims sc = packed(s.B, s.nh, s.S, s.S), rows = rows_bhs(s);
    cudnnBackendDescriptor_t seq_q, seq_kv;
    lengths(b, s, &seq_q, &seq_kv);
    cudnnBackendDescriptor_t scale = tensor(b, U_SCALE, CUDNN_DATA_FLOAT, ONE, true);
    cudnnBackendDescriptor_t x = masks(b, s, scaled_scores(b, s, tq, tkt, scale, seq_q, seq_kv), seq_q, seq_kv);
    cudnnBackendDescriptor_t mx = tensor(b, 0, CUDNN_DATA_FLOAT, rows), sub = tensor(b, 0, CUDNN_DATA_FLOAT, sc);
    cudnnBackendDescriptor_t e = tensor(b, 0, CUDNN_DATA_FLOAT, sc), sum = tensor(b, 0, CUDNN_DATA_FLOAT, rows);
    cudnnBackendDescriptor_t lg = tensor(b, 0, CUDNN_DATA_FLOAT, rows);
    cudnnBackendDescriptor_t st = tensor(b, U_STATS, CUDNN_DATA_FLOAT, rows);
    cudnnBackendDescriptor_t p = tensor(b, 0, CUDNN_DATA_BFLOAT16, sc);
    reduce(b, CUDNN_REDUCE_TENSOR_MAX, x, mx);
    pw(b, CUDNN_POINTWISE_SUB, x, mx, NULL, sub);
    pw(b, CUDNN_POINTWISE_EXP, sub, NULL, NULL, e);
    reduce(b, CUDNN_REDUCE_TENSOR_ADD, e, sum);
    pw(b, CUDNN_POINTWISE_LOG, sum, NULL, NULL, lg);
    pw(b, CUDNN_POINTWISE_ADD, mx, lg, NULL, st);  // Stats = max + log Σ exp: our lse
    pw(b, CUDNN_POINTWISE_DIV, e, sum, NULL, p);
    matmul_len(b, p, tv, to, seq_q, NULL, seq_kv);
}

// cudnn-frontend's composite SDPA backward (no dropout, no bias), which cuDNN's fused flash
// backward engine recognizes: Σ = (dO·O summed) × 1 to memory; P = exp(mask(S·scale − Stats));
// dV = Pᵀ·dO; dS = (dO·Vᵀ − Σ)·P·scale; dK = dSᵀ·Q; dQ = dS·K through an fp32 accumulator in
// memory. Under GQA dK and dV are made per query head (bf16) and summed over each group.
void graph_backward(Build *b, const Shape &s) {
    const int64_t hd = s.hd, hdv = s.hdv;
    const bool gqa = s.nkv != s.nh;
    const Dims sc = packed(s.B, s.nh, s.S, s.S), rows = rows_bhs(s);
    const Dims scT = {{s.B, s.nh, s.S, s.S}, {(int64_t)s.nh * s.S * s.S, (int64_t)s.S * s.S, 1, s.S}};
    cudnnBackendDescriptor_t tq = tensor(b, U_Q, CUDNN_DATA_BFLOAT16, bshd(s, s.nh, hd, hd));
    // K serves as Kᵀ (the scores) and as K (dQ): one tensor bound as Kᵀ, K a reshape of it. The
    // other way round cuDNN 9.14 refuses the graph: its flash backward wants exactly two matmuls
    // whose inputs nothing produces, Q·Kᵀ and dO·Vᵀ (its log, on the H100, 2026-11-27).
    cudnnBackendDescriptor_t tkt = tensor(b, U_K, CUDNN_DATA_BFLOAT16, bshd(s, s.nkv, hd, hd, true));
    cudnnBackendDescriptor_t tvt = tensor(b, U_V, CUDNN_DATA_BFLOAT16, bshd(s, s.nkv, hdv, hdv, true));
    cudnnBackendDescriptor_t to = tensor(b, U_O, CUDNN_DATA_BFLOAT16, bshd(s, s.nh, hdv, hdv));
    cudnnBackendDescriptor_t tdo = tensor(b, U_DO, CUDNN_DATA_BFLOAT16, bshd(s, s.nh, hdv, hdv));
    cudnnBackendDescriptor_t st = tensor(b, U_STATS, CUDNN_DATA_FLOAT, rows);
    cudnnBackendDescriptor_t seq_q, seq_kv;
    lengths(b, s, &seq_q, &seq_kv);
    // Σ_d dO·O per query row, to memory
    cudnnBackendDescriptor_t prod = tensor(b, 0, CUDNN_DATA_FLOAT, packed(s.B, s.nh, s.S, hdv));
    cudnnBackendDescriptor_t red = tensor(b, 0, CUDNN_DATA_FLOAT, rows), dsum = tensor(b, U_SUM, CUDNN_DATA_FLOAT, rows);
    pw(b, CUDNN_POINTWISE_MUL, tdo, to, NULL, prod);
    reduce(b, CUDNN_REDUCE_TENSOR_ADD, prod, red);
    pw(b, CUDNN_POINTWISE_MUL, red, tensor(b, U_ONE, CUDNN_DATA_FLOAT, ONE, true), NULL, dsum);
    // P = exp(mask(S·scale − Stats)); Pᵀ as a bf16 view
    cudnnBackendDescriptor_t scale = tensor(b, U_SCALE, CUDNN_DATA_FLOAT, ONE, true);
    cudnnBackendDescriptor_t sub = tensor(b, 0, CUDNN_DATA_FLOAT, sc), p = tensor(b, 0, CUDNN_DATA_FLOAT, sc);
    pw(b, CUDNN_POINTWISE_SUB, scaled_scores(b, s, tq, tkt, scale, seq_q, seq_kv), st, NULL, sub);
    pw(b, CUDNN_POINTWISE_EXP, masks(b, s, sub, seq_q, seq_kv), NULL, NULL, p);
    cudnnBackendDescriptor_t pt = tensor(b, 0, CUDNN_DATA_BFLOAT16, scT);
    reshape(b, p, pt);
    // dV = Pᵀ·dO (per query head, summed over the group under GQA)
    cudnnBackendDescriptor_t tdv = tensor(b, U_DV, CUDNN_DATA_BFLOAT16, bshd(s, s.nkv, hdv, hdv));
    if (gqa) {
        cudnnBackendDescriptor_t full = tensor(b, 0, CUDNN_DATA_BFLOAT16, packed(s.B, s.nh, s.S, hdv));
        matmul_len(b, pt, tdo, full, seq_kv, NULL, seq_q);
        reduce(b, CUDNN_REDUCE_TENSOR_ADD, full, tdv);
    } else {
        matmul_len(b, pt, tdo, tdv, seq_kv, NULL, seq_q);
    }
    // dS = (dO·Vᵀ − Σ)·P·scale
    cudnnBackendDescriptor_t dp = tensor(b, 0, CUDNN_DATA_FLOAT, sc), t1 = tensor(b, 0, CUDNN_DATA_FLOAT, sc);
    cudnnBackendDescriptor_t t2 = tensor(b, 0, CUDNN_DATA_FLOAT, sc), ds = tensor(b, 0, CUDNN_DATA_FLOAT, sc);
    matmul_len(b, tdo, tvt, dp, seq_q, seq_kv, NULL);
    pw(b, CUDNN_POINTWISE_SUB, dp, dsum, NULL, t1);
    pw(b, CUDNN_POINTWISE_MUL, t1, p, NULL, t2);
    pw(b, CUDNN_POINTWISE_MUL, t2, scale, NULL, ds);
    // dK = dSᵀ·Q
    cudnnBackendDescriptor_t dst = tensor(b, 0, CUDNN_DATA_BFLOAT16, scT);
    reshape(b, ds, dst);
    cudnnBackendDescriptor_t tdk = tensor(b, U_DK, CUDNN_DATA_BFLOAT16, bshd(s, s.nkv, hd, hd));
    if (gqa) {
        cudnnBackendDescriptor_t full = tensor(b, 0, CUDNN_DATA_BFLOAT16, packed(s.B, s.nh, s.S, hd));
        matmul_len(b, dst, tq, full, seq_kv, NULL, seq_q);
        reduce(b, CUDNN_REDUCE_TENSOR_ADD, full, tdk);
    } else {
        matmul_len(b, dst, tq, tdk, seq_kv, NULL, seq_q);
    }
    // dQ = dS·K into the fp32 accumulator, then bf16
    cudnnBackendDescriptor_t tk = tensor(b, 0, CUDNN_DATA_BFLOAT16, bshd(s, s.nkv, hd, hd));
    reshape(b, tkt, tk);
    cudnnBackendDescriptor_t acc = tensor(b, U_DQ_ACC, CUDNN_DATA_FLOAT, packed(s.B, s.nh, s.S, hd));
    matmul_len(b, ds, tk, acc, seq_q, NULL, seq_kv);
    pw(b, CUDNN_POINTWISE_IDENTITY, acc, NULL, NULL, tensor(b, U_DQ, CUDNN_DATA_BFLOAT16, bshd(s, s.nh, hd, hd)));
}

// ---------------------------------------------------------------------------------------------
// Plans, cached per shape.
struct Plan {
    Shape key;
    cudnnBackendDescriptor_t plan;
    int64_t ws;
    cudnnBackendDescriptor_t d[MAX_DESC];  // every descriptor the plan was built from (kept alive)
    int n;
    char why[320];  // plan == NULL: why the library refused the graph
};
enum { MAX_PLANS = 32 };
Plan plans[MAX_PLANS];
int nplans;

bool same(const Shape &a, const Shape &b) { return !memcmp(&a, &b, sizeof a); }

// Builds the graph of `s`, asks the heuristics, and finalizes the first plan the engine takes.
// Returns the status of the first failing call (what in b->what).
cudnnStatus_t build_plan(const Shape &s, Plan *out, Build *b) {
    memset(b, 0, sizeof *b);
    b->next_virtual = 1000;
    cudnnBackendDescriptor_t ops[MAX_DESC];
    int nops = 0;
    ops_out = ops, nops_out = &nops;
    if (s.bwd) graph_backward(b, s);
    else graph_forward(b, s);
    cudnnBackendDescriptor_t g = mk(b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(b, g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, nops, ops);
    set(b, g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    fin(b, g, "operation graph");
    cudnnBackendDescriptor_t h = mk(b, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    cudnnBackendHeurMode_t hm = CUDNN_HEUR_MODE_A;
    set(b, h, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g);
    set(b, h, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &hm);
    fin(b, h, "engine heuristics");
    enum { NCFG = 8 };
    cudnnBackendDescriptor_t cfg[NCFG];
    for (int i = 0; i < NCFG; i++) cfg[i] = mk(b, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    int64_t ncfg = 0;
    if (!b->st) {
        cudnnStatus_t st = api.GetAttribute(h, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, NCFG,
                                            &ncfg, cfg);
        if (st) fail_at(b, st, "cudnnBackendGetAttribute(engine heuristics' results)");
        else if (ncfg == 0) fail_at(b, CUDNN_STATUS_NOT_SUPPORTED, "the engine heuristics offered no engine");
    }
    // The first configuration the library finalizes a plan for (a heuristic's pick may still be
    // refused at finalization: then the next).
    cudnnBackendDescriptor_t plan = NULL;
    cudnnStatus_t last = CUDNN_STATUS_SUCCESS;
    for (int64_t i = 0; i < ncfg && !b->st && !plan; i++) {
        cudnnBackendDescriptor_t p = mk(b, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        set(b, p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
        set(b, p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i]);
        if (b->st) break;
        if (s.bug == 5) {  // planted bug 5: the plan is used unfinalized
            plan = p;
            break;
        }
        last = api.Finalize(p);
        if (last == CUDNN_STATUS_SUCCESS) plan = p;
    }
    if (!b->st && !plan) fail_at(b, last, "cudnnBackendFinalize(execution plan) for each of %lld engines", (long long)ncfg);
    int64_t ws = 0, got = 0;
    if (!b->st && s.bug != 5) {
        cudnnStatus_t st = api.GetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got, &ws);
        if (st) fail_at(b, st, "cudnnBackendGetAttribute(plan's workspace size)");
    }
    out->key = s, out->plan = plan, out->ws = ws, out->n = b->n;
    memcpy(out->d, b->d, sizeof(b->d[0]) * (size_t)b->n);
    return b->st;
}

// The plan of `s`, built at its first use. A graph the library refuses (status and call kept, as
// its plan == NULL, so it is not rebuilt) is a reason to decline: the WMMA kernel runs (fatal
// under MT_ATTENTION=cudnn).
Plan *get_plan(const Shape &s) {
    Plan *p = NULL;
    for (int i = 0; i < nplans && !p; i++)
        if (same(plans[i].key, s)) p = &plans[i];
    if (!p) {
        if (nplans == MAX_PLANS) {  // the oldest goes: shapes come and go with sequence lengths
            destroy_all(plans[0].d, plans[0].n);
            memmove(&plans[0], &plans[1], sizeof(Plan) * (MAX_PLANS - 1));
            nplans--;
        }
        Build b;
        p = &plans[nplans++];
        if (build_plan(s, p, &b) != CUDNN_STATUS_SUCCESS) {
            destroy_all(b.d, b.n);
            p->key = s, p->plan = NULL, p->n = 0;
            snprintf(p->why, sizeof p->why,
                     "cuDNN refused the %s graph (B=%d S=%d nh=%d nkv=%d hd=%d hd_v=%d window=%d): %s: %s",
                     s.bwd ? "backward" : "forward", s.B, s.S, s.nh, s.nkv, s.hd, s.hdv, s.window, b.what,
                     st_name(b.st));
        }
    }
    if (p->plan) return p;
    decline(p->why);
    return NULL;
}

struct Binding {
    int64_t uid[U_COUNT];
    void *ptr[U_COUNT];
    int n;
    void add(int64_t u, const void *p) { uid[n] = u, ptr[n++] = (void *)p; }
};

// Runs `p` on the backend's stream with the bound tensors and a workspace from the ledger.
cudnnStatus_t execute(mt_backend *be, const Plan *p, const Binding &bind, int bug, char *what, size_t what_len) {
    cudaStream_t stream = mt_cuda_begin(be);
    cudnnStatus_t st = api.SetStream(handle, stream);
    if (st) {
        snprintf(what, what_len, "cudnnSetStream");
        return st;
    }
    const size_t ws = (size_t)p->ws;
    void *work = ws ? mt_work_alloc(be, ws) : NULL;
    cudnnBackendDescriptor_t vp = NULL;
    st = api.CreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    if (st) {
        snprintf(what, what_len, "cudnnBackendCreateDescriptor(variant pack)");
        if (work) mt_work_free(be, work, ws);
        return st;
    }
    void *ws_ptr = bug == 2 ? NULL : work;  // planted bug 2: no workspace
    const char *step = "cudnnBackendSetAttribute(variant pack's UIDs)";
    st = api.SetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, bind.n, bind.uid);
    if (!st) {
        step = "cudnnBackendSetAttribute(variant pack's pointers)";
        st = api.SetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, bind.n, bind.ptr);
    }
    if (!st) {
        step = "cudnnBackendSetAttribute(variant pack's workspace)";
        st = api.SetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws_ptr);
    }
    if (!st) step = "cudnnBackendFinalize(variant pack)", st = api.Finalize(vp);
    if (!st) step = "cudnnBackendExecute", st = api.Execute(handle, p->plan, vp);
    if (st) snprintf(what, what_len, "%s", step);
    cudnnStatus_t st2 = api.DestroyDescriptor(vp);
    if (!st && st2) st = st2, snprintf(what, what_len, "cudnnBackendDestroyDescriptor(variant pack)");
    if (work) mt_work_free(be, work, ws);
    return st;
}

// Whether a direction's graph masks by lengths: with key lengths, and (cudnn-frontend's workaround
// for cuDNN ≤ 9.15) in the backward whenever S is not a multiple of 128, with every length S.
int needs_lens(int bwd, int S, int kv) { return mt_att_cudnn_needs_lens(bwd, S, kv, api.GetVersion()); }

Shape shape_of(int bwd, int B, int S, int nh, int nkv, int hd, int hdv, int window, int kv, int bug, int dev) {
    return Shape{bwd, B, S, nh, nkv, hd, hdv, window, kv, needs_lens(bwd, S, kv), bug, dev};
}

// The plan of `s` when cuDNN takes both directions of its shape, else NULL (declined). One kernel
// for both or neither: the backward reads the forward's statistics and output, and on the H100
// (2026-11-27) cuDNN's forward beside the WMMA backward trained the tiny Mixtral wrong (logits
// rel. L2 0.7) while the WMMA kernels alone matched the CPU.
Plan *get_pair_plan(const Shape &s) {
    Shape other = s;
    other.bwd = !s.bwd;
    other.lens = needs_lens(other.bwd, s.S, s.kv);
    if (!get_plan(other)) return NULL;
    return get_plan(s);  // after: a plan evicted from the cache by the other's build is rebuilt
}
// Whether cuDNN takes these arguments; the reason when not (NULL: it does).
const char *refusal(int has_key_mask, int has_kv_len, int nh, int nkv, int hd, int hd_v) {
    read_mode();
    if (mode == MT_ATTENTION_WMMA) return "";  // asked for: no reason to print
    if (!load()) return api_why;
    return mt_att_cudnn_shape_refusal(has_key_mask, has_kv_len, nh, nkv, hd, hd_v);
}

bool aligned(const void *p) { return ((uintptr_t)p & 15) == 0; }

// The by-value scalars every graph binds (cudnn-frontend's constants).
const float LOWEST = -3.402823466e38f, WINDOW_NEG = -1073741824.0f, ONE_F = 1.0f;

__global__ void fill_i32_kernel(int32_t *p, int n, int32_t v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v;
}
// lse [B, S, nh] ↔ the engine's [B, nh, S]: to_lse 0 reads src as lse, 1 writes dst as lse.
__global__ void lse_layout_kernel(float *dst, const float *src, int B, int S, int nh, int to_lse) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;  // lse's index
    if (i >= (int64_t)B * S * nh) return;
    int h = (int)(i % nh), t = (int)((i / nh) % S), b = (int)(i / ((int64_t)nh * S));
    int64_t j = ((int64_t)b * nh + h) * S + t;  // the engine's
    if (to_lse) dst[i] = src[j];
    else dst[j] = src[i];
}

// Scratch beside cuDNN's own workspace, one allocation: the lengths (seq_q, seq_kv), the
// statistics in the engine's layout, and the backward's Σ rows and fp32 dQ accumulator.
struct Scratch {
    char *base;
    size_t bytes;
    int32_t *seq_q, *seq_kv;
    float *stats, *sum, *dq_acc;
};
size_t up256(size_t n) { return (n + 255) / 256 * 256; }

Scratch scratch_alloc(mt_backend *be, const Shape &s, const int32_t *kv_len) {
    const size_t rows = (size_t)s.B * s.nh * s.S;
    const size_t lens = s.lens ? up256((size_t)s.B * 4) : 0;
    Scratch x = {};
    x.bytes = mt_att_cudnn_scratch_bytes(s.bwd, s.B, s.S, s.nh, s.hd, s.lens, kv_len != NULL);
    x.base = (char *)mt_work_alloc(be, x.bytes);
    char *p = x.base;
    cudaStream_t stream = mt_cuda_begin(be);
    if (s.lens) {
        x.seq_q = (int32_t *)p, p += lens;
        fill_i32_kernel<<<mt_cuda_blocks(s.B, 256), 256, 0, stream>>>(x.seq_q, s.B, s.S);  // every query row
        MT_CHECK_CUDA(cudaGetLastError());
        if (kv_len) x.seq_kv = (int32_t *)kv_len;  // the caller's (device)
        else {
            x.seq_kv = (int32_t *)p, p += lens;
            fill_i32_kernel<<<mt_cuda_blocks(s.B, 256), 256, 0, stream>>>(x.seq_kv, s.B, s.S);
            MT_CHECK_CUDA(cudaGetLastError());
        }
    }
    x.stats = (float *)p, p += up256(rows * 4);
    if (s.bwd) x.sum = (float *)p, p += up256(rows * 4), x.dq_acc = (float *)p;
    return x;
}

void lse_convert(mt_backend *be, float *dst, const float *src, const Shape &s, int to_lse) {
    const int64_t n = (int64_t)s.B * s.S * s.nh;
    lse_layout_kernel<<<mt_cuda_blocks(n, 256), 256, 0, mt_cuda_begin(be)>>>(dst, src, s.B, s.S, s.nh, to_lse);
    MT_CHECK_CUDA(cudaGetLastError());
}

// The bindings both directions share.
void bind_common(Binding &bind, const Shape &s, const Scratch &x, const mt_bf16 *q, const mt_bf16 *k, const mt_bf16 *v,
                 const mt_bf16 *out, const float *scale, const float *window) {
    bind.add(U_Q, q), bind.add(U_K, k), bind.add(U_V, v), bind.add(U_O, out), bind.add(U_STATS, x.stats);
    bind.add(U_SCALE, scale), bind.add(U_LOWEST, &LOWEST);
    if (s.window > 0) bind.add(U_WINDOW, window), bind.add(U_WINDOW_NEG, &WINDOW_NEG);
    if (s.lens) bind.add(U_SEQ_Q, x.seq_q), bind.add(U_SEQ_KV, x.seq_kv);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
extern "C" void attention_set_mode(mt_attention_mode m) { mode = m, mode_set = 1; }
extern "C" mt_attention_mode attention_get_mode(void) {
    read_mode();
    return mode;
}
extern "C" size_t attention_cudnn_version(void) {
    load();
    return api_syms ? api.GetVersion() : 0;
}
extern "C" int attention_cudnn_emulated(void) {
#ifdef MT_CUDASIM
    return 1;
#else
    return 0;
#endif
}

extern "C" const char *attention_path(int has_key_mask, int has_kv_len, int nh, int nkv, int hd, int hd_v) {
    const char *why = refusal(has_key_mask, has_kv_len, nh, nkv, hd, hd_v);
    if (!why) return "cudnn";
    if (*why) decline(why);
    return "wmma";
}

extern "C" int attention_cudnn_forward(mt_backend *be, mt_bf16 *out, float *lse, const mt_bf16 *q, const mt_bf16 *k,
                                       const mt_bf16 *v, const uint8_t *key_mask, const int32_t *kv_len, int B, int S,
                                       int nh, int nkv, int hd, int hd_v, float scale, int window) {
    if (strcmp(attention_path(key_mask != NULL, kv_len != NULL, nh, nkv, hd, hd_v), "cudnn")) return 0;
    if (!aligned(q) || !aligned(k) || !aligned(v) || !aligned(out)) {
        decline("a tensor not 16-byte aligned");
        return 0;
    }
    if (B <= 0 || S <= 0) return 1;
    mt_cuda_begin(be);  // the backend's device current: its handle and plans
    const Shape s = shape_of(0, B, S, nh, nkv, hd, hd_v, window, kv_len != NULL, 0, use_device());
    Plan *p = get_pair_plan(s);
    if (!p) return 0;
    const float w = (float)window;
    Scratch x = scratch_alloc(be, s, kv_len);
    Binding bind = {};
    bind_common(bind, s, x, q, k, v, out, &scale, &w);
    char what[96];
    cudnnStatus_t st = execute(be, p, bind, 0, what, sizeof what);
    if (st) mt_fatal(MT_EXIT_ERROR, "attention_cudnn forward: %s: %s", what, st_name(st));
    lse_convert(be, lse, x.stats, s, 1);
    mt_work_free(be, x.base, x.bytes);
    return 1;
}

extern "C" int attention_cudnn_backward(mt_backend *be, mt_bf16 *dq, mt_bf16 *dk, mt_bf16 *dv, const mt_bf16 *dout,
                                        const mt_bf16 *q, const mt_bf16 *k, const mt_bf16 *v, const mt_bf16 *out,
                                        const float *lse, const uint8_t *key_mask, const int32_t *kv_len, int B,
                                        int S, int nh, int nkv, int hd, int hd_v, float scale, int window) {
    if (strcmp(attention_path(key_mask != NULL, kv_len != NULL, nh, nkv, hd, hd_v), "cudnn")) return 0;
    if (!aligned(q) || !aligned(k) || !aligned(v) || !aligned(out) || !aligned(dout)) {
        decline("a tensor not 16-byte aligned");
        return 0;
    }
    if (B <= 0 || S <= 0 || (!dq && !dk && !dv)) return 1;
    mt_cuda_begin(be);
    const Shape s = shape_of(1, B, S, nh, nkv, hd, hd_v, window, kv_len != NULL, 0, use_device());
    Plan *p = get_pair_plan(s);
    if (!p) return 0;
    // cuDNN writes the gradients; ours accumulate: into scratch first, added after.
    const size_t nq = (size_t)B * S * nh * hd, nk = (size_t)B * S * nkv * hd, nv = (size_t)B * S * nkv * hd_v;
    const size_t bytes = mt_att_cudnn_staging_bytes(B, S, nh, nkv, hd, hd_v);
    mt_bf16 *tq = (mt_bf16 *)mt_work_alloc(be, bytes), *tk = tq + nq, *tv = tk + nk;
    const float w = (float)window;
    Scratch x = scratch_alloc(be, s, kv_len);
    lse_convert(be, x.stats, lse, s, 0);
    Binding bind = {};
    bind_common(bind, s, x, q, k, v, out, &scale, &w);
    bind.add(U_DO, dout), bind.add(U_DQ, tq), bind.add(U_DK, tk), bind.add(U_DV, tv);
    bind.add(U_SUM, x.sum), bind.add(U_DQ_ACC, x.dq_acc), bind.add(U_ONE, &ONE_F);
    char what[96];
    cudnnStatus_t st = execute(be, p, bind, 0, what, sizeof what);
    if (st) mt_fatal(MT_EXIT_ERROR, "attention_cudnn backward: %s: %s", what, st_name(st));
    mt_work_free(be, x.base, x.bytes);
    if (dq) mt_add_cuda(be, dq, dq, tq, (int64_t)nq);
    if (dk) mt_add_cuda(be, dk, dk, tk, (int64_t)nk);
    if (dv) mt_add_cuda(be, dv, dv, tv, (int64_t)nv);
    mt_work_free(be, tq, bytes);
    return 1;
}

extern "C" int attention_cudnn_check(int bwd, int B, int S, int nh, int nkv, int hd, int hd_v, int window, int lens,
                                     char *msg, size_t msg_len) {
    read_mode();
    load();
    if (!api_syms) {
        snprintf(msg, msg_len, "%s", api_why);
        return -1;
    }
    const Shape s = shape_of(bwd, B, S, nh, nkv, hd, hd_v, window, lens, 0, api_state > 0 ? use_device() : 0);
    if (api_state > 0) {  // a device: the plan the step would use
        mt_attention_mode m0 = mode;
        mode = MT_ATTENTION_AUTO;  // a refusal is reported here, not fatal
        Plan *p = get_plan(s);
        mode = m0;
        if (!p) {
            for (int i = 0; i < nplans; i++)
                if (same(plans[i].key, s)) snprintf(msg, msg_len, "%s", plans[i].why);
            return 0;
        }
        snprintf(msg, msg_len, "plan finalized, workspace %lld bytes", (long long)p->ws);
        return 1;
    }
    // No device (cudnnCreate failed): every tensor and operation descriptor, finalized by the
    // library; the operation graph needs a handle.
    Build b;
    memset(&b, 0, sizeof b);
    b.next_virtual = 1000;
    cudnnBackendDescriptor_t ops[MAX_DESC];
    int nops = 0;
    ops_out = ops, nops_out = &nops;
    if (bwd) graph_backward(&b, s);
    else graph_forward(&b, s);
    int ok = b.st == CUDNN_STATUS_SUCCESS;
    if (ok) snprintf(msg, msg_len, "%d operations, %d descriptors finalized (no device: the graph not)", nops, b.n);
    else snprintf(msg, msg_len, "%s: %s", b.what, st_name(b.st));
    destroy_all(b.d, b.n);
    return ok ? 2 : 0;
}

extern "C" int attention_cudnn_count(int bwd, int has_key_mask, int B, int S, int nh, int nkv, int hd, int hd_v,
                                     int window, int kv, size_t *scratch, int64_t *ws) {
    read_mode();
    load();
    if (!api_syms || mode == MT_ATTENTION_WMMA || mt_att_cudnn_shape_refusal(has_key_mask, kv, nh, nkv, hd, hd_v))
        return 0;
    const int lens = needs_lens(bwd, S, kv);
    *scratch = mt_att_cudnn_scratch_bytes(bwd, B, S, nh, hd, lens, kv);
    *ws = -1;
    if (api_state > 0) {  // a device: the plans the step would build (a refusal printed, not fatal)
        const Shape s = shape_of(bwd, B, S, nh, nkv, hd, hd_v, window, kv, 0, use_device());
        mt_attention_mode m0 = mode;
        mode = MT_ATTENTION_AUTO;
        Plan *p = get_pair_plan(s);
        mode = m0;
        if (!p) return 0;
        *ws = p->ws;
    }
    return 1;
}

extern "C" int attention_cudnn_planted(mt_backend *be, int bug, mt_bf16 *out, float *lse, const mt_bf16 *q,
                                       const mt_bf16 *k, const mt_bf16 *v, int B, int S, int nh, int nkv, int hd,
                                       char *msg, size_t msg_len) {
    snprintf(msg, msg_len, "accepted");
    if (!load()) {
        snprintf(msg, msg_len, "%s", api_why);
        return -1;
    }
    mt_cuda_begin(be);
    const Shape s = {0, B, S, nh, nkv, hd, hd, 0, 0, 0, bug, use_device()};
    Plan p;
    Build b;
    cudnnStatus_t st = build_plan(s, &p, &b);
    if (st) {
        snprintf(msg, msg_len, "%s: %s", b.what, st_name(st));
        destroy_all(b.d, b.n);
        return (int)st;
    }
    const float scale = 1.0f / sqrtf((float)hd);
    Binding bind = {};
    bind.add(U_Q, q), bind.add(U_K, k), bind.add(U_V, v), bind.add(U_O, out);
    if (bug != 4) bind.add(U_STATS, lse);  // planted bug 4: the statistics unbound
    bind.add(U_SCALE, &scale), bind.add(U_LOWEST, &LOWEST);
    char what[96];
    st = execute(be, &p, bind, bug, what, sizeof what);
    if (st) snprintf(msg, msg_len, "%s: %s", what, st_name(st));
    destroy_all(p.d, p.n);
    return (int)st;
}
