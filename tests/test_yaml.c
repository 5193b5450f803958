// YAML run configs: the flat shape in file order, and every bound (depth, size, aliases,
// duplicates) failing fast with file:line:column.
#include <criterion/criterion.h>
#include <string.h>
#include <time.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/yaml.h"
#include "test_util.h"

static char tmp[256];
static void setup(void) { mt_test_tmpdir(tmp, sizeof tmp); }
static void teardown(void) { mt_test_rmrf(tmp); }
TestSuite(yaml, .init = setup, .fini = teardown);

typedef struct {
    int n, stop_at;
    char key[16][64], value[16][256];
    int line[16], column[16];
} pairs;

static int record(void *ctx, const char *key, const char *value, int line, int column) {
    pairs *p = ctx;
    if (p->n == p->stop_at) {
        mt_error_set("callback stopped at '%s'", key);
        return 7;
    }
    if (p->n >= 16) return 0;  // long files: only the first 16 are kept
    snprintf(p->key[p->n], sizeof p->key[0], "%s", key);
    snprintf(p->value[p->n], sizeof p->value[0], "%s", value);
    p->line[p->n] = line;
    p->column[p->n] = column;
    p->n++;
    return 0;
}

// Writes `len` bytes of `text` to tmp/name; returns the path (static buffer).
static const char *write_file(const char *name, const char *text, size_t len) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    cr_assert_eq(mt_write_file_atomic(path, text, len), 0, "%s", mt_error_get());
    return path;
}

static int read_text(const char *text, pairs *p) {
    memset(p, 0, sizeof *p);
    p->stop_at = -1;
    return mt_yaml_read_flat(write_file("run.yaml", text, strlen(text)), record, p);
}

// Fails, naming run.yaml:line:column and every fragment.
#define expect_error(text, line_col, ...)                                                          \
    do {                                                                                           \
        pairs p_;                                                                                  \
        mt_error_clear();                                                                          \
        cr_assert_neq(read_text(text, &p_), 0, "accepted: %.200s", text);                          \
        const char *e_ = mt_error_get();                                                           \
        char want_[64];                                                                            \
        snprintf(want_, sizeof want_, "run.yaml:%s: ", line_col);                                  \
        cr_assert(strstr(e_, want_), "error lacks '%s': %s", want_, e_);                           \
        const char *frags_[] = {__VA_ARGS__};                                                      \
        for (size_t i_ = 0; i_ < sizeof frags_ / sizeof *frags_; i_++)                             \
            cr_assert(strstr(e_, frags_[i_]), "error lacks '%s': %s", frags_[i_], e_);            \
    } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

Test(yaml, flat_scalars_and_lists_in_order) {
    pairs p;
    const char *text = "# a run config\n"
                       "mode: lora\n"
                       "r: 16\n"
                       "  # comment\n"
                       "targets: [w1, w2, w3]\n"
                       "layers:\n"
                       "  - 0-5\n"
                       "  - 7\n"
                       "out: \"runs/a b\"\n"
                       "lr: '2e-4'\n"
                       "empty:\n"
                       "none: []\n";
    cr_assert_eq(read_text(text, &p), 0, "%s", mt_error_get());
    cr_assert_eq(p.n, 8);
    static const char *keys[] = {"mode", "r", "targets", "layers", "out", "lr", "empty", "none"};
    static const char *values[] = {"lora", "16", "w1,w2,w3", "0-5,7", "runs/a b", "2e-4", "", ""};
    static const int lines[] = {2, 3, 5, 6, 9, 10, 11, 12};
    for (int i = 0; i < 8; i++) {
        cr_assert_str_eq(p.key[i], keys[i]);
        cr_assert_str_eq(p.value[i], values[i], "%s", keys[i]);
        cr_assert_eq(p.line[i], lines[i], "%s on line %d", keys[i], p.line[i]);
        cr_assert_eq(p.column[i], 1);
    }
    // Indented under a document marker: columns follow.
    cr_assert_eq(read_text("---\n  a: 1\n  b: 2\n...\n", &p), 0, "%s", mt_error_get());
    cr_assert_eq(p.n, 2);
    cr_assert_eq(p.line[1], 3);
    cr_assert_eq(p.column[1], 3);
}

Test(yaml, callback_can_stop) {
    pairs p;
    memset(&p, 0, sizeof p);
    p.stop_at = 1;
    const char *path = write_file("run.yaml", "a: 1\nb: 2\nc: 3\n", 15);
    cr_assert_neq(mt_yaml_read_flat(path, record, &p), 0);
    cr_assert_eq(p.n, 1);
    cr_assert_str_eq(mt_error_get(), "callback stopped at 'b'");  // the callback's own error
}

static int count_pairs(void *ctx, const char *key, const char *value, int line, int column) {
    (void)key, (void)value, (void)column;
    int *count = ctx;
    cr_assert_eq(line, *count + 1);
    (*count)++;
    return 0;
}

Test(yaml, duplicate_key) {
    expect_error("a: 1\nr: 2\nr: 3\n", "3:1", "duplicate key 'r'");
    // Many distinct keys are fine (the set grows).
    char text[20000];
    size_t n = 0;
    for (int i = 0; i < 1000; i++) n += (size_t)sprintf(text + n, "k%d: %d\n", i, i);
    int count = 0;
    cr_assert_eq(mt_yaml_read_flat(write_file("many.yaml", text, n), count_pairs, &count), 0, "%s",
                 mt_error_get());
    cr_assert_eq(count, 1000);
    strcpy(text + n, "k999: again\n");
    expect_error(text, "1001:1", "duplicate key 'k999'");
}

Test(yaml, anchors_and_aliases_refused) {
    expect_error("a: &x 1\nb: 2\n", "1:4", "anchor");
    expect_error("a: 1\nb: *x\n", "2:4", "alias");
    expect_error("a: &x [1, 2]\n", "1:4", "anchor");
    // The billion-laughs shape fails at its first anchor, before any expansion.
    const char *bomb = "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n"
                       "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
                       "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n";
    expect_error(bomb, "1:4", "anchor");
}

static void deep_fails_fast(const char *open, const char *close, const char *prefix, const char *line_col) {
    size_t depth = 10000, n = strlen(prefix);
    size_t ol = strlen(open), cl = strlen(close);
    char *text = malloc(n + depth * (ol + cl) + 2);
    memcpy(text, prefix, n);
    for (size_t i = 0; i < depth; i++, n += ol) memcpy(text + n, open, ol);
    for (size_t i = 0; i < depth; i++, n += cl) memcpy(text + n, close, cl);
    text[n++] = '\n';
    text[n] = 0;
    double t0 = now_s();
    expect_error(text, line_col, "run.yaml");
    double dt = now_s() - t0;
    cr_assert_lt(dt, 1.0, "took %.3f s", dt);
    free(text);
}

Test(yaml, ten_thousand_levels_fail_fast) {
    deep_fails_fast("[", "]", "a: ", "1:5");
    deep_fails_fast("[", "]", "", "1:1");          // a list at the root
    deep_fails_fast("{a: ", "}", "a: ", "1:4");
}

Test(yaml, ten_thousand_block_levels_fail_fast) {
    // Block style: every level one line deeper and one space further in.
    size_t depth = 10000, n = 0;
    // 10k lines of growing indent would be 50 MB, past the file cap; "- - - ..." on one line
    // nests one block sequence per "- ".
    char *text = malloc(2 * depth + 16);
    for (size_t i = 0; i < depth; i++) n += (size_t)sprintf(text + n, "- ");
    strcpy(text + n, "x\n");
    double t0 = now_s();
    expect_error(text, "1:1", "mapping");
    cr_assert_lt(now_s() - t0, 1.0);
    n = (size_t)sprintf(text, "a:\n");
    for (size_t i = 0; i < depth; i++) n += (size_t)sprintf(text + n, "- ");
    strcpy(text + n, "x\n");
    t0 = now_s();
    expect_error(text, "2:3", "'a'");
    cr_assert_lt(now_s() - t0, 1.0);
    free(text);
}

Test(yaml, big_scalars) {
    // 10 MB: over the 1 MiB file cap, refused before parsing.
    size_t big = 10u << 20;
    char *text = malloc(big + 16);
    memcpy(text, "a: ", 3);
    memset(text + 3, 'x', big);
    strcpy(text + 3 + big, "\n");
    pairs p;
    memset(&p, 0, sizeof p);
    const char *path = write_file("big.yaml", text, strlen(text));
    cr_assert_neq(mt_yaml_read_flat(path, record, &p), 0);
    cr_assert(strstr(mt_error_get(), path) && strstr(mt_error_get(), "limit"), "%s", mt_error_get());
    // 100 KiB: under the file cap, over the 64 KiB scalar cap, as a value and as a key.
    size_t mid = 100u << 10;
    memset(text + 3, 'x', mid);
    strcpy(text + 3 + mid, "\n");
    expect_error(text, "1:4", "limit");
    memset(text, 'k', mid);
    strcpy(text + mid, ": 1\n");
    expect_error(text, "1:1", "limit");
    // 64 KiB exactly is fine.
    memcpy(text, "a: ", 3);
    memset(text + 3, 'y', 64u << 10);
    strcpy(text + 3 + (64u << 10), "\n");
    cr_assert_eq(read_text(text, &p), 0, "%s", mt_error_get());
    free(text);
}

Test(yaml, only_flat_shapes) {
    expect_error("a: 1\nb:\n  c: 2\n", "3:3", "'b'", "nested");
    expect_error("a: {c: 2}\n", "1:4", "'a'", "nested");
    expect_error("a:\n  - x: 1\n", "2:5", "'a'", "list");
    expect_error("a: [[1, 2]]\n", "1:5", "'a'", "list");
    expect_error("? [a, b]\n: 1\n", "1:3", "key");
    expect_error("a: [x, 'y,z']\n", "1:8", "comma");
    expect_error("a: 1\n---\nb: 2\n", "2:1", "more than one");
    // A syntax error is libyaml's message, still with file:line:column.
    pairs p;
    cr_assert_neq(read_text("a: 1\nb: [1, 2\n", &p), 0);
    int line = 0, col = 0;
    const char *e = strstr(mt_error_get(), "run.yaml:");
    cr_assert(e && sscanf(e, "run.yaml:%d:%d:", &line, &col) == 2 && line >= 2 && col >= 1, "%s",
              mt_error_get());
}

Test(yaml, root_must_be_a_mapping) {
    expect_error("just a string\n", "1:1", "mapping");
    expect_error("- a\n- b\n", "1:1", "mapping");
    expect_error("\"\"\n", "1:1", "mapping");
}

Test(yaml, empty_files) {
    pairs p;
    cr_assert_eq(read_text("", &p), 0, "%s", mt_error_get());
    cr_assert_eq(p.n, 0);
    cr_assert_eq(read_text("# only a comment\n\n", &p), 0, "%s", mt_error_get());
    cr_assert_eq(p.n, 0);
    cr_assert_eq(read_text("---\n", &p), 0, "%s", mt_error_get());
    cr_assert_eq(p.n, 0);
    cr_assert_eq(read_text("{}\n", &p), 0, "%s", mt_error_get());
    cr_assert_eq(p.n, 0);
}

Test(yaml, missing_file_and_bad_bytes) {
    pairs p;
    memset(&p, 0, sizeof p);
    char path[512];
    snprintf(path, sizeof path, "%s/absent.yaml", tmp);
    cr_assert_neq(mt_yaml_read_flat(path, record, &p), 0);
    cr_assert(strstr(mt_error_get(), path), "%s", mt_error_get());
    expect_error("a: 1\nb: \xff\xfe\n", "2:4", "UTF-8");
    expect_error("a: \"x\\0y\"\n", "1:4", "NUL");
}
