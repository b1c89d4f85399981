#pragma once
// The Compare page's transfer mode (kvscope transfer, transfer/transfer_compare.h): the open
// capture is the consumer of a KV transfer, another capture of the same requests the producer.
// What was compared and the verdict; the changed blocks with their explanations; the map of one
// prompt's layers x positions, identical, changed and explained, or changed and unexplained
// (positions not compared hatched); a clicked cell's block in words.

#include "transfer/transfer_compare.h"

#include <QWidget>

#include <memory>

class QComboBox;
class QLabel;
class QTableWidget;

namespace kvscope {

class HeatmapView;

class TransferView : public QWidget {
    Q_OBJECT

public:
    explicit TransferView(QWidget* parent = nullptr);

    void show(std::shared_ptr<const TransferResult> result);
    void clear(const QString& message);
    HeatmapView& heatmap() { return *m_map; }
    const TransferResult* result() const { return m_result.get(); }

private:
    void fillTable();
    void showMap();
    void showCell(int row, qint64 position);
    QString cellText(int row, qint64 position) const;

    QLabel* m_summary;
    QComboBox* m_prompt;
    HeatmapView* m_map;
    QTableWidget* m_table;
    QLabel* m_cell;
    std::shared_ptr<const TransferResult> m_result;
};

// The verdict and what was compared, in a few lines of HTML (shared with the tests).
QString transferSummary(const TransferResult& result);

}  // namespace kvscope
