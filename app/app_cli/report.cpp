#include "app_cli/app_commands.h"

#include "analysis/threshold_check.h"
#include "report/drawing_application.h"
#include "report/report_writer.h"

#include <ostream>

namespace kvscope::cli {

int report(const Args& args, std::ostream& out, std::ostream& err)
{
    std::string bundle, dir;
    Thresholds t;
    OptionParser parser("report");
    parser.operand("BUNDLE", bundle);
    parser.requiredText({"-o", "--output"}, "DIR", dir);
    addThresholdOptions(parser, t);
    if (!parser.parse(args, err))
        return 2;
    try {
        const auto app = applicationForDrawing();  // the PNGs are drawn by the app's widgets
        auto reader = std::make_shared<BundleReader>(bundle);
        AnalysisOptions options;
        options.suspects = t.suspects;
        const AnalysisResult result = analyzeForVerdict(reader, options);  // the same verdict as `check`
        const ReportFiles files = writeReport(CaptureLoader(reader), result, t, QString::fromStdString(dir));
        out << "wrote " << files.html.toStdString() << " (" << files.htmlBytes / 1024 << " KiB) and "
                  << files.images.size() << " PNG images\n";
    } catch (const std::exception& e) {
        err << "kvscope: " << e.what() << "\n";
        return 2;
    }
    return 0;
}

}  // namespace kvscope::cli
