// Bounded work in the BPE encoder (issue 32): 10 MB runs of one character class give the ids
// `tokenizers` gives (tests/data/bpe/runs/expected.json, scripts/make_bpe_run_fixtures.py); a
// pre-tokenizer regex that backtracks quadratically ends with an error naming tokenizer.json
// within seconds; a tokenizer.json string that is not UTF-8 is refused naming the key.
#include <criterion/criterion.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "core/common.h"
#include "core/fileio.h"
#include "data/bpe.h"
#include "data/tokenizer.h"
#include "tests/test_util.h"

static cJSON *read_json(const char *path) {
    char *text;
    size_t len;
    cr_assert_eq(mt_read_file(path, 64u << 20, &text, &len), 0, "%s", mt_error_get());
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    cr_assert(j, "%s: not JSON", path);
    return j;
}

static void write_json(const char *path, const cJSON *j) {
    char *text = cJSON_PrintUnformatted(j);
    cr_assert_eq(mt_write_file_atomic(path, text, strlen(text)), 0, "%s", mt_error_get());
    free(text);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// The text of a case: each [piece, repeat] of the spec, concatenated. Malloc'ed.
static char *build_text(const cJSON *spec, size_t *len) {
    size_t n = 0, at = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, spec) n += strlen(cJSON_GetArrayItem(e, 0)->valuestring) * (size_t)cJSON_GetArrayItem(e, 1)->valuedouble;
    char *t = malloc(n + 1);
    cJSON_ArrayForEach(e, spec) {
        const char *p = cJSON_GetArrayItem(e, 0)->valuestring;
        size_t pl = strlen(p), r = (size_t)cJSON_GetArrayItem(e, 1)->valuedouble;
        for (size_t k = 0; k < r; k++, at += pl) memcpy(t + at, p, pl);
    }
    t[n] = 0;
    *len = n;
    return t;
}

Test(bpe_runs, ten_megabyte_runs_equal_tokenizers, .timeout = 120) {
    cJSON *j = read_json("tests/data/bpe/runs/expected.json");
    cr_assert_str_eq(cJSON_GetObjectItem(j, "magic")->valuestring, "mt-bpe-runs");
    int checked = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "cases")) {
        const char *tk = cJSON_GetObjectItem(c, "tokenizer")->valuestring;
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        char path[256];
        snprintf(path, sizeof path, "tests/data/bpe/%s/tokenizer.json", tk);
        mt_bpe *b = mt_bpe_load(path);
        cr_assert(b, "%s", mt_error_get());
        size_t len;
        char *text = build_text(cJSON_GetObjectItem(c, "text"), &len);
        mt_ids got = {0};
        double t0 = now_s();
        int rc = mt_bpe_encode(b, text, len, &got);
        double secs = now_s() - t0;
        cr_assert_eq(rc, 0, "%s %s: %s", tk, name, mt_error_get());
        cr_assert_lt(secs, 10.0, "%s %s: %.1f s for %zu bytes", tk, name, secs, len);
        const cJSON *segs = cJSON_GetObjectItem(c, "ids");
        if (segs) {  // else `tokenizers` itself failed on this text: ours must only finish
            size_t at = 0;
            const cJSON *s;
            cJSON_ArrayForEach(s, segs) {
                const cJSON *pat = cJSON_GetArrayItem(s, 0);
                size_t reps = (size_t)cJSON_GetArrayItem(s, 1)->valuedouble, p = (size_t)cJSON_GetArraySize(pat);
                for (size_t r = 0; r < reps; r++)
                    for (size_t k = 0; k < p; k++, at++) {
                        int32_t want = (int32_t)cJSON_GetArrayItem(pat, (int)k)->valuedouble;
                        if (at >= got.n || got.v[at] != want)
                            cr_assert_fail("%s %s (%zu bytes): id %zu is %d, tokenizers gives %d", tk, name,
                                           len, at, at < got.n ? got.v[at] : -1, want);
                    }
            }
            cr_assert_eq(got.n, at, "%s %s: %zu ids, tokenizers gives %zu", tk, name, got.n, at);
            checked++;
        }
        mt_ids_free(&got);
        free(text);
        mt_bpe_free(b);
    }
    cr_assert_geq(checked, 15, "only %d cases compared", checked);
    cJSON_Delete(j);
}

// qwen2's fixture with its Split regex replaced by `pattern`, written in dir.
static void write_with_regex(const char *dir, const char *pattern, char *out, size_t n) {
    cJSON *j = read_json("tests/data/bpe/qwen2/tokenizer.json");
    cJSON *split = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "pre_tokenizer"), "pretokenizers"), 0);
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(split, "pattern"), "Regex", cJSON_CreateString(pattern));
    snprintf(out, n, "%s/tokenizer.json", dir);
    write_json(out, j);
    cJSON_Delete(j);
}

Test(bpe_runs, quadratic_regex_ends_with_an_error_naming_the_file, .timeout = 60) {
    char dir[64], path[128];
    mt_test_tmpdir(dir, sizeof dir);
    write_with_regex(dir, ".(?=[^#]*#)|.", path, sizeof path);
    mt_bpe *b = mt_bpe_load(path);
    cr_assert(b, "%s", mt_error_get());
    size_t len = 2000000;  // quadratic: hours unbounded; the budget ends it in ~2.5 s
    char *text = malloc(len);
    memset(text, 'a', len);
    mt_ids got = {0};
    double t0 = now_s();
    int rc = mt_bpe_encode(b, text, len, &got);
    double secs = now_s() - t0;
    cr_assert_neq(rc, 0, "the pathological regex finished (%.1f s)", secs);
    cr_assert(strstr(mt_error_get(), path) && strstr(mt_error_get(), "time budget"), "%s", mt_error_get());
    cr_assert_lt(secs, 10.0, "%.1f s", secs);
    // A short text is still encoded: the budget bounds time, it does not refuse the pattern.
    got.n = 0;
    cr_assert_eq(mt_bpe_encode(b, "ab#cd", 5, &got), 0, "%s", mt_error_get());
    cr_assert_eq(got.n, 5);
    mt_ids_free(&got);
    free(text);
    mt_bpe_free(b);
    mt_test_rmrf(dir);
}

Test(bpe_runs, invalid_utf8_in_tokenizer_json_is_refused_naming_the_key) {
    char dir[64], path[128];
    mt_test_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    cJSON *j = read_json("tests/data/bpe/qwen2/tokenizer.json");
    cJSON_AddNumberToObject(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "model"), "vocab"), "ab\xff", 9999);
    write_json(path, j);
    cr_assert_null(mt_bpe_load(path));
    cr_assert(strstr(mt_error_get(), path) && strstr(mt_error_get(), "model.vocab") &&
              strstr(mt_error_get(), "not valid UTF-8"), "%s", mt_error_get());
    // in a value: an added token's content
    cJSON_DeleteItemFromObject(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "model"), "vocab"), "ab\xff");
    cJSON *added = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "added_tokens"), 0);
    cJSON_ReplaceItemInObject(added, "content", cJSON_CreateString("<|\xc3(|>"));
    write_json(path, j);
    cr_assert_null(mt_bpe_load(path));
    cr_assert(strstr(mt_error_get(), "added_tokens[0].content") && strstr(mt_error_get(), "not valid UTF-8"),
              "%s", mt_error_get());
    cJSON_Delete(j);
    mt_test_rmrf(dir);
}
