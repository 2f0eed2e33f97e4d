#include "autotune/tuning_db.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "codegen/halide/halide_kernels.h"
#include "core/error.h"

namespace rattn {

namespace {
std::string key_of(const std::string& scope, const std::string& item) { return scope + '\x1f' + item; }
}  // namespace

TuningDb::TuningDb(std::string path) : path_(std::move(path)) {
  if (path_.empty()) return;
  std::error_code ec;
  if (!std::filesystem::exists(path_, ec)) return;
  if (!std::filesystem::is_regular_file(path_, ec))
    fail(Status::invalid_argument, "tuning database " + path_ + ": not a regular file");
  std::ifstream in(path_);
  if (!in) fail(Status::io_error, "tuning database " + path_ + ": cannot read: " + std::strerror(errno));
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    boost::system::error_code jec;
    boost::json::value v = boost::json::parse(line, jec);
    const boost::json::object* o = jec ? nullptr : v.if_object();
    const boost::json::string *scope = nullptr, *item = nullptr, *fp = nullptr, *fpt = nullptr;
    if (o) {
      if (auto* s = o->if_contains("scope")) scope = s->if_string();
      if (auto* s = o->if_contains("item")) item = s->if_string();
      if (auto* s = o->if_contains("fingerprint")) fp = s->if_string();
      if (auto* s = o->if_contains("fingerprint_text")) fpt = s->if_string();
    }
    if (!scope || !item || !fp || !fpt || !o->contains("value")) {
      ++skipped_;
      continue;
    }
    records_[key_of(std::string(*scope), std::string(*item))][std::string(*fp)] =
        Record{std::string(*fpt), o->at("value")};
  }
}

std::optional<boost::json::value> TuningDb::find(const std::string& scope, const std::string& item,
                                                 const std::string& fingerprint, std::string* foreign) const {
  const auto it = records_.find(key_of(scope, item));
  if (it == records_.end()) return std::nullopt;
  const auto own = it->second.find(fingerprint);
  if (own != it->second.end()) return own->second.value;
  if (foreign && !it->second.empty()) *foreign = it->second.begin()->second.fingerprint_text;
  return std::nullopt;
}

void TuningDb::put(const std::string& scope, const std::string& item, const std::string& fingerprint,
                   const std::string& fingerprint_text, const boost::json::value& value) {
  records_[key_of(scope, item)][fingerprint] = Record{fingerprint_text, value};
  if (path_.empty()) return;
  const std::string line = boost::json::serialize(boost::json::object{{"scope", scope},
                                                                      {"item", item},
                                                                      {"fingerprint", fingerprint},
                                                                      {"fingerprint_text", fingerprint_text},
                                                                      {"value", value}}) +
                           "\n";
  std::error_code ec;
  const auto dir = std::filesystem::path(path_).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) fail(Status::io_error, "tuning database " + path_ + ": cannot open: " + std::strerror(errno));
  // One write per record: O_APPEND keeps concurrent writers' lines whole.
  const ssize_t n = ::write(fd, line.data(), line.size());
  const int write_errno = errno;
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (n != ssize_t(line.size()) || !synced)
    fail(Status::io_error, "tuning database " + path_ + ": cannot append: " + std::strerror(write_errno));
}

std::string default_tuning_db_path() {
  if (const char* p = std::getenv("RATTN_TUNE_DB"); p && *p) return p;
  return kernel_cache_dir() + "/tune.jsonl";
}

}  // namespace rattn
