// Where a command writes (format/output_path.h): checked before any work, never onto a file it
// reads, and every refusal names the output and why.

#include "format/bundle_error.h"
#include "format/output_path.h"

#include <QTemporaryDir>
#include <QTest>

#include <filesystem>
#include <fstream>

#include <unistd.h>

using namespace kvscope;

class TestOutputPath : public QObject {
    Q_OBJECT

private slots:
    void writableOutputsPass();
    void refusalsNameTheOutput();
};

namespace {

// The message of the refusal, or empty when it passed.
std::string refusal(const std::string& output, const std::vector<std::string>& inputs = {})
{
    try {
        requireWritableOutput(output, inputs);
        return {};
    } catch (const BundleError& e) {
        return e.what();
    }
}

}  // namespace

void TestOutputPath::writableOutputsPass()
{
    QTemporaryDir dir;
    const std::string existing = dir.filePath("existing.kvres").toStdString();
    std::ofstream(existing) << "x";
    QCOMPARE(refusal(existing, {dir.filePath("in.h5").toStdString()}), std::string());  // replaced
    QCOMPARE(refusal(dir.filePath("new.json").toStdString()), std::string());
}

void TestOutputPath::refusalsNameTheOutput()
{
    QTemporaryDir dir;
    const std::string input = dir.filePath("in.h5").toStdString();
    std::ofstream(input) << "bundle";
    const std::string link = dir.filePath("link.h5").toStdString();
    std::filesystem::create_symlink(input, link);
    struct Case {
        std::string output;
        std::string says;
    };
    const Case cases[] = {
        {dir.path().toStdString(), "is a folder"},
        {input, "is the input itself"},
        {link, "is the same file as the input " + input},
        {dir.filePath("missing/out.json").toStdString(), "the folder " + dir.filePath("missing").toStdString() + " does not exist"},
    };
    for (const Case& c : cases) {
        const std::string message = refusal(c.output, {input});
        QVERIFY2(message.find(c.output) != std::string::npos && message.find(c.says) != std::string::npos, message.c_str());
    }
    if (geteuid() != 0) {  // (root writes anywhere)
        const std::string locked = dir.filePath("locked").toStdString();
        std::filesystem::create_directory(locked);
        std::filesystem::permissions(locked, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
        const std::string message = refusal(locked + "/out.json");
        std::filesystem::permissions(locked, std::filesystem::perms::owner_all);
        QVERIFY2(message.find("is not writable") != std::string::npos, message.c_str());
    }
}

QTEST_GUILESS_MAIN(TestOutputPath)
#include "tst_output_path.moc"
