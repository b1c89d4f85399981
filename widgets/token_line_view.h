#pragma once
// One metric of one layer and head across the sequence, with the heatmap's markers.

#include <qcustomplot.h>

namespace kvscope {

class TokenLineView : public QCustomPlot {
    Q_OBJECT

public:
    explicit TokenLineView(QWidget* parent = nullptr);
    // NaN values (no data) leave gaps. `base` may be empty.
    void setSeries(const QVector<double>& actual, const QVector<double>& base, const QString& title,
                   const QString& valueLabel, double prefillBoundary, const QVector<double>& divergences, qint64 selected);
    // What the legend calls the two series (default "actual" and "base").
    void setSeriesNames(const QString& actual, const QString& base);
    // No cell selected: empty, with `message` as the title.
    void clearSeries(const QString& message);

protected:
    void resizeEvent(QResizeEvent* event) override;

private:
    // As many token ticks as fit their labels with room between them.
    void fitTokenTicks();

    QCPGraph* m_actual;
    QCPGraph* m_base;
    QCPTextElement* m_title;
    QString m_titleText;
    QList<QCPAbstractItem*> m_markers;
};

}  // namespace kvscope
