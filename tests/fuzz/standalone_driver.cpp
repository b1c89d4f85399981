// Runs a fuzz target without libFuzzer, for builds with GCC: every file of the corpus
// folders given, then RUNS inputs made from them by simple mutations (bit flips, byte
// runs overwritten, inserted or erased, truncation, a splice of two inputs), from a fixed
// seed. A smoke test of the targets in the default test run; the real fuzzing is the
// libFuzzer build (tests/fuzz/run.sh). Usage: TARGET [-runs=N] [-seed=N] DIR...

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

using Bytes = std::vector<std::uint8_t>;

Bytes mutate(const std::vector<Bytes>& corpus, std::mt19937_64& random)
{
    Bytes b = corpus[random() % corpus.size()];
    const auto pick = [&](std::size_t n) { return n ? std::size_t(random() % n) : 0; };
    for (int step = 0, steps = 1 + int(random() % 4); step < steps; ++step) {
        switch (random() % 6) {
        case 0:
            if (!b.empty())
                b[pick(b.size())] ^= std::uint8_t(1u << (random() % 8));
            break;
        case 1:
            for (std::size_t i = pick(b.size()), n = 1 + pick(16); n-- && i < b.size(); ++i)
                b[i] = std::uint8_t(random());
            break;
        case 2:
            b.insert(b.begin() + std::ptrdiff_t(pick(b.size() + 1)), 1 + pick(8), std::uint8_t(random()));
            break;
        case 3:
            if (!b.empty()) {
                const std::size_t at = pick(b.size());
                b.erase(b.begin() + std::ptrdiff_t(at), b.begin() + std::ptrdiff_t(std::min(b.size(), at + 1 + pick(16))));
            }
            break;
        case 4:
            b.resize(pick(b.size() + 1));
            break;
        default: {
            const Bytes& other = corpus[random() % corpus.size()];
            const std::size_t from = pick(other.size());
            b.resize(pick(b.size() + 1));
            b.insert(b.end(), other.begin() + std::ptrdiff_t(from), other.end());
        }
        }
    }
    return b;
}

}  // namespace

int main(int argc, char** argv)
{
    long runs = 2000;
    std::uint64_t seed = 1;
    std::vector<Bytes> corpus;
    for (int i = 1; i < argc; ++i) {
        if (std::strncmp(argv[i], "-runs=", 6) == 0) {
            runs = std::atol(argv[i] + 6);
        } else if (std::strncmp(argv[i], "-seed=", 6) == 0) {
            seed = std::strtoull(argv[i] + 6, nullptr, 10);
        } else {
            for (const auto& entry : std::filesystem::directory_iterator(argv[i])) {
                std::ifstream in(entry.path(), std::ios::binary);
                corpus.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
            }
        }
    }
    if (corpus.empty()) {
        std::fprintf(stderr, "%s: no corpus files\n", argv[0]);
        return 2;
    }
    for (const Bytes& input : corpus)
        LLVMFuzzerTestOneInput(input.data(), input.size());
    std::mt19937_64 random(seed);
    for (long run = 0; run < runs; ++run) {
        const Bytes input = mutate(corpus, random);
        LLVMFuzzerTestOneInput(input.data(), input.size());
    }
    std::printf("%s: %zu corpus files and %ld mutated inputs, no crash\n", argv[0], corpus.size(), runs);
    return 0;
}
