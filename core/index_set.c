// core/index_set.c — index sets: parsing "all" / "0-5,7", membership, counting.
#include "core/index_set.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"

int mt_index_set_parse(mt_index_set *s, const char *text) {
    memset(s, 0, sizeof *s);
    if (strcmp(text, "all") == 0) { s->all = 1; return 0; }
    static uint8_t member[MT_MAX_INDEX];
    memset(member, 0, sizeof member);
    const char *p = text;
    if (!*p) goto bad;
    while (*p) {
        char *end;
        if (!isdigit((unsigned char)*p)) goto bad;
        long lo = strtol(p, &end, 10), hi = lo;
        p = end;
        if (*p == '-') {
            if (!isdigit((unsigned char)p[1])) goto bad;
            hi = strtol(p + 1, &end, 10);
            p = end;
        }
        if (lo > hi || hi >= MT_MAX_INDEX) {
            mt_error_set("'%s': range %ld-%ld is empty or beyond %d", text, lo, hi, MT_MAX_INDEX - 1);
            return -1;
        }
        for (long i = lo; i <= hi; i++) member[i] = 1;
        if (*p == ',') { p++; if (!*p) goto bad; }
        else if (*p) goto bad;
    }
    for (int i = 0; i < MT_MAX_INDEX; i++)
        if (member[i]) s->items[s->count++] = (uint16_t)i;
    return 0;
bad:
    mt_error_set("'%s' is not an index set (all, 3, 0-5, 0,2,4-6)", text);
    return -1;
}

int mt_index_set_contains(const mt_index_set *s, int i) {
    if (s->all) return i >= 0;
    for (int j = 0; j < s->count; j++)
        if (s->items[j] == i) return 1;
    return 0;
}

int mt_index_set_count(const mt_index_set *s, int n) {
    if (s->all) return n;
    int c = 0;
    for (int j = 0; j < s->count; j++) c += s->items[j] < n;
    return c;
}
