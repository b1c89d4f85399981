#pragma once
// What sees the open capture: the pages, the toolbar, the status line, the window. Each
// registers with the AnalysisController (addViewer), which tells every viewer, in the order
// they registered, what happens to the capture; it then emits its own signal of the same
// event. The state itself is the controller's (result(), loader(), isRunning()): a viewer
// reads it there.

#include <QString>

namespace kvscope {

class CaptureViewer {
public:
    virtual ~CaptureViewer() = default;

    // open() was called for `path`; `kept`: the capture on screen stays until it has opened.
    virtual void captureOpening(const QString& path, bool kept) { (void)path, (void)kept; }
    // It opened: its prompts, layers and shapes are known; its layers follow one by one.
    virtual void captureOpened() {}
    virtual void layerAnalysed(int layer) { (void)layer; }
    // Every layer is ready (a results file's too).
    virtual void captureAnalysed() {}
    // Cancelled after it opened: the layers done so far are final.
    virtual void analysisCancelled() {}
    // `path` never opened (`error`: why; empty: cancelled); the capture on screen before stays.
    virtual void openingStopped(const QString& path, const QString& error) { (void)path, (void)error; }
    // Nothing is open any more: `why` (it failed to open or to be read, or its import was cancelled).
    virtual void captureClosed(const QString& why) { (void)why; }
};

}  // namespace kvscope
