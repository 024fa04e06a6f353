// temp_dir.h: a scratch directory for one test, removed with everything in it when the test ends.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <string>

#include "rl/common.h"

namespace harness {

struct TempDir {
    std::string path;
    TempDir() {
        std::string tmpl = (std::filesystem::temp_directory_path() / "fp8rl-test-XXXXXX").string();
        if (!mkdtemp(&tmpl[0])) fp8rl::fail("cannot create a temporary directory under %s", tmpl.c_str());
        path = tmpl;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    std::string operator/(const std::string& name) const { return path + "/" + name; }
};

// Writes `data` to `path`, replacing it.
inline void write_text(const std::string& path, const std::string& data) {
    FILE* f = fopen(path.c_str(), "wb");
    if (!f) fp8rl::fail("%s: cannot create", path.c_str());
    fwrite(data.data(), 1, data.size(), f);
    fclose(f);
}

}  // namespace harness
