// grad_buckets.h: ZeRO-2's gradient buckets (--zero 2, cuda/engine/engine_gpu.cuh): the parameter ranges
// the backward finishes one after the other, so each range's gradients can be reduced into their
// owners' shards as soon as they are complete, through two bucket buffers of the largest range (one
// filled while the other's reduce runs). Host
// code from the tensor table alone (rl/model/weights.h), so the memory plan (cuda/engine/memory_plan.h)
// counts the bucket the engine allocates.
//   ranges  in the table's order, which tiles [0, P): the embedding, each layer (every tensor named
//           model.layers.l.*, contiguous), the final norm, and the untied lm_head. The backward
//           visits them as lm_head (tied: the embedding's range), final norm, layers L-1 .. 0,
//           embedding; a tied embedding's range is reduced twice, once per part of its gradient.
#pragma once
#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "rl/model/config.h"
#include "rl/model/weights.h"

namespace fp8rl {

// Parameters [begin, end) of the flat parameter buffer.
struct ParamRange {
    size_t begin = 0, end = 0;
    size_t size() const { return end - begin; }
};

struct GradBuckets {
    ParamRange embed, final_norm, head;  // head: the logits matrix's range (the embedding's when tied)
    std::vector<ParamRange> layers;      // [L]
    std::vector<ParamRange> ranges;      // all of them, tiling [0, P) in the table's order
    size_t largest = 0;                  // floats of a bucket buffer
};

inline GradBuckets grad_buckets(const ModelConfig& c) {
    size_t P = 0;
    const std::vector<TensorInfo> table = tensor_layout(c, &P);
    // the first tensor of each range, then P
    std::vector<std::string> names = {"model.embed_tokens.weight"};
    for (int64_t l = 0; l < c.num_layers; l++) names.push_back(layer_tensor_name(l, "input_layernorm.weight"));
    names.push_back("model.norm.weight");
    if (!c.tie_word_embeddings) names.push_back("lm_head.weight");
    std::vector<size_t> starts;
    for (const std::string& n : names)
        for (const TensorInfo& t : table)
            if (t.name == n) starts.push_back(t.offset);
    if (starts.size() != names.size() || table.empty() || table.front().name != names.front())
        fail("internal: grad_buckets: the tensor table is not embedding, layers, norm[, lm_head]");
    starts.push_back(P);
    std::vector<ParamRange> ranges;
    for (size_t i = 0; i + 1 < starts.size(); i++) ranges.push_back({starts[i], starts[i + 1]});
    GradBuckets b;
    b.ranges = ranges;
    b.embed = ranges.front();
    b.layers.assign(ranges.begin() + 1, ranges.begin() + 1 + c.num_layers);
    b.final_norm = ranges[(size_t)c.num_layers + 1];
    b.head = c.tie_word_embeddings ? b.embed : ranges.back();
    for (const ParamRange& r : ranges) b.largest = std::max(b.largest, r.size());
    return b;
}

}  // namespace fp8rl
