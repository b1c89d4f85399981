#include "format/hdf5_file.h"

#include "format/batched_reads.h"
#include "format/bundle_error.h"
#include "format/fletcher32.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <filesystem>
#include <limits>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

namespace kvscope {

std::mutex& hdf5Mutex()
{
    static std::mutex mutex;
    return mutex;
}

namespace {

// Silence HDF5's own error stack printing (per thread in thread-safe builds, so on every
// open); errors are reported as BundleError instead.
void silenceHdf5()
{
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

herr_t closeFile(hid_t id) { return H5Fclose(id); }
herr_t closeObject(hid_t id) { return H5Oclose(id); }
herr_t closeDataset(hid_t id) { return H5Dclose(id); }
herr_t closeAttribute(hid_t id) { return H5Aclose(id); }
herr_t closeType(hid_t id) { return H5Tclose(id); }
herr_t closeSpace(hid_t id) { return H5Sclose(id); }
herr_t closePlist(hid_t id) { return H5Pclose(id); }
herr_t closeGroup(hid_t id) { return H5Gclose(id); }

// Variable-length strings in the character set `stored` has: libhdf5 1.10 converts none into
// another (ASCII into UTF-8 fails), and ASCII bytes are UTF-8 as they are.
Hdf5Handle variableStringType(hid_t stored)
{
    Hdf5Handle type(H5Tcopy(H5T_C_S1), closeType);
    H5Tset_size(type.id(), H5T_VARIABLE);
    const H5T_cset_t cset = H5Tget_cset(stored);
    H5Tset_cset(type.id(), cset == H5T_CSET_ASCII ? H5T_CSET_ASCII : H5T_CSET_UTF8);
    return type;
}

// Fixed-length UTF-8, null-padded (numpy's 'S' layout, as h5py writes it): read without
// HDF5's global heap, whose corrupt records can make libhdf5 loop or crash.
Hdf5Handle fixedStringType(std::size_t bytes)
{
    Hdf5Handle type(H5Tcopy(H5T_C_S1), closeType);
    H5Tset_size(type.id(), std::max<std::size_t>(1, bytes));
    H5Tset_strpad(type.id(), H5T_STR_NULLPAD);
    H5Tset_cset(type.id(), H5T_CSET_UTF8);
    return type;
}

// What HDF5 said went wrong first (the innermost entry of this thread's error stack), e.g.
// "incorrect metadata checksum after all read attempts"; empty when it said nothing.
std::string hdf5Detail()
{
    std::string detail;
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, [](unsigned n, const H5E_error2_t* error, void* out) -> herr_t {
        if (n == 0 && error->desc)
            *static_cast<std::string*>(out) = error->desc;
        return 0;
    }, &detail);
    return detail.empty() ? detail : " (HDF5: " + detail + ")";
}

// A file shorter than its superblock says: "holds N of the M bytes it declares", from libhdf5's
// "truncated file: eof = N, ..., stored_eof = M"; empty for any other failure to open.
std::string truncation(const std::string& detail)
{
    const auto number = [&](const char* key) -> std::string {
        const std::size_t at = detail.find(key);
        if (at == std::string::npos)
            return {};
        const std::size_t begin = at + std::strlen(key);
        const std::size_t end = detail.find_first_not_of("0123456789", begin);
        return detail.substr(begin, end - begin);
    };
    if (detail.find("truncated file") == std::string::npos)
        return {};
    const std::string present = number("truncated file: eof = "), declared = number("stored_eof = ");
    if (present.empty() || declared.empty())
        return {};
    return "is truncated: it holds " + present + " of the " + declared +
           " bytes it declares (an interrupted copy or write?)";
}

// Why a read failed, in words a user can act on.
std::string readProblem()
{
    const std::string detail = hdf5Detail();
    if (detail.find("Fletcher32") != std::string::npos || detail.find("checksum") != std::string::npos)
        return ": its checksum does not match, the file is corrupt" + detail;
    return " (truncated file?)" + detail;
}

// A chunked dataset's creation list: chunks and the Fletcher32 filter.
Hdf5Handle checksummedChunks(const std::vector<hsize_t>& chunk)
{
    Hdf5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), closePlist);
    H5Pset_chunk(dcpl.id(), int(chunk.size()), chunk.data());
    H5Pset_fletcher32(dcpl.id());
    return dcpl;
}

std::string parentOf(const std::string& path)
{
    const auto slash = path.find_last_of('/');
    return slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
}

}  // namespace

Hdf5Handle& Hdf5Handle::operator=(Hdf5Handle&& other) noexcept
{
    if (this != &other) {
        if (m_id >= 0 && m_closer)
            m_closer(m_id);
        m_id = other.m_id;
        m_closer = other.m_closer;
        other.m_id = -1;
    }
    return *this;
}

Hdf5Handle::~Hdf5Handle()
{
    if (m_id >= 0 && m_closer)
        m_closer(m_id);
}

hid_t storageType(DType dtype)
{
    switch (dtype) {
    case DType::Float32:
        return H5T_IEEE_F32LE;
    case DType::BFloat16:
        return H5T_STD_U16LE;
    case DType::Float8E4M3:
    case DType::Float8E5M2:
    case DType::Float8E4M3Fnuz:
    case DType::Float4E2M1:
    case DType::Int4TokenHead:
        return H5T_STD_U8LE;
    case DType::Int8:
        return H5T_STD_I8LE;
    case DType::Float16: {
        // HDF5 1.10 has no predefined half type; this is the one h5py uses for numpy float16.
        static const hid_t half = [] {
            const hid_t t = H5Tcopy(H5T_IEEE_F32LE);
            H5Tset_fields(t, 15, 10, 5, 0, 10);
            H5Tset_size(t, 2);
            H5Tset_ebias(t, 15);
            H5Tlock(t);
            return t;
        }();
        return half;
    }
    }
    return H5T_STD_U8LE;
}

void Hdf5File::fail(const std::string& object, const std::string& problem) const
{
    throw BundleError(m_path, object, problem);
}

Hdf5File Hdf5File::openReadOnly(const std::string& path)
{
    silenceHdf5();
    Hdf5File file;
    file.m_path = path;
    FILE* probe = std::fopen(path.c_str(), "rb");
    if (!probe)
        throw BundleError(path, {}, std::string("cannot open: ") + std::strerror(errno));
    std::fclose(probe);
    if (std::filesystem::is_directory(path))  // fopen opens a folder too
        throw BundleError(path, {}, "is a folder, not an HDF5 file (a folder of dumps becomes a bundle by "
                                    "`kvscope import DIR -o BUNDLE.h5`, docs/import.md)");
    if (H5Fis_hdf5(path.c_str()) <= 0)
        throw BundleError(path, {}, "not an HDF5 file");
    file.m_file = Hdf5Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), closeFile);
    if (!file.m_file.valid()) {
        const std::string detail = hdf5Detail();
        const std::string truncated = truncation(detail);
        throw BundleError(path, {}, truncated.empty() ? "cannot be opened as HDF5 (truncated or corrupt?)" + detail : truncated);
    }
    auto raw = std::make_shared<PlainFile>();
    raw->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    Hdf5Handle fcpl(H5Fget_create_plist(file.m_file.id()), closePlist);
    hsize_t userBlock = 0;
    struct stat opened {};
    if (raw->fd >= 0 && fcpl.valid() && H5Pget_userblock(fcpl.id(), &userBlock) >= 0 && ::fstat(raw->fd, &opened) == 0) {
        raw->base = userBlock;
        raw->bytes = std::uint64_t(opened.st_size);
        file.m_raw = std::move(raw);
    }
    return file;
}

Hdf5File Hdf5File::create(const std::string& path)
{
    silenceHdf5();
    Hdf5File file;
    file.m_path = path;
    // The newest file format: checksums on every piece of metadata (superblock, object
    // headers, B-trees, heaps), so corrupt metadata is detected before it is followed.
    Hdf5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), closePlist);
    H5Pset_libver_bounds(fapl.id(), H5F_LIBVER_LATEST, H5F_LIBVER_LATEST);
    file.m_file = Hdf5Handle(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.id()), closeFile);
    if (!file.m_file.valid())
        throw BundleError(path, {}, "cannot be created");
    return file;
}

Hdf5File Hdf5File::openForUpdate(const std::string& path)
{
    silenceHdf5();
    Hdf5File file;
    file.m_path = path;
    if (H5Fis_hdf5(path.c_str()) <= 0)
        throw BundleError(path, {}, "not an HDF5 file (or missing)");
    file.m_file = Hdf5Handle(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), closeFile);
    if (!file.m_file.valid())
        throw BundleError(path, {}, "cannot be opened for writing (read-only, or open elsewhere?)" + hdf5Detail());
    return file;
}

void Hdf5File::remove(const std::string& object)
{
    if (H5Ldelete(m_file.id(), object.c_str(), H5P_DEFAULT) < 0)
        fail(object, "cannot be removed" + hdf5Detail());
    m_existing.clear();
}

bool Hdf5File::exists(const std::string& object) const
{
    if (object == "/" || m_existing.count(object))
        return true;
    // Every prefix must exist before H5Lexists may be asked about the next component.
    std::size_t pos = 1;
    while (true) {
        const std::size_t next = object.find('/', pos);
        const std::string prefix = object.substr(0, next);
        if (next == std::string::npos) {
            if (H5Lexists(m_file.id(), prefix.c_str(), H5P_DEFAULT) <= 0 ||
                H5Oexists_by_name(m_file.id(), object.c_str(), H5P_DEFAULT) <= 0)
                return false;
            // The object and every group on its way resolve.
            for (std::size_t slash = object.find('/', 1); slash != std::string::npos; slash = object.find('/', slash + 1))
                m_existing.insert(object.substr(0, slash));
            m_existing.insert(object);
            return true;
        }
        if (!m_existing.count(prefix) && H5Lexists(m_file.id(), prefix.c_str(), H5P_DEFAULT) <= 0)
            return false;
        pos = next + 1;
    }
}

bool Hdf5File::isGroup(const std::string& object) const
{
    if (!exists(object))
        return false;
    H5O_info_t info;
    if (H5Oget_info_by_name(m_file.id(), object.c_str(), &info, H5P_DEFAULT) < 0)
        return false;
    return info.type == H5O_TYPE_GROUP;
}

Hdf5Handle Hdf5File::openObject(const std::string& object) const
{
    if (!exists(object))
        fail(object, "missing");
    Hdf5Handle h(H5Oopen(m_file.id(), object.c_str(), H5P_DEFAULT), closeObject);
    if (!h.valid())
        fail(object, "cannot be opened" + hdf5Detail());
    return h;
}

Hdf5Handle Hdf5File::openDataset(const std::string& dataset) const
{
    if (!exists(dataset))
        fail(dataset, "missing");
    Hdf5Handle h(H5Dopen2(m_file.id(), dataset.c_str(), H5P_DEFAULT), closeDataset);
    if (!h.valid())
        fail(dataset, "is not a dataset or cannot be opened" + hdf5Detail());
    return h;
}

void Hdf5File::requireChecksummed(hid_t dataset, const std::string& name) const
{
    Hdf5Handle space(H5Dget_space(dataset), closeSpace);
    if (H5Sget_simple_extent_npoints(space.id()) == 0)
        return;
    Hdf5Handle dcpl(H5Dget_create_plist(dataset), closePlist);
    unsigned flags = 0, config = 0;
    std::size_t n = 0;
    if (H5Pget_layout(dcpl.id()) != H5D_CHUNKED ||
        H5Pget_filter_by_id2(dcpl.id(), H5Z_FILTER_FLETCHER32, &flags, &n, nullptr, 0, nullptr, &config) < 0)
        fail(name, "is stored without its Fletcher32 checksum, which format v2 requires on every dataset");
}

std::uint64_t Hdf5File::fileSize() const
{
    hsize_t size = 0;
    H5Fget_filesize(m_file.id(), &size);
    return size;
}

void Hdf5File::requirePlausibleSize(const std::string& dataset, std::uint64_t bytes) const
{
    // No filter in a bundle compresses, so the data cannot be larger than the file that
    // holds it: a declared size beyond that is refused before anything is allocated.
    const std::uint64_t size = fileSize();
    if (bytes > size)
        fail(dataset, "declares " + std::to_string(bytes) + " bytes of data, more than the whole file holds (" +
                          std::to_string(size) + " bytes)");
}

std::int64_t Hdf5File::elementCount(const std::vector<std::int64_t>& shape)
{
    std::int64_t n = 1;
    for (std::int64_t d : shape)
        if (d < 0 || __builtin_mul_overflow(n, d, &n))
            return -1;
    return n;
}

namespace {
// Unwritten parts of a dataset read back as the fill value (zeros) without any error: a
// writer that died half-way must not pass for data.
void requireWritten(const Hdf5File& file, hid_t dataset, const std::string& name)
{
    H5D_space_status_t status;
    if (H5Dget_space_status(dataset, &status) < 0)
        file.fail(name, "cannot be inspected");
    Hdf5Handle space(H5Dget_space(dataset), closeSpace);
    if (H5Sget_simple_extent_npoints(space.id()) == 0 || status == H5D_SPACE_STATUS_ALLOCATED)
        return;
    const std::string unwritten = "holds parts that were never written (an unfinished file?)";
    if (status != H5D_SPACE_STATUS_PART_ALLOCATED)
        file.fail(name, unwritten);
    // HDF5 calls a chunked dataset whose edge chunks overhang its extent "partly allocated"
    // even when every chunk was written: count the chunks instead.
    Hdf5Handle dcpl(H5Dget_create_plist(dataset), closePlist);
    if (H5Pget_layout(dcpl.id()) != H5D_CHUNKED)
        file.fail(name, unwritten);
    const int rank = H5Sget_simple_extent_ndims(space.id());
    std::vector<hsize_t> dims(static_cast<std::size_t>(rank)), chunk(static_cast<std::size_t>(rank));
    H5Sget_simple_extent_dims(space.id(), dims.data(), nullptr);
    H5Pget_chunk(dcpl.id(), rank, chunk.data());
    hsize_t expected = 1;
    for (int i = 0; i < rank; ++i)
        expected *= (dims[std::size_t(i)] + chunk[std::size_t(i)] - 1) / chunk[std::size_t(i)];
    hsize_t written = 0;
    if (H5Dget_num_chunks(dataset, space.id(), &written) < 0 || written < expected)
        file.fail(name, unwritten);
}
}  // namespace

namespace {
// Names listed by index with HDF5's two-call pattern: the length first, then the text.
// `nameAt(i, buffer, size)` returns the length, or < 0 on failure.
template <typename NameAt>
std::vector<std::string> indexedNames(const Hdf5File& file, const std::string& object, hsize_t count, NameAt&& nameAt,
                                      const char* problem)
{
    std::vector<std::string> names;
    for (hsize_t i = 0; i < count; ++i) {
        const ssize_t len = nameAt(i, nullptr, 0);
        if (len < 0)
            file.fail(object, problem);
        std::string name(std::size_t(len), '\0');
        nameAt(i, name.data(), std::size_t(len) + 1);
        names.push_back(name);
    }
    return names;
}
}  // namespace

std::vector<std::string> Hdf5File::children(const std::string& group) const
{
    if (!isGroup(group))
        fail(group, "missing or not a group");
    Hdf5Handle g(H5Gopen2(m_file.id(), group.c_str(), H5P_DEFAULT), closeGroup);
    H5G_info_t info;
    if (H5Gget_info(g.id(), &info) < 0)
        fail(group, "cannot be listed");
    // Creation order is tracked only when the writer asked for it; name order otherwise.
    Hdf5Handle gcpl(H5Gget_create_plist(g.id()), closePlist);
    unsigned flags = 0;
    H5Pget_link_creation_order(gcpl.id(), &flags);
    const H5_index_t index = (flags & H5P_CRT_ORDER_TRACKED) ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME;
    return indexedNames(*this, group, info.nlinks, [&](hsize_t i, char* buffer, std::size_t size) {
        return H5Lget_name_by_idx(g.id(), ".", index, H5_ITER_INC, i, buffer, size, H5P_DEFAULT);
    }, "cannot be listed");
}

bool Hdf5File::hasAttribute(const std::string& object, const std::string& name) const
{
    if (!exists(object))
        return false;
    const htri_t found = H5Aexists_by_name(m_file.id(), object.c_str(), name.c_str(), H5P_DEFAULT);
    if (found < 0)  // the object's header cannot be read (it fails its checksum): not a missing attribute
        fail(object, "cannot be read to look for attribute '" + name + "' (a damaged header?)" + readProblem());
    return found > 0;
}

std::vector<std::string> Hdf5File::attributeNames(const std::string& object) const
{
    Hdf5Handle obj = openObject(object);
    H5O_info_t info;
    if (H5Oget_info(obj.id(), &info) < 0)
        fail(object, "cannot list attributes");
    return indexedNames(*this, object, info.num_attrs, [&](hsize_t i, char* buffer, std::size_t size) {
        return H5Aget_name_by_idx(obj.id(), ".", H5_INDEX_NAME, H5_ITER_INC, i, buffer, size, H5P_DEFAULT);
    }, "cannot list attributes");
}

Hdf5Handle Hdf5File::openAttribute(const std::string& object, const std::string& name) const
{
    if (!hasAttribute(object, name))
        fail(object, "attribute '" + name + "' is missing");
    Hdf5Handle a(H5Aopen_by_name(m_file.id(), object.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT),
                 closeAttribute);
    if (!a.valid())
        fail(object, "attribute '" + name + "' cannot be opened");
    return a;
}

std::string Hdf5File::readStringAttribute(const std::string& object, const std::string& name) const
{
    Hdf5Handle a = openAttribute(object, name);
    Hdf5Handle type(H5Aget_type(a.id()), closeType);
    Hdf5Handle space(H5Aget_space(a.id()), closeSpace);
    if (H5Tget_class(type.id()) != H5T_STRING || H5Sget_simple_extent_npoints(space.id()) != 1)
        fail(object, "attribute '" + name + "' must be a single string");
    if (H5Tis_variable_str(type.id()) > 0) {
        if (m_checksumsRequired)
            fail(object, "attribute '" + name + "' is a variable-length string; format v2 stores fixed-length ones");
        Hdf5Handle mem = variableStringType(type.id());
        char* value = nullptr;
        if (H5Aread(a.id(), mem.id(), &value) < 0)
            fail(object, "attribute '" + name + "' cannot be read");
        std::string s = value ? value : "";
        H5free_memory(value);
        return s;
    }
    const std::size_t size = H5Tget_size(type.id());
    if (size > (1 << 20))
        fail(object, "attribute '" + name + "' declares a string of " + std::to_string(size) + " bytes");
    std::string s(size, '\0');
    if (H5Aread(a.id(), type.id(), s.data()) < 0)
        fail(object, "attribute '" + name + "' cannot be read" + hdf5Detail());
    s.resize(std::strlen(s.c_str()));
    return s;
}

std::int64_t Hdf5File::readIntAttribute(const std::string& object, const std::string& name) const
{
    Hdf5Handle a = openAttribute(object, name);
    Hdf5Handle type(H5Aget_type(a.id()), closeType);
    Hdf5Handle space(H5Aget_space(a.id()), closeSpace);
    if (H5Tget_class(type.id()) != H5T_INTEGER || H5Sget_simple_extent_npoints(space.id()) != 1)
        fail(object, "attribute '" + name + "' must be a single integer");
    std::int64_t value = 0;
    if (H5Aread(a.id(), H5T_NATIVE_INT64, &value) < 0)
        fail(object, "attribute '" + name + "' cannot be read");
    return value;
}

double Hdf5File::readDoubleAttribute(const std::string& object, const std::string& name) const
{
    Hdf5Handle a = openAttribute(object, name);
    Hdf5Handle type(H5Aget_type(a.id()), closeType);
    Hdf5Handle space(H5Aget_space(a.id()), closeSpace);
    const H5T_class_t cls = H5Tget_class(type.id());
    if ((cls != H5T_FLOAT && cls != H5T_INTEGER) || H5Sget_simple_extent_npoints(space.id()) != 1)
        fail(object, "attribute '" + name + "' must be a single number");
    double value = 0;
    if (H5Aread(a.id(), H5T_NATIVE_DOUBLE, &value) < 0)
        fail(object, "attribute '" + name + "' cannot be read");
    return value;
}

DatasetInfo Hdf5File::datasetInfo(const std::string& dataset) const
{
    Hdf5Handle d = openDataset(dataset);
    Hdf5Handle space(H5Dget_space(d.id()), closeSpace);
    Hdf5Handle type(H5Dget_type(d.id()), closeType);
    DatasetInfo info;
    const int rank = H5Sget_simple_extent_ndims(space.id());
    if (rank < 0)
        fail(dataset, "has an unreadable dataspace");
    std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
    H5Sget_simple_extent_dims(space.id(), dims.data(), nullptr);
    info.shape.assign(dims.begin(), dims.end());
    info.typeClass = H5Tget_class(type.id());
    info.typeSize = H5Tget_size(type.id());
    info.isSigned = info.typeClass == H5T_INTEGER && H5Tget_sign(type.id()) == H5T_SGN_2;
    Hdf5Handle dcpl(H5Dget_create_plist(d.id()), closePlist);
    if (dcpl.valid() && H5Pget_layout(dcpl.id()) == H5D_CHUNKED) {
        std::vector<hsize_t> chunk(dims.size());
        if (H5Pget_chunk(dcpl.id(), rank, chunk.data()) == rank)
            info.chunk.assign(chunk.begin(), chunk.end());
    }
    return info;
}

std::string Hdf5File::readString(const std::string& dataset) const
{
    const std::vector<std::string> values = readStrings(dataset);
    if (values.size() != 1)
        fail(dataset, "must hold a single string");
    return values.front();
}

std::vector<std::string> Hdf5File::readStrings(const std::string& dataset) const
{
    Hdf5Handle d = openForReading(dataset);
    Hdf5Handle type(H5Dget_type(d.id()), closeType);
    Hdf5Handle space(H5Dget_space(d.id()), closeSpace);
    if (H5Tget_class(type.id()) != H5T_STRING)
        fail(dataset, "must hold strings");
    const hssize_t n = H5Sget_simple_extent_npoints(space.id());
    if (n < 0 || n > (1 << 26))
        fail(dataset, "has an absurd number of strings");
    std::vector<std::string> out;
    if (H5Tis_variable_str(type.id()) > 0) {
        if (m_checksumsRequired)
            fail(dataset, "holds variable-length strings; format v2 stores fixed-length ones");
        Hdf5Handle mem = variableStringType(type.id());
        std::vector<char*> raw(std::size_t(n), nullptr);
        if (H5Dread(d.id(), mem.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data()) < 0)
            fail(dataset, "cannot be read" + readProblem());
        for (char* s : raw)
            out.emplace_back(s ? s : "");
        H5Dvlen_reclaim(mem.id(), space.id(), H5P_DEFAULT, raw.data());
    } else {
        const std::size_t size = H5Tget_size(type.id());
        requirePlausibleSize(dataset, std::uint64_t(n) * size);
        std::vector<char> buffer(std::size_t(n) * size);
        if (H5Dread(d.id(), type.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer.data()) < 0)
            fail(dataset, "cannot be read" + readProblem());
        for (hssize_t i = 0; i < n; ++i) {
            const char* p = buffer.data() + std::size_t(i) * size;
            out.emplace_back(p, strnlen(p, size));
        }
    }
    return out;
}

Hdf5Handle Hdf5File::openForReading(const std::string& dataset) const
{
    Hdf5Handle d = openDataset(dataset);
    if (m_checksumsRequired)
        requireChecksummed(d.id(), dataset);
    requireWritten(*this, d.id(), dataset);
    return d;
}

std::vector<std::int64_t> Hdf5File::readIntegers(const std::string& dataset, std::int64_t maxElements) const
{
    const DatasetInfo info = datasetInfo(dataset);
    if (info.typeClass != H5T_INTEGER)
        fail(dataset, "must hold integers");
    const std::int64_t n = elementCount(info.shape);
    if (n < 0 || n > maxElements)
        fail(dataset, "declares an absurd size (shape [" + std::to_string(info.shape.empty() ? 0 : info.shape[0]) + ", ...])");
    requirePlausibleSize(dataset, std::uint64_t(n) * info.typeSize);
    std::vector<std::int64_t> out(static_cast<std::size_t>(n));
    Hdf5Handle d = openForReading(dataset);
    if (n > 0 && H5Dread(d.id(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0)
        fail(dataset, "cannot be read" + readProblem());
    return out;
}

std::vector<float> Hdf5File::readFloats(const std::string& dataset, std::int64_t maxElements) const
{
    const DatasetInfo info = datasetInfo(dataset);
    if (info.typeClass != H5T_FLOAT || (info.typeSize != 4 && info.typeSize != 8))
        fail(dataset, "must hold float32 or float64 values");
    const std::int64_t n = elementCount(info.shape);
    if (n < 0 || n > maxElements)
        fail(dataset, "declares an absurd size (shape [" + std::to_string(info.shape.empty() ? 0 : info.shape[0]) + ", ...])");
    requirePlausibleSize(dataset, std::uint64_t(n) * info.typeSize);
    std::vector<float> out(static_cast<std::size_t>(n));
    Hdf5Handle d = openForReading(dataset);
    if (n > 0 && H5Dread(d.id(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0)
        fail(dataset, "cannot be read" + readProblem());
    return out;
}

void Hdf5File::readRaw(const std::string& dataset, hid_t memType, void* dst, const std::vector<std::int64_t>* rows,
                       std::vector<ChunkRowRead>* deferred) const
{
    Hdf5Handle d = openForReading(dataset);
    Hdf5Handle fileSpace(H5Dget_space(d.id()), closeSpace);
    const int rank = H5Sget_simple_extent_ndims(fileSpace.id());
    std::vector<hsize_t> dims(static_cast<std::size_t>(std::max(rank, 0)));
    H5Sget_simple_extent_dims(fileSpace.id(), dims.data(), nullptr);
    if (rank < 1 || (rows && rows->empty()))  // a scalar, or nothing wanted
        return rows ? void() : readWhole(d.id(), memType, dst, dataset);
    std::size_t rowBytes = H5Tget_size(memType);
    for (int i = 1; i < rank; ++i)
        rowBytes *= std::size_t(dims[std::size_t(i)]);
    std::vector<std::int64_t> all;
    if (!rows) {
        all.resize(std::size_t(dims[0]));
        for (std::size_t i = 0; i < all.size(); ++i)
            all[i] = std::int64_t(i);
        rows = &all;
    }
    for (std::size_t i = 0; i < rows->size(); ++i)  // sorted and unique (the caller's promise, checked)
        if ((*rows)[i] < 0 || hsize_t((*rows)[i]) >= dims[0] || (i > 0 && (*rows)[i] <= (*rows)[i - 1]))
            fail(dataset, "row " + std::to_string((*rows)[i]) + " out of range or out of order");
    if (const std::optional<RowChunking> chunking = m_raw ? rowChunking(d.id(), memType, dims, rowBytes) : std::nullopt) {
        auto* out = static_cast<unsigned char*>(dst);
        // Many checksummed chunks (the engine's blocks, one chunk each): libhdf5 1.10 finds a
        // chunk's address only by walking its index from the start (7 us a chunk in a pool of
        // 500 blocks, growing with the pool), but reads a chunk by direct lookup (2 us with
        // the read): read here, under the lock. One chunk (a reference): located once, read
        // straight from the file (deferred: without the lock).
        if (chunking->checksummed && dims[0] > chunking->chunkRows)
            return readChunksDirect(d.id(), *chunking, *rows, out, dataset, rank);
        ChunkRowRead read = planChunkReads(d.id(), *chunking, *rows, out, dataset, rank);
        if (deferred)
            deferred->push_back(std::move(read));
        else
            read.run();
        return;
    }
    if (rows == &all)
        return readWhole(d.id(), memType, dst, dataset);
    // Otherwise one plain read per run of consecutive rows: a union of single-row hyperslabs
    // costs HDF5 far more in selection bookkeeping than the data itself.
    std::vector<hsize_t> start(static_cast<std::size_t>(rank), 0), count = dims;
    auto* out = static_cast<unsigned char*>(dst);
    for (std::size_t first = 0; first < rows->size();) {
        std::size_t last = first;
        while (last + 1 < rows->size() && (*rows)[last + 1] == (*rows)[last] + 1)
            ++last;
        start[0] = hsize_t((*rows)[first]);
        count[0] = hsize_t(last - first + 1);
        H5Sselect_hyperslab(fileSpace.id(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
        Hdf5Handle memSpace(H5Screate_simple(rank, count.data(), nullptr), closeSpace);
        if (H5Dread(d.id(), memType, memSpace.id(), fileSpace.id(), H5P_DEFAULT, out + first * rowBytes) < 0)
            fail(dataset, "cannot be read" + readProblem());
        requireNotShrunk(dataset);
        first = last + 1;
    }
}

namespace {

// Whether a dataset's chunks can be read as stored: chunked, and unfiltered (false) or with just
// the Fletcher32 checksum appended (true); nullopt otherwise.
std::optional<bool> chunksAsStored(hid_t d)
{
    Hdf5Handle dcpl(H5Dget_create_plist(d), closePlist);
    if (H5Pget_layout(dcpl.id()) != H5D_CHUNKED)
        return std::nullopt;
    const int filters = H5Pget_nfilters(dcpl.id());
    unsigned flags = 0, config = 0;
    std::size_t n = 0;
    const bool checksummed = filters == 1 && H5Pget_filter2(dcpl.id(), 0, &flags, &n, nullptr, 0, nullptr, &config) ==
                                                 H5Z_FILTER_FLETCHER32;
    if (filters != 0 && !checksummed)
        return std::nullopt;
    return checksummed;
}

// A box of a chunked dataset read chunk by chunk as stored (no filter run), each chunk's
// Fletcher32 verified here. libhdf5's own path sums every chunk with a scalar Fletcher32 and
// copies it through its chunk cache: a long reference (chunks of 1 MiB along the positions)
// read a window at a time spent a quarter of the analysis there. A chunk wholly inside the box
// is read by one preadv of `raw` straight into its places (a reference's chunk: a piece per
// head), its checksum summed over the pieces in order; one the box cuts is read aside
// (H5Dread_chunk) and its part copied out. False, nothing read, unless every chunk is stored
// whole as the memory type wants it, unfiltered or with just the checksum.
bool readBoxByChunks(const Hdf5File& file, const PlainFile* raw, hid_t d, hid_t memType, const std::vector<hsize_t>& first,
                     const std::vector<hsize_t>& extent, unsigned char* dst, const std::string& dataset)
{
    const std::optional<bool> asStored = chunksAsStored(d);
    if (!asStored)
        return false;
    const bool checksummed = *asStored;
    Hdf5Handle dcpl(H5Dget_create_plist(d), closePlist);
    const std::size_t rank = first.size();
    std::vector<hsize_t> chunk(rank);
    if (rank == 0 || H5Pget_chunk(dcpl.id(), int(rank), chunk.data()) != int(rank))
        return false;
    Hdf5Handle fileType(H5Dget_type(d), H5Tclose);
    if (H5Tequal(fileType.id(), memType) <= 0)
        return false;
    const std::size_t element = H5Tget_size(memType);
    std::size_t chunkBytes = element;
    for (hsize_t c : chunk) {
        if (c == 0)
            return false;
        chunkBytes *= std::size_t(c);
    }
    // Chunk after chunk of the box, the last axis fastest: `at` is the chunk's first element.
    std::vector<hsize_t> lo(rank), hi(rank), at(rank);
    for (std::size_t i = 0; i < rank; ++i) {
        if (extent[i] == 0)
            return true;
        lo[i] = first[i] / chunk[i] * chunk[i];
        hi[i] = first[i] + extent[i];
    }
    const auto forEachChunk = [&](auto&& visit) {
        at = lo;
        for (;;) {
            if (!visit())
                return false;
            std::size_t i = rank;
            while (i > 0 && (at[i - 1] += chunk[i - 1]) >= hi[i - 1]) {
                at[i - 1] = lo[i - 1];
                --i;
            }
            if (i == 0)
                return true;
        }
    };
    const std::size_t stored = chunkBytes + (checksummed ? 4 : 0);
    // Every chunk written, whole (else libhdf5's fill values and its errors, as before).
    if (!forEachChunk([&] {
            hsize_t size = 0;
            return H5Dget_chunk_storage_size(d, at.data(), &size) >= 0 && size == stored;
        }))
        return false;
    std::vector<unsigned char> scratch;
    std::vector<hsize_t> from(rank), to(rank), index(rank);
    std::vector<iovec> pieces, read;
    // The box's part of the chunk at `at`, a run of the last axis at a time, as (offset in the
    // chunk, offset in dst, bytes); consecutive runs contiguous on both sides joined.
    const auto forEachRun = [&](auto&& visit) {
        for (std::size_t i = 0; i < rank; ++i) {
            from[i] = std::max(at[i], first[i]);
            to[i] = std::min(at[i] + chunk[i], hi[i]);
        }
        const std::size_t run = std::size_t(to[rank - 1] - from[rank - 1]) * element;
        index = from;
        std::size_t joinedSource = 0, joinedTarget = 0, joined = 0;
        for (;;) {
            std::size_t source = 0, target = 0;
            for (std::size_t i = 0; i < rank; ++i) {
                source = source * std::size_t(chunk[i]) + std::size_t(index[i] - at[i]);
                target = target * std::size_t(extent[i]) + std::size_t(index[i] - first[i]);
            }
            source *= element, target *= element;
            if (joined && source == joinedSource + joined && target == joinedTarget + joined) {
                joined += run;
            } else {
                if (joined)
                    visit(joinedSource, joinedTarget, joined);
                joinedSource = source, joinedTarget = target, joined = run;
            }
            std::size_t i = rank - 1;
            while (i > 0 && ++index[i - 1] >= to[i - 1]) {
                index[i - 1] = from[i - 1];
                --i;
            }
            if (i == 0)
                break;
        }
        visit(joinedSource, joinedTarget, joined);
    };
    const auto whollyInside = [&] {
        for (std::size_t i = 0; i < rank; ++i)
            if (at[i] < first[i] || at[i] + chunk[i] > hi[i])
                return false;
        return true;
    };
    const auto corrupt = [&] { file.fail(dataset, "cannot be read: its checksum does not match, the file is corrupt"); };
    forEachChunk([&] {  // (failing as libhdf5's path does)
        unsigned filterMask = 0;
        haddr_t address = HADDR_UNDEF;
        hsize_t size = 0;
        if (raw && whollyInside() && H5Dget_chunk_info_by_coord(d, at.data(), &filterMask, &address, &size) >= 0 &&
            address != HADDR_UNDEF && size == stored && filterMask == 0) {
            pieces.clear();
            bool even = true;
            forEachRun([&](std::size_t, std::size_t target, std::size_t bytes) {
                pieces.push_back({dst + target, bytes});
                even = even && bytes % 2 == 0;
            });
            unsigned char sum[4];
            if (checksummed)
                pieces.push_back({sum, 4});
            if (even && pieces.size() <= IOV_MAX) {
                read = pieces;  // (preadFully advances the pieces it reads)
                if (!preadFully(raw->fd, read.data(), int(read.size()), off_t(raw->base + address))) {
                    file.requireNotShrunk(dataset);
                    file.fail(dataset, "cannot be read: a chunk lies beyond the end of the file (truncated?)");
                }
                if (checksummed) {
                    Fletcher32Sum check;
                    for (std::size_t i = 0; i + 1 < pieces.size(); ++i)
                        check.add(static_cast<const unsigned char*>(pieces[i].iov_base), pieces[i].iov_len);
                    if (check.finish() != storedFletcher32(sum))
                        corrupt();
                }
                return true;
            }
        }
        scratch.resize(stored);
        std::uint32_t mask = 0;
        if (H5Dread_chunk(d, H5P_DEFAULT, at.data(), &mask, scratch.data()) < 0)
            file.fail(dataset, "cannot be read" + readProblem());
        if (mask != 0 || (checksummed && !fletcher32Matches(scratch.data(), chunkBytes, scratch.data() + chunkBytes)))
            corrupt();
        forEachRun([&](std::size_t source, std::size_t target, std::size_t bytes) {
            std::memcpy(dst + target, scratch.data() + source, bytes);
        });
        return true;
    });
    return true;
}

}  // namespace

void Hdf5File::readSlab(const std::string& dataset, hid_t memType, void* dst, const std::vector<std::int64_t>& start,
                        const std::vector<std::int64_t>& count) const
{
    Hdf5Handle d = openForReading(dataset);
    Hdf5Handle fileSpace(H5Dget_space(d.id()), closeSpace);
    const int rank = H5Sget_simple_extent_ndims(fileSpace.id());
    std::vector<hsize_t> dims(static_cast<std::size_t>(std::max(rank, 0)));
    H5Sget_simple_extent_dims(fileSpace.id(), dims.data(), nullptr);
    if (start.size() != dims.size() || count.size() != dims.size())
        fail(dataset, "read with a box of " + std::to_string(start.size()) + " dimensions, it has " + std::to_string(rank));
    for (std::size_t i = 0; i < dims.size(); ++i)
        if (start[i] < 0 || count[i] < 0 || hsize_t(start[i]) + hsize_t(count[i]) > dims[i])
            fail(dataset, "the box read leaves its shape at dimension " + std::to_string(i));
    if (Hdf5File::elementCount(count) == 0)
        return;
    const std::vector<hsize_t> first(start.begin(), start.end()), extent(count.begin(), count.end());
    if (readBoxByChunks(*this, m_raw.get(), d.id(), memType, first, extent, static_cast<unsigned char*>(dst), dataset))
        return requireNotShrunk(dataset);  // chunks read past a new end are zeros, which pass their checksums
    H5Sselect_hyperslab(fileSpace.id(), H5S_SELECT_SET, first.data(), nullptr, extent.data(), nullptr);
    Hdf5Handle memSpace(H5Screate_simple(rank, extent.data(), nullptr), closeSpace);
    if (H5Dread(d.id(), memType, memSpace.id(), fileSpace.id(), H5P_DEFAULT, dst) < 0)
        fail(dataset, "cannot be read" + readProblem());
    requireNotShrunk(dataset);
}

void Hdf5File::requireNotShrunk(const std::string& dataset) const
{
    // libhdf5 reads past the end of a file cut short while open as zeros, and a chunk of zeros
    // passes its Fletcher32 checksum (the sum of zeros is zero): only the file's size tells.
    struct stat now {};
    if (m_raw && m_raw->bytes > 0 && ::fstat(m_raw->fd, &now) == 0 && std::uint64_t(now.st_size) < m_raw->bytes)
        fail(dataset, "the file was cut short while open (" + std::to_string(m_raw->bytes) + " bytes when opened, " +
                          std::to_string(now.st_size) + " now): what was read of it cannot be trusted");
}

void Hdf5File::readWhole(hid_t dataset, hid_t memType, void* dst, const std::string& name) const
{
    Hdf5Handle space(H5Dget_space(dataset), closeSpace);
    if (const int rank = H5Sget_simple_extent_ndims(space.id()); rank > 0) {
        std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
        H5Sget_simple_extent_dims(space.id(), dims.data(), nullptr);
        if (readBoxByChunks(*this, m_raw.get(), dataset, memType, std::vector<hsize_t>(dims.size(), 0), dims,
                            static_cast<unsigned char*>(dst), name))
            return requireNotShrunk(name);
    }
    if (H5Dread(dataset, memType, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst) < 0)
        fail(name, "cannot be read" + readProblem());
    requireNotShrunk(name);
}

std::optional<RowChunking> Hdf5File::rowChunking(hid_t d, hid_t memType, const std::vector<hsize_t>& dims,
                                                std::size_t rowBytes) const
{
    // Only chunks of whole rows, stored exactly as the memory type wants them, unfiltered or
    // with just the Fletcher32 checksum appended: then a chunk's bytes on disk are the rows
    // themselves, and the checksum is verified here.
    const std::optional<bool> asStored = chunksAsStored(d);
    if (!asStored)
        return std::nullopt;
    const bool checksummed = *asStored;
    Hdf5Handle dcpl(H5Dget_create_plist(d), closePlist);
    const int rank = int(dims.size());
    std::vector<hsize_t> chunk(dims.size());
    if (H5Pget_chunk(dcpl.id(), rank, chunk.data()) != rank || chunk[0] == 0)
        return std::nullopt;
    for (int i = 1; i < rank; ++i)
        if (chunk[std::size_t(i)] != dims[std::size_t(i)])
            return std::nullopt;
    Hdf5Handle fileType(H5Dget_type(d), H5Tclose);
    if (H5Tequal(fileType.id(), memType) <= 0)
        return std::nullopt;
    return RowChunking{rowBytes, chunk[0], dims[0], checksummed};
}

ChunkRowRead Hdf5File::planChunkReads(hid_t d, const RowChunking& chunking, const std::vector<std::int64_t>& rows,
                                      unsigned char* out, const std::string& dataset, int rank) const
{
    ChunkRowRead read(m_raw, m_path, dataset, chunking, rows, out);
    const std::size_t storedBytes = std::size_t(chunking.chunkRows) * chunking.rowBytes + (chunking.checksummed ? 4 : 0);
    std::vector<std::uint64_t> addresses;
    std::vector<hsize_t> offset(std::size_t(rank), 0);
    for (const ChunkRun& chunk : read.chunks()) {
        offset[0] = chunk.firstRow;
        unsigned filterMask = 0;
        haddr_t address = HADDR_UNDEF;
        hsize_t stored = 0;
        if (H5Dget_chunk_info_by_coord(d, offset.data(), &filterMask, &address, &stored) < 0 ||
            address == HADDR_UNDEF || stored != storedBytes || filterMask != 0)
            fail(dataset, "chunk at row " + std::to_string(chunk.firstRow) + " is missing or of the wrong size (truncated file?)");
        addresses.push_back(address);
    }
    read.setAddresses(std::move(addresses));
    return read;
}

void Hdf5File::readChunksDirect(hid_t d, const RowChunking& c, const std::vector<std::int64_t>& rows, unsigned char* out,
                                const std::string& dataset, int rank) const
{
    const std::size_t chunkBytes = std::size_t(c.chunkRows) * c.rowBytes;
    std::vector<unsigned char> scratch(chunkBytes + 4);
    std::vector<hsize_t> offset(std::size_t(rank), 0);
    for (const ChunkRun& chunk : chunkRuns(rows, c.chunkRows)) {
        offset[0] = chunk.firstRow;
        const auto fault = [&](const char* what) {  // (the message made only when it is needed)
            fail(dataset, "chunk at row " + std::to_string(chunk.firstRow) + what);
        };
        hsize_t stored = 0;
        if (H5Dget_chunk_storage_size(d, offset.data(), &stored) < 0 || stored != scratch.size())
            fault(" is missing or of the wrong size (truncated file?)");
        std::uint32_t filterMask = 0;
        if (H5Dread_chunk(d, H5P_DEFAULT, offset.data(), &filterMask, scratch.data()) < 0)
            fault(" lies beyond the end of the file (truncated?)");
        if (filterMask != 0 || !fletcher32Matches(scratch.data(), chunkBytes, scratch.data() + chunkBytes))
            fault(" does not match its Fletcher32 checksum: the file is corrupt");
        for (std::size_t k = chunk.begin; k < chunk.end; ++k)
            std::memcpy(out + k * c.rowBytes, scratch.data() + (std::uint64_t(rows[k]) - chunk.firstRow) * c.rowBytes,
                        c.rowBytes);
    }
    requireNotShrunk(dataset);  // chunks read past a new end are zeros, which pass their checksums
}

void Hdf5File::createGroup(const std::string& group)
{
    if (exists(group))
        return;
    const std::string parent = parentOf(group);
    if (parent != "/" && !exists(parent))
        createGroup(parent);
    Hdf5Handle gcpl(H5Pcreate(H5P_GROUP_CREATE), closePlist);
    H5Pset_link_creation_order(gcpl.id(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
    Hdf5Handle g(H5Gcreate2(m_file.id(), group.c_str(), H5P_DEFAULT, gcpl.id(), H5P_DEFAULT), closeGroup);
    if (!g.valid())
        fail(group, "cannot create group");
}

namespace {
template <typename Writer>
void writeAttribute(const Hdf5File& file, hid_t fileId, const std::string& object,
                    const std::string& name, hid_t type, Writer&& write)
{
    Hdf5Handle obj(H5Oopen(fileId, object.c_str(), H5P_DEFAULT), closeObject);
    if (!obj.valid())
        file.fail(object, "cannot open to write attribute '" + name + "'");
    if (H5Aexists(obj.id(), name.c_str()) > 0)
        H5Adelete(obj.id(), name.c_str());
    Hdf5Handle space(H5Screate(H5S_SCALAR), closeSpace);
    Hdf5Handle a(H5Acreate2(obj.id(), name.c_str(), type, space.id(), H5P_DEFAULT, H5P_DEFAULT),
                 closeAttribute);
    if (!a.valid() || write(a.id()) < 0)
        file.fail(object, "cannot write attribute '" + name + "'");
}
}  // namespace

void Hdf5File::writeStringAttribute(const std::string& object, const std::string& name,
                                    const std::string& value)
{
    Hdf5Handle type = fixedStringType(value.size());
    std::string padded = value;
    padded.resize(H5Tget_size(type.id()), '\0');
    writeAttribute(*this, m_file.id(), object, name, type.id(),
                   [&](hid_t a) { return H5Awrite(a, type.id(), padded.data()); });
}

void Hdf5File::writeIntAttribute(const std::string& object, const std::string& name, std::int64_t value)
{
    writeAttribute(*this, m_file.id(), object, name, H5T_STD_I64LE,
                   [&](hid_t a) { return H5Awrite(a, H5T_NATIVE_INT64, &value); });
}

void Hdf5File::writeDoubleAttribute(const std::string& object, const std::string& name, double value)
{
    writeAttribute(*this, m_file.id(), object, name, H5T_IEEE_F64LE,
                   [&](hid_t a) { return H5Awrite(a, H5T_NATIVE_DOUBLE, &value); });
}

void Hdf5File::writeString(const std::string& dataset, const std::string& value)
{
    writeStrings(dataset, {value});  // one element: a scalar dataset cannot be chunked, so not checksummed
}

void Hdf5File::writeStrings(const std::string& dataset, const std::vector<std::string>& values)
{
    createGroup(parentOf(dataset));
    std::size_t width = 1;
    for (const std::string& s : values)
        width = std::max(width, s.size());
    Hdf5Handle type = fixedStringType(width);
    std::string packed(values.size() * width, '\0');
    for (std::size_t i = 0; i < values.size(); ++i)
        packed.replace(i * width, values[i].size(), values[i]);
    const hsize_t n = values.size();
    Hdf5Handle space(H5Screate_simple(1, &n, nullptr), closeSpace);
    // Chunks of at most ~1 MiB, each with its checksum.
    const Hdf5Handle dcpl = n > 0 ? checksummedChunks({std::clamp<hsize_t>((1 << 20) / width, 1, n)})
                                  : Hdf5Handle(H5Pcreate(H5P_DATASET_CREATE), closePlist);
    Hdf5Handle d(H5Dcreate2(m_file.id(), dataset.c_str(), type.id(), space.id(), H5P_DEFAULT, dcpl.id(), H5P_DEFAULT),
                 closeDataset);
    if (!d.valid() || (n > 0 && H5Dwrite(d.id(), type.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, packed.data()) < 0))
        fail(dataset, "cannot be written");
}

void Hdf5File::writeRaw(const std::string& dataset, hid_t fileType, const std::vector<std::int64_t>& shape,
                        const void* src, std::int64_t chunkRows)
{
    // Rows of dimension 0: `chunkRows`, or ~1 MiB.
    std::int64_t rowBytes = std::int64_t(H5Tget_size(fileType));
    for (std::size_t i = 1; i < shape.size(); ++i)
        rowBytes *= std::max<std::int64_t>(1, shape[i]);
    std::vector<std::int64_t> chunk = shape;
    if (!chunk.empty())
        chunk[0] = chunkRows > 0 ? chunkRows : std::max<std::int64_t>(1, (1 << 20) / std::max<std::int64_t>(1, rowBytes));
    writeRawChunked(dataset, fileType, shape, src, chunk);
}

void Hdf5File::writeRawChunked(const std::string& dataset, hid_t fileType, const std::vector<std::int64_t>& shape,
                               const void* src, const std::vector<std::int64_t>& chunk)
{
    createGroup(parentOf(dataset));
    std::vector<hsize_t> dims(shape.begin(), shape.end());
    Hdf5Handle space(H5Screate_simple(int(dims.size()), dims.data(), nullptr), closeSpace);
    bool nonEmpty = true;  // (a scalar, no dimensions, holds one value)
    for (hsize_t d : dims)
        nonEmpty = nonEmpty && d > 0;
    // Every dataset with data is chunked and each chunk carries a Fletcher32 checksum, so a
    // flipped bit is an error, not a number (a scalar cannot be chunked).
    Hdf5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), closePlist);
    if (nonEmpty && !dims.empty()) {
        std::vector<hsize_t> chunkDims(dims.size());
        for (std::size_t i = 0; i < dims.size(); ++i)
            chunkDims[i] = std::clamp<hsize_t>(hsize_t(std::max<std::int64_t>(1, chunk.at(i))), 1, dims[i]);
        dcpl = checksummedChunks(chunkDims);
    }
    Hdf5Handle d(H5Dcreate2(m_file.id(), dataset.c_str(), fileType, space.id(), H5P_DEFAULT, dcpl.id(),
                            H5P_DEFAULT),
                 closeDataset);
    if (!d.valid())
        fail(dataset, "cannot be created");
    if (nonEmpty && H5Dwrite(d.id(), fileType, H5S_ALL, H5S_ALL, H5P_DEFAULT, src) < 0)
        fail(dataset, "cannot be written");
}

void Hdf5File::createCompressedFloats(const std::string& dataset, const std::vector<std::int64_t>& shape,
                                      const std::vector<std::int64_t>& chunk)
{
    createGroup(parentOf(dataset));
    const std::vector<hsize_t> dims(shape.begin(), shape.end());
    std::vector<hsize_t> chunkDims(dims.size());
    for (std::size_t i = 0; i < dims.size(); ++i)
        chunkDims[i] = std::clamp<hsize_t>(hsize_t(chunk.at(i)), 1, std::max<hsize_t>(1, dims[i]));
    Hdf5Handle space(H5Screate_simple(int(dims.size()), dims.data(), nullptr), closeSpace);
    Hdf5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), closePlist);
    H5Pset_chunk(dcpl.id(), int(chunkDims.size()), chunkDims.data());
    // Shuffling the bytes of floats first lets deflate find their repeated exponents; level 1
    // because the analysis waits on it. The checksum comes last, over the stored bytes.
    H5Pset_shuffle(dcpl.id());
    H5Pset_deflate(dcpl.id(), 1);
    H5Pset_fletcher32(dcpl.id());
    const float nan = std::numeric_limits<float>::quiet_NaN();
    H5Pset_fill_value(dcpl.id(), H5T_NATIVE_FLOAT, &nan);
    Hdf5Handle d(H5Dcreate2(m_file.id(), dataset.c_str(), H5T_IEEE_F32LE, space.id(), H5P_DEFAULT, dcpl.id(),
                            H5P_DEFAULT),
                 closeDataset);
    if (!d.valid())
        fail(dataset, "cannot be created" + hdf5Detail());
}

void Hdf5File::writeChunk(const std::string& dataset, const std::vector<std::int64_t>& offset,
                          const std::vector<unsigned char>& bytes)
{
    Hdf5Handle d = openDataset(dataset);
    const std::vector<hsize_t> at(offset.begin(), offset.end());
    if (H5Dwrite_chunk(d.id(), H5P_DEFAULT, 0, at.data(), bytes.size(), bytes.data()) < 0)
        fail(dataset, "a chunk cannot be written" + hdf5Detail());
}

}  // namespace kvscope
