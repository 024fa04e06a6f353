// attention_tiles.h: how the GPU attention kernels cut a row of keys, shared with the CPU engine,
// whose attention (cpu/attention.h) rounds where they round so that it can be their oracle.
//   training and prefill (cuda/kernels/attention.cuh): key tiles of kFlashTile from a sequence's first key,
//     an online softmax over them; a row's sum is held as kFlashLanes partial sums, the lanes of an
//     mma C fragment's row (lane t adds keys 8j + 2t and 8j + 2t + 1 of a tile, j = 0..7), added
//     pairwise at the end;
//   decode (kv_cache.cuh): a row's cached keys cut into chunks of kDecodeSplitKeys keys, those of
//     its prompt's whole tiles (decode_prefix_keys) apart from the rest, so the sibling rows of a
//     prompt (a group's G samples) have the same prefix chunks and one CTA can serve them all
//     (cascade attention); each chunk has its own online softmax over kDecodeTile-key tiles (a
//     tile's sum is a warp's butterfly reduction), merged by the chunks' log-sum-exps. The cut
//     depends on the row's prompt length and its own length alone, never on the batch.
#pragma once
#include "rl/numerics/fast_div.h"
#include "rl/numerics/hostdevice.h"

namespace fp8rl {

constexpr int kFlashTile = 64;   // query and key rows of a training-kernel tile (4 warps of 16 rows)
constexpr int kFlashLanes = 4;   // lanes sharing a row of a tile

constexpr int kDecodeTile = 32;           // keys per decode tile: one per lane of the warp that scores them
static_assert(kDecodeTile == 32, "a decode tile is one warp: its sum is a warp butterfly");
constexpr int kDecodeSplitKeys = 256;  // keys per chunk: a shorter one costs more in the merge than it saves

// The keys of a decode row of `len` cached keys that are its prompt's (prompt_len), down to a whole
// number of tiles: its prefix, which it shares with every row of the same prompt.
FP8RL_HD long decode_prefix_keys(long prompt_len, long len) {
    const long shared = prompt_len < len ? prompt_len : len;
    return shared < 0 ? 0 : shared / kDecodeTile * kDecodeTile;
}
// split_keys: an int, or its FastDivisor (the decode kernel's: the same quotients without a divide).
FP8RL_HD long split_quotient(long n, int split_keys) { return n / split_keys; }
FP8RL_HD long split_quotient(long n, const FastDivisor& split) { return (long)split.div((uint32_t)n); }
FP8RL_HD long split_value(int split_keys) { return split_keys; }
FP8RL_HD long split_value(const FastDivisor& split) { return (long)split.d; }
template <class Split>
FP8RL_HD int decode_span_chunks(long keys, Split split_keys) {
    return (int)split_quotient(keys + split_value(split_keys) - 1, split_keys);
}
// The chunks of a row: its prefix's, then those of its own keys, split_keys (a multiple of
// kDecodeTile) each but the last of either part.
FP8RL_HD int decode_row_chunks(long len, long prefix, int split_keys) {
    return decode_span_chunks(prefix, split_keys) + decode_span_chunks(len - prefix, split_keys);
}
// Keys [*begin, *end) of chunk c of a row (empty past its chunks).
template <class Split>
FP8RL_HD void decode_chunk_keys(long len, long prefix, Split split, int c, long* begin, long* end) {
    const int prefix_chunks = decode_span_chunks(prefix, split);
    const long split_keys = split_value(split);
    const long b = c < prefix_chunks ? (long)c * split_keys : prefix + (long)(c - prefix_chunks) * split_keys;
    const long limit = c < prefix_chunks ? prefix : len;
    *begin = b < limit ? b : len;
    *end = b < limit ? (b + split_keys < limit ? b + split_keys : limit) : len;
}
// The most chunks a row of at most max_len keys has, whatever its prefix.
FP8RL_HD int decode_max_chunks(long max_len, int split_keys) { return decode_span_chunks(max_len, split_keys) + 1; }

}  // namespace fp8rl
