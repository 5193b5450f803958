// Byte-level BPE (data/bpe.c) against the `tokenizers` library, on the committed fixtures of
// scripts/make_bpe_fixtures.py (tests/data/bpe/<name>/): encode, decode, refusals of invalid
// UTF-8 and of tokenizer.json files outside what bpe.h accepts.
#include <criterion/criterion.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "core/common.h"
#include "core/fileio.h"
#include "data/bpe.h"
#include "data/tokenizer.h"
#include "tests/test_util.h"

static const char *const FIXTURES[] = {"qwen2", "olmoe", "gpt2im"};

static cJSON *read_json(const char *path) {
    char *text;
    size_t len;
    cr_assert_eq(mt_read_file(path, 64u << 20, &text, &len), 0, "%s", mt_error_get());
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    cr_assert(j, "%s: not JSON", path);
    return j;
}

static cJSON *expected(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "tests/data/bpe/%s/expected.json", name);
    cJSON *j = read_json(path);
    cJSON *magic = cJSON_GetObjectItem(j, "magic"), *ver = cJSON_GetObjectItem(j, "version");
    cr_assert(cJSON_IsString(magic) && strcmp(magic->valuestring, "mt-bpe-fixture") == 0, "%s: magic", path);
    cr_assert(cJSON_IsNumber(ver) && ver->valueint == 1, "%s: version", path);
    return j;
}

static mt_bpe *load(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "tests/data/bpe/%s/tokenizer.json", name);
    mt_bpe *b = mt_bpe_load(path);
    cr_assert(b, "%s", mt_error_get());
    return b;
}

static void ids_of(const cJSON *arr, mt_ids *out) {
    out->n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) mt_ids_push(out, (int32_t)e->valuedouble);
}

static void assert_ids(const char *name, const char *text, const mt_ids *got, const mt_ids *want) {
    size_t n = MT_MIN(got->n, want->n), i = 0;
    while (i < n && got->v[i] == want->v[i]) i++;
    cr_assert(got->n == want->n && i == n,
              "%s: \"%s\": %zu ids, want %zu; first difference at %zu (got %d, want %d)", name, text,
              got->n, want->n, i, i < got->n ? got->v[i] : -1, i < want->n ? want->v[i] : -1);
}

Test(bpe, encode_and_decode_equal_tokenizers) {
    int cases = 0;
    for (size_t f = 0; f < MT_ARRAY_LEN(FIXTURES); f++) {
        mt_bpe *b = load(FIXTURES[f]);
        cJSON *j = expected(FIXTURES[f]);
        mt_ids got = {0}, want = {0};
        const cJSON *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "encode")) {
            const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
            ids_of(cJSON_GetObjectItem(c, "ids"), &want);
            got.n = 0;
            cr_assert_eq(mt_bpe_encode(b, text, strlen(text), &got), 0, "%s", mt_error_get());
            assert_ids(FIXTURES[f], text, &got, &want);
            char *dec;
            size_t len;
            cr_assert_eq(mt_bpe_decode(b, got.v, got.n, &dec, &len), 0);
            const char *wd = cJSON_GetObjectItem(c, "decoded")->valuestring;
            cr_assert(len == strlen(wd) && strcmp(dec, wd) == 0, "%s: decode(\"%s\") = \"%s\", want \"%s\"",
                      FIXTURES[f], text, dec, wd);
            free(dec);
            cases++;
        }
        mt_ids_free(&got);
        mt_ids_free(&want);
        cJSON_Delete(j);
        mt_bpe_free(b);
    }
    cr_assert_geq(cases, 3 * 25, "the fixtures hold %d cases", cases);
}

Test(bpe, decode_of_cut_characters_equals_tokenizers) {
    for (size_t f = 0; f < MT_ARRAY_LEN(FIXTURES); f++) {
        mt_bpe *b = load(FIXTURES[f]);
        cJSON *j = expected(FIXTURES[f]);
        mt_ids ids = {0};
        const cJSON *c;
        int n = 0, replaced = 0;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "decode")) {
            ids_of(cJSON_GetObjectItem(c, "ids"), &ids);
            const char *want = cJSON_GetObjectItem(c, "text")->valuestring;
            char *dec;
            size_t len;
            cr_assert_eq(mt_bpe_decode(b, ids.v, ids.n, &dec, &len), 0);
            cr_assert_str_eq(dec, want, "%s: decode case %d", FIXTURES[f], n);
            replaced += strstr(want, "\xEF\xBF\xBD") != NULL;
            free(dec);
            n++;
        }
        cr_assert_gt(replaced, 0, "%s: no case exercises U+FFFD", FIXTURES[f]);
        mt_ids_free(&ids);
        cJSON_Delete(j);
        mt_bpe_free(b);
    }
}

Test(bpe, invalid_utf8_is_refused_with_its_offset) {
    mt_bpe *b = load("qwen2");
    cJSON *j = expected("qwen2");
    const cJSON *h;
    int n = 0;
    cJSON_ArrayForEach(h, cJSON_GetObjectItem(j, "invalid_utf8_hex")) {
        const char *hex = h->valuestring;
        size_t len = strlen(hex) / 2;
        char buf[64];
        for (size_t i = 0; i < len; i++) {
            unsigned x;
            sscanf(hex + 2 * i, "%2x", &x);
            buf[i] = (char)x;
        }
        mt_ids ids = {0};
        cr_assert_neq(mt_bpe_encode(b, buf, len, &ids), 0, "%s was accepted", hex);
        cr_assert(strstr(mt_error_get(), "UTF-8") && strstr(mt_error_get(), "at byte"), "got: %s",
                  mt_error_get());
        cr_assert_eq(ids.n, 0, "%s: ids were appended before the refusal", hex);
        mt_ids_free(&ids);
        n++;
    }
    cr_assert_geq(n, 5);
    cJSON_Delete(j);
    mt_bpe_free(b);
}

Test(bpe, special_tokens_and_pieces) {
    mt_bpe *b = load("qwen2");
    int32_t s = mt_bpe_token_id(b, "<|im_start|>"), tc = mt_bpe_token_id(b, "<tool_call>");
    cr_assert_geq(s, 0);
    cr_assert(mt_bpe_is_special(b, s));
    cr_assert_geq(tc, 0);
    cr_assert_not(mt_bpe_is_special(b, tc), "<tool_call> is added but not special");
    cr_assert_str_eq(mt_bpe_piece(b, s), "<|im_start|>");
    cr_assert_eq(mt_bpe_token_id(b, "\xC4\xA0"), 220, "Ġ (the space byte) is id 220 in GPT-2 order");
    cr_assert_eq(mt_bpe_id_count(b), 660);
    mt_bpe_free(b);
}

// --- selection and the data layer ----------------------------------------------------------

static void copy_fixture(const char *name, const char *dir) {
    char src[256], dst[256];
    snprintf(src, sizeof src, "tests/data/bpe/%s/tokenizer.json", name);
    snprintf(dst, sizeof dst, "%s/tokenizer.json", dir);
    char *text;
    size_t len;
    cr_assert_eq(mt_read_file(src, 64u << 20, &text, &len), 0, "%s", mt_error_get());
    cr_assert_eq(mt_write_file_atomic(dst, text, len), 0, "%s", mt_error_get());
    free(text);
}

Test(bpe, tokenizer_open_picks_tokenizer_json_without_bos) {
    char dir[256];
    mt_test_tmpdir(dir, sizeof dir);
    copy_fixture("qwen2", dir);
    mt_tokenizer t;
    // Qwen pads the embedding past the tokenizer: vocab 700 > 660 ids.
    cr_assert_eq(mt_tokenizer_open(&t, dir, 700, 656, 658), 0, "%s", mt_error_get());
    cr_assert_eq(t.kind, MT_TOKENIZER_BPE);
    cr_assert_eq(t.bos, -1, "BPE models get no BOS from the data layer");
    cr_assert_eq(t.eos, 658);
    mt_ids ids = {0};
    const char *text = "<|im_start|>user\nHi<|im_end|>";
    cr_assert_eq(mt_tokenizer_encode(&t, text, strlen(text), &ids), 0, "%s", mt_error_get());
    cr_assert_eq(ids.v[0], 657);
    cr_assert_eq(ids.v[ids.n - 1], 658);
    char *dec;
    size_t len;
    cr_assert_eq(mt_tokenizer_decode(&t, ids.v, ids.n, &dec, &len), 0);
    cr_assert_str_eq(dec, "<|im_start|>user\nHi", "EOS skipped, the rest as written");
    free(dec);
    char piece[64];
    cr_assert_eq(mt_tokenizer_piece(&t, 220, piece, sizeof piece), 0);
    cr_assert_str_eq(piece, "\xC4\xA0");
    cr_assert_eq(mt_tokenizer_piece(&t, 690, piece, sizeof piece), 0);
    cr_assert_str_eq(piece, "<unused>");
    mt_ids_free(&ids);
    mt_tokenizer_free(&t);
    // The embedding must hold every id; EOS must be a token.
    cr_assert_neq(mt_tokenizer_open(&t, dir, 600, 656, 658), 0);
    cr_assert(strstr(mt_error_get(), "tokenizer.json") && strstr(mt_error_get(), "600"), "got: %s",
              mt_error_get());
    cr_assert_neq(mt_tokenizer_open(&t, dir, 700, 656, 680), 0);
    cr_assert(strstr(mt_error_get(), "eos_token_id 680"), "got: %s", mt_error_get());
    mt_test_rmrf(dir);
}

// --- refusals ------------------------------------------------------------------------------

typedef void (*mutate_fn)(cJSON *root);

static cJSON *at(cJSON *root, const char *a, const char *b) {
    cJSON *x = cJSON_GetObjectItem(root, a);
    return b ? cJSON_GetObjectItem(x, b) : x;
}

static void set(cJSON *obj, const char *key, cJSON *v) { cJSON_ReplaceItemInObject(obj, key, v); }

static void m_wordpiece(cJSON *r) { set(at(r, "model", NULL), "type", cJSON_CreateString("WordPiece")); }
static void m_fallback(cJSON *r) { set(at(r, "model", NULL), "byte_fallback", cJSON_CreateTrue()); }
static void m_nfkc(cJSON *r) { set(at(r, "normalizer", NULL), "type", cJSON_CreateString("NFKC")); }
static void m_metaspace(cJSON *r) { set(at(r, "pre_tokenizer", NULL), "type", cJSON_CreateString("Metaspace")); }
static void m_removed(cJSON *r) {
    set(cJSON_GetArrayItem(at(r, "pre_tokenizer", "pretokenizers"), 0), "behavior", cJSON_CreateString("Removed"));
}
static void m_bad_regex(cJSON *r) {
    cJSON *split = cJSON_GetArrayItem(at(r, "pre_tokenizer", "pretokenizers"), 0);
    set(cJSON_GetObjectItem(split, "pattern"), "Regex", cJSON_CreateString("(\\p{L}+"));
}
static void m_prefix(cJSON *r) {
    set(cJSON_GetArrayItem(at(r, "pre_tokenizer", "pretokenizers"), 1), "add_prefix_space", cJSON_CreateTrue());
}
static void m_merge_three(cJSON *r) {
    cJSON_ReplaceItemInArray(at(r, "model", "merges"), 3, cJSON_CreateString("a b c"));
}
static void m_merge_unknown(cJSON *r) {
    const char *pair[2] = {"\xE2\x82\xAC", "zz-not-a-token"};
    cJSON_ReplaceItemInArray(at(r, "model", "merges"), 5, cJSON_CreateStringArray(pair, 2));
}
static void m_lstrip(cJSON *r) { set(cJSON_GetArrayItem(at(r, "added_tokens", NULL), 1), "lstrip", cJSON_CreateTrue()); }
static void m_no_decoder(cJSON *r) { set(r, "decoder", cJSON_CreateNull()); }
static void m_template(cJSON *r) { set(at(r, "post_processor", NULL), "type", cJSON_CreateString("TemplateProcessing")); }
static void m_no_byte(cJSON *r) { cJSON_DeleteItemFromObject(at(r, "model", "vocab"), "\xC4\x80"); }
static void m_dropout(cJSON *r) { set(at(r, "model", NULL), "dropout", cJSON_CreateNumber(0.1)); }

Test(bpe, unsupported_tokenizer_json_is_refused_naming_the_field) {
    struct { mutate_fn fn; const char *want; } cases[] = {
        {m_wordpiece, "model.type"},       {m_fallback, "model.byte_fallback"},
        {m_nfkc, "normalizer"},            {m_metaspace, "pre_tokenizer"},
        {m_removed, "behavior"},           {m_bad_regex, "regex"},
        {m_prefix, "add_prefix_space"},    {m_merge_three, "model.merges[3]"},
        {m_merge_unknown, "model.merges[5]"}, {m_lstrip, "lstrip"},
        {m_no_decoder, "decoder"},         {m_template, "post_processor"},
        {m_no_byte, "byte 0x00"},          {m_dropout, "model.dropout"},
    };
    char dir[256], path[300];
    mt_test_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    cJSON *orig = read_json("tests/data/bpe/qwen2/tokenizer.json");
    for (size_t i = 0; i < MT_ARRAY_LEN(cases); i++) {
        cJSON *r = cJSON_Duplicate(orig, 1);
        cases[i].fn(r);
        char *text = cJSON_PrintUnformatted(r);
        cr_assert_eq(mt_write_file_atomic(path, text, strlen(text)), 0);
        free(text);
        cJSON_Delete(r);
        mt_bpe *b = mt_bpe_load(path);
        cr_assert_null(b, "case %zu (%s) was accepted", i, cases[i].want);
        cr_assert(strstr(mt_error_get(), "tokenizer.json") && strstr(mt_error_get(), cases[i].want),
                  "case %zu: want \"%s\" in: %s", i, cases[i].want, mt_error_get());
    }
    // The unmutated file loads: the refusals above come from the mutations.
    char *text = cJSON_PrintUnformatted(orig);
    cr_assert_eq(mt_write_file_atomic(path, text, strlen(text)), 0);
    free(text);
    mt_bpe *b = mt_bpe_load(path);
    cr_assert(b, "%s", mt_error_get());
    mt_bpe_free(b);
    cr_assert_eq(mt_write_file_atomic(path, "{\"model\": ", 10), 0);
    cr_assert_null(mt_bpe_load(path));
    cr_assert(strstr(mt_error_get(), "not valid JSON"), "got: %s", mt_error_get());
    cJSON_Delete(orig);
    mt_test_rmrf(dir);
}
