// A TOML config file read once, at the edge, into the components' typed options. Every key that is
// read is checked for type and range; Finish() reports keys nobody read. Errors name the file, the
// line and the dotted key.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.hpp"

namespace atfill::pipeline {

class ConfigFile {
 public:
  static Result<ConfigFile> Load(const std::string& path);
  static Result<ConfigFile> Parse(std::string_view text, std::string source_name);

  ConfigFile(ConfigFile&&) noexcept;
  ConfigFile& operator=(ConfigFile&&) noexcept;
  ~ConfigFile();

  // Each reader leaves *out untouched when the key is absent. `key` is dotted: "engine.workers".
  Status ReadBool(std::string_view key, bool* out);
  Status ReadInt(std::string_view key, int64_t* out, int64_t min, int64_t max);
  template <typename T>
  Status ReadUint(std::string_view key, T* out, int64_t min, int64_t max) {
    int64_t v = static_cast<int64_t>(*out);
    ATFILL_RETURN_IF_ERROR(ReadInt(key, &v, min, max));
    *out = static_cast<T>(v);
    return Status::OK();
  }
  Status ReadDouble(std::string_view key, double* out, double min, double max);
  Status ReadString(std::string_view key, std::string* out);
  // `allowed` empty = any string.
  Status ReadEnum(std::string_view key, std::string* out, const std::vector<std::string>& allowed);
  Status ReadStringList(std::string_view key, std::vector<std::string>* out);
  // A path relative to the config file's folder becomes absolute against it.
  Status ReadPath(std::string_view key, std::string* out);
  // An array of paths, each resolved like ReadPath.
  Status ReadPathList(std::string_view key, std::vector<std::string>* out);
  // A table whose keys are names (they may hold dots: quoted NSIDs) and whose values are paths,
  // each resolved like ReadPath: [scripts.collections] "app.bsky.feed.post" = "post.lua".
  Status ReadPathTable(std::string_view key, std::map<std::string, std::string>* out);

  bool Has(std::string_view key) const;
  // Errors for keys present in the file that no reader asked for (the first few, one per line).
  Status Finish() const;

  const std::string& source_name() const;
  // "file:line: key" for messages about a key that was read.
  std::string Where(std::string_view key) const;

 private:
  struct Impl;
  explicit ConfigFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace atfill::pipeline
