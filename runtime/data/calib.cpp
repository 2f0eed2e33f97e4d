#include "runtime/data/calib.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <boost/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/finite.h"
#include "core/npy.h"

namespace rattn {
namespace json = boost::json;

void validate_calib_manifest(const CalibManifest& m) {
  const auto bad = [](const std::string& what) { fail(Status::invalid_argument, "calibration manifest: " + what); };
  if (m.num_q_heads < 1 || m.num_kv_heads < 1) bad("num_q_heads and num_kv_heads must be >= 1");
  if (m.num_q_heads % m.num_kv_heads != 0) bad("num_q_heads must be a multiple of num_kv_heads");
  if (m.head_dim < 1) bad("head_dim must be >= 1");
  if (m.tokens < 1) bad("tokens must be >= 1");
  if (m.dtype != DType::f32 && m.dtype != DType::f16) bad("dtype must be f32 or f16");
  if (m.layers.empty()) bad("no layers");
  for (int id : m.layers)
    if (id < 0) bad("negative layer id");
  if (!m.rope_applied) bad("rope_applied must be true (queries and keys are stored after RoPE)");
}

std::string calib_layer_path(const std::string& dir, int layer_id, char which) {
  return (std::filesystem::path(dir) / ("layer_" + std::to_string(layer_id) + "." + which + ".npy")).string();
}

void write_calib_manifest(const std::string& dir, const CalibManifest& m) {
  validate_calib_manifest(m);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail(Status::io_error, "calibration: cannot create directory " + dir + ": " + ec.message());
  json::object o;
  o["format"] = "rattn-calib";
  o["version"] = 1;
  o["model"] = m.model;
  json::array layers;
  for (int id : m.layers) layers.push_back(id);
  o["layers"] = std::move(layers);
  o["num_q_heads"] = m.num_q_heads;
  o["num_kv_heads"] = m.num_kv_heads;
  o["head_dim"] = m.head_dim;
  o["tokens"] = m.tokens;
  o["dtype"] = dtype_name(m.dtype);
  o["rope_applied"] = m.rope_applied;
  write_file_atomic((std::filesystem::path(dir) / "manifest.json").string(), json::serialize(o) + "\n");
}

namespace {

void write_tensor(const std::string& path, const float* src, int64_t heads, const CalibManifest& m) {
  const std::vector<int64_t> shape{heads, m.tokens, m.head_dim};
  const size_t n = size_t(heads) * size_t(m.tokens) * size_t(m.head_dim);
  if (m.dtype == DType::f32) {
    write_npy(path, NpyType::f32, shape, src);
  } else {
    std::vector<uint16_t> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = f32_to_f16(src[i]);
    write_npy(path, NpyType::f16, shape, h.data());
  }
}

std::vector<float> read_tensor(const std::string& path, int64_t heads, const CalibManifest& m) {
  if (!std::filesystem::exists(path)) fail(Status::not_found, "calibration: missing file " + path);
  NpyArray a = read_npy(path);
  const std::vector<int64_t> want{heads, m.tokens, m.head_dim};
  if (a.shape != want) {
    std::ostringstream s;
    s << "calibration: " << path << " has shape [";
    for (size_t i = 0; i < a.shape.size(); ++i) s << (i ? ", " : "") << a.shape[i];
    s << "], manifest says [" << heads << ", " << m.tokens << ", " << m.head_dim << "]";
    fail(Status::corrupt_data, s.str());
  }
  const size_t n = size_t(a.size());
  std::vector<float> out(n);
  if (a.type == NpyType::f32) {
    std::copy(a.as<float>(), a.as<float>() + n, out.begin());
  } else if (a.type == NpyType::f16) {
    const uint16_t* h = a.as<uint16_t>();
    for (size_t i = 0; i < n; ++i) out[i] = f16_to_f32(h[i]);
  } else {
    fail(Status::corrupt_data, "calibration: " + path + " must hold float32 or float16");
  }
  if (const int64_t at = first_out_of_range(out.data(), n); at >= 0) {
    const int64_t per_head = m.tokens * m.head_dim;
    fail(Status::corrupt_data, "calibration: " + path + ": element " + std::to_string(at) + " (head " +
                                   std::to_string(at / per_head) + ", token " +
                                   std::to_string(at % per_head / m.head_dim) + ", dim " +
                                   std::to_string(at % m.head_dim) + "): " +
                                   describe_out_of_range(DType::f32, out.data(), size_t(at), DType::f32));
  }
  return out;
}

}  // namespace

void write_calib_layer(const std::string& dir, int layer_id, const float* q, const float* k, const float* v,
                       const CalibManifest& m) {
  validate_calib_manifest(m);
  if (!q || !k || !v) fail(Status::invalid_argument, "write_calib_layer: null tensor");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail(Status::io_error, "calibration: cannot create directory " + dir + ": " + ec.message());
  write_tensor(calib_layer_path(dir, layer_id, 'q'), q, m.num_q_heads, m);
  write_tensor(calib_layer_path(dir, layer_id, 'k'), k, m.num_kv_heads, m);
  write_tensor(calib_layer_path(dir, layer_id, 'v'), v, m.num_kv_heads, m);
}

CalibManifest read_calib_manifest(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "manifest.json").string();
  if (!std::filesystem::exists(path)) fail(Status::not_found, "calibration: missing " + path);
  const std::string text = read_file(path);
  boost::system::error_code ec;
  json::value v = json::parse(text, ec);
  if (ec || !v.is_object()) fail(Status::corrupt_data, "calibration: " + path + " is not a JSON object");
  const json::object& o = v.as_object();
  const auto need = [&](const char* key) -> const json::value& {
    const json::value* f = o.if_contains(key);
    if (!f) fail(Status::corrupt_data, "calibration: " + path + " lacks \"" + key + "\"");
    return *f;
  };
  const auto integer = [&](const char* key) -> int64_t {
    const json::value& f = need(key);
    if (!f.is_int64() && !f.is_uint64()) fail(Status::corrupt_data, "calibration: " + path + ": \"" + key + "\" must be an integer");
    return f.is_int64() ? f.as_int64() : int64_t(f.as_uint64());
  };
  // Counts and ids are ints: a larger value is corrupt, not to be truncated into a plausible one.
  const auto small = [&](const char* key, int64_t v) -> int {
    if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
      fail(Status::corrupt_data, "calibration: " + path + ": \"" + key + "\" = " + std::to_string(v) + " is out of range");
    return int(v);
  };
  CalibManifest m;
  const json::value* model = o.if_contains("model");
  if (model && model->is_string()) m.model = std::string(model->as_string());
  const json::value& layers = need("layers");
  if (!layers.is_array()) fail(Status::corrupt_data, "calibration: " + path + ": \"layers\" must be an array");
  for (const auto& l : layers.as_array()) {
    if (!l.is_int64()) fail(Status::corrupt_data, "calibration: " + path + ": layer ids must be integers");
    m.layers.push_back(small("layers", l.as_int64()));
  }
  m.num_q_heads = small("num_q_heads", integer("num_q_heads"));
  m.num_kv_heads = small("num_kv_heads", integer("num_kv_heads"));
  m.head_dim = small("head_dim", integer("head_dim"));
  m.tokens = integer("tokens");
  const json::value& dt = need("dtype");
  if (!dt.is_string() || !parse_dtype(std::string(dt.as_string()), &m.dtype))
    fail(Status::corrupt_data, "calibration: " + path + ": \"dtype\" must be \"f32\" or \"f16\"");
  const json::value& rope = need("rope_applied");
  if (!rope.is_bool()) fail(Status::corrupt_data, "calibration: " + path + ": \"rope_applied\" must be a boolean");
  m.rope_applied = rope.as_bool();
  try {
    validate_calib_manifest(m);
  } catch (const Error& e) {
    fail(Status::corrupt_data, std::string(e.what()) + " (" + path + ")");
  }
  return m;
}

CalibLayer read_calib_layer(const std::string& dir, const CalibManifest& m, int layer_id) {
  validate_calib_manifest(m);
  if (std::find(m.layers.begin(), m.layers.end(), layer_id) == m.layers.end())
    fail(Status::invalid_argument, "calibration: layer " + std::to_string(layer_id) + " is not in the manifest of " + dir);
  CalibLayer l;
  l.layer_id = layer_id;
  l.q = read_tensor(calib_layer_path(dir, layer_id, 'q'), m.num_q_heads, m);
  l.k = read_tensor(calib_layer_path(dir, layer_id, 'k'), m.num_kv_heads, m);
  l.v = read_tensor(calib_layer_path(dir, layer_id, 'v'), m.num_kv_heads, m);
  return l;
}

}  // namespace rattn
