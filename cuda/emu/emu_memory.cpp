// emu_memory.cpp: the emulated device's memory (cuda/emu/emu.h). Device memory is not host memory on a
// GPU, so here it is an mmap'ed arena that host code cannot touch: PROT_NONE except while an
// ArenaOpen lives (kernels, copies, sets, library calls and collectives run inside one). A host
// dereference is a SIGSEGV that the handler below turns into one message naming the buffer.
// Under ASan the arena's bytes outside live allocations are poisoned: an overflow past the size
// asked, or a use after cudaFree, is still reported by ASan.
#include <sanitizer/asan_interface.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "cuda/emu/emu_internal.h"

namespace emu {
namespace {

constexpr size_t ALIGN = 256;  // cudaMalloc's alignment
constexpr size_t GAP = 256;    // between allocations: ASan's redzone

char* arena = nullptr;
size_t reserved = 0, top = 0;  // bytes reserved, high-water mark of what was ever handed out
int open_depth = 0;
bool left_open = false;  // open since a stream operation, until the host synchronizes
struct Allocation {
    size_t bytes;
    unsigned long long serial;  // the n-th cudaMalloc, so a message can name the buffer
};
std::map<uintptr_t, Allocation> live;   // base -> allocation
std::map<size_t, size_t> free_ranges;   // offset -> bytes, below top
std::map<uintptr_t, size_t> pinned;     // cudaMallocHost'ed: base -> bytes
size_t allocated = 0;
unsigned long long serials = 0;
struct sigaction previous_segv;

// The arena is backed by 2 MB huge pages where the kernel allows (MADV_HUGEPAGE), and opened and
// closed in whole huge pages: mprotect then rewrites one entry per 2 MB instead of 512, and a
// huge page never splits. At 4 KB pages the page-table walk of mprotect was ~20% of a rollout test.
constexpr size_t HUGE_PAGE = 2u << 20;

void protect(size_t from, size_t to, int prot) {
    from = from / HUGE_PAGE * HUGE_PAGE;
    to = std::min((to + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE, reserved);
    if (to > from && mprotect(arena + from, to - from, prot) != 0) {
        perror("CUDA emulation: mprotect of the device memory arena");
        abort();
    }
}

const std::pair<const uintptr_t, Allocation>* allocation_at(uintptr_t u, bool one_past_end) {
    auto it = live.upper_bound(u);
    if (it == live.begin()) return nullptr;
    --it;
    size_t end = it->first + it->second.bytes;
    return u < end || (one_past_end && u == end) ? &*it : nullptr;
}

void write_stderr(const char* s) {
    for (size_t n = strlen(s); n > 0;) {
        ssize_t w = write(2, s, n);
        if (w <= 0) return;
        s += w, n -= (size_t)w;
    }
}

// A host access to the arena: name the buffer and stop. Any other fault goes to the handler that
// was there before (ASan's, or the default), by returning with it restored.
void on_segv(int sig, siginfo_t* info, void* context) {
    uintptr_t u = (uintptr_t)info->si_addr;
    if (!arena || u < (uintptr_t)arena || u >= (uintptr_t)arena + reserved) {
        sigaction(SIGSEGV, &previous_segv, nullptr);
        (void)sig, (void)context;
        return;
    }
    static char msg[512];
    if (const auto* a = allocation_at(u, false))
        snprintf(msg, sizeof msg,
                 "CUDA emulation: host code touched device memory (the rule: device memory is not host memory): byte %zu "
                 "of the %zu-byte buffer of cudaMalloc #%llu at %p; only kernels, copies, sets and library calls reach it "
                 "(copy it to the host with cudaMemcpy)\n",
                 (size_t)(u - a->first), a->second.bytes, a->second.serial, (void*)a->first);
    else
        snprintf(msg, sizeof msg,
                 "CUDA emulation: host code touched device memory (the rule: device memory is not host memory) at %p, "
                 "in no live cudaMalloc'ed buffer (freed, or past the end of one)\n",
                 (void*)u);
    write_stderr(msg);
    signal(SIGABRT, SIG_DFL);
    abort();
}

void reserve_arena() {
    reserved = (2 * capacity() + (1ull << 30) + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;  // alignment, gaps, fragmentation
    // one huge page more, to start the arena on a huge page's boundary
    void* p = mmap(nullptr, reserved + HUGE_PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        perror("CUDA emulation: cannot reserve the device memory arena");
        abort();
    }
    arena = (char*)(((uintptr_t)p + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE);
    madvise(arena, reserved, MADV_HUGEPAGE);  // a hint: where the kernel refuses, 4 KB pages work the same
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &previous_segv);
}

// First fit among the freed ranges, else the top of the arena; returns the offset or SIZE_MAX.
size_t take(size_t span) {
    for (auto it = free_ranges.begin(); it != free_ranges.end(); ++it) {
        if (it->second < span) continue;
        size_t off = it->first, rest = it->second - span;
        free_ranges.erase(it);
        if (rest) free_ranges[off + span] = rest;
        return off;
    }
    if (top + span > reserved) return SIZE_MAX;
    size_t off = top;
    top += span;
    if (open_depth > 0 || left_open) protect(off, top, PROT_READ | PROT_WRITE);
    return off;
}

void give_back(size_t off, size_t span) {
    auto next = free_ranges.lower_bound(off);
    if (next != free_ranges.end() && next->first == off + span) {
        span += next->second;
        free_ranges.erase(next);
    }
    auto prev = free_ranges.lower_bound(off);
    if (prev != free_ranges.begin()) {
        --prev;
        if (prev->first + prev->second == off) {
            off = prev->first;
            span += prev->second;
            free_ranges.erase(prev);
        }
    }
    free_ranges[off] = span;
}

size_t span_of(size_t bytes) { return (bytes + ALIGN - 1) / ALIGN * ALIGN + GAP; }

}  // namespace

ArenaOpen::ArenaOpen(bool until_sync_) : until_sync(until_sync_) {
    if (open_depth++ == 0 && arena && !left_open) protect(0, top, PROT_READ | PROT_WRITE);
}
ArenaOpen::~ArenaOpen() {
    if (--open_depth > 0 || !arena) return;
    if (until_sync) {
        left_open = true;
    } else {
        protect(0, top, PROT_NONE);
        left_open = false;
    }
}

void close_arena_at_sync() {
    if (open_depth == 0 && arena && left_open) protect(0, top, PROT_NONE);
    left_open = false;
}

void keep_arena_open() {
    if (open_depth++ == 0 && arena) protect(0, top, PROT_READ | PROT_WRITE);
}

void* device_alloc(size_t bytes) {
    if (!arena) reserve_arena();
    if (bytes > capacity() - allocated) return nullptr;
    const size_t span = span_of(bytes);
    size_t off = take(span);
    if (off == SIZE_MAX) return nullptr;
    char* p = arena + off;
    ASAN_POISON_MEMORY_REGION(p, span);  // the slack and the gap after the buffer
    ASAN_UNPOISON_MEMORY_REGION(p, bytes);
    {
        ArenaOpen open;
        memset(p, 0xFF, bytes);  // NaN as FP32, BF16 and E4M3: a read of memory nobody wrote shows
    }
    live[(uintptr_t)p] = {bytes, ++serials};
    allocated += bytes;
    return p;
}

bool device_free(void* p) {
    auto it = live.find((uintptr_t)p);
    if (it == live.end()) return false;
    ASAN_POISON_MEMORY_REGION(p, it->second.bytes);
    allocated -= it->second.bytes;
    give_back((size_t)((char*)p - arena), span_of(it->second.bytes));
    live.erase(it);
    return true;
}

size_t device_allocated() { return allocated; }

bool on_device(const void* p, size_t bytes) {
    const auto* a = allocation_at((uintptr_t)p, false);
    return a && (uintptr_t)p + bytes <= a->first + a->second.bytes;
}

bool in_device_arena(const void* p) {
    return arena && (uintptr_t)p >= (uintptr_t)arena && (uintptr_t)p < (uintptr_t)arena + reserved;
}

void pinned_add(void* p, size_t bytes) { pinned[(uintptr_t)p] = bytes; }
bool pinned_remove(void* p) { return pinned.erase((uintptr_t)p) > 0; }

bool kernel_may_use(const void* p) {
    if (!p || allocation_at((uintptr_t)p, true)) return true;
    uintptr_t u = (uintptr_t)p;
    auto it = pinned.upper_bound(u);
    if (it == pinned.begin()) return false;
    --it;
    return u <= it->first + it->second;
}

bool is_device_memory(const void* p, size_t bytes) { return on_device(p, bytes); }

}  // namespace emu
