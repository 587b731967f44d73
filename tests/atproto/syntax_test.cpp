#include "atproto/syntax.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <ostream>
#include <set>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "atproto/tid.hpp"
#include "tests/common/test_util.hpp"

namespace atfill::atproto {
namespace {

// --- Interop vectors ---

struct VectorLine {
  size_t number;  // 1-based line number in the file
  std::string text;
};

// Every line except blank ones and '#' comments, exactly as written (never trimmed: leading and
// trailing spaces are what some invalid cases test).
std::vector<VectorLine> ReadVectorLines(const std::filesystem::path& path) {
  const std::string data = testing::ReadFileOrDie(path);
  std::vector<VectorLine> lines;
  size_t number = 0;
  size_t start = 0;
  while (start < data.size()) {
    size_t end = data.find('\n', start);
    if (end == std::string::npos) end = data.size();
    ++number;
    std::string line = data.substr(start, end - start);
    start = end + 1;
    if (line.empty() || line[0] == '#') continue;
    lines.push_back({number, std::move(line)});
  }
  return lines;
}

// Short enough to read in a failure message.
std::string Shown(const std::string& text) {
  if (text.size() <= 80) return "\"" + text + "\"";
  return "\"" + text.substr(0, 60) + "...\" (" + std::to_string(text.size()) + " chars)";
}

// Parses with the value type for `kind`, to check it agrees with the free validator.
Status ParseAs(SyntaxKind kind, std::string_view text) {
  switch (kind) {
    case SyntaxKind::kDid:
      return Did::Parse(text).status();
    case SyntaxKind::kHandle:
      return Handle::Parse(text).status();
    case SyntaxKind::kNsid:
      return Nsid::Parse(text).status();
    case SyntaxKind::kRecordKey:
      return RecordKey::Parse(text).status();
    case SyntaxKind::kTid:
      return Tid::Parse(text).status();
    case SyntaxKind::kAtUri:
      return AtUri::Parse(text).status();
    case SyntaxKind::kDatetime:
      return Datetime::Parse(text).status();
    case SyntaxKind::kCid:
      return CidString::Parse(text).status();
    case SyntaxKind::kAtIdentifier:
      return AtIdentifier::Parse(text).status();
    case SyntaxKind::kLanguage:
      return Language::Parse(text).status();
    case SyntaxKind::kUri:
      return ValidateUri(text);
  }
  return Status::Internal("unhandled kind");
}

// The shape-only check where one exists (datetime, language), else the full one.
Status ShapeOnly(SyntaxKind kind, std::string_view text) {
  if (kind == SyntaxKind::kDatetime) return ValidateDatetimeSyntax(text);
  if (kind == SyntaxKind::kLanguage) return ValidateLanguageSyntax(text);
  return ValidateSyntax(kind, text);
}

enum class Expect {
  kValid,         // *_syntax_valid.txt: every check passes
  kInvalid,       // *_syntax_invalid.txt: every check fails, the shape check too
  kParseInvalid,  // *_parse_invalid.txt: well-formed, but not a valid value
};

struct VectorFile {
  const char* file;
  SyntaxKind kind;
  Expect expect;
};

constexpr VectorFile kVectorFiles[] = {
    {"atidentifier_syntax_valid.txt", SyntaxKind::kAtIdentifier, Expect::kValid},
    {"atidentifier_syntax_invalid.txt", SyntaxKind::kAtIdentifier, Expect::kInvalid},
    {"aturi_syntax_valid.txt", SyntaxKind::kAtUri, Expect::kValid},
    {"aturi_syntax_invalid.txt", SyntaxKind::kAtUri, Expect::kInvalid},
    {"cid_syntax_valid.txt", SyntaxKind::kCid, Expect::kValid},
    {"cid_syntax_invalid.txt", SyntaxKind::kCid, Expect::kInvalid},
    {"datetime_syntax_valid.txt", SyntaxKind::kDatetime, Expect::kValid},
    {"datetime_syntax_invalid.txt", SyntaxKind::kDatetime, Expect::kInvalid},
    {"datetime_parse_invalid.txt", SyntaxKind::kDatetime, Expect::kParseInvalid},
    {"did_syntax_valid.txt", SyntaxKind::kDid, Expect::kValid},
    {"did_syntax_invalid.txt", SyntaxKind::kDid, Expect::kInvalid},
    {"handle_syntax_valid.txt", SyntaxKind::kHandle, Expect::kValid},
    {"handle_syntax_invalid.txt", SyntaxKind::kHandle, Expect::kInvalid},
    {"language_syntax_valid.txt", SyntaxKind::kLanguage, Expect::kValid},
    {"language_syntax_invalid.txt", SyntaxKind::kLanguage, Expect::kInvalid},
    {"language_parse_invalid.txt", SyntaxKind::kLanguage, Expect::kParseInvalid},
    {"nsid_syntax_valid.txt", SyntaxKind::kNsid, Expect::kValid},
    {"nsid_syntax_invalid.txt", SyntaxKind::kNsid, Expect::kInvalid},
    {"recordkey_syntax_valid.txt", SyntaxKind::kRecordKey, Expect::kValid},
    {"recordkey_syntax_invalid.txt", SyntaxKind::kRecordKey, Expect::kInvalid},
    {"tid_syntax_valid.txt", SyntaxKind::kTid, Expect::kValid},
    {"tid_syntax_invalid.txt", SyntaxKind::kTid, Expect::kInvalid},
    {"uri_syntax_valid.txt", SyntaxKind::kUri, Expect::kValid},
    {"uri_syntax_invalid.txt", SyntaxKind::kUri, Expect::kInvalid},
};

// Names the file when GoogleTest prints a parameter.
void PrintTo(const VectorFile& vf, std::ostream* os) { *os << vf.file; }

class SyntaxVectorTest : public ::testing::TestWithParam<VectorFile> {};

TEST_P(SyntaxVectorTest, EveryLine) {
  const VectorFile& vf = GetParam();
  ATFILL_SHARED_PATH(path, std::filesystem::path("vectors/interop/syntax") / vf.file);
  const std::vector<VectorLine> lines = ReadVectorLines(path);
  ASSERT_GT(lines.size(), 0u) << vf.file << " has no test lines";

  size_t passed = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const VectorLine& line = lines[i];
    const std::string where = std::string(vf.file) + ":" + std::to_string(line.number) + " " +
                              Shown(line.text) + " (case " + std::to_string(passed + 1) + " of " +
                              std::to_string(lines.size()) + ")";
    const Status full = ValidateSyntax(vf.kind, line.text);
    const Status parsed = ParseAs(vf.kind, line.text);
    const Status shape = ShapeOnly(vf.kind, line.text);
    // The value type and the free validator must agree, message included.
    bool line_ok = full.ToString() == parsed.ToString();
    switch (vf.expect) {
      case Expect::kValid:
        line_ok = line_ok && full.ok() && shape.ok();
        break;
      case Expect::kInvalid:
        line_ok = line_ok && !full.ok() && !shape.ok() && full.code() == StatusCode::kInvalid &&
                  !full.message().empty();
        break;
      case Expect::kParseInvalid:
        line_ok = line_ok && shape.ok() && !full.ok();
        break;
    }
    EXPECT_TRUE(line_ok) << where << ": validator says " << full.ToString() << "; Parse says "
                         << parsed.ToString() << "; shape check says " << shape.ToString();
    if (line_ok) ++passed;
  }
  EXPECT_EQ(passed, lines.size()) << vf.file << ": " << passed << " of " << lines.size()
                                  << " cases passed";
}

INSTANTIATE_TEST_SUITE_P(Interop, SyntaxVectorTest, ::testing::ValuesIn(kVectorFiles),
                         [](const ::testing::TestParamInfo<VectorFile>& info) {
                           std::string name = info.param.file;
                           name = name.substr(0, name.size() - 4);  // ".txt"
                           return name;
                         });

// A new vector file in the shared folder must not be skipped silently.
TEST(SyntaxVectorFiles, EveryFileIsCovered) {
  ATFILL_SHARED_PATH(dir, "vectors/interop/syntax");
  std::set<std::string> covered;
  for (const VectorFile& vf : kVectorFiles) covered.insert(vf.file);
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".txt") continue;
    ++files;
    EXPECT_TRUE(covered.count(name) == 1) << name << " is not run by SyntaxVectorTest";
  }
  EXPECT_EQ(files, covered.size());
}

// --- DID ---

TEST(Did, Accessors) {
  auto plc = Did::Parse("did:plc:7iza6de2dwap2sbkpav7c6c6");
  ASSERT_TRUE(plc.ok()) << plc.status().ToString();
  EXPECT_EQ(plc->str(), "did:plc:7iza6de2dwap2sbkpav7c6c6");
  EXPECT_EQ(plc->method(), "plc");
  EXPECT_EQ(plc->identifier(), "7iza6de2dwap2sbkpav7c6c6");
  EXPECT_TRUE(plc->is_plc());
  EXPECT_FALSE(plc->is_web());
  EXPECT_EQ(plc->WebHost().status().code(), StatusCode::kInvalid);

  auto other = Did::Parse("did:method::::val");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->method(), "method");
  EXPECT_EQ(other->identifier(), ":::val");
  EXPECT_FALSE(other->is_plc());
}

TEST(Did, WebHost) {
  auto web = Did::Parse("did:web:example.com");
  ASSERT_TRUE(web.ok());
  EXPECT_TRUE(web->is_web());
  auto host = web->WebHost();
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  EXPECT_EQ(*host, "example.com");

  auto port = Did::Parse("did:web:localhost%3A1234");
  ASSERT_TRUE(port.ok());
  auto port_host = port->WebHost();
  ASSERT_TRUE(port_host.ok()) << port_host.status().ToString();
  EXPECT_EQ(*port_host, "localhost:1234");

  auto path = Did::Parse("did:web:example.com:users:alice");
  ASSERT_TRUE(path.ok());
  EXPECT_EQ(path->WebHost().status().code(), StatusCode::kUnsupported);

  auto escape = Did::Parse("did:web:exa%41mple.com");
  ASSERT_TRUE(escape.ok());
  EXPECT_EQ(escape->WebHost().status().code(), StatusCode::kInvalid);
}

TEST(Did, Messages) {
  EXPECT_EQ(ValidateDid("did:" + std::string(2045, 'a')).message(),
            "did is longer than 2048 characters");
  EXPECT_TRUE(ValidateDid("did:a:" + std::string(2042, 'a')).ok());
  EXPECT_EQ(ValidateDid("did:method:val/two").message(),
            "did has disallowed character '/' at offset 14");
  EXPECT_EQ(ValidateDid("did:m123:val").message(),
            "did method has character '1' at offset 5; a method is lower-case letters only");
  EXPECT_EQ(ValidateDid("DID:method:val").message(), "did must start with lower-case \"did:\"");
  EXPECT_EQ(ValidateDid("did:method:").message(), "did identifier after the method is empty");
  EXPECT_EQ(ValidateDid("did:method:val:").message(), "did ends with ':'");
  EXPECT_EQ(ValidateDid("did:method:val%").message(), "did ends with '%'");
  EXPECT_EQ(ValidateDid("").message(), "did is empty");
  EXPECT_EQ(ValidateDid("did:plc:abc\xC3\xA9").message(),
            "did has disallowed character byte 0xC3 at offset 11");
}

TEST(Did, OrderingAndHash) {
  auto a = Did::Parse("did:plc:aaa");
  auto b = Did::Parse("did:plc:bbb");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_LT(*a, *b);
  EXPECT_NE(*a, *b);
  EXPECT_EQ(*a, *Did::Parse("did:plc:aaa"));
  std::unordered_set<Did> set{*a, *b, *a};
  EXPECT_EQ(set.size(), 2u);
  EXPECT_TRUE(Did().empty());
}

// --- Handle ---

TEST(Handle, KeepsInputAndNormalizes) {
  auto h = Handle::Parse("XX.LCS.MIT.EDU");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->str(), "XX.LCS.MIT.EDU");
  EXPECT_EQ(h->Normalized(), "xx.lcs.mit.edu");
  auto lower = Handle::Parse("xx.lcs.mit.edu");
  ASSERT_TRUE(lower.ok());
  EXPECT_NE(*h, *lower);
  EXPECT_EQ(h->Normalized(), lower->Normalized());
}

TEST(Handle, Messages) {
  EXPECT_EQ(ValidateHandle("john").message(), "handle has one segment; it needs at least two");
  EXPECT_EQ(ValidateHandle("john.0").message(), "handle top-level domain starts with a digit");
  EXPECT_EQ(ValidateHandle("john-.test").message(), "handle segment 1 ends with a hyphen");
  EXPECT_EQ(ValidateHandle("john.-est").message(), "handle segment 2 starts with a hyphen");
  EXPECT_EQ(ValidateHandle("john..test").message(), "handle segment 2 is empty");
  EXPECT_EQ(ValidateHandle("john.test.").message(), "handle ends with '.'");
  EXPECT_EQ(ValidateHandle("jo_hn.test").message(),
            "handle has disallowed character '_' at offset 2");
  EXPECT_EQ(ValidateHandle("john .test").message(),
            "handle has disallowed character a space at offset 4");
  EXPECT_EQ(ValidateHandle("a." + std::string(64, 'o') + ".test").message(),
            "handle segment 2 is longer than 63 characters");
}

// --- NSID ---

TEST(Nsid, Accessors) {
  auto n = Nsid::Parse("app.bsky.feed.post");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->authority(), "app.bsky.feed");
  EXPECT_EQ(n->name(), "post");
  EXPECT_EQ(n->DomainAuthority(), "feed.bsky.app");

  auto mixed = Nsid::Parse("Com.Example.fooBar");
  ASSERT_TRUE(mixed.ok());
  EXPECT_EQ(mixed->name(), "fooBar");
  EXPECT_EQ(mixed->DomainAuthority(), "example.com");
}

TEST(Nsid, Messages) {
  EXPECT_EQ(ValidateNsid("com.example").message(), "nsid has 2 segments; it needs at least 3");
  EXPECT_EQ(ValidateNsid("0two.example.foo").message(), "nsid segment 1 starts with a digit");
  EXPECT_EQ(ValidateNsid("com.example.fooBar.2").message(),
            "nsid name (segment 4) starts with a digit");
  EXPECT_EQ(ValidateNsid("a-0.b-1.c-3").message(),
            "nsid name has disallowed character '-' at offset 9");
  EXPECT_EQ(ValidateNsid("com.example-.foo").message(), "nsid segment 2 ends with a hyphen");
  EXPECT_EQ(ValidateNsid("one.two..three").message(), "nsid segment 3 is empty");
  EXPECT_EQ(ValidateNsid("com.atproto.feed.p@st").message(),
            "nsid name has disallowed character '@' at offset 18");
  EXPECT_EQ(ValidateNsid("com.ex_ample.foo").message(),
            "nsid has disallowed character '_' at offset 6");
  EXPECT_EQ(ValidateNsid("com." + std::string(320, 'a') + ".foo").message(),
            "nsid is longer than 317 characters");
}

// --- Record key ---

TEST(RecordKey, Messages) {
  EXPECT_TRUE(RecordKey::Parse("3jzfcijpj2z2a").ok());
  EXPECT_EQ(ValidateRecordKey("..").message(), "record key cannot be \".\" or \"..\"");
  EXPECT_EQ(ValidateRecordKey("alpha/beta").message(),
            "record key has disallowed character '/' at offset 5");
  EXPECT_EQ(ValidateRecordKey("").message(), "record key is empty");
  EXPECT_EQ(ValidateRecordKey(std::string(513, 'o')).message(),
            "record key is longer than 512 characters");
}

// --- AT URI ---

TEST(AtUri, Parts) {
  auto full = AtUri::Parse("at://did:plc:asdf123/com.atproto.feed.post/record");
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  EXPECT_EQ(full->authority(), "did:plc:asdf123");
  EXPECT_TRUE(full->authority_is_did());
  EXPECT_TRUE(full->has_collection());
  EXPECT_EQ(full->collection(), "com.atproto.feed.post");
  EXPECT_TRUE(full->has_rkey());
  EXPECT_EQ(full->rkey(), "record");

  auto coll = AtUri::Parse("at://user.bsky.social/app.bsky.feed.post");
  ASSERT_TRUE(coll.ok());
  EXPECT_EQ(coll->authority(), "user.bsky.social");
  EXPECT_FALSE(coll->authority_is_did());
  EXPECT_EQ(coll->collection(), "app.bsky.feed.post");
  EXPECT_FALSE(coll->has_rkey());
  EXPECT_EQ(coll->rkey(), "");

  auto bare = AtUri::Parse("at://did:abc:123");
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare->authority(), "did:abc:123");
  EXPECT_FALSE(bare->has_collection());
  EXPECT_EQ(bare->collection(), "");
  EXPECT_FALSE(bare->has_rkey());

  EXPECT_EQ(AtUri().authority(), "");
  EXPECT_FALSE(AtUri().has_collection());
}

TEST(AtUri, FormatAndForRecord) {
  auto did = Did::Parse("did:plc:7iza6de2dwap2sbkpav7c6c6");
  auto nsid = Nsid::Parse("app.bsky.feed.post");
  auto rkey = RecordKey::Parse("3jzfcijpj2z2a");
  ASSERT_TRUE(did.ok() && nsid.ok() && rkey.ok());
  const std::string text = AtUri::Format(*did, *nsid, *rkey);
  EXPECT_EQ(text, "at://did:plc:7iza6de2dwap2sbkpav7c6c6/app.bsky.feed.post/3jzfcijpj2z2a");
  EXPECT_EQ(AtUri::Format("did:a:b", "c.d.e", "f"), "at://did:a:b/c.d.e/f");

  const AtUri built = AtUri::ForRecord(*did, *nsid, *rkey);
  auto parsed = AtUri::Parse(text);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(built, *parsed);
  EXPECT_EQ(built.authority(), parsed->authority());
  EXPECT_EQ(built.collection(), "app.bsky.feed.post");
  EXPECT_EQ(built.rkey(), "3jzfcijpj2z2a");
}

TEST(AtUri, Messages) {
  EXPECT_EQ(ValidateAtUri("at://did:plc:asdf123#").message(),
            "at-uri has a fragment ('#' at offset 20); fragments are not allowed");
  EXPECT_EQ(ValidateAtUri("at://did:plc:asdf123/").message(), "at-uri ends with '/'");
  EXPECT_EQ(ValidateAtUri("at://").message(), "at-uri authority is empty");
  EXPECT_EQ(ValidateAtUri("at://did:plc:asdf123/com.atproto.feed.post/record/").message(),
            "at-uri ends with '/'");
  EXPECT_EQ(ValidateAtUri("at://user.bsky.social//com.atproto.feed.post").message(),
            "at-uri collection is empty (\"//\")");
  EXPECT_EQ(ValidateAtUri("at://did:plc:asdf123/short/stuff").message(),
            "at-uri collection: nsid has 1 segment; it needs at least 3");
  EXPECT_EQ(ValidateAtUri("at://did:plc:asdf@123/com.atproto.feed.post").message(),
            "at-uri authority: did has disallowed character '@' at offset 17");
  EXPECT_EQ(ValidateAtUri("at://did:plc:asdf123/com.atproto.feed.post/a/b").message(),
            "at-uri path has more than two segments (collection and record key)");
  EXPECT_EQ(ValidateAtUri("at://did:plc:asdf123/com.atproto.feed.post/..").message(),
            "at-uri record key: record key cannot be \".\" or \"..\"");
  EXPECT_EQ(ValidateAtUri("AT://did:plc:asdf123").message(),
            "at-uri does not start with \"at://\"");
}

// --- AtIdentifier ---

TEST(AtIdentifier, Kinds) {
  auto did = AtIdentifier::Parse("did:plc:asdf123");
  ASSERT_TRUE(did.ok());
  EXPECT_TRUE(did->is_did());
  ASSERT_NE(did->did(), nullptr);
  EXPECT_EQ(did->did()->method(), "plc");
  EXPECT_EQ(did->handle(), nullptr);
  EXPECT_EQ(did->str(), "did:plc:asdf123");

  auto handle = AtIdentifier::Parse("John.Test");
  ASSERT_TRUE(handle.ok());
  EXPECT_TRUE(handle->is_handle());
  ASSERT_NE(handle->handle(), nullptr);
  EXPECT_EQ(handle->handle()->Normalized(), "john.test");
  EXPECT_EQ(handle->did(), nullptr);
  EXPECT_NE(*did, *handle);
  EXPECT_TRUE(AtIdentifier().empty());
}

// --- Datetime ---

int64_t MicrosOf(std::string_view text) {
  auto dt = Datetime::Parse(text);
  EXPECT_TRUE(dt.ok()) << text << ": " << dt.status().ToString();
  return dt.ok() ? dt->unix_micros() : -1;
}

TEST(Datetime, UnixMicros) {
  EXPECT_EQ(MicrosOf("1970-01-01T00:00:00Z"), 0);
  EXPECT_EQ(MicrosOf("1985-04-12T23:20:50.123Z"), 482196050123000);
  EXPECT_EQ(MicrosOf("1985-04-12T23:20:50.123456Z"), 482196050123456);
  EXPECT_EQ(MicrosOf("1985-04-12T23:20:50.1234567Z"), 482196050123456);  // truncated
  EXPECT_EQ(MicrosOf("1985-04-12T23:20:50.1Z"), 482196050100000);
  EXPECT_EQ(MicrosOf("1985-04-12T16:20:50.123-07:00"), 482196050123000);
  EXPECT_EQ(MicrosOf("1985-04-13T01:05:50.123+01:45"), 482196050123000);
  EXPECT_EQ(MicrosOf("1969-12-31T23:59:59.999999Z"), -1);
  EXPECT_EQ(MicrosOf("0000-01-01T00:00:00.000Z"), -62167219200LL * 1000000);
  EXPECT_EQ(MicrosOf("2000-02-29T00:00:00Z"), 951782400LL * 1000000);
  EXPECT_EQ(MicrosOf("2024-12-31T23:59:59Z"), 1735689599LL * 1000000);
}

TEST(Datetime, CalendarRules) {
  EXPECT_TRUE(ValidateDatetime("2024-02-29T00:00:00Z").ok());
  EXPECT_TRUE(ValidateDatetime("2000-02-29T00:00:00Z").ok());
  EXPECT_EQ(ValidateDatetime("2023-02-29T00:00:00Z").message(),
            "datetime day 29 does not exist in 2023-02");
  EXPECT_FALSE(ValidateDatetime("1900-02-29T00:00:00Z").ok());
  EXPECT_TRUE(ValidateDatetimeSyntax("1900-02-29T00:00:00Z").ok());
  EXPECT_EQ(ValidateDatetime("1985-13-12T23:20:50.123Z").message(),
            "datetime month 13 is out of range (01-12)");
  EXPECT_EQ(ValidateDatetime("1985-04-12T23:20:60Z").message(),
            "datetime second 60 is out of range (00-59)");
  EXPECT_EQ(ValidateDatetime("1985-04-12T23:20:50+24:00").message(),
            "datetime timezone offset +24:00 is out of range");
  EXPECT_EQ(ValidateDatetime("0000-01-01T00:00:00+01:00").message(),
            "datetime is before 0000-01-01T00:00:00Z once converted to UTC");
  EXPECT_TRUE(ValidateDatetime("0000-01-01T00:00:00-01:00").ok());
}

TEST(Datetime, ShapeMessages) {
  EXPECT_EQ(ValidateDatetime("1985-04-12T23:20:50.123").message(),
            "datetime has no timezone; it needs 'Z' or an offset like +00:00");
  EXPECT_EQ(ValidateDatetime("1985-04-12T23:20:50.123-00:00").message(),
            "datetime uses \"-00:00\"; write UTC as 'Z' or \"+00:00\"");
  EXPECT_EQ(ValidateDatetime("1985-04-12t23:20:50.123Z").message(),
            "datetime expects 'T' at offset 10, found 't'");
  EXPECT_EQ(ValidateDatetime("1985-04-12T23:20:50.123z").message(),
            "datetime expects 'Z' or a +HH:MM/-HH:MM timezone at offset 23, found 'z'");
  EXPECT_EQ(ValidateDatetime("1985-4-12T23:20:50.123Z").message(),
            "datetime expects 2 digits for the month at offset 5, found '-' at offset 6");
  EXPECT_EQ(ValidateDatetime("1985-04-12T23:20:50.Z").message(),
            "datetime has a '.' with no fraction digits after it (offset 19)");
  EXPECT_EQ(ValidateDatetime("1985-04-12").message(),
            "datetime expects 'T' at offset 10, found the end of the text");
  EXPECT_EQ(ValidateDatetime("1985-04-12T23:20:50.123Z ").message(),
            "datetime has unexpected characters after the timezone at offset 24");
  EXPECT_EQ(ValidateDatetime("1985-04-12T23:20:50." + std::string(60, '1') + "Z").message(),
            "datetime is longer than 64 characters");
}

TEST(Datetime, FromUnixMicrosRoundTrip) {
  for (int64_t micros :
       {int64_t{0}, int64_t{482196050123456}, int64_t{-1}, int64_t{-62167219200LL * 1000000},
        int64_t{253402300799999999LL}, int64_t{1735689599000001LL}}) {
    auto dt = Datetime::FromUnixMicros(micros);
    ASSERT_TRUE(dt.ok()) << micros << ": " << dt.status().ToString();
    EXPECT_EQ(dt->unix_micros(), micros);
    auto reparsed = Datetime::Parse(dt->str());
    ASSERT_TRUE(reparsed.ok()) << dt->str() << ": " << reparsed.status().ToString();
    EXPECT_EQ(reparsed->unix_micros(), micros) << dt->str();
    EXPECT_EQ(*reparsed, *dt);
  }
  auto epoch = Datetime::FromUnixMicros(482196050123000);
  ASSERT_TRUE(epoch.ok());
  EXPECT_EQ(epoch->str(), "1985-04-12T23:20:50.123000Z");
  EXPECT_EQ(Datetime::FromUnixMicros(-62167219200LL * 1000000 - 1).status().code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(Datetime::FromUnixMicros(253402300800000000LL).status().code(),
            StatusCode::kOutOfRange);
}

TEST(Datetime, OrderingByInstant) {
  auto utc = Datetime::Parse("1985-04-12T23:20:50.123Z");
  auto offset = Datetime::Parse("1985-04-12T23:20:50.123+00:00");
  auto later = Datetime::Parse("1985-04-12T16:20:51-07:00");
  ASSERT_TRUE(utc.ok() && offset.ok() && later.ok());
  EXPECT_NE(*utc, *offset);
  EXPECT_EQ(utc->unix_micros(), offset->unix_micros());
  EXPECT_LT(*utc, *later);
  EXPECT_LT(*offset, *later);
}

// --- CID string, language, URI ---

TEST(CidString, Messages) {
  EXPECT_TRUE(CidString::Parse("bafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi").ok());
  EXPECT_EQ(ValidateCid("QmbWqxBEKC3P8tqsKc98xmWNzrzDtRLMiMPL8wBuTGsMnR").message(),
            "cid is a CIDv0 (\"Qm...\"), which atproto does not allow");
  EXPECT_EQ(ValidateCid("noop").message(), "cid is shorter than 8 characters");
  EXPECT_EQ(ValidateCid("example.com").message(), "cid has disallowed character '.' at offset 7");
}

TEST(Language, PrimaryAndRepeats) {
  auto lang = Language::Parse("pt-BR");
  ASSERT_TRUE(lang.ok());
  EXPECT_EQ(lang->primary(), "pt");
  auto plain = Language::Parse("ja");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->primary(), "ja");
  EXPECT_EQ(ValidateLanguage("de-DE-1901-1901").message(),
            "language tag repeats the variant subtag \"1901\" (offset 11)");
  EXPECT_EQ(ValidateLanguage("en-u-co-phonebk-U-ca-buddhist").message(),
            "language tag repeats the extension singleton 'u' (offset 16)");
  // Repeats inside private use are not constrained.
  EXPECT_TRUE(ValidateLanguage("en-x-foo-foo").ok());
  EXPECT_TRUE(ValidateLanguage("x-a-a").ok());
  EXPECT_EQ(ValidateLanguage("JA").message(),
            "language tag must start with 2 or 3 lower-case letters (or \"i-\" or \"x-\")");
  EXPECT_EQ(ValidateLanguage("ja-").message(), "language tag ends with '-'");
  EXPECT_EQ(ValidateLanguage("en-abcdefghi").message(),
            "language subtag at offset 3 is longer than 8 characters");
}

TEST(Uri, Messages) {
  EXPECT_TRUE(ValidateUri("at://did:plc:asdf123/app.bsky.feed.post/3jzfcijpj2z2a").ok());
  EXPECT_EQ(ValidateUri("example.com").message(), "uri has no scheme (no ':')");
  EXPECT_EQ(ValidateUri("http:").message(), "uri has nothing after the scheme");
  EXPECT_EQ(ValidateUri("https://example.com/path gap").message(),
            "uri has disallowed character a space at offset 24");
  EXPECT_EQ(ValidateUri("127.0.0.1:80").message(), "uri scheme must start with a letter");
}

// --- Dispatch ---

TEST(SyntaxKind, NamesRoundTrip) {
  const std::vector<std::pair<std::string, SyntaxKind>> names = {
      {"did", SyntaxKind::kDid},
      {"handle", SyntaxKind::kHandle},
      {"nsid", SyntaxKind::kNsid},
      {"rkey", SyntaxKind::kRecordKey},
      {"tid", SyntaxKind::kTid},
      {"aturi", SyntaxKind::kAtUri},
      {"datetime", SyntaxKind::kDatetime},
      {"cid", SyntaxKind::kCid},
      {"atidentifier", SyntaxKind::kAtIdentifier},
      {"language", SyntaxKind::kLanguage},
      {"uri", SyntaxKind::kUri}};
  for (const auto& [name, kind] : names) {
    auto parsed = ParseSyntaxKind(name);
    ASSERT_TRUE(parsed.ok()) << name;
    EXPECT_EQ(*parsed, kind) << name;
    EXPECT_EQ(SyntaxKindName(kind), name);
  }
  EXPECT_EQ(*ParseSyntaxKind("record-key"), SyntaxKind::kRecordKey);
  EXPECT_EQ(*ParseSyntaxKind("at-uri"), SyntaxKind::kAtUri);
  EXPECT_EQ(*ParseSyntaxKind("at-identifier"), SyntaxKind::kAtIdentifier);
  auto bad = ParseSyntaxKind("DID");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown syntax kind \"DID\""), std::string::npos);
}

TEST(SyntaxKind, DispatchMatchesValidators) {
  EXPECT_TRUE(ValidateSyntax(SyntaxKind::kTid, "3jzfcijpj2z2a").ok());
  EXPECT_EQ(ValidateSyntax(SyntaxKind::kTid, "3jzfcijpj2z2").message(),
            ValidateTid("3jzfcijpj2z2").message());
  EXPECT_EQ(ValidateSyntax(SyntaxKind::kNsid, "com.example").message(),
            ValidateNsid("com.example").message());
}

TEST(DescribeByte, Forms) {
  EXPECT_EQ(DescribeByte('a'), "'a'");
  EXPECT_EQ(DescribeByte(' '), "a space");
  EXPECT_EQ(DescribeByte('\n'), "byte 0x0A");
  EXPECT_EQ(DescribeByte(static_cast<char>(0xF0)), "byte 0xF0");
}

}  // namespace
}  // namespace atfill::atproto
