// optim/dist.h — one rank's trainables in a parallel run: which ranks hold copies of each,
// their gradients summed over those ranks, the gradient norm over every rank, and ZeRO-1.
//
// Two groups. Replicated trainables (attention, router, norms, embeddings) have a copy on every
// rank: their group is the world. An expert's trainables have copies on the ranks with the same
// EP rank: the DP group. A group's tensors are laid end to end in one flat buffer, padded to a
// multiple of its rank count G and cut into G equal chunks; chunk c is rank c's shard.
//   no ZeRO  the gradients are all-reduced in place and every rank updates every tensor it holds;
//   ZeRO-1   they are reduce-scattered, each rank updates its chunk only (the optimizer sees one
//            param per piece of a tensor inside the chunk, so Adam state and fp32 masters exist
//            for the chunk alone), and the updated weights are all-gathered.
// Both reductions fold in rank order (MT_COMM_EXACT), and the norm is the same computation
// either way (each chunk's Σg² in the blocked order, chunks folded in order, then EP ranks
// folded in order), so ZeRO-1 gives the same bits as no ZeRO, and every rank the same bits.
//
// Memory moves through the backend (copy, fill_zero) and the comm's data collectives, so the
// same code runs on host memory over MPI (tested: tests/mpi) and on device memory over NCCL (not
// run: no multi-GPU machine here).
//
// With ZeRO the flat buffer of a group of more than one rank is counted under `comm`: a copy of
// its gradients, which the reduce-scatter needs contiguous (the planner counts it too).
#pragma once
#include "core/comm.h"
#include "optim/optim.h"

enum { MT_DIST_REPLICATED, MT_DIST_EXPERTS, MT_DIST_GROUPS };

typedef struct mt_dist_group {
    mt_comm *comm;         // the ranks holding copies; NULL on one rank or when counting
    int rank, size;
    int n;                 // its params
    int *idx;              // [n] their indices in the full list, in order
    int64_t *start;        // [n] their offsets in the flat layout
    int64_t numel, chunk;  // elements, and the chunk each rank owns: ceil(numel / size)
    mt_dtype dtype;        // of the weights and gradients (one dtype per model)
    int sharded;           // ZeRO and size > 1: each rank updates its chunk only
    void *flat;            // sharded: [chunk × size] (ledger: comm; NULL when counting)
    size_t flat_bytes;
} mt_dist_group;

typedef struct mt_dist {
    int zero;
    mt_backend *be;
    mt_comm *ep;           // the EP group: the expert group's norm is summed over it
    int counting;          // the null backend: layouts and buffers counted, nothing moved
    mt_dist_group group[MT_DIST_GROUPS];
    const mt_param *params;
    int n_params;
    mt_param *opt;         // what the optimizer updates: the params, or (ZeRO) pieces of them
    unsigned char *piece;  // [n_opt] 1: opt[i] is a piece (its w and g are views dist owns)
    int n_opt, cap_opt;    // cap_opt: the room of opt and piece (grown by doubling)
} mt_dist;

// Where this rank sits: its rank and the size of the world and of its DP group (EP size =
// world / dp). Comms may be NULL (one rank, or counting on the null backend as that rank).
typedef struct mt_dist_ranks {
    mt_comm *world, *ep, *dp;
    int world_rank, world_size, dp_rank, dp_size;
} mt_dist_ranks;

// Sorts params into the groups and builds the flat layouts and the optimizer's list. An expert
// trainable is one whose name holds ".experts.". 0, or -1 with an error (a backend other than
// cpu or null; the ledger refusing a buffer).
int mt_dist_init(mt_dist *d, mt_backend *be, const mt_param *params, int n, const mt_dist_ranks *r, int zero);
void mt_dist_free(mt_dist *d);
// After backward: every gradient summed over its copies (ZeRO: this rank's chunk only).
void mt_dist_reduce_grads(mt_dist *d);
// The gradient norm over the whole model (every rank's experts once), the same on every rank.
double mt_dist_grad_norm(mt_dist *d);
// After the optimizer's step (ZeRO): every rank's updated chunk to every rank.
void mt_dist_share_weights(mt_dist *d);
