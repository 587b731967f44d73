// atfill's own table.move, insert and remove (bounded by the deadline), the refused and safe
// functions, the event's fields as the script sees them, get_record and the json entry points.
#include "stages/script/lua_worker.hpp"

namespace atfill::stages::lua {

// The table library's rule for its list argument: a table, or a value whose metatable has the
// fields the function uses (__index to read, __newindex to write, __len for the length).
void CheckListLike(lua_State* L, int arg, bool read, bool write, bool length) {
  if (lua_type(L, arg) == LUA_TTABLE) return;
  if (lua_getmetatable(L, arg) != 0) {
    bool ok = true;
    for (const auto& [wanted, field] :
         {std::pair{read, "__index"}, std::pair{write, "__newindex"}, std::pair{length, "__len"}}) {
      if (!wanted) continue;
      const bool present = lua_getfield(L, -1, field) != LUA_TNIL;
      lua_pop(L, 1);
      ok = ok && present;
    }
    lua_pop(L, 1);
    if (ok) return;
  }
  luaL_checktype(L, arg, LUA_TTABLE);
}

// table.move, insert and remove are atfill's own: the library's loops run in C, and moving nils
// (table.move({}, 1, 1e15, 2), or a __len that reports 1e15) they neither run an instruction nor
// allocate, so one call could run for ever. These do the same element by element, in the same
// order, with the library's checks and messages, and look at the clock every kTableSlice steps.
int LuaWorker::TableMove(lua_State* L) {
  LuaWorker* self = Self(L);
  const lua_Integer f = luaL_checkinteger(L, 2);
  const lua_Integer e = luaL_checkinteger(L, 3);
  const lua_Integer t = luaL_checkinteger(L, 4);
  const int dest = lua_isnoneornil(L, 5) ? 1 : 5;
  CheckListLike(L, 1, true, false, false);
  CheckListLike(L, dest, false, true, false);
  if (e >= f) {
    luaL_argcheck(L, f > 0 || e < LUA_MAXINTEGER + f, 3, "too many elements to move");
    const lua_Integer n = e - f;  // elements, less one
    luaL_argcheck(L, t <= LUA_MAXINTEGER - n, 4, "destination wrap around");
    // Upwards unless the ranges overlap with the destination above the source, in one table.
    const bool upwards = t > e || t <= f || (dest != 1 && !lua_compare(L, 1, dest, LUA_OPEQ));
    for (lua_Integer k = 0; k <= n; ++k) {
      const lua_Integer i = upwards ? k : n - k;
      lua_geti(L, 1, f + i);
      lua_seti(L, dest, t + i);
      if ((k & (kTableSlice - 1)) == kTableSlice - 1) self->CheckDeadline(L, "table.move");
    }
  }
  lua_pushvalue(L, dest);
  return 1;
}

int LuaWorker::TableInsert(lua_State* L) {
  LuaWorker* self = Self(L);
  CheckListLike(L, 1, true, true, true);
  const lua_Integer end = luaL_len(L, 1) + 1;  // the first free position
  lua_Integer pos = end;
  switch (lua_gettop(L)) {
    case 2:
      break;
    case 3: {
      pos = luaL_checkinteger(L, 2);
      // Unsigned: also refuses pos < 1.
      luaL_argcheck(L, static_cast<lua_Unsigned>(pos) - 1u < static_cast<lua_Unsigned>(end), 2,
                    "position out of bounds");
      for (lua_Integer i = end; i > pos; --i) {
        lua_geti(L, 1, i - 1);
        lua_seti(L, 1, i);
        if (((end - i) & (kTableSlice - 1)) == kTableSlice - 1) {
          self->CheckDeadline(L, "table.insert");
        }
      }
      break;
    }
    default:
      return luaL_error(L, "wrong number of arguments to 'insert'");
  }
  lua_seti(L, 1, pos);
  return 0;
}

int LuaWorker::TableRemove(lua_State* L) {
  LuaWorker* self = Self(L);
  CheckListLike(L, 1, true, true, true);
  const lua_Integer size = luaL_len(L, 1);
  lua_Integer pos = luaL_optinteger(L, 2, size);
  if (pos != size) {
    // Also pos == size + 1, and 0 for an empty list. (Argument #1 in the message, as the
    // library says it.)
    luaL_argcheck(L, static_cast<lua_Unsigned>(pos) - 1u <= static_cast<lua_Unsigned>(size), 1,
                  "position out of bounds");
  }
  lua_geti(L, 1, pos);  // the result
  for (const lua_Integer first = pos; pos < size; ++pos) {
    lua_geti(L, 1, pos + 1);
    lua_seti(L, 1, pos);
    if (((pos - first) & (kTableSlice - 1)) == kTableSlice - 1) {
      self->CheckDeadline(L, "table.remove");
    }
  }
  lua_pushnil(L);
  lua_seti(L, 1, pos);
  return 1;
}

int LuaWorker::Refuse(lua_State* L) {
  return luaL_error(L, "%s is not available in atfill scripts",
                    lua_tostring(L, lua_upvalueindex(1)));
}

int LuaWorker::RefuseLibrary(lua_State* L) {
  const char* library = lua_tostring(L, lua_upvalueindex(1));
  if (lua_type(L, 2) == LUA_TSTRING) {
    return luaL_error(L, "%s.%s is not available in atfill scripts (no %s library)", library,
                      lua_tostring(L, 2), library);
  }
  return luaL_error(L, "the %s library is not available in atfill scripts", library);
}

int LuaWorker::Silent(lua_State* /*L*/) { return 0; }

// setmetatable without __gc: finalizers would run script code at arbitrary moments (inside
// another record's call, or while atfill decodes JSON).
int LuaWorker::SafeSetMetatable(lua_State* L) {
  const int t = lua_type(L, 2);
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_argexpected(L, t == LUA_TNIL || t == LUA_TTABLE, 2, "nil or table");
  if (t == LUA_TTABLE) {
    lua_pushliteral(L, "__gc");
    if (lua_rawget(L, 2) != LUA_TNIL) {
      return luaL_error(L, "__gc metamethods are not available in atfill scripts");
    }
    lua_pop(L, 1);
  }
  if (luaL_getmetafield(L, 1, "__metatable") != LUA_TNIL) {
    return luaL_error(L, "cannot change a protected metatable");
  }
  lua_settop(L, 2);
  lua_setmetatable(L, 1);
  return 1;
}

// The iterator pairs(event) returns; the fields table is its upvalue, not a value the script
// could keep.
int LuaWorker::FieldsNext(lua_State* L) {
  lua_settop(L, 2);
  if (lua_next(L, lua_upvalueindex(kUpFields)) != 0) return 2;
  lua_pushnil(L);
  return 1;
}

// __index of the fields table: makes a field on its first read in a call and keeps it there
// (the key is one of the interned upvalue strings, so the comparisons are pointer compares).
int LuaWorker::FieldsIndex(lua_State* L) {
  LuaWorker* self = Self(L);
  const RecordEvent* event = self->event_;
  if (event == nullptr) return 0;
  int field = 0;
  for (int k = kUpDid; k <= kUpRecord; ++k) {
    if (lua_rawequal(L, 2, lua_upvalueindex(k))) {
      field = k;
      break;
    }
  }
  const auto push_string = [&](const std::string& s) { lua_pushlstring(L, s.data(), s.size()); };
  switch (field) {
    case kUpDid:
      push_string(event->did);
      break;
    case kUpCollection:
      push_string(event->collection);
      break;
    case kUpRkey:
      push_string(event->rkey);
      break;
    case kUpOperation:
      lua_pushvalue(L, lua_upvalueindex(event->operation == Operation::kCreate   ? kUpCreate
                                        : event->operation == Operation::kUpdate ? kUpUpdate
                                                                                 : kUpDelete));
      break;
    case kUpOrigin:
      lua_pushvalue(L, lua_upvalueindex(event->origin == pipeline::Origin::kLive    ? kUpLive
                                        : event->origin == pipeline::Origin::kCrawl ? kUpCrawl
                                                                                    : kUpReplay));
      break;
    case kUpRev:
      if (event->rev.empty()) return 0;
      push_string(event->rev);
      break;
    case kUpUri:
      self->scratch_ = event->Uri();
      push_string(self->scratch_);
      break;
    case kUpCid:
      if (!event->cid.valid()) return 0;
      self->scratch_ = event->cid.ToString();
      push_string(self->scratch_);
      break;
    case kUpRecord: {
      if (event->operation == Operation::kDelete) return 0;
      dom::element root;
      const char* error = nullptr;
      if (!self->Parse(event->body, &root, &error)) {
        return luaL_error(L, "event.record is not valid JSON: %s", error);
      }
      self->canonical_.clear();
      self->dom_entries_.clear();
      self->canonical_ok_ = self->Canonical(root, 0, &self->canonical_);
      self->decoded_ = true;
      lua_rawgeti(L, LUA_REGISTRYINDEX, self->array_mt_ref_);
      self->PushJson(L, root, lua_gettop(L));
      break;
    }
    default:
      return 0;
  }
  lua_pushvalue(L, 2);
  lua_pushvalue(L, -2);
  lua_rawset(L, 1);
  self->made_fields_ |= 1u << field;
  return 1;
}

int LuaWorker::EventNewIndex(lua_State* L) {
  LuaWorker* self = Self(L);
  if (lua_rawequal(L, 2, lua_upvalueindex(kUpRecord))) {
    if (self->event_ != nullptr && self->event_->operation == Operation::kDelete) {
      return luaL_error(L, "event.record cannot be set on a delete");
    }
    const int t = lua_type(L, 3);
    if (t != LUA_TTABLE && t != LUA_TNIL) {
      return luaL_error(L, "event.record must be a table (got a %s)", lua_typename(L, t));
    }
    lua_settop(L, 3);
    lua_rawset(L, lua_upvalueindex(kUpFields));
    self->made_fields_ |= 1u << kUpRecord;
    return 0;
  }
  for (int k = kUpDid; k < kUpRecord; ++k) {
    if (lua_rawequal(L, 2, lua_upvalueindex(k))) {
      return luaL_error(L, "event.%s is read-only (only event.record can be changed)",
                        lua_tostring(L, 2));
    }
  }
  if (lua_type(L, 2) == LUA_TSTRING) {
    return luaL_error(L, "event has no field '%s' (only event.record can be changed)",
                      lua_tostring(L, 2));
  }
  return luaL_error(L, "event fields are read-only (only event.record can be changed)");
}

// pairs(event) lists every field, so they are all made first.
int LuaWorker::EventPairs(lua_State* L) {
  const int fields = lua_upvalueindex(kUpFields);
  for (int k = kUpDid; k <= kUpRecord; ++k) {
    lua_pushvalue(L, lua_upvalueindex(k));
    lua_gettable(L, fields);
    lua_pop(L, 1);
  }
  lua_pushvalue(L, fields);
  lua_pushcclosure(L, FieldsNext, 1);
  lua_pushnil(L);
  lua_pushnil(L);
  return 3;
}

int LuaWorker::GetRecord(lua_State* L) {
  LuaWorker* self = Self(L);
  size_t n = 0;
  const char* uri = luaL_checklstring(L, 1, &n);
  const auto& reader = self->program_->options.read_record;
  if (!reader) return luaL_error(L, "atfill.get_record: no record reader is configured");
  // The reader's result lives only in this scope; what Lua needs is copied to members first.
  bool found = false;
  bool failed = false;
  {
    try {
      auto result = reader(std::string_view(uri, n));
      if (!result.ok()) {
        failed = true;
        self->scratch_ = result.status().ToString();
      } else if (result->has_value()) {
        found = true;
        self->scratch_ = std::move(**result);
      }
    } catch (const std::exception& e) {
      failed = true;
      self->scratch_ = e.what();
    } catch (...) {
      failed = true;
      self->scratch_ = "the record reader threw an unknown exception";
    }
  }
  if (failed) return luaL_error(L, "atfill.get_record: %s", self->scratch_.c_str());
  // The reader cannot be interrupted (the sink's own timeouts bound it); a call it kept past the
  // deadline fails once it returns.
  self->CheckDeadline(L, "atfill.get_record");
  if (!found) return 0;
  // scratch_ is not touched again until the push copies what it needs.
  self->PushParsed(L, self->scratch_, "atfill.get_record");
  return 1;
}

int LuaWorker::JsonDecode(lua_State* L) {
  size_t n = 0;
  const char* text = luaL_checklstring(L, 1, &n);
  Self(L)->PushParsed(L, std::string_view(text, n), "atfill.json_decode");
  return 1;
}

int LuaWorker::JsonEncode(lua_State* L) {
  LuaWorker* self = Self(L);
  luaL_checkany(L, 1);
  lua_settop(L, 1);
  self->scratch_.clear();
  self->out_ = &self->scratch_;
  self->path_.clear();
  self->keys_.clear();
  self->encode_what_ = "atfill.json_encode: value";
  self->capture_created_at_ = false;
  self->EncodeValue(L, 1, 0);
  lua_pushlstring(L, self->scratch_.data(), self->scratch_.size());
  return 1;
}

int LuaWorker::MakeArray(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  lua_rawgeti(L, LUA_REGISTRYINDEX, Self(L)->array_mt_ref_);
  lua_setmetatable(L, 1);
  return 1;
}

}  // namespace atfill::stages::lua
