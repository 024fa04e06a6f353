// bench_tokenizer: load time of the real Qwen3 tokenizer.json, and single-threaded encode and decode
// throughput over a >= 10 MB mixed corpus built deterministically from the tokenizer test corpus.
// dev/bench_tokenizer.py runs HF tokenizers on the same documents in the same run and prints the
// ratio. Usage: bench_tokenizer [--corpus-out FILE]  (writes the documents, one JSON string a line)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "rl/text/tokenizer.h"

using namespace fp8rl;

static double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Documents of about 4 KB: words of the test corpus drawn by a 64-bit LCG, with spaces, newlines,
// paragraph breaks and numbers between them, until 10 MB.
static std::vector<std::string> build_corpus() {
    std::vector<std::string> words;
    std::string corpus = read_file("test/fixtures/tokenizer/corpus.jsonl");
    for (size_t i = 0; i < corpus.size();) {
        size_t nl = corpus.find('\n', i);
        std::string text = json_parse(corpus.substr(i, nl - i), "corpus.jsonl").find("text")->str;
        i = nl + 1;
        for (size_t a = 0; a < text.size();) {
            size_t b = text.find(' ', a);
            if (b == std::string::npos) b = text.size();
            if (b > a && b - a < 40) words.push_back(text.substr(a, b - a));
            a = b + 1;
        }
    }
    uint64_t x = 42;
    auto next = [&x]() { x = x * 6364136223846793005ull + 1442695040888963407ull; return x >> 33; };
    std::vector<std::string> docs;
    size_t total = 0;
    while (total < 10u * 1000 * 1000) {
        std::string doc;
        while (doc.size() < 4000) {
            uint64_t r = next();
            doc += words[r % words.size()];
            uint64_t sep = (r >> 16) % 100;
            doc += sep < 80 ? " " : sep < 90 ? "\n" : sep < 93 ? "\n\n" : sep < 97 ? ", " : " " + std::to_string(r % 100000) + " ";
        }
        total += doc.size();
        docs.push_back(std::move(doc));
    }
    return docs;
}

int main(int argc, char** argv) {
    try {
        const char* env = getenv("FP8RL_TOKENIZERS");
        std::string path = std::string(env ? env : "test/fixtures/tokenizer") + "/qwen3/tokenizer.json";
        FILE* probe = fopen(path.c_str(), "rb");
        if (probe) fclose(probe);
        else {
            printf("bench_tokenizer: SKIPPED (%s not found; set FP8RL_TOKENIZERS)\n", path.c_str());
            return 0;
        }
        std::vector<std::string> docs = build_corpus();
        size_t bytes = 0;
        for (const std::string& d : docs) bytes += d.size();
        if (argc == 3 && strcmp(argv[1], "--corpus-out") == 0) {
            std::string out;
            for (const std::string& d : docs) out += json_quote(d) + "\n";
            FILE* f = fopen(argv[2], "wb");
            if (!f || fwrite(out.data(), 1, out.size(), f) != out.size()) fail("%s: cannot write", argv[2]);
            fclose(f);
        }

        auto t0 = std::chrono::steady_clock::now();
        std::unique_ptr<Tokenizer> tok = Tokenizer::load(path);
        double load_s = seconds_since(t0);

        t0 = std::chrono::steady_clock::now();
        std::vector<std::vector<int>> ids;
        size_t n_ids = 0;
        uint64_t hash = 0xCBF29CE484222325ull;  // FNV-1a of all ids, to compare with HF
        for (const std::string& d : docs) ids.push_back(tok->encode(d));
        double encode_s = seconds_since(t0);
        for (const std::vector<int>& v : ids)
            for (int id : v) {
                n_ids++;
                for (int k = 0; k < 4; k++) hash = (hash ^ (((uint32_t)id >> (8 * k)) & 0xFF)) * 0x100000001B3ull;
            }

        t0 = std::chrono::steady_clock::now();
        size_t decoded = 0;
        for (const std::vector<int>& v : ids) decoded += tok->decode(v).size();
        double decode_s = seconds_since(t0);

        printf("bench_tokenizer: Qwen3 tokenizer.json load %.3f s\n", load_s);
        printf("bench_tokenizer: encode %zu docs, %.2f MB -> %zu ids in %.3f s = %.2f MB/s (1 thread), ids fnv1a64 %016llx\n",
               docs.size(), bytes / 1e6, n_ids, encode_s, bytes / 1e6 / encode_s, (unsigned long long)hash);
        printf("bench_tokenizer: decode %.2f MB in %.3f s = %.2f MB/s\n", decoded / 1e6, decode_s, decoded / 1e6 / decode_s);
        return 0;
    } catch (const Error& e) {
        fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
