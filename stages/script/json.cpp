// The bridge between Lua values and atproto JSON: decoding into tables (arrays marked), and
// encoding back, canonical when the record did not change.
#include "stages/script/lua_worker.hpp"

namespace atfill::stages::lua {

bool DoubleToInteger(double d, int64_t* out) {
  if (!std::isfinite(d) || d != std::trunc(d)) return false;
  if (d < -9223372036854775808.0 || d >= 9223372036854775808.0) return false;
  *out = static_cast<int64_t>(d);
  return true;
}

void AppendEscaped(std::string_view s, std::string* out) { AppendJsonString(s, out); }

bool ValidUtf8(const char* s, size_t n) {
  // Most strings are ASCII: checked here without simdjson's dispatch.
  unsigned char any = 0;
  for (size_t i = 0; i < n; ++i) any |= static_cast<unsigned char>(s[i]);
  return any < 0x80 || simdjson::validate_utf8(s, n);
}

void AppendInteger(int64_t v, std::string* out) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  out->append(buf, r.ptr);
}

// ---- JSON --------------------------------------------------------------------------------------

bool LuaWorker::Parse(std::string_view text, dom::element* root, const char** error) {
  const size_t need = text.size() + simdjson::SIMDJSON_PADDING;
  if (padded_capacity_ < need) {
    const size_t capacity = std::max(need, padded_capacity_ * 2);
    // Zeroed once, so the padding simdjson may read is never uninitialised memory.
    padded_ = std::make_unique<char[]>(capacity);
    padded_capacity_ = capacity;
  }
  std::memcpy(padded_.get(), text.data(), text.size());
  auto parsed = parser_.parse(padded_.get(), text.size(), false);
  if (parsed.error() != simdjson::SUCCESS) {
    *error = simdjson::error_message(parsed.error());
    return false;
  }
  *root = parsed.value_unsafe();
  return true;
}

void LuaWorker::PushParsed(lua_State* L, std::string_view text, const char* what) {
  dom::element root;
  const char* error = nullptr;
  if (!Parse(text, &root, &error)) luaL_error(L, "%s: invalid JSON: %s", what, error);
  lua_rawgeti(L, LUA_REGISTRYINDEX, array_mt_ref_);
  const int mt = lua_gettop(L);
  PushJson(L, root, mt);
  lua_remove(L, mt);
}

void LuaWorker::PushArray(lua_State* L, dom::array array, int array_mt) {
  lua_createtable(L, static_cast<int>(std::min<size_t>(array.size(), INT_MAX)), 0);
  lua_pushvalue(L, array_mt);
  lua_setmetatable(L, -2);
  lua_Integer i = 0;
  for (dom::element item : array) {
    PushJson(L, item, array_mt);
    lua_rawseti(L, -2, ++i);
  }
}

void LuaWorker::PushObject(lua_State* L, dom::object object, int array_mt) {
  lua_createtable(L, 0, static_cast<int>(std::min<size_t>(object.size(), INT_MAX)));
  for (dom::key_value_pair field : object) {
    lua_pushlstring(L, field.key.data(), field.key.size());
    PushJson(L, field.value, array_mt);
    lua_rawset(L, -3);
  }
}

void LuaWorker::PushJson(lua_State* L, dom::element e, int array_mt) {
  luaL_checkstack(L, 4, "JSON nesting");
  switch (e.type()) {
    case dom::element_type::ARRAY:
      PushArray(L, e.get_array().value_unsafe(), array_mt);
      return;
    case dom::element_type::OBJECT:
      PushObject(L, e.get_object().value_unsafe(), array_mt);
      return;
    case dom::element_type::INT64:
      lua_pushinteger(L, e.get_int64().value_unsafe());
      return;
    case dom::element_type::UINT64:
      // Past int64: kept as a float, which the encoder refuses.
      lua_pushnumber(L, static_cast<lua_Number>(e.get_uint64().value_unsafe()));
      return;
    case dom::element_type::DOUBLE: {
      const double d = e.get_double().value_unsafe();
      int64_t i = 0;
      if (DoubleToInteger(d, &i)) {
        lua_pushinteger(L, i);
      } else {
        lua_pushnumber(L, d);
      }
      return;
    }
    case dom::element_type::STRING: {
      std::string_view s = e.get_string().value_unsafe();
      lua_pushlstring(L, s.data(), s.size());
      return;
    }
    case dom::element_type::BOOL:
      lua_pushboolean(L, e.get_bool().value_unsafe() ? 1 : 0);
      return;
    case dom::element_type::NULL_VALUE:
      lua_pushlightuserdata(L, nullptr);
      return;
  }
  lua_pushnil(L);
}

bool LuaWorker::CanonicalArray(dom::array array, size_t depth, std::string* out) {
  out->push_back('[');
  bool first = true;
  for (dom::element item : array) {
    if (!first) out->push_back(',');
    first = false;
    if (!Canonical(item, depth + 1, out)) return false;
  }
  out->push_back(']');
  return true;
}

bool LuaWorker::CanonicalObject(dom::object object, size_t depth, std::string* out) {
  const size_t base = dom_entries_.size();
  for (dom::key_value_pair field : object) dom_entries_.emplace_back(field.key, field.value);
  std::sort(dom_entries_.begin() + static_cast<ptrdiff_t>(base), dom_entries_.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  out->push_back('{');
  for (size_t i = base; i < dom_entries_.size(); ++i) {
    if (i != base) out->push_back(',');
    const auto entry = dom_entries_[i];
    AppendEscaped(entry.first, out);
    out->push_back(':');
    if (!Canonical(entry.second, depth + 1, out)) return false;
  }
  out->push_back('}');
  dom_entries_.resize(base);
  return true;
}

bool LuaWorker::Canonical(dom::element e, size_t depth, std::string* out) {
  switch (e.type()) {
    case dom::element_type::ARRAY:
      return CanonicalArray(e.get_array().value_unsafe(), depth, out);
    case dom::element_type::OBJECT:
      return CanonicalObject(e.get_object().value_unsafe(), depth, out);
    case dom::element_type::INT64:
      AppendInteger(e.get_int64().value_unsafe(), out);
      return true;
    case dom::element_type::UINT64:
      return false;
    case dom::element_type::DOUBLE: {
      int64_t i = 0;
      if (!DoubleToInteger(e.get_double().value_unsafe(), &i)) return false;
      AppendInteger(i, out);
      return true;
    }
    case dom::element_type::STRING:
      AppendEscaped(e.get_string().value_unsafe(), out);
      return true;
    case dom::element_type::BOOL:
      out->append(e.get_bool().value_unsafe() ? "true" : "false");
      return true;
    case dom::element_type::NULL_VALUE:
      out->append("null");
      return true;
  }
  return false;
}

void LuaWorker::EncodeFail(lua_State* L, const char* reason) {
  scratch_.assign(encode_what_);
  for (const PathPart& part : path_) {
    if (part.key != nullptr) {
      scratch_.push_back('.');
      scratch_.append(part.key, part.key_size);
    } else {
      scratch_.push_back('[');
      AppendInteger(part.index, &scratch_);
      scratch_.push_back(']');
    }
  }
  luaL_error(L, "%s: %s", scratch_.c_str(), reason);
  std::abort();  // luaL_error does not return
}

void LuaWorker::EncodeValue(lua_State* L, int idx, size_t depth) {
  std::string& out = *out_;
  switch (lua_type(L, idx)) {
    case LUA_TNIL:
      out.append("null");
      return;
    case LUA_TBOOLEAN:
      out.append(lua_toboolean(L, idx) ? "true" : "false");
      return;
    case LUA_TLIGHTUSERDATA:
      if (lua_touserdata(L, idx) == nullptr) {
        out.append("null");
        return;
      }
      EncodeFail(L, "cannot encode a userdata as JSON");
    case LUA_TNUMBER: {
      int64_t i = 0;
      if (lua_isinteger(L, idx)) {
        i = lua_tointeger(L, idx);
      } else if (!DoubleToInteger(lua_tonumber(L, idx), &i)) {
        EncodeFail(L, lua_pushfstring(L,
                                      "%f is not an integer (atproto data has no floating-point "
                                      "numbers; use math.floor or //)",
                                      lua_tonumber(L, idx)));
      }
      AppendInteger(i, &out);
      return;
    }
    case LUA_TSTRING: {
      size_t n = 0;
      const char* s = lua_tolstring(L, idx, &n);
      if (!ValidUtf8(s, n)) EncodeFail(L, "string is not valid UTF-8");
      AppendEscaped(std::string_view(s, n), &out);
      return;
    }
    case LUA_TTABLE:
      EncodeTable(L, idx, depth);
      return;
    default:
      EncodeFail(L, lua_pushfstring(L, "cannot encode a %s as JSON", luaL_typename(L, idx)));
  }
}

void LuaWorker::EncodeTable(lua_State* L, int idx, size_t depth) {
  if (depth >= kMaxDepth + 1) {
    EncodeFail(L, "tables nest too deep for JSON (does a table contain itself?)");
  }
  // A table reached many times over (t = {t, t} nested 40 deep) makes text that grows
  // exponentially, outside the Lua allocator: bounded by the memory cap and the deadline.
  if (out_->size() > alloc_.limit) {
    EncodeFail(L, "the JSON text is larger than the script's memory limit");
  }
  CheckDeadline(L, encode_what_ == kEncodeRecord ? "encoding event.record" : "atfill.json_encode");
  idx = lua_absindex(L, idx);
  luaL_checkstack(L, 4, "JSON nesting");
  std::string& out = *out_;
  bool is_array = false;
  if (lua_getmetatable(L, idx) != 0) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, array_mt_ref_);
    is_array = lua_rawequal(L, -1, -2) != 0;
    lua_pop(L, 2);
  }
  lua_Integer count = 0;
  if (!is_array) {
    // Classify: string keys only -> object; keys 1..n only -> array; nothing -> {}.
    size_t strings = 0;
    lua_Integer integers = 0;
    lua_Integer max_integer = 0;
    bool other = false;
    const size_t base = keys_.size();
    const int top = lua_gettop(L);
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
      if (lua_type(L, -2) == LUA_TSTRING) {
        // The value stays on the stack, below the key lua_next needs: no lookup when writing.
        size_t n = 0;
        const char* k = lua_tolstring(L, -2, &n);
        lua_insert(L, -2);
        keys_.push_back({std::string_view(k, n), lua_gettop(L) - 1});
        ++strings;
        luaL_checkstack(L, 3, "JSON object");
        continue;
      }
      if (lua_isinteger(L, -2) && lua_tointeger(L, -2) > 0) {
        ++integers;
        max_integer = std::max(max_integer, lua_tointeger(L, -2));
      } else {
        other = true;
      }
      lua_pop(L, 1);
    }
    if (other || (strings > 0 && integers > 0) || (integers > 0 && max_integer != integers)) {
      keys_.resize(base);
      EncodeFail(L,
                 "table is neither an array (keys 1..n) nor an object (string keys); use "
                 "atfill.array for arrays");
    }
    if (integers == 0) {
      std::sort(keys_.begin() + static_cast<ptrdiff_t>(base), keys_.end(),
                [](const KeyRef& a, const KeyRef& b) { return a.key < b.key; });
      out.push_back('{');
      for (size_t i = base; i < keys_.size(); ++i) {
        const std::string_view key = keys_[i].key;
        const int slot = keys_[i].slot;
        if (i != base) out.push_back(',');
        if (!ValidUtf8(key.data(), key.size())) {
          EncodeFail(L, "key is not valid UTF-8");
        }
        AppendEscaped(key, &out);
        out.push_back(':');
        path_.push_back({key.data(), key.size(), 0});
        if (depth == 0 && capture_created_at_ && key == "createdAt" &&
            lua_type(L, slot) == LUA_TSTRING) {
          size_t n = 0;
          const char* s = lua_tolstring(L, slot, &n);
          created_at_.assign(s, n);
        }
        EncodeValue(L, slot, depth + 1);
        path_.pop_back();
      }
      out.push_back('}');
      keys_.resize(base);
      lua_settop(L, top);
      return;
    }
    count = integers;
  } else {
    count = static_cast<lua_Integer>(lua_rawlen(L, idx));
  }
  out.push_back('[');
  for (lua_Integer i = 1; i <= count; ++i) {
    if (i != 1) out.push_back(',');
    path_.push_back({nullptr, 0, i});
    lua_rawgeti(L, idx, i);
    EncodeValue(L, -1, depth + 1);
    lua_pop(L, 1);
    path_.pop_back();
  }
  out.push_back(']');
}

}  // namespace atfill::stages::lua
