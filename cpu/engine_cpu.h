// engine_cpu.h: the CPU reference engine behind the driver's interface (rl/driver/engine.h). It owns the
// model's FP32 master weights (rl/model/weights.h), the gradient buffer in the same layout, the AdamW
// state (rl/objective/adamw.h), and one prepared parameter copy per precision in use, refreshed after every
// update; forward, backward and generation are the reference model's (cpu/model.h, cpu/generate.h).
#pragma once
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "rl/driver/engine.h"
#include "cpu/generate.h"
#include "cpu/model.h"
#include "rl/model/fp8_export.h"
#include "rl/model/weights.h"

namespace fp8rl {

struct RunShape;  // rl/driver/memory_fit.h: what a run's device memory depends on

class CpuEngine : public Engine {
public:
    // dir: a HF model directory; its side files (tokenizer, generation config) are copied into
    // every checkpoint. Of the options it reads kv_scale_per_head, train_kv_replay, kv_amax_reduce,
    // fp8_scaling and fp8_pow2_scales (the GPU's are the rest).
    explicit CpuEngine(const std::string& dir, const EngineOptions& options = {})
        : kv_scale_per_head_(options.kv_scale_per_head), train_kv_replay_(options.train_kv_replay), fp8_scaling_(options.fp8_scaling),
          fp8_pow2_scales_(options.fp8_pow2_scales), kv_amax_reduce_(options.kv_amax_reduce), source_dir_(dir),
          weights_(ModelWeights::load(dir)), model_(weights_), grads_(weights_.num_floats(), 0.0f) {}

    // A frozen copy (the KL reference policy): same weights, its own buffers; no KV replay
    // (without_kv_replay, rl/driver/engine.h).
    CpuEngine(const CpuEngine& other)
        : kv_scale_per_head_(other.kv_scale_per_head_), train_kv_replay_(false), fp8_scaling_(other.fp8_scaling_),
          fp8_pow2_scales_(other.fp8_pow2_scales_), kv_amax_reduce_(other.kv_amax_reduce_), source_dir_(other.source_dir_),
          weights_(other.weights_), model_(weights_), grads_() {}
    CpuEngine& operator=(const CpuEngine&) = delete;  // model_ points into weights_

    // The CPU engine's memory is the host's: no device plan to print or check (nor --plan_ranks).
    static std::string device_memory_plan(const ModelConfig&, RunShape&) { return ""; }
    static constexpr bool plans_device_memory = false;

    const ModelConfig& config() const { return weights_.config; }
    size_t num_floats() const override { return weights_.num_floats(); }

    std::vector<Generation> generate(const std::vector<GenRequest>& requests, uint32_t step, const SamplingConfig& s,
                                     Precision weights, Precision kv_cache, Progress* progress) override {
        return rollout(requests, nullptr, step, s, weights, kv_cache, progress);
    }

    std::vector<Generation> start_turns(const std::vector<GenRequest>& requests, int max_total_tokens, uint32_t step,
                                        const SamplingConfig& s, Precision weights, Precision kv_cache, Progress* progress) override {
        if (max_total_tokens < s.max_new_tokens)
            fail("start_turns: a trajectory of %d tokens cannot hold a first turn of %d", max_total_tokens, s.max_new_tokens);
        turn_weights_ = weights;
        return rollout(requests, nullptr, step, s, weights, kv_cache, progress, nullptr, max_total_tokens);
    }

    std::vector<Generation> next_turns(const std::vector<TurnRequest>& turns) override {
        std::vector<KeptTurn> kept;
        for (const TurnRequest& t : turns) kept.push_back({t.row, t.tokens, t.max_new_tokens});
        std::vector<Generation> out;
        for (Completion& c : generator_.continue_turns(model_, params(turn_weights_), kept)) out.push_back(generation(c));
        return out;
    }

    void end_turns() override { generator_.end_turns(); }
    int64_t turn_fed_tokens() const override { return generator_.fed_tokens(); }

    // Teacher forcing through the generator's prefill and decode steps (the GPU engine's twin): the
    // completion of request i is tokens[i], each token with its log-prob and its sample_offset under
    // the draw `s` and `step` would make there (the departure test of the GPU's completions). eos
    // does not stop a forced completion; s.max_new_tokens is raised to the longest.
    std::vector<Generation> teacher_forced(const std::vector<GenRequest>& requests,
                                           const std::vector<std::vector<int32_t>>& tokens, uint32_t step,
                                           SamplingConfig s, Precision weights, Precision kv_cache) {
        if (tokens.size() != requests.size()) fail("teacher_forced: %zu completions for %zu requests", tokens.size(), requests.size());
        for (const auto& t : tokens) s.max_new_tokens = std::max(s.max_new_tokens, (int)t.size());
        return rollout(requests, &tokens, step, s, weights, kv_cache, nullptr);
    }

    void last_kv_scales(std::vector<float>* k_scale, std::vector<float>* v_scale) const override {
        *k_scale = kv_k_scale_, *v_scale = kv_v_scale_;
    }

    TokenValues decode_logprobs(const std::vector<Sequence>& seqs, const SamplingConfig& s, const RolloutNumerics& n) override {
        TokenValues out;
        if (seqs.empty()) return out;
        std::vector<GenRequest> requests;
        std::vector<std::vector<int32_t>> responses;
        SamplingConfig forced = s;
        forced.max_new_tokens = teacher_forcing_split(seqs, &requests, &responses);
        for (Generation& g : rollout(requests, &responses, 0, forced, n.weights, n.kv_cache, nullptr, &n))
            out.push_back(std::move(g.logprobs));
        return out;
    }

    TokenValues prefill_logprobs(const std::vector<Sequence>& seqs, float temperature, const RolloutNumerics& n) override {
        TokenValues out;
        run_forward(seqs, n.weights, temperature, &out, nullptr, eval_acts_, eval_batch_, false, false, &n);
        return out;
    }

    void logprobs(const std::vector<Sequence>& seqs, Precision p, float temperature, TokenValues* logprob,
                  TokenValues* entropy) override {
        // an FP32 pass is Calibrated Clipping's high-precision shadow: never replayed
        run_forward(seqs, p, temperature, logprob, entropy, eval_acts_, eval_batch_, false, p != Precision::FP32);
    }

    void forward_train(const std::vector<Sequence>& seqs, Precision p, float temperature, TokenValues* logprob,
                       TokenValues* entropy) override {
        run_forward(seqs, p, temperature, logprob, entropy, train_acts_, train_batch_, true, p != Precision::FP32);
        train_seqs_ = seqs;
        train_precision_ = p;
    }

    void last_train_top1(TokenValues* top1) const override {
        top1->assign(train_seqs_.size(), {});
        for (size_t s = 0; s < train_seqs_.size(); s++)  // head row t predicts token t + 1
            for (int64_t t = train_batch_.offsets[s] + train_seqs_[s].prompt_len; t < train_batch_.offsets[s + 1]; t++)
                (*top1)[s].push_back(t == train_batch_.offsets[s] ? 0.0f : train_acts_.head_top1[t - 1]);
    }

    void backward(const TokenValues& d_logprob, const TokenValues& d_entropy) override {
        const long T = train_batch_.num_tokens();
        std::vector<float> dlp((size_t)T, 0.0f), dent((size_t)T, 0.0f);  // [T] model_forward alignment
        for (size_t s = 0; s < train_seqs_.size(); s++) {
            const int64_t first = train_batch_.offsets[s] + train_seqs_[s].prompt_len;
            for (size_t k = 0; k < d_logprob[s].size(); k++) {
                dlp[(size_t)first + k] = d_logprob[s][k];
                dent[(size_t)first + k] = d_entropy[s][k];
            }
        }
        model_backward(model_, params(train_precision_), train_acts_, dlp.data(), dent.data(), grads_.data());
    }

    void init_optimizer(const AdamWConfig& cfg, const Dist& dist) override {
        adam_ = AdamW(num_floats(), cfg);
        dist_ = &dist;
    }

    void zero_grads() override { std::fill(grads_.begin(), grads_.end(), 0.0f); }

    double reduce_and_clip_grads(double max_norm) override {
        dist_->all_reduce_sum(grads_.data(), grads_.size());
        return clip_grad_norm(grads_.data(), grads_.size(), max_norm);
    }

    void optimizer_step(double lr) override {
        adam_.step(weights_.master.data(), grads_.data(), lr);
        weights_updated();
    }

    int64_t optimizer_steps() const override { return adam_.steps_taken(); }

    // The gradient buffer (master layout), for tests that compare engines.
    const std::vector<float>& gradients() const { return grads_; }

    void save_state(TrainerState& s) override {
        s.master = weights_.master;
        s.adam_m = adam_.m();
        s.adam_v = adam_.v();
        s.optimizer_steps = adam_.steps_taken();
    }

    void load_state(const TrainerState& s) override {
        weights_.master = s.master;
        weights_updated();
        adam_.m() = s.adam_m;
        adam_.v() = s.adam_v;
        adam_.set_steps_taken(s.optimizer_steps);
    }

    void save_hf(const std::string& dir) override { fp8rl::save_hf(weights_, dir, source_dir_); }

    // The prepared fp8 parameters' copies (quantized from the master on first use, as a rollout would).
    std::vector<Fp8Tensor> fp8_weight_copies() override {
        if (fp8_scaling_ != Fp8Scaling::Block)
            fail("the FP8 export needs --fp8_scaling block (the format holds 128x128 block scales), not %s", fp8_scaling_name(fp8_scaling_));
        std::vector<Fp8Tensor> out;
        for (const Fp8Weight& w : params(Precision::FP8).fp8) out.push_back(w.w);
        return out;
    }
    std::string save_hf_fp8(const std::string& dir, const std::vector<float>& master) override {
        return write_fp8_hf_files(weights_, master, fp8_weight_copies(), dir, source_dir_, fp8_pow2_scales_);
    }

private:
    // generate(), or teacher forcing with `forced` completions; an FP8 cache at the scales of `at`
    // (decode_logprobs, which leaves last_kv_scales() alone) or calibrated on the prompts.
    std::vector<Generation> rollout(const std::vector<GenRequest>& requests, const std::vector<std::vector<int32_t>>* forced,
                                    uint32_t step, const SamplingConfig& s, Precision weights, Precision kv_cache,
                                    Progress* progress, const RolloutNumerics* at = nullptr, int kept_tokens = 0) {
        GenerateOptions o;
        o.sampling.temperature = s.temperature;
        o.sampling.top_k = s.top_k;
        o.sampling.top_p = s.top_p;
        o.max_new_tokens = s.max_new_tokens;
        o.eos_ids = weights_.config.eos_token_ids;
        o.vocab_limit = s.vocab_limit;
        o.seed = s.seed;
        o.step = step;
        o.kv_cache = kv_cache;
        o.kept_tokens = kept_tokens;
        if (kv_cache == Precision::FP8 && at) {
            if (at->k_scale.empty() || at->v_scale.empty()) fail("decode_logprobs: an FP8 KV cache without its scales");
            o.kv_k_scale = at->k_scale, o.kv_v_scale = at->v_scale;
        } else if (kv_cache == Precision::FP8) {
            kv_scales(requests, weights, &o.kv_k_scale, &o.kv_v_scale);
        }
        if (!at) kv_k_scale_ = o.kv_k_scale, kv_v_scale_ = o.kv_v_scale;
        // Chunks only pace the progress bar: every completion depends on its own key alone (a
        // multi-turn rollout's rows keep their caches in the generator: one chunk).
        const size_t chunk = kept_tokens > 0 ? std::max<size_t>(requests.size(), 1) : 256;
        std::vector<Generation> out;
        for (size_t begin = 0; begin < requests.size(); begin += chunk) {
            const size_t end = std::min(requests.size(), begin + chunk);
            std::vector<std::vector<int32_t>> prompts, forced_chunk;
            o.sequence_keys.clear();
            for (size_t i = begin; i < end; i++) {
                prompts.push_back(requests[i].prompt);
                o.sequence_keys.push_back(requests[i].sequence);
                if (forced) forced_chunk.push_back((*forced)[i]);
            }
            if (forced) o.forced = &forced_chunk;
            for (Completion& c : generator_.generate(model_, params(weights), prompts, o)) out.push_back(generation(c));
            if (progress) progress->update((int64_t)end);
        }
        return out;
    }

    static Generation generation(Completion& c) {
        Generation g;
        g.tokens = std::move(c.tokens);
        g.logprobs = std::move(c.logprobs_full);  // full softmax(logits / T): what the trainer computes
        g.logprobs_sampled = std::move(c.logprobs);
        g.sample_offsets = std::move(c.sample_offsets);
        g.finished = c.stopped_on_eos;
        return g;
    }

    bool kv_scale_per_head_;  // --kv_scales head: FP8 KV scales per layer and KV head
    bool train_kv_replay_;    // --train_kv_replay: training attention reads K and V through the rollout's FP8 cache
    Fp8Scaling fp8_scaling_;  // --fp8_scaling: the FP8 weights' and operands' scale granularity
    bool fp8_pow2_scales_;    // --fp8_scales pow2: those scales rounded down to powers of two
    KvAmaxReduce kv_amax_reduce_;  // the FP8 KV amaxes' max over the ranks (EngineOptions)
    std::string source_dir_;
    ModelWeights weights_;
    CpuModel model_;
    std::vector<float> grads_;  // [num_floats()] master layout
    AdamW adam_;
    const Dist* dist_ = nullptr;  // the ranks gradients are summed over (init_optimizer)
    std::map<Precision, ModelParams> params_;
    ForwardActs train_acts_, eval_acts_;
    Generator generator_;
    TokenBatch train_batch_, eval_batch_;
    std::vector<Sequence> train_seqs_;
    Precision train_precision_ = Precision::FP32;
    std::vector<float> kv_k_scale_, kv_v_scale_;  // of the last generate(), FP8 cache only
    Precision turn_weights_ = Precision::BF16;    // the weights of the multi-turn rollout in progress (start_turns)

    // After the master weights changed: the prepared copies (BF16/FP8) follow.
    void weights_updated() {
        for (auto& kv : params_) kv.second.prepare(model_, kv.first);
    }

    // The parameters as precision p reads them, prepared on first use.
    const ModelParams& params(Precision p) {
        auto it = params_.find(p);
        if (it == params_.end()) {
            it = params_.emplace(p, ModelParams()).first;
            it->second.fp8_scaling = fp8_scaling_;
            it->second.fp8_pow2_scales = fp8_pow2_scales_;
            it->second.prepare(model_, p);
        }
        return it->second;
    }

    // FP8 KV-cache scales per layer from the K/V amax of a forward over the prompts with the
    // current weights (spec-fp8.md §9.4), so stale scales never reach the rollout; the amaxes are
    // every rank's prompts' (kv_amax_reduce_), so N ranks cache what one rank caches.
    void kv_scales(const std::vector<GenRequest>& requests, Precision weights, std::vector<float>* k, std::vector<float>* v) {
        std::vector<Sequence> seqs;
        for (const GenRequest& r : requests) seqs.push_back({r.prompt, 0});
        run_forward(seqs, weights, 1.0f, nullptr, nullptr, eval_acts_, eval_batch_, false);
        kv_scales_from_forward(eval_acts_, model_.KV, kv_scale_per_head_, *k, *v, kv_amax_reduce_);
    }

    // Packs the sequences, runs the model, and cuts out the response positions.
    // replay: K and V through the last rollout's FP8 cache (--train_kv_replay, cpu/kv_cache.h); or,
    // given `at` (prefill_logprobs), through its FP8 cache when it has one, whatever --train_kv_replay says.
    void run_forward(const std::vector<Sequence>& seqs, Precision p, float temperature, TokenValues* logprob,
                     TokenValues* entropy, ForwardActs& acts, TokenBatch& batch, bool for_backward, bool replay = false,
                     const RolloutNumerics* at = nullptr) {
        acts.replay_k_scale.clear();
        acts.replay_v_scale.clear();
        if (at ? at->kv_cache == Precision::FP8 : replay && train_kv_replay_) {
            const std::vector<float>& k = at ? at->k_scale : kv_k_scale_, &v = at ? at->v_scale : kv_v_scale_;
            if (k.empty() || v.empty())
                fail(at ? "prefill_logprobs: an FP8 KV cache without its scales"
                        : "--train_kv_replay: a training forward before any rollout with an FP8 KV cache");
            acts.replay_k_scale = kv_scales_by_head(k, model_.L, model_.KV);
            acts.replay_v_scale = kv_scales_by_head(v, model_.L, model_.KV);
            acts.replay_decode_row = replay_decode_rows(seqs);
        }
        batch = TokenBatch();
        for (const Sequence& s : seqs) batch.add(s.ids);
        const long T = batch.num_tokens();
        std::vector<float> lp((size_t)T), ent((size_t)T);
        model_forward(model_, params(p), batch, temperature, acts, lp.data(), ent.data(), for_backward);
        if (logprob) logprob->assign(seqs.size(), {});
        if (entropy) entropy->assign(seqs.size(), {});
        for (size_t s = 0; s < seqs.size(); s++) {
            const int64_t first = batch.offsets[s] + seqs[s].prompt_len, last = batch.offsets[s + 1];
            if (logprob) (*logprob)[s].assign(lp.begin() + first, lp.begin() + last);
            if (entropy) (*entropy)[s].assign(ent.begin() + first, ent.begin() + last);
        }
    }
};

}  // namespace fp8rl
