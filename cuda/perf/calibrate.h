// calibrate.h: what a GPU run says of the model's constants (gpu_spec.h). Every benchmark that
// dev/gpu_check.sh runs writes, per kernel it times, one line of a TSV file under
// DIR/calibration/ (test/gpu/bench_util.cuh's record_calibration):
//   kernel <TAB> measured_s <TAB> predicted_s <TAB> ratio <TAB> bound <TAB> constants (comma-separated)
// the constants being those the prediction rests on (constants_of_bound). `build/perf_model --calibrate
// DIR` reads them all and reports, per constant, the measurements that rest on it: their ratios
// (measured / predicted: geometric mean, range) and whether they contradict it (the mean outside
// [1 / kCalibrationTolerance, kCalibrationTolerance]), with the value that alone would explain the mean.
// It changes nothing: a contradicted constant is for a person to re-source (docs/perf-model.md).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/perf/gpu_spec.h"
#include "rl/common.h"

namespace fp8rl {

constexpr double kCalibrationTolerance = 1.25;  // the 25%

// The constants a prediction bound by `bound` rests on (JSON names of assumptions()); `fp8`: which
// GEMM rate a "tensor" bound means.
inline std::string constants_of_bound(const std::string& bound, bool fp8) {
    if (bound == "tensor") return fp8 ? "gemm_fp8_block_flops" : "gemm_bf16_flops";
    if (bound == "issue") return "ipc_half_warps,clock_under_load_hz";
    if (bound == "ceiling") return "deepgemm_fp8_block_flops";
    if (bound == "fa3") return "fa3_attention_flops";
    if (bound == "smem") return "smem_bytes_per_clock,clock_under_load_hz";
    if (bound == "hbm") return "hbm_efficiency";
    if (bound == "l2") return "l2_bytes_per_s";
    if (bound == "latency") return "l2_latency_clocks,hbm_latency_clocks";
    if (bound == "launch") return "launch_s";
    if (bound == "nvlink") return "nccl_bus_bytes_per_s";
    fail("constants_of_bound: unknown bound \"%s\"", bound.c_str());
}

struct Measurement {
    std::string file, kernel, bound;
    int line = 0;
    double measured_s = 0, predicted_s = 0, ratio = 0;
    std::vector<std::string> constants;
};

// Every line of DIR/calibration/*.tsv (lines starting with '#' are comments); a malformed line, an
// unknown constant or no file at all is an error naming the file and line.
inline std::vector<Measurement> read_calibration(const std::string& dir) {
    namespace fs = std::filesystem;
    const fs::path where = fs::path(dir) / "calibration";
    std::error_code ec;
    if (!fs::is_directory(where, ec))
        fail("--calibrate %s: no directory %s (dev/gpu_check.sh writes it on a GPU machine)", dir.c_str(), where.string().c_str());
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(where, ec))
        if (e.path().extension() == ".tsv") files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    if (files.empty()) fail("--calibrate %s: no .tsv file in %s (dev/gpu_check.sh's benchmarks write them)", dir.c_str(), where.string().c_str());
    std::map<std::string, bool> known;
    for (const Assumption& a : assumptions(GpuSpec())) known[a.name] = true;
    std::vector<Measurement> out;
    for (const std::string& file : files) {
        std::ifstream in(file);
        std::string text;
        for (int line = 1; std::getline(in, text); line++) {
            if (text.empty() || text[0] == '#') continue;
            std::vector<std::string> f;
            std::stringstream ss(text);
            for (std::string field; std::getline(ss, field, '\t');) f.push_back(field);
            Measurement m;
            m.file = file, m.line = line;
            char* end[3] = {};
            if (f.size() == 6) {
                m.kernel = f[0], m.bound = f[4];
                m.measured_s = strtod(f[1].c_str(), &end[0]), m.predicted_s = strtod(f[2].c_str(), &end[1]);
                m.ratio = strtod(f[3].c_str(), &end[2]);
            }
            if (f.size() != 6 || *end[0] || *end[1] || *end[2] || !(m.measured_s > 0) || !(m.predicted_s > 0) ||
                !(std::fabs(m.ratio / (m.measured_s / m.predicted_s) - 1) < 1e-3))
                fail("%s:%d: want kernel, measured_s > 0, predicted_s > 0, ratio = measured / predicted, bound, constants "
                     "(6 tab-separated fields): \"%s\"", file.c_str(), line, text.c_str());
            std::stringstream cs(f[5]);
            for (std::string c; std::getline(cs, c, ',');) {
                if (!known.count(c)) fail("%s:%d: unknown constant \"%s\" (gpu_spec.h's assumptions())", file.c_str(), line, c.c_str());
                m.constants.push_back(c);
            }
            if (m.constants.empty()) fail("%s:%d: no constant named", file.c_str(), line);
            out.push_back(m);
        }
    }
    return out;
}

struct ConstantVerdict {
    std::string name;
    int measurements = 0;
    double mean_ratio = 1, min_ratio = 0, max_ratio = 0;  // geometric mean of measured / predicted
    bool contradicted = false;
};

// Per constant named by a measurement, in name order.
inline std::vector<ConstantVerdict> judge_constants(const std::vector<Measurement>& ms) {
    std::map<std::string, ConstantVerdict> by;
    std::map<std::string, double> log_sum;
    for (const Measurement& m : ms)
        for (const std::string& c : m.constants) {
            ConstantVerdict& v = by[c];
            v.name = c;
            v.min_ratio = v.measurements ? std::min(v.min_ratio, m.ratio) : m.ratio;
            v.max_ratio = v.measurements ? std::max(v.max_ratio, m.ratio) : m.ratio;
            v.measurements++, log_sum[c] += std::log(m.ratio);
        }
    std::vector<ConstantVerdict> out;
    for (auto& e : by) {
        ConstantVerdict v = e.second;
        v.mean_ratio = std::exp(log_sum[e.first] / v.measurements);
        v.contradicted = v.mean_ratio > kCalibrationTolerance || v.mean_ratio < 1 / kCalibrationTolerance;
        out.push_back(v);
    }
    return out;
}

// The report --calibrate prints: a line per constant, then the measurements; returns how many
// constants were contradicted.
inline int print_calibration(const std::string& dir, FILE* f) {
    const std::vector<Measurement> ms = read_calibration(dir);
    const GpuSpec g;
    std::map<std::string, Assumption> by_name;
    for (const Assumption& a : assumptions(g)) by_name.emplace(a.name, a);
    const std::vector<ConstantVerdict> vs = judge_constants(ms);
    int contradicted = 0;
    fprintf(f, "calibration from %s: %zu measurements; a constant is contradicted when its measurements' geometric-mean "
               "ratio (measured / predicted) is outside [%.2f, %.2f]; nothing is refitted\n\n",
            dir.c_str(), ms.size(), 1 / kCalibrationTolerance, kCalibrationTolerance);
    fprintf(f, "| constant | value (H100) | measurements | mean ratio | range | verdict |\n|---|---|---|---|---|---|\n");
    for (const ConstantVerdict& v : vs) {
        contradicted += v.contradicted;
        fprintf(f, "| %s | %.4g %s | %d | %.3f | %.3f-%.3f | %s |\n", v.name.c_str(), by_name.at(v.name).value,
                by_name.at(v.name).unit, v.measurements, v.mean_ratio, v.min_ratio, v.max_ratio,
                v.contradicted ? (v.mean_ratio > 1 ? "CONTRADICTED: the GPU is slower than predicted"
                                                   : "CONTRADICTED: the GPU is faster than predicted")
                               : "consistent");
    }
    fprintf(f, "\n| file:line | kernel | measured s | predicted s | ratio | bound |\n|---|---|---|---|---|---|\n");
    for (const Measurement& m : ms)
        fprintf(f, "| %s:%d | %s | %.4g | %.4g | %.3f | %s |\n", std::filesystem::path(m.file).filename().string().c_str(), m.line,
                m.kernel.c_str(), m.measured_s, m.predicted_s, m.ratio, m.bound.c_str());
    fprintf(f, "\n%d of %zu constants contradicted\n", contradicted, vs.size());
    return contradicted;
}

}  // namespace fp8rl
