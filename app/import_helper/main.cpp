// kvscope-import: a folder of torch.save / safetensors dumps into a capture bundle. The only
// executable that links libtorch; `kvscope import` and the app's File > Open folder run it
// (core/dumps/import_process.h).

#include "dumps/dump_import.h"

#include <iostream>
#include <string>

int main(int argc, char** argv)
{
    std::string dir, out;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if ((a == "-o" || a == "--output") && i + 1 < argc)
            out = argv[++i];
        else if (dir.empty())
            dir = a;
        else
            out.clear(), i = argc;
    }
    if (dir.empty() || out.empty()) {
        std::cerr << "usage: kvscope-import DIR -o BUNDLE.h5   (the expected files: docs/import.md)\n";
        return 2;
    }
    try {
        kvscope::importDumpDirectory(dir, out);
    } catch (const std::exception& e) {
        std::cerr << "kvscope-import: " << e.what() << "\n";
        return 2;
    }
    return 0;
}
