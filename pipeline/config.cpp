#include "pipeline/config.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <filesystem>
#include <functional>

namespace atfill::pipeline {

struct ConfigFile::Impl {
  toml::table table;
  std::string source;
  std::string dir;
  std::set<std::string, std::less<>> used;

  const toml::node* Find(std::string_view key) {
    used.emplace(key);
    return table.at_path(key).node();
  }
  std::string Line(const toml::node* node) const {
    return source + ":" + std::to_string(node->source().begin.line);
  }
  Status TypeError(const toml::node* node, std::string_view key, std::string_view want) const {
    return Status::Invalid(Line(node) + ": " + std::string(key) + " must be " + std::string(want));
  }
  // A path relative to the config file's folder, made absolute against it.
  std::string Resolve(std::string_view path) const {
    std::filesystem::path p(path);
    if (p.is_relative() && !dir.empty()) p = std::filesystem::path(dir) / p;
    return p.lexically_normal().string();
  }
};

ConfigFile::ConfigFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ConfigFile::ConfigFile(ConfigFile&&) noexcept = default;
ConfigFile& ConfigFile::operator=(ConfigFile&&) noexcept = default;
ConfigFile::~ConfigFile() = default;

Result<ConfigFile> ConfigFile::Parse(std::string_view text, std::string source_name) {
  auto impl = std::make_unique<Impl>();
  impl->source = std::move(source_name);
  try {
    impl->table = toml::parse(text, impl->source);
  } catch (const toml::parse_error& e) {
    return Status::Invalid(impl->source + ":" + std::to_string(e.source().begin.line) + ": " +
                           std::string(e.description()));
  }
  return ConfigFile(std::move(impl));
}

Result<ConfigFile> ConfigFile::Load(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return Status::IoError("config file " + path + " does not exist or is not a file");
  }
  auto impl = std::make_unique<Impl>();
  impl->source = path;
  impl->dir = std::filesystem::absolute(std::filesystem::path(path)).parent_path().string();
  try {
    impl->table = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    return Status::Invalid(path + ":" + std::to_string(e.source().begin.line) + ": " +
                           std::string(e.description()));
  }
  return ConfigFile(std::move(impl));
}

Status ConfigFile::ReadBool(std::string_view key, bool* out) {
  const toml::node* n = impl_->Find(key);
  if (n == nullptr) return Status::OK();
  auto v = n->value<bool>();
  if (!n->is_boolean() || !v) return impl_->TypeError(n, key, "true or false");
  *out = *v;
  return Status::OK();
}

Status ConfigFile::ReadInt(std::string_view key, int64_t* out, int64_t min, int64_t max) {
  const toml::node* n = impl_->Find(key);
  if (n == nullptr) return Status::OK();
  if (!n->is_integer()) return impl_->TypeError(n, key, "an integer");
  const int64_t v = *n->value<int64_t>();
  if (v < min || v > max) {
    return Status::OutOfRange(impl_->Line(n) + ": " + std::string(key) + " = " + std::to_string(v) +
                              " is out of range [" + std::to_string(min) + ", " +
                              std::to_string(max) + "]");
  }
  *out = v;
  return Status::OK();
}

Status ConfigFile::ReadDouble(std::string_view key, double* out, double min, double max) {
  const toml::node* n = impl_->Find(key);
  if (n == nullptr) return Status::OK();
  if (!n->is_number()) return impl_->TypeError(n, key, "a number");
  const double v = *n->value<double>();
  if (!(v >= min && v <= max)) {
    return Status::OutOfRange(impl_->Line(n) + ": " + std::string(key) + " = " + std::to_string(v) +
                              " is out of range [" + std::to_string(min) + ", " +
                              std::to_string(max) + "]");
  }
  *out = v;
  return Status::OK();
}

Status ConfigFile::ReadString(std::string_view key, std::string* out) {
  const toml::node* n = impl_->Find(key);
  if (n == nullptr) return Status::OK();
  if (!n->is_string()) return impl_->TypeError(n, key, "a string");
  *out = *n->value<std::string>();
  return Status::OK();
}

Status ConfigFile::ReadEnum(std::string_view key, std::string* out,
                            const std::vector<std::string>& allowed) {
  std::string v = *out;
  ATFILL_RETURN_IF_ERROR(ReadString(key, &v));
  if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
    return Status::Invalid(Where(key) + " = \"" + v + "\" must be one of: " + list);
  }
  *out = std::move(v);
  return Status::OK();
}

Status ConfigFile::ReadStringList(std::string_view key, std::vector<std::string>* out) {
  const toml::node* n = impl_->Find(key);
  if (n == nullptr) return Status::OK();
  const toml::array* arr = n->as_array();
  if (arr == nullptr) return impl_->TypeError(n, key, "an array of strings");
  std::vector<std::string> values;
  for (const auto& item : *arr) {
    if (!item.is_string()) return impl_->TypeError(&item, key, "an array of strings");
    values.push_back(*item.value<std::string>());
  }
  *out = std::move(values);
  return Status::OK();
}

Status ConfigFile::ReadPath(std::string_view key, std::string* out) {
  std::string v;
  const bool present = Has(key);
  ATFILL_RETURN_IF_ERROR(ReadString(key, &v));
  if (!present) return Status::OK();
  if (v.empty()) return Status::Invalid(Where(key) + " must not be empty");
  *out = impl_->Resolve(v);
  return Status::OK();
}

Status ConfigFile::ReadPathList(std::string_view key, std::vector<std::string>* out) {
  std::vector<std::string> values;
  const bool present = Has(key);
  ATFILL_RETURN_IF_ERROR(ReadStringList(key, &values));
  if (!present) return Status::OK();
  for (std::string& v : values) {
    if (v.empty()) return Status::Invalid(Where(key) + " must not hold an empty path");
    v = impl_->Resolve(v);
  }
  *out = std::move(values);
  return Status::OK();
}

Status ConfigFile::ReadPathTable(std::string_view key, std::map<std::string, std::string>* out) {
  const toml::node* n = impl_->Find(key);
  if (n == nullptr) return Status::OK();
  const toml::table* t = n->as_table();
  if (t == nullptr) return impl_->TypeError(n, key, "a table of name = \"path\" entries");
  std::map<std::string, std::string> values;
  for (const auto& [k, node] : *t) {
    const std::string entry = std::string(key) + "." + std::string(k.str());
    impl_->used.insert(entry);
    auto v = node.value<std::string>();
    if (!node.is_string() || !v) return impl_->TypeError(&node, entry, "a path (a string)");
    if (v->empty())
      return Status::Invalid(impl_->Line(&node) + ": " + entry + " must not be empty");
    values[std::string(k.str())] = impl_->Resolve(*v);
  }
  *out = std::move(values);
  return Status::OK();
}

bool ConfigFile::Has(std::string_view key) const {
  return impl_->table.at_path(key).node() != nullptr;
}

Status ConfigFile::Finish() const {
  std::vector<std::string> unknown;
  // Walks every leaf; a table or array of tables is descended, other values are leaves.
  std::function<void(const toml::table&, const std::string&)> walk =
      [&](const toml::table& t, const std::string& prefix) {
        for (const auto& [k, node] : t) {
          const std::string key =
              prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
          if (const toml::table* sub = node.as_table()) {
            walk(*sub, key);
          } else if (impl_->used.find(key) == impl_->used.end()) {
            unknown.push_back(impl_->Line(&node) + ": unknown key '" + key + "'");
          }
        }
      };
  walk(impl_->table, "");
  if (unknown.empty()) return Status::OK();
  std::string msg;
  for (size_t i = 0; i < unknown.size() && i < 5; ++i) msg += (i ? "; " : "") + unknown[i];
  if (unknown.size() > 5) msg += "; and " + std::to_string(unknown.size() - 5) + " more";
  return Status::Invalid(msg);
}

const std::string& ConfigFile::source_name() const { return impl_->source; }

std::string ConfigFile::Where(std::string_view key) const {
  const toml::node* n = impl_->table.at_path(key).node();
  if (n == nullptr) return impl_->source + ": " + std::string(key);
  return impl_->Line(n) + ": " + std::string(key);
}

}  // namespace atfill::pipeline
