#include "format/recurrent_state.h"

#include <algorithm>
#include <map>
#include <set>

namespace kvscope {

bool isStateDType(DType dtype)
{
    return dtype == DType::Float32 || dtype == DType::BFloat16 || dtype == DType::Float16;
}

namespace {

std::vector<std::int64_t> trailing(const std::vector<std::int64_t>& shape)
{
    return {shape.begin() + std::min<std::ptrdiff_t>(2, std::ptrdiff_t(shape.size())), shape.end()};
}

std::string rankName(std::size_t rank, bool engine)
{
    return engine ? "rank " + std::to_string(rank) + ", " : std::string();
}

}  // namespace

std::string stateRecordProblem(const LayerStateRecord& record, bool engine)
{
    const auto& positions = record.positions;
    if (positions.empty())
        return "no checkpoint positions";
    for (std::size_t i = 0; i < positions.size(); ++i)
        if (positions[i] < 1 || (i > 0 && positions[i] <= positions[i - 1]))
            return "positions must increase from at least 1 (checkpoint " + std::to_string(i) + " is " +
                   std::to_string(positions[i]) + ")";
    if (record.ranks.empty() || record.ranks[0].empty())
        return engine ? "no rank holds a part" : "no part";
    if (!engine && record.ranks.size() != 1)
        return "a reference's state is whole: one set of parts, not " + std::to_string(record.ranks.size());
    std::map<std::string, std::vector<std::int64_t>> trailingOf;  // part -> its trailing axes
    for (const StatePart& part : record.ranks[0])
        if (!trailingOf.emplace(part.name, trailing(part.tensor.shape)).second)
            return "part '" + part.name + "' twice";
    for (std::size_t r = 0; r < record.ranks.size(); ++r) {
        if (record.ranks[r].size() != trailingOf.size())
            return rankName(r, engine) + std::to_string(record.ranks[r].size()) + " parts, rank 0 has " +
                   std::to_string(trailingOf.size());
        for (const StatePart& part : record.ranks[r]) {
            const std::string where = rankName(r, engine) + "part '" + part.name + "': ";
            const auto it = trailingOf.find(part.name);
            if (part.name.empty() || part.name.find('/') != std::string::npos || part.name.size() > 64)
                return where + "not a name a bundle can hold";
            if (it == trailingOf.end())
                return where + "rank 0 has no such part";
            const RawTensor& t = part.tensor;
            if (!isStateDType(t.dtype))
                return where + "dtype " + dtypeName(t.dtype) + " (a state is float32, bfloat16 or float16)";
            if (t.shape.size() < 2 || t.shape[0] != std::int64_t(positions.size()) || t.shape[1] < 1)
                return where + "shape " + shapeToString(t.shape) + " is not [" + std::to_string(positions.size()) +
                       " checkpoints, units, ...]";
            if (trailing(t.shape) != it->second)
                return where + "shape " + shapeToString(t.shape) + ": its trailing axes differ from rank 0's";
            if (t.bytes.size() != std::size_t(t.numel()) * dtypeSize(t.dtype))
                return where + std::to_string(t.bytes.size()) + " bytes for shape " + shapeToString(t.shape);
            if (!t.scales.empty() || t.scale != 1.0f)
                return where + "a state carries no scales";
            if (engine && std::int64_t(part.units.size()) != t.shape[1])
                return where + std::to_string(part.units.size()) + " units listed for " + std::to_string(t.shape[1]) + " rows";
            if (!engine && !part.units.empty())
                return where + "a reference's rows are its units: no units list";
            if (std::set<std::int64_t>(part.units.begin(), part.units.end()).size() != part.units.size())
                return where + "a unit listed twice";
        }
    }
    return {};
}

std::string stateMismatchProblem(const LayerStateRecord& engine, const LayerStateRecord& reference)
{
    std::map<std::string, const StatePart*> whole;
    for (const StatePart& part : reference.ranks.at(0))
        whole[part.name] = &part;
    if (whole.size() != engine.ranks.at(0).size())
        return "the engine has " + std::to_string(engine.ranks[0].size()) + " parts, the reference " +
               std::to_string(whole.size());
    for (const StatePart& part : engine.ranks[0]) {
        const auto it = whole.find(part.name);
        if (it == whole.end())
            return "part '" + part.name + "': the reference has no such part";
        const std::vector<std::int64_t>& shape = it->second->tensor.shape;
        if (trailing(part.tensor.shape) != trailing(shape))
            return "part '" + part.name + "': engine " + shapeToString(part.tensor.shape) + " and reference " +
                   shapeToString(shape) + " differ past the units";
        std::vector<bool> held(std::size_t(shape[1]), false);
        for (std::size_t r = 0; r < engine.ranks.size(); ++r)
            for (const StatePart& rankPart : engine.ranks[r])
                if (rankPart.name == part.name)
                    for (std::int64_t u : rankPart.units) {
                        if (u < 0 || u >= shape[1])
                            return "rank " + std::to_string(r) + ", part '" + part.name + "': unit " + std::to_string(u) +
                                   " outside the reference's " + std::to_string(shape[1]);
                        held[std::size_t(u)] = true;
                    }
        const auto missing = std::find(held.begin(), held.end(), false);
        if (missing != held.end())
            return "part '" + part.name + "': unit " + std::to_string(missing - held.begin()) + " is held by no rank";
    }
    return {};
}

}  // namespace kvscope
