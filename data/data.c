// data/data.c — JSONL and token files into samples; samples into shuffled, packed batches.
// The formats and the batch layout are described in data.h.
#include "data/data.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/rng.h"
#include "data/line_reader.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token files are read as little-endian");

#define TOKFILE_MAGIC "MTTOK1"
#define TOKFILE_HEADER 16
#define TOKFILE_FLAG_MASK 1u
#define PAD_ID 0

void mt_data_opts_default(mt_data_opts *o) {
    *o = (mt_data_opts){.seq = 512, .overlong = MT_OVERLONG_TRUNCATE, .packing = 0, .shuffle = 1,
                        .seed = 0, .prompt = MT_PROMPT_ALPACA, .whole_epochs = 0,
                        .max_line_bytes = MT_MAX_LINE_BYTES_DEFAULT};
    snprintf(o->chat.source, sizeof o->chat.source, "the default");
}

static const char *const overlong_names[] = {"truncate", "drop", "refuse"};

int mt_overlong_parse(const char *text, mt_overlong *out) {
    for (int i = 0; i < (int)MT_ARRAY_LEN(overlong_names); i++)
        if (strcmp(text, overlong_names[i]) == 0) {
            *out = (mt_overlong)i;
            return 0;
        }
    mt_error_set("overlong: \"%s\" is not truncate, drop or refuse", text);
    return -1;
}

const char *mt_overlong_name(mt_overlong m) {
    return (unsigned)m < MT_ARRAY_LEN(overlong_names) ? overlong_names[m] : "?";
}

// ---------------------------------------------------------------------------------------------
// Building samples

typedef struct loader {
    mt_dataset *d;
    const mt_tokenizer *tok;
    char where[1200];      // "file:line" or "file: sample k", for messages
    mt_ids cur_tok, cur_lab;
    mt_ids scratch;
    int64_t content;       // tokens of text runs in the loss (0 → the sample is empty)
    int cut;               // a string of this line was cut (line_reader.h): overlong
    size_t cap_tokens, cap_offsets;
} loader;

static void loader_begin(loader *L) {
    L->cur_tok.n = L->cur_lab.n = 0;
    L->content = 0;
    L->cut = 0;
}

static void push_token(loader *L, int32_t id, int in_loss) {
    mt_ids_push(&L->cur_tok, id);
    mt_ids_push(&L->cur_lab, in_loss ? id : MT_LABEL_IGNORE);
}

static int emit_segment(void *ctx, mt_seg_kind kind, const char *text, size_t len, int in_loss) {
    loader *L = ctx;
    if (kind == MT_SEG_BOS) {
        if (L->tok->add_bos) push_token(L, L->tok->bos, 0);  // never a target; none for BPE by default
        return 0;
    }
    if (kind == MT_SEG_EOS) {
        push_token(L, L->tok->eos, in_loss);
        return 0;
    }
    // Only what the row can hold (seq, and one more to know the sample is overlong) is encoded;
    // the rest of the text is checked, not tokenized.
    size_t want = (size_t)L->d->opts.seq + 1, room = L->cur_tok.n < want ? want - L->cur_tok.n : 0;
    L->scratch.n = 0;
    if (mt_tokenizer_encode_max(L->tok, text, len, room, &L->scratch)) return -1;
    for (size_t i = 0; i < L->scratch.n; i++) push_token(L, L->scratch.v[i], in_loss);
    if (in_loss) L->content += (int64_t)L->scratch.n + (room == 0 && len > 0);
    return 0;
}

// Checks, fits to seq and keeps (or drops and counts) the sample in cur_tok/cur_lab.
static int loader_finish(loader *L) {
    mt_dataset *d = L->d;
    mt_data_stats *st = &d->stats;
    int64_t len = (int64_t)L->cur_tok.n, vocab = L->tok->vocab;
    for (int64_t i = 0; i < len; i++) {
        int32_t id = L->cur_tok.v[i];
        if (id < 0 || id >= vocab) {
            mt_error_set("%s: token id %d at position %lld is outside the vocabulary [0, %lld)",
                         L->where, (int)id, (long long)i, (long long)vocab);
            return -1;
        }
    }
    if (len == 0 || L->content == 0) {
        st->dropped_empty++;
        return 0;
    }
    L->cur_lab.v[0] = MT_LABEL_IGNORE;  // the first token of a sample is never a target
    int truncated = 0;
    if (len > d->opts.seq || L->cut) {
        switch (d->opts.overlong) {
        case MT_OVERLONG_DROP:
            st->dropped_overlong++;
            return 0;
        case MT_OVERLONG_REFUSE:
            if (len > d->opts.seq)
                mt_error_set("%s: sample of more than %lld tokens is longer than --seq %lld (overlong: "
                             "refuse; truncate or drop would keep going)", L->where, (long long)d->opts.seq,
                             (long long)d->opts.seq);
            else  // its tokenizer squeezed the kept text (SentencePiece's whitespace), not the rest
                mt_error_set("%s: a string runs past the %llu bytes of text that --seq %lld can use: "
                             "longer than --seq (overlong: refuse; truncate or drop would keep going)",
                             L->where, (unsigned long long)mt_data_string_cap(L->tok, d->opts.seq),
                             (long long)d->opts.seq);
            return -1;
        case MT_OVERLONG_TRUNCATE:
            len = MT_MIN(len, d->opts.seq);
            truncated = 1;
            break;
        }
    }
    int64_t in_loss = 0;
    for (int64_t i = 0; i < len; i++) in_loss += L->cur_lab.v[i] != MT_LABEL_IGNORE;
    if (in_loss == 0) {  // the cut took every target (the prompt filled seq), or there was none
        if (truncated) st->dropped_truncated++;
        else st->dropped_masked++;
        return 0;
    }
    int64_t at = d->n ? d->offsets[d->n] : 0;
    if ((size_t)(at + len) > L->cap_tokens) {
        L->cap_tokens = MT_MAX(2 * L->cap_tokens, (size_t)(at + len) + 4096);
        d->tokens = mt_xrealloc(d->tokens, L->cap_tokens * sizeof *d->tokens);
        d->labels = mt_xrealloc(d->labels, L->cap_tokens * sizeof *d->labels);
    }
    if ((size_t)d->n + 2 > L->cap_offsets) {
        L->cap_offsets = MT_MAX(2 * L->cap_offsets, 1024);
        d->offsets = mt_xrealloc(d->offsets, L->cap_offsets * sizeof *d->offsets);
    }
    memcpy(d->tokens + at, L->cur_tok.v, (size_t)len * sizeof(int32_t));
    memcpy(d->labels + at, L->cur_lab.v, (size_t)len * sizeof(int32_t));
    d->offsets[d->n] = at;
    d->offsets[++d->n] = at + len;
    st->samples++;
    st->truncated += truncated;
    st->tokens += len;
    st->loss_tokens += in_loss;
    st->longest = MT_MAX(st->longest, len);
    return 0;
}

// ---------------------------------------------------------------------------------------------
// JSONL

static int utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t k;
        uint32_t cp;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) { k = 1; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { k = 2; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { k = 3; cp = c & 0x07; }
        else return 0;
        if (i + k >= n) return 0;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if ((k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) || cp > 0x10FFFF ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += k + 1;
    }
    return 1;
}

// A string field: 0 and *out, 1 when absent (or null and allow_null), -1 with an error.
static int get_string(const loader *L, const cJSON *obj, const char *key, int allow_empty,
                      const char *ctx, const char **out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    *out = NULL;
    if (!it) return 1;
    if (!cJSON_IsString(it) || !it->valuestring) {
        mt_error_set("%s: %s\"%s\" must be a string", L->where, ctx, key);
        return -1;
    }
    size_t n = strlen(it->valuestring);
    if (n == 0 && !allow_empty) {
        mt_error_set("%s: %s\"%s\" is empty", L->where, ctx, key);
        return -1;
    }
    if (!utf8_valid((const unsigned char *)it->valuestring, n)) {
        mt_error_set("%s: %s\"%s\" is not valid UTF-8", L->where, ctx, key);
        return -1;
    }
    *out = it->valuestring;
    return 0;
}

static int required_string(const loader *L, const cJSON *obj, const char *key, const char *ctx,
                           const char **out) {
    int rc = get_string(L, obj, key, 0, ctx, out);
    if (rc == 1) mt_error_set("%s: %smissing \"%s\"", L->where, ctx, key);
    return rc ? -1 : 0;
}

static int render_failed(const loader *L) {
    // Render and encode errors do not know the line: add it.
    mt_error_prefix("%s", L->where);
    return -1;
}

static int sample_text(loader *L, const cJSON *obj) {
    const char *text;
    if (required_string(L, obj, "text", "", &text)) return -1;
    if (emit_segment(L, MT_SEG_BOS, NULL, 0, 0) || emit_segment(L, MT_SEG_TEXT, text, strlen(text), 1) ||
        emit_segment(L, MT_SEG_EOS, NULL, 0, 1))
        return render_failed(L);
    L->d->stats.text++;
    return 0;
}

static int sample_instruction(loader *L, const cJSON *obj) {
    const char *instruction, *input, *output;
    if (required_string(L, obj, "instruction", "", &instruction)) return -1;
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(obj, "input");
    if (in && cJSON_IsNull(in)) input = NULL;
    else if (get_string(L, obj, "input", 1, "", &input) < 0) return -1;
    if (required_string(L, obj, "output", "", &output)) return -1;
    if (mt_instruction_render_chat(instruction, input, output, L->d->opts.prompt, &L->d->opts.chat, emit_segment, L))
        return render_failed(L);
    L->d->stats.instruction++;
    return 0;
}

// How a list of messages is spelled: "messages" (role/content, as transformers' chat templates
// read them) or ShareGPT's "conversations" (from/value, with human and gpt for user and assistant).
typedef struct msg_dialect {
    const char *role_key, *content_key;
    const char *const *names;  // [3]: this dialect's system, user, assistant
} msg_dialect;

static const char *const plain_roles[3] = {"system", "user", "assistant"};
static const char *const sharegpt_roles[3] = {"system", "human", "gpt"};
static const msg_dialect plain_msgs = {"role", "content", plain_roles};
static const msg_dialect sharegpt_msgs = {"from", "value", sharegpt_roles};

// A message's reasoning, under the names transformers aliases to the "thinking" gpt-oss's template
// reads ("thinking" first, then "reasoning_content", "reasoning"; null counts as absent). 0 with
// *out (NULL when none) or -1 with an error.
static int read_thinking(const loader *L, const cJSON *msg, const char *ctx, const char **out) {
    static const char *const keys[] = {"thinking", "reasoning_content", "reasoning"};
    *out = NULL;
    for (size_t k = 0; k < MT_ARRAY_LEN(keys) && !*out; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(msg, keys[k]);
        if (!v || cJSON_IsNull(v)) continue;
        if (get_string(L, msg, keys[k], 1, ctx, out) < 0) return -1;
    }
    return 0;
}

// Appends the messages of array `key` to m[*n..] (m has room for them), roles mapped to
// system/user/assistant (and developer, for harmony); no_loss marks assistant turns kept out of
// the loss. 0 or -1 with an error.
static int read_messages(const loader *L, const cJSON *arr, const char *key, const msg_dialect *dl, int no_loss,
                         mt_chat_msg *m, int *n) {
    int i = 0, harmony = L->d->opts.chat.style == MT_CHAT_HARMONY;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        char ctx[64];
        snprintf(ctx, sizeof ctx, "%s[%d]: ", key, i);
        if (!cJSON_IsObject(it)) {
            mt_error_set("%s: %s[%d] is not an object", L->where, key, i);
            return -1;
        }
        // Tools need their definitions too, which no row form carries: refused rather than dropped.
        if (cJSON_GetObjectItemCaseSensitive(it, "tool_calls")) {
            mt_error_set("%s: %s\"tool_calls\": tool calls are not supported in training data", L->where, ctx);
            return -1;
        }
        const char *role, *content, *thinking;
        // Harmony renders empty contents (and so transformers does): only there are they kept.
        if (required_string(L, it, dl->role_key, ctx, &role)) return -1;
        int rc = get_string(L, it, dl->content_key, harmony, ctx, &content);
        if (rc == 1) mt_error_set("%s: %smissing \"%s\"", L->where, ctx, dl->content_key);
        if (rc || read_thinking(L, it, ctx, &thinking)) return -1;
        int k = 0;
        while (k < 3 && strcmp(role, dl->names[k]) != 0) k++;
        const char *mapped = k < 3 ? plain_roles[k] : NULL;
        if (!mapped && dl == &plain_msgs && strcmp(role, "developer") == 0) mapped = "developer";
        if (!mapped && strcmp(role, "tool") == 0) {
            mt_error_set("%s: %srole \"tool\": tool messages are not supported in training data", L->where, ctx);
            return -1;
        }
        if (!mapped) {
            mt_error_set("%s: %sunknown %s \"%s\" (%s, %s or %s%s)", L->where, ctx, dl->role_key, role, dl->names[0],
                         dl->names[1], dl->names[2], dl == &plain_msgs ? "; developer with harmony" : "");
            return -1;
        }
        m[*n] = (mt_chat_msg){mapped, content, no_loss, thinking};
        ++*n, i++;
    }
    return 0;
}

// A chat sample from one or two message arrays (the second, TRL's completion, alone in the loss
// when given); `stat` counts it.
static int sample_messages(loader *L, const cJSON *obj, const char *key, const char *key2, const msg_dialect *dl,
                           int64_t *stat) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(obj, key), *b = key2 ? cJSON_GetObjectItemCaseSensitive(obj, key2) : NULL;
    const char *keys[2] = {key, key2};
    const cJSON *arrs[2] = {a, b};
    for (int k = 0; k < (key2 ? 2 : 1); k++) {
        if (!cJSON_IsArray(arrs[k])) {
            mt_error_set("%s: \"%s\" must be an array", L->where, keys[k]);
            return -1;
        }
        if (cJSON_GetArraySize(arrs[k]) == 0) {
            mt_error_set("%s: \"%s\" is empty", L->where, keys[k]);
            return -1;
        }
    }
    int total = cJSON_GetArraySize(a) + (b ? cJSON_GetArraySize(b) : 0), n = 0, rc = 0;
    mt_chat_msg *m = mt_xcalloc((size_t)total, sizeof *m);
    // TRL's completion_only_loss: the prompt's own assistant turns are context, not targets.
    if (read_messages(L, a, key, dl, key2 != NULL, m, &n) || (b && read_messages(L, b, key2, dl, 0, m, &n)))
        rc = -1;
    if (rc == 0 && key2) {
        int replies = 0;
        for (int i = cJSON_GetArraySize(a); i < n; i++) replies += strcmp(m[i].role, "assistant") == 0;
        if (!replies) {
            mt_error_set("%s: \"%s\" holds no assistant message: nothing to learn", L->where, key2);
            rc = -1;
        }
    }
    if (rc == 0 && mt_chat_render_template(&L->d->opts.chat, m, n, 1, emit_segment, L)) rc = render_failed(L);
    free(m);
    if (rc == 0) ++*stat;
    return rc;
}

static int sample_chat(loader *L, const cJSON *obj) {
    return sample_messages(L, obj, "messages", NULL, &plain_msgs, &L->d->stats.chat);
}

static int sample_sharegpt(loader *L, const cJSON *obj) {
    return sample_messages(L, obj, "conversations", NULL, &sharegpt_msgs, &L->d->stats.sharegpt);
}

// TRL's prompt-completion rows: two strings (standard) or two message lists (conversational).
static int sample_prompt_completion(loader *L, const cJSON *obj) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(obj, "prompt");
    if (cJSON_IsArray(p))
        return sample_messages(L, obj, "prompt", "completion", &plain_msgs, &L->d->stats.prompt_completion);
    const char *prompt, *completion;
    if (required_string(L, obj, "prompt", "", &prompt) || required_string(L, obj, "completion", "", &completion))
        return -1;
    if (emit_segment(L, MT_SEG_BOS, NULL, 0, 0) || emit_segment(L, MT_SEG_TEXT, prompt, strlen(prompt), 0) ||
        emit_segment(L, MT_SEG_TEXT, completion, strlen(completion), 1) || emit_segment(L, MT_SEG_EOS, NULL, 0, 1))
        return render_failed(L);
    L->d->stats.prompt_completion++;
    return 0;
}

static int has_key(const cJSON *obj, const char *key) {
    return cJSON_GetObjectItemCaseSensitive(obj, key) != NULL;
}

// cJSON turns "\u0000" into a NUL inside a C string, which would cut the text there silently.
static int has_nul_escape(const char *s, size_t len) {
    for (size_t i = 0; i + 6 <= len; i++) {
        if (s[i] != '\\') continue;
        if (s[i + 1] == 'u' && s[i + 2] == '0' && s[i + 3] == '0' && s[i + 4] == '0' &&
            s[i + 5] == '0')
            return 1;
        i++;  // skip the escaped character (so "\\\\u0000" is text, not an escape)
    }
    return 0;
}

// JSON forbids raw control bytes (< 0x20) inside strings, but cJSON copies them in, and a raw NUL
// would then cut the sample short at strlen: the first one's column (from 1), or 0.
static size_t raw_control(const char *s, size_t len) {
    int in_string = 0;
    while (len && (s[len - 1] == '\n' || s[len - 1] == '\r')) len--;  // the line's end
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 && (in_string || (c != '\t' && c != '\r' && c != '\n'))) return i + 1;
        if (in_string && c == '\\') i++;
        else if (c == '"') in_string = !in_string;
    }
    return 0;
}

static int parse_line(loader *L, const char *s, size_t len) {
    size_t col = raw_control(s, len);
    if (col) {
        mt_error_set("%s: raw control byte 0x%02x at column %zu (JSON strings must escape it, e.g. \\u%04x)",
                     L->where, (unsigned char)s[col - 1], col, (unsigned char)s[col - 1]);
        return -1;
    }
    if (has_nul_escape(s, len)) {
        mt_error_set("%s: a string holds \\u0000 (NUL), which a sample cannot carry", L->where);
        return -1;
    }
    const char *end = NULL;
    cJSON *obj = cJSON_ParseWithLengthOpts(s, len, &end, 0);
    if (!obj) {
        const char *e = cJSON_GetErrorPtr();
        long at = e && e >= s && e <= s + len ? (long)(e - s) : 0;
        mt_error_set("%s: invalid JSON (near column %ld)", L->where, at + 1);
        return -1;
    }
    for (const char *p = end; p && p < s + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\r' && *p != '\n') {
            mt_error_set("%s: invalid JSON: more text after the object (column %ld)", L->where,
                         (long)(p - s) + 1);
            cJSON_Delete(obj);
            return -1;
        }
    int rc = -1;
    if (!cJSON_IsObject(obj)) {
        mt_error_set("%s: not a JSON object", L->where);
    } else {
        int has_text = has_key(obj, "text"), has_chat = has_key(obj, "messages");
        int has_inst = has_key(obj, "instruction") || has_key(obj, "output");
        int has_pc = has_key(obj, "prompt") || has_key(obj, "completion"), has_sg = has_key(obj, "conversations");
        if (has_text + has_chat + has_inst + has_pc + has_sg > 1)
            mt_error_set("%s: holds fields of more than one form (\"text\", \"instruction\"/"
                         "\"output\", \"messages\", \"prompt\"/\"completion\", \"conversations\"): which is "
                         "meant?", L->where);
        else if (has_text) rc = sample_text(L, obj);
        else if (has_chat) rc = sample_chat(L, obj);
        else if (has_inst) rc = sample_instruction(L, obj);
        else if (has_pc) rc = sample_prompt_completion(L, obj);
        else if (has_sg) rc = sample_sharegpt(L, obj);
        else
            mt_error_set("%s: no \"text\", \"instruction\"/\"output\", \"messages\", \"prompt\"/"
                         "\"completion\" or \"conversations\" field", L->where);
    }
    cJSON_Delete(obj);
    return rc;
}

uint64_t mt_data_string_cap(const mt_tokenizer *tok, int64_t seq) {
    return ((uint64_t)seq + 2) * mt_tokenizer_max_token_bytes(tok) * 2 + 4096;
}

uint64_t mt_data_work_bytes(int64_t seq, uint64_t max_line_bytes, uint64_t max_token_bytes, uint64_t *typical) {
    uint64_t cap = ((uint64_t)seq + 2) * max_token_bytes * 2 + 4096, fixed = sizeof(mt_line_reader);
    uint64_t sample = ((uint64_t)seq + 1) * 2 * sizeof(int32_t) * 2;  // ids, labels, and their growth
    if (typical) *typical = fixed + sample + 2 * cap + 40 * cap;      // line, cJSON's copy; encoding
    return fixed + sample + max_line_bytes + 32 * max_line_bytes + 40 * MT_MIN(cap, max_line_bytes);
}

static int load_jsonl(loader *L, FILE *f, const char *path) {
    mt_line_reader r;
    uint64_t keep = MT_MIN(L->d->opts.max_line_bytes, (uint64_t)SIZE_MAX / 2);
    mt_line_reader_init(&r, f, path, (size_t)MT_MIN(mt_data_string_cap(L->tok, L->d->opts.seq), keep),
                        (size_t)keep);
    int rc = 0, got;
    while ((got = mt_line_next(&r)) > 0) {
        const char *line = r.line;
        size_t len = r.len;
        int blank = 1;
        for (size_t i = 0; i < len && blank; i++)
            blank = line[i] == ' ' || line[i] == '\t' || line[i] == '\r' || line[i] == '\n';
        if (blank) {
            L->d->stats.blank_lines++;
            continue;
        }
        snprintf(L->where, sizeof L->where, "%s:%lld", path, (long long)r.lineno);
        L->d->stats.lines++;
        loader_begin(L);
        L->cut = r.cut;
        if (parse_line(L, line, len) || loader_finish(L)) {
            rc = -1;
            break;
        }
    }
    if (got < 0) rc = -1;
    mt_line_reader_free(&r);
    mt_oom_context(NULL);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// Token files

static int read_exact(const loader *L, FILE *f, void *buf, size_t n) {
    if (n == 0 || fread(buf, 1, n, f) == n) return 0;
    mt_error_set("%s: read failed: %s", L->where, feof(f) ? "unexpected end of file" : strerror(errno));
    return -1;
}

// Positions [from, len) of a sample's ids (width 4) or mask bytes (width 1), read in pieces and
// checked as the kept ones are: ids inside the vocabulary, mask bytes 0 or 1.
static int check_rest(const loader *L, FILE *f, uint32_t from, uint32_t len, int width) {
    int32_t buf[4096];
    for (uint32_t at = from; at < len;) {
        uint32_t n = MT_MIN(len - at, (uint32_t)(sizeof buf / width));
        if (read_exact(L, f, buf, (size_t)n * width)) return -1;
        for (uint32_t i = 0; i < n; i++) {
            if (width == 4 && (buf[i] < 0 || buf[i] >= L->tok->vocab)) {
                mt_error_set("%s: token id %d at position %u is outside the vocabulary [0, %lld)",
                             L->where, (int)buf[i], at + i, (long long)L->tok->vocab);
                return -1;
            }
            if (width == 1 && ((const uint8_t *)buf)[i] > 1) {
                mt_error_set("%s: mask byte %u at position %u is not 0 or 1", L->where,
                             (unsigned)((const uint8_t *)buf)[i], at + i);
                return -1;
            }
        }
        at += n;
    }
    return 0;
}

static int load_tokfile(loader *L, FILE *f, const char *path, uint64_t size) {
    unsigned char h[TOKFILE_HEADER];
    if (size < TOKFILE_HEADER || fread(h, 1, TOKFILE_HEADER, f) != TOKFILE_HEADER) {
        if (ferror(f)) mt_error_set("%s: read failed in the header: %s", path, strerror(errno));
        else mt_error_set("%s: token file shorter than its %d-byte header", path, TOKFILE_HEADER);
        return -1;
    }
    uint16_t flags;
    uint64_t count;
    memcpy(&flags, h + 6, 2);
    memcpy(&count, h + 8, 8);
    if (flags & ~TOKFILE_FLAG_MASK) {
        mt_error_set("%s: unknown flags 0x%x in the token file header", path, (unsigned)flags);
        return -1;
    }
    int has_mask = flags & TOKFILE_FLAG_MASK;
    if (count > (size - TOKFILE_HEADER) / 4) {
        mt_error_set("%s: truncated or damaged: the header says %" PRIu64 " samples but the file "
                     "(%" PRIu64 " bytes) cannot hold that many", path, count, size);
        return -1;
    }
    uint64_t pos = TOKFILE_HEADER;
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    size_t cap = 0;
    int rc = 0;
    for (uint64_t k = 0; k < count && rc == 0; k++) {
        snprintf(L->where, sizeof L->where, "%s: sample %" PRIu64, path, k);
        mt_oom_context(L->where);
        uint32_t len;
        uint64_t bytes, end;
        if (pos + 4 > size) {
            mt_error_set("%s: truncated: the file ends (at byte %" PRIu64 ") before the sample's "
                         "length", L->where, size);
            rc = -1;
            break;
        }
        if ((rc = read_exact(L, f, &len, 4))) break;
        if (!mt_mul_ok(len, has_mask ? 5 : 4, &bytes) || !mt_add_ok(pos + 4, bytes, &end) ||
            end > size) {
            mt_error_set("%s: truncated: %u tokens need %" PRIu64 " bytes from byte %" PRIu64
                         " but the file has %" PRIu64, L->where, len, bytes, pos + 4, size);
            rc = -1;
            break;
        }
        // Only seq + 1 ids are kept (one more than a row holds: the sample is then overlong);
        // the rest is read in fixed pieces to check it.
        uint32_t k = (uint32_t)MT_MIN((uint64_t)len, (uint64_t)L->d->opts.seq + 1);
        if (k > cap) {
            cap = k;
            ids = mt_xrealloc(ids, cap * sizeof *ids);
            mask = mt_xrealloc(mask, cap);
        }
        if ((rc = read_exact(L, f, ids, (size_t)k * 4)) || (rc = check_rest(L, f, k, len, 4))) break;
        if (has_mask && ((rc = read_exact(L, f, mask, k)) || (rc = check_rest(L, f, k, len, 1)))) break;
        pos = end;
        L->d->stats.lines++;
        L->d->stats.pretokenized++;
        loader_begin(L);
        for (uint32_t i = 0; i < k && rc == 0; i++) {
            if (has_mask && mask[i] > 1) {
                mt_error_set("%s: mask byte %u at position %u is not 0 or 1", L->where,
                             (unsigned)mask[i], i);
                rc = -1;
            }
            push_token(L, ids[i], has_mask ? mask[i] : 1);
        }
        L->content = len;
        if (rc == 0) rc = loader_finish(L);
    }
    if (rc == 0 && pos != size) {
        mt_error_set("%s: %" PRIu64 " bytes after the last of its %" PRIu64 " samples (a damaged "
                     "or concatenated file?)", path, size - pos, count);
        rc = -1;
    }
    free(ids);
    free(mask);
    return rc;
}

int mt_tokfile_write(const char *path, int64_t n, const int64_t *offsets, const int32_t *ids,
                     const uint8_t *mask) {
    mt_atomic_file af;
    if (n < 0) {
        mt_error_set("%s: negative sample count", path);
        return -1;
    }
    if (mt_atomic_open(&af, path)) return -1;
    unsigned char h[TOKFILE_HEADER] = {0};
    uint16_t flags = mask ? TOKFILE_FLAG_MASK : 0;
    uint64_t count = (uint64_t)n;
    memcpy(h, TOKFILE_MAGIC, 6);
    memcpy(h + 6, &flags, 2);
    memcpy(h + 8, &count, 8);
    int ok = fwrite(h, 1, sizeof h, af.f) == sizeof h;
    for (int64_t i = 0; i < n && ok; i++) {
        int64_t len64 = offsets[i + 1] - offsets[i];
        if (len64 < 0 || len64 > UINT32_MAX) {
            mt_atomic_abort(&af);
            mt_error_set("%s: sample %lld has length %lld", path, (long long)i, (long long)len64);
            return -1;
        }
        uint32_t len = (uint32_t)len64;
        ok = fwrite(&len, 4, 1, af.f) == 1 &&
             fwrite(ids + offsets[i], 4, len, af.f) == len &&
             (!mask || fwrite(mask + offsets[i], 1, len, af.f) == len);
    }
    if (!ok) {
        mt_error_set("%s: write failed: %s", path, strerror(errno));
        mt_atomic_abort(&af);
        return -1;
    }
    return mt_atomic_commit(&af);
}

int mt_dataset_save_tokens(const mt_dataset *d, const char *path) {
    int64_t total = d->n ? d->offsets[d->n] : 0;
    uint8_t *mask = mt_xmalloc((size_t)(total ? total : 1));
    for (int64_t i = 0; i < total; i++) mask[i] = d->labels[i] != MT_LABEL_IGNORE;
    int64_t zero = 0;
    int rc = mt_tokfile_write(path, d->n, d->n ? d->offsets : &zero, d->tokens, mask);
    free(mask);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// Loading

int mt_dataset_load(mt_dataset *d, const char *path, const mt_tokenizer *tok,
                    const mt_data_opts *opts) {
    memset(d, 0, sizeof *d);
    d->perm_epoch = -1;
    d->opts = *opts;
    snprintf(d->source, sizeof d->source, "%s", path);
    if (opts->seq < 2) {
        mt_error_set("%s: --seq %lld is too short for a sample", path, (long long)opts->seq);
        return -1;
    }
    struct stat st;
    FILE *f = mt_open_regular(path, &st);
    if (!f) return -1;
    char magic[6] = {0};
    size_t got = fread(magic, 1, sizeof magic, f);
    if (got < sizeof magic && ferror(f)) {
        mt_error_set("%s: read failed: %s", path, strerror(errno));
        fclose(f);
        return -1;
    }
    rewind(f);
    loader L = {.d = d, .tok = tok};
    int rc;
    if (got == sizeof magic && memcmp(magic, TOKFILE_MAGIC, 6) == 0)
        rc = load_tokfile(&L, f, path, (uint64_t)st.st_size);
    else
        rc = load_jsonl(&L, f, path);
    fclose(f);
    mt_oom_context(NULL);
    mt_ids_free(&L.cur_tok);
    mt_ids_free(&L.cur_lab);
    mt_ids_free(&L.scratch);
    if (rc == 0 && d->n == 0) {
        const mt_data_stats *s = &d->stats;
        char notes[1024];
        mt_data_notes_format(s, opts, notes, sizeof notes);
        mt_error_set("%s: no usable sample (%lld read: %lld empty, %lld with nothing in the loss, "
                     "%lld cut to --seq %lld with nothing left in the loss, %lld longer than --seq and "
                     "dropped)%s%s", path, (long long)s->lines, (long long)s->dropped_empty,
                     (long long)s->dropped_masked, (long long)s->dropped_truncated, (long long)opts->seq,
                     (long long)s->dropped_overlong, notes[0] ? "; " : "", notes);
        rc = -1;
    }
    if (rc != 0) mt_dataset_free(d);  // a refused file leaves the caller nothing to free
    return rc;
}

void mt_dataset_free(mt_dataset *d) {
    free(d->offsets);
    free(d->tokens);
    free(d->labels);
    free(d->perm);
    memset(d, 0, sizeof *d);
    d->perm_epoch = -1;
}

int64_t mt_dataset_sample(const mt_dataset *d, int64_t i, const int32_t **tokens,
                          const int32_t **labels) {
    if (i < 0 || i >= d->n) return -1;
    if (tokens) *tokens = d->tokens + d->offsets[i];
    if (labels) *labels = d->labels + d->offsets[i];
    return d->offsets[i + 1] - d->offsets[i];
}

// ---------------------------------------------------------------------------------------------
// Order and batches

// Uniform in [0, n) without modulo bias.
static uint64_t rng_below(mt_rng *r, uint64_t n) {
    uint64_t limit = -n % n, x;
    do x = mt_rng_next(r);
    while (x < limit);
    return x % n;
}

static const int64_t *epoch_order(mt_dataset *d, int64_t epoch) {
    if (!d->perm) d->perm = mt_xmalloc((size_t)d->n * sizeof *d->perm);
    if (d->perm_epoch == epoch) return d->perm;
    for (int64_t i = 0; i < d->n; i++) d->perm[i] = i;
    if (d->opts.shuffle) {
        // Fisher-Yates from the stream (seed, "data.shuffle" + epoch): an epoch's order depends
        // on nothing but the seed and its number.
        mt_rng r;
        mt_rng_seed(&r, d->opts.seed, mt_hash_string("data.shuffle") + (uint64_t)epoch);
        for (int64_t i = d->n - 1; i > 0; i--) {
            int64_t j = (int64_t)rng_below(&r, (uint64_t)i + 1);
            int64_t t = d->perm[i];
            d->perm[i] = d->perm[j];
            d->perm[j] = t;
        }
    }
    d->perm_epoch = epoch;
    return d->perm;
}

static int64_t sample_len(const mt_dataset *d, int64_t i) { return d->offsets[i + 1] - d->offsets[i]; }

int mt_data_next_batch(mt_dataset *d, mt_data_cursor *c, int B, int S, int32_t *tokens,
                       int32_t *labels, int32_t *mask) {
    if (B <= 0 || S <= 0) {
        mt_error_set("%s: batch shape [%d, %d] is empty", d->source, B, S);
        return -1;
    }
    if (d->n <= 0) {
        mt_error_set("%s: the dataset holds no sample", d->source);
        return -1;
    }
    if (d->stats.longest > S) {
        mt_error_set("%s: rows of %d tokens cannot hold the longest sample (%lld tokens)",
                     d->source, S, (long long)d->stats.longest);
        return -1;
    }
    if (c->epoch < 0 || c->index < 0 || c->index >= d->n) {
        mt_error_set("%s: data cursor (epoch %lld, index %lld) does not fit this dataset of %lld "
                     "samples", d->source, (long long)c->epoch, (long long)c->index, (long long)d->n);
        return -1;
    }
    size_t cells = (size_t)B * (size_t)S;
    for (size_t i = 0; i < cells; i++) {
        tokens[i] = PAD_ID;
        labels[i] = MT_LABEL_IGNORE;
        mask[i] = 0;
    }
    int64_t start_epoch = c->epoch;
    int rows = 0;
    for (int r = 0; r < B; r++) {
        if (d->opts.whole_epochs && c->epoch != start_epoch) break;
        int64_t pos = 0;
        for (;;) {
            const int64_t *order = epoch_order(d, c->epoch);
            int64_t i = order[c->index], len = sample_len(d, i);
            if (pos + len > S) break;  // next row (a row is never empty: len ≤ S)
            size_t at = (size_t)r * S + (size_t)pos;
            memcpy(tokens + at, d->tokens + d->offsets[i], (size_t)len * sizeof *tokens);
            memcpy(labels + at, d->labels + d->offsets[i], (size_t)len * sizeof *labels);
            for (int64_t k = 0; k < len; k++) mask[at + k] = 1;
            pos += len;
            int epoch_end = ++c->index == d->n;
            if (epoch_end) {
                c->epoch++;
                c->index = 0;
            }
            if (!d->opts.packing || epoch_end) break;
        }
        rows++;
    }
    return rows;
}

int64_t mt_data_epoch_rows(mt_dataset *d, int64_t epoch, int S) {
    if (d->stats.longest > S) {
        mt_error_set("%s: rows of %d tokens cannot hold the longest sample (%lld tokens)",
                     d->source, S, (long long)d->stats.longest);
        return -1;
    }
    if (!d->opts.packing) return d->n;
    const int64_t *order = epoch_order(d, epoch);
    int64_t rows = 0, pos = S;
    for (int64_t k = 0; k < d->n; k++) {
        int64_t len = sample_len(d, order[k]);
        if (pos + len > S) {
            rows++;
            pos = 0;
        }
        pos += len;
    }
    return rows;
}

uint64_t mt_dataset_fingerprint(const mt_dataset *d) {
    uint64_t h = 0xcbf29ce484222325ull;
#define MIX(x) (h = (h ^ (uint64_t)(x)) * 0x100000001b3ull)
    MIX(d->n);
    MIX(d->opts.seed);
    MIX(d->opts.shuffle);
    MIX(d->opts.packing);
    for (int64_t i = 0; i <= d->n && d->offsets; i++) MIX(d->offsets[i]);
    int64_t total = d->n ? d->offsets[d->n] : 0;
    for (int64_t i = 0; i < total; i++) {
        MIX((uint32_t)d->tokens[i]);
        MIX((uint32_t)d->labels[i]);
    }
#undef MIX
    return h;
}

void mt_data_stats_format(const mt_data_stats *s, char *buf, size_t n) {
    snprintf(buf, n,
             "samples=%lld tokens=%lld loss_tokens=%lld truncated=%lld dropped_overlong=%lld "
             "dropped_empty=%lld dropped_truncated=%lld dropped_masked=%lld longest=%lld (text=%lld "
             "instruction=%lld chat=%lld prompt_completion=%lld sharegpt=%lld pretokenized=%lld)",
             (long long)s->samples, (long long)s->tokens, (long long)s->loss_tokens,
             (long long)s->truncated, (long long)s->dropped_overlong, (long long)s->dropped_empty,
             (long long)s->dropped_truncated, (long long)s->dropped_masked, (long long)s->longest,
             (long long)s->text, (long long)s->instruction, (long long)s->chat,
             (long long)s->prompt_completion, (long long)s->sharegpt, (long long)s->pretokenized);
}

void mt_data_notes_format(const mt_data_stats *s, const mt_data_opts *o, char *buf, size_t n) {
    size_t k = 0;
#define ADD(...) (k += (size_t)snprintf(buf + k, k < n ? n - k : 0, __VA_ARGS__), k = MT_MIN(k, n ? n - 1 : 0))
    if (n) buf[0] = 0;
    int chatty = s->chat || s->sharegpt || s->prompt_completion || (s->instruction && o->prompt == MT_PROMPT_CHAT);
    if (s->instruction)
        ADD("instruction template %s%s", mt_prompt_style_name(o->prompt),
            o->prompt == MT_PROMPT_ALPACA ? " (Alpaca's preamble, ~150 bytes a prompt)" : "");
    if (s->lines > s->pretokenized)
        ADD("%schat template %s (%s)%s", k ? "; " : "", mt_chat_style_name(o->chat.style),
            o->chat.source[0] ? o->chat.source : "?", chatty ? "" : ", unused");
    if (s->truncated || s->dropped_truncated) {
        ADD("%s--seq %lld cut %lld sample%s", k ? "; " : "", (long long)o->seq,
            (long long)(s->truncated + s->dropped_truncated), s->truncated + s->dropped_truncated == 1 ? "" : "s");
        if (s->dropped_truncated)
            ADD(" (%lld lost every token in the loss and %s dropped)", (long long)s->dropped_truncated,
                s->dropped_truncated == 1 ? "was" : "were");
        ADD(": raise --seq%s", s->instruction && o->prompt == MT_PROMPT_ALPACA
                                   ? " or shorten the prompt with --instruction-template none" : "");
    }
#undef ADD
}
