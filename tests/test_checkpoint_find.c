// Which checkpoint --resume picks: `latest` when it names a complete one; otherwise the newest
// complete checkpoint, never a half-written temporary folder.
#include <criterion/criterion.h>
#include <string.h>
#include <sys/stat.h>

#include "core/common.h"
#include "core/fileio.h"
#include "trainer/checkpoint.h"
#include "tests/test_util.h"

static void make_ckpt(const char *out, const char *name, int complete) {
    char dir[512], f[600];
    snprintf(dir, sizeof dir, "%s/%s", out, name);
    cr_assert_eq(mt_mkdir_p(dir), 0);
    if (complete) {
        snprintf(f, sizeof f, "%s/state.json", dir);
        cr_assert_eq(mt_write_file_atomic(f, "{}", 2), 0);
    }
}

static void set_latest(const char *out, const char *text) {
    char f[512];
    snprintf(f, sizeof f, "%s/latest", out);
    cr_assert_eq(mt_write_file_atomic(f, text, strlen(text)), 0);
}

Test(checkpoint, find_follows_latest_then_falls_back_to_newest_complete) {
    char tmp[64], dir[4096], want[600];
    mt_test_tmpdir(tmp, sizeof tmp);
    make_ckpt(tmp, "checkpoint-2", 1);
    make_ckpt(tmp, "checkpoint-10", 1);
    make_ckpt(tmp, "checkpoint-12", 0);           // killed before its state was written
    make_ckpt(tmp, ".checkpoint-14.tmp-123", 1);  // a temporary folder is never a checkpoint
    set_latest(tmp, "checkpoint-2\n");
    cr_assert_eq(mt_checkpoint_find(tmp, dir), 0);
    snprintf(want, sizeof want, "%s/checkpoint-2", tmp);
    cr_assert_str_eq(dir, want, "latest is followed when it names a complete checkpoint");
    const char *bad[] = {"", "garbage\x01\x02", "checkpoint-99\n", "../checkpoint-10\n", "checkpoint-12\n"};
    snprintf(want, sizeof want, "%s/checkpoint-10", tmp);
    for (size_t i = 0; i < MT_ARRAY_LEN(bad); i++) {
        set_latest(tmp, bad[i]);
        cr_assert_eq(mt_checkpoint_find(tmp, dir), 0);
        cr_assert_str_eq(dir, want, "latest '%s' falls back to the newest complete one", bad[i]);
    }
    char f[600];
    snprintf(f, sizeof f, "%s/latest", tmp);
    remove(f);
    cr_assert_eq(mt_checkpoint_find(tmp, dir), 0);
    cr_assert_str_eq(dir, want, "no latest at all");
    mt_test_rmrf(tmp);
    mt_test_tmpdir(tmp, sizeof tmp);
    make_ckpt(tmp, "checkpoint-3", 0);
    cr_assert_neq(mt_checkpoint_find(tmp, dir), 0, "only incomplete checkpoints: nothing to resume");
    cr_assert(strstr(mt_error_get(), "no complete checkpoint"), "%s", mt_error_get());
    mt_test_rmrf(tmp);
}
