#include "commands/commands.h"

#include "dumps/import_process.h"

#include <ostream>

namespace kvscope::cli {

int importDumps(const Args& args, std::ostream& out, std::ostream& err)
{
    std::string dir, bundle;
    OptionParser parser("import");
    parser.operand("DIR", dir);
    parser.requiredText({"-o", "--output"}, "BUNDLE.h5", bundle);
    if (!parser.parse(args, err))
        return 2;
    try {
        runImport(dir, bundle);  // in kvscope-import, the one executable that links libtorch
    } catch (const std::exception& e) {
        err << "kvscope: " << e.what() << "\n";
        return 2;
    }
    out << "wrote " << bundle << "\n";
    return 0;
}

}  // namespace kvscope::cli
