// Reading a sharded outputs file (fixtures/SCHEMA.md, "Sharded outputs"): outputs/ through the
// fixtures library's reader, and what that layout adds (the plan, the status of a case that
// produced nothing, copies/<k>/<output>) with the HDF5 C API.
#include <fmt/format.h>
#include <hdf5.h>

#include <algorithm>
#include <memory>
#include <optional>

#include "normcheck/fixtures/error.hpp"
#include "normcheck/sharding/shard.hpp"

namespace normcheck::shard {
namespace {

struct Handle {
  hid_t id;
  herr_t (*close)(hid_t);
  Handle(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  ~Handle() {
    if (id >= 0) close(id);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
};

bool has_link(hid_t g, const std::string& name) { return H5Lexists(g, name.c_str(), H5P_DEFAULT) > 0; }

std::optional<std::string> string_attr(hid_t obj, const char* name) {
  if (H5Aexists(obj, name) <= 0) return std::nullopt;
  Handle a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  Handle t(H5Aget_type(a.id), H5Tclose);
  if (H5Tget_class(t.id) != H5T_STRING) return std::nullopt;
  if (H5Tis_variable_str(t.id) > 0) {
    Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.id, H5T_VARIABLE);
    H5Tset_cset(mem.id, H5Tget_cset(t.id));
    char* s = nullptr;
    if (H5Aread(a.id, mem.id, &s) < 0 || !s) return std::nullopt;
    std::string out(s);
    H5free_memory(s);
    return out;
  }
  std::string out(H5Tget_size(t.id), '\0');
  if (H5Aread(a.id, t.id, out.data()) < 0) return std::nullopt;
  out.erase(std::find(out.begin(), out.end(), '\0'), out.end());
  return out;
}

ref::Tensor read_tensor(hid_t g, const std::string& name, const std::string& where) {
  Handle ds(H5Dopen2(g, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (ds.id < 0) throw fix::FixtureError(where, "cannot open dataset " + name);
  Handle space(H5Dget_space(ds.id), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.id);
  if (rank < 0 || rank > ref::kMaxRank) throw fix::FixtureError(where, name + ": rank out of range");
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
  ref::Tensor t;
  std::int64_t n = 1;
  for (auto d : dims) {
    if (d > static_cast<hsize_t>(ref::kMaxElements) ||
        n > ref::kMaxElements / std::max<std::int64_t>(1, static_cast<std::int64_t>(d)))
      throw fix::FixtureError(where, name + ": absurd dimensions");
    n *= static_cast<std::int64_t>(d);
    t.shape.push_back(static_cast<std::int64_t>(d));
  }
  t.data.resize(static_cast<std::size_t>(n));
  if (n > 0 && H5Dread(ds.id, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data.data()) < 0)
    throw fix::FixtureError(where, name + ": cannot read as numbers");
  return t;
}

}  // namespace

std::vector<std::string> sharded_case_ids(const std::string& path) {
  fix::FixtureReader r(path, fix::FixtureReader::Kind::outputs);
  return r.case_ids();
}

ShardedOutputs read_sharded(const std::string& path, const std::string& id, std::string* plan_text) {
  ShardedOutputs out;
  {
    fix::FixtureReader r(path, fix::FixtureReader::Kind::outputs);
    fix::OutputsCase oc = r.read_outputs_case(id);
    for (auto& [name, o] : oc.fc.expected) out.gathered.emplace(name, std::move(o.value));
    out.wider_values = std::move(oc.wider_values);  // its copies are declared with it
  }
  const std::string where = path + ": case " + id;
  H5E_auto2_t func = nullptr;
  void* data = nullptr;
  H5Eget_auto2(H5E_DEFAULT, &func, &data);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // errors are reported as FixtureError
  struct Restore {
    H5E_auto2_t f;
    void* d;
    ~Restore() { H5Eset_auto2(H5E_DEFAULT, f, d); }
  } restore{func, data};
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (file.id < 0) throw fix::FixtureError(path, "cannot open");
  Handle g(H5Gopen2(file.id, ("cases/" + id).c_str(), H5P_DEFAULT), H5Gclose);
  if (g.id < 0) throw fix::FixtureError(where, "is not a group");
  const auto plan = string_attr(g.id, "shard_plan");
  if (!plan) throw fix::FixtureError(where, "attribute 'shard_plan' is missing: not a sharded outputs file");
  *plan_text = *plan;
  out.status = string_attr(g.id, "status").value_or("");
  out.message = string_attr(g.id, "message").value_or("");
  if (H5Aexists(g.id, "seconds") > 0) {
    Handle a(H5Aopen(g.id, "seconds", H5P_DEFAULT), H5Aclose);
    H5Aread(a.id, H5T_NATIVE_DOUBLE, &out.seconds);
  }
  if (!out.status.empty() && out.status != "CRASHED" && out.status != "TIMEOUT" &&
      out.status != "UNSUPPORTED")
    throw fix::FixtureError(where, "status '" + out.status + "' is not CRASHED, TIMEOUT or UNSUPPORTED");
  if (has_link(g.id, "copies")) {
    // copies/0, copies/1 ... each with some of the gathered outputs' names
    Handle cg(H5Gopen2(g.id, "copies", H5P_DEFAULT), H5Gclose);
    for (std::size_t k = 0; has_link(cg.id, std::to_string(k)); ++k) {
      const std::string kname = std::to_string(k);
      Handle kg(H5Gopen2(cg.id, kname.c_str(), H5P_DEFAULT), H5Gclose);
      for (const auto& [name, gathered] : out.gathered) {
        if (!has_link(kg.id, name)) continue;
        auto& v = out.copies[name];
        if (v.size() != k)
          throw fix::FixtureError(where,
                                  fmt::format("copies/{}/{}: copy {} of it is missing", k, name, v.size()));
        ref::Tensor t = read_tensor(kg.id, name, where + ": copies/" + kname);
        if (gathered.shape != t.shape)
          throw fix::FixtureError(where,
                                  fmt::format("copies/{}/{}: not the shape of outputs/{}", k, name, name));
        t.dtype = gathered.dtype;
        v.push_back(std::move(t));
      }
    }
  }
  return out;
}

}  // namespace normcheck::shard
