// `rattn eval --topk-grid DIR`: on captured queries, keys and values, the
// error of static set + exact top-k against full attention per global layer.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "core/atomic_file.h"
#include "models/engine/rattn_attention.h"
#include "runtime/data/calib.h"
#include "tools/rattn/eval.h"

namespace rattn::cli::eval {

namespace json = boost::json;

// Error of the best any top-k retrieval can do (static set + exact top-k)
// on captured queries/keys/values: what a plan can reach at all on a model.
int topk_grid_main(const Options& o) {
  const CalibManifest m = read_calib_manifest(o.topk_grid_dir);
  const int d = m.head_dim, group = m.group();
  const int64_t T = m.tokens;
  const double scale = 1.0 / std::sqrt(double(d));  // the calibration queries are the model's, unscaled
  json::object result;
  result["command"] = "eval --topk-grid";
  result["calib"] = o.topk_grid_dir;
  result["tokens"] = T;
  result["positions"] = "every 8th of the last " + std::to_string(std::min(o.grid_positions, T));
  json::array rows;
  for (int layer : m.layers) {
    const CalibLayer cl = read_calib_layer(o.topk_grid_dir, m, layer);
    std::vector<double> sum(o.grid.size(), 0.0), mx(o.grid.size(), 0.0);
    int64_t count = 0;
    std::vector<float> q(size_t(group) * size_t(d));
    std::vector<double> full(size_t(group) * size_t(d)), oracle(size_t(group) * size_t(d));
    for (int64_t t = T - std::min(o.grid_positions, T); t < T; t += 8) {
      for (int kh = 0; kh < m.num_kv_heads; ++kh) {
        for (int j = 0; j < group; ++j)
          std::memcpy(&q[size_t(j) * size_t(d)], &cl.q[(size_t(kh * group + j) * size_t(T) + size_t(t)) * size_t(d)], size_t(d) * 4);
        const float* k = &cl.k[size_t(kh) * size_t(T) * size_t(d)];
        const float* v = &cl.v[size_t(kh) * size_t(T) * size_t(d)];
        for (size_t c = 0; c < o.grid.size(); ++c) {
          engine::internal::attention_with_topk_oracle_f64(q.data(), group, d, k, v, d, t, scale, o.grid[c][0], o.grid[c][1],
                                                           o.grid[c][2], full.data(), oracle.data());
          for (int j = 0; j < group; ++j) {
            double num = 0, den = 0;
            for (int i = 0; i < d; ++i) {
              const size_t x = size_t(j) * size_t(d) + size_t(i);
              num += (oracle[x] - full[x]) * (oracle[x] - full[x]);
              den += full[x] * full[x];
            }
            const double e = std::sqrt(num / std::max(den, 1e-300));
            sum[c] += e;
            mx[c] = std::max(mx[c], e);
          }
        }
        count += group;
      }
    }
    for (size_t c = 0; c < o.grid.size(); ++c) {
      json::object r;
      r["layer"] = layer;
      r["sinks"] = o.grid[c][0];
      r["window"] = o.grid[c][1];
      r["top_k"] = o.grid[c][2];
      r["rel_error_mean"] = sum[c] / double(std::max<int64_t>(count, 1));
      r["rel_error_max"] = mx[c];
      std::fprintf(stderr, "rattn eval: topk-grid %s\n", json::serialize(r).c_str());
      rows.push_back(r);
    }
  }
  result["rows"] = rows;
  const std::string out = json::serialize(result);
  std::printf("%s\n", out.c_str());
  if (!o.json_out.empty()) write_file_atomic(o.json_out, out + "\n");
  return 0;
}

}  // namespace rattn::cli::eval
