// gpt-oss's data side: the harmony chat template (data/chat_harmony.c) and the o200k pre-tokenizer
// regex (data/bpe.c reads it as any Split regex) against transformers and `tokenizers`, on the
// committed fixtures of scripts/make_harmony_fixtures.py (tests/data/harmony/).
#include <criterion/criterion.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/common.h"
#include "core/fileio.h"
#include "data/bpe.h"
#include "data/data.h"
#include "data/tokenizer.h"
#include "tests/test_util.h"

#define DIR "tests/data/harmony"

static cJSON *expected(void) {
    char *text;
    size_t len;
    cr_assert_eq(mt_read_file(DIR "/expected.json", 64u << 20, &text, &len), 0, "%s", mt_error_get());
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    cr_assert(j, "expected.json: not JSON");
    const cJSON *magic = cJSON_GetObjectItem(j, "magic"), *ver = cJSON_GetObjectItem(j, "version");
    cr_assert(cJSON_IsString(magic) && strcmp(magic->valuestring, "mt-harmony-fixture") == 0);
    cr_assert(cJSON_IsNumber(ver) && ver->valueint == 1);
    return j;
}

static void ids_of(const cJSON *arr, mt_ids *out) {
    out->n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) mt_ids_push(out, (int32_t)e->valuedouble);
}

static void assert_ids(const char *text, const mt_ids *got, const mt_ids *want) {
    size_t n = MT_MIN(got->n, want->n), i = 0;
    while (i < n && got->v[i] == want->v[i]) i++;
    cr_assert(got->n == want->n && i == n, "\"%s\": %zu ids, want %zu; first difference at %zu (got %d, want %d)",
              text, got->n, want->n, i, i < got->n ? got->v[i] : -1, i < want->n ? want->v[i] : -1);
}

Test(harmony, o200k_pre_tokenizer_encodes_as_tokenizers_does) {
    mt_bpe *b = mt_bpe_load(DIR "/tokenizer.json");
    cr_assert(b, "%s", mt_error_get());
    cJSON *j = expected();
    mt_ids got = {0}, want = {0};
    int cases = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "encode")) {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        ids_of(cJSON_GetObjectItem(c, "ids"), &want);
        got.n = 0;
        cr_assert_eq(mt_bpe_encode(b, text, strlen(text), &got), 0, "%s", mt_error_get());
        assert_ids(text, &got, &want);
        char *dec;
        size_t len;
        cr_assert_eq(mt_bpe_decode(b, got.v, got.n, &dec, &len), 0);
        const char *wd = cJSON_GetObjectItem(c, "decoded")->valuestring;
        cr_assert(len == strlen(wd) && strcmp(dec, wd) == 0, "decode(\"%s\") = \"%s\", want \"%s\"", text, dec, wd);
        free(dec);
        cases++;
    }
    cr_assert_geq(cases, 30);
    mt_ids_free(&got);
    mt_ids_free(&want);
    cJSON_Delete(j);
    mt_bpe_free(b);
}

typedef struct collect {
    const mt_bpe *b;
    char text[16384], loss[8192];
    size_t n, nl;
    mt_ids ids;
    int special_segments;
} collect;

static int collect_seg(void *ctx, mt_seg_kind kind, const char *text, size_t len, int in_loss) {
    collect *c = ctx;
    if (kind != MT_SEG_TEXT) {
        c->special_segments++;
        return 0;
    }
    cr_assert_lt(c->n + len, sizeof c->text);
    memcpy(c->text + c->n, text, len);
    c->text[c->n += len] = 0;
    if (in_loss) {
        cr_assert_lt(c->nl + len, sizeof c->loss);
        memcpy(c->loss + c->nl, text, len);
        c->loss[c->nl += len] = 0;
    }
    return c->b ? mt_bpe_encode(c->b, text, len, &c->ids) : 0;
}

// A fixture message's thinking as transformers aliases it: "thinking", else "reasoning_content".
static const char *thinking_of(const cJSON *m) {
    const cJSON *t = cJSON_GetObjectItem(m, "thinking");
    if (!cJSON_IsString(t)) t = cJSON_GetObjectItem(m, "reasoning_content");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

Test(harmony, template_equals_transformers_apply_chat_template) {
    mt_bpe *b = mt_bpe_load(DIR "/tokenizer.json");
    cr_assert(b, "%s", mt_error_get());
    cJSON *j = expected();
    mt_chat_template t = {0};
    cr_assert_eq(mt_chat_template_recognise(cJSON_GetObjectItem(j, "chat_template")->valuestring, &t.style), 0,
                 "gpt-oss's template not recognised");
    cr_assert_eq(t.style, MT_CHAT_HARMONY);
    cr_assert_eq(mt_chat_date_set(&t, cJSON_GetObjectItem(j, "date")->valuestring), 0, "%s", mt_error_get());
    int cases = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "chat")) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        mt_chat_msg mm[8];
        int n = 0;
        const cJSON *m;
        cJSON_ArrayForEach(m, cJSON_GetObjectItem(c, "messages")) {
            cr_assert_lt(n, 8);
            mm[n] = (mt_chat_msg){cJSON_GetObjectItem(m, "role")->valuestring,
                                  cJSON_GetObjectItem(m, "content")->valuestring, 0, thinking_of(m)};
            n++;
        }
        collect col = {.b = b};
        cr_assert_eq(mt_chat_render_template(&t, mm, n, 0, collect_seg, &col), 0, "%s: %s", name, mt_error_get());
        cr_assert_eq(col.special_segments, 0, "harmony prints its special tokens as text");
        cr_assert_str_eq(col.text, cJSON_GetObjectItem(c, "text")->valuestring, "%s", name);
        // Encoding run by run equals encoding the rendering whole (runs meet at special tokens).
        mt_ids want = {0};
        ids_of(cJSON_GetObjectItem(c, "ids"), &want);
        assert_ids(name, &col.ids, &want);
        // In the loss: what the model writes after "<|start|>assistant", per assistant turn.
        char expect[8192] = "";
        for (int i = 0; i < n; i++) {
            if (strcmp(mm[i].role, "assistant") != 0) continue;
            int last = i == n - 1;
            if (last && mm[i].thinking) {
                strcat(expect, "<|channel|>analysis<|message|>");
                strcat(expect, mm[i].thinking);
                strcat(expect, "<|end|><|start|>assistant");
            }
            strcat(expect, "<|channel|>final<|message|>");
            strcat(expect, mm[i].content);
            strcat(expect, last ? "<|return|>" : "<|end|>");
        }
        cr_assert_str_eq(col.loss, expect, "%s", name);
        mt_ids_free(&want);
        mt_ids_free(&col.ids);
        cases++;
    }
    cr_assert_geq(cases, 14);
    cJSON_Delete(j);
    mt_bpe_free(b);
}

Test(harmony, date_flag_and_refusals) {
    mt_chat_template t = {.style = MT_CHAT_HARMONY};
    cr_assert_neq(mt_chat_date_set(&t, "2025-8-5"), 0);
    cr_assert(strstr(mt_error_get(), "--chat-date"), "got: %s", mt_error_get());
    cr_assert_neq(mt_chat_date_set(&t, "2025-13-01"), 0);
    cr_assert_eq(mt_chat_date_set(&t, ""), 0);
    cr_assert_eq(strlen(t.date), 10, "today: %s", t.date);
    cr_assert_eq(mt_chat_date_set(&t, "2030-01-02"), 0);
    collect col = {0};
    mt_chat_msg ok[] = {{"user", "hi", 0, NULL}, {"assistant", "yo", 0, NULL}};
    cr_assert_eq(mt_chat_render_template(&t, ok, 2, 1, collect_seg, &col), 0, "%s", mt_error_get());
    cr_assert(strstr(col.text, "Current date: 2030-01-02\n"), "%s", col.text);
    static const struct { mt_chat_msg m[3]; int n; const char *why; } bad[] = {
        {{{"user", "a", 0, NULL}, {"developer", "b", 0, NULL}}, 2, "may only come first"},
        {{{"user", "a", 0, "hmm"}, {"assistant", "b", 0, NULL}}, 2, "only an assistant message"},
        {{{"user", "a", 0, NULL}, {"assistant", "<|channel|>final<|message|>b", 0, NULL}}, 2, "<|channel|>"},
        {{{"user", "a", 0, NULL}, {"assistant", "b", 0, "<|channel|>analysis<|message|>x"}}, 2, "<|channel|>"},
        {{{"user", "a", 0, NULL}, {"tool", "b", 0, NULL}}, 2, "unknown role"},
        {{{"user", "a", 0, NULL}, {"user", "b", 0, NULL}}, 2, "alternate"},
        {{{"developer", "a", 0, NULL}}, 1, "no user message"},
        {{{"user", "a", 0, NULL}}, 1, "no assistant turn"},
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(bad); i++) {
        collect c2 = {0};
        cr_assert_neq(mt_chat_render_template(&t, bad[i].m, bad[i].n, 1, collect_seg, &c2), 0, "case %zu", i);
        cr_assert(strstr(mt_error_get(), bad[i].why), "case %zu: %s", i, mt_error_get());
    }
    // Thinking and the developer role are harmony's: another template refuses them.
    mt_chat_template q = {.style = MT_CHAT_CHATML};
    mt_chat_msg th[] = {{"user", "a", 0, NULL}, {"assistant", "b", 0, "why"}};
    cr_assert_neq(mt_chat_render_template(&q, th, 2, 1, collect_seg, &col), 0);
    cr_assert(strstr(mt_error_get(), "harmony"), "got: %s", mt_error_get());
    mt_chat_msg dev[] = {{"developer", "a", 0, NULL}, {"user", "a", 0, NULL}, {"assistant", "b", 0, NULL}};
    cr_assert_neq(mt_chat_render_template(&q, dev, 3, 1, collect_seg, &col), 0);
    cr_assert(strstr(mt_error_get(), "developer"), "got: %s", mt_error_get());
}

static void write_file(const char *dir, const char *name, const char *text) {
    char path[400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    cr_assert_eq(mt_write_file_atomic(path, text, strlen(text)), 0, "%s", mt_error_get());
}

// A model folder with the fixture tokenizer and gpt-oss's template in tokenizer_config.json.
static void model_folder(const char *dir, const cJSON *j) {
    char *text;
    size_t len;
    cr_assert_eq(mt_read_file(DIR "/tokenizer.json", 64u << 20, &text, &len), 0, "%s", mt_error_get());
    write_file(dir, "tokenizer.json", text);
    free(text);
    cJSON *cfg = cJSON_CreateObject();
    cJSON_AddStringToObject(cfg, "chat_template", cJSON_GetObjectItem(j, "chat_template")->valuestring);
    cJSON_AddStringToObject(cfg, "eos_token", "<|return|>");
    char *s = cJSON_PrintUnformatted(cfg);
    write_file(dir, "tokenizer_config.json", s);
    free(s);
    cJSON_Delete(cfg);
}

static int open_data(mt_dataset *d, const char *dir, const char *rows, const cJSON *j, mt_tokenizer *tok) {
    write_file(dir, "train.jsonl", rows);
    char data[400];
    snprintf(data, sizeof data, "%s/train.jsonl", dir);
    mt_data_opts o;
    mt_data_opts_default(&o);
    o.shuffle = 0;
    cr_assert_eq(mt_chat_template_load(&o.chat, dir, "", tok->kind), 0, "%s", mt_error_get());
    cr_assert_eq(o.chat.style, MT_CHAT_HARMONY, "%s", o.chat.source);
    cr_assert_eq(mt_chat_date_set(&o.chat, cJSON_GetObjectItem(j, "date")->valuestring), 0);
    return mt_dataset_load(d, data, tok, &o);
}

// JSONL rows with "developer", "thinking" / "reasoning_content" and empty contents give
// transformers' ids; tools are refused naming the file and line.
Test(harmony, dataset_rows_give_transformers_ids_and_refuse_tools) {
    cJSON *j = expected();
    char dir[256];
    mt_test_tmpdir(dir, sizeof dir);
    model_folder(dir, j);
    mt_tokenizer tok;
    int64_t vocab = 775;
    cr_assert_eq(mt_tokenizer_open(&tok, dir, vocab, 754, 758), 0, "%s", mt_error_get());
    // Each fixture conversation with an assistant reply, one row each.
    size_t cap = 1 << 16, at = 0;
    char *rows = mt_xmalloc(cap);
    const cJSON *c, *picked[16];
    int k = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "chat")) {
        if (cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt"))) continue;
        char *msgs = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "messages"));
        at += (size_t)snprintf(rows + at, cap - at, "{\"messages\": %s}\n", msgs);
        free(msgs);
        picked[k++] = c;
    }
    mt_dataset d;
    cr_assert_eq(open_data(&d, dir, rows, j, &tok), 0, "%s", mt_error_get());
    cr_assert_eq(d.n, k);
    for (int i = 0; i < k; i++) {
        const int32_t *toks, *labs;
        int64_t len = mt_dataset_sample(&d, i, &toks, &labs);
        mt_ids want = {0};
        ids_of(cJSON_GetObjectItem(picked[i], "ids"), &want);
        const char *name = cJSON_GetObjectItem(picked[i], "name")->valuestring;
        cr_assert_eq(len, (int64_t)want.n, "%s: %lld tokens, transformers %zu", name, (long long)len, want.n);
        for (int64_t t = 0; t < len; t++) cr_assert_eq(toks[t], want.v[t], "%s: token %lld", name, (long long)t);
        cr_assert_eq(labs[len - 1], toks[len - 1], "%s: <|return|> is learnt", name);
        mt_ids_free(&want);
    }
    mt_dataset_free(&d);
    static const struct { const char *row, *why; } bad[] = {
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"\", "
         "\"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": {}}}]}]}\n", "tool calls"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"tool\", \"content\": \"b\"}]}\n",
         "tool messages"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\", "
         "\"thinking\": 3}]}\n", "\"thinking\" must be a string"},
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(bad); i++) {
        char *two = mt_xmalloc(strlen(rows) + strlen(bad[i].row) + 1);
        strcat(strcpy(two, rows), bad[i].row);
        cr_assert_neq(open_data(&d, dir, two, j, &tok), 0, "case %zu", i);
        char line[64];
        snprintf(line, sizeof line, "train.jsonl:%d", k + 1);
        cr_assert(strstr(mt_error_get(), line) && strstr(mt_error_get(), bad[i].why), "case %zu: %s", i,
                  mt_error_get());
        free(two);
    }
    free(rows);
    mt_tokenizer_free(&tok);
    mt_test_rmrf(dir);
    cJSON_Delete(j);
}
