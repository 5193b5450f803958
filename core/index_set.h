// core/index_set.h — a set of layer or expert indices: "all", or a list of indices and ranges
// ("0-5,7"). The run options (--layers, --experts) hold them; the model and the planner read them.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MT_MAX_INDEX 1024  // largest layer or expert index a set may name, plus one

typedef struct mt_index_set {
    int all;
    int count;
    uint16_t items[MT_MAX_INDEX];  // sorted, unique
} mt_index_set;

// "all", "3", "0-5", "0,2,4-6"; indices < MT_MAX_INDEX.
int mt_index_set_parse(mt_index_set *s, const char *text);
int mt_index_set_contains(const mt_index_set *s, int i);
// Number of members among 0..n-1.
int mt_index_set_count(const mt_index_set *s, int n);

#ifdef __cplusplus
}
#endif
