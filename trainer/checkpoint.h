// trainer/checkpoint.h — training-state checkpoints for --resume: trainables, optimizer state,
// step, data position. A checkpoint is complete or absent: it is written into a temporary folder
// that is renamed into place, and only then does the `latest` pointer name it.
#pragma once
#include <stdint.h>

#include "core/comm.h"
#include "data/data.h"
#include "optim/optim.h"
#include "trainer/options.h"  // mt_opt_pairs

typedef struct mt_train_state {
    int64_t step;              // optimizer steps done
    mt_data_cursor cursor;     // where the data continues
    uint64_t data_fingerprint; // the dataset it was trained on
    int64_t skips;             // non-finite steps skipped so far
    double eval_loss;          // eval loss at this step, NaN when none ran (retention keeps the best)
    const mt_opt_pairs *options; // the settings the run was given, kept in state.json for --resume
                                 // OUT alone (NULL: none; not filled by loading)
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
// Like mt_checkpoint_find, but every candidate is verified (mt_checkpoint_verify) before it is
// chosen: when the one `latest` names fails, a warning names the file and what failed and the
// newest earlier checkpoint that verifies is used, saying so. A checkpoint folder given itself
// must verify. 0, or -1 when none verifies.
int mt_checkpoint_find_verified(const char *path, char *dir);
// Checks state.json's own checksum, then the size and SHA-256 of every file it lists; `verbose`
// prints a line per file. 0, or -1 with an error naming the file and what failed.
int mt_checkpoint_verify(const char *dir, int verbose);
// 0 when the checkpoint's state.json lists `file` (or lists nothing: version 1), else -1.
int mt_checkpoint_lists(const char *dir, const char *file);
// Retention (HF Trainer's save_total_limit): keeps at most `limit` checkpoint-N folders in `out`
// (0: all), always the newest and the one with the lowest eval loss (so 2 when limit is 1 and
// they differ). A pruned folder is renamed to a temporary name before it is removed.
void mt_checkpoint_prune(const char *out, int64_t limit);
// Removes, from `out`, the temporary folders and files (.checkpoint-N.tmp-PID, latest.tmp.PID,
// ...) of processes that no longer exist; those of a live process are left alone. Returns how
// many were removed.
int mt_checkpoint_remove_stale(const char *out);

// state.json (checkpoint_verify.c)
typedef struct cJSON cJSON;
// Adds "files": {name: {size, sha256}} for every file in dir but state.json.
int mt_ckpt_manifest_add(cJSON *state, const char *dir);
// The text of state.json: the object, then the SHA-256 of everything before it (malloc'd).
char *mt_ckpt_state_seal(const cJSON *state);
// Reads and parses state.json, refusing it unless its own checksum holds.
int mt_ckpt_state_read(const char *path, cJSON **out);
// state.json's training state and run id (cap bytes): the checksum, then the fields' types and
// ranges. 0, or -1 with an error naming the file.
int mt_ckpt_state_parse(const char *path, mt_train_state *st, char *run_id, size_t cap);
// state.json's "options" (the settings its run was given) appended to `out`: 0, 1 when the
// checkpoint predates them (a run of an earlier moetrain), -1 with an error.
int mt_ckpt_state_options(const char *dir, mt_opt_pairs *out);
// What a verified state must also mean for this run before anything trains: its data position
// inside `d` (epoch >= 0, index in [0, n)) and its step at most `total_steps` (a checkpoint past
// --steps has nothing left to train). 0, or -1 with an error naming `dir`.
int mt_train_state_check(const mt_train_state *st, const mt_dataset *d, int64_t total_steps, const char *dir);

// Restores trainables and optimizer state (this rank's files); refuses (naming both) when run_id
// differs.
int mt_checkpoint_load(const char *dir, const mt_param *w, int nw, const mt_param *p, int n, mt_adamw *o,
                       mt_train_state *st, const char *run_id, mt_comm *world);
