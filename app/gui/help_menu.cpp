#include "gui/help_menu.h"

#include "util/version.h"

#include <QCoreApplication>
#include <QProcess>
#include <QDir>
#include <QFileInfo>
#include <QMessageBox>
#include <QUrl>

namespace kvscope {

HelpMenu::HelpMenu(QWidget* parent)
    : QMenu(tr("&Help"), parent)
{
    addAction(tr("&Keyboard shortcuts"), QKeySequence::HelpContents, this, [this] {
        QMessageBox::information(parentWidget(), tr("Keyboard shortcuts"), shortcutsText());
    });
    addAction(tr("&Documentation"), this, [this] {
        const QString folder = docsFolder();
        if (folder.isEmpty()) {
            QMessageBox::information(parentWidget(), tr("Documentation"),
                                     tr("The documentation is not installed here; it is the docs/ folder of the sources."));
            return;
        }
        // xdg-open says when nothing could open the folder (QDesktopServices cannot tell): then
        // where it is, to open by hand.
        const auto showWhere = [this, folder] {
            QMessageBox::information(parentWidget(), tr("Documentation"),
                                     tr("Nothing here opens folders; the documentation is in %1").arg(folder));
        };
        auto* opener = new QProcess(this);
        connect(opener, &QProcess::finished, this, [opener, showWhere](int code, QProcess::ExitStatus status) {
            opener->deleteLater();
            if (status != QProcess::NormalExit || code != 0)
                showWhere();
        });
        connect(opener, &QProcess::errorOccurred, this, [opener, showWhere](QProcess::ProcessError error) {
            if (error == QProcess::FailedToStart) {
                opener->deleteLater();
                showWhere();
            }
        });
        opener->start("xdg-open", {folder});
    });
    addSeparator();
    addAction(tr("&About kvscope"), this, [this] {
        QMessageBox::about(parentWidget(), tr("About kvscope"),
                           tr("<b>kvscope %1</b><p>Inspects an inference engine's paged KV cache against a reference "
                              "model and finds where, and why, it goes wrong.</p><p>Documentation: %2</p>")
                               .arg(QString::fromLatin1(kVersion), docsFolder().toHtmlEscaped()));
    });
}

QString HelpMenu::docsFolder()
{
    const QStringList candidates{
        QDir(QCoreApplication::applicationDirPath()).absoluteFilePath("../share/doc/kvscope/docs"),
        QStringLiteral(KVSCOPE_SOURCE_DOCS),
    };
    for (const QString& c : candidates)
        if (QFileInfo(c + "/analysis-json.md").exists())
            return QDir(c).canonicalPath();
    return {};
}

QString HelpMenu::shortcutsText()
{
    return tr("<table>"
              "<tr><td><b>Ctrl+O</b></td><td>open a bundle</td></tr>"
              "<tr><td><b>Tab</b></td><td>next control: toolbar, heatmap, heads, suspects, worst cells</td></tr>"
              "<tr><td><b>arrows</b></td><td>(heatmap) move the selected cell</td></tr>"
              "<tr><td><b>Enter</b></td><td>(heatmap) on to the selected cell's heads; (worst cells) go to the cell</td></tr>"
              "<tr><td><b>Esc</b></td><td>(heatmap) clear the selection</td></tr>"
              "<tr><td><b>Home</b>, <b>Ctrl+0</b></td><td>reset the zoom (also: double-click, right-click menu)</td></tr>"
              "<tr><td><b>K</b>, <b>V</b></td><td>keys or values</td></tr>"
              "<tr><td><b>1</b>-<b>6</b></td><td>metric: L-inf, L2, 1 - cos, error ratio, BC vs noise, reference BC</td></tr>"
              "<tr><td><b>Ctrl+PgUp</b>, <b>Ctrl+PgDown</b></td><td>previous / next prompt</td></tr>"
              "<tr><td><b>Ctrl+1</b> - <b>Ctrl+5</b></td><td>per prompt / across prompts / what if / compare / over time</td></tr>"
              "<tr><td><b>F6</b>, <b>Shift+F6</b></td><td>next / previous panel: heatmap, heads, suspects, worst cells</td></tr>"
              "<tr><td><b>Esc</b></td><td>(heads, suspects, worst cells) back to the heatmap</td></tr>"
              "<tr><td><b>Ctrl+Enter</b></td><td>(what if, compare) run</td></tr>"
              "<tr><td><b>F1</b></td><td>this list</td></tr>"
              "</table><p>Mouse: wheel zooms, drag pans, a click (without moving) selects.</p>");
}

}  // namespace kvscope
