// Ports for servers that pick their own (tests, simnet, an admin server given port 0): below
// Linux's ephemeral range (32768-60999), where a client socket of any program may hold a port
// the moment a server wants it, and where a port probed free and closed can be taken again
// before the server binds it. Binding there instead keeps the two apart.
#pragma once

#include <cstdint>
#include <optional>
#include <random>

namespace atfill {

inline constexpr uint16_t kLowPortFirst = 20000;
inline constexpr uint16_t kLowPortLast = 32767;

// Calls try_bind(port) with ports drawn at random from [kLowPortFirst, kLowPortLast] until it
// returns true, at most `attempts` times; the port it bound, or nullopt. Random rather than in
// order, so parallel test processes rarely try the same port.
template <typename TryBind>
std::optional<uint16_t> BindLowPort(TryBind&& try_bind, int attempts = 200) {
  static thread_local std::mt19937 rng{std::random_device{}()};
  std::uniform_int_distribution<int> pick(kLowPortFirst, kLowPortLast);
  for (int i = 0; i < attempts; ++i) {
    const auto port = static_cast<uint16_t>(pick(rng));
    if (try_bind(port)) return port;
  }
  return std::nullopt;
}

}  // namespace atfill
