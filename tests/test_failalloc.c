// Out of host memory is exit 4, never a silent loss or a hang (issue 32):
//   * every allocation of the data path (tokenizer.json, JSONL of every form, a token file) made
//     to fail in turn (tests/failalloc/failalloc_data.c): the load exits 4 naming what it read, or
//     reads every sample (a caller that recovers);
//   * `moetrain eval` under ulimit -v from 100 MB to 1.2 GB: each ends within 10 s, 0 or 4.
// Both need malloc and the address space to themselves: skipped under ASan.
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "tests/test_util.h"

#if defined(__SANITIZE_ADDRESS__)
#define SKIP_SAN() cr_skip_test("built with ASan, which owns malloc and reserves terabytes of address space")
#else
#define SKIP_SAN() (void)0
#endif

// Runs `cmd` through the shell (stderr into stdout): its exit code and output.
static int run(const char *cmd, char *out, size_t n) {
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    size_t k = fread(out, 1, n - 1, p);
    out[k] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void write_data(const char *path, int lines) {
    FILE *f = fopen(path, "w");
    cr_assert(f);
    for (int i = 0; i < lines; i++) {
        if (i % 3 == 0) fprintf(f, "{\"text\":\"sample %d: some text to tokenize\"}\n", i);
        else if (i % 3 == 1) fprintf(f, "{\"instruction\":\"say %d\",\"input\":\"x\",\"output\":\"said %d\"}\n", i, i);
        else fprintf(f, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi %d\"},{\"role\":\"assistant\",\"content\":\"hello %d\"}]}\n", i, i);
    }
    cr_assert_eq(fclose(f), 0);
}

// Every allocation of phase `phase` (1 the tokenizer, 2 the data) fails once in turn, at a
// stride that keeps the runs under ~400.
static void sweep(const char *tok, const char *data, int samples) {
    char cmd[1024], out[4096];
    snprintf(cmd, sizeof cmd, "%s %s %s 512 2>&1", MT_FAILALLOC_BIN, tok, data);
    cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
    long k1, k2, s;
    cr_assert_eq(sscanf(out, "allocs1=%ld allocs2=%ld samples=%ld", &k1, &k2, &s), 3, "%s", out);
    cr_assert_eq(s, samples, "%s", out);
    for (int phase = 1; phase <= 2; phase++) {
        long k = phase == 1 ? k1 : k2, step = k / 200 + 1;
        for (long n = 1; n <= k; n += step) {
            snprintf(cmd, sizeof cmd, "%s %s %s 512 %d %ld 2>&1", MT_FAILALLOC_BIN, tok, data, phase, n);
            int rc = run(cmd, out, sizeof out);
            if (rc == 0) {
                char want[64];
                snprintf(want, sizeof want, "samples=%d", samples);
                cr_assert(strstr(out, want), "allocation %d/%ld: exit 0 but %s", phase, n, out);
            } else {
                cr_assert_eq(rc, MT_EXIT_OOM, "allocation %d/%ld of %ld: exit %d: %s", phase, n, k, rc, out);
                cr_assert(strstr(out, "out of host memory"), "allocation %d/%ld: %s", phase, n, out);
                if (phase == 2) cr_assert(strstr(out, data), "allocation %d/%ld names no file: %s", phase, n, out);
            }
        }
    }
}

Test(failalloc, every_allocation_of_the_data_path_fails_with_exit_4, .timeout = 120) {
    SKIP_SAN();
    char dir[64], data[128], tok[128];
    mt_test_tmpdir(dir, sizeof dir);
    snprintf(data, sizeof data, "%s/data.jsonl", dir);
    write_data(data, 21);
    sweep("bytes", data, 21);
    snprintf(tok, sizeof tok, "%s/tests/data/bpe/qwen2/tokenizer.json", MT_REPO_ROOT);
    sweep(tok, data, 21);
    mt_test_rmrf(dir);
}

Test(failalloc, ulimit_v_sweep_ends_in_0_or_4_never_a_hang, .timeout = 200) {
    SKIP_SAN();
    char dir[64], model[128], data[128], cmd[1024], out[8192];
    mt_test_tmpdir(dir, sizeof dir);
    cr_assert_eq(mt_test_tiny_run_inputs(dir, model, data, 32), 0);
    int ok = 0, oom = 0;
    for (long v = 100000; v <= 1200000; v += 100000) {
        snprintf(cmd, sizeof cmd, "ulimit -v %ld; timeout 10 %s eval --model %s --data %s --seq 64 2>&1", v,
                 MT_TEST_BIN, model, data);
        int rc = run(cmd, out, sizeof out);
        cr_assert_neq(rc, 124, "ulimit -v %ld: still running after 10 s (a hang): %s", v, out);
        cr_assert(rc == 0 || rc == MT_EXIT_OOM, "ulimit -v %ld: exit %d: %s", v, rc, out);
        if (rc == MT_EXIT_OOM) cr_assert(strstr(out, "out of host memory"), "ulimit -v %ld: %s", v, out);
        ok += rc == 0, oom += rc == MT_EXIT_OOM;
    }
    cr_assert(ok > 0 && oom > 0, "expected both ends of the sweep: %d ran, %d out of memory", ok, oom);
    mt_test_rmrf(dir);
}
