#include "widgets/bc_bar_view.h"

#include "widgets/plot_decorations.h"

#include <cmath>

namespace kvscope {

BcBarView::BcBarView(QWidget* parent)
    : QCustomPlot(parent)
{
    setMinimumSize(300, 160);
    m_k = new QCPBars(xAxis, yAxis);
    m_v = new QCPBars(xAxis, yAxis);
    m_k->setName("K");
    m_v->setName("V");
    m_k->setBrush(QColor(31, 119, 180));
    m_v->setBrush(QColor(44, 160, 44));
    m_k->setPen(Qt::NoPen);
    m_v->setPen(Qt::NoPen);
    m_k->setWidth(0.4);
    m_v->setWidth(0.4);
    yAxis->setLabel("combined BC vs noise");
    yAxis->setRange(0.0, 1.02);
    placeLegendAbove(this, 0);
    // BC 0.9: the reference plugin's default pass threshold.
    auto* threshold = new QCPItemStraightLine(this);
    threshold->point1->setCoords(0, 0.9);
    threshold->point2->setCoords(1, 0.9);
    threshold->setPen(QPen(QColor(215, 25, 28), 1, Qt::DashLine));
}

void BcBarView::setValues(const QStringList& layers, const QVector<double>& k, const QVector<double>& v,
                          const QStringList& parts)
{
    m_k->setName(parts.value(0, "K"));
    m_v->setName(parts.value(1, "V"));
    QVector<double> kx, vx;
    QSharedPointer<QCPAxisTickerText> ticker(new QCPAxisTickerText);
    const int every = std::max(1, int(layers.size()) / 24 + 1);
    for (int i = 0; i < layers.size(); ++i) {
        kx.append(i - 0.2);
        vx.append(i + 0.2);
        if (i % every == 0)
            ticker->addTick(i, QString::number(i));
    }
    m_k->setData(kx, k);
    m_v->setData(vx, v);
    xAxis->setTicker(ticker);
    xAxis->setLabel("layer");
    xAxis->setRange(-0.7, layers.size() - 0.3);
    yAxis->setRange(0.0, 1.01);  // from 0: a low bar must look low, not absent
    replot(QCustomPlot::rpQueuedReplot);
}

}  // namespace kvscope
