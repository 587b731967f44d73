#include "sources/pds_account_status.hpp"

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

void PdsAccountStatus::Lookup(const std::string& did, int64_t timeout_ms, Done done) const {
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  net::HttpClient* http = http_;
  resolver_->Resolve(
      did, [http, did, deadline, done = std::move(done)](sources::ResolveOutcome outcome) mutable {
        if (!outcome.ok()) {
          done({Verdict::kUnknown, "cannot resolve the DID: " + outcome.message});
          return;
        }
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (left <= 0) {
          done({Verdict::kUnknown, "resolving the DID took too long"});
          return;
        }
        net::HttpRequest request;
        request.url = sources::GetRepoStatusUrl(outcome.doc->pds_endpoint, did);
        request.timeout_ms = left;
        request.retry = net::RetryPolicy{.max_attempts = 1};
        http->Submit(std::move(request),
                     [did, pds = outcome.doc->pds_endpoint, done = std::move(done)](
                         Result<net::HttpResponse> r) { done(Classify(did, pds, r)); });
      });
}

}  // namespace atfill::sources
