#include "commands/commands.h"

#include "analysis/analyzer.h"
#include "analysis/threshold_check.h"
#include "format/output_path.h"
#include "results/analysis_input.h"

#include <fstream>

namespace kvscope::cli {

int check(const Args& args, std::ostream& out, std::ostream& err)
{
    std::string jsonPath;
    std::vector<std::string> inputs;
    bool strict = false;
    Thresholds t;
    OptionParser parser("check");
    parser.operands("BUNDLE", inputs);
    addThresholdOptions(parser, t);
    parser.text({"--json"}, jsonPath);
    parser.flag("--strict", strict);
    if (!parser.parse(args, err))
        return 2;
    AnalysisResult result;
    try {
        if (!jsonPath.empty())
            requireWritableOutput(jsonPath, isSweep(inputs) ? sweepBundlePaths(inputs) : inputs);
        AnalysisOptions options;
        options.suspects = t.suspects;
        options.share = sharedAnalysis();
        options.fingerprints = false;  // a verdict uses none
        options.bcs = BcNeeds::verdict(!t.bcVsNoise);  // and of the BCs only the one it judges
        result = analysisForVerdict(inputs, options, strict, bundleProbe()).result;  // a bundle, a sweep, or a results file
    } catch (const std::exception& e) {
        err << "kvscope: " << e.what() << "\n";
        return 2;
    }
    const std::vector<Violation> violations = checkThresholds(result, t);
    if (!jsonPath.empty()) {
        std::ofstream file(jsonPath, std::ios::binary);
        if (file)
            writeVerdictJson(result.bundle.empty() ? inputs.front() : result.bundle, t, violations, file);
        if (!file || !file.flush()) {
            err << "kvscope check: " << jsonPath << ": cannot be written\n";
            return 2;
        }
    }
    out << "kvscope check " << (result.bundles.empty() ? inputs.front() : result.bundle) << ": ";
    if (t.maxKl)
        out << "max next-token KL with the engine's KV in every layer " << *t.maxKl << " nats (impact; the floors not judged)";
    else
        out << "min combined " << (t.bcVsNoise ? "BC vs noise " : "BC (reference tool's) ") << t.minBc
            << ", max L-inf multiplier " << t.maxRatio;
    if (t.maxLinf && !t.maxKl)
        out << ", max relative L-inf " << *t.maxLinf;
    out << "\n";
    for (const PromptAnalysis& p : result.prompts)
        if (!p.threeWay && !t.maxLinf && !t.maxKl)
            out << "  note: prompt " << p.id << " is two-way (no baseline): not judged without --max-linf\n";
    for (const Violation& v : violations) {
        if (!v.bundle.empty()) {
            out << "  FAIL bundle " << v.bundle << " left out: " << v.detail << "\n";
            continue;
        }
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
