#include "synth/impact_capture.h"

#include "format/bundle_reader.h"
#include "kv/capture_loader.h"
#include "quant/quantiser.h"
#include "util/deterministic_math.h"
#include "util/work_team.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <stdexcept>
#include <thread>

namespace kvscope::synth {

namespace {

int layerIndex(const std::string& name)
{
    return std::stoi(name.substr(13));  // "model.layers.N...."
}

int argmax(const float* row, int vocab)
{
    return int(std::max_element(row, row + vocab) - row);
}

// One prompt's reference run and the caches the transplants read.
struct PromptRun {
    std::string id;
    std::int64_t first = 0;  // the position of step 0's row
    int steps = 0;
    std::vector<Matrix> residuals;        // entering each layer, rows of the decode steps
    std::vector<LayerCache> reference;    // the model's own caches
    std::map<int, LayerCache> engine;     // attention layer -> the engine's cache as the bundle holds it
    std::map<int, LayerCache> baseline;   // attention layer -> the baseline reference's (three-way)
    std::map<std::pair<int, std::string>, LayerCache> quantised;  // (layer, scheme) -> own KV quantised
    Matrix referenceLogits;               // [steps, vocab]
};

// `kv`'s part as rows [positions, width]; positions it does not hold (or beyond it) from `own`.
Matrix rowsOf(const LayerKv& kv, KvPart part, const std::vector<float>& own, std::int64_t positions)
{
    const int width = kv.heads * kv.headDim(part);
    Matrix m(int(positions), width);
    for (std::int64_t p = 0; p < positions; ++p) {
        float* row = m.row(int(p));
        if (p < kv.seq && kv.present[std::size_t(p)])
            std::copy_n(kv.values(part).data() + kv.index(part, 0, p), width, row);
        else
            std::copy_n(own.data() + std::size_t(p) * std::size_t(width), width, row);
    }
    return m;
}

Matrix quantisedRows(const QuantScheme& scheme, const std::vector<float>& values, std::int64_t positions, int heads,
                     int dim, bool isK)
{
    Matrix out(int(positions), heads * dim);
    const std::vector<std::uint8_t> present(std::size_t(positions), 1);
    QuantiseInput in;
    in.values = values.data();
    in.present = present.data();
    in.seq = positions;
    in.heads = heads;
    in.dim = dim;
    in.isK = isK;
    // vLLM's static scales take the warm-up batch's amax: here the prompt's own.
    for (std::size_t i = 0; i < std::size_t(positions) * std::size_t(heads * dim); ++i)
        in.warmupAmax = std::max(in.warmupAmax, std::fabs(values[i]));
    quantise(scheme, in, out.values.data());
    return out;
}

}  // namespace

double klDivergence(const float* referenceLogits, const float* otherLogits, int vocab)
{
    const auto logSumExp = [vocab](const float* x) {
        const double top = *std::max_element(x, x + vocab);
        double sum = 0;
        for (int i = 0; i < vocab; ++i)
            sum += detmath::exp(double(x[i]) - top);
        return top + detmath::log(sum);
    };
    const double lp = logSumExp(referenceLogits), lq = logSumExp(otherLogits);
    double kl = 0;
    for (int i = 0; i < vocab; ++i) {
        const double logP = double(referenceLogits[i]) - lp, logQ = double(otherLogits[i]) - lq;
        kl += detmath::exp(logP) * (logP - logQ);
    }
    return std::max(kl, 0.0);  // rounding may leave -1e-17 where the two are the same
}

namespace {

// The caches one prompt's transplants read: the model's own run over its tokens, and the
// engine's, the baseline's and the quantised KV of each attention layer.
PromptRun prepareRun(const TinyTransformer& model, const CaptureLoader& loader, const PromptInfo& p,
                     const std::vector<std::string>& attentionLayers, const std::vector<QuantScheme>& schemes)
{
    const ModelShape& shape = model.shape();
    PromptRun run;
    run.id = p.id;
    run.steps = int(p.teacherTokens.size());
    run.first = p.promptLen - 1;
    std::vector<std::int64_t> tokens = p.inputIds;
    tokens.insert(tokens.end(), p.teacherTokens.begin(), p.teacherTokens.end() - 1);  // the last is never fed
    const std::int64_t positions = std::int64_t(tokens.size());
    std::vector<Matrix> residuals;
    model.forward(tokens, 0, run.reference, Numerics::Expected, {}, 0, &residuals);
    for (const Matrix& x : residuals) {
        Matrix rows(run.steps, x.cols);
        std::copy_n(x.row(int(run.first)), rows.values.size(), rows.values.begin());
        run.residuals.push_back(std::move(rows));
    }
    for (const std::string& name : attentionLayers) {
        const int l = layerIndex(name);
        const LayerCache& own = run.reference[std::size_t(l)];
        const LayerKv kv = loader.engineLayer(p.id, name);
        run.engine.emplace(l, model.cacheOf(l, rowsOf(kv, KvPart::K, own.k, positions),
                                            rowsOf(kv, KvPart::V, own.v, positions), Numerics::Expected));
        if (p.hasBaseline) {
            const LayerKv base = loader.referenceLayer(p.id, ReferenceRole::Baseline, name);
            run.baseline.emplace(l, model.cacheOf(l, rowsOf(base, KvPart::K, own.k, positions),
                                                  rowsOf(base, KvPart::V, own.v, positions), Numerics::Expected));
        }
        for (const QuantScheme& scheme : schemes)
            run.quantised.emplace(std::pair(l, scheme.name()),
                                  model.cacheOf(l, quantisedRows(scheme, own.k, positions, shape.kvHeads, shape.headDim, true),
                                                quantisedRows(scheme, own.v, positions, shape.kvHeads, shape.headDim, false),
                                                Numerics::Expected));
    }
    std::vector<TinyTransformer::PastRead> reads;
    for (const LayerCache& c : run.reference)
        reads.push_back({&c, false});
    run.referenceLogits = model.decodeSteps(run.residuals[0], run.first, 0, reads, Numerics::Expected);
    return run;
}

// Every transplant of one prompt, in parallel over the team.
ImpactRecord measure(const TinyTransformer& model, const PromptRun& run, const std::vector<std::string>& attentionLayers,
                     const std::vector<QuantScheme>& schemes, WorkTeam& team)
{
    std::vector<Transplant> transplants;
    for (const std::string& layer : attentionLayers) {
        transplants.push_back({TransplantKind::Layer, layer, {}});
        transplants.push_back({TransplantKind::From, layer, {}});
        if (!run.baseline.empty()) {
            transplants.push_back({TransplantKind::Baseline, layer, {}});
            transplants.push_back({TransplantKind::BaselineFrom, layer, {}});
        }
        for (const QuantScheme& scheme : schemes)
            transplants.push_back({TransplantKind::Scheme, layer, scheme.name()});
    }
    const int vocab = run.referenceLogits.cols;
    std::vector<std::vector<double>> kl(transplants.size());
    std::vector<std::vector<std::int8_t>> changed(transplants.size());
    team.run(int(transplants.size()), [&](int index, int) {
        const std::size_t t = std::size_t(index);
        const Transplant& tr = transplants[t];
        const int first = layerIndex(tr.layer);
        const bool onward = tr.kind == TransplantKind::From || tr.kind == TransplantKind::BaselineFrom;
        const bool baseline = tr.kind == TransplantKind::Baseline || tr.kind == TransplantKind::BaselineFrom;
        std::vector<TinyTransformer::PastRead> reads;
        for (int l = 0; l < model.shape().layers; ++l) {
            const bool replaced = l == first || (onward && l > first && run.engine.count(l));
            const LayerCache* past = &run.reference[std::size_t(l)];
            if (replaced)
                past = tr.kind == TransplantKind::Scheme ? &run.quantised.at({l, tr.scheme})
                       : baseline                         ? &run.baseline.at(l)
                                                          : &run.engine.at(l);
            reads.push_back({past, replaced});
        }
        const Matrix logits =
            model.decodeSteps(run.residuals[std::size_t(first)], run.first, first, reads, Numerics::Expected);
        if (!std::all_of(logits.values.begin(), logits.values.end(), [](float v) { return std::isfinite(v); }))
            return;  // a NaN or infinity reached the output: left out
        for (int g = 0; g < run.steps; ++g) {
            kl[t].push_back(klDivergence(run.referenceLogits.row(g), logits.row(g), vocab));
            changed[t].push_back(argmax(run.referenceLogits.row(g), vocab) != argmax(logits.row(g), vocab));
        }
    });
    ImpactRecord record;
    record.computedBy = "kvscope synth";
    record.steps = run.steps;
    for (std::size_t t = 0; t < transplants.size(); ++t) {
        if (kl[t].empty())
            continue;
        record.transplants.push_back(transplants[t]);
        record.kl.insert(record.kl.end(), kl[t].begin(), kl[t].end());
        record.top1Changed.insert(record.top1Changed.end(), changed[t].begin(), changed[t].end());
    }
    return record;
}

}  // namespace

void addImpact(const std::string& path, const TinyTransformer& model, const ModelCaptureOptions& o)
{
    const auto started = std::chrono::steady_clock::now();
    const ModelShape& shape = model.shape();
    std::vector<QuantScheme> schemes;
    if (!shape.mla())
        for (const std::string& name : o.impactSchemes) {
            std::string error;
            const std::optional<QuantScheme> scheme = parseScheme(name, error);
            if (!scheme)
                throw std::invalid_argument("impact scheme '" + name + "': " + error);
            schemes.push_back(*scheme);
        }
    WorkTeam team(std::max(1, o.threads > 0 ? o.threads : int(std::thread::hardware_concurrency())));
    std::map<std::string, ImpactRecord> records;
    {
        const auto reader = std::make_shared<BundleReader>(path);
        const CaptureLoader loader(reader);
        std::vector<std::string> attentionLayers;  // in model order: the layers whose KV the capture holds
        for (const std::string& name : reader->config().layerNames())
            if (!shape.isMamba(layerIndex(name)) &&
                reader->config().groups[std::size_t(reader->config().groupOf(name))].specType != SpecType::NotCompared)
                attentionLayers.push_back(name);
        std::sort(attentionLayers.begin(), attentionLayers.end(),
                  [](const std::string& a, const std::string& b) { return layerIndex(a) < layerIndex(b); });
        for (const PromptInfo& p : reader->prompts())  // one prompt's caches in memory at a time
            if (!p.teacherTokens.empty())
                records[p.id] = measure(model, prepareRun(model, loader, p, attentionLayers, schemes), attentionLayers,
                                        schemes, team);
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    Hdf5File file = Hdf5File::openForUpdate(path);  // (the reader closed: libhdf5 opens a file once)
    for (auto& [id, record] : records) {
        record.seconds = seconds;
        writeImpact(file, id, record);
    }
}

}  // namespace kvscope::synth
