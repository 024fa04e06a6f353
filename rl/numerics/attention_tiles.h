// attention_tiles.h: how the GPU attention kernels cut a row of keys, shared with the CPU engine,
// whose attention (cpu/attention.h) rounds where they round so that it can be their oracle.
//   training and prefill (cuda/attention.cuh): key tiles of kFlashTile from a sequence's first key,
//     an online softmax over them; a row's sum is held as kFlashLanes partial sums, the lanes of an
//     mma C fragment's row (lane t adds keys 8j + 2t and 8j + 2t + 1 of a tile, j = 0..7), added
//     pairwise at the end;
//   decode (kv_cache.cuh): a row's cached keys cut into decode_row_splits chunks of
//     decode_split_keys keys (whole kDecodeTile tiles but the last), each with its own online
//     softmax over kDecodeTile-key tiles (a tile's sum is a warp's butterfly reduction), merged by
//     the chunks' log-sum-exps.
#pragma once
#include "rl/numerics/hostdevice.h"

namespace fp8rl {

constexpr int kFlashTile = 64;   // query and key rows of a training-kernel tile (4 warps of 16 rows)
constexpr int kFlashLanes = 4;   // lanes sharing a row of a tile

constexpr int kDecodeTile = 32;           // keys per decode tile: one per lane of the warp that scores them
static_assert(kDecodeTile == 32, "a decode tile is one warp: its sum is a warp butterfly");
constexpr int kDecodeMaxSplits = 16;      // chunks of the cache length per (row, kv head)
constexpr int kDecodeMinSplitKeys = 256;  // a chunk shorter than this costs more in the merge than it saves

// The chunks of a row of `len` cached keys: one per kDecodeMinSplitKeys keys, at most kDecodeMaxSplits
// (forced > 0: that many, for tests), each a whole number of tiles (decode_split_keys) but the last.
FP8RL_HD int decode_row_splits(long len, int forced = 0) {
    if (forced > 0) return forced;
    const long by_length = (len + kDecodeMinSplitKeys - 1) / kDecodeMinSplitKeys;
    return (int)(by_length < 1 ? 1 : by_length > kDecodeMaxSplits ? kDecodeMaxSplits : by_length);
}
FP8RL_HD long decode_split_keys(long len, int splits) {
    const long chunk = (len + splits - 1) / splits;
    return (chunk + kDecodeTile - 1) / kDecodeTile * kDecodeTile;
}

}  // namespace fp8rl
