// decode_slots.cuh: the decode loop's state on the device, so that decode steps run back to back
// without the host (rollout.cu). Each slot holds one sequence: the token the next step feeds, its
// position, how many tokens it may still draw. A step's first kernel (decode_rows_kernel) turns the
// slots its rows run into the step's row inputs (token ids, positions, cache rows, lengths, sampling
// keys and positions, forced tokens); then decode_commit_kernel appends each row's drawn token to
// its slot's window buffer, advances the slot and stops it on an eos id or at its limit; last,
// decode_refill_kernel gives each row whose slot stopped the next standby slot (a waiting request
// whose prompt is cached, its pages and first token ready), so a finished sequence's row goes on
// with another one in the next step, without the host. The host looks only once per window of
// steps: one copy of the window buffers and slots back, one copy of the next window's slots and
// page tables in.
//
// The control block, one device allocation and its pinned host mirror (the same layout), so each
// direction is one copy: [out | slots] is what comes back, [slots | run | table | row_slot |
// draw_slot | cascade] what goes in. A block for S rows has 2S slots: slot r < S is row r's at the
// window's start, slots S .. 2S - 1 are the standby requests'.
//   out       SampledToken [2S][window + 1]          tokens drawn in this window by each slot (+1: an admission's first)
//   slots     DecodeSlot [2S]
//   run       DecodeRun                              the RL step of the sampling keys; the standby slots and the next to take
//   table     int32 [2S][max_pages]                  KV pages in position order: row r's (r < S; attention reads
//                                                    these), then each standby slot's (copied to its row when taken)
//   row_slot  int32 [S]                              the slot each decode row runs (r at the window's start)
//   draw_slot int32 [2S]                             the slots whose first tokens the window's start draws (row r for draw_slot[r])
//   cascade   int32 [S] rows, [S + 1] start, [1] count, [S] shared: the window's groups of sibling rows whose
//             prompt prefix decode attention reads once (kv_cache.cuh's DecodeCascade); a refilled row leaves its group
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
    int32_t row;        // the decode row running it (-1: none yet, a standby slot not taken)
};

struct DecodeRun {
    uint32_t step;    // the RL step of rng_uniform(seed, step, key, position)
    int32_t standby;  // standby slots this window: S .. S + standby - 1
    int32_t next;     // the next standby slot a row may take (decode_refill_kernel advances it)
    int32_t pad;
};

// The row inputs a step reads, each [rows] (device).
struct DecodeRows {
    int32_t *ids, *pos, *cache_rows, *lens, *prefix, *forced;  // prefix: the keys of its prompt (decode_prefix_keys)
    uint32_t *keys, *sample_pos, *steps;
};

// Byte offsets of the control block's parts (16-byte aligned: each is a kernel argument's base).
struct DecodeControlLayout {
    size_t out = 0, slots = 0, run = 0, table = 0, row_slot = 0, draw_slot = 0, cascade_rows = 0, cascade_start = 0,
           cascade_count = 0, cascade_shared = 0, bytes = 0;
    int rows = 0, slot_count = 0, out_per_slot = 0, max_pages = 0;  // S rows, 2S slots
    DecodeControlLayout() = default;
    DecodeControlLayout(int row_count, int window_steps, int pages)
        : rows(row_count), slot_count(2 * row_count), out_per_slot(window_steps + 1), max_pages(pages) {
        auto align = [](size_t b) { return (b + 15) / 16 * 16; };
        slots = align((size_t)slot_count * out_per_slot * sizeof(SampledToken));
        run = slots + align((size_t)slot_count * sizeof(DecodeSlot));
        table = run + sizeof(DecodeRun);
        row_slot = table + align((size_t)slot_count * pages * sizeof(int32_t));
        draw_slot = row_slot + align((size_t)rows * sizeof(int32_t));
        cascade_rows = draw_slot + align((size_t)slot_count * sizeof(int32_t));
        cascade_start = cascade_rows + align((size_t)rows * sizeof(int32_t));
        cascade_count = cascade_start + align((size_t)(rows + 1) * sizeof(int32_t));
        cascade_shared = cascade_count + 16;
        bytes = cascade_shared + align((size_t)rows * sizeof(int32_t));
    }
    size_t download_bytes() const { return run; }         // [out | slots]
    size_t upload_bytes() const { return bytes - slots; }  // [slots | run | table | row_slot | draw_slot | cascade]
};

// Row r of a step runs the sequence of slot row_slot[r], or is a padding row
// (token 0 at position 0, no cache row, length 0: attention reads no key) when that slot draws no
// more. forced_pool: the teacher-forced completions, back to back.
static __global__ void decode_rows_kernel(DecodeRows out, const DecodeSlot* slots, const int32_t* row_slot, int rows,
                                          const DecodeRun* run, const int32_t* table, int max_pages, int page_tokens,
                                          const int32_t* forced_pool) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const int s = row_slot[r];
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
    DecodeSlot& q = slots[row_slot[r]];
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

// mask without its n lowest set bits
__device__ inline unsigned drop_lowest_bits(unsigned mask, int n) {
    for (int i = 0; i < n; i++) mask &= mask - 1u;
    return mask;
}

// After a step's commit: each of its `rows` rows whose slot draws no more takes the next standby
// slot that does (from run->next on; one whose first token ended it is passed over), in row order:
// its page table row is copied to the row's, which attention reads, and it leaves its cascade group
// (shared null: none), reading its prompt's pages itself. One warp, 32 rows at a time: a ballot
// marks the stopped rows and another the live standby slots of the next 32, and the k-th stopped
// row takes the k-th live slot, so the assignment is the same whatever the timing, in rows / 32
// rounds beside a decode step's milliseconds.
static __global__ void __launch_bounds__(32)
    decode_refill_kernel(DecodeSlot* slots, int32_t* row_slot, int rows, DecodeRun* run, int32_t* table, int max_pages,
                         int32_t* shared, int first_standby) {
    const int lane = threadIdx.x;
    const int end = first_standby + run->standby;
    int next = run->next;  // the same in every lane: it moves by ballots
    for (int base = 0; base < rows && next < end; base += 32) {
        const int r = base + lane;
        unsigned stopped = __ballot_sync(~0u, r < rows && slots[row_slot[r]].remaining <= 0);
        while (stopped && next < end) {
            const unsigned live = __ballot_sync(~0u, next + lane < end && slots[next + lane].remaining > 0);
            const int pairs = min(__popc(stopped), __popc(live));
            if ((stopped >> lane) & 1u) {
                const int k = __popc(stopped & ((1u << lane) - 1u));  // this row's rank among the stopped
                if (k < pairs) {
                    const int s = next + __ffs((int)drop_lowest_bits(live, k)) - 1;  // the k-th live slot
                    row_slot[r] = s;
                    slots[s].row = r;
                    for (int p = 0; p < max_pages; p++) table[(long)r * max_pages + p] = table[(long)s * max_pages + p];
                    if (shared) shared[r] = 0;
                }
            }
            if (pairs == __popc(stopped)) {  // every stopped row served: on past the last slot taken
                next += __ffs((int)drop_lowest_bits(live, pairs - 1));
            } else {  // every live slot of these 32 taken (or none live): on to the next 32
                next = min(next + 32, end);
            }
            stopped = drop_lowest_bits(stopped, pairs);  // the rows served
        }
    }
    if (lane == 0) run->next = next;
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

inline void decode_refill_gpu(DecodeSlot* slots, int32_t* row_slot, int rows, DecodeRun* run, int32_t* table, int max_pages,
                              int32_t* shared, int first_standby, cudaStream_t stream) {
    if (rows < 1) return;
    LAUNCH_KERNEL(decode_refill_kernel, 1, 32, 0, stream, slots, row_slot, rows, run, table, max_pages, shared, first_standby);
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_DECODE_SLOTS_CUH
