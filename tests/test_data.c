// Data: the three JSONL forms with their loss masks token by token, every bad line with its
// line number, length handling, token files, packing/padding layouts, shuffling and resume.
// Byte-level tokenizer (vocab 256, BOS 1, EOS 2) so that every expected id is readable.
#include <criterion/criterion.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "tests/test_util.h"
#include "data/data.h"
#include "data/tokenizer.h"

#define IGN MT_LABEL_IGNORE

typedef struct fx {
    char dir[64];
    char path[160];
    mt_tokenizer tok;
    mt_data_opts o;
} fx;

static void fx_init(fx *f) {
    mt_test_tmpdir(f->dir, sizeof f->dir);
    cr_assert_eq(mt_tokenizer_init_bytes(&f->tok, 256, 1, 2), 0, "%s", mt_error_get());
    mt_data_opts_default(&f->o);
    f->o.shuffle = 0;
}

static void fx_done(fx *f) { mt_test_rmrf(f->dir); }

static const char *fx_write(fx *f, const char *name, const char *content) {
    snprintf(f->path, sizeof f->path, "%s/%s", f->dir, name);
    FILE *fp = fopen(f->path, "wb");
    cr_assert(fp);
    fputs(content, fp);
    fclose(fp);
    return f->path;
}

static int fx_load(fx *f, mt_dataset *d, const char *jsonl) {
    return mt_dataset_load(d, fx_write(f, "data.jsonl", jsonl), &f->tok, &f->o);
}

// The expected sample, built from segments the way the spec in data.h says.
typedef struct expect {
    int32_t tok[4096], lab[4096];
    int n;
} expect;

static void ex_text(expect *e, const char *s, int in_loss) {
    for (; *s; s++) {
        e->tok[e->n] = (uint8_t)*s;
        e->lab[e->n++] = in_loss ? (uint8_t)*s : IGN;
    }
}
static void ex_id(expect *e, int32_t id, int in_loss) {
    e->tok[e->n] = id;
    e->lab[e->n++] = in_loss ? id : IGN;
}

static void assert_sample(const mt_dataset *d, int64_t i, const expect *e) {
    const int32_t *tok, *lab;
    int64_t n = mt_dataset_sample(d, i, &tok, &lab);
    cr_assert_eq(n, e->n, "sample %lld: %lld tokens, expected %d", (long long)i, (long long)n, e->n);
    for (int k = 0; k < e->n; k++) {
        cr_assert_eq(tok[k], e->tok[k], "sample %lld token %d: %d, expected %d", (long long)i, k,
                     tok[k], e->tok[k]);
        cr_assert_eq(lab[k], e->lab[k], "sample %lld label %d: %d, expected %d", (long long)i, k,
                     lab[k], e->lab[k]);
    }
}

// ---------------------------------------------------------------------------------------------
// The three forms

Test(data, text_form_all_in_loss) {
    fx f;
    fx_init(&f);
    mt_dataset d;
    cr_assert_eq(fx_load(&f, &d, "{\"text\": \"hi \\u00e9\"}\n"), 0, "%s", mt_error_get());
    expect e = {0};
    ex_id(&e, 1, 0);               // BOS: never a target
    ex_text(&e, "hi \xc3\xa9", 1);  // the \u escape arrives as UTF-8 bytes
    ex_id(&e, 2, 1);               // EOS in the loss
    assert_sample(&d, 0, &e);
    cr_assert_eq(d.stats.text, 1);
    cr_assert_eq(d.stats.tokens, 7);
    cr_assert_eq(d.stats.loss_tokens, 6);
    mt_dataset_free(&d);
    fx_done(&f);
}

Test(data, instruction_form_prompt_masked) {
    fx f;
    fx_init(&f);
    mt_dataset d;
    cr_assert_eq(fx_load(&f, &d,
                         "{\"instruction\": \"Reverse\", \"input\": \"abc\", \"output\": \"cba\"}\n"
                         "{\"instruction\": \"Say hi\", \"output\": \"hi\", \"id\": 7}\n"
                         "{\"instruction\": \"Say hi\", \"input\": \"\", \"output\": \"hi\"}\n"
                         "{\"instruction\": \"Say hi\", \"input\": null, \"output\": \"hi\"}\n"),
                 0, "%s", mt_error_get());
    cr_assert_eq(d.n, 4);
    expect e = {0};
    ex_id(&e, 1, 0);
    ex_text(&e,
            "Below is an instruction that describes a task, paired with an input that provides "
            "further context. Write a response that appropriately completes the request.\n\n"
            "### Instruction:\nReverse\n\n### Input:\nabc\n\n### Response:\n", 0);
    ex_text(&e, "cba", 1);
    ex_id(&e, 2, 1);
    assert_sample(&d, 0, &e);
    expect e2 = {0};
    ex_id(&e2, 1, 0);
    ex_text(&e2,
            "Below is an instruction that describes a task. Write a response that appropriately "
            "completes the request.\n\n### Instruction:\nSay hi\n\n### Response:\n", 0);
    ex_text(&e2, "hi", 1);
    ex_id(&e2, 2, 1);
    for (int i = 1; i < 4; i++) assert_sample(&d, i, &e2);  // missing, empty, null input alike
    cr_assert_eq(d.stats.instruction, 4);
    cr_assert_eq(d.stats.loss_tokens, 4 + 3 * 3);
    mt_dataset_free(&d);

    f.o.prompt = MT_PROMPT_ALPACA_SHORT;
    cr_assert_eq(fx_load(&f, &d, "{\"instruction\": \"Rev\", \"input\": \"ab\", \"output\": \"ba\"}\n"),
                 0, "%s", mt_error_get());
    expect e3 = {0};
    ex_id(&e3, 1, 0);
    ex_text(&e3, "### Instruction:\nRev\n\n### Input:\nab\n\n### Response:\n", 0);
    ex_text(&e3, "ba", 1);
    ex_id(&e3, 2, 1);
    assert_sample(&d, 0, &e3);
    mt_dataset_free(&d);
    fx_done(&f);
}

Test(data, chat_form_mixtral_template) {
    fx f;
    fx_init(&f);
    mt_dataset d;
    cr_assert_eq(fx_load(&f, &d,
                         "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
                         " {\"role\": \"user\", \"content\": \"Hi?\"},"
                         " {\"role\": \"assistant\", \"content\": \"Hello.\"},"
                         " {\"role\": \"user\", \"content\": \"2+2?\"},"
                         " {\"role\": \"assistant\", \"content\": \"4\"}]}\n"
                         "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"},"
                         " {\"role\": \"assistant\", \"content\": \"b\"},"
                         " {\"role\": \"user\", \"content\": \"c\"}]}\n"),
                 0, "%s", mt_error_get());
    // <s>[INST] Be brief.\n\nHi? [/INST]Hello.</s>[INST] 2+2? [/INST]4</s>
    expect e = {0};
    ex_id(&e, 1, 0);
    ex_text(&e, "[INST] Be brief.\n\nHi? [/INST]", 0);
    ex_text(&e, "Hello.", 1);
    ex_id(&e, 2, 1);
    ex_text(&e, "[INST] 2+2? [/INST]", 0);
    ex_text(&e, "4", 1);
    ex_id(&e, 2, 1);
    assert_sample(&d, 0, &e);
    // A trailing user turn is kept, out of the loss.
    expect e2 = {0};
    ex_id(&e2, 1, 0);
    ex_text(&e2, "[INST] a [/INST]", 0);
    ex_text(&e2, "b", 1);
    ex_id(&e2, 2, 1);
    ex_text(&e2, "[INST] c [/INST]", 0);
    assert_sample(&d, 1, &e2);
    cr_assert_eq(d.stats.chat, 2);
    mt_dataset_free(&d);
    fx_done(&f);
}

// The renderer alone, as `generate` uses it: a conversation ending on a user turn is a prompt.
static int collect(void *ctx, mt_seg_kind kind, const char *text, size_t len, int in_loss) {
    char *buf = ctx;
    char piece[256];
    if (kind == MT_SEG_BOS) snprintf(piece, sizeof piece, "<s>");
    else if (kind == MT_SEG_EOS) snprintf(piece, sizeof piece, "</s>");
    else snprintf(piece, sizeof piece, "%s%.*s%s", in_loss ? "{" : "", (int)len, text, in_loss ? "}" : "");
    strcat(buf, piece);
    return 0;
}

Test(data, chat_render_for_generation) {
    char out[512] = "";
    mt_chat_msg m[] = {{"user", "Hi", 0, NULL}};
    cr_assert_eq(mt_chat_render(m, 1, 0, collect, out), 0, "%s", mt_error_get());
    cr_assert_str_eq(out, "<s>[INST] Hi [/INST]");
    cr_assert_neq(mt_chat_render(m, 1, 1, collect, out), 0, "training needs an assistant turn");
    out[0] = 0;
    cr_assert_eq(mt_instruction_render("Do", NULL, NULL, MT_PROMPT_ALPACA_SHORT, collect, out), 0);
    cr_assert_str_eq(out, "<s>### Instruction:\nDo\n\n### Response:\n");
}

// ---------------------------------------------------------------------------------------------
// Bad lines: the error names the file and the line; the load fails.

static void expect_bad_line(const char *bad, const char *phrase) {
    fx f;
    fx_init(&f);
    char content[1024];
    // A good line, a blank line, then the bad one: line 3.
    snprintf(content, sizeof content, "{\"text\": \"fine\"}\n\n%s\n{\"text\": \"after\"}\n", bad);
    mt_dataset d;
    cr_assert_neq(fx_load(&f, &d, content), 0, "accepted: %s", bad);
    char want[256];
    snprintf(want, sizeof want, "%s:3:", f.path);
    cr_assert(strstr(mt_error_get(), want), "line 3 not named for %s; got: %s", bad, mt_error_get());
    cr_assert(strstr(mt_error_get(), phrase), "'%s' not said for %s; got: %s", phrase, bad,
              mt_error_get());
    mt_dataset_free(&d);
    fx_done(&f);
}

Test(data, bad_lines_named) {
    expect_bad_line("{\"text\": \"unterminated}", "invalid JSON");
    expect_bad_line("{\"text\": \"a\"} trailing", "more text after");
    expect_bad_line("[\"text\", \"a\"]", "not a JSON object");
    expect_bad_line("\"just a string\"", "not a JSON object");
    expect_bad_line("{\"question\": \"a\", \"answer\": \"b\"}", "no \"text\"");  // prompt/completion is TRL's form (below)
    expect_bad_line("{\"text\": \"\"}", "\"text\" is empty");
    expect_bad_line("{\"text\": 5}", "\"text\" must be a string");
    expect_bad_line("{\"text\": \"a\", \"messages\": []}", "more than one form");
    expect_bad_line("{\"instruction\": \"do\"}", "missing \"output\"");
    expect_bad_line("{\"output\": \"done\"}", "missing \"instruction\"");
    expect_bad_line("{\"instruction\": \"do\", \"output\": \"\"}", "\"output\" is empty");
    expect_bad_line("{\"instruction\": \"do\", \"input\": 3, \"output\": \"x\"}", "\"input\" must be a string");
    expect_bad_line("{\"text\": \"bad \xff byte\"}", "not valid UTF-8");
    expect_bad_line("{\"text\": \"ctl \\u0002 byte\"}", "reserved");
    expect_bad_line("{\"text\": \"cut \\u0000 here\"}", "NUL");
    expect_bad_line("{\"messages\": \"hi\"}", "must be an array");
    expect_bad_line("{\"messages\": []}", "\"messages\" is empty");
    expect_bad_line("{\"messages\": [\"hi\"]}", "messages[0] is not an object");
    expect_bad_line("{\"messages\": [{\"role\": \"user\"}]}", "messages[0]: missing \"content\"");
    expect_bad_line("{\"messages\": [{\"role\": \"user\", \"content\": 1}]}", "\"content\" must be a string");
    expect_bad_line("{\"messages\": [{\"role\": \"bot\", \"content\": \"x\"}]}", "unknown role \"bot\"");
    expect_bad_line("{\"messages\": [{\"role\": \"user\", \"content\": \"\"},"
                    " {\"role\": \"assistant\", \"content\": \"x\"}]}", "\"content\" is empty");
    expect_bad_line("{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\"}]}", "alternate");
    expect_bad_line("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"},"
                    " {\"role\": \"user\", \"content\": \"b\"}]}", "alternate");
    expect_bad_line("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"},"
                    " {\"role\": \"system\", \"content\": \"b\"}]}", "system message may only come first");
    expect_bad_line("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}", "no assistant turn");
    expect_bad_line("{\"messages\": [{\"role\": \"system\", \"content\": \"a\"}]}", "no user message");
}

Test(data, missing_file_and_crlf) {
    fx f;
    fx_init(&f);
    mt_dataset d;
    cr_assert_neq(mt_dataset_load(&d, "/nonexistent/x.jsonl", &f.tok, &f.o), 0);
    cr_assert(strstr(mt_error_get(), "/nonexistent/x.jsonl"), "got: %s", mt_error_get());
    mt_dataset_free(&d);
    // Windows line ends and a last line without a newline are fine; an escaped backslash before
    // "u0000" is text, not a NUL.
    cr_assert_eq(fx_load(&f, &d, "{\"text\": \"a\"}\r\n\r\n{\"text\": \"b\\\\u0000\"}"), 0, "%s",
                 mt_error_get());
    cr_assert_eq(d.n, 2);
    cr_assert_eq(mt_dataset_sample(&d, 1, NULL, NULL), 1 + 7 + 1, "b\\u0000 is 7 bytes");
    cr_assert_eq(d.stats.blank_lines, 1);
    mt_dataset_free(&d);
    fx_done(&f);
}

// ---------------------------------------------------------------------------------------------
// Lengths

static const char *overlong_data =
    "{\"text\": \"abc\"}\n"           // 5 tokens
    "{\"text\": \"abcdefghij\"}\n"    // 12 tokens > seq 8
    "{\"instruction\": \"a much too long instruction for eight\", \"output\": \"x\"}\n";

Test(data, overlong_truncate) {
    fx f;
    fx_init(&f);
    f.o.seq = 8;
    f.o.prompt = MT_PROMPT_ALPACA_SHORT;
    mt_dataset d;
    cr_assert_eq(fx_load(&f, &d, overlong_data), 0, "%s", mt_error_get());
    cr_assert_eq(d.n, 2);
    cr_assert_eq(d.stats.truncated, 1);
    cr_assert_eq(d.stats.dropped_truncated, 1, "the prompt alone fills seq: nothing left to learn");
    cr_assert_eq(d.stats.longest, 8);
    expect e = {0};
    ex_id(&e, 1, 0);
    ex_text(&e, "abcdefg", 1);  // first 8 tokens kept: EOS cut
    assert_sample(&d, 1, &e);
    mt_dataset_free(&d);
    fx_done(&f);
}

Test(data, overlong_drop) {
    fx f;
    fx_init(&f);
    f.o.seq = 8;
    f.o.overlong = MT_OVERLONG_DROP;
    mt_dataset d;
    cr_assert_eq(fx_load(&f, &d, overlong_data), 0, "%s", mt_error_get());
    cr_assert_eq(d.n, 1);
    cr_assert_eq(d.stats.dropped_overlong, 2);
    cr_assert_eq(d.stats.truncated, 0);
    char line[512];
    mt_data_stats_format(&d.stats, line, sizeof line);
    cr_assert(strstr(line, "samples=1 ") && strstr(line, "dropped_overlong=2 "), "%s", line);
    mt_dataset_free(&d);
    fx_done(&f);
}

Test(data, overlong_refuse) {
    fx f;
    fx_init(&f);
    f.o.seq = 8;
    f.o.overlong = MT_OVERLONG_REFUSE;
    mt_dataset d;
    cr_assert_neq(fx_load(&f, &d, overlong_data), 0);
    char want[256];
    snprintf(want, sizeof want, "%s:2: sample of more than 8 tokens is longer than --seq 8", f.path);
    cr_assert(strstr(mt_error_get(), want), "got: %s", mt_error_get());
    mt_dataset_free(&d);
    mt_overlong m;
    cr_assert_eq(mt_overlong_parse("drop", &m), 0);
    cr_assert_eq(m, MT_OVERLONG_DROP);
    cr_assert_neq(mt_overlong_parse("cut", &m), 0);
    fx_done(&f);
}

Test(data, zero_usable_samples) {
    fx f;
    fx_init(&f);
    f.o.seq = 4;
    f.o.overlong = MT_OVERLONG_DROP;
    mt_dataset d;
    cr_assert_neq(fx_load(&f, &d, "{\"text\": \"abcdef\"}\n{\"text\": \"ghijkl\"}\n"), 0);
    cr_assert(strstr(mt_error_get(), "no usable sample") && strstr(mt_error_get(), "2 longer"),
              "got: %s", mt_error_get());
    mt_dataset_free(&d);
    cr_assert_neq(fx_load(&f, &d, "\n\n"), 0, "blank lines only");
    cr_assert(strstr(mt_error_get(), "no usable sample"), "got: %s", mt_error_get());
    mt_dataset_free(&d);
    fx_done(&f);
}

// ---------------------------------------------------------------------------------------------
// Token files

Test(data, token_file_round_trip) {
    fx f;
    fx_init(&f);
    mt_dataset a, b;
    cr_assert_eq(fx_load(&f, &a,
                         "{\"text\": \"hello\"}\n"
                         "{\"instruction\": \"Rev\", \"output\": \"ver\"}\n"
                         "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"},"
                         " {\"role\": \"assistant\", \"content\": \"a\"}]}\n"),
                 0, "%s", mt_error_get());
    char tok[160];
    snprintf(tok, sizeof tok, "%s/data.mttok", f.dir);
    cr_assert_eq(mt_dataset_save_tokens(&a, tok), 0, "%s", mt_error_get());
    cr_assert_eq(mt_dataset_load(&b, tok, &f.tok, &f.o), 0, "%s", mt_error_get());
    cr_assert_eq(b.n, a.n);
    cr_assert_eq(b.stats.pretokenized, 3);
    for (int64_t i = 0; i < a.n; i++) {
        const int32_t *ta, *la, *tb, *lb;
        int64_t na = mt_dataset_sample(&a, i, &ta, &la), nb = mt_dataset_sample(&b, i, &tb, &lb);
        cr_assert_eq(na, nb);
        cr_assert_arr_eq(ta, tb, (size_t)na * 4, "sample %lld tokens", (long long)i);
        cr_assert_arr_eq(la, lb, (size_t)na * 4, "sample %lld labels", (long long)i);
    }
    cr_assert_eq(mt_dataset_fingerprint(&a), mt_dataset_fingerprint(&b));
    mt_dataset_free(&a);
    mt_dataset_free(&b);

    // Without a mask every token is in the loss but a sample's first; a 0-length sample is
    // dropped as empty, a 1-token one as fully masked.
    int64_t off[] = {0, 3, 3, 4};
    int32_t ids[] = {1, 65, 66, 9};
    cr_assert_eq(mt_tokfile_write(tok, 3, off, ids, NULL), 0, "%s", mt_error_get());
    cr_assert_eq(mt_dataset_load(&b, tok, &f.tok, &f.o), 0, "%s", mt_error_get());
    cr_assert_eq(b.n, 1);
    cr_assert_eq(b.stats.dropped_empty, 1);
    cr_assert_eq(b.stats.dropped_masked, 1);
    expect e = {0};
    ex_id(&e, 1, 0);
    ex_id(&e, 65, 1);
    ex_id(&e, 66, 1);
    assert_sample(&b, 0, &e);
    mt_dataset_free(&b);
    fx_done(&f);
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *fp = fopen(path, "wb");
    cr_assert(fp);
    cr_assert_eq(fwrite(p, 1, n, fp), n);
    fclose(fp);
}

Test(data, token_file_damage_refused) {
    fx f;
    fx_init(&f);
    char tok[160];
    snprintf(tok, sizeof tok, "%s/t.mttok", f.dir);
    int64_t off[] = {0, 4, 8};
    int32_t ids[] = {1, 10, 11, 2, 1, 12, 13, 2};
    uint8_t mask[] = {0, 1, 1, 1, 0, 0, 1, 1};
    cr_assert_eq(mt_tokfile_write(tok, 2, off, ids, mask), 0);
    // 16 header + 2 × (4 + 4·4 + 4) = 64 bytes
    char *buf;
    size_t len;
    FILE *fp = fopen(tok, "rb");
    buf = malloc(256);
    len = fread(buf, 1, 256, fp);
    fclose(fp);
    cr_assert_eq(len, 64);
    mt_dataset d;
    cr_assert_eq(mt_dataset_load(&d, tok, &f.tok, &f.o), 0, "%s", mt_error_get());
    cr_assert_eq(d.stats.loss_tokens, 3 + 2);
    mt_dataset_free(&d);

    // Cut anywhere: refused, naming the sample, never read past the end.
    size_t cuts[] = {63, 60, 45, 41, 40, 30, 20, 10};
    for (size_t k = 0; k < MT_ARRAY_LEN(cuts); k++) {
        write_bytes(tok, buf, cuts[k]);
        cr_assert_neq(mt_dataset_load(&d, tok, &f.tok, &f.o), 0, "cut to %zu accepted", cuts[k]);
        cr_assert(strstr(mt_error_get(), cuts[k] >= 16 ? "truncated" : "header"),
                  "cut %zu: %s", cuts[k], mt_error_get());
        mt_dataset_free(&d);
    }
    write_bytes(tok, buf, 50);
    cr_assert_neq(mt_dataset_load(&d, tok, &f.tok, &f.o), 0);
    cr_assert(strstr(mt_error_get(), "sample 1: truncated"), "got: %s", mt_error_get());
    mt_dataset_free(&d);
    // Trailing bytes, a count too large for the file, unknown flags, bad mask, bad id.
    memcpy(buf + 64, "xx", 2);
    write_bytes(tok, buf, 66);
    cr_assert_neq(mt_dataset_load(&d, tok, &f.tok, &f.o), 0);
    cr_assert(strstr(mt_error_get(), "2 bytes after the last"), "got: %s", mt_error_get());
    mt_dataset_free(&d);
    char *bad = malloc(64);
    memcpy(bad, buf, 64);
    uint64_t huge = 1ull << 60;
    memcpy(bad + 8, &huge, 8);
    write_bytes(tok, bad, 64);
    cr_assert_neq(mt_dataset_load(&d, tok, &f.tok, &f.o), 0);
    cr_assert(strstr(mt_error_get(), "says 1152921504606846976 samples"), "got: %s", mt_error_get());
    mt_dataset_free(&d);
    memcpy(bad, buf, 64);
    bad[6] = 6;
    write_bytes(tok, bad, 64);
    cr_assert_neq(mt_dataset_load(&d, tok, &f.tok, &f.o), 0);
    cr_assert(strstr(mt_error_get(), "flags"), "got: %s", mt_error_get());
    mt_dataset_free(&d);
    memcpy(bad, buf, 64);
    bad[16 + 4 + 16 + 1] = 7;  // sample 0's mask byte 1
    write_bytes(tok, bad, 64);
    cr_assert_neq(mt_dataset_load(&d, tok, &f.tok, &f.o), 0);
    cr_assert(strstr(mt_error_get(), "sample 0: mask byte 7"), "got: %s", mt_error_get());
    mt_dataset_free(&d);
    memcpy(bad, buf, 64);
    int32_t big = 256;
    memcpy(bad + 16 + 24 + 4 + 8, &big, 4);  // sample 1, token 2
    write_bytes(tok, bad, 64);
    cr_assert_neq(mt_dataset_load(&d, tok, &f.tok, &f.o), 0);
    cr_assert(strstr(mt_error_get(), "sample 1: token id 256 at position 2"), "got: %s",
              mt_error_get());
    mt_dataset_free(&d);
    free(bad);
    free(buf);
    fx_done(&f);
}

// ---------------------------------------------------------------------------------------------
// Batches

// Samples "a".."f" of lengths 3..8 (BOS + n letters + EOS with n = 1..6).
static const char *six =
    "{\"text\": \"a\"}\n{\"text\": \"bb\"}\n{\"text\": \"ccc\"}\n"
    "{\"text\": \"dddd\"}\n{\"text\": \"eeeee\"}\n{\"text\": \"ffffff\"}\n";

Test(data, padded_layout) {
    fx f;
    fx_init(&f);
    mt_dataset d;
    cr_assert_eq(fx_load(&f, &d, six), 0, "%s", mt_error_get());
    enum { B = 4, S = 8 };
    int32_t tok[B * S], lab[B * S], mask[B * S];
    mt_data_cursor c = {0, 0};
    cr_assert_eq(mt_data_next_batch(&d, &c, B, S, tok, lab, mask), B, "%s", mt_error_get());
    for (int r = 0; r < B; r++) {
        int len = r + 3;
        for (int k = 0; k < S; k++) {
            int32_t want_tok = k == 0 ? 1 : k < len - 1 ? 'a' + r : k == len - 1 ? 2 : 0;
            int32_t want_lab = k == 0 || k >= len ? IGN : want_tok;
            cr_assert_eq(tok[r * S + k], want_tok, "row %d col %d", r, k);
            cr_assert_eq(lab[r * S + k], want_lab, "row %d col %d", r, k);
            cr_assert_eq(mask[r * S + k], k < len, "row %d col %d", r, k);
        }
    }
    cr_assert_eq(c.epoch, 0);
    cr_assert_eq(c.index, 4);
    // Two more rows finish the epoch; the next batch continues into epoch 1.
    cr_assert_eq(mt_data_next_batch(&d, &c, B, S, tok, lab, mask), B);
    cr_assert_eq(tok[0 * S + 1], 'e');
    cr_assert_eq(tok[1 * S + 1], 'f');
    cr_assert_eq(tok[2 * S + 1], 'a', "epoch 1 starts (no shuffle: same order)");
    cr_assert_eq(c.epoch, 1);
    cr_assert_eq(c.index, 2);
    // Rows too short for the longest sample are refused.
    cr_assert_eq(mt_data_next_batch(&d, &c, B, 7, tok, lab, mask), -1);
    cr_assert(strstr(mt_error_get(), "longest"), "got: %s", mt_error_get());
    mt_data_cursor bad = {0, 6};
    cr_assert_eq(mt_data_next_batch(&d, &bad, B, S, tok, lab, mask), -1);
    cr_assert(strstr(mt_error_get(), "cursor"), "got: %s", mt_error_get());
    mt_dataset_free(&d);
    fx_done(&f);
}

Test(data, packed_layout) {
    fx f;
    fx_init(&f);
    f.o.packing = 1;
    mt_dataset d;
    cr_assert_eq(fx_load(&f, &d, six), 0, "%s", mt_error_get());
    enum { B = 4, S = 10 };
    int32_t tok[B * S], lab[B * S], mask[B * S];
    mt_data_cursor c = {0, 0};
    cr_assert_eq(mt_data_epoch_rows(&d, 0, S), 5);
    cr_assert_eq(mt_data_next_batch(&d, &c, B, S, tok, lab, mask), B, "%s", mt_error_get());
    // Lengths 3..8 into rows of 10, whole samples only, in order (no shuffle).
    const char *rows[B] = {
        "\x01" "a\x02\x01" "bb\x02___",   // a b, pad 3
        "\x01" "ccc\x02_____",            // c alone (c + d = 11 > 10)
        "\x01" "dddd\x02____",            // d alone (d + e = 13)
        "\x01" "eeeee\x02___",            // e alone
    };
    for (int r = 0; r < B; r++)
        for (int k = 0; k < S; k++) {
            char ch = rows[r][k];
            int pad = ch == '_';
            cr_assert_eq(tok[r * S + k], pad ? 0 : (uint8_t)ch, "row %d col %d", r, k);
            cr_assert_eq(mask[r * S + k], !pad, "row %d col %d", r, k);
            // Labels: the token, except padding and every document's first token (its BOS):
            // the previous document's last token never learns to predict the next document.
            int first = ch == '\x01';
            cr_assert_eq(lab[r * S + k], pad || first ? IGN : (uint8_t)ch, "row %d col %d", r, k);
        }
    cr_assert_eq(c.index, 5);
    cr_assert_eq(mt_data_next_batch(&d, &c, B, S, tok, lab, mask), B);
    cr_assert_eq(tok[1], 'f');
    cr_assert_eq(mask[7], 1);
    cr_assert_eq(mask[8], 0);
    cr_assert_eq(tok[S + 1], 'a', "row 1 is epoch 1");
    cr_assert_eq(c.epoch, 1);
    mt_dataset_free(&d);

    // Small samples fill a row several at a time; the end of an epoch ends the row even where
    // the next epoch's first sample would fit: a row never mixes epochs.
    cr_assert_eq(fx_load(&f, &d, "{\"text\":\"a\"}\n{\"text\":\"b\"}\n{\"text\":\"c\"}\n"), 0);
    c = (mt_data_cursor){0, 0};
    int32_t t1[24], l1[24], m1[24];
    cr_assert_eq(mt_data_next_batch(&d, &c, 2, 12, t1, l1, m1), 2);
    int32_t want[24] = {1, 'a', 2, 1, 'b', 2, 1, 'c', 2, 0, 0, 0,
                        1, 'a', 2, 1, 'b', 2, 1, 'c', 2, 0, 0, 0};
    int32_t wlab[24] = {IGN, 'a', 2, IGN, 'b', 2, IGN, 'c', 2, IGN, IGN, IGN,
                        IGN, 'a', 2, IGN, 'b', 2, IGN, 'c', 2, IGN, IGN, IGN};
    int32_t wmask[24] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0};
    cr_assert_arr_eq(t1, want, sizeof want);
    cr_assert_arr_eq(l1, wlab, sizeof wlab);
    cr_assert_arr_eq(m1, wmask, sizeof wmask);
    cr_assert_eq(c.epoch, 2);
    mt_dataset_free(&d);
    fx_done(&f);
}

// The order of samples (by their first letter) over `batches` batches of B rows of S.
static void order_of(mt_dataset *d, mt_data_cursor *c, int batches, int B, int S, char *out) {
    int32_t *tok = malloc(sizeof(int32_t) * B * S), *lab = malloc(sizeof(int32_t) * B * S),
            *mask = malloc(sizeof(int32_t) * B * S);
    int n = 0;
    for (int b = 0; b < batches; b++) {
        cr_assert_eq(mt_data_next_batch(d, c, B, S, tok, lab, mask), B, "%s", mt_error_get());
        for (int i = 0; i < B * S; i++)
            if (tok[i] == 1) out[n++] = (char)tok[i + 1];
    }
    out[n] = 0;
    free(tok);
    free(lab);
    free(mask);
}

static const char *letters =
    "{\"text\":\"a\"}\n{\"text\":\"b\"}\n{\"text\":\"c\"}\n{\"text\":\"d\"}\n{\"text\":\"e\"}\n"
    "{\"text\":\"f\"}\n{\"text\":\"g\"}\n{\"text\":\"h\"}\n{\"text\":\"i\"}\n{\"text\":\"j\"}\n"
    "{\"text\":\"k\"}\n{\"text\":\"l\"}\n{\"text\":\"m\"}\n{\"text\":\"n\"}\n{\"text\":\"o\"}\n"
    "{\"text\":\"p\"}\n";

static int is_permutation(const char *s, int n) {
    int seen[26] = {0};
    for (int i = 0; i < n; i++) {
        if (s[i] < 'a' || s[i] >= 'a' + n || seen[s[i] - 'a']++) return 0;
    }
    return 1;
}

Test(data, shuffle_by_seed_and_epoch) {
    fx f;
    fx_init(&f);
    f.o.shuffle = 1;
    f.o.seed = 42;
    mt_dataset d1, d2, d3;
    cr_assert_eq(fx_load(&f, &d1, letters), 0);
    cr_assert_eq(fx_load(&f, &d2, letters), 0);
    f.o.seed = 43;
    cr_assert_eq(fx_load(&f, &d3, letters), 0);
    char o1[64], o2[64], o3[64];
    mt_data_cursor c1 = {0, 0}, c2 = {0, 0}, c3 = {0, 0};
    order_of(&d1, &c1, 4, 8, 4, o1);  // 32 rows: epochs 0 and 1
    order_of(&d2, &c2, 4, 8, 4, o2);
    order_of(&d3, &c3, 4, 8, 4, o3);
    cr_assert_str_eq(o1, o2, "same seed, same order");
    cr_assert_str_neq(o1, o3, "another seed, another order");
    cr_assert(is_permutation(o1, 16) && is_permutation(o1 + 16, 16), "each epoch once: %s", o1);
    cr_assert(strncmp(o1, o1 + 16, 16) != 0, "epochs differ: %s", o1);
    cr_assert(strncmp(o1, "abcdefghijklmnop", 16) != 0, "shuffled: %s", o1);
    cr_assert_neq(mt_dataset_fingerprint(&d1), mt_dataset_fingerprint(&d3));
    cr_assert_eq(mt_dataset_fingerprint(&d1), mt_dataset_fingerprint(&d2));
    mt_dataset_free(&d1);
    mt_dataset_free(&d2);
    mt_dataset_free(&d3);
    fx_done(&f);
}

// Resume: a fresh dataset (nothing cached) from a saved cursor yields exactly the batches the
// uninterrupted run yields, across an epoch boundary, packed and not.
static void resume_case(int packing) {
    fx f;
    fx_init(&f);
    f.o.shuffle = 1;
    f.o.seed = 7;
    f.o.packing = packing;
    enum { B = 3, S = 8, STEPS = 9, CUT = 4 };
    int32_t ref_t[STEPS][B * S], ref_l[STEPS][B * S], ref_m[STEPS][B * S];
    mt_dataset d;
    cr_assert_eq(fx_load(&f, &d, letters), 0);
    mt_data_cursor c = {0, 0}, saved = {0, 0};
    for (int s = 0; s < STEPS; s++) {
        if (s == CUT) saved = c;  // what the trainer writes into its checkpoint
        cr_assert_eq(mt_data_next_batch(&d, &c, B, S, ref_t[s], ref_l[s], ref_m[s]), B);
    }
    cr_assert_geq(c.epoch, 1, "the run crosses an epoch boundary");
    mt_dataset_free(&d);
    cr_assert_eq(fx_load(&f, &d, letters), 0);
    c = saved;
    for (int s = CUT; s < STEPS; s++) {
        int32_t t[B * S], l[B * S], m[B * S];
        cr_assert_eq(mt_data_next_batch(&d, &c, B, S, t, l, m), B);
        cr_assert_arr_eq(t, ref_t[s], sizeof t, "packing %d step %d tokens", packing, s);
        cr_assert_arr_eq(l, ref_l[s], sizeof l, "packing %d step %d labels", packing, s);
        cr_assert_arr_eq(m, ref_m[s], sizeof m, "packing %d step %d mask", packing, s);
    }
    mt_dataset_free(&d);
    fx_done(&f);
}

Test(data, cursor_resume_exact) {
    resume_case(0);
    resume_case(1);
}

Test(data, whole_epochs_for_eval) {
    fx f;
    fx_init(&f);
    f.o.whole_epochs = 1;
    f.o.packing = 1;
    mt_dataset d;
    cr_assert_eq(fx_load(&f, &d, six), 0);
    enum { B = 4, S = 10 };
    int32_t tok[B * S], lab[B * S], mask[B * S];
    mt_data_cursor c = {0, 0};
    int64_t rows = mt_data_epoch_rows(&d, 0, S), seen = 0;
    int got, letters_seen = 0;
    do {
        got = mt_data_next_batch(&d, &c, B, S, tok, lab, mask);
        cr_assert_geq(got, 1, "%s", mt_error_get());
        seen += got;
        for (int i = 0; i < B * S; i++) {
            if (i >= got * S) cr_assert_eq(mask[i], 0, "rows past the epoch are padding");
            letters_seen += tok[i] == 1;
        }
    } while (c.epoch == 0);
    cr_assert_eq(seen, rows, "epoch_rows agrees with the rows made");
    cr_assert_eq(seen, 5);
    cr_assert_eq(letters_seen, 6, "every sample once, none twice");
    cr_assert_eq(c.index, 0);
    mt_dataset_free(&d);
    fx_done(&f);
}

// ---------------------------------------------------------------------------------------------
// Instruction templates, TRL's and ShareGPT's rows, and the data line (issue 28, snag 3)

Test(data, instruction_templates_alpaca_none_and_chat) {
    fx f;
    fx_init(&f);
    const char *row = "{\"instruction\": \"Add\", \"input\": \"1 2\", \"output\": \"3\"}\n";
    mt_dataset d;
    expect e = {0};
    f.o.prompt = MT_PROMPT_NONE;  // the instruction and its input alone
    cr_assert_eq(fx_load(&f, &d, row), 0, "%s", mt_error_get());
    ex_id(&e, 1, 0), ex_text(&e, "Add\n\n1 2\n", 0), ex_text(&e, "3", 1), ex_id(&e, 2, 1);
    assert_sample(&d, 0, &e);
    mt_dataset_free(&d);
    f.o.prompt = MT_PROMPT_CHAT;  // a user turn through the chat template (Mixtral's by default)
    cr_assert_eq(fx_load(&f, &d, row), 0, "%s", mt_error_get());
    e.n = 0;
    ex_id(&e, 1, 0), ex_text(&e, "[INST] Add\n\n1 2 [/INST]", 0), ex_text(&e, "3", 1), ex_id(&e, 2, 1);
    assert_sample(&d, 0, &e);
    mt_dataset_free(&d);
    f.o.prompt = MT_PROMPT_ALPACA;  // the default: Stanford Alpaca's preamble
    cr_assert_eq(fx_load(&f, &d, row), 0, "%s", mt_error_get());
    const int32_t *tok;
    int64_t n = mt_dataset_sample(&d, 0, &tok, NULL);
    cr_assert_gt(n, 150, "Alpaca's preamble is long: %lld tokens", (long long)n);
    cr_assert_eq(memcmp((const int32_t[]){'B', 'e', 'l', 'o', 'w'}, tok + 1, 20), 0);
    mt_dataset_free(&d);
    mt_prompt_style s;
    cr_assert_eq(mt_prompt_style_parse("none", &s), 0);
    cr_assert_eq(s, MT_PROMPT_NONE);
    cr_assert_neq(mt_prompt_style_parse("vicuna", &s), 0);
    cr_assert(strstr(mt_error_get(), "alpaca, none or chat"), "%s", mt_error_get());
    fx_done(&f);
}

Test(data, trl_prompt_completion_rows_train_on_the_completion) {
    fx f;
    fx_init(&f);
    mt_dataset d;
    // Standard form: <s> prompt completion </s>, the completion and EOS in the loss (TRL's
    // completion_only_loss default).
    cr_assert_eq(fx_load(&f, &d, "{\"prompt\": \"2+2=\", \"completion\": \" 4\"}\n"), 0, "%s", mt_error_get());
    expect e = {0};
    ex_id(&e, 1, 0), ex_text(&e, "2+2=", 0), ex_text(&e, " 4", 1), ex_id(&e, 2, 1);
    assert_sample(&d, 0, &e);
    cr_assert_eq(d.stats.prompt_completion, 1);
    mt_dataset_free(&d);
    // Conversational form: the prompt's own assistant turn is context, only the completion learns.
    cr_assert_eq(fx_load(&f, &d,
                         "{\"prompt\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}, "
                         "{\"role\": \"user\", \"content\": \"c\"}], \"completion\": [{\"role\": \"assistant\", \"content\": \"d\"}]}\n"),
                 0, "%s", mt_error_get());
    e.n = 0;
    ex_id(&e, 1, 0), ex_text(&e, "[INST] a [/INST]", 0), ex_text(&e, "b", 0), ex_id(&e, 2, 0);
    ex_text(&e, "[INST] c [/INST]", 0), ex_text(&e, "d", 1), ex_id(&e, 2, 1);
    assert_sample(&d, 0, &e);
    mt_dataset_free(&d);
    // A completion without an assistant turn has nothing to learn; a string prompt with a list
    // completion is neither form.
    cr_assert_neq(fx_load(&f, &d, "{\"prompt\": [{\"role\": \"user\", \"content\": \"a\"}], \"completion\": "
                                  "[{\"role\": \"user\", \"content\": \"b\"}]}\n"), 0);
    mt_dataset_free(&d);
    cr_assert_neq(fx_load(&f, &d, "{\"prompt\": \"a\", \"completion\": [{\"role\": \"assistant\", \"content\": \"b\"}]}\n"), 0);
    cr_assert(strstr(mt_error_get(), "data.jsonl:1") && strstr(mt_error_get(), "completion"), "%s", mt_error_get());
    mt_dataset_free(&d);
    fx_done(&f);
}

Test(data, sharegpt_rows_read_as_messages) {
    fx f;
    fx_init(&f);
    mt_dataset a, b;
    cr_assert_eq(fx_load(&f, &a, "{\"conversations\": [{\"from\": \"system\", \"value\": \"S\"}, {\"from\": \"human\", "
                                 "\"value\": \"u\"}, {\"from\": \"gpt\", \"value\": \"g\"}]}\n"), 0, "%s", mt_error_get());
    cr_assert_eq(fx_load(&f, &b, "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", "
                                 "\"content\": \"u\"}, {\"role\": \"assistant\", \"content\": \"g\"}]}\n"), 0, "%s", mt_error_get());
    cr_assert_eq(a.stats.sharegpt, 1);
    const int32_t *ta, *la, *tb, *lb;
    int64_t na = mt_dataset_sample(&a, 0, &ta, &la), nb = mt_dataset_sample(&b, 0, &tb, &lb);
    cr_assert_eq(na, nb);
    cr_assert_arr_eq(ta, tb, (size_t)na * 4);
    cr_assert_arr_eq(la, lb, (size_t)na * 4, "gpt turns, and only they, in the loss");
    mt_dataset_free(&a);
    mt_dataset_free(&b);
    cr_assert_neq(fx_load(&f, &a, "{\"conversations\": [{\"from\": \"user\", \"value\": \"u\"}]}\n"), 0);
    cr_assert(strstr(mt_error_get(), "human") && strstr(mt_error_get(), "gpt"), "names the roles: %s", mt_error_get());
    mt_dataset_free(&a);
    fx_done(&f);
}

// Every sample read is kept or counted under one reason; a cut that empties samples says --seq.
Test(data, every_dropped_or_cut_sample_is_counted_with_a_hint) {
    fx f;
    fx_init(&f);
    f.o.seq = 24;
    f.o.prompt = MT_PROMPT_NONE;
    mt_dataset d;
    cr_assert_eq(fx_load(&f, &d,
                         "{\"instruction\": \"short\", \"output\": \"ok\"}\n"                                // kept whole
                         "{\"instruction\": \"q\", \"output\": \"an answer much longer than the row\"}\n"   // answer cut
                         "{\"instruction\": \"a prompt that fills all the row\", \"output\": \"x\"}\n"),    // answer gone
                 0, "%s", mt_error_get());
    const mt_data_stats *s = &d.stats;
    cr_assert_eq(s->samples, 2);
    cr_assert_eq(s->truncated, 1);
    cr_assert_eq(s->dropped_truncated, 1);
    cr_assert_eq(s->samples + s->dropped_truncated + s->dropped_overlong + s->dropped_empty + s->dropped_masked, s->lines);
    char line[1024], notes[1024];
    mt_data_stats_format(s, line, sizeof line);
    cr_assert(strstr(line, "truncated=1 ") && strstr(line, "dropped_truncated=1 "), "%s", line);
    mt_data_notes_format(s, &f.o, notes, sizeof notes);
    cr_assert(strstr(notes, "--seq 24 cut 2 samples") && strstr(notes, "1 lost every token in the loss") &&
                  strstr(notes, "raise --seq"), "%s", notes);
    cr_assert(strstr(notes, "instruction template none"), "%s", notes);
    mt_dataset_free(&d);
    // All of them emptied: the error says so and names --seq (and Alpaca's preamble).
    f.o.prompt = MT_PROMPT_ALPACA;
    cr_assert_neq(fx_load(&f, &d, "{\"instruction\": \"q\", \"output\": \"a\"}\n"), 0);
    cr_assert(strstr(mt_error_get(), "1 cut to --seq 24 with nothing left in the loss") &&
                  strstr(mt_error_get(), "raise --seq") && strstr(mt_error_get(), "--instruction-template none"),
              "%s", mt_error_get());
    mt_dataset_free(&d);
    fx_done(&f);
}
