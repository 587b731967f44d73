// The standard stage order (pipeline/plan.hpp): the one place the verbs, benches and embedding
// programs take it from.
#include "pipeline/plan.hpp"

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

namespace atfill::pipeline {
namespace {

class Named : public Transform {
 public:
  explicit Named(std::string name) : name_(std::move(name)) {}
  std::string_view name() const override { return name_; }
  Status Process(TransformState*, EventChunk*) const override { return Status::OK(); }

 private:
  std::string name_;
};

std::vector<std::string> Names(const std::vector<const Transform*>& order) {
  std::vector<std::string> out;
  for (const Transform* t : order) out.emplace_back(t->name());
  return out;
}

TEST(PlanTest, EveryStageTakesItsSlotInTheStandardOrder) {
  const Named shard("shard"), verify("verify"), script("script"), check("check"), hold("hold"),
      guard("guard");
  // Filled in an order of its own: the slots, not the caller, decide the order.
  StandardStages stages;
  stages.ingest_guard = &guard;
  stages.live_hold = &hold;
  stages.cid_verify = &verify;
  stages.account_check = &check;
  stages.shard_filter = &shard;
  stages.script = &script;
  EXPECT_EQ(Names(stages.InOrder()),
            (std::vector<std::string>{"shard", "verify", "script", "check", "hold", "guard"}));
}

TEST(PlanTest, EmptySlotsAreLeftOut) {
  const Named verify("verify"), guard("guard");
  EXPECT_TRUE(StandardStages{}.InOrder().empty());
  EXPECT_EQ(Names(StandardStages{.cid_verify = &verify, .ingest_guard = &guard}.InOrder()),
            (std::vector<std::string>{"verify", "guard"}));
  EXPECT_EQ(Names(StandardStages{.ingest_guard = &guard}.InOrder()),
            (std::vector<std::string>{"guard"}));
}

}  // namespace
}  // namespace atfill::pipeline
