// trainer/decode.c — greedy decoding over the model's forward.
#include "trainer/decode.h"

#include <string.h>

#include "core/common.h"

int mt_greedy_decode(mt_model *m, const int32_t *prompt, int n, int max_new, int32_t eos, int32_t *out) {
    int cap = n + max_new, V = (int)m->cfg.vocab, made = 0;
    int32_t *seq = mt_xmalloc((size_t)cap * sizeof(int32_t)), *labels = mt_xmalloc((size_t)cap * sizeof(int32_t));
    memcpy(seq, prompt, (size_t)n * sizeof(int32_t));
    for (int i = 0; i < cap; i++) labels[i] = -100;
    while (made < max_new) {
        int len = n + made;
        mt_batch b = {1, len, seq, labels, NULL};
        mt_loss l;
        if (mt_model_forward(m, &b, &l) != 0) {
            made = -1;
            break;
        }
        const float *row = (const float *)m->logits->data + (size_t)(len - 1) * V;
        int32_t best = 0;
        for (int v = 1; v < V; v++)
            if (row[v] > row[best]) best = v;
        seq[len] = out[made++] = best;
        if (best == eos) break;
    }
    free(seq);
    free(labels);
    return made;
}
