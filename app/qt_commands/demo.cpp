#include "qt_commands/app_commands.h"

#include "gui/gui_main.h"
#include "report/drawing_application.h"
#include "synth/model_capture.h"
#include "util/sibling_executables.h"

#include <filesystem>
#include <ostream>

namespace kvscope::cli {

namespace {

// The demo's models: GQA attention (the default), MLA, a hybrid of Mamba2 and attention.
enum class DemoModel { Gqa, Mla, Hybrid };

synth::ModelCaptureOptions demoOptions(DemoModel model)
{
    switch (model) {
    case DemoModel::Mla: return synth::demoMlaCaptureOptions();
    case DemoModel::Hybrid: return synth::demoHybridCaptureOptions();
    case DemoModel::Gqa: break;
    }
    return synth::demoModelCaptureOptions();
}

// Made under another name and renamed when whole: a demo stopped half way (the window closed,
// Ctrl-C) leaves no broken capture for the next run to open.
void makeDemoCapture(const std::string& path, DemoModel model)
{
    const std::string part = path + ".part";
    synth::writeModelCapture(part, demoOptions(model));
    std::filesystem::rename(part, path);
}

}  // namespace

int demo(const Args& args, std::ostream& out, std::ostream& err)
{
    std::string dirName = "kvscope-demo";
    DemoModel model = DemoModel::Gqa;
    bool captureOnly = false;
    OptionParser parser("demo");
    parser.operand("DIR", dirName, false);
    parser.flag("--mla", [&model] { model = DemoModel::Mla; });
    parser.flag("--hybrid", [&model] { model = DemoModel::Hybrid; });
    parser.flag("--capture-only", [&captureOnly] { captureOnly = true; });
    if (!parser.parse(args, err))
        return 2;
    // The demo capture, made by the model-based generator on first use and kept.
    const std::filesystem::path dir = dirName;
    std::filesystem::create_directories(dir);
    const bool mla = model == DemoModel::Mla, hybrid = model == DemoModel::Hybrid;
    const std::string path =
        (dir / (mla ? "demo-mla-capture.h5" : hybrid ? "demo-hybrid-capture.h5" : "demo-capture-v2.h5")).string();
    const std::string making =
        mla      ? "making the MLA demo capture (a 16-layer latent-attention model run three ways; a few seconds, once)"
        : hybrid ? "making the hybrid demo capture (a 24-layer Mamba2 and attention model run three ways; about half a "
                   "minute, once)"
                 : "making the demo capture (a 24-layer model run three ways; a minute or two, once)";
    if (captureOnly || !hasDisplay()) {
        if (!std::filesystem::exists(path)) {
            out << making << std::endl;
            makeDemoCapture(path, model);
        }
        if (captureOnly) {
            out << "wrote " << path << "\n";
            return 0;
        }
    } else {  // the window at once; the capture made by a child meanwhile (the window can cancel it)
        static int argc = 1;
        static char name[] = "kvscope";
        static char* argv[] = {name, nullptr};
        GuiLaunch launch{QString::fromStdString(path), {}, false, {}, QString::fromStdString(making)};
        if (!std::filesystem::exists(path)) {
            launch.makeArgv = {siblingExecutable("kvscope-app", "KVSCOPE_APP"), "demo", dirName, "--capture-only"};
            if (mla)
                launch.makeArgv.push_back("--mla");
            if (hybrid)
                launch.makeArgv.push_back("--hybrid");
        }
        return runGui(argc, argv, launch);
    }
    // No display: the demo's report instead, and its summary here.
    const std::string reportDir = (dir / (mla ? "report-mla" : hybrid ? "report-hybrid" : "report")).string();
    if (const int rc = report({path, "-o", reportDir}, out, err); rc != 0)
        return rc;
    out << "open " << reportDir << "/report.html in a browser; the analysis:\n\n";
    return analyze({path}, out, err);
}

}  // namespace kvscope::cli
