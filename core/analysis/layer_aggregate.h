#pragma once
// Pools one layer of the three-way prompts into the aggregate BCs: by generation index (the
// same offset after each prompt's prefill) and combined (every prompt and token), with the
// reference tool's shared equal-width bins and against the noise floor.
//
// The shared bins' ranges are known only once every token is compared (from the per-token
// ranges the comparison left), so the errors are binned in a second pass over the sides.

#include "analysis/analysis_result.h"
#include "analysis/analysis_share.h"
#include "analysis/layer_comparison.h"
#include "kv/layer_source.h"
#include "util/work_team.h"

#include <memory>
#include <vector>

namespace kvscope {

// One prompt's three sides of one layer, kept while the layer's aggregate is computed.
// Each is left as read (the engine in its blocks) and decoded a few tokens at a time.
struct LayerSides {
    LayerSource reference;
    LayerSource actual;
    LayerSource base;
    bool ok = false;
};

// Writes layer `layer` of `aggregate`. `allSides` and `allStats` (what comparing them left,
// stats per prompt) are indexed by prompt; `pooled` lists the prompts pooled. With a `team`,
// its threads share the second pass. Those of the pooled BCs `needs` leaves out stay NaN (it
// must match what the comparison was asked for: their per-token statistics).
void aggregateLayer(const AnalysisResult& result, const std::vector<int>& pooled, const std::vector<LayerSides>& allSides,
                    const std::vector<TokenErrorStats>& allStats, int layer, AggregateBc& aggregate,
                    WorkTeam* team = nullptr, AnalysisShare* share = nullptr, BcNeeds needs = {});

// The same for a layer compared in windows of tokens, whose sides are not all held at once:
// made once every window is compared (`compared`: per prompt, whether its every window was),
// then count() with each window's sides read again (the second pass), then finish().
// With a `share` (kvscope-mpi), `compared` holds this process's prompts only: the shared ranges
// and the counts are combined with every other process's, at construction and in finish().
class WindowedLayerPooling {
public:
    WindowedLayerPooling(const AnalysisResult& result, const std::vector<int>& pooled, std::vector<char> compared,
                         const std::vector<TokenErrorStats>& allStats, int layer, AggregateBc& aggregate,
                         WorkTeam* team = nullptr, AnalysisShare* share = nullptr, BcNeeds needs = {});
    ~WindowedLayerPooling();
    // Whether the second pass has anything to count (else count() need not be called).
    bool needsSides() const;
    void count(const std::vector<LayerSides>& allSides, PositionRange window);
    // Writes the layer's pooled BCs, unless a window could not be read again here (`unreadable`)
    // or, with a share, on another process: then they stay NaN. Whether they were written.
    bool finish(bool unreadable = false);

private:
    class Steps;
    std::unique_ptr<Steps> m_pooling;
};

}  // namespace kvscope
