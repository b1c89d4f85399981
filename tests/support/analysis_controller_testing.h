#pragma once
// The analysis controller's test hooks, kept out of its public API: they hold its worker at
// known points (after a layer, after a window of a long layer, in the probe child).

#include "gui/analysis_controller.h"

namespace kvscope {

class AnalysisControllerTesting {
public:
    // After each finished layer, with the count so far (e.g. cancel after the first layer).
    static void setLayerHook(AnalysisController& c, std::function<void(int)> hook) { c.m_hooks.layer = std::move(hook); }
    // After each window of a layer read in windows: the layer and the tokens done of it.
    static void setWindowHook(AnalysisController& c, std::function<void(int, qint64)> hook)
    {
        c.m_hooks.window = std::move(hook);
    }
    // Layers longer than this many tokens are analysed in windows of it (0: by their bytes).
    static void setWindowTokens(AnalysisController& c, qint64 tokens) { c.m_hooks.windowTokens = tokens; }
    // In the child process that opens a bundle before the app does (BundleReader::probeInChild).
    static void setProbeHook(AnalysisController& c, std::function<void()> hook) { c.m_hooks.probe = std::move(hook); }
};

}  // namespace kvscope
