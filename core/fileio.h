// core/fileio.h — whole-file reads with a size cap, and writes that are never left half done.
#pragma once
#include <stddef.h>
#include <stdio.h>
#include <sys/stat.h>

#ifdef __cplusplus
extern "C" {
#endif

// `path` opened for reading, refused unless it is a regular file (a folder or a FIFO would read
// as nothing or block); *st is its stat. NULL with an error naming the path.
FILE *mt_open_regular(const char *path, struct stat *st);
// Reads all of `path` (at most max_bytes) into a NUL-terminated buffer the caller frees.
int mt_read_file(const char *path, size_t max_bytes, char **out, size_t *len);

// A file written to "<path>.tmp.<pid>" and renamed onto `path` by mt_atomic_commit()
// after fflush + fsync; mt_atomic_abort() removes the temporary.
typedef struct mt_atomic_file {
    FILE *f;
    char path[4096];
    char tmp[4200];
} mt_atomic_file;

int mt_atomic_open(mt_atomic_file *af, const char *path);
int mt_atomic_commit(mt_atomic_file *af);  // on failure the temporary is removed
void mt_atomic_abort(mt_atomic_file *af);
// Convenience: the whole of data[0..len) to `path`, atomically.
int mt_write_file_atomic(const char *path, const void *data, size_t len);
// mkdir -p; 0 or -1 with an error.
int mt_mkdir_p(const char *path);
int mt_is_dir(const char *path);
// The folder a --model argument names: `model` itself, or, when it names a file (its
// config.json), the folder holding that file ("." for a bare file name). Written into dir.
void mt_model_folder(const char *model, char *dir, size_t n);
// Removes a folder of plain files (a checkpoint, a temporary one) and the folder, or a file;
// 0 when it is gone (or was never there), -1 otherwise.
int mt_remove_flat_dir(const char *path);

#ifdef __cplusplus
}
#endif
