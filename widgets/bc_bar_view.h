#pragma once
// Combined BC per layer (every prompt and token pooled), K and V side by side.

#include <qcustomplot.h>

namespace kvscope {

class BcBarView : public QCustomPlot {
    Q_OBJECT

public:
    explicit BcBarView(QWidget* parent = nullptr);
    void setValues(const QStringList& layers, const QVector<double>& k, const QVector<double>& v);

private:
    QCPBars* m_k;
    QCPBars* m_v;
};

}  // namespace kvscope
