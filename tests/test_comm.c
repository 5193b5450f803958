// core/comm on one process: every collective is the identity or a copy, splits and the grid,
// the flag, launch detection, settings from the environment, the fold behind MT_COMM_EXACT.
// Multi-rank behaviour is tested by tests/mpi (make test-mpi): Criterion forks, MPI does not.
#include <criterion/criterion.h>
#include <string.h>

#include "tests/gpu_or_skip.h"
#include "core/comm.h"
#include "core/comm_internal.h"
#include "core/common.h"

static const char *const launcher_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE",
                                            "PMI_RANK", "SLURM_STEP_NUM_TASKS", "MT_COMM",
                                            "MT_COMM_TIMEOUT", "MT_COMM_CHECK"};

// Each Criterion test runs in its own process, so the environment can be changed freely.
static void clean_env(void) {
    for (size_t i = 0; i < MT_ARRAY_LEN(launcher_vars); i++) unsetenv(launcher_vars[i]);
}

static mt_comm *single(void) {
    clean_env();
    mt_comm *c = mt_comm_init(MT_COMM_SINGLE, NULL);
    cr_assert_not_null(c, "%s", mt_error_get());
    return c;
}

Test(comm, single_world) {
    mt_comm *c = single();
    cr_assert_eq(mt_comm_rank(c), 0);
    cr_assert_eq(mt_comm_size(c), 1);
    cr_assert_eq(mt_comm_world_rank(c), 0);
    cr_assert_eq(mt_comm_kind_of(c), MT_COMM_SINGLE);
    cr_assert_str_eq(mt_comm_name(c), "world");
    cr_assert_eq(mt_comm_timeout(c), 600.0, "default deadline");
    mt_comm_wait(c);
    mt_comm_sync(c);
    mt_comm_free(c);
    mt_comm_free(NULL);
}

Test(comm, auto_without_launcher_is_single) {
    clean_env();
    cr_assert_eq(mt_comm_launched(), 0);
    mt_comm *c = mt_comm_init(MT_COMM_AUTO, NULL);
    cr_assert_not_null(c, "%s", mt_error_get());
    cr_assert_eq(mt_comm_kind_of(c), MT_COMM_SINGLE);
    mt_comm_free(c);
}

Test(comm, launch_detection) {
    clean_env();
    setenv("SLURM_NTASKS", "4", 1);  // a batch script sees it too: not a launch by itself
    cr_assert_eq(mt_comm_launched(), 0);
    setenv("SLURM_STEP_NUM_TASKS", "4", 1);
    cr_assert_eq(mt_comm_launched(), 1);
    clean_env();
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    cr_assert_eq(mt_comm_launched(), 1);
    clean_env();
    setenv("PMIX_RANK", "0", 1);
    cr_assert_eq(mt_comm_launched(), 1);
    unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
    unsetenv("MPI_LOCALRANKID");
    unsetenv("SLURM_LOCALID");
    unsetenv("PMI_LOCAL_RANK");
    cr_assert_eq(mt_comm_local_rank(), 0);
    setenv("SLURM_LOCALID", "5", 1);
    cr_assert_eq(mt_comm_local_rank(), 5);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1);
    cr_assert_eq(mt_comm_local_rank(), 3, "Open MPI's variable first");
}

Test(comm, environment_settings) {
    clean_env();
    setenv("MT_COMM", "single", 1);
    setenv("MT_COMM_TIMEOUT", "2.5", 1);
    mt_comm *c = mt_comm_init(MT_COMM_AUTO, NULL);
    cr_assert_not_null(c, "%s", mt_error_get());
    cr_assert_eq(mt_comm_kind_of(c), MT_COMM_SINGLE);
    cr_assert_eq(mt_comm_timeout(c), 2.5);
    mt_comm_set_timeout(c, 0);
    cr_assert_eq(mt_comm_timeout(c), 0);
    mt_comm *s = mt_comm_split(c, 0, 0, "ep");
    cr_assert_eq(mt_comm_timeout(s), 0, "a split inherits the deadline");
    mt_comm_free(s);
    mt_comm_free(c);

    setenv("MT_COMM", "bogus", 1);
    cr_assert_null(mt_comm_init(MT_COMM_AUTO, NULL));
    cr_assert(strstr(mt_error_get(), "MT_COMM: unknown communicator 'bogus'"), "%s",
              mt_error_get());
    setenv("MT_COMM", "single", 1);
    const char *bad[] = {"abc", "-1", "5s", "nan", ""};
    for (size_t i = 0; i < MT_ARRAY_LEN(bad) - 1; i++) {
        setenv("MT_COMM_TIMEOUT", bad[i], 1);
        cr_assert_null(mt_comm_init(MT_COMM_AUTO, NULL), "MT_COMM_TIMEOUT=%s accepted", bad[i]);
        cr_assert(strstr(mt_error_get(), "MT_COMM_TIMEOUT"), "%s", mt_error_get());
    }
}

Test(comm, kinds_and_types) {
    mt_comm_kind k;
    cr_assert_eq(mt_comm_kind_parse("nccl", &k), 0);
    cr_assert_eq(k, MT_COMM_NCCL);
    cr_assert_eq(mt_comm_kind_parse("mpi", &k), 0);
    cr_assert_eq(k, MT_COMM_MPI);
    cr_assert_eq(mt_comm_kind_parse("gloo", &k), -1);
    cr_assert_str_eq(mt_comm_kind_name(MT_COMM_SINGLE), "single");
    mt_comm_type t;
    cr_assert_eq(mt_comm_type_of(MT_BF16, &t), 0);
    cr_assert_eq(t, MT_COMM_BF16);
    cr_assert_eq(mt_comm_type_of(MT_Q4, &t), -1, "packed 4-bit has no element type");
    cr_assert_eq(mt_comm_type_size(MT_COMM_F64), 8);
    cr_assert_eq(mt_comm_type_size(MT_COMM_BF16), 2);
    cr_assert_str_eq(mt_comm_type_name(MT_COMM_I64), "i64");
}

Test(comm, nccl_needs_a_cuda_backend) {
    clean_env();
    cr_assert_null(mt_comm_init(MT_COMM_NCCL, NULL));
    cr_assert(strstr(mt_error_get(), "CUDA"), "%s", mt_error_get());
}

Test(comm, reductions_and_broadcast_are_identity) {
    mt_comm *c = single();
    float f[5] = {1.5f, -2.25f, 3e-30f, 1e30f, 0.1f}, f0[5];
    memcpy(f0, f, sizeof f);
    for (int op = 0; op < MT_COMM_OP_COUNT; op++)
        for (int flags = 0; flags <= (MT_COMM_EXACT | MT_COMM_ASYNC); flags++) {
            mt_comm_all_reduce(c, f, 5, MT_COMM_F32, (mt_comm_op)op, flags);
            mt_comm_host_all_reduce(c, f, 5, MT_COMM_F32, (mt_comm_op)op, flags);
            cr_assert_eq(memcmp(f, f0, sizeof f), 0, "op %d flags %d", op, flags);
        }
    uint16_t b[3] = {0x3f80, 0xc000, 0x7fc0};
    mt_comm_all_reduce(c, b, 3, MT_COMM_BF16, MT_COMM_SUM, MT_COMM_EXACT);
    cr_assert(b[0] == 0x3f80 && b[1] == 0xc000 && b[2] == 0x7fc0);
    int64_t i[2] = {-7, (int64_t)1 << 50};
    mt_comm_all_reduce(c, i, 2, MT_COMM_I64, MT_COMM_SUM, 0);
    mt_comm_broadcast(c, i, 2, MT_COMM_I64, 0, 0);
    mt_comm_host_broadcast(c, i, 2, MT_COMM_I64, 0);
    cr_assert(i[0] == -7 && i[1] == (int64_t)1 << 50);
    mt_comm_all_reduce(c, NULL, 0, MT_COMM_F32, MT_COMM_SUM, 0);  // nothing to do, no buffer
    double x = 0.1;
    double s = mt_comm_sum_f64(c, x);
    cr_assert_eq(memcmp(&s, &x, sizeof x), 0);
    mt_comm_free(c);
}

Test(comm, scatter_gather_copy) {
    mt_comm *c = single();
    float g[6] = {1, 2, 3, 4, 5, 6}, shard[6] = {0}, full[6] = {0};
    mt_comm_reduce_scatter(c, g, shard, 6, MT_COMM_F32, MT_COMM_SUM, MT_COMM_EXACT);
    cr_assert_eq(memcmp(shard, g, sizeof g), 0);
    mt_comm_all_gather(c, shard, full, 6, MT_COMM_F32, 0);
    cr_assert_eq(memcmp(full, g, sizeof g), 0);
    // In place: rank 0's chunk is the whole buffer.
    mt_comm_reduce_scatter(c, g, g, 6, MT_COMM_F32, MT_COMM_SUM, 0);
    mt_comm_all_gather(c, g, g, 6, MT_COMM_F32, 0);
    cr_assert(g[0] == 1 && g[5] == 6);
    mt_comm_free(c);
}

Test(comm, all_to_all_v_copies_rows) {
    mt_comm *c = single();
    int64_t send_rows[1] = {3}, recv_rows[1] = {-1};
    mt_comm_all_to_all_counts(c, send_rows, recv_rows);
    cr_assert_eq(recv_rows[0], 3);
    uint16_t in[3 * 4], out[3 * 4] = {0};
    for (int k = 0; k < 12; k++) in[k] = (uint16_t)(k * 3 + 1);
    mt_comm_all_to_all_v(c, in, send_rows, out, recv_rows, 4, MT_COMM_BF16, 0);
    cr_assert_eq(memcmp(in, out, sizeof in), 0);
    int64_t none[1] = {0};
    mt_comm_all_to_all_v(c, NULL, none, NULL, none, 4, MT_COMM_BF16, 0);  // zero rows
    mt_comm_free(c);
}

Test(comm, all_to_all_v_mismatch_is_fatal, .exit_code = MT_EXIT_ERROR) {
    mt_comm *c = single();
    int64_t s[1] = {2}, r[1] = {3};
    float in[8] = {0}, out[12];
    mt_comm_all_to_all_v(c, in, s, out, r, 4, MT_COMM_F32, 0);
}

Test(comm, bad_root_is_fatal, .exit_code = MT_EXIT_ERROR) {
    mt_comm *c = single();
    float x = 1;
    mt_comm_broadcast(c, &x, 1, MT_COMM_F32, 1, 0);
}

Test(comm, null_buffer_is_fatal, .exit_code = MT_EXIT_ERROR) {
    mt_comm *c = single();
    mt_comm_all_reduce(c, NULL, 4, MT_COMM_F32, MT_COMM_SUM, 0);
}

Test(comm, abort_exits_with_its_code, .exit_code = 7) {
    mt_comm *c = single();
    mt_comm_abort(c, 7, "disk full on this rank (test)");
}

Test(comm, flag_barrier_check_same) {
    mt_comm *c = single();
    cr_assert_eq(mt_comm_any(c, 0), 0);
    cr_assert_eq(mt_comm_any(c, 42), 1);
    cr_assert_eq(mt_comm_any(c, -1), 1);
    mt_comm_barrier(c);
    cr_assert_eq(mt_comm_check_same(c, "config", 0xdeadbeef), 0);
    mt_comm_free(c);
}

Test(comm, split_and_grid) {
    mt_comm *c = single();
    mt_comm *s = mt_comm_split(c, 3, -5, "dp");
    cr_assert_eq(mt_comm_size(s), 1);
    cr_assert_eq(mt_comm_rank(s), 0);
    cr_assert_str_eq(mt_comm_name(s), "dp");
    cr_assert_eq(mt_comm_kind_of(s), MT_COMM_SINGLE);
    float x = 2;
    mt_comm_all_reduce(s, &x, 1, MT_COMM_F32, MT_COMM_SUM, 0);
    cr_assert_eq(x, 2);
    mt_comm_free(s);

    mt_comm *ep, *dp;
    cr_assert_eq(mt_comm_grid(c, 1, &ep, &dp), 0);
    cr_assert_eq(mt_comm_size(ep), 1);
    cr_assert_eq(mt_comm_size(dp), 1);
    cr_assert_str_eq(mt_comm_name(ep), "ep");
    cr_assert_str_eq(mt_comm_name(dp), "dp");
    mt_comm_free(ep);
    mt_comm_free(dp);
    cr_assert_eq(mt_comm_grid(c, 2, &ep, &dp), -1);
    cr_assert(strstr(mt_error_get(), "--ep 2 does not divide the 1 ranks"), "%s", mt_error_get());
    cr_assert_null(ep);
    cr_assert_eq(mt_comm_grid(c, 0, &ep, &dp), -1);
    mt_comm_free(c);
}

Test(comm, check_mode_on_one_rank) {
    clean_env();
    setenv("MT_COMM_CHECK", "1", 1);
    mt_comm *c = mt_comm_init(MT_COMM_SINGLE, NULL);
    cr_assert_not_null(c);
    float x[3] = {1, 2, 3};
    mt_comm_all_reduce(c, x, 3, MT_COMM_F32, MT_COMM_SUM, 0);
    int64_t r[1] = {1};
    mt_comm_all_to_all_v(c, x, r, x, r, 3, MT_COMM_F32, 0);
    cr_assert(x[0] == 1 && x[2] == 3);
    mt_comm_free(c);
}

// --- The fold behind MT_COMM_EXACT (shared by every fixed-order path on the host) ----------

Test(comm, parts_cover_the_buffer) {
    const size_t ns[] = {0, 1, 3, 4, 7, 1000003};
    for (size_t k = 0; k < MT_ARRAY_LEN(ns); k++)
        for (int size = 1; size <= 8; size++) {
            size_t at = 0, lo = (size_t)-1, hi = 0;
            for (int r = 0; r < size; r++) {
                cr_assert_eq(comm_part_off(ns[k], size, r), at, "n %zu size %d part %d", ns[k],
                             size, r);
                size_t len = comm_part_len(ns[k], size, r);
                at += len;
                lo = MT_MIN(lo, len), hi = MT_MAX(hi, len);
            }
            cr_assert_eq(at, ns[k]);
            cr_assert_leq(hi - lo, 1, "parts as even as possible");
        }
}

Test(comm, fold_is_left_to_right_in_rank_order) {
    // Rows chosen so that the order of the additions changes the f32 result.
    float rows[3][2] = {{1e8f, 1.0f}, {1.0f, 1e8f}, {-1e8f, -1e8f}};
    float dst[2];
    comm_fold(dst, rows, 3, 2, 2, MT_COMM_F32, MT_COMM_SUM);
    float e0 = (1e8f + 1.0f) + -1e8f, e1 = (1.0f + 1e8f) + -1e8f;
    cr_assert_eq(memcmp(&dst[0], &e0, 4), 0, "%g vs %g", dst[0], e0);
    cr_assert_eq(memcmp(&dst[1], &e1, 4), 0);
    cr_assert_eq(dst[0], 0.0f, "(1e8 + 1) rounds to 1e8 first");
    float mx[2], mn[2];
    comm_fold(mx, rows, 3, 2, 2, MT_COMM_F32, MT_COMM_MAX);
    comm_fold(mn, rows, 3, 2, 2, MT_COMM_F32, MT_COMM_MIN);
    cr_assert(mx[0] == 1e8f && mx[1] == 1e8f && mn[0] == -1e8f && mn[1] == -1e8f);
    // In place into the first row (what the reduce-scatter's fold may do).
    comm_fold(rows[0], rows, 3, 2, 2, MT_COMM_F32, MT_COMM_SUM);
    cr_assert_eq(rows[0][0], e0);
}

Test(comm, fold_bf16_rounds_once) {
    // 1 + 2^-8 + 2^-8: rounding to bf16 after each add (a tie, to even: 1) would lose both.
    uint16_t rows[3] = {mt_f32_to_bf16(1.0f), mt_f32_to_bf16(0x1p-8f), mt_f32_to_bf16(0x1p-8f)};
    uint16_t dst;
    comm_fold(&dst, rows, 3, 1, 1, MT_COMM_BF16, MT_COMM_SUM);
    cr_assert_eq(dst, mt_f32_to_bf16(1.0f + 0x1p-7f), "got %#x", dst);
    cr_assert_neq(dst, mt_f32_to_bf16(1.0f));
    int64_t ir[2] = {INT64_C(1) << 62, -(INT64_C(1) << 62) + 5}, id;
    comm_fold(&id, ir, 2, 1, 1, MT_COMM_I64, MT_COMM_SUM);
    cr_assert_eq(id, 5);
    uint8_t u[2] = {200, 100}, ud;
    comm_fold(&ud, u, 2, 1, 1, MT_COMM_U8, MT_COMM_SUM);
    cr_assert_eq(ud, 44, "u8 sums wrap");
    double d[3] = {0.1, 0.2, 0.3}, dd;
    comm_fold(&dd, d, 3, 1, 1, MT_COMM_F64, MT_COMM_SUM);
    double de = (0.1 + 0.2) + 0.3;
    cr_assert_eq(memcmp(&dd, &de, 8), 0);
}

Test(comm, exact_scratch_is_in_the_ledger) {
    clean_env();
    mt_backend *be = mt_backend_cpu_new();
    mt_comm *c = mt_comm_init(MT_COMM_SINGLE, be);
    cr_assert_not_null(c);
    void *p = comm_host_scratch(c, 4096);
    cr_assert_eq(be->ledger.cur[MT_MEM_COMM], 4096);
    comm_host_scratch_free(c, p, 4096);
    cr_assert_eq(be->ledger.cur[MT_MEM_COMM], 0);
    mt_comm_free(c);
    mt_backend_free(be);
}

// --- NCCL on one GPU: the only NCCL test that can run on a single lent GPU ------------------

static void *dev(mt_backend *be, const void *host, size_t bytes) {
    void *p;
    cr_assert_eq(mt_backend_alloc(be, MT_MEM_WORK, bytes, &p), 0, "%s", mt_error_get());
    if (host) be->ops->upload(be, p, host, bytes);
    return p;
}

Test(comm, nccl_one_rank) {
    mt_backend *be = gpu_or_skip();
    clean_env();
    setenv("MT_COMM_TIMEOUT", "60", 1);
    mt_comm *c = mt_comm_init(MT_COMM_AUTO, be);
    cr_assert_not_null(c, "%s", mt_error_get());
    cr_assert_eq(mt_comm_kind_of(c), MT_COMM_NCCL, "a CUDA backend gets nccl");
    cr_assert_eq(mt_comm_size(c), 1);
    enum { N = 1000 };
    float h[N], back[N];
    for (int i = 0; i < N; i++) h[i] = (float)i * 0.37f - 100.0f;
    float *x = dev(be, h, sizeof h), *y = dev(be, NULL, sizeof h);
    for (int flags = 0; flags <= (MT_COMM_EXACT | MT_COMM_ASYNC); flags++) {
        mt_comm_all_reduce(c, x, N, MT_COMM_F32, MT_COMM_SUM, flags);
        mt_comm_wait(c);
    }
    mt_comm_broadcast(c, x, N, MT_COMM_F32, 0, 0);
    mt_comm_reduce_scatter(c, x, y, N, MT_COMM_F32, MT_COMM_SUM, MT_COMM_EXACT);
    mt_comm_all_gather(c, y, y, N, MT_COMM_F32, 0);
    int64_t rows[1] = {N / 10};
    mt_comm_all_to_all_v(c, y, rows, x, rows, 10, MT_COMM_F32, 0);
    mt_comm_sync(c);
    be->ops->download(be, back, x, sizeof back);
    cr_assert_eq(memcmp(back, h, sizeof h), 0, "one rank: every collective is the identity");
    mt_comm *ep, *dp;
    cr_assert_eq(mt_comm_grid(c, 1, &ep, &dp), 0);
    cr_assert_eq(mt_comm_kind_of(ep), MT_COMM_NCCL);
    mt_comm_all_reduce(ep, x, N, MT_COMM_F32, MT_COMM_MAX, 0);
    mt_comm_free(ep);
    mt_comm_free(dp);
    cr_assert_eq(mt_comm_any(c, 1), 1);
    cr_assert_eq(mt_comm_check_same(c, "config", 7), 0);
    mt_comm_free(c);
    mt_backend_release(be, MT_MEM_WORK, sizeof h, x);
    mt_backend_release(be, MT_MEM_WORK, sizeof h, y);
    cr_assert_eq(be->ledger.cur[MT_MEM_COMM], 0, "EXACT's scratch released with the comm");
    mt_backend_free(be);
}
