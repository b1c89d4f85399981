#include "commands/commands.h"

#include "analysis/impact_summary.h"
#include "format/bundle_error.h"
#include "format/output_path.h"
#include "quant/impact_recipe.h"
#include "quant/whatif.h"
#include "quant/whatif_json.h"
#include "util/work_team.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <thread>

namespace kvscope::cli {

namespace {

std::string percent(double share)
{
    std::ostringstream s;
    s << std::setprecision(3) << 100 * share << "%";
    return s.str();
}

std::string number(double x)
{
    if (std::isnan(x))
        return "-";
    std::ostringstream s;
    s << std::setprecision(3) << x;
    return s.str();
}

void printResult(const WhatIfResult& r, std::ostream& out)
{
    out << "what-if for " << r.bundle << ": " << r.promptIds.size() << " prompt(s), " << r.layers.size()
        << " layers; the floor: " << (r.floor == "baseline" ? "expected against the fp32 baseline" : "bf16 rounding of the values")
        << " (median relative L2 K " << percent(r.bf16FloorMedian[0]) << ", V " << percent(r.bf16FloorMedian[1]) << ")\n";
    for (const std::string& p : r.problems)
        out << "  left out: " << p << "\n";
    for (const WhatIfScheme& s : r.schemes) {
        out << "\n" << s.scheme.name() << ": " << s.verdict << "\n";
        out << "    " << std::left << std::setw(34) << "layer" << std::setw(10) << "K rel L2" << std::setw(10) << "V rel L2"
            << std::setw(10) << "K/floor" << std::setw(10) << "V/floor" << std::setw(11) << "saturated" << "K outlier\n";
        for (const WhatIfLayer& l : s.layers)
            out << "    " << std::setw(34) << l.layer << std::setw(10) << percent(l.relL2Median[0]) << std::setw(10)
                << percent(l.relL2Median[1]) << std::setw(10) << number(l.floorRatioMedian[0]) << std::setw(10)
                << number(l.floorRatioMedian[1]) << std::setw(11) << percent(std::max(l.saturated[0], l.saturated[1]))
                << number(l.kOutlierChannel) << (l.hurt ? "x  hurt" : "x") << "\n";
    }
}

void printRecipe(const ImpactRecipe& recipe, std::ostream& out)
{
    out << "\nby output (the bundle's impact record): next-token KL per layer, median / max over decode steps, "
           "against the baseline's KV there (bf16 noise); budget: "
        << recipe.budgetRule << "\n";
    for (const SchemeImpact& s : recipe.schemes) {
        out << "  " << s.scheme.name() << (s.vllmDtype.empty() ? " (no vLLM cache dtype)" : " (vLLM " + s.vllmDtype + ")")
            << ": " << s.layers.size() - s.keep.size() << " of " << s.layers.size() << " layers within\n";
        out << "    " << std::left << std::setw(34) << "layer" << std::setw(22) << "KL median / max" << std::setw(22)
            << "noise median / max" << "\n";
        for (const SchemeLayerImpact& l : s.layers)
            out << "    " << std::setw(34) << l.layer << std::setw(22) << (klText(l.kl.klMedian) + " / " + klText(l.kl.klMax))
                << std::setw(22) << (l.noise ? klText(l.noise->klMedian) + " / " + klText(l.noise->klMax) : std::string("-"))
                << (l.within ? "within" : "keep in bf16") << "\n";
    }
    out << "recipe: " << recipe.text << "\n";
}

}  // namespace

int whatif(const Args& args, std::ostream& out, std::ostream& err)
{
    std::string bundle, jsonPath, schemeList;
    int threads = int(std::max(1u, std::thread::hardware_concurrency()));
    bool maps = false;
    std::optional<double> klBudget;
    OptionParser parser("whatif");
    parser.operand("BUNDLE", bundle);
    parser.text({"--schemes"}, schemeList);
    parser.text({"--json"}, jsonPath);
    parser.flag("--maps", maps);
    parser.integer("--threads", threads);
    parser.real("--kl-budget", klBudget);
    if (!parser.parse(args, err))
        return 2;
    WhatIfOptions options;
    if (schemeList == "all") {
        options.schemes = allSchemes();
    } else if (!schemeList.empty()) {
        options.schemes.clear();
        std::stringstream list(schemeList);
        for (std::string name; std::getline(list, name, ',');) {
            std::string error;
            const std::optional<QuantScheme> s = parseScheme(name, error);
            if (!s) {
                err << "kvscope whatif: " << error << "\n";
                return 2;
            }
            options.schemes.push_back(*s);
        }
    }
    try {
        if (!jsonPath.empty())
            requireWritableOutput(jsonPath, {bundle});
        const CaptureLoader loader(std::make_shared<BundleReader>(bundle));
        WorkTeam team(std::max(1, threads));
        options.team = &team;
        const WhatIfResult result = runWhatIf(loader, options);
        std::vector<ImpactRecord> records;
        for (const std::string& id : result.promptIds)
            if (std::optional<ImpactRecord> r = loader.impact(id))
                records.push_back(std::move(*r));
        std::vector<const ImpactRecord*> pointers;
        for (const ImpactRecord& r : records)
            pointers.push_back(&r);
        const std::optional<ImpactRecipe> recipe = recipeForMeasured(pointers, result.layers, klBudget);
        if (result.promptIds.empty()) {
            err << "kvscope whatif: " << bundle << ": no prompt has a usable expected reference\n";
            for (const std::string& p : result.problems)
                err << "  " << p << "\n";
            return 2;
        }
        if (!jsonPath.empty()) {
            std::ofstream file(jsonPath);
            writeWhatIfJson(result, file, maps, recipe ? &*recipe : nullptr);
            if (!file)
                throw std::runtime_error("cannot write " + jsonPath);
            out << "wrote " << jsonPath << "\n";
            return 0;
        }
        printResult(result, out);
        if (recipe)
            printRecipe(*recipe, out);
        return 0;
    } catch (const std::exception& e) {
        err << "kvscope: " << e.what() << "\n";
        return 2;
    }
}

}  // namespace kvscope::cli
