#include "kv/layer_state.h"

#include "format/bundle_error.h"
#include "format/bundle_reader.h"

#include <algorithm>
#include <cstring>
#include <map>

namespace kvscope {

std::int64_t StatePartValues::unitSize() const
{
    std::int64_t size = 1;
    for (std::size_t d = 2; d < shape.size(); ++d)
        size *= shape[d];
    return size;
}

std::string StateReplicaDifference::describe() const
{
    return "TP rank " + std::to_string(rank) + "'s copy of the " + part + " state of " + layer + " differs from rank " +
           std::to_string(againstRank) + "'s from unit " + std::to_string(unit) + " (at position " +
           std::to_string(position) + "; " + std::to_string(units) + " unit(s) differ)";
}

namespace {

// Indices into `from` of the checkpoints in `wanted` (each must be there).
std::vector<std::size_t> checkpointRows(const std::vector<std::int64_t>& from, const std::vector<std::int64_t>& wanted)
{
    std::vector<std::size_t> rows;
    for (std::int64_t p : wanted)
        rows.push_back(std::size_t(std::lower_bound(from.begin(), from.end(), p) - from.begin()));
    return rows;
}

const StatePart& partNamed(const std::vector<StatePart>& parts, const std::string& name)
{
    return *std::find_if(parts.begin(), parts.end(), [&](const StatePart& p) { return p.name == name; });
}

// The rows `rows` of a whole part [checkpoints, units, ...] as floats.
std::vector<float> checkpointsOf(const RawTensor& tensor, const std::vector<std::size_t>& rows)
{
    const std::int64_t size = tensor.numel() / tensor.shape[0];
    std::vector<float> values(rows.size() * std::size_t(size));
    for (std::size_t i = 0; i < rows.size(); ++i)
        tensor.decode(std::int64_t(rows[i]) * size, size, values.data() + i * std::size_t(size));
    return values;
}

}  // namespace

LayerState loadLayerState(const BundleReader& reader, const std::string& promptId, const std::string& layer)
{
    const LayerStateRecord engine = reader.readEngineState(promptId, layer);
    const auto expected = reader.readReferenceState(promptId, ReferenceRole::Expected, layer);
    const std::string expectedPath = bundle_path::referenceState(promptId, ReferenceRole::Expected, layer);
    if (!expected)
        throw BundleError(reader.path(), expectedPath, "missing: the engine's state of this layer has no expected reference");
    if (const std::string problem = stateMismatchProblem(engine, *expected); !problem.empty())
        throw BundleError(reader.path(), expectedPath, problem);
    auto baseline = reader.readReferenceState(promptId, ReferenceRole::Baseline, layer);
    if (baseline) {
        if (const std::string problem = stateMismatchProblem(engine, *baseline); !problem.empty())
            throw BundleError(reader.path(), bundle_path::referenceState(promptId, ReferenceRole::Baseline, layer), problem);
    }

    LayerState state;
    state.layer = layer;
    state.kind = engine.kind;
    for (std::int64_t p : engine.positions)
        (std::binary_search(expected->positions.begin(), expected->positions.end(), p) ? state.positions
                                                                                        : state.uncompared)
            .push_back(p);
    if (state.positions.empty())
        throw BundleError(reader.path(), expectedPath, "none of the engine's checkpoints is one of the reference's");
    state.hasBaseline = baseline && std::all_of(state.positions.begin(), state.positions.end(), [&](std::int64_t p) {
        return std::binary_search(baseline->positions.begin(), baseline->positions.end(), p);
    });
    const std::vector<std::size_t> engineRows = checkpointRows(engine.positions, state.positions);

    for (const StatePart& wholePart : expected->ranks[0]) {
        StatePartValues part;
        part.name = wholePart.name;
        part.shape = wholePart.tensor.shape;
        part.shape[0] = std::int64_t(state.positions.size());
        part.referenceDType = wholePart.tensor.dtype;
        part.expected = checkpointsOf(wholePart.tensor, checkpointRows(expected->positions, state.positions));
        if (state.hasBaseline)
            part.baseline = checkpointsOf(partNamed(baseline->ranks[0], part.name).tensor,
                                          checkpointRows(baseline->positions, state.positions));
        const std::int64_t unitSize = part.unitSize(), units = part.units();
        part.engine.assign(part.expected.size(), 0.0f);
        // unit -> the rank read for it, and that rank's row of it
        std::vector<std::pair<int, std::int64_t>> readFrom(std::size_t(units), {-1, -1});
        std::map<int, StateReplicaDifference> differences;  // by rank
        for (std::size_t r = 0; r < engine.ranks.size(); ++r) {
            const StatePart& rankPart = partNamed(engine.ranks[r], part.name);
            part.engineDType = rankPart.tensor.dtype;
            const std::vector<float> values = checkpointsOf(rankPart.tensor, engineRows);
            const std::int64_t rankUnits = rankPart.tensor.shape[1];
            const std::size_t unitBytes = std::size_t(unitSize) * dtypeSize(rankPart.tensor.dtype);
            for (std::int64_t row = 0; row < rankUnits; ++row) {
                const std::int64_t unit = rankPart.units[std::size_t(row)];
                auto& [readRank, readRow] = readFrom[std::size_t(unit)];
                if (readRank < 0) {
                    readRank = int(r);
                    readRow = row;
                    for (std::size_t c = 0; c < state.positions.size(); ++c)
                        std::copy_n(values.begin() + std::ptrdiff_t((std::int64_t(c) * rankUnits + row) * unitSize), unitSize,
                                    part.engine.begin() + std::ptrdiff_t((std::int64_t(c) * units + unit) * unitSize));
                    continue;
                }
                // A replica: the same bytes as the copy read, at every compared checkpoint.
                const StatePart& readPart = partNamed(engine.ranks[std::size_t(readRank)], part.name);
                for (std::size_t c = 0; c < state.positions.size(); ++c) {
                    const std::uint8_t* mine =
                        rankPart.tensor.bytes.data() + (engineRows[c] * std::size_t(rankUnits) + std::size_t(row)) * unitBytes;
                    const std::uint8_t* theirs = readPart.tensor.bytes.data() +
                                                 (engineRows[c] * std::size_t(readPart.tensor.shape[1]) + std::size_t(readRow)) *
                                                     unitBytes;
                    if (readPart.tensor.dtype == rankPart.tensor.dtype && std::memcmp(mine, theirs, unitBytes) == 0)
                        continue;
                    auto [it, first] = differences.try_emplace(int(r));
                    if (first)
                        it->second = {layer, part.name, int(r), readRank, unit, state.positions[c], 0};
                    ++it->second.units;
                    break;
                }
            }
        }
        for (auto& [rank, difference] : differences)
            state.replicaDifferences.push_back(difference);
        state.parts.push_back(std::move(part));
    }
    return state;
}

}  // namespace kvscope
