// trainer/train.h — pieces of the training command other commands reuse.
#pragma once
#include <stddef.h>

#include "model/mixtral.h"
#include "trainer/data.h"
#include "trainer/options.h"

// A one-line description of what must not change across --resume.
void mt_run_id(const mt_run_opts *o, const mt_model_config *c, char *buf, size_t n);
// Mean cross-entropy over one pass of `data` (each sample once, in file order when the dataset
// was loaded with shuffle off); NAN when it holds no loss token. *tokens_out: tokens counted.
double mt_eval_loss(mt_model *m, mt_dataset *data, int B, int S, int64_t *tokens_out);
