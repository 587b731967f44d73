#include "atproto/json_check.hpp"

namespace atfill::atproto {

const char* JsonTypeName(simdjson::dom::element e) {
  switch (e.type()) {
    case simdjson::dom::element_type::ARRAY:
      return "an array";
    case simdjson::dom::element_type::OBJECT:
      return "an object";
    case simdjson::dom::element_type::INT64:
    case simdjson::dom::element_type::UINT64:
    case simdjson::dom::element_type::DOUBLE:
      return "a number";
    case simdjson::dom::element_type::STRING:
      return "a string";
    case simdjson::dom::element_type::BOOL:
      return "a boolean";
    case simdjson::dom::element_type::NULL_VALUE:
      return "null";
  }
  return "an unknown JSON type";
}
namespace {

namespace od = simdjson::ondemand;

// A scalar's raw token runs up to the next structural character, spaces included.
std::string_view TrimRight(std::string_view s) {
  while (!s.empty() &&
         (s.back() == ' ' || s.back() == '\t' || s.back() == '\n' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

}  // namespace

bool IsJsonNumber(std::string_view s) {
  size_t i = 0;
  const auto digits = [&] {
    const size_t start = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    return i > start;
  };
  if (i < s.size() && s[i] == '-') ++i;
  if (i < s.size() && s[i] == '0') {
    ++i;
  } else if (!digits()) {
    return false;
  }
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (!digits()) return false;
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (!digits()) return false;
  }
  return i == s.size();
}

simdjson::error_code CheckJsonValue(od::value value, size_t depth, size_t max_depth,
                                    bool* too_deep) {
  od::json_type type;
  if (auto e = value.type().get(type)) return e;
  switch (type) {
    case od::json_type::object: {
      if (depth >= max_depth) {
        *too_deep = true;
        return simdjson::SUCCESS;
      }
      od::object object;
      if (auto e = value.get_object().get(object)) return e;
      for (auto field : object) {
        std::string_view key;
        if (auto e = field.unescaped_key().get(key)) return e;
        od::value child;
        if (auto e = field.value().get(child)) return e;
        if (auto e = CheckJsonValue(child, depth + 1, max_depth, too_deep)) return e;
        if (*too_deep) return simdjson::SUCCESS;
      }
      return simdjson::SUCCESS;
    }
    case od::json_type::array: {
      if (depth >= max_depth) {
        *too_deep = true;
        return simdjson::SUCCESS;
      }
      od::array array;
      if (auto e = value.get_array().get(array)) return e;
      for (auto element : array) {
        od::value child;
        if (auto e = element.get(child)) return e;
        if (auto e = CheckJsonValue(child, depth + 1, max_depth, too_deep)) return e;
        if (*too_deep) return simdjson::SUCCESS;
      }
      return simdjson::SUCCESS;
    }
    case od::json_type::string: {
      std::string_view s;
      return value.get_string().get(s);
    }
    case od::json_type::number:
      return IsJsonNumber(TrimRight(value.raw_json_token())) ? simdjson::SUCCESS
                                                             : simdjson::NUMBER_ERROR;
    case od::json_type::boolean: {
      const std::string_view token = TrimRight(value.raw_json_token());
      return token == "true" || token == "false" ? simdjson::SUCCESS : simdjson::T_ATOM_ERROR;
    }
    case od::json_type::null:
      return TrimRight(value.raw_json_token()) == "null" ? simdjson::SUCCESS
                                                         : simdjson::N_ATOM_ERROR;
  }
  return simdjson::TAPE_ERROR;
}

simdjson::error_code CheckRecordObject(od::object record, size_t max_depth,
                                       std::string_view* created_at, bool* too_deep) {
  for (auto field : record) {
    std::string_view key;
    if (auto e = field.unescaped_key().get(key)) return e;
    od::value value;
    if (auto e = field.value().get(value)) return e;
    od::json_type type;
    if (auto e = value.type().get(type)) return e;
    if (key == "createdAt" && type == od::json_type::string) {
      if (auto e = value.get_string().get(*created_at)) return e;
      continue;
    }
    if (auto e = CheckJsonValue(value, 1, max_depth, too_deep)) return e;
    if (*too_deep) return simdjson::SUCCESS;
  }
  return simdjson::SUCCESS;
}

}  // namespace atfill::atproto
