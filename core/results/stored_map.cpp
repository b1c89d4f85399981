#include "results/stored_map.h"

#include "analysis/off_floor.h"

#include "analysis/heatmap_pyramid.h"
#include "format/hdf5_file.h"
#include "results/compressed_chunk.h"
#include "results/results_file.h"

#include <cmath>
#include <mutex>

namespace kvscope {

namespace {

constexpr std::int64_t kMapChunkColumns = 4096;  // a window of a screen or two reads a chunk or two a row

const char* mapMetricKey(HeatmapMetric metric)
{
    switch (metric) {
    case HeatmapMetric::RelLinf: return "linf";
    case HeatmapMetric::RelL2: return "l2";
    case HeatmapMetric::OneMinusCos: return "one_minus_cos";
    case HeatmapMetric::ErrorRatio: return "error_ratio";
    case HeatmapMetric::Bc: return "bc";
    case HeatmapMetric::BcVsNoise: return "bc_vs_noise";
    }
    return "?";
}

// BCs are one value a layer and token: no head behind them.
bool perHeadMap(HeatmapMetric metric)
{
    return metric != HeatmapMetric::Bc && metric != HeatmapMetric::BcVsNoise;
}

std::string valuesName(const std::string& group, int level)
{
    return group + "/values_" + std::to_string(level);
}

std::string headsName(const std::string& group, int level)
{
    return group + "/heads_" + std::to_string(level);
}

}  // namespace

std::vector<HeatmapSpec> storedMapSpecs(const PromptAnalysis& p, const RecordedOptions& options)
{
    std::vector<HeatmapMetric> metrics{HeatmapMetric::RelLinf, HeatmapMetric::RelL2, HeatmapMetric::OneMinusCos};
    if (p.threeWay) {
        metrics.push_back(HeatmapMetric::ErrorRatio);
        if (options.bc) {
            metrics.push_back(HeatmapMetric::Bc);
            metrics.push_back(HeatmapMetric::BcVsNoise);
        }
    }
    std::vector<HeatmapSpec> specs;
    for (HeatmapMetric metric : metrics)
        for (KvPart part : {KvPart::K, KvPart::V})
            specs.push_back(HeatmapSpec{metric, part, HeadReductionKind::Max, 0});
    return specs;
}

int storedMapLevels(std::int64_t tokens)
{
    int levels = 1;
    while (pyramidLevelColumns(tokens, levels - 1) > kStoredMapTopColumns)
        ++levels;
    return levels;
}

namespace results_path {
std::string map(std::size_t promptIndex, const HeatmapSpec& spec)
{
    return prompt(promptIndex) + "/map/" + mapMetricKey(spec.metric) + "_" + kvPartName(spec.part);
}
}  // namespace results_path

void createStoredMaps(Hdf5File& file, std::size_t index, const PromptAnalysis& p, const RecordedOptions& options)
{
    const std::int64_t layers = std::int64_t(p.layers.size());
    for (const HeatmapSpec& spec : storedMapSpecs(p, options)) {
        const std::string group = results_path::map(index, spec);
        for (int level = 0; level < storedMapLevels(p.tokens); ++level) {
            const std::vector<std::int64_t> shape{layers, pyramidLevelColumns(p.tokens, level)};
            file.createCompressedFloats(valuesName(group, level), shape, {1, kMapChunkColumns});
            if (perHeadMap(spec.metric))  // (small integers as floats: shuffled, they compress to almost nothing)
                file.createCompressedFloats(headsName(group, level), shape, {1, kMapChunkColumns});
        }
    }
}

void writeStoredMapLayer(Hdf5File& file, std::size_t index, const PromptAnalysis& p, const RecordedOptions& options,
                         int layer)
{
    for (const HeatmapSpec& spec : storedMapSpecs(p, options)) {
        HeatmapGrid row;
        row.rows = 1;
        row.columns = p.tokens;
        row.values.resize(std::size_t(p.tokens));
        row.heads.resize(std::size_t(p.tokens));
        for (std::int64_t t = 0; t < p.tokens; ++t) {
            int head = -1;
            row.values[std::size_t(t)] = heatmapValue(p, spec, layer, t, &head);
            row.heads[std::size_t(t)] = std::int16_t(head);
        }
        const HeatmapPyramid pyramid(std::move(row), lowerIsWorse(spec.metric));
        const std::string group = results_path::map(index, spec);
        for (int level = 0; level < storedMapLevels(p.tokens); ++level) {
            const HeatmapGrid& g = pyramid.level(level);
            writeCompressedLayer(file, valuesName(group, level), g.values.data(), g.columns, 0, kMapChunkColumns, layer);
            if (perHeadMap(spec.metric)) {
                const std::vector<float> heads(g.heads.begin(), g.heads.end());
                writeCompressedLayer(file, headsName(group, level), heads.data(), g.columns, 0, kMapChunkColumns, layer);
            }
        }
    }
}

void writeStoredMapRanges(Hdf5File& file, std::size_t index, const PromptAnalysis& p, const RecordedOptions& options)
{
    for (const HeatmapSpec& spec : storedMapSpecs(p, options)) {
        if (scaleOf(spec.metric) == ScaleKind::Ratio && p.threeWay) {
            // Drawn in units of the map's off threshold (off_floor.h), one for every layer three-way
            // (the suspects' layers take theirs when the map is shown: useSuspectThresholds).
            std::int64_t tested = 0;
            for (std::int64_t n : finiteCells(p, nullptr))
                tested += n;
            const double threshold =
                layerOffThresholds(p, options.suspects, std::int64_t(double(tested) * kMapNoiseCaptures), nullptr).front();
            const std::lock_guard lock(hdf5Mutex());
            file.writeDoubleAttribute(results_path::map(index, spec), "off_threshold", threshold);
        }
        if (scaleOf(spec.metric) != ScaleKind::Error)
            continue;
        // One pass over the cells: the linear range is the logarithmic one from 0 (map_spec.h).
        const ValueRange logarithmic = kvscope::dataRange(p, spec, true);
        const ValueRange linear{0.0, logarithmic.upper};
        const std::string group = results_path::map(index, spec);
        const std::lock_guard lock(hdf5Mutex());
        file.writeDoubleAttribute(group, "range_lower", linear.lower);
        file.writeDoubleAttribute(group, "range_upper", linear.upper);
        file.writeDoubleAttribute(group, "log_range_lower", logarithmic.lower);
        file.writeDoubleAttribute(group, "log_range_upper", logarithmic.upper);
    }
}

std::optional<StoredMap> StoredMap::open(const std::string& path, std::size_t index, const HeatmapSpec& spec, int layers,
                                         std::int64_t tokens)
{
    if (spec.reduction != HeadReductionKind::Max && perHeadMap(spec.metric))
        return std::nullopt;
    StoredMap m;
    m.m_group = results_path::map(index, HeatmapSpec{spec.metric, spec.part, HeadReductionKind::Max, 0});
    m.m_rows = layers;
    m.m_tokens = tokens;
    m.m_levels = storedMapLevels(tokens);
    m.m_perHead = perHeadMap(spec.metric);
    m.m_lowerWorse = lowerIsWorse(spec.metric);
    const std::lock_guard lock(hdf5Mutex());
    // (closed under the HDF5 lock, on whichever thread lets the map go last)
    m.m_file = std::shared_ptr<Hdf5File>(new Hdf5File(Hdf5File::openReadOnly(path)), [](Hdf5File* f) {
        const std::lock_guard closing(hdf5Mutex());
        delete f;
    });
    Hdf5File& file = *m.m_file;
    file.setChecksumsRequired(true);
    if (!file.exists(m.m_group))
        return std::nullopt;  // a map the analysis had no data for (or a file written before maps were kept)
    for (int level = 0; level < m.m_levels; ++level) {
        const std::vector<std::int64_t> shape{layers, pyramidLevelColumns(tokens, level)};
        std::vector<std::string> datasets{valuesName(m.m_group, level)};
        if (m.m_perHead)
            datasets.push_back(headsName(m.m_group, level));
        for (const std::string& d : datasets) {
            if (!file.exists(d))
                file.fail(d, "missing: the map keeps " + std::to_string(m.m_levels) + " levels; the file is damaged");
            const DatasetInfo info = file.datasetInfo(d);
            if (info.shape != shape || info.typeClass != H5T_FLOAT || info.typeSize != 4)
                file.fail(d, "must be float32 of shape " + shapeToString(shape) + ", as the record says");
        }
    }
    if (scaleOf(spec.metric) == ScaleKind::Ratio && file.hasAttribute(m.m_group, "off_threshold")) {
        m.m_offThreshold = file.readDoubleAttribute(m.m_group, "off_threshold");
        if (!std::isfinite(*m.m_offThreshold) || !(*m.m_offThreshold > 0))
            file.fail(m.m_group, "holds an off threshold that is not a positive number: the file is damaged");
    }
    if (scaleOf(spec.metric) == ScaleKind::Error) {
        for (const char* name : {"range_lower", "range_upper", "log_range_lower", "log_range_upper"})
            if (!file.hasAttribute(m.m_group, name))
                file.fail(m.m_group, std::string("has no attribute '") + name + "': the file is damaged");
        m.m_range = ValueRange{file.readDoubleAttribute(m.m_group, "range_lower"),
                               file.readDoubleAttribute(m.m_group, "range_upper")};
        m.m_logRange = ValueRange{file.readDoubleAttribute(m.m_group, "log_range_lower"),
                                  file.readDoubleAttribute(m.m_group, "log_range_upper")};
        for (const ValueRange& r : {*m.m_range, *m.m_logRange})
            if (!std::isfinite(r.lower) || !std::isfinite(r.upper) || !(r.lower < r.upper))
                file.fail(m.m_group, "holds a colour range that is not an interval: the file is damaged");
    }
    return m;
}

std::optional<ValueRange> StoredMap::dataRange(bool logarithmic) const
{
    return logarithmic ? m_logRange : m_range;
}

HeatmapGrid StoredMap::window(std::int64_t from, std::int64_t to, std::int64_t maxColumns) const
{
    if (m_rows == 0 || m_tokens == 0)
        return {};
    const PyramidWindow w = planPyramidWindow(m_tokens, m_levels, from, to, maxColumns);
    HeatmapGrid read;
    read.rows = m_rows;
    read.columns = w.last - w.first;
    read.tokensPerColumn = std::int64_t(1) << w.level;
    read.firstToken = w.first * read.tokensPerColumn;
    read.values.resize(std::size_t(read.rows) * std::size_t(read.columns));
    std::vector<float> heads(m_perHead ? read.values.size() : 0);
    {
        const std::lock_guard lock(hdf5Mutex());
        const std::vector<std::int64_t> start{0, w.first}, count{m_rows, read.columns};
        m_file->readSlab(valuesName(m_group, w.level), H5T_NATIVE_FLOAT, read.values.data(), start, count);
        if (m_perHead)
            m_file->readSlab(headsName(m_group, w.level), H5T_NATIVE_FLOAT, heads.data(), start, count);
    }
    read.heads.assign(read.values.size(), -1);
    for (std::size_t i = 0; i < heads.size(); ++i)  // (a damaged head index shows as none, never out of range)
        if (std::isfinite(heads[i]) && heads[i] >= 0 && heads[i] < 32768)
            read.heads[i] = std::int16_t(heads[i]);
    return poolRuns(read, 0, read.columns, w.run, m_lowerWorse);
}

}  // namespace kvscope
