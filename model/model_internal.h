// model/model_internal.h — shared between the model's own files; not for other folders.
#pragma once
#include "model/mixtral.h"

void mt_model_acts_ensure(mt_model *m, int B, int S);
void mt_model_acts_free(mt_model *m);

static inline float *F(const mt_tensor *t) { return (float *)t->data; }
static inline int32_t *I(const mt_tensor *t) { return (int32_t *)t->data; }
