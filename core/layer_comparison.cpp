#include "layer_comparison.h"

#include "vector_metrics.h"

#include <cmath>
#include <stdexcept>

namespace kvscope {

namespace {

const float* partAt(const LayerKv& kv, KvPart part, int head, std::int64_t token)
{
    return part == KvPart::K ? kv.kAt(head, token) : kv.vAt(head, token);
}

ErrorRange errorRange(const LayerKv& reference, const LayerKv& x, std::int64_t token, KvPart part)
{
    ErrorRange range;
    for (int h = 0; h < reference.heads; ++h) {
        const float* r = partAt(reference, part, h, token);
        const float* v = partAt(x, part, h, token);
        float lo = range.lo, hi = range.hi;
        for (int d = 0; d < reference.headDim; ++d) {
            const float e = std::fabs(r[d] - v[d]);  // float32, as the reference computes it
            lo = e < lo ? e : lo;
            hi = e > hi ? e : hi;
        }
        range.lo = lo;
        range.hi = hi;
    }
    return range;
}

}  // namespace

bool comparable(const LayerKv& reference, const LayerKv& target, const LayerKv* base, std::int64_t token)
{
    return reference.present[std::size_t(token)] && target.present[std::size_t(token)] &&
           (!base || base->present[std::size_t(token)]);
}

void addTokenErrors(const LayerKv& reference, const LayerKv& x, std::int64_t token, KvPart part,
                    const SharedBins& bins, Histogram& histogram)
{
    for (int h = 0; h < reference.heads; ++h) {
        const float* r = partAt(reference, part, h, token);
        const float* v = partAt(x, part, h, token);
        for (int d = 0; d < reference.headDim; ++d)
            histogram.add(bins, std::fabs(r[d] - v[d]));
    }
}

void compareLayer(const LayerKv& reference, const LayerKv& target, const LayerKv* base, int layer,
                  PromptAnalysis& out, std::vector<NonFiniteCell>& nonFinite, TokenErrorRanges* ranges)
{
    auto sameShape = [](const LayerKv& a, const LayerKv& b) {
        return a.heads == b.heads && a.seq == b.seq && a.headDim == b.headDim;
    };
    if (!sameShape(reference, target) || (base && !sameShape(reference, *base)))
        throw std::invalid_argument("compareLayer: reference, target and base differ in shape");
    if (reference.heads != out.heads || reference.seq != out.tokens)
        throw std::invalid_argument("compareLayer: layer shape differs from the prompt's result");
    if (ranges) {
        ranges->k.assign(std::size_t(reference.seq), ErrorRange{});
        ranges->v.assign(std::size_t(reference.seq), ErrorRange{});
    }
    const int dim = reference.headDim;
    for (std::int64_t t = 0; t < reference.seq; ++t) {
        if (!comparable(reference, target, base, t))
            continue;
        for (KvPart part : {KvPart::K, KvPart::V}) {
            for (int h = 0; h < reference.heads; ++h) {
                const std::size_t cell = out.cell(layer, t, h);
                VectorComparison c;
                if (compareVectors(partAt(reference, part, h, t), partAt(target, part, h, t), dim, c)) {
                    out.metrics[std::size_t(metricFor(part, 0))][cell] = float(c.cos);
                    out.metrics[std::size_t(metricFor(part, 1))][cell] = float(c.linf);
                    out.metrics[std::size_t(metricFor(part, 2))][cell] = float(c.l2);
                } else {
                    nonFinite.push_back({layer, t, h, part, "actual"});
                }
                if (base) {
                    if (compareVectors(partAt(reference, part, h, t), partAt(*base, part, h, t), dim, c)) {
                        out.metrics[std::size_t(baseOf(metricFor(part, 0)))][cell] = float(c.cos);
                        out.metrics[std::size_t(baseOf(metricFor(part, 1)))][cell] = float(c.linf);
                        out.metrics[std::size_t(baseOf(metricFor(part, 2)))][cell] = float(c.l2);
                    } else {
                        nonFinite.push_back({layer, t, h, part, "expected"});
                    }
                }
            }
            if (!base)
                continue;
            // BC between |baseline - expected| and |baseline - actual| over all heads.
            ErrorRange range = errorRange(reference, *base, t, part);
            range.merge(errorRange(reference, target, t, part));
            if (ranges)
                (part == KvPart::K ? ranges->k : ranges->v)[std::size_t(t)] = range;
            const SharedBins bins(range);
            Histogram p, q;
            addTokenErrors(reference, *base, t, part, bins, p);
            addTokenErrors(reference, target, t, part, bins, q);
            out.bc[std::size_t(part)][std::size_t(layer) * std::size_t(out.tokens) + std::size_t(t)] =
                float(bhattacharyya(p, q));
        }
    }
}

}  // namespace kvscope
