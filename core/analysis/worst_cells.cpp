#include "analysis/worst_cells.h"

#include <algorithm>
#include <tuple>

namespace kvscope {

std::vector<WorstCell> worstCells(const PromptAnalysis& p, std::size_t count)
{
    std::vector<WorstCell> cells;
    for (int l = 0; l < int(p.layers.size()); ++l)
        for (std::int64_t t = 0; t < p.tokens; ++t) {
            WorstCell best;
            bool found = false;
            for (KvPart part : {KvPart::K, KvPart::V}) {
                const Metric m = metricFor(part, MetricKind::Linf);
                const HeadReduction r = maxOverHeads(p, m, l, t);
                if (r.head < 0)
                    continue;
                WorstCell c{l, t, r.head, part, r.value, std::nanf(""), std::nanf(""), r.value};
                if (p.threeWay) {
                    c.baseError = maxOverHeads(p, baseOf(m), l, t).value;
                    c.ratio = errorRatio(p, m, l, t);
                    c.score = c.ratio;
                }
                if (std::isnan(c.score))
                    continue;
                if (!found || c.score > best.score)
                    best = c;
                found = true;
            }
            if (found)
                cells.push_back(best);
        }
    const std::size_t n = std::min(count, cells.size());
    std::partial_sort(cells.begin(), cells.begin() + std::ptrdiff_t(n), cells.end(),
                      [](const WorstCell& a, const WorstCell& b) {
                          return a.score != b.score ? a.score > b.score : std::tie(a.layer, a.token) < std::tie(b.layer, b.token);
                      });
    cells.resize(n);
    return cells;
}

}  // namespace kvscope
