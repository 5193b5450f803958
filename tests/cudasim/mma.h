// tests/cudasim/mma.h — the emulator's nvcuda::wmma (test-only). It shadows the toolkit's <mma.h>
// in `make SIM=1` because -Itests/cudasim comes before the CUDA include directory.
//
// CUDA leaves the fragment element layout unspecified, so here every lane holds the whole tile,
// row-major (x[r·cols + c]); an mma_sync is a scalar GEMM in fp32 (bf16/half inputs widened
// exactly, products summed in k order). load/store/mma are warp-synchronous (the _sync in their
// names): each is a warp barrier over the full warp, so a lane missing one is reported as a
// divergent warp intrinsic. A store is written by lane 0 alone, right after that barrier: the
// other lanes must __syncwarp() before reading what it stored, as on a GPU, and the race
// detector reports them if they do not.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <string.h>

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K> struct tile_dims;
template <int M, int N, int K> struct tile_dims<matrix_a, M, N, K> { enum { rows = M, cols = K }; };
template <int M, int N, int K> struct tile_dims<matrix_b, M, N, K> { enum { rows = K, cols = N }; };
template <int M, int N, int K> struct tile_dims<accumulator, M, N, K> { enum { rows = M, cols = N }; };

template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
    enum { rows = tile_dims<Use, M, N, K>::rows, cols = tile_dims<Use, M, N, K>::cols };
    static constexpr int num_elements = rows * cols;
    T x[num_elements];
};

inline float wmma_f(float x) { return x; }
inline float wmma_f(__nv_bfloat16 x) { return __bfloat162float(x); }
inline float wmma_f(__half x) { return __half2float(x); }
inline void wmma_sync_point() { cudasim::warp_barrier(0xffffffffu, cudasim::OP_WMMA); }

// element (r, c) of a tile in memory: row-major p[r·ldm + c], column-major p[c·ldm + r]
template <class F, class T> inline void wmma_load(F &f, const T *p, unsigned ldm, bool col) {
    wmma_sync_point();
    for (int r = 0; r < F::rows; r++)
        for (int c = 0; c < F::cols; c++) f.x[r * F::cols + c] = col ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c];
}
template <class Use, int M, int N, int K, class T>
inline void load_matrix_sync(fragment<Use, M, N, K, T, row_major> &f, const T *p, unsigned ldm) {
    wmma_load(f, p, ldm, false);
}
template <class Use, int M, int N, int K, class T>
inline void load_matrix_sync(fragment<Use, M, N, K, T, col_major> &f, const T *p, unsigned ldm) {
    wmma_load(f, p, ldm, true);
}
template <int M, int N, int K, class T>
inline void load_matrix_sync(fragment<accumulator, M, N, K, T> &f, const T *p, unsigned ldm, layout_t l) {
    wmma_load(f, p, ldm, l == mem_col_major);
}
template <int M, int N, int K, class T>
inline void store_matrix_sync(T *p, const fragment<accumulator, M, N, K, T> &f, unsigned ldm, layout_t l) {
    wmma_sync_point();
    if ((cudasim::cur->lin & 31) != 0) return;  // one writer: the tile is the same in every lane
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++)
            (l == mem_col_major ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c]) = f.x[r * N + c];
}
template <class Use, int M, int N, int K, class T, class L, class V>
inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, const V &v) {
    for (int i = 0; i < f.num_elements; i++) f.x[i] = (T)v;
}
// d = a·b + c, fp32 accumulation (d may alias c). Every lane holds the same tiles, so every lane
// would compute the same scalar GEMM: the first lane of a warp to arrive computes it and keeps
// its inputs and result (per warp slot of the block, per fragment type); a lane whose inputs are
// equal bit for bit copies the result. Equal inputs give equal outputs whatever the staleness
// of an entry, so this changes no result, only the emulator's time (32x fewer GEMMs).
template <int M, int N, int K, class TA, class LA, class TB, class LB, class TC>
inline void mma_sync(fragment<accumulator, M, N, K, TC> &d, const fragment<matrix_a, M, N, K, TA, LA> &a,
                     const fragment<matrix_b, M, N, K, TB, LB> &b, const fragment<accumulator, M, N, K, TC> &c) {
    wmma_sync_point();
    struct entry {
        bool valid;
        TA a[M * K];
        TB b[K * N];
        TC c[M * N], d[M * N];
    };
    static entry memo[32];  // a block has at most 32 warps
    entry &m = memo[(cudasim::cur->lin >> 5) & 31];
    if (m.valid && memcmp(m.a, a.x, sizeof m.a) == 0 && memcmp(m.b, b.x, sizeof m.b) == 0 &&
        memcmp(m.c, c.x, sizeof m.c) == 0) {
        memcpy(d.x, m.d, sizeof m.d);
        return;
    }
    float out[M * N];
    for (int r = 0; r < M; r++)
        for (int n = 0; n < N; n++) {
            float s = wmma_f(c.x[r * N + n]);
            for (int k = 0; k < K; k++) s += wmma_f(a.x[r * K + k]) * wmma_f(b.x[k * N + n]);
            out[r * N + n] = s;
        }
    memcpy(m.a, a.x, sizeof m.a), memcpy(m.b, b.x, sizeof m.b), memcpy(m.c, c.x, sizeof m.c);
    for (int i = 0; i < M * N; i++) d.x[i] = (TC)out[i];
    memcpy(m.d, d.x, sizeof m.d);
    m.valid = true;
}
}  // namespace wmma
}  // namespace nvcuda
