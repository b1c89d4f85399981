// An analysis shared by several processes (analysis/analysis_share.h, as kvscope-mpi runs it)
// writes the JSON one process writes, byte for byte, however the prompts are shared out: the
// processes are threads here, combining through memory what MPI_Allreduce combines between
// ranks, on every kind of capture, in windows of tokens or whole layers, with a process that
// analyses nothing. The balancing of prompts by bytes is checked against a hand-worked case.

#include "analysis/analysis_json.h"
#include "analysis/analysis_share.h"
#include "analysis/analyzer.h"
#include "format/bundle_reader.h"
#include "sharing_capture.h"
#include "small_model.h"
#include "synth/model_capture.h"
#include "synth/synthetic_capture.h"

#include <QTemporaryDir>
#include <QTest>

#include <algorithm>
#include <barrier>
#include <functional>
#include <map>
#include <sstream>
#include <thread>

using namespace kvscope;
using namespace kvscope::synth;

namespace {

// What the processes share: a barrier and a slot each, through which every combination and
// the gathering of prompts pass.
struct Hub {
    explicit Hub(int processes) : barrier(processes), doubles(std::size_t(processes)), wide(std::size_t(processes)),
                                  narrow(std::size_t(processes)) {}
    std::barrier<> barrier;
    std::vector<std::vector<double>*> doubles;
    std::vector<std::vector<std::uint64_t>*> wide;
    std::vector<std::vector<std::uint32_t>*> narrow;
    std::map<std::size_t, PromptAnalysis> handedOver;
    std::mutex handOver;
};

// One process's share. `owners` decides who analyses which prompt (empty: balancePrompts).
class ThreadShare final : public AnalysisShare {
public:
    ThreadShare(Hub& hub, int rank, int processes, std::function<std::vector<int>(std::size_t)> owners)
        : m_hub(hub), m_rank(rank), m_processes(processes), m_owners(std::move(owners)) {}

    void shareOut(const std::vector<std::string>&, const std::vector<std::uint64_t>& bytes) override
    {
        m_owner = m_owners ? m_owners(bytes.size()) : balancePrompts(bytes, m_processes);
    }
    bool analyses(std::size_t prompt) const override { return m_owner[prompt] == m_rank; }
    void minimum(std::vector<double>& v) override { combine(v, m_hub.doubles, [](double a, double b) { return std::min(a, b); }); }
    void maximum(std::vector<double>& v) override { combine(v, m_hub.doubles, [](double a, double b) { return std::max(a, b); }); }
    void sum(std::vector<std::uint64_t>& v) override { combine(v, m_hub.wide, std::plus<std::uint64_t>()); }
    void sum(std::vector<std::uint32_t>& v) override { combine(v, m_hub.narrow, std::plus<std::uint32_t>()); }
    bool gather(AnalysisResult& result, const CaptureLoader&) override
    {
        if (m_rank != 0) {
            const std::lock_guard lock(m_hub.handOver);
            for (std::size_t i = 0; i < result.prompts.size(); ++i)
                if (analyses(i))
                    m_hub.handedOver[i] = std::move(result.prompts[i]);
        }
        m_hub.barrier.arrive_and_wait();
        if (m_rank != 0)
            return false;
        for (auto& [i, p] : m_hub.handedOver)
            result.prompts[i] = std::move(p);
        return true;
    }

private:
    template <typename T, typename Op>
    void combine(std::vector<T>& values, std::vector<std::vector<T>*>& inputs, Op op)
    {
        inputs[std::size_t(m_rank)] = &values;
        m_hub.barrier.arrive_and_wait();
        std::vector<T> combined = *inputs[0];
        for (int r = 1; r < m_processes; ++r) {
            if (inputs[std::size_t(r)]->size() != combined.size())
                throw std::logic_error("processes combine different sizes");
            for (std::size_t i = 0; i < combined.size(); ++i)
                combined[i] = op(combined[i], (*inputs[std::size_t(r)])[i]);
        }
        m_hub.barrier.arrive_and_wait();  // every process has read every input
        values = std::move(combined);
    }

    Hub& m_hub;
    const int m_rank;
    const int m_processes;
    std::function<std::vector<int>(std::size_t)> m_owners;
    std::vector<int> m_owner;
};

std::string json(const AnalysisResult& result)
{
    std::ostringstream out;
    writeAnalysisJson(result, out);
    return out.str();
}

// The analysis of `bundle` by `processes` threads sharing it; rank 0's result as JSON.
std::string sharedJson(const std::string& bundle, int processes, AnalysisOptions options,
                       std::function<std::vector<int>(std::size_t)> owners = {})
{
    Hub hub(processes);
    std::string rootJson, failure;
    std::mutex failed;
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < processes; ++rank)
        ranks.emplace_back([&, rank] {
            ThreadShare share(hub, rank, processes, owners);
            AnalysisOptions mine = options;
            mine.share = &share;
            try {
                const AnalysisResult result = analyzeBundle(std::make_shared<BundleReader>(bundle), mine);
                rootJson = json(result);  // (rank 0 only: the others hand over)
            } catch (const AnalysisHandedOver&) {
            } catch (const std::exception& e) {
                const std::lock_guard lock(failed);
                failure = e.what();
            }
        });
    for (std::thread& t : ranks)
        t.join();
    if (!failure.empty())
        throw std::runtime_error(failure);
    return rootJson;
}

QString firstDifference(const std::string& a, const std::string& b)
{
    std::size_t at = 0;
    while (at < a.size() && at < b.size() && a[at] == b[at])
        ++at;
    return QString("at byte %1: ...%2... against ...%3...")
        .arg(at)
        .arg(QString::fromStdString(a.substr(at > 80 ? at - 80 : 0, 160)))
        .arg(QString::fromStdString(b.substr(at > 80 ? at - 80 : 0, 160)));
}

}  // namespace

class TestAnalysisShare : public QObject {
    Q_OBJECT

private slots:
    void balancesByBytes();
    void sharedAnalysisWritesTheSameJson_data();
    void sharedAnalysisWritesTheSameJson();

private:
    QTemporaryDir m_dir;
};

void TestAnalysisShare::balancesByBytes()
{
    // Largest first, each to the least loaded (the first of equals): 9 -> 0, 7 -> 1, 5 -> 1
    // (7 < 9), 3 -> 0 (9 < 12), 2 -> 0 (12 = 12: the first).
    QCOMPARE(balancePrompts({5, 9, 2, 7, 3}, 2), (std::vector<int>{1, 0, 0, 1, 0}));
    QCOMPARE(balancePrompts({5, 9, 2}, 1), (std::vector<int>{0, 0, 0}));
    // More processes than prompts: the last ones get none.
    QCOMPARE(balancePrompts({4, 4}, 3), (std::vector<int>{0, 1}));
}

void TestAnalysisShare::sharedAnalysisWritesTheSameJson_data()
{
    QTest::addColumn<int>("kind");
    QTest::newRow("three-way, three prompts, rope_offset") << 0;
    QTest::newRow("one pooled prompt (its own BCs are the aggregate's)") << 1;
    QTest::newRow("prefix caching, prefix_reuse") << 2;
    QTest::newRow("fp8 per token and head, fp8_scale") << 3;
    QTest::newRow("MLA") << 4;
    QTest::newRow("TP 4 replicated heads, replica_diff") << 5;
    QTest::newRow("two-way, dead_head (no aggregate)") << 6;
    QTest::newRow("prompts sharing prefix blocks (counted once, by the first)") << 7;
}

void TestAnalysisShare::sharedAnalysisWritesTheSameJson()
{
    QFETCH(int, kind);
    ModelCaptureOptions o = kvtest::smallModel();
    o.promptLens = {24, 32, 20};
    switch (kind) {
    case 0: o.fault = FaultKind::RopeOffset; break;
    case 1: o.promptLens = {24}; break;
    case 2: o.fault = FaultKind::PrefixReuse; o.promptLens = {24, 24, 32}; break;
    case 3: o.kvDtype = DType::Float8E4M3; o.kvScale = ScaleGranularity::TokenHead; o.fault = FaultKind::Fp8Scale; break;
    case 4: o = withMla(o); break;
    case 5: o.shape.kvHeads = 2; o.tpSize = 4; o.fault = FaultKind::ReplicaDiff; break;
    case 6: o.baseline = false; o.fault = FaultKind::DeadHead; break;
    }
    const std::string bundle = (m_dir.path() + "/case" + QString::number(kind) + ".h5").toStdString();
    if (kind == 7)
        writeSyntheticCapture(bundle, kvtest::sharedPrefixCapture());
    else
        writeModelCapture(bundle, o);
    AnalysisOptions options;
    options.threads = 1;
    const std::string alone = json(analyzeBundle(std::make_shared<BundleReader>(bundle), options));
    QVERIFY(alone.find("\"k_linf\"") != std::string::npos);
    QCOMPARE(alone.find("\"aggregate\":{") != std::string::npos, kind != 6);
    const auto everyOtherToLast = [](std::size_t prompts) {  // rank 1 analyses nothing
        std::vector<int> owner(prompts);
        for (std::size_t i = 0; i < prompts; ++i)
            owner[i] = i % 2 == 0 ? 0 : 2;
        return owner;
    };
    struct Run {
        int processes;
        std::int64_t windowTokens;
        bool uneven;
        std::size_t windowBytes = 0;  // 1: a prompt at a time
    };
    for (const Run run : {Run{1, 0, false}, Run{2, 0, false}, Run{3, 0, false}, Run{2, 16, false}, Run{3, 7, true},
                          Run{2, 0, false, 1}}) {
        AnalysisOptions shared = options;
        shared.windowTokens = run.windowTokens;
        shared.windowBytes = run.windowBytes;
        const std::string json = sharedJson(bundle, run.processes, shared, 
                                              run.uneven ? std::function<std::vector<int>(std::size_t)>(everyOtherToLast) : nullptr);
        if (json != alone)
            QFAIL(qPrintable(QString("%1 processes, windows of %2: ").arg(run.processes).arg(run.windowTokens) +
                             firstDifference(json, alone)));
    }
}

QTEST_GUILESS_MAIN(TestAnalysisShare)
#include "tst_analysis_share.moc"
