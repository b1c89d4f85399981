#include "gui/pages.h"

#include "gui/across_prompts_page.h"
#include "gui/compare_page.h"
#include "gui/over_time_page.h"
#include "gui/prompt_page.h"
#include "gui/whatif_page.h"

namespace kvscope {

Pages makePages(AnalysisController* controller)
{
    Pages pages;
    pages.prompt = new PromptPage(controller);
    pages.across = new AcrossPromptsPage(controller);
    pages.whatIf = new WhatIfPage(controller);
    pages.compare = new ComparePage(controller);
    pages.overTime = new OverTimePage(controller);
    pages.all = {pages.prompt, pages.across, pages.whatIf, pages.compare, pages.overTime};
    return pages;
}

}  // namespace kvscope
