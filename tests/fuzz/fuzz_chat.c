// libFuzzer target: the chat-template renderer, in every template, never crashes and never loses a
// message. First byte: the template (mixtral, chatml, qwen, qwen2, qwen3, tulu, olmo). Second
// byte, bit 0 clear: the rest is a JSONL file of rows of any shape ("messages" with null, list,
// object or tool-call contents, unknown roles, ...) loaded as a dataset with that template: it
// loads (ids in the vocabulary, labels the token or ignored) or is refused with an error naming
// the line. Bit 0 set: the rest is messages as NUL-separated role / content fields, rendered
// directly: accepted or refused, and when accepted every system and user content appears in the
// rendered text, and something is in the loss when an assistant turn is required.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "data/data.h"
#include "data/tokenizer.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/fuzz/fuzz_data.h"

static const mt_chat_style STYLES[] = {MT_CHAT_MIXTRAL, MT_CHAT_CHATML, MT_CHAT_QWEN, MT_CHAT_QWEN2,
                                       MT_CHAT_QWEN3, MT_CHAT_TULU, MT_CHAT_OLMO, MT_CHAT_HARMONY};

typedef struct {
    char *text;
    size_t n, cap;
    size_t in_loss;
} render_out;

static int collect(void *ctx, mt_seg_kind kind, const char *text, size_t len, int in_loss) {
    render_out *o = ctx;
    if (kind != MT_SEG_TEXT) {
        o->in_loss += in_loss;
        return 0;
    }
    if (o->n + len + 1 > o->cap) {
        o->cap = 2 * (o->n + len + 1);
        o->text = realloc(o->text, o->cap);
    }
    memcpy(o->text + o->n, text, len);
    o->n += len;
    o->text[o->n] = 0;
    o->in_loss += in_loss && len;
    return 0;
}

static void render_direct(const mt_chat_template *t, int need_assistant, const uint8_t *p, size_t n) {
    char *buf = malloc(n + 1);
    memcpy(buf, p, n);
    buf[n] = 0;
    mt_chat_msg msgs[16];
    int k = 0;
    char *s = buf, *end = buf + n;
    while (k < 16 && s < end) {
        char *role = s;
        s += strlen(s) + 1;
        if (s >= end) break;
        char *content = s;
        s += strlen(s) + 1;
        // An assistant's content after a 0x1F is its thinking (harmony's analysis channel).
        char *sep = strchr(content, 0x1F);
        if (sep) *sep = 0;
        msgs[k++] = (mt_chat_msg){role, content, 0, sep ? sep + 1 : NULL};
    }
    if (k > 0) {
        render_out o = {0};
        if (mt_chat_render_template(t, msgs, k, need_assistant, collect, &o) == 0) {
            for (int i = 0; i < k; i++)
                if ((strcmp(msgs[i].role, "user") == 0 || strcmp(msgs[i].role, "system") == 0) && msgs[i].content[0] &&
                    (!o.text || !strstr(o.text, msgs[i].content)))
                    __builtin_trap();  // a user or system message lost
            if (need_assistant && o.in_loss == 0) __builtin_trap();
        }
        free(o.text);
    }
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const mt_tokenizer *tok = fuzz_byte_tokenizer();
    if (size < 2) return 0;
    mt_chat_template t = {.style = STYLES[data[0] % MT_ARRAY_LEN(STYLES)]};
    strcpy(t.bos_token, "<s>");
    strcpy(t.eos_token, "</s>");
    strcpy(t.date, "2025-08-05");  // harmony's date: today's would make runs differ
    if (data[1] & 1) {
        render_direct(&t, (data[1] >> 1) & 1, data + 2, size - 2);
        return 0;
    }
    char in[256];
    snprintf(in, sizeof in, "%s/rows.jsonl", fuzz_dir("chat"));
    fuzz_write(in, data + 2, size - 2);
    mt_data_opts o;
    mt_data_opts_default(&o);
    o.shuffle = 0;
    o.seq = 256;
    o.chat = t;
    mt_dataset d;
    if (mt_dataset_load(&d, in, tok, &o) == 0) {
        fuzz_check_dataset(&d, 256, o.seq);
    } else if (!strstr(mt_error_get(), in)) {
        __builtin_trap();  // a refusal names the file
    }
    mt_dataset_free(&d);
    return 0;
}
