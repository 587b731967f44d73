#include <array>
#include <map>
#include <mutex>
#include <utility>

#include "state/kv_store.hpp"

namespace atfill::state {
namespace {

using Map = std::map<std::string, std::string, std::less<>>;

bool ValidFamily(Family f) { return static_cast<size_t>(f) < kFamilyCount; }

Status BadFamily(Family f) {
  return Status::Invalid("state: unknown column family " + std::to_string(static_cast<int>(f)));
}

class MemoryKvStore final : public KvStore {
 public:
  Result<std::optional<std::string>> Get(Family f, std::string_view key) override {
    if (!ValidFamily(f)) return BadFamily(f);
    std::lock_guard lock(mu_);
    const Map& m = data_[static_cast<size_t>(f)];
    auto it = m.find(key);
    if (it == m.end()) return std::optional<std::string>();
    return std::optional<std::string>(it->second);
  }

  Status Write(const WriteBatch& batch) override {
    for (const auto& op : batch.ops()) {
      if (!ValidFamily(op.family)) return BadFamily(op.family);
    }
    std::lock_guard lock(mu_);
    // Applied in place with an undo log so a failing op leaves nothing behind.
    std::vector<std::pair<const WriteBatch::Op*, std::optional<std::string>>> undo;
    undo.reserve(batch.size());
    for (const auto& op : batch.ops()) {
      Map& m = data_[static_cast<size_t>(op.family)];
      auto it = m.find(op.key);
      std::optional<std::string> before;
      if (it != m.end()) before = it->second;
      Status st;
      switch (op.type) {
        case WriteBatch::OpType::kPut:
          m.insert_or_assign(op.key, op.value);
          break;
        case WriteBatch::OpType::kDelete:
          if (it != m.end()) m.erase(it);
          break;
        case WriteBatch::OpType::kAdd: {
          uint64_t base = 0;
          if (before) {
            auto decoded = DecodeCounter(
                *before, "state: add to " + std::string(FamilyName(op.family)) + " key");
            if (!decoded.ok()) {
              st = decoded.status();
              break;
            }
            base = *decoded;
          }
          auto delta = DecodeCounter(op.value, "state: add delta");
          if (!delta.ok()) {
            st = delta.status();
            break;
          }
          m.insert_or_assign(op.key, EncodeCounter(base + *delta));
          break;
        }
      }
      if (!st.ok()) {
        Rollback(undo);
        return st;
      }
      undo.emplace_back(&op, std::move(before));
    }
    return Status::OK();
  }

  Status Scan(Family f, std::string_view prefix,
              const std::function<bool(std::string_view, std::string_view)>& fn,
              std::string_view start_after) override {
    if (!ValidFamily(f)) return BadFamily(f);
    // Copied under the lock, so fn runs unlocked (it may call back into the store) over a
    // consistent snapshot.
    std::vector<std::pair<std::string, std::string>> copy;
    {
      std::lock_guard lock(mu_);
      const Map& m = data_[static_cast<size_t>(f)];
      auto it = !start_after.empty() && start_after >= prefix ? m.upper_bound(start_after)
                                                              : m.lower_bound(prefix);
      for (; it != m.end() && std::string_view(it->first).starts_with(prefix); ++it) {
        copy.emplace_back(it->first, it->second);
      }
    }
    for (const auto& [k, v] : copy) {
      if (!fn(k, v)) break;
    }
    return Status::OK();
  }

  Result<std::optional<std::string>> LastKey(Family f, std::string_view prefix) override {
    if (!ValidFamily(f)) return BadFamily(f);
    std::lock_guard lock(mu_);
    const Map& m = data_[static_cast<size_t>(f)];
    // The first key past every key with this prefix, then one step back.
    std::string end(prefix);
    while (!end.empty() && static_cast<uint8_t>(end.back()) == 0xff) end.pop_back();
    auto it = m.end();
    if (!end.empty()) {
      end.back() = static_cast<char>(static_cast<uint8_t>(end.back()) + 1);
      it = m.lower_bound(end);
    }
    if (it == m.begin()) return std::optional<std::string>();
    --it;
    if (!std::string_view(it->first).starts_with(prefix)) return std::optional<std::string>();
    return std::optional<std::string>(it->first);
  }

 private:
  void Rollback(std::vector<std::pair<const WriteBatch::Op*, std::optional<std::string>>>& undo) {
    for (auto it = undo.rbegin(); it != undo.rend(); ++it) {
      Map& m = data_[static_cast<size_t>(it->first->family)];
      if (it->second) {
        m.insert_or_assign(it->first->key, std::move(*it->second));
      } else {
        m.erase(it->first->key);
      }
    }
  }

  std::mutex mu_;
  std::array<Map, kFamilyCount> data_;
};

}  // namespace

std::unique_ptr<KvStore> NewMemoryKvStore() { return std::make_unique<MemoryKvStore>(); }

}  // namespace atfill::state
