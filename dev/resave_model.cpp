// resave_model.cpp: loads a HF model directory with rl/model/weights.h and writes it back with save_hf,
// for dev/check_written_checkpoint.py (which builds it). Not part of the product or the tests.
//   resave_model SRC_DIR OUT_DIR [MAX_SHARD_BYTES [GENERATE_CONFIG]]
// GENERATE_CONFIG 1 writes config.json from the parsed fields alone (as for a model made from
// scratch) instead of copying the source's keys.
#include <cstdio>
#include <cstdlib>

#include "rl/model/weights.h"

int main(int argc, char** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: resave_model SRC_DIR OUT_DIR [MAX_SHARD_BYTES [GENERATE_CONFIG]]\n");
        return 2;
    }
    try {
        fp8rl::ModelWeights w = fp8rl::ModelWeights::load(argv[1]);
        if (argc > 4 && atoi(argv[4]) == 1) w.config.raw = fp8rl::Json();
        fp8rl::save_hf(w, argv[2], argv[1], argc > 3 ? strtoull(argv[3], nullptr, 10) : 0);
    } catch (const fp8rl::Error& e) {
        fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
