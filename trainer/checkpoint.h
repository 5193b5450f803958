// trainer/checkpoint.h — training-state checkpoints for --resume: trainables, optimizer state,
// step, data position. A checkpoint is complete or absent: it is written into a temporary folder
// that is renamed into place, and only then does the `latest` pointer name it.
#pragma once
#include <stdint.h>

#include "core/comm.h"
#include "data/data.h"
#include "optim/optim.h"

typedef struct mt_train_state {
    int64_t step;              // optimizer steps done
    mt_data_cursor cursor;     // where the data continues
    uint64_t data_fingerprint; // the dataset it was trained on
    int64_t skips;             // non-finite steps skipped so far
} mt_train_state;

// Writes OUT/checkpoint-<step>/ {trainables.safetensors (the weights w), optimizer.safetensors
// (the state of the optimizer's params p, which are w or, with ZeRO, pieces of them),
// state.json} and points OUT/latest at it. `run_id` describes what must not change across a
// resume. `world` (NULL: one process) makes it collective: every rank writes its own
// trainables-rank-R-of-N / optimizer-rank-R-of-N files into the folder rank 0 made, and rank 0
// renames it into place only when every rank succeeded; every rank returns the same result.
int mt_checkpoint_save(const char *out, const mt_param *w, int nw, const mt_param *p, int n, const mt_adamw *o,
                       const mt_train_state *st, const char *run_id, mt_comm *world);
// `path` is a checkpoint folder, or an output folder: then the one `latest` names, or, when
// `latest` is missing, garbled or names a missing folder, the newest complete checkpoint (with a
// warning). Fills dir (4096 bytes). 0, or -1 when there is none.
int mt_checkpoint_find(const char *path, char *dir);
// Restores trainables and optimizer state (this rank's files); refuses (naming both) when run_id
// differs.
int mt_checkpoint_load(const char *dir, const mt_param *w, int nw, const mt_param *p, int n, mt_adamw *o,
                       mt_train_state *st, const char *run_id, mt_comm *world);
