// tests/cudasim/runtime.cc — the CUDA runtime calls moetrain makes, on the CPU, with the
// checks a GPU makes by faulting or by returning an error.
//
// Device memory. Every allocation is its own mapping: the bytes asked for end at a 256-byte
// boundary (cudaMalloc's alignment), the slack around them is a redzone filled with 0xcb, and
// a guard page follows. The mapping is PROT_NONE except while a kernel or a runtime call that
// touches device memory runs: then a fault on it opens it (the SIGSEGV handler mprotects it
// readable and writable and lets the access retry), and the end of the call closes again
// every allocation it opened, first checking their redzones. So
//   * a host dereference of a device pointer faults at once, reported with the address;
//   * a kernel's access past the end of an allocation faults in the guard page (or, for the
//     few bytes up to the 256-byte boundary, is found in the redzone when the kernel ends),
//     reported with the kernel, block and thread (the redzone with the kernel);
//   * new memory is filled with 0xff, a NaN in every float type, so reading before writing
//     shows in the results.
// The accounting behind cudaMemGetInfo follows a driver's: cudaMalloc counts in 512-byte
// steps until cudaFree; cudaMallocAsync takes from the stream-ordered pool, which grows in
// 2 MiB steps; cudaFreeAsync returns bytes to the pool, and at the next synchronisation the pool
// gives back to the driver what it holds beyond its release threshold (default 0: all it holds
// unused; cudaMemPoolAttrReleaseThreshold = UINT64_MAX: nothing), never what is in use;
// cudaMemPoolTrimTo gives back down to what it is asked to keep. One default pool for all the
// emulated devices, as they share one accounting. An H100 SXM: 80 GiB.
//
// Streams. CUDASIM_ASYNC=deferred (the default) queues every kernel, copy, memset, cuBLASLt
// matmul and stream-ordered free on its stream, and runs the queue only at a synchronisation
// point: cudaStreamSynchronize, cudaEventSynchronize, cudaEventQuery (it runs the work and
// answers cudaErrorNotReady the first time), cudaDeviceSynchronize, cudaFree, the blocking
// cudaMemcpy/cudaMemset (which wait for the legacy stream and the blocking streams only, as
// documented: not for a cudaStreamNonBlocking stream). A host read of a download without the
// synchronisation sees the destination unwritten. Device-to-host cudaMemcpyAsync is deferred
// even into pageable memory, where the real driver happens to copy before returning: code that
// counts on that breaks the day its buffer is pinned. Host-to-device copies read their source
// when queued (the staging the driver does for pageable memory). NCCL calls run their stream up
// to and including themselves at once (progress on the device does not wait for the host there).
// CUDASIM_ASYNC=eager runs everything when it is called.
#include <cublasLt.h>
#include <errno.h>
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <string>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "exec.h"
#include "runtime.h"

namespace cudasim {

static std::recursive_mutex mu;
static pthread_t owner;
static bool owner_set;
static thread_local cudaError_t last_error = cudaSuccess;
static thread_local int device_depth;  // > 0 while a kernel or runtime call may touch device memory

static void lock_owner() {
    if (!owner_set) {
        owner = pthread_self();
        owner_set = true;
    }
}
#define API_ENTER(name)                      \
    std::lock_guard<std::recursive_mutex> g_(mu); \
    lock_owner();                            \
    CallName call_(name)

struct CallName {
    const char *saved;
    explicit CallName(const char *n) : saved(cur_call) { if (!cur_kernel) cur_call = n; }
    ~CallName() { cur_call = saved; }
};

static cudaError_t set_error(cudaError_t e) {
    if (e != cudaSuccess) last_error = e;
    return e;
}

static void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void report(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vreport(fmt, ap);
    va_end(ap);
}

// ---------------------------------------------------------------------------------------------
// Device memory

enum : size_t { ALIGN = 256, GRANULE = 512, POOL_STEP = 2u << 20 };
static const unsigned char REDZONE = 0xcb, FRESH = 0xff;
static const size_t DEVICE_BYTES = (size_t)80 << 30;
static size_t page_size;

struct Alloc {
    char *map;       // the mapping: data pages, then one guard page
    size_t pages;    // bytes of data pages
    char *ptr;       // what the caller got
    size_t n;        // bytes asked for
    size_t counted;  // bytes the driver accounting holds
    bool pool;       // cudaMallocAsync
    bool open;       // readable and writable now
};
static std::map<uintptr_t, Alloc *> allocs;  // by mapping start
static std::vector<Alloc *> opened;
static size_t plain_bytes, pool_reserved, pool_in_use;
static bool protect = true;  // CUDASIM_HOSTCHECK=0 leaves device memory readable by the host

static size_t round_up(size_t n, size_t g) { return (n + g - 1) / g * g; }

// The allocation whose mapping (guard page included) holds p.
static Alloc *find_mapping(const void *p) {
    uintptr_t u = (uintptr_t)p;
    auto it = allocs.upper_bound(u);
    if (it == allocs.begin()) return nullptr;
    --it;
    Alloc *a = it->second;
    return u < (uintptr_t)a->map + a->pages + page_size ? a : nullptr;
}

Alloc *device_alloc_of(const void *p) {
    Alloc *a = find_mapping(p);
    return a && (const char *)p >= a->ptr && (const char *)p < a->ptr + a->n ? a : nullptr;
}

static void open_alloc(Alloc *a) {
    if (a->open) return;
    mprotect(a->map, a->pages, PROT_READ | PROT_WRITE);
    a->open = true;
    opened.push_back(a);
}

// The redzone: [map, ptr) and [ptr + n, map + pages) hold REDZONE unless something wrote there.
static void check_redzone(Alloc *a, const char *who) {
    const char *lo = a->map, *hi = a->map + a->pages;
    const char *bad = nullptr;
    for (const char *p = a->ptr + a->n; p < hi && !bad; p++)
        if ((unsigned char)*p != REDZONE) bad = p;
    for (const char *p = lo; p < a->ptr && !bad; p++)
        if ((unsigned char)*p != REDZONE) bad = p;
    if (!bad) return;
    fprintf(stderr, "cudasim: %s: out-of-bounds write: byte %td %s a %zu-byte device allocation at %p was written "
            "(found in its redzone when the work ended)\n", who ? who : "host code",
            bad >= a->ptr ? bad - (a->ptr + a->n) : a->ptr - bad, bad >= a->ptr ? "past the end of" : "before the start of",
            a->n, (void *)a->ptr);
    abort();
}

static void close_all(const char *who) {
    for (Alloc *a : opened) {
        check_redzone(a, who);
        if (protect) mprotect(a->map, a->pages, PROT_NONE);
        a->open = !protect;
    }
    opened.clear();
}

// While one lives, device memory may be touched (a kernel or a runtime call runs).
struct DeviceScope {
    const char *who;
    explicit DeviceScope(const char *w) : who(w) { device_depth++; }
    ~DeviceScope() {
        if (--device_depth == 0) close_all(who);
    }
};

static void install_handlers();
bool deferred();

static cudaError_t dev_alloc(void **out, size_t n, bool pool) {
    *out = nullptr;
    if (!page_size) page_size = (size_t)sysconf(_SC_PAGESIZE);
    install_handlers();
    const size_t body = round_up(n ? n : 1, ALIGN), counted = round_up(n ? n : 1, GRANULE);
    size_t grow = 0;
    if (pool && pool_reserved - pool_in_use < counted) grow = round_up(counted - (pool_reserved - pool_in_use), POOL_STEP);
    if (plain_bytes + pool_reserved + (pool ? grow : counted) > DEVICE_BYTES) return set_error(cudaErrorMemoryAllocation);
    const size_t pages = round_up(body, page_size);
    void *m = mmap(nullptr, pages + page_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return set_error(cudaErrorMemoryAllocation);
    Alloc *a = new Alloc{(char *)m, pages, (char *)m + pages - body, n, counted, pool, true};
    memset(a->map, REDZONE, a->ptr - a->map);
    memset(a->ptr, FRESH, n);
    memset(a->ptr + n, REDZONE, body - n);
    mprotect(a->map + pages, page_size, PROT_NONE);
    if (protect) {
        mprotect(a->map, pages, PROT_NONE);
        a->open = false;
    }
    allocs[(uintptr_t)m] = a;
    if (pool) {
        pool_reserved += grow;
        pool_in_use += counted;
    } else {
        plain_bytes += counted;
    }
    *out = a->ptr;
    return cudaSuccess;
}

static void dev_release(Alloc *a) {
    if (a->open) {
        check_redzone(a, "cudaFree");
        for (auto it = opened.begin(); it != opened.end(); ++it)
            if (*it == a) {
                opened.erase(it);
                break;
            }
    }
    if (a->pool) pool_in_use -= a->counted;
    else plain_bytes -= a->counted;
    allocs.erase((uintptr_t)a->map);
    munmap(a->map, a->pages + page_size);
    delete a;
}

static Alloc *alloc_for_free(void *p, const char *what) {
    Alloc *a = find_mapping(p);
    if (!a || a->ptr != p)
        fail("%s(%p): not the start of a live device allocation (a double free, or a pointer that cudaMalloc did "
             "not return)", what, p);
    return a;
}

// cudaMemPoolAttrReleaseThreshold: "Amount of reserved memory in bytes to hold onto before trying
// to release memory back to the OS" (default 0).
static uint64_t pool_threshold;

// Down to `keep` bytes reserved, never below what is in use (in POOL_STEP granules); a pool
// holding no more than `keep` is left alone (cudaMemPoolTrimTo's "no-op").
static void pool_trim_to(size_t keep) {
    if (pool_reserved <= keep) return;
    pool_reserved = std::max(round_up(pool_in_use, POOL_STEP), round_up(keep, POOL_STEP));
}
// At a synchronisation: "When more than the release threshold bytes of memory are held by the
// memory pool, the allocator will try to release memory back to the OS".
static void pool_trim() {
    if (pool_reserved > pool_threshold) pool_trim_to((size_t)pool_threshold);
}

// The range [p, p + n) must lie in one allocation, or in host memory.
static void check_range(const void *p, size_t n, bool want_device, const char *role) {
    Alloc *a = find_mapping(p);
    if (!a) {
        if (want_device) fail("the %s pointer %p is not device memory (host memory, or freed)", role, p);
        return;
    }
    if (!want_device) fail("the %s pointer %p is device memory, but the copy's kind says host", role, p);
    if ((const char *)p < a->ptr || (const char *)p + n > a->ptr + a->n)
        fail("%zu bytes at %s %p run outside its %zu-byte device allocation at %p (offset %td)", n, role, p, a->n,
             (void *)a->ptr, (const char *)p - a->ptr);
}

// ---------------------------------------------------------------------------------------------
// Pending downloads: in deferred mode the pages lying wholly inside the host destination of a
// queued device-to-host copy are PROT_NONE until the copy runs, so a host access to them before
// the synchronisation faults and is reported (CUDASIM_HOSTWATCH=0 turns this off). Pages shared
// with other data are left alone (a destination smaller than a page is not watched): nothing
// else ever faults on a watched page. A system call handed a watched page fails with EFAULT:
// writing into a download still in flight is a bug of its own.

struct Watch {
    uintptr_t lo, hi;  // the watched pages
    const char *dst;
    std::string what;
};
static std::vector<Watch *> watches;
static int hostwatch = -1;

static bool hostwatch_on() {
    if (hostwatch < 0) {
        const char *h = getenv("CUDASIM_HOSTWATCH");
        hostwatch = deferred() && !(h && !strcmp(h, "0"));
    }
    return hostwatch;
}

static Watch *watch_add(void *dst, size_t n, std::string what) {
    if (!page_size) page_size = (size_t)sysconf(_SC_PAGESIZE);
    const uintptr_t lo = round_up((uintptr_t)dst, page_size), hi = ((uintptr_t)dst + n) / page_size * page_size;
    if (hi <= lo) return nullptr;
    for (Watch *w : watches)
        if (lo < w->hi && w->lo < hi) return nullptr;  // two downloads into one place: the first one watches
    install_handlers();
    Watch *w = new Watch{lo, hi, (const char *)dst, std::move(what)};
    watches.push_back(w);
    mprotect((void *)lo, hi - lo, PROT_NONE);
    return w;
}

static void watch_remove(Watch *w) {
    if (!w) return;
    mprotect((void *)w->lo, w->hi - w->lo, PROT_READ | PROT_WRITE);
    for (auto it = watches.begin(); it != watches.end(); ++it)
        if (*it == w) {
            watches.erase(it);
            break;
        }
    delete w;
}

// A fault on a watched page is the report; false: not a watched page.
static bool watch_fault(void *addr, bool write) {
    for (Watch *w : watches)
        if ((uintptr_t)addr >= w->lo && (uintptr_t)addr < w->hi) {
            fprintf(stderr, "cudasim: the host %s %p, byte %td of the destination of %s, which has not run yet: the "
                    "stream must be synchronised (cudaStreamSynchronize, cudaEventSynchronize) before the host uses a "
                    "download. Host stack:\n", write ? "wrote" : "read", addr, (const char *)addr - w->dst, w->what.c_str());
            void *bt[32];
            int k = backtrace(bt, 32);
            backtrace_symbols_fd(bt, k, 2);
            abort();
        }
    return false;
}

// ---------------------------------------------------------------------------------------------
// Faults: device memory opened on first touch inside a kernel or runtime call; anything else
// that faults in it is reported.

static struct sigaction prev_segv, prev_bus;

static void segv_handler(int sig, siginfo_t *si, void *uctx) {
    void *addr = si->si_addr;
    const bool write = (((ucontext_t *)uctx)->uc_mcontext.gregs[REG_ERR] & 2) != 0;
    if (in_smem(addr)) {
        if (race_enabled() && race_fault(addr, write, uctx)) return;
        if ((char *)addr >= smem_base() + (SMEM_OPTIN_MAX + 4095) / 4096 * 4096)
            fail("%s past the end of the block's shared memory (%p)", write ? "write" : "read", addr);
    }
    watch_fault(addr, write);
    Alloc *a = find_mapping(addr);
    if (a && device_depth > 0 && pthread_equal(pthread_self(), owner)) {
        if ((char *)addr < a->map + a->pages) {
            open_alloc(a);
            return;
        }
        fail("out-of-bounds %s at %p: %zu bytes past the end of a %zu-byte device allocation at %p",
             write ? "write" : "read", addr, (size_t)((char *)addr - (a->ptr + a->n)), a->n, (void *)a->ptr);
    }
    if (a) {
        fprintf(stderr,
                "cudasim: the host %s device memory at %p (byte %td of a %zu-byte device allocation at %p) outside any "
                "kernel or CUDA call: a device pointer is not a host pointer (copy it with cudaMemcpy). Host stack:\n",
                write ? "wrote" : "read", addr, (char *)addr - a->ptr, a->n, (void *)a->ptr);
        void *bt[32];
        int k = backtrace(bt, 32);
        backtrace_symbols_fd(bt, k, 2);
        abort();
    }
    if (device_depth > 0 && cur_kernel && cur)
        fail("invalid %s at %p: not device memory (freed, never allocated, or a bad index)", write ? "write" : "read",
             addr);
    struct sigaction *prev = sig == SIGBUS ? &prev_bus : &prev_segv;  // not ours: as before us
    sigaction(sig, prev, nullptr);
}

static void trap_handler(int, siginfo_t *, void *uctx) {
    if (!race_trap(uctx)) {
        signal(SIGTRAP, SIG_DFL);
        raise(SIGTRAP);
    }
}

static void install_handlers() {
    static bool done;
    if (done) return;
    done = true;
    const char *h = getenv("CUDASIM_HOSTCHECK");
    protect = !(h && !strcmp(h, "0"));
    static char altstack[1 << 16];
    stack_t ss = {};
    ss.ss_sp = altstack;
    ss.ss_size = sizeof altstack;
    sigaltstack(&ss, nullptr);
    struct sigaction sa = {};
    sa.sa_sigaction = segv_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &prev_segv);
    sigaction(SIGBUS, &sa, &prev_bus);
    sa.sa_sigaction = trap_handler;
    sigaction(SIGTRAP, &sa, nullptr);
}

// ---------------------------------------------------------------------------------------------
// Streams and events

struct Item {
    std::string name;  // "kernel 'k'", "cudaMemcpyAsync", ...: for reports
    std::function<void()> fn;
};
struct Stream {
    std::deque<Item> q;
    uint64_t queued = 0, done = 0;
    bool blocking = true;      // synchronises with the legacy stream
    std::string last_kernel;  // for reports: what a pending copy comes after
};
struct Event {
    Stream *s = nullptr;
    uint64_t at = 0;
    bool told_not_ready = false;
    bool timing = true;  // not cudaEventDisableTiming: its record stamps the host clock when reached
    // Set by the stamp item when the stream reaches the record (host ms, CPU-emulated); shared
    // with the item so that an event destroyed before its stream ran leaves nothing dangling.
    std::shared_ptr<double> stamp;
};
static Stream legacy;
static std::vector<Stream *> streams;

static Stream *stream_of(cudaStream_t s) { return s ? (Stream *)s : &legacy; }

bool deferred() {
    static int d = -1;
    if (d < 0) {
        const char *a = getenv("CUDASIM_ASYNC");
        d = !(a && !strcmp(a, "eager"));
    }
    return d;
}

// Runs s until `upto` items of it have completed (on the owner thread only).
static void run_until(Stream *s, uint64_t upto) {
    while (s->done < upto && !s->q.empty()) {
        Item it = std::move(s->q.front());
        s->q.pop_front();
        {
            DeviceScope scope(it.name.c_str());
            const char *saved = cur_call;
            cur_call = it.name.c_str();
            it.fn();
            cur_call = saved;
        }
        s->done++;
    }
}
static void run_all(Stream *s) { run_until(s, s->queued); }
static void run_everything() {
    for (bool again = true; again;) {
        again = false;
        run_all(&legacy);
        for (Stream *s : streams)
            if (s->done < s->queued) {
                run_all(s);
                again = true;
            }
    }
    pool_trim();
}
// What the legacy stream waits for: itself and every blocking stream.
static void run_legacy() {
    run_all(&legacy);
    for (Stream *s : streams)
        if (s->blocking) run_all(s);
}

void enqueue(cudaStream_t st, std::string name, std::function<void()> fn, bool now) {
    Stream *s = stream_of(st);
    s->q.push_back(Item{std::move(name), std::move(fn)});
    s->queued++;
    if (!deferred() || now) run_all(s);
}

}  // namespace cudasim

using namespace cudasim;

// ---------------------------------------------------------------------------------------------
// Kernel launches (from cudasim.h)

struct FuncAttr {
    int max_dyn = SMEM_DEFAULT_MAX;
};
static std::map<const void *, FuncAttr> func_attrs;

void cudasim::submit_kernel(const char *name, const void *addr, const Cfg &c, std::function<void()> body) {
    API_ENTER("kernel launch");
    const unsigned long long threads = (unsigned long long)c.b.x * c.b.y * c.b.z;
    const char *why = nullptr;
    char buf[256];
    cudaError_t e = cudaErrorInvalidConfiguration;
    if (threads == 0 || c.g.x == 0 || c.g.y == 0 || c.g.z == 0) {
        why = "an empty grid or block";
    } else if (threads > 1024 || c.b.x > 1024 || c.b.y > 1024 || c.b.z > 64) {
        snprintf(buf, sizeof buf, "block (%u,%u,%u) = %llu threads, over the 1024 per block (and 1024, 1024, 64 per "
                 "dimension) of the device", c.b.x, c.b.y, c.b.z, threads);
        why = buf;
    } else if (c.g.x > 2147483647u || c.g.y > 65535 || c.g.z > 65535) {
        snprintf(buf, sizeof buf, "grid (%u,%u,%u), over the device's limits (2^31-1, 65535, 65535)", c.g.x, c.g.y, c.g.z);
        why = buf;
    } else {
        auto it = addr ? func_attrs.find(addr) : func_attrs.end();
        const size_t limit = it == func_attrs.end() ? (size_t)SMEM_DEFAULT_MAX : (size_t)it->second.max_dyn;
        if (c.smem > limit) {
            e = cudaErrorInvalidValue;
            if (c.smem > SMEM_OPTIN_MAX)
                snprintf(buf, sizeof buf, "%zu bytes of dynamic shared memory, over the 227 KiB a block can have", c.smem);
            else
                snprintf(buf, sizeof buf, "%zu bytes of dynamic shared memory, over the %zu this kernel may use (more "
                         "than 48 KiB needs cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize))",
                         c.smem, limit);
            why = buf;
        }
    }
    if (why) {
        fprintf(stderr, "cudasim: launch of kernel '%s' refused (%s): %s\n", name, cudaGetErrorName(e), why);
        set_error(e);
        return;
    }
    stream_of(c.st)->last_kernel = name;
    enqueue(c.st, std::string("kernel '") + name + "'", [name, c, body = std::move(body)] { run_grid(name, c, body); }, false);
}

extern "C" {

cudaError_t cudaFuncSetAttribute(const void *f, cudaFuncAttribute a, int v) {
    API_ENTER("cudaFuncSetAttribute");
    if (a != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
    if (v < 0 || v > SMEM_OPTIN_MAX) return set_error(cudaErrorInvalidValue);
    func_attrs[f].max_dyn = v;
    return cudaSuccess;
}

// ---------------------------------------------------------------------------------------------
// Device

// An 8-GPU H100 SXM node (CUDASIM_DEVICES changes the count): ranks under mpirun each take the
// device of their local rank. Every device of a process shares its one memory accounting.
static int device_count() {
    static int n = 0;
    if (!n) {
        const char *e = getenv("CUDASIM_DEVICES");
        n = e && atoi(e) > 0 ? atoi(e) : 8;
    }
    return n;
}
static thread_local int current_device;

cudaError_t cudaGetDeviceCount(int *n) {
    *n = device_count();
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    if (d < 0 || d >= device_count()) return set_error(cudaErrorInvalidDevice);
    current_device = d;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) {
    *d = current_device;
    return cudaSuccess;
}

// An H100 SXM (what the project is sized for), as the driver describes it.
// The emulator stands for the toolkit it was built with, driver and runtime alike.
cudaError_t cudaDriverGetVersion(int *v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d) {
    if (d < 0 || d >= device_count()) return set_error(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "NVIDIA H100 80GB HBM3 (cudasim: CPU-emulated)");
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024, p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647, p->maxGridSize[1] = 65535, p->maxGridSize[2] = 65535;
    p->sharedMemPerBlock = SMEM_DEFAULT_MAX;
    p->sharedMemPerBlockOptin = SMEM_OPTIN_MAX;
    p->sharedMemPerMultiprocessor = 228 << 10;
    p->regsPerBlock = 65536;
    p->maxThreadsPerMultiProcessor = 2048;
    p->totalGlobalMem = DEVICE_BYTES;
    p->l2CacheSize = 50 << 20;
    p->memoryBusWidth = 5120;
    p->unifiedAddressing = 1;
    p->memoryPoolsSupported = 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int d) {
    if (d < 0 || d >= device_count()) return set_error(cudaErrorInvalidDevice);
    switch (a) {
    case cudaDevAttrMemoryPoolsSupported: *v = 1; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = SMEM_OPTIN_MAX; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = SMEM_DEFAULT_MAX; break;
    case cudaDevAttrMultiProcessorCount: *v = 132; break;
    case cudaDevAttrMaxThreadsPerBlock: *v = 1024; break;
    case cudaDevAttrWarpSize: *v = 32; break;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
    default: return set_error(cudaErrorInvalidValue);  // not modelled: say so rather than guess
    }
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    API_ENTER("cudaDeviceSynchronize");
    run_everything();
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    default: return "cudaErrorUnknown";
    }
}
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    default: return "unknown error (cudasim)";
    }
}

// ---------------------------------------------------------------------------------------------
// Memory

cudaError_t cudaMalloc(void **p, size_t n) {
    API_ENTER("cudaMalloc");
    return dev_alloc(p, n, false);
}
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t) {
    API_ENTER("cudaMallocAsync");
    return dev_alloc(p, n, true);
}
cudaError_t cudaFree(void *p) {
    API_ENTER("cudaFree");
    run_everything();  // cudaFree synchronises the device
    if (!p) return cudaSuccess;
    dev_release(alloc_for_free(p, "cudaFree"));
    pool_trim();
    return cudaSuccess;
}
cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
    API_ENTER("cudaFreeAsync");
    if (!p) return cudaSuccess;
    Alloc *a = alloc_for_free(p, "cudaFreeAsync");
    enqueue(s, "cudaFreeAsync", [a] { dev_release(a); }, false);
    return cudaSuccess;
}
// The default pool (one for every device: see the accounting above). Attributes: the release
// threshold (cuuint64_t), and reading the reserved and used bytes; the others are not modelled.
static int pool_handle;
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *p, int d) {
    if (!p) return set_error(cudaErrorInvalidValue);
    if (d < 0 || d >= device_count()) return set_error(cudaErrorInvalidDevice);
    *p = (cudaMemPool_t)&pool_handle;
    return cudaSuccess;
}
static bool pool_ok(cudaMemPool_t p) { return p == (cudaMemPool_t)&pool_handle; }
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t p, enum cudaMemPoolAttr a, void *v) {
    API_ENTER("cudaMemPoolSetAttribute");
    if (!pool_ok(p) || !v) return set_error(cudaErrorInvalidValue);
    if (a != cudaMemPoolAttrReleaseThreshold) {
        fprintf(stderr, "cudasim: cudaMemPoolSetAttribute: attribute %d is not modelled\n", (int)a);
        return set_error(cudaErrorInvalidValue);
    }
    memcpy(&pool_threshold, v, sizeof pool_threshold);
    return cudaSuccess;
}
cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t p, enum cudaMemPoolAttr a, void *v) {
    API_ENTER("cudaMemPoolGetAttribute");
    if (!pool_ok(p) || !v) return set_error(cudaErrorInvalidValue);
    uint64_t x;
    switch (a) {
    case cudaMemPoolAttrReleaseThreshold: x = pool_threshold; break;
    case cudaMemPoolAttrReservedMemCurrent: x = pool_reserved; break;
    case cudaMemPoolAttrUsedMemCurrent: x = pool_in_use; break;
    default:
        fprintf(stderr, "cudasim: cudaMemPoolGetAttribute: attribute %d is not modelled\n", (int)a);
        return set_error(cudaErrorInvalidValue);
    }
    memcpy(v, &x, sizeof x);
    return cudaSuccess;
}
// "Allocations that have been asynchronously freed but whose completion has not been observed on
// the host (eg. by a synchronize) can count as outstanding": here a queued cudaFreeAsync that has
// not run holds its bytes.
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t p, size_t keep) {
    API_ENTER("cudaMemPoolTrimTo");
    if (!pool_ok(p)) return set_error(cudaErrorInvalidValue);
    pool_trim_to(keep);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *f, size_t *t) {
    API_ENTER("cudaMemGetInfo");
    *t = DEVICE_BYTES;
    *f = DEVICE_BYTES - plain_bytes - pool_reserved;
    return cudaSuccess;
}
// Pinned host memory: plain host memory here, remembered so that cudaPointerGetAttributes calls
// it pinned (cudaMemoryTypeHost), as the driver does. cudaFreeHost waits for the device first.
static std::set<const void *> pinned;
cudaError_t cudaMallocHost(void **p, size_t n) {
    API_ENTER("cudaMallocHost");
    *p = aligned_alloc(256, (n + 255) / 256 * 256);
    if (!*p) return cudaErrorMemoryAllocation;
    pinned.insert(*p);
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void *p) {
    API_ENTER("cudaFreeHost");
    run_everything();
    if (!p) return cudaSuccess;
    if (!pinned.erase(p)) fail("cudaFreeHost of %p, which cudaMallocHost did not give", p);
    free(p);
    return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *a, const void *p) {
    API_ENTER("cudaPointerGetAttributes");
    memset(a, 0, sizeof *a);
    if (device_alloc_of(p)) {
        a->type = cudaMemoryTypeDevice;
        a->device = 0;
        a->devicePointer = (void *)p;
    } else if (pinned.count(p)) {
        a->type = cudaMemoryTypeHost;
        a->device = 0;
        a->hostPointer = (void *)p;
    } else {
        a->type = cudaMemoryTypeUnregistered;
        a->device = -2;
    }
    return cudaSuccess;
}
cudaError_t cudaGetSymbolAddress(void **p, const void *sym) {
    *p = (void *)sym;  // __device__ variables are host variables here
    return cudaSuccess;
}

static cudaMemcpyKind resolve_kind(void *d, const void *s, cudaMemcpyKind k) {
    if (k != cudaMemcpyDefault) return k;
    bool dd = find_mapping(d), sd = find_mapping(s);
    return dd ? (sd ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
              : (sd ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
}

// The checks every copy gets, then the copy as a stream item.
static std::function<void()> copy_item(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t st = 0,
                                       bool watch = false) {
    k = resolve_kind(d, s, k);
    const bool dd = k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice;
    const bool sd = k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice;
    check_range(d, n, dd, "destination");
    check_range(s, n, sd, "source");
    if (k == cudaMemcpyHostToDevice) {  // the source is read now (staged, as for pageable memory)
        auto staged = std::make_shared<std::vector<char>>((const char *)s, (const char *)s + n);
        return [d, staged] { memcpy(d, staged->data(), staged->size()); };
    }
    if (k == cudaMemcpyDeviceToHost && watch && hostwatch_on()) {
        Stream *q = stream_of(st);
        char what[256];
        snprintf(what, sizeof what, "a cudaMemcpyAsync of %zu bytes from device %p (device to host, queued on stream %p%s%s%s)",
                 n, s, (void *)st, q->last_kernel.empty() ? "" : " after kernel '", q->last_kernel.c_str(),
                 q->last_kernel.empty() ? "" : "'");
        Watch *w = watch_add(d, n, what);
        return [d, s, n, w] {
            watch_remove(w);
            memmove(d, s, n);
        };
    }
    return [d, s, n] { memmove(d, s, n); };
}

cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t st) {
    API_ENTER("cudaMemcpyAsync");
    if (n) enqueue(st, "cudaMemcpyAsync", copy_item(d, s, n, k, st, deferred()), false);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind k) {
    API_ENTER("cudaMemcpy");
    run_legacy();  // a legacy-stream call: after the blocking streams' work, not the non-blocking ones'
    if (n) enqueue(0, "cudaMemcpy", copy_item(d, s, n, k), true);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st) {
    API_ENTER("cudaMemsetAsync");
    check_range(d, n, true, "destination");
    if (n) enqueue(st, "cudaMemsetAsync", [d, v, n] { memset(d, v, n); }, false);
    return cudaSuccess;
}
cudaError_t cudaMemset(void *d, int v, size_t n) {
    API_ENTER("cudaMemset");
    run_legacy();
    check_range(d, n, true, "destination");
    if (n) enqueue(0, "cudaMemset", [d, v, n] { memset(d, v, n); }, true);
    return cudaSuccess;
}

// ---------------------------------------------------------------------------------------------
// Streams and events

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    API_ENTER("cudaStreamCreateWithFlags");
    Stream *st = new Stream;
    st->blocking = !(flags & cudaStreamNonBlocking);
    streams.push_back(st);
    *s = (cudaStream_t)st;
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    API_ENTER("cudaStreamDestroy");
    if (!s) return set_error(cudaErrorInvalidResourceHandle);
    Stream *st = (Stream *)s;
    run_all(st);  // its work completes first, as the driver does
    for (auto it = streams.begin(); it != streams.end(); ++it)
        if (*it == st) {
            streams.erase(it);
            delete st;
            return cudaSuccess;
        }
    return set_error(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    API_ENTER("cudaStreamSynchronize");
    if (s) run_all(stream_of(s));
    else run_legacy();
    pool_trim();
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
    API_ENTER("cudaStreamWaitEvent");
    Event *ev = (Event *)e;
    if (!ev) return set_error(cudaErrorInvalidResourceHandle);
    if (!ev->s) return cudaSuccess;  // never recorded: nothing to wait for
    Stream *from = ev->s;
    uint64_t at = ev->at;
    enqueue(s, "cudaStreamWaitEvent", [from, at] { run_until(from, at); }, false);
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    Event *ev = new Event;
    ev->timing = !(flags & cudaEventDisableTiming);
    *e = (cudaEvent_t)ev;
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    API_ENTER("cudaEventDestroy");
    delete (Event *)e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    API_ENTER("cudaEventRecord");
    Event *ev = (Event *)e;
    ev->s = stream_of(s);
    ev->told_not_ready = false;
    ev->stamp.reset();
    if (ev->timing) {  // the time the emulated stream gets there: an item of its own
        auto stamp = std::make_shared<double>(-1.0);
        ev->stamp = stamp;
        enqueue(s, "cudaEventRecord", [stamp] {
            struct timespec t;
            clock_gettime(CLOCK_MONOTONIC, &t);
            *stamp = (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
        }, false);
    }
    ev->at = ev->s->queued;
    return cudaSuccess;
}
// Milliseconds between two completed timing events, as the host clock saw the emulated stream
// reach them: CPU-emulated, meaningless as GPU time, but ordered and additive as the real one.
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    API_ENTER("cudaEventElapsedTime");
    Event *x = (Event *)a, *y = (Event *)b;
    if (!x || !y || !ms) return set_error(cudaErrorInvalidValue);
    if (!x->timing || !y->timing || !x->stamp || !y->stamp) return set_error(cudaErrorInvalidResourceHandle);
    if (*x->stamp < 0 || *y->stamp < 0) return set_error(cudaErrorNotReady);
    *ms = (float)(*y->stamp - *x->stamp);
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    API_ENTER("cudaEventSynchronize");
    Event *ev = (Event *)e;
    if (ev->s) run_until(ev->s, ev->at);
    pool_trim();
    return cudaSuccess;
}
// Deferred mode: the owner thread's first query of pending work runs it and says "not ready",
// as a busy device would; another thread (a watchdog) only looks.
cudaError_t cudaEventQuery(cudaEvent_t e) {
    API_ENTER("cudaEventQuery");
    Event *ev = (Event *)e;
    if (!ev->s || ev->s->done >= ev->at) return cudaSuccess;
    if (pthread_equal(pthread_self(), owner)) {
        run_until(ev->s, ev->at);
        if (!ev->told_not_ready) {
            ev->told_not_ready = true;
            return cudaErrorNotReady;
        }
        return cudaSuccess;
    }
    return cudaErrorNotReady;
}

}  // extern "C"

// ---------------------------------------------------------------------------------------------
// For the library stand-ins (cublaslt.cc, nccl.cc)

namespace cudasim {
void lib_enter() { mu.lock(); lock_owner(); }
void lib_leave() { mu.unlock(); }
void lib_open(const void *p) {
    if (Alloc *a = find_mapping(p)) open_alloc(a);
}
void lib_check_device(const void *p, size_t n, const char *role) { check_range(p, n, true, role); }
void lib_enqueue(cudaStream_t s, const char *name, std::function<void()> fn, bool now) { enqueue(s, name, std::move(fn), now); }
}  // namespace cudasim
