// A raw NUL or other control byte inside a JSONL string (text, instruction/input/output, chat
// messages) is refused with file:line and the column: never a sample silently cut at the NUL.
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "data/data.h"
#include "data/tokenizer.h"
#include "tests/test_util.h"

// `path` with the byte-level tokenizer and default options.
static int load(const char *path, mt_dataset *d) {
    mt_tokenizer tok;
    cr_assert_eq(mt_tokenizer_init_bytes(&tok, 256, 1, 2), 0);
    mt_data_opts o;
    mt_data_opts_default(&o);
    int rc = mt_dataset_load(d, path, &tok, &o);
    mt_tokenizer_free(&tok);
    return rc;
}

// Loads `good line \n bad line` (bad given with its length, raw bytes and all); the error must name
// line 2 and say what was found.
static void expect_refused(const char *bad, size_t n, const char *phrase) {
    char dir[64], path[128];
    mt_test_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/d.jsonl", dir);
    FILE *f = fopen(path, "wb");
    fputs("{\"text\": \"fine\"}\n", f);
    fwrite(bad, 1, n, f);
    fputs("\n", f);
    fclose(f);
    mt_dataset d;
    cr_assert_neq(load(path, &d), 0, "accepted: %.*s", (int)n, bad);
    char want[160];
    snprintf(want, sizeof want, "%s:2:", path);
    cr_assert(strstr(mt_error_get(), want), "line 2 not named: %s", mt_error_get());
    cr_assert(strstr(mt_error_get(), phrase), "'%s' not said: %s", phrase, mt_error_get());
    mt_dataset_free(&d);
    mt_test_rmrf(dir);
}

#define REFUSED(lit, phrase) expect_refused(lit, sizeof(lit) - 1, phrase)

Test(data_control, raw_nul_in_every_field_is_refused) {
    REFUSED("{\"text\": \"hello\0world goes on\"}", "raw control byte 0x00 at column 16");
    REFUSED("{\"instruction\": \"do\0it\", \"output\": \"x\"}", "raw control byte 0x00");
    REFUSED("{\"instruction\": \"do\", \"input\": \"in\0put\", \"output\": \"x\"}", "raw control byte 0x00");
    REFUSED("{\"instruction\": \"do\", \"output\": \"ou\0t\"}", "raw control byte 0x00");
    REFUSED("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\0there\"}, {\"role\": \"assistant\", "
            "\"content\": \"x\"}]}", "raw control byte 0x00");
    REFUSED("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
            "\"content\": \"x\0y\"}]}", "raw control byte 0x00");
    REFUSED("{\"messages\": [{\"role\": \"us\0er\", \"content\": \"hi\"}]}", "raw control byte 0x00");
}

Test(data_control, other_raw_control_bytes_are_refused_too) {
    REFUSED("{\"text\": \"bell\a here\"}", "raw control byte 0x07");
    REFUSED("{\"text\": \"tab\there\"}", "raw control byte 0x09");
    REFUSED("{\"text\": \"line\rbreak\"}", "raw control byte 0x0d");
    REFUSED("{\"text\": \"esc\x1b[0m\"}", "raw control byte 0x1b");
    REFUSED("{\"text\":\0\"a\"}", "raw control byte 0x00");  // outside a string: not whitespace
}

Test(data_control, escapes_and_whitespace_between_tokens_are_fine) {
    char dir[64], path[128];
    mt_test_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/d.jsonl", dir);
    FILE *f = fopen(path, "wb");
    fputs("{\t\"text\":\t\"a \\\"quoted\\\" \\\\ tab\\there\"\t}\r\n", f);
    fclose(f);
    mt_dataset d;
    int rc = load(path, &d);
    cr_assert(rc != 0 ? strstr(mt_error_get(), "reserved") != NULL : d.n == 1, "%s", mt_error_get());
    if (rc == 0) mt_dataset_free(&d);
    mt_test_rmrf(dir);
}
