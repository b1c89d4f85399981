#pragma once
// Ticks at whole numbers only, for the axes that count (tokens, counts): zoomed in, a token
// axis must not read "12.5".

#include "qcustomplot.h"

#include <algorithm>
#include <cmath>

namespace kvscope {

class IntegerAxisTicker : public QCPAxisTicker {
protected:
    double getTickStep(const QCPRange& range) override { return std::max(1.0, std::ceil(QCPAxisTicker::getTickStep(range))); }
    int getSubTickCount(double tickStep) override { return tickStep <= 1 ? 0 : QCPAxisTicker::getSubTickCount(tickStep); }
};

}  // namespace kvscope
