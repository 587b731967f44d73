#include "net/xrpc_error.hpp"

#include <simdjson.h>

#include <array>

#include "net/http_client.hpp"

namespace atfill::net {
namespace {

// Error bodies are small; a larger body is a page of something else and is not worth parsing.
constexpr size_t kMaxErrorBodyBytes = 64 * 1024;

}  // namespace

XrpcError ParseXrpcError(std::string_view body) {
  XrpcError out;
  if (body.empty() || body.size() > kMaxErrorBodyBytes) return out;
  simdjson::dom::parser parser;
  const simdjson::padded_string padded(body);
  simdjson::dom::object object;
  if (parser.parse(padded).get_object().get(object) != simdjson::SUCCESS) return out;
  std::string_view error;
  if (object["error"].get_string().get(error) != simdjson::SUCCESS) return out;
  out.error = std::string(error);
  std::string_view message;
  if (object["message"].get_string().get(message) == simdjson::SUCCESS) {
    out.message = std::string(message);
  }
  return out;
}

XrpcError ParseXrpcError(const HttpResponse& response) { return ParseXrpcError(response.body); }

bool IsFinalXrpcError(int status, const XrpcError& error) {
  if (status < 400 || status >= 500 || status == 408 || status == 429) return false;
  static constexpr std::array<std::string_view, 5> kFinal = {
      "RepoNotFound", "InvalidRequest", "RepoTakendown", "RepoDeactivated", "RepoSuspended"};
  for (std::string_view name : kFinal) {
    if (error.error == name) return true;
  }
  return false;
}

bool IsAccountStateXrpcError(int status, const XrpcError& error) {
  return IsFinalXrpcError(status, error) && error.error != "InvalidRequest";
}

bool IsFinalXrpcError(const HttpResponse& response) {
  if (response.status < 400 || response.status >= 500) return false;
  return IsFinalXrpcError(response.status, ParseXrpcError(response));
}

}  // namespace atfill::net
