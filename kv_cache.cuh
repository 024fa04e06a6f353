// kv_cache.cuh: the paged key/value cache of generation on the GPU (spec-gpu.md §4), the device twin
// of cpu/kv_cache.h: per layer K (after k-norm and RoPE) and V of every cached token, stored in BF16
// or as FP8 E4M3 codes with one scale per layer for K and one for V (spec-fp8.md §9), or one per
// layer and KV head (--kv_scales head), and the decode attention that reads them.
//
// Layout: one pool each for K and V, [layers][pages][page_tokens][kv_heads][head_dim]; token slot
// s = page * page_tokens + offset is row s of a layer's [pages * page_tokens][kv_heads * head_dim].
// A sequence's tokens live in the pages its page table names, in order: position p is at offset
// p % page_tokens of page page_table[p / page_tokens].
//
// Decode attention is flash-decoding in three launches. A step's plan (kv_decode_plan_kernel, once
// per step for every layer) lists on the device the (row, chunk) pairs that hold keys: each row's
// cache length cut into chunks of kDecodeSplitKeys keys, its prompt's (its prefix) apart from its
// own (rl/numerics/attention_tiles.h). The split kernel runs one CTA per listed pair and KV head (a
// grid sized for the longest row the plan allows, CTAs past the list exiting at once): it brings
// the chunk's keys and values into shared memory tile by tile, as they are stored (BF16 or FP8
// codes), with 16-byte asynchronous copies (cp.async), the next tile's copies in flight while the
// current one is read (two stages), each key's slot looked up a tile ahead; FP8 codes are converted
// to BF16 in registers as the tensor cores' B fragments read them (the hardware's E4M3 -> FP16
// conversion, exact; V's through a transposing ldmatrix and byte permutes), and every query head of
// the GQA group reads the tile through the tensor cores (Q K^T and P V as mma.sync m16n8k16,
// FlashInfer's tensor-core decode), q's fragments and the output accumulator held in registers for
// the whole chunk; it keeps an online softmax (running max, running sum, rescaled output) and
// writes the chunk's normalised partial O and its log-sum-exp (FP32). The combine kernel
// (FlashInfer's merge_states) merges each row's chunks by their LSE weights, a lane per 8 outputs
// with all its loads in flight, and writes O in BF16 (and, in an fp8 decode step, O's FP8 1x128
// operand for the O projection). Scores are exact BF16 products summed in d order, then scaled; exp
// is rl/numerics/fast_exp.h's (the CPU engine's); P stays FP32 for the softmax sums and meets V as
// two BF16 terms (16 significant bits, unlike the training kernel's single BF16 P); the output's is
// the only other rounding to BF16 (see the kernel). A row's chunks depend on its own length and its
// prompt's alone, never on the batch (its other rows, its size, the longest row): a sequence decodes
// to the same bits whatever it is batched with, so a redone or preempted completion is the same.
// Cascade attention (FlashInfer's shared-prefix decode): the G samples of a prompt share its pages,
// so their prefix chunks hold the same keys; the plan's cascade list has one item per (prefix
// chunk, group of up to kCascadeRows siblings), whose CTA reads each tile once for the queries of
// all of them, each query computed as its own row's CTA computes it; the combine adds each row's
// own chunks by LSE as before.
//
//   PagedKvCache cache(shape, Precision::FP8);       // the pools (bytes(shape, storage) for the plan)
//   cache.reserve_decode(max_batch, heads, max_len); // the decode workspace, before any graph capture
//   cache.set_scales(k_scales, v_scales);            // after every update (kv_amax_gpu + kv_scale_from_amax)
//   cache.append(layer, k, v, slots, n, stream);     // prefill and every decode step
//   cache.round_trip(layer, k, v, n, stream);        // prefill: attend over what the pages hold
//   cache.plan_decode(lens, prefixes, B, max_len, stream, cascade);  // once a decode step
//   cache.decode_attention(layer, out, q, heads, page_table, max_pages, stream);  // every layer of it
#ifndef FP8RL_KV_CACHE_CUH
#define FP8RL_KV_CACHE_CUH
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cuda/kernels/attention.cuh"
#include "cuda/kernels/block_reduce.cuh"
#include "cuda/kernels/fp8_rows.cuh"
#include "cuda/common.cuh"
#include "cuda/element.cuh"
#include "cuda/engine/device_array.cuh"
#include "rl/numerics/attention_tiles.h"
#include "rl/numerics/fast_div.h"
#include "rl/numerics/fast_exp.h"
#include "rl/numerics/fast_log.h"
#include "rl/numerics/fp8.h"
#include "rl/numerics/precision.h"

namespace fp8rl {

// Tokens per page. 16 (vLLM's default) rather than nano-vllm's 256: RL completions are short and
// a group's G samples each copy the prompt's last partial page (copy_page), so small pages waste
// at most 15 slots per sequence and make that copy cheap; the decode kernel's tiles do not depend
// on the page size (any page_tokens >= 1 works).
constexpr int kKvPageTokens = 16;

constexpr int kDecodeThreads = 128;    // 4 warps per CTA
static_assert(kDecodeTile == 32 && kDecodeThreads % 32 == 0, "a warp scores one tile, a lane per key");

struct KvCacheShape {
    int layers, kv_heads, head_dim;
    int page_tokens = kKvPageTokens;  // tokens per page
    int pages;        // pages in the pool
    long width() const { return (long)kv_heads * head_dim; }
    long slots() const { return (long)pages * page_tokens; }
};

// The value a stored element stands for: BF16 as it is; an FP8 code times its layer's scale,
// rounded to FP32 as cpu/kv_cache.h's stored() rounds it.
__device__ __forceinline__ float kv_value(__nv_bfloat16 x, float) { return __bfloat162float(x); }
__device__ __forceinline__ float kv_value(uint8_t code, float scale) { return mul_rn(e4m3_to_float(code), scale); }
// The stored element for a BF16 value x (held as a float): BF16 as it is; FP8 encodes x / scale
// (satfinite E4M3).
__device__ __forceinline__ void kv_store(__nv_bfloat16* dst, float x, float) { *dst = __float2bfloat16_rn(x); }
__device__ __forceinline__ void kv_store(uint8_t* dst, float x, float scale) { *dst = float_to_e4m3(x / scale); }

// Where a kernel that produces K and V (cuda/kernels/qkv_rope.cuh, in a decode step) appends them itself:
// one layer's pools [slots][width] of BF16 or FP8 elements (with the layer's [kv_heads] scales), and
// the slot of each row (-1: a padding row, nothing written). A null `slots`: no append.
struct KvAppend {
    void *k_pool = nullptr, *v_pool = nullptr;
    const float *k_scale = nullptr, *v_scale = nullptr;
    const int32_t* slots = nullptr;
    long slot_count = 0, width = 0;
    int head_dim = 0;
    bool fp8 = false;
};

// Element col (of width) of row `row`'s K (key) or V, the BF16 value x, as kv_append_kernel stores it.
__device__ __forceinline__ void kv_append_value(const KvAppend& a, long row, long col, float x, bool key) {
    const long slot = a.slots[row];
    if (slot < 0 || slot >= a.slot_count) return;
    void* pool = key ? a.k_pool : a.v_pool;
    const long at = slot * a.width + col;
    if (!a.fp8) return kv_store(static_cast<__nv_bfloat16*>(pool) + at, x, 1.0f);
    const float* scales = key ? a.k_scale : a.v_scale;
    const long head = col / a.head_dim;
    kv_store(static_cast<uint8_t*>(pool) + at, x, scales[head]);
}

// Rows i < n of k, v [n][width] into slots[i] of one layer's pools [slots][width], column c with its
// KV head's scale k_scale[c / head_dim] (the layer's [kv_heads]). A slot outside [0, slot_count)
// writes nothing: -1 marks the padding rows of a CUDA-graph bucket.
template <class Elem>
__global__ void kv_append_kernel(Elem* k_pool, Elem* v_pool, const float* k_scale, const float* v_scale,
                                 const __nv_bfloat16* k, const __nv_bfloat16* v, const int32_t* slots, long n,
                                 long width, int head_dim, long slot_count) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n * width; i += (long)gridDim.x * blockDim.x) {
        const long slot = slots[i / width], c = i % width;
        if (slot < 0 || slot >= slot_count) continue;
        kv_store(k_pool + slot * width + c, __bfloat162float(k[i]), k_scale[c / head_dim]);
        kv_store(v_pool + slot * width + c, __bfloat162float(v[i]), v_scale[c / head_dim]);
    }
}

// k, v [n][width] of one layer replaced, in place, by the values their FP8 codes stand for (rounded
// to BF16): a prefill then attends over what decode steps will read, as cpu/generate.h's prefill
// reads its cache.
static __global__ void kv_round_trip_kernel(__nv_bfloat16* k, __nv_bfloat16* v, const float* k_scale, const float* v_scale,
                                     long count, long width, int head_dim) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < count; i += (long)gridDim.x * blockDim.x) {
        const float ks = k_scale[i % width / head_dim], vs = v_scale[i % width / head_dim];
        uint8_t code;
        kv_store(&code, __bfloat162float(k[i]), ks);
        k[i] = __float2bfloat16(kv_value(code, ks));
        kv_store(&code, __bfloat162float(v[i]), vs);
        v[i] = __float2bfloat16(kv_value(code, vs));
    }
}

// The cascade groups of a decode step (cascade attention): sibling rows of one prompt whose prefix
// chunks (decode_prefix_keys) one CTA computes for all of them, reading each K/V tile once. Group g
// is rows[start[g] .. start[g + 1]), at most kCascadeRows, g < *count; shared[r] != 0 marks the rows
// in a group (the per-row launch skips their prefix chunks); a row whose mark is cleared during a
// window (it took another sequence: decode_slots.cuh's refill) is the per-row launch's alone.
// Device pointers; all null: no groups.
constexpr int kCascadeRows = 8;  // rows per cascade CTA: their queries and outputs share its shared memory
struct DecodeCascade {
    const int32_t *rows = nullptr, *start = nullptr, *count = nullptr, *shared = nullptr;
    int max_groups = 0;  // an upper bound on *count: the cascade launch's grid
};

// Where decode attention writes its result: out [B][H D] BF16, with `operand` also its FP8 1x128
// operand (rows B .. operand.rows zero codes).
struct DecodeOutput {
    __nv_bfloat16* out = nullptr;
    Fp8RowsOut operand;
    int B = 0;
};

// The keys of decode row r: len = min(lens[r], max_len) (keys past max_len are never read) and its
// prefix (prefixes[r], null: 0) down to whole tiles, as the plan, the split and the combine cut it.
struct DecodeRowKeys {
    long len, prefix;
};
__device__ __forceinline__ DecodeRowKeys decode_row_keys(const int32_t* lens, const int32_t* prefixes, int max_len, long r) {
    const long len = max(0L, (long)min(lens[r], max_len));
    return {len, prefixes ? max(0L, min((long)prefixes[r], len)) / kDecodeTile * kDecodeTile : 0L};
}

// Two E4M3 codes (the first in the low byte) as a pair of BF16 (the first in the low half), exactly:
// the hardware's conversion of two codes to two FP16 (cvt.rn.f16x2.e4m3x2,
// __nv_cvt_fp8x2_to_halfraw2: E4M3 is exact in FP16), then FP16 -> FP32 -> BF16, both exact (E4M3's
// 4 significant bits and exponents 2^-9 .. 2^8 fit BF16). In emulation cuda_fp8.h's host path
// decodes the bits in software (test_kv_cache checks all 256 codes).
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint16_t codes) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)codes, __NV_E4M3);
    const __nv_bfloat162 b = __float22bfloat162_rn(__half22float2(__half2(h)));
    uint32_t out;
    memcpy(&out, &b, sizeof out);
    return out;
}
// Column `odd` (0 or 1) of a transposing ldmatrix's register of E4M3 codes, which holds two keys'
// codes of two adjacent columns (bytes: first key's column 0, 1, then the second key's): the column's
// two codes, the first key's in the low byte, as e4m3x2_to_bf16x2 takes them: one byte permute (PRMT;
// nvcc makes three instructions of the shifts and masks that emulation runs).
__device__ __forceinline__ uint16_t e4m3_column_pair(uint32_t codes, int odd) {
#ifdef FP8RL_EMU
    return (uint16_t)(((codes >> (8 * odd)) & 0xFFu) | ((codes >> (8 * odd + 8)) & 0xFF00u));
#else
    return (uint16_t)__byte_perm(codes, 0u, odd ? 0x4431u : 0x4420u);  // bytes odd, odd + 2; zeros above
#endif
}

// Dynamic shared memory of a decode CTA serving `queries` query heads (a GQA group's, times the rows
// of a cascade group), in bytes: kDecodeStages stages of the key tile [kDecodeTile][D + 16 bytes] and
// the value tile [kDecodeTile][D (at least 16 bytes) + 16 bytes] in their storage type (rows padded by
// 16 bytes: the 8 rows an ldmatrix or a quarter warp's 16-byte reads touch hit 8 distinct bank
// groups; a value row is whole 16-byte vectors, ldmatrix's rows), the stages' key slots
// [kDecodeTile]; q in BF16 [queries rounded up to 16][D + 8] (read once into the tensor cores' A
// fragments); the probabilities' BF16 pair P_hi, P_lo [queries rounded up to 16][kDecodeTile + 8]
// each (P V's A rows); then in FP32 the scores [queries][kDecodeTile] and per query the running max,
// the running sum and the last rescale factor. The output accumulator lives in registers.
constexpr int kDecodeStages = 2;
constexpr int kDecodePld = kDecodeTile + 8;  // BF16 elements per row of P_hi and P_lo
// The query tiles (16 queries) whose fragments a split CTA keeps in registers, at most: a per-row
// CTA's GQA group (at most 32 query heads per kv head), a cascade CTA's rows times it.
constexpr int kDecodeMaxQueryTiles = 2;
inline size_t decode_smem_bytes(int queries, int D, size_t elem_bytes) {
    const size_t bf16_row = (size_t)(D + 8) * 2, query_rows = (size_t)(queries + 15) / 16 * 16;
    const size_t k_row = D * elem_bytes + 16, v_row = std::max<size_t>(D * elem_bytes, 16) + 16;
    return (size_t)kDecodeStages * kDecodeTile * (k_row + v_row + sizeof(int32_t)) + query_rows * bf16_row +
           2 * query_rows * kDecodePld * 2 + sizeof(float) * ((size_t)queries * kDecodeTile + 3 * queries);
}

// ---- the plan: a decode step's work list, built on the device (FlashInfer's plan/run split) ----
// Item i of a list is (items[2 i], items[2 i + 1]) = (row, or cascade group, and chunk), in (row,
// chunk) order; counts[0] counts the per-row list, counts[1] the cascade list. Only chunks that
// hold keys are listed, so the split kernel's CTAs past a list's count exit at their first load.
constexpr int kDecodePlanThreads = 256;

// The exclusive prefix sum of v over the CTA's kDecodePlanThreads threads, and *total their sum.
__device__ int plan_exclusive_sum(int v, int* total) {
    STATIC_SHARED(int, warp_sums, [kDecodePlanThreads / 32]);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int inclusive = v;
    for (int offset = 1; offset < 32; offset *= 2) {
        const int other = __shfl_up_sync(0xFFFFFFFFu, inclusive, offset);
        if (lane >= offset) inclusive += other;
    }
    if (lane == 31) warp_sums[warp] = inclusive;
    __syncthreads();
    int before = 0, all = 0;
    for (int w = 0; w < kDecodePlanThreads / 32; w++) before += w < warp ? warp_sums[w] : 0, all += warp_sums[w];
    __syncthreads();  // read before the next call writes it
    *total = all;
    return before + inclusive - v;
}

// One CTA: the per-row list (each row's chunks with keys, less the prefix chunks of a row a cascade
// group serves: marked shared, with keys) and the cascade list (each group g < *cascade.count with
// a live member still shared: its first such member's prefix chunks). The split kernel recomputes
// each item's keys and members by the same rules (decode_row_keys, decode_chunk_keys).
static __global__ void __launch_bounds__(kDecodePlanThreads)
    kv_decode_plan_kernel(int32_t* row_items, int32_t* group_items, int32_t* counts, const int32_t* lens,
                          const int32_t* prefixes, int B, int max_len, FastDivisor split, DecodeCascade cascade) {
    auto row_span = [&](int r, int* first, int* end) {
        const DecodeRowKeys k = decode_row_keys(lens, prefixes, max_len, r);
        const int prefix_chunks = decode_span_chunks(k.prefix, split);
        *end = prefix_chunks + decode_span_chunks(k.len - k.prefix, split);
        *first = cascade.shared && cascade.shared[r] && k.len > 0 ? prefix_chunks : 0;
    };
    auto group_span = [&](int g, int* first, int* end) {
        *first = *end = 0;
        if (g >= *cascade.count) return;
        for (int i = cascade.start[g]; i < cascade.start[g + 1]; i++) {
            const DecodeRowKeys k = decode_row_keys(lens, prefixes, max_len, cascade.rows[i]);
            if (k.len > 0 && cascade.shared[cascade.rows[i]]) return void(*end = decode_span_chunks(k.prefix, split));
        }
    };
    // each thread a run of consecutive rows (groups), placed after the runs before it
    auto build = [&](int n, auto span, int32_t* items, int32_t* count) {
        const int per = (n + kDecodePlanThreads - 1) / kDecodePlanThreads, begin = min(n, (int)threadIdx.x * per),
                  end = min(n, begin + per);
        int mine = 0, first, last;
        for (int i = begin; i < end; i++) span(i, &first, &last), mine += max(0, last - first);
        int total;
        int at = plan_exclusive_sum(mine, &total);
        for (int i = begin; i < end; i++) {
            span(i, &first, &last);
            for (int c = first; c < last; c++, at++) items[2 * at] = i, items[2 * at + 1] = c;
        }
        if (threadIdx.x == 0) *count = total;
    };
    build(B, row_span, row_items, counts);
    build(cascade.rows ? cascade.max_groups : 0, group_span, group_items, counts + 1);
}

// ---- the combine (FlashInfer's merge_states, FA2's split-KV combine) ------------------------------
constexpr int kCombineThreads = 128;  // 4 warps: 8 groups of 128 outputs
constexpr int kCombineBatch = 8;      // chunks whose loads a lane has in flight at once

// Row blockIdx.x of the result from its chunks' partials, a half warp per 128-column group as
// fp8_rows.cuh lays them out, a lane 8 outputs of one head: the lane loads its (row, head)'s chunk
// LSEs, kCombineBatch at a time, all in flight; weighs each chunk once (fast_exp of its LSE less
// their max); loads each chunk's 8 partial outputs with two 16-byte loads, a batch's in flight
// together; and adds them in chunk order, without contraction, as cpu/attention.h's merge does:
// no output waits on a chain of loads. The row's chunks are decode_row_chunks of its keys; an idle
// row (none) gets zero. Rows past o.B get zero codes of o's FP8 operand alone. The partials were
// written by the split launches before it: a kernel boundary orders them.
template <int D>
__global__ void __launch_bounds__(kCombineThreads)
    kv_decode_combine_kernel(const float* part_o, const float* part_lse, const int32_t* lens, const int32_t* prefixes,
                             int max_len, int H, int chunks, FastDivisor split, DecodeOutput o) {
    static_assert(D % 8 == 0, "a lane's 8 outputs are one head's");
    const long r = blockIdx.x;
    const int cols = H * D, lane16 = threadIdx.x % kGroupLanes, half = (threadIdx.x % 32) / kGroupLanes;
    const int pair = blockIdx.y * (kCombineThreads / 32) + threadIdx.x / 32;
    if (pair >= group_pairs(cols)) return;  // the whole warp
    const int kb = pair * 2 + half, c = kb * FP8_BLOCK + lane16 * 8;
    const bool real = r < o.B && c < cols;  // cols is a multiple of 8: a lane's outputs are all real or none
    float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (real) {
        const DecodeRowKeys k = decode_row_keys(lens, prefixes, max_len, r);
        const int n = decode_span_chunks(k.prefix, split) + decode_span_chunks(k.len - k.prefix, split);
        const long row_head = r * H + c / D;
        const float* lse = part_lse + row_head * chunks;
        const float* out = part_o + row_head * chunks * D + c % D;
        float lse_max = -INFINITY;
        for (int c0 = 0; c0 < n; c0 += kCombineBatch) {
            float l[kCombineBatch];
            for (int i = 0; i < kCombineBatch; i++) l[i] = c0 + i < n ? lse[c0 + i] : -INFINITY;
            for (int i = 0; i < kCombineBatch; i++) lse_max = fmaxf(lse_max, l[i]);
        }
        float weight_sum = 0.0f, acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        for (int c0 = 0; c0 < n; c0 += kCombineBatch) {
            float l[kCombineBatch];
            float4 part[kCombineBatch][2];
            for (int i = 0; i < kCombineBatch; i++)
                if (c0 + i < n) {
                    l[i] = lse[c0 + i];
                    for (int h = 0; h < 2; h++) part[i][h] = reinterpret_cast<const float4*>(out + (long)(c0 + i) * D)[h];
                }
            for (int i = 0; i < kCombineBatch; i++)
                if (c0 + i < n) {
                    const float w = fast_exp(l[i] - lse_max), x[8] = {part[i][0].x, part[i][0].y, part[i][0].z, part[i][0].w,
                                                                      part[i][1].x, part[i][1].y, part[i][1].z, part[i][1].w};
                    weight_sum += w;
                    for (int e = 0; e < 8; e++) acc[e] += mul_rn(w, x[e]);
                }
        }
        if (n > 0)
            for (int e = 0; e < 8; e++) v[e] = round_bf16(acc[e] / weight_sum);
        store8(o.out + r * cols + c, 8, v);
    }
    if (o.operand) quantize_group8(v, (int)r, kb, cols, o.operand);
}

// One CTA per work item blockIdx.x of the plan's list (kv_decode_plan_kernel) and kv head
// blockIdx.y: a (row, chunk), or with cascade.rows a (cascade group, prefix chunk); items past
// *item_count (the grid is the list's capacity, fixed for a graph) exit at once. The CTA computes
// the GQA group's query heads of its rows over one chunk of keys, cut by decode_chunk_keys from the
// row's keys (decode_row_keys). A cascade CTA's rows are its group's live ones still marked shared
// (an idle row has no keys and a refilled row left its group: the per-row list holds theirs); it
// reads the first one's pages: the rows share their prompt's pages, and a copied partial page holds
// the same prefix keys. Every query's arithmetic is the per-row launch's (the same tiles in the
// same order), so a row's bits do not depend on whether a cascade CTA served it. Writes part_o
// [B][H][chunks][D] (the chunk's softmax-weighted V, normalised by the chunk's sum) and part_lse
// [B][H][chunks]; kv_decode_combine_kernel merges them. QT: the query tiles of 16 queries (queries
// rounded up) whose fragments the warps hold, 1 or 2 (kDecodeMaxQueryTiles).
//
// Per tile, on the tensor cores (mma.cuh, BF16 operands, FP32 accumulate), for all the CTA's queries
// at once (m16 tiles of queries, the rows past them zero), with the operands in registers as
// FlashAttention-2 keeps them: q's A fragments loaded once per CTA (a warp per query tile and keys
// of it), the output O as C fragments held by the warp that owns them for the whole chunk (a warp
// per 16 queries x 32 columns of d). FP8 codes are converted to BF16 (exactly) in registers as the
// B fragments read them, and the layer's scale applied to the products, not the elements: K's two
// codes at a time (e4m3x2_to_bf16x2), V's from a transposing ldmatrix of the codes (each lane gets
// two keys' codes of two adjacent columns, which byte permutes pair by column: the n8 tiles' columns
// are then d, d + 2, ...: a column permutation, each output's chain the same); BF16 storage is read
// as it landed.
//   scores  S = Q K^T: a chain over d from 0 (exact BF16 products), times the K scale, times D^-1/2;
//   softmax a warp per query, a lane per key, as before: P in FP32, its sum a warp butterfly; the
//           lane writes P_hi = bf16(P), P_lo = bf16(P - P_hi) (the pair carries 16 significant bits
//           of P, so P V is nearly FP32's);
//   P V     O = O * rescale + P_hi V + P_lo V per 16 keys, one chain per output;
// The value rows of the last tile past its keys are zeros (written as its copies are issued), so the
// MMAs read whole 16-key steps as the CPU's chains add zero products.
//   output  part_o = (O * V scale) / sum, part_lse = max + fast_log(sum) (rl/numerics/fast_log.h:
//           the host's bits, and no I2F as CUDA's logf has).
// cpu/attention.h's cached_decode_row computes the same operations in the same order.
template <int D, class Elem, int QT>
__global__ void __launch_bounds__(kDecodeThreads)
    kv_decode_split_kernel(float* part_o, float* part_lse, const __nv_bfloat16* q, const Elem* k_pool,
                           const Elem* v_pool, const float* k_scale, const float* v_scale, const int32_t* page_table,
                           int max_pages, const int32_t* lens, const int32_t* prefixes, int max_len, int H,
                           FastDivisor group, FastDivisor page_tokens, FastDivisor split_keys, int chunks,
                           DecodeCascade cascade, const int32_t* items, const int32_t* item_count) {
    constexpr bool fp8 = std::is_same<Elem, uint8_t>::value;
    constexpr int row_bytes = D * (int)sizeof(Elem), k_row = row_bytes + 16;  // a key row padded (bank groups)
    constexpr int v_row = (row_bytes < 16 ? 16 : row_bytes) + 16;  // a value row: whole 16-byte vectors, padded
    // copies of 16 bytes (8 for the 8-byte rows of FP8 at head dim 8), as many per row as it holds
    constexpr int copy_bytes = row_bytes < 16 ? row_bytes : 16, vectors = row_bytes / copy_bytes;
    constexpr int ld = D + 8;  // BF16 elements per row of q (D = 8: 8 zeros pad k to 16)
    constexpr int warps = kDecodeThreads / 32, k_steps = (D + 15) / 16;
    // P V: a warp item is 16 queries x d_item columns (n8 tiles), QT x d_items of them; D = 8 pads to 16
    constexpr int d_item = D >= 32 ? 32 : 16, n_tiles = d_item / 8, d_items = (D + d_item - 1) / d_item;
    constexpr int warp_items = (QT * d_items + warps - 1) / warps, qt_warps = warps / QT;
    static_assert(row_bytes % copy_bytes == 0, "a row is whole 8- or 16-byte vectors");
    static_assert(D % 16 == 0 || D == 8, "the tensor cores' k is 16: head dims are multiples of 16, or 8 (padded)");
    static_assert((QT == 1 || QT == 2) && QT <= kDecodeMaxQueryTiles && kDecodeTile / 8 % qt_warps == 0,
                  "a query tile's warps split the tile's n8 blocks of keys");
    DYNAMIC_SHARED(uint8_t, decode_smem);  // named apart from attention.cuh's BF16 `smem`: one extern symbol per name
    if ((int)blockIdx.x >= *item_count) return;  // past the step's work
    const int kv_head = blockIdx.y, KV = gridDim.y, chunk = items[2 * blockIdx.x + 1];  // the grid's y: every kv head
    const long head0 = (long)kv_head * group.d;
    // the CTA's rows: one, or a cascade group's live ones still marked shared
    long rows[kCascadeRows];
    int members = 0;
    if (cascade.rows) {
        const int g = items[2 * blockIdx.x];
        for (int i = cascade.start[g]; i < cascade.start[g + 1] && members < kCascadeRows; i++)
            if (decode_row_keys(lens, prefixes, max_len, cascade.rows[i]).len > 0 && cascade.shared[cascade.rows[i]])
                rows[members++] = cascade.rows[i];
    } else {
        rows[members++] = items[2 * blockIdx.x];
    }
    // this CTA's partials: a chunk of one kv head's queries of each of its rows
    auto write_partials = [&] {
        const int queries = members * group.d;  // query q is head q % group of rows[q / group]; <= 16 QT
        const int query_tiles = (queries + 15) / 16;
        uint8_t *k_t = decode_smem, *v_t = k_t + kDecodeStages * kDecodeTile * k_row;
        uint32_t* slot_s = reinterpret_cast<uint32_t*>(v_t + kDecodeStages * kDecodeTile * v_row);
        __nv_bfloat16* q_h = reinterpret_cast<__nv_bfloat16*>(slot_s + kDecodeStages * kDecodeTile);
        __nv_bfloat16 *p_hi = q_h + query_tiles * 16 * ld, *p_lo = p_hi + query_tiles * 16 * kDecodePld;
        float *p_s = reinterpret_cast<float*>(p_lo + query_tiles * 16 * kDecodePld),
              *max_s = p_s + queries * kDecodeTile, *sum_s = max_s + queries, *rescale_s = sum_s + queries;
        const DecodeRowKeys row_keys = decode_row_keys(lens, prefixes, max_len, rows[0]);
        long key_begin, key_end;  // not empty: the plan lists chunks with keys
        decode_chunk_keys(row_keys.len, row_keys.prefix, split_keys, chunk, &key_begin, &key_end);
        auto out_at = [&](int query) {  // the part_lse index of a query's (row, head, chunk)
            return (rows[group.div(query)] * H + head0 + group.mod(query)) * chunks + chunk;
        };
        // BF16 storage: the stored values as they are (scale 1)
        const float ks = fp8 ? k_scale[kv_head] : 1.0f, vs = fp8 ? v_scale[kv_head] : 1.0f, scale = 1.0f / sqrtf((float)D);
        const __nv_bfloat16 zero = __float2bfloat16_rn(0.0f);
        // q in 16-byte vectors, the real queries' alone; rows past them and columns past D are zeros
        constexpr int q_vectors = ld / 8;  // per row of q_h: D / 8 of q's, then one of zeros
        for (int e = threadIdx.x; e < query_tiles * 16 * q_vectors; e += kDecodeThreads) {
            const int g = e / q_vectors, v = e % q_vectors;
            uint4 x = make_uint4(0u, 0u, 0u, 0u);
            if (g < queries && v < D / 8)
                x = reinterpret_cast<const uint4*>(q + (rows[group.div(g)] * H + head0 + group.mod(g)) * D)[v];
            reinterpret_cast<uint4*>(q_h + g * ld)[v] = x;
        }
        for (int e = threadIdx.x; e < query_tiles * 16 * kDecodePld; e += kDecodeThreads) p_hi[e] = p_lo[e] = zero;
        for (int g = threadIdx.x; g < queries; g += kDecodeThreads) {
            max_s[g] = -INFINITY;
            sum_s[g] = 0.0f;
        }
        if constexpr (row_bytes < 16)  // D = 8: the value rows' columns past D, which P V's n8 tiles read, zeros
            for (int e = threadIdx.x; e < kDecodeStages * kDecodeTile * v_row / 16; e += kDecodeThreads)
                reinterpret_cast<uint4*>(v_t)[e] = make_uint4(0u, 0u, 0u, 0u);
        const int32_t* pages = page_table + rows[0] * max_pages;
        // key positions fit 31 bits (plan_decode) and a chunk's keys an int
        const uint32_t first_key = (uint32_t)key_begin;
        const int chunk_keys = (int)(key_end - key_begin), tiles = (chunk_keys + kDecodeTile - 1) / kDecodeTile;
        auto tile_keys = [&](int i) { return min(kDecodeTile, chunk_keys - i * kDecodeTile); };
        // The slot of key j of tile i, from its page's id in the row's page table. Tile i's slots live
        // in slot_s[i % kDecodeStages]; a lane of warp 0 per key writes them kDecodeStages tiles ahead
        // of the copies that read them (every tile's barriers lie between), so a copy's addresses cost a
        // shared load and a multiply-add each.
        auto tile_slot = [&](int i, int j) {
            const uint32_t pos = first_key + (uint32_t)(i * kDecodeTile + j), page = page_tokens.div(pos);
            return (uint32_t)pages[page] * page_tokens.d + (pos - page * page_tokens.d);
        };
        // this thread's copies: one 16-byte vector (copy_col) of rows copy_row0, + copy_rows, ... of a tile
        static_assert(kDecodeThreads % vectors == 0, "a thread copies the same vector of every row it copies");
        constexpr int copy_rows = kDecodeThreads / vectors;
        const int copy_row0 = threadIdx.x / vectors, copy_col = threadIdx.x % vectors * copy_bytes;
        const uint8_t* k_src = reinterpret_cast<const uint8_t*>(k_pool) + kv_head * row_bytes + copy_col;
        const uint8_t* v_src = reinterpret_cast<const uint8_t*>(v_pool) + kv_head * row_bytes + copy_col;
        const uint32_t slot_bytes = (uint32_t)KV * row_bytes;  // a slot's K (or V) row, every kv head
        auto copy_tile = [&](int i, int stage) {  // one group of this thread's copies (maybe empty)
            const int keys = tile_keys(i);
            uint8_t *k_stage = k_t + stage * kDecodeTile * k_row, *v_stage = v_t + stage * kDecodeTile * v_row;
            const uint32_t* slots = slot_s + i % kDecodeStages * kDecodeTile;
            FP8RL_NO_UNROLL
            for (int j = copy_row0; j < keys; j += copy_rows) {
                const size_t at = (size_t)slots[j] * slot_bytes;
                __pipeline_memcpy_async(k_stage + j * k_row + copy_col, k_src + at, copy_bytes);
                __pipeline_memcpy_async(v_stage + j * v_row + copy_col, v_src + at, copy_bytes);
            }
            // the last tile's value rows past its keys, up to its last 16-key step, zeros (no copy writes them)
            constexpr int row_vectors = (row_bytes < 16 ? 16 : row_bytes) / 16;
            FP8RL_NO_UNROLL
            for (int e = threadIdx.x; e < ((keys + 15) / 16 * 16 - keys) * row_vectors; e += kDecodeThreads)
                reinterpret_cast<uint4*>(v_stage + (keys + e / row_vectors) * v_row)[e % row_vectors] = make_uint4(0u, 0u, 0u, 0u);
            __pipeline_commit();
        };
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        const int g8 = lane / 4, t4 = lane % 4;  // a fragment's row group and thread in group (mma.cuh)
        FP8RL_NO_UNROLL
        for (int e = threadIdx.x; e < min(tiles, kDecodeStages) * kDecodeTile; e += kDecodeThreads)
            if (e % kDecodeTile < tile_keys(e / kDecodeTile)) slot_s[e] = tile_slot(e / kDecodeTile, e % kDecodeTile);
        __syncthreads();  // the first tiles' slots (and q, P's pads and the statistics) are written
        copy_tile(0, 0);
        // Q K^T: the warp's query tile and n8 blocks of keys; q's A fragments, once
        const int score_tile = warp / qt_warps;
        const bool scoring = score_tile < query_tiles;  // warp-uniform
        uint32_t qa[k_steps][4];
        if (scoring)
            for (int s = 0; s < k_steps; s++) ldmatrix_a_fragment(qa[s], q_h + score_tile * 16 * ld + 16 * s, ld);
        // P V: the warp's items it = warp + warps * j (query tile it / d_items, columns d_item * (it % d_items)
        // on), their O as C fragments; column pv_col(nt, e) of an item holds C element e of its n8 tile nt
        float o[warp_items][n_tiles][4] = {};
        auto pv_col = [&](int nt, int e) {
            const int j = c_fragment_col(e);
            return fp8 ? 16 * (nt >> 1) + 2 * j + (nt & 1) : 8 * nt + j;
        };
        for (int i = 0; i < tiles; i++) {
            const int stage = i % kDecodeStages, keys = tile_keys(i);
            // the slot of this lane's key of tile i + kDecodeStages, read now, stored once tile i has landed
            const bool slot_lane = warp == 0 && i + kDecodeStages < tiles && lane < tile_keys(i + kDecodeStages);
            const uint32_t next_slot = slot_lane ? tile_slot(i + kDecodeStages, lane) : 0u;
            if (i + 1 < tiles) copy_tile(i + 1, (i + 1) % kDecodeStages);
            else __pipeline_commit();  // an empty group: the wait below always leaves one group in flight
            __pipeline_wait_prior(1);  // this thread's copies of tile i have landed
            __syncthreads();           // every thread's have
            if (slot_lane) slot_s[stage * kDecodeTile + lane] = next_slot;  // where tile i's were (its copies read them)
            const uint8_t *k_land = k_t + stage * kDecodeTile * k_row, *v_land = v_t + stage * kDecodeTile * v_row;
            // S = Q K^T: a warp per (16 queries, 8 keys); keys past the tile's score what their rows hold,
            // never read; columns past D are zeros
            if (scoring)
                for (int j = 0; j < QT; j++) {
                    const int n0 = (warp % qt_warps + qt_warps * j) * 8;
                    if (n0 >= keys) continue;  // the warp's keys are all past the tile's (warp-uniform)
                    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    const uint8_t* k_at = k_land + (n0 + g8) * k_row;
                    for (int s = 0; s < k_steps; s++) {
                        uint32_t b[2];
                        for (int r = 0; r < 2; r++) {
                            const int d = 16 * s + 2 * t4 + 8 * r;
                            if (D % 16 != 0 && d >= D) b[r] = 0u;  // D = 8: k padded to 16
                            else if (fp8) b[r] = e4m3x2_to_bf16x2(*reinterpret_cast<const uint16_t*>(k_at + d));
                            else b[r] = load_bf16_pair(reinterpret_cast<const __nv_bfloat16*>(k_at) + d);
                        }
                        mma_m16n8k16(c, qa[s], b);
                    }
                    for (int e = 0; e < 4; e++) {
                        const int g = score_tile * 16 + c_fragment_row(e), key = n0 + c_fragment_col(e);
                        if (g < queries) p_s[g * kDecodeTile + key] = c[e];
                    }
                }
            __syncthreads();  // the scores are written
            FP8RL_NO_UNROLL
            for (int g = warp; g < queries; g += warps) {  // a warp per query, a lane per key
                const float s = lane < keys ? p_s[g * kDecodeTile + lane] * ks * scale : -INFINITY;
                // lane 0 owns the query's statistics (no lane reads them while it writes); the others get its copy
                const float old_max = __shfl_sync(0xFFFFFFFFu, lane == 0 ? max_s[g] : 0.0f, 0);
                const float new_max = fmaxf(old_max, warp_reduce(s, MaxOp()));  // finite: the tile has a key
                const float p = fast_exp(s - new_max), rescale = fast_exp(old_max - new_max);  // exp(-inf) = 0
                const float tile_sum = warp_reduce(p, SumOp());
                const __nv_bfloat16 hi = __float2bfloat16_rn(p);
                p_hi[g * kDecodePld + lane] = hi;
                p_lo[g * kDecodePld + lane] = __float2bfloat16_rn(p - __bfloat162float(hi));  // the difference exact
                if (lane == 0) {
                    max_s[g] = new_max;
                    sum_s[g] = sum_s[g] * rescale + tile_sum;
                    rescale_s[g] = rescale;
                }
            }
            __syncthreads();  // probabilities and rescale factors are written
            // O = O * rescale + P_hi V + P_lo V, per 16 keys
            for (int j = 0; j < warp_items; j++) {
                const int it = warp + warps * j, m0 = it / d_items * 16, d0 = it % d_items * d_item;
                if (it >= QT * d_items || m0 >= queries) continue;  // warp-uniform
                // the lane's two rows' factors (rows past the queries: their O and P rows stay zeros)
                const float r0 = m0 + g8 < queries ? rescale_s[m0 + g8] : 0.0f;
                const float r1 = m0 + g8 + 8 < queries ? rescale_s[m0 + g8 + 8] : 0.0f;
                for (int nt = 0; nt < n_tiles; nt++)
                    for (int e = 0; e < 4; e++) o[j][nt][e] *= e < 2 ? r0 : r1;
                FP8RL_NO_UNROLL
                for (int k0 = 0; k0 < keys; k0 += 16) {
                    uint32_t hi[4], lo[4], b[n_tiles][2];
                    ldmatrix_a_fragment(hi, p_hi + m0 * kDecodePld + k0, kDecodePld);
                    ldmatrix_a_fragment(lo, p_lo + m0 * kDecodePld + k0, kDecodePld);
                    if constexpr (fp8) {
                        // matrix i: keys k0 + 8 (i & 1) on, codes d0 + 16 (i >> 1) on as 8 BF16-sized pairs; the
                        // lane gets keys 2 t4, 2 t4 + 1 of columns 2 g8, 2 g8 + 1 (d_item 16: matrices 2, 3 repeat 0, 1)
                        const int i = lane / 8, r = lane % 8;
                        uint32_t m[4];
                        ldmatrix_x4<true>(m, reinterpret_cast<const __nv_bfloat16*>(
                                                 v_land + (k0 + r + 8 * (i & 1)) * v_row + d0 + 16 * ((i >> 1) % (d_item / 16))));
                        for (int nt = 0; nt < n_tiles; nt++)
                            for (int h = 0; h < 2; h++)  // n8 tile nt: the codes of column 2 g8 + (nt & 1)
                                b[nt][h] = e4m3x2_to_bf16x2(e4m3_column_pair(m[2 * (nt >> 1) + h], nt & 1));
                    } else {
                        const __nv_bfloat16* v_b = reinterpret_cast<const __nv_bfloat16*>(v_land);
                        for (int nt = 0; nt < n_tiles; nt += 2)
                            ldmatrix_b_fragments_kn(b[nt], b[nt + 1], v_b + k0 * (v_row / 2) + d0 + 8 * nt, v_row / 2);
                    }
                    for (int nt = 0; nt < n_tiles; nt++) {
                        mma_m16n8k16(o[j][nt], hi, b[nt]);
                        mma_m16n8k16(o[j][nt], lo, b[nt]);
                    }
                }
            }
            __syncthreads();  // every thread is done with this stage before tile i + 2's copies refill it
        }
        for (int j = 0; j < warp_items; j++) {
            const int it = warp + warps * j, m0 = it / d_items * 16, d0 = it % d_items * d_item;
            if (it >= QT * d_items || m0 >= queries) continue;
            for (int half = 0; half < 2; half++) {  // the lane's two rows: C elements 2 half, 2 half + 1
                const int g = m0 + g8 + 8 * half;
                if (g >= queries) continue;
                float* out = part_o + out_at(g) * D + d0;  // the row's place and sum once, not per element
                const float sum = sum_s[g];
                for (int nt = 0; nt < n_tiles; nt++)
                    for (int e = 2 * half; e < 2 * half + 2; e++)
                        if (d0 + pv_col(nt, e) < D) out[pv_col(nt, e)] = o[j][nt][e] * vs / sum;
            }
        }
        for (int g = threadIdx.x; g < queries; g += kDecodeThreads) part_lse[out_at(g)] = max_s[g] + fast_log(sum_s[g]);
    };
    write_partials();
}


// Page src to page dst in every layer: blockIdx.x is the layer, blockIdx.y 0 for K and 1 for V.
static __global__ void kv_copy_page_kernel(uint8_t* k_pool, uint8_t* v_pool, long layer_bytes, long page_bytes, int src,
                                           int dst) {
    uint8_t* pool = (blockIdx.y == 0 ? k_pool : v_pool) + blockIdx.x * layer_bytes;
    for (long i = threadIdx.x; i < page_bytes; i += blockDim.x) pool[dst * page_bytes + i] = pool[src * page_bytes + i];
}

// amax[h] = max |x[r][h][d]| over rows r and d < head_dim, as the bits of a non-negative float (which
// order like the values), so the blocks' atomic maxima give one result whatever their order; head h
// is blockIdx.y. NaN is skipped, as cpu/model_layers.h's max_abs skips it (x > m is false); amax
// starts at 0 (set before the launch).
static __global__ void kv_amax_kernel(float* amax, const __nv_bfloat16* x, long rows, int head_dim) {
    const int h = blockIdx.y, heads = gridDim.y;
    float m = 0.0f;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < rows * head_dim; i += (long)gridDim.x * blockDim.x) {
        const float a = fabsf(__bfloat162float(x[(i / head_dim * heads + h) * head_dim + i % head_dim]));
        m = a > m ? a : m;
    }
    m = block_reduce(m, MaxOp());
    if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned*>(amax + h), float_bits(m));
}

// FP8 KV calibration: amax (device [heads]) = per head, max |x| over x [rows][heads][head_dim]
// (device), FP32 and exact (heads 1, head_dim n: the max over n values).
inline void kv_amax_gpu(float* amax, const __nv_bfloat16* x, long rows, int heads, int head_dim, cudaStream_t stream) {
    if (rows < 0 || heads < 1 || head_dim < 1 || heads > 65535)
        fail("kv_amax_gpu: rows = %ld, heads = %d, head_dim = %d", rows, heads, head_dim);
    CUDA_CHECK(cudaMemsetAsync(amax, 0, (size_t)heads * sizeof(float), stream));
    const long n = rows * head_dim;
    if (n == 0) return;
    const long threads = 256, blocks = std::min<long>(1024, (n + threads * 8 - 1) / (threads * 8));
    LAUNCH_KERNEL(kv_amax_kernel, dim3((unsigned)blocks, (unsigned)heads), (unsigned)threads, 0, stream, amax, x, rows,
                  head_dim);
}

class PagedKvCache {
  public:
    // storage: BF16 or FP8. FP8 scales start at 1 (set_scales sets the calibrated ones).
    PagedKvCache(const KvCacheShape& shape, Precision storage) : shape_(shape), storage_(storage) {
        check_shape(shape, storage);
        const size_t pool = pool_bytes(shape, storage);
        k_pool_.resize(pool, "KV cache: K pages");
        v_pool_.resize(pool, "KV cache: V pages");
        k_scale_dev_.resize((size_t)shape.layers * shape.kv_heads, "KV cache: K scales");
        v_scale_dev_.resize((size_t)shape.layers * shape.kv_heads, "KV cache: V scales");
        set_scales(std::vector<float>(shape.layers, 1.0f), std::vector<float>(shape.layers, 1.0f));
    }

    // Device bytes of the K and V pools and their scales (the decode workspace is decode_workspace_bytes).
    static size_t bytes(const KvCacheShape& shape, Precision storage) {
        check_shape(shape, storage);
        return 2 * pool_bytes(shape, storage) + 2 * (size_t)shape.layers * shape.kv_heads * sizeof(float);
    }
    // Device bytes of one page in every layer, K and V (what a pool grows by per page).
    static size_t page_bytes(const KvCacheShape& shape, Precision storage) {
        check_shape(shape, storage);
        return 2 * (size_t)shape.layers * shape.page_tokens * shape.width() * element_bytes(storage);
    }
    const KvCacheShape& shape() const { return shape_; }
    Precision storage() const { return storage_; }

    // FP8 scales for K and V: host vectors [layers] (one per layer) or [layers][kv_heads] (one per
    // layer and KV head); set before appending (a synchronous upload: not while capturing). The
    // device holds them [layers][kv_heads] either way (a layer's scale repeated over its heads), so
    // the kernels index one layout, and reads them there: a captured graph uses the scales set last.
    void set_scales(const std::vector<float>& k_scale, const std::vector<float>& v_scale) {
        const size_t layers = (size_t)shape_.layers, heads = (size_t)shape_.kv_heads;
        if (k_scale.size() != v_scale.size() || (k_scale.size() != layers && k_scale.size() != layers * heads))
            fail("PagedKvCache::set_scales: %zu K and %zu V scales for %zu layers of %zu KV heads (one per layer, or "
                 "one per layer and KV head)", k_scale.size(), v_scale.size(), layers, heads);
        const size_t per_layer = k_scale.size() / layers;
        std::vector<float> k_dev(layers * heads), v_dev(layers * heads);
        for (size_t i = 0; i < layers * heads; i++) {
            const size_t g = i / heads * per_layer + (per_layer > 1 ? i % heads : 0);
            if (!(k_scale[g] > 0.0f) || !(v_scale[g] > 0.0f) || std::isinf(k_scale[g]) || std::isinf(v_scale[g]))
                fail("PagedKvCache::set_scales: layer %zu, KV head %zu has K scale %g, V scale %g: scales must be "
                     "positive and finite (kv_scale_from_amax gives them)", i / heads, i % heads, k_scale[g], v_scale[g]);
            k_dev[i] = k_scale[g], v_dev[i] = v_scale[g];
        }
        k_scales_ = k_scale;
        v_scales_ = v_scale;
        k_scale_dev_.upload(k_dev);
        v_scale_dev_.upload(v_dev);
    }
    const std::vector<float>& k_scales() const { return k_scales_; }
    const std::vector<float>& v_scales() const { return v_scales_; }

    // Writes the K and V rows of n tokens of `layer` (k, v: [n][kv_heads][head_dim] BF16 on the
    // device; k after k-norm and RoPE) into slots[i] = page * page_tokens + offset (device int32 [n];
    // -1: a padding row, nothing written). FP8 storage encodes x / scale (satfinite E4M3).
    void append(int layer, const __nv_bfloat16* k, const __nv_bfloat16* v, const int32_t* slots, long n,
                cudaStream_t stream) {
        check_layer("append", layer);
        if (n < 0) fail("PagedKvCache::append: n = %ld tokens", n);
        if (n == 0) return;
        const long blocks = std::min<long>(4096, (n * shape_.width() + 255) / 256);
        dispatch_storage([&](auto elem) {
            using Elem = decltype(elem);
            LAUNCH_KERNEL((kv_append_kernel<Elem>), (unsigned)blocks, 256, 0, stream, layer_pool<Elem>(k_pool_, layer),
                          layer_pool<Elem>(v_pool_, layer), layer_scales(k_scale_dev_, layer), layer_scales(v_scale_dev_, layer),
                          k, v, slots, n, shape_.width(), shape_.head_dim, shape_.slots());
        });
    }

    // What append(layer, ..., slots, ...) writes to, for a kernel that appends the K and V it
    // produces itself (a decode step's q/k-norm + RoPE): slots as append takes them.
    KvAppend append_target(int layer, const int32_t* slots) const {
        check_layer("append_target", layer);
        KvAppend a;
        a.k_pool = const_cast<uint8_t*>(k_pool_.get()) + (size_t)layer * shape_.slots() * shape_.width() * element_bytes(storage_);
        a.v_pool = const_cast<uint8_t*>(v_pool_.get()) + (size_t)layer * shape_.slots() * shape_.width() * element_bytes(storage_);
        a.k_scale = layer_scales(k_scale_dev_, layer), a.v_scale = layer_scales(v_scale_dev_, layer);
        a.slots = slots, a.slot_count = shape_.slots(), a.width = shape_.width(), a.head_dim = shape_.head_dim;
        a.fp8 = storage_ == Precision::FP8;
        return a;
    }

    // With FP8 storage, replaces n tokens' K and V rows of `layer` (as append takes them) by the values
    // the cache stores for them, rounded to BF16, so that attention over k and v (a prefill) reads
    // what decode reads from the pages; BF16 storage stores them as they are: nothing to do.
    void round_trip(int layer, __nv_bfloat16* k, __nv_bfloat16* v, long n, cudaStream_t stream) {
        check_layer("round_trip", layer);
        if (n < 0) fail("PagedKvCache::round_trip: n = %ld tokens", n);
        if (storage_ != Precision::FP8 || n == 0) return;
        const long count = n * shape_.width(), blocks = std::min<long>(4096, (count + 255) / 256);
        LAUNCH_KERNEL(kv_round_trip_kernel, (unsigned)blocks, 256, 0, stream, k, v, layer_scales(k_scale_dev_, layer),
                      layer_scales(v_scale_dev_, layer), count, shape_.width(), shape_.head_dim);
    }

    // Sizes the decode workspace for up to max_batch rows of `heads` query heads and max_len keys,
    // cut in chunks of split_keys: the partials and the work lists (per row, and per cascade group for
    // up to max_batch groups) (allocates), and allows the split kernel the shared memory of its
    // per-row and cascade CTAs: call it before capturing a graph. plan_decode and decode_attention
    // fail if a call needs more.
    void reserve_decode(int max_batch, int heads, int max_len, int split_keys = kDecodeSplitKeys) {
        check_heads("reserve_decode", heads);
        check_split("reserve_decode", split_keys);
        if (max_batch < 1 || max_len < 1)
            fail("PagedKvCache::reserve_decode: max_batch = %d rows, max_len = %d keys (need >= 1 each)", max_batch, max_len);
        const int group = heads / shape_.kv_heads;
        if (group > 16 * kDecodeMaxQueryTiles)
            fail("PagedKvCache::reserve_decode: %d query heads per kv head need %d query tiles of fragments in the "
                 "decode kernel's registers (at most %d: %d query heads per kv head)", group, (group + 15) / 16,
                 kDecodeMaxQueryTiles, 16 * kDecodeMaxQueryTiles);
        // a cascade CTA serves as many rows as its registers hold the queries of and keep it within
        // kCascadeSharedBytes (3 CTAs an SM)
        const size_t elem = element_bytes(storage_);
        cascade_rows_ = 1;
        while (cascade_rows_ < kCascadeRows && (cascade_rows_ + 1) * group <= 16 * kDecodeMaxQueryTiles &&
               decode_smem_bytes((cascade_rows_ + 1) * group, shape_.head_dim, elem) <= kCascadeSharedBytes)
            cascade_rows_++;
        const size_t smem = std::max(decode_smem_bytes(group, shape_.head_dim, elem),
                                     decode_smem_bytes(cascade_rows_ * group, shape_.head_dim, elem));
        with_head_dim("PagedKvCache::reserve_decode", shape_.head_dim, [&](auto head_dim) {
            constexpr int D = decltype(head_dim)::value;
            dispatch_storage([&](auto elem) {
                using Elem = decltype(elem);
                CUDA_CHECK(cudaFuncSetAttribute((kv_decode_split_kernel<D, Elem, 1>),
                                                cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
                CUDA_CHECK(cudaFuncSetAttribute((kv_decode_split_kernel<D, Elem, 2>),
                                                cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            });
        });
        const size_t partials = decode_partials_for(max_batch, heads, max_len, split_keys);
        part_o_.resize(partials * shape_.head_dim, "KV cache: decode partial outputs");
        part_lse_.resize(partials, "KV cache: decode partial LSE");
        item_capacity_ = decode_items_for(max_batch, max_len, split_keys);
        work_items_.resize(4 * item_capacity_, "KV cache: decode work lists");  // [per row, cascade][capacity][2]
        work_counts_.resize(2, "KV cache: decode work counts");
        decode_group_ = group;
    }
    // Device bytes reserve_decode(max_batch, heads, max_len) takes, for the memory plan.
    static size_t decode_workspace_bytes(const KvCacheShape& shape, int max_batch, int heads, int max_len) {
        return decode_partials_for(max_batch, heads, max_len, kDecodeSplitKeys) * (shape.head_dim + 1) * sizeof(float) +
               (4 * decode_items_for(max_batch, max_len, kDecodeSplitKeys) + 2) * sizeof(int32_t);
    }
    // The most rows one cascade group may hold (DecodeCascade), as reserve_decode set it; 1: no cascade.
    int cascade_rows() const { return cascade_rows_; }

    // The chunks per (row, head) decode_attention writes for rows of up to max_len keys.
    static int decode_chunks(int max_len, int split_keys = kDecodeSplitKeys) { return decode_max_chunks(max_len, split_keys); }

    // The work of a decode step (FlashInfer's plan/run split), for the decode_attention calls that
    // follow (every layer's): from the B rows' lengths lens[b] (device int32; 0: an idle row, zeros
    // written, nothing read) and prompt prefixes prefixes[b] (device, null: 0; decode_prefix_keys,
    // chunked apart), one kernel lists on the device the (row, chunk) pairs that hold keys, and
    // with a cascade (device arrays, or none) the prefix chunks of its groups of rows of one prompt,
    // computed once per tile for the group with the same bits as without. max_len >= every lens[b]
    // (keys past it are not read) fixes the lists' capacity, the split launches' grids; split_keys
    // (a multiple of kDecodeTile) the chunks (tests cut finer). No host sync, no allocation:
    // capturable in a CUDA graph, after reserve_decode; the arrays are read when the launches run.
    void plan_decode(const int32_t* lens, const int32_t* prefixes, int B, int max_len, cudaStream_t stream,
                     const DecodeCascade& cascade = DecodeCascade(), int split_keys = kDecodeSplitKeys) {
        check_split("plan_decode", split_keys);
        if (B < 0 || max_len < 0 || B > 65535)
            fail("PagedKvCache::plan_decode: B = %d rows, max_len = %d keys: need 0 <= B <= 65535 and max_len >= 0", B, max_len);
        if (max_len > INT32_MAX - split_keys)  // the kernels' FastDivisor quotients need key counts < 2^31
            fail("PagedKvCache::plan_decode: max_len = %d: at most %d keys a row", max_len, INT32_MAX - split_keys);
        const bool cascading = cascade.rows != nullptr;
        if (cascading != (cascade.start && cascade.count && cascade.shared) || cascade.max_groups < 0 ||
            (cascading && (cascade.max_groups > 65535 || !prefixes || cascade_rows_ < 2)))
            fail("PagedKvCache::plan_decode: a cascade needs rows, start, count and shared, at most 65535 groups, "
                 "the rows' prefixes and reserve_decode's room for 2 rows a CTA (%d)", cascade_rows_);
        const int chunks = decode_max_chunks(max_len, split_keys);
        if ((size_t)B * chunks > item_capacity_ ||
            (cascading && (size_t)cascade.max_groups * decode_span_chunks(max_len, split_keys) > item_capacity_))
            fail("PagedKvCache::plan_decode: %d rows (%d cascade groups) x %d chunks exceed the decode work lists (%zu "
                 "items); call reserve_decode(max batch, heads, max_len) first", B, cascade.max_groups, chunks,
                 item_capacity_);
        plan_ = DecodePlan{lens, prefixes, B, max_len, split_keys, chunks, cascading ? cascade : DecodeCascade(), true};
        if (B == 0) return;
        LAUNCH_KERNEL(kv_decode_plan_kernel, 1, kDecodePlanThreads, 0, stream, work_items_.get(),
                      work_items_.get() + 2 * item_capacity_, work_counts_.get(), lens, prefixes, B, max_len,
                      FastDivisor(split_keys), plan_.cascade);
    }

    // out [B][H][D] BF16 for the rows of the last plan_decode: for each row b, softmax(q_b k^T /
    // sqrt(D)) v over its first lens[b] cached tokens, whose pages are page_table[b * max_pages + 0
    // ..] (device int32); q [B][H][D] BF16; query head h reads kv head h / (H / kv_heads). The split
    // kernel computes the plan's (row, chunk) items into partials (decode_split), the combine kernel
    // merges each row's (decode_combine). No host sync, no allocation, no attribute call: capturable
    // in a CUDA graph. operand: also out's FP8 1x128 operand (cuda/kernels/fp8_rows.cuh), its rows
    // from B to operand.rows zero.
    void decode_attention(int layer, __nv_bfloat16* out, const __nv_bfloat16* q, int heads, const int32_t* page_table,
                          int max_pages, cudaStream_t stream, const Fp8RowsOut& operand = {}) {
        decode_split(layer, q, heads, page_table, max_pages, stream);
        decode_combine(out, heads, stream, operand);
    }
    // decode_attention's two launches apart (benchmarks time each): the split kernel over the last
    // plan's lists into the partials (the per-row list, then the cascade list), ...
    void decode_split(int layer, const __nv_bfloat16* q, int heads, const int32_t* page_table, int max_pages,
                      cudaStream_t stream) {
        check_layer("decode_attention", layer);
        const DecodePlan& p = check_decode_plan(heads);
        if (max_pages < 0 || (long)p.max_len > (long)max_pages * shape_.page_tokens)
            fail("PagedKvCache::decode_attention: max_len = %d, max_pages = %d: need max_len <= max_pages * page_tokens "
                 "(%d)", p.max_len, max_pages, shape_.page_tokens);
        if (p.B == 0) return;
        const int group = heads / shape_.kv_heads;
        const FastDivisor group_div(group), page_div(shape_.page_tokens), split_div(p.split_keys);
        with_head_dim("PagedKvCache::decode_attention", shape_.head_dim, [&](auto head_dim) {
            constexpr int D = decltype(head_dim)::value;
            dispatch_storage([&](auto elem) {
                using Elem = decltype(elem);
                auto launch = [&](long items, int queries, const DecodeCascade& c, int list) {
                    auto run = [&](auto query_tiles) {
                        constexpr int QT = decltype(query_tiles)::value;
                        LAUNCH_KERNEL((kv_decode_split_kernel<D, Elem, QT>), dim3((unsigned)items, shape_.kv_heads),
                                      kDecodeThreads, decode_smem_bytes(queries, D, sizeof(Elem)),  // allowed by reserve_decode
                                      stream, part_o_.get(), part_lse_.get(), q, layer_pool<Elem>(k_pool_, layer),
                                      layer_pool<Elem>(v_pool_, layer), layer_scales(k_scale_dev_, layer),
                                      layer_scales(v_scale_dev_, layer), page_table, max_pages, p.lens, p.prefixes,
                                      p.max_len, heads, group_div, page_div, split_div, p.chunks, c,
                                      work_items_.get() + 2 * list * item_capacity_, work_counts_.get() + list);
                    };
                    if (queries <= 16) run(std::integral_constant<int, 1>());
                    else run(std::integral_constant<int, 2>());  // reserve_decode: at most kDecodeMaxQueryTiles
                };
                launch((long)p.B * p.chunks, group, DecodeCascade(), 0);  // the per-row list
                const long group_items = (long)p.cascade.max_groups * decode_span_chunks(p.max_len, p.split_keys);
                if (p.cascade.rows && group_items > 0) launch(group_items, cascade_rows_ * group, p.cascade, 1);
            });
        });
    }
    // ... and the combine kernel from those partials into out (and operand), after decode_split on the
    // same stream.
    void decode_combine(__nv_bfloat16* out, int heads, cudaStream_t stream, const Fp8RowsOut& operand = {}) {
        const DecodePlan& p = check_decode_plan(heads);
        if (operand && operand.rows > 65535)
            fail("PagedKvCache::decode_attention: the operand's %d rows exceed a grid dimension (65535)", operand.rows);
        if (operand)
            check_fp8_rows_out("PagedKvCache::decode_attention (the output's FP8 operand)", p.B, heads * shape_.head_dim, operand);
        if (p.B == 0) return;
        DecodeOutput o;
        o.out = out, o.operand = operand, o.B = p.B;
        const FastDivisor split_div(p.split_keys);
        with_head_dim("PagedKvCache::decode_attention", shape_.head_dim, [&](auto head_dim) {
            constexpr int D = decltype(head_dim)::value;
            const int rows = std::max(p.B, operand ? operand.rows : 0), warps = kCombineThreads / 32;
            LAUNCH_KERNEL((kv_decode_combine_kernel<D>),
                          dim3((unsigned)rows, (unsigned)((group_pairs(heads * D) + warps - 1) / warps)), kCombineThreads,
                          0, stream, (const float*)part_o_.get(), (const float*)part_lse_.get(), p.lens, p.prefixes,
                          p.max_len, heads, p.chunks, split_div, o);
        });
    }

    // The LSE of each (row, head, chunk) the last decode_attention wrote, [B][H][decode_chunks(max_len)]:
    // a row's first decode_row_chunks(len, prefix) chunks (the others are not written): tests read them.
    const float* decode_chunk_lse() const { return part_lse_.get(); }

    // Copies page src to page dst in every layer, K and V (copy-on-write of a prompt's last partial
    // page when G samples share the prompt's pages).
    void copy_page(int src, int dst, cudaStream_t stream) {
        if (src < 0 || src >= shape_.pages || dst < 0 || dst >= shape_.pages)
            fail("PagedKvCache::copy_page: pages %d -> %d outside the pool [0, %d)", src, dst, shape_.pages);
        const long page_bytes = (long)shape_.page_tokens * shape_.width() * element_bytes(storage_);
        LAUNCH_KERNEL(kv_copy_page_kernel, dim3(shape_.layers, 2), 256, 0, stream, k_pool_.get(), v_pool_.get(),
                      page_bytes * shape_.pages, page_bytes, src, dst);
    }

    // The raw pools (tests): [layers][pages][page_tokens][kv_heads][head_dim] elements of
    // element_bytes(storage) bytes (BF16 bits or E4M3 codes).
    const uint8_t* k_pool() const { return k_pool_.get(); }
    const uint8_t* v_pool() const { return v_pool_.get(); }
    static size_t element_bytes(Precision storage) { return storage == Precision::FP8 ? 1 : 2; }

  private:
    KvCacheShape shape_;
    Precision storage_;
    DeviceArray<uint8_t> k_pool_, v_pool_;
    DeviceArray<float> k_scale_dev_, v_scale_dev_;  // [layers][kv_heads]
    std::vector<float> k_scales_, v_scales_;
    DeviceArray<float> part_o_, part_lse_;  // decode workspace: [B][H][chunks][D], [B][H][chunks]
    DeviceArray<int32_t> work_items_;       // the plan's lists: [per row, cascade][item_capacity_][row or group, chunk]
    DeviceArray<int32_t> work_counts_;      // [2]: the lists' lengths
    size_t item_capacity_ = 0;
    // What the last plan_decode was given (the device arrays are read when the launches run)
    struct DecodePlan {
        const int32_t *lens = nullptr, *prefixes = nullptr;
        int B = 0, max_len = 0, split_keys = kDecodeSplitKeys, chunks = 0;
        DecodeCascade cascade;
        bool made = false;
    } plan_;
    int decode_group_ = 0;  // query heads per kv head reserve_decode allowed for
    int cascade_rows_ = 1;  // rows per cascade CTA reserve_decode allowed for

    static void check_shape(const KvCacheShape& s, Precision storage) {
        if (storage != Precision::BF16 && storage != Precision::FP8)
            fail("PagedKvCache: storage %s is not supported (bf16 or fp8)", precision_name(storage));
        if (s.layers < 1 || s.kv_heads < 1 || s.page_tokens < 1 || s.pages < 1)
            fail("PagedKvCache: layers = %d, kv_heads = %d, page_tokens = %d, pages = %d: each must be >= 1", s.layers,
                 s.kv_heads, s.page_tokens, s.pages);
        with_head_dim("PagedKvCache", s.head_dim, [](auto) {});
        if (s.slots() > INT32_MAX) fail("PagedKvCache: %ld slots exceed int32 slot ids", s.slots());
    }
    static size_t pool_bytes(const KvCacheShape& s, Precision storage) {
        return (size_t)s.layers * s.slots() * s.width() * element_bytes(storage);
    }
    void check_layer(const char* who, int layer) const {
        if (layer < 0 || layer >= shape_.layers)
            fail("PagedKvCache::%s: layer %d outside [0, %d)", who, layer, shape_.layers);
    }
    // The last plan, for `heads` query heads: made, and within the decode workspace.
    const DecodePlan& check_decode_plan(int heads) const {
        check_heads("decode_attention", heads);
        const DecodePlan& p = plan_;
        if (!p.made) fail("PagedKvCache::decode_attention: no plan: call plan_decode(lens, prefixes, B, max_len) first");
        if ((size_t)p.B * heads * p.chunks > part_lse_.size() || heads / shape_.kv_heads > decode_group_)
            fail("PagedKvCache::decode_attention: %d rows x %d heads x %d chunks exceed the decode workspace (%zu "
                 "partials, %d heads per kv head); call reserve_decode(max batch, heads, max_len) first", p.B, heads,
                 p.chunks, part_lse_.size(), decode_group_);
        return p;
    }
    void check_heads(const char* who, int heads) const {
        if (heads < 1 || heads % shape_.kv_heads != 0 || heads > 65535)
            fail("PagedKvCache::%s: heads = %d must be a positive multiple of kv_heads = %d", who, heads,
                 shape_.kv_heads);
    }
    // The most (row, head, chunk) partials decode_attention writes with up to max_batch rows of max_len keys.
    static size_t decode_partials_for(int max_batch, int heads, int max_len, int split_keys) {
        return (size_t)max_batch * heads * decode_max_chunks(max_len, split_keys);
    }
    // The items of either work list for up to max_batch rows (or cascade groups) of max_len keys.
    static size_t decode_items_for(int max_batch, int max_len, int split_keys) {
        return (size_t)max_batch * decode_max_chunks(max_len, split_keys);
    }
    static void check_split(const char* who, int split_keys) {
        if (split_keys < kDecodeTile || split_keys % kDecodeTile != 0)
            fail("PagedKvCache::%s: split_keys = %d must be a positive multiple of %d", who, split_keys, kDecodeTile);
    }
    static constexpr size_t kCascadeSharedBytes = 72 * 1024;
    template <class F>
    void dispatch_storage(F f) const {
        if (storage_ == Precision::FP8)
            f(uint8_t());
        else
            f(__nv_bfloat16());
    }
    const float* layer_scales(const DeviceArray<float>& scales, int layer) const {
        return scales.get() + (size_t)layer * shape_.kv_heads;
    }
    template <class Elem>
    Elem* layer_pool(const DeviceArray<uint8_t>& pool, int layer) const {
        return reinterpret_cast<Elem*>(pool.get()) + (size_t)layer * shape_.slots() * shape_.width();
    }
};

}  // namespace fp8rl

#endif  // FP8RL_KV_CACHE_CUH
