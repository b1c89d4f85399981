// kvscope: the desktop app and its headless subcommands.

#include "cli_analyze.h"
#include "cli_bench.h"
#include "cli_check.h"
#include "cli_export.h"
#include "cli_import.h"
#include "cli_inspect.h"
#include "cli_report.h"
#include "cli_synth.h"
#include "main_window.h"
#include "model_capture.h"

#include <QApplication>
#include <QTimer>

#include <malloc.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

namespace {

const char* const kUsage = R"(usage: kvscope [BUNDLE | DIR]      the desktop app (on a bundle, or a folder of dumps)
       kvscope COMMAND [ARGS]

commands:
  demo [DIR]        open the app on the built-in demo capture (made in DIR, default
                    ./kvscope-demo, on first use: a 24-layer model with a RoPE fault in
                    layer 13); without a display, write its HTML report and print its analysis
  analyze BUNDLE [--json OUT.json] [--prompt ID]... [--layers SPEC] [--threads N] [--strict]
                    compare the engine's KV with the reference: per (token, layer, head)
                    cos / relative L-inf / relative L2, per (token, layer) BC, aggregated
                    BC across prompts; a readable summary, or everything as JSON
  report BUNDLE -o DIR [--min-bc 0.9] [--max-ratio 2.0] [--max-linf X]
                    a self-contained HTML report (opens offline) with PNG images of each map
  check BUNDLE [--min-bc 0.9] [--max-ratio 2.0] [--max-linf X] [--json OUT]
                    for CI: exit 0 when within the thresholds, 1 with the violations listed,
                    2 when the bundle is unreadable or invalid
  inspect BUNDLE    show what a capture bundle holds and check that every layer of
                    every prompt reconstructs; exit 0 if so, 1 if not, 2 if unreadable
  synth OUT.h5 [--demo] [--layers N] ... [--fault KIND]
                    a capture from a small transformer run three ways (fp32 baseline,
                    bf16 expected, bf16 engine), with an injectable engine fault
                    (kvscope synth --help lists the options)
  import DIR -o BUNDLE.h5
                    make a bundle from raw dumps: per-rank get_kv_caches .pt files, the
                    config as JSON, block tables .pt, HF past_key_values as .pt or
                    .safetensors, logits .pt (file names: docs/import.md)
  export BUNDLE OUT.h5 [--prompt ID]... [--layers SPEC]
                    write the reconstructed, merged engine KV and the aligned references,
                    float32 [heads, seq, head_dim] with a presence mask, for other tools
  bench [--tokens 2048] [--layers 80] [--threads N] [--runs 3] [--dir DIR] [--keep]
                    time the three-way analysis of a synthetic Llama-3.3-70B-shaped
                    capture against a read-once roofline, at L and 2L layers
  help              this text

Capture bundles are HDF5 files, format v1: see docs/bundle-format.md.
)";

// The demo capture, made by the model-based generator on first use and kept.
std::string demoCapture(const std::vector<std::string>& args)
{
    const std::filesystem::path dir = args.size() > 2 ? args[2] : "kvscope-demo";
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "demo-capture-v1.h5").string();
    if (!std::filesystem::exists(path)) {
        std::cout << "generating the demo capture (a 24-layer model run three ways; about half a minute, once)\n";
        kvscope::synth::writeModelCapture(path, kvscope::synth::demoModelCaptureOptions());
    }
    return path;
}

bool hasDisplay()
{
    const QByteArray platform = qgetenv("QT_QPA_PLATFORM");
    if (platform == "offscreen" || platform == "minimal")
        return false;
    return !qEnvironmentVariableIsEmpty("DISPLAY") || !qEnvironmentVariableIsEmpty("WAYLAND_DISPLAY");
}

// `screenshot`: once the analysis is done, save the window to this file and quit (for the
// README's pictures); `across`: show the across-prompts view.
int runGui(int argc, char** argv, const QString& path, const QString& screenshot = {}, bool across = false)
{
    QApplication app(argc, argv);
    QApplication::setOrganizationName("kvscope");
    QApplication::setApplicationName("kvscope");
    kvscope::MainWindow window;
    window.show();
    if (!screenshot.isEmpty())
        QObject::connect(&window.controller(), &kvscope::AnalysisController::finished, &window, [&] {
            window.showAcrossPrompts(across);
            QTimer::singleShot(1500, &window, [&] {
                window.grab().save(screenshot);
                app.quit();
            });
        });
    if (!path.isEmpty())
        window.openPath(path);
    return app.exec();
}

}  // namespace

int main(int argc, char** argv)
{
    // The analysis allocates and frees layer-sized buffers (megabytes) over and over: keep
    // them in the heap rather than handing them back to the kernel and faulting them in again.
    mallopt(M_MMAP_THRESHOLD, 512 << 20);
    mallopt(M_TRIM_THRESHOLD, 1024 << 20);
    const std::vector<std::string> args(argv, argv + argc);
    const std::string command = args.size() > 1 ? args[1] : "";
    const bool isCommand = command == "analyze" || command == "check" || command == "report" || command == "inspect" || command == "demo" || command == "synth" ||
                           command == "import" || command == "export" || command == "bench" ||
                           command == "bench-run" || command == "help" || command == "--help" || command == "-h";
    if (!isCommand && args.size() <= 2) {
        if (!hasDisplay() && qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) {
            std::cerr << "kvscope: no display for the app; headless, use `kvscope report BUNDLE -o DIR` or "
                         "`kvscope analyze BUNDLE` (kvscope help lists the commands)\n";
            return 2;
        }
        return runGui(argc, argv, QString::fromStdString(command));
    }
    if (!isCommand && args.size() >= 4 && args[2] == "--screenshot")
        return runGui(1, argv, QString::fromStdString(command), QString::fromStdString(args[3]),
                      args.size() > 4 && args[4] == "--across");
    try {
        if (command == "analyze")
            return kvscope::cli::analyze({args.begin() + 2, args.end()}, std::cout, std::cerr);
        if (command == "bench")
            return kvscope::cli::bench({args.begin() + 2, args.end()});
        if (command == "bench-run")
            return kvscope::cli::benchRun({args.begin() + 2, args.end()});
        if (command == "report") {
            // Rendering the PNGs needs a QApplication; without a display, an offscreen one.
            if (!hasDisplay())
                qputenv("QT_QPA_PLATFORM", "offscreen");
            QApplication app(argc, argv);
            return kvscope::cli::report({args.begin() + 2, args.end()});
        }
        if (command == "check")
            return kvscope::cli::check({args.begin() + 2, args.end()}, std::cout, std::cerr);
        if (command == "export")
            return kvscope::cli::exportKv({args.begin() + 2, args.end()});
        if (command == "import")
            return kvscope::cli::importDumps({args.begin() + 2, args.end()});
        if (command == "synth")
            return kvscope::cli::synth({args.begin() + 2, args.end()});
        if (command == "inspect" && args.size() == 3)
            return kvscope::cli::inspect(args[2], std::cout, std::cerr);
        if (command == "demo" && args.size() <= 3) {
            const std::string path = demoCapture(args);
            if (hasDisplay())
                return runGui(1, argv, QString::fromStdString(path));
            // No display: the demo's report instead, and its summary here.
            const std::string reportDir = (std::filesystem::path(path).parent_path() / "report").string();
            qputenv("QT_QPA_PLATFORM", "offscreen");
            QApplication app(argc, argv);
            if (const int rc = kvscope::cli::report({path, "-o", reportDir}); rc != 0)
                return rc;
            std::cout << "open " << reportDir << "/report.html in a browser; the analysis:\n\n";
            return kvscope::cli::analyze({path}, std::cout, std::cerr);
        }
        if (command == "help" || command == "--help" || command == "-h") {
            std::cout << kUsage;
            return 0;
        }
    } catch (const std::exception& e) {
        std::cerr << "kvscope: " << e.what() << "\n";
        return 2;
    }
    std::cerr << kUsage;
    return 2;
}
