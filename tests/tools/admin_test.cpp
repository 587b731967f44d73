// The admin HTTP server over loopback against an in-memory AdminBackend: every route's answer,
// the token rule on every route, request validation, status mapping, the event streams (no stage
// transition lost, end after a final status, Stop ends an open stream) and /metrics.
#include <gtest/gtest.h>
#include <httplib.h>
#include <simdjson.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/test_util.hpp"
#include "tools/atfill/admin/admin_server.hpp"
#include "tools/atfill/admin/metrics.hpp"

namespace atfill::admin {
namespace {

using state::JobStage;
using state::JobStatus;

constexpr const char* kToken = "s3cret-token_for.tests";

// --- A fake backend: jobs in memory, every answer under one mutex ---

class FakeBackend : public AdminBackend {
 public:
  struct Job {
    JobDetails details;
    std::vector<StageChange> changes;
    std::vector<state::BatchAudit> batches;
  };

  // Adds a job with the given status and stage; returns its id.
  uint64_t Add(JobStatus status, JobStage stage, std::string kind = "backfill") {
    std::lock_guard<std::mutex> lock(mu_);
    return AddLocked(status, stage, std::move(kind));
  }

  // Moves job `id` through `stages` and then to `status`, all in one critical section, so a
  // reader polling at any interval sees every step at once.
  void Move(uint64_t id, const std::vector<JobStage>& stages, std::optional<JobStatus> status) {
    std::lock_guard<std::mutex> lock(mu_);
    Job& j = jobs_.at(id);
    for (JobStage s : stages) {
      j.changes.push_back({j.changes.size(), j.details.job.stage, s, 1'700'000'000'000'000});
      j.details.job.stage = s;
    }
    if (status) j.details.job.status = *status;
  }

  void SetRecordsWritten(uint64_t id, uint64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.at(id).details.job.counters.records_written = n;
  }

  void SetHosts(uint64_t id, std::vector<state::HostSummary> hosts) {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.at(id).details.hosts = std::move(hosts);
  }

  void SetDetails(uint64_t id, const std::function<void(JobDetails&)>& edit) {
    std::lock_guard<std::mutex> lock(mu_);
    edit(jobs_.at(id).details);
  }

  void SetLive(LiveStatus live) {
    std::lock_guard<std::mutex> lock(mu_);
    live_ = std::move(live);
  }

  // Makes ListJobs fail with `s` (OK: answer normally).
  void FailList(Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_list_ = std::move(s);
  }

  int calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  std::vector<BackfillRequest> started() {
    std::lock_guard<std::mutex> lock(mu_);
    return started_;
  }
  std::vector<uint64_t> cleared() {
    std::lock_guard<std::mutex> lock(mu_);
    return cleared_;
  }

  // AdminBackend
  Result<std::vector<JobSummary>> ListJobs() override {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_;
    if (!fail_list_.ok()) return fail_list_;
    std::vector<JobSummary> out;
    for (auto it = jobs_.rbegin(); it != jobs_.rend(); ++it) {
      out.push_back({it->second.details.job, it->second.details.queued_units});
    }
    return out;
  }

  Result<JobDetails> GetJob(uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_;
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return Status::NotFound("no job " + std::to_string(id));
    return it->second.details;
  }

  Result<std::vector<StageChange>> StageChanges(uint64_t id, uint64_t since) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_;
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return Status::NotFound("no job " + std::to_string(id));
    std::vector<StageChange> out;
    for (const auto& c : it->second.changes) {
      if (c.index >= since) out.push_back(c);
    }
    return out;
  }

  Result<uint64_t> StartBackfill(const BackfillRequest& request) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_;
    if (request.source == "replay" && !request.dids.empty()) {
      return Status::Invalid("a replay cannot backfill given accounts");
    }
    started_.push_back(request);
    return AddLocked(JobStatus::kRunning, JobStage::kPending, "backfill");
  }

  Result<state::JobRecord> Pause(uint64_t id) override {
    return Steer(id, {JobStatus::kRunning}, JobStatus::kPausing, "pause");
  }
  Result<state::JobRecord> Resume(uint64_t id) override {
    return Steer(id, {JobStatus::kPaused, JobStatus::kFailed}, JobStatus::kRunning, "resume");
  }
  Result<state::JobRecord> Cancel(uint64_t id) override {
    return Steer(id, {JobStatus::kRunning, JobStatus::kPaused, JobStatus::kFailed},
                 JobStatus::kCancelling, "cancel");
  }

  Result<uint64_t> RetryFailed(uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_;
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return Status::NotFound("no job " + std::to_string(id));
    if (!state::IsTerminal(it->second.details.job.status)) {
      return Status::Unsupported("job " + std::to_string(id) + " has not finished");
    }
    return AddLocked(JobStatus::kRunning, JobStage::kRetryingBlocks, "backfill");
  }

  Status ClearDetails(uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_;
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return Status::NotFound("no job " + std::to_string(id));
    if (!state::IsTerminal(it->second.details.job.status)) {
      return Status::Unsupported("job " + std::to_string(id) + " has not finished");
    }
    it->second.details.hosts.clear();
    it->second.details.recent.clear();
    cleared_.push_back(id);
    return Status::OK();
  }

  Result<uint64_t> ClearAllDetails() override {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_;
    uint64_t n = 0;
    for (auto& [id, j] : jobs_) {
      if (!state::IsTerminal(j.details.job.status)) continue;
      j.details.hosts.clear();
      j.details.recent.clear();
      cleared_.push_back(id);
      ++n;
    }
    return n;
  }

  Result<LiveStatus> Live() override {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_;
    return live_;
  }

  Result<std::vector<state::BatchAudit>> Batches(uint64_t id, uint64_t from,
                                                 size_t limit) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_;
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return Status::NotFound("no job " + std::to_string(id));
    std::vector<state::BatchAudit> out;
    for (const auto& b : it->second.batches) {
      if (b.batch_no >= from && out.size() < limit) out.push_back(b);
    }
    return out;
  }

  Result<std::vector<LiveSample>> LiveHistory(int64_t* interval_ms) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_;
    *interval_ms = 1000;
    return history_;
  }

  void SetBatches(uint64_t id, std::vector<state::BatchAudit> batches) {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.at(id).batches = std::move(batches);
  }

  void SetLiveHistory(std::vector<LiveSample> history) {
    std::lock_guard<std::mutex> lock(mu_);
    history_ = std::move(history);
  }

 private:
  uint64_t AddLocked(JobStatus status, JobStage stage, std::string kind) {
    const uint64_t id = next_id_++;
    Job j;
    j.details.job.id = id;
    j.details.job.kind = std::move(kind);
    j.details.job.status = status;
    j.details.job.stage = stage;
    j.details.job.started_by = "api";
    j.details.job.created_us = j.details.job.started_us = 1'700'000'000'000'000;
    j.details.job.params["collections"] = "app.bsky.feed.post";
    j.details.queued_units = 10 * id;
    jobs_[id] = std::move(j);
    return id;
  }

  Result<state::JobRecord> Steer(uint64_t id, std::vector<JobStatus> from, JobStatus to,
                                 const char* what) {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_;
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return Status::NotFound("no job " + std::to_string(id));
    auto& job = it->second.details.job;
    bool allowed = false;
    for (JobStatus s : from) allowed = allowed || job.status == s;
    if (!allowed) {
      return Status::Unsupported("cannot " + std::string(what) + " a " +
                                 std::string(state::JobStatusName(job.status)) + " job");
    }
    job.status = to;
    return job;
  }

  std::mutex mu_;
  std::map<uint64_t, Job> jobs_;
  uint64_t next_id_ = 1;
  LiveStatus live_;
  std::vector<LiveSample> history_;
  Status fail_list_;
  int calls_ = 0;
  std::vector<BackfillRequest> started_;
  std::vector<uint64_t> cleared_;
};

// --- Helpers ---

struct Answer {
  int status = 0;  // 0 = no answer
  std::string body;
  httplib::Headers headers;
  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
};

// A parsed JSON document that keeps its own buffer.
struct Json {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  bool ok = false;
  explicit Json(const std::string& text) {
    ok = parser.parse(simdjson::padded_string(text)).get(root) == simdjson::SUCCESS;
  }
  simdjson::dom::element operator[](std::string_view key) const { return root[key].value(); }
  bool Has(std::string_view key) const { return !root[key].error(); }
  uint64_t Uint(std::string_view key) const { return root[key].get_uint64().value(); }
  std::string Str(std::string_view key) const {
    return std::string(root[key].get_string().value());
  }
};

class AdminServerTest : public ::testing::Test {
 protected:
  void SetUp() override { options_.token = kToken; }
  void TearDown() override { server_.Stop(); }

  void StartServer() {
    Status s = server_.Start(options_, &backend_, &metrics_);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_NE(server_.port(), 0);
  }

  Answer Call(const std::string& method, const std::string& path, const std::string& body = "",
              std::optional<std::string> authorization = std::string("Bearer ") + kToken) {
    httplib::Client cli("127.0.0.1", server_.port());
    cli.set_read_timeout(10, 0);
    httplib::Request req;
    req.method = method;
    req.path = path;
    if (authorization) req.headers.emplace("Authorization", *authorization);
    if (!body.empty()) {
      req.body = body;
      req.headers.emplace("Content-Type", "application/json");
    }
    auto res = cli.send(req);
    Answer a;
    if (res) {
      a.status = res->status;
      a.body = res->body;
      a.headers = res->headers;
    }
    return a;
  }

  // The "error" sentence of an error answer, which must be JSON.
  static std::string ErrorOf(const Answer& a) {
    Json j(a.body);
    EXPECT_TRUE(j.ok) << a.body;
    if (!j.ok) return "";
    std::string_view e;
    EXPECT_EQ(j.root["error"].get_string().get(e), simdjson::SUCCESS) << a.body;
    return std::string(e);
  }

  AdminServerOptions options_;
  FakeBackend backend_;
  Metrics metrics_;
  AdminServer server_;
};

// Every protected route, with an existing job (1) in its path.
struct RouteCase {
  const char* method;
  const char* path;
};
const RouteCase kProtected[] = {
    {"GET", "/admin/backfill"},
    {"POST", "/admin/backfill"},
    {"DELETE", "/admin/backfill/details"},
    {"GET", "/admin/backfill/1"},
    {"POST", "/admin/backfill/1/pause"},
    {"POST", "/admin/backfill/1/resume"},
    {"POST", "/admin/backfill/1/cancel"},
    {"POST", "/admin/backfill/1/retry-failed"},
    {"DELETE", "/admin/backfill/1/details"},
    {"GET", "/admin/backfill/1/events"},
    {"GET", "/admin/backfill/1/batches"},
    {"GET", "/admin/jetstream/status"},
    {"GET", "/admin/jetstream/history"},
    {"GET", "/admin/collections"},
    {"POST", "/admin/collections"},
    {"GET", "/metrics"},
    // Unknown paths under /admin are refused before anything else is said about them.
    {"GET", "/admin/nope"},
    {"PUT", "/admin/backfill"},
};

// --- Options and start ---

TEST(AdminServerOptionsTest, EmptyTokenIsAConfigError) {
  AdminServerOptions o;
  Status s = o.Validate();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalid);
  EXPECT_NE(s.message().find("token"), std::string::npos) << s.message();
  o.token = "has space";
  EXPECT_FALSE(o.Validate().ok());
  o.token = "fine";
  EXPECT_TRUE(o.Validate().ok());
  o.max_event_streams = o.threads;
  EXPECT_FALSE(o.Validate().ok());
}

TEST(AdminServerStartTest, RefusesToStartWithoutToken) {
  FakeBackend backend;
  Metrics metrics;
  AdminServer server;
  AdminServerOptions o;
  Status s = server.Start(o, &backend, &metrics);
  EXPECT_EQ(s.code(), StatusCode::kInvalid) << s.ToString();
  EXPECT_EQ(server.port(), 0);
}

TEST(AdminServerStartTest, BindErrorNamesTheAddress) {
  FakeBackend backend;
  Metrics metrics;
  AdminServer first;
  AdminServerOptions o;
  o.token = kToken;
  ASSERT_TRUE(first.Start(o, &backend, &metrics).ok());
  AdminServer second;
  o.port = first.port();
  Status s = second.Start(o, &backend, &metrics);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("127.0.0.1:" + std::to_string(first.port())), std::string::npos)
      << s.message();
  // Stop on a server that never started is harmless; the first still answers.
  second.Stop();
  httplib::Client cli("127.0.0.1", first.port());
  auto res = cli.Get("/");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  first.Stop();
  first.Stop();
}

// --- The token rule ---

TEST_F(AdminServerTest, EveryApiRouteNeedsTheToken) {
  StartServer();
  backend_.Add(JobStatus::kRunning, JobStage::kDiscovering);
  const int calls_before = backend_.calls();
  const std::vector<std::optional<std::string>> refused = {
      std::nullopt,
      std::string("Bearer wrong"),
      std::string("Bearer ") + std::string(kToken).substr(0, 5),  // a prefix
      std::string("Bearer ") + kToken + "x",                      // an extension
      std::string("Basic ") + kToken,
      std::string(kToken),
      std::string("Bearer"),
  };
  for (const RouteCase& r : kProtected) {
    for (const auto& auth : refused) {
      SCOPED_TRACE(std::string(r.method) + " " + r.path + " with " + auth.value_or("(none)"));
      Answer a = Call(r.method, r.path, R"({"collections":["app.bsky.feed.post"]})", auth);
      EXPECT_EQ(a.status, 401);
      EXPECT_TRUE(a.header("WWW-Authenticate").starts_with("Bearer"))
          << a.header("WWW-Authenticate");
      EXPECT_EQ(a.header("Content-Type"), "application/json");
      EXPECT_NE(ErrorOf(a).find("token"), std::string::npos);
    }
  }
  // Nothing reached the backend.
  EXPECT_EQ(backend_.calls(), calls_before);
  EXPECT_TRUE(backend_.started().empty());
  // The scheme is case-insensitive; the right token passes.
  EXPECT_EQ(Call("GET", "/admin/backfill", "", std::string("bearer ") + kToken).status, 200);
  EXPECT_EQ(Call("GET", "/admin/backfill").status, 200);
}

TEST_F(AdminServerTest, DashboardFilesNeedNoToken) {
  StartServer();
  const std::map<std::string, std::string> types = {{"/", "text/html; charset=utf-8"},
                                                    {"/app.js", "text/javascript; charset=utf-8"},
                                                    {"/style.css", "text/css; charset=utf-8"}};
  ASSERT_EQ(DashboardFiles().size(), types.size());
  for (const EmbeddedFile& f : DashboardFiles()) {
    SCOPED_TRACE(std::string(f.path));
    Answer a = Call("GET", std::string(f.path), "", std::nullopt);
    EXPECT_EQ(a.status, 200);
    EXPECT_EQ(a.header("Content-Type"), types.at(std::string(f.path)));
    EXPECT_NE(a.header("Content-Security-Policy").find("default-src 'none'"), std::string::npos);
    EXPECT_EQ(a.body, f.bytes);
    EXPECT_GT(a.body.size(), 500u);
  }
  // The page carries the hooks the browser tests drive.
  const std::string page = Call("GET", "/", "", std::nullopt).body;
  for (const char* id : {"token-input", "start-backfill", "jobs-table", "live-panel"}) {
    EXPECT_NE(page.find(std::string("data-testid=\"") + id + "\""), std::string::npos) << id;
  }
  const std::string js = Call("GET", "/app.js", "", std::nullopt).body;
  for (const char* id :
       {"'job-row-'", "'job-status-'", "'job-records-'", "sessionStorage", "getReader"}) {
    EXPECT_NE(js.find(id), std::string::npos) << id;
  }
  // Not a file: 404, still without a token.
  EXPECT_EQ(Call("GET", "/nope.js", "", std::nullopt).status, 404);
}

// --- Routes ---

TEST_F(AdminServerTest, StartBackfillAcceptsAValidBody) {
  StartServer();
  Answer a =
      Call("POST", "/admin/backfill",
           R"({"collections":["app.bsky.feed.post","app.bsky.graph.follow"],)"
           R"("dids":["did:plc:abcdefghijklmnopqrstuvwx"],"source":"crawl","mode":"getRepo"})");
  ASSERT_EQ(a.status, 202) << a.body;
  Json j(a.body);
  ASSERT_TRUE(j.ok);
  EXPECT_EQ(j.Uint("id"), 1u);
  auto started = backend_.started();
  ASSERT_EQ(started.size(), 1u);
  EXPECT_EQ(started[0].collections,
            (std::vector<std::string>{"app.bsky.feed.post", "app.bsky.graph.follow"}));
  EXPECT_EQ(started[0].dids, (std::vector<std::string>{"did:plc:abcdefghijklmnopqrstuvwx"}));
  EXPECT_EQ(started[0].source, "crawl");
  EXPECT_EQ(started[0].mode, "getRepo");
  // Only collections; the rest stays empty (the config's defaults).
  a = Call("POST", "/admin/backfill", R"({"collections":["app.bsky.feed.like"]})");
  ASSERT_EQ(a.status, 202) << a.body;
  EXPECT_EQ(Json(a.body).Uint("id"), 2u);
  started = backend_.started();
  ASSERT_EQ(started.size(), 2u);
  EXPECT_TRUE(started[1].dids.empty());
  EXPECT_EQ(started[1].source, "");
  EXPECT_EQ(started[1].mode, "");
}

TEST_F(AdminServerTest, MalformedBackfillBodiesAre400WithTheReason) {
  StartServer();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "not JSON"},
      {"{", "not JSON"},
      {"[1,2]", "JSON object"},
      {"{}", "at least one"},
      {R"({"collections":[],"dids":[]})", "at least one"},
      {R"({"collections":"app.bsky.feed.post"})", "'collections' must be an array"},
      {R"({"collections":[1]})", "'collections[0]' must be a string"},
      {R"({"collections":["app.bsky.feed.post","not an nsid"]})", "collections[1]"},
      {R"({"dids":["did:plc:ok123","nope"]})", "dids[1]"},
      {R"({"collections":["app.bsky.feed.post"],"source":5})", "'source' must be a string"},
      {R"({"collections":["app.bsky.feed.post"],"source":"s3"})", "'source' is 's3'"},
      {R"({"collections":["app.bsky.feed.post"],"mode":"all"})", "'mode' is 'all'"},
      {R"({"collections":["app.bsky.feed.post"],"relay":"x"})", "unknown field 'relay'"},
      {R"({"collections":["app.bsky.feed.post"],"collections":["a.b.c"]})", "appears twice"},
      // The backend's own refusal (Invalid) maps to 400 as well.
      {R"({"dids":["did:plc:ok123"],"source":"replay"})", "cannot backfill given accounts"},
  };
  for (const auto& [body, reason] : cases) {
    SCOPED_TRACE(body);
    Answer a = Call("POST", "/admin/backfill", body);
    EXPECT_EQ(a.status, 400);
    EXPECT_NE(ErrorOf(a).find(reason), std::string::npos) << a.body;
  }
  EXPECT_TRUE(backend_.started().empty());
}

// POST /admin/collections: bodies checked before the backend hears of them; a process without a
// live consumer answers 409 (its refusal, Unsupported).
TEST_F(AdminServerTest, CollectionChangesAreCheckedAndNeedALiveConsumer) {
  StartServer();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{", "not JSON"},
      {"{}", "at least one of 'add' or 'remove'"},
      {R"({"add":["not an nsid"]})", "add[0]"},
      {R"({"remove":"app.bsky.feed.post"})", "'remove' must be an array"},
      {R"({"add":["app.bsky.feed.post"],"backfill":"yes"})", "'backfill' must be true or false"},
      {R"({"add":["app.bsky.feed.post"],"purge":1})", "'purge' must be true or false"},
      {R"({"add":["app.bsky.feed.post"],"drop":true})", "unknown field 'drop'"},
  };
  for (const auto& [body, reason] : cases) {
    SCOPED_TRACE(body);
    Answer a = Call("POST", "/admin/collections", body);
    EXPECT_EQ(a.status, 400);
    EXPECT_NE(ErrorOf(a).find(reason), std::string::npos) << a.body;
  }
  Answer none = Call("POST", "/admin/collections", R"({"add":["app.bsky.feed.like"]})");
  EXPECT_EQ(none.status, 409) << none.body;
  EXPECT_NE(ErrorOf(none).find("no live consumer"), std::string::npos) << none.body;
  EXPECT_EQ(Call("GET", "/admin/collections").status, 409);
}

TEST_F(AdminServerTest, ListsJobsNewestFirstWithTheCliFields) {
  StartServer();
  backend_.Add(JobStatus::kCompleted, JobStage::kCompleted);
  backend_.Add(JobStatus::kRunning, JobStage::kResolvingAndFetching);
  backend_.SetRecordsWritten(2, 1234);
  Answer a = Call("GET", "/admin/backfill");
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(a.header("Content-Type"), "application/json");
  Json j(a.body);
  ASSERT_TRUE(j.ok) << a.body;
  simdjson::dom::array jobs = j["jobs"].get_array().value();
  ASSERT_EQ(jobs.size(), 2u);
  simdjson::dom::element first = jobs.at(0).value();
  EXPECT_EQ(first["id"].get_uint64().value(), 2u);
  EXPECT_EQ(first["status"].get_string().value(), "running");
  EXPECT_EQ(first["stage"].get_string().value(), "resolving_and_fetching");
  EXPECT_EQ(first["counters"]["records_written"].get_uint64().value(), 1234u);
  EXPECT_EQ(first["queued_units"].get_uint64().value(), 20u);
  for (const char* key : {"kind", "started_by", "created_at", "started_at", "updated_at",
                          "finished_at", "heartbeat_at", "progress", "stop_reason", "params"}) {
    EXPECT_FALSE(first[key].error()) << key;
  }
  EXPECT_EQ(jobs.at(1)["id"].get_uint64().value(), 1u);
  EXPECT_EQ(jobs.at(1)["progress"]["percent"].get_double().value(), 100.0);
}

TEST_F(AdminServerTest, GetsOneJobWithHostsRecentAndFailedBlocks) {
  StartServer();
  const uint64_t id = backend_.Add(JobStatus::kRunning, JobStage::kPending);
  backend_.Move(id, {JobStage::kDiscovering}, std::nullopt);
  backend_.SetDetails(id, [](JobDetails& d) {
    d.hosts = {{"https://a.example", 3, 2, 1, 40}, {"https://b.example", 1, 1, 0, 7}};
    d.recent = {{9, "did:plc:aaa", "https://a.example", "3k2", 12, "ok", 1'700'000'000'000'000}};
    d.failed_blocks = 4;
    d.errors_by_kind = {{"fetch", 2}};
  });
  Answer a = Call("GET", "/admin/backfill/" + std::to_string(id));
  ASSERT_EQ(a.status, 200) << a.body;
  Json j(a.body);
  ASSERT_TRUE(j.ok);
  EXPECT_EQ(j.Uint("id"), id);
  EXPECT_EQ(j.Str("stage"), "discovering");
  simdjson::dom::array hosts = j["hosts"].get_array().value();
  ASSERT_EQ(hosts.size(), 2u);
  EXPECT_EQ(hosts.at(0)["host"].get_string().value(), "https://a.example");
  EXPECT_EQ(hosts.at(0)["records"].get_uint64().value(), 40u);
  EXPECT_EQ(hosts.at(1)["done"].get_uint64().value(), 1u);
  simdjson::dom::array recent = j["recent"].get_array().value();
  ASSERT_EQ(recent.size(), 1u);
  EXPECT_EQ(recent.at(0)["did"].get_string().value(), "did:plc:aaa");
  EXPECT_EQ(recent.at(0)["fetched_at"].get_string().value(), "2023-11-14T22:13:20Z");
  EXPECT_EQ(j.Uint("failed_blocks"), 4u);
  EXPECT_EQ(j["errors_by_kind"]["fetch"].get_uint64().value(), 2u);
  simdjson::dom::array changes = j["stage_changes"].get_array().value();
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes.at(0)["from"].get_string().value(), "pending");
  EXPECT_EQ(changes.at(0)["to"].get_string().value(), "discovering");
}

// List-valued parameters (stored one item a line) are JSON arrays; the others stay strings.
TEST_F(AdminServerTest, ListParamsAreArrays) {
  StartServer();
  const uint64_t id = backend_.Add(JobStatus::kRunning, JobStage::kDiscovering);
  backend_.SetDetails(id, [](JobDetails& d) {
    d.job.params["collections"] = "app.bsky.feed.post\napp.bsky.feed.like";
    d.job.params["dids"] = "";
    d.job.params["blocks"] = "seg-1/0";
    d.job.params["mode"] = "listRecords";
  });
  for (const std::string& path :
       std::vector<std::string>{"/admin/backfill/" + std::to_string(id), "/admin/backfill"}) {
    SCOPED_TRACE(path);
    Answer a = Call("GET", path);
    ASSERT_EQ(a.status, 200) << a.body;
    Json j(a.body);
    ASSERT_TRUE(j.ok) << a.body;
    simdjson::dom::element job = j.Has("jobs") ? j["jobs"].at(0).value() : j.root;
    simdjson::dom::element params = job["params"].value();
    simdjson::dom::array collections;
    ASSERT_EQ(params["collections"].get_array().get(collections), simdjson::SUCCESS) << a.body;
    ASSERT_EQ(collections.size(), 2u);
    EXPECT_EQ(collections.at(0).get_string().value(), "app.bsky.feed.post");
    EXPECT_EQ(collections.at(1).get_string().value(), "app.bsky.feed.like");
    EXPECT_EQ(params["dids"].get_array().value().size(), 0u) << a.body;
    EXPECT_EQ(params["blocks"].get_array().value().size(), 1u) << a.body;
    EXPECT_EQ(params["mode"].get_string().value(), "listRecords");
  }
}

// The per-batch audit trail, paged by batch number.
TEST_F(AdminServerTest, BatchesArePagedByBatchNumber) {
  StartServer();
  const uint64_t id = backend_.Add(JobStatus::kRunning, JobStage::kResolvingAndFetching);
  std::vector<state::BatchAudit> batches;
  for (uint64_t n = 1; n <= 5; ++n) {
    state::BatchAudit b;
    b.batch_no = n;
    b.first_position = "crawl";
    b.last_position = "crawl";
    b.count = 100 * n;
    b.failures = n == 3 ? 1 : 0;
    b.duration_us = 2000;
    b.attempts = 1;
    b.committed_at_us = 1'700'000'000'000'000 + static_cast<int64_t>(n) * 1'000'000;
    batches.push_back(b);
  }
  backend_.SetBatches(id, batches);
  const std::string base = "/admin/backfill/" + std::to_string(id) + "/batches";
  Answer all = Call("GET", base);
  ASSERT_EQ(all.status, 200) << all.body;
  Json j(all.body);
  ASSERT_TRUE(j.ok) << all.body;
  simdjson::dom::array list = j["batches"].get_array().value();
  ASSERT_EQ(list.size(), 5u);
  EXPECT_EQ(list.at(0)["batch"].get_uint64().value(), 1u);
  EXPECT_EQ(list.at(0)["count"].get_uint64().value(), 100u);
  EXPECT_EQ(list.at(2)["failures"].get_uint64().value(), 1u);
  EXPECT_EQ(list.at(4)["committed_us"].get_int64().value(), 1'700'000'005'000'000);
  EXPECT_EQ(list.at(4)["committed_at"].get_string().value(), "2023-11-14T22:13:25Z");
  EXPECT_EQ(j.Uint("next"), 6u);

  Answer page = Call("GET", base + "?from=2&limit=2");
  ASSERT_EQ(page.status, 200) << page.body;
  Json p(page.body);
  ASSERT_TRUE(p.ok);
  simdjson::dom::array two = p["batches"].get_array().value();
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two.at(0)["batch"].get_uint64().value(), 2u);
  EXPECT_EQ(p.Uint("next"), 4u);
  Answer past = Call("GET", base + "?from=9");
  ASSERT_EQ(past.status, 200);
  EXPECT_EQ(Json(past.body).Uint("next"), 9u);

  for (const char* bad : {"?from=x", "?limit=0", "?limit=10001", "?from=-1"}) {
    EXPECT_EQ(Call("GET", base + bad).status, 400) << bad;
  }
  EXPECT_EQ(Call("GET", "/admin/backfill/99/batches").status, 404);
}

TEST_F(AdminServerTest, LiveHistoryServesTheSamples) {
  StartServer();
  backend_.SetLiveHistory({{1'700'000'000'000'000, 2.5, 10}, {1'700'000'001'000'000, -1, 11}});
  Answer a = Call("GET", "/admin/jetstream/history");
  ASSERT_EQ(a.status, 200) << a.body;
  Json j(a.body);
  ASSERT_TRUE(j.ok) << a.body;
  EXPECT_EQ(j.Uint("interval_ms"), 1000u);
  simdjson::dom::array samples = j["samples"].get_array().value();
  ASSERT_EQ(samples.size(), 2u);
  EXPECT_EQ(samples.at(0)["at_us"].get_int64().value(), 1'700'000'000'000'000);
  EXPECT_EQ(samples.at(0)["lag_s"].get_double().value(), 2.5);
  EXPECT_TRUE(samples.at(1)["lag_s"].is_null());
  EXPECT_EQ(samples.at(1)["cursor"].get_uint64().value(), 11u);
}

TEST_F(AdminServerTest, UnknownAndNonNumericJobIdsAre404) {
  StartServer();
  backend_.Add(JobStatus::kRunning, JobStage::kPending);
  const std::string long_id(70, '7');
  for (const std::string& id :
       std::vector<std::string>{"999", "abc", "0", "-1", "1x", "18446744073709551616", long_id}) {
    for (const auto& [method, suffix] :
         std::vector<std::pair<std::string, std::string>>{{"GET", ""},
                                                          {"POST", "/pause"},
                                                          {"POST", "/resume"},
                                                          {"POST", "/cancel"},
                                                          {"POST", "/retry-failed"},
                                                          {"DELETE", "/details"},
                                                          {"GET", "/events"}}) {
      const std::string path = "/admin/backfill/" + id + suffix;
      SCOPED_TRACE(method + " " + path);
      Answer a = Call(method, path);
      EXPECT_EQ(a.status, 404);
      EXPECT_FALSE(ErrorOf(a).empty());
    }
  }
  Answer a = Call("GET", "/admin/nope");
  EXPECT_EQ(a.status, 404);
  EXPECT_NE(ErrorOf(a).find("no route"), std::string::npos);
}

TEST_F(AdminServerTest, PauseResumeCancelAnswer202OrMap409) {
  StartServer();
  const uint64_t running = backend_.Add(JobStatus::kRunning, JobStage::kDiscovering);
  const uint64_t done = backend_.Add(JobStatus::kCompleted, JobStage::kCompleted);
  const uint64_t paused = backend_.Add(JobStatus::kPaused, JobStage::kResolvingAndFetching);

  Answer a = Call("POST", "/admin/backfill/" + std::to_string(running) + "/pause");
  ASSERT_EQ(a.status, 202) << a.body;
  EXPECT_EQ(Json(a.body).Str("status"), "pausing");
  EXPECT_EQ(Json(a.body).Uint("id"), running);

  a = Call("POST", "/admin/backfill/" + std::to_string(paused) + "/resume");
  ASSERT_EQ(a.status, 202) << a.body;
  EXPECT_EQ(Json(a.body).Str("status"), "running");

  a = Call("POST", "/admin/backfill/" + std::to_string(paused) + "/cancel");
  ASSERT_EQ(a.status, 202) << a.body;
  EXPECT_EQ(Json(a.body).Str("status"), "cancelling");

  for (const char* action : {"pause", "resume", "cancel"}) {
    SCOPED_TRACE(action);
    a = Call("POST", "/admin/backfill/" + std::to_string(done) + "/" + action);
    EXPECT_EQ(a.status, 409);
    EXPECT_NE(ErrorOf(a).find("completed"), std::string::npos) << a.body;
  }
}

TEST_F(AdminServerTest, RetryFailedAndClearDetails) {
  StartServer();
  const uint64_t failed = backend_.Add(JobStatus::kFailed, JobStage::kFailed);
  const uint64_t running = backend_.Add(JobStatus::kRunning, JobStage::kDiscovering);
  const uint64_t done = backend_.Add(JobStatus::kCompleted, JobStage::kCompleted);

  Answer a = Call("POST", "/admin/backfill/" + std::to_string(failed) + "/retry-failed");
  ASSERT_EQ(a.status, 202) << a.body;
  EXPECT_EQ(Json(a.body).Uint("id"), 4u);
  EXPECT_EQ(Json(a.body).Uint("retry_of"), failed);
  a = Call("POST", "/admin/backfill/" + std::to_string(running) + "/retry-failed");
  EXPECT_EQ(a.status, 409) << a.body;

  a = Call("DELETE", "/admin/backfill/" + std::to_string(running) + "/details");
  EXPECT_EQ(a.status, 409) << a.body;
  EXPECT_TRUE(backend_.cleared().empty());
  a = Call("DELETE", "/admin/backfill/" + std::to_string(done) + "/details");
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(Json(a.body).Uint("id"), done);
  EXPECT_EQ(backend_.cleared(), (std::vector<uint64_t>{done}));

  a = Call("DELETE", "/admin/backfill/details");
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(Json(a.body).Uint("cleared"), 2u);  // the failed and the completed job
}

TEST_F(AdminServerTest, LiveStatus) {
  StartServer();
  Answer a = Call("GET", "/admin/jetstream/status");
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(a.body, R"({"configured":false})");
  LiveStatus live;
  live.configured = true;
  live.status = "streaming";
  live.host = "wss://jetstream.example";
  live.protocol = "v2";
  live.cursor = 123456;
  live.witnessed_us = 1'700'000'000'000'000;
  live.lag_s = 1.5;
  live.events_per_s = 250;
  live.job_id = 7;
  backend_.SetLive(live);
  a = Call("GET", "/admin/jetstream/status");
  ASSERT_EQ(a.status, 200) << a.body;
  Json j(a.body);
  ASSERT_TRUE(j.ok);
  EXPECT_TRUE(j["configured"].get_bool().value());
  EXPECT_EQ(j.Str("status"), "streaming");
  EXPECT_EQ(j.Str("host"), "wss://jetstream.example");
  EXPECT_EQ(j.Str("protocol"), "v2");
  EXPECT_EQ(j.Uint("cursor"), 123456u);
  EXPECT_EQ(j.Str("witnessed_at"), "2023-11-14T22:13:20Z");
  EXPECT_EQ(j["lag_s"].get_double().value(), 1.5);
  EXPECT_EQ(j["events_per_s"].get_double().value(), 250.0);
  EXPECT_EQ(j.Uint("job_id"), 7u);
  EXPECT_TRUE(j["error"].is_null());
}

// The label subscriptions ride in the live answer, whether or not a live consumer runs.
TEST_F(AdminServerTest, LiveStatusCarriesTheLabelSubscriptions) {
  StartServer();
  LiveStatus live;
  live.labels.configured = true;
  live.labels.job_id = 4;
  live.labels.status = "running";
  live.labels.labelers = {{"did:plc:labeler", 2001}};
  live.labels.labels_per_s = 12.5;
  live.labels.frames = 2001;
  live.labels.labels = 1990;
  live.labels.stored = 1800;
  live.labels.negated = 150;
  live.labels.stale = 40;
  live.labels.refused = 11;
  live.labels.refused_by = {{"bad_signature", 6}, {"bad_version", 5}};
  live.labels.connection_errors = 3;
  backend_.SetLive(live);
  Answer a = Call("GET", "/admin/jetstream/status");
  ASSERT_EQ(a.status, 200) << a.body;
  Json j(a.body);
  ASSERT_TRUE(j.ok);
  EXPECT_FALSE(j["configured"].get_bool().value());
  EXPECT_NE(a.body.find(R"("labels":{"configured":true,"status":"running","job_id":4,)"
                        R"("labelers":[{"did":"did:plc:labeler","cursor":2001}],)"
                        R"("labels_per_s":12.5,"frames":2001,"labels":1990,"stored":1800,)"
                        R"("negated":150,"stale":40,"refused":11,)"
                        R"("refused_by":{"bad_signature":6,"bad_version":5},"bad_frames":0,)"
                        R"("connection_errors":3,"error":null})"),
            std::string::npos)
      << a.body;

  Answer m = Call("GET", "/metrics");
  ASSERT_EQ(m.status, 200);
  for (const char* line : {"atfill_labels_total{outcome=\"stored\"} 1800\n",
                           "atfill_labels_total{outcome=\"negated\"} 150\n",
                           "atfill_labels_total{outcome=\"stale\"} 40\n",
                           "atfill_labels_total{outcome=\"refused\"} 11\n",
                           "atfill_labels_refused_total{kind=\"bad_signature\"} 6\n",
                           "atfill_labels_refused_total{kind=\"bad_version\"} 5\n",
                           "atfill_label_connection_errors_total 3\n",
                           "atfill_labeler_cursor{labeler=\"did:plc:labeler\"} 2001\n"}) {
    EXPECT_NE(m.body.find(line), std::string::npos) << line << m.body;
  }
  // The job's counters grow: the series grow by as much, not by the total again.
  live.labels.stored = 1850;
  live.labels.labelers[0].cursor = 2100;
  backend_.SetLive(live);
  m = Call("GET", "/metrics");
  EXPECT_NE(m.body.find("atfill_labels_total{outcome=\"stored\"} 1850\n"), std::string::npos)
      << m.body;
  EXPECT_NE(m.body.find("atfill_labels_total{outcome=\"refused\"} 11\n"), std::string::npos);
  EXPECT_NE(m.body.find("atfill_labeler_cursor{labeler=\"did:plc:labeler\"} 2100\n"),
            std::string::npos);
}

TEST_F(AdminServerTest, WrongMethodIs405WithAllow) {
  StartServer();
  backend_.Add(JobStatus::kRunning, JobStage::kPending);
  struct Case {
    const char* method;
    const char* path;
    const char* allow;
  };
  for (const Case& c :
       {Case{"GET", "/admin/backfill/1/pause", "POST"}, Case{"PUT", "/admin/backfill", "GET, POST"},
        Case{"PATCH", "/admin/backfill/1", "GET"},
        Case{"POST", "/admin/backfill/details", "DELETE, GET"}, Case{"DELETE", "/metrics", "GET"},
        Case{"POST", "/admin/jetstream/status", "GET"},
        Case{"POST", "/admin/backfill/1/events", "GET"}, Case{"POST", "/", "GET, HEAD"}}) {
    SCOPED_TRACE(std::string(c.method) + " " + c.path);
    Answer a = Call(c.method, c.path);
    EXPECT_EQ(a.status, 405);
    EXPECT_EQ(a.header("Allow"), c.allow);
    EXPECT_NE(ErrorOf(a).find("not allowed"), std::string::npos);
  }
}

TEST_F(AdminServerTest, BackendErrorsMapToStatusCodes) {
  StartServer();
  backend_.FailList(Status::Unavailable("shutting down"));
  Answer a = Call("GET", "/admin/backfill");
  EXPECT_EQ(a.status, 503);
  EXPECT_EQ(ErrorOf(a), "shutting down");
  backend_.FailList(Status::Corrupt("job 3 does not decode"));
  a = Call("GET", "/admin/backfill");
  EXPECT_EQ(a.status, 500);
  EXPECT_EQ(ErrorOf(a), "job 3 does not decode");
  backend_.FailList(Status::NotFound("gone"));
  EXPECT_EQ(Call("GET", "/admin/backfill").status, 404);
  backend_.FailList(Status::Invalid("bad"));
  EXPECT_EQ(Call("GET", "/admin/backfill").status, 400);
  backend_.FailList(Status::Unsupported("not now"));
  EXPECT_EQ(Call("GET", "/admin/backfill").status, 409);
}

TEST_F(AdminServerTest, OversizedBodyIs413) {
  options_.max_body_bytes = 4096;
  StartServer();
  Answer a = Call("POST", "/admin/backfill", std::string(8192, ' '));
  EXPECT_EQ(a.status, 413);
  EXPECT_TRUE(backend_.started().empty());
}

// --- Metrics ---

TEST_F(AdminServerTest, MetricsExposition) {
  StartServer();
  backend_.Add(JobStatus::kRunning, JobStage::kDiscovering);
  backend_.Add(JobStatus::kRunning, JobStage::kDiscovering);
  backend_.Add(JobStatus::kCompleted, JobStage::kCompleted);
  LiveStatus live;
  live.configured = true;
  live.lag_s = 2.25;
  backend_.SetLive(live);

  Answer a = Call("GET", "/metrics");
  ASSERT_EQ(a.status, 200);
  EXPECT_TRUE(a.header("Content-Type").starts_with("text/plain; version=0.0.4"))
      << a.header("Content-Type");
  const std::string& text = a.body;
  for (const auto& [family, type] :
       std::vector<std::pair<std::string, std::string>>{{"atfill_stage_events_total", "counter"},
                                                        {"atfill_stage_records_total", "counter"},
                                                        {"atfill_errors_total", "counter"},
                                                        {"atfill_http_requests_total", "counter"},
                                                        {"atfill_sink_batch_seconds", "histogram"},
                                                        {"atfill_live_lag_seconds", "gauge"},
                                                        {"atfill_queue_depth", "gauge"},
                                                        {"atfill_jobs", "gauge"}}) {
    EXPECT_NE(text.find("# HELP " + family + " "), std::string::npos) << family;
    EXPECT_NE(text.find("# TYPE " + family + " " + type + "\n"), std::string::npos) << family;
  }
  // Every sample line has the exposition format's shape.
  const std::regex sample(
      R"(^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"]*")*\})? \S+( \d+)?$)");
  size_t start = 0;
  int samples = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line.empty() || line[0] == '#') continue;
    ++samples;
    EXPECT_TRUE(std::regex_match(line, sample)) << line;
  }
  EXPECT_GT(samples, 10);
  EXPECT_NE(text.find("atfill_jobs{status=\"running\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("atfill_jobs{status=\"completed\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("atfill_jobs{status=\"paused\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("atfill_queue_depth{job=\"1\"} 10\n"), std::string::npos);
  EXPECT_NE(text.find("atfill_queue_depth{job=\"2\"} 20\n"), std::string::npos);
  EXPECT_EQ(text.find("atfill_queue_depth{job=\"3\"}"), std::string::npos);  // finished
  EXPECT_NE(text.find("atfill_live_lag_seconds 2.25\n"), std::string::npos);
  EXPECT_NE(text.find("atfill_stage_events_total{stage=\"fetcher\"} 0\n"), std::string::npos);
  EXPECT_EQ(text.find("atfill_errors_total{kind=\"cid_mismatch\"}"), std::string::npos);

  // Counters the engine side adds show up in the next scrape.
  metrics_.AddStageEvents("fetcher", 5);
  metrics_.StageEvents("fetcher").Add(2);
  metrics_.AddErrors("cid_mismatch");
  metrics_.CountHttpResponse(200);
  metrics_.CountHttpResponse(503);
  metrics_.CountHttpResponse(0);
  metrics_.ObserveSinkBatch(0.02);
  state::JobCounters before, after;
  after.events_read = 100;
  after.records_written = 90;
  after.failed_records = 3;
  metrics_.AddJobCounters(before, after);
  metrics_.AddJobCounters(after, before);  // shrinking adds nothing
  backend_.Move(1, {}, JobStatus::kCompleted);
  backend_.SetLive(LiveStatus{});

  const std::string next = Call("GET", "/metrics").body;
  EXPECT_NE(next.find("atfill_stage_events_total{stage=\"fetcher\"} 7\n"), std::string::npos)
      << next;
  EXPECT_NE(next.find("atfill_stage_events_total{stage=\"source\"} 100\n"), std::string::npos);
  EXPECT_NE(next.find("atfill_stage_records_total{stage=\"sink\"} 90\n"), std::string::npos);
  EXPECT_NE(next.find("atfill_errors_total{kind=\"record\"} 3\n"), std::string::npos);
  EXPECT_NE(next.find("atfill_errors_total{kind=\"cid_mismatch\"} 1\n"), std::string::npos);
  EXPECT_NE(next.find("atfill_http_requests_total{class=\"2xx\"} 1\n"), std::string::npos);
  EXPECT_NE(next.find("atfill_http_requests_total{class=\"5xx\"} 1\n"), std::string::npos);
  EXPECT_NE(next.find("atfill_http_requests_total{class=\"error\"} 1\n"), std::string::npos);
  EXPECT_NE(next.find("atfill_http_requests_total{class=\"4xx\"} 0\n"), std::string::npos);
  EXPECT_NE(next.find("atfill_sink_batch_seconds_count 1\n"), std::string::npos);
  EXPECT_NE(next.find("atfill_sink_batch_seconds_bucket{le=\"0.025\"} 1\n"), std::string::npos);
  EXPECT_NE(next.find("atfill_sink_batch_seconds_bucket{le=\"0.01\"} 0\n"), std::string::npos);
  // Job 1 finished: its queue series is gone; the live consumer went away with its lag.
  EXPECT_EQ(next.find("atfill_queue_depth{job=\"1\"}"), std::string::npos);
  EXPECT_NE(next.find("atfill_jobs{status=\"running\"} 1\n"), std::string::npos);
  EXPECT_EQ(next.find("atfill_live_lag_seconds "), std::string::npos);
}

// --- Event streams ---

struct SseEvent {
  std::string name;
  std::string data;
};

// Reads one event stream on a thread of its own and queues its events; comments are counted.
class SseReader {
 public:
  SseReader(uint16_t port, const std::string& path, std::string token = kToken)
      : thread_([this, port, path, token] { Run(port, path, token); }) {}
  ~SseReader() {
    cancel_ = true;
    thread_.join();
  }

  // The next event, or nullopt after `timeout` or when the stream closed with none left.
  std::optional<SseEvent> Next(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [this] { return !events_.empty() || closed_; });
    if (events_.empty()) return std::nullopt;
    SseEvent e = std::move(events_.front());
    events_.pop_front();
    return e;
  }

  // Waits until the stream's connection ended; true when it did within `timeout`.
  bool WaitClosed(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [this] { return closed_; });
  }

  int status() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }
  std::string content_type() {
    std::lock_guard<std::mutex> lock(mu_);
    return content_type_;
  }
  int comments() {
    std::lock_guard<std::mutex> lock(mu_);
    return comments_;
  }
  std::string raw() {
    std::lock_guard<std::mutex> lock(mu_);
    return raw_;
  }

 private:
  void Run(uint16_t port, const std::string& path, const std::string& token) {
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(30, 0);
    httplib::Headers headers = {{"Authorization", "Bearer " + token}};
    auto res = cli.Get(
        path, headers,
        [this](const httplib::Response& r) {
          std::lock_guard<std::mutex> lock(mu_);
          status_ = r.status;
          content_type_ = r.get_header_value("Content-Type");
          return !cancel_;
        },
        [this](const char* data, size_t n) {
          std::lock_guard<std::mutex> lock(mu_);
          raw_.append(data, n);
          buffer_.append(data, n);
          for (size_t cut; (cut = buffer_.find("\n\n")) != std::string::npos;) {
            Parse(buffer_.substr(0, cut));
            buffer_.erase(0, cut + 2);
          }
          cv_.notify_all();
          return !cancel_;
        });
    std::lock_guard<std::mutex> lock(mu_);
    if (res && status_ == 0) status_ = res->status;
    if (res && status_ >= 400) raw_ = res->body;
    closed_ = true;
    cv_.notify_all();
  }

  void Parse(const std::string& block) {
    SseEvent e;
    size_t start = 0;
    while (start <= block.size()) {
      size_t end = block.find('\n', start);
      if (end == std::string::npos) end = block.size();
      const std::string line = block.substr(start, end - start);
      start = end + 1;
      if (line.starts_with(":")) {
        ++comments_;
      } else if (line.starts_with("event: ")) {
        e.name = line.substr(7);
      } else if (line.starts_with("data: ")) {
        e.data += line.substr(6);
      }
    }
    if (!e.name.empty()) events_.push_back(std::move(e));
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<SseEvent> events_;
  std::string buffer_;
  std::string raw_;
  std::string content_type_;
  int status_ = 0;
  int comments_ = 0;
  bool closed_ = false;
  std::atomic<bool> cancel_{false};
  std::thread thread_;
};

class AdminEventsTest : public AdminServerTest {
 protected:
  void SetUp() override {
    AdminServerTest::SetUp();
    options_.sse_interval_ms = 20;
  }
};

TEST_F(AdminEventsTest, EveryStageChangeArrivesInOrderThenStatusAndEnd) {
  StartServer();
  const uint64_t id = backend_.Add(JobStatus::kRunning, JobStage::kPending);
  backend_.Move(id, {JobStage::kDiscovering}, std::nullopt);  // history before the stream

  SseReader reader(server_.port(), "/admin/backfill/" + std::to_string(id) + "/events");
  auto e = reader.Next();
  ASSERT_TRUE(e) << reader.raw();
  EXPECT_EQ(reader.status(), 200);
  EXPECT_EQ(reader.content_type(), "text/event-stream");
  ASSERT_EQ(e->name, "snapshot");
  {
    Json j(e->data);
    ASSERT_TRUE(j.ok) << e->data;
    EXPECT_EQ(j.Uint("id"), id);
    EXPECT_EQ(j.Str("stage"), "discovering");
    EXPECT_EQ(j["stage_changes"].get_array().value().size(), 1u);
    EXPECT_TRUE(j.Has("hosts"));
  }

  // Counters: one change, one event carrying it.
  backend_.SetRecordsWritten(id, 777);
  e = reader.Next();
  ASSERT_TRUE(e);
  ASSERT_EQ(e->name, "counters") << e->data;
  {
    Json j(e->data);
    EXPECT_EQ(j.Uint("id"), id);
    EXPECT_EQ(j["counters"]["records_written"].get_uint64().value(), 777u);
    EXPECT_TRUE(j.Has("progress"));
  }

  // Hosts: the per-PDS summary changed.
  backend_.SetHosts(id, {{"https://pds.example", 5, 4, 1, 99}});
  e = reader.Next();
  ASSERT_TRUE(e);
  ASSERT_EQ(e->name, "hosts") << e->data;
  {
    Json j(e->data);
    simdjson::dom::array hosts = j["hosts"].get_array().value();
    ASSERT_EQ(hosts.size(), 1u);
    EXPECT_EQ(hosts.at(0)["records"].get_uint64().value(), 99u);
  }

  // Four stages and the final status at once: all four transitions, in order, then the status
  // and the end, then the connection closes.
  backend_.Move(id,
                {JobStage::kResolvingAndFetching, JobStage::kRetryingBlocks, JobStage::kReplaying,
                 JobStage::kCompleted},
                JobStatus::kCompleted);
  const std::vector<std::pair<std::string, std::string>> transitions = {
      {"discovering", "resolving_and_fetching"},
      {"resolving_and_fetching", "retrying_blocks"},
      {"retrying_blocks", "replaying"},
      {"replaying", "completed"}};
  for (size_t i = 0; i < transitions.size(); ++i) {
    e = reader.Next();
    ASSERT_TRUE(e) << "transition " << i;
    ASSERT_EQ(e->name, "stage") << e->data;
    Json j(e->data);
    EXPECT_EQ(j.Uint("id"), id);
    EXPECT_EQ(j.Uint("index"), i + 1);
    EXPECT_EQ(j.Str("from"), transitions[i].first);
    EXPECT_EQ(j.Str("to"), transitions[i].second);
  }
  e = reader.Next();
  ASSERT_TRUE(e);
  ASSERT_EQ(e->name, "status") << e->data;
  {
    Json j(e->data);
    EXPECT_EQ(j.Str("from"), "running");
    EXPECT_EQ(j.Str("to"), "completed");
  }
  e = reader.Next();
  ASSERT_TRUE(e);
  ASSERT_EQ(e->name, "end") << e->data;
  EXPECT_EQ(Json(e->data).Str("status"), "completed");
  EXPECT_EQ(Json(e->data).Str("reason"), "final");
  EXPECT_TRUE(reader.WaitClosed(std::chrono::seconds(5)));
  EXPECT_FALSE(reader.Next(std::chrono::milliseconds(0)));
}

TEST_F(AdminEventsTest, AFinishedOrPausedJobSendsSnapshotThenEnd) {
  StartServer();
  for (JobStatus status : {JobStatus::kCompleted, JobStatus::kPaused, JobStatus::kCancelled}) {
    const uint64_t id = backend_.Add(status, JobStage::kCompleted);
    SseReader reader(server_.port(), "/admin/backfill/" + std::to_string(id) + "/events");
    auto e = reader.Next();
    ASSERT_TRUE(e);
    EXPECT_EQ(e->name, "snapshot");
    e = reader.Next();
    ASSERT_TRUE(e);
    EXPECT_EQ(e->name, "end");
    EXPECT_EQ(Json(e->data).Str("status"), state::JobStatusName(status));
    EXPECT_TRUE(reader.WaitClosed(std::chrono::seconds(5)));
  }
}

TEST_F(AdminEventsTest, PausingEndsTheStreamOncePaused) {
  StartServer();
  const uint64_t id = backend_.Add(JobStatus::kRunning, JobStage::kDiscovering);
  SseReader reader(server_.port(), "/admin/backfill/" + std::to_string(id) + "/events");
  ASSERT_EQ(reader.Next()->name, "snapshot");
  backend_.Move(id, {}, JobStatus::kPausing);
  auto e = reader.Next();
  ASSERT_TRUE(e);
  ASSERT_EQ(e->name, "status");
  EXPECT_EQ(Json(e->data).Str("to"), "pausing");
  backend_.Move(id, {}, JobStatus::kPaused);
  e = reader.Next();
  ASSERT_TRUE(e);
  ASSERT_EQ(e->name, "status");
  EXPECT_EQ(Json(e->data).Str("to"), "paused");
  e = reader.Next();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->name, "end");
  EXPECT_TRUE(reader.WaitClosed(std::chrono::seconds(5)));
}

TEST_F(AdminEventsTest, KeepAliveCommentsWhenNothingHappens) {
  options_.keepalive_interval_ms = 40;
  StartServer();
  const uint64_t id = backend_.Add(JobStatus::kRunning, JobStage::kDiscovering);
  SseReader reader(server_.port(), "/admin/backfill/" + std::to_string(id) + "/events");
  ASSERT_EQ(reader.Next()->name, "snapshot");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (reader.comments() < 2 && std::chrono::steady_clock::now() < deadline) {
    reader.Next(std::chrono::milliseconds(50));
  }
  EXPECT_GE(reader.comments(), 2);
  EXPECT_NE(reader.raw().find(": keep-alive\n\n"), std::string::npos);
}

TEST_F(AdminEventsTest, StopEndsAnOpenStreamPromptly) {
  options_.sse_interval_ms = 250;
  StartServer();
  const uint64_t id = backend_.Add(JobStatus::kRunning, JobStage::kDiscovering);
  SseReader reader(server_.port(), "/admin/backfill/" + std::to_string(id) + "/events");
  ASSERT_EQ(reader.Next()->name, "snapshot");
  const auto t0 = std::chrono::steady_clock::now();
  server_.Stop();
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, std::chrono::seconds(2));
  auto e = reader.Next(std::chrono::seconds(5));
  ASSERT_TRUE(e);
  EXPECT_EQ(e->name, "end");
  EXPECT_EQ(Json(e->data).Str("reason"), "shutdown");
  EXPECT_TRUE(reader.WaitClosed(std::chrono::seconds(2)));
}

TEST_F(AdminEventsTest, UnknownJobIs404AndStreamsAreBounded) {
  options_.threads = 4;
  options_.max_event_streams = 1;
  StartServer();
  Answer a = Call("GET", "/admin/backfill/42/events");
  EXPECT_EQ(a.status, 404);
  EXPECT_EQ(a.header("Content-Type"), "application/json");
  const uint64_t id = backend_.Add(JobStatus::kRunning, JobStage::kDiscovering);
  const std::string path = "/admin/backfill/" + std::to_string(id) + "/events";
  SseReader first(server_.port(), path);
  ASSERT_EQ(first.Next()->name, "snapshot");
  a = Call("GET", path);
  EXPECT_EQ(a.status, 503);
  EXPECT_NE(ErrorOf(a).find("too many"), std::string::npos);
  // The slot frees when the first stream ends.
  backend_.Move(id, {}, JobStatus::kCompleted);
  ASSERT_TRUE(first.WaitClosed(std::chrono::seconds(5)));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    SseReader again(server_.port(), path);
    if (again.Next() && (status = again.status()) == 200) break;
  }
  EXPECT_EQ(status, 200);
}

// --- Slow, idle and non-reading clients ---

// A client socket on loopback, driven byte by byte, for the clients httplib will not be: one
// that stops halfway through its request, drips it, or never reads its answer.
class RawClient {
 public:
  // `receive_buffer` > 0 shrinks the socket's receive buffer (before connecting, so the window
  // the server sees is small too).
  explicit RawClient(uint16_t port, int receive_buffer = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_GE(fd_, 0) << std::strerror(errno);
    if (receive_buffer > 0) {
      ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof(receive_buffer));
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    EXPECT_TRUE(connected_) << std::strerror(errno);
  }
  ~RawClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  // True when all of `bytes` went into the socket.
  bool Send(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // Reads one answer with a Content-Length body (the server's only other framing is the event
  // streams', not read here); its status, or 0 when none came within `timeout`.
  int ReadAnswer(std::chrono::milliseconds timeout, std::string* body = nullptr) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const size_t head_end = in_.find("\r\n\r\n");
      if (head_end != std::string::npos) {
        const std::string head = in_.substr(0, head_end);
        std::smatch m;
        size_t length = 0;
        if (std::regex_search(head, m, std::regex("[Cc]ontent-[Ll]ength: *([0-9]+)"))) {
          length = std::stoul(m[1].str());
        }
        if (in_.size() >= head_end + 4 + length) {
          if (body != nullptr) *body = in_.substr(head_end + 4, length);
          in_.erase(0, head_end + 4 + length);
          return head.size() > 12 ? std::atoi(head.c_str() + 9) : -1;
        }
      }
      if (!ReadSome(deadline)) return 0;
    }
  }

  // True when the server closed the connection (end of stream or reset) within `timeout`;
  // whatever arrives before counts in received().
  bool WaitClosed(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (ReadSome(deadline)) {
    }
    return closed_;
  }

  // Closed as far as a look without waiting tells.
  bool ClosedNow() { return WaitClosed(std::chrono::milliseconds(0)); }

  // The server closed or reset the connection, told by the socket's TCP state without reading
  // (reading would let a stalled server write on).
  bool PeerEnded() const {
    tcp_info info{};
    socklen_t len = sizeof(info);
    if (::getsockopt(fd_, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return true;
    return info.tcpi_state != TCP_ESTABLISHED;
  }

  size_t received() const { return received_; }

 private:
  // Reads what is there (waiting until `deadline` for something); false at the deadline or
  // once the connection has closed.
  bool ReadSome(std::chrono::steady_clock::time_point deadline) {
    if (closed_) return false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count()))) <= 0) return false;
    char buf[65536];
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n <= 0) {
      closed_ = true;
      return false;
    }
    in_.append(buf, static_cast<size_t>(n));
    received_ += static_cast<size_t>(n);
    if (in_.size() > (1u << 20)) in_.erase(0, in_.size() - (1u << 16));
    return true;
  }

  int fd_ = -1;
  bool connected_ = false;
  bool closed_ = false;
  std::string in_;
  size_t received_ = 0;
};

constexpr const char* kHalfSentHead = "GET / HTTP/1.1\r\nHost: x\r\n";

// A client that sends `Expect: 100-continue` (curl does for a body over 1 KiB) holds its body back
// until the interim answer comes: it gets that at once, then the request's own answer.
TEST_F(AdminServerTest, AnExpectContinueRequestGetsTheInterimAnswerThenItsOwn) {
  StartServer();
  RawClient c(server_.port());
  const std::string body = R"({"collections":["app.bsky.feed.like"]})";
  ASSERT_TRUE(c.Send(std::string("POST /admin/backfill HTTP/1.1\r\nHost: x\r\nAuthorization: "
                                 "Bearer ") +
                     kToken +
                     "\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
                     "Content-Length: " +
                     std::to_string(body.size()) + "\r\n\r\n"));
  EXPECT_EQ(c.ReadAnswer(std::chrono::milliseconds(2000)), 100);  // before the body is sent
  ASSERT_TRUE(c.Send(body));
  std::string answer;
  EXPECT_EQ(c.ReadAnswer(std::chrono::milliseconds(2000), &answer), 202) << answer;
  EXPECT_EQ(backend_.started().size(), 1u);
}

class AdminSlowClientsTest : public AdminServerTest {
 protected:
  void SetUp() override {
    AdminServerTest::SetUp();
    options_.header_timeout_s = 2;
    options_.body_timeout_s = 2;
    options_.io_timeout_s = 2;
    options_.idle_timeout_s = 30;
  }

  // GET / and an authorised GET /admin/backfill each answer 200 within 2 s.
  void ExpectPromptAnswers() {
    for (const char* path : {"/", "/admin/backfill"}) {
      SCOPED_TRACE(path);
      const auto t0 = std::chrono::steady_clock::now();
      Answer a = Call("GET", path, "", std::string("Bearer ") + kToken);
      const auto took = std::chrono::steady_clock::now() - t0;
      EXPECT_EQ(a.status, 200);
      EXPECT_LT(took, std::chrono::seconds(2));
    }
  }

  std::string Scrape() { return Call("GET", "/metrics").body; }
};

TEST_F(AdminSlowClientsTest, HalfSentAndIdleConnectionsNeitherStallOthersNorStay) {
  StartServer();
  backend_.Add(JobStatus::kRunning, JobStage::kDiscovering);
  std::vector<std::unique_ptr<RawClient>> half_sent;
  std::vector<std::unique_ptr<RawClient>> silent;
  for (int i = 0; i < 300; ++i) {
    half_sent.push_back(std::make_unique<RawClient>(server_.port()));
    ASSERT_TRUE(half_sent.back()->Send(kHalfSentHead));
  }
  for (int i = 0; i < 50; ++i) silent.push_back(std::make_unique<RawClient>(server_.port()));
  const auto opened = std::chrono::steady_clock::now();
  ExpectPromptAnswers();
  // Every one of them is closed by the header deadline (2 s from its accept), none much later.
  for (auto* group : {&half_sent, &silent}) {
    for (size_t i = 0; i < group->size(); ++i) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          opened + std::chrono::seconds(5) - std::chrono::steady_clock::now());
      ASSERT_TRUE((*group)[i]->WaitClosed(std::max(left, std::chrono::milliseconds(0))))
          << "connection " << i << " of " << group->size() << " still open";
      EXPECT_EQ((*group)[i]->received(), 0u);
    }
  }
  EXPECT_NE(Scrape().find("atfill_errors_total{kind=\"admin_header_timeout\"} 350\n"),
            std::string::npos)
      << Scrape();
  ExpectPromptAnswers();
}

TEST_F(AdminSlowClientsTest, ADrippedHeadIsCutAtTheHeaderDeadline) {
  StartServer();
  RawClient slow(server_.port());
  ASSERT_TRUE(slow.Send("GET / HTTP/1.1\r\nHost: x\r\n"));
  // A header line every 100 ms keeps every single read short; only a deadline on the whole head
  // ends it.
  const auto t0 = std::chrono::steady_clock::now();
  bool closed = false;
  for (int i = 0; i < 60 && !closed; ++i) {
    closed = !slow.Send("X-Drip-" + std::to_string(i) + ": y\r\n") ||
             slow.WaitClosed(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(closed) << "still open after 6 s";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(4));
  EXPECT_EQ(slow.received(), 0u);
}

TEST_F(AdminSlowClientsTest, ADrippedBodyIsCutAtTheBodyDeadlineAndOthersAreServed) {
  StartServer();
  RawClient slow(server_.port());
  ASSERT_TRUE(slow.Send(std::string("POST /admin/backfill HTTP/1.1\r\nHost: x\r\nAuthorization: "
                                    "Bearer ") +
                        kToken +
                        "\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"));
  const auto t0 = std::chrono::steady_clock::now();
  bool closed = false;
  for (int i = 0; i < 60 && !closed; ++i) {
    closed = !slow.Send(" ") || slow.WaitClosed(std::chrono::milliseconds(100));
    if (i == 5) ExpectPromptAnswers();
  }
  EXPECT_TRUE(closed) << "still open after 6 s";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_TRUE(backend_.started().empty());
  EXPECT_NE(Scrape().find("atfill_errors_total{kind=\"admin_body_timeout\"} 1\n"),
            std::string::npos);
}

TEST_F(AdminSlowClientsTest, ClientsThatNeverReadDoNotBlockOthersAndAreCut) {
  StartServer();
  // Each asks for the 34 KB script hundreds of times over and reads none of it, through a
  // small receive window: the server's writes to it stall at once.
  std::string requests;
  for (int i = 0; i < 300; ++i) requests += "GET /app.js HTTP/1.1\r\nHost: x\r\n\r\n";
  std::vector<std::unique_ptr<RawClient>> deaf;
  for (int i = 0; i < 24; ++i) {
    deaf.push_back(std::make_unique<RawClient>(server_.port(), 4096));
    ASSERT_TRUE(deaf.back()->Send(requests));
  }
  ExpectPromptAnswers();
  // The write deadline (2 s) cuts each of them: what arrived before the close is far less than
  // the 300 answers asked for.
  const size_t asked = 300 * DashboardFiles()[0].bytes.size();
  for (size_t i = 0; i < deaf.size(); ++i) {
    ASSERT_TRUE(testing::WaitUntil([&] { return deaf[i]->PeerEnded(); }, std::chrono::seconds(8)))
        << "client " << i;
    deaf[i]->WaitClosed(std::chrono::seconds(2));
    EXPECT_LT(deaf[i]->received(), asked / 2) << "client " << i;
  }
  EXPECT_NE(Scrape().find("atfill_errors_total{kind=\"admin_write_timeout\"}"), std::string::npos);
}

TEST_F(AdminSlowClientsTest, AtTheCapTheOldestIdleConnectionMakesRoom) {
  options_.max_connections = 8;
  options_.max_event_streams = 2;
  StartServer();
  const uint64_t id = backend_.Add(JobStatus::kRunning, JobStage::kDiscovering);
  // One stream (busy, never closed to make room), then idle keep-alive connections up to the
  // cap, oldest first: each has had an answer, so the server holds it.
  SseReader stream(server_.port(), "/admin/backfill/" + std::to_string(id) + "/events");
  ASSERT_EQ(stream.Next()->name, "snapshot");
  std::vector<std::unique_ptr<RawClient>> idle;
  for (int i = 0; i < 7; ++i) {
    idle.push_back(std::make_unique<RawClient>(server_.port()));
    ASSERT_TRUE(idle.back()->Send("GET /style.css HTTP/1.1\r\nHost: x\r\n\r\n"));
    ASSERT_EQ(idle.back()->ReadAnswer(std::chrono::seconds(5)), 200) << i;
  }
  // Two newcomers, kept open: each is served, and each closes the oldest idle one still open.
  std::vector<std::unique_ptr<RawClient>> newcomers;
  for (size_t round = 0; round < 2; ++round) {
    SCOPED_TRACE(round);
    newcomers.push_back(std::make_unique<RawClient>(server_.port()));
    ASSERT_TRUE(newcomers.back()->Send("GET /style.css HTTP/1.1\r\nHost: x\r\n\r\n"));
    EXPECT_EQ(newcomers.back()->ReadAnswer(std::chrono::seconds(2)), 200);
    EXPECT_TRUE(idle[round]->WaitClosed(std::chrono::seconds(2)));
  }
  for (size_t i = 2; i < idle.size(); ++i) EXPECT_FALSE(idle[i]->ClosedNow()) << i;
  for (auto& c : newcomers) EXPECT_FALSE(c->ClosedNow());
  // The stream was never a candidate.
  backend_.SetRecordsWritten(id, 5);
  auto e = stream.Next();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->name, "counters");
  // The scrape's own connection made a third room.
  EXPECT_NE(Scrape().find("atfill_errors_total{kind=\"admin_connection_evicted\"} 3\n"),
            std::string::npos);
  EXPECT_TRUE(idle[2]->WaitClosed(std::chrono::seconds(2)));
}

TEST_F(AdminSlowClientsTest, StopIsPromptWithSlowClientsOpen) {
  StartServer();
  std::vector<std::unique_ptr<RawClient>> half_sent;
  for (int i = 0; i < 50; ++i) {
    half_sent.push_back(std::make_unique<RawClient>(server_.port()));
    ASSERT_TRUE(half_sent.back()->Send(kHalfSentHead));
  }
  ExpectPromptAnswers();
  const auto t0 = std::chrono::steady_clock::now();
  server_.Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  for (auto& c : half_sent) EXPECT_TRUE(c->WaitClosed(std::chrono::seconds(1)));
}

TEST(AdminServerOptionsTest, ConnectionBoundsAreChecked) {
  AdminServerOptions o;
  o.token = "fine";
  ASSERT_TRUE(o.Validate().ok());
  for (auto set : std::vector<std::function<void(AdminServerOptions&)>>{
           [](AdminServerOptions& x) { x.header_timeout_s = 0; },
           [](AdminServerOptions& x) { x.body_timeout_s = 0; },
           [](AdminServerOptions& x) { x.max_connections = x.max_event_streams; }}) {
    AdminServerOptions bad = o;
    set(bad);
    Status s = bad.Validate();
    EXPECT_EQ(s.code(), StatusCode::kInvalid) << s.ToString();
  }
}

}  // namespace
}  // namespace atfill::admin
