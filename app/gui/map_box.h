#pragma once
// A map with the row of choosers above it ("Map: [scheme] [prompt] [part]"), as the pages that
// show one map at a time lay it out.

#include <QHBoxLayout>
#include <QLabel>
#include <QVBoxLayout>
#include <QWidget>

#include <initializer_list>
#include <utility>

namespace kvscope {

// `choosers`: each widget with its stretch.
inline QWidget* mapBox(std::initializer_list<std::pair<QWidget*, int>> choosers, QWidget* map)
{
    auto* bar = new QHBoxLayout;
    bar->addWidget(new QLabel(QObject::tr("Map:")));
    for (const auto& [widget, stretch] : choosers)
        bar->addWidget(widget, stretch);
    auto* box = new QWidget;
    auto* layout = new QVBoxLayout(box);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->addLayout(bar);
    layout->addWidget(map, 1);
    return box;
}

}  // namespace kvscope
