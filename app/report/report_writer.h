#pragma once
// The report people can send: one self-contained HTML file (styles, script and data inlined;
// it opens offline from file://) with PNG images of each map beside it, rendered by the
// app's own heatmap widget. Needs a QApplication (offscreen is fine).

#include "analysis/analysis_result.h"
#include "kv/capture_loader.h"
#include "analysis/threshold_check.h"
#include "diff/capture_diff.h"
#include "quant/whatif.h"

#include <QColor>
#include <QString>
#include <QStringList>

namespace kvscope {

struct ReportFiles {
    QString html;
    QStringList images;
    qint64 htmlBytes = 0;
};

// Writes DIR/report.html and DIR/*.png, with a what-if section when `whatIf` is given, and the
// comparison with A first when `against` is (kvscope report B --against A). Throws
// std::runtime_error when DIR cannot be written.
ReportFiles writeReport(const CaptureLoader& loader, const AnalysisResult& result, const Thresholds& thresholds,
                        const QString& directory, const WhatIfResult* whatIf = nullptr, const DiffResult* against = nullptr);

// The colour of a what-if cell: its error in bf16 noise floors, from green (within 2) to red (10
// and beyond); grey without data.
QColor whatIfColour(double floorRatio);
// A what-if cell as the app and the report show it: "K / V" median error in floors, then the
// 90th percentile of the worse part (what a median of mostly untouched tokens hides), which
// also colours it; "hurt" when a head does more than twice as badly as the model's typical.
QString whatIfCellText(const WhatIfLayer& cell);
double whatIfCellLevel(const WhatIfLayer& cell);

}  // namespace kvscope
