// The metrics JSONL (parsed back with cJSON) and the progress line.
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/common.h"
#include "core/fileio.h"
#include "test_util.h"
#include "trainer/metrics.h"

// The file's lines, each parsed; *n gets the count. Fails the test on a line that is not JSON.
static cJSON **read_jsonl(const char *path, int *n) {
    char *buf;
    size_t len;
    cr_assert_eq(mt_read_file(path, 1 << 20, &buf, &len), 0, "%s", mt_error_get());
    cr_assert(len > 0 && buf[len - 1] == '\n', "every record ends its line");
    cJSON **rows = calloc(64, sizeof *rows);
    *n = 0;
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        cr_assert_lt(*n, 64);
        rows[*n] = cJSON_Parse(line);
        cr_assert_not_null(rows[*n], "line %d is not JSON: %s", *n + 1, line);
        (*n)++;
    }
    free(buf);
    return rows;
}

static void free_rows(cJSON **rows, int n) {
    for (int i = 0; i < n; i++) cJSON_Delete(rows[i]);
    free(rows);
}

static const cJSON *field(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    cr_assert_not_null(v, "field '%s' is missing", k);
    return v;
}

static double num(const cJSON *o, const char *k) {
    const cJSON *v = field(o, k);
    cr_assert(cJSON_IsNumber(v), "field '%s' is not a number", k);
    return v->valuedouble;
}

static mt_step_record sample_record(const float *load) {
    return (mt_step_record){.step = 7, .total = 100, .loss = 2.3456789, .ce = 2.31, .aux = 0.0123,
                            .z = 1.5e-5, .lr = 3e-4, .grad_norm = 0.75, .tokens_per_s = 1234.5,
                            .eta_s = 3725.0, .peak_bytes = 5368709120ull, .skipped = 0,
                            .layers = 2, .experts = 3, .expert_load = load};
}

Test(metrics, jsonl_parses_with_every_field) {
    char dir[256], path[400];
    mt_test_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    mt_metrics m;
    cr_assert_eq(mt_metrics_open(&m, path), 0, "%s", mt_error_get());
    m.out = NULL;  // no progress in this test
    const float load[6] = {0.5f, 0.25f, 0.25f, 1.0f, 0.0f, 0.0f};
    mt_step_record r = sample_record(load);
    mt_metrics_step(&m, &r);
    r.step = 8, r.expert_load = NULL;
    mt_metrics_step(&m, &r);
    mt_metrics_event(&m, "eval", "\"step\":8,\"loss\":2.5,\"ppl\":12.18,\"split\":\"val\"");
    mt_metrics_event(&m, "save", NULL);
    mt_metrics_close(&m);

    int n;
    cJSON **rows = read_jsonl(path, &n);
    cr_assert_eq(n, 4);
    const cJSON *s = rows[0];
    cr_assert_str_eq(field(s, "type")->valuestring, "step");
    cr_assert_eq(num(s, "step"), 7);
    cr_assert_eq(num(s, "total"), 100);
    cr_assert_float_eq(num(s, "loss"), 2.3456789, 1e-9);
    cr_assert_float_eq(num(s, "ce"), 2.31, 1e-9);
    cr_assert_float_eq(num(s, "aux"), 0.0123, 1e-12);
    cr_assert_float_eq(num(s, "z"), 1.5e-5, 1e-15);
    cr_assert_float_eq(num(s, "lr"), 3e-4, 1e-15);
    cr_assert_float_eq(num(s, "grad_norm"), 0.75, 0);
    cr_assert_float_eq(num(s, "tokens_per_s"), 1234.5, 0);
    cr_assert_float_eq(num(s, "eta_s"), 3725.0, 0);
    cr_assert_eq(num(s, "peak_bytes"), 5368709120.0);
    cr_assert(cJSON_IsFalse(field(s, "skipped")));
    cr_assert_eq(num(s, "skips"), 0);
    cr_assert(num(s, "elapsed_s") >= 0);
    const cJSON *el = field(s, "expert_load");
    cr_assert(cJSON_IsArray(el) && cJSON_GetArraySize(el) == 2, "layers × experts");
    for (int l = 0; l < 2; l++) {
        const cJSON *row = cJSON_GetArrayItem(el, l);
        cr_assert_eq(cJSON_GetArraySize(row), 3);
        for (int e = 0; e < 3; e++)
            cr_assert_float_eq(cJSON_GetArrayItem(row, e)->valuedouble, load[l * 3 + e], 1e-7);
    }
    cr_assert(cJSON_IsNull(field(rows[1], "expert_load")), "no load: null, the key still there");
    cr_assert_str_eq(field(rows[2], "type")->valuestring, "eval");
    cr_assert_eq(num(rows[2], "step"), 8);
    cr_assert_float_eq(num(rows[2], "ppl"), 12.18, 1e-12);
    cr_assert_str_eq(field(rows[2], "split")->valuestring, "val");
    cr_assert(num(rows[2], "elapsed_s") >= 0);
    cr_assert_str_eq(field(rows[3], "type")->valuestring, "save");
    free_rows(rows, n);
    mt_test_rmrf(dir);
}

Test(metrics, non_finite_numbers_become_null) {
    char dir[256], path[400];
    mt_test_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    mt_metrics m;
    cr_assert_eq(mt_metrics_open(&m, path), 0);
    m.out = NULL;
    const float load[6] = {0.5f, NAN, 0.25f, INFINITY, 0.0f, 0.0f};
    mt_step_record r = sample_record(load);
    r.loss = NAN, r.ce = NAN, r.grad_norm = INFINITY, r.eta_s = -INFINITY, r.skipped = 1;
    mt_metrics_step(&m, &r);
    r.loss = 1.0, r.grad_norm = 1.0, r.skipped = 0, r.step = 8;
    mt_metrics_step(&m, &r);
    mt_metrics_close(&m);
    int n;
    cJSON **rows = read_jsonl(path, &n);
    cr_assert_eq(n, 2);
    const char *nulls[] = {"loss", "ce", "grad_norm", "eta_s"};
    for (size_t i = 0; i < MT_ARRAY_LEN(nulls); i++)
        cr_assert(cJSON_IsNull(field(rows[0], nulls[i])), "%s must be null", nulls[i]);
    cr_assert(cJSON_IsTrue(field(rows[0], "skipped")));
    cr_assert_eq(num(rows[0], "skips"), 1);
    cr_assert_float_eq(num(rows[0], "aux"), 0.0123, 1e-12, "finite fields stay numbers");
    const cJSON *row0 = cJSON_GetArrayItem(field(rows[0], "expert_load"), 0);
    const cJSON *row1 = cJSON_GetArrayItem(field(rows[0], "expert_load"), 1);
    cr_assert(cJSON_IsNull(cJSON_GetArrayItem(row0, 1)) && cJSON_IsNull(cJSON_GetArrayItem(row1, 0)));
    cr_assert(cJSON_IsFalse(field(rows[1], "skipped")));
    cr_assert_eq(num(rows[1], "skips"), 1, "the skip counter carries on");
    free_rows(rows, n);
    mt_test_rmrf(dir);
}

// Progress into a memory stream; returns the text (caller frees).
static char *run_progress(int tty, int every, int total, int skip_at) {
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    mt_metrics m;
    cr_assert_eq(mt_metrics_open(&m, NULL), 0);
    cr_assert_null(m.jsonl, "no path: no file");
    m.out = out, m.tty = tty, m.every = every;
    mt_step_record r = sample_record(NULL);
    r.total = total;
    for (int s = 1; s <= total; s++) {
        r.step = s;
        r.skipped = s == skip_at;
        mt_metrics_step(&m, &r);
        if (s == 2) mt_metrics_event(&m, "eval", "\"loss\":2.5");
    }
    mt_metrics_close(&m);
    fclose(out);
    return text;
}

Test(metrics, plain_progress_lines_off_a_terminal) {
    char *t = run_progress(0, 3, 7, 4);
    cr_assert_null(strchr(t, '\r'), "no carriage returns off a terminal: %s", t);
    cr_assert_null(strchr(t, '\033'), "no escape codes off a terminal");
    // every 3: steps 1 (first), 3, 6, 7 (last), plus 4 (skipped) and the eval event.
    const char *want[] = {"step=1/7 ", "step=3/7 ", "step=4/7 ", "step=6/7 ", "step=7/7 "};
    for (size_t i = 0; i < MT_ARRAY_LEN(want); i++) cr_assert(strstr(t, want[i]), "%s missing:\n%s", want[i], t);
    cr_assert_null(strstr(t, "step=2/7"));
    cr_assert_null(strstr(t, "step=5/7"));
    int lines = 0;
    for (char *p = t; *p; p++) lines += *p == '\n';
    cr_assert_eq(lines, 6, "5 steps + 1 event:\n%s", t);
    cr_assert(strstr(t, "step=4/7 loss=2.3457 aux=0.0123 lr=3.00e-04 gnorm=0.750 tok/s=1234 "
                        "eta=1h02m peak=5.00GiB SKIPPED"), "got:\n%s", t);
    cr_assert(strstr(t, "\neval: loss=2.5\n"), "got:\n%s", t);
    free(t);
    // every = 1: all steps.
    t = run_progress(0, 1, 5, 0);
    int n = 0;
    for (char *p = t; (p = strstr(p, "step=")); p++) n++;
    cr_assert_eq(n, 5);
    free(t);
}

Test(metrics, live_line_on_a_terminal) {
    char *t = run_progress(1, 1, 3, 0);
    cr_assert(strncmp(t, "\rstep=1/3 ", 10) == 0, "got: %s", t);
    cr_assert(strstr(t, "\033[K\neval: loss=2.5\n"),
              "an event ends the live line first: %s", t);
    cr_assert(strstr(t, "\rstep=3/3 "), "got: %s", t);
    cr_assert_eq(t[strlen(t) - 1], '\n', "the last line is ended");
    cr_assert_null(strstr(t, "step=1/3 loss=2.3457 aux=0.0123 lr=3.00e-04 gnorm=0.750 tok/s=1234 eta=1h02m peak=5.00GiB\n"),
                   "a step's line is overwritten, not ended");
    free(t);
}

Test(metrics, append_mode_ends_a_partial_line) {
    char dir[256], path[400];
    mt_test_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"type\":\"step\",\"step\":1}\n{\"type\":\"st", f);  // a crash mid-line
    fclose(f);
    mt_metrics m;
    cr_assert_eq(mt_metrics_open_ex(&m, path, 1), 0);
    m.out = NULL;
    mt_step_record r = sample_record(NULL);
    mt_metrics_step(&m, &r);
    mt_metrics_close(&m);
    char *buf;
    size_t len;
    cr_assert_eq(mt_read_file(path, 1 << 20, &buf, &len), 0);
    char *last = strstr(buf, "\"st\n");
    cr_assert_not_null(last, "partial line ended: %s", buf);
    cJSON *j = cJSON_Parse(last + 4);
    cr_assert_not_null(j, "the new record is a line of its own");
    cr_assert_eq(cJSON_GetObjectItem(j, "step")->valueint, 7);
    cJSON_Delete(j);
    free(buf);
    // A fresh open truncates.
    cr_assert_eq(mt_metrics_open(&m, path), 0);
    mt_metrics_close(&m);
    cr_assert_eq(mt_read_file(path, 1 << 20, &buf, &len), 0);
    cr_assert_eq(len, 0);
    free(buf);
    mt_test_rmrf(dir);
}

Test(metrics, bad_event_fields_keep_the_file_valid) {
    char dir[256], path[400];
    mt_test_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    mt_metrics m;
    cr_assert_eq(mt_metrics_open(&m, path), 0);
    m.out = NULL;
    mt_metrics_event(&m, "odd \"kind\"\n", "\"a\":1,}\n{\"b\":");
    mt_metrics_close(&m);
    int n;
    cJSON **rows = read_jsonl(path, &n);
    cr_assert_eq(n, 1, "one record, one line");
    cr_assert_str_eq(field(rows[0], "type")->valuestring, "odd \"kind\"\n");
    cr_assert_str_eq(field(rows[0], "bad_fields")->valuestring, "\"a\":1,}\n{\"b\":");
    free_rows(rows, n);
    cr_assert_neq(mt_metrics_open(&m, "/nonexistent-dir/x/m.jsonl"), 0);
    cr_assert(strstr(mt_error_get(), "/nonexistent-dir/x/m.jsonl"), "got: %s", mt_error_get());
    mt_test_rmrf(dir);
}

Test(metrics, duration_and_byte_formats) {
    char b[32];
    mt_format_duration(b, sizeof b, 45.4); cr_assert_str_eq(b, "45s");
    mt_format_duration(b, sizeof b, 723); cr_assert_str_eq(b, "12m03s");
    mt_format_duration(b, sizeof b, 3725); cr_assert_str_eq(b, "1h02m");
    mt_format_duration(b, sizeof b, NAN); cr_assert_str_eq(b, "?");
    mt_format_duration(b, sizeof b, 1e300); cr_assert_str_eq(b, "277777h46m");
    mt_format_bytes(b, sizeof b, 512); cr_assert_str_eq(b, "512B");
    mt_format_bytes(b, sizeof b, 812ull << 20); cr_assert_str_eq(b, "812MiB");
    mt_format_bytes(b, sizeof b, 1320702443ull); cr_assert_str_eq(b, "1.23GiB");
}
