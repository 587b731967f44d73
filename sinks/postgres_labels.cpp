#include <chrono>
#include <cstdlib>
#include <string>
#include <utility>

#include "sinks/label_sinks.hpp"
#include "sinks/postgres_schema.hpp"
#include "sinks/postgres_util.hpp"

namespace atfill::sinks {
namespace {

using pg::Clock;
using pg::Failure;

// Labels come a few at a time: one statement per label or negation (both are rows: see
// label_sinks.hpp), in one transaction per batch.
class PostgresLabelSink final : public pipeline::LabelSink {
 public:
  explicit PostgresLabelSink(PostgresSinkOptions options) : options_(std::move(options)) {
    const std::string rows = pg::QualifiedName(options_.schema, "atfill_label_rows");
    upsert_sql_ =
        "INSERT INTO " + rows +
        " AS l (uri, src, val, cid, cts, cts_us, exp, exp_us, neg, indexed_at) VALUES ($1, "
        "$2, $3, $4, $5, $6::bigint, $7, $8::bigint, $9::boolean, (extract(epoch FROM "
        "clock_timestamp()) * 1000000)::bigint) ON CONFLICT (uri, src, val) DO UPDATE SET cid = "
        "excluded.cid, cts = excluded.cts, cts_us = excluded.cts_us, exp = excluded.exp, exp_us = "
        "excluded.exp_us, neg = excluded.neg, indexed_at = excluded.indexed_at WHERE "
        "excluded.cts_us >= l.cts_us";
  }

  Status Connect() {
    const auto deadline = Clock::now() + std::chrono::milliseconds(options_.connect_timeout_ms);
    auto conn = pg::Connect(options_.conninfo, deadline);
    if (!conn.ok()) {
      return conn.status().WithContext("connecting to PostgreSQL " +
                                       pg::DescribeConninfo(options_.conninfo));
    }
    Status st = pg::MigrateSchema(conn->get(), options_.schema, options_.log);
    if (!st.ok()) return st.WithContext("schema " + options_.schema + " of " + Describe());
    conn_ = std::move(*conn);
    return Status::OK();
  }

  Result<pipeline::LabelWriteStats> WriteLabels(std::span<const pipeline::Label> labels) override {
    pipeline::LabelWriteStats stats;
    if (labels.empty()) return stats;
    if (conn_ == nullptr) {
      Status st = Connect();
      if (!st.ok()) return Status::Unavailable(st.message() + "; no label was written");
    }
    Failure failure = Failure::kNone;
    PGconn* c = conn_.get();
    Status st = pg::Exec(c, "BEGIN", &failure);
    for (size_t i = 0; st.ok() && i < labels.size(); ++i) {
      st = Apply(labels[i], &stats, &failure);
    }
    if (st.ok()) st = pg::Exec(c, "COMMIT", &failure);
    if (st.ok()) return stats;
    if (failure == Failure::kConnection) {
      conn_.reset();
    } else if (PQtransactionStatus(c) != PQTRANS_IDLE) {
      (void)pg::Exec(c, "ROLLBACK", nullptr);
    }
    if (failure != Failure::kOther) {
      return Status::Unavailable("writing labels to PostgreSQL " + Describe() + ": " +
                                 st.message());
    }
    return st.WithContext("writing labels to PostgreSQL " + Describe());
  }

  std::string Describe() const override {
    return "postgres:" + pg::DescribeConninfo(options_.conninfo);
  }

 private:
  Status Apply(const pipeline::Label& l, pipeline::LabelWriteStats* stats, Failure* failure) {
    const std::string cts_us = std::to_string(l.cts_us);
    const std::string exp_us = std::to_string(l.exp_us);
    if (!pg::IsStorableText(l.uri) || !pg::IsStorableText(l.val) || !pg::IsStorableText(l.cid)) {
      return Status::Invalid("the label " + l.val + " of " + l.uri + " holds a NUL byte");
    }
    Result<pg::PgResult> r = pg::Query(
        conn_.get(), upsert_sql_,
        {l.uri.c_str(), l.src.c_str(), l.val.c_str(), l.cid.empty() ? nullptr : l.cid.c_str(),
         l.cts.c_str(), cts_us.c_str(), l.exp.empty() ? nullptr : l.exp.c_str(),
         l.exp.empty() ? nullptr : exp_us.c_str(), l.neg ? "true" : "false"},
        failure);
    if (!r.ok()) return r.status();
    const char* tuples = PQcmdTuples(r->get());
    const uint64_t changed = tuples != nullptr ? std::strtoull(tuples, nullptr, 10) : 0;
    stats->Count(l, changed);
    return Status::OK();
  }

  PostgresSinkOptions options_;
  std::string upsert_sql_;
  pg::Conn conn_;
};

}  // namespace

Result<std::unique_ptr<pipeline::LabelSink>> OpenPostgresLabelSink(
    const PostgresSinkOptions& options) {
  ATFILL_RETURN_IF_ERROR(options.Validate());
  auto sink = std::make_unique<PostgresLabelSink>(options);
  ATFILL_RETURN_IF_ERROR(sink->Connect());
  return std::unique_ptr<pipeline::LabelSink>(std::move(sink));
}

}  // namespace atfill::sinks
