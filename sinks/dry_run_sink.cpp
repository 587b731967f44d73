#include "sinks/dry_run_sink.hpp"

#include "sinks/event_checks.hpp"

namespace atfill::sinks {
namespace {

class DryRunSink final : public pipeline::Sink {
 public:
  Result<pipeline::WriteStats> Write(std::span<const pipeline::Event> batch) override {
    pipeline::WriteStats stats;
    for (size_t i = 0; i < batch.size(); ++i) {
      if (const auto* r = std::get_if<pipeline::RecordEvent>(&batch[i])) {
        ATFILL_RETURN_IF_ERROR(CheckRecordEvent(*r, i));
        if (r->operation == pipeline::Operation::kDelete) {
          ++stats.deleted;
        } else {
          ++stats.inserted;
        }
      } else {
        const auto& a = std::get<pipeline::AccountEvent>(batch[i]);
        ATFILL_RETURN_IF_ERROR(CheckAccountEvent(a, i));
        if (pipeline::StatusPurgesRecords(a.status)) ++stats.purged_accounts;
      }
    }
    return stats;
  }
  std::string_view name() const override { return "dry-run"; }
};

}  // namespace

Result<std::unique_ptr<pipeline::Sink>> NewDryRunSink() {
  return std::unique_ptr<pipeline::Sink>(std::make_unique<DryRunSink>());
}

}  // namespace atfill::sinks
