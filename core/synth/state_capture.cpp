#include "synth/state_capture.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

namespace kvscope::synth {

namespace {

constexpr float kNotResetFactor = 0.5f;  // the leftover's weight in state_not_reset
constexpr float kScaleFactor = 0.5f;     // state_scale

void require(bool ok, const std::string& what)
{
    if (!ok)
        throw std::invalid_argument(what);
}

// The units rank `rank` of `tp` holds of each part, as vLLM's MambaMixer2 shards them: x
// channels and heads in contiguous runs; B and C channels of the rank's groups (n_groups / tp of
// them), or of the one group, which every rank then holds (extra_groups_for_head_shards).
struct RankUnits {
    std::vector<std::int64_t> conv, ssm;
};
RankUnits unitsOfRank(const Mamba2Shape& m, int rank, int tp)
{
    RankUnits u;
    const int xPer = m.inner() / tp, headsPer = m.heads / tp;
    for (int c = rank * xPer; c < (rank + 1) * xPer; ++c)
        u.conv.push_back(c);
    const int groupsPer = m.groups == 1 ? 1 : m.groups / tp, firstGroup = m.groups == 1 ? 0 : rank * groupsPer;
    for (int part = 0; part < 2; ++part)  // B, then C
        for (int g = firstGroup; g < firstGroup + groupsPer; ++g)
            for (int i = 0; i < m.stateSize; ++i)
                u.conv.push_back(m.inner() + (part * m.groups + g) * m.stateSize + i);
    for (int h = rank * headsPer; h < (rank + 1) * headsPer; ++h)
        u.ssm.push_back(h);
    return u;
}

std::vector<Mamba2State> statesAt(const TinyTransformer& model, const LayerCache& cache, int layer,
                                  const std::vector<std::int64_t>& positions, Numerics numerics, const EngineFaults& faults)
{
    std::vector<Mamba2State> states;
    for (std::int64_t p : positions)
        states.push_back(model.stateAfter(cache, layer, p, numerics, faults));
    return states;
}

// Rows `units` of each checkpoint's part (`row` values a unit): [checkpoints, units, ...].
std::vector<float> gather(const std::vector<Mamba2State>& states, bool conv, const std::vector<std::int64_t>& units,
                          std::size_t row)
{
    std::vector<float> out;
    out.reserve(states.size() * units.size() * row);
    for (const Mamba2State& s : states) {
        const std::vector<float>& part = conv ? s.conv : s.ssm;
        for (std::int64_t u : units)
            out.insert(out.end(), part.begin() + std::ptrdiff_t(std::size_t(u) * row),
                       part.begin() + std::ptrdiff_t((std::size_t(u) + 1) * row));
    }
    return out;
}

}  // namespace

std::string mixerLayerName(int layer)
{
    return "model.layers." + std::to_string(layer) + ".mixer";
}

ModelCaptureOptions withHybridDefaults(ModelCaptureOptions o)
{
    if (!o.hybrid)
        return o;
    if (o.stateSpaceLayers.empty())
        for (int l = 0; l < o.shape.layers; l += 2)
            o.stateSpaceLayers.push_back(l);
    o.shape.mambaLayers = o.stateSpaceLayers;
    o.shape.mambaCheckpointEvery = o.fullBlockSize;
    return o;
}

void checkHybridOptions(const ModelCaptureOptions& o)
{
    if (!o.hybrid) {
        require(!isStateFault(o.fault), "fault " + faultName(o.fault) + " needs a hybrid model (--hybrid)");
        return;
    }
    const Mamba2Shape& m = o.shape.mamba;
    require(!o.shape.mla(), "a hybrid model's attention layers are GQA, not MLA");
    require(m.heads >= 1 && m.headDim >= 1 && m.stateSize >= 1 && m.groups >= 1 && m.convWidth >= 2,
            "the Mamba2 mixer needs positive heads, head_dim, d_state and groups, and a convolution at least 2 wide");
    require(m.heads % m.groups == 0, "Mamba2 heads (" + std::to_string(m.heads) + ") must be a multiple of its groups (" +
                                         std::to_string(m.groups) + ")");
    require(m.heads % o.tpSize == 0, "Mamba2 heads (" + std::to_string(m.heads) + ") must divide evenly over tp_size " +
                                         std::to_string(o.tpSize));
    require(m.groups % o.tpSize == 0 || m.groups == 1,
            "Mamba2 groups (" + std::to_string(m.groups) + ") must divide evenly over tp_size " + std::to_string(o.tpSize) +
                " or be 1 (replicated), as vLLM's MambaMixer2 requires");
    const int faultLayer = o.faultLayer >= 0 ? o.faultLayer : std::min((o.shape.layers / 2) | 1, o.shape.layers - 1);
    require(o.fault != FaultKind::OtherLayer || !o.shape.isMamba(faultLayer - 1),
            "other_layer needs an attention layer before the fault layer " + std::to_string(faultLayer) +
                " (layer " + std::to_string(faultLayer - 1) + " is a Mamba2 layer)");
}

std::vector<std::int64_t> checkpointPositions(std::int64_t positions, std::int64_t every)
{
    std::vector<std::int64_t> out;
    for (std::int64_t p = every; every > 0 && p < positions; p += every)
        out.push_back(p);
    out.push_back(positions);
    return out;
}

StateFaultPlan planStateFault(const ModelCaptureOptions& o)
{
    StateFaultPlan plan;
    plan.kind = o.fault;
    if (!isStateFault(o.fault))
        return plan;
    const std::vector<int>& mamba = o.shape.mambaLayers;
    plan.layer = o.faultLayer;
    if (plan.layer < 0)  // the Mamba2 layer nearest the middle
        plan.layer = *std::min_element(mamba.begin(), mamba.end(), [&](int a, int b) {
            return std::abs(2 * a - o.shape.layers) < std::abs(2 * b - o.shape.layers);
        });
    require(o.shape.isMamba(plan.layer), faultName(o.fault) + " needs a Mamba2 layer: layer " + std::to_string(plan.layer) +
                                             " is an attention layer");
    require(!plan.needsOtherPrompt() || o.promptLens.size() >= 2,
            faultName(o.fault) + " takes prompt_0's state into prompt_1: it needs two prompts");
    plan.prompt = plan.needsOtherPrompt() ? 1 : 0;
    const std::int64_t every = o.fullBlockSize, promptLen = o.promptLens[plan.prompt];
    const std::int64_t end = promptLen + o.decodeTokens - 1;  // the positions the engine's run absorbs
    const int shortest = *std::min_element(o.promptLens.begin(), o.promptLens.end());
    const std::int64_t step = o.faultStep != ModelCaptureOptions::kDefaultStep ? o.faultStep : -(shortest / 2);
    const std::int64_t at = std::max<std::int64_t>(promptLen + step, 1);
    plan.position = std::max((at + every - 1) / every, std::int64_t(o.fault == FaultKind::StateStale ? 2 : 1)) * every;
    require(plan.position <= end, faultName(o.fault) + " at the first checkpoint from position " + std::to_string(at) +
                                      " (a multiple of the block size " + std::to_string(every) + "): " +
                                      std::to_string(plan.position) + " is past prompt_" + std::to_string(plan.prompt) +
                                      "'s run of " + std::to_string(end) + " positions");
    const std::int64_t sourceEnd = o.promptLens[0] + o.decodeTokens - 1;
    require(o.fault != FaultKind::StateOtherRequest || plan.position <= sourceEnd,
            "state_other_request at position " + std::to_string(plan.position) + " is past prompt_0's run of " +
                std::to_string(sourceEnd) + " positions");

    nlohmann::json& t = plan.truth;
    t["kind"] = faultName(o.fault);
    t["layer"] = mixerLayerName(plan.layer);
    t["prompt"] = "prompt_" + std::to_string(plan.prompt);
    t["position"] = plan.position;
    t["checkpoint"] = plan.position / every - 1;  // in the prompt's positions
    t["parts"] = {"conv", "ssm"};
    t["engine_continues"] = true;
    switch (o.fault) {
    case FaultKind::StateStale:
        plan.source = plan.position - every;
        t["holds_position"] = plan.source;
        t["description"] = "the state after holds_position positions where the state after position positions belongs "
                           "(a stale block's state)";
        break;
    case FaultKind::StateOtherRequest:
        t["holds_prompt"] = "prompt_0";
        t["description"] = "prompt_0's state at the same checkpoint (another request's slot)";
        break;
    case FaultKind::StateNotReset:
        plan.factor = kNotResetFactor;
        t["factor"] = plan.factor;
        t["leftover_prompt"] = "prompt_0";
        t["leftover_position"] = sourceEnd;
        t["description"] = "the state plus factor x prompt_0's final state (a slot whose old state was not cleared)";
        break;
    case FaultKind::StateZeros:
        t["description"] = "zeros (a state never written or reset mid-request)";
        break;
    case FaultKind::StateScale:
        plan.factor = kScaleFactor;
        t["factor"] = plan.factor;
        t["description"] = "the state times factor";
        break;
    default:
        break;
    }
    return plan;
}

void addStateFault(const StateFaultPlan& plan, const TinyTransformer& model, const std::vector<LayerCache>& source,
                   std::int64_t sourceEnd, EngineFaults& faults)
{
    using Fault = EngineFaults::StateFault;
    faults.stateLayer = plan.layer;
    faults.stateAt = plan.position;
    faults.stateFactor = plan.factor;
    const Mamba2Shape& m = model.shape().mamba;
    switch (plan.kind) {
    case FaultKind::StateStale:
        faults.stateFault = Fault::Stale;
        faults.stateSource = plan.source;
        break;
    case FaultKind::StateOtherRequest:
        faults.stateFault = Fault::Replace;
        faults.stateOther = model.stateAfter(source[std::size_t(plan.layer)], plan.layer, plan.position, Numerics::Engine);
        break;
    case FaultKind::StateNotReset:
        faults.stateFault = Fault::AddScaled;
        faults.stateOther = model.stateAfter(source[std::size_t(plan.layer)], plan.layer, sourceEnd, Numerics::Engine);
        break;
    case FaultKind::StateZeros:
        faults.stateFault = Fault::Replace;
        faults.stateOther.conv.assign(std::size_t(m.convDim()) * std::size_t(m.convWidth - 1), 0.0f);
        faults.stateOther.ssm.assign(std::size_t(m.heads) * std::size_t(m.headDim) * std::size_t(m.stateSize), 0.0f);
        break;
    case FaultKind::StateScale:
        faults.stateFault = Fault::Scale;
        break;
    default:
        break;
    }
}

LayerStateRecord engineStateRecord(const TinyTransformer& model, const std::vector<LayerCache>& cache, int layer,
                                   const std::vector<std::int64_t>& positions, const EngineFaults& faults, int tpSize)
{
    const Mamba2Shape& m = model.shape().mamba;
    const std::vector<Mamba2State> states = statesAt(model, cache[std::size_t(layer)], layer, positions, Numerics::Engine, faults);
    const std::int64_t checkpoints = std::int64_t(positions.size()), past = m.convWidth - 1;
    LayerStateRecord record{mixerLayerName(layer), "mamba2", positions, {}};
    for (int r = 0; r < tpSize; ++r) {
        const RankUnits u = unitsOfRank(m, r, tpSize);
        const std::int64_t convUnits = std::int64_t(u.conv.size()), heads = std::int64_t(u.ssm.size());
        record.ranks.push_back(
            {{"conv", RawTensor::fromFloat(DType::BFloat16, {checkpoints, convUnits, past}, gather(states, true, u.conv, std::size_t(past))),
              u.conv},
             {"ssm",
              RawTensor::fromFloat(m.engineStateBf16 ? DType::BFloat16 : DType::Float32, {checkpoints, heads, m.headDim, m.stateSize},
                                   gather(states, false, u.ssm, std::size_t(m.headDim) * std::size_t(m.stateSize))),
              u.ssm}});
    }
    return record;
}

LayerStateRecord referenceStateRecord(const TinyTransformer& model, const std::vector<LayerCache>& cache, int layer,
                                      const std::vector<std::int64_t>& positions, Numerics numerics)
{
    const Mamba2Shape& m = model.shape().mamba;
    const std::vector<Mamba2State> states = statesAt(model, cache[std::size_t(layer)], layer, positions, numerics, {});
    const std::int64_t checkpoints = std::int64_t(positions.size()), past = m.convWidth - 1;
    const DType dtype = numerics == Numerics::Baseline ? DType::Float32 : DType::BFloat16;
    std::vector<std::int64_t> channels(std::size_t(m.convDim())), heads(std::size_t(m.heads));
    for (std::size_t i = 0; i < channels.size(); ++i)
        channels[i] = std::int64_t(i);
    for (std::size_t i = 0; i < heads.size(); ++i)
        heads[i] = std::int64_t(i);
    LayerStateRecord record{mixerLayerName(layer), "", positions, {}};  // a reference names no kind
    record.ranks.push_back(
        {{"conv", RawTensor::fromFloat(dtype, {checkpoints, m.convDim(), past}, gather(states, true, channels, std::size_t(past))), {}},
         {"ssm", RawTensor::fromFloat(dtype, {checkpoints, m.heads, m.headDim, m.stateSize},
                                      gather(states, false, heads, std::size_t(m.headDim) * std::size_t(m.stateSize))),
          {}}});
    return record;
}

}  // namespace kvscope::synth
