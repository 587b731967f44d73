// The admin API and dashboard of a real `atfill run` (with [admin]) against simnet over loopback:
// backfills started, followed (server-sent events), steered and cleared over HTTP; metrics; and
// the dashboard driven in headless Chromium (Debian's chromium, through playwright-core).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <simdjson.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "sinks/sqlite_reader.hpp"
#include "tests/common/process.hpp"
#include "tests/common/test_util.hpp"
#include "tools/simnet/simnet.hpp"

namespace atfill {
namespace {

using testing::Child;
using ::testing::HasSubstr;
using testing::TempDir;

constexpr const char* kToken = "s3cret-admin-token";
constexpr const char* kPost = "app.bsky.feed.post";

std::string Slurp(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

simnet::SimnetOptions Network(int64_t latency_ms) {
  simnet::SimnetOptions o;
  o.seed = 31;
  o.accounts = 120;
  o.pds_hosts = 4;
  o.collections = {kPost, "app.bsky.feed.like"};
  o.max_records = 20;
  o.deactivated_share = 0;
  o.takendown_share = 0;
  o.latency_ms = latency_ms;
  o.threads = 2;
  return o;
}

// `atfill run` with [admin] on a free port, its state and table in a folder of its own.
class Server {
 public:
  // `extra`: more config sections. `backfill_first`: run `atfill backfill` to its end before the
  // server starts (for tests of what the server finds). `args`: after `atfill run CONFIG`.
  explicit Server(const simnet::Simnet& net, const std::string& extra = "",
                  bool backfill_first = false, const std::vector<std::string>& args = {}) {
    config_ = (dir_ / "atfill.toml").string();
    testing::WriteFile(config_,
                       "[state]\ndir = \"state\"\n[sink.sqlite]\npath = \"db.sqlite\"\n"
                       "[progress]\ninterval_s = 60\n[admin]\nport = 0\ntoken = \"" +
                           std::string(kToken) + "\"\nsse_interval_ms = 50\n[crawl]\nrelay = \"" +
                           net.relay_url() +
                           "\"\ncollections = [\"app.bsky.feed.post\"]\n"
                           "allow_loopback_endpoints = true\nlist_repos_limit = 20\n"
                           "[resolver]\nplc = \"" +
                           net.plc_url() + "\"\n" + extra);
    if (backfill_first) {
      auto before = testing::RunProcess({ATFILL_BINARY, "backfill", config_}, dir_.path());
      EXPECT_EQ(before.exit_code, 0) << before.err;
    }
    std::vector<std::string> argv{ATFILL_BINARY, "run", config_};
    argv.insert(argv.end(), args.begin(), args.end());
    child_ = std::make_unique<Child>(argv, dir_.path());
    // The port it listens on, from its first lines.
    const std::regex listening(R"(dashboard on http://127\.0\.0\.1:(\d+)/)");
    testing::WaitUntil(
        [&] {
          std::smatch m;
          const std::string err = Slurp(child_->err_path());
          if (std::regex_search(err, m, listening)) port_ = std::stoi(m[1]);
          return port_ != 0 || !child_->Running();
        },
        std::chrono::seconds(30));
  }
  ~Server() { Stop(); }

  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/"; }
  const std::filesystem::path& dir() const { return dir_.path(); }
  std::string log() const { return Slurp(child_->err_path()); }

  httplib::Client Client(bool with_token = true) const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(30, 0);
    if (with_token) c.set_bearer_token_auth(kToken);
    return c;
  }

  // SIGTERM: running jobs pause, the server stops, the process exits 0.
  testing::ProcessResult Stop() {
    if (stopped_) return {};
    stopped_ = true;
    child_->Kill(SIGTERM);
    return child_->Wait(std::chrono::seconds(60));
  }

 private:
  TempDir dir_;
  std::string config_;
  std::unique_ptr<Child> child_;
  int port_ = 0;
  bool stopped_ = false;
};

// One server-sent event.
struct Sse {
  std::string event;
  std::string data;
};

// Reads the job's event stream to its `end` (or `limit` events).
std::vector<Sse> ReadEvents(const Server& server, uint64_t id, size_t limit = 100000) {
  std::vector<Sse> events;
  std::string buffer;
  auto c = server.Client();
  c.set_read_timeout(120, 0);
  auto r =
      c.Get("/admin/backfill/" + std::to_string(id) + "/events", [&](const char* data, size_t n) {
        buffer.append(data, n);
        size_t end;
        while ((end = buffer.find("\n\n")) != std::string::npos) {
          Sse e;
          std::istringstream block(buffer.substr(0, end));
          buffer.erase(0, end + 2);
          for (std::string line; std::getline(block, line);) {
            if (line.rfind("event: ", 0) == 0) e.event = line.substr(7);
            if (line.rfind("data: ", 0) == 0) e.data += line.substr(6);
          }
          if (!e.event.empty()) events.push_back(std::move(e));
          if (events.size() >= limit || (!events.empty() && events.back().event == "end"))
            return false;
        }
        return true;
      });
  return events;
}

uint64_t NumberAfter(const std::string& json, const std::string& key) {
  const auto at = json.find("\"" + key + "\":");
  if (at == std::string::npos) return UINT64_MAX;
  return std::strtoull(json.c_str() + at + key.size() + 3, nullptr, 10);
}

std::string StringAfter(const std::string& json, const std::string& key) {
  const auto at = json.find("\"" + key + "\":\"");
  if (at == std::string::npos) return "";
  const auto start = at + key.size() + 4;
  return json.substr(start, json.find('"', start) - start);
}

uint64_t Rows(const std::filesystem::path& db) {
  auto rows = sinks::ReadAllRecords(db.string());
  EXPECT_TRUE(rows.ok()) << rows.status().ToString();
  return rows.ok() ? rows->size() : 0;
}

uint64_t RowsOf(const std::filesystem::path& db, const std::string& collection) {
  auto rows = sinks::ReadAllRecords(db.string());
  EXPECT_TRUE(rows.ok()) << rows.status().ToString();
  if (!rows.ok()) return 0;
  return static_cast<uint64_t>(std::count_if(
      rows->begin(), rows->end(), [&](const auto& r) { return r.collection == collection; }));
}

// GETs `path` until `done` holds for the answer (or `seconds` pass: a test failure); returns the
// last answer's body.
std::string Poll(const Server& server, const std::string& path,
                 const std::function<bool(const std::string&)>& done, int seconds = 90) {
  std::string body;
  const bool shown = testing::WaitUntil(
      [&] {
        auto r = server.Client().Get(path);
        if (r && r->status == 200) body = r->body;
        return r && r->status == 200 && done(body);
      },
      std::chrono::seconds(seconds), std::chrono::milliseconds(50));
  if (!shown) ADD_FAILURE() << "GET " << path << " never showed what was awaited: " << body;
  return body;
}

// Waits until GET /admin/backfill/{id} shows `status`; returns the job's JSON.
std::string WaitForStatus(const Server& server, uint64_t id, const std::string& status) {
  return Poll(server, "/admin/backfill/" + std::to_string(id),
              [&](const std::string& job) { return StringAfter(job, "status") == status; });
}

TEST(AdminRunTest, ABackfillStartedOverTheApiStreamsEveryStageAndLands) {
  auto net = simnet::Simnet::Start(Network(5));
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  Server server(**net, "[jobs]\nrecord_batches = true\n");
  ASSERT_NE(server.port(), 0) << server.log();

  // The token rule on the real server.
  auto anonymous = server.Client(false).Get("/admin/backfill");
  ASSERT_TRUE(anonymous);
  EXPECT_EQ(anonymous->status, 401);
  auto page = server.Client(false).Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_THAT(page->body, HasSubstr("token-input"));

  auto bad = server.Client().Post("/admin/backfill", R"({"collections":["not an nsid"]})",
                                  "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400) << bad->body;

  auto started = server.Client().Post(
      "/admin/backfill", R"({"collections":["app.bsky.feed.post"]})", "application/json");
  ASSERT_TRUE(started);
  ASSERT_EQ(started->status, 202) << started->body;
  const uint64_t id = NumberAfter(started->body, "id");
  ASSERT_NE(id, UINT64_MAX) << started->body;

  const std::vector<Sse> events = ReadEvents(server, id);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.front().event, "snapshot");
  EXPECT_EQ(events.back().event, "end");
  EXPECT_THAT(events.back().data, HasSubstr("\"status\":\"completed\""));
  // Every stage change arrives once, in order, with no index missing: from pending through the
  // crawl's stages to completed.
  std::vector<std::string> stages;
  uint64_t next = 0;
  const std::regex change(R"re("index":(\d+),"from":"[a-z_]+","to":"([a-z_]+)")re");
  for (const Sse& e : events) {
    if (e.event != "snapshot" && e.event != "stage") continue;
    // The snapshot holds the changes made before the connection; each stage event one more.
    for (auto it = std::sregex_iterator(e.data.begin(), e.data.end(), change);
         it != std::sregex_iterator(); ++it) {
      EXPECT_EQ(std::stoull((*it)[1]), next) << e.data;
      next = std::stoull((*it)[1]) + 1;
      stages.push_back((*it)[2]);
    }
  }
  ASSERT_FALSE(stages.empty());
  EXPECT_EQ(stages.back(), "completed") << ::testing::PrintToString(stages);
  bool counters = false;
  for (const Sse& e : events) counters = counters || e.event == "counters";
  EXPECT_TRUE(counters);

  // What the API says equals the table.
  auto job = server.Client().Get("/admin/backfill/" + std::to_string(id));
  ASSERT_TRUE(job);
  ASSERT_EQ(job->status, 200);
  const uint64_t written = NumberAfter(job->body, "records_written");
  EXPECT_GT(written, 100u);
  EXPECT_EQ(written, Rows(server.dir() / "db.sqlite"));
  EXPECT_THAT(job->body, HasSubstr("\"started_by\":\"api\""));
  EXPECT_THAT(job->body, HasSubstr("\"hosts\":[{"));
  // The work-unit counters: every unit discovered, resolved and fetched (simnet has no
  // deactivated accounts), as the crawl's own units_* count them.
  const uint64_t total = NumberAfter(job->body, "total_repos");
  const uint64_t resolved = NumberAfter(job->body, "resolved_repos");
  const uint64_t processed = NumberAfter(job->body, "processed_repos");
  EXPECT_GT(total, 0u) << job->body;
  EXPECT_EQ(total, NumberAfter(job->body, "units_queued")) << job->body;
  EXPECT_EQ(processed, NumberAfter(job->body, "units_finished")) << job->body;
  EXPECT_EQ(resolved, total) << job->body;
  EXPECT_EQ(processed, total) << job->body;
  // A list parameter is a JSON array.
  EXPECT_THAT(job->body, HasSubstr("\"collections\":[\"app.bsky.feed.post\"]"));
  // The per-batch audit trail ([jobs] record_batches) holds every record the job read.
  auto batches = server.Client().Get("/admin/backfill/" + std::to_string(id) + "/batches");
  ASSERT_TRUE(batches);
  ASSERT_EQ(batches->status, 200) << batches->body;
  uint64_t audited = 0;
  const std::regex count(R"re("count":(\d+))re");
  for (auto it = std::sregex_iterator(batches->body.begin(), batches->body.end(), count);
       it != std::sregex_iterator(); ++it) {
    audited += std::stoull((*it)[1]);
  }
  EXPECT_EQ(audited, NumberAfter(job->body, "total_records")) << batches->body;

  // Metrics count what the job did.
  auto metrics = server.Client().Get("/metrics");
  ASSERT_TRUE(metrics);
  ASSERT_EQ(metrics->status, 200);
  EXPECT_THAT(metrics->body,
              HasSubstr("atfill_stage_records_total{stage=\"sink\"} " + std::to_string(written)));
  EXPECT_THAT(metrics->body, HasSubstr("atfill_jobs{status=\"completed\"} 1"));
  EXPECT_THAT(metrics->body, HasSubstr("atfill_http_requests_total{class=\"2xx\"}"));
  EXPECT_THAT(metrics->body, HasSubstr("atfill_sink_batch_seconds_count"));
  // The resolver and fetcher stages count the job's units.
  EXPECT_THAT(metrics->body, HasSubstr("atfill_stage_events_total{stage=\"resolver\"} " +
                                       std::to_string(resolved)));
  EXPECT_THAT(metrics->body, HasSubstr("atfill_stage_events_total{stage=\"fetcher\"} " +
                                       std::to_string(processed)));

  // No live consumer is configured.
  auto live = server.Client().Get("/admin/jetstream/status");
  ASSERT_TRUE(live);
  EXPECT_EQ(live->status, 200);
  EXPECT_THAT(live->body, HasSubstr("\"configured\":false"));

  // Unknown jobs, and what a completed job does not allow.
  EXPECT_EQ(server.Client().Get("/admin/backfill/999")->status, 404);
  EXPECT_EQ(
      server.Client().Post("/admin/backfill/" + std::to_string(id) + "/pause", "", "")->status,
      409);
  EXPECT_EQ(server.Client()
                .Post("/admin/backfill/" + std::to_string(id) + "/retry-failed", "", "")
                ->status,
            409);

  // Clearing the details of the finished job removes its recent repos, not the job.
  auto cleared = server.Client().Delete("/admin/backfill/" + std::to_string(id) + "/details");
  ASSERT_TRUE(cleared);
  EXPECT_EQ(cleared->status, 200) << cleared->body;
  auto after = server.Client().Get("/admin/backfill/" + std::to_string(id));
  ASSERT_TRUE(after);
  EXPECT_THAT(after->body, HasSubstr("\"recent\":[]"));
  EXPECT_THAT(after->body, HasSubstr("\"details_cleared\""));
  EXPECT_EQ(NumberAfter(after->body, "records_written"), written);

  auto stopped = server.Stop();
  EXPECT_EQ(stopped.exit_code, 0) << stopped.err;
}

// Every line of an `atfill run` process names the verb the user typed, whoever started the job
// (the command line here); the job records who did.
TEST(AdminRunTest, ABackfillFromTheCommandLineIsReportedAsTheRunsOwn) {
  auto net = simnet::Simnet::Start(Network(1));
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  Server server(**net, "", false, {"--backfill"});
  ASSERT_NE(server.port(), 0) << server.log();
  ASSERT_TRUE(
      testing::WaitUntil([&] { return server.log().find("job 1 completed") != std::string::npos; },
                         std::chrono::seconds(60)))
      << server.log();
  const std::string log = server.log();
  EXPECT_THAT(log, HasSubstr("atfill run: backfill job 1 crawls 1 collection(s)"));
  EXPECT_THAT(log, HasSubstr("atfill run: job 1 completed"));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("atfill cli:")));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("atfill api:")));
  auto job = server.Client().Get("/admin/backfill/1");
  ASSERT_TRUE(job);
  EXPECT_THAT(job->body, HasSubstr("\"started_by\":\"cli\""));
}

TEST(AdminRunTest, PauseResumeAndCancelSteerRunningJobs) {
  // Slow hosts, so the jobs are still running when they are steered.
  auto net = simnet::Simnet::Start(Network(150));
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  Server server(**net);
  ASSERT_NE(server.port(), 0) << server.log();
  auto started = server.Client().Post(
      "/admin/backfill", R"({"collections":["app.bsky.feed.post"]})", "application/json");
  ASSERT_TRUE(started);
  ASSERT_EQ(started->status, 202) << started->body;
  const std::string id = std::to_string(NumberAfter(started->body, "id"));

  auto pause = server.Client().Post("/admin/backfill/" + id + "/pause", "", "");
  ASSERT_TRUE(pause);
  EXPECT_EQ(pause->status, 202) << pause->body;
  EXPECT_THAT(pause->body, HasSubstr("\"status\":\"pausing\""));
  const std::string paused = WaitForStatus(server, std::stoull(id), "paused");
  const uint64_t at_pause = NumberAfter(paused, "records_written");
  EXPECT_EQ(server.Client().Post("/admin/backfill/" + id + "/pause", "", "")->status, 202);

  auto resume = server.Client().Post("/admin/backfill/" + id + "/resume", "", "");
  ASSERT_TRUE(resume);
  EXPECT_EQ(resume->status, 202) << resume->body;
  EXPECT_EQ(server.Client().Post("/admin/backfill/" + id + "/resume", "", "")->status, 409);
  const std::string done = WaitForStatus(server, std::stoull(id), "completed");
  EXPECT_GE(NumberAfter(done, "records_written"), at_pause);
  EXPECT_EQ(NumberAfter(done, "records_written"), Rows(server.dir() / "db.sqlite"));
  // Units resolved before the pause but fetched after it count once.
  EXPECT_GT(NumberAfter(done, "total_repos"), 0u) << done;
  EXPECT_EQ(NumberAfter(done, "resolved_repos"), NumberAfter(done, "total_repos")) << done;
  EXPECT_EQ(NumberAfter(done, "processed_repos"), NumberAfter(done, "total_repos")) << done;

  // A second job (other targets) cancelled while it runs.
  auto second = server.Client().Post("/admin/backfill", R"({"collections":["app.bsky.feed.like"]})",
                                     "application/json");
  ASSERT_TRUE(second);
  ASSERT_EQ(second->status, 202) << second->body;
  const std::string id2 = std::to_string(NumberAfter(second->body, "id"));
  EXPECT_NE(id2, id);
  auto cancel = server.Client().Post("/admin/backfill/" + id2 + "/cancel", "", "");
  ASSERT_TRUE(cancel);
  EXPECT_EQ(cancel->status, 202) << cancel->body;
  WaitForStatus(server, std::stoull(id2), "cancelled");
  EXPECT_EQ(server.Client().Post("/admin/backfill/" + id2 + "/resume", "", "")->status, 409);

  auto list = server.Client().Get("/admin/backfill");
  ASSERT_TRUE(list);
  EXPECT_EQ(list->status, 200);
  // Newest first.
  EXPECT_LT(list->body.find("\"id\":" + id2), list->body.find("\"id\":" + id));
  auto clear_all = server.Client().Delete("/admin/backfill/details");
  ASSERT_TRUE(clear_all);
  EXPECT_EQ(clear_all->status, 200);
  EXPECT_THAT(clear_all->body, HasSubstr("\"cleared\":2"));
  EXPECT_EQ(server.Stop().exit_code, 0);
}

// A network whose Jetstream serves 2000 events.
simnet::SimnetOptions LiveNetwork() {
  simnet::SimnetOptions so = Network(0);
  so.jetstream.events = 2000;
  return so;
}

// The [live] section that follows `net`'s Jetstream from its first event; `more`: further keys.
std::string LiveSection(const simnet::Simnet& net, const std::string& more = "") {
  return "[live]\nhosts = [\"" + net.jetstream_url() + "\"]\nallow_private_endpoints = true\n" +
         more + "start_seq = 1\ncheck_deleted_accounts = false\n";
}

// With [live] set, the same process runs the live consumer; the API shows its state.
TEST(AdminRunTest, TheLiveConsumersStateIsServed) {
  auto net = simnet::Simnet::Start(LiveNetwork());
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  Server server(**net, LiveSection(**net, "idle_exit_ms = 1000\n"));
  ASSERT_NE(server.port(), 0) << server.log();
  const std::string live = Poll(server, "/admin/jetstream/status", [](const std::string& body) {
    return NumberAfter(body, "cursor") == 2000;
  });
  EXPECT_THAT(live, HasSubstr("\"configured\":true"));
  EXPECT_EQ(NumberAfter(live, "cursor"), 2000u) << live;
  EXPECT_EQ(StringAfter(live, "host"), (*net)->jetstream_url());
  EXPECT_FALSE(StringAfter(live, "protocol").empty()) << live;  // as configured ("auto")
  EXPECT_GT(NumberAfter(live, "job_id"), 0u);
  // The stream went quiet (idle_exit_ms): the consumer paused, the server keeps serving.
  auto jobs = server.Client().Get("/admin/backfill");
  ASSERT_TRUE(jobs);
  EXPECT_EQ(jobs->status, 200);
  EXPECT_THAT(jobs->body, HasSubstr("\"kind\":\"live\""));
  EXPECT_EQ(server.Stop().exit_code, 0);
}

// The names of the samples in a Prometheus text exposition (comment lines left out).
std::set<std::string> SampleNames(const std::string& scrape) {
  std::set<std::string> names;
  std::istringstream lines(scrape);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    names.insert(line.substr(0, line.find_first_of("{ ")));
  }
  return names;
}

// The PromQL queries of the Grafana dashboard: each panel's (rows' nested panels too) and the
// template variables', each with where it is.
void DashboardQueries(simdjson::dom::array panels,
                      std::vector<std::pair<std::string, std::string>>* out) {
  for (simdjson::dom::element panel : panels) {
    std::string_view title;
    if (panel["title"].get(title) != simdjson::SUCCESS) title = "(untitled)";
    simdjson::dom::array nested;
    if (panel["panels"].get(nested) == simdjson::SUCCESS) DashboardQueries(nested, out);
    simdjson::dom::array targets;
    if (panel["type"].get_string().value_unsafe() == "row") continue;
    ASSERT_EQ(panel["targets"].get(targets), simdjson::SUCCESS) << "panel " << title;
    size_t queries = 0;
    for (simdjson::dom::element target : targets) {
      std::string_view expr;
      ASSERT_EQ(target["expr"].get(expr), simdjson::SUCCESS) << "panel " << title;
      out->emplace_back("panel \"" + std::string(title) + "\"", std::string(expr));
      ++queries;
    }
    EXPECT_GT(queries, 0u) << "panel " << title << " queries nothing";
  }
}

// contrib/grafana/atfill.json against a real scrape of `atfill run` with a live consumer: every
// metric a panel or variable queries is served, so renaming a metric fails here instead of
// leaving a panel empty; and the panels cover what the dashboard is for.
TEST(AdminRunTest, TheGrafanaDashboardQueriesOnlyMetricsARunningAtfillServes) {
  auto net = simnet::Simnet::Start(LiveNetwork());
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  Server server(**net, LiveSection(**net));
  ASSERT_NE(server.port(), 0) << server.log();
  // The live lag is served once the consumer has seen the stream.
  const std::string scrape = Poll(server, "/metrics", [](const std::string& body) {
    return SampleNames(body).count("atfill_live_lag_seconds") == 1;
  });
  const std::set<std::string> served = SampleNames(scrape);

  const std::string text = Slurp(ATFILL_GRAFANA_DASHBOARD);
  simdjson::dom::parser parser;
  simdjson::dom::element dashboard;
  ASSERT_EQ(parser.parse(simdjson::padded_string(text)).get(dashboard), simdjson::SUCCESS)
      << ATFILL_GRAFANA_DASHBOARD << " is not JSON";
  std::vector<std::pair<std::string, std::string>> queries;
  simdjson::dom::array panels;
  ASSERT_EQ(dashboard["panels"].get(panels), simdjson::SUCCESS);
  DashboardQueries(panels, &queries);
  simdjson::dom::array variables;
  ASSERT_EQ(dashboard["templating"]["list"].get(variables), simdjson::SUCCESS);
  for (simdjson::dom::element variable : variables) {
    std::string_view definition;
    if (variable["definition"].get(definition) == simdjson::SUCCESS) {
      queries.emplace_back("variable " + std::string(variable["name"].get_string().value_unsafe()),
                           std::string(definition));
    }
  }

  const std::regex metric(R"(\batfill_[a-z0-9_]+)");
  std::set<std::string> queried;
  for (const auto& [where, query] : queries) {
    size_t names = 0;
    for (auto it = std::sregex_iterator(query.begin(), query.end(), metric);
         it != std::sregex_iterator(); ++it, ++names) {
      queried.insert(it->str());
      EXPECT_EQ(served.count(it->str()), 1u)
          << where << " queries " << it->str() << ", which /metrics does not serve: " << query;
    }
    EXPECT_GT(names, 0u) << where << " names no atfill metric: " << query;
  }
  for (const char* wanted :
       {"atfill_stage_events_total", "atfill_stage_records_total", "atfill_errors_total",
        "atfill_sink_batch_seconds_bucket", "atfill_live_lag_seconds", "atfill_jobs"}) {
    EXPECT_EQ(queried.count(wanted), 1u) << "no panel charts " << wanted;
  }
  EXPECT_EQ(server.Stop().exit_code, 0);
}

// The retention task clears the details of backfills finished longer ago than
// backfill_retention_days when `atfill run` starts (then daily); the job and its counts stay.
TEST(AdminRunTest, RetentionClearsTheDetailsOfOldFinishedJobs) {
  auto net = simnet::Simnet::Start(Network(0));
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  // 0.000000001 days is under 0.1 ms: the job finished before the server process started is old
  // enough by the time its retention task runs.
  Server server(**net, "[jobs]\nbackfill_retention_days = 0.000000001\n", /*backfill_first=*/true);
  ASSERT_NE(server.port(), 0) << server.log();
  const std::string job = Poll(server, "/admin/backfill/1", [](const std::string& body) {
    return body.find("details_cleared") != std::string::npos;
  });
  EXPECT_THAT(job, HasSubstr("\"details_cleared\""));
  EXPECT_THAT(job, HasSubstr("\"recent\":[]"));
  EXPECT_THAT(job, HasSubstr("\"status\":\"completed\""));
  EXPECT_EQ(NumberAfter(job, "records_written"), Rows(server.dir() / "db.sqlite"));
  EXPECT_THAT(server.log(), HasSubstr("retention: cleared the details of 1 backfill job(s)"));
  EXPECT_EQ(server.Stop().exit_code, 0);
}

// A person's path through the dashboard in headless Chromium: token, start a backfill, watch it
// complete; the page's numbers equal the API's and the table's; the job's rate chart (from its
// audit trail), work units and per-PDS bars, the live consumer's lag chart, and the recent repos
// paged 20 at a time. Saves a screenshot.
TEST(DashboardTest, ABackfillStartedFromThePageIsFollowedToCompletion) {
  // playwright-core from the npm registry, installed once into the build folder.
  const std::filesystem::path e2e = ATFILL_E2E_HOME;
  if (!std::filesystem::exists(e2e / "node_modules" / "playwright-core" / "package.json")) {
    std::filesystem::create_directories(e2e);
    std::filesystem::copy_file(ATFILL_E2E_SOURCE "/package.json", e2e / "package.json",
                               std::filesystem::copy_options::overwrite_existing);
    std::filesystem::copy_file(ATFILL_E2E_SOURCE "/package-lock.json", e2e / "package-lock.json",
                               std::filesystem::copy_options::overwrite_existing);
    auto install = testing::RunProcess(
        {"/bin/sh", "-c", "cd '" + e2e.string() + "' && npm ci --no-audit --no-fund"}, e2e,
        std::chrono::seconds(300));
    ASSERT_EQ(install.exit_code, 0) << install.out << install.err;
  }
  // The script beside its node_modules (an ES module resolves imports from its own folder).
  std::filesystem::copy_file(ATFILL_E2E_SOURCE "/dashboard.mjs", e2e / "dashboard.mjs",
                             std::filesystem::copy_options::overwrite_existing);
  ASSERT_TRUE(std::filesystem::exists("/usr/bin/chromium"))
      << "the dashboard test needs Debian's chromium package (tools/setup installs it)";

  simnet::SimnetOptions so = Network(40);
  so.jetstream.events = 2000;
  auto net = simnet::Simnet::Start(so);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  // A live consumer of likes beside the backfill of posts, for the lag chart.
  Server server(**net, "[jobs]\nrecord_batches = true\n[live]\nhosts = [\"" +
                           (*net)->jetstream_url() +
                           "\"]\ncollections = [\"app.bsky.feed.like\"]\n"
                           "allow_private_endpoints = true\nidle_exit_ms = 1000\n"
                           "start_seq = 1\ncheck_deleted_accounts = false\n");
  ASSERT_NE(server.port(), 0) << server.log();
  const std::filesystem::path shot = std::filesystem::path(ATFILL_TEST_ARTIFACTS) / "dashboard.png";
  std::filesystem::create_directories(shot.parent_path());
  std::filesystem::remove(shot);
  // A record lexicon pasted into the lexicons panel, then removed.
  const std::filesystem::path lexicon = server.dir() / "note.json";
  testing::WriteFile(lexicon,
                     R"({"lexicon":1,"id":"com.example.note","defs":{"main":{"type":"record",)"
                     R"("key":"tid","record":{"type":"object","properties":{}}}}})");
  auto drive = testing::RunProcess(
      {"/bin/sh", "-c",
       "exec node '" + (e2e / "dashboard.mjs").string() + "' '" + server.url() + "' '" + kToken +
           "' " + kPost + " '" + shot.string() + "' " + kPost + " '" + lexicon.string() + "'"},
      server.dir(), std::chrono::seconds(240));
  ASSERT_EQ(drive.exit_code, 0) << drive.out << drive.err << server.log();
  const std::string& page = drive.out;
  EXPECT_THAT(page, HasSubstr("The server refused the token"));
  EXPECT_EQ(StringAfter(page, "status"), "completed") << page;
  EXPECT_EQ(StringAfter(page, "detail_status"), "completed") << page;
  EXPECT_THAT(page, HasSubstr("\"console_errors\":[]"));
  EXPECT_THAT(page, HasSubstr("\"token_panel_visible\":false"));  // once the token is taken
  EXPECT_THAT(page, HasSubstr("\"pause_enabled\":false"));
  const uint64_t id = NumberAfter(page, "id");

  // The page's numbers are the API's and the table's.
  auto job = server.Client().Get("/admin/backfill/" + std::to_string(id));
  ASSERT_TRUE(job);
  ASSERT_EQ(job->status, 200);
  const uint64_t written = NumberAfter(job->body, "records_written");
  EXPECT_GT(written, 100u);
  EXPECT_EQ(written, RowsOf(server.dir() / "db.sqlite", kPost));
  auto digits = [](std::string s) {
    s.erase(std::remove(s.begin(), s.end(), ','), s.end());
    return std::strtoull(s.c_str(), nullptr, 10);
  };
  EXPECT_EQ(digits(StringAfter(page, "records")), written) << page;
  EXPECT_EQ(digits(StringAfter(page, "detail_records")), written) << page;
  EXPECT_EQ(NumberAfter(page, "hosts"), 4u) << page;
  EXPECT_THAT(page, HasSubstr("completed")) << page;
  // The rate chart is drawn from the audit trail, a line with a rise in it.
  EXPECT_THAT(page, HasSubstr("\"source\":\"batches\"")) << page;
  EXPECT_GE(NumberAfter(page, "points"), 2u) << page;
  EXPECT_GE(NumberAfter(page, "line_points"), 2u) << page;
  EXPECT_GT(NumberAfter(page, "line_height"), 0u) << page;
  // The work-unit bars show the job's counters.
  const uint64_t units = NumberAfter(job->body, "total_repos");
  EXPECT_GT(units, 0u) << job->body;
  EXPECT_EQ(NumberAfter(page, "discovered"), units) << page;
  EXPECT_EQ(NumberAfter(page, "resolved"), units) << page;
  EXPECT_EQ(NumberAfter(page, "fetched"), units) << page;
  // One bar per PDS, each with its done part drawn.
  const std::regex bar(R"re(\{"done":(\d+),"width":([0-9.]+)\})re");
  size_t bars = 0;
  for (auto it = std::sregex_iterator(page.begin(), page.end(), bar); it != std::sregex_iterator();
       ++it, ++bars) {
    EXPECT_GT(std::stoull((*it)[1]), 0u) << page;
    EXPECT_GT(std::stod((*it)[2]), 0.0) << page;
  }
  EXPECT_EQ(bars, 4u) << page;
  // The lag chart has samples and a line.
  EXPECT_GE(NumberAfter(page, "lag_points"), 3u) << page;
  EXPECT_EQ(NumberAfter(page, "lag_line"), 1u) << page;
  // The recent repos: 20 on the first page, a next page with 20 others.
  ASSERT_GT(units, 40u) << job->body;
  EXPECT_EQ(NumberAfter(page, "recent"), 20u) << page;
  EXPECT_THAT(StringAfter(page, "recent_page"), ::testing::StartsWith("page 1 of ")) << page;
  EXPECT_THAT(page, HasSubstr("\"recent_prev_enabled\":false")) << page;
  EXPECT_THAT(page, HasSubstr("\"recent_next_enabled\":true")) << page;
  EXPECT_THAT(StringAfter(page, "recent_page2"), ::testing::StartsWith("page 2 of ")) << page;
  EXPECT_EQ(NumberAfter(page, "recent_page2_rows"), 20u) << page;
  EXPECT_EQ(NumberAfter(page, "recent_pages_overlap"), 0u) << page;
  EXPECT_THAT(page, HasSubstr("\"recent_page2_prev_enabled\":true")) << page;
  // Posts added to the live consumer (which took likes) from the collections panel: their backfill
  // job starts, is followed on the page to its end, and the page lists both collections.
  EXPECT_THAT(page, HasSubstr(R"("live_collections_before":["app.bsky.feed.like"])")) << page;
  EXPECT_THAT(page,
              HasSubstr(R"("live_collections_after":["app.bsky.feed.like","app.bsky.feed.post"])"))
      << page;
  const uint64_t added_job = NumberAfter(page, "collections_job");
  EXPECT_NE(added_job, id) << page;
  EXPECT_EQ(StringAfter(page, "collections_job_status"), "completed") << page;
  auto added = server.Client().Get("/admin/backfill/" + std::to_string(added_job));
  ASSERT_TRUE(added);
  EXPECT_THAT(added->body, HasSubstr("app.bsky.feed.post")) << added->body;
  auto listed = server.Client().Get("/admin/collections");
  ASSERT_TRUE(listed);
  EXPECT_EQ(listed->body, R"({"collections":["app.bsky.feed.like","app.bsky.feed.post"]})");
  // The lexicons panel: a document that is not one is refused with the server's reason; the
  // record lexicon is added, listed, its NSID followed by the live consumer, then removed.
  EXPECT_THAT(page, HasSubstr(R"x("errors_for_refused_lexicon":["Failed to load resource: the )x"
                              R"x(server responded with a status of 400 (Bad Request)"])x"))
      << page;
  EXPECT_THAT(StringAfter(page, "lexicon_refused"),
              ::testing::StartsWith("Not added: not a valid lexicon: id 'not-an-nsid'"))
      << page;
  EXPECT_EQ(StringAfter(page, "lexicon_message"),
            "Lexicon com.example.note added. Collections now: app.bsky.feed.like, "
            "app.bsky.feed.post, com.example.note.")
      << page;
  EXPECT_THAT(StringAfter(page, "lexicons_listed"),
              HasSubstr("com.example.note (record, from api)"))
      << page;
  EXPECT_THAT(page, HasSubstr(R"("live_collections_with_lexicon":["app.bsky.feed.like",)"
                              R"("app.bsky.feed.post","com.example.note"])"))
      << page;
  EXPECT_EQ(StringAfter(page, "lexicon_removed"),
            "Lexicon com.example.note removed. Collections now: app.bsky.feed.like, "
            "app.bsky.feed.post.")
      << page;
  // The screenshot is a real PNG of the page.
  const std::string png = Slurp(shot);
  ASSERT_GT(png.size(), 10'000u);
  EXPECT_EQ(png.substr(1, 3), "PNG");
  EXPECT_EQ(server.Stop().exit_code, 0);
}

}  // namespace
}  // namespace atfill
