#include "cli/commands.h"

#include "analysis/analysis_json.h"
#include "analysis/analyzer.h"
#include "analysis/threshold_check.h"

#include <cmath>
#include <fstream>

namespace kvscope::cli {

int check(const Args& args, std::ostream& out, std::ostream& err)
{
    std::string bundle, jsonPath;
    Thresholds t;
    OptionParser parser("check");
    parser.operand("BUNDLE", bundle);
    addThresholdOptions(parser, t);
    parser.text({"--json"}, jsonPath);
    if (!parser.parse(args, err))
        return 2;
    AnalysisResult result;
    try {
        AnalysisOptions options;
        options.suspects = t.suspects;
        result = analyzeForVerdict(std::make_shared<BundleReader>(bundle), options);
    } catch (const std::exception& e) {
        err << "kvscope: " << e.what() << "\n";
        return 2;
    }
    const std::vector<Violation> violations = checkThresholds(result, t);
    if (!jsonPath.empty()) {
        std::ofstream file(jsonPath);
        file << "{\"bundle\":" << jsonString(bundle) << ",\"thresholds\":{\"min_bc\":" << t.minBc
             << ",\"bc\":\"" << (t.bcVsNoise ? "bc_vs_noise" : "bc") << "\""
             << ",\"max_ratio\":" << t.maxRatio << ",\"max_linf\":";
        if (t.maxLinf)
            file << *t.maxLinf;
        else
            file << "null";
        file << "},\"passed\":" << (violations.empty() ? "true" : "false") << ",\"violations\":[";
        for (std::size_t i = 0; i < violations.size(); ++i) {
            const Violation& v = violations[i];
            file << (i ? "," : "") << "{\"prompt\":" << (v.prompt.empty() ? "null" : jsonString(v.prompt))
                 << ",\"layer\":" << jsonString(v.layer) << ",\"token\":";
            if (v.token >= 0)
                file << v.token;
            else
                file << "null";
            file << ",\"head\":";
            if (v.head >= 0)
                file << v.head;
            else
                file << "null";
            file << ",\"metric\":" << jsonString(v.metric) << ",\"value\":";
            if (std::isfinite(v.value))
                file << v.value;
            else
                file << "null";
            file << ",\"threshold\":" << v.threshold;
            if (!v.detail.empty())
                file << ",\"evidence\":" << jsonString(v.detail);
            file << "}";
        }
        file << "]}\n";
    }
    out << "kvscope check " << bundle << ": min combined " << (t.bcVsNoise ? "BC vs noise " : "BC (reference tool's) ") << t.minBc << ", max L-inf multiplier " << t.maxRatio;
    if (t.maxLinf)
        out << ", max relative L-inf " << *t.maxLinf;
    out << "\n";
    for (const PromptAnalysis& p : result.prompts)
        if (!p.threeWay && !t.maxLinf)
            out << "  note: prompt " << p.id << " is two-way (no baseline): not judged without --max-linf\n";
    for (const Violation& v : violations) {
        out << "  FAIL " << (v.prompt.empty() ? "all prompts" : "prompt " + v.prompt) << ", " << v.layer;
        if (v.token >= 0)
            out << ", token " << v.token;
        if (v.head >= 0)
            out << ", head " << v.head;
        out << ": " << v.metric << " = " << v.value << " (threshold " << v.threshold << ")\n";
        if (!v.detail.empty())
            out << "       " << v.detail << "\n";
    }
    out << (violations.empty() ? "PASS\n" : std::to_string(violations.size()) + " violation(s)\n");
    return violations.empty() ? 0 : 1;
}

}  // namespace kvscope::cli
