// decode_slots.cuh: the decode loop's state on the device, so that decode steps run back to back
// without the host (rollout.cu). Each slot holds one running sequence: the token the next step feeds,
// its position, how many tokens it may still draw. A step's first kernel (decode_rows_kernel) turns
// the slots into the step's row inputs (token ids, positions, cache rows, lengths, sampling keys and
// positions, forced tokens); its last (decode_commit_kernel) appends each row's drawn token to its
// slot's window buffer, advances the slot and stops it on an eos id or at its limit, after which the
// slot is a padding row (nothing appended, no key read) until the host refills it. The host looks
// only once per window of steps: one copy of the window buffers and slots back, one copy of the next
// window's slots and page tables in.
//
// The control block, one device allocation and its pinned host mirror (the same layout), so each
// direction is one copy: [out | slots] is what comes back, [slots | run | table | row_slot | cascade]
// what goes in.
//   out       SampledToken [slots][window + 1]  tokens drawn in this window (+1: an admission's first)
//   slots     DecodeSlot [slots]
//   run       DecodeRun                          what every row shares (the RL step of the sampling keys)
//   table     int32 [slots][max_pages]           each slot's KV pages in position order
//   row_slot  int32 [slots]                      the slots of an admission's rows (row r samples for row_slot[r])
//   cascade   int32 [slots] rows, [slots + 1] start, [1] count, [slots] shared: the window's groups of
//             sibling slots whose prompt prefix decode attention reads once (kv_cache.cuh's DecodeCascade)
#ifndef FP8RL_CUDA_DECODE_SLOTS_CUH
#define FP8RL_CUDA_DECODE_SLOTS_CUH
#include <cstdint>

#include "cuda/common.cuh"
#include "rl/numerics/attention_tiles.h"
#include "rl/numerics/sampling.h"

namespace fp8rl {

struct DecodeSlot {
    int32_t token;      // the token the next step feeds: the last one drawn
    int32_t position;   // its position in the sequence
    int32_t generated;  // tokens of the completion so far (the sampling position is prompt + generated)
    int32_t remaining;  // tokens it may still draw; 0: a padding row
    uint32_t key;       // the sequence's sampling key (GenRequest.sequence)
    int32_t forced;     // offset of its teacher-forced completion in the forced pool; -1: sampled
    int32_t drawn;      // tokens appended to its window buffer since the host last looked
    int32_t pad;
};

struct DecodeRun {
    uint32_t step;  // the RL step of rng_uniform(seed, step, key, position)
    uint32_t pad[3];
};

// The row inputs a step reads, each [rows] (device).
struct DecodeRows {
    int32_t *ids, *pos, *cache_rows, *lens, *prefix, *forced;  // prefix: the keys of its prompt (decode_prefix_keys)
    uint32_t *keys, *sample_pos, *steps;
};

// Byte offsets of the control block's parts (16-byte aligned: each is a kernel argument's base).
struct DecodeControlLayout {
    size_t out = 0, slots = 0, run = 0, table = 0, row_slot = 0, cascade_rows = 0, cascade_start = 0, cascade_count = 0,
           cascade_shared = 0, bytes = 0;
    int out_per_slot = 0, max_pages = 0;
    DecodeControlLayout() = default;
    DecodeControlLayout(int slot_count, int window_steps, int pages) : out_per_slot(window_steps + 1), max_pages(pages) {
        auto align = [](size_t b) { return (b + 15) / 16 * 16; };
        slots = align((size_t)slot_count * out_per_slot * sizeof(SampledToken));
        run = slots + align((size_t)slot_count * sizeof(DecodeSlot));
        table = run + sizeof(DecodeRun);
        row_slot = table + align((size_t)slot_count * pages * sizeof(int32_t));
        cascade_rows = row_slot + align((size_t)slot_count * sizeof(int32_t));
        cascade_start = cascade_rows + align((size_t)slot_count * sizeof(int32_t));
        cascade_count = cascade_start + align((size_t)(slot_count + 1) * sizeof(int32_t));
        cascade_shared = cascade_count + 16;
        bytes = cascade_shared + align((size_t)slot_count * sizeof(int32_t));
    }
    size_t download_bytes() const { return run; }         // [out | slots]
    size_t upload_bytes() const { return bytes - slots; }  // [slots | run | table | row_slot | cascade]
};

// Row r of a step runs the sequence of slot row_slot[r] (row_slot null: slot r), or is a padding row
// (token 0 at position 0, no cache row, length 0: attention reads no key) when that slot draws no
// more. forced_pool: the teacher-forced completions, back to back.
static __global__ void decode_rows_kernel(DecodeRows out, const DecodeSlot* slots, const int32_t* row_slot, int rows,
                                          const DecodeRun* run, const int32_t* table, int max_pages, int page_tokens,
                                          const int32_t* forced_pool) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const int s = row_slot ? row_slot[r] : r;
    const DecodeSlot q = slots[s];
    const bool live = q.remaining > 0;
    const int32_t p = live ? q.position : 0;
    out.ids[r] = live ? q.token : 0;
    out.pos[r] = p;
    out.cache_rows[r] = live ? table[(long)s * max_pages + p / page_tokens] * page_tokens + p % page_tokens : -1;
    out.lens[r] = live ? p + 1 : 0;
    out.prefix[r] = live ? (int32_t)decode_prefix_keys(q.position - q.generated + 1, p + 1) : 0;  // its prompt's length
    out.keys[r] = live ? q.key : 0u;
    out.sample_pos[r] = live ? (uint32_t)(p + 1) : 0u;  // the drawn token's position
    out.steps[r] = run->step;
    out.forced[r] = !live ? 0 : q.forced >= 0 ? forced_pool[q.forced + q.generated] : -1;  // padding: a valid id
}

// Each live row's drawn token into its slot's window buffer out [slots][out_per_slot]; the slot then
// feeds it next, one position on, and stops on an eos id (sampled rows only: eos [n_eos]) or when it
// may draw no more.
static __global__ void decode_commit_kernel(DecodeSlot* slots, const int32_t* row_slot, int rows, const SampledToken* sampled,
                                            SampledToken* out, int out_per_slot, const int32_t* eos, int n_eos) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    DecodeSlot& q = slots[row_slot ? row_slot[r] : r];
    if (q.remaining <= 0) return;
    const SampledToken t = sampled[r];
    out[(long)(&q - slots) * out_per_slot + q.drawn++] = t;
    q.token = t.token;
    q.position++;
    q.generated++;
    q.remaining--;
    if (q.forced < 0)
        for (int e = 0; e < n_eos; e++)
            if (t.token == eos[e]) q.remaining = 0;
}

inline void decode_rows_gpu(const DecodeRows& out, const DecodeSlot* slots, const int32_t* row_slot, int rows,
                            const DecodeRun* run, const int32_t* table, int max_pages, int page_tokens,
                            const int32_t* forced_pool, cudaStream_t stream) {
    if (rows < 1) return;
    LAUNCH_KERNEL(decode_rows_kernel, (unsigned)((rows + 127) / 128), 128, 0, stream, out, slots, row_slot, rows, run, table,
                  max_pages, page_tokens, forced_pool);
}

inline void decode_commit_gpu(DecodeSlot* slots, const int32_t* row_slot, int rows, const SampledToken* sampled,
                              SampledToken* out, int out_per_slot, const int32_t* eos, int n_eos, cudaStream_t stream) {
    if (rows < 1) return;
    LAUNCH_KERNEL(decode_commit_kernel, (unsigned)((rows + 127) / 128), 128, 0, stream, slots, row_slot, rows, sampled, out,
                  out_per_slot, eos, n_eos);
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_DECODE_SLOTS_CUH
