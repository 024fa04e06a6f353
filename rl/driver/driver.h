// driver.h: one RL step (DESIGN.md §2) and the run around it, on any Engine (rl/driver/engine.h).
//
//   prompts (rank's share of the global batch) -> rollout (G completions each, rollout precision)
//   -> rewards + overlong shaping -> group advantages (+ DAPO dynamic sampling, refilling)
//   -> old log-probs recomputed by the trainer (train precision); rollout/train mismatch metrics;
//      TIS/MIS weights; reference log-probs when KL is on. With one minibatch and one epoch the
//      old policy is the one being trained, so the training forward's log-probs are the old ones,
//      bit for bit: no pass, and the mismatch metrics and weights are taken per micro-batch after
//      its forward (old_lp_from_training); on --mismatch_report steps, before them, the log-probs
//      with each mismatch source switched off (rl/driver/mismatch_report.h)
//   -> Calibrated Clipping shadow passes (fp32) on calibration steps
//   -> epochs x minibatches: forward, per-token loss, backward, gradient all-reduce (sum),
//      NaN/Inf guard, clip, AdamW, refresh derived weights
//   -> metrics line + log.jsonl (+ TensorBoard); periodic eval, dashboard.html; periodic checkpoint
//   -> at the end, a three-line summary (rl/io/run_summary.h)
//
// Ranks run the same code on their own prompts; everything global (token counts of the loss
// normalizer, gradients, metrics, calibration statistics) is summed over ranks in rank order.
#pragma once
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cuda/perf/profile_range.h"
#include "rl/objective/adamw.h"
#include "rl/objective/advantage.h"
#include "rl/objective/calibrated_clip.h"
#include "rl/text/chat.h"
#include "rl/io/checkpoint.h"
#include "rl/io/dashboard.h"
#include "rl/tasks/data.h"
#include "rl/driver/dist.h"
#include "rl/driver/engine.h"
#include "rl/io/logger.h"
#include "rl/io/rollout_dump.h"
#include "rl/driver/mismatch_report.h"
#include "rl/driver/multi_turn.h"
#include "rl/objective/loss_agg.h"
#include "rl/objective/metrics.h"
#include "rl/tasks/reward.h"
#include "rl/tasks/score.h"
#include "rl/io/run_summary.h"
#include "rl/text/tokenizer.h"
#include "rl/driver/train_config.h"
#include "rl/driver/train_setup.h"

namespace fp8rl {

// One response of the step, with everything computed about it. Arrays are per response token.
struct Sample {
    Sequence seq;
    std::vector<float> rollout_lp, old_lp, ref_lp, hp_old_lp;
    std::vector<float> adv;        // the sequence's advantage on every token
    std::vector<double> is_weight; // TIS/MIS weight (detached)
    // 1 = a token the loss trains: the model's (the eos too); 0 = an observation's (--env_cmd)
    std::vector<uint8_t> mask;
    // --dump_rollouts, on the steps it writes: the first training forward's entropy, ratio and clip side
    std::vector<float> entropy;
    std::vector<double> ratio;
    std::vector<int8_t> clipped;
    double score = 0, reward = 0, advantage = 0;
    bool finished = false;
    std::shared_ptr<const RolloutNumerics> numerics;  // --mismatch_report steps: how its generate() computed
    int T() const { return seq.response_len(); }
};

// mean/max/min of per-response values over all ranks, as metrics prefix/{mean,max,min}.
inline void summary_metrics(const Dist& dist, const std::string& prefix, const std::vector<double>& v, MetricRow& m) {
    double sum[2] = {0.0, (double)v.size()}, lo = INFINITY, hi = -INFINITY;
    for (double x : v) {
        sum[0] += x;
        lo = std::min(lo, x);
        hi = std::max(hi, x);
    }
    dist.all_reduce_sum(sum, 2);
    dist.all_reduce_min(&lo, 1);
    dist.all_reduce_max(&hi, 1);
    m.set(prefix + "/mean", sum[1] > 0 ? sum[0] / sum[1] : NAN);
    m.set(prefix + "/max", hi);
    m.set(prefix + "/min", lo);
}

// The reduced StepMetrics (sums, minima, maxima over ranks) into the row.
inline void report_step_metrics(const Dist& dist, StepMetrics& sm, int64_t updates, MetricRow& m) {
    dist.all_reduce_sum(sm.sums);
    dist.all_reduce_min(sm.mins);
    dist.all_reduce_max(sm.maxes);
    for (const auto& kv : sm.finalize(updates)) m.set(kv.first, kv.second);
}

// Seconds since `t0`.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A plain prompt is tokenized as it is; messages are rendered by the model's chat template (the
// renderer of --chat, tested against transformers' apply_chat_template) with the opening of the
// assistant turn, so the policy answers as the assistant. chat: loaded at the first "messages" row.
inline std::vector<int32_t> encode_example_prompt(const Tokenizer& tok, const Example& ex, const std::string& model_dir,
                                                  int enable_thinking, std::unique_ptr<ChatTemplate>& chat) {
    std::vector<int> ids;
    if (ex.messages.empty()) {
        ids = tok.encode(ex.prompt);
    } else {
        if (!chat) chat = std::make_unique<ChatTemplate>(ChatTemplate::load(model_dir));
        std::vector<ChatMessage> messages;
        for (const auto& m : ex.messages) messages.push_back({m.first, m.second, "", false});
        ChatOptions opt;
        opt.enable_thinking = enable_thinking;
        ids = chat->encode(tok, messages, opt);
    }
    return std::vector<int32_t>(ids.begin(), ids.end());
}

// How many tokens a prompt takes as the trainer encodes it (--max_prompt_tokens counts these); the
// chat template is loaded at the first "messages" row and kept.
inline std::function<int64_t(const Example&)> prompt_length_counter(const Tokenizer& tok, const std::string& model_dir,
                                                                   int enable_thinking) {
    auto chat = std::make_shared<std::unique_ptr<ChatTemplate>>();
    return [&tok, model_dir, enable_thinking, chat](const Example& ex) {
        return (int64_t)encode_example_prompt(tok, ex, model_dir, enable_thinking, *chat).size();
    };
}

// The longest prompt the memory plan sizes sequences by: --max_prompt_tokens when given (the data
// holds no longer one), else measured over every row of a dataset or over the first prompts of a
// synthetic task (whose lengths --task_size bounds).
inline int64_t planned_prompt_tokens(const TrainConfig& cfg, const std::function<int64_t(const Example&)>& length,
                                     PromptSource& prompts) {
    if (cfg.max_prompt_tokens > 0) return cfg.max_prompt_tokens;
    const int64_t n = prompts.size() > 0 ? prompts.size() : kMeasuredTaskPrompts;
    int64_t longest = 0;
    for (int64_t i = 0; i < n; i++) longest = std::max(longest, length(prompts.at(i)));
    return longest;
}

// The micro-batches of the sequences [b, e): consecutive runs holding at most max_tokens tokens each
// (a longer sequence forms one alone); max_tokens 0 = one micro-batch. Returns the boundaries,
// b = bounds[0] < ... < bounds.back() = e (just {b, e} when the range is empty).
inline std::vector<size_t> micro_batch_bounds(const std::vector<Sequence>& seqs, size_t b, size_t e, int64_t max_tokens) {
    std::vector<size_t> bounds = {b};
    int64_t tokens = 0;
    for (size_t i = b; i < e; i++) {
        const int64_t n = (int64_t)seqs[i].ids.size();
        if (max_tokens > 0 && i > bounds.back() && tokens + n > max_tokens) {
            bounds.push_back(i);
            tokens = 0;
        }
        tokens += n;
    }
    bounds.push_back(e);
    return bounds;
}

class Trainer {
public:
    // model_dir: where the tokenizer's chat template is read from, for dataset rows with "messages".
    Trainer(TrainConfig cfg, const Dist& dist, Engine& engine, Engine* reference, const Tokenizer& tok,
            const std::string& model_dir, PromptSource train, std::vector<EvalSet> eval)
        : cfg_(std::move(cfg)), dist_(dist), engine_(engine), ref_(reference), tok_(tok), model_dir_(model_dir),
          train_(std::move(train)), eval_(std::move(eval)), scorer_(make_scorer(cfg_.reward)),
          env_(cfg_.env.enabled() ? std::make_unique<EnvWorkers>(cfg_.env) : nullptr) {
        engine_.init_optimizer(cfg_.adam, dist_);
        cfg_.sampling.vocab_limit = tok.vocab_size();  // a padded embedding's extra rows are never sampled
        // Without Calibrated Clipping (or measuring only) the bounds are the reference bounds, always.
        bounds_ = cfg_.calibrated_clip == 1 ? cc_initial_state() : CalibState{1.0 - cfg_.clip_low, 1.0 + cfg_.clip_high};
    }

    // Continues from a checkpoint's trainer state (weights, optimizer, cursor, bounds, step).
    void restore(const TrainerState& s) {
        if (s.master.size() != engine_.num_floats())
            fail("--resume: the trainer state holds %zu weights, the model %zu; resume with the same model",
                 s.master.size(), engine_.num_floats());
        engine_.load_state(s);
        step_ = s.step;
        cursor_ = s.data_cursor;
        bad_steps_ = s.bad_steps;
        bounds_ = CalibState{s.clip_low, s.clip_high};
        bounds_.low_unset = s.cc_low_unset;
        bounds_.high_unset = s.cc_high_unset;
        bounds_.pooled = s.cc_pooled;
        bounds_.pooled_steps = s.cc_pooled_steps;
    }

    int64_t step() const { return step_; }

    // Runs steps until cfg.steps; evaluates, redraws the dashboard and checkpoints on schedule;
    // ends with the summary. Returns the last eval.
    MetricRow run(Logger& log) {
        MetricRow last_eval;
        const auto t0 = std::chrono::steady_clock::now();
        for (; step_ < cfg_.steps;) {
            MetricRow m = train_step();
            bool last = step_ == cfg_.steps;
            const bool eval = cfg_.eval_every > 0 && (step_ % cfg_.eval_every == 0 || last);
            if (eval) {
                last_eval = evaluate();
                for (auto& kv : last_eval.items) m.set(kv.first, kv.second);
            }
            log.record(m);
            log.print(step_line(m, cfg_.steps));
            if (eval && !eval_.empty()) log.print(eval_lines(m));
            if ((eval || last) && log.enabled()) write_dashboard(dashboard_path(), dashboard_title(), log.rows());
            if ((cfg_.save_every > 0 && step_ % cfg_.save_every == 0) || last) save(log);
        }
        log.print(run_summary(cfg_, log.rows(), seconds_since(t0)));
        return last_eval;
    }

    std::string dashboard_path() const { return cfg_.out_dir + "/dashboard.html"; }
    std::string dashboard_title() const {
        return strfmt("fp8rl: %s on %s, rollout %s, training %s, KV cache %s, FP8 scaling %s, Calibrated Clipping %s",
                      cfg_.algo.c_str(), cfg_.task.c_str(), precision_name(cfg_.rollout_precision),
                      precision_name(cfg_.train_precision), precision_name(cfg_.kv_cache), fp8_scaling_name(cfg_.fp8_scaling),
                      cfg_.calibrated_clip == 1 ? "on" : cfg_.calibrated_clip == 2 ? "measuring" : "off");
    }

    // The eval's readable lines, one per set ("" without sets).
    std::string eval_lines(const MetricRow& m) const {
        std::string out;
        for (const EvalSet& set : eval_)
            out += (out.empty() ? "" : "\n") + eval_set_line(set.name, m, cfg_.eval.k, cfg_.eval.greedy);
        return out;
    }

    // The state a checkpoint holds.
    TrainerState state() {
        TrainerState s;
        s.step = step_;
        s.data_cursor = cursor_;
        s.bad_steps = bad_steps_;
        s.clip_low = bounds_.low;
        s.clip_high = bounds_.high;
        s.cc_low_unset = bounds_.low_unset;
        s.cc_high_unset = bounds_.high_unset;
        s.cc_pooled = bounds_.pooled;
        s.cc_pooled_steps = bounds_.pooled_steps;
        engine_.save_state(s);
        return s;
    }

    // One RL step; returns its metrics (reduced over ranks).
    MetricRow train_step();
    // Every held-out set's scores (rl/driver/eval.h); with dump, each generation's --dump_eval line
    // of this rank's prompts is appended to it.
    MetricRow evaluate(std::string* dump = nullptr);
    // --eval_only 1: one evaluate() of the loaded weights at this step, printed and written to
    // OUT_DIR/eval.jsonl (its generations to OUT_DIR/eval_generations.jsonl with --dump_eval 1, one
    // file per rank on several); nothing else is written.
    void evaluate_only(const std::string& model_dir);

private:
    TrainConfig cfg_;
    const Dist& dist_;
    Engine& engine_;
    Engine* ref_;  // frozen reference policy, only when KL is on
    const Tokenizer& tok_;
    std::string model_dir_;
    mutable std::unique_ptr<ChatTemplate> chat_;  // loaded at the first "messages" row
    PromptSource train_;
    std::vector<EvalSet> eval_;
    int64_t step_ = 0, cursor_ = 0, bad_steps_ = 0, consecutive_bad_ = 0;
    int64_t empty_passes_ = 0;  // this step's passes of no sequences (a collective pass on a rank with fewer micro-batches)
    CalibState bounds_;  // ratio bounds in force and Calibrated Clipping's state (its initial one when it is on)
    // The scorer (built-in verifier, --reward_cmd workers or --reward_url) and this step's figures of an external one.
    std::unique_ptr<Scorer> scorer_;
    double reward_seconds_ = 0;
    int64_t reward_timeouts_ = 0;
    std::vector<std::pair<std::string, std::pair<double, double>>> reward_metric_sums_;  // name -> (sum, count)
    std::unique_ptr<EnvWorkers> env_;  // --env_cmd's workers; null = single-turn

    std::vector<int32_t> encode_prompt(const Example& ex) const;
    std::string decode_response(const std::vector<int32_t>& tokens) const;
    std::vector<ScoreResult> score_generations(const std::vector<Example>& examples, int per_example,
                                               const std::vector<GenRequest>& requests, const std::vector<Generation>& done, bool eval,
                                               const std::string& task, const std::vector<uint8_t>& skip = {});
    std::vector<Trajectory> multi_turn_rollout(const std::vector<Example>& examples, int per_example,
                                               const std::vector<GenRequest>& requests, uint32_t step, const SamplingConfig& sampling,
                                               Progress* progress, bool eval);
    // The environment's rewards where it gave one, else the scorer's (training's and the eval's rule).
    std::vector<ScoreResult> score_trajectories(const std::vector<Example>& examples, int per_example,
                                                const std::vector<GenRequest>& requests, const std::vector<Trajectory>& trajectories,
                                                bool eval, const std::string& task);
    void report_reward_metrics(MetricRow& m, const std::string& prefix);
    std::vector<Sample> rollout(MetricRow& m, double* gen_seconds, int64_t* gen_tokens);
    std::vector<std::pair<size_t, size_t>> forward_batches(const std::vector<Sequence>& seqs, const std::vector<size_t>& mb_begin) const;
    TokenValues batched_logprobs(Engine& engine, const std::vector<Sequence>& seqs, const std::vector<size_t>& mb_begin,
                                 Precision p);
    bool old_lp_from_training() const;
    // --dump_rollouts: a sample's per-token values of its first training forward; the step's file.
    static void record_for_dump(Sample& s, const SequenceTokens& st, const ClipBounds& bounds);
    void dump_rollouts(const std::vector<Sample>& samples) const;
    // Both engines into a phase: into the rollout the reference first, so that the policy's high-water
    // mark of the rollout starts after both freed their update buffers.
    void enter_phase(Engine::Phase p) {
        if (p == Engine::Phase::Rollout && ref_) ref_->enter_phase(p);
        engine_.enter_phase(p);
        if (p == Engine::Phase::Update && ref_) ref_->enter_phase(p);
    }
    void save(Logger& log);
};

inline std::vector<int32_t> Trainer::encode_prompt(const Example& ex) const {
    return encode_example_prompt(tok_, ex, model_dir_, cfg_.enable_thinking, chat_);
}

inline std::string Trainer::decode_response(const std::vector<int32_t>& tokens) const {
    return tok_.decode(std::vector<int>(tokens.begin(), tokens.end()), /*skip_special_tokens=*/true);
}

// Scores generation i, the answer to examples[i / per_example], as request id requests[i].sequence (the
// same on any rank count) of this step (or of the eval after it), sample i % per_example of its group,
// for `task` (--task, or an eval set's).
// An external scorer's time, timeouts and metrics add up until reported; its failure stops the run
// (no checkpoint is written).
inline std::vector<ScoreResult> Trainer::score_generations(const std::vector<Example>& examples, int per_example,
                                                           const std::vector<GenRequest>& requests, const std::vector<Generation>& done,
                                                           bool eval, const std::string& task, const std::vector<uint8_t>& skip) {
    std::vector<ScoreRequest> batch;
    std::vector<std::string> prompts(examples.size());
    for (size_t e = 0; e < examples.size(); e++)  // the text the model saw: a plain prompt, or the rendered chat
        prompts[e] = examples[e].messages.empty() ? examples[e].prompt
                                                  : tok_.decode(std::vector<int>(requests[e * (size_t)per_example].prompt.begin(),
                                                                                 requests[e * (size_t)per_example].prompt.end()),
                                                                /*skip_special_tokens=*/false);
    std::vector<size_t> scored;  // the generations not skipped, in order
    for (size_t i = 0; i < done.size(); i++) {
        if (!skip.empty() && skip[i]) continue;
        scored.push_back(i);
        const Example& ex = examples[i / (size_t)per_example];
        ScoreRequest& r = batch.emplace_back();
        r.id = requests[i].sequence;
        r.task = task;
        r.prompt = prompts[i / (size_t)per_example];
        r.response = decode_response(done[i].tokens);
        r.answer = ex.answer;
        r.data = ex.data;
        r.step = step_;
        r.sample = (int64_t)(i % (size_t)per_example);
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<ScoreResult> out(done.size()), got;
    try {
        if (!batch.empty()) got = scorer_->score(batch);
    } catch (const Error& e) {
        fail("%s %lld: %s; stopping (the last checkpoint in %s is intact)", eval ? "eval after step" : "step",
             (long long)(eval ? step_ : step_ + 1), e.what(), cfg_.out_dir.c_str());
    }
    for (size_t k = 0; k < scored.size(); k++) out[scored[k]] = std::move(got[k]);
    reward_seconds_ += seconds_since(t0);
    for (const ScoreResult& r : out) {
        reward_timeouts_ += r.timed_out;
        for (const auto& kv : r.metrics) {
            auto it = std::find_if(reward_metric_sums_.begin(), reward_metric_sums_.end(), [&](const auto& x) { return x.first == kv.first; });
            if (it == reward_metric_sums_.end()) it = reward_metric_sums_.insert(reward_metric_sums_.end(), {kv.first, {0.0, 0.0}});
            it->second.first += kv.second;
            it->second.second += 1;
        }
    }
    return out;
}

// --env_cmd: every request's trajectory (rl/driver/multi_turn.h). request i answers examples[i /
// per_example]; its conversation starts as the example's messages, or a plain prompt as one user turn,
// and an observation is rendered by the chat template of a messages row, or as its plain text.
inline std::vector<Trajectory> Trainer::multi_turn_rollout(const std::vector<Example>& examples, int per_example,
                                                           const std::vector<GenRequest>& requests, uint32_t step,
                                                           const SamplingConfig& sampling, Progress* progress, bool eval) {
    std::vector<EnvRequest> first(requests.size());
    for (size_t i = 0; i < requests.size(); i++) {
        const Example& ex = examples[i / (size_t)per_example];
        EnvRequest& r = first[i];
        r.id = requests[i].sequence;
        r.messages = ex.messages.empty() ? std::vector<std::pair<std::string, std::string>>{{"user", ex.prompt}} : ex.messages;
        r.answer = ex.answer;
        r.data = ex.data;
    }
    const bool chat = !examples.empty() && !examples[0].messages.empty();  // a dataset's rows are all one or the other
    ChatOptions opt;
    opt.enable_thinking = cfg_.enable_thinking;
    TrajectoryContext ctx;
    ctx.env = env_.get();
    ctx.max_turns = cfg_.env.max_turns;
    ctx.max_turn_tokens = cfg_.env.max_turn_tokens;
    ctx.max_total_tokens = cfg_.env.max_total_tokens;
    ctx.decode = [&](const std::vector<int32_t>& ids) { return decode_response(ids); };
    ctx.render = [&](const std::string& role, const std::string& content, bool ended_on_eos) {
        const std::string text = chat ? chat_->continuation(role, content, ended_on_eos, opt) : content;
        if (int b = tok_.first_unencodable_byte(content); b >= 0)  // dropped by the tokenizer, the model would never see it
            fail("--env_cmd: the observation '%.80s' holds byte 0x%02x, which no token of the model's vocabulary holds (a fresh "
                 "model's tokenizer knows only its task's bytes); have the environment answer in those", content.c_str(), b);
        const std::vector<int> ids = tok_.encode(text, false);
        return std::vector<int32_t>(ids.begin(), ids.end());
    };
    try {
        return run_trajectories(engine_, requests, std::move(first), step, sampling, cfg_.rollout_precision, cfg_.kv_cache, progress, ctx);
    } catch (const Error& e) {
        fail("%s %lld: %s; stopping (the last checkpoint in %s is intact)", eval ? "eval after step" : "step",
             (long long)(eval ? step_ : step_ + 1), e.what(), cfg_.out_dir.c_str());
    }
}

inline std::vector<ScoreResult> Trainer::score_trajectories(const std::vector<Example>& examples, int per_example,
                                                            const std::vector<GenRequest>& requests,
                                                            const std::vector<Trajectory>& trajectories, bool eval,
                                                            const std::string& task) {
    std::vector<Generation> done;
    std::vector<uint8_t> rewarded;
    for (const Trajectory& t : trajectories) {
        done.push_back(t.gen);
        rewarded.push_back(t.has_reward);
    }
    std::vector<ScoreResult> out = score_generations(examples, per_example, requests, done, eval, task, rewarded);
    for (size_t i = 0; i < trajectories.size(); i++)
        if (rewarded[i]) {
            out[i].verdict.reward = trajectories[i].reward;
            out[i].verdict.correct = trajectories[i].reward > 0;
        }
    return out;
}

// An external scorer's figures since the last call: reward/latency_s (the slowest rank's scoring
// time), reward/timeouts (summed) and reward/NAME, the mean of each metric over the responses that
// report it on any rank (the names are gathered and sorted, so every rank reduces the same list);
// `prefix` before each name ("val/" for the eval's).
inline void Trainer::report_reward_metrics(MetricRow& m, const std::string& prefix) {
    if (!scorer_->external()) return;
    std::string mine;
    for (const auto& kv : reward_metric_sums_) mine += kv.first + '\n';
    const std::vector<char> all = dist_.all_gather(std::vector<char>(mine.begin(), mine.end()));
    std::vector<std::string> names;
    for (size_t b = 0, e; b < all.size(); b = e + 1) {
        e = std::find(all.begin() + (long)b, all.end(), '\n') - all.begin();
        names.emplace_back(all.begin() + (long)b, all.begin() + (long)e);
    }
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    std::vector<double> sums(names.size() * 2 + 1, 0.0);  // [name][sum, count], timeouts
    for (size_t k = 0; k < names.size(); k++)
        for (const auto& kv : reward_metric_sums_)
            if (kv.first == names[k]) {
                sums[k * 2] = kv.second.first;
                sums[k * 2 + 1] = kv.second.second;
            }
    sums.back() = (double)reward_timeouts_;
    dist_.all_reduce_sum(sums);
    double latency = reward_seconds_;
    dist_.all_reduce_max(&latency, 1);
    for (size_t k = 0; k < names.size(); k++) m.set(prefix + "reward/" + names[k], sums[k * 2] / sums[k * 2 + 1]);
    m.set(prefix + "reward/timeouts", sums.back());
    m.set(prefix + "reward/latency_s", latency);
    reward_seconds_ = 0;
    reward_timeouts_ = 0;
    reward_metric_sums_.clear();
}

// Rollout, scoring and advantages, with DAPO dynamic sampling: batches of prompts are generated
// until the kept groups (rewards not all equal) fill the global batch or the attempts run out.
inline std::vector<Sample> Trainer::rollout(MetricRow& m, double* gen_seconds, int64_t* gen_tokens) {
    const int G = cfg_.group_size, ranks = dist_.size();
    const int64_t B = cfg_.batch_prompts;
    std::vector<Sample> kept;
    std::vector<double> scores, correct, rewards, lengths, prompt_lengths, clipped;
    int64_t kept_groups_global = 0, seen_groups_global = 0, attempts = 0;
    double env_sums[4] = {0, 0, 0, 0};  // --env_cmd: trajectories, turns, observation tokens, truncated
    *gen_seconds = 0;
    *gen_tokens = 0;
    enter_phase(Engine::Phase::Rollout);
    for (int attempt = 0; attempt < cfg_.max_gen_batches; attempt++) {
        attempts++;
        std::vector<int64_t> positions = PromptSource::rank_positions(B, cfg_.minibatches, dist_.rank(), ranks);
        std::vector<GenRequest> requests;
        std::vector<Example> examples;
        for (int64_t pos : positions) {
            examples.push_back(train_.at(cursor_ + pos));
            std::vector<int32_t> prompt = encode_prompt(examples.back());
            for (int g = 0; g < G; g++)
                requests.push_back({prompt, (uint32_t)(((int64_t)attempt * B + pos) * G + g)});
        }
        cursor_ += B;
        auto t0 = std::chrono::steady_clock::now();
        Progress bar("rollout", (int64_t)requests.size(), dist_.is_root());
        std::vector<Generation> done;
        std::vector<Trajectory> trajectories;  // --env_cmd
        if (env_) {
            trajectories = multi_turn_rollout(examples, G, requests, (uint32_t)step_, cfg_.sampling, &bar, false);
            for (const Trajectory& t : trajectories) {
                done.push_back(t.gen);
                env_sums[0] += 1;
                env_sums[1] += t.turns;
                env_sums[2] += (double)t.observation_tokens;
                env_sums[3] += t.truncated;
            }
        } else {
            done = engine_.generate(requests, (uint32_t)step_, cfg_.sampling, cfg_.rollout_precision, cfg_.kv_cache, &bar);
        }
        *gen_seconds += seconds_since(t0);
        std::shared_ptr<const RolloutNumerics> numerics;  // its FP8 KV scales, before another generate() changes them
        if (mismatch_report_step(cfg_.mismatch_report, step_))
            numerics = last_rollout_numerics(engine_, cfg_.rollout_precision, cfg_.kv_cache);
        // the environment's last reward, else the verifier's on the whole conversation
        std::vector<ScoreResult> verdicts = env_ ? score_trajectories(examples, G, requests, trajectories, false, cfg_.task)
                                                 : score_generations(examples, G, requests, done, false, cfg_.task);
        std::vector<Sample> batch(done.size());
        std::vector<double> batch_rewards(done.size());
        for (size_t i = 0; i < done.size(); i++) {
            Sample& s = batch[i];
            s.seq.ids = requests[i].prompt;
            s.seq.prompt_len = (int32_t)requests[i].prompt.size();
            s.seq.ids.insert(s.seq.ids.end(), done[i].tokens.begin(), done[i].tokens.end());
            s.rollout_lp = done[i].logprobs;
            s.numerics = numerics;
            s.finished = done[i].finished;
            s.mask = env_ ? trajectories[i].loss_mask : std::vector<uint8_t>(done[i].tokens.size(), 1);
            *gen_tokens += valid_tokens(s.mask.data(), (int)s.mask.size());  // the model's tokens
            const Verdict& v = verdicts[i].verdict;
            s.score = v.reward;
            correct.push_back(v.correct ? 1.0 : 0.0);
            s.reward = s.score + overlong_penalty((int64_t)done[i].tokens.size(), cfg_.response_budget(),
                                                  cfg_.overlong_buffer, cfg_.overlong_penalty);
            batch_rewards[i] = s.reward;
            scores.push_back(s.score);
            rewards.push_back(s.reward);
            lengths.push_back((double)done[i].tokens.size());
            prompt_lengths.push_back((double)s.seq.prompt_len);
            clipped.push_back(s.finished ? 0.0 : 1.0);
        }
        std::vector<double> adv = batch_advantages(batch_rewards, (size_t)G, cfg_.estimator);
        for (size_t i = 0; i < batch.size(); i++) {
            batch[i].advantage = adv[i];
            batch[i].adv.assign((size_t)batch[i].T(), (float)adv[i]);
        }
        if (!cfg_.dynamic_sampling) {
            kept = std::move(batch);
            break;
        }
        GroupFilter f = filter_informative_groups(batch_rewards, (size_t)G);
        for (size_t g : f.kept)
            for (int i = 0; i < G; i++) kept.push_back(std::move(batch[g * (size_t)G + (size_t)i]));
        kept_groups_global += dist_.sum((int64_t)f.kept.size());
        seen_groups_global += B;
        if (kept_groups_global >= B) break;
    }
    if (env_) {
        dist_.all_reduce_sum(env_sums, 4);
        m.set("env/turns", env_sums[1] / env_sums[0]);
        m.set("env/observation_tokens", env_sums[2] / env_sums[0]);
        m.set("env/truncated", env_sums[3] / env_sums[0]);
    }
    if (cfg_.dynamic_sampling) {
        m.set("dynamic_sampling/num_gen_batches", (double)attempts);
        m.set("dynamic_sampling/kept_group_fraction", (double)kept_groups_global / (double)seen_groups_global);
    }
    // the FP8 KV cache's scales of the last generation, recalibrated on every call
    std::vector<float> k_scale, v_scale;
    engine_.last_kv_scales(&k_scale, &v_scale);
    if (!k_scale.empty()) {
        m.set("fp8/kv_scale_k_min", *std::min_element(k_scale.begin(), k_scale.end()));
        m.set("fp8/kv_scale_k_max", *std::max_element(k_scale.begin(), k_scale.end()));
        m.set("fp8/kv_scale_v_min", *std::min_element(v_scale.begin(), v_scale.end()));
        m.set("fp8/kv_scale_v_max", *std::max_element(v_scale.begin(), v_scale.end()));
    }
    std::vector<double> advantages;
    for (const Sample& x : kept) advantages.push_back(x.advantage);
    enter_phase(Engine::Phase::Update);
    summary_metrics(dist_, "critic/advantages", advantages, m);
    summary_metrics(dist_, "critic/score", scores, m);
    summary_metrics(dist_, "critic/rewards", rewards, m);
    summary_metrics(dist_, "response_length", lengths, m);
    summary_metrics(dist_, "prompt_length", prompt_lengths, m);
    summary_metrics(dist_, "response_length/clip", clipped, m);  // its mean is the clip ratio
    m.set("response_length/clip_ratio", m.get("response_length/clip/mean"));
    summary_metrics(dist_, "critic/correct", correct, m);
    report_reward_metrics(m, "");
    return kept;
}

// The forwards training makes over seqs, [begin, end) each: each minibatch's micro-batches, so that
// no forward holds more tokens than a training one (the bound a GPU engine's memory plan counts on).
inline std::vector<std::pair<size_t, size_t>> Trainer::forward_batches(const std::vector<Sequence>& seqs,
                                                                       const std::vector<size_t>& mb_begin) const {
    std::vector<std::pair<size_t, size_t>> batches;
    for (size_t j = 0; j + 1 < mb_begin.size(); j++) {
        const std::vector<size_t> mu = micro_batch_bounds(seqs, mb_begin[j], mb_begin[j + 1], cfg_.micro_batch_tokens);
        for (size_t k = 0; k + 1 < mu.size(); k++)
            if (mu[k] != mu[k + 1]) batches.push_back({mu[k], mu[k + 1]});  // skips an empty minibatch
    }
    return batches;
}

// Log-probs of seqs in the forwards training makes (forward_batches).
inline TokenValues Trainer::batched_logprobs(Engine& engine, const std::vector<Sequence>& seqs,
                                             const std::vector<size_t>& mb_begin, Precision p) {
    const std::vector<std::pair<size_t, size_t>> batches = forward_batches(seqs, mb_begin);
    // A collective forward runs as often on every rank: agreed before the first, since a rank that
    // stopped early would wait in the agreement while the others wait in their next gather.
    int64_t calls = (int64_t)batches.size();
    if (engine.collective_logprobs(p)) dist_.all_reduce_max(&calls, 1);
    TokenValues out;
    for (int64_t b = 0; b < calls; b++) {
        TokenValues lp;
        if (b < (int64_t)batches.size()) {
            engine.logprobs(std::vector<Sequence>(seqs.begin() + (long)batches[b].first, seqs.begin() + (long)batches[b].second),
                            p, cfg_.sampling.temperature, &lp, nullptr);
        } else {
            engine.logprobs({}, p, cfg_.sampling.temperature, &lp, nullptr);  // this rank's share of the gathers
            empty_passes_++;
        }
        for (auto& v : lp) out.push_back(std::move(v));
    }
    return out;
}

// True when the old policy's log-probs are the training forward's, so the pass recomputing them is
// skipped (as TRL's GRPOTrainer skips it): one minibatch and one epoch, so the single update's
// forward runs on the weights the rollout ended with, over the micro-batches batched_logprobs would
// form (micro_batch_bounds of the same range and budget), at the same precision and temperature,
// and forward_train computes what logprobs() does (each engine's contract: cpu/engine_cpu.h and
// cuda/engine/engine_gpu.cuh run the same forward for both). The sums of the step's metrics keep their
// order: the rollout mismatch ones are summed sequence by sequence in sample order either way.
inline bool Trainer::old_lp_from_training() const {
    return cfg_.minibatches == 1 && cfg_.epochs == 1 && !cfg_.always_old_logprob_pass;
}

inline void Trainer::record_for_dump(Sample& s, const SequenceTokens& st, const ClipBounds& bounds) {
    s.entropy.assign(st.entropy, st.entropy + st.T);
    s.ratio.resize((size_t)st.T);
    s.clipped.resize((size_t)st.T);
    for (int t = 0; t < st.T; t++) {
        if (!st.mask[t]) {  // an observation's token: no entropy, ratio or clip
            s.entropy[(size_t)t] = NAN;
            s.ratio[(size_t)t] = NAN;
            s.clipped[(size_t)t] = 0;
            continue;
        }
        PolicyTokenLoss pg = policy_token_loss(st.logp[t], st.old_logp[t], st.adv[t], bounds);
        s.ratio[(size_t)t] = pg.ratio;
        s.clipped[(size_t)t] = !(pg.flags & kClipped) ? 0 : pg.ratio < bounds.low ? -1 : 1;
    }
}

// Every rank's lines, gathered in rank order, written by rank 0.
inline void Trainer::dump_rollouts(const std::vector<Sample>& samples) const {
    std::string text;
    for (const Sample& x : samples) {
        // a step stopped by NaN/Inf leaves later samples without a training forward: their values null
        Sample s = x;
        const size_t T = (size_t)s.T();
        if (s.old_lp.size() != T) s.old_lp.assign(T, NAN);
        if (s.is_weight.size() != T) s.is_weight.assign(T, NAN);
        if (s.entropy.size() != T) s.entropy.assign(T, NAN);
        if (s.ratio.size() != T) s.ratio.assign(T, NAN);
        if (s.clipped.size() != T) s.clipped.assign(T, 0);
        RolloutDumpSample d;
        d.step = step_;
        d.prompt = tok_.decode(std::vector<int>(s.seq.ids.begin(), s.seq.ids.begin() + s.seq.prompt_len), false);
        const std::vector<int32_t> response(s.seq.ids.begin() + s.seq.prompt_len, s.seq.ids.end());
        d.response = decode_response(response);
        d.ids = response.data();
        d.reward = s.reward;
        d.advantage = s.advantage;
        d.T = s.T();
        d.rollout_lp = s.rollout_lp.data();
        d.old_lp = s.old_lp.data();
        d.entropy = s.entropy.data();
        d.is_weight = s.is_weight.data();
        d.ratio = s.ratio.data();
        d.clipped = s.clipped.data();
        d.loss_mask = s.mask.data();
        text += rollout_dump_line(d);
    }
    std::vector<char> all = dist_.all_gather(std::vector<char>(text.begin(), text.end()));
    if (dist_.is_root()) write_file_atomic(rollout_dump_path(cfg_.out_dir, step_), std::string(all.begin(), all.end()));
}

inline MetricRow Trainer::train_step() {
    auto t_step = std::chrono::steady_clock::now();
    MetricRow m;
    m.set("training/global_step", (double)step_);
    double gen_s = 0;
    int64_t gen_tokens = 0;
    std::vector<Sample> samples = rollout(m, &gen_s, &gen_tokens);
    m.set("timing_s/gen", gen_s);
    m.set("perf/gen_tokens_per_s", (double)dist_.sum(gen_tokens) / std::max(gen_s, 1e-9) / dist_.size());

    std::vector<Sequence> seqs;
    for (const Sample& s : samples) seqs.push_back(s.seq);
    const float T = cfg_.sampling.temperature;
    // Minibatch j is the j-th contiguous share of this rank's samples (rank_positions keeps
    // minibatch j the same prompts for any rank count).
    const int M = cfg_.minibatches;
    std::vector<size_t> mb_begin((size_t)M + 1);
    for (int j = 0; j <= M; j++) mb_begin[(size_t)j] = samples.size() * (size_t)j / (size_t)M;

    // --mismatch_report: the log-probs of each source switched, on the weights the rollout sampled with
    const bool reporting = mismatch_report_step(cfg_.mismatch_report, step_);
    std::vector<MismatchSource> mismatch;
    double mismatch_s = 0;
    if (reporting) {
        const auto tm = std::chrono::steady_clock::now();
        std::vector<std::shared_ptr<const RolloutNumerics>> numerics;
        for (const Sample& s : samples) numerics.push_back(s.numerics);
        mismatch = mismatch_logprobs(engine_, seqs, numerics, cfg_.rollout_precision, cfg_.kv_cache, cfg_.sampling,
                                     forward_batches(seqs, mb_begin), [&](Engine::Phase p) { enter_phase(p); });
        mismatch_s = seconds_since(tm);
    }

    // Old log-probs from the trainer, in training precision (decoupled PPO: never the rollout's);
    // from the training forward itself when that is the same computation (timing_s/old_log_prob 0).
    const bool old_from_training = old_lp_from_training();
    auto t0 = std::chrono::steady_clock::now();
    if (!old_from_training) {
        PROFILE_RANGE("old_logprobs");
        TokenValues old_lp = batched_logprobs(engine_, seqs, mb_begin, cfg_.train_precision);
        for (size_t i = 0; i < samples.size(); i++) samples[i].old_lp = old_lp[i];
    }
    m.set("timing_s/old_log_prob", old_from_training ? 0.0 : seconds_since(t0));
    if (ref_) {
        t0 = std::chrono::steady_clock::now();
        TokenValues ref_lp = batched_logprobs(*ref_, seqs, mb_begin, cfg_.train_precision);
        for (size_t i = 0; i < samples.size(); i++) samples[i].ref_lp = ref_lp[i];
        m.set("timing_s/ref", seconds_since(t0));
    }
    // Mismatch between what the rollout sampled with and what the trainer computes; IS weights. A
    // sample's old_lp must be known: before training, or after its training forward.
    StepMetrics sm;
    auto rollout_mismatch = [&](Sample& s) {
        s.is_weight.resize((size_t)s.T());
        sequence_is_weights(cfg_.is_correction, cfg_.is_floor, cfg_.is_cap, s.old_lp.data(), s.rollout_lp.data(), s.mask.data(), s.T(),
                            s.is_weight.data());
        sm.add_rollout_sequence(s.old_lp.data(), s.rollout_lp.data(), s.is_weight.data(), s.mask.data(), s.T(), cfg_.is_cap);
    };
    if (!old_from_training)
        for (Sample& s : samples) rollout_mismatch(s);

    // Calibrated Clipping: fp32 shadow pass of the old policy on calibration steps (also when only
    // measuring, --calibrated_clip 2: the calib/* metrics at the reference bounds, which stay).
    const bool calibrating = cfg_.calibrated_clip && cc_is_calibration_step(step_, cfg_.cc_interval);
    CalibConfig ccfg;
    ccfg.ref_low = 1.0 - cfg_.clip_low;
    ccfg.ref_high = 1.0 + cfg_.clip_high;
    ccfg.dual_clip = cfg_.dual_clip;
    ccfg.agg = cfg_.loss_agg;
    CalibStats cc_stats(ccfg, bounds_);
    double calib_s = 0;
    if (calibrating) {
        t0 = std::chrono::steady_clock::now();
        TokenValues hp = batched_logprobs(engine_, seqs, mb_begin, Precision::FP32);
        for (size_t i = 0; i < samples.size(); i++) samples[i].hp_old_lp = hp[i];
        calib_s += seconds_since(t0);
    }

    // Each minibatch's loss normalizers are counted over all ranks before the first backward.
    std::vector<int64_t> counts((size_t)M * 2, 0);  // [M][tokens, sequences]
    for (int j = 0; j < M; j++) {
        std::vector<int64_t> lens;
        for (size_t i = mb_begin[(size_t)j]; i < mb_begin[(size_t)j + 1]; i++) lens.push_back(valid_tokens(samples[i].mask.data(), samples[i].T()));
        AggCounts c = agg_counts_of(lens.data(), lens.size());
        counts[(size_t)j * 2] = c.tokens;
        counts[(size_t)j * 2 + 1] = c.sequences;
    }
    dist_.all_reduce_sum(counts);
    // The micro-batches of minibatch j on this rank: none when dynamic sampling kept it no group.
    auto micro_batches = [&](int j) {
        const size_t b = mb_begin[(size_t)j], e = mb_begin[(size_t)j + 1];
        return b == e ? std::vector<size_t>{b} : micro_batch_bounds(seqs, b, e, cfg_.micro_batch_tokens);
    };
    // A collective backward runs as often on every rank: each minibatch's most micro-batches.
    std::vector<int64_t> forwards((size_t)M);
    for (int j = 0; j < M; j++) forwards[(size_t)j] = (int64_t)micro_batches(j).size() - 1;
    if (engine_.collective_backward()) dist_.all_reduce_max(forwards.data(), forwards.size());

    TokenLossConfig lc;
    lc.bounds.low = bounds_.low;
    lc.bounds.high = bounds_.high;
    lc.bounds.dual_clip = cfg_.dual_clip;
    lc.kl_coef = cfg_.kl_coef;
    lc.kl = cfg_.kl_estimator;
    lc.entropy_coef = cfg_.entropy_coef;
    const double horizon = (double)cfg_.response_budget();  // Λ of seq-mean-token-sum-norm
    // The loss's gradient at a token follows from the token's log-prob and entropy and what is known
    // before the forward (old and reference log-probs, advantage, IS weight, the normalizers), so the
    // training forward and backward run as one call (forward_backward_train) unless the old log-probs
    // come from this forward and the IS weights of a sequence need all its log-probs first.
    const IsCorrection isc = cfg_.is_correction;
    const bool gradient_per_token =
        !(old_from_training && (isc == IsCorrection::SeqTis || isc == IsCorrection::SeqMis || isc == IsCorrection::GeoMask));
    const bool dumping = cfg_.dump_rollouts > 0 && step_ % cfg_.dump_rollouts == 0;
    double grad_norm_sum = 0, train_s = 0, lr = 0;
    int64_t train_tokens = 0, updates = 0;
    bool bad = false;
    for (int epoch = 0; epoch < cfg_.epochs && !bad; epoch++) {
        for (int j = 0; j < M && !bad; j++) {
            const size_t b = mb_begin[(size_t)j], e = mb_begin[(size_t)j + 1];
            const AggCounts global{counts[(size_t)j * 2], counts[(size_t)j * 2 + 1]};
            // No rank holds a sequence of it (dynamic sampling kept no group): no update, the weights stay.
            if (global.sequences == 0) continue;
            const bool calibrate = calibrating && epoch == 0;
            TokenValues hp_lp;  // calibrate: fp32 log-probs of the weights about to be updated, [b, e)
            if (calibrate) {
                auto tc = std::chrono::steady_clock::now();
                if (j == 0) {  // still the old weights: the old pass is this pass
                    for (size_t i = b; i < e; i++) hp_lp.push_back(samples[i].hp_old_lp);
                } else {  // before the training forward: a GPU engine keeps one forward's activations
                    std::vector<size_t> whole = {b, e};
                    hp_lp = batched_logprobs(engine_, seqs, whole, Precision::FP32);
                }
                calib_s += seconds_since(tc);
            }
            // One update: the gradients of the minibatch's micro-batches accumulate (backward adds).
            engine_.zero_grads();
            double loss = 0;
            const std::vector<size_t> mu = micro_batches(j);
            for (size_t u = 0; u + 1 < mu.size(); u++) {
                t0 = std::chrono::steady_clock::now();
                const size_t ub = mu[u], ue = mu[u + 1];
                std::vector<Sequence> mb(seqs.begin() + (long)ub, seqs.begin() + (long)ue);
                TokenValues lp, ent;
                if (gradient_per_token) {  // the engine may fuse the backward into the forward (its LM head)
                    std::vector<double> weight(mb.size());  // c of each sequence (loss_agg.h)
                    for (size_t k = 0; k < mb.size(); k++)
                        weight[k] = agg_token_weight(cfg_.loss_agg, valid_tokens(samples[ub + k].mask.data(), samples[ub + k].T()),
                                                     global, horizon);
                    auto grad = [&](size_t k, size_t t, float logp, float h, float* dlp, float* dh) {
                        const Sample& s = samples[ub + k];
                        *dlp = *dh = 0.0f;
                        if (!s.mask[t]) return;
                        // the only update's forward: logp is the old log-prob too, its IS weight a token's own
                        double w = old_from_training ? 0.0 : s.is_weight[t];
                        if (old_from_training)
                            sequence_is_weights(cfg_.is_correction, cfg_.is_floor, cfg_.is_cap, &logp, &s.rollout_lp[t], &s.mask[t],
                                                1, &w);
                        const float old = old_from_training ? logp : s.old_lp[t];
                        token_gradient(weight[k], token_loss(logp, old, ref_ ? s.ref_lp[t] : logp, s.adv[t], w, h, lc), dlp, dh);
                    };
                    engine_.forward_backward_train(mb, cfg_.train_precision, T, &lp, &ent, grad);
                } else {
                    engine_.forward_train(mb, cfg_.train_precision, T, &lp, &ent);
                }
                if (old_from_training)  // the only update's forward: these are the old policy's log-probs
                    for (size_t k = 0; k < mb.size(); k++) {
                        samples[ub + k].old_lp = lp[k];
                        rollout_mismatch(samples[ub + k]);
                    }
                if (calibrate) {
                    for (size_t k = 0; k < mb.size(); k++) {
                        const Sample& s = samples[ub + k];
                        cc_stats.add_sequence(lp[k].data(), s.old_lp.data(), hp_lp[ub - b + k].data(), s.hp_old_lp.data(),
                                              s.adv.data(), s.is_weight.data(), s.mask.data(), s.T(), ent[k].data(),
                                              s.reward > 0);
                    }
                }
                TokenValues d_lp(mb.size()), d_ent(mb.size());
                for (size_t k = 0; k < mb.size(); k++) {
                    const Sample& s = samples[ub + k];
                    d_lp[k].resize((size_t)s.T());
                    d_ent[k].resize((size_t)s.T());
                    SequenceTokens st;
                    st.T = s.T();
                    st.logp = lp[k].data();
                    st.old_logp = s.old_lp.data();
                    st.ref_logp = ref_ ? s.ref_lp.data() : nullptr;
                    st.adv = s.adv.data();
                    st.is_weight = s.is_weight.data();
                    st.entropy = ent[k].data();
                    st.mask = s.mask.data();
                    SequenceLoss sl = sequence_loss(st, lc, cfg_.loss_agg, global, horizon, d_lp[k].data(), d_ent[k].data());
                    if (dumping && epoch == 0) record_for_dump(samples[ub + k], st, lc.bounds);
                    loss += sl.loss;
                    sm.add_sequence_loss(sl);
                    sm.add_policy_sequence(st, lc.bounds);
                    train_tokens += s.T();
                }
                if (!gradient_per_token) engine_.backward(d_lp, d_ent);
                train_s += seconds_since(t0);
            }
            for (int64_t u = (int64_t)mu.size() - 1; u < forwards[(size_t)j]; u++, empty_passes_++) engine_.backward_of_nothing();
            t0 = std::chrono::steady_clock::now();
            double norm = engine_.reduce_and_clip_grads(cfg_.grad_clip);
            loss = dist_.sum(loss);
            if (!std::isfinite(norm) || !std::isfinite(loss)) {
                bad = true;  // skip this and the remaining updates of the step; the weights stay as they are
                break;
            }
            lr = cfg_.lr.at(engine_.optimizer_steps());
            engine_.optimizer_step(lr);
            grad_norm_sum += norm;
            updates++;
            train_s += seconds_since(t0);
        }
    }
    if (bad) {
        bad_steps_++;
        consecutive_bad_++;
        if (consecutive_bad_ >= cfg_.max_bad_steps)
            fail("step %lld: NaN/Inf in the loss or gradients for %d steps in a row; stopping (the last checkpoint in %s is intact); lower --lr or check the data",
                 (long long)step_ + 1, (int)consecutive_bad_, cfg_.out_dir.c_str());
    } else {
        consecutive_bad_ = 0;
    }
    m.set("training/skipped_bad", bad ? 1 : 0);
    m.set("training/bad_steps_total", (double)bad_steps_);
    if (dumping) dump_rollouts(samples);
    report_step_metrics(dist_, sm, updates, m);
    if (reporting) {
        std::vector<MismatchSample> ms;
        for (const Sample& s : samples)
            ms.push_back({s.old_lp.size() == (size_t)s.T() ? s.old_lp.data() : nullptr, s.rollout_lp.data(), s.mask.data(), s.T()});
        report_mismatch(dist_, ms, mismatch, cfg_.is_cap, m);
        m.set("timing_s/mismatch_report", mismatch_s);
    }
    m.set("actor/grad_norm", updates ? grad_norm_sum / (double)updates : NAN);
    m.set("actor/lr", lr);
    m.set("actor/kl_coef", cfg_.kl_coef);
    m.set("timing_s/update_actor", train_s);
    m.set("perf/train_tokens_per_s", (double)dist_.sum(train_tokens) / std::max(train_s, 1e-9) / dist_.size());
    m.set("perf/empty_passes", (double)dist_.sum(empty_passes_));  // work lost to ranks' unequal micro-batch counts
    empty_passes_ = 0;

    // New bounds take effect from the next step (spec-rl.md §12.8).
    m.set("calib/clip_low", bounds_.low);
    m.set("calib/clip_high", bounds_.high);
    if (calibrating) {
        auto tc = std::chrono::steady_clock::now();
        dist_.all_reduce_sum(cc_stats.values);
        CalibResult r = cc_decide(ccfg, bounds_, cc_stats);
        if (cfg_.calibrated_clip == 1)
            bounds_ = r.bounds;
        else
            r.pooled = false;  // measuring only: nothing is kept for the next calibration
        for (const auto& kv : cc_metrics(r)) m.set(kv.first, kv.second);
        m.set("timing_s/calib", calib_s + seconds_since(tc));
    }
    step_++;
    m.set("training/epoch", (double)cursor_ / std::max<double>(1.0, (double)train_.size()));
    // the device's high-water mark of each phase of this step, the most of any rank (an engine on a device)
    std::vector<double> peaks(2, 0.0);
    size_t rollout_peak = 0, update_peak = 0;
    if (engine_.phase_peaks(&rollout_peak, &update_peak)) {
        peaks = {rollout_peak / 1073741824.0, update_peak / 1073741824.0};
        dist_.all_reduce_max(peaks);
        m.set("memory/rollout_peak_gib", peaks[0]);
        m.set("memory/train_peak_gib", peaks[1]);
    }
    m.set("timing_s/step", seconds_since(t_step));
    return m;
}

inline MetricRow Trainer::evaluate(std::string* dump) {
    enter_phase(Engine::Phase::Rollout);
    std::vector<Trajectory> trajectories;  // --env_cmd: the last eval generation's
    EvalGenerate multi_turn;
    if (env_)
        multi_turn = [&](const std::vector<GenRequest>& requests, uint32_t at, const SamplingConfig& sampling,
                         const std::vector<Example>& examples, int per_example) {
            trajectories = multi_turn_rollout(examples, per_example, requests, at, sampling, nullptr, true);
            std::vector<Generation> out;
            for (const Trajectory& t : trajectories) out.push_back(t.gen);
            return out;
        };
    MetricRow m = evaluate_sets(
        engine_, dist_, eval_, cfg_.eval, cfg_.rollout_precision, cfg_.kv_cache, step_, cfg_.sampling.vocab_limit,
        [&](const Example& ex) { return encode_prompt(ex); },
        [&](const std::vector<int32_t>& ids, bool skip_special) { return tok_.decode(std::vector<int>(ids.begin(), ids.end()), skip_special); },
        [&](const EvalSet& set, const std::vector<Example>& examples, int per_example, const std::vector<GenRequest>& requests,
            const std::vector<Generation>& done) {  // training's scorer: built-in or external, its failure rules
            std::vector<Verdict> v;
            for (const ScoreResult& r : env_ ? score_trajectories(examples, per_example, requests, trajectories, true, set.task)
                                             : score_generations(examples, per_example, requests, done, true, set.task))
                v.push_back(r.verdict);
            return v;
        },
        dump, multi_turn);
    enter_phase(Engine::Phase::Update);
    report_reward_metrics(m, "val/");
    return m;
}

inline void Trainer::evaluate_only(const std::string& model_dir) {
    std::string dump;
    MetricRow m;
    m.set("training/global_step", (double)step_);
    for (auto& kv : evaluate(cfg_.eval.dump ? &dump : nullptr).items) m.set(kv.first, kv.second);
    std::string files;
    if (cfg_.eval.dump) {
        files = cfg_.out_dir + "/eval_generations" + (dist_.size() > 1 ? strfmt(".rank%d", dist_.rank()) : "") + ".jsonl";
        write_file_atomic(files, dump);
    }
    if (!dist_.is_root()) return;
    std::string line = "{\"model\":";
    json_append_string(line, model_dir);
    write_file_atomic(cfg_.out_dir + "/eval.jsonl", line + "," + metrics_json(m).substr(1) + "\n");
    printf("eval of %s at step %lld:\n%s\nfiles: %s/eval.jsonl%s%s\n", model_dir.c_str(), (long long)step_, eval_lines(m).c_str(),
           cfg_.out_dir.c_str(), files.empty() ? "" : " ", files.c_str());
}

// Writes a checkpoint of state (a HF directory of the engine's weights with recipe.json and the
// trainer state) on rank 0, prunes the old ones, and waits for every rank.
inline void save_run_checkpoint(const TrainConfig& cfg, const Dist& dist, Engine& engine, const TrainerState& s, Logger& log) {
    auto t0 = std::chrono::steady_clock::now();
    if (dist.is_root()) {
        std::string notice;
        std::string dir = save_checkpoint(cfg.out_dir, s, [&](const std::string& d) {
            if (cfg.save_format != SaveFormat::FP8) engine.save_hf(d);
            if (cfg.save_format != SaveFormat::BF16) {
                const std::string fp8_dir = cfg.save_format == SaveFormat::FP8 ? d : d + "/fp8";
                std::error_code ec;
                std::filesystem::create_directories(fp8_dir, ec);
                if (ec) fail("%s: cannot create directory (%s)", fp8_dir.c_str(), ec.message().c_str());
                notice = engine.save_hf_fp8(fp8_dir, s.master);
            }
            write_file_atomic(d + "/" + kRecipeFile, recipe_json(cfg));
        });
        if (!notice.empty()) log.print(notice);
        std::string line = "  checkpoint: " + dir + strfmt(" (%.1fs)", seconds_since(t0));
        if (cfg.save_format != SaveFormat::BF16) line += cfg.save_format == SaveFormat::FP8 ? " (block FP8)" : " (bf16, block FP8 in fp8/)";
        if (cfg.keep_checkpoints > 0) {
            size_t removed = prune_checkpoints(cfg.out_dir, cfg.keep_checkpoints).size();
            if (removed) line += strfmt("; removed %zu older (--keep_checkpoints %lld)", removed, (long long)cfg.keep_checkpoints);
        }
        log.print(line);
    }
    dist.barrier();
}

inline void Trainer::save(Logger& log) { save_run_checkpoint(cfg_, dist_, engine_, state(), log); }

}  // namespace fp8rl
