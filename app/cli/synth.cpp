#include "cli/commands.h"

#include "synth/model_capture.h"

#include <iostream>
#include <sstream>

namespace kvscope::cli {

namespace {


std::vector<int> parseList(const std::string& text)
{
    std::vector<int> values;
    std::stringstream in(text);
    for (std::string item; std::getline(in, item, ',');)
        values.push_back(std::stoi(item));
    return values;
}

}  // namespace

int synth(const Args& args, std::ostream& out, std::ostream& err)
{
    synth::ModelCaptureOptions o;
    std::string path;
    try {
        for (std::size_t i = 0; i < args.size(); ++i) {
            const std::string& a = args[i];
            auto value = [&]() -> const std::string& {
                if (i + 1 >= args.size())
                    throw std::invalid_argument(a + " needs a value");
                return args[++i];
            };
            auto number = [&] { return std::stoi(value()); };
            if (a == "--demo")
                o = synth::demoModelCaptureOptions();
            else if (a == "--layers")
                o.shape.layers = number();
            else if (a == "--hidden")
                o.shape.hidden = number();
            else if (a == "--query-heads")
                o.shape.queryHeads = number();
            else if (a == "--kv-heads")
                o.shape.kvHeads = number();
            else if (a == "--head-dim")
                o.shape.headDim = number();
            else if (a == "--ffn")
                o.shape.ffn = number();
            else if (a == "--vocab")
                o.shape.vocab = number();
            else if (a == "--window")
                o.shape.window = number();
            else if (a == "--spec") {
                const std::string spec = value();
                if (spec != "sliding" && spec != "full")
                    throw std::invalid_argument("--spec takes sliding or full");
                o.slidingWindowSpec = spec == "sliding";
            } else if (a == "--tp")
                o.tpSize = number();
            else if (a == "--block-size")
                o.fullBlockSize = number();
            else if (a == "--sliding-block-size")
                o.slidingBlockSize = number();
            else if (a == "--threads")
                o.threads = number();
            else if (a == "--fp8")
                o.fp8Cache = true;
            else if (a == "--prompts")
                o.promptLens = parseList(value());
            else if (a == "--decode")
                o.decodeTokens = number();
            else if (a == "--two-way")
                o.baseline = false;
            else if (a == "--seed")
                o.seed = std::stoull(value());
            else if (a == "--fault") {
                const std::string name = value();
                if (!synth::parseFault(name, o.fault))
                    throw std::invalid_argument("unknown fault '" + name + "'");
            } else if (a == "--fault-layer")
                o.faultLayer = number();
            else if (a == "--fault-head")
                o.faultHead = number();
            else if (a == "--fault-rank")
                o.faultRank = number();
            else if (a == "--fault-step")
                o.faultStep = number();
            else if (path.empty() && !a.starts_with("--"))
                path = a;
            else
                throw std::invalid_argument("unexpected argument '" + a + "'");
        }
        if (path.empty())
            throw std::invalid_argument("no output file");
        synth::writeModelCapture(path, o);
    } catch (const std::invalid_argument& e) {
        err << "kvscope synth: " << e.what() << "\n";
        printUsage("synth", err);
        return 2;
    } catch (const std::exception& e) {
        err << "kvscope synth: " << e.what() << "\n";
        return 2;
    }
    out << "wrote " << path << " (fault: " << synth::faultName(o.fault) << ")\n";
    return 0;
}

}  // namespace kvscope::cli
