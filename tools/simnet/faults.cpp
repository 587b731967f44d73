#include <charconv>
#include <cmath>

#include "tools/simnet/simnet.hpp"

namespace atfill::simnet {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  while (true) {
    const size_t pos = s.find(sep);
    out.push_back(Trim(s.substr(0, pos)));
    if (pos == std::string_view::npos) break;
    s.remove_prefix(pos + 1);
  }
  return out;
}

Result<double> ParseDouble(std::string_view key, std::string_view text) {
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value)) {
    return Status::Invalid("fault key " + std::string(key) + ": \"" + std::string(text) +
                           "\" is not a number");
  }
  return value;
}

Result<int64_t> ParseInt(std::string_view key, std::string_view text) {
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0) {
    return Status::Invalid("fault key " + std::string(key) + ": \"" + std::string(text) +
                           "\" is not a non-negative integer");
  }
  return value;
}

Result<FaultRate> ParseRate(std::string_view key, std::string_view text) {
  FaultRate rate;
  if (text == "always") {
    rate.hit = rate.period = 1;
    return rate;
  }
  if (const size_t slash = text.find('/'); slash != std::string_view::npos) {
    ATFILL_ASSIGN_OR_RETURN(int64_t hit, ParseInt(key, text.substr(0, slash)));
    ATFILL_ASSIGN_OR_RETURN(int64_t period, ParseInt(key, text.substr(slash + 1)));
    if (period == 0 || hit > period || period > 1'000'000) {
      return Status::Invalid("fault key " + std::string(key) + ": \"" + std::string(text) +
                             "\" must be HIT/PERIOD with 0 <= HIT <= PERIOD <= 1000000, PERIOD>0");
    }
    rate.hit = static_cast<uint32_t>(hit);
    rate.period = static_cast<uint32_t>(period);
    return rate;
  }
  ATFILL_ASSIGN_OR_RETURN(rate.probability, ParseDouble(key, text));
  if (rate.probability < 0 || rate.probability > 1) {
    return Status::Invalid("fault key " + std::string(key) + ": probability " + std::string(text) +
                           " is outside 0..1");
  }
  return rate;
}

void ApplyRate(FaultRate* to, const FaultRate& from) {
  if (from.enabled()) *to = from;
}

}  // namespace

bool FaultRate::Hits(uint64_t n, uint64_t random) const {
  if (period > 0 && hit > 0 && n % period < hit) return true;
  if (probability <= 0) return false;
  // 53 random bits as a double in [0, 1).
  return static_cast<double>(random >> 11) * 0x1.0p-53 < probability;
}

void HostFaults::Apply(const HostFaults& other) {
  if (other.extra_latency_ms > 0) extra_latency_ms = other.extra_latency_ms;
  ApplyRate(&rate_limit, other.rate_limit);
  if (other.rate_limit_reset_s != 2) rate_limit_reset_s = other.rate_limit_reset_s;
  ApplyRate(&server_error, other.server_error);
  if (other.server_error_status != 0) server_error_status = other.server_error_status;
  ApplyRate(&timeout, other.timeout);
  ApplyRate(&truncate, other.truncate);
  ApplyRate(&cid_mismatch, other.cid_mismatch);
  ApplyRate(&oversize, other.oversize);
  ApplyRate(&bad_signature, other.bad_signature);
  ApplyRate(&private_endpoint, other.private_endpoint);
  ApplyRate(&bad_scheme, other.bad_scheme);
}

Result<std::vector<FaultRule>> ParseFaultSpec(std::string_view spec) {
  std::vector<FaultRule> rules;
  if (Trim(spec).empty()) return rules;
  for (std::string_view text : Split(spec, ';')) {
    if (text.empty()) continue;
    const size_t colon = text.find(':');
    if (colon == std::string_view::npos) {
      return Status::Invalid("fault rule \"" + std::string(text) +
                             "\" has no ':' between its target and its settings");
    }
    FaultRule rule;
    std::string_view target = Trim(text.substr(0, colon));
    if (const size_t at = target.find('@'); at != std::string_view::npos) {
      ATFILL_ASSIGN_OR_RETURN(rule.host_share, ParseDouble("@share", target.substr(at + 1)));
      if (rule.host_share < 0 || rule.host_share > 1) {
        return Status::Invalid("fault rule \"" + std::string(text) + "\": share outside 0..1");
      }
      target = target.substr(0, at);
    }
    if (target.empty())
      return Status::Invalid("fault rule \"" + std::string(text) + "\": no target");
    rule.target = std::string(target);
    for (std::string_view setting : Split(text.substr(colon + 1), ',')) {
      if (setting.empty()) continue;
      const size_t eq = setting.find('=');
      if (eq == std::string_view::npos) {
        return Status::Invalid("fault setting \"" + std::string(setting) + "\" is not KEY=VALUE");
      }
      const std::string_view key = Trim(setting.substr(0, eq));
      const std::string_view value = Trim(setting.substr(eq + 1));
      HostFaults& f = rule.faults;
      if (key == "latency_ms") {
        ATFILL_ASSIGN_OR_RETURN(f.extra_latency_ms, ParseInt(key, value));
      } else if (key == "reset_s") {
        ATFILL_ASSIGN_OR_RETURN(f.rate_limit_reset_s, ParseInt(key, value));
      } else if (key == "error_status") {
        ATFILL_ASSIGN_OR_RETURN(int64_t status, ParseInt(key, value));
        if (status < 500 || status > 599) {
          return Status::Invalid("fault key error_status: " + std::string(value) +
                                 " is not a 5xx status");
        }
        f.server_error_status = static_cast<int>(status);
      } else {
        FaultRate* rate = key == "rate_limit"         ? &f.rate_limit
                          : key == "error"            ? &f.server_error
                          : key == "timeout"          ? &f.timeout
                          : key == "truncate"         ? &f.truncate
                          : key == "cid_mismatch"     ? &f.cid_mismatch
                          : key == "oversize"         ? &f.oversize
                          : key == "bad_signature"    ? &f.bad_signature
                          : key == "private_endpoint" ? &f.private_endpoint
                          : key == "bad_scheme"       ? &f.bad_scheme
                                                      : nullptr;
        if (rate == nullptr) {
          return Status::Invalid("unknown fault key \"" + std::string(key) + "\"");
        }
        ATFILL_ASSIGN_OR_RETURN(*rate, ParseRate(key, value));
      }
    }
    rules.push_back(std::move(rule));
  }
  return rules;
}

}  // namespace atfill::simnet
