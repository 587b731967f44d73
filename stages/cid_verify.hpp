// Checks that each created or updated record's body hashes to the CID its source stated: the body
// is re-encoded as DAG-CBOR and hashed. A mismatch or an invalid body is dropped and logged with
// the record's URI; it is never written.
#pragma once

#include "pipeline/transform.hpp"

namespace atfill::stages {

// Stateless and thread-safe; runs on many chunks at once.
class CidVerify : public pipeline::Transform {
 public:
  std::string_view name() const override { return "cid_verify"; }
  Status Process(pipeline::TransformState* state, pipeline::EventChunk* chunk) const override;
};

}  // namespace atfill::stages
