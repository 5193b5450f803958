// data/line_reader.c — JSONL lines read in bounded pieces (see line_reader.h).
#include "data/line_reader.h"

#include <errno.h>
#include <string.h>

#include "core/common.h"

void mt_line_reader_init(mt_line_reader *r, FILE *f, const char *path, size_t string_cap,
                         size_t max_keep) {
    memset(r, 0, sizeof *r);
    r->f = f;
    r->path = path;
    r->string_cap = string_cap;
    r->max_keep = max_keep;
}

void mt_line_reader_free(mt_line_reader *r) {
    free(r->line);
    r->line = NULL;
    r->len = r->cap = 0;
}

// The next byte of the file, -1 at its end, -2 on a read error (the error is set).
static int next_byte(mt_line_reader *r) {
    if (r->io_at == r->io_n) {
        if (r->eof) return -1;
        r->io_n = fread(r->io, 1, sizeof r->io, r->f);
        r->io_at = 0;
        if (r->io_n < sizeof r->io) {
            if (ferror(r->f)) {
                mt_error_set("%s:%lld: read failed: %s", r->path, (long long)r->lineno,
                             strerror(errno ? errno : EIO));
                return -2;
            }
            r->eof = 1;
        }
        if (r->io_n == 0) return -1;
    }
    return r->io[r->io_at++];
}

static int keep(mt_line_reader *r, int c) {
    if (r->len + 2 > r->cap) {
        if (r->len + 1 > r->max_keep) {
            mt_error_set("%s:%lld: the line keeps more than --max-line-bytes %zu bytes (its strings "
                         "counted only to what --seq can use): refused", r->path,
                         (long long)r->lineno, r->max_keep);
            return -1;
        }
        r->cap = MT_MIN(MT_MAX(2 * r->cap, (size_t)4096), r->max_keep + 2);
        r->line = mt_xrealloc(r->line, r->cap);
    }
    r->line[r->len++] = (char)c;
    return 0;
}

// Decoded bytes of a \uXXXX escape (a surrogate counts half of its pair's 4).
static size_t escape_bytes(unsigned cp) {
    return cp < 0x80 ? 1 : cp < 0x800 ? 2 : (cp >= 0xD800 && cp <= 0xDFFF) ? 2 : 3;
}

static int hex_value(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

typedef struct scan {
    int in_str, drop, esc, hex_left;  // esc: just after a backslash
    unsigned hex;
    size_t decoded;                   // of the current string
    int need;                         // UTF-8 continuation bytes expected (dropped text)
    unsigned char lo, hi;             // the range of the next one
} scan;

// One byte of a string's dropped tail: checked as the parser would check it. 0, or -1 with an
// error.
static int check_dropped(mt_line_reader *r, scan *s, int c) {
    const char *bad = NULL;
    if (s->hex_left) {
        if (hex_value(c) < 0) bad = "a \\u escape needs four hex digits";
        s->hex_left--;
    } else if (s->esc) {
        s->esc = 0;
        if (c == 'u') s->hex_left = 4;
        else if (!strchr("\"\\/bfnrt", c)) bad = "an invalid escape";
    } else if (s->need) {
        if (c < s->lo || c > s->hi) bad = "invalid UTF-8";
        s->need--;
        s->lo = 0x80, s->hi = 0xBF;
    } else if (c < 0x20) {
        bad = "a raw control byte (JSON strings must escape it)";
    } else if (c == '\\') {
        s->esc = 1;
    } else if (c >= 0x80) {
        s->lo = 0x80, s->hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) s->need = 1;
        else if (c >= 0xE0 && c <= 0xEF) s->need = 2, s->lo = c == 0xE0 ? 0xA0 : 0x80, s->hi = c == 0xED ? 0x9F : 0xBF;
        else if (c >= 0xF0 && c <= 0xF4) s->need = 3, s->lo = c == 0xF0 ? 0x90 : 0x80, s->hi = c == 0xF4 ? 0x8F : 0xBF;
        else bad = "invalid UTF-8";
    }
    if (bad) {
        mt_error_set("%s:%lld: column %llu: %s in a string", r->path, (long long)r->lineno,
                     (unsigned long long)r->raw_len, bad);
        return -1;
    }
    return 0;
}

// One byte of a string that is being kept: counts its decoded bytes.
static void count_kept(scan *s, int c) {
    if (s->hex_left) {
        s->hex = s->hex << 4 | (unsigned)(hex_value(c) < 0 ? 0 : hex_value(c));
        if (--s->hex_left == 0) s->decoded += escape_bytes(s->hex);
    } else if (s->esc) {
        s->esc = 0;
        if (c == 'u') s->hex_left = 4, s->hex = 0;
        else s->decoded++;
    } else if (c == '\\') {
        s->esc = 1;
    } else if (c == '"') {
        s->in_str = 0;
    } else {
        s->decoded++;
    }
}

int mt_line_next(mt_line_reader *r) {
    r->len = 0;
    r->raw_len = 0;
    r->cut = 0;
    r->lineno++;
    char where[1100];
    snprintf(where, sizeof where, "%s:%lld", r->path, (long long)r->lineno);
    mt_oom_context(where);
    scan s = {0};
    int c;
    while ((c = next_byte(r)) >= 0 && c != '\n') {
        r->raw_len++;
        if (!s.in_str) {
            if (keep(r, c)) return -1;
            if (c == '"') s = (scan){.in_str = 1};
            continue;
        }
        // A string: cut at a character boundary once string_cap decoded bytes are kept.
        if (!s.drop && !s.esc && !s.hex_left && c != '"' && (c & 0xC0) != 0x80 &&
            s.decoded >= r->string_cap) {
            s.drop = 1;
            r->cut = 1;
        }
        if (!s.drop) {
            if (keep(r, c)) return -1;
            count_kept(&s, c);
            continue;
        }
        if (c == '"' && !s.esc && !s.hex_left) {
            if (s.need) {
                mt_error_set("%s:%lld: column %llu: invalid UTF-8 in a string", r->path,
                             (long long)r->lineno, (unsigned long long)r->raw_len);
                return -1;
            }
            if (keep(r, c)) return -1;
            s.in_str = 0;
            continue;
        }
        if (check_dropped(r, &s, c)) return -1;
    }
    if (c == -2) return -1;
    if (c == -1 && r->raw_len == 0) {
        r->lineno--;
        mt_oom_context(NULL);
        return 0;
    }
    if (!r->line) r->line = mt_xmalloc(r->cap = 4096);
    r->line[r->len] = 0;
    return 1;
}
