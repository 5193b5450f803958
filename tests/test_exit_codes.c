// tests/test_exit_codes.c — README's exit-code table is the program's (`moetrain --help`
// prints it from trainer/options.c's mt_exit_codes), and each code is what a case of it
// returns: a run of the real binary per row (issue 28).
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/fileio.h"
#include "test_util.h"

// "| 2 | meaning |" rows of README's table: codes[i], meanings[i]; returns how many.
static int readme_table(int *codes, char meanings[][256], int cap) {
    char *text;
    size_t len;
    cr_assert_eq(mt_read_file(MT_REPO_ROOT "/README.md", 1 << 22, &text, &len), 0);
    const char *t = strstr(text, "| code | meaning |");
    cr_assert_not_null(t, "README has the exit-code table");
    int n = 0;
    for (const char *line = strchr(t, '\n'); line && line[1] == '|' && n < cap; line = strchr(line + 1, '\n')) {
        int code, used = 0;
        if (sscanf(line + 1, "| %d | %n", &code, &used) != 1 || !used) continue;  // the |---| row
        const char *m = line + 1 + used, *end = strstr(m, " |");
        cr_assert_not_null(end);
        codes[n] = code;
        snprintf(meanings[n], 256, "%.*s", (int)(end - m), m);
        n++;
    }
    free(text);
    return n;
}

Test(exit_codes, readme_table_equals_the_programs) {
    int codes[16];
    char meanings[16][256];
    int n = readme_table(codes, meanings, 16);
    cr_assert_geq(n, 7, "README lists 0, 1, 2, 3, 4, 130, 143");
    static char out[32768];
    cr_assert_eq(mt_test_run(out, sizeof out, "--help"), 0);
    const char *table = strstr(out, "exit codes:");
    cr_assert_not_null(table, "%s", out);
    int listed = 0;
    for (const char *line = strchr(table, '\n'); line && line[1]; line = strchr(line + 1, '\n')) {
        int code, used = 0;
        if (sscanf(line + 1, " %d %n", &code, &used) != 1) break;
        const char *m = line + 1 + used, *end = strchr(m, '\n');
        int len = end ? (int)(end - m) : (int)strlen(m), found = 0;
        for (int i = 0; i < n; i++)
            if (codes[i] == code) {
                found = 1;
                cr_expect(strlen(meanings[i]) == (size_t)len && strncmp(meanings[i], m, (size_t)len) == 0,
                          "code %d: README says '%s', the program '%.*s'", code, meanings[i], len, m);
            }
        cr_expect(found, "code %d is not in README's table", code);
        listed++;
    }
    cr_expect_eq(listed, n, "README's table has %d rows, the program's %d", n, listed);
    // `train --help` prints the same table
    cr_assert_eq(mt_test_run(out, sizeof out, "train --help"), 0);
    for (int i = 0; i < n; i++) cr_expect(strstr(out, meanings[i]), "train --help lacks '%s'", meanings[i]);
}

// sh -c CMD: the exit status (stdout and stderr to `log`).
static int sh(const char *log, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sh(const char *log, const char *fmt, ...) {
    char cmd[4096], full[4600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(full, sizeof full, "(%s) > %s 2>&1", cmd, log);
    int st = system(full);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// A run stopped by `sig` once its first step is logged: its exit code.
static int stopped_by(const char *tmp, const char *model, const char *data, const char *sig) {
    char log[200];
    snprintf(log, sizeof log, "%s/%s.log", tmp, sig);
    return sh(log,
              "%s --model %s --data %s --mode lora --r 2 --quant none --seq 16 --steps 100000 --out %s/%s & pid=$!; "
              "for i in $(seq 300); do grep -q '\"type\":\"step\"' %s/%s/metrics.jsonl 2>/dev/null && break; sleep 0.05; done; "
              "kill -%s $pid; wait $pid",
              MT_TEST_BIN, model, data, tmp, sig, tmp, sig, sig);
}

Test(exit_codes, each_code_is_what_its_case_returns, .timeout = 120) {
    char tmp[64], model[128], data[128], bad[160], log[200];
    mt_test_tmpdir(tmp, sizeof tmp);
    cr_assert_eq(mt_test_tiny_run_inputs(tmp, model, data, 8), 0);
    snprintf(bad, sizeof bad, "%s/bad.jsonl", tmp);
    FILE *f = fopen(bad, "w");
    fprintf(f, "{\"text\": 3}\n");
    fclose(f);
    snprintf(log, sizeof log, "%s/run.log", tmp);
    const char *run = "--mode lora --r 2 --quant none --seq 16 --steps 1";
    cr_expect_eq(sh(log, "%s --version", MT_TEST_BIN), 0, "0: done");
    cr_expect_eq(sh(log, "%s --model %s --data %s %s --out %s/e1", MT_TEST_BIN, model, bad, run, tmp), 1,
                 "1: bad input");
    cr_expect_eq(sh(log, "%s --model %s --data %s %s --learning_rate 1e-4 --out %s/e2", MT_TEST_BIN, model, data, run,
                    tmp), 2, "2: an unknown flag");
    cr_expect_eq(sh(log, "%s --data %s %s", MT_TEST_BIN, data, run), 2, "2: --model missing");
    cr_expect_eq(sh(log, "%s --model %s --data %s %s --experts 9 --out %s/e2", MT_TEST_BIN, model, data, run, tmp), 2,
                 "2: --experts the model does not have");
    cr_expect_eq(sh(log, "%s --model %s --data %s %s --mem 100KB --out %s/e3", MT_TEST_BIN, model, data, run, tmp), 3,
                 "3: the plan does not fit --mem");
    cr_expect_eq(sh(log, "%s --model %s --data %s %s --gpu-mem 1MB --out %s/e3", MT_TEST_BIN, model, data, run, tmp), 3,
                 "3: the plan does not fit --gpu-mem");
    cr_expect_eq(stopped_by(tmp, model, data, "INT"), 130, "130: SIGINT");
    cr_expect_eq(stopped_by(tmp, model, data, "TERM"), 143, "143: SIGTERM");
    mt_test_rmrf(tmp);
}

// Its own test: under ASan (which reserves terabytes of address space) a ulimit -v cannot be met,
// so it is skipped there, saying why.
Test(exit_codes, code_4_is_out_of_host_memory) {
#if defined(__SANITIZE_ADDRESS__)
    cr_skip_test("built with ASan, which reserves terabytes of address space: no ulimit -v fits it");
#endif
    char tmp[64], log[200];
    mt_test_tmpdir(tmp, sizeof tmp);
    snprintf(log, sizeof log, "%s/oom.log", tmp);
    cr_expect_eq(sh(log, "ulimit -v 150000; %s --version", MT_TEST_BIN), 4, "4: out of host memory");
    mt_test_rmrf(tmp);
}
