#include "stages/lexicon_validate.hpp"

namespace atfill::stages {

Result<LexiconMode> ParseLexiconMode(std::string_view text) {
  if (text == "off") return LexiconMode::kOff;
  if (text == "log") return LexiconMode::kLog;
  if (text == "reject") return LexiconMode::kReject;
  return Status::Invalid("lexicon mode must be \"reject\", \"log\" or \"off\", not \"" +
                         std::string(text) + "\"");
}

std::string_view LexiconModeName(LexiconMode mode) {
  switch (mode) {
    case LexiconMode::kOff:
      return "off";
    case LexiconMode::kLog:
      return "log";
    case LexiconMode::kReject:
      return "reject";
  }
  return "?";
}

bool LexiconCheck::Apply(const pipeline::RecordEvent& record,
                         const atproto::LexiconVerdict& verdict, pipeline::EventChunk* chunk,
                         Tally* tally) const {
  switch (verdict.outcome) {
    case atproto::LexiconVerdict::Outcome::kValid:
      ++tally->valid;
      return true;
    case atproto::LexiconVerdict::Outcome::kUnknown:
      ++tally->unknown;
      return true;
    case atproto::LexiconVerdict::Outcome::kInvalid:
      break;
  }
  ++tally->invalid;
  if (mode_ == LexiconMode::kOff) return true;
  chunk->errors.push_back({"lexicon_invalid", record.Uri(),
                           "record does not match its lexicon: " + verdict.Describe() +
                               (mode_ == LexiconMode::kLog ? " (written: mode is log)" : "")});
  return mode_ != LexiconMode::kReject;
}

void LexiconCheck::Count(const Tally& tally, pipeline::EventChunk* chunk) {
  if (tally.valid > 0) chunk->counters.emplace_back("lexicon_valid", tally.valid);
  if (tally.invalid > 0) chunk->counters.emplace_back("lexicon_invalid", tally.invalid);
  if (tally.unknown > 0) chunk->counters.emplace_back("lexicon_unknown", tally.unknown);
}

Status LexiconValidate::Process(pipeline::TransformState* /*state*/,
                                pipeline::EventChunk* chunk) const {
  const auto catalog = check_.catalog();
  LexiconCheck::Tally tally;
  auto& events = chunk->events;
  size_t keep = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    auto* record = std::get_if<pipeline::RecordEvent>(&events[i]);
    bool ok = true;
    if (record != nullptr && record->operation != pipeline::Operation::kDelete) {
      ok = check_.Apply(*record,
                        catalog->ValidateJson(record->collection, record->rkey, record->body),
                        chunk, &tally);
    }
    if (ok) {
      if (keep != i) events[keep] = std::move(events[i]);
      ++keep;
    } else {
      ++chunk->dropped;
    }
  }
  events.resize(keep);
  LexiconCheck::Count(tally, chunk);
  return Status::OK();
}

}  // namespace atfill::stages
