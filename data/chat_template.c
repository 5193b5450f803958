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
// Other templates (mt_chat_render_template), each equal as text to transformers'
// apply_chat_template on the Jinja string in known_templates[] below (tests/test_bpe.c checks
// it on fixtures from scripts/make_bpe_fixtures.py), with the same role rules as above:
//   chatml  transformers' generic ChatML: <|im_start|>{role}\n{content}<|im_end|>\n per message;
//           generation prompt <|im_start|>assistant\n.
//   qwen    Qwen1.5-*-Chat (Qwen1.5-MoE-A2.7B-Chat): ChatML with the system message "You are a
//           helpful assistant" when the conversation has none.
//   qwen2   Qwen2-*-Instruct (Qwen2-57B-A14B-Instruct): the same with "You are a helpful
//           assistant." (a full stop). Qwen2.5's template (tools, its own default system
//           message) is not among these.
//   qwen3   Qwen3's (Qwen3-30B-A3B, the April 2025 releases), messages without tools: ChatML
//           with no default system message. A reply's "<think>…</think>" is dropped from the
//           turns before the last user message; the reply after it is printed as
//           "<think>\n{reasoning}\n</think>\n\n{answer}", with an empty block when it has no
//           reasoning. Python's split/strip rules apply to the reply as in the template. A user
//           message that is wholly "<tool_response>…</tool_response>" is not a query. Recognised
//           by the SHA-256 of its canonical Jinja (QWEN3_SHA256). In the loss: a
//           non-empty think block, the answer and <|im_end|>; an empty "<think>\n\n</think>\n\n"
//           is prompt, as the non-thinking generation prompt (enable_thinking=false) writes it.
//   tulu    OLMoE-1B-7B-0924-Instruct's (the Tulu template): {bos_token}, then <|system|>\n{s}\n,
//           <|user|>\n{u}\n, <|assistant|>\n{a}{eos_token}\n; generation prompt <|assistant|>\n.
//           Reconstructed from the model's discussion page and the Tulu papers: the exact
//           tokenizer_config.json was not available to us, so a real file may differ in Jinja
//           whitespace (recognition then fails, with an error suggesting --chat-template tulu).
//   olmo    AI2's OLMo template: tulu's, opened with eos_token instead of bos_token (as public
//           OLMo and OLMoE code quotes it; OLMoE's tokenizer has bos = eos = <|endoftext|>, where
//           the two render alike).
//   harmony gpt-oss's (OpenAI's harmony format), in chat_harmony.c; recognised by HARMONY_SHA256.
//   Loss: the assistant's content and its end marker (<|im_end|>, eos_token), never the "\n"
//   after it nor the role headers. Special tokens are emitted as text (the BPE encoder matches
//   them as added tokens, as transformers does); each run is encoded separately, which equals
//   encoding the whole rendered string except where a content starts with whitespace that the
//   pre-tokenizer would have joined to the header's "\n".
//
// Instruction (--instruction-template): the Alpaca prompt (Stanford Alpaca's PROMPT_DICT,
// "prompt_input" and "prompt_no_input"), the same without its first paragraph, no template (the
// instruction and input alone), or one user turn through the chat template; then the output and
// EOS in the loss.
//
// Without tokenizer_config.json (the tiny byte-level models) a model gets its family's template
// (family_template below) and tulu/olmo, which print bos_token/eos_token as text, use the
// tokenizer's BOS/EOS ids instead. A message's no_loss keeps an assistant turn out of the loss
// (TRL's conversational prompts: only the completion is learnt).
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/sha256.h"
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

// Checks a conversation before anything is emitted: [system] user assistant user ...; sets
// *first to 1 when a system message leads.
static int check_conversation(const mt_chat_msg *msgs, int n, int need_assistant, int *first) {
    *first = n > 0 && msgs[0].role && strcmp(msgs[0].role, "system") == 0;
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
        if (msgs[i].thinking) {
            mt_error_set("message %d: \"thinking\" is rendered only by the harmony template (gpt-oss)", i);
            return -1;
        }
        if (i < *first) continue;
        if (mt_chat_check_turn(&msgs[i], i, *first, is_user, is_asst, "system")) return -1;
        assistants += is_asst;
    }
    return mt_chat_check_turns_end(n, *first, assistants, need_assistant);
}

int mt_chat_check_turn(const mt_chat_msg *msg, int i, int first, int is_user, int is_asst, const char *lead) {
    if (!is_user && !is_asst) {
        mt_error_set("message %d: a %s message may only come first", i, msg->role);
        return -1;
    }
    if (is_user != ((i - first) % 2 == 0)) {
        mt_error_set("message %d: roles must alternate user/assistant after an optional %s message, but this "
                     "one is \"%s\"", i, lead, msg->role);
        return -1;
    }
    return 0;
}

int mt_chat_check_turns_end(int n, int first, int assistants, int need_assistant) {
    if (n - first <= 0) {
        mt_error_set("the conversation has no user message");
        return -1;
    }
    if (need_assistant && assistants == 0) {
        mt_error_set("the conversation has no assistant turn: nothing to learn");
        return -1;
    }
    return 0;
}

int mt_chat_render(const mt_chat_msg *msgs, int n, int need_assistant, mt_seg_fn emit, void *ctx) {
    int first;
    if (check_conversation(msgs, n, need_assistant, &first)) return -1;
    const char *system = first ? msgs[0].content : NULL;
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
            int loss = !msgs[i].no_loss;
            rc = emit_str(emit, ctx, msgs[i].content, loss);
            if (rc == 0) rc = emit(ctx, MT_SEG_EOS, NULL, 0, loss);
        }
    }
    free(b.p);
    return rc;
}

// Emits the text in b (not in the loss) and empties b; the next runs go on from there.
static int flush(sbuf *b, mt_seg_fn emit, void *ctx) {
    int rc = b->n ? emit(ctx, MT_SEG_TEXT, b->p, b->n, 0) : 0;
    b->n = 0;
    return rc;
}

// A ChatML turn's header into b; a system or user turn whole (0), an assistant's header only
// (1: its reply and <|im_end|> are the caller's, in the loss).
static int chatml_header(sbuf *b, const mt_chat_msg *m) {
    sb_add(b, "<|im_start|>");
    sb_add(b, m->role);
    sb_add(b, "\n");
    if (strcmp(m->role, "assistant") == 0) return 1;
    sb_add(b, m->content);
    sb_add(b, "<|im_end|>\n");
    return 0;
}

// default_system: the system message a conversation without one gets (NULL: none).
static int render_chatml(const char *default_system, const mt_chat_msg *msgs, int n, int first,
                         mt_seg_fn emit, void *ctx) {
    sbuf b = {0};
    int rc = 0;
    if (default_system && !first) {
        sb_add(&b, "<|im_start|>system\n");
        sb_add(&b, default_system);
        sb_add(&b, "<|im_end|>\n");
    }
    for (int i = 0; i < n && rc == 0; i++) {
        if (!chatml_header(&b, &msgs[i])) continue;
        rc = flush(&b, emit, ctx);
        if (rc == 0) rc = emit_str(emit, ctx, msgs[i].content, !msgs[i].no_loss);
        if (rc == 0) rc = emit_str(emit, ctx, "<|im_end|>", !msgs[i].no_loss);
        sb_add(&b, "\n");
    }
    if (rc == 0 && strcmp(msgs[n - 1].role, "user") == 0) sb_add(&b, "<|im_start|>assistant\n");
    if (rc == 0) rc = flush(&b, emit, ctx);
    free(b.p);
    return rc;
}

// 1 for a user message that carries a tool's answer rather than a query (Qwen3's rule).
static int is_tool_response(const char *s) {
    size_t n = strlen(s), a = strlen("<tool_response>"), z = strlen("</tool_response>");
    return n >= a && n >= z && strncmp(s, "<tool_response>", a) == 0 && strcmp(s + n - z, "</tool_response>") == 0;
}

// A reply split as Qwen3's template splits it: with "</think>" in it, the answer is what follows
// the last one, '\n's stripped on the left; the reasoning is what precedes the first one,
// '\n's stripped on the right, after its last "<think>", '\n's stripped on the left.
// Without, the answer is the reply and the reasoning empty. *reasoning is malloc'ed.
static const char *qwen3_split(const char *reply, char **reasoning) {
    const char *end = strstr(reply, "</think>");
    *reasoning = mt_xcalloc(1, 1);
    if (!end) return reply;
    const char *answer = reply, *p;
    for (p = reply; (p = strstr(p, "</think>")); p += strlen("</think>")) answer = p + strlen("</think>");
    while (*answer == '\n') answer++;
    size_t len = (size_t)(end - reply);
    while (len && reply[len - 1] == '\n') len--;
    const char *start = reply;
    for (p = reply; (p = strstr(p, "<think>")) && p + strlen("<think>") <= reply + len; p += strlen("<think>"))
        start = p + strlen("<think>");
    while (start < reply + len && *start == '\n') start++;
    free(*reasoning);
    *reasoning = mt_xmalloc((size_t)(reply + len - start) + 1);
    memcpy(*reasoning, start, (size_t)(reply + len - start));
    (*reasoning)[reply + len - start] = 0;
    return answer;
}

static int render_qwen3(const mt_chat_msg *msgs, int n, mt_seg_fn emit, void *ctx) {
    int last_query = n - 1;
    for (int i = n - 1; i >= 0; i--)
        if (strcmp(msgs[i].role, "user") == 0 && !is_tool_response(msgs[i].content)) {
            last_query = i;
            break;
        }
    sbuf b = {0};
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if (!chatml_header(&b, &msgs[i])) continue;
        char *reasoning;
        const char *answer = qwen3_split(msgs[i].content, &reasoning);
        if (i > last_query && (i == n - 1 || reasoning[0])) {
            char *r = reasoning;  // strip('\n')
            size_t len = strlen(r);
            while (len && r[len - 1] == '\n') r[--len] = 0;
            while (*r == '\n') r++;
            while (*answer == '\n') answer++;
            if (!r[0]) sb_add(&b, "<think>\n\n</think>\n\n");
            rc = flush(&b, emit, ctx);
            if (rc == 0 && r[0]) {
                sb_add(&b, "<think>\n");
                sb_add(&b, r);
                sb_add(&b, "\n</think>\n\n");
                rc = emit(ctx, MT_SEG_TEXT, b.p, b.n, !msgs[i].no_loss);
                b.n = 0;
            }
        } else
            rc = flush(&b, emit, ctx);
        if (rc == 0 && answer[0]) rc = emit_str(emit, ctx, answer, !msgs[i].no_loss);
        if (rc == 0) rc = emit_str(emit, ctx, "<|im_end|>", !msgs[i].no_loss);
        sb_add(&b, "\n");
        free(reasoning);
    }
    if (rc == 0 && strcmp(msgs[n - 1].role, "user") == 0) sb_add(&b, "<|im_start|>assistant\n");
    if (rc == 0) rc = flush(&b, emit, ctx);
    free(b.p);
    return rc;
}

// first: the token the template opens with (tulu: bos_token, olmo: eos_token).
static int render_tulu(const mt_chat_template *t, const char *first, const mt_chat_msg *msgs, int n,
                       mt_seg_fn emit, void *ctx) {
    sbuf b = {0};
    int rc = 0;
    // Without the token's text (a byte-level model has no tokenizer_config.json) the tokenizer's
    // own BOS / EOS ids stand in for it.
    if (first[0]) sb_add(&b, first);
    else rc = emit(ctx, t->style == MT_CHAT_TULU ? MT_SEG_BOS : MT_SEG_EOS, NULL, 0, 0);
    for (int i = 0; i < n && rc == 0; i++) {
        const char *role = msgs[i].role;
        if (strcmp(role, "assistant") != 0) {
            sb_add(&b, strcmp(role, "user") == 0 ? "<|user|>\n" : "<|system|>\n");
            sb_add(&b, msgs[i].content);
            sb_add(&b, "\n");
            continue;
        }
        sb_add(&b, "<|assistant|>\n");
        rc = flush(&b, emit, ctx);
        int loss = !msgs[i].no_loss;
        if (rc == 0) rc = emit_str(emit, ctx, msgs[i].content, loss);
        if (rc == 0) rc = t->eos_token[0] ? emit_str(emit, ctx, t->eos_token, loss) : emit(ctx, MT_SEG_EOS, NULL, 0, loss);
        sb_add(&b, "\n");
    }
    if (rc == 0 && strcmp(msgs[n - 1].role, "user") == 0) sb_add(&b, "<|assistant|>\n");
    if (rc == 0) rc = flush(&b, emit, ctx);
    free(b.p);
    return rc;
}

int mt_chat_render_template(const mt_chat_template *t, const mt_chat_msg *msgs, int n,
                            int need_assistant, mt_seg_fn emit, void *ctx) {
    if (t->style == MT_CHAT_NONE) {
        mt_error_set("%s", t->why[0] ? t->why : "no chat template: pass --chat-template");
        return -1;
    }
    if (t->style == MT_CHAT_MIXTRAL) return mt_chat_render(msgs, n, need_assistant, emit, ctx);
    if (t->style == MT_CHAT_HARMONY) return mt_chat_render_harmony(t, msgs, n, need_assistant, emit, ctx);
    int first;
    if (check_conversation(msgs, n, need_assistant, &first)) return -1;
    if (t->style == MT_CHAT_TULU || t->style == MT_CHAT_OLMO) {
        return render_tulu(t, t->style == MT_CHAT_TULU ? t->bos_token : t->eos_token, msgs, n, emit, ctx);
    }
    if (t->style == MT_CHAT_QWEN3) return render_qwen3(msgs, n, emit, ctx);
    const char *sys = t->style == MT_CHAT_QWEN    ? "You are a helpful assistant"
                      : t->style == MT_CHAT_QWEN2 ? "You are a helpful assistant."
                                                  : NULL;
    return render_chatml(sys, msgs, n, first, emit, ctx);
}

// --- selection -----------------------------------------------------------------------------

static const char *const style_names[] = {"mixtral", "chatml", "qwen", "tulu", "qwen2", "qwen3", "olmo", "harmony"};

// Qwen3's template (Qwen3-30B-A3B's tokenizer_config.json, 4.1 kB), canonical form's SHA-256.
#define QWEN3_SHA256 "3c8fb44cf96664e5bdf28e72399771f0d8100f4d37b52f278d941d79c9850ec7"
// gpt-oss-120b's (16.7 kB; llama.cpp's models/templates/openai-gpt-oss-120b.jinja, kept in
// tests/data/harmony/chat_template.jinja), canonical form's SHA-256.
#define HARMONY_SHA256 "b97142d8130e4b4b9cc84b4ce4e1343fd5331131af7602c669e5b588f9525704"

// Tulu's template after its opening token (bos_token for tulu, eos_token for AI2's olmo).
#define TULU_BODY                                                                                  \
    "{% for message in messages %}\n{% if message['role'] == 'system' %}\n"                         \
    "{{ '<|system|>\\n' + message['content'] }}\n{% elif message['role'] == 'user' %}\n"              \
    "{{ '<|user|>\\n' + message['content'] }}\n{% elif message['role'] == 'assistant' %}\n"           \
    "{{ '<|assistant|>\\n'  + message['content'] + eos_token }}\n{% endif %}\n"                     \
    "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}"

// The Jinja strings recognised, as their models' tokenizer_config.json holds them.
static const struct { mt_chat_style style; const char *jinja; } known_templates[] = {
    {MT_CHAT_MIXTRAL,
     "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
     "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
     "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
     "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
     "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"},
    {MT_CHAT_CHATML,
     "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
     "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"},
    {MT_CHAT_QWEN,
     "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
     "{{ '<|im_start|>system\\nYou are a helpful assistant<|im_end|>\\n' }}{% endif %}"
     "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
     "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"},
    {MT_CHAT_QWEN2,
     "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
     "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
     "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
     "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"},
    {MT_CHAT_TULU, "{{ bos_token }}" TULU_BODY},
    {MT_CHAT_OLMO, "{{ eos_token }}" TULU_BODY},
};

int mt_chat_style_parse(const char *name, mt_chat_style *out) {
    for (int i = 0; i < (int)MT_ARRAY_LEN(style_names); i++)
        if (strcmp(name, style_names[i]) == 0) {
            *out = (mt_chat_style)i;
            return 0;
        }
    mt_error_set("unknown chat template \"%s\" (auto, mixtral, chatml, qwen, qwen2, qwen3, tulu, olmo or harmony)", name);
    return -1;
}

const char *mt_chat_style_name(mt_chat_style s) {
    return (unsigned)s < MT_ARRAY_LEN(style_names) ? style_names[s] : "none";
}

// Jinja with the whitespace inside {{ }} and {% %} (outside quotes) dropped; the text between
// tags, which the template prints, is kept exactly. A malloc'ed string.
static char *jinja_canonical(const char *s) {
    size_t n = strlen(s), k = 0;
    char *out = mt_xmalloc(n + 1);
    int in_tag = 0;
    char quote = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!in_tag) {
            if (c == '{' && (s[i + 1] == '{' || s[i + 1] == '%')) {
                in_tag = 1;
                out[k++] = c;
                out[k++] = s[++i];
                continue;
            }
            out[k++] = c;
            continue;
        }
        if (quote) {
            if (c == '\\' && i + 1 < n) {
                out[k++] = c;
                out[k++] = s[++i];
                continue;
            }
            if (c == quote) quote = 0;
            out[k++] = c;
            continue;
        }
        if (c == '\'' || c == '"') quote = c;
        else if ((c == '}' || c == '%') && s[i + 1] == '}') {
            in_tag = 0;
            out[k++] = c;
            out[k++] = s[++i];
            continue;
        } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r')
            continue;
        out[k++] = c;
    }
    // Leading and trailing whitespace of the whole template is not printed by transformers.
    out[k] = 0;
    size_t a = 0;
    while (out[a] == ' ' || out[a] == '\n') a++;
    while (k > a && (out[k - 1] == ' ' || out[k - 1] == '\n')) k--;
    memmove(out, out + a, k - a);
    out[k - a] = 0;
    return out;
}

// Templates too long to keep here, known by the SHA-256 of their canonical form.
static const struct { mt_chat_style style; const char *sha256; } hashed_templates[] = {
    {MT_CHAT_QWEN3, QWEN3_SHA256},
    {MT_CHAT_HARMONY, HARMONY_SHA256},
};

int mt_chat_template_recognise(const char *jinja, mt_chat_style *out) {
    char *want = jinja_canonical(jinja), hex[65];
    int found = -1;
    mt_sha256_hex(want, strlen(want), hex);
    for (size_t i = 0; i < MT_ARRAY_LEN(hashed_templates) && found < 0; i++)
        if (strcmp(hex, hashed_templates[i].sha256) == 0) {
            *out = hashed_templates[i].style;
            found = 0;
        }
    for (size_t i = 0; i < MT_ARRAY_LEN(known_templates) && found < 0; i++) {
        char *have = jinja_canonical(known_templates[i].jinja);
        if (strcmp(have, want) == 0) {
            *out = known_templates[i].style;
            found = 0;
        }
        free(have);
    }
    free(want);
    return found;
}

// A special-token entry: "text", {"content": "text", ...} or null.
static void token_string(const cJSON *v, char *buf, size_t n) {
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    snprintf(buf, n, "%s", cJSON_IsString(v) ? v->valuestring : "");
}

// The chat template a family's instruct models ship, for a model folder without one: config.json's
// model_type (read from `config`, the folder's or the file --model names). *type gets the name.
static mt_chat_style family_template(const char *config, char *type, size_t n) {
    static const struct { const char *model_type; mt_chat_style style; } fams[] = {
        {"mixtral", MT_CHAT_MIXTRAL}, {"qwen2_moe", MT_CHAT_QWEN}, {"qwen3_moe", MT_CHAT_QWEN3}, {"olmoe", MT_CHAT_TULU},
        {"gpt_oss", MT_CHAT_HARMONY},
    };
    char *text = NULL;
    size_t len;
    snprintf(type, n, "unknown");
    if (mt_read_file(config, 16u << 20, &text, &len) != 0) {
        mt_error_clear();
        return MT_CHAT_MIXTRAL;
    }
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    mt_chat_style style = MT_CHAT_MIXTRAL;
    if (cJSON_IsString(mt)) {
        snprintf(type, n, "%s", mt->valuestring);
        for (size_t i = 0; i < MT_ARRAY_LEN(fams); i++)
            if (strcmp(mt->valuestring, fams[i].model_type) == 0) style = fams[i].style;
    }
    cJSON_Delete(root);
    return style;
}

int mt_chat_template_load(mt_chat_template *t, const char *model_dir, const char *flag,
                          mt_tokenizer_kind kind) {
    memset(t, 0, sizeof *t);
    int from_flag = flag && flag[0] && strcmp(flag, "auto") != 0;
    if (from_flag && mt_chat_style_parse(flag, &t->style)) return mt_error_prefix("--chat-template"), -1;
    if (from_flag) snprintf(t->source, sizeof t->source, "--chat-template");
    // --model may name config.json: look beside it.
    char dir[4096], path[4200], config[4200];
    struct stat st;
    mt_model_folder(model_dir, dir, sizeof dir);
    if (stat(model_dir, &st) == 0 && S_ISREG(st.st_mode)) snprintf(config, sizeof config, "%s", model_dir);
    else snprintf(config, sizeof config, "%s/config.json", dir);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    cJSON *root = NULL;
    if (stat(path, &st) == 0) {
        char *text;
        size_t len;
        if (mt_read_file(path, 64u << 20, &text, &len)) return -1;
        root = cJSON_ParseWithLength(text, len);
        free(text);
        if (!cJSON_IsObject(root)) {
            cJSON_Delete(root);
            mt_error_set("%s: not a JSON object", path);
            return -1;
        }
        token_string(cJSON_GetObjectItemCaseSensitive(root, "bos_token"), t->bos_token, sizeof t->bos_token);
        token_string(cJSON_GetObjectItemCaseSensitive(root, "eos_token"), t->eos_token, sizeof t->eos_token);
    }
    if (from_flag) {
        cJSON_Delete(root);
        return 0;
    }
    // chat_template: a string, or a list of {"name", "template"} whose "default" is the one used.
    const cJSON *ct = root ? cJSON_GetObjectItemCaseSensitive(root, "chat_template") : NULL, *e;
    if (cJSON_IsArray(ct)) {
        const cJSON *pick = NULL;
        cJSON_ArrayForEach(e, ct) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
            if (cJSON_IsString(name) && strcmp(name->valuestring, "default") == 0)
                pick = cJSON_GetObjectItemCaseSensitive(e, "template");
        }
        ct = pick;
    }
    int spm_like = kind != MT_TOKENIZER_BPE;
    if (!cJSON_IsString(ct)) {
        snprintf(t->why, sizeof t->why, "%.400s has no chat_template: pass --chat-template chatml, qwen, "
                 "qwen2, qwen3, tulu, olmo or harmony to use chat samples", root ? path : "the model folder (no tokenizer_config.json)");
        if (spm_like) {  // a tiny byte-level model or Mixtral's tokenizer.model: the family's own
            char type[64];
            t->style = family_template(config, type, sizeof type);
            snprintf(t->source, sizeof t->source, "built-in for model_type %s: %s", type,
                     root ? "tokenizer_config.json has no chat_template" : "no tokenizer_config.json");
        } else {
            t->style = MT_CHAT_NONE;
            snprintf(t->source, sizeof t->source, "none: %s", root ? "tokenizer_config.json has no chat_template"
                                                                   : "no tokenizer_config.json");
        }
    } else if (mt_chat_template_recognise(ct->valuestring, &t->style) == 0) {
        snprintf(t->source, sizeof t->source, "tokenizer_config.json");
    } else {
        snprintf(t->why, sizeof t->why, "%.400s: chat_template is not one moetrain knows (Mixtral, ChatML, "
                 "Qwen1.5, Qwen2, Qwen3, OLMoE/Tulu, OLMo, gpt-oss harmony): pass --chat-template mixtral, chatml, "
                 "qwen, qwen2, qwen3, tulu, olmo or harmony for the closest", path);
        if (spm_like) {
            mt_warn("%s; using mixtral", t->why);
            t->style = MT_CHAT_MIXTRAL;
            snprintf(t->source, sizeof t->source, "fallback: tokenizer_config.json's chat_template is not one moetrain knows");
        } else {
            t->style = MT_CHAT_NONE;
            snprintf(t->source, sizeof t->source, "none: tokenizer_config.json's chat_template is not one moetrain knows");
        }
    }
    cJSON_Delete(root);
    return 0;
}

static const char *const prompt_names[] = {"alpaca", "alpaca-short", "none", "chat"};

int mt_prompt_style_parse(const char *name, mt_prompt_style *out) {
    for (int i = 0; i < (int)MT_ARRAY_LEN(prompt_names); i++)
        if (strcmp(name, prompt_names[i]) == 0) {
            *out = (mt_prompt_style)i;
            return 0;
        }
    mt_error_set("unknown instruction template \"%s\" (alpaca, none or chat)", name);
    return -1;
}

const char *mt_prompt_style_name(mt_prompt_style s) {
    return (unsigned)s < MT_ARRAY_LEN(prompt_names) ? prompt_names[s] : "?";
}

int mt_instruction_render_chat(const char *instruction, const char *input, const char *output,
                               mt_prompt_style style, const mt_chat_template *chat, mt_seg_fn emit,
                               void *ctx) {
    int has_input = input && input[0];
    sbuf b = {0};
    if (style == MT_PROMPT_CHAT) {
        // One user turn (the input below the instruction, as Alpaca's template orders them) and,
        // when there is an output, the assistant's reply.
        if (!chat) {
            mt_error_set("--instruction-template chat needs the model's chat template");
            return -1;
        }
        sb_add(&b, instruction);
        if (has_input) {
            sb_add(&b, "\n\n");
            sb_add(&b, input);
        }
        mt_chat_msg m[2] = {{"user", b.p, 0, NULL}, {"assistant", output, 0, NULL}};
        int rc = mt_chat_render_template(chat, m, output ? 2 : 1, output != NULL, emit, ctx);
        free(b.p);
        return rc;
    }
    if (style == MT_PROMPT_NONE) {
        sb_add(&b, instruction);
        if (has_input) {
            sb_add(&b, "\n\n");
            sb_add(&b, input);
        }
        sb_add(&b, "\n");
    } else {
        if (style == MT_PROMPT_ALPACA) sb_add(&b, has_input ? alpaca_intro_input : alpaca_intro_no_input);
        sb_add(&b, "### Instruction:\n");
        sb_add(&b, instruction);
        if (has_input) {
            sb_add(&b, "\n\n### Input:\n");
            sb_add(&b, input);
        }
        sb_add(&b, "\n\n### Response:\n");
    }
    int rc = emit(ctx, MT_SEG_BOS, NULL, 0, 0);
    if (rc == 0) rc = emit(ctx, MT_SEG_TEXT, b.p, b.n, 0);
    free(b.p);
    if (rc || !output) return rc;
    if (emit_str(emit, ctx, output, 1)) return -1;
    return emit(ctx, MT_SEG_EOS, NULL, 0, 1);
}

int mt_instruction_render(const char *instruction, const char *input, const char *output,
                          mt_prompt_style style, mt_seg_fn emit, void *ctx) {
    return mt_instruction_render_chat(instruction, input, output, style, NULL, emit, ctx);
}
