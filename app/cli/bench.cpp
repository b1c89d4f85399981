#include "cli/commands.h"

#include "analysis/analyzer.h"
#include "format/bundle_reader.h"
#include "synth/synthetic_capture.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <thread>

namespace kvscope::cli {

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point since)
{
    return std::chrono::duration<double>(Clock::now() - since).count();
}

// Reads every KV element the analysis reads (all stored engine blocks of every rank, both
// references) once, decodes it and sums it: the least any analysis must do.
double roofline(const std::string& path, int threads, std::uint64_t& bytes)
{
    const BundleReader reader(path);
    const std::vector<std::string> layers = reader.config().layerNames();
    std::atomic<int> next{0};
    std::atomic<std::uint64_t> total{0};
    std::vector<double> sums(std::size_t(threads), 0.0);
    auto work = [&](int self) {
        std::vector<float> buffer;
        auto add = [&](const RawTensor& t) {
            buffer.resize(std::size_t(t.numel()));
            t.decode(0, t.numel(), buffer.data());
            float s = 0;
            for (float v : buffer)
                s += v;
            sums[std::size_t(self)] += s;
            total += t.bytes.size();
        };
        for (int l; (l = next++) < int(layers.size());)
            for (const PromptInfo& p : reader.prompts()) {
                for (std::size_t s = 0; s < p.snapshots.size(); ++s)
                    for (int r : reader.config().contributingRanks())
                        for (KvPart part : {KvPart::K, KvPart::V})
                            add(reader.readEngineShard(p.id, s, r, layers[std::size_t(l)], part).blocks);
                for (ReferenceRole role : {ReferenceRole::Expected, ReferenceRole::Baseline}) {
                    if (role == ReferenceRole::Baseline && !p.hasBaseline)
                        continue;
                    const BundleReader::Reference ref = reader.readReference(p.id, role, layers[std::size_t(l)]);
                    add(ref.k);
                    add(ref.v);
                }
            }
    };
    std::vector<std::thread> pool;
    for (int i = 1; i < threads; ++i)
        pool.emplace_back(work, i);
    work(0);
    for (std::thread& t : pool)
        t.join();
    bytes = total;
    double sum = 0;
    for (double s : sums)
        sum += s;
    return sum;
}

struct ChildResult {
    std::string output;
    int status = -1;
};

// Peak resident set of this process since exec (VmHWM), in kB. (getrusage's ru_maxrss
// would also count what a forked child inherited from the parent before exec.)
long peakRssKb()
{
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);)
        if (line.rfind("VmHWM:", 0) == 0)
            return std::atol(line.c_str() + 6);
    return 0;
}

ChildResult runChild(const std::vector<std::string>& args)
{
    int pipeFds[2];
    ChildResult result;
    if (pipe(pipeFds) != 0)
        return result;
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(pipeFds[1], STDOUT_FILENO);
        close(pipeFds[0]);
        std::vector<char*> argv;
        for (const std::string& a : args)
            argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        execv("/proc/self/exe", argv.data());
        _exit(127);
    }
    close(pipeFds[1]);
    char buffer[4096];
    for (ssize_t n; (n = read(pipeFds[0], buffer, sizeof buffer)) > 0;)
        result.output.append(buffer, std::size_t(n));
    close(pipeFds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return result;
}

double bestOf(int runs, const std::vector<std::string>& args, long& peakRssKb, std::uint64_t* bytes)
{
    double best = 1e300;
    for (int i = 0; i < runs; ++i) {
        const ChildResult r = runChild(args);
        if (r.status != 0)
            throw std::runtime_error("bench child failed: " + r.output);
        std::istringstream in(r.output);
        double s = 0;
        std::uint64_t b = 0;
        long rss = 0;
        in >> s >> b >> rss;
        best = std::min(best, s);
        peakRssKb = std::max(peakRssKb, rss);
        if (bytes)
            *bytes = b;
    }
    return best;
}

}  // namespace

int benchRun(const Args& args, std::ostream& out, std::ostream& err)
{
    if (args.size() != 3)
        return 2;
    const int threads = std::max(1, std::atoi(args[2].c_str()));
    const auto start = Clock::now();
    if (args[0] == "roofline") {
        std::uint64_t bytes = 0;
        const double sum = roofline(args[1], threads, bytes);
        out << seconds(start) << " " << bytes << " " << peakRssKb() << " " << sum << "\n";
        return 0;
    }
    if (args[0] == "analyze") {
        AnalysisOptions options;
        options.threads = threads;
        const AnalysisResult result = analyzeBundle(std::make_shared<BundleReader>(args[1]), options);
        out << seconds(start) << " 0 " << peakRssKb() << " " << result.prompts.size() << "\n";
        return 0;
    }
    return 2;
}

int bench(const Args& args, std::ostream& out, std::ostream& err)
{
    int tokens = 2048, layers = 80, threads = int(std::max(1u, std::thread::hardware_concurrency())), runs = 3;
    std::filesystem::path dir = std::filesystem::temp_directory_path() / "kvscope-bench";
    bool keep = false;
    for (std::size_t i = 0; i < args.size(); ++i) {
        const bool value = i + 1 < args.size();
        if (args[i] == "--tokens" && value)
            tokens = std::atoi(args[++i].c_str());
        else if (args[i] == "--layers" && value)
            layers = std::atoi(args[++i].c_str());
        else if (args[i] == "--threads" && value)
            threads = std::atoi(args[++i].c_str());
        else if (args[i] == "--runs" && value)
            runs = std::atoi(args[++i].c_str());
        else if (args[i] == "--dir" && value)
            dir = args[++i];
        else if (args[i] == "--keep")
            keep = true;
        else {
            printUsage("bench", err);
            return 2;
        }
    }
    if (tokens < 4 || layers < 1 || threads < 1 || runs < 1) {
        err << "kvscope bench: tokens, layers, threads and runs must be positive\n";
        return 2;
    }
    std::filesystem::create_directories(dir);
    out << "kvscope bench: synthetic capture shaped like Llama-3.3-70B (8 KV heads x 128, bf16, block 16, TP 8), "
              << tokens << " tokens, three-way, " << threads << " thread(s), best of " << runs << "\n"
              << "  roofline = read every input element once (HDF5 read + decode + sum), same threads\n\n"
              << std::left << std::setw(8) << "layers" << std::setw(14) << "input MB" << std::setw(13) << "roofline s"
              << std::setw(13) << "analysis s" << std::setw(8) << "ratio" << std::setw(18) << "analysis RSS MB"
              << std::setw(17) << "(result arrays)" << "roofline RSS MB\n";
    for (int l : {layers, 2 * layers}) {
        const std::string path = (dir / ("bench-" + std::to_string(tokens) + "x" + std::to_string(l) + ".h5")).string();
        if (!std::filesystem::exists(path))
            writeSyntheticCapture(path, llama70bShape(tokens, l));
        long rooflineRss = 0, analysisRss = 0;
        std::uint64_t bytes = 0;
        const std::string t = std::to_string(threads);
        runChild({"kvscope", "bench-run", "roofline", path, t});  // warm the page cache
        const double roof = bestOf(runs, {"kvscope", "bench-run", "roofline", path, t}, rooflineRss, &bytes);
        const double full = bestOf(runs, {"kvscope", "bench-run", "analyze", path, t}, analysisRss, nullptr);
        // What the analysis must keep whatever the streaming: every metric of every cell.
        const double resultBytes = 4.0 * double(l) * tokens * (kMetricCount * 8 + 2) + 8.0 * l * (tokens / 2 + 1);
        out << std::setw(8) << l << std::setw(14) << std::fixed << std::setprecision(1) << double(bytes) / 1e6
                  << std::setw(13) << std::setprecision(3) << roof << std::setw(13) << full << std::setw(8)
                  << std::setprecision(2) << full / roof << std::setw(18) << std::setprecision(0)
                  << double(analysisRss) / 1024 << std::setw(17) << resultBytes / 1e6 << double(rooflineRss) / 1024
                  << "\n";
        if (!keep)
            std::filesystem::remove(path);
    }
    return 0;
}

}  // namespace kvscope::cli
