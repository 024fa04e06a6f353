// common.h: the error type every input check throws, and small helpers shared by all of rl/.
// Errors are exceptions carrying one finished message ("where: what; what to do"); main()
// catches them, prints one line on stderr and exits 1, so bad input never crashes the program.
#pragma once
#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace fp8rl {

struct Error : std::runtime_error {
    explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// printf-style formatting into a std::string.
inline std::string vstrfmt(const char* fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(nullptr, 0, fmt, ap);
    std::string out(n > 0 ? (size_t)n : 0, '\0');
    if (n > 0) vsnprintf(&out[0], (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return out;
}

inline std::string strfmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline std::string strfmt(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string out = vstrfmt(fmt, ap);
    va_end(ap);
    return out;
}

// Throws an Error with a printf-style message.
[[noreturn]] inline void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
[[noreturn]] inline void fail(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string out = vstrfmt(fmt, ap);
    va_end(ap);
    throw Error(out);
}

// Reads a whole file into memory; a missing or unreadable file is an Error naming it.
inline std::string read_file(const std::string& path) {
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) fail("%s: cannot open file; check the path", path.c_str());
    std::string data;
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) data.append(buf, n);
    bool bad = ferror(f) != 0;
    fclose(f);
    if (bad) fail("%s: read error", path.c_str());
    return data;
}

// Writes `path` from a sequence of byte ranges: to path + ".tmp" first, then renamed into place,
// so a crash never leaves a half-written file under the real name.
inline void write_file_atomic(const std::string& path, const std::vector<std::pair<const void*, size_t>>& parts) {
    std::string tmp = path + ".tmp";
    FILE* f = fopen(tmp.c_str(), "wb");
    if (!f) fail("%s: cannot write (%s); check that the directory exists and is writable", tmp.c_str(), strerror(errno));
    bool ok = true;
    for (const auto& p : parts)
        if (p.second > 0 && fwrite(p.first, 1, p.second, f) != p.second) ok = false;
    if (fclose(f) != 0) ok = false;
    if (!ok) {
        int err = errno;
        remove(tmp.c_str());
        fail("%s: write failed (%s); is the disk full?", tmp.c_str(), strerror(err));
    }
    if (rename(tmp.c_str(), path.c_str()) != 0) {
        int err = errno;
        remove(tmp.c_str());
        fail("%s: cannot rename to %s (%s)", tmp.c_str(), path.c_str(), strerror(err));
    }
}

inline void write_file_atomic(const std::string& path, const std::string& data) {
    write_file_atomic(path, std::vector<std::pair<const void*, size_t>>{{data.data(), data.size()}});
}

}  // namespace fp8rl
