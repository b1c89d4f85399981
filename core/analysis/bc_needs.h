#pragma once
// Which of the analysis's BCs a result needs. Each costs a histogram of every error, or a
// second pass over the layer (docs/performance.md), so a command computes those its output
// shows: kvscope check judges the combined BC against the noise floor and needs none of the
// others; kvscope analyze's summary prints the BCs against the noise floor, and the reference
// tool's combined BC only when asked (--seed-bc). The combined BC against the noise floor
// (AggregateBc::combinedVsNoise) comes with any of them.

namespace kvscope {

struct BcNeeds {
    // The reference tool's BC per token (PromptAnalysis::bc) and by generation index
    // (AggregateBc::bc). Pooling it by generation index shares the combined BC's second pass,
    // which it therefore runs too.
    bool perToken = true;
    // The reference tool's BC per layer, every token pooled (AggregateBc::combined): the
    // layer's whole range first, then a second pass.
    bool combined = true;
    // The BC against the noise floor per token (PromptAnalysis::bcVsNoise) and by generation
    // index (AggregateBc::bcVsNoise).
    bool perTokenVsNoise = true;

    bool all() const { return perToken && combined && perTokenVsNoise; }
    // Whether the second pass runs.
    bool countsPooled() const { return perToken || combined; }

    // What kvscope check judges: the combined BC against the noise floor, or with `seedBc` the
    // reference tool's.
    static BcNeeds verdict(bool seedBc) { return {.perToken = false, .combined = seedBc, .perTokenVsNoise = false}; }
    // What kvscope analyze prints without --json or --save: the BCs against the noise floor, and
    // with `seedBc` the reference tool's combined BC (the one pass, or with it the second).
    static BcNeeds summary(bool seedBc) { return {.perToken = false, .combined = seedBc, .perTokenVsNoise = true}; }
};

}  // namespace kvscope
