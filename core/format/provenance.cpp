#include "format/provenance.h"

#include <nlohmann/json.hpp>

#include <stdexcept>

namespace kvscope {

namespace {

constexpr ProvenanceKind kKinds[] = {ProvenanceKind::Prefill,      ProvenanceKind::PrefixCache, ProvenanceKind::External,
                                     ProvenanceKind::Decode,       ProvenanceKind::SpecAccepted, ProvenanceKind::Recomputed,
                                     ProvenanceKind::Unknown};

std::optional<std::int64_t> optionalCount(const nlohmann::json& r, const char* key, const std::string& where)
{
    if (!r.contains(key) || r[key].is_null())
        return std::nullopt;
    if (!r[key].is_number_integer() || r[key].get<std::int64_t>() < 0)
        throw std::invalid_argument(where + ": '" + key + "' must be a non-negative integer");
    return r[key].get<std::int64_t>();
}

std::string positions(const ProvenanceRange& r)
{
    return r.end - r.start == 1 ? std::to_string(r.start) : std::to_string(r.start) + "-" + std::to_string(r.end - 1);
}

std::string blockList(const std::vector<std::int64_t>& blocks)
{
    // Runs of consecutive ids: "17-24, 30".
    std::string text;
    for (std::size_t i = 0; i < blocks.size();) {
        std::size_t j = i;
        while (j + 1 < blocks.size() && blocks[j + 1] == blocks[j] + 1)
            ++j;
        text += (text.empty() ? "" : ", ") + std::to_string(blocks[i]) + (j > i ? "-" + std::to_string(blocks[j]) : "");
        i = j + 1;
    }
    return text;
}

}  // namespace

const char* provenanceKindName(ProvenanceKind kind)
{
    switch (kind) {
    case ProvenanceKind::Prefill:
        return "prefill";
    case ProvenanceKind::PrefixCache:
        return "prefix_cache";
    case ProvenanceKind::External:
        return "external";
    case ProvenanceKind::Decode:
        return "decode";
    case ProvenanceKind::SpecAccepted:
        return "spec_accepted";
    case ProvenanceKind::Recomputed:
        return "recomputed";
    case ProvenanceKind::Unknown:
        return "unknown";
    }
    return "unknown";
}

std::optional<ProvenanceKind> provenanceKindNamed(const std::string& name)
{
    for (ProvenanceKind k : kKinds)
        if (name == provenanceKindName(k))
            return k;
    return std::nullopt;
}

std::vector<ProvenanceRange> parseProvenance(const std::string& text, std::int64_t positionCount)
{
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        throw std::invalid_argument(std::string("not JSON (") + e.what() + ")");
    }
    if (!j.is_array())
        throw std::invalid_argument("must be a list of ranges");
    std::vector<ProvenanceRange> ranges;
    for (std::size_t i = 0; i < j.size(); ++i) {
        const nlohmann::json& r = j[i];
        const std::string where = "range " + std::to_string(i);
        if (!r.is_object())
            throw std::invalid_argument(where + " is not an object");
        ProvenanceRange range;
        if (!r.contains("start") || !r["start"].is_number_integer() || !r.contains("end") || !r["end"].is_number_integer())
            throw std::invalid_argument(where + ": needs integer 'start' and 'end'");
        range.start = r["start"].get<std::int64_t>();
        range.end = r["end"].get<std::int64_t>();
        if (range.start < 0 || range.end <= range.start || range.end > positionCount)
            throw std::invalid_argument(where + ": positions " + std::to_string(range.start) + "-" + std::to_string(range.end) +
                                        " are not within the prompt's " + std::to_string(positionCount) + " positions");
        if (!ranges.empty() && range.start < ranges.back().end)
            throw std::invalid_argument(where + ": starts at " + std::to_string(range.start) + ", before the previous range ends (" +
                                        std::to_string(ranges.back().end) + "): ranges go in order and do not overlap");
        const std::string kind = r.contains("kind") && r["kind"].is_string() ? r["kind"].get<std::string>() : "";
        const std::optional<ProvenanceKind> known = provenanceKindNamed(kind);
        if (!known)
            throw std::invalid_argument(where + ": kind '" + kind +
                                        "' is not one of prefill, prefix_cache, external, decode, spec_accepted, recomputed, unknown");
        range.kind = *known;
        range.chunk = optionalCount(r, "chunk", where);
        range.step = optionalCount(r, "step", where);
        range.preemption = optionalCount(r, "preemption", where);
        if (r.contains("blocks") && !r["blocks"].is_null()) {
            if (!r["blocks"].is_array())
                throw std::invalid_argument(where + ": 'blocks' must be a list of block ids");
            for (const nlohmann::json& b : r["blocks"]) {
                if (!b.is_number_integer() || b.get<std::int64_t>() < 0)
                    throw std::invalid_argument(where + ": 'blocks' must be a list of non-negative block ids");
                range.blocks.push_back(b.get<std::int64_t>());
            }
        }
        if (r.contains("connector") && !r["connector"].is_null()) {
            if (!r["connector"].is_string())
                throw std::invalid_argument(where + ": 'connector' must be a string");
            range.connector = r["connector"].get<std::string>();
        }
        if (range.kind == ProvenanceKind::External && range.connector.empty())
            throw std::invalid_argument(where + ": an external range names its 'connector'");
        ranges.push_back(std::move(range));
    }
    return ranges;
}

const ProvenanceRange* provenanceAt(const std::vector<ProvenanceRange>& ranges, std::int64_t position)
{
    for (const ProvenanceRange& r : ranges)
        if (position >= r.start && position < r.end)
            return &r;
    return nullptr;
}

std::vector<std::string> describeProvenance(const std::vector<ProvenanceRange>& ranges)
{
    std::vector<std::string> lines;
    for (std::size_t i = 0; i < ranges.size();) {
        // Adjacent ranges of one kind that differ only in their step (decode, one a step) merge.
        ProvenanceRange merged = ranges[i];
        std::size_t j = i;
        const bool stepped = merged.step.has_value();
        while (j + 1 < ranges.size() && ranges[j + 1].start == ranges[j].end && ranges[j + 1].kind == merged.kind &&
               stepped && ranges[j + 1].step && ranges[j + 1].connector == merged.connector && ranges[j + 1].blocks.empty() &&
               merged.blocks.empty())
            merged.end = ranges[++j].end;
        std::string line = positions(merged) + " " + provenanceKindName(merged.kind);
        std::vector<std::string> details;
        if (merged.chunk)
            details.push_back("chunk " + std::to_string(*merged.chunk));
        if (!merged.blocks.empty())
            details.push_back("blocks " + blockList(merged.blocks));
        if (!merged.connector.empty())
            details.push_back(merged.connector);
        if (stepped)
            details.push_back(j > i ? "steps " + std::to_string(*ranges[i].step) + "-" + std::to_string(*ranges[j].step)
                                    : "step " + std::to_string(*merged.step));
        if (merged.preemption)
            details.push_back("after preemption " + std::to_string(*merged.preemption));
        for (std::size_t d = 0; d < details.size(); ++d)
            line += (d ? ", " : " (") + details[d] + (d + 1 == details.size() ? ")" : "");
        lines.push_back(line);
        i = j + 1;
    }
    return lines;
}

}  // namespace kvscope
