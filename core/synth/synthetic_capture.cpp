#include "synth/synthetic_capture.h"

#include "format/bundle_writer.h"
#include "util/deterministic_math.h"
#include "kv/paged_layout.h"

#include <cmath>
#include <stdexcept>
#include <random>

namespace kvscope {

namespace {

std::string layerName(int i)
{
    return "model.layers." + std::to_string(i) + ".self_attn";
}

bool isSliding(const SyntheticCaptureOptions& o, int layer)
{
    return o.alternateSliding && layer % 2 == 0;
}

int headDimOf(const SyntheticCaptureOptions& o, int layer)
{
    return isSliding(o, layer) && o.slidingHeadDim > 0 ? o.slidingHeadDim : o.headDim;
}

int kvHeadsOf(const SyntheticCaptureOptions& o, int layer)
{
    return isSliding(o, layer) && o.slidingKvHeads > 0 ? o.slidingKvHeads : o.kvHeads;
}

KvCacheConfig syntheticConfig(const SyntheticCaptureOptions& o, std::int64_t longest)
{
    KvCacheGroup sliding, full;
    for (int i = 0; i < o.layers; ++i)
        (isSliding(o, i) ? sliding : full).layerNames.push_back(layerName(i));
    for (KvCacheGroup* g : {&sliding, &full}) {
        g->slidingWindow = o.alternateSliding ? std::optional<int>(o.slidingWindow) : std::nullopt;
        g->dtype = DType::BFloat16;
        g->totalKvHeads = g == &sliding && o.slidingKvHeads > 0 ? o.slidingKvHeads : o.kvHeads;
        g->numKvHeads = std::max(1, g->totalKvHeads / o.tpSize);
        g->headSize = g == &sliding && o.slidingHeadDim > 0 ? o.slidingHeadDim : o.headDim;
    }
    sliding.specType = SpecType::SlidingWindow;
    sliding.blockSize = o.slidingBlockSize;
    full.blockSize = o.fullBlockSize;

    KvCacheConfig config;
    // Enough blocks for every group of the longest sequence, the null block and some slack,
    // times the pool factor (other sequences' blocks).
    const std::int64_t needed = 2 + longest / o.fullBlockSize +
                                (sliding.layerNames.empty() ? 0 : longest / o.slidingBlockSize) + 8;
    config.numBlocks = int(needed * std::max(1, o.poolFactor));
    config.tpSize = o.tpSize;
    config.totalNumKvHeads = o.kvHeads;
    if (!sliding.layerNames.empty())
        config.groups.push_back(sliding);
    config.groups.push_back(full);
    return KvCacheConfig::fromJson(config.toJson(), {}, "synthetic config");  // validated as a bundle's would be
}

float bf16(float x)
{
    return detmath::roundToBf16(x);
}

struct LayerData {
    LayerKv baseline;
    LayerKv engine;
    LayerKv expected;  // with modelNoise only; otherwise the baseline, rounded when written
};

// modelNoise, fitted to the model-based synth's clean error ratios in its full-attention
// layers at 2,000-4,000 tokens (percentiles 50 / 90 / 99 / 99.9 / 99.99: K 0.9 / 2.0 / 4.1 /
// 6.5 / 9.3 floors, V 0.9 / 1.4 / 2.0 / 2.6 / 3.1; this generator gives K 1.0 / 2.1 / 4.1 / 6.5
// / 9.1, V 0.9 / 1.4 / 2.0 / 2.6 / 3.3) and to its two-way drift (a few unit roundoffs of
// relative L2 at layer 0, about 20 at layer 79). The errors are bounded, as sums of a few
// roundings are; their spread is the engine's log-normal factor per token and head, which the
// ratios turned out to follow closely (a straight line on log-probability paper).
constexpr double kNoiseUnitRoundoffs = 1.5;        // the errors' RMS, in bf16 unit roundoffs, times sqrt(layer + 1)
constexpr double kEngineMedian = 0.82;             // the engine's factor: its median
constexpr double kEngineSpread[2] = {0.67, 0.38};  // and the sigma of its logarithm, [K/V]

// Adds model noise to `d`: expected and the engine each the baseline plus an error of their own.
void addModelNoise(const SyntheticCaptureOptions& o, std::size_t prompt, int layer, LayerData& d)
{
    const std::uint64_t seed = o.seed * 2000003 + prompt * 6151 + std::uint64_t(layer) * 7907 + 1;
    detmath::SplitMix64 bits(seed);
    detmath::NormalSampler n01(seed + 1);
    // Uniform on [-sqrt(3), sqrt(3)) times the RMS: bounded, with that RMS.
    const double rms = kNoiseUnitRoundoffs * std::sqrt(double(layer) + 1.0) / 256.0;  // bf16: 2^-8
    const auto error = [&](double size) { return float(size * 1.7320508075688772 * (2.0 * bits.uniform() - 1.0)); };
    d.expected = d.baseline;
    for (KvPart part : {KvPart::K, KvPart::V}) {
        const FloatBuffer& base = d.baseline.values(part);
        FloatBuffer& expected = d.expected.values(part);
        FloatBuffer& engine = d.engine.values(part);
        const std::size_t dim = std::size_t(d.baseline.headDim(part));
        for (std::size_t row = 0; row < base.size(); row += dim) {  // one head at one position
            const double factor = kEngineMedian * detmath::exp(kEngineSpread[std::size_t(part)] * n01());
            for (std::size_t i = row; i < row + dim; ++i) {
                expected[i] = bf16(base[i] + error(rms));
                engine[i] = bf16(base[i] + error(rms * factor));
            }
        }
    }
}

// One layer of one prompt, every position present, regenerated identically from its seed.
LayerData generateLayer(const SyntheticCaptureOptions& o, std::size_t prompt, int layer, std::int64_t promptLen,
                        std::int64_t seqLen)
{
    detmath::NormalSampler n01(o.seed * 1000003 + prompt * 7919 + std::uint64_t(layer) * 104729);
    const int dim = headDimOf(o, layer);
    const int heads = kvHeadsOf(o, layer);
    LayerData d{LayerKv::absent(heads, seqLen, dim), LayerKv::absent(heads, seqLen, dim), {}};
    std::fill(d.baseline.present.begin(), d.baseline.present.end(), 1);
    std::fill(d.engine.present.begin(), d.engine.present.end(), 1);
    for (std::size_t i = 0; i < d.baseline.k.size(); ++i) {
        const int channel = int(i % std::size_t(dim));
        d.baseline.k[i] = float(n01()) * (channel % 11 == 3 ? 8.0f : 1.0f);
        d.baseline.v[i] = float(n01());
        // A perturbation well below bf16's resolution changes some roundings only.
        d.engine.k[i] = bf16(d.baseline.k[i] * (1.0f + 1e-3f * float(n01())));
        d.engine.v[i] = bf16(d.baseline.v[i] * (1.0f + 1e-3f * float(n01())));
    }
    if (o.modelNoise)
        addModelNoise(o, prompt, layer, d);
    if (layer == o.faultLayer && o.faultOtherLayer && layer > 0) {
        SyntheticCaptureOptions clean = o;
        clean.faultLayer = -1;
        d.engine = generateLayer(clean, prompt, layer - 1, promptLen, seqLen).engine;
    } else if (layer == o.faultLayer)
        for (std::int64_t pos = promptLen + o.faultPosition; pos < seqLen; ++pos)
            for (int c = 0; c + 1 < dim; c += 2) {
                // RoPE rotated by one position too many: pair i turns by 10000^(-2i/dim).
                float* k = d.engine.k.data() + d.engine.index(KvPart::K, o.faultHead, pos) + c;
                double sinA = 0, cosA = 0;
                detmath::sinCos(detmath::exp(-double(c) / dim * 9.21034037197618273607), sinA, cosA);  // ln 10000
                const float a = k[0], b = k[1], s = float(sinA), co = float(cosA);
                k[0] = bf16(a * co - b * s);
                k[1] = bf16(a * s + b * co);
            }
    return d;
}

}  // namespace

SyntheticCaptureOptions demoCaptureOptions()
{
    SyntheticCaptureOptions o;
    o.model = "kvscope-demo (synthetic, 8 layers)";
    return o;
}

SyntheticCaptureOptions llama70bShape(int tokens, int layers)
{
    SyntheticCaptureOptions o;
    o.model = "synthetic, shaped like Llama-3.3-70B (" + std::to_string(layers) + " layers)";
    o.layers = layers;
    o.alternateSliding = false;
    o.kvHeads = 8;
    o.headDim = 128;
    o.tpSize = 8;
    o.fullBlockSize = 16;
    o.promptLens = {tokens / 2};
    o.decodeTokens = tokens - tokens / 2;
    o.faultLayer = -1;
    o.divergence = -1;
    o.poolFactor = 4;
    o.tablePadding = 8;
    return o;
}

SyntheticCaptureOptions modelFreeOf(const synth::ModelCaptureOptions& o)
{
    if (o.fault != synth::FaultKind::None && o.fault != synth::FaultKind::RopeOffset && o.fault != synth::FaultKind::OtherLayer)
        throw std::invalid_argument("--model-free injects none, rope_offset or other_layer only");
    if (o.kvDtype != DType::BFloat16 || o.dcpSize != 1 || o.shape.mla() || !o.stateSpaceLayers.empty() || o.hybrid ||
        o.shape.chunked || !o.slidingWindowSpec)
        throw std::invalid_argument("--model-free writes bf16 caches of sliding and full layers only "
                                    "(no --kv-dtype, --dcp, --mla, --spec, --state-space-layers or --hybrid)");
    SyntheticCaptureOptions m;
    m.model = "kvscope-synth, model-free (" + std::to_string(o.shape.layers) + " layers)";
    m.layers = o.shape.layers;
    m.kvHeads = o.shape.kvHeads;
    m.headDim = o.shape.headDim;
    m.tpSize = o.tpSize;
    m.fullBlockSize = o.fullBlockSize;
    m.slidingBlockSize = o.slidingBlockSize;
    m.slidingWindow = o.shape.window;
    m.promptLens = o.promptLens;
    m.decodeTokens = o.decodeTokens;
    m.baseline = o.baseline;
    m.seed = o.seed;
    m.modelNoise = true;
    m.divergence = -1;
    m.faultLayer = o.fault == synth::FaultKind::RopeOffset || o.fault == synth::FaultKind::OtherLayer ? std::max(0, o.faultLayer) : -1;
    m.faultOtherLayer = o.fault == synth::FaultKind::OtherLayer;
    m.faultHead = std::max(0, o.faultHead);
    m.faultPosition = o.faultStep == synth::ModelCaptureOptions::kDefaultStep ? 0 : o.faultStep;
    return m;
}

void writeSyntheticCapture(const std::string& path, const SyntheticCaptureOptions& o)
{
    std::int64_t longest = 0;
    for (int len : o.promptLens)
        longest = std::max<std::int64_t>(longest, len + o.decodeTokens);
    const KvCacheConfig config = syntheticConfig(o, longest);
    BundleMetadata meta;
    meta.model = o.model;
    meta.engine = "synthetic paged engine";
    meta.notes = "Synthetic capture: bf16 engine and reference over an fp32 baseline, made without a model.";
    meta.extra["synthetic_fault"] = o.faultLayer < 0 ? "none"
        : o.faultOtherLayer ? "other_layer layer=" + layerName(o.faultLayer) + " holds=" + layerName(std::max(0, o.faultLayer - 1))
        : "rope_offset layer=" + layerName(o.faultLayer) + " head=" + std::to_string(o.faultHead) +
              " from_decode_step=" + std::to_string(o.faultPosition);
    // The fault's rotation (interleaved pairs, base 10000), so that RoPE explanations can be tested.
    meta.extra["rope"] = R"({"theta": 10000.0, "rotary_dim": )" + std::to_string(o.headDim) + R"(, "style": "gptj"})";
    BundleWriter writer(path, meta, config);

    // Prefix caching: positions [0, shared) of every later prompt are prompt 0's, in the blocks
    // prompt 0's first snapshot wrote them to (the full-attention group's).
    const std::int64_t shared = std::int64_t(o.sharedPrefixBlocks) * o.fullBlockSize;
    const std::size_t fullGroup = config.groups.size() - 1;
    std::vector<std::int64_t> sharedTokens;
    std::vector<std::int32_t> sharedBlocks;
    const auto withSharedPrefix = [&](std::size_t p, int layer, LayerData d) {
        if (p == 0 || shared == 0)
            return d;
        const LayerData first = generateLayer(o, 0, layer, o.promptLens[0], o.promptLens[0] + o.decodeTokens);
        for (LayerKv* to : {&d.engine, &d.baseline, &d.expected}) {
            const LayerKv& from = to == &d.engine ? first.engine : to == &d.baseline ? first.baseline : first.expected;
            if (to->values(KvPart::K).empty())
                continue;  // no expected of its own
            for (KvPart part : {KvPart::K, KvPart::V})
                std::copy_n(from.values(part).begin(), std::size_t(shared) * from.rowSize(part), to->values(part).begin());
        }
        return d;
    };

    std::mt19937_64 rng(o.seed);
    for (std::size_t p = 0; p < o.promptLens.size(); ++p) {
        const std::string id = "prompt_" + std::to_string(p);
        const std::int64_t promptLen = o.promptLens[p];
        const std::int64_t seqLen = promptLen + o.decodeTokens;
        const std::int64_t divergence = o.divergence < 0 ? -1 : promptLen + o.divergence;
        if (shared > promptLen || (divergence >= 0 && divergence < shared))
            throw std::invalid_argument("a shared prefix must lie in every prompt, before its divergence");
        PromptRecord record;
        record.id = id;
        std::uniform_int_distribution<std::int64_t> tokens(3, 32000);
        for (std::int64_t i = 0; i < promptLen; ++i)
            record.inputIds.push_back(tokens(rng));
        if (p == 0)
            sharedTokens.assign(record.inputIds.begin(), record.inputIds.begin() + shared);
        std::copy(sharedTokens.begin(), sharedTokens.end(), record.inputIds.begin());
        for (int i = 0; i < o.decodeTokens; ++i)
            record.teacherTokens.push_back(tokens(rng));
        record.divergencePositions = divergence < 0 ? std::vector<std::int64_t>{} : std::vector<std::int64_t>{divergence};
        for (std::int64_t t : record.inputIds)
            record.tokenStrings.push_back("t" + std::to_string(t));
        for (std::int64_t t : record.teacherTokens)
            record.tokenStrings.push_back("t" + std::to_string(t));
        if (std::size_t(p) < o.provenance.size())
            record.provenance = o.provenance[std::size_t(p)];
        writer.addPrompt(record);

        // With a divergence, snapshot 0 ran one token past it: its KV there is the engine's own
        // (wrong) token. Snapshot 1 re-prefilled the teacher token and ran to the end.
        const int snapshots = divergence < 0 ? 1 : 2;
        for (int s = 0; s < snapshots; ++s) {
            const std::int64_t snapSeqLen = s + 1 < snapshots ? divergence + 2 : seqLen;
            PagedLayout layout(config, snapSeqLen, o.seed * 31 + p * 7 + std::uint64_t(s), o.tablePadding);
            for (std::int64_t b = 0; b < o.sharedPrefixBlocks; ++b) {
                if (p == 0 && s == 0)
                    sharedBlocks.push_back(layout.physicalOf(fullGroup, b));
                else if (p > 0)
                    layout.pin(fullGroup, b, sharedBlocks[std::size_t(b)]);
            }
            detmath::NormalSampler wrong(o.seed + 17 * p);
            EngineSnapshot snap = layout.snapshot(
                [&](const std::string& layer) {
                    const int index = std::stoi(layer.substr(std::string("model.layers.").size()));
                    LayerKv kv = withSharedPrefix(p, index, generateLayer(o, p, index, promptLen, seqLen)).engine;
                    if (s + 1 < snapshots)
                        for (int h = 0; h < kv.heads; ++h)
                            for (int d = 0; d < kv.headDim(KvPart::K); ++d) {
                                kv.k[kv.index(KvPart::K, h, divergence) + std::size_t(d)] = bf16(float(wrong()) * 3.0f);
                                kv.v[kv.index(KvPart::V, h, divergence) + std::size_t(d)] = bf16(float(wrong()) * 3.0f);
                            }
                    return kv;
                },
                o.keepOnlyReferencedBlocks);
            snap.validatedUntil = s + 1 < snapshots ? divergence : snapSeqLen - 1;
            writer.addSnapshot(id, snap);
        }

        for (int l = 0; l < o.layers; ++l) {
            const LayerData d = withSharedPrefix(p, l, generateLayer(o, p, l, promptLen, seqLen));
            // HF keeps only window - 1 positions of sliding-window layers.
            const std::int64_t keep = isSliding(o, l) ? std::min<std::int64_t>(seqLen, o.slidingWindow - 1) : seqLen;
            const int dim = headDimOf(o, l), heads = kvHeadsOf(o, l);
            const auto kept = [&](const LayerKv& kv, KvPart part) {
                std::vector<float> values;
                values.reserve(std::size_t(heads * keep * dim));
                for (int h = 0; h < heads; ++h)
                    for (std::int64_t pos = seqLen - keep; pos < seqLen; ++pos) {
                        const float* row = part == KvPart::K ? kv.kAt(h, pos) : kv.vAt(h, pos);
                        values.insert(values.end(), row, row + dim);
                    }
                return values;
            };
            const std::vector<std::int64_t> shape{1, heads, keep, dim};
            if (o.baseline)
                writer.addReference(id, ReferenceRole::Baseline, layerName(l),
                                    RawTensor::fromFloat(DType::Float32, shape, kept(d.baseline, KvPart::K)),
                                    RawTensor::fromFloat(DType::Float32, shape, kept(d.baseline, KvPart::V)));
            const LayerKv& expected = o.modelNoise ? d.expected : d.baseline;  // rounded to bf16 here
            writer.addReference(id, ReferenceRole::Expected, layerName(l),
                                RawTensor::fromFloat(DType::BFloat16, shape, kept(expected, KvPart::K)),
                                RawTensor::fromFloat(DType::BFloat16, shape, kept(expected, KvPart::V)));
        }
    }
    writer.finish();
}

}  // namespace kvscope
