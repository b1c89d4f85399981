#include "qt_commands/app_commands.h"

#include "gui/gui_main.h"
#include "report/drawing_application.h"
#include "synth/model_capture.h"

#include <filesystem>
#include <ostream>

namespace kvscope::cli {

int demo(const Args& args, std::ostream& out, std::ostream& err)
{
    std::string dirName = "kvscope-demo";
    bool mla = false;
    OptionParser parser("demo");
    parser.operand("DIR", dirName, false);
    parser.flag("--mla", [&mla] { mla = true; });
    if (!parser.parse(args, err))
        return 2;
    // The demo capture, made by the model-based generator on first use and kept.
    const std::filesystem::path dir = dirName;
    std::filesystem::create_directories(dir);
    const std::string path = (dir / (mla ? "demo-mla-capture.h5" : "demo-capture-v2.h5")).string();
    if (!std::filesystem::exists(path)) {
        out << (mla ? "generating the MLA demo capture (a 16-layer latent-attention model run three ways; a few "
                      "seconds, once)"
                    : "generating the demo capture (a 24-layer model run three ways; about half a minute, once)")
            << std::endl;
        synth::writeModelCapture(path, mla ? synth::demoMlaCaptureOptions() : synth::demoModelCaptureOptions());
    }
    if (hasDisplay()) {
        static int argc = 1;
        static char name[] = "kvscope";
        static char* argv[] = {name, nullptr};
        return runGui(argc, argv, {QString::fromStdString(path), {}, false});
    }
    // No display: the demo's report instead, and its summary here.
    const std::string reportDir = (dir / (mla ? "report-mla" : "report")).string();
    if (const int rc = report({path, "-o", reportDir}, out, err); rc != 0)
        return rc;
    out << "open " << reportDir << "/report.html in a browser; the analysis:\n\n";
    return analyze({path}, out, err);
}

}  // namespace kvscope::cli
