#pragma once
// The tuning database: measurements keyed by a scope (model, plan, data,
// context and the tuner's options that change what is measured), an item
// (e.g. one sampled layer) and the hardware fingerprint. One JSON record per
// line, appended as each measurement finishes, so an interrupted run resumes
// where it stopped and a repeated run reuses everything. A record of another
// fingerprint is never reused; find() reports that it exists.
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <boost/json.hpp>

namespace rattn {

class TuningDb {
 public:
  // "" keeps records in memory only. A missing file is created on the first
  // put(); lines that do not parse (a run killed mid-write) are skipped and
  // counted.
  explicit TuningDb(std::string path);

  // The value recorded for (scope, item) on `fingerprint`; when there is
  // none but one exists for another fingerprint, *foreign gets that
  // fingerprint's text.
  std::optional<boost::json::value> find(const std::string& scope, const std::string& item,
                                         const std::string& fingerprint, std::string* foreign = nullptr) const;
  // Records and appends one line (one write, then fsync).
  void put(const std::string& scope, const std::string& item, const std::string& fingerprint,
           const std::string& fingerprint_text, const boost::json::value& value);

  const std::string& path() const { return path_; }
  int skipped_lines() const { return skipped_; }
  size_t size() const { return records_.size(); }

 private:
  struct Record {
    std::string fingerprint_text;
    boost::json::value value;
  };
  std::string path_;
  // scope \x1f item -> fingerprint -> record
  std::map<std::string, std::map<std::string, Record>> records_;
  int skipped_ = 0;
};

// The default database: $RATTN_TUNE_DB, else <kernel cache dir>/tune.jsonl.
std::string default_tuning_db_path();

}  // namespace rattn
