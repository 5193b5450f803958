// tests/cudasim/nccl.cc — an NCCL stand-in for the calls core/comm_nccl.cu makes. The ranks
// are processes (under mpirun) and the data moves through MPI; one rank alone needs no MPI.
//
// Bootstrap as NCCL's: the rank that calls ncclGetUniqueId (rank 0 of the new communicator)
// writes its MPI_COMM_WORLD rank and a sequence number into the id; the caller passes the id to
// the others (moetrain does so over MPI); in ncclCommInitRankConfig every member sends
// (its rank, its world rank) to that world rank, which answers with the member list, and the
// members make an MPI communicator of exactly themselves (MPI_Comm_create_group: only they take
// part). Tags are in [TAG_BASE, TAG_BASE + 1000) on MPI_COMM_WORLD; moetrain's own MPI traffic
// uses a duplicate of it, so they cannot meet.
//
// Collectives run as stream items (so after the work their stream waits for) and the stream is
// run up to them at once: a device makes progress on communication without the host, and two
// ranks that synchronise in different orders must not deadlock in the emulator either. Sums are
// taken in rank order in double and rounded once: deterministic, and within rounding of NCCL's
// ring. Grouped calls (ncclGroupStart/End) become one item: the sends and receives are posted
// non-blocking, the collectives run in call order, then everything is waited for.
#include <nccl.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#ifdef MT_MPI
#include <mpi.h>
#endif
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "runtime.h"

namespace {

enum { TAG_BASE = 29000 };
const char MAGIC[] = "cudasim-nccl";

struct Comm {
    int rank, nranks;
#ifdef MT_MPI
    MPI_Comm mpi;
#endif
};

struct IdBody {
    char magic[16];
    int root_world;
    int seq;
};

size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}
double get(const void *p, ncclDataType_t t, size_t i) {
    switch (t) {
    case ncclInt8: return ((const int8_t *)p)[i];
    case ncclUint8: return ((const uint8_t *)p)[i];
    case ncclFloat16: return __half2float(((const __half *)p)[i]);
    case ncclBfloat16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case ncclInt32: return ((const int32_t *)p)[i];
    case ncclUint32: return ((const uint32_t *)p)[i];
    case ncclFloat32: return ((const float *)p)[i];
    case ncclInt64: return (double)((const int64_t *)p)[i];
    case ncclUint64: return (double)((const uint64_t *)p)[i];
    case ncclFloat64: return ((const double *)p)[i];
    default: return 0;
    }
}
void put(void *p, ncclDataType_t t, size_t i, double v) {
    switch (t) {
    case ncclInt8: ((int8_t *)p)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case ncclFloat16: ((__half *)p)[i] = __float2half_rn((float)v); break;
    case ncclBfloat16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn((float)v); break;
    case ncclInt32: ((int32_t *)p)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t *)p)[i] = (uint32_t)v; break;
    case ncclFloat32: ((float *)p)[i] = (float)v; break;
    case ncclInt64: ((int64_t *)p)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t *)p)[i] = (uint64_t)v; break;
    case ncclFloat64: ((double *)p)[i] = v; break;
    default: break;
    }
}
// 64-bit integers are reduced exactly (double would round above 2^53).
void reduce_into(void *dst, const std::vector<const char *> &parts, size_t off, size_t n, ncclDataType_t t, ncclRedOp_t op) {
    const bool wide = t == ncclInt64 || t == ncclUint64;
    for (size_t i = 0; i < n; i++) {
        if (wide) {
            int64_t acc = ((const int64_t *)parts[0])[off + i];
            for (size_t r = 1; r < parts.size(); r++) {
                int64_t v = ((const int64_t *)parts[r])[off + i];
                acc = op == ncclSum ? acc + v : op == ncclProd ? acc * v : op == ncclMax ? (v > acc ? v : acc) : (v < acc ? v : acc);
            }
            ((int64_t *)dst)[i] = acc;
            continue;
        }
        double acc = get(parts[0], t, off + i);
        for (size_t r = 1; r < parts.size(); r++) {
            double v = get(parts[r], t, off + i);
            acc = op == ncclSum ? acc + v : op == ncclProd ? acc * v : op == ncclMax ? (v > acc ? v : acc) : (v < acc ? v : acc);
        }
        put(dst, t, i, acc);
    }
}

ncclResult_t bad(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
ncclResult_t bad(ncclResult_t r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cudasim NCCL: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return r;
}

// What a grouped call leaves for ncclGroupEnd.
struct Pending {
    cudaStream_t stream;
    bool p2p;
    std::function<void(std::vector<void *> &requests)> run;
};
int group_depth;
std::vector<Pending> group;

#ifdef MT_MPI
bool mpi_up() {
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    return up && !down;
}
#endif

// All ranks' n bytes at src, in rank order, in one buffer.
std::vector<char> gather_all(Comm *c, const void *src, size_t n) {
    std::vector<char> all(n * c->nranks);
#ifdef MT_MPI
    if (c->nranks > 1) {
        MPI_Allgather(src, (int)n, MPI_BYTE, all.data(), (int)n, MPI_BYTE, c->mpi);
        return all;
    }
#endif
    memcpy(all.data(), src, n);
    return all;
}

// Waits for the non-blocking transfers a stream item posted.
void wait_all(std::vector<void *> &reqs) {
#ifdef MT_MPI
    for (void *r : reqs) {
        MPI_Wait((MPI_Request *)r, MPI_STATUS_IGNORE);
        delete (MPI_Request *)r;
    }
#endif
    reqs.clear();
}

ncclResult_t submit(const char *name, cudaStream_t s, bool p2p, std::function<void(std::vector<void *> &)> run) {
    if (group_depth > 0) {
        group.push_back({s, p2p, std::move(run)});
        return ncclSuccess;
    }
    cudasim::lib_enqueue(s, name, [run] {
        std::vector<void *> reqs;
        run(reqs);
        wait_all(reqs);
    }, true);
    return ncclSuccess;
}

Comm *comm_of(ncclComm_t c) { return (Comm *)c; }

}  // namespace

extern "C" {

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument (cudasim)";
    case ncclInvalidUsage: return "invalid usage (cudasim)";
    case ncclSystemError: return "system error (cudasim)";
    default: return "error (cudasim)";
    }
}
const char *ncclGetLastError(ncclComm_t) { return ""; }
ncclResult_t ncclGetVersion(int *v) {
    *v = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    static int seq;
    memset(id, 0, sizeof *id);
    IdBody b;
    memset(&b, 0, sizeof b);
    memcpy(b.magic, MAGIC, sizeof MAGIC);
    b.root_world = 0;
#ifdef MT_MPI
    if (mpi_up()) MPI_Comm_rank(MPI_COMM_WORLD, &b.root_world);
#endif
    b.seq = seq++;
    memcpy(id->internal, &b, sizeof b);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank, ncclConfig_t *) {
    cudasim::LibCall lock;
    IdBody b;
    memcpy(&b, id.internal, sizeof b);
    if (memcmp(b.magic, MAGIC, sizeof MAGIC) != 0)
        return bad(ncclInvalidArgument, "ncclCommInitRankConfig: the id was not made by ncclGetUniqueId (not broadcast to this rank?)");
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return bad(ncclInvalidArgument, "ncclCommInitRankConfig: rank %d of %d", rank, nranks);
    Comm *c = new Comm();
    c->rank = rank;
    c->nranks = nranks;
    if (nranks == 1) {
#ifdef MT_MPI
        c->mpi = MPI_COMM_NULL;
#endif
        *out = (ncclComm_t)c;
        return ncclSuccess;
    }
#ifdef MT_MPI
    if (!mpi_up()) return bad(ncclInvalidUsage, "%d ranks need MPI (run under mpirun)", nranks);
    int world = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world);
    const int tag = TAG_BASE + b.seq % 1000;
    std::vector<int> members(nranks, -1);
    if (rank == 0) {
        if (world != b.root_world) return bad(ncclInvalidArgument, "rank 0 is not the rank that made the id");
        members[0] = world;
        for (int i = 1; i < nranks; i++) {
            int who[2];
            MPI_Recv(who, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (who[0] <= 0 || who[0] >= nranks || members[who[0]] >= 0)
                return bad(ncclInvalidUsage, "two processes claim rank %d of one communicator", who[0]);
            members[who[0]] = who[1];
        }
        for (int i = 1; i < nranks; i++) MPI_Send(members.data(), nranks, MPI_INT, members[i], tag, MPI_COMM_WORLD);
    } else {
        int who[2] = {rank, world};
        MPI_Send(who, 2, MPI_INT, b.root_world, tag, MPI_COMM_WORLD);
        MPI_Recv(members.data(), nranks, MPI_INT, b.root_world, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    MPI_Group wg, g;
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    MPI_Group_incl(wg, nranks, members.data(), &g);
    if (MPI_Comm_create_group(MPI_COMM_WORLD, g, tag, &c->mpi) != MPI_SUCCESS)
        return bad(ncclSystemError, "MPI_Comm_create_group failed");
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
    if (getenv("CUDASIM_VERBOSE"))
        fprintf(stderr, "cudasim NCCL: communicator of %d ranks over MPI: rank %d is world rank %d\n", nranks, rank, world);
    *out = (ncclComm_t)c;
    return ncclSuccess;
#else
    return bad(ncclInvalidUsage, "%d ranks: this build has no MPI", nranks);
#endif
}

ncclResult_t ncclCommInitRank(ncclComm_t *c, int n, ncclUniqueId id, int r) { return ncclCommInitRankConfig(c, n, id, r, nullptr); }
ncclResult_t ncclCommFinalize(ncclComm_t) { return ncclSuccess; }
// The MPI communicator is left to MPI_Finalize: MPI_Comm_free is collective, ncclCommDestroy is not.
ncclResult_t ncclCommDestroy(ncclComm_t c) {
    delete comm_of(c);
    return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t) { return ncclSuccess; }
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t *e) {
    *e = ncclSuccess;
    return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t c, int *n) {
    *n = comm_of(c)->nranks;
    return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t c, int *r) {
    *r = comm_of(c)->rank;
    return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
    group_depth++;
    return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
    cudasim::LibCall lock;
    if (group_depth == 0) return bad(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--group_depth > 0 || group.empty()) return ncclSuccess;
    std::vector<Pending> ops;
    ops.swap(group);
    cudasim::lib_enqueue(ops[0].stream, "NCCL group", [ops] {
        std::vector<void *> reqs;
        for (const Pending &p : ops)
            if (p.p2p) p.run(reqs);
        for (const Pending &p : ops)
            if (!p.p2p) p.run(reqs);
        wait_all(reqs);
    }, true);
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t cc,
                           cudaStream_t s) {
    cudasim::LibCall lock;
    Comm *c = comm_of(cc);
    const size_t es = type_size(t);
    if (!c || !es) return bad(ncclInvalidArgument, "ncclAllReduce: comm or type");
    if (!n) return ncclSuccess;
    cudasim::lib_check_device(send, n * es, "ncclAllReduce sendbuff");
    cudasim::lib_check_device(recv, n * es, "ncclAllReduce recvbuff");
    return submit("ncclAllReduce", s, false, [=](std::vector<void *> &) {
        cudasim::lib_open(send);
        cudasim::lib_open(recv);
        std::vector<char> all = gather_all(c, send, n * es);
        std::vector<const char *> parts;
        for (int r = 0; r < c->nranks; r++) parts.push_back(all.data() + (size_t)r * n * es);
        reduce_into(recv, parts, 0, n, t, op);
    });
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t cc,
                               cudaStream_t s) {
    cudasim::LibCall lock;
    Comm *c = comm_of(cc);
    const size_t es = type_size(t);
    if (!c || !es) return bad(ncclInvalidArgument, "ncclReduceScatter: comm or type");
    if (!n) return ncclSuccess;
    cudasim::lib_check_device(send, n * es * c->nranks, "ncclReduceScatter sendbuff");
    cudasim::lib_check_device(recv, n * es, "ncclReduceScatter recvbuff");
    return submit("ncclReduceScatter", s, false, [=](std::vector<void *> &) {
        cudasim::lib_open(send);
        cudasim::lib_open(recv);
        std::vector<char> all = gather_all(c, send, n * es * c->nranks);
        std::vector<const char *> parts;
        for (int r = 0; r < c->nranks; r++) parts.push_back(all.data() + (size_t)r * n * es * c->nranks);
        reduce_into(recv, parts, (size_t)c->rank * n, n, t, op);
    });
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t n, ncclDataType_t t, ncclComm_t cc, cudaStream_t s) {
    cudasim::LibCall lock;
    Comm *c = comm_of(cc);
    const size_t es = type_size(t);
    if (!c || !es) return bad(ncclInvalidArgument, "ncclAllGather: comm or type");
    if (!n) return ncclSuccess;
    cudasim::lib_check_device(send, n * es, "ncclAllGather sendbuff");
    cudasim::lib_check_device(recv, n * es * c->nranks, "ncclAllGather recvbuff");
    return submit("ncclAllGather", s, false, [=](std::vector<void *> &) {
        cudasim::lib_open(send);
        cudasim::lib_open(recv);
        std::vector<char> all = gather_all(c, send, n * es);
        memcpy(recv, all.data(), all.size());
    });
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t n, ncclDataType_t t, int root, ncclComm_t cc, cudaStream_t s) {
    cudasim::LibCall lock;
    Comm *c = comm_of(cc);
    const size_t es = type_size(t);
    if (!c || !es || root < 0 || root >= c->nranks) return bad(ncclInvalidArgument, "ncclBroadcast: comm, type or root %d", root);
    if (!n) return ncclSuccess;
    if (c->rank == root) cudasim::lib_check_device(send, n * es, "ncclBroadcast sendbuff");
    cudasim::lib_check_device(recv, n * es, "ncclBroadcast recvbuff");
    return submit("ncclBroadcast", s, false, [=](std::vector<void *> &) {
        if (c->rank == root) cudasim::lib_open(send);
        cudasim::lib_open(recv);
        if (c->rank == root && send != recv) memmove(recv, send, n * es);
#ifdef MT_MPI
        if (c->nranks > 1) MPI_Bcast(recv, (int)(n * es), MPI_BYTE, root, c->mpi);
#endif
    });
}

// Point to point: posted non-blocking when its group ends (or at once, alone).
static ncclResult_t p2p(const char *name, bool send, void *buf, size_t n, ncclDataType_t t, int peer, ncclComm_t cc,
                        cudaStream_t s) {
    cudasim::LibCall lock;
    Comm *c = comm_of(cc);
    const size_t es = type_size(t);
    if (!c || !es || peer < 0 || peer >= c->nranks) return bad(ncclInvalidArgument, "%s: comm, type or peer %d", name, peer);
    if (!n) return ncclSuccess;
    cudasim::lib_check_device(buf, n * es, send ? "ncclSend sendbuff" : "ncclRecv recvbuff");
    if (peer == c->rank) return bad(ncclInvalidUsage, "%s with itself (the project copies to itself with cudaMemcpyAsync)", name);
    return submit(name, s, true, [=](std::vector<void *> &reqs) {
        cudasim::lib_open(buf);
#ifdef MT_MPI
        MPI_Request *r = new MPI_Request;
        if (send) MPI_Isend(buf, (int)(n * es), MPI_BYTE, peer, TAG_BASE + 999, c->mpi, r);
        else MPI_Irecv(buf, (int)(n * es), MPI_BYTE, peer, TAG_BASE + 999, c->mpi, r);
        reqs.push_back(r);
#else
        (void)reqs;
#endif
    });
}

ncclResult_t ncclSend(const void *buf, size_t n, ncclDataType_t t, int peer, ncclComm_t cc, cudaStream_t s) {
    return p2p("ncclSend", true, (void *)buf, n, t, peer, cc, s);
}
ncclResult_t ncclRecv(void *buf, size_t n, ncclDataType_t t, int peer, ncclComm_t cc, cudaStream_t s) {
    return p2p("ncclRecv", false, buf, n, t, peer, cc, s);
}

}  // extern "C"
