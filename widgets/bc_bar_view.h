#pragma once
// Combined BC per layer (every prompt and token pooled), K and V side by side.

#include <qcustomplot.h>

namespace kvscope {

class BcBarView : public QCustomPlot {
    Q_OBJECT

public:
    explicit BcBarView(QWidget* parent = nullptr);
    // `parts`: what K and V are called (an MLA latent's c_kv and k_pe).
    void setValues(const QStringList& layers, const QVector<double>& k, const QVector<double>& v,
                   const QStringList& parts = {"K", "V"});

private:
    QCPBars* m_k;
    QCPBars* m_v;
};

}  // namespace kvscope
