// data/sentencepiece_shim.cc — the C view of libsentencepiece declared in sentencepiece_shim.h.
// Nothing C++ crosses the boundary: statuses and exceptions become mt_error_set() messages.
#include "data/sentencepiece_shim.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "core/common.h"

struct mt_spm {
    sentencepiece::SentencePieceProcessor sp;
    std::string path;
};

mt_spm *mt_spm_load(const char *path) {
    try {
        mt_spm *s = new mt_spm;
        s->path = path;
        auto st = s->sp.Load(path);
        if (!st.ok()) {
            mt_error_set("%s: not a SentencePiece model: %s", path, st.ToString().c_str());
            delete s;
            return nullptr;
        }
        return s;
    } catch (const std::bad_alloc &) {  // out of memory is exit 4, not a bad file
        mt_fatal_oom("inside SentencePiece");
    } catch (const std::exception &e) {
        mt_error_set("%s: loading the SentencePiece model failed: %s", path, e.what());
        return nullptr;
    }
}

void mt_spm_free(mt_spm *s) { delete s; }

int mt_spm_piece_count(const mt_spm *s) { return s->sp.GetPieceSize(); }
int mt_spm_bos_id(const mt_spm *s) { return s->sp.bos_id(); }
int mt_spm_eos_id(const mt_spm *s) { return s->sp.eos_id(); }
int mt_spm_unk_id(const mt_spm *s) { return s->sp.unk_id(); }
int mt_spm_pad_id(const mt_spm *s) { return s->sp.pad_id(); }

int mt_spm_encode(const mt_spm *s, const char *text, size_t len, int32_t **ids, size_t *n) {
    *ids = nullptr;
    *n = 0;
    try {
        std::vector<int> v;
        auto st = s->sp.Encode(absl::string_view(text, len), &v);
        if (!st.ok()) {
            mt_error_set("%s: encode failed: %s", s->path.c_str(), st.ToString().c_str());
            return -1;
        }
        int32_t *out = static_cast<int32_t *>(mt_xmalloc((v.size() ? v.size() : 1) * sizeof(int32_t)));
        for (size_t i = 0; i < v.size(); i++) out[i] = v[i];
        *ids = out;
        *n = v.size();
        return 0;
    } catch (const std::bad_alloc &) {  // out of memory is exit 4, not a bad file
        mt_fatal_oom("inside SentencePiece");
    } catch (const std::exception &e) {
        mt_error_set("%s: encode failed: %s", s->path.c_str(), e.what());
        return -1;
    }
}

int mt_spm_decode(const mt_spm *s, const int32_t *ids, size_t n, char **text, size_t *len) {
    *text = nullptr;
    *len = 0;
    try {
        int count = s->sp.GetPieceSize();
        std::vector<int> v(n);
        for (size_t i = 0; i < n; i++) {
            if (ids[i] < 0 || ids[i] >= count) {
                mt_error_set("%s: decode: id %d at position %zu is outside the model's %d pieces",
                             s->path.c_str(), (int)ids[i], i, count);
                return -1;
            }
            v[i] = ids[i];
        }
        std::string out;
        auto st = s->sp.Decode(v, &out);
        if (!st.ok()) {
            mt_error_set("%s: decode failed: %s", s->path.c_str(), st.ToString().c_str());
            return -1;
        }
        char *buf = static_cast<char *>(mt_xmalloc(out.size() + 1));
        memcpy(buf, out.data(), out.size());
        buf[out.size()] = 0;
        *text = buf;
        *len = out.size();
        return 0;
    } catch (const std::bad_alloc &) {  // out of memory is exit 4, not a bad file
        mt_fatal_oom("inside SentencePiece");
    } catch (const std::exception &e) {
        mt_error_set("%s: decode failed: %s", s->path.c_str(), e.what());
        return -1;
    }
}

const char *mt_spm_id_to_piece(const mt_spm *s, int id) {
    if (id < 0 || id >= s->sp.GetPieceSize()) return nullptr;
    return s->sp.IdToPiece(id).c_str();
}

int mt_spm_piece_to_id(const mt_spm *s, const char *piece) { return s->sp.PieceToId(piece); }

// The trainer logs its command line to stderr before it reads --minloglevel; training is for
// tests and tools, so stderr is pointed at /dev/null meanwhile (the status says what failed).
int mt_spm_train(const char *args) {
    fflush(stderr);
    int saved = dup(2), null = open("/dev/null", O_WRONLY);
    if (saved >= 0 && null >= 0) dup2(null, 2);
    if (null >= 0) close(null);
    struct restore {
        int fd;
        ~restore() {
            if (fd >= 0) {
                dup2(fd, 2);
                close(fd);
            }
        }
    } restore_stderr{saved};
    try {
        auto st = sentencepiece::SentencePieceTrainer::Train(std::string(args) + " --minloglevel=2");
        if (!st.ok()) {
            mt_error_set("SentencePiece training failed: %s", st.ToString().c_str());
            return -1;
        }
        return 0;
    } catch (const std::bad_alloc &) {  // out of memory is exit 4, not a bad file
        mt_fatal_oom("inside SentencePiece");
    } catch (const std::exception &e) {
        mt_error_set("SentencePiece training failed: %s", e.what());
        return -1;
    }
}
