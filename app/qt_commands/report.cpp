#include "qt_commands/app_commands.h"

#include "analysis/threshold_check.h"
#include "report/drawing_application.h"
#include "report/report_writer.h"
#include "diff/diff_side.h"
#include "results/analysis_input.h"

#include "util/work_team.h"

#include <optional>
#include <ostream>
#include <thread>

namespace kvscope::cli {

int report(const Args& args, std::ostream& out, std::ostream& err)
{
    std::string dir;
    std::vector<std::string> inputs;
    bool strict = false;
    Thresholds t;
    OptionParser parser("report");
    parser.operands("BUNDLE", inputs);
    parser.flag("--strict", strict);
    parser.requiredText({"-o", "--output"}, "DIR", dir);
    addThresholdOptions(parser, t);
    std::string against;
    parser.text({"--against"}, against);
    bool withWhatIf = true;
    parser.flag("--no-whatif", [&withWhatIf] { withWhatIf = false; });
    if (!parser.parse(args, err))
        return 2;
    const std::string& bundle = inputs.front();
    if (!against.empty() && isSweep(inputs)) {
        err << "kvscope report: --against compares one bundle with another, not a sweep\n";
        return 2;
    }
    try {
        const auto app = applicationForDrawing();  // the PNGs are drawn by the app's widgets
        AnalysisOptions options;
        options.suspects = t.suspects;
        std::optional<DiffSide> sideA;
        if (!against.empty()) {  // A's side as kvscope diff takes it, first: an engine-only B borrows its reference
            AnalysisOptions lean = options;
            lean.searchSuspects = false;
            lean.bcs.reset();
            sideA = loadDiffSide(against, lean);
            options.referenceDonor = sideA->bundle;
        }
        // The same verdict as `check`; from a results file, its bundle only when it is at hand.
        options.share = sharedAnalysis();
        const AnalysisInput input = analysisForVerdict(inputs, options, strict, bundleProbe());
        const AnalysisResult& result = input.result;
        const std::shared_ptr<const CaptureLoader> opened =
            input.loader ? input.loader
                         : std::make_shared<const CaptureLoader>(input.reader, UnreadableBlockPolicy::Error, options.referenceDonor);
        const CaptureLoader& loader = *opened;
        if (!input.bundleMissing.empty())
            err << "kvscope report: " << input.bundleMissing << ": no what-if section (it needs the KV)\n";
        if (!input.bundleMissing.empty() && !against.empty())
            throw std::runtime_error("--against needs the KV of " + bundle + "'s bundle for the suspects of the change: " +
                                     input.bundleMissing);
        std::optional<WhatIfResult> whatIf;
        // (per-head schemes: an MLA latent has no heads)
        if (withWhatIf && loader.holdsData() && !loader.config().isMla()) {
            WorkTeam team(int(std::max(1u, std::thread::hardware_concurrency())));
            WhatIfOptions whatIfOptions;
            whatIfOptions.team = &team;
            whatIf = runWhatIf(loader, whatIfOptions);
        }
        std::optional<DiffResult> comparison;
        if (sideA) {
            DiffOptions diffOptions;
            diffOptions.suspects = t.suspects;
            comparison = diffAnalyses(*sideA, result, loader, diffOptions);
            comparison->pathB = bundle;  // B as given: a results file is named, not the bundle it came from
        }
        const ReportFiles files = writeReport(loader, result, t, QString::fromStdString(dir), whatIf ? &*whatIf : nullptr,
                                              comparison ? &*comparison : nullptr);
        out << "wrote " << files.html.toStdString() << " (" << files.htmlBytes / 1024 << " KiB) and "
                  << files.images.size() << " PNG images\n";
    } catch (const std::exception& e) {
        err << "kvscope: " << e.what() << "\n";
        return 2;
    }
    return 0;
}

}  // namespace kvscope::cli
