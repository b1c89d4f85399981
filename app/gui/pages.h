#pragma once
// The window's pages, in the order of their tabs. A new page is one more here: the window
// registers each with the controller as a viewer and gives it a tab it keeps current.

#include "gui/page.h"

#include <vector>

namespace kvscope {

class AcrossPromptsPage;
class AnalysisController;
class ComparePage;
class OverTimePage;
class PromptPage;
class WhatIfPage;

struct Pages {
    std::vector<Page*> all;
    // The ones the window wires to the toolbar, the menus, the report and each other.
    PromptPage* prompt = nullptr;
    AcrossPromptsPage* across = nullptr;
    WhatIfPage* whatIf = nullptr;
    ComparePage* compare = nullptr;
    OverTimePage* overTime = nullptr;
};

Pages makePages(AnalysisController* controller);

}  // namespace kvscope
