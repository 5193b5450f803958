// model/fused_experts.h — gpt-oss's fused expert tensors and the per-expert Linears moetrain
// trains (docs/families.md "gpt-oss"). Per expert, gate_up_proj holds [H, 2f] and down_proj [f, H],
// applied as x · W: each is the transpose of its output rows. gate_up's row 2i is the gate's (w1)
// row i and row 2i + 1 the up's (w3); down's rows are w2's. MXFP4 stores the rows themselves
// ([E, rows, in/32, 16]), so one expert's slice is rowsᵀ in the dense form and rows in MXFP4.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Where Linear `which` (the family's expert[] index: 0 gate/w1, 1 down/w2, 2 up/w3) lies in its
// fused tensor: one expert's rows [rows, in], the Linear's row i being row off + stride · i.
typedef struct {
    int64_t rows, in, stride, off;
} mt_fused_part;

mt_fused_part mt_fused_part_of(int which, int64_t hidden, int64_t inter);
// Expert slice [in, rows] (the dense form) <-> the Linear's W [rows / stride, in].
void mt_fused_get(const float *slice, mt_fused_part p, float *w);
void mt_fused_put(float *slice, mt_fused_part p, const float *w);

// Which fused tensor `name` is: 0 "....experts.gate_up_proj", 1 "....experts.down_proj", -1
// neither; *experts_len (may be NULL): the length of its "....experts" prefix.
int mt_fused_tensor_of(const char *name, size_t *experts_len);
// gate_up_proj_bias [E, 2f] (gate in the even columns, up in the odd) to and from w1's and w3's
// biases [E, f] each.
void mt_fused_bias_split(const float *fused, int64_t E, int64_t f, float *gate, float *up);
void mt_fused_bias_join(float *fused, int64_t E, int64_t f, const float *gate, const float *up);

#ifdef __cplusplus
}
#endif
