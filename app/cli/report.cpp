#include "cli/commands.h"

#include "analysis/threshold_check.h"
#include "report/drawing_application.h"
#include "report/report_writer.h"

#include <ostream>

namespace kvscope::cli {

int report(const Args& args, std::ostream& out, std::ostream& err)
{
    std::string bundle, dir;
    Thresholds t;
    try {
        for (std::size_t i = 0; i < args.size(); ++i) {
            if (takeThresholdOption(args, i, t))
                continue;
            const bool value = i + 1 < args.size();
            if ((args[i] == "-o" || args[i] == "--output") && value)
                dir = args[++i];
            else if (bundle.empty() && !args[i].starts_with("-"))
                bundle = args[i];
            else
                throw std::invalid_argument(args[i]);
        }
        if (bundle.empty() || dir.empty())
            throw std::invalid_argument("arguments");
    } catch (const std::exception&) {
        printUsage("report", err);
        return 2;
    }
    try {
        const auto app = applicationForDrawing();  // the PNGs are drawn by the app's widgets
        auto reader = std::make_shared<BundleReader>(bundle);
        AnalysisOptions options;
        options.suspects = t.suspects;
        const AnalysisResult result = analyzeForVerdict(reader, options);  // the same verdict as `check`
        const ReportFiles files = writeReport(*reader, result, t, QString::fromStdString(dir));
        out << "wrote " << files.html.toStdString() << " (" << files.htmlBytes / 1024 << " KiB) and "
                  << files.images.size() << " PNG images\n";
    } catch (const std::exception& e) {
        err << "kvscope: " << e.what() << "\n";
        return 2;
    }
    return 0;
}

}  // namespace kvscope::cli
