// old_logprobs_run.h: what the tests of the old policy's log-probs (rl/driver/driver.h,
// Trainer::old_lp_from_training) share on both engines (test/test_trainer_old_logprobs.cpp on the
// CPU engine, test/gpu/test_trainer_old_logprobs_gpu.cu on the GPU engine): an engine that records
// every call, a short in-process training with it, and the comparison of two runs' metrics and weights.
#pragma once
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "rl/driver/driver.h"
#include "rl/driver/train_setup.h"
#include "test/harness.h"
#include "test/temp_dir.h"

namespace fp8rl::old_lp_test {

// Passes every call to the CPU engine. Counts logprobs() calls per precision and keeps, per step,
// the values that logprobs() in training precision (the old-log-prob pass) and forward_train()
// returned, in call order. Before each forward_train it also asks logprobs() of the same sequences
// (not counted) and counts the values whose bits differ from the training forward's.
class RecordingEngine : public Engine {
public:
    RecordingEngine(Engine& e, Precision train) : e_(e), train_(train) {}

    std::map<Precision, int> logprob_calls;
    std::vector<std::vector<float>> old_pass_lp, train_lp;  // [step] concatenated over calls
    long shadow_values = 0, shadow_mismatches = 0;

    void begin_step() {
        old_pass_lp.emplace_back();
        train_lp.emplace_back();
    }

    size_t num_floats() const override { return e_.num_floats(); }
    std::vector<Generation> generate(const std::vector<GenRequest>& r, uint32_t step, const SamplingConfig& s, Precision w,
                                     Precision kv, Progress* p) override {
        return e_.generate(r, step, s, w, kv, p);
    }
    std::vector<Generation> start_turns(const std::vector<GenRequest>& r, int total, uint32_t step, const SamplingConfig& s,
                                        Precision w, Precision kv, Progress* p) override {
        return e_.start_turns(r, total, step, s, w, kv, p);
    }
    std::vector<Generation> next_turns(const std::vector<TurnRequest>& t) override { return e_.next_turns(t); }
    void end_turns() override { e_.end_turns(); }
    int64_t turn_fed_tokens() const override { return e_.turn_fed_tokens(); }
    void last_kv_scales(std::vector<float>* k, std::vector<float>* v) const override { e_.last_kv_scales(k, v); }
    TokenValues decode_logprobs(const std::vector<Sequence>& seqs, const SamplingConfig& s, const RolloutNumerics& n) override {
        return e_.decode_logprobs(seqs, s, n);
    }
    TokenValues prefill_logprobs(const std::vector<Sequence>& seqs, float temperature, const RolloutNumerics& n) override {
        return e_.prefill_logprobs(seqs, temperature, n);
    }
    void logprobs(const std::vector<Sequence>& seqs, Precision p, float temperature, TokenValues* lp, TokenValues* ent) override {
        logprob_calls[p]++;
        e_.logprobs(seqs, p, temperature, lp, ent);
        if (p == train_ && lp)
            for (const auto& v : *lp) old_pass_lp.back().insert(old_pass_lp.back().end(), v.begin(), v.end());
    }
    void forward_train(const std::vector<Sequence>& seqs, Precision p, float temperature, TokenValues* lp,
                       TokenValues* ent) override {
        TokenValues shadow;
        e_.logprobs(seqs, p, temperature, &shadow, nullptr);
        e_.forward_train(seqs, p, temperature, lp, ent);
        for (size_t s = 0; s < seqs.size(); s++) {
            train_lp.back().insert(train_lp.back().end(), (*lp)[s].begin(), (*lp)[s].end());
            shadow_values += (long)(*lp)[s].size();
            if (shadow[s].size() != (*lp)[s].size()) {
                shadow_mismatches += (long)(*lp)[s].size();
                continue;
            }
            for (size_t t = 0; t < shadow[s].size(); t++)
                shadow_mismatches += memcmp(&shadow[s][t], &(*lp)[s][t], sizeof(float)) != 0;
        }
    }
    void last_train_top1(TokenValues* top1) const override { e_.last_train_top1(top1); }
    void backward(const TokenValues& d_lp, const TokenValues& d_ent) override { e_.backward(d_lp, d_ent); }
    void init_optimizer(const AdamWConfig& cfg, const Dist& dist) override { e_.init_optimizer(cfg, dist); }
    void zero_grads() override { e_.zero_grads(); }
    double reduce_and_clip_grads(double max_norm) override { return e_.reduce_and_clip_grads(max_norm); }
    void optimizer_step(double lr) override { e_.optimizer_step(lr); }
    int64_t optimizer_steps() const override { return e_.optimizer_steps(); }
    void save_state(TrainerState& s) override { e_.save_state(s); }
    void load_state(const TrainerState& s) override { e_.load_state(s); }
    void save_hf(const std::string& dir) override { e_.save_hf(dir); }
    std::vector<Fp8Tensor> fp8_weight_copies() override { return e_.fp8_weight_copies(); }
    std::string save_hf_fp8(const std::string& dir, const std::vector<float>& master) override { return e_.save_hf_fp8(dir, master); }

private:
    Engine& e_;
    Precision train_;
};

struct Run {
    std::vector<MetricRow> rows;
    std::vector<float> master;
    std::map<Precision, int> logprob_calls;
    std::vector<std::vector<float>> old_pass_lp, train_lp;
    long shadow_values = 0, shadow_mismatches = 0;
    Precision train_precision = Precision::FP32;
};

// `steps` steps of a fresh tiny model on 1-digit addition with `flags` on top: several
// micro-batches per minibatch (of at most micro_batch_tokens tokens), the KL term (a reference
// policy), Calibrated Clipping calibrating on steps 0, 2, ... (its shadow passes and the
// calibration statistics read old_lp), TIS weights.
template <class EngineT>
inline Run train(const std::string& flags, bool always_pass, int steps = 3, int micro_batch_tokens = 40) {
    harness::TempDir tmp;
    std::string line = "--init tiny --task add --task_size 1 --max_new_tokens 4 --group_size 4 --batch_prompts 8"
                       " --lr 3e-3 --eval_every 0 --seed 7 --kl_coef 0.05"
                       " --calibrated_clip 1 --cc_interval 2 --out_dir " + tmp.path +
                       strfmt(" --steps %d --micro_batch_tokens %d ", steps, micro_batch_tokens) + flags;
    std::vector<std::string> words = {"train_rl_cpu"};
    for (size_t pos = 0; pos < line.size();) {
        size_t end = line.find(' ', pos);
        if (end == std::string::npos) end = line.size();
        if (end > pos) words.push_back(line.substr(pos, end - pos));
        pos = end + 1;
    }
    std::vector<char*> argv;
    for (std::string& w : words) argv.push_back(&w[0]);
    Args args = Args::parse((int)argv.size(), argv.data(), FlagEngine::Cpu);
    TrainConfig cfg = train_config_from_args(args);
    cfg.always_old_logprob_pass = always_pass;
    Dist dist;
    const std::string dir = model_directory(args, cfg, dist);
    std::unique_ptr<Tokenizer> tok = Tokenizer::load(dir + "/tokenizer.json");
    EngineT engine(dir, engine_options_from_args(args));
    EngineT reference(engine);
    RecordingEngine rec(engine, cfg.train_precision);
    Trainer trainer(cfg, dist, rec, &reference, *tok, dir, training_prompts(cfg), eval_sets(cfg));
    Run r;
    for (int64_t s = 0; s < cfg.steps; s++) {
        rec.begin_step();
        r.rows.push_back(trainer.train_step());
    }
    r.master = trainer.state().master;
    r.logprob_calls = rec.logprob_calls;
    r.old_pass_lp = rec.old_pass_lp;
    r.train_lp = rec.train_lp;
    r.shadow_values = rec.shadow_values;
    r.shadow_mismatches = rec.shadow_mismatches;
    r.train_precision = cfg.train_precision;
    return r;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && (a.empty() || memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

inline bool wall_clock(const std::string& name) {
    return name.rfind("timing_s/", 0) == 0 || name.rfind("perf/", 0) == 0 || name.rfind("memory/", 0) == 0;  // and the device's memory
}

// Every metric of every step but the wall-clock ones: the same names in the same order, the same bits.
inline void check_same_metrics(const Run& a, const Run& b, const std::string& what) {
    CHECK_EQ(a.rows.size(), b.rows.size());
    int compared = 0;
    for (size_t s = 0; s < a.rows.size() && s < b.rows.size(); s++) {
        std::vector<std::pair<std::string, double>> x, y;
        for (const auto& kv : a.rows[s].items)
            if (!wall_clock(kv.first)) x.push_back(kv);
        for (const auto& kv : b.rows[s].items)
            if (!wall_clock(kv.first)) y.push_back(kv);
        CHECK_MSG(x.size() == y.size(), "%s, step %zu: %zu metrics vs %zu", what.c_str(), s + 1, x.size(), y.size());
        for (size_t i = 0; i < x.size() && i < y.size(); i++) {
            const bool same = x[i].first == y[i].first && memcmp(&x[i].second, &y[i].second, sizeof(double)) == 0;
            CHECK_MSG(same, "%s, step %zu: %s = %.17g vs %s = %.17g", what.c_str(), s + 1, x[i].first.c_str(), x[i].second,
                      y[i].first.c_str(), y[i].second);
            compared += same;
        }
    }
    CHECK(compared > 30 * (int)a.rows.size());
    CHECK_MSG(same_bits(a.master, b.master), "%s: the master weights differ", what.c_str());
    printf("    %s: %d metrics over %zu steps and %zu master weights bit-identical\n", what.c_str(), compared, a.rows.size(),
           a.master.size());
}

inline int calls(const Run& r, Precision p) {
    auto it = r.logprob_calls.find(p);
    return it == r.logprob_calls.end() ? 0 : it->second;
}

// A run without the pass (skip) against the same run with it (pass), both of `train`'s config:
// skip asked logprobs() nothing in training precision (only Calibrated Clipping's fp32 shadow pass,
// as pass did), its training forwards returned the pass's bits (in every micro-batch, and over each
// step against pass's pass), and every metric and weight is the same bits.
inline void check_no_pass_equals_pass(const Run& skip, const Run& pass, const char* precision) {
    const Precision p = skip.train_precision;
    CHECK_MSG(calls(skip, p) == 0, "%s: %d old-log-prob calls", precision, calls(skip, p));
    CHECK_MSG(calls(pass, p) >= 2 * (int)pass.rows.size(), "%s: %d calls with the pass forced", precision, calls(pass, p));
    int calibrating = 0;
    for (const MetricRow& row : skip.rows) {
        calibrating += row.has("timing_s/calib");
        CHECK_EQ(row.get("timing_s/old_log_prob"), 0.0);
        // the ratio of the only update is new/old of the same forward: exactly 1
        CHECK_EQ(row.get("actor/ratio_min"), 1.0);
        CHECK_EQ(row.get("actor/ratio_max"), 1.0);
        CHECK(std::isfinite(row.get("rollout_corr/kl")) && std::isfinite(row.get("rollout_corr/rollout_is_mean")));
    }
    CHECK_EQ(calibrating, ((int)skip.rows.size() + 1) / 2);  // --cc_interval 2: steps 0, 2, ...
    // the fp32 shadow pass of the calibration steps (a call per micro-batch) is made either way
    CHECK(calls(skip, Precision::FP32) >= calibrating);
    CHECK_EQ(calls(skip, Precision::FP32), calls(pass, Precision::FP32));
    // the training forward's log-probs are the pass's, value for value: in every micro-batch, and
    // over each step the skipping run's training forwards against the forced run's pass
    CHECK_MSG(skip.shadow_values > 0 && skip.shadow_mismatches == 0, "%s: %ld of %ld values differ", precision,
              skip.shadow_mismatches, skip.shadow_values);
    CHECK_EQ(skip.train_lp.size(), pass.old_pass_lp.size());
    for (size_t s = 0; s < skip.train_lp.size() && s < pass.old_pass_lp.size(); s++)
        CHECK_MSG(!skip.train_lp[s].empty() && same_bits(skip.train_lp[s], pass.old_pass_lp[s]),
                  "%s, step %zu: the training forward's %zu log-probs are not the pass's %zu", precision, s + 1,
                  skip.train_lp[s].size(), pass.old_pass_lp[s].size());
    check_same_metrics(skip, pass, std::string(precision) + ", no pass vs the pass");
}

// A run with two minibatches or two epochs (flags): the pass ran, over every sequence once a step.
inline void check_pass_runs(const Run& r, const char* flags) {
    CHECK_MSG(calls(r, r.train_precision) >= 2 * (int)r.rows.size(), "%s: %d old-log-prob calls", flags, calls(r, r.train_precision));
    for (size_t s = 0; s < r.old_pass_lp.size(); s++)
        CHECK_MSG(r.old_pass_lp[s].size() * (strstr(flags, "epochs") ? 2 : 1) == r.train_lp[s].size(),
                  "%s, step %zu: the pass computed %zu log-probs, training %zu", flags, s + 1, r.old_pass_lp[s].size(),
                  r.train_lp[s].size());
    for (const MetricRow& row : r.rows) CHECK(row.get("timing_s/old_log_prob") > 0.0);
}

}  // namespace fp8rl::old_lp_test
