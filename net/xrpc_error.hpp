// XRPC error bodies ({"error":"RepoNotFound","message":"..."}) and which of them are final.
#pragma once

#include <string>
#include <string_view>

namespace atfill::net {

struct HttpResponse;

struct XrpcError {
  // The error name ("RepoNotFound"); empty when the body is not an XRPC error object.
  std::string error;
  // The human message; empty when absent.
  std::string message;
};

// Reads an XRPC error object. Never fails: a body that is not JSON, not an object, or whose
// "error" is missing or not a string yields an empty `error`. Thread-safe.
XrpcError ParseXrpcError(std::string_view body);
XrpcError ParseXrpcError(const HttpResponse& response);

// True when a live server gave a definitive answer for the unit, so retrying is pointless: a 4xx
// (other than 408 and 429) whose error is RepoNotFound, InvalidRequest, RepoTakendown,
// RepoDeactivated or RepoSuspended. 5xx, 408, 429 and every other 4xx are not final; transport
// failures never reach this function (they are errors, retryable by the caller).
bool IsFinalXrpcError(int status, const XrpcError& error);
// Parses the body of `response` and applies the rule above.
bool IsFinalXrpcError(const HttpResponse& response);
// True when a final error (above) is the PDS's report of the account's state, not a failure of
// the request: RepoDeactivated, RepoTakendown, RepoSuspended, or RepoNotFound (the account was
// deleted or is not on this PDS). InvalidRequest is not one: it says the request was wrong.
bool IsAccountStateXrpcError(int status, const XrpcError& error);

}  // namespace atfill::net
