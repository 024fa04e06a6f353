// memory_plan.h: the device memory the GPU engine (cuda/engine/engine_gpu.cuh) will allocate, from the
// model's shapes and the run's flags, before it allocates anything (spec-gpu.md §5): printed at the
// start of training, and a run that does not fit the device is refused with the numbers and the
// flags that would make it fit. Host code only: the figures are the engine's own allocation sizes
// written out for `tokens` tokens per forward (every buffer of a batch grows to the largest batch
// and stays), so the plan is an upper bound of what the engine holds at its largest forward.
// Two phases share the device (GpuEngine::enter_phase): the update holds the activations, backward
// buffers and head workspaces; the rollout frees them (and with --offload_train_state the FP32
// master weights, gradients and moments) and holds the KV page pool, the decode buffers and its
// prefill forward instead. The pool takes what the rollout phase leaves free (up to every slot at
// full length, or --kv_cache_mb), so a plan fits when the update fits and the rollout fits with the
// least pool a generation runs in (the longest sequence's pages): the larger of the two.
// Constants of the GPU code (the cuBLASLt workspace, the head's vocabulary chunk, ...) come in
// PlanConstants, filled by the engine from the headers that define them.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/dist/grad_buckets.h"
#include "rl/common.h"
#include "rl/model/config.h"
#include "rl/numerics/fp8_block.h"
#include "rl/model/weights.h"

namespace fp8rl {

struct PlanConstants {
    size_t gemm_workspace_bytes;  // GemmRunner's cuBLASLt workspace
    int head_vocab_chunk;         // loss.cuh's columns of logits at a time
    int head_token_block;         // ... and its tokens of logits at a time
    int head_fused_token_block;   // ... and the fused head's (forward_backward) tokens at a time
    int grad_norm_threads, grad_norm_max_blocks;  // cuda/engine/global_norm.cuh's partial sums
    int column_sum_chunk_rows;    // cuda/kernels/column_sum.cuh's rows per partial
};

struct MemoryPlanRequest {
    int64_t tokens = 0;            // the most tokens one forward holds (the micro-batch)
    bool recompute_layer = false;  // --recompute layer
    bool reference_policy = false; // a frozen copy for the KL term (a second engine without optimizer)
    int optimizer_shards = 1;      // ranks the FP32 master and AdamW moments are split over (ZeRO-1; 1 = none)
    int gradient_shards = 1;       // ranks the FP32 gradients are split over, through a bucket (ZeRO-2; 1 = none)
    int64_t longest_sequence = 1;  // a micro-batch holds at least one sequence, however long
    Fp8Scaling fp8_scaling = Fp8Scaling::Block;  // --fp8_scaling: the FP8 copies' and operands' scales
    bool one_fp8_weight_copy = false;  // EngineOptions::one_fp8_weight_copy (rollout and training in fp8, block)
    bool fp8_weights = true;           // EngineOptions::fp8_weights (false: a bf16 run, no FP8 weight copies)
    bool offload_train_state = false;  // --offload_train_state 1: master, moments (and gradients) off the device in the rollout
    // generation (rollout.cu's rollout_memory): its decode buffers, the KV page pool it asks for (every slot
    // at full length, or --kv_cache_mb) and the least it runs in, and the tokens of its largest prefill forward
    size_t rollout_bytes = 0, kv_pool_bytes = 0, kv_pool_min_bytes = 0, kv_page_bytes = 0;
    int64_t rollout_tokens = 0;
};

// What the KV pool leaves of the device for cuBLASLt's and NCCL's own allocations and the
// allocator's rounding (which DeviceArray does not count).
constexpr size_t kPoolHeadroomBytes = 1ull << 30;

struct MemoryPlan {
    MemoryPlanRequest request;
    size_t params = 0;
    // bytes on one device
    size_t master = 0, gradients = 0, adam_m = 0, adam_v = 0, bf16_copy = 0, fp8_copies = 0;
    size_t grad_bucket = 0;  // ZeRO-2's two bucket buffers (each of cuda/dist/grad_buckets.h's largest range)
    size_t activations = 0;  // the forward's per micro-batch (by --recompute), ids, positions, RoPE table
    size_t backward = 0;     // the backward's activation gradients and column-sum scratch
    size_t head = 0;         // the log-prob head's workspaces (logits, with the dlogits over them, ...)
    size_t gemm_scratch = 0; // the cuBLASLt workspace and the FP8 copies of GEMM operands
    size_t reference = 0;    // the KL reference's weights and forward buffers
    size_t reference_state = 0;  // ... of which its weights (the rest it frees for the rollout)
    // the rollout phase: the prefill forward (one activation set) with its GEMM scratch, the decode
    // buffers, the KV page pool asked for and the least it runs in (its page size)
    size_t rollout_forward = 0, rollout_buffers = 0, kv_pool = 0, kv_pool_min = 0, kv_page = 0;

    size_t train_state() const { return master + gradients + adam_m + adam_v; }
    size_t weights() const { return bf16_copy + fp8_copies + grad_bucket; }
    size_t update_peak() const {
        return train_state() + weights() + activations + backward + head + gemm_scratch + reference;
    }
    // Without the KV pool: what the rollout phase holds beside it.
    size_t rollout_fixed() const {
        return (request.offload_train_state ? 0 : train_state()) + weights() + reference_state + rollout_forward + rollout_buffers;
    }
    // The pool on a device of `device_bytes`: what the rollout phase leaves (less kPoolHeadroomBytes),
    // at most the pool asked for, in whole pages; 0 when not even the least fits.
    size_t kv_pool_on(size_t device_bytes) const;
    size_t rollout_peak(size_t device_bytes) const { return rollout_fixed() + kv_pool_on(device_bytes); }
    // The rollout phase's least: its least pool, and the headroom the pool leaves.
    size_t rollout_min() const { return kv_page ? rollout_fixed() + kv_pool_min + kPoolHeadroomBytes : rollout_fixed(); }
    // The least device memory the run needs: the larger phase, the rollout with its least pool.
    size_t total() const { return std::max(update_peak(), rollout_min()); }
    // Bytes over PCIe per step with --offload_train_state 1: the master weights and moments out and back.
    size_t offload_bytes_per_step() const { return 2 * (master + adam_m + adam_v); }
};


// PCIe Gen5 x16 between pinned host memory and an H100: 64 GB/s per direction in theory (128 GB/s
// both ways, NVIDIA's H100 PCIe figure); a pinned copy reaches about 80% of a link's rate, so the
// plan prices --offload_train_state at 50 GB/s (docs/gpu-engine.md, "Phases").
constexpr double kPcieBytesPerSecond = 50e9;

inline size_t MemoryPlan::kv_pool_on(size_t device_bytes) const {
    const size_t fixed = rollout_fixed() + kPoolHeadroomBytes;
    if (kv_page == 0 || device_bytes <= fixed) return 0;
    const size_t pool = std::min(kv_pool, (device_bytes - fixed) / kv_page * kv_page);
    return pool >= kv_pool_min ? pool : 0;
}

inline double gib(size_t bytes) { return (double)bytes / (1024.0 * 1024.0 * 1024.0); }
inline double mib(size_t bytes) { return (double)bytes / (1024.0 * 1024.0); }
inline std::string bytes_text(size_t bytes) { return bytes >= (1u << 30) ? strfmt("%.2f GiB", gib(bytes)) : strfmt("%.1f MiB", mib(bytes)); }

namespace memory_plan_detail {

inline long round_up(long n, long m) { return (n + m - 1) / m * m; }

// The FP8 copies of every projection at a granularity: codes and transposed codes, both scale
// tensors; at row and tensor also the requantization's amax scratch (the largest projection's).
inline size_t fp8_copy_bytes(const ModelConfig& c, Fp8Scaling scaling) {
    const int C = (int)c.hidden_size, Q = (int)c.q_dim(), Kd = (int)c.kv_dim(), I = (int)c.intermediate_size;
    const int shapes[7][2] = {{Q, C}, {Kd, C}, {Kd, C}, {C, Q}, {I, C}, {I, C}, {C, I}};  // [N][K] of q k v o gate up down
    const Fp8Layout layout = fp8_weight_layout(scaling);
    size_t per_layer = 0, amax_words = 0;
    for (const auto& s : shapes) {
        per_layer += 2 * (size_t)s[0] * s[1] +
                     sizeof(float) * (fp8_scale_count(layout, s[0], s[1]) + fp8_scale_count(layout, s[1], s[0]));
        amax_words = std::max(amax_words, fp8_amax_words(scaling, s[0], s[1]));
    }
    return per_layer * (size_t)c.num_layers + sizeof(uint32_t) * amax_words;
}

// The engine's four fused projections of a layer, [N][K]: [q|k|v], o, [gate|up], down.
inline std::vector<std::pair<int, int>> fused_projection_shapes(const ModelConfig& c) {
    const int C = (int)c.hidden_size, Q = (int)c.q_dim(), Kd = (int)c.kv_dim(), I = (int)c.intermediate_size;
    return {{Q + 2 * Kd, C}, {C, Q}, {2 * I, C}, {C, I}};
}

// One FP8 weight copy: every projection's 128x128-block codes and scales, and one transposed copy
// (the largest projection's), made before each dgrad.
inline size_t one_fp8_copy_bytes(const ModelConfig& c) {
    size_t per_layer = 0, codes_t = 0, scales_t = 0;
    for (const auto& [N, K] : fused_projection_shapes(c)) {
        per_layer += (size_t)N * K + sizeof(float) * blk128_scale_count(N, K);
        codes_t = std::max(codes_t, (size_t)N * K);
        scales_t = std::max(scales_t, sizeof(float) * blk128_scale_count(K, N));
    }
    return per_layer * (size_t)c.num_layers + codes_t + scales_t;
}
// Floats of the projections in [P], and of the largest layer's parameter range.
inline size_t projection_floats(const ModelConfig& c) {
    size_t n = 0;
    for (const auto& [N, K] : fused_projection_shapes(c)) n += (size_t)N * K;
    return n * (size_t)c.num_layers;
}
inline size_t largest_layer_floats(const ModelConfig& c) {
    size_t n = 0;
    for (const ParamRange& r : grad_buckets(c).layers) n = std::max(n, r.size());
    return n;
}

// prepare_batch carves its activations on 256-byte boundaries (cuBLASLt's default alignment
// assumption; FP8 GEMM operands need 16): each carve wastes less than this, and it counts the
// carves of a forward (every layer's x, up to 11 per activation set in BF16 and 5 in FP32, 5 + 6 more).
constexpr size_t CARVE_ALIGN_BYTES = 256;
inline size_t forward_carve_slack(long layers, long sets) { return CARVE_ALIGN_BYTES * (size_t)(layers + 16 * sets + 11); }

// The buffers of one forward of T tokens (prepare_batch): ids, positions, targets, sequence offsets
// (at most T sequences), the RoPE table (at most T positions), BF16 activations and FP32 statistics.
// An fp8 training forward keeps xn1, xn2 and a as their transposed FP8 operands (codes and 1x128
// scales: 1 + 4 / 128 bytes a value) in the rooms of the BF16 tensors (2 bytes a value).
inline size_t forward_bytes(const ModelConfig& c, long T, bool recompute) {
    const long Tp = round_up(T, 128), C = c.hidden_size, Q = c.q_dim(), Kd = c.kv_dim(), I = c.intermediate_size;
    const long L = c.num_layers, H = c.num_heads, KV = c.num_kv_heads, D = c.head_dim;
    const long N = Q + 2 * Kd;  // the fused [q|k|v] projection's outputs
    const long inner = Tp * (3 * C + (c.qk_norm ? Q + Kd : 0) + 2 * Q + 2 * Kd + 3 * I);
    const long inner_f32 = T * (2 + 2 * H + KV);
    const long sets = recompute ? 1 : L;
    const size_t ids = 4 * (size_t)(Tp + T + T + T + 1), rope = 2 * sizeof(float) * (size_t)T * (size_t)(D / 2);
    return ids + rope + 2 * (size_t)(L * Tp * C + sets * inner + 4 * Tp * C + Tp * N) +
           4 * (size_t)(sets * inner_f32 + 5 * T + Tp * N) + 2 * forward_carve_slack(L, sets);
}

// The FP8 operand scratch of the linear layers (LinearScratch: two operands and their transposes,
// and at row and tensor the amax scratch).
inline size_t linear_scratch_bytes(const ModelConfig& c, long T, Fp8Scaling scaling) {
    const int Tp = (int)round_up(T, 128);
    const int max_dim = (int)std::max({c.hidden_size, c.q_dim() + 2 * c.kv_dim(), 2 * c.intermediate_size});
    const Fp8Layout layout = fp8_rows_layout(scaling);
    const size_t scales = std::max(fp8_scale_count(layout, Tp, max_dim), fp8_scale_count(layout, max_dim, Tp));
    return 2 * (2 * (size_t)Tp * max_dim + 2 * sizeof(float) * scales) + sizeof(uint32_t) * fp8_amax_words(scaling, Tp, max_dim);
}

// The head's scratch (LogprobHeadGpu): forward statistics and one tile (token block, rounded up to
// 8, x vocabulary chunk) of FP32 logits; backward the padded copies of the last token block of x, of
// the last chunk of W and of dW. A training step's (backward) logits are the larger of that tile and
// the fused head's (forward_backward: a fused block's rows, rounded up to 8, x the whole
// vocabulary), which share one array; the BF16 dlogits are written over the logits (no bytes of their own).
inline size_t head_bytes(const ModelConfig& c, long T, int chunk, int block, int fused_block, bool backward) {
    const long C = c.hidden_size, V = c.vocab_size;
    const long last = V % chunk ? V % chunk : std::min<long>(chunk, V);  // columns of the last chunk
    const bool padded_w = last % 8 != 0;
    auto rows = [&](long b) { return std::min<long>(T, b); };           // a block's rows
    auto last_rows = [&](long b) { return T - (T - 1) / b * b; };       // the last block's
    auto x_pad = [&](long b) { return last_rows(b) % 8 ? round_up(last_rows(b), 8) : 0; };
    size_t logits = 4 * (size_t)round_up(rows(block), 8) * chunk;
    size_t b = (size_t)T * (4 + 4 + 8 + 8) + (padded_w ? 2 * (size_t)round_up(last, 8) * C : 0);
    if (backward) {
        const long tail = V % chunk;  // the fused head's logits: the full chunks' columns, then the tail's padded
        logits = std::max(logits, 4 * (size_t)round_up(rows(fused_block), 8) * (size_t)(V - tail + round_up(tail, 8)));
        b += 2 * (size_t)std::max(x_pad(block), x_pad(fused_block)) * C + (padded_w ? 4 * (size_t)round_up(last, 8) * C : 0);
    }
    return b + logits;
}

// The backward's buffers: BF16 activation gradients, FP32 dgrad outputs, the head's d(log-prob) and
// d(entropy) rows and the column sums' scratch (norm weights, biases).
inline size_t backward_bytes(const ModelConfig& c, long T, int chunk_rows) {
    const long Tp = round_up(T, 128), C = c.hidden_size, Q = c.q_dim(), Kd = c.kv_dim(), I = c.intermediate_size;
    const long H = c.num_heads, KV = c.num_kv_heads, D = c.head_dim;
    auto column_scratch = [&](long rows, long n) { return (rows + chunk_rows - 1) / chunk_rows * n; };
    const long N = Q + 2 * Kd;
    const long scratch = std::max({column_scratch(T, C), column_scratch(T * H, D), column_scratch(T * KV, D),
                                   column_scratch(T, N)});
    return 2 * (size_t)(Tp * (2 * C + 3 * I + 2 * Q + 2 * Kd + N)) + 4 * (size_t)(Tp * C + T * H + 2 * T + scratch);
}

}  // namespace memory_plan_detail

inline MemoryPlan plan_memory(const ModelConfig& c, const MemoryPlanRequest& r, const PlanConstants& k) {
    using namespace memory_plan_detail;
    if (r.tokens <= 0) fail("memory plan: tokens per micro-batch must be positive (got %lld)", (long long)r.tokens);
    if (r.optimizer_shards < 1) fail("memory plan: optimizer shards %d must be at least 1", r.optimizer_shards);
    if (r.gradient_shards < 1) fail("memory plan: gradient shards %d must be at least 1", r.gradient_shards);
    MemoryPlan p;
    p.request = r;
    tensor_layout(c, &p.params);
    const size_t P = p.params, shard = (P + (size_t)r.optimizer_shards - 1) / (size_t)r.optimizer_shards;
    const size_t norm_blocks = std::min<size_t>((P + k.grad_norm_threads - 1) / k.grad_norm_threads, (size_t)k.grad_norm_max_blocks);
    const long T = r.tokens;
    p.master = 4 * shard;
    p.adam_m = 4 * shard;
    p.adam_v = 4 * shard;
    const size_t grads = r.gradient_shards > 1 ? (P + (size_t)r.gradient_shards - 1) / (size_t)r.gradient_shards : P;
    p.gradients = 4 * grads + 8 * (std::max<size_t>(norm_blocks, 1) + 2);  // + the norm's partial sums
    p.grad_bucket = r.gradient_shards > 1 ? 2 * 4 * grad_buckets(c).largest : 0;
    p.bf16_copy = 2 * P;
    p.fp8_copies = r.fp8_weights ? fp8_copy_bytes(c, r.fp8_scaling) : 0;
    if (r.one_fp8_weight_copy) {  // BF16: the other tensors, and one layer's weights for a BF16 pass
        p.bf16_copy = 2 * (P - projection_floats(c)) + 2 * largest_layer_floats(c);
        p.fp8_copies = one_fp8_copy_bytes(c);
        if (r.optimizer_shards > 1 && r.gradient_shards == 1) p.grad_bucket = 4 * largest_layer_floats(c);  // its gathers
    }
    p.activations = forward_bytes(c, T, r.recompute_layer);
    p.backward = backward_bytes(c, T, k.column_sum_chunk_rows);
    p.head = head_bytes(c, T, k.head_vocab_chunk, k.head_token_block, k.head_fused_token_block, true);
    p.gemm_scratch = k.gemm_workspace_bytes + linear_scratch_bytes(c, T, r.fp8_scaling);
    // a forward without a backward (the reference's, a prefill) keeps one activation set, as --recompute layer does
    if (r.reference_policy) {
        p.reference_state = 4 * P + p.bf16_copy + p.fp8_copies;
        p.reference = p.reference_state + forward_bytes(c, T, true) + head_bytes(c, T, k.head_vocab_chunk, k.head_token_block, k.head_fused_token_block, false) +
                      k.gemm_workspace_bytes + linear_scratch_bytes(c, T, r.fp8_scaling);
    }
    if (r.rollout_tokens > 0)
        p.rollout_forward = forward_bytes(c, r.rollout_tokens, true) + k.gemm_workspace_bytes +
                            linear_scratch_bytes(c, r.rollout_tokens, r.fp8_scaling);
    p.rollout_buffers = r.rollout_bytes;
    p.kv_pool = r.kv_pool_bytes, p.kv_pool_min = r.kv_pool_min_bytes, p.kv_page = r.kv_page_bytes;
    return p;
}

// The plan as the lines printed at start, on a device of device_bytes: the update phase's buffers,
// then the rollout phase's, each phase's peak, and the larger, which must fit.
inline std::string memory_plan_text(const MemoryPlan& p, size_t device_bytes) {
    const MemoryPlanRequest& r = p.request;
    std::string s = strfmt("memory plan (one GPU): %s for %s parameters, %lld tokens per micro-batch, --recompute %s\n",
                           bytes_text(p.total()).c_str(), std::to_string(p.params).c_str(), (long long)r.tokens,
                           r.recompute_layer ? "layer" : "none");
    auto line = [&](const char* what, size_t bytes) { s += strfmt("  %-50s %12.1f MiB\n", what, mib(bytes)); };
    const std::string shards = strfmt(" (1/%d: optimizer shards)", r.optimizer_shards);
    line(("FP32 master weights" + (r.optimizer_shards > 1 ? shards : std::string())).c_str(), p.master);
    line(("FP32 gradients" + (r.gradient_shards > 1 ? strfmt(" (1/%d: gradient shards)", r.gradient_shards) : std::string())).c_str(),
         p.gradients);
    if (r.gradient_shards > 1) line("ZeRO-2 gradient buckets (2 x largest range)", p.grad_bucket);
    line(("AdamW m" + (r.optimizer_shards > 1 ? shards : std::string())).c_str(), p.adam_m);
    line(("AdamW v" + (r.optimizer_shards > 1 ? shards : std::string())).c_str(), p.adam_v);
    if (r.one_fp8_weight_copy) {
        line("BF16 copy: embeddings, norms, head; one layer", p.bf16_copy);
        line("FP8 weight copy + scale grids; one transpose", p.fp8_copies);
        if (r.optimizer_shards > 1 && r.gradient_shards == 1) line("FP32 gather of one layer (BF16 passes)", p.grad_bucket);
    } else {
        line("BF16 weight copy", p.bf16_copy);
        line(r.fp8_weights ? "FP8 weight copies + scale grids" : "FP8 weight copies: none (no pass runs in fp8)", p.fp8_copies);
    }
    s += "  update phase (log-prob passes, training forward and backward, AdamW):\n";
    line("activations per micro-batch", p.activations);
    line("backward buffers", p.backward);
    line("log-prob head workspaces", p.head);
    line("GEMM scratch (cuBLASLt workspace, FP8 operands)", p.gemm_scratch);
    if (r.reference_policy) line("KL reference policy (weights + forward)", p.reference);
    line("update phase peak", p.update_peak());
    if (!p.kv_page) return s;  // no generation planned
    const size_t pool = p.kv_pool_on(device_bytes);
    s += strfmt("  rollout phase (generation)%s:\n",
                r.offload_train_state ? "; the FP32 master weights and moments in pinned host memory, the gradients freed" : "");
    if (r.reference_policy) line("KL reference policy (weights)", p.reference_state);
    line("prefill forward (one activation set, GEMM scratch)", p.rollout_forward);
    line("decode buffers", p.rollout_buffers);
    line(strfmt("KV page pool: %zu pages of %.0f KiB", pool / p.kv_page, p.kv_page / 1024.0).c_str(), pool);
    line("rollout phase peak", p.rollout_peak(device_bytes));
    s += strfmt("  KV pool: %zu sequences at full length (%s each; %s asked for); more run when shorter, and "
                "preemption handles the rest\n",
                p.kv_pool_min ? pool / p.kv_pool_min : 0, bytes_text(p.kv_pool_min).c_str(), bytes_text(p.kv_pool).c_str());
    if (r.offload_train_state)
        s += strfmt("  --offload_train_state 1: %s over PCIe per step (master weights and moments out before the rollout, back "
                    "after), ~%.2f s at %.0f GB/s\n",
                    bytes_text(p.offload_bytes_per_step()).c_str(), p.offload_bytes_per_step() / (kPcieBytesPerSecond), kPcieBytesPerSecond / 1e9);
    return s;
}

// What the plan's ZeRO stage splits over the ranks (ZeRO-1: master weights and moments; ZeRO-2 the
// gradients too), and its bytes on one rank.
inline std::string sharded_state_text(const MemoryPlan& p) {
    return p.request.gradient_shards > 1 ? "master weights, AdamW moments and gradients" : "master weights and AdamW moments";
}
inline size_t sharded_state_bytes(const MemoryPlan& p) {
    return p.master + p.adam_m + p.adam_v + (p.request.gradient_shards > 1 ? p.gradients : 0);
}

// An H200's and an H100's (80 GB) memory as nvidia-smi reports them (the H200's is the emulated
// device's, cuda/emu/emu_runtime.cpp): what --plan_device names for --plan_ranks.
constexpr size_t kH200Bytes = 143771ull << 20;
constexpr size_t kH100Bytes = 81559ull << 20;

// The one line that refuses a plan exceeding the device's free memory ("" when it fits): the numbers,
// then what would fit by the request's own terms (--recompute layer, the most tokens per micro-batch
// that fit) and the caller's options beyond the request (other flags, rank counts; without them,
// "more ranks"), then the caller's notes on what does not help.
inline std::string memory_plan_refusal(const ModelConfig& c, const MemoryPlanRequest& r, const PlanConstants& k,
                                       size_t free_bytes, size_t total_bytes, const std::vector<std::string>& more = {},
                                       const std::vector<std::string>& notes = {}) {
    const MemoryPlan p = plan_memory(c, r, k);
    if (p.total() <= free_bytes) return "";
    std::vector<std::string> options;
    MemoryPlanRequest alt = r;
    const bool update_fits = p.update_peak() <= free_bytes;  // then only the rollout phase's options help
    if (!r.recompute_layer && !update_fits) {
        alt.recompute_layer = true;
        const size_t with_recompute = plan_memory(c, alt, k).total();
        options.push_back(strfmt("--recompute layer (%s%s)", bytes_text(with_recompute).c_str(), with_recompute <= free_bytes ? ", fits" : ""));
    }
    int64_t fitting = 0;  // the most tokens per micro-batch that fit (with the recompute just named)
    for (int64_t lo = std::min(r.longest_sequence, r.tokens), hi = update_fits ? 0 : r.tokens; lo <= hi;) {
        alt.tokens = lo + (hi - lo) / 2;
        if (plan_memory(c, alt, k).total() <= free_bytes) fitting = alt.tokens, lo = alt.tokens + 1;
        else hi = alt.tokens - 1;
    }
    if (fitting > 0) options.push_back(strfmt("--micro_batch_tokens %lld%s", (long long)fitting, r.recompute_layer ? "" : " with it"));
    options.insert(options.end(), more.begin(), more.end());
    if (more.empty() && notes.empty())
        options.push_back(strfmt("more ranks (ZeRO-%d splits the %s of %s over them)", p.request.gradient_shards > 1 ? 2 : 1,
                                 bytes_text(sharded_state_bytes(p)).c_str(), sharded_state_text(p).c_str()));
    std::string tail;
    for (size_t i = 0; i < options.size(); i++) tail += (i == 0 ? "; try " : i + 1 == options.size() ? " or " : ", ") + options[i];
    if (fitting == 0 && !update_fits)
        tail += strfmt("; no --micro_batch_tokens fits (a forward holds at least one whole sequence, %lld tokens)",
                       (long long)r.longest_sequence);
    for (const std::string& n : notes) tail += "; " + n;
    return strfmt("the memory plan needs %s of GPU memory (update phase %s: weights and optimizer %s, %lld tokens per micro-batch "
                  "%s; rollout phase %s with the least KV pool), the GPU has %s free of %s%s",
                  bytes_text(p.total()).c_str(), bytes_text(p.update_peak()).c_str(),
                  bytes_text(p.master + p.gradients + p.adam_m + p.adam_v + p.bf16_copy + p.fp8_copies + p.grad_bucket).c_str(),
                  (long long)r.tokens, bytes_text(p.activations + p.backward + p.head + p.gemm_scratch).c_str(),
                  bytes_text(p.rollout_min()).c_str(), bytes_text(free_bytes).c_str(), bytes_text(total_bytes).c_str(), tail.c_str());
}

}  // namespace fp8rl
