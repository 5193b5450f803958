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
