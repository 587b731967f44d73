// Checks that each created or updated record's body hashes to the CID its source stated: the body
// is re-encoded as DAG-CBOR and hashed. A mismatch or an invalid body is dropped and logged with
// the record's URI; it is never written. With a lexicon check, the record's lexicon verdict is
// reached on the same parse of its body (stages/lexicon_validate.hpp).
#pragma once

#include <optional>

#include "pipeline/transform.hpp"
#include "stages/lexicon_validate.hpp"

namespace atfill::stages {

// Stateless and thread-safe; runs on many chunks at once.
class CidVerify : public pipeline::Transform {
 public:
  CidVerify() = default;
  explicit CidVerify(LexiconCheck lexicons) : lexicons_(std::move(lexicons)) {}

  std::string_view name() const override { return "cid_verify"; }
  Status Process(pipeline::TransformState* state, pipeline::EventChunk* chunk) const override;

 private:
  std::optional<LexiconCheck> lexicons_;
};

}  // namespace atfill::stages
