#pragma once
// The prefix-caching capture the tests share: three prompts, the later two starting with the
// first's two blocks of 16 (32 tokens), which the engine shares (one physical block each).

#include "synth/synthetic_capture.h"

namespace kvtest {

inline kvscope::SyntheticCaptureOptions sharedPrefixCapture()
{
    kvscope::SyntheticCaptureOptions o;
    o.layers = 3;
    o.alternateSliding = false;
    o.promptLens = {40, 56, 48};
    o.decodeTokens = 12;
    o.divergence = -1;
    o.faultLayer = -1;
    o.sharedPrefixBlocks = 2;
    return o;
}

}  // namespace kvtest
