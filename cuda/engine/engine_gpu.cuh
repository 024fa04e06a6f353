// engine_gpu.cuh: the GPU engine behind the driver's interface (rl/driver/engine.h), the product's
// model: the forward and backward of cpu/model.h's model_forward / model_backward, step for step,
// on the device kernels of cuda/ and loss.cuh (spec-gpu.md §3).
//   state     FP32 master weights, gradients and AdamW moments [P]; the BF16 copy of every weight;
//             for the four (fused) projections of every layer the FP8 128x128-block copy and its transpose,
//             all refreshed on the device after every update (spec-gpu.md §3.1). Weights and
//             gradients cross to the host only for checkpoints and --resume.
//             With EngineOptions::one_fp8_weight_copy (rollout and training in fp8, block scaling) a
//             projection lives once, as its FP8 copy: the dgrad's transposed copy is made from it just
//             before each dgrad (exact: a square block's scale serves W and W^T), a BF16 pass casts
//             each layer's weights from the FP32 master (gathered from the shards under ZeRO) as it
//             reaches the layer, and the BF16 copy holds only the other tensors, compacted.
//   ranks     data parallel over cuda/dist/nccl.cuh's communicator (spec-gpu.md §6); with --zero 1 the
//             master weights and moments are sharded over the ranks (ZeRO-1, init_optimizer), with
//             --zero 2 the gradients too, reduced bucket by bucket as the backward finishes them,
//             overlapping the next bucket's backward (ZeRO-2, cuda/dist/grad_buckets.h).
//   numerics  activations BF16 where the CPU engine's bf16/fp8 precisions round (DESIGN.md §3), in
//             the CPU's order: the emulated build is bit-exact with the CPU engine.
//   kernels   a layer's forward is 10 launches in fp8 (9 in bf16; issue 28): residual add + RMSNorm
//             writing the FP8 operand, [q|k|v] GEMM, q/k-norm + RoPE, attention, the attention
//             output's FP8 operand, O GEMM, residual add + RMSNorm, [gate|up] GEMM, SwiGLU writing
//             the FP8 operand, down GEMM (whose output the next layer's norm adds). A training
//             forward in fp8 (block scaling) is 12: each norm is its statistics pass, then tiles
//             that write the FP8 operand and its transpose, which the backward's weight gradient
//             reads (issue 59), as SwiGLU's tiles do; no BF16 xn1, xn2 or a is stored.
//   batches   a packed batch of T tokens runs in buffers of Tp = T rounded up to 128 rows (the FP8
//             GEMMs' rule); the padding rows are zero in every GEMM operand, so they change no sum
//             and no 1x128 group's scale. Elementwise kernels run over the T real rows.
//   recompute with --recompute layer (EngineOptions::recompute_layer) the forward keeps each layer's
//             input only (and what the head needs); the rest of a layer's activations live in one
//             shared set, which the backward fills again with the layer's forward just before the
//             layer's backward: the same kernels on the same input, so the same bits.
//   rollout   generation (rollout.cu): prefill of the prompts through this forward, then batched
//             decode steps over a paged KV cache (kv_cache.cuh), one layer step shared by all three.
// fp32 is not a GPU precision: a high-precision pass (Calibrated Clipping's shadow log-probs) runs
// in BF16 with FP32 accumulation, the paper's BF16 reference (spec-gpu.md §3.3).
#ifndef FP8RL_ENGINE_GPU_CUH
#define FP8RL_ENGINE_GPU_CUH
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cpu/model.h"
#include "cuda/engine/adamw.cuh"
#include "cuda/kernels/attention.cuh"
#include "cuda/common.cuh"
#include "cuda/engine/device.cuh"
#include "cuda/engine/device_array.cuh"
#include "cuda/kernels/elementwise.cuh"
#include "cuda/kernels/embedding.cuh"
#include "cuda/kernels/kv_replay.cuh"
#include "cuda/engine/global_norm.cuh"
#include "cuda/dist/grad_buckets.h"
#include "cuda/kernels/linear.cuh"
#include "cuda/engine/memory_plan.h"
#include "cuda/engine/pinned_array.cuh"
#include "cuda/dist/nccl.cuh"
#include "cuda/perf/profile_range.h"
#include "cuda/kernels/qkv_rope.cuh"
#include "cuda/kernels/rmsnorm.cuh"
#include "cuda/kernels/rope.cuh"
#include "cuda/kernels/swiglu.cuh"
#include "fp8_gemm.cuh"
#include "rl/model/fp8_export.h"
#include "loss.cuh"
#include "rl/driver/engine.h"
#include "rl/driver/memory_fit.h"
#include "rl/model/weights.h"

namespace fp8rl {

using bf16 = __nv_bfloat16;

// One layer's activations of a batch, kept for the backward pass (device, [Tp] rows); a decode
// step keeps one set for all layers. x: the residual entering the layer; h1: after attention; qkv
// [Tp][(H + 2 KV) D] and gu [Tp][2I]: the fused projections' outputs; o and mlp: the attention and
// MLP outputs, which the next norm adds to the residual. qkv, o and mlp are one set shared by all
// layers (nothing reads them after the next kernel).
struct LayerActsGpu {
    bf16 *x, *xn1, *qkv, *qp, *kp, *q, *k, *v, *att, *o, *h1, *xn2, *gu, *a, *mlp;
    float *rstd1, *rstd_q, *rstd_k, *lse, *rstd2;
    // a training forward in fp8 at block scaling (StepRows::kept_transposes) keeps xn1, xn2 and a as
    // the QKV, gate|up and down wgrads' transposed FP8 operands, in their rooms, instead of BF16 tensors
    Fp8Transposed xn1_t, xn2_t, a_t;
};

// A kept transposed FP8 operand of a [Tp][cols] activation in the room of its BF16 tensor: codes
// [cols][Tp], then the VEC128 scales [Tp / 128][cols] (Tp cols (1 + 4 / 128) bytes < 2 Tp cols).
inline Fp8Transposed transposed_in_room(bf16* room, long Tp, long cols) {
    uint8_t* codes = reinterpret_cast<uint8_t*>(room);
    return {codes, reinterpret_cast<float*>(codes + (size_t)Tp * cols)};
}

// The rows one forward step runs over: T real rows in buffers of Tp (a multiple of 128 for the
// FP8 GEMMs; the padding rows are zero GEMM operands), their positions [T], FP32 GEMM scratch
// [Tp][max dim], the precision of the linear layers, and whether a backward follows: fp8 then keeps
// the transposed FP8 operands of its GEMM inputs (xn1, xn2, a) for the backward's weight gradients.
struct StepRows {
    long T, Tp;
    const int32_t* pos;
    float* gemm_f32;
    Precision precision;
    bool for_backward;
    Fp8Scaling scaling;
    Fp8GemmKernel fp8_gemm = Fp8GemmKernel::Cublaslt;  // the projections' FP8 GEMMs (the trainer's: --fp8_gemm_kernel)
    // The producers write their outputs' FP8 operands themselves (block scaling), or the BF16
    // tensors the GEMMs quantize (row and tensor: cuda/kernels/linear.cuh).
    bool fused_fp8() const { return precision == Precision::FP8 && scaling == Fp8Scaling::Block; }
    bool bf16_inputs() const { return precision == Precision::BF16 || !fused_fp8(); }
    // In a training forward the fp8 producers of the weight gradients' activations (the norms,
    // SwiGLU) also write their transposed FP8 operands, kept for the backward (LayerActsGpu's
    // Fp8Transposed), instead of BF16 tensors.
    bool kept_transposes() const { return fused_fp8() && for_backward; }
};

struct RolloutState;    // rollout.cu: the KV cache and decode buffers of generation
struct RolloutRequest;  // rollout.cu: one request's host-side state
struct RolloutSizes;    // rollout.cu: what generate() allocates, in elements
// rollout.cu: the device bytes generate() allocates beyond its prefill forward's (the memory plan)
struct RolloutMemory;
inline RolloutMemory rollout_memory(const ModelConfig& c, const EngineOptions& o, long requests, long longest_prompt,
                                    int max_new_tokens, Precision kv_cache);
inline size_t rollout_device_bytes(const ModelConfig& c, const EngineOptions& o, long requests, long longest_prompt,
                                   int max_new_tokens, Precision kv_cache);

// What the last generate() did (tests and logs).
struct RolloutStats {
    int64_t prefills = 0, prefill_tokens = 0, decode_steps = 0, preemptions = 0;
    int64_t windows = 0;  // windows of decode steps: the host's looks at the device (collect_window)
    int64_t replayed_tokens = 0;                      // kept tokens of preempted requests fed again at their return
    int64_t turn_fed_tokens = 0;  // the last next_turns(): tokens fed into kept caches before its first draws
    int64_t refills = 0;  // standby requests a row took on the device when its sequence stopped (decode_slots.cuh)
    int64_t graphs_captured = 0, graph_launches = 0;  // decode step graphs captured, and steps replayed from them
    int64_t cascade_rows = 0;  // rows in cascade groups (their prompt's pages read once per group), summed over windows
    int max_running = 0;                  // most sequences decoded in one step
    std::vector<float> k_scale, v_scale;  // [L] or [L][KV] (--kv_scales head): the FP8 cache's scales in use (empty for BF16)
};

class GpuEngine : public Engine {
  public:
    // dir: a HF model directory (its tokenizer and generation config are copied into checkpoints).
    explicit GpuEngine(const std::string& dir, const EngineOptions& options = {})
        : options_(options), source_dir_(dir), weights_(ModelWeights::load(dir)), model_(weights_),
          buckets_(grad_buckets(weights_.config)), head_(gemm_) {
        CUDA_CHECK(cudaStreamCreate(&stream_));
        const size_t P = weights_.num_floats();
        const bool one_copy = options_.one_fp8_weight_copy;
        if (one_copy && options_.fp8_scaling != Fp8Scaling::Block)
            fail("GpuEngine: one FP8 weight copy needs --fp8_scaling block (only a 128x128-block copy transposes exactly)");
        master_.resize(P, "FP32 master weights");
        master_.upload(weights_.master);
        size_t amax_words = 0, largest = 0;
        for (int l = 0; l < model_.L && options_.fp8_weights; l++)  // a bf16 run holds no FP8 weights
            for (int j = 0; j < kProjections; j++) {
                const LinearWeight w = model_.projection(l, (Projection)j, nullptr);
                fp8_.emplace_back(new Fp8Storage(w.N, w.K, options_.fp8_scaling, !one_copy, options_.fp8_pow2_scales));
                amax_words = std::max(amax_words, fp8_amax_words(options_.fp8_scaling, w.N, w.K));
                largest = std::max(largest, (size_t)w.N * w.K);
            }
        if (one_copy) {
            init_bf16_runs();
            size_t scales = 0, layer = 0;
            for (int l = 0; l < model_.L; l++) {
                layer = std::max(layer, buckets_.layers[l].size());
                for (int j = 0; j < kProjections; j++) {
                    const LinearWeight w = model_.projection(l, (Projection)j, nullptr);
                    scales = std::max(scales, blk128_scale_count(w.K, w.N));
                }
            }
            transposed_codes_.resize(largest, "FP8 transposed weight codes (one projection, before its dgrad)");
            transposed_scales_.resize(scales, "FP8 transposed weight scales (one projection)");
            layer_bf16_.resize(layer, "BF16 weights of one layer (a BF16 pass)");
        } else {
            bf16_.resize(P, "BF16 weight copy");
        }
        std::vector<ProjectionTiles> tiles;
        for (int l = 0; l < model_.L && options_.fp8_weights; l++) {
            const std::vector<ProjectionTiles> t = projection_tiles(l, 0);
            tiles.insert(tiles.end(), t.begin(), t.end());
        }
        if (options_.fp8_weights) projections_.reset(new ProjectionTable(tiles, P));
        if (amax_words) weight_amax_.resize(amax_words, "FP8 weight amax scratch");
        refresh_derived();
    }

    // A frozen copy (the KL reference policy): the same weights, no optimizer.
    // A frozen copy (the KL reference) samples nothing, so it has no KV cache to replay.
    GpuEngine(const GpuEngine& other) : GpuEngine(other.source_dir_, without_kv_replay(other.options_)) {
        if (other.shards_ > 1) fail("internal: a GpuEngine is copied before its optimizer shards its weights, not after");
        CUDA_CHECK(cudaMemcpy(master_.get(), other.master_.get(), master_.size() * sizeof(float), cudaMemcpyDeviceToDevice));
        refresh_derived();
    }
    GpuEngine& operator=(const GpuEngine&) = delete;

    const ModelConfig& config() const { return weights_.config; }
    size_t num_floats() const override { return weights_.num_floats(); }

    // The constants of the GPU code that the memory plan counts with.
    static PlanConstants plan_constants() {
        return {GemmRunner::WORKSPACE_BYTES, HEAD_VOCAB_CHUNK, HEAD_TOKEN_BLOCK, HEAD_FUSED_TOKEN_BLOCK, GRAD_NORM_THREADS, GRAD_NORM_MAX_BLOCKS, kColumnSumChunkRows};
    }
    static MemoryPlanRequest plan_request(const ModelConfig& c, const EngineOptions& o, const MemoryDemand& d) {
        MemoryPlanRequest r;
        r.tokens = d.tokens_per_forward;
        r.recompute_layer = o.recompute_layer;
        r.reference_policy = d.reference_policy;
        r.optimizer_shards = o.zero >= 1 ? d.ranks : 1;  // as init_optimizer shards them
        r.gradient_shards = o.zero == 2 ? d.ranks : 1;
        r.longest_sequence = d.longest_sequence;
        r.fp8_scaling = o.fp8_scaling;
        r.one_fp8_weight_copy = o.one_fp8_weight_copy;
        r.fp8_weights = o.fp8_weights;
        r.offload_train_state = o.offload_train_state;
        if (d.rollout_requests > 0) fill_rollout_request(c, o, d, r);
        return r;
    }
    static PlanRequestOf plan_request_of(const ModelConfig& c) {
        return [&c](const RunShape& s) { return plan_request(c, s.options, memory_demand_of(s)); };
    }
    // Training's memory plan (cuda/engine/memory_plan.h), checked against this device's free memory before
    // anything is allocated: a plan that does not fit fails with the numbers and the options. Resolves
    // s's --rollout_slots 0 to the slots the plan fits.
    static std::string device_memory_plan(const ModelConfig& c, RunShape& s) {
        check_device();
        size_t free_bytes = 0, total_bytes = 0;
        CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
        return fitting_memory_plan(c, s, plan_request_of(c), plan_constants(), free_bytes, total_bytes);
    }
    // --plan_ranks: the same plan against a whole device of device_bytes, with no device (rl/driver/cli.h).
    static constexpr bool plans_device_memory = true;
    static PlannedMemory offline_memory_plan(const ModelConfig& c, const RunShape& s, size_t device_bytes) {
        return plan_against(c, s, plan_request_of(c), plan_constants(), device_bytes, device_bytes);
    }
    // The memory of the device this process would train on (--plan_ranks on a GPU); 0 without one.
    static size_t own_device_bytes() {
        int devices = 0;
        if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return cudaGetLastError(), 0;
        size_t free_bytes = 0, total_bytes = 0;
        CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
        return total_bytes;
    }

    // The phases share the device (cuda/engine/memory_plan.h): entering the rollout frees the update's
    // activations, backward buffers, GEMM scratch and head workspaces (and with --offload_train_state
    // 1 moves the FP32 master weights and moments to pinned host memory and frees the gradients);
    // entering the update frees the rollout's KV pool, decode buffers and graphs (captured again at the
    // next rollout: RolloutStats::graphs_captured) and brings the state back. Each phase's device
    // high-water mark is kept (phase_peaks). Any call that needs the state enters the update itself.
    void enter_phase(Phase phase) override;
    bool phase_peaks(size_t* rollout, size_t* update) const override {
        *rollout = rollout_peak_;
        *update = phase_ == Phase::Update ? device_bytes_peak() : update_peak_;
        return true;
    }

    // rollout.cu. Generation overwrites the state the last forward_train kept for backward.
    std::vector<Generation> generate(const std::vector<GenRequest>& requests, uint32_t step, const SamplingConfig& s,
                                     Precision weights, Precision kv_cache, Progress* progress) override;
    // Teacher forcing through the same prefill and paged decode: the completion of request i is
    // tokens[i], each with its log-prob at temperature 1 (tests: decode against the forward).
    std::vector<Generation> teacher_forced(const std::vector<GenRequest>& requests,
                                           const std::vector<std::vector<int32_t>>& tokens, Precision weights,
                                           Precision kv_cache);
    // rollout.cu: multi-turn rollouts over kept KV pages (the Engine's).
    std::vector<Generation> start_turns(const std::vector<GenRequest>& requests, int max_total_tokens, uint32_t step,
                                        const SamplingConfig& s, Precision weights, Precision kv_cache, Progress* progress) override;
    std::vector<Generation> next_turns(const std::vector<TurnRequest>& turns) override;
    void end_turns() override;
    int64_t turn_fed_tokens() const override { return rollout_stats_.turn_fed_tokens; }
    // rollout.cu: the Engine's teacher forcing at the sampler's temperature, rollout_stats() kept.
    TokenValues decode_logprobs(const std::vector<Sequence>& seqs, const SamplingConfig& s, const RolloutNumerics& n) override;
    TokenValues prefill_logprobs(const std::vector<Sequence>& seqs, float temperature, const RolloutNumerics& n) override {
        TokenValues out;
        if (!seqs.empty()) forward(seqs, n.weights, false, temperature, &out, nullptr, false, &n);
        return out;
    }
    const RolloutStats& rollout_stats() const { return rollout_stats_; }
    void last_kv_scales(std::vector<float>* k_scale, std::vector<float>* v_scale) const override {
        *k_scale = rollout_stats_.k_scale, *v_scale = rollout_stats_.v_scale;
    }
    ~GpuEngine() override;

    void logprobs(const std::vector<Sequence>& seqs, Precision p, float temperature, TokenValues* logprob,
                  TokenValues* entropy) override {
        if (seqs.empty()) {  // a collective pass's share on a rank with fewer batches: the gathers alone
            if (collective_logprobs(p))
                for (int l = 0; l < model_.L; l++) load_layer_bf16(l);
            bf16_layer_ = -1;
            logprob->clear();
            if (entropy) entropy->clear();
            return;
        }
        // an FP32 pass is Calibrated Clipping's high-precision shadow (BF16 here): never replayed
        forward(seqs, p == Precision::FP32 ? Precision::BF16 : p, false, temperature, logprob, entropy, p != Precision::FP32);
    }
    // With one FP8 weight copy on N > 1 ranks a BF16 pass gathers each layer from the master shards.
    bool collective_logprobs(Precision p) const override {
        return options_.one_fp8_weight_copy && shards_ > 1 && p != Precision::FP8;
    }

    void forward_train(const std::vector<Sequence>& seqs, Precision p, float temperature, TokenValues* logprob,
                       TokenValues* entropy) override {
        if (p == Precision::FP32) fail("the GPU engine trains in bf16 or fp8 (--train_precision), not fp32");
        if (options_.one_fp8_weight_copy && p != Precision::FP8)
            fail("internal: an engine with one FP8 weight copy trains in fp8, not %s", precision_name(p));
        forward(seqs, p, true, temperature, logprob, entropy, true);
        keep_train_top1(seqs);
    }
    // The fused head (LogprobHeadGpu::forward_backward): the loss's gradients are asked for each
    // token block's rows as soon as their log-probs are known, so the block's logits serve forward
    // and backward; the same bits as forward_train() then backward() of those gradients.
    void forward_backward_train(const std::vector<Sequence>& seqs, Precision p, float temperature, TokenValues* logprob,
                                TokenValues* entropy, const TokenGradient& loss_grad) override;
    void last_train_top1(TokenValues* top1) const override { *top1 = train_top1_; }

    void backward(const TokenValues& d_logprob, const TokenValues& d_entropy) override;
    bool collective_backward() const override { return sharded_grads_; }
    // The buckets in backward()'s order, each reduced with nothing added: the other ranks' reduces.
    void backward_of_nothing() override {
        need_state();
        if (!grads_.size()) fail("GpuEngine::backward_of_nothing before init_optimizer");
        open_bucket(buckets_.head), close_bucket();
        open_bucket(buckets_.final_norm), close_bucket();
        for (int l = model_.L - 1; l >= 0; l--) open_bucket(buckets_.layers[l]), close_bucket();
        open_bucket(buckets_.embed), close_bucket();
        finish_buckets();
    }

    // Data parallel (spec-gpu.md §6). With --zero 1 on N > 1 ranks (ZeRO-1), rank r owns shard r
    // of S = ceil(P / N) parameters: its master weights, m and v are [S]; gradients stay [N * S]
    // (zero padding past P), reduce-scattered so that block r holds the sum. With --zero 2 (ZeRO-2)
    // the gradients are [S] too: the backward writes each bucket's gradients into bucket_ and
    // reduces them into their owners' shards at once (close_bucket), so they accumulate there over
    // micro-batches. Otherwise every rank owns everything (S = P) and the gradients are all-reduced.
    void init_optimizer(const AdamWConfig& cfg, const Dist& dist) override {
        const size_t P = num_floats();
        adam_ = cfg;
        comm_.reset(new Communicator(dist, options_.collective_timeout_s));
        shards_ = options_.zero >= 1 ? comm_->size() : 1;
        shard_ = (P + shards_ - 1) / shards_;
        sharded_grads_ = options_.zero == 2 && shards_ > 1;
        if (sharded_grads_) init_buckets();
        else if (options_.one_fp8_weight_copy && shards_ > 1)  // load_layer_bf16's gathers
            bucket_.resize(layer_bf16_.size(), "FP32 weights of one layer (gathered for a BF16 pass)");
        if (shards_ > 1) {  // keep this rank's shard (zero past P); the derived copies are already those of these weights
            std::vector<float> mine(shard_, 0.0f);
            CUDA_CHECK(cudaMemcpy(mine.data(), master_.get() + shard_offset(), own_params() * sizeof(float),
                                  cudaMemcpyDeviceToHost));
            master_.release();
            master_.resize(shard_, "FP32 master weights (this rank's shard)");
            master_.upload(mine);
        }
        if (sharded_grads_) grads_.resize(shard_, "FP32 gradients (this rank's shard)");
        else grads_.resize(shards_ * shard_, "FP32 gradients");
        m_.resize(shard_, "AdamW first moments (this rank's shard)");
        v_.resize(shard_, "AdamW second moments (this rank's shard)");
        grads_.zero(stream_), m_.zero(stream_), v_.zero(stream_);
        if (sharded_grads_ && comm_->rank() == 0)
            printf("GPU engine: ZeRO-2, FP32 master weights, AdamW moments and gradients in %zu shards of %zu parameters "
                   "(%.4g MB per rank), gradients reduced in buckets of up to %zu parameters (%.4g MB)\n",
                   shards_, shard_, (optimizer_state_bytes() + shard_ * sizeof(float)) / 1e6, buckets_.largest,
                   buckets_.largest * sizeof(float) / 1e6);
        else if (shards_ > 1 && comm_->rank() == 0)
            printf("GPU engine: ZeRO-1, FP32 master weights and AdamW moments in %zu shards of %zu parameters (%.4g MB per rank)\n",
                   shards_, shard_, optimizer_state_bytes() / 1e6);
        if (options_.one_fp8_weight_copy && comm_->rank() == 0)
            printf("GPU engine: one FP8 weight copy (the projections' 128x128-block copy, transposed before each dgrad; "
                   "BF16 for the other %zu parameters, and one layer's at a time in a BF16 pass)\n", bf16_.size());
        norm_partial_.resize((size_t)grad_norm_blocks(shard_), "gradient norm partial sums");
        norm_.resize(2, "gradient norm");
    }

    // ZeRO-1's shard count (1: every rank holds the whole optimizer state), and this rank's bytes of
    // FP32 master weights and AdamW moments, for the memory plan. The gradients [P] (under ZeRO-2
    // [S]) and the BF16 and FP8 copies [P] are whole on every rank.
    int optimizer_shards() const { return (int)shards_; }
    size_t optimizer_state_bytes() const { return shard_ * 3 * sizeof(float); }

    void zero_grads() override {
        need_state();
        grads_.zero(stream_);
    }

    double reduce_and_clip_grads(double max_norm) override {
        need_state();
        // under ZeRO-2 the backward has reduced every bucket into its owners' shards already
        if (shards_ == 1) comm_->all_reduce_sum(grads_.get(), shard_, stream_);
        else if (!sharded_grads_) comm_->reduce_scatter_sum(grads_.get(), shard_, stream_);
        // the norm of the whole gradient: each rank's sum of squares over its shard, summed
        float* g = own_grads();
        grad_norm_squared_gpu(g, shard_, norm_partial_.get(), norm_.get(), stream_);
        if (shards_ > 1) comm_->all_reduce_sum(norm_.get(), 1, stream_);
        clip_grad_norm_gpu(g, shard_, norm_.get(), max_norm, norm_.get() + 1, stream_);
        return norm_.download(2)[1];
    }

    // AdamW with the BF16 and FP8 copies written in the same pass (cuda/engine/adamw.cuh). Under ZeRO-1,
    // AdamW on this rank's shard, then the copies of all weights from the whole master, all-gathered:
    // every rank quantizes every FP8 block itself from the FP32 master
    // rather than gathering BF16 weights and quantized blocks: 128x128 blocks do not align with flat
    // shards, the copies stay bit for bit those of one rank (the CPU engine quantizes from FP32 too),
    // and gathering FP32 moves 4 bytes per parameter, as an all-reduce's second half does.
    void optimizer_step(double lr) override {
        PROFILE_RANGE("optimizer_step");
        need_state();
        steps_++;
        if (shards_ == 1 && options_.fp8_scaling == Fp8Scaling::Block && options_.fp8_weights) {
            adamw_update_with_fp8_gpu(master_.get(), m_.get(), v_.get(), updated_bf16(0), grads_.get(), num_floats(),
                                      *projections_, adam_, steps_, lr, stream_);
            if (options_.one_fp8_weight_copy) cast_bf16_copy(master_.get(), {0, num_floats()});
            return;
        }
        if (shards_ == 1) {  // row and tensor scales need a whole weight's amax first: the update, then the copies
            adamw_update_gpu(master_.get(), m_.get(), v_.get(), bf16_.get(), grads_.get(), num_floats(), adam_, steps_, lr,
                             stream_);
            return requantize_projections(master_.get());
        }
        if (own_params() > 0)  // the shard's padding past P stays zero
            adamw_update_gpu(master_.get(), m_.get(), v_.get(), updated_bf16(shard_offset()), own_grads(), own_params(), adam_,
                             steps_, lr, stream_);
        refresh_from_shards();
    }

    int64_t optimizer_steps() const override { return steps_; }

    // Host copies of the gradients and the master weights (this rank's shard under ZeRO-1 and 2), for tests
    // that compare engines.
    std::vector<float> gradients() {
        need_state();
        return grads_.download();
    }
    std::vector<float> master_weights() {
        need_state();
        return master_.download();
    }

    // Whole vectors [P] whatever the shard count (the shards gathered), so a checkpoint written on N
    // ranks resumes on M. Collective under ZeRO-1 and 2: every rank calls it (the driver does), and only
    // rank 0, which writes the checkpoint, receives the vectors.
    void save_state(TrainerState& s) override {
        need_state();
        s.master = gather(master_);
        if (options_.one_fp8_weight_copy && shards_ > 1) weights_.master = s.master;  // for save_hf
        s.adam_m = gather(m_);
        s.adam_v = gather(v_);
        s.optimizer_steps = steps_;
    }

    // s holds whole vectors [P]; each rank keeps its shard.
    void load_state(const TrainerState& s) override {
        need_state();
        set_state(s.master, m_.size() ? &s.adam_m : nullptr, v_.size() ? &s.adam_v : nullptr);
        steps_ = s.optimizer_steps;
    }

    // From the BF16 copy, which every rank holds whole: the file's BF16 is that same rounding of the
    // master weights, and rank 0 alone writes it. With one FP8 weight copy the projections have no
    // BF16 copy: the master rounded here, the whole master (under ZeRO the one save_state gathered).
    void save_hf(const std::string& dir) override {
        need_state();
        if (options_.one_fp8_weight_copy) {
            if (shards_ == 1) weights_.master = master_.download(num_floats());
            if (weights_.master.size() != num_floats()) fail("internal: save_hf under ZeRO runs after save_state");
            for (float& x : weights_.master) x = round_bf16(x);
        } else {
            const std::vector<bf16> w = bf16_.download(num_floats());
            weights_.master.resize(w.size());
            for (size_t i = 0; i < w.size(); i++) weights_.master[i] = __bfloat162float(w[i]);
        }
        fp8rl::save_hf(weights_, dir, source_dir_);
    }

    // The device's 128x128-block copies as they are (codes and scales downloaded, the scale grid's
    // padding included): every rank holds them whole.
    std::vector<Fp8Tensor> fp8_weight_copies() override {
        if (options_.fp8_scaling != Fp8Scaling::Block)
            fail("the FP8 export needs --fp8_scaling block (the format holds 128x128 block scales), not %s",
                 fp8_scaling_name(options_.fp8_scaling));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        std::vector<Fp8Tensor> out;
        for (int l = 0; l < model_.L; l++)
            for (int j = 0; j < kProjections; j++) {
                const LinearWeight w = model_.projection(l, (Projection)j, nullptr);
                const Fp8Storage& f = *fp8_[(size_t)l * kProjections + j];
                Fp8Tensor t;
                t.rows = w.N, t.cols = w.K, t.layout = Fp8Layout::Blk128x128;
                t.data = f.codes.download((size_t)w.N * w.K);
                t.scale_inv = f.scales.download(blk128_scale_count(w.N, w.K));
                out.push_back(std::move(t));
            }
        return out;
    }
    std::string save_hf_fp8(const std::string& dir, const std::vector<float>& master) override {
        return write_fp8_hf_files(weights_, master, fp8_weight_copies(), dir, source_dir_, options_.fp8_pow2_scales);
    }

  private:
    // The FP8 copies of one projection weight [N][K] at a granularity; without the transposed copy
    // when the engine keeps one FP8 copy (transposed_ then makes it before each dgrad).
    struct Fp8Storage {
        DeviceArray<uint8_t> codes, codes_t;
        DeviceArray<float> scales, scales_t;
        Fp8WeightCopy copy;
        Fp8Storage(int N, int K, Fp8Scaling scaling, bool transposed, bool pow2_scales)
            : codes((size_t)N * K, "FP8 weight codes"), scales(fp8_scale_count(fp8_weight_layout(scaling), N, K), "FP8 weight scales") {
            if (transposed) {
                codes_t.resize((size_t)N * K, "FP8 transposed weight codes");
                scales_t.resize(fp8_scale_count(fp8_weight_layout(scaling), K, N), "FP8 weight scales");
            }
            copy = {codes.get(), scales.get(), codes_t.get(), scales_t.get(), pow2_scales, scaling};
        }
    };
    // One FP8 weight copy: the BF16 copy's runs, each the parameters [begin, end) of [P] between two
    // projections, at `compact` in bf16_.
    struct Bf16Run {
        size_t begin, end, compact;
    };

    // First member: the device is checked before anything (cuBLASLt's handle) touches it.
    struct UsableDevice {
        UsableDevice() { check_device(); }
    } device_;
    EngineOptions options_;
    std::string source_dir_;
    ModelWeights weights_;  // config and tensor table; master values only while saving or generating
    CpuModel model_;        // shapes, tensor offsets, RoPE frequencies (the CPU engine's, shared)
    GradBuckets buckets_;   // the parameter ranges the backward finishes in turn (ZeRO-2's buckets)
    // The engine's own stream (the legacy stream cannot be captured into a graph), a blocking one:
    // DeviceArray's synchronous copies on the legacy stream stay ordered with its work. Destroyed
    // in ~GpuEngine (rollout.cu).
    cudaStream_t stream_ = nullptr;
    GemmRunner gemm_;
    LogprobHeadGpu head_;
    DeviceArray<float> master_, grads_, m_, v_;
    DeviceArray<bf16> bf16_;  // [P], or with one FP8 weight copy [the runs' floats] (wb maps an offset)
    std::vector<std::unique_ptr<Fp8Storage>> fp8_;  // [L * kProjections]
    // One FP8 weight copy: bf16_'s runs in [P] order; the dgrad's transposed copy of one projection
    // (codes [K][N], scales), made before each dgrad; a BF16 pass's weights of layer bf16_layer_
    // ([its parameter range], cast from the FP32 master as the pass reaches the layer; -1: none).
    std::vector<Bf16Run> bf16_runs_;
    DeviceArray<uint8_t> transposed_codes_;
    DeviceArray<float> transposed_scales_;
    DeviceArray<bf16> layer_bf16_;
    int bf16_layer_ = -1;
    std::unique_ptr<ProjectionTable> projections_;  // the FP8 copies' tiles, for the optimizer's pass (block)
    DeviceArray<uint32_t> weight_amax_;  // row and tensor scaling: requantize_projections' amax scratch
    AdamWConfig adam_;
    int64_t steps_ = 0;
    std::unique_ptr<Communicator> comm_;
    size_t shards_ = 1;  // ZeRO-1 and 2: the ranks (init_optimizer); 1 = unsharded
    size_t shard_ = 0;   // parameters per shard, S; master_, m_, v_ are [S]
    bool sharded_grads_ = false;  // ZeRO-2 on N > 1 ranks: grads_ is [S] too, filled through bucket_
    // ZeRO-2: two bucket buffers [2][largest range], the backward filling one while the other's
    // reduce runs; each free again once its event (on the communicator's stream) has passed.
    DeviceArray<float> bucket_;
    struct Event {
        cudaEvent_t e = nullptr;
        Event() { CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)); }
        ~Event() { cudaEventDestroy(e); }
        Event(const Event&) = delete;
        Event& operator=(const Event&) = delete;
    };
    std::unique_ptr<Event> bucket_free_[2];
    int slot_ = 0;                // the bucket buffer in use
    ParamRange open_;             // the parameters whose gradients it holds now
    std::vector<std::unique_ptr<ProjectionTable>> layer_projections_;  // ZeRO-2, block: layer l's tiles within its range
    DeviceArray<double> norm_partial_, norm_;  // [blocks], {sum of squares, norm}

    // The batch of the last forward.
    TokenBatch batch_;
    std::vector<Sequence> train_seqs_;
    TokenValues train_top1_;  // last_train_top1()
    Precision precision_ = Precision::BF16;
    bool for_backward_ = false;  // the last forward keeps what a backward reads
    Fp8GemmKernel forward_gemm_ = Fp8GemmKernel::Cublaslt;  // the last trunk_forward's (batch_rows)
    // --train_kv_replay: on during a replayed forward (and the recomputes of its backward); the rollout's
    // scales [K, V][L][KV] as the forward read them; its rows read as decode steps (replay_decode_rows);
    // whether the last training forward replayed
    bool kv_replay_ = false, train_kv_replayed_ = false;
    DeviceArray<float> kv_replay_scales_;
    DeviceArray<uint8_t> kv_replay_decode_rows_;
    float temperature_ = 1.0f;
    long T_ = 0, Tp_ = 0;
    std::vector<int32_t> target_host_, pos_host_;
    DeviceArray<int32_t> ids_, pos_, target_, cu_seqlens_;
    DeviceArray<bf16> act_bf16_;    // every BF16 activation of the batch, carved below
    DeviceArray<float> act_f32_;    // every FP32 activation (statistics, FP32 GEMM outputs)
    std::vector<LayerActsGpu> layers_;
    bf16 *hf_ = nullptr, *xf_ = nullptr;
    float *rstdf_ = nullptr, *head_logprob_ = nullptr, *head_entropy_ = nullptr, *head_lse_ = nullptr, *head_mu_ = nullptr;
    float* gemm_f32_ = nullptr;     // [Tp][qkv dim] FP32 [q|k|v] GEMM output before the bias
    DeviceArray<bf16> grad_bf16_;   // backward: dh, dxn, da, dgu, datt, dq, dk, dv, dqkv
    DeviceArray<float> grad_f32_;   // backward: the head's dx, delta, the head's row gradients, scratch
    std::unique_ptr<LinearScratch> scratch_;
    long scratch_max_tokens_ = 0;
    std::unique_ptr<DeviceRopeTable> rope_;
    // pointers into grad_bf16_ / grad_f32_ for the backward pass
    struct {
        bf16 *dh, *dxn_b, *da_b, *dgu, *datt_b, *dq, *dk, *dv, *dqkv;
        float *dxn, *delta;
    } g_{};
    float* column_scratch_ = nullptr;
    long column_scratch_floats_ = 0;
    RopeTable rope_host_;
    int max_seqlen_ = 0;

    std::unique_ptr<RolloutState> rollout_;
    RolloutStats rollout_stats_;
    // the multi-turn rollout in progress (start_turns): its requests (the kept state points into
    // them), and what its next turns draw with
    std::vector<GenRequest> turn_requests_;
    uint32_t turn_step_ = 0;
    SamplingConfig turn_sampling_;
    Precision turn_weights_ = Precision::BF16;

    // The phase the engine is in (enter_phase), the device high-water marks of the last rollout
    // phase and of the last update phase, and --offload_train_state's pinned copy of this rank's
    // master weights, m and v ([3][S]), which hold the state while offloaded_.
    Phase phase_ = Phase::Update;
    size_t rollout_peak_ = 0, update_peak_ = 0;
    PinnedArray<float> host_state_;
    bool offloaded_ = false;

    // Picks the rank's GPU (cuda/engine/device.cuh) and checks it.
    static void check_device() {
        const int device = select_device();
        std::string why = fp8_block_gemm_unsupported_reason(device);
        if (!why.empty()) fail("%s; train_rl needs a Hopper GPU (sm_90) for its FP8 block-scaled GEMMs", why.c_str());
    }

    const bf16* wb(size_t offset) const {
        if (offset == kNoTensor) return nullptr;
        if (!options_.one_fp8_weight_copy) return bf16_.get() + offset;
        auto run = std::upper_bound(bf16_runs_.begin(), bf16_runs_.end(), offset,
                                    [](size_t o, const Bf16Run& r) { return o < r.end; });  // the first run ending past offset
        if (run == bf16_runs_.end() || offset < run->begin)
            fail("internal: the BF16 copy of a projection at parameter %zu (the engine keeps one FP8 weight copy)", offset);
        return bf16_.get() + run->compact + (offset - run->begin);
    }
    // Where the backward adds the gradient of the tensor at `offset`: grads_, or under ZeRO-2 the open bucket.
    float* grad(size_t offset) const {
        if (offset == kNoTensor) return nullptr;
        if (!sharded_grads_) return grads_.get() + offset;
        if (offset < open_.begin || offset >= open_.end)
            fail("internal: a gradient at parameter %zu outside the open bucket [%zu, %zu)", offset, open_.begin, open_.end);
        return bucket_slot() + (offset - open_.begin);
    }
    float* bucket_slot() const { return bucket_.get() + (size_t)slot_ * buckets_.largest; }

    // Projection j of layer l for the GEMMs. One FP8 weight copy: its BF16 weights only while a BF16
    // pass has layer l cast (load_layer_bf16), else none, which a bf16 GEMM refuses.
    LinearDevice linear(int l, Projection j) const {
        const LinearWeight w = model_.projection(l, j, nullptr);
        const size_t offset = model_.weight_offset(l, j);
        const bf16* w16 = !options_.one_fp8_weight_copy ? bf16_.get() + offset
                          : bf16_layer_ == l            ? layer_bf16_.get() + (offset - buckets_.layers[l].begin)
                                                        : nullptr;
        return {w16, fp8_.empty() ? nullptr : &fp8_[(size_t)l * kProjections + j]->copy, w.N, w.K};
    }

    // A pass in fp8 on an engine without FP8 weights (EngineOptions::fp8_weights) is the driver's bug.
    void need_fp8_weights(Precision p) const {
        if (p == Precision::FP8 && !options_.fp8_weights)
            fail("internal: an engine without FP8 weights (a bf16 run) asked for an fp8 pass");
    }

    // One FP8 weight copy, a BF16 pass at layer l: the layer's weights in BF16 from the FP32 master
    // (under ZeRO gathered from the shards: collective, see collective_logprobs).
    void load_layer_bf16(int l) {
        const ParamRange& r = buckets_.layers[l];
        const float* w = shards_ > 1 ? gather_range(master_, r) : master_.get() + r.begin;
        cast(layer_bf16_.get(), w, (long)r.size(), stream_);
        bf16_layer_ = l;
    }

    // The BF16 copy of the parameters [r.begin, r.end) of [P] from `master`, which holds them from
    // r.begin on (the whole master: r = [0, P)). With one FP8 weight copy the runs within r only.
    void cast_bf16_copy(const float* master, ParamRange r) {
        if (!options_.one_fp8_weight_copy) return cast(bf16_.get() + r.begin, master, (long)r.size(), stream_);
        for (const Bf16Run& run : bf16_runs_) {
            const size_t a = std::max(run.begin, r.begin), b = std::min(run.end, r.end);
            if (a < b) cast(bf16_.get() + run.compact + (a - run.begin), master + (a - r.begin), (long)(b - a), stream_);
        }
    }
    // The BF16 copy bf16_ as the update writes it: one FP8 weight copy has none of the projections,
    // so its runs are cast after the update instead.
    bf16* updated_bf16(size_t offset) const { return options_.one_fp8_weight_copy ? nullptr : bf16_.get() + offset; }

    // After the master weights changed wholesale: the BF16 copy and every FP8 copy, from the whole
    // FP32 master [P].
    void refresh_derived(const float* master) {
        cast_bf16_copy(master, {0, num_floats()});
        requantize_projections(master);
    }

    // Every projection's FP8 copies from the FP32 master [P]: block in one tile pass (cuda/engine/adamw.cuh),
    // row and tensor weight by weight (requantize_layer).
    void requantize_projections(const float* master) {
        if (!options_.fp8_weights) return;
        if (options_.fp8_scaling == Fp8Scaling::Block) return requantize_projections_gpu(master, *projections_, stream_);
        for (int l = 0; l < model_.L; l++) requantize_layer(master, 0, l);
    }
    // Layer l's FP8 copies from `master`, which holds the parameters from `first` on: block in one tile
    // pass over the layer's table (ZeRO-2's, relative to its range), row and tensor by
    // fp8_gemm.cuh's fp8_requantize_weight_gpu.
    void requantize_layer(const float* master, size_t first, int l) {
        if (!options_.fp8_weights) return;
        if (options_.fp8_scaling == Fp8Scaling::Block) return requantize_projections_gpu(master, *layer_projections_[l], stream_);
        for (int j = 0; j < kProjections; j++) {
            const LinearWeight w = model_.projection(l, (Projection)j, nullptr);
            fp8_requantize_weight_gpu(master + (model_.weight_offset(l, (Projection)j) - first), w.N, w.K,
                                      fp8_[(size_t)l * kProjections + j]->copy, weight_amax_.get(), stream_);
        }
    }
    // Layer l's projections for the tile pass, at their offsets less `first`.
    std::vector<ProjectionTiles> projection_tiles(int l, size_t first) const {
        std::vector<ProjectionTiles> t;
        for (int j = 0; j < kProjections; j++) {
            const LinearWeight w = model_.projection(l, (Projection)j, nullptr);
            t.push_back({model_.weight_offset(l, (Projection)j) - first, w.N, w.K, 0, fp8_[(size_t)l * kProjections + j]->copy});
        }
        return t;
    }
    void refresh_derived() { refresh_derived(master_.get()); }

    // One FP8 weight copy: bf16_runs_ (the gaps between the projections in [P]) and bf16_ for them.
    void init_bf16_runs() {
        std::vector<ParamRange> projections;
        for (int l = 0; l < model_.L; l++)
            for (int j = 0; j < kProjections; j++) {
                const LinearWeight w = model_.projection(l, (Projection)j, nullptr);
                const size_t a = model_.weight_offset(l, (Projection)j);
                projections.push_back({a, a + (size_t)w.N * w.K});
            }
        std::sort(projections.begin(), projections.end(), [](const ParamRange& x, const ParamRange& y) { return x.begin < y.begin; });
        size_t at = 0, compact = 0;
        auto run_to = [&](size_t end) {
            if (end > at) bf16_runs_.push_back({at, end, compact}), compact += end - at;
        };
        for (const ParamRange& p : projections) run_to(p.begin), at = p.end;
        run_to(num_floats());
        bf16_.resize(compact, "BF16 copy of the embeddings, norms, biases and head");
    }

    // ZeRO-2: the bucket buffers and their events and, at block scaling, each layer's tile table
    // within its range.
    void init_buckets() {
        bucket_.resize(2 * buckets_.largest, "ZeRO-2 gradient buckets");
        for (auto& e : bucket_free_) e.reset(new Event());
        if (options_.fp8_scaling != Fp8Scaling::Block || !options_.fp8_weights) return;
        for (int l = 0; l < model_.L; l++)
            layer_projections_.emplace_back(
                new ProjectionTable(projection_tiles(l, buckets_.layers[l].begin), buckets_.layers[l].size()));
    }

    // f(owner, begin, end) for each rank's part [begin, end) of r, in rank order (the same collectives
    // in the same order on every rank).
    template <class F>
    void for_each_owner(ParamRange r, F f) const {
        for (size_t q = r.begin / shard_; q < shards_ && q * shard_ < r.end; q++)
            f((int)q, std::max(r.begin, q * shard_), std::min(r.end, (q + 1) * shard_));
    }

    // ZeRO-2 (no-ops otherwise): the backward's gradients of r go into a zeroed bucket buffer until
    // close_bucket reduces each owner's part into the owner's shard, where they add to the earlier
    // micro-batches'. Overlapped (cuda/dist/nccl.cuh): the reduces and the owner's add run on the
    // communicator's stream after the bucket's last kernel, while the engine's stream goes on with the
    // next range into the other buffer; a buffer is zeroed for reuse after its event, and
    // finish_buckets makes the engine's stream (and the host) wait for the last reduce.
    void open_bucket(ParamRange r) {
        if (!sharded_grads_) return;
        slot_ ^= 1;
        open_ = r;
        CUDA_CHECK(cudaStreamWaitEvent(stream_, bucket_free_[slot_]->e, 0));
        CUDA_CHECK(cudaMemsetAsync(bucket_slot(), 0, r.size() * sizeof(float), stream_));
    }
    void close_bucket() {
        if (!sharded_grads_) return;
        for_each_owner(open_, [&](int q, size_t a, size_t b) {
            float* part = bucket_slot() + (a - open_.begin);
            comm_->reduce_sum(part, b - a, q, stream_, /*overlap=*/true);
            if (q != comm_->rank()) return;
            float* g = grads_.get() + (a - shard_offset());
            residual_add(g, g, (const float*)part, (long)(b - a), comm_->stream());
        });
        CUDA_CHECK(cudaEventRecord(bucket_free_[slot_]->e, comm_->stream()));
        open_ = {};
    }
    void finish_buckets() {
        if (sharded_grads_) comm_->wait(stream_);
    }

    // ZeRO-2: bucket_'s first buffer [r.size()] = x's parameters r (x: master_, m_ or v_, [S] per
    // rank), each part broadcast by its owner. Collective; outside a backward (no reduce pending).
    const float* gather_range(const DeviceArray<float>& x, ParamRange r) {
        for_each_owner(r, [&](int q, size_t a, size_t b) {
            float* part = bucket_.get() + (a - r.begin);
            if (q == comm_->rank())
                CUDA_CHECK(cudaMemcpyAsync(part, x.get() + (a - shard_offset()), (b - a) * sizeof(float), cudaMemcpyDeviceToDevice,
                                           stream_));
            comm_->broadcast(part, b - a, q, stream_);
        });
        return bucket_.get();
    }

    // After the sharded master changed (an update, a load): the BF16 and FP8 copies of every weight;
    // under ZeRO-2 range by range through the bucket, so no rank holds the whole FP32 master.
    void refresh_from_shards() {
        if (!sharded_grads_) return refresh_derived(full_master());
        for (const ParamRange& r : buckets_.ranges) {
            const float* w = gather_range(master_, r);
            cast_bf16_copy(w, r);
            for (int l = 0; l < model_.L; l++)
                if (buckets_.layers[l].begin == r.begin) requantize_layer(w, r.begin, l);
        }
    }

    // This rank's shard: where it starts in [P], how many of the P parameters it holds, its gradients.
    size_t shard_offset() const { return comm_ && shards_ > 1 ? (size_t)comm_->rank() * shard_ : 0; }
    size_t own_params() const { return std::min(shard_, num_floats() - std::min(num_floats(), shard_offset())); }
    float* own_grads() const { return sharded_grads_ ? grads_.get() : grads_.get() + shard_offset(); }

    // The whole FP32 master [P]: master_ itself, or under ZeRO-1 the shards all-gathered into the
    // gradient buffer, which holds nothing between an update and the next backward (every caller
    // runs there: the update, generation, checkpoints). Collective under ZeRO-1.
    const float* full_master() {
        if (shards_ == 1) return master_.get();
        comm_->all_gather(master_.get(), grads_.get(), shard_, stream_);
        return grads_.get();
    }

    // A whole vector [P] of per-parameter state (master_, m_ or v_), gathered under ZeRO-1 into every
    // rank's gradient buffer (as full_master) and downloaded by rank 0 alone (which writes checkpoints).
    std::vector<float> gather(const DeviceArray<float>& x) {
        if (shards_ == 1) return x.download();
        if (!sharded_grads_) {
            comm_->all_gather(x.get(), grads_.get(), shard_, stream_);
            return comm_->rank() == 0 ? grads_.download(num_floats()) : std::vector<float>();
        }
        std::vector<float> whole(comm_->rank() == 0 ? num_floats() : 0);  // ZeRO-2: range by range through the bucket
        for (const ParamRange& r : buckets_.ranges) {
            const float* w = gather_range(x, r);
            if (comm_->rank() == 0)
                CUDA_CHECK(cudaMemcpy(whole.data() + r.begin, w, r.size() * sizeof(float), cudaMemcpyDeviceToHost));
        }
        return whole;
    }

    // This rank's shard of whole vectors [P] (m, v when given, else left as they are), then the
    // derived copies from the whole master.
    void set_state(const std::vector<float>& master, const std::vector<float>* m, const std::vector<float>* v) {
        const size_t begin = std::min(num_floats(), shard_offset()), n = own_params();
        for (auto [dst, src] : {std::make_pair(&master_, &master), std::make_pair(&m_, m), std::make_pair(&v_, v)}) {
            if (!src) continue;
            dst->zero(stream_);  // the last shard's padding past P
            dst->upload(src->data() + begin, n);
        }
        if (shards_ == 1) return refresh_derived();
        if (sharded_grads_) return refresh_from_shards();
        grads_.upload(master);  // scratch for the whole master
        refresh_derived(grads_.get());
    }

    // replay: K and V through the last rollout's FP8 cache when --train_kv_replay is on (kv_replay.cuh);
    // given `at` (prefill_logprobs), through its FP8 cache when it has one, whatever --train_kv_replay says.
    void forward(const std::vector<Sequence>& seqs, Precision p, bool for_backward, float temperature, TokenValues* logprob,
                 TokenValues* entropy, bool replay, const RolloutNumerics* at = nullptr);
    // forward() up to the head: the replay's scales and rows, then trunk_forward.
    void forward_to_head(const std::vector<Sequence>& seqs, Precision p, bool for_backward, float temperature, bool replay,
                         const RolloutNumerics* at);
    // The head's rows [T] (head_logprob_, head_entropy_) as response positions of seqs.
    void head_token_values(const std::vector<Sequence>& seqs, TokenValues* logprob, TokenValues* entropy);
    // forward_train's and forward_backward_train's last part: the top-1 hits of the head's rows.
    void keep_train_top1(const std::vector<Sequence>& seqs);
    // backward()'s buffers (g_, the column sums' scratch); returns the head's row gradients
    // {dlogprob, dentropy} [T], and dx (g_.dxn) zeroed for the head's dX GEMMs to add into.
    std::pair<float*, float*> backward_buffers();
    // backward() after the head: the final norm, the layers, the embedding.
    void backward_below_head();
    // Embedding, every layer and the final norm over the packed batch (xf_ [Tp][C]). kv_ready(l), when
    // given, runs once layer l's K (after k-norm and RoPE) and V are in layers_[l], before its
    // attention reads them (prefill and the FP8 KV calibration read them there: with --recompute
    // layer the next layer overwrites them).
    // fp8_gemm: the kernel of the projections' FP8 GEMMs (the trainer's passes: trainer_fp8_gemm();
    // the rollout's prefill: cuBLASLt).
    void trunk_forward(const std::vector<Sequence>& seqs, Precision p, bool for_backward, Fp8GemmKernel fp8_gemm,
                       const std::function<void(int)>& kv_ready = {});
    void prepare_batch(const std::vector<Sequence>& seqs);
    // Layer l's forward into layers_[l]; recomputing: all but its output (the next layer's input).
    void layer_forward(int l, bool recomputing, const std::function<void(int)>& kv_ready = {});
    void ensure_rope(int positions);
    void ensure_scratch(long rows);
    StepRows batch_rows() {
        return {T_, Tp_, pos_.get(), gemm_f32_, precision_, for_backward_, options_.fp8_scaling, forward_gemm_};
    }
    // The kernel of the trainer's FP8 projection GEMMs (--fp8_gemm_kernel).
    Fp8GemmKernel trainer_fp8_gemm() const { return options_.own_fp8_gemm ? Fp8GemmKernel::Own : Fp8GemmKernel::Cublaslt; }
    // The layer step shared by the training forward, prefill and decode: the residual entering the
    // layer (before's h1 + mlp into A.x, or A.x as it is when before is null) -> A.q, A.k (after
    // q/k-norm and RoPE at r.pos), A.v; then, with A.att filled by attention, A.att -> A.h1 and the
    // MLP's output A.mlp (stop_before_down: recomputing a layer whose output is kept). A decode step
    // appends K and V to the cache in the q/k-norm + RoPE kernel (append).
    void attention_inputs(LayerActsGpu& A, const LayerActsGpu* before, int l, const StepRows& r,
                          const KvAppend& append = {});
    // att_operand: A.att's FP8 operand is in the scratch already (the attention that produced A.att wrote it).
    void attention_outputs(LayerActsGpu& A, int l, const StepRows& r, bool stop_before_down, bool att_operand = false);
    void layer_backward(int l, bf16* dh);
    // y [Tp][N] = projection j of x (bf16) or of the FP8 operand x's producer wrote (fp8).
    void project(void* y, GemmOut out, const bf16* x, int l, Projection j, const StepRows& r);
    // The FP8 operand target of a [Tp][cols] GEMM input in fp8 (none in bf16).
    Fp8RowsOut fp8_operand(const StepRows& r, int cols) {
        return r.fused_fp8() ? scratch_->rows_out(0, (int)r.Tp, cols) : Fp8RowsOut{};
    }
    QkvShape qkv_shape(int l) const {
        const CpuModel& m = model_;
        const LayerTensors& w = m.layers[l];
        return {m.H, m.KV, m.D, m.eps, wb(w.bq), wb(w.q_norm), wb(w.k_norm)};
    }
    // The phases (enter_phase): the update's buffers freed; the rollout's freed (rollout.cu); the
    // optimizer state to pinned host memory and back. need_state: enters the update if the state is away.
    void release_update_buffers();
    void release_rollout();
    void offload_state();
    void restore_state();
    void need_state() {
        if (offloaded_) enter_phase(Phase::Update);
    }
    // rollout.cu
    static void fill_rollout_request(const ModelConfig& c, const EngineOptions& o, const MemoryDemand& d, MemoryPlanRequest& r);
    int pages_left(const std::vector<GenRequest>& requests, long longest_prompt, int max_new_tokens, Precision kv_cache,
                   const RolloutSizes& z) const;
    // at: an FP8 cache at its scales (decode_logprobs) instead of calibrated on the prompts;
    // kept_tokens > 0: a multi-turn rollout's first turn (start_turns), its requests' pages kept
    std::vector<Generation> rollout(const std::vector<GenRequest>& requests, const std::vector<std::vector<int32_t>>* forced,
                                    uint32_t step, const SamplingConfig& s, Precision weights, Precision kv_cache,
                                    Progress* progress, const RolloutNumerics* at = nullptr, int kept_tokens = 0);
    void run_windows(uint32_t step, Precision weights, const SamplingConfig& s, Progress* progress);
    void calibrate_kv_scales(const std::vector<GenRequest>& requests, Precision weights);
    int slots_that_fit(long requests, long longest_prompt, int max_new_tokens, Precision kv_cache) const;
    void prefill(const std::vector<int>& prompt_ids, Precision weights);
    void start_window(uint32_t step, Precision weights, const SamplingConfig& s);
    void write_cascade_groups();
    void replay_kept_tokens(const RolloutRequest& q, Precision weights);
    void collect_window(Progress* progress);
    void decode_step(int rows, int max_len, Precision weights, const SamplingConfig& s);
    void decode_launches(int rows, int max_len, Precision weights, const int32_t* table, const SamplingConfig* s);
    void sample_rows(int rows, const SamplingConfig& s);
    // dx (BF16) and the weight (and bias) gradient of projection j (dy null: its FP8 operands are in the
    // scratch, written by its producer).
    // x_t: x's transposed FP8 operand, kept by its producer (StepRows::kept_transposes), instead of x.
    void project_backward(bf16* dx, const bf16* dy, const bf16* x, int l, Projection j, size_t bias,
                          const Fp8Transposed& x_t = {});
    // project_backward in two halves: dx, then (after other kernels, which leave the scratch's slot 0
    // alone) the weight and bias gradients of the same dy
    void project_dgrad(bf16* dx, const bf16* dy, int l, Projection j);
    void project_wgrad(const bf16* dy, const bf16* x, int l, Projection j, size_t bias, const Fp8Transposed& x_t);
};


// ---------------------------------------------------------------------------------------------
// Phases (cuda/engine/memory_plan.h): the rollout and the update share the device.

inline void GpuEngine::enter_phase(Phase phase) {
    if (phase == phase_) return;
    if (phase == Phase::Rollout) {
        update_peak_ = device_bytes_peak();
        release_update_buffers();
        if (options_.offload_train_state && m_.size()) offload_state();
    } else {
        rollout_peak_ = device_bytes_peak();
        release_rollout();
        release_update_buffers();  // the prefill's, sized for the prompts
        if (offloaded_) restore_state();
    }
    phase_ = phase;
    reset_device_bytes_peak();
}

// The forward's activations, the backward's buffers, the GEMM operand scratch and the head's
// workspaces; the next forward allocates them again (a backward first needs its forward_train).
inline void GpuEngine::release_update_buffers() {
    act_bf16_.release(), act_f32_.release(), grad_bf16_.release(), grad_f32_.release();
    layers_.clear();
    train_seqs_.clear();
    scratch_.reset();
    scratch_max_tokens_ = 0;
    head_.release();
}

// --offload_train_state 1: this rank's FP32 master weights and AdamW moments into pinned host memory
// (the copies queued, then one wait before their device memory is freed); the gradients hold nothing
// between an update and the next (zero_grads starts each), so they are freed, not copied.
inline void GpuEngine::offload_state() {
    const size_t S = m_.size();
    host_state_.resize(3 * S, "FP32 master weights and AdamW moments (offloaded for the rollout)");
    const DeviceArray<float>* parts[3] = {&master_, &m_, &v_};
    for (int i = 0; i < 3; i++)
        CUDA_CHECK(cudaMemcpyAsync(host_state_.get() + i * S, parts[i]->get(), S * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    master_.release(), m_.release(), v_.release(), grads_.release();
    offloaded_ = true;
}

// Back before the update: the copies are queued on the engine's stream, ahead of the update's
// kernels, without the host waiting; the gradients zeroed as zero_grads would.
inline void GpuEngine::restore_state() {
    const size_t S = shard_;
    DeviceArray<float>* parts[3] = {&master_, &m_, &v_};
    const char* what[3] = {"FP32 master weights", "AdamW first moments", "AdamW second moments"};
    for (int i = 0; i < 3; i++) {
        parts[i]->resize(S, what[i]);
        CUDA_CHECK(cudaMemcpyAsync(parts[i]->get(), host_state_.get() + i * S, S * sizeof(float), cudaMemcpyHostToDevice, stream_));
    }
    grads_.resize(sharded_grads_ ? shard_ : shards_ * shard_, "FP32 gradients");
    grads_.zero(stream_);
    offloaded_ = false;
}

// ---------------------------------------------------------------------------------------------
// Forward.

inline void GpuEngine::prepare_batch(const std::vector<Sequence>& seqs) {
    batch_ = TokenBatch();
    for (const Sequence& s : seqs) batch_.add(s.ids);
    validate_batch(model_, batch_);
    const CpuModel& m = model_;
    T_ = batch_.num_tokens();
    Tp_ = (T_ + 127) / 128 * 128;
    const long T = T_, Tp = Tp_, C = m.C, Q = (long)m.H * m.D, Kd = (long)m.KV * m.D, I = m.I;
    // per token: ids (padded with 0), positions restarting at 0 per sequence, next-token targets
    std::vector<int32_t> ids(batch_.ids);
    ids.resize((size_t)Tp, 0);
    pos_host_.assign((size_t)T, 0), target_host_.assign((size_t)T, -1);
    std::vector<int32_t> cu(batch_.offsets.begin(), batch_.offsets.end());
    max_seqlen_ = 0;
    for (int s = 0; s < batch_.num_sequences(); s++) {
        max_seqlen_ = std::max(max_seqlen_, (int)(batch_.offsets[s + 1] - batch_.offsets[s]));
        for (long t = batch_.offsets[s]; t < batch_.offsets[s + 1]; t++) {
            pos_host_[(size_t)t] = (int32_t)(t - batch_.offsets[s]);
            if (t + 1 < batch_.offsets[s + 1]) target_host_[(size_t)t] = batch_.ids[(size_t)t + 1];
        }
    }
    ids_.resize((size_t)Tp, "token ids"), ids_.upload(ids);
    pos_.resize((size_t)T, "positions"), pos_.upload(pos_host_);
    target_.resize((size_t)T, "targets"), target_.upload(target_host_);
    cu_seqlens_.resize(cu.size(), "sequence offsets"), cu_seqlens_.upload(cu);
    ensure_rope(max_seqlen_);
    // BF16 activations, kept for the backward pass, not zeroed: the GEMMs write all Tp rows of their
    // outputs, the producers of GEMM inputs (norms, SwiGLU, FP8 operands) write the padding rows as
    // zeros, and the attention output's padding rows are zeroed below. Every layer's input x; the rest of a layer's activations (`inner`) per layer, or with
    // --recompute layer one set that every layer's forward, and its recomputation just before its
    // backward, writes.
    const long N = m.qkv_dim();
    const long inner = Tp * (3 * C + (m.qk_norm ? Q + Kd : 0) + 2 * Q + 2 * Kd + 3 * I);
    const long inner_f32 = T * (2 + 2 * m.H + m.KV);  // rstd1, rstd2, rstd_q, rstd_k, lse
    const long sets = options_.recompute_layer || !for_backward_ ? 1 : m.L;  // a forward without a backward keeps one set
    // Every carve starts on a 256-byte boundary (memory_plan.h's CARVE_ALIGN_BYTES): T-sized FP32 buffers would
    // leave the next one 8-byte aligned when T % 4 != 0, and FP8 GEMMs need 16 (their D: gemm_f32_).
    const size_t slack = memory_plan_detail::forward_carve_slack(m.L, sets);
    act_bf16_.resize((size_t)(m.L * Tp * C + sets * inner + 4 * Tp * C + Tp * N) + slack / sizeof(bf16), "BF16 activations");
    act_f32_.resize((size_t)(sets * inner_f32 + 5 * T + Tp * N) + slack / sizeof(float), "FP32 activation statistics");
    bf16* b = act_bf16_.get();
    float* f = act_f32_.get();
    const long align_b = memory_plan_detail::CARVE_ALIGN_BYTES / sizeof(bf16), align_f = memory_plan_detail::CARVE_ALIGN_BYTES / sizeof(float);
    auto take_b = [&](long n) { bf16* r = b; b += memory_plan_detail::round_up(n, align_b); return r; };
    auto take_f = [&](long n) { float* r = f; f += memory_plan_detail::round_up(n, align_f); return r; };
    layers_.assign(m.L, LayerActsGpu{});
    for (LayerActsGpu& a : layers_) a.x = take_b(Tp * C);
    // shared by all layers: the [q|k|v] output (split at once) and the two branches (added at once)
    bf16 *const qkv = take_b(Tp * N), *const o = take_b(Tp * C), *const mlp = take_b(Tp * C);
    for (long l = 0; l < m.L; l++) {
        LayerActsGpu& a = layers_[(size_t)l];
        if (l >= sets) {  // recompute: the shared set
            bf16* x = a.x;
            a = layers_[0];
            a.x = x;
            continue;
        }
        a.xn1 = take_b(Tp * C), a.qkv = qkv;
        a.qp = m.qk_norm ? take_b(Tp * Q) : nullptr, a.kp = m.qk_norm ? take_b(Tp * Kd) : nullptr;
        a.q = take_b(Tp * Q), a.k = take_b(Tp * Kd), a.v = take_b(Tp * Kd), a.att = take_b(Tp * Q);
        a.h1 = take_b(Tp * C), a.xn2 = take_b(Tp * C), a.gu = take_b(Tp * 2 * I), a.a = take_b(Tp * I);
        a.xn1_t = transposed_in_room(a.xn1, Tp, C), a.xn2_t = transposed_in_room(a.xn2, Tp, C);
        a.a_t = transposed_in_room(a.a, Tp, I);
        a.o = o, a.mlp = mlp;
        if (Tp > T)  // attention writes T rows; its output's padding rows are GEMM operands
            CUDA_CHECK(cudaMemsetAsync(a.att + T * Q, 0, (size_t)(Tp - T) * Q * sizeof(bf16), stream_));
        a.rstd1 = take_f(T), a.rstd_q = take_f(T * m.H), a.rstd_k = take_f(T * m.KV), a.lse = take_f(T * m.H);
        a.rstd2 = take_f(T);
    }
    hf_ = take_b(Tp * C), xf_ = take_b(Tp * C);
    rstdf_ = take_f(T), head_logprob_ = take_f(T), head_entropy_ = take_f(T), head_lse_ = take_f(T), head_mu_ = take_f(T);
    gemm_f32_ = take_f(Tp * N);
    ensure_scratch(Tp);
}

inline void GpuEngine::ensure_rope(int positions) {
    if (rope_ && rope_host_.positions >= positions) return;
    rope_host_ = RopeTable{model_.D / 2, model_.inv_freq, {}, {}, 0};
    rope_host_.ensure(positions);
    rope_.reset();  // freed before the larger one is allocated: the memory plan counts one
    rope_.reset(new DeviceRopeTable(rope_host_));
}

inline void GpuEngine::ensure_scratch(long rows) {
    if (scratch_ && scratch_max_tokens_ >= rows) return;
    const CpuModel& m = model_;
    // the widest GEMM operand: an input [rows][C, H D or I], an output gradient [rows][C, qkv dim or 2I]
    const long max_dim = std::max({(long)m.C, (long)m.qkv_dim(), 2L * m.I});
    scratch_.reset();  // freed before the larger one is allocated: the memory plan counts one
    scratch_.reset(new LinearScratch((int)rows, (int)max_dim, options_.fp8_pow2_scales, options_.fp8_scaling));
    scratch_max_tokens_ = rows;
}

inline void GpuEngine::project(void* y, GemmOut out, const bf16* x, int l, Projection j, const StepRows& r) {
    linear_forward_gpu(gemm_, *scratch_, r.precision, linear(l, j), x, (int)r.Tp, y, out, stream_, r.fp8_gemm);
}

inline void GpuEngine::attention_inputs(LayerActsGpu& A, const LayerActsGpu* before, int l, const StepRows& r,
                                        const KvAppend& append) {
    const CpuModel& m = model_;
    const LayerTensors& w = m.layers[l];
    bf16* xn = r.bf16_inputs() ? A.xn1 : nullptr;
    const Fp8Transposed xn_t = r.kept_transposes() ? A.xn1_t : Fp8Transposed{};
    if (before)
        residual_rmsnorm_forward(xn, A.rstd1, A.x, before->h1, before->mlp, wb(w.ln1), r.T, m.C, m.eps, stream_,
                                 fp8_operand(r, m.C), r.Tp, xn_t);
    else
        rmsnorm_forward(xn, A.rstd1, (const bf16*)A.x, wb(w.ln1), r.T, m.C, m.eps, stream_, fp8_operand(r, m.C), r.Tp, xn_t);
    const QkvOut out{A.q, A.k, A.v, A.qp, A.kp, A.rstd_q, A.rstd_k};
    if (w.bq == kNoTensor) {
        project(A.qkv, GemmOut::BF16, A.xn1, l, kQKV, r);
        qkv_rope_forward(out, (const bf16*)A.qkv, r.T, r.pos, rope_->view(), qkv_shape(l), stream_, append);
    } else {  // the bias joins the FP32 product before the one BF16 rounding, as on the CPU
        project(r.gemm_f32, GemmOut::F32, A.xn1, l, kQKV, r);
        qkv_rope_forward(out, (const float*)r.gemm_f32, r.T, r.pos, rope_->view(), qkv_shape(l), stream_, append);
    }
}

inline void GpuEngine::attention_outputs(LayerActsGpu& A, int l, const StepRows& r, bool stop_before_down, bool att_operand) {
    const CpuModel& m = model_;
    const LayerTensors& w = m.layers[l];
    const long Q = (long)m.H * m.D;
    if (r.fused_fp8() && !att_operand) quantize_rows_gpu(A.att, (int)r.T, (int)Q, fp8_operand(r, (int)Q), stream_);
    project(A.o, GemmOut::BF16, A.att, l, kO, r);
    residual_rmsnorm_forward(r.bf16_inputs() ? A.xn2 : nullptr, A.rstd2, A.h1, A.x, A.o, wb(w.ln2), r.T, m.C, m.eps,
                             stream_, fp8_operand(r, m.C), r.Tp, r.kept_transposes() ? A.xn2_t : Fp8Transposed{});
    project(A.gu, GemmOut::BF16, A.xn2, l, kGateUp, r);
    if (r.kept_transposes())  // a's two FP8 operands from one tile, no BF16 a
        swiglu_forward_fp8(A.gu, r.T, r.Tp, m.I, fp8_operand(r, m.I), A.a_t, stream_);
    else
        swiglu_forward(r.bf16_inputs() ? A.a : nullptr, (const bf16*)A.gu, r.T, m.I, stream_, fp8_operand(r, m.I), r.Tp);
    if (stop_before_down) return;  // recomputing: the output is the next layer's input, kept
    project(A.mlp, GemmOut::BF16, A.a, l, kDown, r);
}

inline void GpuEngine::layer_forward(int l, bool recomputing, const std::function<void(int)>& kv_ready) {
    const CpuModel& m = model_;
    LayerActsGpu& A = layers_[l];
    const StepRows r = batch_rows();
    if (options_.one_fp8_weight_copy && r.precision == Precision::BF16) load_layer_bf16(l);
    attention_inputs(A, recomputing || l == 0 ? nullptr : &layers_[l - 1], l, r);
    if (kv_ready) kv_ready(l);
    const PackedAttentionShape shape{T_, m.H, m.KV, m.D, batch_.num_sequences(), max_seqlen_};
    // fp8 at D = 128: attention writes the O projection's FP8 operand itself, no pass over A.att (not
    // under --train_kv_replay, whose decode rows are replaced after the attention)
    const Fp8RowsOut att_operand = !kv_replay_ && attention_writes_fp8(m.D) ? fp8_operand(r, m.H * m.D) : Fp8RowsOut{};
    if (kv_replay_) {  // kv_replay.cuh's steps; the decode rows' output and lse in the FP32 GEMM scratch, free here
        const float *k_scale = kv_replay_scales_.get() + (size_t)l * m.KV, *v_scale = k_scale + (size_t)m.L * m.KV;
        bf16* decode_att = reinterpret_cast<bf16*>(r.gemm_f32);
        float* decode_lse = reinterpret_cast<float*>(decode_att + T_ * m.H * m.D);
        kv_replay_step(A.k, A.v, k_scale, v_scale, T_, m.KV, m.D, KvReplayGpuStep::ToCodes, stream_);
        attention_forward(decode_att, decode_lse, A.q, A.k, A.v, cu_seqlens_.get(), shape, stream_, k_scale, v_scale);
        kv_replay_step(A.k, A.v, k_scale, v_scale, T_, m.KV, m.D, KvReplayGpuStep::ToStored, stream_);
        attention_forward(A.att, A.lse, A.q, A.k, A.v, cu_seqlens_.get(), shape, stream_);
        kv_replay_keep_decode_rows(A.att, A.lse, decode_att, decode_lse, kv_replay_decode_rows_.get(), T_, m.H, m.D, stream_);
    } else {
        attention_forward(A.att, A.lse, A.q, A.k, A.v, cu_seqlens_.get(), shape, stream_, nullptr, nullptr, att_operand);
    }
    attention_outputs(A, l, r, recomputing, (bool)att_operand);
}

inline void GpuEngine::trunk_forward(const std::vector<Sequence>& seqs, Precision p, bool for_backward,
                                     Fp8GemmKernel fp8_gemm, const std::function<void(int)>& kv_ready) {
    precision_ = p;
    for_backward_ = for_backward;
    forward_gemm_ = fp8_gemm;
    prepare_batch(seqs);
    const CpuModel& m = model_;
    embedding_forward(layers_[0].x, wb(m.embed), ids_.get(), T_, m.V, m.C, stream_);
    for (int l = 0; l < m.L; l++) layer_forward(l, false, kv_ready);
    bf16_layer_ = -1;  // a later bf16 GEMM outside a pass finds no BF16 weights rather than stale ones
    const LayerActsGpu& last = layers_[(size_t)m.L - 1];
    residual_rmsnorm_forward(xf_, rstdf_, hf_, last.h1, last.mlp, wb(m.final_norm), T_, m.C, m.eps, stream_);
}

inline void GpuEngine::forward_to_head(const std::vector<Sequence>& seqs, Precision p, bool for_backward,
                                       float temperature, bool replay, const RolloutNumerics* at) {
    need_fp8_weights(p);
    need_state();
    if (!(temperature > 0.0f)) fail("GpuEngine: temperature must be > 0 (got %g)", temperature);
    temperature_ = temperature;
    kv_replay_ = at ? at->kv_cache == Precision::FP8 : replay && options_.train_kv_replay;
    if (kv_replay_) {
        const std::vector<float>& k = at ? at->k_scale : rollout_stats_.k_scale, &vs = at ? at->v_scale : rollout_stats_.v_scale;
        if (k.empty() || vs.empty())
            fail(at ? "prefill_logprobs: an FP8 KV cache without its scales"
                    : "--train_kv_replay: a training forward before any rollout with an FP8 KV cache");
        std::vector<float> scales = kv_scales_by_head(k, model_.L, model_.KV), v = kv_scales_by_head(vs, model_.L, model_.KV);
        scales.insert(scales.end(), v.begin(), v.end());
        kv_replay_scales_.resize(scales.size(), "--train_kv_replay KV scales");
        kv_replay_scales_.upload(scales);
        const std::vector<uint8_t> decode_rows = replay_decode_rows(seqs);
        kv_replay_decode_rows_.resize(std::max<size_t>(1, decode_rows.size()), "--train_kv_replay decode rows");
        if (!decode_rows.empty()) kv_replay_decode_rows_.upload(decode_rows);
    }
    if (for_backward) train_kv_replayed_ = kv_replay_;
    // prefill_logprobs (at) reads as the rollout's prefill does, through cuBLASLt
    trunk_forward(seqs, p, for_backward, at ? Fp8GemmKernel::Cublaslt : trainer_fp8_gemm());
    kv_replay_ = false;
}

inline void GpuEngine::forward(const std::vector<Sequence>& seqs, Precision p, bool for_backward, float temperature,
                               TokenValues* logprob, TokenValues* entropy, bool replay, const RolloutNumerics* at) {
    PROFILE_RANGE("forward");
    forward_to_head(seqs, p, for_backward, temperature, replay, at);
    const CpuModel& m = model_;
    head_.forward(head_logprob_, head_entropy_, head_lse_, head_mu_, xf_, wb(m.lm_head), target_.get(), (int)T_,
                  {m.V, m.C, temperature}, stream_);
    head_token_values(seqs, logprob, entropy);
}

inline void GpuEngine::head_token_values(const std::vector<Sequence>& seqs, TokenValues* logprob, TokenValues* entropy) {
    std::vector<float> lp((size_t)T_), ent((size_t)T_);
    CUDA_CHECK(cudaMemcpy(lp.data(), head_logprob_, T_ * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(ent.data(), head_entropy_, T_ * sizeof(float), cudaMemcpyDeviceToHost));
    // head row t predicts token t + 1: response position k of sequence s is row first + k - 1
    if (logprob) logprob->assign(seqs.size(), {});
    if (entropy) entropy->assign(seqs.size(), {});
    for (size_t s = 0; s < seqs.size(); s++) {
        const int64_t first = batch_.offsets[s] + seqs[s].prompt_len, last = batch_.offsets[s + 1];
        for (int64_t t = first; t < last; t++) {
            const bool start = t == batch_.offsets[s];
            if (logprob) (*logprob)[s].push_back(start ? 0.0f : lp[(size_t)t - 1]);
            if (entropy) (*entropy)[s].push_back(start ? 0.0f : ent[(size_t)t - 1]);
        }
    }
}

inline void GpuEngine::keep_train_top1(const std::vector<Sequence>& seqs) {
    train_seqs_ = seqs;
    const std::vector<float> rows = head_.top1(target_.get(), (int)T_, stream_);
    train_top1_.assign(seqs.size(), {});
    for (size_t s = 0; s < seqs.size(); s++)  // head row t predicts token t + 1
        for (int64_t t = batch_.offsets[s] + seqs[s].prompt_len; t < batch_.offsets[s + 1]; t++)
            train_top1_[s].push_back(t == batch_.offsets[s] ? 0.0f : rows[(size_t)t - 1]);
}

inline void GpuEngine::forward_backward_train(const std::vector<Sequence>& seqs, Precision p, float temperature,
                                              TokenValues* logprob, TokenValues* entropy, const TokenGradient& loss_grad) {
    if (p == Precision::FP32) fail("the GPU engine trains in bf16 or fp8 (--train_precision), not fp32");
    if (options_.one_fp8_weight_copy && p != Precision::FP8)
        fail("internal: an engine with one FP8 weight copy trains in fp8, not %s", precision_name(p));
    {
        PROFILE_RANGE("forward");
        forward_to_head(seqs, p, true, temperature, true, nullptr);
    }
    if (!grads_.size()) fail("GpuEngine::forward_backward_train before init_optimizer");
    PROFILE_RANGE("backward");
    // head row r predicts token r + 1: response position k of sequence s (first its row's token)
    // sits at row first + k - 1; rows without one (prompts, a sequence's first token, padding) get 0
    std::vector<int64_t> row_seq((size_t)T_, -1), row_pos((size_t)T_, 0);
    for (size_t s = 0; s < seqs.size(); s++)
        for (int64_t row = std::max(batch_.offsets[s], batch_.offsets[s] + seqs[s].prompt_len - 1); row < batch_.offsets[s + 1] - 1; row++)
            if (target_host_[(size_t)row] >= 0)
                row_seq[(size_t)row] = (int64_t)s, row_pos[(size_t)row] = row - batch_.offsets[s] - seqs[s].prompt_len + 1;
    const std::pair<float*, float*> rows = backward_buffers();
    float *const dlogprob_row = rows.first, *const dentropy_row = rows.second;
    std::vector<float> lp, ent, dlp, dent;
    auto token_grads = [&](int t0, int tb) {  // the block's rows, through the host's loss
        lp.resize((size_t)tb), ent.resize((size_t)tb), dlp.assign((size_t)tb, 0.0f), dent.assign((size_t)tb, 0.0f);
        CUDA_CHECK(cudaMemcpyAsync(lp.data(), head_logprob_ + t0, tb * sizeof(float), cudaMemcpyDeviceToHost, stream_));
        CUDA_CHECK(cudaMemcpyAsync(ent.data(), head_entropy_ + t0, tb * sizeof(float), cudaMemcpyDeviceToHost, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        for (int i = 0; i < tb; i++) {
            const size_t row = (size_t)(t0 + i);
            if (row_seq[row] >= 0) loss_grad((size_t)row_seq[row], (size_t)row_pos[row], lp[i], ent[i], &dlp[i], &dent[i]);
        }
        CUDA_CHECK(cudaMemcpyAsync(dlogprob_row + t0, dlp.data(), tb * sizeof(float), cudaMemcpyHostToDevice, stream_));
        CUDA_CHECK(cudaMemcpyAsync(dentropy_row + t0, dent.data(), tb * sizeof(float), cudaMemcpyHostToDevice, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));  // the host vectors are refilled by the next block
    };
    const CpuModel& m = model_;
    open_bucket(buckets_.head);
    head_.forward_backward(head_logprob_, head_entropy_, head_lse_, head_mu_, dlogprob_row, dentropy_row, g_.dxn,
                           grad(m.lm_head), xf_, wb(m.lm_head), target_.get(), (int)T_, {m.V, m.C, temperature},
                           token_grads, stream_);
    close_bucket();
    head_token_values(seqs, logprob, entropy);
    keep_train_top1(seqs);
    backward_below_head();
}

// ---------------------------------------------------------------------------------------------
// Backward.

inline void GpuEngine::project_backward(bf16* dx, const bf16* dy, const bf16* x, int l, Projection j, size_t bias,
                                        const Fp8Transposed& x_t) {
    project_dgrad(dx, dy, l, j);
    project_wgrad(dy, x, l, j, bias, x_t);
}

inline void GpuEngine::project_dgrad(bf16* dx, const bf16* dy, int l, Projection j) {
    LinearDevice W = linear(l, j);
    Fp8WeightCopy with_transpose;  // one FP8 weight copy: the dgrad's transposed copy, made now
    if (options_.one_fp8_weight_copy) {
        with_transpose = *W.w8;
        with_transpose.codes_t = transposed_codes_.get(), with_transpose.scale_inv_t = transposed_scales_.get();
        fp8_transpose_block_copy_gpu(W.w8->codes, W.w8->scale_inv, W.N, W.K, with_transpose.codes_t,
                                     with_transpose.scale_inv_t, stream_);
        W.w8 = &with_transpose;
    }
    linear_dgrad_gpu(gemm_, *scratch_, precision_, W, dy, (int)Tp_, dx, GemmOut::BF16, stream_, trainer_fp8_gemm());
}

inline void GpuEngine::project_wgrad(const bf16* dy, const bf16* x, int l, Projection j, size_t bias,
                                     const Fp8Transposed& x_t) {
    const LinearDevice W = linear(l, j);
    linear_wgrad_gpu(gemm_, *scratch_, precision_, W, dy, x_t ? nullptr : x, (int)Tp_, grad(model_.weight_offset(l, j)),
                     stream_, x_t, trainer_fp8_gemm());
    if (bias != kNoTensor) bias_backward(grad(bias), dy, T_, W.N, column_scratch_, column_scratch_floats_, stream_);
}

inline void GpuEngine::layer_backward(int l, bf16* dh) {
    const CpuModel& m = model_;
    const LayerTensors& w = m.layers[l];
    LayerActsGpu& A = layers_[l];
    const long T = T_;
    float* const scratch = column_scratch_;
    const long sf = column_scratch_floats_;
    const bool kept = batch_rows().kept_transposes();  // the forward kept its activations' FP8 transposes
    // MLP
    project_backward(g_.da_b, dh, A.a, l, kDown, kNoTensor, kept ? A.a_t : Fp8Transposed{});
    if (precision_ == Precision::FP8) {  // d[gate|up] straight into its FP8 operands, no BF16 tensor
        const LinearScratch::Operand& q = scratch_->target(0, (int)Tp_, 2 * m.I);
        swiglu_backward_fp8(g_.da_b, A.gu, T, Tp_, m.I, scratch_->pow2_scales(), q.codes, q.scales, q.codes_t, q.scales_t,
                            stream_, scratch_->scaling(), scratch_->amax());
        project_backward(g_.dxn_b, nullptr, A.xn2, l, kGateUp, kNoTensor, kept ? A.xn2_t : Fp8Transposed{});
    } else {
        swiglu_backward(g_.dgu, (const bf16*)g_.da_b, (const bf16*)A.gu, T, m.I, stream_);
        project_backward(g_.dxn_b, g_.dgu, A.xn2, l, kGateUp, kNoTensor);
    }
    rmsnorm_backward(dh, grad(w.ln2), g_.dxn_b, A.h1, wb(w.ln2), A.rstd2, T, m.C, true, scratch, sf, stream_);
    // attention: the O dgrad; the attention backward, whose delta kernel (fp8, block scaling) writes
    // att^T's FP8 operand into the scratch's slot 1 from the att it reads (no pass over att); the O wgrad
    project_dgrad(g_.datt_b, dh, l, kO);
    const PackedAttentionShape shape{T, m.H, m.KV, m.D, batch_.num_sequences(), max_seqlen_};
    Fp8TransposedOut att_t;
    if (precision_ == Precision::FP8 && scratch_->fused_casts()) {
        const LinearScratch::Operand& o = scratch_->target(1, (int)Tp_, (int)(m.H * m.D));
        att_t = {o.codes_t, o.scales_t, (int)Tp_, scratch_->pow2_scales()};
    }
    attention_backward(g_.dq, g_.dk, g_.dv, g_.delta, g_.datt_b, A.att, A.lse, A.q, A.k, A.v, cu_seqlens_.get(), shape,
                       stream_, att_t);
    project_wgrad(dh, A.att, l, kO, kNoTensor, att_t ? att_t.operand() : Fp8Transposed{});
    const QkvGrad qkv_grad{g_.dq, g_.dk, g_.dv, A.qp, A.kp, A.rstd_q, A.rstd_k};
    // fp8 (block scaling): d[q|k|v] straight into its FP8 operands, unless a bias gradient needs it in BF16
    const bool dqkv_fp8 = kept && w.bq == kNoTensor && qkv_rope_backward_fp8_fits(m.D);
    if (dqkv_fp8) {
        const LinearScratch::Operand& q = scratch_->target(0, (int)Tp_, (int)m.qkv_dim());
        qkv_rope_backward_fp8(qkv_grad, T, Tp_, pos_.get(), rope_->view(), qkv_shape(l), scratch_->pow2_scales(), q.codes,
                              q.scales, q.codes_t, q.scales_t, stream_);
    } else {
        qkv_rope_backward(g_.dqkv, qkv_grad, T, pos_.get(), rope_->view(), qkv_shape(l), stream_);
    }
    if (m.qk_norm) {  // dq, dk now hold the norms' output gradients
        rmsnorm_weight_grad(grad(w.q_norm), g_.dq, A.qp, A.rstd_q, T * m.H, m.D, scratch, sf, stream_);
        rmsnorm_weight_grad(grad(w.k_norm), g_.dk, A.kp, A.rstd_k, T * m.KV, m.D, scratch, sf, stream_);
    }
    project_backward(g_.dxn_b, dqkv_fp8 ? nullptr : g_.dqkv, A.xn1, l, kQKV, w.bq, kept ? A.xn1_t : Fp8Transposed{});
    rmsnorm_backward(dh, grad(w.ln1), g_.dxn_b, A.x, wb(w.ln1), A.rstd1, T, m.C, true, scratch, sf, stream_);
}

inline void GpuEngine::backward(const TokenValues& d_logprob, const TokenValues& d_entropy) {
    PROFILE_RANGE("backward");
    need_state();
    if (!grads_.size()) fail("GpuEngine::backward before init_optimizer");
    if (d_logprob.size() != train_seqs_.size()) fail("GpuEngine::backward: gradients of %zu sequences, the forward had %zu",
                                                     d_logprob.size(), train_seqs_.size());
    const CpuModel& m = model_;
    const long T = T_;
    // head row r predicts token r + 1: dL/dlogprob of response position k of sequence s sits at row first + k - 1
    std::vector<float> dlp((size_t)T, 0.0f), dent((size_t)T, 0.0f);
    for (size_t s = 0; s < train_seqs_.size(); s++) {
        const int64_t first = batch_.offsets[s] + train_seqs_[s].prompt_len;
        for (size_t k = 0; k < d_logprob[s].size(); k++) {
            const int64_t row = first + (int64_t)k - 1;
            if (row < batch_.offsets[s] || target_host_[(size_t)row] < 0) continue;
            dlp[(size_t)row] = d_logprob[s][k];
            dent[(size_t)row] = d_entropy[s][k];
        }
    }
    const auto [dlogprob_row, dentropy_row] = backward_buffers();
    CUDA_CHECK(cudaMemcpy(dlogprob_row, dlp.data(), T * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dentropy_row, dent.data(), T * sizeof(float), cudaMemcpyHostToDevice));
    // each bucket's gradients are complete at its close_bucket (ZeRO-2: reduced into the owners' shards)
    open_bucket(buckets_.head);
    head_.backward(g_.dxn, grad(m.lm_head), dlogprob_row, dentropy_row, head_lse_, head_mu_, xf_, wb(m.lm_head),
                   target_.get(), (int)T, {m.V, m.C, temperature_}, stream_);
    close_bucket();
    backward_below_head();
}

inline std::pair<float*, float*> GpuEngine::backward_buffers() {
    const CpuModel& m = model_;
    const long T = T_, Tp = Tp_, C = m.C, Q = (long)m.H * m.D, Kd = (long)m.KV * m.D, I = m.I, N = m.qkv_dim();
    // buffers: BF16 gradients of activations, not zeroed: GEMMs write all Tp rows, the other kernels
    // T rows; of what a GEMM reads, dh, dgu and dqkv get their padding rows zeroed below.
    grad_bf16_.resize((size_t)(Tp * (2 * C + 3 * I + 2 * Q + 2 * Kd + N)), "BF16 activation gradients");
    bf16* b = grad_bf16_.get();
    auto take_b = [&](long n) { bf16* r = b; b += n; return r; };
    g_.dh = take_b(Tp * C);
    g_.dxn_b = take_b(Tp * C), g_.da_b = take_b(Tp * I), g_.dgu = take_b(Tp * 2 * I);
    g_.datt_b = take_b(Tp * Q), g_.dq = take_b(Tp * Q), g_.dk = take_b(Tp * Kd), g_.dv = take_b(Tp * Kd);
    g_.dqkv = take_b(Tp * N);
    for (auto [p, n] : {std::make_pair(g_.dh, C), std::make_pair(g_.dgu, 2 * I), std::make_pair(g_.dqkv, N)})
        if (Tp > T) CUDA_CHECK(cudaMemsetAsync(p + T * n, 0, (size_t)(Tp - T) * n * sizeof(bf16), stream_));
    column_scratch_floats_ = std::max({rmsnorm_backward_scratch_floats(T, m.C), rmsnorm_backward_scratch_floats(T * m.H, m.D),
                                       rmsnorm_backward_scratch_floats(T * m.KV, m.D), bias_backward_scratch_floats(T, (int)N)});
    grad_f32_.resize((size_t)(Tp * m.C + T * m.H + 2 * T + column_scratch_floats_), "FP32 activation gradients");
    float* f = grad_f32_.get();
    auto take_f = [&](long n) { float* r = f; f += n; return r; };
    g_.dxn = take_f(Tp * m.C), g_.delta = take_f(T * m.H);
    float* dlogprob_row = take_f(T);
    float* dentropy_row = take_f(T);
    column_scratch_ = take_f(column_scratch_floats_);
    // the head's dX GEMMs add into dx (beta = 1)
    CUDA_CHECK(cudaMemsetAsync(g_.dxn, 0, (size_t)T * m.C * sizeof(float), stream_));
    return {dlogprob_row, dentropy_row};
}

inline void GpuEngine::backward_below_head() {
    const CpuModel& m = model_;
    const long T = T_;
    cast(g_.dxn_b, g_.dxn, T * m.C, stream_);
    open_bucket(buckets_.final_norm);
    rmsnorm_backward(g_.dh, grad(m.final_norm), g_.dxn_b, hf_, wb(m.final_norm), rstdf_, T, m.C, false, column_scratch_,
                     column_scratch_floats_, stream_);
    close_bucket();
    kv_replay_ = train_kv_replayed_;  // a recomputed layer reads K and V as its forward did
    forward_gemm_ = trainer_fp8_gemm();  // ... and runs its GEMMs on the same kernels
    for (int l = m.L - 1; l >= 0; l--) {
        if (options_.recompute_layer) layer_forward(l, true);
        open_bucket(buckets_.layers[l]);
        layer_backward(l, g_.dh);
        close_bucket();
    }
    kv_replay_ = false;
    open_bucket(buckets_.embed);
    embedding_backward(grad(m.embed), g_.dh, ids_.get(), T, m.V, m.C, stream_);
    close_bucket();
    finish_buckets();
}

}  // namespace fp8rl

#include "rollout.cu"  // GpuEngine's generation, after the class it completes

#endif  // FP8RL_ENGINE_GPU_CUH
