// Labels: the subscribeLabels frame decoder and signature check, the label sinks' rules on real
// SQLite and PostgreSQL databases, and `atfill run` following simnet's labeler over loopback:
// labels land, negations remove, expired labels are hidden, bad signatures are refused, and a run
// killed with SIGKILL and restarted ends with nothing lost and nothing doubled.
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "atproto/cbor.hpp"
#include "atproto/crypto.hpp"
#include "atproto/syntax.hpp"
#include "sinks/label_sinks.hpp"
#include "sources/labels/label_frames.hpp"
#include "tests/common/job_harness.hpp"
#include "tests/common/pg_server.hpp"
#include "tests/common/process.hpp"
#include "tests/common/test_util.hpp"
#include "tools/simnet/labeler.hpp"
#include "tools/simnet/simnet.hpp"

namespace atfill {
namespace {

using pipeline::Label;
using sources::DecodeLabelFrame;
using sources::LabelFrame;
using testing::TempDir;

int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

atproto::PrivateKey Key(uint8_t fill) {
  Bytes scalar(32, fill);
  return *atproto::PrivateKey::FromBytes(atproto::KeyType::kSecp256k1, scalar);
}

Label MakeLabel(std::string uri, std::string val, std::string cts, bool neg = false,
                std::string exp = "") {
  Label l;
  l.src = "did:plc:labelerlabelerlabelerla";
  l.uri = std::move(uri);
  l.val = std::move(val);
  l.neg = neg;
  l.cts = std::move(cts);
  l.exp = std::move(exp);
  return l;
}

Bytes Signed(const Label& l, const atproto::PrivateKey& key) {
  auto sig = key.Sign(sources::EncodeLabel(l, {}));
  EXPECT_TRUE(sig.ok());
  return sources::EncodeLabel(l, *sig);
}

// --- frames ---

TEST(LabelFramesTest, ALabelsFrameDecodesAndItsSignatureVerifies) {
  const auto key = Key(7);
  Label l = MakeLabel("at://did:plc:abc/app.bsky.feed.post/1", "spam", "2025-01-02T03:04:05.000Z",
                      false, "2099-01-01T00:00:00Z");
  l.cid = "bafyreib2rxk3rh6kzwq";
  const Bytes frame = sources::EncodeLabelsFrame(42, {Signed(l, key)});
  auto decoded = DecodeLabelFrame(frame);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ASSERT_EQ(decoded->kind, LabelFrame::Kind::kLabels);
  EXPECT_EQ(decoded->seq, 42);
  ASSERT_EQ(decoded->labels.size(), 1u);
  const Label& got = decoded->labels[0].label;
  EXPECT_EQ(got.uri, l.uri);
  EXPECT_EQ(got.val, "spam");
  EXPECT_EQ(got.cid, l.cid);
  EXPECT_FALSE(got.neg);
  EXPECT_EQ(got.cts_us, 1735787045000000);
  EXPECT_EQ(got.exp, "2099-01-01T00:00:00Z");
  EXPECT_EQ(got.exp_us, 4070908800000000);
  std::string kind;
  EXPECT_TRUE(sources::VerifyLabel(decoded->labels[0], l.src, key.public_key(), &kind).ok());
}

TEST(LabelFramesTest, AnotherKeyAnAlteredFieldOrAnotherSourceIsRefused) {
  const auto key = Key(7);
  const Label l = MakeLabel("did:plc:abc", "rude", "2025-01-02T03:04:05Z");
  std::string kind;
  // Signed by another key.
  auto other = DecodeLabelFrame(sources::EncodeLabelsFrame(1, {Signed(l, Key(9))}));
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(sources::VerifyLabel(other->labels[0], l.src, key.public_key(), &kind).ok());
  EXPECT_EQ(kind, "bad_signature");
  // The right signature over another value.
  auto sig = key.Sign(sources::EncodeLabel(l, {}));
  ASSERT_TRUE(sig.ok());
  Label altered = l;
  altered.val = "spam";
  auto changed =
      DecodeLabelFrame(sources::EncodeLabelsFrame(1, {sources::EncodeLabel(altered, *sig)}));
  ASSERT_TRUE(changed.ok());
  kind.clear();
  EXPECT_FALSE(sources::VerifyLabel(changed->labels[0], l.src, key.public_key(), &kind).ok());
  EXPECT_EQ(kind, "bad_signature");
  // No signature at all.
  auto bare = DecodeLabelFrame(sources::EncodeLabelsFrame(1, {sources::EncodeLabel(l, {})}));
  ASSERT_TRUE(bare.ok());
  kind.clear();
  EXPECT_FALSE(sources::VerifyLabel(bare->labels[0], l.src, key.public_key(), &kind).ok());
  EXPECT_EQ(kind, "bad_signature");
  // Well signed, but by a labeler the stream does not belong to.
  auto good = DecodeLabelFrame(sources::EncodeLabelsFrame(1, {Signed(l, key)}));
  ASSERT_TRUE(good.ok());
  kind.clear();
  EXPECT_FALSE(
      sources::VerifyLabel(good->labels[0], "did:plc:someoneelse", key.public_key(), &kind).ok());
  EXPECT_EQ(kind, "wrong_source");
}

// A label map as another labeler may send it: the schema's fields (signed as the spec says, over
// them alone) plus `extra` fields, with `ver` replaced when `ver` is set (absent when null).
Bytes WithFields(const Label& l, const atproto::PrivateKey& key,
                 std::vector<std::pair<std::string, atproto::Value>> extra,
                 std::optional<atproto::Value> ver = atproto::Value::Int(1)) {
  auto sig = key.Sign(sources::EncodeLabel(l, {}));
  EXPECT_TRUE(sig.ok());
  auto map = atproto::DecodeCbor(sources::EncodeLabel(l, *sig));
  EXPECT_TRUE(map.ok());
  atproto::Value::Map fields;
  for (auto& [k, v] : map->as_map()) {
    if (k != "ver") fields.emplace_back(k, v);
  }
  if (ver.has_value()) fields.emplace_back("ver", *ver);
  for (auto& f : extra) fields.push_back(std::move(f));
  return atproto::EncodeCbor(atproto::Value::MakeMap(std::move(fields)));
}

TEST(LabelFramesTest, TheSignatureCoversTheSchemaFieldsOnlyNotTypeNorUnknownFields) {
  const auto key = Key(7);
  Label l = MakeLabel("at://did:plc:abc/app.bsky.actor.profile/self", "sensitive",
                      "2025-04-28T10:00:00.000Z");
  l.cid = "bafyreib2rxk3rh6kzwq";
  using atproto::Value;
  const Bytes label = WithFields(
      l, key,
      {{"$type", Value::String("com.atproto.label.defs#label")},
       {"reason", Value::MakeMap({{"note", Value::String("added by a later schema")}})}});
  auto decoded = DecodeLabelFrame(sources::EncodeLabelsFrame(6601, {label}));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ASSERT_EQ(decoded->labels.size(), 1u);
  std::string kind;
  Status st = sources::VerifyLabel(decoded->labels[0], l.src, key.public_key(), &kind);
  EXPECT_TRUE(st.ok()) << kind << ": " << st.ToString();
  EXPECT_EQ(decoded->labels[0].label.val, "sensitive");
  // A schema field is still covered: the same signature over another cid is refused.
  Label other = l;
  other.cid = "bafyreib2rxk3rh6kzwr";
  auto sig = key.Sign(sources::EncodeLabel(l, {}));
  ASSERT_TRUE(sig.ok());
  auto changed =
      DecodeLabelFrame(sources::EncodeLabelsFrame(1, {sources::EncodeLabel(other, *sig)}));
  ASSERT_TRUE(changed.ok());
  kind.clear();
  EXPECT_FALSE(sources::VerifyLabel(changed->labels[0], l.src, key.public_key(), &kind).ok());
  EXPECT_EQ(kind, "bad_signature");
}

TEST(LabelFramesTest, ALabelWithoutVerOrOfAnotherVersionIsRefusedWithItsReason) {
  const auto key = Key(7);
  const Label l = MakeLabel("did:plc:abc", "rude", "2025-01-02T03:04:05Z");
  using atproto::Value;
  auto decoded = DecodeLabelFrame(sources::EncodeLabelsFrame(
      9, {WithFields(l, key, {}, Value::Int(2)), WithFields(l, key, {}, std::nullopt),
          WithFields(l, key, {}, Value::String("1")), WithFields(l, key, {})}));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ASSERT_EQ(decoded->errors.size(), 3u);
  for (const auto& e : decoded->errors) EXPECT_EQ(e.kind, "bad_version") << e.message;
  EXPECT_EQ(decoded->errors[0].key, "seq 9 label 0");
  EXPECT_NE(decoded->errors[0].message.find("ver is 2, not 1"), std::string::npos);
  EXPECT_NE(decoded->errors[1].message.find("no ver"), std::string::npos);
  EXPECT_NE(decoded->errors[2].message.find("not an integer"), std::string::npos);
  ASSERT_EQ(decoded->labels.size(), 1u);
  std::string kind;
  EXPECT_TRUE(sources::VerifyLabel(decoded->labels[0], l.src, key.public_key(), &kind).ok());
}

TEST(LabelFramesTest, InfoErrorAndMalformedFramesAreToldApart) {
  auto info = DecodeLabelFrame(sources::EncodeInfoFrame("OutdatedCursor", "too old"));
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->kind, LabelFrame::Kind::kInfo);
  EXPECT_EQ(info->name, "OutdatedCursor");
  EXPECT_EQ(info->message, "too old");
  auto error = DecodeLabelFrame(sources::EncodeErrorFrame("FutureCursor", ""));
  ASSERT_TRUE(error.ok());
  EXPECT_EQ(error->kind, LabelFrame::Kind::kError);
  EXPECT_EQ(error->name, "FutureCursor");
  // A header alone, a truncated frame, a body that is not a map, a label that is not one.
  const Bytes frame = sources::EncodeInfoFrame("x", "");
  size_t header = 0;
  ASSERT_TRUE(atproto::DecodeCborPrefix(frame, &header).ok());
  EXPECT_FALSE(DecodeLabelFrame(ByteView(frame.data(), header)).ok());
  EXPECT_FALSE(DecodeLabelFrame(ByteView(frame.data(), frame.size() - 1)).ok());
  EXPECT_FALSE(DecodeLabelFrame(ByteView()).ok());
  using atproto::Value;
  Bytes not_map =
      atproto::EncodeCbor(Value::MakeMap({{"op", Value::Int(1)}, {"t", Value::String("#labels")}}));
  atproto::EncodeCbor(Value::Int(3), &not_map);
  EXPECT_FALSE(DecodeLabelFrame(not_map).ok());
  Bytes no_seq =
      atproto::EncodeCbor(Value::MakeMap({{"op", Value::Int(1)}, {"t", Value::String("#labels")}}));
  atproto::EncodeCbor(Value::MakeMap({{"labels", Value::MakeArray()}}), &no_seq);
  EXPECT_FALSE(DecodeLabelFrame(no_seq).ok());
  Bytes bad_label =
      atproto::EncodeCbor(Value::MakeMap({{"op", Value::Int(1)}, {"t", Value::String("#labels")}}));
  atproto::EncodeCbor(
      Value::MakeMap({{"seq", Value::Int(5)},
                      {"labels", Value::MakeArray(
                                     {Value::Int(1), Value::MakeMap({{"val", Value::Int(2)}})})}}),
      &bad_label);
  auto bad = DecodeLabelFrame(bad_label);
  ASSERT_TRUE(bad.ok()) << bad.status().ToString();
  EXPECT_TRUE(bad->labels.empty());
  ASSERT_EQ(bad->errors.size(), 2u);
  EXPECT_EQ(bad->errors[0].kind, "bad_label");
  EXPECT_EQ(bad->errors[1].key, "seq 5 label 1");
}

// --- the sinks' rules ---

// (uri, val, cts, exp) of the view, sorted.
using Row = std::tuple<std::string, std::string, std::string, std::string>;

std::vector<Row> SqliteView(const std::string& path, const char* table = "atfill_labels") {
  std::vector<Row> out;
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  const std::string sql =
      std::string("SELECT uri, val, cts, coalesce(exp, '') FROM ") + table + " ORDER BY uri, val";
  sqlite3_stmt* stmt = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK)
      << sqlite3_errmsg(db);
  while (stmt != nullptr && sqlite3_step(stmt) == SQLITE_ROW) {
    auto text = [&](int i) {
      return std::string(reinterpret_cast<const char*>(sqlite3_column_text(stmt, i)));
    };
    out.emplace_back(text(0), text(1), text(2), text(3));
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return out;
}

std::vector<Row> PgView(const std::string& conninfo, const std::string& schema) {
  std::vector<Row> out;
  auto conn = testing::PgConnection::Open(conninfo);
  EXPECT_TRUE(conn.ok()) << conn.status().ToString();
  if (!conn.ok()) return out;
  auto rows = (*conn)->Rows("SELECT uri, val, cts, coalesce(exp, '') FROM \"" + schema +
                            "\".atfill_labels ORDER BY uri COLLATE \"C\", val COLLATE \"C\"");
  EXPECT_TRUE(rows.ok()) << rows.status().ToString();
  if (!rows.ok()) return out;
  for (auto& r : *rows) out.emplace_back(r[0], r[1], r[2], r[3]);
  return out;
}

// Writes through `sink` the cases of the rules and checks the view `read` gives back.
void CheckLabelRules(pipeline::LabelSink& sink, const std::function<std::vector<Row>()>& read) {
  auto at = [](int s) {
    return "2025-01-01T00:00:" + std::string(s < 10 ? "0" : "") + std::to_string(s) + "Z";
  };
  auto with_us = [](Label l) {
    l.cts_us = atproto::Datetime::Parse(l.cts)->unix_micros();
    if (!l.exp.empty()) l.exp_us = atproto::Datetime::Parse(l.exp)->unix_micros();
    return l;
  };
  std::vector<Label> batch = {
      with_us(MakeLabel("did:plc:a", "spam", at(1))),
      with_us(MakeLabel("did:plc:a", "rude", at(2))),
      with_us(MakeLabel("did:plc:b", "spam", at(3), false, "2025-01-01T00:01:00Z")),  // expired
      with_us(MakeLabel("did:plc:c", "spam", at(4), false, "2099-01-01T00:00:00Z")),
      with_us(MakeLabel("did:plc:a", "rude", at(5), true)),  // negates a/rude
      with_us(MakeLabel("did:plc:d", "spam", at(9))),
      with_us(MakeLabel("did:plc:d", "spam", at(6), true)),  // older than the label: stale
      with_us(MakeLabel("did:plc:e", "spam", at(8))),
      with_us(MakeLabel("did:plc:e", "spam", at(7))),  // older than the stored one: stale
      with_us(MakeLabel("did:plc:f", "misleading", at(10))),
      with_us(MakeLabel("did:plc:f", "misleading", at(20), true)),  // negates f/misleading
      with_us(MakeLabel("did:plc:g", "spam", at(11), true)),        // negates nothing yet
  };
  auto stats = sink.WriteLabels(batch);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->stored, 7u);
  EXPECT_EQ(stats->negated, 3u);
  EXPECT_EQ(stats->stale, 2u);
  const std::vector<Row> want = {{"did:plc:a", "spam", at(1), ""},
                                 {"did:plc:c", "spam", at(4), "2099-01-01T00:00:00Z"},
                                 {"did:plc:d", "spam", at(9), ""},
                                 {"did:plc:e", "spam", at(8), ""}};
  EXPECT_EQ(read(), want);
  // Labels older than the negations already stored, arriving after them (in a later batch, as
  // from a labeler whose history is not in cts order), stay negated.
  const std::vector<Label> late = {
      with_us(MakeLabel("did:plc:f", "misleading", at(15))),
      with_us(MakeLabel("did:plc:g", "spam", at(10))),
      with_us(MakeLabel("did:plc:a", "rude", at(4))),
  };
  auto late_stats = sink.WriteLabels(late);
  ASSERT_TRUE(late_stats.ok()) << late_stats.status().ToString();
  EXPECT_EQ(late_stats->stored, 0u);
  EXPECT_EQ(late_stats->stale, 3u);
  EXPECT_EQ(read(), want);
  // The same batches again (a replay after a crash) leave the same table.
  ASSERT_TRUE(sink.WriteLabels(batch).ok());
  ASSERT_TRUE(sink.WriteLabels(late).ok());
  EXPECT_EQ(read(), want);
  // A label newer than the negation puts it back.
  auto newer =
      sink.WriteLabels(std::vector<Label>{with_us(MakeLabel("did:plc:g", "spam", at(12)))});
  ASSERT_TRUE(newer.ok()) << newer.status().ToString();
  EXPECT_EQ(newer->stored, 1u);
  std::vector<Row> with_g = want;
  with_g.emplace_back("did:plc:g", "spam", at(12), "");
  EXPECT_EQ(read(), with_g);
}

// The rows a sink holds after CheckLabelRules: the labels in the view, the expired one, and the
// negations of a/rude and f/misleading.
constexpr size_t kRowsAfterRules = 8;

TEST(LabelSinkTest, SqliteAppliesNegationsNewerLabelsAndHidesExpiredOnes) {
  TempDir dir;
  sinks::SqliteSinkOptions o;
  o.path = (dir.path() / "db.sqlite").string();
  auto sink = sinks::OpenSqliteLabelSink(o);
  ASSERT_TRUE(sink.ok()) << sink.status().ToString();
  CheckLabelRules(**sink, [&] { return SqliteView(o.path); });
  // The expired label and the negations are kept in the table, only the view hides them.
  EXPECT_EQ(SqliteView(o.path, "atfill_label_rows").size(), kRowsAfterRules);
  EXPECT_EQ(SqliteView(o.path, "atfill_label_rows WHERE neg = 1").size(), 2u);
  // The record sink opens the same file afterwards: both schemas live side by side.
  auto records = sinks::OpenSqliteSink(o);
  ASSERT_TRUE(records.ok()) << records.status().ToString();
  EXPECT_EQ(SqliteView(o.path).size(), 5u);
}

// A label table written before negations were kept (no neg column) gets it at open, keeping its
// labels, and then keeps negations.
TEST(LabelSinkTest, SqliteUpgradesALabelTableWithoutNegKeepingItsRows) {
  TempDir dir;
  const std::string path = (dir.path() / "db.sqlite").string();
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    const char* before = R"sql(
CREATE TABLE atfill_label_rows(uri TEXT NOT NULL, src TEXT NOT NULL, val TEXT NOT NULL, cid TEXT,
  cts TEXT NOT NULL, cts_us INTEGER NOT NULL, exp TEXT, exp_us INTEGER,
  indexed_at INTEGER NOT NULL, PRIMARY KEY (uri, src, val)) WITHOUT ROWID;
CREATE VIEW atfill_labels(src, uri, cid, val, neg, cts, exp) AS
SELECT src, uri, cid, val, 0, cts, exp FROM atfill_label_rows
WHERE exp_us IS NULL
   OR exp_us > CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER);
INSERT INTO atfill_label_rows VALUES ('did:plc:a', 'did:plc:labelerlabelerlabelerla', 'spam',
  NULL, '2025-01-01T00:00:01Z', 1735689601000000, NULL, NULL, 0);
)sql";
    char* err = nullptr;
    ASSERT_EQ(sqlite3_exec(db, before, nullptr, nullptr, &err), SQLITE_OK) << err;
    sqlite3_close(db);
  }
  sinks::SqliteSinkOptions o;
  o.path = path;
  auto sink = sinks::OpenSqliteLabelSink(o);
  ASSERT_TRUE(sink.ok()) << sink.status().ToString();
  const std::vector<Row> kept = {{"did:plc:a", "spam", "2025-01-01T00:00:01Z", ""}};
  EXPECT_EQ(SqliteView(path), kept);
  Label neg = MakeLabel("did:plc:a", "spam", "2025-01-01T00:00:05Z", true);
  neg.cts_us = 1735689605000000;
  Label older = MakeLabel("did:plc:a", "spam", "2025-01-01T00:00:03Z");
  older.cts_us = 1735689603000000;
  ASSERT_TRUE((*sink)->WriteLabels(std::vector<Label>{neg}).ok());
  ASSERT_TRUE((*sink)->WriteLabels(std::vector<Label>{older}).ok());
  EXPECT_TRUE(SqliteView(path).empty());
  // Opening it again changes nothing.
  sink->reset();
  auto again = sinks::OpenSqliteLabelSink(o);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(SqliteView(path).empty());
  EXPECT_EQ(SqliteView(path, "atfill_label_rows WHERE neg = 1").size(), 1u);
}

TEST(LabelSinkTest, PostgresAppliesNegationsNewerLabelsAndHidesExpiredOnes) {
  auto db = testing::PgDatabase::CreateOnTestServer();
  ASSERT_TRUE(db.ok()) << db.status().ToString();
  sinks::PostgresSinkOptions o;
  o.conninfo = (*db)->conninfo();
  o.schema = "labels_here";
  auto sink = sinks::OpenPostgresLabelSink(o);
  ASSERT_TRUE(sink.ok()) << sink.status().ToString();
  CheckLabelRules(**sink, [&] { return PgView(o.conninfo, o.schema); });
  auto conn = testing::PgConnection::Open(o.conninfo);
  ASSERT_TRUE(conn.ok());
  auto n = (*conn)->Column("SELECT count(*) FROM labels_here.atfill_label_rows");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->at(0), std::to_string(kRowsAfterRules));
  // The record sink migrated the same schema: the current version, labels included.
  auto v = (*conn)->Column("SELECT version FROM labels_here.atfill_schema_version");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->at(0), std::to_string(sinks::kPostgresSchemaVersion));
}

// A version 5 schema (label rows without neg) is upgraded to 6 at open, its labels kept, and then
// keeps negations.
TEST(LabelSinkTest, PostgresUpgradesAVersion5SchemaKeepingItsLabels) {
  auto db = testing::PgDatabase::CreateOnTestServer();
  ASSERT_TRUE(db.ok()) << db.status().ToString();
  sinks::PostgresSinkOptions o;
  o.conninfo = (*db)->conninfo();
  o.schema = "v5";
  ASSERT_TRUE(sinks::OpenPostgresLabelSink(o).ok());
  auto conn = testing::PgConnection::Open(o.conninfo);
  ASSERT_TRUE(conn.ok());
  // Back to version 5's label table and view.
  ASSERT_TRUE((*conn)
                  ->Exec(R"sql(
DROP VIEW v5.atfill_labels;
ALTER TABLE v5.atfill_label_rows DROP COLUMN neg;
CREATE VIEW v5.atfill_labels(src, uri, cid, val, neg, cts, exp) AS
SELECT l.src, l.uri, l.cid, l.val, false, l.cts, l.exp FROM v5.atfill_label_rows l
WHERE l.exp_us IS NULL OR l.exp_us > (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
UPDATE v5.atfill_schema_version SET version = 5;
INSERT INTO v5.atfill_label_rows VALUES ('did:plc:a', 'did:plc:labelerlabelerlabelerla', 'spam',
  NULL, '2025-01-01T00:00:01Z', 1735689601000000, NULL, NULL, 0);
)sql")
                  .ok());
  std::vector<std::string> said;
  o.log = [&](std::string_view line) { said.emplace_back(line); };
  auto sink = sinks::OpenPostgresLabelSink(o);
  ASSERT_TRUE(sink.ok()) << sink.status().ToString();
  auto v = (*conn)->Column("SELECT version FROM v5.atfill_schema_version");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->at(0), std::to_string(sinks::kPostgresSchemaVersion));
  ASSERT_EQ(said.size(), 2u);  // the upgrade and its end
  const std::vector<Row> kept = {{"did:plc:a", "spam", "2025-01-01T00:00:01Z", ""}};
  EXPECT_EQ(PgView(o.conninfo, "v5"), kept);
  Label neg = MakeLabel("did:plc:a", "spam", "2025-01-01T00:00:05Z", true);
  neg.cts_us = 1735689605000000;
  Label older = MakeLabel("did:plc:a", "spam", "2025-01-01T00:00:03Z");
  older.cts_us = 1735689603000000;
  ASSERT_TRUE((*sink)->WriteLabels(std::vector<Label>{neg}).ok());
  ASSERT_TRUE((*sink)->WriteLabels(std::vector<Label>{older}).ok());
  EXPECT_TRUE(PgView(o.conninfo, "v5").empty());
}

// --- atfill run against simnet's labeler ---

simnet::SimnetOptions Network(uint64_t labels) {
  simnet::SimnetOptions so;
  so.seed = 22;
  so.accounts = 40;
  so.labeler.labels = labels;
  return so;
}

// The labels the view should show now: the log's truth without the expired ones.
std::vector<Row> Want(const simnet::LabelerLog& log) {
  std::vector<Row> out;
  const int64_t now = NowUs();
  for (const auto& t : log.Truth()) {
    if (t.exp_us != 0 && t.exp_us <= now) continue;
    out.emplace_back(t.uri, t.val, t.cts, t.exp);
  }
  return out;
}

std::string Config(const std::filesystem::path& dir, const simnet::Simnet& net,
                   const std::string& extra) {
  const std::string path = (dir / "atfill.toml").string();
  testing::WriteFile(path,
                     "[state]\ndir = \"state\"\n[sink.sqlite]\npath = \"db.sqlite\"\n"
                     "[resolver]\nplc = \"" +
                         net.plc_url() + "\"\n[labels]\nlabelers = [\"" + net.labeler()->did() +
                         "\"]\nallow_private_endpoints = true\nidle_exit_ms = 1500\n"
                         "reconnect_base_ms = 20\nreconnect_max_ms = 200\n" +
                         extra);
  return path;
}

size_t CountOf(const std::string& err, const std::string& needle) {
  size_t n = 0;
  for (size_t at = err.find(needle); at != std::string::npos; at = err.find(needle, at + 1)) ++n;
  return n;
}

TEST(LabelsRunTest, TheLabelersHistoryLandsNegatedExpiredAndForgedLabelsLeftOut) {
  auto net = simnet::Simnet::Start(Network(600));
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  const simnet::LabelerLog& log = *(*net)->labeler();
  ASSERT_GT(log.negations, 20u);
  ASSERT_GT(log.expired, 20u);
  ASSERT_GT(log.expiring, 5u);
  ASSERT_GT(log.bad_signatures, 5u);
  TempDir dir;
  const std::string config = Config(dir.path(), **net, "");
  auto run = testing::RunProcess({ATFILL_BINARY, "run", config}, dir.path());
  ASSERT_EQ(run.exit_code, 4) << run.err;  // stopped: the labeler went quiet
  const std::string db = (dir.path() / "db.sqlite").string();
  const auto want = Want(log);
  ASSERT_GT(want.size(), 100u);
  EXPECT_EQ(SqliteView(db), want);
  EXPECT_NE(run.err.find("from seq 0"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("cursor 600"), std::string::npos) << run.err;
  // Every forged label was refused and named; none is in the table unless a genuine label of
  // the same (uri, val) put it there.
  EXPECT_EQ(CountOf(run.err, "refused bad_signature"), log.bad_signatures) << run.err;
  std::set<std::pair<std::string, std::string>> genuine, in_view, in_table;
  for (const auto& e : log.entries()) {
    if (!e.bad_signature) genuine.emplace(e.uri, e.val);
  }
  for (const auto& [uri, val, cts, exp] : SqliteView(db)) in_view.emplace(uri, val);
  std::set<std::pair<std::string, std::string>> labels_in_table;
  for (const auto& [uri, val, cts, exp] : SqliteView(db, "atfill_label_rows")) {
    in_table.emplace(uri, val);
  }
  for (const auto& [uri, val, cts, exp] : SqliteView(db, "atfill_label_rows WHERE neg = 0")) {
    labels_in_table.emplace(uri, val);
  }
  size_t forged_only = 0;
  for (const auto& e : log.entries()) {
    if (e.bad_signature && genuine.count({e.uri, e.val}) == 0) {
      ++forged_only;
      EXPECT_EQ(in_table.count({e.uri, e.val}), 0u) << e.uri << " " << e.val;
    }
  }
  EXPECT_GT(forged_only, 0u);
  // Each negation removed its label (unless a later label put it back).
  size_t removed = 0;
  for (size_t i = 0; i < log.entries().size(); ++i) {
    const auto& e = log.entries()[i];
    if (!e.neg) continue;
    bool relabelled = false;
    for (size_t j = i + 1; j < log.entries().size(); ++j) {
      const auto& later = log.entries()[j];
      relabelled |= !later.neg && !later.bad_signature && later.uri == e.uri && later.val == e.val;
    }
    if (!relabelled) {
      ++removed;
      EXPECT_EQ(labels_in_table.count({e.uri, e.val}), 0u) << "negated but present: " << e.uri;
    }
  }
  EXPECT_GT(removed, 10u);
  // Expired labels are stored but hidden by the view.
  size_t hidden = 0;
  for (const auto& t : log.Truth()) {
    if (t.exp_us != 0 && t.exp_us <= NowUs()) {
      ++hidden;
      EXPECT_EQ(in_table.count({t.uri, t.val}), 1u);
      EXPECT_EQ(in_view.count({t.uri, t.val}), 0u);
    }
  }
  EXPECT_GT(hidden, 10u);
  // The subscription is a job: `atfill status` shows its cursor and counters by outcome, and
  // its error log holds every refusal with its reason.
  auto status = testing::RunProcess({ATFILL_BINARY, "status", config}, dir.path());
  ASSERT_EQ(status.exit_code, 0) << status.err;
  const std::string& out = status.out;
  EXPECT_NE(out.find("labels job 1: paused"), std::string::npos) << out;
  EXPECT_NE(out.find("labeler     " + log.did() + ", cursor seq 600"), std::string::npos) << out;
  EXPECT_NE(out.find("applied     600 frames"), std::string::npos) << out;
  EXPECT_NE(out.find("refused     " + std::to_string(log.bad_signatures) + ": " +
                     std::to_string(log.bad_signatures) + " bad_signature"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("stopped     idle:"), std::string::npos) << out;
  auto errors =
      testing::RunProcess({ATFILL_BINARY, "job", config, "1", "--errors", "--json"}, dir.path());
  ASSERT_EQ(errors.exit_code, 0) << errors.err;
  EXPECT_EQ(CountOf(errors.out, "\"kind\":\"bad_signature\""), log.bad_signatures) << errors.out;
  EXPECT_NE(errors.out.find("\"bad_signature\":" + std::to_string(log.bad_signatures)),
            std::string::npos)
      << errors.out;
  // A second run starts from the saved cursor, writes nothing new, and goes on in the same job.
  auto again = testing::RunProcess({ATFILL_BINARY, "run", config}, dir.path());
  ASSERT_EQ(again.exit_code, 4) << again.err;
  EXPECT_NE(again.err.find("from seq 600"), std::string::npos) << again.err;
  EXPECT_NE(again.err.find(": 0 frames"), std::string::npos) << again.err;
  EXPECT_NE(again.err.find("atfill labels: job 1"), std::string::npos) << again.err;
  EXPECT_EQ(SqliteView(db), want);
  auto status_again = testing::RunProcess({ATFILL_BINARY, "status", config}, dir.path());
  EXPECT_NE(status_again.out.find("applied     600 frames"), std::string::npos) << status_again.out;
}

int64_t RowCount(const std::string& db) {
  sqlite3* h = nullptr;
  if (sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    sqlite3_close(h);
    return 0;
  }
  sqlite3_stmt* stmt = nullptr;
  int64_t n = 0;
  if (sqlite3_prepare_v2(h, "SELECT count(*) FROM atfill_label_rows", -1, &stmt, nullptr) ==
          SQLITE_OK &&
      sqlite3_step(stmt) == SQLITE_ROW) {
    n = sqlite3_column_int64(stmt, 0);
  }
  sqlite3_finalize(stmt);
  sqlite3_close(h);
  return n;
}

TEST(LabelsRunTest, SigkilledMidStreamThenResumedLosesAndDoublesNothing) {
  simnet::SimnetOptions so = Network(3000);
  so.labeler.frames_per_second = 1500;  // two seconds of labels per connection
  auto net = simnet::Simnet::Start(so);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  TempDir dir;
  const std::string config = Config(dir.path(), **net, "batch_labels = 40\nbatch_ms = 20\n");
  const std::string db = (dir.path() / "db.sqlite").string();
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("ATFILL_TEST_SEED=" + std::to_string(seed));
  int kills = 0;
  for (int i = 0; i < 3; ++i) {
    const int64_t before = RowCount(db);
    const int64_t target = before + 50 + static_cast<int64_t>(rng() % 200);
    testing::Child child({ATFILL_BINARY, "run", config}, dir.path());
    testing::WaitUntil([&] { return RowCount(db) >= target || !child.Running(); },
                       std::chrono::seconds(20));
    if (child.Kill(SIGKILL)) {
      ++kills;
      EXPECT_EQ(child.Wait().signal, SIGKILL);
    } else {
      child.Wait();
    }
  }
  EXPECT_EQ(kills, 3);
  auto last = testing::RunProcess({ATFILL_BINARY, "run", config}, dir.path());
  ASSERT_EQ(last.exit_code, 4) << last.err;
  // The last run resumed from a saved cursor, not from the start.
  const size_t from = last.err.find("from seq ");
  ASSERT_NE(from, std::string::npos) << last.err;
  EXPECT_GT(std::strtoull(last.err.c_str() + from + 9, nullptr, 10), 0u) << last.err;
  EXPECT_NE(last.err.find("cursor 3000"), std::string::npos) << last.err;
  // Every label in force once, and nothing else (a list, so a doubled row would show).
  EXPECT_EQ(SqliteView(db), Want(*(*net)->labeler()));
}

TEST(LabelsRunTest, PostgresHoldsTheSameLabels) {
  auto pg = testing::PgDatabase::CreateOnTestServer();
  ASSERT_TRUE(pg.ok()) << pg.status().ToString();
  auto net = simnet::Simnet::Start(Network(400));
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  TempDir dir;
  const std::string config = Config(dir.path(), **net,
                                    "[sink]\nkind = \"postgres\"\n[sink.postgres]\nconninfo = \"" +
                                        (*pg)->conninfo() + "\"\nschema = \"lab\"\n");
  auto run = testing::RunProcess({ATFILL_BINARY, "run", config}, dir.path());
  ASSERT_EQ(run.exit_code, 4) << run.err;
  const auto want = Want(*(*net)->labeler());
  ASSERT_GT(want.size(), 50u);
  EXPECT_EQ(PgView((*pg)->conninfo(), "lab"), want);
  EXPECT_EQ(CountOf(run.err, "refused bad_signature"), (*net)->labeler()->bad_signatures);
}

}  // namespace
}  // namespace atfill
