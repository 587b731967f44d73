#include "stages/account_check.hpp"

#include <chrono>
#include <future>
#include <memory>
#include <utility>

#include "net/xrpc_error.hpp"
#include "stages/fetcher.hpp"

namespace atfill::stages {
namespace {

using pipeline::AccountEvent;
using pipeline::AccountStatus;
using Clock = std::chrono::steady_clock;

enum class Verdict { kActive, kGone, kUnknown };

struct Answer {
  Verdict verdict = Verdict::kUnknown;
  std::string detail;  // why, for the log
};

}  // namespace

Status AccountCheckOptions::Validate() const {
  if (timeout_ms < 1 || timeout_ms > 600'000) {
    return Status::Invalid("account check timeout_ms must be within 1..600000, not " +
                           std::to_string(timeout_ms));
  }
  return Status::OK();
}

AccountCheck::AccountCheck(DidResolver* resolver, net::HttpClient* http,
                           AccountCheckOptions options)
    : resolver_(resolver), http_(http), options_(options) {}

AccountCheckStats AccountCheck::stats() const {
  return {checks_.load(), refused_.load(), unconfirmed_.load()};
}

namespace {

// Asks the PDS of `did` for its status, within `deadline`.
Answer Ask(DidResolver* resolver, net::HttpClient* http, const std::string& did,
           Clock::time_point deadline) {
  auto resolved = std::make_shared<std::promise<ResolveOutcome>>();
  auto resolved_future = resolved->get_future();
  resolver->Resolve(did, [resolved](ResolveOutcome o) { resolved->set_value(std::move(o)); });
  if (resolved_future.wait_until(deadline) != std::future_status::ready) {
    return {Verdict::kUnknown, "resolving the DID took too long"};
  }
  const ResolveOutcome outcome = resolved_future.get();
  if (!outcome.ok()) return {Verdict::kUnknown, "cannot resolve the DID: " + outcome.message};

  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return {Verdict::kUnknown, "resolving the DID took too long"};
  net::HttpRequest request;
  request.url = GetRepoStatusUrl(outcome.doc->pds_endpoint, did);
  request.timeout_ms = left;
  request.retry = net::RetryPolicy{.max_attempts = 1};
  auto answered = std::make_shared<std::promise<Result<net::HttpResponse>>>();
  auto answered_future = answered->get_future();
  http->Submit(std::move(request),
               [answered](Result<net::HttpResponse> r) { answered->set_value(std::move(r)); });
  // The request carries its own timeout; wait a little past it for the callback.
  const Result<net::HttpResponse> response = answered_future.get();
  const std::string pds = outcome.doc->pds_endpoint;
  if (!response.ok()) {
    return {Verdict::kUnknown, "cannot ask " + pds + ": " + response.status().message()};
  }
  if (response->status == 200) {
    auto parsed = ParseRepoStatus(did, response->body);
    if (!parsed.ok()) return {Verdict::kUnknown, parsed.status().message()};
    if (parsed->active) return {Verdict::kActive, pds + " says the repo is active"};
    return {Verdict::kGone,
            pds + " says " + (parsed->status.empty() ? "inactive" : parsed->status)};
  }
  const net::XrpcError error = net::ParseXrpcError(*response);
  if (response->status == 400 && error.error == "RepoNotFound") {
    return {Verdict::kGone, pds + " does not have the repo"};
  }
  return {Verdict::kUnknown, pds + " answered HTTP " + std::to_string(response->status) +
                                 (error.error.empty() ? "" : " " + error.error)};
}

}  // namespace

Status AccountCheck::Process(pipeline::TransformState*, pipeline::EventChunk* chunk) const {
  std::vector<pipeline::Event>& events = chunk->events;
  size_t kept = 0;
  int64_t checks = 0, refused = 0, unconfirmed = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    const auto* a = std::get_if<AccountEvent>(&events[i]);
    bool keep = true;
    if (a != nullptr && !a->resync && a->status == AccountStatus::kDeleted) {
      ++checks;
      const Answer answer = Ask(resolver_, http_, a->did,
                                Clock::now() + std::chrono::milliseconds(options_.timeout_ms));
      if (answer.verdict == Verdict::kActive) {
        keep = false;
        ++refused;
        chunk->errors.push_back({"account_status_mismatch", a->did,
                                 "the stream says " + a->did + " was deleted but " + answer.detail +
                                     "; its records are kept"});
      } else if (answer.verdict == Verdict::kUnknown) {
        ++unconfirmed;
      }
    }
    if (keep) {
      if (kept != i) events[kept] = std::move(events[i]);
      ++kept;
    }
  }
  events.resize(kept);
  chunk->dropped += static_cast<uint64_t>(refused);
  if (checks != 0) chunk->counters.emplace_back("account_checks", checks);
  if (refused != 0) chunk->counters.emplace_back("account_purges_refused", refused);
  if (unconfirmed != 0) chunk->counters.emplace_back("account_purges_unconfirmed", unconfirmed);
  checks_ += static_cast<uint64_t>(checks);
  refused_ += static_cast<uint64_t>(refused);
  unconfirmed_ += static_cast<uint64_t>(unconfirmed);
  return Status::OK();
}

}  // namespace atfill::stages
