// core/fileio.c — capped reads, atomic writes (temp + fsync + rename), mkdir -p.
#include "core/fileio.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"

FILE *mt_open_regular(const char *path, struct stat *st) {
    FILE *f = fopen(path, "rb");
    if (!f && errno == ENOMEM) {  // stdio's FILE could not be allocated: not the file's fault
        char what[1200];
        snprintf(what, sizeof what, "opening %s", path);
        mt_fatal_oom(what);
    }
    if (!f) {
        mt_error_set("%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    if (fstat(fileno(f), st) != 0 || !S_ISREG(st->st_mode)) {
        mt_error_set("%s: not a regular file", path);
        fclose(f);
        return NULL;
    }
    return f;
}

int mt_read_file(const char *path, size_t max_bytes, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    struct stat st;
    FILE *f = mt_open_regular(path, &st);
    if (!f) return -1;
    if ((uint64_t)st.st_size > max_bytes) {
        mt_error_set("%s: %lld bytes is larger than the %zu-byte limit for this kind of file", path,
                     (long long)st.st_size, max_bytes);
        fclose(f);
        return -1;
    }
    size_t n = (size_t)st.st_size;
    char *buf = mt_xmalloc(n + 1);
    if (fread(buf, 1, n, f) != n) {
        mt_error_set("%s: read failed: %s", path, ferror(f) ? strerror(errno) : "the file is shorter than it was");
        free(buf);
        fclose(f);
        return -1;
    }
    fclose(f);
    buf[n] = 0;
    *out = buf;
    *len = n;
    return 0;
}

int mt_atomic_open(mt_atomic_file *af, const char *path) {
    memset(af, 0, sizeof *af);
    if (strlen(path) >= sizeof af->path) {
        mt_error_set("%s: path too long", path);
        return -1;
    }
    strcpy(af->path, path);
    snprintf(af->tmp, sizeof af->tmp, "%s.tmp.%d", path, (int)getpid());
    af->f = fopen(af->tmp, "wb");
    if (!af->f) {
        mt_error_set("%s: cannot create: %s", af->tmp, strerror(errno));
        return -1;
    }
    return 0;
}

int mt_atomic_commit(mt_atomic_file *af) {
    int ok = fflush(af->f) == 0 && fsync(fileno(af->f)) == 0;
    int err = errno;
    ok = (fclose(af->f) == 0) && ok;
    af->f = NULL;
    if (!ok) {
        mt_error_set("%s: write failed: %s", af->path, strerror(err ? err : errno));
        unlink(af->tmp);
        return -1;
    }
    if (rename(af->tmp, af->path) != 0) {
        mt_error_set("%s: rename from %s failed: %s", af->path, af->tmp, strerror(errno));
        unlink(af->tmp);
        return -1;
    }
    return 0;
}

void mt_atomic_abort(mt_atomic_file *af) {
    if (af->f) fclose(af->f);
    af->f = NULL;
    unlink(af->tmp);
}

int mt_write_file_atomic(const char *path, const void *data, size_t len) {
    mt_atomic_file af;
    if (mt_atomic_open(&af, path) != 0) return -1;
    if (len && fwrite(data, 1, len, af.f) != len) {
        mt_error_set("%s: write failed: %s", path, strerror(errno));
        mt_atomic_abort(&af);
        return -1;
    }
    return mt_atomic_commit(&af);
}

int mt_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int mt_mkdir_p(const char *path) {
    char buf[4096];
    if (strlen(path) >= sizeof buf) {
        mt_error_set("%s: path too long", path);
        return -1;
    }
    strcpy(buf, path);
    for (char *p = buf + 1; ; p++) {
        if (*p == '/' || *p == 0) {
            char saved = *p;
            *p = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
                mt_error_set("%s: cannot create folder: %s", buf, strerror(errno));
                return -1;
            }
            *p = saved;
            if (!saved) break;
        }
    }
    if (!mt_is_dir(path)) {
        mt_error_set("%s: exists and is not a folder", path);
        return -1;
    }
    return 0;
}

int mt_remove_flat_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) {
        if (errno == ENOENT) return 0;
        return errno == ENOTDIR ? unlink(path) : -1;
    }
    struct dirent *e;
    char file[4400];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(file, sizeof file, "%s/%s", path, e->d_name);
        unlink(file);
    }
    closedir(d);
    return rmdir(path);
}

void mt_model_folder(const char *model, char *dir, size_t n) {
    struct stat st;
    snprintf(dir, n, "%s", model);
    if (stat(dir, &st) != 0 || !S_ISREG(st.st_mode)) return;
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, n, ".");
}
