#pragma once
// What the engine's KV does to the reference's output (docs/bundle-format.md, "Impact"): for each
// transplant (which layers read which KV) and decode step, the KL divergence of the reference's
// next-token distribution and whether its argmax changed. Written after the capture by whatever
// runs the model (kvscope synth, the capture package's `impact`), read by the analysis.

#include "format/hdf5_file.h"
#include "util/json_writer.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvscope {

enum class TransplantKind {
    Layer,   // the engine's KV in one layer
    From,    // the engine's KV in one layer and every later attention layer
    Scheme,  // the reference's own KV of one layer, quantised by a what-if scheme and decoded
    Baseline,      // the fp32 baseline reference's KV in one layer: the noise floor of Layer
    BaselineFrom,  // the same in one layer and every later attention layer: the noise floor of From
};

struct Transplant {
    TransplantKind kind = TransplantKind::Layer;
    std::string layer;
    std::string scheme;  // Scheme only: a `kvscope whatif` scheme name
    bool operator==(const Transplant&) const = default;
};

// The row's JSON ({"kind": "layer", "layer": L}, ...), and back (the problem, empty when none).
std::string transplantJson(const Transplant& transplant);
std::string parseTransplant(const std::string& json, Transplant& out);

struct ImpactRecord {
    std::string computedBy;
    double seconds = -1;  // how long the transplants took (< 0: not recorded)
    std::vector<Transplant> transplants;
    std::int64_t steps = 0;
    std::vector<double> kl;                // [transplants, steps], nats
    std::vector<std::int8_t> top1Changed;  // [transplants, steps], 0 or 1

    std::optional<std::size_t> find(const Transplant& transplant) const;
    double klAt(std::size_t transplant, std::int64_t step) const { return kl[transplant * std::size_t(steps) + std::size_t(step)]; }
    bool changedAt(std::size_t transplant, std::int64_t step) const
    {
        return top1Changed[transplant * std::size_t(steps) + std::size_t(step)] != 0;
    }
};

// What one transplant did to the next-token distribution over the decode steps of one or more
// prompts.
struct ImpactFigures {
    double klMedian = 0;  // nats, over the steps
    double klMax = 0;
    int top1Changed = 0;  // steps whose argmax changed
    int steps = 0;
};
// `transplant`'s figures over the steps of every record holding it (nullopt: none does).
std::optional<ImpactFigures> impactFigures(const std::vector<const ImpactRecord*>& records, const Transplant& transplant);
// {"kl_median", "kl_max", "top1_changed", "steps"}, or null: how every JSON writes them.
void writeImpactFigures(JsonWriter& w, const std::optional<ImpactFigures>& figures);

// What is wrong with `record` (empty when nothing): the shapes, a KL negative or not finite, a
// top-1 flag not 0 or 1, a transplant of a layer not in `layers` (the config's) or listed twice.
std::string impactRecordProblem(const ImpactRecord& record, const std::vector<std::string>& layers);

// prompts/<id>/impact in an open file: written (an existing one replaced), or read and checked
// (a problem is a BundleError naming the object).
void writeImpact(Hdf5File& file, const std::string& promptId, const ImpactRecord& record);
ImpactRecord readImpact(const Hdf5File& file, const std::string& promptId, const std::vector<std::string>& layers);
std::string impactPath(const std::string& promptId);

}  // namespace kvscope
