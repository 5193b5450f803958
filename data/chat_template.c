// data/chat_template.c — how a chat or an instruction sample becomes text and special tokens.
//
// Chat: Mixtral-8x7B-Instruct-v0.1's chat_template, as in its tokenizer_config.json (revision
// 1e637f2d7cb0a9d6fb1922f305cb784995190a83, the template transformers' apply_chat_template runs):
//
//   {{ bos_token }}{% for message in messages %}
//     {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
//       {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
//     {% endif %}
//     {% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}
//     {% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}
//     {% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}
//   {% endfor %}
//
// which gives  <s>[INST] u1 [/INST]a1</s>[INST] u2 [/INST]a2</s>. What we match and add:
//   * the same strings, order, BOS once at the start and EOS after every assistant turn, and the
//     same alternation rule (first turn user);
//   * that template has no system role. We accept one system message, first only, and prepend
//     it to the first user turn as "{system}\n\n{user}", the form of the later Mistral templates
//     and mistral-common (which, for inference, put it on the last user turn instead; for a
//     single-turn sample the two agree);
//   * tokenization per run, as mistral-common does it: "[INST] … [/INST]" and each assistant
//     reply are encoded separately, so SentencePiece gives the reply its "▁" prefix and the
//     loss boundary is a token boundary (transformers, encoding the rendered string whole, would
//     glue the reply's first piece to "]"). The byte-level tokenizer sees the template's exact
//     bytes.
// Loss: assistant replies and their </s>; BOS, [INST] runs (system and user text) never.
//
// Instruction: the Alpaca prompt (Stanford Alpaca's PROMPT_DICT, "prompt_input" and
// "prompt_no_input"), then the output and EOS in the loss.
#include <string.h>

#include "core/common.h"
#include "data/data.h"

static const char *const alpaca_intro_input =
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n";
static const char *const alpaca_intro_no_input =
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\n\n";

// A small growable string.
typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void sb_add(sbuf *b, const char *s) {
    size_t k = strlen(s);
    if (b->n + k + 1 > b->cap) {
        b->cap = MT_MAX(2 * b->cap, b->n + k + 64);
        b->p = mt_xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, k + 1);
    b->n += k;
}

static int emit_str(mt_seg_fn emit, void *ctx, const char *s, int in_loss) {
    return emit(ctx, MT_SEG_TEXT, s, strlen(s), in_loss);
}

int mt_chat_render(const mt_chat_msg *msgs, int n, int need_assistant, mt_seg_fn emit, void *ctx) {
    int first = 0;
    const char *system = NULL;
    if (n > 0 && msgs[0].role && strcmp(msgs[0].role, "system") == 0) {
        system = msgs[0].content;
        first = 1;
    }
    // Check everything before emitting anything.
    int assistants = 0;
    for (int i = 0; i < n; i++) {
        const char *role = msgs[i].role, *content = msgs[i].content;
        if (!role || !content) {
            mt_error_set("message %d: missing \"role\" or \"content\"", i);
            return -1;
        }
        int is_user = strcmp(role, "user") == 0, is_asst = strcmp(role, "assistant") == 0;
        if (!is_user && !is_asst && strcmp(role, "system") != 0) {
            mt_error_set("message %d: unknown role \"%s\" (system, user or assistant)", i, role);
            return -1;
        }
        if (!content[0]) {
            mt_error_set("message %d (%s): empty \"content\"", i, role);
            return -1;
        }
        if (i < first) continue;
        int want_user = (i - first) % 2 == 0;
        if (!is_user && !is_asst) {
            mt_error_set("message %d: a system message may only come first", i);
            return -1;
        }
        if (is_user != want_user) {
            mt_error_set("message %d: roles must alternate user/assistant after an optional "
                         "system message, but this one is \"%s\"", i, role);
            return -1;
        }
        assistants += is_asst;
    }
    if (n - first <= 0) {
        mt_error_set("the conversation has no user message");
        return -1;
    }
    if (need_assistant && assistants == 0) {
        mt_error_set("the conversation has no assistant turn: nothing to learn");
        return -1;
    }
    if (emit(ctx, MT_SEG_BOS, NULL, 0, 0)) return -1;
    sbuf b = {0};
    int rc = 0;
    for (int i = first; i < n && rc == 0; i++) {
        if (strcmp(msgs[i].role, "user") == 0) {
            b.n = 0;
            sb_add(&b, "[INST] ");
            if (system && i == first) {
                sb_add(&b, system);
                sb_add(&b, "\n\n");
            }
            sb_add(&b, msgs[i].content);
            sb_add(&b, " [/INST]");
            rc = emit(ctx, MT_SEG_TEXT, b.p, b.n, 0);
        } else {
            rc = emit_str(emit, ctx, msgs[i].content, 1);
            if (rc == 0) rc = emit(ctx, MT_SEG_EOS, NULL, 0, 1);
        }
    }
    free(b.p);
    return rc;
}

int mt_instruction_render(const char *instruction, const char *input, const char *output,
                          mt_prompt_style style, mt_seg_fn emit, void *ctx) {
    int has_input = input && input[0];
    sbuf b = {0};
    if (style == MT_PROMPT_ALPACA) sb_add(&b, has_input ? alpaca_intro_input : alpaca_intro_no_input);
    sb_add(&b, "### Instruction:\n");
    sb_add(&b, instruction);
    if (has_input) {
        sb_add(&b, "\n\n### Input:\n");
        sb_add(&b, input);
    }
    sb_add(&b, "\n\n### Response:\n");
    int rc = emit(ctx, MT_SEG_BOS, NULL, 0, 0);
    if (rc == 0) rc = emit(ctx, MT_SEG_TEXT, b.p, b.n, 0);
    free(b.p);
    if (rc || !output) return rc;
    if (emit_str(emit, ctx, output, 1)) return -1;
    return emit(ctx, MT_SEG_EOS, NULL, 0, 1);
}
