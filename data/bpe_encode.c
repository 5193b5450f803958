// data/bpe_encode.c — text → ids with a loaded tokenizer.json (bpe.h): added tokens, NFC, the
// pre-tokenizer's regexes, then merges by rank.
//
// Bounded work per text: each regex search runs on a window of the text (RE_WINDOW bytes, grown
// only while the match runs into its last RE_MARGIN bytes, as a long run of one class does), under
// a PCRE2 match limit that scales with the window, and the whole text under a time budget for
// its regexes (RE_BUDGET_BASE_S plus RE_BUDGET_NS_PER_BYTE per byte; the merging of long pieces
// is not charged to it): a pattern that backtracks
// quadratically (`.(?=[^#]*#)|.`) ends with an error naming tokenizer.json within seconds instead
// of running for hours. What the window cannot see: a lookahead reaching more than RE_MARGIN bytes
// past a match (no real pre-tokenizer has one). Long pre-tokens are merged a window at a time
// (bpe_piece).
#include <time.h>
#include <utf8proc.h>

#include "core/common.h"
#include "core/safetensors.h"
#include "data/bpe_internal.h"

#define RE_WINDOW ((size_t)4096)
#define RE_MARGIN ((size_t)1024)
#define RE_MATCH_LIMIT 10000000ull
#define RE_BUDGET_BASE_S 2.0
#define RE_BUDGET_NS_PER_BYTE 250.0


// A candidate merge: the pair starting at symbol pos, its rank and merged id.
typedef struct {
    int32_t rank, pos, id;
} cand;

typedef struct {
    int32_t *id, *prev, *next;  // symbols of one word as a linked list; id -1: merged away
    cand *heap;
    size_t cap, heap_n, heap_cap;
    char *word;                 // the word in the byte-level alphabet (ignore_merges)
    size_t word_cap;
} bpe_scratch;

static int cand_less(cand a, cand b) { return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos; }

static void heap_push(bpe_scratch *s, cand c) {
    if (s->heap_n == s->heap_cap) {
        s->heap_cap = s->heap_cap ? 2 * s->heap_cap : 64;
        s->heap = mt_xrealloc(s->heap, s->heap_cap * sizeof *s->heap);
    }
    size_t i = s->heap_n++;
    while (i > 0 && cand_less(c, s->heap[(i - 1) / 2])) {
        s->heap[i] = s->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->heap[i] = c;
}

static cand heap_pop(bpe_scratch *s) {
    cand top = s->heap[0], last = s->heap[--s->heap_n];
    size_t i = 0, n = s->heap_n;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        cand best = last;
        if (l < n && cand_less(s->heap[l], best)) m = l, best = s->heap[l];
        if (l + 1 < n && cand_less(s->heap[l + 1], best)) m = l + 1;
        if (m == i) break;
        s->heap[i] = s->heap[m];
        i = m;
    }
    if (n) s->heap[i] = last;
    return top;
}

static void push_pair(const mt_bpe *b, bpe_scratch *s, int32_t pos) {
    int32_t nx = s->next[pos];
    if (nx < 0) return;
    const pair_slot *e = merge_find(b, s->id[pos], s->id[nx]);
    if (e) heap_push(s, (cand){e->rank, pos, e->id});
}

// One pre-token: bytes p[0..n) merged in s->id / s->next (a linked list of symbols: symbol i
// spans p[i .. next[i])). The adjacent pair of lowest rank is merged first, the leftmost among
// equals, as `tokenizers` does it (a heap of candidates, stale ones skipped): n log n.
static void bpe_merge(const mt_bpe *b, bpe_scratch *s, const uint8_t *p, size_t n) {
    if (n > s->cap) {
        s->cap = 2 * n;
        s->id = mt_xrealloc(s->id, s->cap * sizeof *s->id);
        s->prev = mt_xrealloc(s->prev, s->cap * sizeof *s->prev);
        s->next = mt_xrealloc(s->next, s->cap * sizeof *s->next);
    }
    for (size_t i = 0; i < n; i++) {
        s->id[i] = b->byte_id[p[i]];
        s->prev[i] = (int32_t)i - 1;
        s->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    s->heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++) push_pair(b, s, (int32_t)i);
    while (s->heap_n) {
        cand c = heap_pop(s);
        int32_t nx = s->next[c.pos];
        if (s->id[c.pos] < 0 || nx < 0) continue;
        const pair_slot *e = merge_find(b, s->id[c.pos], s->id[nx]);
        if (!e || e->id != c.id) continue;  // stale: the pair changed since it was queued
        s->id[c.pos] = c.id;
        s->id[nx] = -1;
        s->next[c.pos] = s->next[nx];
        if (s->next[nx] >= 0) s->prev[s->next[nx]] = c.pos;
        if (s->prev[c.pos] >= 0) push_pair(b, s, s->prev[c.pos]);
        push_pair(b, s, c.pos);
    }
}

// ignore_merges: the id of the whole pre-token p[0..n) when the vocabulary holds it, else -1.
static int32_t bpe_whole(const mt_bpe *b, bpe_scratch *s, const uint8_t *p, size_t n) {
    if (!b->ignore_merges || n > b->max_tok) return -1;  // longer than any token: not one
    if (2 * n + 1 > s->word_cap) s->word = mt_xrealloc(s->word, s->word_cap = 4 * n + 16);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(s->word + k, b->byte_chr[p[i]], b->byte_chr_len[p[i]]);
        k += b->byte_chr_len[p[i]];
    }
    return vocab_find(b, s->word, k);
}

// The encoder of one mt_bpe_encode_max call.
typedef struct enc {
    const mt_bpe *b;
    bpe_scratch s;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    size_t limit;      // stop once `out` holds this many ids
    double deadline;   // of the regex budget (monotonic seconds)
    size_t text_len;
    uint64_t calls;
} enc;

static void put(enc *E, mt_ids *out, int32_t id) {
    if (out->n < E->limit) mt_ids_push(out, id);
}

// A pre-token of any length. Up to WORD_WINDOW bytes are merged whole; a longer one (a run of
// one character class: 10 MB of spaces, digits or letters) is merged a window at a time, keeping
// the tokens that end before the window's last `overlap` bytes and starting the next window where
// they end. A merge never reaches further than a few tokens, so the kept tokens are those of the
// whole run (checked against `tokenizers` on 10 MB runs: tests/data/bpe/runs), and memory stays
// O(window).
static double now_s(void);

static void bpe_piece(enc *E, const uint8_t *p, size_t n, mt_ids *out) {
    const mt_bpe *b = E->b;
    // The regex budget is the regexes' alone: a long piece's merging moves the deadline on.
    double t0 = n > RE_WINDOW ? now_s() : 0;
    bpe_scratch *s = &E->s;
    int32_t whole = bpe_whole(b, s, p, n);
    if (whole >= 0) {
        put(E, out, whole);
        return;
    }
    size_t window = (size_t)MT_MAX(16384, 16 * b->max_tok), overlap = (size_t)(4 * b->max_tok + 64);
    for (size_t at = 0; at < n && out->n < E->limit;) {
        size_t w = MT_MIN(n - at, window), last = 0;
        int all = at + w == n;
        bpe_merge(b, s, p + at, w);
        for (int32_t i = 0; i >= 0; i = s->next[i]) {
            size_t end = s->next[i] < 0 ? w : (size_t)s->next[i];
            if (!all && end > w - overlap && last > 0) break;  // (one token at least: progress)
            put(E, out, s->id[i]);
            last = end;
        }
        if (all) break;
        at += last;
    }
    if (n > RE_WINDOW) E->deadline += now_s() - t0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// The next match of regex k in t[0..n) at or after `off`, found in a window of the text that
// grows only while the match runs to the window's end (a long run of one class): each call's
// work is bounded by its window, and PCRE2's match limit by the window's size. 1 with the match
// in [*a, *e); 0 when none starts before *a (the search goes on from there; *a == n: none at
// all); -1 with an error naming tokenizer.json (a limit or the per-text time budget hit).
static int next_match(enc *E, int k, const char *t, size_t n, size_t off, size_t *a, size_t *e) {
    const mt_bpe *b = E->b;
    for (size_t win = RE_WINDOW;; win *= 2) {
        size_t end = n - off <= win ? n : off + win;
        while (end < n && ((uint8_t)t[end] & 0xC0) == 0x80) end++;  // a character boundary
        pcre2_set_match_limit(E->mctx, (uint32_t)MT_MIN(RE_MATCH_LIMIT + 64 * (uint64_t)(end - off), UINT32_MAX));
        int rc = pcre2_match(b->re[k], (PCRE2_SPTR)t, end, off, PCRE2_NO_UTF_CHECK, E->md, E->mctx);
        if ((++E->calls & 31) == 0 || win > RE_WINDOW) {
            if (now_s() > E->deadline) {
                mt_error_set("%s: pre_tokenizer regex %d ran past its time budget (%.1f s for %zu "
                             "bytes of text) at byte %zu: a pattern that backtracks without bound?",
                             b->path, k, RE_BUDGET_BASE_S + RE_BUDGET_NS_PER_BYTE * 1e-9 * (double)E->text_len,
                             E->text_len, off);
                return -1;
            }
        }
        if (rc == PCRE2_ERROR_NOMEMORY) mt_fatal_oom("PCRE2 match");
        if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            mt_error_set("%s: pre_tokenizer regex %d failed at byte %zu of the text: %s", b->path, k,
                         off, (const char *)msg);
            return -1;
        }
        if (end == n) {
            if (rc == PCRE2_ERROR_NOMATCH) return *a = n, 0;
        } else if (rc == PCRE2_ERROR_NOMATCH) {
            if (end - off > RE_MARGIN) {  // none starts before the margin: go on from there
                size_t resume = end - RE_MARGIN;
                while (((uint8_t)t[resume] & 0xC0) == 0x80) resume--;
                if (resume > off) return *a = resume, 0;
            }
            continue;
        } else if (pcre2_get_ovector_pointer(E->md)[1] + RE_MARGIN > end) {
            continue;  // the match may go on past the window: look again with a larger one
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(E->md);
        *a = ov[0], *e = ov[1];
        return 1;
    }
}

// Applies regexes re[k..] to t[0..n) (matches and gaps both kept), then BPE on each piece.
static int split_and_merge(enc *E, int k, const char *t, size_t n, mt_ids *out) {
    if (n == 0 || out->n >= E->limit) return 0;
    if (k == E->b->n_re) {
        bpe_piece(E, (const uint8_t *)t, n, out);
        return 0;
    }
    size_t prev = 0, off = 0;
    while (off < n && out->n < E->limit) {
        size_t a, e;
        int rc = next_match(E, k, t, n, off, &a, &e);
        if (rc < 0) return -1;
        if (rc == 0) {
            off = a;
            continue;
        }
        if (a > prev && split_and_merge(E, k + 1, t + prev, a - prev, out)) return -1;
        if (e > a && split_and_merge(E, k + 1, t + a, e - a, out)) return -1;
        prev = MT_MAX(prev, e);
        off = e > a ? e : e + 1;  // an empty match: step past one character
        while (e == a && off < n && ((uint8_t)t[off] & 0xC0) == 0x80) off++;
    }
    return prev < n ? split_and_merge(E, k + 1, t + prev, n - prev, out) : 0;
}

// A run of text between added tokens: normalize, pre-tokenize, merge.
static int encode_chunk(enc *E, const char *t, size_t n, mt_ids *out) {
    if (n == 0 || out->n >= E->limit) return 0;
    if (!E->b->nfc) return split_and_merge(E, 0, t, n, out);
    utf8proc_uint8_t *norm = NULL;
    utf8proc_ssize_t k = utf8proc_map((const utf8proc_uint8_t *)t, (utf8proc_ssize_t)n, &norm,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (k == UTF8PROC_ERROR_NOMEM) mt_fatal_oom("NFC normalization");
    if (k < 0) {
        mt_error_set("%s: NFC normalization failed: %s", E->b->path, utf8proc_errmsg(k));
        return -1;
    }
    int rc = split_and_merge(E, 0, (const char *)norm, (size_t)k, out);
    free(norm);
    return rc;
}

int mt_bpe_encode(const mt_bpe *b, const char *text, size_t len, mt_ids *out) {
    return mt_bpe_encode_max(b, text, len, SIZE_MAX, out);
}

int mt_bpe_encode_max(const mt_bpe *b, const char *text, size_t len, size_t max, mt_ids *out) {
    size_t valid = mt_st_utf8_prefix(text, len);
    if (valid != len) {
        mt_error_set("the text is not valid UTF-8 at byte %zu (byte 0x%02X): %s reads UTF-8 only",
                     valid, (unsigned)(uint8_t)text[valid], b->path);
        return -1;
    }
    // Scratch per call: encode may run on several threads.
    enc E = {.b = b, .limit = max > SIZE_MAX - out->n ? SIZE_MAX : out->n + max, .text_len = len};
    E.deadline = now_s() + RE_BUDGET_BASE_S + RE_BUDGET_NS_PER_BYTE * 1e-9 * (double)len;
    E.md = pcre2_match_data_create(4, NULL);
    E.mctx = pcre2_match_context_create(NULL);
    if (!E.md || !E.mctx) mt_fatal_oom("PCRE2 match data");
    size_t start = 0, i = 0;
    int rc = 0;
    while (i < len && rc == 0 && out->n < E.limit) {
        const added_token *hit = NULL;
        if (b->add_first[(uint8_t)text[i]])
            for (int a = 0; a < b->n_adds; a++)
                if (b->adds[a].len <= len - i && memcmp(text + i, b->adds[a].content, b->adds[a].len) == 0) {
                    hit = &b->adds[a];
                    break;
                }
        if (!hit) {
            i++;
            continue;
        }
        rc = encode_chunk(&E, text + start, i - start, out);
        put(&E, out, hit->id);
        i += hit->len;
        start = i;
    }
    if (rc == 0) rc = encode_chunk(&E, text + start, len - start, out);
    pcre2_match_data_free(E.md);
    pcre2_match_context_free(E.mctx);
    free(E.s.id);
    free(E.s.prev);
    free(E.s.next);
    free(E.s.heap);
    free(E.s.word);
    return rc;
}
