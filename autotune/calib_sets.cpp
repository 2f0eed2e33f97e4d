#include "autotune/calib_sets.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "core/atomic_file.h"
#include "core/error.h"

namespace rattn {

namespace fs = std::filesystem;

std::string hex64(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

namespace {

std::string dir_name(const std::string& dir) {
  fs::path p(dir);
  if (p.filename().empty()) p = p.parent_path();  // "DIR/"
  const std::string name = p.filename().string();
  return name.empty() ? dir : name;
}

std::string set_id(const std::string& dir, const CalibManifest& m) {
  std::string id = read_file(dir + "/manifest.json");
  for (int l : m.layers)
    for (char w : {'q', 'k', 'v'}) {
      std::error_code ec;
      const std::string p = calib_layer_path(dir, l, w);
      id += p + " " + std::to_string(fs::file_size(p, ec)) + " " +
            std::to_string(fs::last_write_time(p, ec).time_since_epoch().count());
    }
  return hex64(fnv1a64(id.data(), id.size()));
}

}  // namespace

std::vector<CalibSet> read_calib_sets(const ModelLayout& model, const std::vector<std::string>& dirs, int64_t context,
                                      int64_t* context_out) {
  if (dirs.empty()) fail(Status::invalid_argument, "tune: no calibration data (--calib DIR or --synthetic)");
  std::vector<CalibSet> sets;
  std::vector<fs::path> seen;
  for (const std::string& dir : dirs) {
    std::error_code ec;
    const fs::path canonical = fs::weakly_canonical(dir, ec);
    if (!ec && std::find(seen.begin(), seen.end(), canonical) != seen.end())
      fail(Status::invalid_argument, "tune: the calibration set " + dir + " is given twice");
    seen.push_back(canonical);
    CalibSet s;
    s.dir = dir;
    s.name = dir_name(dir);
    s.manifest = read_calib_manifest(dir);
    const CalibManifest& m = s.manifest;
    if (m.num_q_heads != model.num_q_heads || m.num_kv_heads != model.num_kv_heads || m.head_dim != model.head_dim)
      fail(Status::invalid_argument,
           "tune: the calibration set " + dir + " does not hold the plan's model's heads: it has " +
               std::to_string(m.num_q_heads) + "/" + std::to_string(m.num_kv_heads) + " of dimension " +
               std::to_string(m.head_dim) + ", the model " + std::to_string(model.num_q_heads) + "/" +
               std::to_string(model.num_kv_heads) + " of dimension " + std::to_string(model.head_dim));
    if (!sets.empty()) {
      const CalibSet& first = sets.front();
      if (m.model != first.manifest.model)
        fail(Status::invalid_argument, "tune: the calibration sets " + first.dir + " and " + dir +
                                           " come from different models (\"" + first.manifest.model + "\", \"" +
                                           m.model + "\")");
      if (m.rope_applied != first.manifest.rope_applied)
        fail(Status::invalid_argument,
             "tune: the calibration sets " + first.dir + " and " + dir + " disagree on rope_applied");
    }
    if (context > m.tokens)
      fail(Status::invalid_argument, "tune: a context of " + std::to_string(context) + " tokens; the calibration set " +
                                         dir + " holds " + std::to_string(m.tokens));
    s.id = set_id(dir, m);
    sets.push_back(std::move(s));
  }
  // Two sets of one name (different parents): named by their paths.
  std::vector<std::string> names;
  for (const CalibSet& s : sets) names.push_back(s.name);
  for (CalibSet& s : sets)
    if (std::count(names.begin(), names.end(), dir_name(s.dir)) > 1) s.name = s.dir;
  int64_t shortest = sets.front().manifest.tokens;
  for (const CalibSet& s : sets) shortest = std::min(shortest, s.manifest.tokens);
  *context_out = context > 0 ? context : shortest;
  return sets;
}

std::vector<int> common_global_layers(const ModelLayout& model, const std::vector<CalibSet>& sets) {
  std::vector<int> out;
  for (int l = 0; l < model.num_layers; ++l) {
    if (!model.is_global(l)) continue;
    bool everywhere = true;
    for (const CalibSet& s : sets)
      everywhere = everywhere && std::find(s.manifest.layers.begin(), s.manifest.layers.end(), l) != s.manifest.layers.end();
    if (everywhere) out.push_back(l);
  }
  return out;
}

}  // namespace rattn
