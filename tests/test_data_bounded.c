// Memory per sample bounded by --seq, not by the line (issue 32): long JSONL strings are read in
// bounded pieces (data/line_reader.c), their dropped tails still checked; --max-line-bytes;
// token-file samples read to seq + 1 ids.
#include <criterion/criterion.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/common.h"
#include "data/data.h"
#include "data/tokenizer.h"
#include "tests/test_util.h"

typedef struct bx {
    char dir[64], path[128];
    mt_tokenizer tok;
    mt_data_opts o;
} bx;

static void bx_init(bx *b) {
    mt_test_tmpdir(b->dir, sizeof b->dir);
    snprintf(b->path, sizeof b->path, "%s/data.jsonl", b->dir);
    cr_assert_eq(mt_tokenizer_init_bytes(&b->tok, 256, 1, 2), 0);
    mt_data_opts_default(&b->o);
    b->o.shuffle = 0;
    b->o.seq = 64;
}

// Lines: head, then `fill` repeated n times, then tail, as one line; then "rest" lines.
static void write_long(const bx *b, const char *head, const char *fill, size_t n, const char *tail,
                       const char *rest) {
    FILE *f = fopen(b->path, "w");
    cr_assert(f);
    fputs("{\"text\":\"first sample\"}\n", f);
    fputs(head, f);
    size_t fl = strlen(fill);
    for (size_t i = 0; i < n; i++) fwrite(fill, 1, fl, f);
    fputs(tail, f);
    fputs(rest, f);
    cr_assert_eq(fclose(f), 0);
}

Test(data_bounded, a_40_mb_line_costs_memory_of_seq_not_of_the_line, .timeout = 60) {
    bx b;
    bx_init(&b);
    write_long(&b, "{\"text\":\"", "lorem ipsum ", 40u << 20 >> 3 / 3, "\"}\n", "{\"text\":\"last\"}\n");
    pid_t pid = fork();
    if (pid == 0) {  // the load in a child, whose peak RSS the parent reads
        mt_dataset d;
        if (mt_dataset_load(&d, b.path, &b.tok, &b.o) != 0) _exit(10);
        const int32_t *t;
        int64_t n = mt_dataset_sample(&d, 1, &t, NULL);
        int ok = d.n == 3 && d.stats.truncated == 1 && n == 64 && t[0] == 1 && memcmp((const int32_t[]){'l', 'o', 'r', 'e', 'm'}, t + 1, 20) == 0;
        _exit(ok ? 0 : 11);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: status %d", status);
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    // The line is ~40 MB; holding it once would cost that much. What is kept: a few KiB.
    cr_assert_lt(ru.ru_maxrss, 24 * 1024, "peak RSS %ld KiB for a 40 MB line at --seq 64", ru.ru_maxrss);
    mt_test_rmrf(b.dir);
}

Test(data_bounded, a_cut_sample_is_overlong_for_drop_and_refuse) {
    bx b;
    bx_init(&b);
    b.o.seq = 16;
    write_long(&b, "{\"text\":\"", "x", 200000, "\"}\n", "");
    mt_dataset d;
    b.o.overlong = MT_OVERLONG_DROP;
    cr_assert_eq(mt_dataset_load(&d, b.path, &b.tok, &b.o), 0, "%s", mt_error_get());
    cr_assert_eq(d.n, 1);
    cr_assert_eq(d.stats.dropped_overlong, 1);
    mt_dataset_free(&d);
    b.o.overlong = MT_OVERLONG_REFUSE;
    cr_assert_neq(mt_dataset_load(&d, b.path, &b.tok, &b.o), 0);
    char want[256];
    snprintf(want, sizeof want, "%s:2: sample of more than 16 tokens is longer than --seq 16", b.path);
    cr_assert(strstr(mt_error_get(), want), "%s", mt_error_get());
    mt_dataset_free(&d);
    mt_test_rmrf(b.dir);
}

// What is dropped of a long string is still checked as the JSON parser would check it.
Test(data_bounded, the_dropped_tail_of_a_string_is_still_checked) {
    static const struct {
        const char *bad, *want;
    } cases[] = {
        {"\\q", "an invalid escape"},
        {"\\u12G4", "four hex digits"},
        {"\xff", "invalid UTF-8"},
        {"\xe2\x82", "invalid UTF-8"},  // cut short by the closing quote
        {"\x01", "raw control byte"},
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(cases); i++) {
        bx b;
        bx_init(&b);
        char tail[64];
        snprintf(tail, sizeof tail, "%s\"}\n", cases[i].bad);
        write_long(&b, "{\"text\":\"", "y", 100000, tail, "{\"text\":\"after\"}\n");
        mt_dataset d;
        cr_assert_neq(mt_dataset_load(&d, b.path, &b.tok, &b.o), 0, "case %zu loaded", i);
        char want[200];
        snprintf(want, sizeof want, "%s:2: column 1000", b.path);  // 100010 and on
        cr_assert(strstr(mt_error_get(), want) && strstr(mt_error_get(), cases[i].want), "case %zu: %s", i,
                  mt_error_get());
        mt_dataset_free(&d);
        mt_test_rmrf(b.dir);
    }
}

Test(data_bounded, max_line_bytes_refuses_a_line_naming_it) {
    bx b;
    bx_init(&b);
    b.o.max_line_bytes = 8192;
    write_long(&b, "{\"text\":\"ok\",\"n\":[", "1,", 5000, "1]}\n", "");
    mt_dataset d;
    cr_assert_neq(mt_dataset_load(&d, b.path, &b.tok, &b.o), 0);
    char want[200];
    snprintf(want, sizeof want, "%s:2: the line keeps more than --max-line-bytes 8192", b.path);
    cr_assert(strstr(mt_error_get(), want), "%s", mt_error_get());
    mt_dataset_free(&d);
    // A long string counts only to what --seq can use: a 1 MB text in an 8192-byte limit loads.
    write_long(&b, "{\"text\":\"", "z", 1 << 20, "\"}\n", "");
    b.o.seq = 16;
    cr_assert_eq(mt_dataset_load(&d, b.path, &b.tok, &b.o), 0, "%s", mt_error_get());
    cr_assert_eq(d.n, 2);
    mt_dataset_free(&d);
    mt_test_rmrf(b.dir);
}

Test(data_bounded, a_long_token_file_sample_is_read_to_seq_and_checked_to_its_end) {
    bx b;
    bx_init(&b);
    snprintf(b.path, sizeof b.path, "%s/t.tok", b.dir);
    size_t n = 1000000;
    int32_t *ids = malloc(n * 4);
    for (size_t i = 0; i < n; i++) ids[i] = 3 + (int32_t)(i % 200);
    int64_t off[2] = {0, (int64_t)n};
    cr_assert_eq(mt_tokfile_write(b.path, 1, off, ids, NULL), 0, "%s", mt_error_get());
    mt_dataset d;
    cr_assert_eq(mt_dataset_load(&d, b.path, &b.tok, &b.o), 0, "%s", mt_error_get());
    cr_assert_eq(d.n, 1);
    cr_assert_eq(d.stats.truncated, 1);
    cr_assert_eq(d.stats.longest, 64);
    mt_dataset_free(&d);
    ids[900000] = 300;  // past what is kept: still checked
    cr_assert_eq(mt_tokfile_write(b.path, 1, off, ids, NULL), 0, "%s", mt_error_get());
    cr_assert_neq(mt_dataset_load(&d, b.path, &b.tok, &b.o), 0);
    cr_assert(strstr(mt_error_get(), "token id 300 at position 900000"), "%s", mt_error_get());
    mt_dataset_free(&d);
    free(ids);
    mt_test_rmrf(b.dir);
}

// A read error is an error naming the file, never an early end of the data. /proc/self/mem is a
// regular file whose first page is unmapped: reading it fails with EIO.
Test(data_bounded, a_read_error_is_not_the_end_of_the_file) {
    bx b;
    bx_init(&b);
    mt_dataset d;
    cr_assert_neq(mt_dataset_load(&d, "/proc/self/mem", &b.tok, &b.o), 0, "a failed read loaded");
    cr_assert(strstr(mt_error_get(), "/proc/self/mem") && strstr(mt_error_get(), "read failed"), "%s", mt_error_get());
    mt_dataset_free(&d);
    mt_test_rmrf(b.dir);
}
