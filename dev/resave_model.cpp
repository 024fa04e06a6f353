// resave_model.cpp: loads a HF model directory with rl/model/weights.h and writes it back with save_hf,
// for dev/check_written_checkpoint.py (which builds it). Not part of the product or the tests.
//   resave_model SRC_DIR OUT_DIR [MAX_SHARD_BYTES [GENERATE_CONFIG]]
//   resave_model --fp8 SRC_DIR OUT_DIR [pow2]
// GENERATE_CONFIG 1 writes config.json from the parsed fields alone (as for a model made from
// scratch) instead of copying the source's keys. --fp8 writes the CPU engine's FP8 weight copy as
// --save_format fp8 does (rl/model/fp8_export.h), with power-of-two scales when pow2 is given.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "cpu/engine_cpu.h"
#include "rl/model/weights.h"

int main(int argc, char** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: resave_model SRC_DIR OUT_DIR [MAX_SHARD_BYTES [GENERATE_CONFIG]] | --fp8 SRC_DIR OUT_DIR [pow2]\n");
        return 2;
    }
    try {
        if (strcmp(argv[1], "--fp8") == 0 && argc >= 4) {
            fp8rl::EngineOptions o;
            o.fp8_pow2_scales = argc > 4 && strcmp(argv[4], "pow2") == 0;
            fp8rl::CpuEngine e(argv[2], o);
            fp8rl::TrainerState s;
            e.save_state(s);
            std::filesystem::create_directories(argv[3]);
            std::string notice = e.save_hf_fp8(argv[3], s.master);
            if (!notice.empty()) printf("%s\n", notice.c_str());
            return 0;
        }
        fp8rl::ModelWeights w = fp8rl::ModelWeights::load(argv[1]);
        if (argc > 4 && atoi(argv[4]) == 1) w.config.raw = fp8rl::Json();
        fp8rl::save_hf(w, argv[2], argv[1], argc > 3 ? strtoull(argv[3], nullptr, 10) : 0);
    } catch (const fp8rl::Error& e) {
        fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
