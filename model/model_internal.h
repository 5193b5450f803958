// model/model_internal.h — shared between the model's own files; not for other folders.
#pragma once
#include "model/mixtral.h"

void mt_model_acts_ensure(mt_model *m, int B, int S);
void mt_model_acts_free(mt_model *m);

// The activation set layer L uses: its own, or the shared one when recomputing.
static inline mt_layer_acts *layer_acts(mt_model *m, int L) { return &m->acts[m->recompute ? 0 : L]; }
void mt_layer_forward(mt_model *m, int L, float *x_out, int replay);

static inline float *F(const mt_tensor *t) { return (float *)t->data; }
static inline int32_t *I(const mt_tensor *t) { return (int32_t *)t->data; }
// Element `i` of a buffer that may have no data (the null backend): NULL stays NULL.
static inline float *at(float *p, int64_t i) { return p ? p + i : NULL; }

// A step buffer's dtype: `gpu`, what a GPU run stores, when counting on the null backend; the
// cpu backend computes and keeps everything in f32 (integers stay as they are).
static inline mt_dtype step_dtype(const mt_model *m, mt_dtype gpu) {
    return m->counting || gpu == MT_I32 ? gpu : MT_F32;
}

// Rows [*row0, *row0 + *rows) of expert e in layer L's expert order. Counting, where routing has
// no data, every expert gets T·k/E rows and the first (T·k mod E) one more: balanced routing, as
// the planner assumes.
// With EP these are rows of the own layout (model/expert_parallel.c), none for another rank's.
void mt_expert_rows(const mt_model *m, int L, int e, int64_t *row0, int64_t *rows);

// Expert parallelism (model/expert_parallel.c); EP ranks call these in the same order.
void mt_ep_exchange_counts(mt_model *m, int L);
int64_t mt_ep_own_rows(const mt_model *m, int L);
void mt_ep_dispatch(mt_model *m, int L, float *own, float *local, int64_t w);
void mt_ep_return(mt_model *m, int L, float *local, float *own, int64_t w);
// Expert buffers of `a` (xs, g, u, a, expert xa) holding at least `rows` rows (model/acts.c).
void mt_model_expert_acts_ensure(mt_model *m, mt_layer_acts *a, int64_t rows);
