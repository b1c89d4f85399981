#pragma once
// Opens a bundle for writing to damage it the way broken files are damaged (the tests of bad input).

#include <QString>
#include <QTest>

#include <hdf5.h>

#include <functional>

namespace kvtest {

inline void modify(const QString& path, const std::function<void(hid_t)>& change)
{
    const hid_t file = H5Fopen(path.toUtf8().constData(), H5F_ACC_RDWR, H5P_DEFAULT);
    QVERIFY(file >= 0);
    change(file);
    H5Fclose(file);
}

}  // namespace kvtest
