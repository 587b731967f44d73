// Asking the network whether an account still exists: the account check (stages/account_check)
// asks its PDS before a stream's deletion purges the account. The stage sees only this interface;
// the implementation (sources/pds_account_status) resolves the DID and asks the PDS on the net/
// event loop.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace atfill::pipeline {

// What the account's PDS said.
struct AccountStatusAnswer {
  enum class Verdict {
    kActive,   // the PDS says the repo is active
    kGone,     // the PDS says it is not (inactive with any status, or RepoNotFound)
    kUnknown,  // the PDS could not be asked (no resolution, transport failure, timeout, 5xx...)
  };
  Verdict verdict = Verdict::kUnknown;
  // Why, a sentence fragment for the log ("https://pds.example says the repo is active").
  std::string detail;
};

class AccountStatusLookup {
 public:
  using Done = std::function<void(AccountStatusAnswer)>;
  virtual ~AccountStatusLookup() = default;

  // Asks about `did`, within `timeout_ms` (the DID's resolution included), and calls `done`
  // exactly once: inline when the answer is known at once, else on an I/O thread, so `done` must
  // be cheap, must not block and must not throw. Thread-safe; never blocks on I/O.
  virtual void Lookup(const std::string& did, int64_t timeout_ms, Done done) const = 0;
};

}  // namespace atfill::pipeline
