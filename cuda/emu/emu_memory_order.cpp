// emu_memory_order.cpp: memory ordering across the CTAs of a launch in the CUDA emulation
// (docs/gpu-emulation.md, "Memory ordering"): __threadfence, loads through L2 (__ldcg), and the
// test-only mutations that delete one barrier, fence or L2 load of a function, so a test can show
// that a program with the site deleted goes wrong under some scheduling seed.
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <unordered_map>
#include <string>
#include <vector>

#include "cuda/emu/emu.h"
#include "cuda/emu/emu_internal.h"

namespace emu {

namespace {

struct Mutation {
    std::string function;
    Site kind = Site::Barrier;
    int ordinal = 0;
};
std::vector<Mutation> mutations;
// The sites of a kind in a mutated function reached so far, in the order first reached.
std::map<std::pair<std::string, Site>, std::vector<int>> site_lines;
bool env_read = false;

const char* site_name(Site s) { return s == Site::Barrier ? "barrier" : s == Site::Fence ? "fence" : "ldcg"; }

// FP8RL_EMU_MUTATION=FUNCTION:KIND:N[,...], read once; a malformed value stops the program with the rule.
void read_env() {
    env_read = true;
    const char* v = getenv("FP8RL_EMU_MUTATION");
    if (!v || !*v) return;
    std::string all = v;
    for (size_t from = 0; from <= all.size();) {
        size_t comma = all.find(',', from);
        if (comma == std::string::npos) comma = all.size();
        const std::string s = all.substr(from, comma - from);
        from = comma + 1;
        size_t a = s.find(':'), b = a == std::string::npos ? a : s.find(':', a + 1);
        const std::string kind = b == std::string::npos ? "" : s.substr(a + 1, b - a - 1);
        char* end = nullptr;
        long n = b == std::string::npos ? -1 : strtol(s.c_str() + b + 1, &end, 10);
        if (a == 0 || n < 0 || !end || *end || (kind != "barrier" && kind != "fence" && kind != "ldcg")) {
            fprintf(stderr, "CUDA emulation: FP8RL_EMU_MUTATION=%s: \"%s\" is not FUNCTION:KIND:N with KIND barrier, "
                            "fence or ldcg and N >= 0 (e.g. last_block_sum_kernel:barrier:0)\n", v, s.c_str());
            exit(2);
        }
        add_mutation(s.substr(0, a), kind == "barrier" ? Site::Barrier : kind == "fence" ? Site::Fence : Site::LoadCg, (int)n);
    }
}

}  // namespace

void add_mutation(const std::string& function, Site kind, int ordinal) {
    if (!env_read) read_env();
    Mutation m;
    m.function = function, m.kind = kind, m.ordinal = ordinal;
    mutations.push_back(m);
    fprintf(stderr, "CUDA emulation: mutation: %s %d of %s deleted\n", site_name(kind), ordinal, function.c_str());
}

void clear_mutations() {
    env_read = true;
    mutations.clear();
    site_lines.clear();
}

bool mutated(Site kind, const char* func, int line) {
    if (!env_read) read_env();
    int site = -1;
    for (const Mutation& m : mutations) {
        // the name without template arguments (__builtin_FUNCTION, which names __ldcg's caller, has them)
        const size_t n = m.function.size();
        if (kind != m.kind || m.function.compare(0, n, func, strnlen(func, n)) != 0 || (func[n] != '\0' && func[n] != '<'))
            continue;
        if (site < 0) {
            std::vector<int>& lines = site_lines[{m.function, kind}];
            site = (int)(std::find(lines.begin(), lines.end(), line) - lines.begin());
            if (site == (int)lines.size()) lines.push_back(line);
        }
        if (site == m.ordinal) return true;
    }
    return false;
}

// ---------------------------------------------------------------------------------------------
// The visibility model (docs/gpu-emulation.md, "Memory ordering"). Plain stores are host stores
// the emulation cannot see, so it watches the words that loads it sees (__ldcg, a mutated plain
// load) read: a kernel's watch set, learned in its seeded launches and kept for the
// next. At every switch between CTAs the words that changed are the last CTA's writes; each
// is kept with the value before it and the CTA's fence count when its run began (a fence of that
// CTA after it, by any of its threads, releases it: lenient, never stricter than the PTX model).
// An atomic carries its CTA's fence count to the address (a release pattern: fence, then the
// atomic); an atomic that reads the address acquires what every CTA released there. A load that
// the emulation sees, of a word another CTA wrote in this launch, returns the value before the
// write unless its CTA acquired the write's release: through L2 (__ldcg) after the atomic, a
// plain load only after a fence that follows the atomic (a stale L1 line is possible until then).
namespace {

constexpr size_t MAX_WATCHED_BYTES = 1u << 20;  // per kernel

struct Watch {
    std::map<uintptr_t, uintptr_t> ranges;  // [begin, end) of 4-byte words, merged
    size_t bytes = 0;
};
std::map<const void*, Watch> watches;  // per kernel (its KernelInfo)

struct Written {
    long cta = -1;       // the CTA that wrote the word in this launch, -1: none
    uint32_t epoch = 0;  // its fence count when the run that wrote it began
    uint32_t before = 0; // the word before the write
};
struct WatchedRange {
    uintptr_t begin, end;
    std::vector<uint32_t> shadow;  // the words as last seen at a switch
    std::vector<Written> written;
};
struct CtaState {
    uint32_t fences = 0, run_epoch = 0;
    std::unordered_map<long, uint32_t> acquired, acquired_fenced;  // per releasing CTA: its fence count released
    uint32_t plain_tag = 0, plain_tag_fences = 0;  // its tag for plain writes (below), made at that fence count
};

struct Launch {
    bool active = false;
    Watch* watch = nullptr;
    std::vector<WatchedRange> ranges;
    std::unordered_map<long, CtaState> ctas;
    std::unordered_map<uintptr_t, std::unordered_map<long, uint32_t>> released;  // per atomic address
    long running = -1;  // the CTA whose run the words changed since the last switch belong to
    bool reported = false;
} grid_state;

// Plain loads and stores of the kernels compiled with g++'s -fsanitize=thread instrumentation (the
// emulated GPU tests: the Makefile's EMU_PLAIN_ACCESS_FLAGS). It calls __tsan_read* / __tsan_write*
// before every load and store; the callbacks at the end of this file take libtsan's place. In a
// seeded launch (CTAs at once, or one at a time in the seeded order), each 4-byte word of the
// device arena has a shadow: the tag of the CTA (and its fence count) that last wrote it in a
// plain or volatile store, and which of its bytes. A load of a word that another CTA wrote in
// this launch, whose write the loading CTA has not acquired (the rules above: a plain load needs a
// fence after the atomic, a volatile one, strong, does not), is a data race: the kernel faults,
// naming it. The callbacks run before the access, so the load cannot be made stale; the fault is
// the report.
struct PlainTag {
    long cta;
    uint32_t fences;  // the CTA's fence count when it took the tag
};
struct PlainWatch {  // scalars only: constant-initialized, as __tsan_init may run before this file's constructors
    bool instrumented = false;  // some translation unit calls the callbacks (its constructor called __tsan_init)
    // arena_bytes while a seeded launch runs, else 0: an access outside the arena, or outside such a
    // launch, costs the callback one compare (the instrumented tests call it before every access)
    size_t checked_bytes = 0;
    uintptr_t arena = 0;
    size_t arena_bytes = 0;
    uint32_t* shadow = nullptr;  // per word: tag << 4 | the bytes written
    uint32_t next_tag = 1, first_tag = 1;  // the tags from first_tag are this launch's
    uint32_t tag = 0;                      // the running CTA's
} plain;
std::vector<PlainTag> plain_tags;  // [tag - first_tag]
constexpr uint32_t MAX_TAG = (1u << 28) - 1;

bool plain_active() { return plain.checked_bytes != 0; }

void plain_begin() {
    if (!plain.instrumented) return;
    if (!plain.shadow) {
        plain.arena = (uintptr_t)device_arena(&plain.arena_bytes);
        void* p = mmap(nullptr, plain.arena_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
            perror("CUDA emulation: cannot reserve the shadow of the device memory arena");
            abort();
        }
        plain.shadow = (uint32_t*)p;
    }
    if (plain.next_tag > MAX_TAG / 2) {  // every old tag forgotten: the shadow's pages drop to zeros
        madvise(plain.shadow, plain.arena_bytes, MADV_DONTNEED);
        plain.next_tag = 1;
    }
    plain.first_tag = plain.next_tag;
    plain.tag = 0;
    plain_tags.clear();
    plain.checked_bytes = plain.arena_bytes;
}

// The running CTA `cta` takes a new tag: its first run, or its fence count changed.
void plain_retag(long cta, CtaState& c) {
    c.plain_tag = plain.next_tag++;
    c.plain_tag_fences = c.fences;
    plain_tags.push_back({cta, c.fences});
    plain.tag = c.plain_tag;
}

__attribute__((noinline)) void plain_store_at(uintptr_t off, size_t bytes) {
    const uintptr_t end = std::min<uintptr_t>(off + bytes, plain.arena_bytes);
    for (uintptr_t a = off; a < end;) {
        const uintptr_t n = std::min<uintptr_t>(4 - a % 4, end - a);
        const uint32_t mask = ((1u << n) - 1) << (a % 4);
        uint32_t& e = plain.shadow[a / 4];
        e = (e >> 4) == plain.tag ? e | mask : plain.tag << 4 | mask;
        a += n;
    }
}

inline void plain_store(uintptr_t p, size_t bytes) {
    const uintptr_t off = p - plain.arena;
    if (__builtin_expect(off < plain.checked_bytes, 0)) plain_store_at(off, bytes);
}

void plain_race(uintptr_t word, const PlainTag& w, bool strong) {
    const long me = grid_state.running;
    const CtaState& c = grid_state.ctas[me];
    const auto& seen = strong ? c.acquired : c.acquired_fenced;
    auto it = seen.find(w.cta);
    if (it != seen.end() && it->second > w.fences) return;  // released, then acquired
    fault_at_next_wait(strformat(
        "a data race: a %s load by CTA %ld of %p, which CTA %ld wrote in this launch without a release this CTA "
        "acquired (the rule, PTX ISA 8.8-8.9: the writer's __threadfence after the write, an atomic that the "
        "reader's atomic reads%s; a load through L2, __ldcg, is modelled instead)",
        strong ? "volatile" : "plain", me, (const void*)word, w.cta, strong ? "" : ", then a __threadfence before a plain load"));
}

__attribute__((noinline)) void plain_load_at(uintptr_t off, size_t bytes, bool strong) {
    const uintptr_t end = std::min<uintptr_t>(off + bytes, plain.arena_bytes);
    for (uintptr_t a = off; a < end;) {
        const uintptr_t n = std::min<uintptr_t>(4 - a % 4, end - a);
        const uint32_t e = plain.shadow[a / 4], tag = e >> 4;
        if (tag >= plain.first_tag && (e & (((1u << n) - 1) << (a % 4)))) {
            const PlainTag& w = plain_tags[tag - plain.first_tag];
            if (w.cta != grid_state.running) plain_race(plain.arena + a / 4 * 4, w, strong);
        }
        a += n;
    }
}

inline void plain_load(uintptr_t p, size_t bytes, bool strong) {
    const uintptr_t off = p - plain.arena;
    if (__builtin_expect(off < plain.checked_bytes, 0)) plain_load_at(off, bytes, strong);
}

void learn(uintptr_t p, size_t bytes) {
    Watch& w = *grid_state.watch;
    uintptr_t begin = p & ~(uintptr_t)3, end = (p + bytes + 3) & ~(uintptr_t)3;
    auto it = w.ranges.upper_bound(begin);
    if (it != w.ranges.begin() && std::prev(it)->second >= end) return;  // known
    if (w.bytes + (end - begin) > MAX_WATCHED_BYTES) return;
    if (it != w.ranges.begin() && std::prev(it)->second >= begin) begin = (--it)->first, end = std::max(end, it->second);
    while (it != w.ranges.end() && it->first <= end) {
        end = std::max(end, it->second);
        w.bytes -= it->second - it->first;
        it = w.ranges.erase(it);
    }
    w.ranges[begin] = end;
    w.bytes += end - begin;
}

WatchedRange* range_of(uintptr_t word) {
    for (WatchedRange& r : grid_state.ranges)
        if (word >= r.begin && word < r.end) return &r;
    return nullptr;
}

// The words that changed since the last switch: the writes of the CTA that ran.
void attribute() {
    if (grid_state.running < 0) return;
    const uint32_t epoch = grid_state.ctas[grid_state.running].run_epoch;
    for (WatchedRange& r : grid_state.ranges) {
        const uint32_t* now = (const uint32_t*)r.begin;
        if (memcmp(now, r.shadow.data(), r.end - r.begin) == 0) continue;
        for (size_t i = 0; i < r.shadow.size(); i++)
            if (now[i] != r.shadow[i]) {
                r.written[i] = {grid_state.running, epoch, r.shadow[i]};
                r.shadow[i] = now[i];
            }
    }
}

}  // namespace

bool plain_accesses_checked() { return plain.instrumented; }

void memory_order_begin(const void* kernel, int resident) {
    grid_state = Launch();
    if (resident < 1) return;
    grid_state.active = true;
    plain_begin();
    grid_state.watch = &watches[kernel];
    for (auto it = grid_state.watch->ranges.begin(); it != grid_state.watch->ranges.end();) {
        if (!on_device((const void*)it->first, it->second - it->first)) {  // freed since
            grid_state.watch->bytes -= it->second - it->first;
            it = grid_state.watch->ranges.erase(it);
            continue;
        }
        WatchedRange r{it->first, it->second, {}, {}};
        r.shadow.assign((const uint32_t*)r.begin, (const uint32_t*)r.end);
        r.written.assign(r.shadow.size(), Written());
        grid_state.ranges.push_back(std::move(r));
        ++it;
    }
}

void memory_order_end() {
    grid_state = Launch();
    plain.checked_bytes = 0;
}

void memory_order_switch(long cta) {
    if (!grid_state.active || cta == grid_state.running) return;
    attribute();
    grid_state.running = cta;
    CtaState& c = grid_state.ctas[cta];
    c.run_epoch = c.fences;
    if (!plain_active()) return;
    if (c.plain_tag == 0 || c.plain_tag_fences != c.fences) plain_retag(cta, c);
    else plain.tag = c.plain_tag;
}

void thread_fence(const char* func, int line) {
    if (mutated(Site::Fence, func, line)) return;
    if (grid_state.active) {
        CtaState& c = grid_state.ctas[current_cta()];
        c.fences++;
        c.acquired_fenced = c.acquired;
        if (plain_active()) plain_retag(current_cta(), c);
    }
    fence_point();
}

void memory_order_atomic(void* address, size_t) {
    if (!grid_state.active || (grid_state.ranges.empty() && !plain_active())) return;
    const long me = current_cta();
    CtaState& c = grid_state.ctas[me];
    auto& rel = grid_state.released[(uintptr_t)address];
    for (const auto& [cta, fences] : rel) {
        uint32_t& a = c.acquired[cta];
        a = std::max(a, fences);
    }
    uint32_t& mine = rel[me];
    mine = std::max(mine, c.fences);
}

void load_global(void* out, const void* p, size_t bytes, bool through_l2, const char* func, int line) {
    note_sync_across_ctas();
    if (through_l2 && mutated(Site::LoadCg, func, line)) through_l2 = false;
    memcpy(out, p, bytes);
    if (!grid_state.active || (uintptr_t)p % 4 || bytes % 4) return;
    learn((uintptr_t)p, bytes);
    const long me = current_cta();
    CtaState& c = grid_state.ctas[me];
    for (size_t k = 0; k < bytes / 4; k++) {
        const uintptr_t word = (uintptr_t)p + 4 * k;
        WatchedRange* r = range_of(word);
        if (!r) continue;
        const size_t i = (word - r->begin) / 4;
        const Written& w = r->written[i];
        if (r->shadow[i] != ((const uint32_t*)p)[k] || w.cta < 0 || w.cta == me) continue;  // its own or none this launch
        const auto& seen = through_l2 ? c.acquired : c.acquired_fenced;
        auto it = seen.find(w.cta);
        if (it != seen.end() && it->second > w.epoch) continue;  // released, then acquired
        memcpy((char*)out + 4 * k, &w.before, 4);
        if (!grid_state.reported)
            fprintf(stderr, "CUDA emulation: %s: a %s load by CTA %ld of %p, which CTA %ld wrote in this launch without a "
                            "release that CTA acquired (the rule: a fence between the write and an atomic that the "
                            "reader's atomic reads%s), returns the value before the write\n",
                    current_kernel_name(), through_l2 ? "__ldcg" : "plain", me, (const void*)word, w.cta,
                    through_l2 ? "" : ", then a fence before a plain load");
        grid_state.reported = true;
    }
}

}  // namespace emu

// The callbacks of g++'s -fsanitize=thread instrumentation (libtsan's interface, which is not linked):
// loads and stores of 1-16 bytes, aligned or not, volatile, ranges (struct copies); the atomics of
// host code in an instrumented translation unit run as the builtins they replace, sequentially
// consistent; the rest does nothing.
extern "C" {
void __tsan_init() { emu::plain.instrumented = true; }
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}
void __tsan_read_range(void* p, size_t bytes) { emu::plain_load((uintptr_t)p, bytes, false); }
void __tsan_write_range(void* p, size_t bytes) { emu::plain_store((uintptr_t)p, bytes); }
#define EMU_TSAN_ACCESS(N)                                                                                  \
    void __tsan_read##N(void* p) { emu::plain_load((uintptr_t)p, N, false); }                              \
    void __tsan_unaligned_read##N(void* p) { emu::plain_load((uintptr_t)p, N, false); }                    \
    void __tsan_volatile_read##N(void* p) { emu::plain_load((uintptr_t)p, N, true); }                      \
    void __tsan_unaligned_volatile_read##N(void* p) { emu::plain_load((uintptr_t)p, N, true); }            \
    void __tsan_write##N(void* p) { emu::plain_store((uintptr_t)p, N); }                                   \
    void __tsan_unaligned_write##N(void* p) { emu::plain_store((uintptr_t)p, N); }                         \
    void __tsan_volatile_write##N(void* p) { emu::plain_store((uintptr_t)p, N); }                          \
    void __tsan_unaligned_volatile_write##N(void* p) { emu::plain_store((uintptr_t)p, N); }
EMU_TSAN_ACCESS(1)
EMU_TSAN_ACCESS(2)
EMU_TSAN_ACCESS(4)
EMU_TSAN_ACCESS(8)
EMU_TSAN_ACCESS(16)
#undef EMU_TSAN_ACCESS
#define EMU_TSAN_ATOMIC(N, T)                                                                               \
    T __tsan_atomic##N##_load(const volatile T* a, int) { return __atomic_load_n(a, __ATOMIC_SEQ_CST); }   \
    void __tsan_atomic##N##_store(volatile T* a, T v, int) { __atomic_store_n(a, v, __ATOMIC_SEQ_CST); }   \
    T __tsan_atomic##N##_exchange(volatile T* a, T v, int) { return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST); } \
    T __tsan_atomic##N##_fetch_add(volatile T* a, T v, int) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); } \
    T __tsan_atomic##N##_fetch_sub(volatile T* a, T v, int) { return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST); } \
    T __tsan_atomic##N##_fetch_and(volatile T* a, T v, int) { return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST); } \
    T __tsan_atomic##N##_fetch_or(volatile T* a, T v, int) { return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); }   \
    T __tsan_atomic##N##_fetch_xor(volatile T* a, T v, int) { return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST); } \
    T __tsan_atomic##N##_fetch_nand(volatile T* a, T v, int) { return __atomic_fetch_nand(a, v, __ATOMIC_SEQ_CST); } \
    bool __tsan_atomic##N##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) {                  \
        return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);            \
    }                                                                                                       \
    bool __tsan_atomic##N##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) {                    \
        return __atomic_compare_exchange_n(a, c, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);             \
    }                                                                                                       \
    T __tsan_atomic##N##_compare_exchange_val(volatile T* a, T c, T v, int, int) {                         \
        __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                  \
        return c;                                                                                           \
    }
EMU_TSAN_ATOMIC(8, uint8_t)
EMU_TSAN_ATOMIC(16, uint16_t)
EMU_TSAN_ATOMIC(32, uint32_t)
EMU_TSAN_ATOMIC(64, uint64_t)
#undef EMU_TSAN_ATOMIC
void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
}
