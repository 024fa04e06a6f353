// Tests of multi-turn environments (--env_cmd, rl/driver/multi_turn.h) through the binary
// ($FP8RL_BIN), with environments in awk that the tests write (no Python): a two-turn trajectory's
// sampled log-probs equal the training forward over the whole sequence; observation tokens carry
// loss mask 0 and no loss, ratio, entropy or IS weight; every failure of the environment ends the
// run with one line and exit 1 within the timeout + 10 s; 2 ranks equal 1; the eval runs the
// environment; the emulated GPU engine equals the CPU engine; the kept KV cache's turns are teacher
// forcing through the decode path bit for bit, and FP8 keeps turn 1's scales. Also: the observation's rendering equals the chat template's, the
// example environment (dev/envs/calculator) computes its expressions, SFT takes tool turns, and
// dynamic sampling with no kept group trains nothing instead of failing.
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "cpu/engine_cpu.h"
#include "rl/driver/lm_data.h"
#include "rl/driver/memory_fit.h"
#include "rl/io/checkpoint.h"
#include "rl/io/json.h"
#include "rl/objective/loss_agg.h"
#include "rl/text/chat.h"
#include "test/harness.h"
#include "test/kept_turns.h"
#include "test/run_binary.h"
#include "test/temp_dir.h"
#include "test/training_run.h"

using namespace fp8rl;

namespace {

// A test environment: turn 1 gets the observation "73" (tool), turn 2 ends with a reward that is a
// function of the request (its length), so groups differ and the update has a gradient.
const char* kTwoTurnEnv =
    "match($0, /^\\{\"id\":-?[0-9]+/) { id = substr($0, 7, RLENGTH - 6) }\n"
    "match($0, /\"turn\":[0-9]+/) { turn = substr($0, RSTART + 7, RLENGTH - 7) }\n"
    "{ if (turn == 1) printf \"{\\\"id\\\":%s,\\\"observation\\\":\\\"73\\\",\\\"done\\\":false}\\n\", id;\n"
    "  else printf \"{\\\"id\\\":%s,\\\"observation\\\":null,\\\"done\\\":true,\\\"reward\\\":%g}\\n\", id, (length($0) % 5) / 4;\n"
    "  fflush() }\n";

// Writes the awk program into dir as env.awk and returns the --env_cmd that runs it line by line.
std::string env_cmd(const harness::TempDir& t, const std::string& awk) {
    harness::write_text(t / "env.awk", awk);
    harness::write_text(t / "env.sh", "awk -W version 2>/dev/null | grep -q mawk && i='-W interactive'\nLC_ALL=C exec awk $i -f " +
                                          t / "env.awk" + "\n");
    return "sh " + t / "env.sh";
}

// The add task at one digit: 3-token turns, two turns, 4 prompts x 4 samples.
std::string env_run(const std::string& out_dir, int steps, const std::string& cmd, const char* precision = "bf16",
                    const char* kv_cache = nullptr) {
    return strfmt(" --init tiny --task add --task_size 1 --max_new_tokens 3 --max_turns 2 --max_total_tokens 10 --group_size 4"
                  " --batch_prompts 4 --lr 3e-3 --steps %d --eval_every 0 --seed 7 --threads 1 --rollout_precision %s"
                  " --train_precision %s --kv_cache %s --out_dir %s --env_cmd \"%s\"",
                  steps, precision, precision, kv_cache ? kv_cache : precision, out_dir.c_str(), cmd.c_str());
}

std::vector<Json> dump_lines(const std::string& file) {
    std::vector<Json> out;
    const std::string text = read_file(file);
    for (size_t pos = 0, nl; pos < text.size(); pos = nl + 1) {
        nl = text.find('\n', pos);
        out.push_back(json_parse(text.substr(pos, nl - pos), file));
    }
    return out;
}

}  // namespace

// The tokens appended after a turn are what the chat template renders for the conversation with the
// observation, less what it renders without it: the prompt (with the generation prompt), then the
// model's turn through its end-of-turn token, then ChatTemplate::continuation.
TEST(env_observation_rendering_is_the_chat_templates) {
    struct Case {
        const char* dir;
        const char* eot;
        std::vector<const char*> roles;
    } cases[] = {{"qwen2.5", "<|im_end|>", {"tool", "user"}}, {"qwen3", "<|im_end|>", {"tool", "user"}}, {"llama3_style", "<|eot_id|>", {"user"}}};
    for (const Case& c : cases) {
        ChatTemplate chat = ChatTemplate::load(std::string("test/fixtures/tokenizer/") + c.dir);
        ChatOptions opt;
        for (const char* role : c.roles) {
            std::vector<ChatMessage> m = {{"system", "Use the tool.", "", false}, {"user", "What is 12*7?", "", false}};
            const std::string prompt = chat.render(m, opt);
            m.push_back({"assistant", "12*7", "", false});
            m.push_back({role, "84", "", false});
            const std::string want = chat.render(m, opt);
            const std::string got = prompt + "12*7" + c.eot + chat.continuation(role, "84", true, opt);
            CHECK_MSG(got == want, "%s, role %s:\n%s\n---\n%s", c.dir, role, got.c_str(), want.c_str());
            // a turn cut at its budget is closed by the continuation
            CHECK_EQ(prompt + "12*7" + chat.continuation(role, "84", false, opt), want);
        }
    }
    ChatTemplate llama = ChatTemplate::load("test/fixtures/tokenizer/llama3_style");
    CHECK_THROWS(llama.continuation("tool", "84", true, ChatOptions()), "reply with \"role\": \"user\"");
}

// dev/envs/calculator answers an expression with its value (products before sums, left to right),
// ends with reward 1 on the answer and reward 0 on anything else.
TEST(env_calculator_answers_expressions) {
    harness::TempDir t;
    auto req = [](int id, const std::string& turn_text) {
        return "{\"id\":" + std::to_string(id) + ",\"turn\":1,\"messages\":[{\"role\":\"user\",\"content\":\"12*7=\"},{\"role\":\"assistant\",\"content\":" +
               json_quote(turn_text) + "}],\"truncated\":false,\"answer\":\"84\",\"data\":{}}\n";
    };
    harness::write_text(t / "requests.jsonl", req(1, "12*7") + req(2, "2+3*4-5") + req(3, "7-10") + req(4, " 84\n") + req(5, "the answer") +
                                                  req(6, "3*4*5+1"));
    harness::RunResult r = run_cmd("sh dev/envs/calculator.sh < " + t / "requests.jsonl");
    CHECK_MSG(r.status == 0, "%s", r.output.c_str());
    const char* want[] = {
        "{\"id\":1,\"observation\":\"84\",\"role\":\"tool\",\"done\":false}", "{\"id\":2,\"observation\":\"9\",\"role\":\"tool\",\"done\":false}",
        "{\"id\":3,\"observation\":\"-3\",\"role\":\"tool\",\"done\":false}", "{\"id\":4,\"observation\":null,\"done\":true,\"reward\":1}",
        "{\"id\":5,\"observation\":null,\"done\":true,\"reward\":0}", "{\"id\":6,\"observation\":\"61\",\"role\":\"tool\",\"done\":false}"};
    std::string expected;
    for (const char* w : want) expected += std::string(w) + "\n";
    CHECK_EQ(r.output, expected);
}

// A two-turn trajectory, in fp32 (cache too): every token the model sampled has the log-prob the
// training forward over the concatenated sequence (prompt, turn 1, observation, turn 2) gives it, to
// the bounds of generate_decode_matches_full_forward; the observation's tokens are the environment's
// "73" with loss mask 0 and no entropy, ratio or IS weight; the environment's reward is the sample's.
TEST(env_two_turn_logprobs_equal_one_forward) {
    harness::TempDir t;
    std::string d = temp_dir("env_two_turn");
    harness::RunResult r = run_cmd(harness::binary() + env_run(d, 1, env_cmd(t, kTwoTurnEnv), "fp32") + " --dump_rollouts 1");
    CHECK_MSG(r.status == 0, "%s", r.output.c_str());
    if (r.status) return;
    std::vector<Json> lines = dump_lines(d + "/rollouts/step_0.jsonl");
    CHECK_EQ(lines.size(), (size_t)16);
    int two_turn = 0, compared = 0;
    for (const Json& s : lines) {
        const auto& mask = s.find("loss_mask")->items;
        const auto& ids = s.find("ids")->items;
        CHECK_EQ(mask.size(), ids.size());
        size_t obs = 0;
        for (size_t k = 0; k < mask.size(); k++) {
            const bool model = mask[k].integer == 1;
            const Json &rl = s.find("rollout_lp")->items[k], &old = s.find("old_lp")->items[k];
            if (!model) {
                obs++;
                CHECK(rl.is_null() && s.find("entropy")->items[k].is_null() && s.find("ratio")->items[k].is_null());
                CHECK_EQ(s.find("is_weight")->items[k].number, 0.0);
                continue;
            }
            CHECK_NEAR(rl.number, old.number, 1e-5, 2e-6);
            compared++;
        }
        if (obs) {
            two_turn++;
            CHECK(s.find("response")->str.find("73") != std::string::npos);
        }
        CHECK(obs == 0 || obs == 2);  // a plain prompt's observation is its text alone: "7", "3"
        CHECK(s.find("reward")->is_number());
    }
    CHECK_MSG(two_turn >= 8, "%d of 16 trajectories had two turns", two_turn);
    CHECK(compared >= 40);
    Json row = log_rows(d)[0];
    CHECK_NEAR(row.find("env/turns")->number, 1.0 + two_turn / 16.0, 0, 1e-12);
    CHECK_NEAR(row.find("env/observation_tokens")->number, 2.0 * two_turn / 16.0, 0, 1e-12);
    CHECK_EQ(row.find("env/truncated")->number, 0.0);
}

// The kept KV cache (Engine::start_turns, next_turns) on the CPU engine, 6 requests (two pairs of
// siblings) over three turns at temperature 0.8, top-p 0.9: every drawn token's log-prob is, bit for
// bit, teacher forcing through the decode path (decode_logprobs) of the whole trajectory at the
// scales turn 1 calibrated, an independent path (one generate() feeding every token after the prompt
// through decode steps); every drawn token lies inside the draw its (seed, step, key, absolute
// position) makes (teacher_forced's sample offset <= 0); turn 1 is generate() bit for bit; a next
// turn feeds only each row's last token and observation (turn_fed_tokens); an FP8 cache keeps turn
// 1's scales to the end. Another cache's scales change the log-probs (the check could fail).
TEST(env_kept_cache_turns_equal_decode_path_teacher_forcing) {
    CpuEngine cpu("test/fixtures/models/qwen3_gqa3_tiny");
    const int V = (int)cpu.config().vocab_size;
    std::vector<GenRequest> requests;
    for (int i = 0; i < 6; i++) {
        std::vector<int32_t> prompt;
        // 5, 41 and 59 tokens: decode rows' prompt prefixes (decode_prefix_keys) of 0 and 32 keys, past 64 keys
        for (int k = 0; k < (i < 2 ? 5 : 23 + 18 * (i / 2)); k++) prompt.push_back((int32_t)((i / 2 * 131 + k * 37 + 11) % (V - 8)));
        requests.push_back({prompt, (uint32_t)(40 + i)});
    }
    SamplingConfig s;
    s.temperature = 0.8f, s.top_p = 0.9f, s.max_new_tokens = 4, s.seed = 9, s.vocab_limit = V - 5;
    auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
        return a.size() == b.size() && (a.empty() || memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    };
    for (Precision kv : {Precision::BF16, Precision::FP8}) {
        const Precision w = kv;
        const kept_turns::Run r = kept_turns::run(cpu, requests, 3, s, w, kv, 5, 16);
        const std::vector<Generation> single = cpu.generate(requests, 3, s, w, kv, nullptr);
        for (size_t i = 0; i < requests.size(); i++)
            CHECK_MSG(single[i].tokens == r.turns[0][i].tokens && same_bits(single[i].logprobs, r.turns[0][i].logprobs),
                      "%s: request %zu's first turn differs from generate()'s", precision_name(kv), i);
        CHECK_EQ(r.fed[0], kept_turns::expected_fed(r, 1));
        CHECK_EQ(r.fed[1], kept_turns::expected_fed(r, 2));
        CHECK_EQ(r.rows[1].size(), (size_t)5);
        CHECK(r.rows[2].size() >= 2);
        CHECK_EQ(r.k_scale.empty(), kv != Precision::FP8);
        CHECK_MSG(r.k_scale_end == r.k_scale && r.v_scale_end == r.v_scale, "%s: the scales changed between turns", precision_name(kv));
        std::vector<Sequence> seqs;
        std::vector<std::vector<int32_t>> responses;
        for (size_t i = 0; i < requests.size(); i++) {
            seqs.push_back({r.sequences[i], (int32_t)requests[i].prompt.size()});
            responses.emplace_back(r.sequences[i].begin() + (long)requests[i].prompt.size(), r.sequences[i].end());
        }
        RolloutNumerics at{w, kv, r.k_scale, r.v_scale};
        const TokenValues forced = cpu.decode_logprobs(seqs, s, at);
        const std::vector<Generation> offsets = cpu.teacher_forced(requests, responses, 3, s, w, kv);
        long compared = 0, differ = 0, outside = 0;
        for (size_t i = 0; i < requests.size(); i++)
            for (size_t k = 0, d = 0; k < r.model[i].size(); k++) {
                if (!r.model[i][k]) continue;
                differ += memcmp(&forced[i][k], &r.logprobs[i][d++], sizeof(float)) != 0;
                outside += offsets[i].sample_offsets[k] > 0;
                compared++;
            }
        printf("    %s: %ld drawn tokens over %zu + %zu + %zu rows, %lld + %lld tokens fed into kept caches\n", precision_name(kv),
               compared, r.rows[0].size(), r.rows[1].size(), r.rows[2].size(), (long long)r.fed[0], (long long)r.fed[1]);
        CHECK_MSG(differ == 0, "%s: %ld of %ld log-probs differ from teacher forcing through the decode path", precision_name(kv),
                  differ, compared);
        CHECK_EQ(outside, 0L);
        CHECK(compared >= 40);
        if (kv == Precision::FP8) {  // turn 1's scales, halved: other log-probs
            for (float& x : at.k_scale) x *= 0.5f;
            const TokenValues other = cpu.decode_logprobs(seqs, s, at);
            long moved = 0;
            for (size_t i = 0; i < requests.size(); i++)
                for (size_t k = 0; k < other[i].size(); k++) moved += r.model[i][k] && other[i][k] != forced[i][k];
            CHECK(moved > 0);
        }
    }
    CHECK_THROWS(cpu.next_turns({{0, {}, 1}}), "kept");  // after end_turns nothing is kept
}

// --max_total_tokens ends a conversation the environment never ends (docs/rewards-and-tasks.md): an
// environment that answers every turn with "7" (one token of a plain prompt) and reward turn / 8,
// --max_turns 10, --max_total_tokens 9, 3-token turns. Every trajectory holds at most 9 response
// tokens and ends on a model turn (no observation without a turn after it); a trajectory of full
// turns (3 + 1 + 3 + 1) gets a third turn of the 1 token the total leaves; each is truncated and has
// its last reply's reward.
TEST(env_max_total_tokens_ends_the_conversation) {
    harness::TempDir t;
    std::string d = temp_dir("env_max_total");
    const char* awk = "match($0, /^\\{\"id\":-?[0-9]+/) { id = substr($0, 7, RLENGTH - 6) }\n"
                      "match($0, /\"turn\":[0-9]+/) { turn = substr($0, RSTART + 7, RLENGTH - 7) }\n"
                      "{ printf \"{\\\"id\\\":%s,\\\"observation\\\":\\\"7\\\",\\\"done\\\":false,\\\"reward\\\":%g}\\n\", id, turn / 8;"
                      " fflush() }\n";
    std::string flags = env_run(d, 1, env_cmd(t, awk));
    const std::string budgets = "--max_turns 2 --max_total_tokens 10";
    flags.replace(flags.find(budgets), budgets.size(), "--max_turns 10 --max_total_tokens 9");
    harness::RunResult r = run_cmd(harness::binary() + flags + " --dump_rollouts 1");
    CHECK_MSG(r.status == 0, "%s", r.output.c_str());
    if (r.status) return;
    int longest = 0;
    for (const Json& s : dump_lines(d + "/rollouts/step_0.jsonl")) {
        const auto& mask = s.find("loss_mask")->items;
        CHECK(!mask.empty() && mask.size() <= 9);
        CHECK_EQ(mask.back().integer, 1);
        int turns = 0;
        for (size_t k = 0; k < mask.size(); k++) turns += mask[k].integer == 1 && (k == 0 || mask[k - 1].integer == 0);
        CHECK_EQ(s.find("reward")->number, turns / 8.0);
        longest = std::max(longest, (int)mask.size());
    }
    CHECK_EQ(longest, 9);
    CHECK_EQ(log_rows(d)[0].find("env/truncated")->number, 1.0);
}

// Observation tokens get no gradient: with the loss mask, every aggregation's d(loss)/d(logprob)
// and d(loss)/d(entropy) are 0 at masked tokens, and the model's tokens get what they would get
// if the masked ones were not in the sequence at all (token-mean over the global count of trained
// tokens; seq-mean-token-mean over each sequence's own), KL and entropy terms included.
TEST(env_no_gradient_reaches_observation_tokens) {
    const int T = 7;
    const float logp[T] = {-1.1f, -0.4f, -2.3f, -0.9f, -1.7f, -0.2f, -3.0f};
    const float old_logp[T] = {-1.0f, -0.5f, -2.0f, -1.2f, -1.6f, -0.3f, -2.5f};
    const float ref_logp[T] = {-1.3f, -0.6f, -2.2f, -1.0f, -1.5f, -0.25f, -2.8f};
    const float ent[T] = {1.0f, 2.0f, 0.5f, 1.5f, 0.7f, 0.3f, 2.2f};
    const float adv[T] = {0.7f, 0.7f, 0.7f, 0.7f, 0.7f, 0.7f, 0.7f};
    const double w[T] = {1, 1, 1, 1, 1, 1, 1};
    const uint8_t mask[T] = {1, 1, 0, 0, 1, 0, 1};
    std::vector<int> kept;
    for (int k = 0; k < T; k++)
        if (mask[k]) kept.push_back(k);
    const int n = (int)kept.size();
    std::vector<float> lp2, old2, ref2, ent2, adv2;
    std::vector<double> w2;
    for (int k : kept) {
        lp2.push_back(logp[k]), old2.push_back(old_logp[k]), ref2.push_back(ref_logp[k]), ent2.push_back(ent[k]), adv2.push_back(adv[k]);
        w2.push_back(w[k]);
    }
    const std::vector<uint8_t> ones((size_t)n, 1);
    TokenLossConfig cfg;
    cfg.kl_coef = 0.1;
    cfg.entropy_coef = 0.01;
    for (LossAgg agg : {LossAgg::TokenMean, LossAgg::TokenSum, LossAgg::SeqMeanTokenMean, LossAgg::SeqMeanTokenSum, LossAgg::SeqMeanTokenSumNorm}) {
        const AggCounts global{(int64_t)n + 5, 2};  // this sequence's trained tokens and another sequence's
        SequenceTokens s{T, logp, old_logp, ref_logp, adv, w, ent, mask};
        SequenceTokens x{n, lp2.data(), old2.data(), ref2.data(), adv2.data(), w2.data(), ent2.data(), ones.data()};
        float d_lp[T], d_ent[T], e_lp[T], e_ent[T];
        SequenceLoss a = sequence_loss(s, cfg, agg, global, 16.0, d_lp, d_ent);
        SequenceLoss b = sequence_loss(x, cfg, agg, global, 16.0, e_lp, e_ent);
        CHECK_EQ(a.loss, b.loss);
        for (int k = 0, j = 0; k < T; k++) {
            if (!mask[k]) {
                CHECK_EQ(d_lp[k], 0.0f);
                CHECK_EQ(d_ent[k], 0.0f);
                continue;
            }
            CHECK(d_lp[k] != 0.0f);
            CHECK_EQ(d_lp[k], e_lp[j]);
            CHECK_EQ(d_ent[k], e_ent[j]);
            j++;
        }
    }
}

// Each failure of an environment worker: exit 1 with one error line naming the worker, the request
// id and the step, within --env_timeout + 10 s.
TEST(env_failures_end_the_run_with_one_line) {
    std::string d = temp_dir("env_fail");
    struct Case {
        std::string cmd, flags, message;
    } cases[] = {
        {"echo environment gave up >&2; exit 3", "", "exited with status 3"},
        {"while read l; do echo not json; done", "", "the reply is not JSON"},
        {"while read l; do echo '{\\\"id\\\": 0, \\\"observation\\\": \\\"1\\\"}'; done", "", "no boolean \"done\""},
        {"while read l; do echo '{\\\"id\\\": 0, \\\"done\\\": false}'; done", "", "needs an \"observation\""},
        {"echo waiting >&2; sleep 100", " --env_timeout 1", "no reply within --env_timeout 1 s"},
    };
    for (const Case& c : cases) {
        const auto t0 = std::chrono::steady_clock::now();
        harness::RunResult r = run_cmd(harness::binary() + env_run(d + "/run", 1, c.cmd) + " --env_workers 1" + c.flags);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        check_worker_failure(r, seconds, c.cmd, {c.message, "environment worker 1 of 1", "step 1: ", "last checkpoint"});
    }
    // an observation the task's tokenizer cannot hold (encode() would drop it: the model would never see it)
    harness::TempDir t;
    const std::string hello = "match($0, /^\\{\"id\":-?[0-9]+/) { printf \"{\\\"id\\\":%s,\\\"observation\\\":\\\"hello\\\",\\\"done\\\":false}\\n\", "
                              "substr($0, 7, RLENGTH - 6); fflush() }\n";
    harness::RunResult r = run_cmd(harness::binary() + env_run(d + "/run", 1, env_cmd(t, hello)));
    CHECK_MSG(r.status == 1 && r.output.find("holds byte 0x68") != std::string::npos && r.output.find("step 1: ") != std::string::npos,
              "exit %d: %s", r.status, r.output.c_str());
    // flags of the environment without it, and what it cannot run with
    struct Refused {
        std::string flags, message;
    } refused[] = {
        {" --max_turns 3", "--max_turns applies to --env_cmd"},
        {" --env_cmd cat --mode sft --data x.jsonl", "--mode sft generates nothing"},
    };
    for (const Refused& c : refused) {
        harness::RunResult r = run_cmd(harness::binary() + " --init tiny --task add --steps 1 --out_dir " + d + "/refused" + c.flags);
        CHECK_MSG(r.status == 1 && r.output.find(c.message) != std::string::npos, "%s: exit %d: %s", c.flags.c_str(), r.status, r.output.c_str());
    }
}

// 2 ranks with an environment give the 1-rank run (each rank's requests stay on it), with a BF16
// and with an FP8 KV cache (whose scales the ranks agree on once per rollout: turn 1's, kept).
TEST(env_mpi_two_ranks_match_one) {
    if (std::system("command -v mpirun > /dev/null 2>&1") != 0) SKIP("mpirun not found (install openmpi-bin)");
    harness::TempDir t;
    const std::string cmd = env_cmd(t, kTwoTurnEnv);
    std::string mpirun = "ASAN_OPTIONS=detect_leaks=0 OMPI_MCA_btl=self,vader mpirun --allow-run-as-root --oversubscribe -np ";
    for (const char* kv : {"bf16", "fp8"}) {
        std::string d = temp_dir(std::string("env_mpi_") + kv);
        harness::RunResult one = run_cmd(mpirun + "1 " + harness::binary() + env_run(d + "/r1", 2, cmd, "bf16", kv));
        harness::RunResult two = run_cmd(mpirun + "2 " + harness::binary() + env_run(d + "/r2", 2, cmd, "bf16", kv));
        CHECK_MSG(one.status == 0 && two.status == 0, "%s\n%s", one.output.c_str(), two.output.c_str());
        if (one.status || two.status) return;
        if (two.output.find("2 rank(s)") == std::string::npos) SKIP("train_rl_cpu was built without MPI (no mpicxx: install libopenmpi-dev, then rebuild)");
        const Json row = log_rows(d + "/r1")[0];
        CHECK(row.find("env/observation_tokens")->number > 0);
        CHECK_EQ(row.find("fp8/kv_scale_k_max") != nullptr, std::string(kv) == "fp8");
        check_runs_agree(d + "/r1", d + "/r2", 1e-3, 1e-6, 1e-4);
    }
}

// The held-out eval meets the environment too: with an environment that answers turn 1 with "73" and
// ends turn 2 with reward 0.5 (a reward the add task's verifier never gives), every eval generation
// (greedy and sampled) holds the observation and has the environment's reward.
TEST(env_eval_runs_the_environment) {
    harness::TempDir t;
    std::string d = temp_dir("env_eval");
    const std::string awk = "match($0, /^\\{\"id\":-?[0-9]+/) { id = substr($0, 7, RLENGTH - 6) }\n"
                            "match($0, /\"turn\":[0-9]+/) { turn = substr($0, RSTART + 7, RLENGTH - 7) }\n"
                            "{ if (turn == 1) printf \"{\\\"id\\\":%s,\\\"observation\\\":\\\"73\\\",\\\"done\\\":false}\\n\", id;\n"
                            "  else printf \"{\\\"id\\\":%s,\\\"observation\\\":null,\\\"done\\\":true,\\\"reward\\\":0.5}\\n\", id;\n"
                            "  fflush() }\n";
    harness::RunResult r = run_cmd(harness::binary() + env_run(d, 1, env_cmd(t, awk)) + " --eval_only 1 --dump_eval 1 --eval_prompts 4 --eval_k 2");
    CHECK_MSG(r.status == 0, "%s", r.output.c_str());
    if (r.status) return;
    std::vector<Json> lines = dump_lines(d + "/eval_generations.jsonl");
    CHECK_EQ(lines.size(), (size_t)12);  // 4 greedy + 4 x 2 sampled
    for (const Json& l : lines) {
        CHECK_EQ(l.find("reward")->number, 0.5);
        CHECK_MSG(l.find("response")->str.find("73") != std::string::npos, "%s", json_dump(l).c_str());
    }
}

#ifndef FP8RL_SANITIZE
// The emulated GPU engine (./train_rl_emu) runs the same multi-turn step as the CPU engine: the
// rollout (tokens, turns, observations, rewards) is the same, its log-probs bit for bit, and what the trainer computes agrees
// within the BF16 noise train_rl_emu_step_matches_train_rl_cpu allows (1e-2 relative + 1e-3; the
// gradient norm 5e-2; the mismatch metrics 5e-2 absolute).
TEST(env_emu_engine_matches_cpu_engine) {
    if (std::system(("test -x " + harness::emu_binary()).c_str()) != 0) SKIP("./train_rl_emu not built (make train_rl_emu)");
    harness::TempDir t;
    std::string d = temp_dir("env_emu");
    const std::string cmd = env_cmd(t, kTwoTurnEnv);
    harness::RunResult cpu = run_cmd(harness::binary() + env_run(d + "/cpu", 1, cmd) + " --dump_rollouts 1");
    harness::RunResult gpu = run_cmd(harness::emu_binary() + env_run(d + "/gpu", 1, cmd) + " --dump_rollouts 1");
    CHECK_MSG(cpu.status == 0 && gpu.status == 0, "%s\n%s", cpu.output.c_str(), gpu.output.c_str());
    if (cpu.status || gpu.status) return;
    // the rollouts over kept KV caches: the same tokens and log-probs, bit for bit (%.9g round-trips a float)
    const std::vector<Json> cpu_dump = dump_lines(d + "/cpu/rollouts/step_0.jsonl"), gpu_dump = dump_lines(d + "/gpu/rollouts/step_0.jsonl");
    CHECK_EQ(cpu_dump.size(), gpu_dump.size());
    for (size_t i = 0; i < std::min(cpu_dump.size(), gpu_dump.size()); i++)
        for (const char* key : {"ids", "rollout_lp", "loss_mask"})
            CHECK_MSG(json_dump(*cpu_dump[i].find(key)) == json_dump(*gpu_dump[i].find(key)), "trajectory %zu: %s differ", i, key);
    Json c = log_rows(d + "/cpu")[0], g = log_rows(d + "/gpu")[0];
    CHECK(c.find("env/observation_tokens")->number > 0);
    int compared = 0;
    for (const auto& kv : c.fields) {
        const std::string& k = kv.first;
        const Json* other = g.find(k);
        if (wall_clock_metric(k) || !kv.second.is_number() || !other) continue;
        auto starts = [&](const char* p) { return k.rfind(p, 0) == 0; };
        const bool rollout = starts("critic/") || starts("response_length/") || starts("prompt_length/") || starts("env/");
        const double x = kv.second.number, y = other->number;
        if (rollout) CHECK_MSG(x == y, "%s: cpu %.9g gpu %.9g", k.c_str(), x, y);
        else if (starts("rollout_corr/")) CHECK_MSG(std::fabs(x - y) <= 5e-2, "%s: cpu %.9g gpu %.9g", k.c_str(), x, y);
        else if (k == "actor/grad_norm") CHECK_MSG(harness::close(x, y, 5e-2, 0), "%s: cpu %.9g gpu %.9g", k.c_str(), x, y);
        else CHECK_MSG(harness::close(x, y, 1e-2, 1e-3), "%s: cpu %.9g gpu %.9g", k.c_str(), x, y);
        compared++;
    }
    CHECK(compared >= 30);
}
#endif

// --dynamic_sampling 1 with no kept group (a fresh model on 2-digit sums: every reward 0): each such
// step trains nothing, as dynamic sampling trains on the groups it kept, and the run goes on; the
// weights and AdamW state after it are those before it.
TEST(dynamic_sampling_with_no_kept_group_trains_nothing) {
    std::string d = temp_dir("dynamic_sampling_empty");
    harness::RunResult r = run_cmd(harness::binary() + " --init tiny --task add --task_size 2 --max_new_tokens 2 --group_size 2 --batch_prompts 2"
                                   " --steps 2 --save_every 1 --eval_every 0 --seed 7 --threads 1 --dynamic_sampling 1 --max_gen_batches 1"
                                   " --out_dir " + d);
    CHECK_MSG(r.status == 0, "%s", r.output.c_str());
    if (r.status) return;
    for (const Json& row : log_rows(d)) CHECK_EQ(row.find("dynamic_sampling/kept_group_fraction")->number, 0.0);
    TrainerState a = load_trainer_state(d + "/checkpoints/step_000001"), b = load_trainer_state(d + "/checkpoints/step_000002");
    CHECK_EQ(a.optimizer_steps, (int64_t)0);
    CHECK_EQ(b.optimizer_steps, (int64_t)0);
    CHECK(a.master == b.master);
    CHECK_EQ(b.step, (int64_t)2);
}

// SFT takes tool turns and function schemas ("tools"): each conversation of transformers' Qwen3
// renderings (chat_qwen3.jsonl's with tool turns, chat_tools_qwen3.jsonl's with schemas,
// dev/make_chat_tools_fixtures.py) encodes to the ids of its text (less the generation prompt, which
// SFT does not render), and the trained tokens are its assistant turns' text through <|im_end|>.
TEST(sft_accepts_tool_turns) {
    const std::string dir = "test/fixtures/tokenizer/qwen3";
    std::unique_ptr<Tokenizer> tok = Tokenizer::load(dir);
    SftEncoder enc(*tok, dir, 1, 0);
    const std::string gen = "<|im_start|>assistant\n", eot = "<|im_end|>";
    int rows = 0, with_tools = 0;
    for (const char* file : {"test/fixtures/tokenizer/chat_qwen3.jsonl", "test/fixtures/tokenizer/chat_tools_qwen3.jsonl"})
        for_each_jsonl_row(file, [&](const Json& row, const std::string& where) {
            const Json* thinking = row.find("enable_thinking");
            const Json* tools = row.find("tools");
            const bool prompt_end = row.find("add_generation_prompt")->boolean;
            if ((!tools && json_dump(*row.find("messages")).find("\"tool\"") == std::string::npos) || (!tools && !prompt_end) ||
                (thinking && !thinking->is_null() && !thinking->boolean))
                return;
            std::string text = row.find("text")->str;
            if (prompt_end) {
                CHECK(text.size() > gen.size() && text.compare(text.size() - gen.size(), gen.size(), gen) == 0);
                text.resize(text.size() - gen.size());  // SFT renders no generation prompt
            }
            std::string want_trained;
            for (size_t at = 0; (at = text.find(gen, at)) != std::string::npos;) {
                const size_t end = text.find(eot, at) + eot.size();
                want_trained += text.substr(at + gen.size(), end - at - gen.size());
                at = end;
            }
            Json conv;
            conv.type = Json::Object;
            if (tools) conv.fields.emplace_back("tools", *tools);
            conv.fields.emplace_back("messages", *row.find("messages"));
            if (want_trained.empty()) {  // no assistant turn to train on
                CHECK_THROWS(enc.encode(conv, where), "no tokens to train on");
                return;
            }
            LmSequence s = enc.encode(conv, where);
            const std::vector<int> want_ids = tok->encode(text, false);
            CHECK_MSG(std::vector<int>(s.ids.begin(), s.ids.end()) == want_ids, "%s: ids", where.c_str());
            std::vector<int> trained;
            for (size_t k = 0; k < s.ids.size(); k++)
                if (s.loss[k]) trained.push_back(s.ids[k]);
            CHECK_EQ(tok->decode(trained, false), want_trained);
            rows++;
            with_tools += tools != nullptr;
        });
    CHECK_MSG(rows >= 4 && with_tools >= 2, "%d rows with tool turns, %d with tools", rows, with_tools);
    Json plain = json_parse("{\"tools\":[{\"type\":\"function\"}],\"prompt\":\"a\",\"completion\":\"b\"}", "row");
    CHECK_THROWS(enc.encode(plain, "row 1"), "\"tools\" need the prompt as chat messages");
    Json not_object = json_parse("{\"tools\":[\"calc\"],\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}", "row");
    CHECK_THROWS(enc.encode(not_object, "row 2"), "tools[0] must be an object");
}

// The memory plan of an --env_cmd run covers its trajectories: every turn runs in the KV cache turn 1
// sized for prompt + --max_total_tokens (Engine::start_turns), only the prompts are prefilled, and the
// training sequences are prompt + --max_total_tokens: a single-turn run of --max_total_tokens new tokens.
TEST(env_memory_demand_covers_every_turn) {
    RunShape s;
    s.cfg.batch_prompts = 8, s.cfg.group_size = 4, s.cfg.sampling.max_new_tokens = 32;
    s.longest_prompt = 20;
    const MemoryDemand single = memory_demand_of(s);
    s.cfg.env.cmd = "cat", s.cfg.env.max_turn_tokens = 16, s.cfg.env.max_total_tokens = 48;
    const MemoryDemand multi = memory_demand_of(s);
    CHECK_EQ(single.longest_sequence, (int64_t)52);
    CHECK_EQ(single.rollout_prompts, (int64_t)8);
    CHECK_EQ(multi.longest_sequence, (int64_t)68);
    CHECK_EQ(multi.longest_prompt, (int64_t)20);
    CHECK_EQ(multi.max_new_tokens, 48);
    CHECK_EQ(multi.rollout_prompts, (int64_t)8);
    CHECK_EQ(multi.rollout_requests, (int64_t)32);
}
