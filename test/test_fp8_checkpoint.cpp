// Tests of FP8 checkpoints out (rl/model/fp8_export.h, --save_format) and in (rl/model/fp8_dequant.h):
// the export holds the engine's FP8 weight copy bit for bit (codes, and scales without the layout's
// padding), splits the fused projections at the HF tensors, re-reads to the same FP8 copy and the same
// FP8 log-probs, and a malformed FP8 directory gets one line and exit 1. The independent check of the
// files (numpy + safetensors against the format's published definition) is dev/check_written_checkpoint.py.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "cpu/engine_cpu.h"
#include "rl/model/fp8_export.h"
#include "rl/model/init_model.h"
#include "test/harness.h"
#include "test/run_binary.h"
#include "test/temp_dir.h"

using namespace fp8rl;

namespace {

// A Qwen3 whose fused projections split at multiples of 128 rows (q 128, k 128, v 128; gate 128, up 128).
const char* kAlignedConfig =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 64, \"intermediate_size\": 128, "
    "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"head_dim\": 32, \"hidden_act\": \"silu\", "
    "\"rms_norm_eps\": 1e-06, \"rope_theta\": 10000.0, \"max_position_embeddings\": 512, \"tie_word_embeddings\": true, "
    "\"attention_bias\": false, \"eos_token_id\": 1, \"torch_dtype\": \"float32\", \"vocab_size\": 96}";

// The element of a 128x128-block tensor as the GEMM reads it: code x scale_inv.
float block_value(const Fp8Tensor& q, int r, int c) {
    return e4m3_to_float(q.data[(size_t)r * q.cols + c]) * q.scale_inv[blk128_scale_index(r / FP8_BLOCK, c / FP8_BLOCK, q.cols)];
}

// Export of engine e into dir; returns the notice.
std::string export_fp8(CpuEngine& e, const std::string& dir) {
    TrainerState s;
    e.save_state(s);
    std::filesystem::create_directories(dir);
    return e.save_hf_fp8(dir, s.master);
}

// Every exported projection of model dir `src` against the engine's copy: rows taken as they are
// where the HF tensor starts at a multiple of 128 (codes and scales equal), quantized alone otherwise.
void check_export_is_engine_copy(const std::string& src, bool pow2, const char* expect_requantized) {
    harness::TempDir tmp;
    EngineOptions o;
    o.fp8_pow2_scales = pow2;
    CpuEngine e(src, o);
    const std::vector<Fp8Tensor> copies = e.fp8_weight_copies();
    std::string notice = export_fp8(e, tmp / "fp8");
    CHECK_MSG(std::string(expect_requantized).empty() ? notice.empty() : notice.find(expect_requantized) != std::string::npos,
              "notice: %s", notice.c_str());
    SafetensorsFile f(tmp / "fp8/model.safetensors");
    const ModelConfig& c = e.config();
    const ModelWeights table = ModelWeights::from_config(c, false);
    size_t exact = 0, requantized = 0;
    for (int64_t l = 0; l < c.num_layers; l++)
        for (const FusedPart& p : fused_projection_parts(c)) {
            const std::string name = layer_tensor_name(l, p.suffix);
            const TensorView* w = f.find(name);
            const TensorView* s = f.find(name + "_scale_inv");
            CHECK_MSG(w && s, "%s or its scale missing", name.c_str());
            if (!w || !s) continue;
            const Fp8Tensor& q = copies[(size_t)l * kFusedProjections + p.projection];
            const int K = q.cols, kb = fp8_num_blocks(K);
            CHECK(w->dtype == DType::F8_E4M3 && s->dtype == DType::F32);
            CHECK(w->shape == (std::vector<int64_t>{p.rows, K}));
            CHECK(s->shape == (std::vector<int64_t>{(p.rows + 127) / 128, kb}));
            std::vector<float> scales((size_t)s->numel);
            memcpy(scales.data(), s->data, scales.size() * 4);
            if (pow2)
                for (float x : scales) {
                    int e;
                    CHECK_MSG(std::frexp(x, &e) == 0.5f, "%s: scale %g is not a power of two", name.c_str(), x);
                }
            Fp8Tensor want;  // what the file must hold: the engine's rows, or those rows quantized alone
            if (p.row0 % 128 == 0) {
                want = q;
                exact++;
            } else {
                TrainerState st;
                e.save_state(st);
                want = fp8_quantize_blockwise(st.master.data() + table.tensor(name).offset, (int)p.rows, K, pow2);
                requantized++;
            }
            const int64_t row0 = p.row0 % 128 == 0 ? p.row0 : 0;
            size_t code_diff = 0, value_diff = 0;
            for (int64_t r = 0; r < p.rows; r++)
                for (int k = 0; k < K; k++) {
                    const uint8_t code = w->data[r * K + k];
                    code_diff += code != want.data[(size_t)(row0 + r) * K + k];
                    const float v = e4m3_to_float(code) * scales[(size_t)(r / 128) * kb + k / 128];
                    const float ref = block_value(want, (int)(row0 + r), k);
                    value_diff += memcmp(&v, &ref, 4) != 0;
                }
            CHECK_MSG(code_diff == 0 && value_diff == 0, "%s: %zu codes and %zu dequantized values differ", name.c_str(), code_diff,
                      value_diff);
        }
    CHECK(exact > 0);
    CHECK_EQ(requantized > 0, !std::string(expect_requantized).empty());
    // non-projections in BF16; config.json says how the weights are quantized
    for (const char* n : {"model.embed_tokens.weight", "model.norm.weight", "model.layers.0.input_layernorm.weight"})
        CHECK(f.find(n) && f.find(n)->dtype == DType::BF16);
    Json cfg = json_parse_file(tmp / "fp8/config.json");
    const Json* qc = cfg.find("quantization_config");
    CHECK(qc && qc->find("quant_method")->str == "fp8" && qc->find("fmt")->str == "e4m3" &&
          qc->find("activation_scheme")->str == "dynamic" && qc->find("weight_block_size")->items.size() == 2 &&
          qc->find("weight_block_size")->items[0].integer == 128 && qc->find("weight_block_size")->items[1].integer == 128);
}

void write_aligned_model(const std::string& dir) { write_random_model(dir, kAlignedConfig, {}, 5); }

std::vector<Sequence> some_sequences() {
    return {{{3, 17, 42, 8, 60, 5, 9, 11}, 2}, {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 90, 91}, 5}};
}

}  // namespace

TEST(fp8_export_holds_the_engines_fp8_copy) {
    harness::TempDir tmp;
    write_aligned_model(tmp / "aligned");
    check_export_is_engine_copy(tmp / "aligned", false, "");
    check_export_is_engine_copy(tmp / "aligned", true, "");
    // qwen3_tiny: q 128 rows, k and v 64: v starts at row 192 of [q|k|v] and is quantized alone
    check_export_is_engine_copy(harness::model_fixtures + "qwen3_tiny", false, "self_attn.v_proj.weight (from row 192)");
    check_export_is_engine_copy(harness::model_fixtures + "qwen2_tiny", true,
                                "self_attn.k_proj.weight (from row 64), self_attn.v_proj.weight (from row 96)");
}

// The export re-read: the engine's FP8 copy is the file's codes and scales, its FP8 log-probs the source's.
TEST(fp8_export_reads_back_to_the_same_fp8_copy_and_logprobs) {
    harness::TempDir tmp;
    write_aligned_model(tmp / "src");
    for (bool pow2 : {false, true}) {
        EngineOptions o;
        o.fp8_pow2_scales = pow2;
        CpuEngine a(tmp / "src", o);
        const std::string out = tmp / (pow2 ? "fp8_pow2" : "fp8");  // the binary below reads the fp32-scale one
        export_fp8(a, out);
        CpuEngine b(out, o);
        std::vector<Fp8Tensor> x = a.fp8_weight_copies(), y = b.fp8_weight_copies();
        CHECK_EQ(x.size(), y.size());
        for (size_t i = 0; i < x.size() && i < y.size(); i++) {
            CHECK_MSG(x[i].data == y[i].data, "projection %zu: codes differ after the round trip", i);
            CHECK_MSG(memcmp(x[i].scale_inv.data(), y[i].scale_inv.data(), x[i].scale_inv.size() * 4) == 0,
                      "projection %zu: scales differ after the round trip", i);
        }
        TokenValues la, lb;
        a.logprobs(some_sequences(), Precision::FP8, 1.0f, &la, nullptr);
        b.logprobs(some_sequences(), Precision::FP8, 1.0f, &lb, nullptr);
        CHECK(la == lb);
    }
    // the same through the binary's --logprobs
    harness::write_text(tmp / "ids.jsonl", "{\"ids\": [3, 17, 42, 8, 60, 5, 9, 11]}\n{\"ids\": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}\n");
    std::string cmd = harness::binary() + " --precision fp8 --logprobs " + tmp / "ids.jsonl" + " --model ";
    harness::RunResult src = harness::run_command(cmd + tmp / "src" + " 2>/dev/null");
    harness::RunResult got = harness::run_command(cmd + tmp / "fp8" + " 2>" + tmp / "said.txt");
    CHECK_MSG(src.status == 0 && got.status == 0, "%s\n%s", src.output.c_str(), got.output.c_str());
    CHECK(!src.output.empty() && got.output == src.output);
    const std::string said = read_file(tmp / "said.txt");
    CHECK_MSG(said == "model " + tmp / "fp8" + ": FP8 checkpoint (F8_E4M3, 128x128 block scales), dequantized into the FP32 master\n",
              "%s", said.c_str());
}

// Other layouts the format allows: block scales of another size, one weight_scale per tensor or per
// output channel (BF16 scales too), each read as code x scale by the definition.
TEST(fp8_checkpoint_other_scale_layouts_dequantize) {
    harness::TempDir tmp;
    write_aligned_model(tmp / "src");
    ModelWeights src = ModelWeights::load(tmp / "src");
    struct Case { const char* name; int64_t block; bool per_channel; bool bf16_scale; };
    for (const Case& cs : {Case{"block64", 64, false, false}, Case{"tensor", 0, false, false}, Case{"channel", 0, true, true}}) {
        const std::string dir = tmp / cs.name;
        save_hf(src, dir, tmp / "src");
        // every projection weight: codes from a fixed pattern, scales by position
        std::vector<std::vector<uint8_t>> bytes;
        std::vector<TensorToWrite> out;
        bytes.reserve(src.tensors.size() * 2);
        std::map<std::string, std::pair<std::vector<uint8_t>, std::vector<float>>> expected;  // codes, scale per element
        for (const TensorInfo& t : src.tensors) {
            const bool proj = t.shape.size() == 2 && t.name.find("proj") != std::string::npos;
            if (!proj) {
                bytes.emplace_back(2 * t.numel);
                for (size_t k = 0; k < t.numel; k++) {
                    uint16_t h = float_to_bf16(src.master[t.offset + k]);
                    bytes.back()[2 * k] = (uint8_t)h, bytes.back()[2 * k + 1] = (uint8_t)(h >> 8);
                }
                out.push_back({t.name, DType::BF16, t.shape, bytes.back().data()});
                continue;
            }
            const int64_t N = t.shape[0], K = t.shape[1];
            bytes.emplace_back((size_t)(N * K));
            std::vector<uint8_t>& codes = bytes.back();
            for (int64_t i = 0; i < N * K; i++) codes[(size_t)i] = (uint8_t)(((i * 37 + 11) & 0x7F) == 0x7F ? 0x3C : (i * 37 + 11) % 256);
            std::vector<float> scale;
            std::vector<int64_t> sshape;
            if (cs.block) sshape = {(N + cs.block - 1) / cs.block, (K + cs.block - 1) / cs.block};
            else if (cs.per_channel) sshape = {N, 1};
            else sshape = {};
            for (int64_t i = 0; i < std::max<int64_t>(1, shape_numel(sshape)); i++) scale.push_back(std::ldexp(1.0f + i % 5, -9 - (int)(i % 3)));
            std::vector<float> per_element((size_t)(N * K));
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < K; k++)
                    per_element[(size_t)(n * K + k)] = cs.block ? scale[(size_t)((n / cs.block) * sshape[1] + k / cs.block)]
                                                      : cs.per_channel ? scale[(size_t)n] : scale[0];
            expected[t.name] = {codes, per_element};
            out.push_back({t.name, DType::F8_E4M3, t.shape, codes.data()});
            bytes.emplace_back(scale.size() * 4);
            if (cs.bf16_scale) {  // the scales chosen are exact in BF16
                bytes.back().resize(scale.size() * 2);
                for (size_t i = 0; i < scale.size(); i++) {
                    uint16_t h = float_to_bf16(scale[i]);
                    bytes.back()[2 * i] = (uint8_t)h, bytes.back()[2 * i + 1] = (uint8_t)(h >> 8);
                }
            } else {
                memcpy(bytes.back().data(), scale.data(), scale.size() * 4);
            }
            std::string sname = t.name + (cs.block ? "_scale_inv" : "_scale");
            out.push_back({sname, cs.bf16_scale ? DType::BF16 : DType::F32, sshape, bytes.back().data()});
        }
        std::filesystem::remove(dir + "/model.safetensors");
        write_checkpoint_weights(dir, out);
        if (cs.block) {
            Json cfg = json_parse_file(dir + "/config.json");
            cfg.fields.emplace_back("quantization_config", json_parse("{\"quant_method\": \"fp8\", \"weight_block_size\": [64, 64]}", "q"));
            harness::write_text(dir + "/config.json", json_dump(cfg, 2));
        }
        ModelWeights w = ModelWeights::load(dir);
        size_t diff = 0, compared = 0;
        for (const auto& kv : expected) {
            const float* got = w.data(kv.first);
            for (size_t i = 0; i < kv.second.first.size(); i++, compared++) {
                const float want = e4m3_to_float(kv.second.first[i]) * kv.second.second[i];
                diff += memcmp(&want, &got[i], 4) != 0;
            }
        }
        CHECK_MSG(diff == 0 && compared > 0, "%s: %zu of %zu values differ", cs.name, diff, compared);
    }
}

// A malformed FP8 directory: one line naming what is wrong, exit 1.
TEST(fp8_checkpoint_malformed_gets_one_line) {
    harness::TempDir tmp;
    write_aligned_model(tmp / "src");
    {
        CpuEngine e(tmp / "src");
        export_fp8(e, tmp / "good");
    }
    struct Case { const char* name; const char* drop; const char* reshape; const char* quant_method; const char* expect; };
    const Case cases[] = {
        {"no_scale", "model.layers.1.mlp.down_proj.weight_scale_inv", "", "", "has no scale (model.layers.1.mlp.down_proj.weight_scale_inv"},
        {"bad_shape", "", "model.layers.0.self_attn.q_proj.weight_scale_inv", "", "at weight_block_size [128, 128] needs [1, 1]"},
        {"bad_method", "", "", "awq", "quant_method \"awq\" is not an FP8 format"},
    };
    for (const Case& cs : cases) {
        const std::string dir = tmp / cs.name;
        std::filesystem::copy(tmp / "good", dir);
        SafetensorsFile f(tmp / "good/model.safetensors");
        std::vector<TensorToWrite> out;
        const float extra[2] = {1.0f, 1.0f};
        for (const TensorView& t : f.tensors()) {
            if (t.name == cs.drop) continue;
            if (t.name == cs.reshape) out.push_back({t.name, DType::F32, {1, 2}, extra});
            else out.push_back({t.name, t.dtype, t.shape, t.data});
        }
        write_safetensors(dir + "/model.safetensors", out);
        if (*cs.quant_method) {
            std::string cfg = read_file(dir + "/config.json");
            cfg.replace(cfg.find("\"fp8\""), 5, strfmt("\"%s\"", cs.quant_method));
            harness::write_text(dir + "/config.json", cfg);
        }
        harness::RunResult r = harness::run_command(harness::binary() + " --precision fp8 --logprobs /dev/null --model " + dir + " 2>&1");
        CHECK_EQ(r.status, 1);
        CHECK_MSG(r.output.find(cs.expect) != std::string::npos && std::count(r.output.begin(), r.output.end(), '\n') == 1, "%s: %s",
                  cs.name, r.output.c_str());
    }
}

// A training run's checkpoints: with --save_format both, fp8/ re-read gives the run's FP8 copy and FP8
// log-probs (those of its FP32 master, from trainer_state.bin); with --save_format fp8 the checkpoint's
// own weights are the FP8 files; other scalings than block are refused before the run.
TEST(fp8_checkpoint_of_a_training_run) {
    harness::TempDir tmp;
    harness::write_text(tmp / "config.json", kAlignedConfig);
    const std::string run = harness::binary() + " --init " + tmp / "config.json" +
                            " --task add --task_size 1 --max_new_tokens 3 --group_size 4 --batch_prompts 8 --minibatches 2"
                            " --lr 3e-3 --steps 1 --eval_every 0 --seed 7 --rollout_precision fp8 --train_precision fp8 --out_dir ";
    harness::RunResult r = harness::run_command(run + tmp / "both" + " --save_format both 2>&1");
    CHECK_MSG(r.status == 0 && r.output.find("(bf16, block FP8 in fp8/)") != std::string::npos, "%s", r.output.c_str());
    if (r.status) return;
    const std::string ckpt = resolve_checkpoint(tmp / "both");
    CpuEngine trained(ckpt), exported(ckpt + "/fp8");
    trained.load_state(load_trainer_state(ckpt));
    const std::vector<Fp8Tensor> x = trained.fp8_weight_copies(), y = exported.fp8_weight_copies();
    bool same = x.size() == y.size();
    for (size_t i = 0; same && i < x.size(); i++) same = x[i].data == y[i].data && x[i].scale_inv == y[i].scale_inv;
    CHECK_MSG(same, "the export re-read is not the run's FP8 weight copy");
    const std::vector<Sequence> seqs = {{{3, 7, 2, 8, 10, 5, 9, 11}, 2}, {{1, 2, 3, 4, 5, 6, 7, 8, 9}, 4}};
    TokenValues la, lb;
    trained.logprobs(seqs, Precision::FP8, 1.0f, &la, nullptr);
    exported.logprobs(seqs, Precision::FP8, 1.0f, &lb, nullptr);
    CHECK_MSG(la == lb, "the export's FP8 log-probs differ from the run's");

    r = harness::run_command(run + tmp / "fp8" + " --save_format fp8 2>&1");
    CHECK_MSG(r.status == 0, "%s", r.output.c_str());
    if (r.status == 0) {
        SafetensorsFile f(resolve_checkpoint(tmp / "fp8") + "/model.safetensors");
        CHECK(f.find("model.layers.1.mlp.down_proj.weight") && f.find("model.layers.1.mlp.down_proj.weight")->dtype == DType::F8_E4M3);
        CHECK(f.find("model.layers.1.mlp.down_proj.weight_scale_inv") != nullptr);
    }
    r = harness::run_command(run + tmp / "row" + " --save_format fp8 --fp8_scaling row 2>&1");
    CHECK_MSG(r.status == 1 && r.output.find("needs --fp8_scaling block") != std::string::npos &&
                  std::count(r.output.begin(), r.output.end(), '\n') == 1,
              "%s", r.output.c_str());
}
