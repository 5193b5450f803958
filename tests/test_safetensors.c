// tests/test_safetensors.c — the safetensors reader against one malformed file per rule of
// docs/formats.md "safetensors" (each built here, in a fresh temporary folder), and the writer by round trips.
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "core/fileio.h"
#include "core/safetensors.h"

static char tmp[256];

static void setup(void) {
    snprintf(tmp, sizeof tmp, "/tmp/mt_st_test_XXXXXX");
    cr_assert_not_null(mkdtemp(tmp));
}

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(p);
}

static void teardown(void) { nftw(tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

TestSuite(safetensors, .init = setup, .fini = teardown);

// ---------------------------------------------------------------------------------------------
// helpers

// tmp/name, in one of 16 rotating buffers so two paths can be held at once.
static const char *at(const char *name) {
    static char buf[16][512];
    static int k;
    k = (k + 1) % 16;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmp, name);
    return buf[k];
}

// tmp/name = 8-byte little-endian n, hlen header bytes, data_len bytes of data (byte i = i*7+1).
static const char *put_raw(const char *name, uint64_t n, const void *hdr, size_t hlen, size_t data_len) {
    const char *p = at(name);
    FILE *f = fopen(p, "wb");
    cr_assert_not_null(f);
    for (int b = 0; b < 8; b++) fputc((int)((n >> (8 * b)) & 0xff), f);
    if (hlen) cr_assert_eq(fwrite(hdr, 1, hlen, f), hlen);
    for (size_t i = 0; i < data_len; i++) fputc((int)((i * 7 + 1) & 0xff), f);
    cr_assert_eq(fclose(f), 0);
    return p;
}

// A file whose N is the header's own length.
static const char *put_st(const char *name, const char *header, size_t data_len) {
    return put_raw(name, strlen(header), header, strlen(header), data_len);
}

static int contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

// Opening `path` fails with -1 and an error that names the file, the rule and (if given) the
// tensor; the struct is left zeroed.
static void expect_fail(const char *path, const char *rule, const char *tensor) {
    mt_st_file f;
    mt_error_clear();
    int rc = mt_st_file_open(&f, path);
    const char *err = mt_error_get();
    cr_assert_eq(rc, -1, "%s opened but should fail with %s", path, rule);
    cr_assert(contains(err, rule), "error '%s' lacks the rule '%s'", err, rule);
    cr_assert(contains(err, strrchr(path, '/') + 1), "error '%s' does not name the file", err);
    if (tensor) {
        char quoted[300];
        snprintf(quoted, sizeof quoted, "tensor '%s'", tensor);
        cr_assert(contains(err, quoted), "error '%s' does not name %s", err, quoted);
    }
    cr_assert_null(f.map);
    cr_assert_null(f.tensors);
    mt_st_file_close(&f);  // harmless on the zeroed struct
}

static void fail_header(const char *header, size_t data_len, const char *rule, const char *tensor) {
    expect_fail(put_st("bad.safetensors", header, data_len), rule, tensor);
}

static void expect_open(mt_st_file *f, const char *path) {
    int rc = mt_st_file_open(f, path);
    cr_assert_eq(rc, 0, "open %s: %s", path, mt_error_get());
}

static void write_text(const char *path, const char *text) {
    cr_assert_eq(mt_write_file_atomic(path, text, strlen(text)), 0, "%s", mt_error_get());
}

// Number of entries in tmp (or tmp/sub), not counting . and ..
static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

#define F32_2 "{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":"  // 8 bytes; append "[b,e]}"

// ---------------------------------------------------------------------------------------------
// length prefix

Test(safetensors, header_too_small) {
    const char *p = at("bad.safetensors");
    FILE *f = fopen(p, "wb");
    fwrite("\x02\0\0\0\0", 1, 5, f);
    fclose(f);
    expect_fail(p, "HeaderTooSmall", NULL);
}

Test(safetensors, header_too_large) {
    expect_fail(put_raw("bad.safetensors", 100000001ull, "{}", 2, 0), "HeaderTooLarge", NULL);
}

Test(safetensors, header_too_large_u64_max) {
    expect_fail(put_raw("bad.safetensors", UINT64_MAX, "{}", 2, 0), "HeaderTooLarge", NULL);
}

Test(safetensors, header_length_past_eof) {
    expect_fail(put_raw("bad.safetensors", 64, "{}", 2, 0), "InvalidHeaderLength", NULL);
    // At the 100 MB limit exactly it is not too large, only past the end of this small file.
    expect_fail(put_raw("bad.safetensors", 100000000ull, "{}", 2, 0), "InvalidHeaderLength", NULL);
}

// ---------------------------------------------------------------------------------------------
// header text

Test(safetensors, header_not_utf8) {
    static const char *bad[] = {
        "{\"a\xff\":" F32_2 "[0,8]}}",          // never valid
        "{\"a\xc0\xaf\":" F32_2 "[0,8]}}",      // overlong '/'
        "{\"a\xed\xa0\x80\":" F32_2 "[0,8]}}",  // UTF-16 surrogate
        "{\"a\xf4\x90\x80\x80\":" F32_2 "[0,8]}}",  // past U+10FFFF
        "{}\xe2\x82",                           // truncated at the end
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(bad); i++) fail_header(bad[i], 8, "InvalidHeader", NULL);
}

Test(safetensors, header_not_json) {
    fail_header("{\"a\": ", 0, "InvalidHeaderDeserialization", NULL);
    fail_header("{\"a\":" F32_2 "[0,8]},}", 8, "InvalidHeaderDeserialization", NULL);
}

Test(safetensors, header_trailing_garbage) {
    fail_header("{}x      ", 0, "InvalidHeaderDeserialization", NULL);
    fail_header("{}{}", 0, "InvalidHeaderDeserialization", NULL);
}

Test(safetensors, header_must_start_with_brace) {
    fail_header("[1,2]", 0, "InvalidHeaderStart", NULL);     // not an object
    fail_header("\"str\"", 0, "InvalidHeaderStart", NULL);   // not an object
    fail_header(" {}", 0, "InvalidHeaderStart", NULL);       // leading space
    expect_fail(put_raw("bad.safetensors", 0, "", 0, 0), "InvalidHeaderStart", NULL);  // empty
}

Test(safetensors, header_control_byte) {
    fail_header("{\"a\x01\":" F32_2 "[0,8]}}", 8, "InvalidHeaderDeserialization", NULL);
    static const char nul[] = "{\"a\0b\":" F32_2 "[0,8]}}";
    expect_fail(put_raw("bad.safetensors", sizeof nul - 1, nul, sizeof nul - 1, 8),
                "InvalidHeaderDeserialization", NULL);
}

// ---------------------------------------------------------------------------------------------
// entries

Test(safetensors, entry_not_object) {
    fail_header("{\"a\":5}", 0, "InvalidHeaderDeserialization", "a");
    fail_header("{\"a\":[]}", 0, "InvalidHeaderDeserialization", "a");
}

Test(safetensors, entry_missing_dtype) {
    fail_header("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "InvalidHeaderDeserialization", "a");
    cr_assert(contains(mt_error_get(), "missing \"dtype\""), "%s", mt_error_get());
}

Test(safetensors, entry_missing_shape) {
    fail_header("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "InvalidHeaderDeserialization", "a");
    cr_assert(contains(mt_error_get(), "missing \"shape\""), "%s", mt_error_get());
}

Test(safetensors, entry_missing_data_offsets) {
    fail_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "InvalidHeaderDeserialization", "a");
    cr_assert(contains(mt_error_get(), "missing \"data_offsets\""), "%s", mt_error_get());
}

Test(safetensors, entry_dtype_not_string) {
    fail_header("{\"a\":{\"dtype\":32,\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
                "InvalidHeaderDeserialization", "a");
}

Test(safetensors, entry_shape_not_array) {
    fail_header("{\"a\":{\"dtype\":\"F32\",\"shape\":\"2\",\"data_offsets\":[0,8]}}", 8,
                "InvalidHeaderDeserialization", "a");
    fail_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8,
                "InvalidHeaderDeserialization", "a");
}

Test(safetensors, entry_data_offsets_mistyped) {
    fail_header("{\"a\":" F32_2 "[0,8,8]}}", 8, "InvalidHeaderDeserialization", "a");
    fail_header("{\"a\":" F32_2 "[0]}}", 8, "InvalidHeaderDeserialization", "a");
    fail_header("{\"a\":" F32_2 "[\"0\",\"8\"]}}", 8, "InvalidHeaderDeserialization", "a");
    fail_header("{\"a\":" F32_2 "{\"0\":8}}}", 8, "InvalidHeaderDeserialization", "a");
    fail_header("{\"a\":" F32_2 "[-8,0]}}", 8, "InvalidHeaderDeserialization", "a");
}

Test(safetensors, entry_field_twice) {
    fail_header("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
                "InvalidHeaderDeserialization", "a");
}

Test(safetensors, negative_dimension) {
    fail_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
                "InvalidHeaderDeserialization", "a");
}

Test(safetensors, inexact_numbers) {
    // Not an integer; 2^53 and beyond (a double cannot tell 2^53 from 2^53+1); overflowing.
    fail_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,8]}}", 8,
                "InvalidHeaderDeserialization", "a");
    fail_header("{\"a\":{\"dtype\":\"U8\",\"shape\":[9007199254740993],\"data_offsets\":[0,8]}}", 8,
                "InvalidHeaderDeserialization", "a");
    fail_header("{\"a\":" F32_2 "[0,1e300]}}", 8, "InvalidHeaderDeserialization", "a");
    fail_header("{\"a\":" F32_2 "[0,1e999]}}", 8, "InvalidHeaderDeserialization", "a");
}

Test(safetensors, too_many_dimensions) {
    fail_header("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
                "InvalidHeaderDeserialization", "a");
}

Test(safetensors, unknown_dtype) {
    fail_header("{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
                "InvalidHeaderDeserialization", "a");
    cr_assert(contains(mt_error_get(), "unknown dtype 'F33'"), "%s", mt_error_get());
    fail_header("{\"a\":{\"dtype\":\"f32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
                "InvalidHeaderDeserialization", "a");  // names are case-sensitive
}

Test(safetensors, duplicate_name) {
    fail_header("{\"a\":" F32_2 "[0,8]},\"b\":" F32_2 "[8,16]},\"a\":" F32_2 "[16,24]}}", 24,
                "InvalidHeaderDeserialization", "a");
    cr_assert(contains(mt_error_get(), "twice"), "%s", mt_error_get());
}

// ---------------------------------------------------------------------------------------------
// offsets and sizes

Test(safetensors, first_offset_not_zero) {
    fail_header("{\"a\":" F32_2 "[4,12]}}", 12, "InvalidOffset", "a");
    cr_assert(contains(mt_error_get(), "not 0"), "%s", mt_error_get());
}

Test(safetensors, offsets_gap) {
    fail_header("{\"a\":" F32_2 "[0,8]},\"b\":" F32_2 "[16,24]}}", 24, "InvalidOffset", "b");
    cr_assert(contains(mt_error_get(), "begins at 16 where the previous tensor ended at 8"), "%s",
              mt_error_get());
}

Test(safetensors, offsets_overlap) {
    fail_header("{\"a\":" F32_2 "[0,8]},\"b\":" F32_2 "[4,12]}}", 12, "InvalidOffset", "b");
    cr_assert(contains(mt_error_get(), "overlap"), "%s", mt_error_get());
}

Test(safetensors, offsets_end_before_begin) {
    fail_header("{\"a\":" F32_2 "[8,0]}}", 8, "InvalidOffset", "a");
}

Test(safetensors, element_count_overflow) {
    fail_header("{\"a\":{\"dtype\":\"U8\",\"shape\":[4503599627370496,4503599627370496],"
                "\"data_offsets\":[0,8]}}", 8, "ValidationOverflow", "a");
}

Test(safetensors, bit_count_overflow) {
    // 2^31 * 2^31 = 2^62 elements fit in 64 bits; times 32 bits does not.
    fail_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2147483648,2147483648],\"data_offsets\":[0,8]}}", 8,
                "ValidationOverflow", "a");
}

Test(safetensors, misaligned_slice) {
    fail_header("{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2, "MisalignedSlice", "a");
    fail_header("{\"a\":{\"dtype\":\"F6_E2M3\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2,
                "MisalignedSlice", "a");
}

Test(safetensors, size_mismatch) {
    fail_header("{\"a\":" F32_2 "[0,4]}}", 4, "TensorInvalidInfo", "a");
    cr_assert(contains(mt_error_get(), "needs 8 bytes"), "%s", mt_error_get());
}

Test(safetensors, trailing_bytes) {
    fail_header("{\"a\":" F32_2 "[0,8]}}", 9, "MetadataIncompleteBuffer", NULL);
    fail_header("{}", 1, "MetadataIncompleteBuffer", NULL);
}

Test(safetensors, data_past_eof) {
    fail_header("{\"a\":" F32_2 "[0,8]}}", 7, "MetadataIncompleteBuffer", "a");
}

// ---------------------------------------------------------------------------------------------
// __metadata__

Test(safetensors, metadata_not_object) {
    fail_header("{\"__metadata__\":[\"pt\"]}", 0, "InvalidHeaderDeserialization", NULL);
    cr_assert(contains(mt_error_get(), "__metadata__"), "%s", mt_error_get());
}

Test(safetensors, metadata_value_not_string) {
    fail_header("{\"__metadata__\":{\"format\":\"pt\",\"n\":3}}", 0, "InvalidHeaderDeserialization", NULL);
    cr_assert(contains(mt_error_get(), "'n'"), "%s", mt_error_get());
}

Test(safetensors, metadata_key_twice) {
    fail_header("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, "InvalidHeaderDeserialization", NULL);
    fail_header("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "InvalidHeaderDeserialization", NULL);
}

// ---------------------------------------------------------------------------------------------
// accepted files

Test(safetensors, padded_header_accepted) {
    const char *h = "{\"__metadata__\":{\"format\":\"pt\"},\"w\":" F32_2 "[0,8]}}";
    char padded[256];
    size_t n = strlen(h), pad = (n + 7) / 8 * 8 + 8;
    memcpy(padded, h, n);
    memset(padded + n, ' ', pad - n);
    mt_st_file f;
    expect_open(&f, put_raw("ok.safetensors", pad, padded, pad, 8));
    cr_assert_eq(f.n_tensors, 1);
    cr_assert_str_eq(f.metadata_json, "{\"format\":\"pt\"}");
    const mt_st_tensor *t = mt_st_file_find(&f, "w");
    cr_assert_not_null(t);
    cr_assert_eq(t->nbytes, 8);
    cr_assert_eq((const uint8_t *)t->data, (const uint8_t *)f.map + 8 + pad);
    cr_assert_eq(((const uint8_t *)t->data)[1], 8);  // byte 1 of the data is 1*7+1
    mt_st_file_close(&f);
}

Test(safetensors, zero_size_scalar_and_any_order_accepted) {
    // Header order differs from file order; a 0-dim tensor sits between two others; unknown
    // entry members are ignored (as the reference does).
    const char *h = "{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[8,12]},"
                    "\"z\":{\"dtype\":\"BF16\",\"shape\":[4,0],\"data_offsets\":[8,8],\"x\":1},"
                    "\"a\":" F32_2 "[0,8]},"
                    "\"q\":{\"dtype\":\"F4\",\"shape\":[2,3],\"data_offsets\":[12,15]}}";
    mt_st_file f;
    expect_open(&f, put_st("ok.safetensors", h, 15));
    cr_assert_eq(f.n_tensors, 4);
    cr_assert_null(f.metadata_json);
    static const char *order[] = {"a", "z", "s", "q"};
    for (int i = 0; i < 4; i++) cr_assert_str_eq(f.tensors[i].name, order[i]);
    const mt_st_tensor *s = mt_st_file_find(&f, "s"), *z = mt_st_file_find(&f, "z");
    cr_assert_eq(s->ndim, 0);
    cr_assert_eq(s->nbytes, 4);
    cr_assert_eq(z->nbytes, 0);
    cr_assert_eq(z->ndim, 2);
    cr_assert_eq(z->shape[1], 0);
    cr_assert_eq(mt_st_file_find(&f, "q")->dtype_bits, 4);
    cr_assert_null(mt_st_file_find(&f, "nope"));
    mt_st_file_close(&f);

    mt_st_file e;  // no tensors at all
    expect_open(&e, put_st("empty.safetensors", "{}      ", 0));
    cr_assert_eq(e.n_tensors, 0);
    cr_assert_null(mt_st_file_find(&e, "a"));
    mt_st_file_close(&e);
}

Test(safetensors, dtype_tables) {
    cr_assert_eq(mt_st_dtype_bits("BF16"), 16);
    cr_assert_eq(mt_st_dtype_bits("F32"), 32);
    cr_assert_eq(mt_st_dtype_bits("BOOL"), 8);
    cr_assert_eq(mt_st_dtype_bits("C64"), 64);
    cr_assert_eq(mt_st_dtype_bits("F4"), 4);
    cr_assert_eq(mt_st_dtype_bits("F6_E3M2"), 6);
    cr_assert_eq(mt_st_dtype_bits("F8_E4M3FNUZ"), 8);
    cr_assert_eq(mt_st_dtype_bits("bf16"), -1);
    cr_assert_eq(mt_st_dtype_bits(NULL), -1);
    cr_assert_str_eq(mt_st_dtype_of(MT_F32), "F32");
    cr_assert_str_eq(mt_st_dtype_of(MT_BF16), "BF16");
    cr_assert_str_eq(mt_st_dtype_of(MT_F16), "F16");
    cr_assert_str_eq(mt_st_dtype_of(MT_U8), "U8");
    cr_assert_str_eq(mt_st_dtype_of(MT_I32), "I32");
    cr_assert_str_eq(mt_st_dtype_of(MT_I64), "I64");
    cr_assert_null(mt_st_dtype_of(MT_Q4));
}

// ---------------------------------------------------------------------------------------------
// writing

// Deterministic bytes for entry `index`: what the fill callback writes and the tests expect.
static void pattern(size_t index, uint8_t *dst, size_t n) {
    uint32_t x = (uint32_t)index * 2654435761u + 12345u;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        dst[i] = (uint8_t)(x >> 24);
    }
}

typedef struct {
    int calls;
    size_t fail_at;  // SIZE_MAX: never
    size_t seen[64];
} fill_ctx;

static int fill_pattern(void *vctx, size_t index, void *dst, size_t nbytes) {
    fill_ctx *c = vctx;
    if (c->calls < 64) c->seen[c->calls] = index;
    c->calls++;
    if (index == c->fail_at) {
        mt_error_set("synthetic failure for entry %zu", index);
        return -1;
    }
    pattern(index, dst, nbytes);
    return 0;
}

static void expect_pattern(const mt_st_tensor *t, size_t index) {
    uint8_t want[4096];
    cr_assert(t->nbytes <= sizeof want);
    pattern(index, want, t->nbytes);
    cr_assert(t->nbytes == 0 || memcmp(t->data, want, t->nbytes) == 0, "tensor %s differs", t->name);
}

Test(safetensors, round_trip_bit_for_bit) {
    float f32[6] = {1.5f, -0.0f, 3.25e-38f, 1e30f, -7.0f, 0.1f};
    uint16_t bf16[4] = {0x3f80, 0x7fc1, 0x0001, 0xff80};  // 1.0, a NaN payload, subnormal, -inf
    uint16_t f16[3] = {0x3c00, 0x7e01, 0x8000};
    uint8_t u8[5] = {0, 1, 127, 128, 255};
    int32_t i32[2] = {INT32_MIN, 42};
    int64_t i64[1] = {INT64_MIN + 1};
    double f64 = 3.141592653589793;
    uint8_t f4[2] = {0x12, 0xef};  // 4 F4 values
    uint8_t fp8[3] = {0x7f, 0x80, 0x01};
    mt_st_entry e[] = {
        {"model.layers.0.w", "F32", 2, {2, 3}, f32},
        {"bf", "BF16", 2, {2, 2}, bf16},
        {"half", "F16", 1, {3}, f16},
        {"bytes", "U8", 1, {5}, u8},
        {"ints", "I32", 1, {2}, i32},
        {"longs", "I64", 1, {1}, i64},
        {"scalar", "F64", 0, {0}, &f64},
        {"empty", "BF16", 3, {2, 0, 7}, NULL},
        {"nf4ish", "F4", 2, {2, 2}, f4},
        {"fp8", "F8_E4M3", 1, {3}, fp8},
        {"ünïcode.name", "BOOL", 1, {2}, u8},
    };
    size_t n = MT_ARRAY_LEN(e);
    const char *p = at("rt.safetensors");
    const char *md = "{\"format\":\"pt\",\"note\":\"caf\xc3\xa9 \\\"quoted\\\"\"}";
    cr_assert_eq(mt_st_write(p, e, n, md, NULL, NULL), 0, "%s", mt_error_get());

    mt_st_file f;
    expect_open(&f, p);
    cr_assert_eq(f.n_tensors, n);
    uint64_t hlen;
    memcpy(&hlen, f.map, 8);  // test host is little-endian
    cr_assert_eq(hlen % 8, 0, "header length %llu not a multiple of 8", (unsigned long long)hlen);
    cJSON *want = cJSON_Parse(md), *got = cJSON_Parse(f.metadata_json);
    cr_assert(cJSON_Compare(want, got, 1), "metadata %s != %s", f.metadata_json, md);
    cJSON_Delete(want);
    cJSON_Delete(got);
    for (size_t i = 0; i < n; i++) {
        const mt_st_tensor *t = &f.tensors[i];
        cr_assert_str_eq(t->name, e[i].name, "file order must be entry order");
        cr_assert_str_eq(t->dtype, e[i].dtype);
        cr_assert_eq(t->ndim, e[i].ndim);
        for (int d = 0; d < t->ndim; d++) cr_assert_eq(t->shape[d], e[i].shape[d]);
        uint64_t nb;
        cr_assert_eq(mt_st_nbytes(e[i].dtype, e[i].ndim, e[i].shape, &nb), 0);
        cr_assert_eq(t->nbytes, nb);
        cr_assert(nb == 0 || memcmp(t->data, e[i].data, nb) == 0, "%s differs", t->name);
        cr_assert_eq(t->file_index, 0);
        cr_assert_eq(mt_st_file_find(&f, e[i].name), t);
    }
    cr_assert_eq(f.tensors[0].data, (const uint8_t *)f.map + 8 + hlen);
    mt_st_file_close(&f);
    cr_assert_eq(count_files(tmp), 1, "a temporary file was left behind");
}

Test(safetensors, write_without_metadata) {
    uint8_t b[3] = {1, 2, 3};
    mt_st_entry e[] = {{"b", "U8", 1, {3}, b}};
    const char *p = at("nm.safetensors");
    cr_assert_eq(mt_st_write(p, e, 1, NULL, NULL, NULL), 0, "%s", mt_error_get());
    mt_st_file f;
    expect_open(&f, p);
    cr_assert_null(f.metadata_json);
    cr_assert_eq(memcmp(f.tensors[0].data, b, 3), 0);
    mt_st_file_close(&f);
}

Test(safetensors, fill_callback) {
    static uint8_t direct[16];
    pattern(1, direct, sizeof direct);
    mt_st_entry e[] = {
        {"a", "F32", 2, {4, 8}, NULL},
        {"b", "U8", 1, {16}, direct},  // given directly: fill must not be asked for it
        {"c", "BF16", 1, {100}, NULL},
        {"d", "F32", 1, {0}, NULL},
    };
    fill_ctx c = {.fail_at = SIZE_MAX};
    const char *p = at("fill.safetensors");
    cr_assert_eq(mt_st_write(p, e, 4, NULL, fill_pattern, &c), 0, "%s", mt_error_get());
    cr_assert_eq(c.calls, 3);
    cr_assert_eq(c.seen[0], 0);
    cr_assert_eq(c.seen[1], 2);
    cr_assert_eq(c.seen[2], 3);
    mt_st_file f;
    expect_open(&f, p);
    for (size_t i = 0; i < 4; i++) expect_pattern(mt_st_file_find(&f, e[i].name), i);
    mt_st_file_close(&f);
}

Test(safetensors, atomic_write_leaves_no_temp) {
    uint8_t b[8] = {0};
    mt_st_entry e[] = {{"b", "U8", 1, {8}, b}};
    const char *p = at("atomic.safetensors");
    cr_assert_eq(mt_st_write(p, e, 1, NULL, NULL, NULL), 0, "%s", mt_error_get());
    b[0] = 9;  // overwrite in place: still one file, the new content
    cr_assert_eq(mt_st_write(p, e, 1, NULL, NULL, NULL), 0, "%s", mt_error_get());
    cr_assert_eq(count_files(tmp), 1);
    mt_st_file f;
    expect_open(&f, p);
    cr_assert_eq(((const uint8_t *)f.tensors[0].data)[0], 9);
    mt_st_file_close(&f);
}

Test(safetensors, failing_fill_leaves_nothing) {
    mt_st_entry e[] = {{"a", "U8", 1, {10}, NULL}, {"b", "U8", 1, {10}, NULL}, {"c", "U8", 1, {10}, NULL}};
    fill_ctx c = {.fail_at = 1};
    const char *p = at("fail.safetensors");
    cr_assert_eq(mt_st_write(p, e, 3, NULL, fill_pattern, &c), -1);
    const char *err = mt_error_get();
    cr_assert(contains(err, "fail.safetensors") && contains(err, "'b'") &&
                  contains(err, "synthetic failure for entry 1"), "%s", err);
    cr_assert_eq(c.calls, 2, "fill must stop at the failure");
    cr_assert(!exists(p));
    cr_assert_eq(count_files(tmp), 0, "the temporary was left behind");
}

Test(safetensors, writer_rejects_bad_entries) {
    uint8_t b[4] = {0};
    const char *p = at("rej.safetensors");
    mt_st_entry unknown[] = {{"a", "F33", 1, {4}, b}};
    mt_st_entry dup[] = {{"a", "U8", 1, {4}, b}, {"a", "U8", 1, {4}, b}};
    mt_st_entry neg[] = {{"a", "U8", 1, {-4}, b}};
    mt_st_entry reserved[] = {{"__metadata__", "U8", 1, {4}, b}};
    mt_st_entry nodata[] = {{"a", "U8", 1, {4}, NULL}};
    mt_st_entry odd[] = {{"a", "F4", 1, {3}, b}};
    cr_assert_eq(mt_st_write(p, unknown, 1, NULL, NULL, NULL), -1);
    cr_assert(contains(mt_error_get(), "F33"), "%s", mt_error_get());
    cr_assert_eq(mt_st_write(p, dup, 2, NULL, NULL, NULL), -1);
    cr_assert(contains(mt_error_get(), "twice"), "%s", mt_error_get());
    cr_assert_eq(mt_st_write(p, neg, 1, NULL, NULL, NULL), -1);
    cr_assert_eq(mt_st_write(p, reserved, 1, NULL, NULL, NULL), -1);
    cr_assert_eq(mt_st_write(p, nodata, 1, NULL, NULL, NULL), -1);
    cr_assert_eq(mt_st_write(p, odd, 1, NULL, NULL, NULL), -1);
    cr_assert(contains(mt_error_get(), "MisalignedSlice"), "%s", mt_error_get());
    mt_st_entry ok[] = {{"a", "U8", 1, {4}, b}};
    cr_assert_eq(mt_st_write(p, ok, 1, "{\"n\":3}", NULL, NULL), -1);  // metadata values are strings
    cr_assert_eq(mt_st_write(p, ok, 1, "[1]", NULL, NULL), -1);
    cr_assert_eq(mt_st_write(p, ok, 1, "{\"k\":\"1\",\"k\":\"2\"}", NULL, NULL), -1);
    cr_assert_eq(count_files(tmp), 0);
}

// ---------------------------------------------------------------------------------------------
// sharded models

// Entries 0..n-1 named "layer.<i>.w", 64 bytes each (F32 [16]) except a larger last one, all
// from fill.
static void make_entries(mt_st_entry *e, char names[][32], size_t n) {
    for (size_t i = 0; i < n; i++) {
        snprintf(names[i], 32, "layer.%zu.w", i);
        e[i] = (mt_st_entry){names[i], i % 2 ? "BF16" : "F32", 1, {16}, NULL};
    }
    e[n - 1].shape[0] = 300;  // F32 [300]: bigger than a shard on its own
    e[n - 1].dtype = "F32";
}

Test(safetensors, sharded_round_trip) {
    enum { N = 7 };
    mt_st_entry e[N];
    char names[N][32];
    make_entries(e, names, N);
    const char *dir = at("model");
    fill_ctx c = {.fail_at = SIZE_MAX};
    // 64- and 32-byte entries with a 100-byte cap: [0,1] [2,3] [4,5] [6 (1200 bytes)].
    cr_assert_eq(mt_st_write_sharded(dir, e, N, 100, fill_pattern, &c), 0, "%s", mt_error_get());
    cr_assert_eq(c.calls, N);
    char p[600];
    for (int s = 1; s <= 4; s++) {
        snprintf(p, sizeof p, "%s/model-%05d-of-00004.safetensors", dir, s);
        cr_assert(exists(p), "%s missing", p);
    }
    cr_assert_eq(count_files(dir), 5, "4 shards + index, nothing else");

    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    char *text;
    size_t len;
    cr_assert_eq(mt_read_file(p, 1 << 20, &text, &len), 0);
    cJSON *idx = cJSON_Parse(text);
    free(text);
    cJSON *total = cJSON_GetObjectItem(cJSON_GetObjectItem(idx, "metadata"), "total_size");
    cr_assert_eq((uint64_t)total->valuedouble, 3 * 64 + 3 * 32 + 1200);
    cJSON *wm = cJSON_GetObjectItem(idx, "weight_map");
    cr_assert_eq(cJSON_GetArraySize(wm), N);
    cr_assert_str_eq(cJSON_GetObjectItem(wm, "layer.3.w")->valuestring, "model-00002-of-00004.safetensors");
    cJSON_Delete(idx);

    mt_st_model m;
    cr_assert_eq(mt_st_model_open(&m, dir), 0, "%s", mt_error_get());
    cr_assert_eq(m.n_files, 4);
    cr_assert_eq(m.n_tensors, N);
    for (size_t k = 1; k < m.n_tensors; k++)
        cr_assert(strcmp(m.tensors[k - 1]->name, m.tensors[k]->name) < 0, "not sorted by name");
    for (size_t i = 0; i < N; i++) {
        const mt_st_tensor *t = mt_st_model_find(&m, names[i]);
        cr_assert_not_null(t, "%s not found", names[i]);
        cr_assert_eq(t->file_index, (int)(i / 2));
        cr_assert(contains(m.files[t->file_index].path, "model-0000"));
        cr_assert_str_eq(t->dtype, e[i].dtype);
        expect_pattern(t, i);
    }
    cr_assert_null(mt_st_model_find(&m, "layer.99.w"));
    cr_assert_not_null(m.files[0].metadata_json);
    mt_st_model_close(&m);
}

Test(safetensors, sharded_small_total_is_one_file) {
    enum { N = 3 };
    mt_st_entry e[N];
    char names[N][32];
    make_entries(e, names, N);
    const char *dir = at("one");
    fill_ctx c = {.fail_at = SIZE_MAX};
    cr_assert_eq(mt_st_write_sharded(dir, e, N, 1 << 20, fill_pattern, &c), 0, "%s", mt_error_get());
    cr_assert(exists(at("one/model.safetensors")));
    cr_assert_eq(count_files(dir), 1);
    mt_st_model m;
    cr_assert_eq(mt_st_model_open(&m, dir), 0, "%s", mt_error_get());
    cr_assert_eq(m.n_files, 1);
    for (size_t i = 0; i < N; i++) expect_pattern(mt_st_model_find(&m, names[i]), i);
    cr_assert_str_eq(m.files[0].metadata_json, "{\"format\":\"pt\"}");
    mt_st_model_close(&m);
    // Re-written sharded into the same folder: the lone file goes, so readers see the shards.
    cr_assert_eq(mt_st_write_sharded(dir, e, N, 100, fill_pattern, &c), 0, "%s", mt_error_get());
    cr_assert(!exists(at("one/model.safetensors")));
    cr_assert_eq(mt_st_model_open(&m, dir), 0, "%s", mt_error_get());
    cr_assert_eq(m.n_files, 2);  // [64 + 32] [1200]
    mt_st_model_close(&m);
}

Test(safetensors, sharded_exact_fit_boundaries) {
    static uint8_t v[50];
    mt_st_entry e[4];
    char names[4][32];
    for (int i = 0; i < 4; i++) {
        snprintf(names[i], 32, "t%d", i);
        e[i] = (mt_st_entry){names[i], "U8", 1, {50}, v};
    }
    // A shard may fill max_shard_bytes exactly: 4 x 50 with 100 -> two full shards.
    const char *dir = at("fit");
    cr_assert_eq(mt_st_write_sharded(dir, e, 4, 100, NULL, NULL), 0, "%s", mt_error_get());
    cr_assert(exists(at("fit/model-00002-of-00002.safetensors")));
    cr_assert_eq(count_files(dir), 3);
    // A total equal to the cap is still one file.
    dir = at("fit1");
    cr_assert_eq(mt_st_write_sharded(dir, e, 4, 200, NULL, NULL), 0, "%s", mt_error_get());
    cr_assert(exists(at("fit1/model.safetensors")));
    cr_assert_eq(count_files(dir), 1);
}

Test(safetensors, sharded_failing_fill_leaves_nothing) {
    enum { N = 7 };
    mt_st_entry e[N];
    char names[N][32];
    make_entries(e, names, N);
    const char *dir = at("broken");
    fill_ctx c = {.fail_at = 4};  // in the third shard
    cr_assert_eq(mt_st_write_sharded(dir, e, N, 100, fill_pattern, &c), -1);
    cr_assert(contains(mt_error_get(), "model-00003-of-00004.safetensors"), "%s", mt_error_get());
    cr_assert_eq(count_files(dir), 0, "shards, temporaries or an index were left behind");
}

Test(safetensors, model_folder_without_weights) {
    mt_st_model m;
    cr_assert_eq(mt_st_model_open(&m, tmp), -1);
    cr_assert(contains(mt_error_get(), "model.safetensors"), "%s", mt_error_get());
    cr_assert_null(m.files);
}

// Hand-made shards for the index tests: A holds a, b; B holds c (and whatever `extra_b` adds).
static const char *make_shards(const char *extra_b) {
    uint8_t v[4] = {1, 2, 3, 4};
    mt_st_entry a[] = {{"a", "U8", 1, {4}, v}, {"b", "U8", 1, {4}, v}};
    mt_st_entry b[] = {{"c", "U8", 1, {4}, v}, {extra_b ? extra_b : "d", "U8", 1, {2}, v}};
    const char *dir = at("m");
    cr_assert_eq(mt_mkdir_p(dir), 0);
    cr_assert_eq(mt_st_write(at("m/A.safetensors"), a, 2, NULL, NULL, NULL), 0, "%s", mt_error_get());
    cr_assert_eq(mt_st_write(at("m/B.safetensors"), b, 2, NULL, NULL, NULL), 0, "%s", mt_error_get());
    return dir;
}

static void expect_model_fail(const char *dir, const char *what1, const char *what2) {
    mt_st_model m;
    int rc = mt_st_model_open(&m, dir);
    const char *err = mt_error_get();
    cr_assert_eq(rc, -1, "the model opened");
    cr_assert(contains(err, "model.safetensors.index.json"), "'%s' does not name the index", err);
    cr_assert(contains(err, what1), "'%s' lacks '%s'", err, what1);
    if (what2) cr_assert(contains(err, what2), "'%s' lacks '%s'", err, what2);
    cr_assert_null(m.files);
}

Test(safetensors, index_consistent_hand_made) {
    const char *dir = make_shards(NULL);
    write_text(at("m/model.safetensors.index.json"),
               "{\"weight_map\":{\"a\":\"A.safetensors\",\"b\":\"A.safetensors\","
               "\"c\":\"B.safetensors\",\"d\":\"B.safetensors\"}}");
    mt_st_model m;
    cr_assert_eq(mt_st_model_open(&m, dir), 0, "%s", mt_error_get());
    cr_assert_eq(m.n_tensors, 4);
    cr_assert_eq(mt_st_model_find(&m, "d")->nbytes, 2);
    mt_st_model_close(&m);
}

Test(safetensors, index_missing_shard) {
    const char *dir = make_shards(NULL);
    write_text(at("m/model.safetensors.index.json"),
               "{\"weight_map\":{\"a\":\"A.safetensors\",\"b\":\"A.safetensors\","
               "\"c\":\"B.safetensors\",\"d\":\"B.safetensors\",\"e\":\"C.safetensors\"}}");
    expect_model_fail(dir, "C.safetensors", "does not exist");
}

Test(safetensors, index_path_escape) {
    const char *dir = make_shards(NULL);
    // A real file outside the folder, so only the name check can stop it.
    uint8_t v[4] = {0};
    mt_st_entry x[] = {{"e", "U8", 1, {4}, v}};
    cr_assert_eq(mt_st_write(at("x.safetensors"), x, 1, NULL, NULL, NULL), 0);
    char abs[700];
    snprintf(abs, sizeof abs, "%s", at("x.safetensors"));
    const char *bad[] = {"../x.safetensors", abs, "sub/A.safetensors", "..", ".", ""};
    char text[1200];
    for (size_t i = 0; i < MT_ARRAY_LEN(bad); i++) {
        snprintf(text, sizeof text,
                 "{\"weight_map\":{\"a\":\"A.safetensors\",\"b\":\"A.safetensors\",\"c\":"
                 "\"B.safetensors\",\"d\":\"B.safetensors\",\"e\":\"%s\"}}", bad[i]);
        write_text(at("m/model.safetensors.index.json"), text);
        expect_model_fail(dir, "tensor 'e'", "not a plain file name");
    }
}

Test(safetensors, index_tensor_in_two_shards) {
    const char *dir = make_shards("b");  // B holds c and b; A holds a and b
    write_text(at("m/model.safetensors.index.json"),
               "{\"weight_map\":{\"a\":\"A.safetensors\",\"b\":\"A.safetensors\",\"c\":\"B.safetensors\"}}");
    expect_model_fail(dir, "tensor 'b' is in two shards", "A.safetensors and B.safetensors");
}

Test(safetensors, index_names_wrong_shard) {
    const char *dir = make_shards(NULL);
    write_text(at("m/model.safetensors.index.json"),
               "{\"weight_map\":{\"a\":\"B.safetensors\",\"b\":\"A.safetensors\","
               "\"c\":\"B.safetensors\",\"d\":\"B.safetensors\"}}");
    expect_model_fail(dir, "tensor 'a'", "it is in A.safetensors");
    write_text(at("m/model.safetensors.index.json"),
               "{\"weight_map\":{\"a\":\"A.safetensors\",\"b\":\"A.safetensors\",\"c\":\"B.safetensors\","
               "\"d\":\"B.safetensors\",\"zz\":\"B.safetensors\"}}");
    expect_model_fail(dir, "tensor 'zz'", "no shard holds it");
}

Test(safetensors, index_misses_shard_tensor) {
    const char *dir = make_shards(NULL);
    write_text(at("m/model.safetensors.index.json"),
               "{\"weight_map\":{\"a\":\"A.safetensors\",\"b\":\"A.safetensors\",\"c\":\"B.safetensors\"}}");
    expect_model_fail(dir, "tensor 'd'", "not in the index");
}

Test(safetensors, index_malformed) {
    const char *dir = make_shards(NULL);
    write_text(at("m/model.safetensors.index.json"), "{\"weight_map\":[1]}");
    expect_model_fail(dir, "weight_map", NULL);
    write_text(at("m/model.safetensors.index.json"), "{\"weight_map\":{\"a\":3}}");
    expect_model_fail(dir, "tensor 'a'", "not a string");
    write_text(at("m/model.safetensors.index.json"),
               "{\"weight_map\":{\"a\":\"A.safetensors\",\"a\":\"A.safetensors\"}}");
    expect_model_fail(dir, "tensor 'a'", "twice");
    write_text(at("m/model.safetensors.index.json"), "{\"weight_map\":");
    expect_model_fail(dir, "JSON", NULL);
}

Test(safetensors, index_bad_shard_file) {
    const char *dir = make_shards(NULL);
    put_st("m/B.safetensors", "{\"c\":" F32_2 "[0,8]}}", 4);  // B is now truncated
    write_text(at("m/model.safetensors.index.json"),
               "{\"weight_map\":{\"a\":\"A.safetensors\",\"b\":\"A.safetensors\",\"c\":\"B.safetensors\"}}");
    expect_model_fail(dir, "B.safetensors", "MetadataIncompleteBuffer");
}
