// libFuzzer target: the quant_state JSON of a bitsandbytes 4-bit weight (".quant_state.
// bitsandbytes__nf4" / "__fp4", moetrain's "__int4"). Importing never crashes; a weight that
// imports, exported (bitsandbytes' json.dumps, byte for byte) and imported again, is the same
// weight: type, blocksize, shape, dtype, double quantization and offset.
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/common.h"
#include "quant/quant.h"

static const char *const suffix[] = {".quant_state.bitsandbytes__nf4", ".quant_state.bitsandbytes__fp4",
                                     ".quant_state.moetrain__int4"};

static mt_st_tensor part(const char *name, const char *dtype, int64_t count, int column, const void *data, int elem) {
    mt_st_tensor t;
    memset(&t, 0, sizeof t);
    t.name = (char *)name;
    snprintf(t.dtype, sizeof t.dtype, "%s", dtype);
    t.ndim = column ? 2 : 1;
    t.shape[0] = count, t.shape[1] = 1;
    t.nbytes = (uint64_t)(count * elem);
    t.data = data;
    return t;
}

// The companion tensors of an [out, in] weight in `type`, sized as the importer expects.
typedef struct {
    mt_st_tensor weight, absmax, zero, quant_map, nested_absmax, nested_quant_map, qs;
    void *buf[4];
} parts_buf;

static void make_parts(parts_buf *b, mt_bnb_parts *p, mt_quant type, int64_t n, int bs, int nested) {
    int64_t nb = mt_q4_blocks(n, bs), nn = mt_q4_blocks(nb, MT_Q4_NESTED_BLOCKSIZE);
    b->buf[0] = calloc((size_t)mt_q4_packed_bytes(n), 1);
    b->buf[1] = calloc((size_t)nb, 4);
    b->buf[2] = calloc((size_t)nb, 2);
    b->buf[3] = calloc((size_t)nn, 4);
    float *am = b->buf[1], *na = b->buf[3];
    for (int64_t i = 0; i < nb; i++) am[i] = 1.0f;
    for (int64_t i = 0; i < nn; i++) na[i] = 1.0f;
    uint16_t *h = b->buf[2];
    for (int64_t i = 0; i < nb; i++) h[i] = 0x3C00;  // fp16 1.0
    memset(p, 0, sizeof *p);
    b->weight = part("w", "U8", mt_q4_packed_bytes(n), 1, b->buf[0], 1);
    p->weight = &b->weight;
    if (type == MT_QUANT_INT4) {
        b->absmax = part("w.absmax", "F16", nb, 0, h, 2);
        b->zero = part("w.zero", "F16", nb, 0, h, 2);
        p->absmax = &b->absmax, p->zero = &b->zero;
        return;
    }
    b->absmax = nested ? part("w.absmax", "U8", nb, 0, b->buf[1], 1)
                       : part("w.absmax", "F32", nb, 0, am, 4);
    b->quant_map = part("w.quant_map", "F32", 16, 0, mt_q4_quant_map(type), 4);
    p->absmax = &b->absmax, p->quant_map = &b->quant_map;
    if (nested) {
        b->nested_absmax = part("w.nested_absmax", "F32", nn, 0, na, 4);
        b->nested_quant_map = part("w.nested_quant_map", "F32", 256, 0, mt_dynamic_map, 4);
        p->nested_absmax = &b->nested_absmax, p->nested_quant_map = &b->nested_quant_map;
    }
}

static void free_parts(parts_buf *b) {
    for (int i = 0; i < 4; i++) free(b->buf[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static mt_backend *be;
    if (!be) be = mt_backend_cpu_new();
    if (size < 1) return 0;
    mt_quant type = (mt_quant)(data[0] % 3);
    const char *json = (const char *)data + 1;
    size_t len = size - 1;
    char key[64];
    snprintf(key, sizeof key, "w%s", suffix[type]);
    // the sizes the JSON claims, so that the other parts can match them when they are small
    int64_t out = 1, in = 1, bs = 64;
    int nested = 0;
    cJSON *j = cJSON_ParseWithLength(json, len);
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(j, "shape"), *b = cJSON_GetObjectItemCaseSensitive(j, "blocksize");
    if (cJSON_GetArraySize(shape) == 2 && cJSON_IsNumber(cJSON_GetArrayItem(shape, 0)) &&
        cJSON_IsNumber(cJSON_GetArrayItem(shape, 1))) {
        double o = cJSON_GetArrayItem(shape, 0)->valuedouble, i = cJSON_GetArrayItem(shape, 1)->valuedouble;
        if (o >= 1 && i >= 1 && o * i <= 65536) out = (int64_t)o, in = (int64_t)i;
    }
    if (cJSON_IsNumber(b) && b->valuedouble >= 32 && b->valuedouble <= 4096) bs = (int64_t)b->valuedouble;
    nested = cJSON_GetObjectItemCaseSensitive(j, "nested_offset") != NULL;
    cJSON_Delete(j);
    parts_buf pb;
    mt_bnb_parts p;
    make_parts(&pb, &p, type, out * in, (int)bs, nested);
    mt_st_tensor qs = part(key, "U8", (int64_t)len, 0, json, 1);
    p.quant_state = &qs, p.quant_state_key = key;
    mt_qweight q, back;
    if (mt_qweight_import(&q, be, "w", &p) == 0) {
        if (q.type != type || q.out != out || q.in != in || !mt_q4_blocksize_ok(q.blocksize)) __builtin_trap();
        mt_bnb_entries ex;
        if (mt_bnb_export(&ex, "w", &q) != 0) __builtin_trap();
        mt_st_tensor t[6];
        mt_bnb_parts p2;
        memset(&p2, 0, sizeof p2);
        for (size_t i = 0; i < ex.n; i++) {
            const mt_st_entry *e = &ex.entries[i];
            int elem = strcmp(e->dtype, "U8") == 0 ? 1 : strcmp(e->dtype, "F16") == 0 ? 2 : 4;
            t[i] = part(e->name, e->dtype, e->shape[0], e->ndim == 2, e->data, elem);
            const char *s = e->name + 1;
            if (!*s) p2.weight = &t[i];
            else if (!strcmp(s, ".absmax")) p2.absmax = &t[i];
            else if (!strcmp(s, ".zero")) p2.zero = &t[i];
            else if (!strcmp(s, ".quant_map")) p2.quant_map = &t[i];
            else if (!strcmp(s, ".nested_absmax")) p2.nested_absmax = &t[i];
            else if (!strcmp(s, ".nested_quant_map")) p2.nested_quant_map = &t[i];
            else if (strstr(s, ".quant_state.")) p2.quant_state = &t[i], p2.quant_state_key = e->name;
            else __builtin_trap();
        }
        if (mt_qweight_import(&back, be, "w", &p2) != 0) __builtin_trap();  // write -> read -> equal
        if (back.type != q.type || back.blocksize != q.blocksize || back.out != q.out || back.in != q.in ||
            back.dtype != q.dtype || back.double_quant != q.double_quant ||
            memcmp(&back.offset, &q.offset, sizeof q.offset) != 0)
            __builtin_trap();
        mt_qweight_free(&back);
        mt_bnb_export_free(&ex);
        mt_qweight_free(&q);
    }
    free_parts(&pb);
    return 0;
}
