// HDF5 checkpoints through the HDF5 C API: flat h5py state dicts (one dataset per tensor, named
// by its full dotted name, possibly in groups) and Keras layouts (legacy `.h5` from
// save_weights/save: `/[model_weights/]<layer>/<variable path>:0`, TF-transformers' `tf_model.h5`
// with `layer_._N`). Every dataset becomes a tensor named by its path with '/' turned into '.',
// the ':0' suffix dropped and `layer_._N` written `layer.N`, so the profiles' HF patterns match
// it as a suffix. Only metadata is read when the file is opened; a tensor's values are read on
// demand, converted by HDF5 itself to binary64 (exact for every float type it can hold).
#include <fmt/core.h>
#include <hdf5.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>

#include "mapped.hpp"

namespace normcheck::audit {
namespace detail {
namespace {

struct Quiet {
  Quiet() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }
};

struct Handle {
  hid_t id;
  herr_t (*close)(hid_t);
  ~Handle() {
    if (id >= 0) close(id);
  }
};

std::string normalize(std::string path) {
  if (!path.empty() && path[0] == '/') path.erase(0, 1);
  if (path.size() > 2 && path.compare(path.size() - 2, 2, ":0") == 0) path.resize(path.size() - 2);
  for (auto& ch : path)
    if (ch == '/') ch = '.';
  // Keras/TF-transformers write layer lists as layer_._N.
  for (std::size_t p = path.find("layer_._"); p != std::string::npos; p = path.find("layer_._", p + 1))
    if (p + 8 < path.size() && path[p + 8] >= '0' && path[p + 8] <= '9') path.replace(p, 8, "layer.");
  return path;
}

// The stored float type by its bit fields: HDF5 has no bf16 predefined type, the project and
// h5py users store it as a custom float (8 exponent, 7 mantissa bits).
std::string dtype_name(hid_t type) {
  const H5T_class_t cls = H5Tget_class(type);
  const std::size_t size = H5Tget_size(type);
  if (cls == H5T_FLOAT) {
    std::size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
    if (H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize) < 0) return "FLOAT?";
    if (size == 8 && esize == 11 && msize == 52) return "F64";
    if (size == 4 && esize == 8 && msize == 23) return "F32";
    if (size == 2 && esize == 5 && msize == 10) return "F16";
    if (size == 2 && esize == 8 && msize == 7) return "BF16";
    return fmt::format("FLOAT{}(e{},m{})", size * 8, esize, msize);
  }
  if (cls == H5T_INTEGER) return fmt::format("{}{}", H5Tget_sign(type) == H5T_SGN_NONE ? "U" : "I", size * 8);
  return fmt::format("HDF5_CLASS_{}", static_cast<int>(cls));
}

class Hdf5 final : public Checkpoint {
 public:
  Hdf5(const std::string& path, const std::uint8_t* image, std::size_t image_size) {
    static Quiet quiet;
    path_ = path;
    if (image) {
      Handle fapl{H5Pcreate(H5P_FILE_ACCESS), H5Pclose};
      if (fapl.id < 0 || H5Pset_fapl_core(fapl.id, 1 << 16, 0) < 0 ||
          H5Pset_file_image(fapl.id, const_cast<std::uint8_t*>(image), image_size) < 0)
        throw CheckpointError(path_, "cannot set up an HDF5 file image");
      file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.id);
    } else {
      file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    }
    if (file_ < 0) throw CheckpointError(path_, "HDF5 library cannot open it (truncated or corrupt)");
    try {
      scan();
    } catch (...) {
      H5Fclose(file_);
      throw;
    }
  }
  ~Hdf5() override { H5Fclose(file_); }
  const std::string& format() const override {
    static const std::string f = "hdf5";
    return f;
  }
  std::vector<double> read(const TensorInfo& t) const override { return read_dataset(file_, t, path_); }

  static std::vector<double> read_dataset(hid_t file, const TensorInfo& t, const std::string& path) {
    if (!t.readable) throw CheckpointError(path, fmt::format("tensor {}: dtype {} cannot be read as numbers", t.name, t.dtype));
    Handle ds{H5Dopen2(file, t.stored_name.c_str(), H5P_DEFAULT), H5Dclose};
    if (ds.id < 0) throw CheckpointError(path, fmt::format("tensor {}: cannot open dataset {}", t.name, t.stored_name));
    std::vector<double> out(t.elements);
    if (t.elements && H5Dread(ds.id, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0)
      throw CheckpointError(path, fmt::format("tensor {}: reading dataset {} failed (corrupt or truncated data)", t.name, t.stored_name));
    return out;
  }

 private:
  static constexpr std::size_t kMaxObjects = 1'000'000;

  static herr_t visit(hid_t group, const char* name, const H5L_info_t* info, void* self_ptr) {
    auto* self = static_cast<Hdf5*>(self_ptr);
    if (info->type != H5L_TYPE_HARD) return 0;  // soft and external links are not followed
    if (++self->visited_ > kMaxObjects) {
      self->error_ = fmt::format("more than {} objects", kMaxObjects);
      return -1;
    }
    Handle obj{H5Oopen(group, name, H5P_DEFAULT), H5Oclose};
    if (obj.id < 0 || H5Iget_type(obj.id) != H5I_DATASET) return 0;
    Handle space{H5Dget_space(obj.id), H5Sclose};
    Handle type{H5Dget_type(obj.id), H5Tclose};
    if (space.id < 0 || type.id < 0) {
      self->error_ = fmt::format("dataset {}: unreadable dataspace or type", name);
      return -1;
    }
    const int rank = H5Sget_simple_extent_ndims(space.id);
    if (rank < 0 || rank > 32) {
      self->error_ = fmt::format("dataset {}: rank {} is unreadable or absurd", name, rank);
      return -1;
    }
    TensorInfo t;
    t.stored_name = std::string("/") + name;
    t.name = normalize(name);
    std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
    if (rank > 0) H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
    t.elements = 1;
    for (auto d : dims) {
      t.shape.push_back(d);
      if (!mul_ok(t.elements, d, t.elements)) {
        self->error_ = fmt::format("dataset {}: element count overflows", name);
        return -1;
      }
    }
    t.dtype = dtype_name(type.id);
    t.readable = readable_size(t.dtype) != 0;
    self->tensors_.push_back(std::move(t));
    return 0;
  }

  void scan() {
    const herr_t r = H5Lvisit(file_, H5_INDEX_NAME, H5_ITER_INC, &Hdf5::visit, this);
    if (!error_.empty()) throw CheckpointError(path_, error_);
    if (r < 0) throw CheckpointError(path_, "walking the HDF5 groups failed (corrupt file)");
    // Root attributes that are numbers or strings (Keras: keras_version, backend).
    const int n = H5Aget_num_attrs(file_);
    for (int i = 0; i < n && i < 256; ++i) {
      Handle a{H5Aopen_by_idx(file_, ".", H5_INDEX_NAME, H5_ITER_INC, static_cast<hsize_t>(i), H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
      if (a.id < 0) continue;
      char name[256] = {};
      if (H5Aget_name(a.id, sizeof name, name) < 0) continue;
      Handle type{H5Aget_type(a.id), H5Tclose};
      Handle space{H5Aget_space(a.id), H5Sclose};
      if (type.id < 0 || space.id < 0 || H5Sget_simple_extent_npoints(space.id) != 1) continue;
      if (H5Tget_class(type.id) == H5T_STRING && !H5Tis_variable_str(type.id)) {
        const std::size_t size = H5Tget_size(type.id);
        if (size == 0 || size > 4096) continue;
        std::string s(size, '\0');
        if (H5Aread(a.id, type.id, s.data()) >= 0) metadata_[name] = s.substr(0, s.find('\0'));
      } else if (H5Tget_class(type.id) == H5T_FLOAT || H5Tget_class(type.id) == H5T_INTEGER) {
        double v = 0;
        if (H5Aread(a.id, H5T_NATIVE_DOUBLE, &v) >= 0) metadata_[name] = v;
      }
    }
  }

  hid_t file_ = -1;
  std::size_t visited_ = 0;
  std::string error_;
};

// Runs `work` in a forked child and returns what it produced. libhdf5 trusts sizes and
// addresses in the file more than a reader of untrusted files may: fuzzing found corrupt files
// on which Debian's libhdf5 1.10.8 dereferences a null pointer (README.md, "Fuzzing"). In a
// child, such a crash is an input error naming the file, not a crash of normcheck.
std::string in_child(const std::string& path, const std::string& what, const std::function<std::string()>& work) {
  int fds[2];
  if (::pipe(fds) != 0) throw CheckpointError(path, fmt::format("cannot create a pipe: {}", std::strerror(errno)));
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw CheckpointError(path, fmt::format("cannot fork: {}", std::strerror(errno)));
  }
  if (pid == 0) {
    ::close(fds[0]);
    std::string out;
    try {
      out = "K" + work();
    } catch (const CheckpointError& e) {
      out = std::string("E") + e.what();
    } catch (const std::exception& e) {
      out = std::string("E") + path + ": " + e.what();
    }
    for (std::size_t done = 0; done < out.size();) {
      const ssize_t n = ::write(fds[1], out.data() + done, out.size() - done);
      if (n <= 0) break;
      done += static_cast<std::size_t>(n);
    }
    ::_exit(0);  // no destructors or atexit handlers of the parent's state in the child
  }
  ::close(fds[1]);
  std::string out;
  char buf[1 << 16];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status))
    throw CheckpointError(path, fmt::format("the HDF5 library crashed (signal {}) {}: the file is corrupt", WTERMSIG(status), what));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || out.empty())
    throw CheckpointError(path, fmt::format("the HDF5 reader failed (exit status {}) {}: the file is corrupt",
                                            WIFEXITED(status) ? WEXITSTATUS(status) : -1, what));
  if (out[0] == 'E') throw CheckpointError("", out.substr(1));
  return out.substr(1);
}

// An HDF5 checkpoint read by children (in_child): one for the structure, one per tensor read.
class IsolatedHdf5 final : public Checkpoint {
 public:
  explicit IsolatedHdf5(const std::string& path) {
    path_ = path;
    const std::string text = in_child(path, "reading the file's structure", [&] {
      const Hdf5 h(path, nullptr, 0);
      nlohmann::json j{{"metadata", h.metadata()}, {"tensors", nlohmann::json::array()}};
      for (const auto& t : h.tensors())
        j["tensors"].push_back({{"name", t.name}, {"stored", t.stored_name}, {"dtype", t.dtype}, {"shape", t.shape},
                                {"elements", t.elements}, {"readable", t.readable}});
      return j.dump();
    });
    const auto j = nlohmann::json::parse(text);
    metadata_ = j["metadata"];
    for (const auto& t : j["tensors"])
      tensors_.push_back({t["name"], t["stored"], t["dtype"], t["shape"].get<std::vector<std::uint64_t>>(),
                          t["elements"].get<std::uint64_t>(), t["readable"].get<bool>()});
  }
  const std::string& format() const override {
    static const std::string f = "hdf5";
    return f;
  }
  std::vector<double> read(const TensorInfo& t) const override {
    if (!t.readable) throw CheckpointError(path_, fmt::format("tensor {}: dtype {} cannot be read as numbers", t.name, t.dtype));
    const std::string bytes = in_child(path_, "reading tensor " + t.name, [&] {
      static Quiet quiet;
      const hid_t file = H5Fopen(path_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
      if (file < 0) throw CheckpointError(path_, "HDF5 library cannot open it (truncated or corrupt)");
      const std::vector<double> v = Hdf5::read_dataset(file, t, path_);
      H5Fclose(file);
      return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(double));
    });
    if (bytes.size() != t.elements * sizeof(double))
      throw CheckpointError(path_, fmt::format("tensor {}: the HDF5 reader returned {} bytes for {} elements", t.name, bytes.size(), t.elements));
    std::vector<double> out(t.elements);
    if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }
};

}  // namespace

std::unique_ptr<Checkpoint> open_hdf5(const std::string& path) { return std::make_unique<IsolatedHdf5>(path); }

}  // namespace detail

std::unique_ptr<Checkpoint> parse_hdf5_image(const std::uint8_t* data, std::size_t size, const std::string& name) {
  return std::make_unique<detail::Hdf5>(name, data, size);
}

}  // namespace normcheck::audit
