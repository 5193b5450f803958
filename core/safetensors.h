// core/safetensors.h — read (mmap, fully validated) and write (atomic, optionally sharded)
// Hugging Face safetensors files. Format and validation rules: docs/formats.md "safetensors".
//
// Every reader error is reported through mt_error_set() as
//   "<file>: [tensor '<name>': ]<ReferenceErrorName>: <what is wrong>"
// using the error names of the reference implementation (huggingface/safetensors tensor.rs:
// HeaderTooSmall, HeaderTooLarge, InvalidHeaderLength, InvalidHeader, InvalidHeaderStart,
// InvalidHeaderDeserialization, InvalidOffset, ValidationOverflow, MisalignedSlice,
// TensorInvalidInfo, MetadataIncompleteBuffer), so a message can be matched to the spec.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_ST_MAX_DIMS 8
#define MT_ST_MAX_HEADER 100000000ull  // the reference's MAX_HEADER_SIZE

typedef struct mt_st_tensor {
    char *name;
    char dtype[16];  // as in the file: "BF16", "F32", "U8", ...
    int dtype_bits;  // 16, 32, 8, 4 (F4), 6 (F6_*) ...
    int ndim;
    int64_t shape[MT_ST_MAX_DIMS];
    uint64_t nbytes;
    const void *data;  // points into the mmap of its file; not necessarily aligned
    int file_index;    // which shard (for sharded models); 0 for a lone file
} mt_st_tensor;

typedef struct mt_st_file {  // one mmapped .safetensors file
    char *path;
    void *map;
    size_t map_len;
    mt_st_tensor *tensors;  // in file (offset) order
    size_t n_tensors;
    char *metadata_json;               // the "__metadata__" object re-serialised, or NULL
    const mt_st_tensor **by_name;      // the same tensors sorted by name (for find)
} mt_st_file;

// 0, or -1 with an error naming the path and the problem. On failure *f is left zeroed, so
// mt_st_file_close() on it is harmless. The file must not be truncated while open (SIGBUS).
int mt_st_file_open(mt_st_file *f, const char *path);
void mt_st_file_close(mt_st_file *f);
const mt_st_tensor *mt_st_file_find(const mt_st_file *f, const char *name);  // NULL if absent

// A checkpoint folder: dir/model.safetensors, or shards through dir/model.safetensors.index.json
// (like transformers, the single file is preferred when both exist).
typedef struct mt_st_model {
    mt_st_file *files;
    size_t n_files;
    const mt_st_tensor **tensors;  // all tensors, sorted by name (binary search)
    size_t n_tensors;
} mt_st_model;
int mt_st_model_open(mt_st_model *m, const char *dir);
void mt_st_model_close(mt_st_model *m);
const mt_st_tensor *mt_st_model_find(const mt_st_model *m, const char *name);

// Writing. An entry gives its data directly, or (data == NULL) through fill(), called once with
// a buffer of nbytes to fill — so a writer can stream tensors it generates without holding them
// all. fill returns 0, or non-zero after mt_error_set() to abandon the write.
typedef int (*mt_st_fill_fn)(void *ctx, size_t index, void *dst, size_t nbytes);
typedef struct mt_st_entry {
    const char *name;
    const char *dtype;  // "BF16", "F32", "U8", ...
    int ndim;
    int64_t shape[MT_ST_MAX_DIMS];
    const void *data;  // or NULL: use fill
} mt_st_entry;

// Writes `path` atomically (temporary + fsync + rename): on any failure neither the file nor
// the temporary is left. Tensors are laid out in the order given (not HF's dtype-then-name
// order; readers sort by offset, so both are valid), the header padded with spaces to a
// multiple of 8. metadata_json: a JSON object of string values (e.g. "{\"format\":\"pt\"}"),
// or NULL for none. fill's `index` is the entry's index in `entries`.
int mt_st_write(const char *path, const mt_st_entry *entries, size_t n,
                const char *metadata_json, mt_st_fill_fn fill, void *ctx);

// Writes dir/model.safetensors when the total is <= max_shard_bytes, else
// dir/model-00001-of-0000N.safetensors ... (5-digit, 1-based, greedy in entry order; an entry
// larger than max_shard_bytes gets a shard of its own) plus
// dir/model.safetensors.index.json = {"metadata":{"total_size":N},"weight_map":{name: file}},
// written last and atomically. Each file carries __metadata__ {"format":"pt"} (transformers
// checks it). The folder is created if missing; a stale file of the other layout
// (model.safetensors or the index) is removed afterwards so readers are not misled.
int mt_st_write_sharded(const char *dir, const mt_st_entry *entries, size_t n,
                        uint64_t max_shard_bytes, mt_st_fill_fn fill, void *ctx);

// dtype string -> bits per element; -1 for an unknown dtype.
int mt_st_dtype_bits(const char *dtype);
// MT_F32 -> "F32", MT_BF16 -> "BF16", MT_F16 -> "F16", MT_U8 -> "U8", MT_I32 -> "I32",
// MT_I64 -> "I64", MT_F8_E4M3 -> "F8_E4M3", MT_F8_E5M2 -> "F8_E5M2"; NULL for a type with no
// safetensors name (MT_Q4 is stored as U8).
const char *mt_st_dtype_of(mt_dtype t);
// "F32" / "BF16" / "F16" -> the float dtype moetrain computes with; -1 (no error set) otherwise.
int mt_st_float_dtype(const char *dtype, mt_dtype *out);

// Bytes of a tensor of this dtype and shape: 0, or -1 with an error when the dtype is unknown,
// a dimension negative, the size overflows, or the bits are not a whole number of bytes.
int mt_st_nbytes(const char *dtype, int ndim, const int64_t *shape, uint64_t *nbytes);

// Length of the longest well-formed UTF-8 prefix of s[0..len) (len when all of it is).
size_t mt_st_utf8_prefix(const void *s, size_t len);

#ifdef __cplusplus
}
#endif
