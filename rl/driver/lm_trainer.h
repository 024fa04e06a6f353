// lm_trainer.h: --mode sft and --mode cpt (docs/sft.md) on any Engine (rl/driver/engine.h): next-token
// cross-entropy on the masked tokens of packed sequences (rl/driver/lm_data.h), the same engines,
// optimizer, checkpoints and logs as RL.
//
// A step takes --batch_seqs rows (conversations or windows) over all ranks, each rank its contiguous
// share; its loss is the token mean over the step's loss tokens on every rank, so the gradient of
// token t is -1/N d log p(t) with N counted over the ranks before the first backward, and N ranks
// train what one rank trains. train/loss is that mean before the update; train/mean_token_accuracy
// the fraction of those N tokens that are their position's most likely token (Engine::last_train_top1).
#pragma once
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "rl/driver/driver.h"
#include "rl/driver/lm_sources.h"

namespace fp8rl {

// The step's line on stdout.
inline std::string lm_step_line(const MetricRow& m, int64_t steps) {
    std::string s = strfmt("step %4lld/%lld | loss %.4f ppl %.3g acc %.3f | tokens %.0f | gnorm %.3g lr %.2g | %.0f tok/s %.2fs",
                           (long long)m.get("training/global_step") + 1, (long long)steps, m.get("train/loss"),
                           m.get("train/ppl"), m.get("train/mean_token_accuracy"), m.get("train/tokens"),
                           m.get("actor/grad_norm"), m.get("actor/lr"), m.get("perf/tokens_per_s"), m.get("timing_s/step"));
    if (m.has("val/loss")) s += strfmt(" | val/loss %.4f (bf16 %.4f)", m.get("val/loss"), m.get("val/loss_bf16"));
    if (m.get("training/skipped_bad", 0) > 0) s += " | SKIPPED: NaN/Inf";
    return s;
}

class LmTrainer {
public:
    // eval: the held-out rows, or null
    LmTrainer(TrainConfig cfg, const Dist& dist, Engine& engine, std::unique_ptr<LmStream> train, std::unique_ptr<LmRows> eval)
        : cfg_(std::move(cfg)), dist_(dist), engine_(engine), train_(std::move(train)), eval_(std::move(eval)) {
        engine_.init_optimizer(cfg_.adam, dist_);
    }

    void restore(const TrainerState& s) {
        if (s.master.size() != engine_.num_floats())
            fail("--resume: the trainer state holds %zu weights, the model %zu; resume with the same model", s.master.size(),
                 engine_.num_floats());
        engine_.load_state(s);
        step_ = s.step;
        cursor_ = s.data_cursor;
        bad_steps_ = s.bad_steps;
    }

    int64_t step() const { return step_; }

    std::string dashboard_path() const { return cfg_.out_dir + "/dashboard.html"; }
    std::string dashboard_title() const {
        return strfmt("fp8rl: %s, training %s, FP8 scaling %s with %s scales", cfg_.mode.c_str(), precision_name(cfg_.train_precision),
                      fp8_scaling_name(cfg_.fp8_scaling), cfg_.fp8_pow2_scales ? "power-of-two" : "fp32");
    }

    // --eval_task_data: the task eval (rl/driver/eval.h) at each eval, prompts encoded as an RL run's.
    void set_task_eval(std::vector<EvalSet> sets, const Tokenizer& tok, const std::string& model_dir) {
        task_eval_ = std::move(sets), tok_ = &tok, model_dir_ = model_dir;
    }

    void run(Logger& log) {
        const bool eval = eval_ != nullptr || !task_eval_.empty();
        if (eval && step_ == 0) {  // the start, logged as the step-0 row
            MetricRow m = evaluate();
            m.set("training/global_step", 0);
            if (m.has("val/loss")) log.print(strfmt("eval at step 0: val/loss %.4f (bf16 %.4f)", m.get("val/loss"), m.get("val/loss_bf16")));
            print_task_eval(log, m);
            log.record(m);
        }
        for (; step_ < cfg_.steps;) {
            MetricRow m = train_step();
            const bool last = step_ == cfg_.steps, eval_now = eval && ((cfg_.eval_every > 0 && step_ % cfg_.eval_every == 0) || last);
            if (eval_now)
                for (auto& kv : evaluate().items) m.set(kv.first, kv.second);
            log.record(m);
            log.print(lm_step_line(m, cfg_.steps));
            if (eval_now) print_task_eval(log, m);
            if ((eval_now || last) && log.enabled()) write_dashboard(dashboard_path(), dashboard_title(), log.rows(), DashKind::Lm);
            if ((cfg_.save_every > 0 && step_ % cfg_.save_every == 0) || last) save(log);
        }
    }

    MetricRow train_step() {
        const auto t_step = std::chrono::steady_clock::now();
        MetricRow m;
        m.set("training/global_step", (double)step_);
        std::vector<Sequence> seqs;
        std::vector<std::vector<uint8_t>> masks;
        for (int64_t pos : PromptSource::rank_positions(cfg_.batch_seqs, 1, dist_.rank(), dist_.size()))
            for (const LmSequence& s : train_->at(cursor_ + pos)) {
                masks.emplace_back();
                seqs.push_back(engine_sequence(s, &masks.back()));
            }
        cursor_ += cfg_.batch_seqs;
        int64_t local_tokens = 0;
        for (const auto& mk : masks)
            for (uint8_t b : mk) local_tokens += b;
        const int64_t N = dist_.sum(local_tokens);
        const std::vector<size_t> mu = micro_batch_bounds(seqs, 0, seqs.size(), cfg_.micro_batch_tokens);
        int64_t forwards = (int64_t)mu.size() - 1;
        if (engine_.collective_backward()) dist_.all_reduce_max(&forwards, 1);

        engine_.zero_grads();
        double nll = 0, hits = 0;  // this rank's sums over its loss tokens: -log p, and top-1 hits
        int64_t tokens = 0;
        for (size_t u = 0; u + 1 < mu.size(); u++) {
            const std::vector<Sequence> mb(seqs.begin() + (long)mu[u], seqs.begin() + (long)mu[u + 1]);
            TokenValues lp, ent, top1;
            // d(loss)/d(logprob) = -1/N at each loss token: known before the forward (the fused head)
            auto grad = [&](size_t k, size_t t, float, float, float* dlp, float* dent) {
                *dlp = masks[mu[u] + k][t] ? (float)(-1.0 / (double)N) : 0.0f;
                *dent = 0.0f;
            };
            engine_.forward_backward_train(mb, cfg_.train_precision, 1.0f, &lp, &ent, grad);
            engine_.last_train_top1(&top1);
            for (size_t k = 0; k < mb.size(); k++) {
                const std::vector<uint8_t>& mk = masks[mu[u] + k];
                for (size_t t = 0; t < mk.size(); t++)
                    if (mk[t]) {
                        nll -= lp[k][t];
                        hits += top1[k][t];
                    }
                tokens += (int64_t)mb[k].ids.size();
            }
        }
        for (int64_t u = (int64_t)mu.size() - 1; u < forwards; u++) engine_.backward_of_nothing();
        const double norm = engine_.reduce_and_clip_grads(cfg_.grad_clip);
        const double loss = dist_.sum(nll) / (double)N;
        const bool bad = !std::isfinite(norm) || !std::isfinite(loss);
        double lr = cfg_.lr.at(engine_.optimizer_steps());
        if (!bad) engine_.optimizer_step(lr);
        note_bad_step(bad);
        const double seconds = seconds_since(t_step);
        m.set("train/loss", loss);
        m.set("train/ppl", std::exp(loss));
        m.set("train/mean_token_accuracy", dist_.sum(hits) / (double)N);
        m.set("train/tokens", (double)N);
        m.set("actor/grad_norm", norm);
        m.set("actor/lr", lr);
        m.set("perf/tokens_per_s", (double)dist_.sum(tokens) / std::max(seconds, 1e-9));
        m.set("training/skipped_bad", bad ? 1 : 0);
        m.set("training/bad_steps_total", (double)bad_steps_);
        m.set("training/epoch", train_->epoch(cursor_));
        size_t rollout_peak = 0, update_peak = 0;  // an engine on a device: its high-water mark, the most of any rank
        if (engine_.phase_peaks(&rollout_peak, &update_peak)) {
            std::vector<double> peak = {update_peak / 1073741824.0};
            dist_.all_reduce_max(peak);
            m.set("memory/train_peak_gib", peak[0]);
        }
        m.set("timing_s/step", seconds);
        step_++;
        return m;
    }

    // val/loss (the training precision) and val/loss_bf16 (the same weights in BF16) over the held-out
    // rows, each rank its contiguous share, in forwards of at most --micro_batch_tokens.
    MetricRow evaluate() {
        MetricRow m = task_eval();
        if (!eval_) return m;
        const int64_t n = eval_->size(), begin = n * dist_.rank() / dist_.size(), end = n * (dist_.rank() + 1) / dist_.size();
        std::vector<Sequence> seqs;
        std::vector<std::vector<uint8_t>> masks;
        for (int64_t i = begin; i < end; i++)
            for (const LmSequence& s : eval_->row(i)) {
                masks.emplace_back();
                seqs.push_back(engine_sequence(s, &masks.back()));
            }
        const std::vector<size_t> mu = micro_batch_bounds(seqs, 0, seqs.size(), cfg_.micro_batch_tokens);
        auto mean_nll = [&](Precision p) {
            int64_t calls = (int64_t)mu.size() - 1;  // a collective pass runs as often on every rank
            if (engine_.collective_logprobs(p)) dist_.all_reduce_max(&calls, 1);
            double sums[2] = {0, 0};  // [nll, tokens]
            for (int64_t u = 0; u < calls; u++) {
                const bool mine = u + 1 < (int64_t)mu.size() && mu[(size_t)u] != mu[(size_t)u + 1];
                const size_t b = mine ? mu[(size_t)u] : 0, e = mine ? mu[(size_t)u + 1] : 0;
                TokenValues lp;
                engine_.logprobs(std::vector<Sequence>(seqs.begin() + (long)b, seqs.begin() + (long)e), p, 1.0f, &lp, nullptr);
                for (size_t k = 0; k < lp.size(); k++)
                    for (size_t t = 0; t < lp[k].size(); t++)
                        if (masks[b + k][t]) {
                            sums[0] -= lp[k][t];
                            sums[1] += 1;
                        }
            }
            dist_.all_reduce_sum(sums, 2);
            return sums[0] / sums[1];
        };
        const double loss = mean_nll(cfg_.train_precision);
        m.set("val/loss", loss);
        m.set("val/loss_bf16", cfg_.train_precision == Precision::BF16 ? loss : mean_nll(Precision::BF16));
        return m;
    }

private:
    TrainConfig cfg_;
    const Dist& dist_;
    Engine& engine_;
    std::unique_ptr<LmStream> train_;  // the row at each global position
    std::unique_ptr<LmRows> eval_;
    std::vector<EvalSet> task_eval_;
    const Tokenizer* tok_ = nullptr;
    std::string model_dir_;
    std::unique_ptr<ChatTemplate> chat_;  // loaded at the first "messages" row

    // The task eval's scores, generated at --rollout_precision and scored by the built-in verifier
    // (none without --eval_task_data).
    MetricRow task_eval() {
        if (task_eval_.empty()) return MetricRow();
        engine_.enter_phase(Engine::Phase::Rollout);
        auto text = [&](const std::vector<int32_t>& ids, bool skip_special) {
            return tok_->decode(std::vector<int>(ids.begin(), ids.end()), skip_special);
        };
        MetricRow m = evaluate_sets(
            engine_, dist_, task_eval_, cfg_.eval, cfg_.rollout_precision, cfg_.kv_cache, step_, tok_->vocab_size(),
            [&](const Example& ex) { return encode_example_prompt(*tok_, ex, model_dir_, cfg_.enable_thinking, chat_); }, text,
            builtin_eval_scorer(text), nullptr);
        engine_.enter_phase(Engine::Phase::Update);
        return m;
    }
    void print_task_eval(Logger& log, const MetricRow& m) const {
        for (const EvalSet& set : task_eval_) log.print(eval_set_line(set.name, m, cfg_.eval.k, cfg_.eval.greedy));
    }
    int64_t step_ = 0, cursor_ = 0, bad_steps_ = 0, consecutive_bad_ = 0;

    void note_bad_step(bool bad) {
        if (!bad) {
            consecutive_bad_ = 0;
            return;
        }
        bad_steps_++;
        if (++consecutive_bad_ >= cfg_.max_bad_steps)
            fail("step %lld: NaN/Inf in the loss or gradients for %d steps in a row; stopping (the last checkpoint in %s is intact); "
                 "lower --lr or check the data",
                 (long long)step_ + 1, (int)consecutive_bad_, cfg_.out_dir.c_str());
    }

    void save(Logger& log) {
        TrainerState s;
        s.step = step_;
        s.data_cursor = cursor_;
        s.bad_steps = bad_steps_;
        engine_.save_state(s);
        save_run_checkpoint(cfg_, dist_, engine_, s, log);
    }
};

}  // namespace fp8rl
