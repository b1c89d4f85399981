#pragma once
// A tab of the window: a viewer of the open capture with a title, a map that File > Export
// view draws, and why it cannot be shown now (its tab is then off, the reason its tooltip).
// A new page is one more entry in pages.cpp; the window adds its tab and keeps it current.

#include "gui/capture_viewer.h"
#include "gui/view_toolbar.h"

class QWidget;

namespace kvscope {

class HeatmapView;

class Page : public CaptureViewer {
public:
    virtual QWidget* widget() = 0;
    virtual QString title() const = 0;
    // Why the page cannot be shown now; empty: it can.
    virtual QString unavailable() const = 0;
    virtual HeatmapView& exportedMap() = 0;
    // The toolbar's settings changed (`promptChanged`: the selection and zoom start over).
    virtual void applyView(const ViewSettings& settings, bool promptChanged) { (void)settings, (void)promptChanged; }
    // The toolbar shows the across-prompts choices while this page is current.
    virtual bool acrossPrompts() const { return false; }
};

}  // namespace kvscope
