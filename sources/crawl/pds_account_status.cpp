#include "sources/crawl/pds_account_status.hpp"

#include <atomic>
#include <chrono>
#include <memory>
#include <utility>

#include "net/xrpc_error.hpp"
#include "sources/crawl/fetcher.hpp"

namespace atfill::sources {
namespace {

using pipeline::AccountStatusAnswer;
using Verdict = pipeline::AccountStatusAnswer::Verdict;
using Clock = std::chrono::steady_clock;

AccountStatusAnswer Classify(const std::string& did, const std::string& pds,
                             const Result<net::HttpResponse>& response) {
  if (!response.ok()) {
    return {Verdict::kUnknown, "cannot ask " + pds + ": " + response.status().message()};
  }
  if (response->status == 200) {
    auto parsed = sources::ParseRepoStatus(did, response->body);
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

// One lookup's answer, given once: by the PDS, by a failure on the way, or by the deadline,
// whichever comes first.
struct PdsAccountStatus::Pending {
  std::atomic<bool> answered{false};
  std::atomic<bool> asking_pds{false};
  Done done;

  void Answer(AccountStatusAnswer answer) {
    if (answered.exchange(true, std::memory_order_acq_rel)) return;
    // Moved out first: the winner alone touches `done`, and it may free what it captured.
    Done d = std::move(done);
    d(std::move(answer));
  }
};

void PdsAccountStatus::Lookup(const std::string& did, int64_t timeout_ms, Done done) const {
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  auto pending = std::make_shared<Pending>();
  pending->done = std::move(done);
  // The resolver's own request may take far longer than the check allows (its timeout and
  // retries are the crawl's), and a slot on a busy host may be waited for before any request
  // starts; the alarm bounds both, and the PDS request, by the one deadline.
  http_->After(timeout_ms, [pending, timeout_ms] {
    pending->Answer({Verdict::kUnknown,
                     "no answer within " + std::to_string(timeout_ms) + " ms (" +
                         (pending->asking_pds.load() ? "asking the PDS" : "resolving the DID") +
                         ")"});
  });
  net::HttpClient* http = http_;
  resolver_->Resolve(did, [http, did, deadline, pending](sources::ResolveOutcome outcome) {
    if (pending->answered.load(std::memory_order_acquire)) return;
    if (!outcome.ok()) {
      pending->Answer({Verdict::kUnknown, "cannot resolve the DID: " + outcome.message});
      return;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      pending->Answer({Verdict::kUnknown, "resolving the DID took too long"});
      return;
    }
    pending->asking_pds.store(true);
    net::HttpRequest request;
    request.url = sources::GetRepoStatusUrl(outcome.doc->pds_endpoint, did);
    // The alarm owns the deadline: the request's own timeout, measured from a moment later than
    // the alarm's, could fire a millisecond before it and answer with curl's reason instead. It
    // only ends a request nobody waits for any more.
    request.timeout_ms = left + 250;
    request.retry = net::RetryPolicy{.max_attempts = 1};
    http->Submit(std::move(request),
                 [did, pds = outcome.doc->pds_endpoint, pending](Result<net::HttpResponse> r) {
                   pending->Answer(Classify(did, pds, r));
                 });
  });
}

}  // namespace atfill::sources
