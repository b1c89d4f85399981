#include "cli_report.h"

#include "analyzer.h"
#include "report_writer.h"

#include <iostream>

namespace kvscope::cli {

int report(const std::vector<std::string>& args)
{
    std::string bundle, dir;
    Thresholds t;
    try {
        for (std::size_t i = 0; i < args.size(); ++i) {
            const bool value = i + 1 < args.size();
            if ((args[i] == "-o" || args[i] == "--output") && value)
                dir = args[++i];
            else if (args[i] == "--min-bc" && value)
                t.minBc = std::stod(args[++i]);
            else if (args[i] == "--max-ratio" && value)
                t.maxRatio = std::stod(args[++i]);
            else if (args[i] == "--max-linf" && value)
                t.maxLinf = std::stod(args[++i]);
            else if (bundle.empty() && !args[i].starts_with("-"))
                bundle = args[i];
            else
                throw std::invalid_argument(args[i]);
        }
        if (bundle.empty() || dir.empty())
            throw std::invalid_argument("arguments");
    } catch (const std::exception&) {
        std::cerr << "usage: kvscope report BUNDLE -o DIR [--min-bc 0.9] [--max-ratio 2.0] [--max-linf X]\n";
        return 2;
    }
    try {
        auto reader = std::make_shared<BundleReader>(bundle);
        const AnalysisResult result = analyzeBundle(reader);
        const ReportFiles files = writeReport(*reader, result, t, QString::fromStdString(dir));
        std::cout << "wrote " << files.html.toStdString() << " (" << files.htmlBytes / 1024 << " KiB) and "
                  << files.images.size() << " PNG images\n";
    } catch (const std::exception& e) {
        std::cerr << "kvscope: " << e.what() << "\n";
        return 2;
    }
    return 0;
}

}  // namespace kvscope::cli
