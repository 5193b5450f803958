// Ledger accounting on the null and cpu backends.
#include <criterion/criterion.h>
#include <string.h>

#include "core/backend.h"
#include "core/common.h"

Test(ledger, null_backend_counts_every_byte) {
    mt_backend *be = mt_backend_null_new();
    int64_t big[2] = {14336, 4096};  // a Mixtral expert's w1 in bf16: 117 MB that never exist
    mt_tensor *w = mt_tensor_new(be, MT_MEM_BASE, MT_BF16, 2, big);
    cr_assert_not_null(w);
    cr_assert_null(w->data, "the null backend must not allocate");
    cr_assert_eq(be->ledger.cur[MT_MEM_BASE], 14336ull * 4096 * 2);
    int64_t gshape[1] = {1000};
    mt_tensor *g = mt_tensor_new(be, MT_MEM_GRAD, MT_F32, 1, gshape);
    cr_assert_eq(be->ledger.cur[MT_MEM_GRAD], 4000);
    cr_assert_eq(be->ledger.total_cur, 14336ull * 4096 * 2 + 4000);
    mt_tensor_free(w);
    cr_assert_eq(be->ledger.cur[MT_MEM_BASE], 0);
    cr_assert_eq(be->ledger.peak[MT_MEM_BASE], 14336ull * 4096 * 2, "peak survives the free");
    cr_assert_eq(be->ledger.total_peak, 14336ull * 4096 * 2 + 4000);
    mt_tensor_free(g);
    cr_assert_eq(be->ledger.total_cur, 0);
    mt_backend_free(be);
}

Test(ledger, peak_is_peak_of_sum_not_sum_of_peaks) {
    mt_ledger l;
    mt_ledger_init(&l, 0);
    cr_assert_eq(mt_ledger_reserve(&l, MT_MEM_ACT, 100), 0);
    mt_ledger_release(&l, MT_MEM_ACT, 100);
    cr_assert_eq(mt_ledger_reserve(&l, MT_MEM_WORK, 60), 0);
    cr_assert_eq(l.peak[MT_MEM_ACT], 100);
    cr_assert_eq(l.peak[MT_MEM_WORK], 60);
    cr_assert_eq(l.total_peak, 100, "act and work never coexisted");
    mt_ledger_reset_peak(&l);
    cr_assert_eq(l.total_peak, 60);
    cr_assert_eq(l.peak[MT_MEM_ACT], 0);
}

Test(ledger, limit_refuses_with_bytes_and_category) {
    mt_backend *be = mt_backend_null_new();
    be->ledger.limit = 1000;
    int64_t s[1] = {200};
    mt_tensor *a = mt_tensor_new(be, MT_MEM_TRAIN, MT_F32, 1, s);  // 800 B
    cr_assert_not_null(a);
    mt_tensor *b = mt_tensor_new(be, MT_MEM_OPTIM, MT_F32, 1, s);  // 800 B more: over
    cr_assert_null(b);
    cr_assert(strstr(mt_error_get(), "800 bytes"), "got: %s", mt_error_get());
    cr_assert(strstr(mt_error_get(), "optim"), "got: %s", mt_error_get());
    cr_assert_eq(be->ledger.cur[MT_MEM_OPTIM], 0, "a refused reservation leaves no trace");
    mt_tensor_free(a);
    mt_backend_free(be);
}

Test(ledger, injected_failure_on_nth_allocation) {
    mt_backend *be = mt_backend_cpu_new();
    be->ledger.fail_at = 3;
    int64_t s[1] = {16};
    mt_tensor *t1 = mt_tensor_new(be, MT_MEM_ACT, MT_F32, 1, s);
    mt_tensor *t2 = mt_tensor_new(be, MT_MEM_ACT, MT_F32, 1, s);
    mt_tensor *t3 = mt_tensor_new(be, MT_MEM_ACT, MT_F32, 1, s);
    mt_tensor *t4 = mt_tensor_new(be, MT_MEM_ACT, MT_F32, 1, s);
    cr_assert(t1 && t2 && !t3 && t4);
    cr_assert(strstr(mt_error_get(), "injected"), "got: %s", mt_error_get());
    cr_assert_eq(be->ledger.cur[MT_MEM_ACT], 3 * 64);
    mt_tensor_free(t1), mt_tensor_free(t2), mt_tensor_free(t4);
    cr_assert_eq(be->ledger.total_cur, 0);
    mt_backend_free(be);
}

Test(ledger, cpu_matmul_work_buffers_are_counted_and_returned) {
    mt_backend *be = mt_backend_cpu_new();
    int64_t sa[2] = {3, 4}, sb[2] = {4, 2}, sc[2] = {3, 2};
    mt_tensor *a = mt_tensor_new(be, MT_MEM_ACT, MT_BF16, 2, sa);
    mt_tensor *b = mt_tensor_new(be, MT_MEM_BASE, MT_BF16, 2, sb);
    mt_tensor *c = mt_tensor_new(be, MT_MEM_ACT, MT_F32, 2, sc);
    uint16_t ha[12], hb[8];
    for (int i = 0; i < 12; i++) ha[i] = mt_f32_to_bf16((float)i);
    for (int i = 0; i < 8; i++) hb[i] = mt_f32_to_bf16((float)(i % 3) - 1.0f);
    mt_tensor_upload(a, ha);
    mt_tensor_upload(b, hb);
    cr_assert_eq(mt_matmul(c, a, b, 0, 0, 1.0f, 0.0f), 0, "%s", mt_error_get());
    float hc[6];
    mt_tensor_download(c, hc);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) {
            float ref = 0;
            for (int k = 0; k < 4; k++) ref += (float)(i * 4 + k) * ((float)((k * 2 + j) % 3) - 1.0f);
            cr_assert_float_eq(hc[i * 2 + j], ref, 1e-5);
        }
    cr_assert_eq(be->ledger.cur[MT_MEM_WORK], 0);
    cr_assert_eq(be->ledger.peak[MT_MEM_WORK], (12 + 8) * 4, "bf16 operands converted in counted scratch");
    cr_assert_neq(mt_matmul(c, b, a, 0, 0, 1.0f, 0.0f), 0, "mismatched shapes are refused");
    cr_assert(strstr(mt_error_get(), "shapes do not agree"));
    mt_tensor_free(a), mt_tensor_free(b), mt_tensor_free(c);
    mt_backend_free(be);
}

Test(ledger, cpu_matmul_transposes_match_definition) {
    mt_backend *be = mt_backend_cpu_new();
    // y = x · Wᵀ, the nn.Linear product: x [2, 3], W [4, 3] -> y [2, 4]
    int64_t sx[2] = {2, 3}, sw[2] = {4, 3}, sy[2] = {2, 4};
    mt_tensor *x = mt_tensor_new(be, MT_MEM_ACT, MT_F32, 2, sx);
    mt_tensor *w = mt_tensor_new(be, MT_MEM_BASE, MT_F32, 2, sw);
    mt_tensor *y = mt_tensor_new(be, MT_MEM_ACT, MT_F32, 2, sy);
    float hx[6] = {1, 2, 3, 4, 5, 6}, hw[12], hy[8];
    for (int i = 0; i < 12; i++) hw[i] = (float)(i - 5) * 0.5f;
    mt_tensor_upload(x, hx);
    mt_tensor_upload(w, hw);
    cr_assert_eq(mt_matmul(y, x, w, 0, 1, 2.0f, 0.0f), 0);
    mt_tensor_download(y, hy);
    for (int i = 0; i < 2; i++)
        for (int o = 0; o < 4; o++) {
            float ref = 0;
            for (int k = 0; k < 3; k++) ref += hx[i * 3 + k] * hw[o * 3 + k];
            cr_assert_float_eq(hy[i * 4 + o], 2.0f * ref, 1e-5);
        }
    mt_tensor_free(x), mt_tensor_free(w), mt_tensor_free(y);
    mt_backend_free(be);
}

// The cpu backend keeps a freed block above glibc's mmap threshold for the next allocation of its
// size (core/backend_cpu.c), so a step's largest scratch is mapped once per run, not per step: the
// same memory comes back (its bytes as they were left; the kernel may well reuse an address for a
// fresh mapping, so the bytes tell), another size gets its own, the oldest of more blocks than it keeps
// is let go, and the ledger counts every byte as before.
static int filled(const void *p, size_t n, unsigned char v) {
    const unsigned char *b = p;
    return b[0] == v && b[n / 2] == v && b[n - 1] == v;
}

Test(ledger, cpu_reuses_a_freed_large_block_of_its_size) {
    mt_backend *be = mt_backend_cpu_new();
    const size_t big = 40u << 20, mib = 1u << 20;
    void *a, *b, *c;
    cr_assert_eq(mt_backend_alloc(be, MT_MEM_WORK, big, &a), 0);
    memset(a, 7, big);
    mt_backend_release(be, MT_MEM_WORK, big, a);
    cr_assert_eq(be->ledger.cur[MT_MEM_WORK], 0);
    cr_assert_eq(mt_backend_alloc(be, MT_MEM_WORK, big, &b), 0);
    cr_assert(b == a && filled(b, big, 7), "the kept block is handed out again");
    cr_assert_eq(be->ledger.cur[MT_MEM_WORK], big);
    cr_assert_eq(mt_backend_alloc(be, MT_MEM_WORK, big + mib, &c), 0);
    cr_assert(!filled(c, big + mib, 7), "a block of another size is a fresh one");
    mt_backend_release(be, MT_MEM_WORK, big, b);
    mt_backend_release(be, MT_MEM_WORK, big + mib, c);
    // Five more sizes freed, each marked: it keeps the last four of the seven.
    void *d[5];
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(mt_backend_alloc(be, MT_MEM_WORK, big + (size_t)(i + 2) * mib, &d[i]), 0);
        memset(d[i], 10 + i, big + (size_t)(i + 2) * mib);
    }
    for (int i = 0; i < 5; i++) mt_backend_release(be, MT_MEM_WORK, big + (size_t)(i + 2) * mib, d[i]);
    void *e, *f;
    cr_assert_eq(mt_backend_alloc(be, MT_MEM_WORK, big + 6 * mib, &e), 0);
    cr_assert(filled(e, big + 6 * mib, 14), "a recent block of that size is kept");
    cr_assert_eq(mt_backend_alloc(be, MT_MEM_WORK, big, &f), 0);
    cr_assert(!filled(f, big, 7), "the oldest one was let go");
    mt_backend_release(be, MT_MEM_WORK, big + 6 * mib, e);
    mt_backend_release(be, MT_MEM_WORK, big, f);
    cr_assert_eq(be->ledger.total_cur, 0);
    mt_backend_free(be);
}
