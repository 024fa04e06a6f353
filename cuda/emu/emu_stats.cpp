// emu_stats.cpp: the profile's statistics in emulation (cuda/emu/emu.h): what the host issued inside
// each range of cuda/perf/profile_range.h's PROFILE_RANGE, and in all, counted as the runtime
// (cuda/emu/emu_runtime.cpp) and the emulated cuBLASLt issue it; with FP8RL_EMU_STATS=FILE, one
// JSON object written to FILE at exit:
//   {"ranges": {NAME: {"calls", "kernel_launches", "gemm_calls", "host_syncs", "h2d_copies",
//    "d2h_copies", "memset_bytes", "graph_launches", "kernels": {KERNEL: launches}, "ctas": {KERNEL: CTAs}}},
//    "total": {...}}
// Like the rest of the runtime it serves one host thread.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda/emu/emu.h"
#include "cuda/emu/emu_internal.h"

namespace emu {
namespace {

struct Range {
    RangeStats stats;                                  // stats.kernels is filled when read
    std::unordered_map<const char*, uint64_t> kernels;  // by LAUNCH_KERNEL's literal: no string built per launch
    std::unordered_map<const char*, uint64_t> ctas;     // the launches' CTAs, alike
    int depth = 0;                                     // how many times it is open now
};

const char* const stats_file = getenv("FP8RL_EMU_STATS");
bool counting = stats_file && *stats_file;
std::map<std::string, Range> ranges;  // node-based: the pointers below stay valid
Range total;
std::vector<Range*> stack;  // one entry per range_push (null: pushed while not counting)
std::vector<Range*> open;   // each open range once

void add(Range& r, const Counted& what) {
    RangeStats& s = r.stats;
    switch (what.kind) {
        case Counted::Nothing: break;
        case Counted::Kernel: s.kernel_launches++, r.kernels[what.kernel]++, r.ctas[what.kernel] += what.ctas; break;
        case Counted::Gemm: s.gemm_calls++; break;
        case Counted::HostToDevice: s.h2d_copies++; break;
        case Counted::DeviceToHost: s.d2h_copies++; break;
        case Counted::Memset: s.memset_bytes += what.bytes; break;
    }
}

// "(rmsnorm_forward_kernel<In, Out>)" -> "rmsnorm_forward_kernel": the template arguments LAUNCH_KERNEL
// sees are the launcher's parameter names, noise in a profile.
std::string kernel_name(const char* expression) {
    std::string s = expression;
    s = s.substr(0, s.find('<'));
    s.erase(std::remove_if(s.begin(), s.end(), [](char c) { return c == '(' || c == ')' || c == ' '; }), s.end());
    const size_t scope = s.rfind("::");
    return scope == std::string::npos ? s : s.substr(scope + 2);
}

RangeStats read(const Range& r) {
    RangeStats s = r.stats;
    for (const auto& k : r.kernels) s.kernels[kernel_name(k.first)] += k.second;
    for (const auto& k : r.ctas) s.ctas[kernel_name(k.first)] += k.second;
    return s;
}

void write_stats(FILE* f, const RangeStats& s) {
    fprintf(f, "{\"calls\": %llu, \"kernel_launches\": %llu, \"gemm_calls\": %llu, \"host_syncs\": %llu, \"h2d_copies\": %llu, "
            "\"d2h_copies\": %llu, \"memset_bytes\": %llu, \"graph_launches\": %llu, \"kernels\": {",
            (unsigned long long)s.calls, (unsigned long long)s.kernel_launches, (unsigned long long)s.gemm_calls,
            (unsigned long long)s.host_syncs, (unsigned long long)s.h2d_copies, (unsigned long long)s.d2h_copies,
            (unsigned long long)s.memset_bytes, (unsigned long long)s.graph_launches);
    for (const auto* per_kernel : {&s.kernels, &s.ctas}) {
        const char* sep = "";
        for (const auto& k : *per_kernel) fprintf(f, "%s\"%s\": %llu", sep, k.first.c_str(), (unsigned long long)k.second), sep = ", ";
        fputs(per_kernel == &s.kernels ? "}, \"ctas\": {" : "}}", f);
    }
}

// At exit (names are identifiers and string literals of the engine's code: nothing to escape).
void write_file() {
    FILE* f = fopen(stats_file, "w");
    if (!f) {
        fprintf(stderr, "CUDA emulation: FP8RL_EMU_STATS=%s: cannot write the file\n", stats_file);
        return;
    }
    fprintf(f, "{\"ranges\": {");
    const char* sep = "";
    for (const auto& r : ranges) {
        fprintf(f, "%s\n  \"%s\": ", sep, r.first.c_str());
        write_stats(f, read(r.second));
        sep = ",";
    }
    fprintf(f, "},\n \"total\": ");
    write_stats(f, read(total));
    fprintf(f, "}\n");
    if (fclose(f) != 0) fprintf(stderr, "CUDA emulation: FP8RL_EMU_STATS=%s: writing the file failed\n", stats_file);
}

// Registered after the counters above are constructed, so it runs before they are destroyed.
struct AtStart {
    AtStart() {
        total.stats.calls = 1;
        if (counting) atexit(write_file);
    }
} at_start;

}  // namespace

void count(const Counted& what) {
    if (!counting) return;
    add(total, what);
    for (Range* r : open) add(*r, what);
}
void count_host_sync() {
    if (!counting) return;
    total.stats.host_syncs++;
    for (Range* r : open) r->stats.host_syncs++;
}
void count_graph_launch() {
    if (!counting) return;
    total.stats.graph_launches++;
    for (Range* r : open) r->stats.graph_launches++;
}

void range_push(const char* name) {
    if (!counting) return stack.push_back(nullptr);
    Range* r = &ranges[name];
    if (r->depth++ == 0) {
        if (!capturing()) r->stats.calls++;  // in a capture nothing runs: not a call
        open.push_back(r);
    }
    stack.push_back(r);
}
void range_pop() {
    if (stack.empty()) kernel_fault("range_pop without a range_push (PROFILE_RANGE)");
    Range* r = stack.back();
    stack.pop_back();
    if (r && --r->depth == 0) open.erase(std::find(open.begin(), open.end(), r));
}

void start_stats() {
    for (auto& r : ranges) r.second.stats = RangeStats(), r.second.kernels.clear(), r.second.ctas.clear();
    total = Range();
    total.stats.calls = 1;
    counting = true;
}
void stop_stats() { counting = false; }

RangeStats range_stats(const std::string& name) {
    const auto it = ranges.find(name);
    return it == ranges.end() ? RangeStats() : read(it->second);
}
RangeStats total_stats() { return read(total); }

}  // namespace emu
