// --mismatch_report (rl/driver/mismatch_report.h): the teacher-forced decode path reproduces the
// rollout's log-probs bit for bit on the CPU engine; with everything in BF16 the decode-path term is
// the whole of rollout_corr/k3_kl; the report changes nothing else in a run; 2 ranks equal 1.
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/engine_cpu.h"
#include "rl/io/json.h"
#include "test/harness.h"
#include "test/run_binary.h"
#include "test/training_run.h"

using namespace fp8rl;

namespace {

// Bits of two log-prob lists: the count of values that differ (a length mismatch counts them all).
long differing_bits(const TokenValues& a, const TokenValues& b) {
    long n = 0;
    if (a.size() != b.size()) return 1 << 30;
    for (size_t s = 0; s < a.size(); s++) {
        if (a[s].size() != b[s].size()) {
            n += (long)std::max(a[s].size(), b[s].size());
            continue;
        }
        for (size_t t = 0; t < a[s].size(); t++) n += memcmp(&a[s][t], &b[s][t], sizeof(float)) != 0;
    }
    return n;
}

// A tiny RL run of 2-digit addition with the report's flags on top.
std::string mismatch_run(const std::string& out_dir, int steps, const std::string& flags) {
    return strfmt(" --init tiny --task add --task_size 2 --max_new_tokens 6 --group_size 4 --batch_prompts 8 --lr 3e-3"
                  " --steps %d --eval_every 0 --seed 7 --threads 1 --out_dir %s ",
                  steps, out_dir.c_str()) + flags;
}

// Two runs' logs agree bit for bit (%.9g) on every metric but wall-clock ones and mismatch/*.
void check_same_run_but_the_report(const std::string& a, const std::string& b) {
    std::vector<Json> x = log_rows(a), y = log_rows(b);
    CHECK_EQ(x.size(), y.size());
    int compared = 0;
    for (size_t i = 0; i < std::min(x.size(), y.size()); i++) {
        for (const auto& kv : x[i].fields) {
            if (wall_clock_metric(kv.first) || kv.second.is_null()) continue;
            const Json* other = y[i].find(kv.first);
            CHECK_MSG(other && other->number == kv.second.number, "step %zu %s: %.9g without the report, %.9g with", i + 1,
                      kv.first.c_str(), kv.second.number, other ? other->number : NAN);
            compared++;
        }
        for (const auto& kv : y[i].fields)
            if (!wall_clock_metric(kv.first) && kv.first.rfind("mismatch/", 0) != 0)
                CHECK_MSG(x[i].find(kv.first), "step %zu: %s only with the report", i + 1, kv.first.c_str());
    }
    CHECK(compared >= 20 * (int)x.size());
}

}  // namespace

// The CPU engine's teacher-forced decode (Engine::decode_logprobs) at the numerics a generate() ran
// with (its weights and KV cache precisions, its FP8 KV scales) gives that generate()'s log-probs bit
// for bit, at temperature 0.8, top-p 0.9 and a vocabulary limit below the model's (the distribution's
// normalization), and leaves last_kv_scales() as the generate() left them. Switching one source
// changes some log-probs (the test could fail); the prefill path at BF16 with a BF16 cache is the
// trainer's logprobs() pass bit for bit.
TEST(mismatch_report_decode_logprobs_reproduce_the_rollout) {
    CpuEngine cpu("test/fixtures/models/qwen3_gqa3_tiny");
    const int V = (int)cpu.config().vocab_size;
    std::vector<GenRequest> requests;
    for (int i = 0; i < 6; i++) {
        std::vector<int32_t> prompt;
        for (int k = 0; k < 2 + (i * 5) % 9; k++) prompt.push_back((int32_t)((i * 131 + k * 37 + 11) % (V - 8)));
        requests.push_back({prompt, (uint32_t)(40 + i)});
    }
    SamplingConfig s;
    s.temperature = 0.8f;
    s.top_p = 0.9f;
    s.max_new_tokens = 7;
    s.seed = 9;
    s.vocab_limit = V - 5;
    struct Config {
        Precision weights, kv;
    } configs[] = {{Precision::FP8, Precision::FP8}, {Precision::BF16, Precision::FP8}, {Precision::FP8, Precision::BF16},
                   {Precision::BF16, Precision::BF16}};
    for (const Config& c : configs) {
        const std::vector<Generation> gen = cpu.generate(requests, 4, s, c.weights, c.kv, nullptr);
        std::vector<Sequence> seqs;
        TokenValues rollout_lp;
        for (size_t i = 0; i < gen.size(); i++) {
            Sequence q{requests[i].prompt, (int32_t)requests[i].prompt.size()};
            q.ids.insert(q.ids.end(), gen[i].tokens.begin(), gen[i].tokens.end());
            seqs.push_back(q);
            rollout_lp.push_back(gen[i].logprobs);
        }
        RolloutNumerics own{c.weights, c.kv, {}, {}};
        cpu.last_kv_scales(&own.k_scale, &own.v_scale);
        CHECK_EQ(own.k_scale.empty(), c.kv != Precision::FP8);
        const TokenValues replay = cpu.decode_logprobs(seqs, s, own);
        const long differ = differing_bits(replay, rollout_lp);
        CHECK_MSG(differ == 0, "%s/%s: %ld teacher-forced log-probs differ from the rollout's", precision_name(c.weights),
                  precision_name(c.kv), differ);
        // one source switched: weights to BF16 where FP8, else the cache to FP8 at the scales 0.02
        RolloutNumerics other = own;
        if (c.weights == Precision::FP8) {
            other.weights = Precision::BF16;
        } else if (c.kv == Precision::FP8) {
            other.kv_cache = Precision::BF16, other.k_scale.clear(), other.v_scale.clear();
        } else {
            other.kv_cache = Precision::FP8;
            other.k_scale = other.v_scale = std::vector<float>((size_t)cpu.config().num_layers, 0.02f);
        }
        CHECK(differing_bits(cpu.decode_logprobs(seqs, s, other), rollout_lp) > 0);
        std::vector<float> k, v;
        cpu.last_kv_scales(&k, &v);
        CHECK_MSG(k == own.k_scale && v == own.v_scale, "%s/%s: decode_logprobs changed the last rollout's KV scales",
                  precision_name(c.weights), precision_name(c.kv));
        if (c.weights == Precision::BF16 && c.kv == Precision::BF16) {
            TokenValues trainer;
            cpu.logprobs(seqs, Precision::BF16, s.temperature, &trainer, nullptr);
            CHECK_EQ(differing_bits(cpu.prefill_logprobs(seqs, s.temperature, own), trainer), 0L);
            CHECK(differing_bits(cpu.prefill_logprobs(seqs, s.temperature, other), trainer) > 0);  // through E4M3
        }
    }
}

// Everything in BF16 (rollout, KV cache, training): the FP8 sources are not there (their terms 0),
// the prefill path is the trainer's own forward (its k3 against the old log-probs 0), so the decode
// path's term is all of rollout_corr/k3_kl and logprob_abs_diff, exactly. At steps 0 and 2 of 3
// (--mismatch_report 2), not 1. Against the same run without the report, every other metric is the
// same bit for bit (the report's passes change neither the rollout nor the training; not under the
// sanitizer, where each run of the binary is slow).
TEST(trainer_mismatch_report_bf16_leaves_the_decode_path) {
    const std::string d = temp_dir("mismatch_bf16");
    const std::string flags = "--rollout_precision bf16 --train_precision bf16 --kv_cache bf16";
    harness::RunResult with = run_cmd(harness::binary() + mismatch_run(d + "/with", 3, flags + " --mismatch_report 2"));
    harness::RunResult without = harness::sanitized ? with : run_cmd(harness::binary() + mismatch_run(d + "/without", 3, flags));
    CHECK_MSG(with.status == 0 && without.status == 0, "%s\n%s", with.output.c_str(), without.output.c_str());
    if (with.status || without.status) return;
    const std::vector<Json> rows = log_rows(d + "/with");
    CHECK_EQ(rows.size(), (size_t)3);
    for (size_t i = 0; i < rows.size(); i++) {
        const Json& r = rows[i];
        CHECK_EQ((bool)r.find("mismatch/decode_path/k3_kl"), i != 1);
        if (i == 1) continue;
        const double k3 = r.find("rollout_corr/k3_kl")->number, abs_diff = r.find("rollout_corr/logprob_abs_diff")->number;
        printf("    step %zu: rollout_corr/k3_kl %.4g, mismatch/decode_path/k3_kl %.4g\n", i, k3,
               r.find("mismatch/decode_path/k3_kl")->number);
        CHECK(k3 > 0);
        CHECK_EQ(r.find("mismatch/decode_path/k3_kl")->number, k3);
        CHECK_EQ(r.find("mismatch/decode_path/abs_diff")->number, abs_diff);
        for (const char* key : {"mismatch/fp8_weights/k3_kl", "mismatch/fp8_weights/abs_diff", "mismatch/fp8_kv_cache/k3_kl",
                                "mismatch/fp8_kv_cache/abs_diff"})
            CHECK_EQ(r.find(key)->number, 0.0);
    }
    if (!harness::sanitized) check_same_run_but_the_report(d + "/without", d + "/with");
}

// FP8 weights and an FP8 KV cache in the rollout, BF16 training: each FP8 source, switched to BF16,
// brings the rollout closer to the trainer (measured on this run: k3_kl 4.65e-5 in all, 3.75e-5
// from the weights, 1.39e-5 from the cache, -1.1e-6 from the decode path), and the run is otherwise
// the one without the report bit for bit. Then 2 ranks against 1 under mpirun, one step, as
// trainer_mpi_two_ranks_match_one_fp8_kv_cache compares them (the mismatch/ metrics included): the
// same log-probs, their sums grouped by rank. Under the sanitizer without the run lacking the report.
TEST(trainer_mismatch_report_fp8_sources_and_two_ranks) {
    const std::string d = temp_dir("mismatch_fp8");
    const std::string flags = "--rollout_precision fp8 --train_precision bf16 --kv_cache fp8 --entropy_coef 0.01";
    harness::RunResult with = run_cmd(harness::binary() + mismatch_run(d + "/with", 1, flags + " --mismatch_report 1"));
    harness::RunResult without = harness::sanitized ? with : run_cmd(harness::binary() + mismatch_run(d + "/without", 1, flags));
    CHECK_MSG(with.status == 0 && without.status == 0, "%s\n%s", with.output.c_str(), without.output.c_str());
    if (with.status || without.status) return;
    const Json r = log_rows(d + "/with")[0];
    const double weights = r.find("mismatch/fp8_weights/k3_kl")->number, kv = r.find("mismatch/fp8_kv_cache/k3_kl")->number;
    printf("    k3_kl %.3g: fp8_weights %.3g, fp8_kv_cache %.3g, decode_path %.3g\n", r.find("rollout_corr/k3_kl")->number, weights, kv,
           r.find("mismatch/decode_path/k3_kl")->number);
    CHECK(weights > 0 && kv > 0);
    if (!harness::sanitized) check_same_run_but_the_report(d + "/without", d + "/with");

    if (std::system("command -v mpirun > /dev/null 2>&1") != 0) SKIP("mpirun not found (install openmpi-bin)");
    const std::string mpirun = "ASAN_OPTIONS=detect_leaks=0 OMPI_MCA_btl=self,vader mpirun --allow-run-as-root --oversubscribe -np ";
    harness::RunResult one = run_cmd(mpirun + "1 " + harness::binary() + mismatch_run(d + "/r1", 1, flags + " --mismatch_report 1"));
    harness::RunResult two = run_cmd(mpirun + "2 " + harness::binary() + mismatch_run(d + "/r2", 1, flags + " --mismatch_report 1"));
    CHECK_MSG(one.status == 0 && two.status == 0, "%s\n%s", one.output.c_str(), two.output.c_str());
    if (one.status || two.status) return;
    if (two.output.find("2 rank(s)") == std::string::npos) SKIP("train_rl_cpu was built without MPI (no mpicxx: install libopenmpi-dev, then rebuild)");
    check_runs_agree(d + "/r1", d + "/r2", 1e-3, 1e-6, 1e-4);
    const Json a = log_rows(d + "/r1")[0], b = log_rows(d + "/r2")[0];
    for (const char* source : {"fp8_weights", "fp8_kv_cache", "decode_path"})
        for (const char* metric : {"k3_kl", "abs_diff"}) {  // tighter: sums of the same terms, grouped by rank
            const std::string key = strfmt("mismatch/%s/%s", source, metric);
            const Json *p = a.find(key), *q = b.find(key);
            CHECK_MSG(p && q && harness::close(p->number, q->number, 1e-9, 0.0), "%s: %.12g (1 rank) vs %.12g (2 ranks)", key.c_str(),
                      p ? p->number : NAN, q ? q->number : NAN);
        }
}
