#include "analysis/state_suspects.h"

#include "kv/capture_loader.h"
#include "metrics/vector_metrics.h"
#include "util/median.h"
#include "util/short_number.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

namespace kvscope {

namespace {

double medianOf(const std::vector<float>& values)
{
    std::vector<double> v(values.begin(), values.end());
    return medianInPlace(v);
}

// A whole part's values at one checkpoint: [units][unit size].
using Checkpoint = std::vector<float>;

// A reference state's parts as floats per checkpoint: part -> [checkpoint] -> values.
struct DecodedState {
    std::string prompt;
    std::vector<std::int64_t> positions;
    std::map<std::string, std::vector<Checkpoint>> parts;
};

DecodedState decode(const std::string& prompt, const LayerStateRecord& record)
{
    DecodedState d{prompt, record.positions, {}};
    for (const StatePart& part : record.ranks.at(0)) {
        const std::int64_t size = part.tensor.numel() / part.tensor.shape[0];
        auto& checkpoints = d.parts[part.name];
        for (std::int64_t c = 0; c < part.tensor.shape[0]; ++c) {
            Checkpoint values(static_cast<std::size_t>(size));
            part.tensor.decode(c * size, size, values.data());
            checkpoints.push_back(std::move(values));
        }
    }
    return d;
}

// An off cell of the onset layer: its part, checkpoint and unit, and its ratio.
struct OffStateCell {
    std::size_t part;
    std::size_t checkpoint;
    std::int64_t unit;
    float ratio;
};

// The onset layer's state with what the hypotheses measure against.
class StateFit {
public:
    // `explained`: SuspectThresholds::explained, what "down to the floor" allows over the clean level.
    StateFit(const StateLayerAnalysis& analysis, const LayerState& state, double explained)
        : m_a(analysis), m_state(state), m_explained(explained)
    {
        for (std::size_t p = 0; p < analysis.parts.size(); ++p)
            for (std::size_t c = 0; c < analysis.positions.size(); ++c)
                for (std::int64_t u = 0; u < analysis.parts[p].units; ++u) {
                    const float r = analysis.parts[p].at(analysis.parts[p].ratio, c, u);
                    if (r > analysis.offThreshold)
                        m_off.push_back({p, c, u, r});
                    else if (std::isfinite(r))
                        m_clean.push_back(r);
                }
        // The hypotheses are about the onset checkpoint: after it the engine ran on from the
        // state it held there, and later states are that state's consequences.
        std::size_t first = analysis.positions.size();
        for (const OffStateCell& c : m_off)
            first = std::min(first, c.checkpoint);
        for (const OffStateCell& c : m_off)
            if (c.checkpoint == first)
                m_onset.push_back(c);
    }
    const std::vector<OffStateCell>& off() const { return m_off; }
    // Where a cell counts as brought back down to the floor.
    double explainedLevel() const { return cleanLevel() * m_explained; }
    const std::vector<OffStateCell>& onset() const { return m_onset; }
    // The layer's level where it is not off, in floors (at least 1): what "down to the floor" means.
    double cleanLevel() const
    {
        std::vector<float> clean = m_clean;
        return std::max(1.0, clean.empty() ? 1.0 : double(medianOf(clean)));
    }
    std::int64_t unitSize(std::size_t part) const { return m_state.parts[part].unitSize(); }
    const float* engine(std::size_t part, std::size_t checkpoint, std::int64_t unit) const
    {
        return values(m_state.parts[part].engine, part, checkpoint, unit);
    }
    const float* expected(std::size_t part, std::size_t checkpoint, std::int64_t unit) const
    {
        return values(m_state.parts[part].expected, part, checkpoint, unit);
    }
    // A cell's floor, as its ratio was taken.
    double floorOf(std::size_t part, std::size_t checkpoint, std::int64_t unit) const
    {
        const StatePartAnalysis& pa = m_a.parts[part];
        return pa.at(pa.floor, checkpoint, unit);
    }
    // How far `predicted` leaves the engine's unit, in its floors: ||engine - predicted|| over
    // the expected unit's norm, as the error itself is measured.
    double residual(const OffStateCell& c, const float* predicted) const
    {
        const std::int64_t n = unitSize(c.part);
        const float* e = engine(c.part, c.checkpoint, c.unit);
        const float* x = expected(c.part, c.checkpoint, c.unit);
        double diff = 0, norm = 0;
        for (std::int64_t i = 0; i < n; ++i) {
            diff += (double(e[i]) - predicted[i]) * (double(e[i]) - predicted[i]);
            norm += double(x[i]) * x[i];
        }
        return std::sqrt(diff) / std::max(std::sqrt(norm), kRelativeEps) / floorOf(c.part, c.checkpoint, c.unit);
    }
    const StateLayerAnalysis& analysis() const { return m_a; }
    const LayerState& state() const { return m_state; }

private:
    const float* values(const std::vector<float>& all, std::size_t part, std::size_t checkpoint, std::int64_t unit) const
    {
        const StatePartValues& p = m_state.parts[part];
        return all.data() + std::size_t((std::int64_t(checkpoint) * p.units() + unit) * p.unitSize());
    }
    const StateLayerAnalysis& m_a;
    const LayerState& m_state;
    double m_explained;
    std::vector<OffStateCell> m_off;
    std::vector<OffStateCell> m_onset;
    std::vector<float> m_clean;
};

// A hypothesis's residual over the off cells: `predict` fills a unit's prediction (false: it
// has none for that cell, which then keeps its error).
Hypothesis judge(const StateFit& fit, std::string kind, const std::function<bool(const OffStateCell&, std::vector<float>&)>& predict)
{
    Hypothesis h;
    h.kind = std::move(kind);
    std::vector<float> before, after;
    int explained = 0;
    // A cell is brought back when it is no longer off: within twice the layer's clean level, or
    // (two-way, where that allows for the drift) half the off threshold.
    const double level = std::max(fit.explainedLevel(), fit.analysis().offThreshold / 2);
    std::vector<float> predicted;
    for (const OffStateCell& c : fit.onset()) {
        predicted.assign(std::size_t(fit.unitSize(c.part)), 0.0f);
        const double r = predict(c, predicted) ? fit.residual(c, predicted.data()) : double(c.ratio);
        before.push_back(c.ratio);
        after.push_back(float(r));
        explained += r <= level;
    }
    h.errorFloors = before.empty() ? 0 : medianOf(before);
    h.residualFloors = after.empty() ? 0 : medianOf(after);
    h.explainedShare = fit.onset().empty() ? 0 : double(explained) / double(fit.onset().size());
    return h;
}

bool explains(const Hypothesis& h, const StateFit& fit)
{
    return h.residualFloors <= fit.explainedLevel() && h.explainedShare >= 0.9;
}

// One least-squares factor of `source` for `target` (a = <t, s> / <s, s>), over the cells given.
double fitFactor(const StateFit& fit, const std::vector<const OffStateCell*>& cells,
                 const std::function<const float*(const OffStateCell&)>& target,
                 const std::function<const float*(const OffStateCell&)>& source)
{
    double ts = 0, ss = 0;
    for (const OffStateCell* c : cells) {
        const float* t = target(*c);
        const float* s = source(*c);
        if (!t || !s)
            continue;
        for (std::int64_t i = 0; i < fit.unitSize(c->part); ++i) {
            ts += double(t[i]) * s[i];
            ss += double(s[i]) * s[i];
        }
    }
    return ss > 0 ? ts / ss : 0.0;
}

std::string positionText(std::int64_t position)
{
    return "position " + std::to_string(position);
}

// The candidates' checkpoint nearest in values to the engine's at one cell's checkpoint: the
// one with the least squared distance over the part's off units.
struct Nearest {
    const DecodedState* source = nullptr;
    std::size_t checkpoint = 0;
};

std::optional<Nearest> nearestCheckpoint(const StateFit& fit, std::size_t part, std::size_t checkpoint,
                                         const std::vector<DecodedState>& candidates,
                                         const std::function<bool(const DecodedState&, std::size_t)>& allowed)
{
    const std::string& name = fit.state().parts[part].name;
    const std::int64_t n = fit.unitSize(part), units = fit.state().parts[part].units();
    std::optional<Nearest> best;
    double bestDistance = std::numeric_limits<double>::infinity();
    for (const DecodedState& source : candidates) {
        const auto it = source.parts.find(name);
        if (it == source.parts.end())
            continue;
        for (std::size_t c = 0; c < it->second.size(); ++c) {
            if (!allowed(source, c) || std::int64_t(it->second[c].size()) != units * n)
                continue;
            double d = 0;
            for (std::int64_t u = 0; u < units; ++u) {
                const float* e = fit.engine(part, checkpoint, u);
                const float* s = it->second[c].data() + u * n;
                for (std::int64_t i = 0; i < n; ++i)
                    d += (double(e[i]) - s[i]) * (double(e[i]) - s[i]);
            }
            if (d < bestDistance) {
                bestDistance = d;
                best = Nearest{&source, c};
            }
        }
    }
    return best;
}

const float* unitOf(const DecodedState& s, const std::string& part, std::size_t checkpoint, std::int64_t unit, std::int64_t n)
{
    return s.parts.at(part)[checkpoint].data() + unit * n;
}

struct StateHypotheses {
    std::vector<Hypothesis> tried;  // best first
    std::optional<Hypothesis> explaining;
};

StateHypotheses testHypotheses(const StateFit& fit, const DecodedState& ownExpected, const std::vector<DecodedState>& others)
{
    const LayerState& state = fit.state();
    std::vector<Hypothesis> tried;
    const std::vector<DecodedState> own{ownExpected};  // outlives the nearest checkpoints found in it

    tried.push_back(judge(fit, "zeros", [](const OffStateCell&, std::vector<float>&) { return true; }));
    tried.back().text = "the engine's state is zero";

    // One factor per part over its off cells.
    std::map<std::size_t, double> factors;
    for (std::size_t part = 0; part < state.parts.size(); ++part) {
        std::vector<const OffStateCell*> cells;
        for (const OffStateCell& c : fit.onset())
            if (c.part == part)
                cells.push_back(&c);
        factors[part] = fitFactor(fit, cells, [&](const OffStateCell& c) { return fit.engine(c.part, c.checkpoint, c.unit); },
                                  [&](const OffStateCell& c) { return fit.expected(c.part, c.checkpoint, c.unit); });
    }
    Hypothesis scale = judge(fit, "scale", [&](const OffStateCell& c, std::vector<float>& out) {
        const float* x = fit.expected(c.part, c.checkpoint, c.unit);
        for (std::size_t i = 0; i < out.size(); ++i)
            out[i] = float(factors[c.part] * x[i]);
        return true;
    });
    const std::size_t onsetPart = fit.onset().front().part;
    scale.parameters = {{"factor", factors[onsetPart]}};
    scale.text = "the engine's " + state.parts[onsetPart].name + " state is the reference's times " +
                 shortNumber(factors[onsetPart]);
    tried.push_back(scale);

    // The state of an earlier position: the nearest of the reference's checkpoints before it.
    std::map<std::pair<std::size_t, std::size_t>, std::optional<Nearest>> stale, other;
    for (const OffStateCell& c : fit.onset()) {
        const auto key = std::pair{c.part, c.checkpoint};
        if (stale.count(key))
            continue;
        const std::int64_t position = state.positions[c.checkpoint];
        stale[key] = nearestCheckpoint(fit, c.part, c.checkpoint, own,
                                       [&](const DecodedState& s, std::size_t cp) { return s.positions[cp] < position; });
        other[key] = nearestCheckpoint(fit, c.part, c.checkpoint, others,
                                       [](const DecodedState&, std::size_t) { return true; });
    }
    auto fromNearest = [&](std::map<std::pair<std::size_t, std::size_t>, std::optional<Nearest>>& chosen) {
        return [&](const OffStateCell& c, std::vector<float>& out) {
            const std::optional<Nearest>& n = chosen[{c.part, c.checkpoint}];
            if (!n)
                return false;
            const std::int64_t size = fit.unitSize(c.part);
            const float* s = unitOf(*n->source, state.parts[c.part].name, n->checkpoint, c.unit, size);
            std::copy_n(s, size, out.begin());
            return true;
        };
    };
    const OffStateCell& first = fit.onset().front();
    if (const auto& n = stale[{first.part, first.checkpoint}]) {
        Hypothesis h = judge(fit, "state_stale", fromNearest(stale));
        const std::int64_t held = n->source->positions[n->checkpoint];
        h.parameters = {{"position", double(state.positions[first.checkpoint])}, {"holds_position", double(held)}};
        h.text = "the state at " + positionText(state.positions[first.checkpoint]) + " is the reference's after " +
                 positionText(held) + " (a stale state)";
        tried.push_back(h);
    }
    if (const auto& n = other[{first.part, first.checkpoint}]) {
        Hypothesis h = judge(fit, "state_other_request", fromNearest(other));
        const std::int64_t held = n->source->positions[n->checkpoint];
        h.parameters = {{"position", double(state.positions[first.checkpoint])}, {"holds_position", double(held)}};
        h.labels = {{"prompt", n->source->prompt}};
        h.text = "the state at " + positionText(state.positions[first.checkpoint]) + " is prompt " + n->source->prompt +
                 "'s after " + positionText(held) + " (another request's state)";
        tried.push_back(h);
    }
    // A leftover: another prompt's final state, times a factor per unit (per part where a unit is
    // too small for a factor of its own to mean anything).
    for (const DecodedState& source : others) {
        std::map<std::pair<std::size_t, std::int64_t>, double> leftover;  // (part, unit or -1) -> factor
        auto key = [&](const OffStateCell& c) { return std::pair{c.part, fit.unitSize(c.part) >= 16 ? c.unit : -1}; };
        std::map<std::pair<std::size_t, std::int64_t>, std::vector<const OffStateCell*>> groups;
        for (const OffStateCell& c : fit.onset())
            groups[key(c)].push_back(&c);
        std::vector<float> residualScratch;
        for (const auto& [k, cells] : groups) {
            const std::string& name = state.parts[k.first].name;
            leftover[k] = fitFactor(
                fit, cells,
                [&](const OffStateCell& c) {
                    residualScratch.resize(std::size_t(fit.unitSize(c.part)));
                    const float* e = fit.engine(c.part, c.checkpoint, c.unit);
                    const float* x = fit.expected(c.part, c.checkpoint, c.unit);
                    for (std::size_t i = 0; i < residualScratch.size(); ++i)
                        residualScratch[i] = e[i] - x[i];
                    return residualScratch.data();
                },
                [&](const OffStateCell& c) {
                    return unitOf(source, name, source.positions.size() - 1, c.unit, fit.unitSize(c.part));
                });
        }
        Hypothesis h = judge(fit, "state_not_reset", [&](const OffStateCell& c, std::vector<float>& out) {
            const double a = leftover[key(c)];
            if (!(a > 0))
                return false;
            const float* x = fit.expected(c.part, c.checkpoint, c.unit);
            const float* s = unitOf(source, state.parts[c.part].name, source.positions.size() - 1, c.unit, fit.unitSize(c.part));
            for (std::size_t i = 0; i < out.size(); ++i)
                out[i] = float(x[i] + a * s[i]);
            return true;
        });
        std::vector<float> factorsSeen;
        for (const auto& [k, a] : leftover)
            factorsSeen.push_back(float(a));
        const double median = medianOf(factorsSeen);
        h.parameters = {{"factor", median}};
        h.labels = {{"prompt", source.prompt}};
        h.text = "the state is the reference's plus prompt " + source.prompt + "'s final state times " +
                 shortNumber(median) + " (a state not reset)";
        if (tried.back().kind != "state_not_reset" || h.residualFloors < tried.back().residualFloors) {
            if (tried.back().kind == "state_not_reset")
                tried.pop_back();
            tried.push_back(h);
        }
    }

    // Best first; among those that explain, the own prompt's stale state before another
    // request's when they are as good (prompts with the same tokens have the same states).
    std::stable_sort(tried.begin(), tried.end(),
                     [](const Hypothesis& a, const Hypothesis& b) { return a.residualFloors < b.residualFloors; });
    StateHypotheses result;
    for (const Hypothesis& h : tried)
        if (explains(h, fit) && h.residualFloors < h.errorFloors / 2) {
            result.explaining = h;
            break;
        }
    if (result.explaining && result.explaining->kind == "state_other_request")
        for (const Hypothesis& h : tried)
            if (h.kind == "state_stale" && explains(h, fit) && h.residualFloors <= 1.1 * result.explaining->residualFloors)
                result.explaining = h;
    result.tried = std::move(tried);
    return result;
}

ErrorShape measureState(const StateFit& fit)
{
    ErrorShape shape;
    std::vector<float> cosines, sizes;
    std::map<std::string, int> partCells;
    for (const OffStateCell& c : fit.onset()) {
        const StatePartAnalysis& part = fit.analysis().parts[c.part];
        cosines.push_back(part.at(part.oneMinusCos, c.checkpoint, c.unit));
        sizes.push_back(part.at(part.sizeRatio, c.checkpoint, c.unit));
        ++partCells[part.name];
    }
    shape.cells = int(fit.onset().size());
    shape.oneMinusCos = medianOf(cosines);
    shape.sizeMin = *std::min_element(sizes.begin(), sizes.end());
    shape.sizeMax = *std::max_element(sizes.begin(), sizes.end());
    // Direction kept: the engine's units point where the reference's do (within a few floors).
    shape.directionKept = shape.oneMinusCos < 0.5 * std::pow(fit.analysis().unitRoundoff * fit.analysis().offThreshold, 2);
    shape.sizeOff = shape.sizeMin < 1 - fit.analysis().unitRoundoff * fit.analysis().offThreshold ||
                    shape.sizeMax > 1 + fit.analysis().unitRoundoff * fit.analysis().offThreshold;
    for (const auto& [name, n] : partCells)
        if (n * 10 >= shape.cells)
            shape.parts.push_back(name);
    std::ostringstream text;
    text << (shape.directionKept ? "direction kept" : "direction changed") << " (median 1 - cos "
         << shortNumber(shape.oneMinusCos) << "); size " << shortNumber(shape.sizeMin) << "-" << shortNumber(shape.sizeMax)
         << "x the reference's; parts off:";
    for (const std::string& p : shape.parts)
        text << " " << p;
    shape.text = text.str();
    return shape;
}

// The checkpoints of `a` with an off cell.
std::vector<std::size_t> offCheckpoints(const StateLayerAnalysis& a)
{
    std::vector<std::size_t> off;
    for (std::size_t c = 0; c < a.positions.size(); ++c)
        if (a.offCells(c) > 0)
            off.push_back(c);
    return off;
}

int orderOf(const std::vector<std::string>& modelOrder, const std::string& layer)
{
    const auto it = std::find(modelOrder.begin(), modelOrder.end(), layer);
    return it == modelOrder.end() ? std::numeric_limits<int>::max() : int(it - modelOrder.begin());
}

Suspect stateSuspect(const StateFit& fit, const StateHypotheses& hypotheses, const PromptAnalysis& p)
{
    const StateLayerAnalysis& a = fit.analysis();
    Suspect s;
    s.pattern = SuspectPattern::State;
    std::vector<float> ratios;
    std::vector<std::string> partsOff;
    std::vector<int> units;
    std::int64_t first = std::numeric_limits<std::int64_t>::max(), last = -1;
    const OffStateCell* worst = nullptr;
    for (const OffStateCell& c : fit.off()) {
        ratios.push_back(c.ratio);
        const std::string& name = a.parts[c.part].name;
        if (std::find(partsOff.begin(), partsOff.end(), name) == partsOff.end())
            partsOff.push_back(name);
        if (c.part == fit.off().front().part && std::find(units.begin(), units.end(), int(c.unit)) == units.end())
            units.push_back(int(c.unit));
        first = std::min(first, a.positions[c.checkpoint]);
        last = std::max(last, a.positions[c.checkpoint]);
        if (!worst || c.ratio > worst->ratio)
            worst = &c;
    }
    std::sort(units.begin(), units.end());
    s.score = medianOf(ratios);
    s.firstLayer = a.layer;
    s.layers = {a.layer};
    for (const std::string& name : partsOff)
        s.kv += (s.kv.empty() ? "" : "+") + name;
    s.heads = units;
    // A state after [0, p) sits at token p - 1: the last position it absorbed.
    s.firstToken = first - 1;
    s.lastToken = last - 1;
    s.phase = s.lastToken < p.promptLen ? "prefill" : s.firstToken >= p.promptLen ? "decode" : "both";
    s.worstLayer = -1;  // not a KV layer of the prompt
    s.worstToken = a.positions[worst->checkpoint] - 1;
    s.worstHead = int(worst->unit);
    s.prompts = {p.id};
    s.evidencePrompt = p.id;
    s.tried = hypotheses.tried;
    std::ostringstream e;
    e << a.layer << " (" << (a.kind.empty() ? "state-space" : a.kind) << " state): from " << positionText(first)
      << " on, the " << s.kv << " state is off its floor by " << shortNumber(s.score) << " floors (median of "
      << fit.off().size() << " off cells; worst " << shortNumber(worst->ratio) << " at " << a.parts[worst->part].name
      << " unit " << worst->unit << ", " << positionText(a.positions[worst->checkpoint]) << ")";
    if (hypotheses.explaining) {
        s.hypothesis = *hypotheses.explaining;
        e << ": " << s.hypothesis.text << " (" << s.hypothesis.kind << ", leaving " << shortNumber(s.hypothesis.residualFloors)
          << " floors).";
    } else {
        s.measured = measureState(fit);
        e << "; unexplained: " << s.measured->text << ".";
    }
    s.evidence = e.str();
    return s;
}

}  // namespace

void addStateSuspects(const CaptureLoader& loader, PromptAnalysis& p, const std::vector<std::string>& otherPrompts,
                      const std::vector<std::string>& modelOrder, const SuspectThresholds& thresholds)
{
    // Non-finite values first: named as the KV's are, before every finite suspect.
    std::vector<Suspect> nonFinite;
    for (const StateLayerAnalysis& a : p.states)
        if (!a.nonFinite.empty()) {
            const StateNonFinite& n = a.nonFinite.front();
            Suspect s;
            s.pattern = SuspectPattern::NonFinite;
            s.score = std::numeric_limits<double>::infinity();
            s.hypothesis.kind = "non_finite";
            s.hypothesis.text = "the " + n.side + " " + n.part + " state holds NaN or infinity";
            s.firstLayer = a.layer;
            s.layers = {a.layer};
            s.kv = n.part;
            s.heads = {int(n.unit)};
            s.firstToken = s.lastToken = s.worstToken = n.position - 1;
            s.worstHead = int(n.unit);
            s.prompts = {p.id};
            s.evidencePrompt = p.id;
            s.phase = s.firstToken < p.promptLen ? "prefill" : "decode";
            s.evidence = a.layer + ": the " + n.side + " " + n.part + " state at unit " + std::to_string(n.unit) + ", " +
                         positionText(n.position) + ", is not finite (" + std::to_string(a.nonFinite.size()) +
                         " unit(s) in this layer).";
            nonFinite.push_back(s);
        }

    // The off state layers in the model's order; the first is the onset, later ones its spread.
    std::vector<const StateLayerAnalysis*> off;
    for (const StateLayerAnalysis& a : p.states)
        if (a.problem.empty() && !offCheckpoints(a).empty())
            off.push_back(&a);
    std::sort(off.begin(), off.end(), [](auto* a, auto* b) { return a->modelIndex < b->modelIndex; });

    std::optional<Suspect> found;
    std::vector<std::string> spread;
    const StateLayerAnalysis* onset = nullptr;
    for (const StateLayerAnalysis* a : off) {
        const std::int64_t firstOff = a->positions[offCheckpoints(*a).front()] - 1;
        // Below a KV suspect's onset (later in the model, from its first token on): its spread,
        // unless a state hypothesis explains this layer on its own.
        Suspect* upstream = nullptr;
        for (Suspect& s : p.suspects)
            if (s.pattern != SuspectPattern::NonFinite && orderOf(modelOrder, s.firstLayer) < a->modelIndex &&
                s.firstToken <= firstOff && (!upstream || orderOf(modelOrder, s.firstLayer) < orderOf(modelOrder, upstream->firstLayer)))
                upstream = &s;
        if (!upstream && onset) {  // below the state onset already found
            spread.push_back(a->layer);
            continue;
        }
        LayerState state = loader.layerState(p.id, a->layer);
        groupSmallUnits(state);
        const StateFit fit(*a, state, thresholds.explained);
        if (fit.off().empty())
            continue;
        std::vector<DecodedState> others;  // the other prompts' states of this layer
        for (const std::string& id : otherPrompts)
            if (id != p.id)
                if (auto record = loader.referenceState(id, ReferenceRole::Expected, a->layer))
                    others.push_back(decode(id, *record));
        const auto own = loader.referenceState(p.id, ReferenceRole::Expected, a->layer);
        const StateHypotheses hypotheses = testHypotheses(fit, decode(p.id, *own), others);
        if (upstream && !hypotheses.explaining) {
            if (std::find(upstream->layers.begin(), upstream->layers.end(), a->layer) == upstream->layers.end()) {
                upstream->layers.push_back(a->layer);
                upstream->evidence += " The recurrent state of " + a->layer + " drifts from there on too (" +
                                      shortNumber(double(fit.off().front().ratio)) + " floors at " +
                                      positionText(a->positions[fit.onset().front().checkpoint]) + "), nothing in it explained.";
            }
            continue;
        }
        if (onset) {
            spread.push_back(a->layer);
            continue;
        }
        onset = a;
        found = stateSuspect(fit, hypotheses, p);
    }
    if (found) {
        Suspect& s = *found;
        // KV suspects below it that nothing explains, from its first token on: its spread (the
        // engine ran on from the wrong state, and every later layer saw it).
        const int at = orderOf(modelOrder, s.firstLayer);
        std::erase_if(p.suspects, [&](const Suspect& k) {
            const bool below = k.pattern != SuspectPattern::NonFinite && k.hypothesis.kind.empty() &&
                               orderOf(modelOrder, k.firstLayer) > at && k.firstToken >= s.firstToken;
            if (below) {
                for (const std::string& layer : k.layers)
                    if (std::find(spread.begin(), spread.end(), layer) == spread.end())
                        spread.push_back(layer);
            }
            return below;
        });
        std::sort(spread.begin(), spread.end(),
                  [&](const std::string& x, const std::string& y) { return orderOf(modelOrder, x) < orderOf(modelOrder, y); });
        s.layers.insert(s.layers.end(), spread.begin(), spread.end());
        if (!spread.empty())
            s.evidence += " Later layers off from there on, spread from it: " + std::to_string(spread.size()) + ".";
    }

    // In the model's order of onsets, non-finite first; the KV suspects keep their own order.
    std::vector<Suspect> merged;
    std::vector<Suspect> kvNonFinite, kvFinite;
    for (Suspect& s : p.suspects)
        (s.pattern == SuspectPattern::NonFinite ? kvNonFinite : kvFinite).push_back(std::move(s));
    merged.insert(merged.end(), kvNonFinite.begin(), kvNonFinite.end());
    merged.insert(merged.end(), nonFinite.begin(), nonFinite.end());
    if (found) {
        const int at = orderOf(modelOrder, found->firstLayer);
        auto later = std::find_if(kvFinite.begin(), kvFinite.end(),
                                  [&](const Suspect& k) { return orderOf(modelOrder, k.firstLayer) > at; });
        kvFinite.insert(later, std::move(*found));
    }
    merged.insert(merged.end(), kvFinite.begin(), kvFinite.end());
    p.suspects = std::move(merged);
}

}  // namespace kvscope
