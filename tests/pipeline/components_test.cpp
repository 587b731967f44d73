// The component registry (pipeline/components.hpp) with fake components over a real RocksDB
// state: config readers and their errors, the order a plan is made in (source, sink, stages),
// what the source asks of the sink, unknown kinds and sources, the order pieces are released in,
// and a job planned by the registry and run by the job controller to its end.
#include "pipeline/components.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pipeline/process_state.hpp"
#include "tests/common/process.hpp"

namespace atfill::pipeline {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct FakeSettings {
  std::string greeting = "hello";
  int64_t records = 3;
};

// `records` records, then the end.
class FakeSource : public Source {
 public:
  FakeSource(int64_t records, std::vector<std::string>* log) : records_(records), log_(log) {}
  ~FakeSource() override { log_->push_back("~source"); }
  Status Seek(const std::string& cursor) override {
    next_ = cursor.empty() ? 0 : std::stoll(cursor);
    return Status::OK();
  }
  Result<bool> Read(EventChunk* chunk) override {
    if (next_ >= records_) return false;
    RecordEvent r;
    r.did = "did:plc:fake";
    r.collection = "app.bsky.feed.post";
    r.rkey = "r" + std::to_string(++next_);
    r.body = "{}";
    r.position = static_cast<uint64_t>(next_);
    chunk->events.push_back(std::move(r));
    chunk->units_read = 1;
    chunk->resume_cursor = std::to_string(next_);
    return true;
  }
  std::string Describe() const override { return "fake source"; }

 private:
  int64_t records_;
  std::vector<std::string>* log_;
  int64_t next_ = 0;
};

class FakeSink : public Sink {
 public:
  explicit FakeSink(std::vector<std::string>* log) : log_(log) {}
  ~FakeSink() override { log_->push_back("~sink"); }
  Result<WriteStats> Write(std::span<const Event> batch) override {
    WriteStats s;
    s.inserted = batch.size();
    return s;
  }
  std::string_view name() const override { return "fake"; }

 private:
  std::vector<std::string>* log_;
};

// Passes every chunk on; notes its release.
class FakeStage : public Transform {
 public:
  FakeStage(std::string name, std::vector<std::string>* log) : name_(std::move(name)), log_(log) {}
  ~FakeStage() override { log_->push_back("~" + name_); }
  std::string_view name() const override { return name_; }
  Status Process(TransformState*, EventChunk*) const override { return Status::OK(); }

 private:
  std::string name_;
  std::vector<std::string>* log_;
};

class ComponentsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    components_.AddConfigReader([](ConfigFile& file, Settings& settings) {
      FakeSettings& f = settings.Mutable<FakeSettings>();
      ATFILL_RETURN_IF_ERROR(file.ReadString("fake.greeting", &f.greeting));
      return file.ReadInt("fake.records", &f.records, 0, 1000);
    });
    components_.AddSource("fake", [this](const Environment& env, PlanDraft& draft) {
      log_.push_back("source");
      if (draft.Param("fail") == "source") return Status::Invalid("the source says no");
      draft.sink_hints.bulk_load = draft.Param("bulk") == "1";
      draft.plan->source = draft.Keep(
          std::make_unique<FakeSource>(env.settings->Get<FakeSettings>().records, &log_));
      draft.plan->cursor_name = "job/" + std::to_string(draft.job->id) + "/fake";
      return Status::OK();
    });
    components_.AddSinkKind(
        "fake",
        {.open = [this](const Settings&, const SinkHints& hints) -> Result<std::unique_ptr<Sink>> {
           log_.push_back(hints.bulk_load ? "sink bulk" : "sink");
           return std::unique_ptr<Sink>(std::make_unique<FakeSink>(&log_));
         },
         .location = [](const Settings&) { return "fake:here"; },
         .readers = {}});
    components_.SetSinkChooser([](const Settings&) { return "fake"; });
    components_.AddStage("first", [this](const Environment&, PlanDraft& draft) {
      log_.push_back("first");
      draft.plan->stages.cid_verify = draft.Keep(std::make_unique<FakeStage>("first", &log_));
      return Status::OK();
    });
    components_.AddStage("second", [this](const Environment&, PlanDraft& draft) {
      log_.push_back("second");
      if (draft.job->kind == "plain") return Status::OK();  // not in this kind's plan
      draft.plan->stages.ingest_guard = draft.Keep(std::make_unique<FakeStage>("second", &log_));
      return Status::OK();
    });
    components_.AddJobKind("fake", "fake");
    components_.AddJobKind("plain", "fake");
  }

  Environment EnvironmentOf(const Settings& settings) {
    Environment env;
    env.components = &components_;
    env.settings = &settings;
    return env;
  }

  Result<Settings> Parse(const std::string& text) {
    return components_.ParseConfig(text, (dir_.path() / "test.toml").string());
  }

  Components components_;
  std::vector<std::string> log_;
  testing::TempDir dir_;
};

TEST_F(ComponentsTest, ReadersFillTheirSettingsAndTheCoreReadsItsOwn) {
  auto settings = Parse("[fake]\ngreeting = \"hi\"\n[engine]\nbatch_records = 7\n");
  ASSERT_TRUE(settings.ok()) << settings.status().message();
  EXPECT_EQ(settings->Get<FakeSettings>().greeting, "hi");
  EXPECT_EQ(settings->Get<FakeSettings>().records, 3);  // its default
  EXPECT_EQ(settings->Get<CoreSettings>().engine.batch.max_events, 7u);
  EXPECT_EQ(Components::ControllerOptions(*settings).engine.batch.max_events, 7u);
}

TEST_F(ComponentsTest, AKeyNoReaderAsksForIsAnErrorNamingIt) {
  auto settings = Parse("[fake]\ngreting = \"hi\"\n");
  ASSERT_FALSE(settings.ok());
  EXPECT_THAT(settings.status().message(), HasSubstr("fake.greting"));
  // The caller's own reader counts as a reader.
  auto with_extra =
      components_.ParseConfig("[mine]\nkey = true\n", "test.toml", [](ConfigFile& file, Settings&) {
        bool v = false;
        return file.ReadBool("mine.key", &v);
      });
  EXPECT_TRUE(with_extra.ok()) << with_extra.status().message();
}

TEST_F(ComponentsTest, AReaderErrorNamesTheFileAndKey) {
  auto settings = Parse("[fake]\nrecords = 5000\n");
  ASSERT_FALSE(settings.ok());
  EXPECT_THAT(settings.status().message(), HasSubstr("test.toml"));
  EXPECT_THAT(settings.status().message(), HasSubstr("fake.records"));
}

TEST_F(ComponentsTest, APlanIsSourceThenSinkThenStagesAndReleasesTheSinkLast) {
  auto settings = Parse("");
  ASSERT_TRUE(settings.ok());
  const Environment env = EnvironmentOf(*settings);
  state::JobRecord job;
  job.id = 4;
  job.kind = "fake";
  job.params["bulk"] = "1";
  {
    auto plan = components_.Plan(env, job, {});
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    EXPECT_EQ(plan->cursor_name, "job/4/fake");
    ASSERT_NE(plan->source, nullptr);
    ASSERT_NE(plan->sink, nullptr);
    EXPECT_EQ(plan->stages.InOrder().size(), 2u);
    EXPECT_THAT(log_, ElementsAre("source", "sink bulk", "first", "second"));
    log_.clear();
  }
  // Last made first, but the sink after everything that may use it.
  EXPECT_THAT(log_, ElementsAre("~second", "~first", "~source", "~sink"));
  EXPECT_EQ(components_.SinkLocation(*settings), "fake:here");
}

TEST_F(ComponentsTest, AStageFactoryMayLeaveItsSlotEmpty) {
  auto settings = Parse("");
  ASSERT_TRUE(settings.ok());
  const Environment env = EnvironmentOf(*settings);
  state::JobRecord job;
  job.kind = "plain";
  auto plan = components_.Plan(env, job, {});
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->stages.InOrder().size(), 1u);
  EXPECT_EQ(plan->stages.ingest_guard, nullptr);
}

// A caller that brings its own source and sink (a bench, an embedding program) gets the stages
// Plan would make for the job's kind, and no source or sink is made.
TEST_F(ComponentsTest, PlanStagesMakesTheStagesAlonePerKindAsPlanDoes) {
  auto settings = Parse("");
  ASSERT_TRUE(settings.ok());
  const Environment env = EnvironmentOf(*settings);
  for (const std::string kind : {"fake", "plain"}) {
    state::JobRecord job;
    job.kind = kind;
    const JobContext ctx;
    auto planned = components_.Plan(env, job, ctx);
    ASSERT_TRUE(planned.ok()) << planned.status().message();
    log_.clear();
    JobPlan plan;
    PlanDraft draft;
    draft.job = &job;
    draft.ctx = &ctx;
    draft.plan = &plan;
    ASSERT_TRUE(components_.PlanStages(env, draft).ok());
    EXPECT_THAT(log_, ElementsAre("first", "second")) << kind;  // no source, no sink
    EXPECT_EQ(plan.source, nullptr);
    EXPECT_EQ(plan.sink, nullptr);
    std::vector<std::string> names, planned_names;
    for (const Transform* t : plan.stages.InOrder()) names.emplace_back(t->name());
    for (const Transform* t : planned->stages.InOrder()) planned_names.emplace_back(t->name());
    EXPECT_EQ(names, planned_names) << kind;
    EXPECT_EQ(names.size(), kind == "fake" ? 2u : 1u);
  }
}

TEST_F(ComponentsTest, UnknownKindsAndSourcesAndAFailingSourceOpenNoSink) {
  auto settings = Parse("");
  ASSERT_TRUE(settings.ok());
  const Environment env = EnvironmentOf(*settings);
  state::JobRecord job;
  job.id = 9;
  job.kind = "nobody";
  auto unknown = components_.Plan(env, job, {});
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kUnsupported);
  EXPECT_THAT(unknown.status().message(), HasSubstr("'nobody'"));

  job.kind = "fake";
  job.params["source"] = "elsewhere";  // a job's own source wins over its kind's
  auto no_source = components_.Plan(env, job, {});
  ASSERT_FALSE(no_source.ok());
  EXPECT_EQ(no_source.status().code(), StatusCode::kUnsupported);
  EXPECT_THAT(no_source.status().message(), HasSubstr("'elsewhere'"));

  job.params["source"] = "fake";
  job.params["fail"] = "source";
  auto failed = components_.Plan(env, job, {});
  ASSERT_FALSE(failed.ok());
  EXPECT_THAT(failed.status().message(), HasSubstr("the source says no"));
  EXPECT_THAT(log_, ElementsAre("source"));  // no sink was opened, no stage made
}

TEST_F(ComponentsTest, TheControllerRunsAJobTheRegistryPlans) {
  auto settings =
      Parse("[fake]\nrecords = 25\n[state]\ndir = \"" + (dir_.path() / "state").string() + "\"\n");
  ASSERT_TRUE(settings.ok()) << settings.status().message();
  auto st = OpenStateForWrite(*settings);
  ASSERT_TRUE(st.ok()) << st.status().message();
  JobController& controller = MakeController(*st, components_, *settings);
  EXPECT_EQ(&MakeController(*st, components_, *settings), &controller);  // made once
  state::JobRecord job;
  job.kind = "fake";
  auto created = st->jobs->Create(job);
  ASSERT_TRUE(created.ok());
  auto outcome = controller.Run(*created);
  ASSERT_TRUE(outcome.ok()) << outcome.status().message();
  EXPECT_EQ(outcome->job.status, state::JobStatus::kCompleted);
  EXPECT_EQ(outcome->job.counters.records_written, 25u);
  // A state directory belongs to the shard that first wrote it.
  st->controller.reset();
  *st = {};
  Settings other = *settings;
  other.Mutable<CoreSettings>().shard = *Shard::Parse("1/2");
  auto refused = OpenStateForWrite(other);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("belongs to shard"));
}

}  // namespace
}  // namespace atfill::pipeline
