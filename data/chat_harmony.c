// data/chat_harmony.c — gpt-oss's chat template (OpenAI's "harmony" format), without tools.
//
// Equal, as text, to transformers' apply_chat_template on gpt-oss-120b's chat_template.jinja
// (recognised in chat_template.c by its SHA-256; tests/test_harmony.c checks it against
// scripts/make_harmony_fixtures.py) with the template's defaults for its other inputs (no tools,
// no builtin_tools, model_identity and reasoning_effort unset):
//
//   <|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n
//   Knowledge cutoff: 2024-06\nCurrent date: {date}\n\nReasoning: medium\n\n
//   # Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>
//   then, when the first message is a system or developer one with non-empty content,
//   <|start|>developer<|message|># Instructions\n\n{content}\n\n<|end|>
//   then per message: <|start|>user<|message|>{content}<|end|>
//                     <|start|>assistant<|channel|>final<|message|>{content}<|end|>
//   except the last message when it is the assistant's (the training case): its thinking, when it
//   has a "thinking" (even ""), as <|start|>assistant<|channel|>analysis<|message|>{thinking}<|end|>,
//   then <|start|>assistant<|channel|>final<|message|>{content}<|return|>. Earlier replies'
//   thinking is dropped, as the template drops it. Ending on a user turn adds <|start|>assistant.
//
// {date} is strftime_now("%Y-%m-%d") in transformers (the local date at render time): here
// t->date (--chat-date), or today's local date when it is "".
// Loss: what the model writes after the generation prompt "<|start|>assistant": an assistant
// turn's "<|channel|>…" onward through its <|end|> or <|return|>, the last turn's analysis
// message and the "<|start|>assistant" between it and the final one included. Every segment
// boundary falls between two special tokens, so encoding the runs separately equals encoding the
// whole rendering.
// Refused, with the message's index: roles other than system/developer (first only), user and
// assistant; thinking on a non-assistant message; content or thinking holding the template's
// "<|channel|>analysis<|message|>" or "<|channel|>final<|message|>" (its own raise_exception).
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/common.h"
#include "data/data.h"

typedef struct hbuf {
    char *p;
    size_t n, cap;
} hbuf;

static void hb_add(hbuf *b, const char *s) {
    size_t k = strlen(s);
    if (b->n + k + 1 > b->cap) {
        b->cap = MT_MAX(2 * b->cap, b->n + k + 64);
        b->p = mt_xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, k + 1);
    b->n += k;
}

// Emits b as one run and empties it.
static int hb_emit(hbuf *b, mt_seg_fn emit, void *ctx, int in_loss) {
    int rc = b->n ? emit(ctx, MT_SEG_TEXT, b->p, b->n, in_loss) : 0;
    b->n = 0;
    return rc;
}

static int has_channel_tag(const char *s) {
    return s && (strstr(s, "<|channel|>analysis<|message|>") || strstr(s, "<|channel|>final<|message|>"));
}

// [system|developer] user assistant user ...: the project's alternation rule, with harmony's
// developer role and empty contents allowed.
static int check_harmony(const mt_chat_msg *msgs, int n, int need_assistant, int *first) {
    *first = n > 0 && msgs[0].role && (strcmp(msgs[0].role, "system") == 0 || strcmp(msgs[0].role, "developer") == 0);
    int assistants = 0;
    for (int i = 0; i < n; i++) {
        const char *role = msgs[i].role;
        if (!role || !msgs[i].content) {
            mt_error_set("message %d: missing \"role\" or \"content\"", i);
            return -1;
        }
        int is_user = strcmp(role, "user") == 0, is_asst = strcmp(role, "assistant") == 0;
        if (!is_user && !is_asst && strcmp(role, "system") != 0 && strcmp(role, "developer") != 0) {
            mt_error_set("message %d: unknown role \"%s\" (system, developer, user or assistant)", i, role);
            return -1;
        }
        if (msgs[i].thinking && !is_asst) {
            mt_error_set("message %d (%s): only an assistant message may carry thinking", i, role);
            return -1;
        }
        if (has_channel_tag(msgs[i].content) || has_channel_tag(msgs[i].thinking)) {
            mt_error_set("message %d (%s): holds a <|channel|> tag: pass the analysis text as \"thinking\" "
                         "and the final text as \"content\"", i, role);
            return -1;
        }
        if (i < *first) continue;
        if (mt_chat_check_turn(&msgs[i], i, *first, is_user, is_asst, "system or developer")) return -1;
        assistants += is_asst;
    }
    return mt_chat_check_turns_end(n, *first, assistants, need_assistant);
}

int mt_chat_date_set(mt_chat_template *t, const char *flag) {
    if (!flag || !flag[0]) {
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        strftime(t->date, sizeof t->date, "%Y-%m-%d", &tm);
        return 0;
    }
    int y, m, d;
    char tail;
    if (strlen(flag) != 10 || sscanf(flag, "%4d-%2d-%2d%c", &y, &m, &d, &tail) != 3 || flag[4] != '-' ||
        flag[7] != '-' || m < 1 || m > 12 || d < 1 || d > 31) {
        mt_error_set("--chat-date: \"%s\" is not a date YYYY-MM-DD", flag);
        return -1;
    }
    snprintf(t->date, sizeof t->date, "%s", flag);
    return 0;
}

int mt_chat_render_harmony(const mt_chat_template *t, const mt_chat_msg *msgs, int n, int need_assistant,
                           mt_seg_fn emit, void *ctx) {
    int first;
    if (check_harmony(msgs, n, need_assistant, &first)) return -1;
    mt_chat_template today = {0};
    const char *date = t->date;
    if (!date[0]) {
        mt_chat_date_set(&today, "");
        date = today.date;
    }
    hbuf b = {0};
    hb_add(&b, "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
               "Knowledge cutoff: 2024-06\nCurrent date: ");
    hb_add(&b, date);
    hb_add(&b, "\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be "
               "included for every message.<|end|>");
    // A first system or developer message becomes the developer's instructions; empty, nothing.
    if (first && msgs[0].content[0]) {
        hb_add(&b, "<|start|>developer<|message|># Instructions\n\n");
        hb_add(&b, msgs[0].content);
        hb_add(&b, "\n\n<|end|>");
    }
    int rc = 0;
    for (int i = first; i < n && rc == 0; i++) {
        const mt_chat_msg *m = &msgs[i];
        if (strcmp(m->role, "user") == 0) {
            hb_add(&b, "<|start|>user<|message|>");
            hb_add(&b, m->content);
            hb_add(&b, "<|end|>");
            continue;
        }
        hb_add(&b, "<|start|>assistant");
        rc = hb_emit(&b, emit, ctx, 0);
        int last = i == n - 1;
        if (last && m->thinking) {
            hb_add(&b, "<|channel|>analysis<|message|>");
            hb_add(&b, m->thinking);
            hb_add(&b, "<|end|><|start|>assistant");
        }
        hb_add(&b, "<|channel|>final<|message|>");
        hb_add(&b, m->content);
        hb_add(&b, last ? "<|return|>" : "<|end|>");
        if (rc == 0) rc = hb_emit(&b, emit, ctx, !m->no_loss);
    }
    if (rc == 0 && strcmp(msgs[n - 1].role, "user") == 0) hb_add(&b, "<|start|>assistant");
    if (rc == 0) rc = hb_emit(&b, emit, ctx, 0);
    free(b.p);
    return rc;
}
