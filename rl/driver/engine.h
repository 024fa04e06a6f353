// engine.h: what the RL driver (rl/driver/driver.h) asks of an engine (DESIGN.md §1). The CPU engine
// (cpu/engine_cpu.h) implements it on the reference model; the GPU engine implements the same
// calls, so the driver, and everything it computes around the model, is shared.
//
// A sequence is prompt + response token ids; "response positions" are the tokens after the
// prompt, each predicted from the ones before it. Log-probs and entropies are of the
// temperature-scaled distribution (the one the sampler used), one value per response position.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "rl/objective/adamw.h"
#include "rl/io/checkpoint.h"
#include "rl/driver/dist.h"
#include "rl/io/logger.h"
#include "rl/numerics/fp8_block.h"
#include "rl/numerics/kv_scales.h"
#include "rl/numerics/precision.h"

namespace fp8rl {

struct SamplingConfig {
    float temperature = 1.0f;  // 0 = greedy
    float top_p = 1.0f;
    int top_k = 0;
    int max_new_tokens = 256;
    uint64_t seed = 0;
    int vocab_limit = 0;  // sample only ids below this (the tokenizer's size); 0 = all
};

struct GenRequest {
    std::vector<int32_t> prompt;
    uint32_t sequence = 0;  // global id: the sampling RNG is keyed by (seed, step, sequence, position)
};

struct Generation {
    std::vector<int32_t> tokens;  // response, including the eos token when one was sampled
    std::vector<float> logprobs;  // [tokens.size()] log softmax(logits / T) of each token (rollout precision)
    // [tokens.size()] log-prob under the distribution each token was drawn from (after top-k and
    // top-p; 0 for greedy): what --prompts prints
    std::vector<float> logprobs_sampled;
    std::vector<float> sample_offsets;  // teacher forcing on the CPU engine: each token's sample_offset
    bool finished = false;        // ended on eos (false: stopped at max_new_tokens)
};

// A row's next turn in a multi-turn rollout (Engine::next_turns).
struct TurnRequest {
    size_t row;                   // the request's index in start_turns()
    std::vector<int32_t> tokens;  // appended after its last turn (an observation's; may be empty)
    int max_new_tokens = 1;       // this turn's budget
};

struct Sequence {
    std::vector<int32_t> ids;  // prompt + response
    int32_t prompt_len = 0;
    int32_t response_len() const { return (int32_t)ids.size() - prompt_len; }
};

// An engine's settings from the command line (rl/driver/args.h, the flags marked for one engine). Each
// engine reads the fields that concern it and ignores the others.
struct EngineOptions {
    // GPU engine, data parallel: 1 = ZeRO-1 (each rank keeps 1/N of the FP32 master weights and AdamW
    // moments: gradients reduce-scattered, weights all-gathered after the update), 0 = every rank
    // keeps all of them (gradients all-reduced). The default is 1: on one rank the two are the same
    // run, on N ranks 1 moves the same bytes (a reduce-scatter plus an all-gather is what a ring
    // all-reduce does) and saves 12 (N - 1) / N bytes per parameter.
    int zero = 1;
    double collective_timeout_s = 600;  // GPU engine: how long a collective waits for the other ranks
    bool recompute_layer = false;  // --recompute layer (GPU engine): keep layer inputs, recompute the rest in backward
    // GPU: sequences decoded together (continuous batching); 0 = as many of a generation's requests as
    // memory allows (training resolves it with the memory plan before the engine exists:
    // rl/driver/memory_fit.h; an engine given 0 takes what its device's free memory holds)
    int rollout_slots = 0;
    // GPU: KV page pool in MiB; 0 = what the rollout phase leaves free, up to every slot at its longest
    double kv_cache_mb = 0;
    int kv_page_tokens = 16;    // GPU: tokens per KV page
    bool kv_scale_per_head = false;  // both engines, --kv_scales head: FP8 KV scales per layer and KV head
    // Both engines, --train_kv_replay 1: the old-log-prob and training forwards' attention reads K and V
    // through E4M3 at the last rollout's KV scales (not FP32 passes: Calibrated Clipping's shadow)
    bool train_kv_replay = false;
    Fp8Scaling fp8_scaling = Fp8Scaling::Block;  // both engines, --fp8_scaling: the FP8 GEMMs' scale granularity
    bool fp8_pow2_scales = false;  // both engines, --fp8_scales pow2: the FP8 GEMMs' scales rounded down to powers of two
    // GPU, --fp8_gemm_kernel own: the trainer's block-scaled FP8 projection GEMMs run fp8rl's own kernel
    // where their shapes fit it (fp8_gemm.cuh's Fp8GemmKernel); false: cuBLASLt
    bool own_fp8_gemm = true;
    // Both engines, data parallel: the max over the ranks of the FP8 KV amaxes, which each rank takes
    // over its own prompts (the driver sets it: rl/driver/cli.h); empty: one rank.
    KvAmaxReduce kv_amax_reduce;
    bool cuda_graphs = true;    // GPU: decode steps replayed from CUDA graphs, one per batch-size bucket
    // GPU, when rollout and training both run in fp8 at block scaling (the driver sets it): the
    // projections live once, as their 128x128-block FP8 copy; the dgrad's transposed copy is made
    // just before each dgrad, a BF16 pass casts each layer from the FP32 master as it goes, and BF16
    // is kept only for the other tensors (embeddings, norms, biases, head).
    bool one_fp8_weight_copy = false;
    // GPU: the projections' FP8 copies exist; the driver clears it for a run that never computes in
    // fp8 (rollout and training in bf16), which then holds no FP8 weights at all (a true BF16 baseline).
    bool fp8_weights = true;
    // GPU, --offload_train_state 1: the FP32 master weights and AdamW moments wait in pinned host
    // memory during the rollout (the gradients, which hold nothing then, are freed), so the KV pool
    // gets their device memory.
    bool offload_train_state = false;
};

// The options of a frozen reference copy of a policy (the KL term): it samples nothing, so it has no
// FP8 KV cache of its own to replay (--train_kv_replay applies to the policy's forwards).
inline EngineOptions without_kv_replay(EngineOptions o) {
    o.train_kv_replay = false;
    return o;
}

// --train_kv_replay: per row of the sequences packed in order, 1 where the rollout computed it in a
// decode step (a response position), 0 in its prefill (a prompt position): how that row read the FP8
// KV cache, and so how the trainer's attention replays it (cpu/model.h's replayed_attention).
inline std::vector<uint8_t> replay_decode_rows(const std::vector<Sequence>& seqs) {
    std::vector<uint8_t> rows;
    for (const Sequence& s : seqs)
        for (size_t t = 0; t < s.ids.size(); t++) rows.push_back((int64_t)t >= s.prompt_len);
    return rows;
}

// The most a training run asks of an engine's memory at once, known before the engine exists (an
// engine on a device plans its memory with it: cuda/engine/memory_plan.h).
struct MemoryDemand {
    int64_t tokens_per_forward = 0;  // tokens of the largest forward_train / logprobs call
    int64_t longest_sequence = 0;    // tokens of the longest sequence (prompt + max_new_tokens)
    bool reference_policy = false;   // a frozen copy of the policy lives beside the engine (KL)
    int ranks = 1;                   // data-parallel ranks (ZeRO-1 shards the optimizer state over them)
    // generation: the most completions one generate() call samples on a rank (training or eval), of
    // at most longest_prompt + max_new_tokens tokens, with this KV cache
    int64_t rollout_requests = 0, longest_prompt = 0;
    int max_new_tokens = 0;
    int64_t rollout_prompts = 0;  // the most distinct prompts of one generate() (its prefill and KV calibration forwards)
    Precision kv_cache = Precision::BF16;
};

// Per response position of each sequence.
using TokenValues = std::vector<std::vector<float>>;

// How a rollout computes log-probs: its projections' precision, its KV cache's, and an FP8 cache's
// scales as last_kv_scales() gives them (empty for any other cache).
struct RolloutNumerics {
    Precision weights = Precision::BF16, kv_cache = Precision::BF16;
    std::vector<float> k_scale, v_scale;
};

// Teacher forcing's inputs from whole sequences (decode_logprobs): request i is sequence i's prompt
// (key i), its completion the response. Returns the longest response (every one must have a token).
inline int teacher_forcing_split(const std::vector<Sequence>& seqs, std::vector<GenRequest>* requests,
                                 std::vector<std::vector<int32_t>>* responses) {
    int longest = 1;
    for (size_t i = 0; i < seqs.size(); i++) {
        const Sequence& q = seqs[i];
        if (q.prompt_len < 1 || q.response_len() < 1)
            fail("decode_logprobs: sequence %zu has %d prompt and %d response tokens (need at least 1 of each)", i, q.prompt_len,
                 q.response_len());
        requests->push_back({std::vector<int32_t>(q.ids.begin(), q.ids.begin() + q.prompt_len), (uint32_t)i});
        responses->emplace_back(q.ids.begin() + q.prompt_len, q.ids.end());
        longest = std::max(longest, q.response_len());
    }
    return longest;
}

class Engine {
public:
    virtual ~Engine() = default;

    // The number of parameters (FP32 master weights).
    virtual size_t num_floats() const = 0;

    // Samples one completion per request.
    virtual std::vector<Generation> generate(const std::vector<GenRequest>& requests, uint32_t step,
                                             const SamplingConfig& sampling, Precision weights, Precision kv_cache,
                                             Progress* progress) = 0;

    // Multi-turn rollouts (rl/driver/multi_turn.h), whose rows keep their KV cache between turns:
    //   start_turns  generate() (turn 1), each row's cache then kept, sized for its prompt +
    //                max_total_tokens; an FP8 cache calibrates its scales here, on the prompts, once
    //                for the whole rollout (last_kv_scales() gives them until the next generate());
    //   next_turns   each listed row's last drawn token and then its appended tokens go into its
    //                kept cache (fed as decode rows: each computed as the decode step that would
    //                have fed it, so a trajectory's log-probs are decode_logprobs' of its tokens at
    //                the rollout's scales, bit for bit), then up to its budget is drawn with
    //                start_turns()' step, sampling and precisions; returns this turn's tokens per
    //                listed row. A row not listed has ended: its cache is freed;
    //   end_turns    frees what is kept (a next generate() or start_turns() also does).
    // A sampled token's random key is its absolute position, as in a single turn.
    virtual std::vector<Generation> start_turns(const std::vector<GenRequest>& requests, int max_total_tokens, uint32_t step,
                                                const SamplingConfig& sampling, Precision weights, Precision kv_cache,
                                                Progress* progress) = 0;
    virtual std::vector<Generation> next_turns(const std::vector<TurnRequest>& turns) = 0;
    virtual void end_turns() = 0;
    // Tokens the last next_turns() fed into kept caches before its first draw (each row's last
    // token and its appended ones: never a turn's earlier context).
    virtual int64_t turn_fed_tokens() const = 0;

    // The FP8 KV-cache scales per layer (K, V) the last generate() used; empty unless its cache was FP8.
    virtual void last_kv_scales(std::vector<float>* k_scale, std::vector<float>* v_scale) const = 0;

    // Teacher forcing through the rollout's decode path (--mismatch_report: rl/driver/mismatch_report.h):
    // each sequence's prompt prefilled and its response fed token by token through decode steps with
    // n's weights and KV cache (an FP8 cache at n's scales, not recalibrated), each response token
    // scored as generate() scores a sampled one (Generation::logprobs: at s.temperature over the ids
    // below s.vocab_limit). With the numerics a generate() ran at, it gives that generate()'s log-probs
    // bit for bit. last_kv_scales() and the sampled tokens' path are left as they were.
    virtual TokenValues decode_logprobs(const std::vector<Sequence>& seqs, const SamplingConfig& s, const RolloutNumerics& n) = 0;
    // The same tokens through the prefill path: one full-sequence forward as logprobs() computes it, at
    // n.weights, its attention reading K and V through E4M3 at n's scales when n's cache is FP8 (what
    // --train_kv_replay reads); no state kept.
    virtual TokenValues prefill_logprobs(const std::vector<Sequence>& seqs, float temperature, const RolloutNumerics& n) = 0;

    // Log-prob (and entropy, when asked) of every response position; no state kept.
    virtual void logprobs(const std::vector<Sequence>& seqs, Precision precision, float temperature, TokenValues* logprob,
                          TokenValues* entropy) = 0;
    // True when logprobs() at this precision is collective over the ranks (a GPU engine with one FP8
    // weight copy gathers each layer's BF16 weights from the master shards): every rank then makes
    // the same number of calls, a rank with fewer batches calling with no sequences.
    virtual bool collective_logprobs(Precision) const { return false; }

    // The training forward: as logprobs(), keeping what backward() needs.
    virtual void forward_train(const std::vector<Sequence>& seqs, Precision precision, float temperature, TokenValues* logprob,
                               TokenValues* entropy) = 0;
    // Per response position of the last forward_train(): 1 where its token is the most likely one
    // there (its logit the largest of the row, ties included), else 0 (train/mean_token_accuracy).
    virtual void last_train_top1(TokenValues* top1) const = 0;
    // Adds d(loss)/d(weights) to the gradients given d(loss)/d(logprob) and d(loss)/d(entropy) per
    // response position of the last forward_train().
    virtual void backward(const TokenValues& d_logprob, const TokenValues& d_entropy) = 0;
    // A loss whose gradient at each response position depends on that position's log-prob and
    // entropy alone (everything else known before the forward): sets *dlogprob and *dentropy of
    // position `pos` of sequence `seq` from them.
    using TokenGradient = std::function<void(size_t seq, size_t pos, float logprob, float entropy, float* dlogprob,
                                             float* dentropy)>;
    // forward_train(), then backward() of the gradients `grad` gives at every response position
    // (its outputs as forward_train's). An engine may fuse the two: the GPU engine's LM head then
    // computes each block's logits once (LogprobHeadGpu::forward_backward), not again in backward().
    virtual void forward_backward_train(const std::vector<Sequence>& seqs, Precision precision, float temperature,
                                        TokenValues* logprob, TokenValues* entropy, const TokenGradient& grad) {
        forward_train(seqs, precision, temperature, logprob, entropy);
        TokenValues d_logprob(seqs.size()), d_entropy(seqs.size());
        for (size_t s = 0; s < seqs.size(); s++) {
            d_logprob[s].resize((*logprob)[s].size());
            d_entropy[s].resize((*logprob)[s].size());
            for (size_t k = 0; k < (*logprob)[s].size(); k++)
                grad(s, k, (*logprob)[s][k], (*entropy)[s][k], &d_logprob[s][k], &d_entropy[s][k]);
        }
        backward(d_logprob, d_entropy);
    }
    // True when backward() is collective over the ranks (a GPU engine under ZeRO-2 reduces each
    // bucket as the backward finishes it): every rank then runs as many backwards per update, a
    // rank with fewer micro-batches calling backward_of_nothing() for the rest.
    virtual bool collective_backward() const { return false; }
    // A collective backward's share on a rank with no micro-batch left: zero gradients, reduced.
    virtual void backward_of_nothing() {}

    // The optimizer lives in the engine with the weights and gradients it updates, so an engine
    // on a GPU keeps all three there (spec-gpu.md §3.1). The driver calls init_optimizer once
    // before training; then per update: zero_grads, backward, reduce_and_clip_grads and, when the
    // norm is finite, optimizer_step.
    virtual void init_optimizer(const AdamWConfig& cfg, const Dist& dist) = 0;
    virtual void zero_grads() = 0;
    // Sums the gradients over the ranks of dist and scales them so their global norm is at most
    // max_norm (rl/objective/adamw.h's rule; 0 = no clipping). Returns the norm before clipping.
    virtual double reduce_and_clip_grads(double max_norm) = 0;
    // One AdamW step at lr on the reduced gradients; then the derived copies (BF16/FP8 weights)
    // are refreshed.
    virtual void optimizer_step(double lr) = 0;
    virtual int64_t optimizer_steps() const = 0;
    // Checkpoints: master weights, AdamW moments and step count to and from s (s.master holds
    // num_floats() values when loading; the derived copies are refreshed). Every rank calls both;
    // an engine that shards its state over the ranks may fill s on rank 0 alone, which writes it.
    virtual void save_state(TrainerState& s) = 0;
    virtual void load_state(const TrainerState& s) = 0;

    // Writes the weights as a HF directory (bf16 safetensors, config.json, tokenizer files).
    virtual void save_hf(const std::string& dir) = 0;
    // The FP8 copy of every projection weight, [L * 4] fused [q|k|v], o, [gate|up], down of each layer
    // in 128x128 blocks, as the FP8 GEMMs read it (--fp8_scaling block): what --save_format fp8 writes.
    virtual std::vector<Fp8Tensor> fp8_weight_copies() = 0;
    // Writes that copy as a block-FP8 HF directory into dir (rl/model/fp8_export.h), with `master`
    // [num_floats()] (the one save_state gave) for the other tensors. Returns its notice line or "".
    virtual std::string save_hf_fp8(const std::string& dir, const std::vector<float>& master) = 0;

    // The two phases of a step: the rollout (generation) and the update (log-prob passes, training,
    // checkpoints). An engine on a device holds each phase's buffers only during it, in the same
    // memory (cuda/engine/engine_gpu.cuh); the CPU engine has nothing to free. An engine starts in
    // the update.
    enum class Phase { Rollout, Update };
    virtual void enter_phase(Phase) {}
    // The device's high-water marks in bytes: of the last rollout phase, and of the update phase (so
    // far, while in it; else the last); false without a device.
    virtual bool phase_peaks(size_t* rollout, size_t* update) const {
        *rollout = *update = 0;
        return false;
    }
};

}  // namespace fp8rl
