// tests/mpi/mpi_ops.c — the collectives of core/comm.h across real MPI ranks.
// Run by tests/mpi/run.sh as `mpirun -np N mpi_ops N`. Every rank checks its own results against
// values it computes alone (each rank can compute every rank's inputs); the counts of passed and
// failed checks are summed over ranks, rank 0 prints "mpi_ops np=N: P passed, F failed", and
// the exit code is 1 on every rank when any check failed.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm.h"
#include "core/common.h"

static int64_t passed, failed;
static int me = -1;

#define CHECK(cond, ...)                                                                       \
    do {                                                                                       \
        if (cond) {                                                                            \
            passed++;                                                                          \
        } else {                                                                               \
            failed++;                                                                          \
            fprintf(stderr, "rank %d: FAIL %s:%d: ", me, __FILE__, __LINE__);                  \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fputc('\n', stderr);                                                               \
        }                                                                                      \
    } while (0)

// Rank r's input element i: signs, magnitudes over 2^±10 and thirds, so the order of a sum
// shows in its last bits.
static float val(int r, size_t i) {
    uint64_t h = (uint64_t)(r + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)i * 0xC2B2AE3D27D4EB4Full;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    float m = (float)((int)(h % 2001) - 1000) / 3.0f;
    return ldexpf(m, (int)((h >> 16) % 21) - 10);
}

// Left fold in rank order, in f32: what EXACT promises bit for bit.
static float rank_order_sum(int n, size_t i) {
    float acc = val(0, i);
    for (int r = 1; r < n; r++) acc += val(r, i);
    return acc;
}

static void test_all_reduce(mt_comm *w) {
    int n = mt_comm_size(w);
    const size_t counts[] = {1, 3, 1000, 100003};
    for (size_t k = 0; k < MT_ARRAY_LEN(counts); k++) {
        size_t cnt = counts[k];
        float *x = mt_xmalloc(cnt * sizeof *x), *y = mt_xmalloc(cnt * sizeof *y);
        for (size_t i = 0; i < cnt; i++) x[i] = y[i] = val(me, i);
        mt_comm_all_reduce(w, x, cnt, MT_COMM_F32, MT_COMM_SUM, MT_COMM_EXACT);
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < cnt; i++) {
            float e = rank_order_sum(n, i);
            if (memcmp(&e, &x[i], sizeof e) != 0 && bad++ == 0) first = i;
        }
        CHECK(bad == 0, "exact f32 all_reduce of %zu: %zu elements differ from the rank-order sum "
              "(first %zu: %.9g vs %.9g)", cnt, bad, first, x[first], rank_order_sum(n, first));
        // The library's own sum: close to it, and (reported, not required) the same on all ranks.
        mt_comm_all_reduce(w, y, cnt, MT_COMM_F32, MT_COMM_SUM, 0);
        double worst = 0;
        for (size_t i = 0; i < cnt; i++) {
            double scale = 0;
            for (int r = 0; r < n; r++) scale += fabs(val(r, i));
            worst = fmax(worst, fabs((double)y[i] - rank_order_sum(n, i)) / (scale + 1e-30));
        }
        CHECK(worst < 1e-6, "native f32 all_reduce of %zu: relative error %g", cnt, worst);
        free(x);
        free(y);
    }
    // f64 fixed order, and the scalar helper.
    double d[7], e[7];
    for (int i = 0; i < 7; i++) {
        d[i] = (double)val(me, (size_t)i) / 7.0;
        e[i] = (double)val(0, (size_t)i) / 7.0;
        for (int r = 1; r < n; r++) e[i] += (double)val(r, (size_t)i) / 7.0;
    }
    mt_comm_all_reduce(w, d, 7, MT_COMM_F64, MT_COMM_SUM, MT_COMM_EXACT);
    CHECK(memcmp(d, e, sizeof d) == 0, "exact f64 all_reduce differs from the rank-order sum");
    double s = mt_comm_sum_f64(w, (double)val(me, 5) / 7.0);
    CHECK(memcmp(&s, &e[5], sizeof s) == 0, "mt_comm_sum_f64: %.17g vs %.17g", s, e[5]);
    // Integers, max, min.
    int64_t iv[3] = {me + 1, -(int64_t)me, (int64_t)1 << 40};
    mt_comm_all_reduce(w, iv, 3, MT_COMM_I64, MT_COMM_SUM, 0);
    CHECK(iv[0] == (int64_t)n * (n + 1) / 2 && iv[1] == -(int64_t)n * (n - 1) / 2 &&
              iv[2] == ((int64_t)n << 40),
          "i64 sum: %lld %lld %lld", (long long)iv[0], (long long)iv[1], (long long)iv[2]);
    float mx[2] = {(float)me, -(float)me}, mn[2] = {(float)me, -(float)me};
    mt_comm_all_reduce(w, mx, 2, MT_COMM_F32, MT_COMM_MAX, 0);
    mt_comm_all_reduce(w, mn, 2, MT_COMM_F32, MT_COMM_MIN, MT_COMM_EXACT);
    CHECK(mx[0] == n - 1 && mx[1] == 0 && mn[0] == 0 && mn[1] == -(n - 1),
          "f32 max/min: %g %g %g %g", mx[0], mx[1], mn[0], mn[1]);
    // bf16 (MPI has no type for it: always the fixed-order path, folded in f32, rounded once).
    enum { NB = 301 };
    uint16_t b[NB];
    for (size_t i = 0; i < NB; i++) b[i] = mt_f32_to_bf16(val(me, i));
    mt_comm_all_reduce(w, b, NB, MT_COMM_BF16, MT_COMM_SUM, 0);
    int bad = 0;
    for (size_t i = 0; i < NB; i++) {
        float acc = mt_bf16_to_f32(mt_f32_to_bf16(val(0, i)));
        for (int r = 1; r < n; r++) acc += mt_bf16_to_f32(mt_f32_to_bf16(val(r, i)));
        bad += b[i] != mt_f32_to_bf16(acc);
    }
    CHECK(bad == 0, "bf16 sum: %d of %d elements differ from the f32 rank-order fold", bad, NB);
    // Host helper = the same thing on an MPI comm.
    float h = val(me, 11);
    mt_comm_host_all_reduce(w, &h, 1, MT_COMM_F32, MT_COMM_SUM, MT_COMM_EXACT);
    float he = rank_order_sum(n, 11);
    CHECK(memcmp(&h, &he, sizeof h) == 0, "host_all_reduce: %.9g vs %.9g", h, he);
}

static void test_broadcast(mt_comm *w) {
    int n = mt_comm_size(w), root = n - 1;
    int32_t v[1000];
    for (int i = 0; i < 1000; i++) v[i] = me == root ? i * 7 - 3 : -1;
    mt_comm_broadcast(w, v, 1000, MT_COMM_I32, root, 0);
    int bad = 0;
    for (int i = 0; i < 1000; i++) bad += v[i] != i * 7 - 3;
    CHECK(bad == 0, "broadcast from rank %d: %d wrong elements", root, bad);
    double d[2] = {me == 0 ? 0.1 : 0, me == 0 ? -3e300 : 0};
    mt_comm_host_broadcast(w, d, 2, MT_COMM_F64, 0);
    CHECK(d[0] == 0.1 && d[1] == -3e300, "host_broadcast f64 from 0: %g %g", d[0], d[1]);
}

// ZeRO-1's pair: reduce_scatter the full gradient, all_gather the shards back.
static void test_reduce_scatter_all_gather(mt_comm *w) {
    int n = mt_comm_size(w);
    const size_t per = 37, full = per * (size_t)n;
    float *g = mt_xmalloc(full * sizeof *g), *shard = mt_xmalloc(per * sizeof *shard);
    float *back = mt_xmalloc(full * sizeof *back), *ref = mt_xmalloc(full * sizeof *ref);
    for (size_t i = 0; i < full; i++) g[i] = ref[i] = val(me, i);
    mt_comm_all_reduce(w, ref, full, MT_COMM_F32, MT_COMM_SUM, MT_COMM_EXACT);

    mt_comm_reduce_scatter(w, g, shard, per, MT_COMM_F32, MT_COMM_SUM, MT_COMM_EXACT);
    int bad = 0;
    for (size_t i = 0; i < per; i++) {
        float e = rank_order_sum(n, (size_t)me * per + i);
        bad += memcmp(&e, &shard[i], sizeof e) != 0;
    }
    CHECK(bad == 0, "exact reduce_scatter: %d of %zu shard elements differ", bad, per);
    mt_comm_all_gather(w, shard, back, per, MT_COMM_F32, 0);
    CHECK(memcmp(back, ref, full * sizeof *ref) == 0,
          "reduce_scatter + all_gather != exact all_reduce (bitwise)");

    // In place: the shard inside the full buffer, both ways.
    for (size_t i = 0; i < full; i++) g[i] = val(me, i);
    float *mine = g + (size_t)me * per;
    mt_comm_reduce_scatter(w, g, mine, per, MT_COMM_F32, MT_COMM_SUM, MT_COMM_EXACT);
    mt_comm_all_gather(w, mine, g, per, MT_COMM_F32, 0);
    CHECK(memcmp(g, ref, full * sizeof *ref) == 0, "in-place round trip != exact all_reduce");

    // Native reduce_scatter (separate and in place): within rounding of the exact one.
    for (size_t i = 0; i < full; i++) g[i] = val(me, i);
    mt_comm_reduce_scatter(w, g, shard, per, MT_COMM_F32, MT_COMM_SUM, 0);
    double worst = 0;
    for (size_t i = 0; i < per; i++) {
        size_t j = (size_t)me * per + i;
        double scale = 1e-30;
        for (int r = 0; r < n; r++) scale += fabs(val(r, j));
        worst = fmax(worst, fabs(shard[i] - ref[j]) / scale);
    }
    mt_comm_reduce_scatter(w, g, mine, per, MT_COMM_F32, MT_COMM_SUM, 0);
    for (size_t i = 0; i < per; i++) {
        size_t j = (size_t)me * per + i;
        double scale = 1e-30;
        for (int r = 0; r < n; r++) scale += fabs(val(r, j));
        worst = fmax(worst, fabs(mine[i] - ref[j]) / scale);
    }
    CHECK(worst < 1e-6, "native reduce_scatter: relative error %g", worst);

    // i32 gather of ranks.
    int32_t r32 = me * 10, all[64];
    mt_comm_all_gather(w, &r32, all, 1, MT_COMM_I32, 0);
    bad = 0;
    for (int r = 0; r < n; r++) bad += all[r] != r * 10;
    CHECK(bad == 0, "all_gather of ranks");
    free(g), free(shard), free(back), free(ref);
}

// Rows this rank `src` sends to `dst`: zero for some pairs.
static int64_t rows_between(int src, int dst) { return (src + 2 * dst + 1) % 3; }
static float cell(int src, int dst, int64_t row, int col) {
    return (float)(src * 10000 + dst * 1000 + row * 10 + col);
}

static void test_all_to_all_v(mt_comm *w) {
    int n = mt_comm_size(w);
    enum { COLS = 5 };
    int64_t *srows = mt_xcalloc((size_t)n, 8), *rrows = mt_xcalloc((size_t)n, 8);
    int64_t ns = 0, nr_expect = 0;
    int zeros = 0;
    for (int p = 0; p < n; p++) {
        srows[p] = rows_between(me, p);
        ns += srows[p];
        nr_expect += rows_between(p, me);
        zeros += srows[p] == 0;
    }
    mt_comm_all_to_all_counts(w, srows, rrows);
    int bad = 0;
    for (int q = 0; q < n; q++) bad += rrows[q] != rows_between(q, me);
    CHECK(bad == 0, "all_to_all_counts: %d wrong", bad);
    int any_zero = mt_comm_any(w, zeros > 0);
    CHECK(any_zero, "the counts include no zero (the test would not cover it)");

    float *send = mt_xcalloc((size_t)ns * COLS + 1, sizeof *send);
    float *recv = mt_xcalloc((size_t)nr_expect * COLS + 1, sizeof *recv);
    size_t at = 0;
    for (int p = 0; p < n; p++)
        for (int64_t row = 0; row < srows[p]; row++)
            for (int col = 0; col < COLS; col++) send[at++] = cell(me, p, row, col);
    mt_comm_all_to_all_v(w, send, srows, recv, rrows, COLS, MT_COMM_F32, 0);
    at = 0;
    bad = 0;
    for (int q = 0; q < n; q++)
        for (int64_t row = 0; row < rrows[q]; row++)
            for (int col = 0; col < COLS; col++) bad += recv[at++] != cell(q, me, row, col);
    CHECK(bad == 0, "all_to_all_v: %d wrong elements of %lld", bad, (long long)nr_expect * COLS);

    // Everything to one peer, nothing elsewhere (an expert with all the tokens).
    for (int p = 0; p < n; p++) srows[p] = p == 0 ? 3 : 0;
    mt_comm_all_to_all_counts(w, srows, rrows);
    float big[3 * COLS], *got = mt_xcalloc((size_t)3 * COLS * (size_t)n, sizeof *got);
    for (int i = 0; i < 3 * COLS; i++) big[i] = (float)(me * 100 + i);
    mt_comm_all_to_all_v(w, big, srows, got, rrows, COLS, MT_COMM_F32, 0);
    bad = 0;
    if (me == 0) {
        for (int q = 0; q < n; q++)
            for (int i = 0; i < 3 * COLS; i++) bad += got[q * 3 * COLS + i] != (float)(q * 100 + i);
    } else {
        for (int q = 0; q < n; q++) bad += rrows[q] != 0;
    }
    CHECK(bad == 0, "all_to_all_v to one peer: %d wrong", bad);
    free(got), free(send), free(recv), free(srows), free(rrows);
}

static void test_split(mt_comm *w) {
    int n = mt_comm_size(w);
    // Two colors, reversed keys: the new rank follows the key.
    mt_comm *s = mt_comm_split(w, me % 2, -me, "odd-even");
    int members = 0, above = 0;
    for (int r = me % 2; r < n; r += 2) members++, above += r > me;
    CHECK(mt_comm_size(s) == members && mt_comm_rank(s) == above,
          "split by parity: size %d rank %d, expected %d %d", mt_comm_size(s), mt_comm_rank(s),
          members, above);
    CHECK(strcmp(mt_comm_name(s), "odd-even") == 0 && mt_comm_world_rank(s) == me,
          "split name/world rank");
    int64_t sum = me;
    mt_comm_all_reduce(s, &sum, 1, MT_COMM_I64, MT_COMM_SUM, 0);
    int64_t esum = 0;
    for (int r = me % 2; r < n; r += 2) esum += r;
    CHECK(sum == esum, "all_reduce in a split: %lld vs %lld", (long long)sum, (long long)esum);
    mt_comm_free(s);

    // EP × DP grid.
    mt_comm *ep, *dp;
    int ep_size = n % 2 == 0 ? 2 : 1;
    CHECK(mt_comm_grid(w, ep_size, &ep, &dp) == 0, "grid ep=%d: %s", ep_size, mt_error_get());
    CHECK(mt_comm_size(ep) == ep_size && mt_comm_rank(ep) == me % ep_size &&
              mt_comm_size(dp) == n / ep_size && mt_comm_rank(dp) == me / ep_size,
          "grid: ep %d/%d dp %d/%d", mt_comm_rank(ep), mt_comm_size(ep), mt_comm_rank(dp),
          mt_comm_size(dp));
    int64_t e = me, d = me;
    mt_comm_all_reduce(ep, &e, 1, MT_COMM_I64, MT_COMM_SUM, 0);
    mt_comm_all_reduce(dp, &d, 1, MT_COMM_I64, MT_COMM_SUM, 0);
    int64_t ee = 0, de = 0;
    for (int r = 0; r < n; r++) {
        if (r / ep_size == me / ep_size) ee += r;
        if (r % ep_size == me % ep_size) de += r;
    }
    CHECK(e == ee && d == de, "grid sums: ep %lld (%lld) dp %lld (%lld)", (long long)e,
          (long long)ee, (long long)d, (long long)de);
    // Collectives on the two interleave with ones on the world without confusion.
    float x = val(me, 1);
    mt_comm_all_reduce(w, &x, 1, MT_COMM_F32, MT_COMM_SUM, MT_COMM_EXACT);
    float xe = rank_order_sum(n, 1);
    CHECK(memcmp(&x, &xe, 4) == 0, "world all_reduce after the grid");
    mt_comm_free(ep);
    mt_comm_free(dp);
    mt_comm *a, *b;
    CHECK(mt_comm_grid(w, 3, &a, &b) == -1 && strstr(mt_error_get(), "does not divide"),
          "grid ep=3 of %d ranks must be refused: %s", n, mt_error_get());
}

static void test_helpers(mt_comm *w) {
    int n = mt_comm_size(w);
    CHECK(mt_comm_any(w, me == n - 1) == 1, "any: the last rank's flag");
    CHECK(mt_comm_any(w, 0) == 0, "any: nobody's flag");
    CHECK(mt_comm_check_same(w, "config", 0x1234) == 0, "check_same with equal hashes: %s",
          mt_error_get());
    mt_comm_barrier(w);
    passed++;
}

int main(int argc, char **argv) {
    mt_comm *w = mt_comm_init(MT_COMM_AUTO, NULL);
    if (!w) mt_fatal(MT_EXIT_ERROR, "%s", mt_error_get());
    me = mt_comm_rank(w);
    int n = mt_comm_size(w);
    int want = argc > 1 ? atoi(argv[1]) : n;
    CHECK(mt_comm_kind_of(w) == MT_COMM_MPI && n == want && mt_comm_launched(),
          "init: kind %s size %d (want mpi, %d)", mt_comm_kind_name(mt_comm_kind_of(w)), n, want);
    test_all_reduce(w);
    test_broadcast(w);
    test_reduce_scatter_all_gather(w);
    test_all_to_all_v(w);
    test_split(w);
    test_helpers(w);
    int64_t tot[2] = {passed, failed};
    mt_comm_all_reduce(w, tot, 2, MT_COMM_I64, MT_COMM_SUM, 0);
    if (me == 0)
        printf("mpi_ops np=%d%s: %lld passed, %lld failed\n", n,
               getenv("MT_COMM_CHECK") ? " (MT_COMM_CHECK=1)" : "", (long long)tot[0],
               (long long)tot[1]);
    mt_comm_free(w);
    return tot[1] ? 1 : 0;
}
