// emu_wgmma.cpp: the emulation of Hopper's warpgroup MMA (PTX ISA, "Asynchronous Warpgroup Level
// Matrix Multiply-Accumulate Instructions": wgmma.fence, wgmma.mma_async, wgmma.commit_group,
// wgmma.wait_group), the subset cuda/kernels/wgmma.cuh issues: .m64nNk16.f32.bf16.bf16, N a multiple
// of 8 up to 256, A from registers or a shared-memory matrix descriptor, B from a descriptor; and
// .m64nNk32.f32.e4m3.e4m3, A and B from descriptors, both K-major (the PTX ISA gives the FP8 types no
// imm-trans-a / imm-trans-b operands: only .f16 / .bf16 transpose, so FP8 operands are K-major).
//
// Semantics kept:
//   - asynchronous issue: wgmma.mma_async only records the operation (and, for a register A, the
//     fragment as issued); the product is computed, reading the shared-memory operands then, and
//     lands in D when the thread's wgmma.wait_group completes its group. A shared-memory operand
//     changed before that wait changes the result, as on a GPU;
//   - groups: commit_group closes the issued-and-uncommitted wgmmas into a group; wait_group N
//     completes all but the N newest groups; uncommitted wgmmas are never completed by a wait;
//   - registers: D and a register A may not be accessed by other code while a wgmma that uses them
//     is in flight (refused, cuda/emu/emu.h's WgmmaGuard), and wgmma.fence must come between such an
//     access and the wgmma.mma_async that uses the registers, and before the first (refused);
//   - .sync.aligned: the 32 lanes of a warp meet at each wgmma.mma_async (a warp collective) and must
//     issue the same instruction; the 4 warps of the warpgroup (warps 4g .. 4g + 3, all present)
//     must issue the same sequence of instructions with the same descriptors;
//   - fragments: warp w % 4 of the warpgroup owns rows 16 (w % 4) + {g, g + 8} of D (g = lane / 4,
//     t = lane % 4): register v holds D[16 (w % 4) + g + 8 ((v >> 1) & 1)][8 (v >> 2) + 2t + (v & 1)];
//     a register A fragment is the same 16x16 layout for the warp's rows (a[r] holds A[row g + 8 (r & 1)]
//     [k 8 (r >> 1) + 2t + {0, 1}], low half first), as mma.sync.m16n8k16's A;
//   - descriptors (64 bits): start address >> 4 in bits 0-13, leading byte offset (LBO) >> 4 in
//     16-29, stride byte offset (SBO) >> 4 in 32-45, base offset in 49-51, swizzle in 62-63 (0 none,
//     1 128-byte, 2 64-byte, 3 32-byte); the other bits are reserved (refused when set). Element
//     (row mn of M or N, column k) of a canonical layout, W = swizzle bytes / 16 (1 without), at
//     byte offset from the start address (CUTLASS cute/atom/mma_traits_sm90_gmma.hpp's canonical forms),
//     e the element's bytes (2 BF16, 1 E4M3), so a 16-byte core-matrix row holds 16 / e elements:
//       K-major (transpose 0): (mn % 8) 16W + (mn / 8) SBO + e (k % (16/e)) + (k / (16/e)) (W == 1 ? LBO : 16)
//       MN-major, no swizzle:  2 (mn % 8) + (mn / 8) SBO + 16 (k % 8) + (k / 8) LBO
//       MN-major, swizzled:    2 (mn % 8W) + (mn / 8W) LBO + 16W (k % 8) + (k / 8) SBO
//     then a swizzle XORs address bits 4.. with bits 7.. (log2 W bits) of the shared-window address
//     (CUTLASS's Swizzle<1|2|3,4,3>), so a swizzled operand's pattern repeats every 8 x 16W bytes.
//     An instruction's K covers 32 bytes of a row in both types (k16 BF16, k32 E4M3): with the 128-byte
//     swizzle a 128-byte row is 4 steps (one 128-wide K block of E4M3), each step's descriptor the
//     previous one's start address + 32 bytes;
//   - E4M3: each byte decodes as cuda_fp8.h's __NV_E4M3 does (rl/numerics/fp8.h's e4m3_to_float,
//     checked against cuda_fp8.h for all 256 codes by test_fp8; 0x7F / 0xFF are NaN, no Inf).
// Not emulated, refused: a nonzero base offset (so a swizzled start address must lie in the first
// 16W-byte row of its 8-row pattern: address bits 7.. of it zero), transposed register A, E4M3 with
// A in registers (the PTX ISA has it; no kernel here uses it) and .e5m2.
// Refused as the PTX ISA rules: E4M3 with a transpose (no such operand), a warpgroup whose warps
// issue different types.
// Not checked: the async-proxy fence (fence.proxy.async) that orders generic writes of shared memory
// before a wgmma reads them; commit_group and wait_group are per thread, not met by the warpgroup.
// The sum, the contract kernels built on it rely on to equal the CPU engine bit for bit: each D
// element adds the K exact FP32 products (16 BF16 or 32 E4M3 ones; a product of two BF16 or two E4M3
// values is exact in FP32) to its accumulator one by one in k order, starting from 0 when scale-d is
// false, as the mma.sync emulation does (cuda/kernels/mma.cuh). The tensor cores' own order and
// truncation are undocumented, so a GPU is compared with a tolerance, the CPU engine bit for bit.
#include <array>
#include <cstring>

#include "cuda/emu/emu.h"
#include "cuda/emu/emu_internal.h"
#include "rl/numerics/fp8.h"

namespace emu {

namespace {

struct Descriptor {
    uint32_t start, lbo, sbo, base_offset, width;  // width: W, the swizzle's bytes / 16 (1 without)
};

const char* swizzle_name(uint32_t width) {
    return width == 8 ? "128-byte" : width == 4 ? "64-byte" : width == 2 ? "32-byte" : "no";
}

// Decodes `bits`; "" or the rule it breaks.
std::string decode(uint64_t bits, Descriptor& d) {
    const uint64_t reserved = (3ull << 14) | (3ull << 30) | (7ull << 46) | (0x3FFull << 52);
    if (bits & reserved)
        return strformat("matrix descriptor 0x%016llx sets reserved bits 0x%016llx (the layout: start address in bits "
                         "0-13, LBO 16-29, SBO 32-45, base offset 49-51, swizzle 62-63)",
                         (unsigned long long)bits, (unsigned long long)(bits & reserved));
    d.start = (uint32_t)(bits & 0x3FFF) << 4;
    d.lbo = (uint32_t)((bits >> 16) & 0x3FFF) << 4;
    d.sbo = (uint32_t)((bits >> 32) & 0x3FFF) << 4;
    d.base_offset = (uint32_t)((bits >> 49) & 7);
    const uint32_t mode = (uint32_t)(bits >> 62);
    d.width = mode == 0 ? 1 : mode == 1 ? 8 : mode == 2 ? 4 : 2;
    if (d.width > 1 && d.base_offset != 0)
        return strformat("matrix descriptor 0x%016llx: base offset %u (the emulation supports base offset 0: start "
                         "the operand's swizzle pattern on a %u-byte boundary)",
                         (unsigned long long)bits, d.base_offset, 128 * d.width);
    if (d.width > 1 && ((d.start >> 7) & (d.width - 1)))
        return strformat("matrix descriptor 0x%016llx: %s swizzle, start address 0x%x with address bits 7.. = %u and base "
                         "offset 0 (the rule: the pattern repeats every %u bytes; a start address inside it needs the "
                         "base offset, which the emulation does not support)",
                         (unsigned long long)bits, swizzle_name(d.width), d.start, (d.start >> 7) & (d.width - 1),
                         128 * d.width);
    return "";
}

uint32_t element_bytes(WgmmaType t) { return t == WgmmaType::BF16 ? 2 : 1; }
int k_of(WgmmaType t) { return t == WgmmaType::BF16 ? 16 : 32; }
const char* type_name(WgmmaType t) { return t == WgmmaType::BF16 ? "bf16" : "e4m3"; }

// The shared-window address of element (mn, k) of the canonical layout `d` describes, for elements
// of `bytes` bytes (MN-major: BF16 only).
uint32_t element_address(const Descriptor& d, bool mn_major, int mn, int k, uint32_t bytes) {
    const uint32_t w = d.width, m = (uint32_t)mn, kk = (uint32_t)k, per_row = 16 / bytes;
    uint32_t off;
    if (!mn_major)
        off = (m % 8) * 16 * w + (m / 8) * d.sbo + bytes * (kk % per_row) + (kk / per_row) * (w == 1 ? d.lbo : 16);
    else if (w == 1)
        off = 2 * (m % 8) + (m / 8) * d.sbo + 16 * (kk % 8) + (kk / 8) * d.lbo;
    else
        off = 2 * (m % (8 * w)) + (m / (8 * w)) * d.lbo + 16 * w * (kk % 8) + (kk / 8) * d.sbo;
    const uint32_t addr = d.start + off;
    return w > 1 ? addr ^ (((addr >> 7) & (w - 1)) << 4) : addr;
}

// The BF16 at `address` of the block's dynamic shared memory `smem` (every element a wgmma reads was
// checked to lie in it when the warpgroup first issued the wgmma: check_operand).
float bf16_at(const char* smem, uint32_t address) {
    const char* p = smem + address;
    uint16_t h;
    memcpy(&h, p, 2);
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// E4M3's 256 values (rl/numerics/fp8.h's decoder, once).
const float* e4m3_values() {
    static const std::array<float, 256> table = [] {
        std::array<float, 256> t{};
        for (int code = 0; code < 256; code++) t[code] = fp8rl::e4m3_to_float((uint8_t)code);
        return t;
    }();
    return table.data();
}

// The operand element of type t at `address` (checked as bf16_at).
float element_at(const char* smem, uint32_t address, WgmmaType t) {
    return t == WgmmaType::BF16 ? bf16_at(smem, address) : e4m3_values()[(uint8_t)smem[address]];
}

float bf16_lo(uint32_t r) { uint32_t u = r << 16; float f; memcpy(&f, &u, 4); return f; }
float bf16_hi(uint32_t r) { uint32_t u = r & 0xFFFF0000u; float f; memcpy(&f, &u, 4); return f; }

// Checks that every element of a rows x K operand of type t lies in the block's dynamic shared memory.
std::string check_operand(const char* name, uint64_t bits, bool mn_major, int rows, WgmmaType t) {
    Descriptor d;
    std::string err = decode(bits, d);
    if (!err.empty()) return strformat("%s: %s", name, err.c_str());
    const uint32_t bytes = element_bytes(t);
    for (int mn = 0; mn < rows; mn++)
        for (int k = 0; k < k_of(t); k++) {
            const uint32_t a = element_address(d, mn_major, mn, k, bytes);
            if (!shared_window(a, bytes))
                return strformat("%s: matrix descriptor 0x%016llx (%s swizzle, start 0x%x, LBO %u, SBO %u) puts element "
                                 "(%d, %d) at shared address 0x%x, outside the block's %s shared memory",
                                 name, (unsigned long long)bits, swizzle_name(d.width), d.start, d.lbo, d.sbo, mn, k, a,
                                 "dynamic");
        }
    return "";
}

std::string describe(const WgmmaSignature& s) {
    return strformat("m64n%dk%d.%s A %s 0x%016llx B 0x%016llx scale-d %d trans-a %d trans-b %d", s.n, k_of(s.type),
                     type_name(s.type), s.a_in_regs ? "registers" : "descriptor", (unsigned long long)s.a_desc, (unsigned long long)s.b_desc,
                     s.scale_d, s.trans_a, s.trans_b);
}

WgmmaSignature signature(const WgmmaIssue& w) {
    return {w.type, w.n, w.scale_d, w.trans_a, w.trans_b, w.a_in_regs, w.a_in_regs ? 0 : w.a_desc, w.b_desc};
}

bool same(const WgmmaSignature& x, const WgmmaSignature& y) {
    return x.type == y.type && x.n == y.n && x.scale_d == y.scale_d && x.trans_a == y.trans_a && x.trans_b == y.trans_b &&
           x.a_in_regs == y.a_in_regs && x.a_desc == y.a_desc && x.b_desc == y.b_desc;
}

// The calling thread's share of D for the completed wgmma `w`: reads B (and a descriptor A) now.
void compute(const WgmmaIssue& w, int warp_in_group, int lane) {
    const int g = lane / 4, t = lane % 4;
    Descriptor bd, ad;
    const char* smem = shared_window(0, 0);
    decode(w.b_desc, bd);
    if (!w.a_in_regs) decode(w.a_desc, ad);
    const int kk = k_of(w.type);
    const uint32_t bytes = element_bytes(w.type);
    float a[2][32];
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < kk; k++)
            a[h][k] = w.a_in_regs ? w.a[g + 8 * h][k]
                                  : element_at(smem, element_address(ad, w.trans_a, 16 * warp_in_group + g + 8 * h, k, bytes),
                                               w.type);
    // register v = 4c + 2h + e holds row h's element of column 8c + 2t + e: each column read once
    for (int c = 0; c < w.n / 8; c++)
        for (int e = 0; e < 2; e++) {
            float b[32];
            for (int k = 0; k < kk; k++) b[k] = element_at(smem, element_address(bd, w.trans_b, 8 * c + 2 * t + e, k, bytes), w.type);
            for (int h = 0; h < 2; h++) {
                float& d = w.d[4 * c + 2 * h + e];
                float acc = w.scale_d ? d : 0.0f;
                for (int k = 0; k < kk; k++) acc += a[h][k] * b[k];
                d = acc;
            }
        }
}

}  // namespace

std::string resolve_wgmma(int warp, int block_threads, WgmmaIssue* const lanes[32], uint64_t& issued,
                          std::vector<WgmmaSignature>& log) {
    const int group = warp / 4;
    if (block_threads < 128 * (group + 1))
        return strformat("wgmma.mma_async by warp %d, whose warpgroup (warps %d-%d) is incomplete in a block of %d threads "
                         "(the rule: the 128 threads of 4 contiguous warps, the first's index a multiple of 4, execute it)",
                         warp, 4 * group, 4 * group + 3, block_threads);
    const WgmmaSignature first = signature(*lanes[0]);
    for (int l = 1; l < 32; l++)
        if (!same(signature(*lanes[l]), first))
            return strformat("warp %d: wgmma.mma_async lane 0 issues %s, lane %d %s (the rule: .sync.aligned, every "
                             "thread of the warpgroup executes the same wgmma.mma_async)",
                             warp, describe(first).c_str(), l, describe(signature(*lanes[l])).c_str());
    const uint64_t index = issued++;
    if (index < log.size()) {
        if (!same(log[index], first))
            return strformat("warp %d: its wgmma.mma_async #%llu is %s, another warp's of warpgroup %d %s (the rule: "
                             ".aligned, the warpgroup's 4 warps execute the same wgmma.mma_async, descriptors included)",
                             warp, (unsigned long long)index + 1, describe(first).c_str(), group,
                             describe(log[index]).c_str());
    } else {
        log.push_back(first);
        std::string err = check_operand("B", first.b_desc, first.trans_b, first.n, first.type);
        if (err.empty() && !first.a_in_regs) err = check_operand("A", first.a_desc, first.trans_a, 64, first.type);
        if (!err.empty()) return strformat("warp %d: wgmma.mma_async %s", warp, err.c_str());
    }
    if (!first.a_in_regs) return "";
    float a[16][16];
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, t = l % 4;
        for (int r = 0; r < 4; r++) {
            a[g + 8 * (r & 1)][8 * (r >> 1) + 2 * t] = bf16_lo(lanes[l]->a_regs[r]);
            a[g + 8 * (r & 1)][8 * (r >> 1) + 2 * t + 1] = bf16_hi(lanes[l]->a_regs[r]);
        }
    }
    for (int l = 0; l < 32; l++) memcpy(lanes[l]->a, a, sizeof a);
    return "";
}

void wgmma_touch(WgmmaGuard& g, const char* what) {
    WgmmaState& s = current_wgmma();
    if (g.in_flight_until > s.completed)
        kernel_fault(strformat("%s accessed while wgmma.mma_async #%llu of this thread, which uses them, is in flight (the "
                               "rule: a wgmma.wait_group that completes its group comes first; %llu of %llu completed)",
                               what, (unsigned long long)g.in_flight_until, (unsigned long long)s.completed,
                               (unsigned long long)s.issued));
    g.touched_at_fence = s.fences;
}

void wgmma_fence() { current_wgmma().fences++; }

void wgmma_issue(WgmmaType type, int n, float* d, WgmmaGuard& d_guard, const uint32_t* a_regs, WgmmaGuard* a_guard,
                 uint64_t a_desc, uint64_t b_desc, bool scale_d, bool trans_a, bool trans_b) {
    WgmmaState& s = current_wgmma();
    if (n < 8 || n > 256 || n % 8)
        kernel_fault(strformat("wgmma.mma_async.m64n%dk%d (the rule: N a multiple of 8 from 8 to 256)", n, k_of(type)));
    if (a_regs && trans_a) kernel_fault("wgmma.mma_async with A in registers and imm-trans-a (the rule: only a shared-memory A transposes)");
    if (type == WgmmaType::E4M3 && (trans_a || trans_b))
        kernel_fault(strformat("wgmma.mma_async.m64n%dk32.f32.e4m3.e4m3 with %s MN-major (the rule, PTX ISA: imm-trans-a "
                               "and imm-trans-b exist only for .f16 / .bf16; FP8 operands are K-major)",
                               n, trans_a ? "A" : "B"));
    if (type == WgmmaType::E4M3 && a_regs)
        kernel_fault(strformat("wgmma.mma_async.m64n%dk32.f32.e4m3.e4m3 with A in registers (not emulated: give A by a "
                               "shared-memory descriptor)",
                               n));
    const char* unfenced = d_guard.touched_at_fence == s.fences ? "the accumulator registers"
                           : a_regs && a_guard->touched_at_fence == s.fences ? "the A fragment registers" : nullptr;
    if (unfenced)
        kernel_fault(strformat("wgmma.mma_async #%llu uses %s, accessed after this thread's last wgmma.fence (%llu fences "
                               "so far) (the rule: wgmma.fence before the first wgmma.mma_async and between a register "
                               "access and the wgmma.mma_async that uses the registers)",
                               (unsigned long long)s.issued + 1, unfenced, (unsigned long long)s.fences));
    WgmmaIssue w;  // the lane's deposit, read and completed by resolve_wgmma while the warp waits
    w.type = type, w.n = n, w.scale_d = scale_d, w.trans_a = trans_a, w.trans_b = trans_b, w.a_in_regs = a_regs != nullptr;
    w.a_desc = a_desc, w.b_desc = b_desc, w.d = d, w.d_guard = &d_guard;
    if (a_regs) memcpy(w.a_regs, a_regs, sizeof w.a_regs);
    warp_collective(WarpOp::Wgmma, 0xFFFFFFFFu, (uint64_t)(uintptr_t)&w, 0, 32);
    s.issued++;
    d_guard.in_flight_until = s.issued;
    if (a_guard) a_guard->in_flight_until = s.issued;
    s.in_flight.push_back(w);
}

void wgmma_commit() {
    WgmmaState& s = current_wgmma();
    s.groups.push_back(s.in_flight.size());
}

void wgmma_wait(int pending) {
    WgmmaState& s = current_wgmma();
    if (pending < 0) kernel_fault(strformat("wgmma.wait_group %d (the rule: a non-negative integer constant)", pending));
    if (s.groups.size() <= (size_t)pending) return;
    const size_t done = s.groups[s.groups.size() - 1 - (size_t)pending];
    const int warp_in_group = current_warp() % 4, lane = current_lane();
    for (size_t i = 0; i < done; i++) compute(s.in_flight[i], warp_in_group, lane);
    s.in_flight.erase(s.in_flight.begin(), s.in_flight.begin() + (long)done);
    s.groups.erase(s.groups.begin(), s.groups.end() - pending);
    for (size_t& g : s.groups) g -= done;
    s.completed += done;
}

}  // namespace emu
