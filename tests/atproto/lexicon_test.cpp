#include "atproto/lexicon.hpp"

#include <gtest/gtest.h>
#include <simdjson.h>

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tests/common/jetstream_lines.hpp"
#include "tests/common/test_util.hpp"

namespace atfill::atproto {
namespace {

namespace dom = simdjson::dom;

constexpr const char* kVectors = "vectors/interop/lexicon/";

struct Case {
  std::string name;
  std::string json;  // the lexicon or the record data
  std::string rkey;
};

std::vector<Case> ReadCases(const std::filesystem::path& path, std::string_view field) {
  dom::parser parser;
  std::vector<Case> out;
  dom::element doc = parser.load(path.string()).value();
  dom::array cases = doc.get_array().value();
  for (dom::element c : cases) {
    Case k;
    k.name = std::string(c["name"].get_string().value());
    k.json = simdjson::minify(c[field]);
    std::string_view rkey;
    if (c["rkey"].get_string().get(rkey) == simdjson::SUCCESS) k.rkey = std::string(rkey);
    out.push_back(std::move(k));
  }
  return out;
}

LexiconCatalog Build(const LexiconCatalog::Builder& builder) {
  auto built = builder.Build();
  EXPECT_TRUE(built.ok()) << built.status().ToString();
  return std::move(*built);
}

// A one-record catalog from the text of its lexicon.
LexiconCatalog Catalog(std::string_view lexicon) {
  LexiconCatalog::Builder b;
  Status s = b.Add(lexicon);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return Build(b);
}

TEST(LexiconVectorsTest, ValidLexiconsLoad) {
  ATFILL_SHARED_PATH(path, std::string(kVectors) + "lexicon-valid.json");
  auto cases = ReadCases(path, "lexicon");
  ASSERT_GE(cases.size(), 3u);
  for (const auto& c : cases) {
    EXPECT_TRUE(CheckLexiconDocument(c.json).ok())
        << c.name << ": " << CheckLexiconDocument(c.json).ToString();
  }
}

TEST(LexiconVectorsTest, InvalidLexiconsAreRefusedWithAReason) {
  ATFILL_SHARED_PATH(path, std::string(kVectors) + "lexicon-invalid.json");
  auto cases = ReadCases(path, "lexicon");
  ASSERT_GE(cases.size(), 7u);
  std::map<std::string, std::string> expected_reason = {
      {"invalid lexicon field", "lexicon must be the integer 1"},
      {"invalid id field", "id must be a string"},
      {"invalid NSID", "is not an NSID"},
      {"defined unknown", "type unknown is not allowed"},
      {"defined ref", "type ref is not allowed"},
      {"non-main primary", "type record is not allowed as a definition other than main"},
      {"record missing type object", "defs.main.record: must be a schema of type object"},
  };
  for (const auto& c : cases) {
    Status s = CheckLexiconDocument(c.json);
    ASSERT_FALSE(s.ok()) << c.name << " was accepted";
    auto it = expected_reason.find(c.name);
    ASSERT_NE(it, expected_reason.end()) << "a case this test does not know: " << c.name;
    EXPECT_NE(s.message().find(it->second), std::string::npos) << c.name << ": " << s.ToString();
  }
}

LexiconCatalog VectorCatalog(const std::filesystem::path& dir) {
  LexiconCatalog::Builder b;
  Status s = b.AddPath(dir);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(b.size(), 5u);
  return Build(b);
}

TEST(LexiconVectorsTest, ValidRecordsPass) {
  ATFILL_SHARED_PATH(catalog_dir, std::string(kVectors) + "catalog");
  ATFILL_SHARED_PATH(path, std::string(kVectors) + "record-data-valid.json");
  const LexiconCatalog catalog = VectorCatalog(catalog_dir);
  // The procedure's body refers to a lexicon the folder does not hold.
  EXPECT_EQ(catalog.unresolved(), std::vector<std::string>{"app.bsky.actor.defs#preferences"});
  auto cases = ReadCases(path, "data");
  ASSERT_GE(cases.size(), 3u);
  for (const auto& c : cases) {
    auto v = catalog.ValidateJson("example.lexicon.record", c.rkey, c.json);
    EXPECT_TRUE(v.valid()) << c.name << ": " << v.Describe();
  }
}

TEST(LexiconVectorsTest, InvalidRecordsFailNamingThePath) {
  ATFILL_SHARED_PATH(catalog_dir, std::string(kVectors) + "catalog");
  ATFILL_SHARED_PATH(path, std::string(kVectors) + "record-data-invalid.json");
  const LexiconCatalog catalog = VectorCatalog(catalog_dir);
  auto cases = ReadCases(path, "data");
  ASSERT_GE(cases.size(), 50u);
  dom::parser parser;
  for (const auto& c : cases) {
    auto v = catalog.ValidateJson("example.lexicon.record", c.rkey, c.json);
    EXPECT_EQ(v.outcome, LexiconVerdict::Outcome::kInvalid) << c.name << " passed";
    EXPECT_FALSE(v.reason.empty()) << c.name;
    // Each case breaks one field: the verdict's path starts with it (the required one is the
    // missing "integer").
    dom::element data = parser.parse(c.json).value();
    std::string field = "integer";
    dom::object fields = data.get_object().value();
    for (auto [key, value] : fields) {
      if (key != "$type" && key != "integer") field = std::string(key);
    }
    if (c.name == "invalid integer field") field = "integer";
    EXPECT_EQ(v.path.substr(0, field.size()), field) << c.name << ": " << v.Describe();
  }
}

TEST(LexiconVectorsTest, VerdictsSayWhatIsWrong) {
  ATFILL_SHARED_PATH(catalog_dir, std::string(kVectors) + "catalog");
  const LexiconCatalog catalog = VectorCatalog(catalog_dir);
  auto check = [&](std::string fields) {
    return catalog
        .ValidateJson("example.lexicon.record", "demo",
                      R"({"$type":"example.lexicon.record","integer":1)" + fields + "}")
        .Describe();
  };
  EXPECT_EQ(check(""), "");
  EXPECT_EQ(
      catalog
          .ValidateJson("example.lexicon.record", "demo", R"({"$type":"example.lexicon.record"})")
          .Describe(),
      "integer: required field is missing");
  EXPECT_EQ(check(R"(,"rangeInteger":9000)"), "rangeInteger: 9000 is above the maximum 20");
  EXPECT_EQ(check(R"(,"lenString":".")"), "lenString: string is shorter than 10 bytes (1)");
  EXPECT_EQ(check(R"(,"graphemeString":"abcdefg-abcdefg-abcdefg")"),
            "graphemeString: string is longer than 20 graphemes (23)");
  EXPECT_EQ(check(R"(,"array":[1,2,true])"), "array[2]: expected an integer, got a boolean");
  EXPECT_EQ(check(R"(,"object":{"a":"x"})"), "object.a: expected an integer, got a string");
  EXPECT_EQ(check(R"(,"object":{"$bytes":"AAEC"})"), "object: expected an object, got bytes");
  EXPECT_EQ(check(R"(,"union":{"$type":"example.lexicon.record#demoObject","a":"x"})"),
            "union.a: expected an integer, got a string");
  EXPECT_EQ(check(R"(,"formats":{"did":"123"})").substr(0, 25), "formats.did: not a valid ");
  EXPECT_EQ(check(R"(,"string":null)"), "string: must not be null");
  EXPECT_EQ(check(R"(,"nullableString":null)"), "");
  EXPECT_EQ(
      check(R"(,"acceptBlob":{"$type":"blob","mimeType":"text/plain","size":1,)"
            R"("ref":{"$link":"bafkreiclp443lavogvhj3d2ob2cxbfuscni2k5jk7bebjzg7khl3esabwq"}})"),
      "acceptBlob: blob type \"text/plain\" is not accepted (image/*)");
  // The record's key follows its lexicon's key type (literal:demo).
  EXPECT_EQ(catalog
                .ValidateJson("example.lexicon.record", "other",
                              R"({"$type":"example.lexicon.record","integer":1})")
                .Describe(),
            "record key \"other\": must be \"demo\"");
  // $type names the collection.
  EXPECT_EQ(catalog.ValidateJson("example.lexicon.record", "demo", R"({"integer":1})").Describe(),
            "$type: a record needs a $type");
  // A collection the catalog has no lexicon for is neither valid nor invalid.
  EXPECT_EQ(
      catalog.ValidateJson("com.example.other", "x", R"({"$type":"com.example.other"})").outcome,
      LexiconVerdict::Outcome::kUnknown);
}

TEST(LexiconTest, DocumentsAreCheckedWithThePathOfTheFault) {
  auto doc = [](std::string main) {
    return R"({"lexicon":1,"id":"com.example.thing","defs":{"main":)" + main + "}}";
  };
  auto message = [&](std::string main) { return CheckLexiconDocument(doc(main)).message(); };
  EXPECT_TRUE(CheckLexiconDocument(doc(R"({"type":"token"})")).ok());
  EXPECT_EQ(message(R"({"type":"string","format":"email"})"),
            "com.example.thing: defs.main.format: unknown string format 'email'");
  EXPECT_EQ(message(R"({"type":"record","key":"tid","record":{"type":"object","required":["a"]}})"),
            "com.example.thing: defs.main.record: required field 'a' is not among the properties");
  EXPECT_EQ(message(R"({"type":"record","key":"uuid","record":{"type":"object"}})"),
            "com.example.thing: defs.main.key: unknown record key type 'uuid'");
  EXPECT_EQ(message(R"({"type":"object","properties":{"x":{"type":"string","maxLength":-1}}})"),
            "com.example.thing: defs.main.properties.x.maxLength: must be a non-negative integer");
  EXPECT_EQ(message(R"({"type":"object","properties":{"x":{"type":"stirng"}}})"),
            "com.example.thing: defs.main.properties.x: unknown type 'stirng'");
  EXPECT_EQ(message(R"({"type":"array"})"), "com.example.thing: defs.main: an array needs items");
  EXPECT_EQ(message(R"({"type":"integer","minimum":5,"maximum":1})"),
            "com.example.thing: defs.main: minimum is above maximum");
  EXPECT_EQ(CheckLexiconDocument("{").message().substr(0, 9), "not JSON:");
}

constexpr const char* kPostLike = R"({"lexicon":1,"id":"com.example.post","defs":{
  "main":{"type":"record","key":"tid","record":{"type":"object","required":["text"],
    "properties":{
      "text":{"type":"string","maxLength":30,"maxGraphemes":10},
      "embed":{"type":"union","refs":["#images","com.example.other#video"]},
      "tags":{"type":"array","items":{"type":"string","format":"nsid"},"maxLength":2},
      "kind":{"type":"ref","ref":"#kind"}}}},
  "images":{"type":"object","required":["images"],"properties":{
    "images":{"type":"array","items":{"type":"ref","ref":"#image"}}}},
  "image":{"type":"object","required":["alt","image"],"properties":{
    "alt":{"type":"string","maxGraphemes":5},
    "image":{"type":"blob","accept":["image/*"],"maxSize":1000}}},
  "kind":{"type":"string","knownValues":["a","b"]}}})";

constexpr const char* kBlobRef =
    R"({"$link":"bafkreiclp443lavogvhj3d2ob2cxbfuscni2k5jk7bebjzg7khl3esabwq"})";

TEST(LexiconTest, PathsThroughUnionsArraysAndRefs) {
  const LexiconCatalog catalog = Catalog(kPostLike);
  ASSERT_TRUE(catalog.HasRecord("com.example.post"));
  ASSERT_EQ(catalog.unresolved(), std::vector<std::string>{"com.example.other#video"});
  const std::string image = std::string(R"({"alt":"ok","image":{"$type":"blob","ref":)") +
                            kBlobRef + R"(,"mimeType":"image/png","size":10}})";
  const std::string bad_image = std::string(R"({"alt":"too long","image":{"$type":"blob","ref":)") +
                                kBlobRef + R"(,"mimeType":"image/png","size":10}})";
  auto post = [](std::string rest) {
    return R"({"$type":"com.example.post","text":"hi")" + rest + "}";
  };
  const std::string rkey = "3kznmn7xqxl22";
  EXPECT_TRUE(catalog.ValidateJson("com.example.post", rkey, post("")).valid());
  EXPECT_EQ(catalog
                .ValidateJson("com.example.post", rkey,
                              post(R"(,"embed":{"$type":"com.example.post#images","images":[)" +
                                   image + "," + image + "," + bad_image + "]}"))
                .Describe(),
            "embed.images[2].alt: string is longer than 5 graphemes (8)");
  EXPECT_TRUE(catalog
                  .ValidateJson("com.example.post", rkey,
                                post(R"(,"embed":{"$type":"com.example.post#images","images":[)" +
                                     image + "]}"))
                  .valid());
  // An open union lets a type it does not list pass; a listed type the catalog lacks does not.
  EXPECT_TRUE(catalog
                  .ValidateJson("com.example.post", rkey,
                                post(R"(,"embed":{"$type":"com.example.elsewhere","x":1})"))
                  .valid());
  EXPECT_EQ(catalog
                .ValidateJson("com.example.post", rkey,
                              post(R"(,"embed":{"$type":"com.example.other#video"})"))
                .Describe(),
            "embed: ref com.example.other#video is not in the catalog");
  EXPECT_EQ(catalog.ValidateJson("com.example.post", rkey, post(R"(,"tags":["a.b.c","x"])"))
                .Describe()
                .substr(0, 26),
            "tags[1]: not a valid nsid:");
  // knownValues are advice: other strings pass.
  EXPECT_TRUE(catalog.ValidateJson("com.example.post", rkey, post(R"(,"kind":"z")")).valid());
  EXPECT_EQ(catalog.ValidateJson("com.example.post", "self", post("")).Describe().substr(0, 20),
            "record key \"self\": t");
  // Graphemes, not bytes or code points: five family emoji are five graphemes in 125 bytes, over
  // the 30-byte limit; ten combining sequences fit in ten graphemes.
  EXPECT_EQ(catalog
                .ValidateJson("com.example.post", rkey,
                              R"({"$type":"com.example.post","text":"e\u0301e\u0301e\u0301"})")
                .Describe(),
            "");
  EXPECT_EQ(catalog
                .ValidateJson("com.example.post", rkey,
                              R"({"$type":"com.example.post","text":"abcdefghijk"})")
                .Describe(),
            "text: string is longer than 10 graphemes (11)");
}

TEST(LexiconTest, GraphemeClusters) {
  EXPECT_EQ(CountGraphemes(""), 0u);
  EXPECT_EQ(CountGraphemes("abc"), 3u);
  EXPECT_EQ(CountGraphemes("a\r\nb"), 3u);
  EXPECT_EQ(CountGraphemes("e\xcc\x81"), 1u);  // e + combining acute
  // family: man ZWJ woman ZWJ girl
  EXPECT_EQ(
      CountGraphemes("\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7"),
      1u);
  // two regional indicators (a flag), then one more
  EXPECT_EQ(CountGraphemes("\xf0\x9f\x87\xa9\xf0\x9f\x87\xaa\xf0\x9f\x87\xa9"), 2u);
}

TEST(LexiconTest, LegacyBlobsAndBytes) {
  const LexiconCatalog catalog = Catalog(R"({"lexicon":1,"id":"com.example.pic","defs":{"main":{
    "type":"record","key":"any","record":{"type":"object","properties":{
      "pic":{"type":"blob","accept":["image/jpeg"],"maxSize":5},
      "raw":{"type":"bytes","maxLength":3},
      "link":{"type":"cid-link"},
      "any":{"type":"unknown"}}}}}})");
  auto v = [&](std::string fields) {
    return catalog
        .ValidateJson("com.example.pic", "x", R"({"$type":"com.example.pic")" + fields + "}")
        .Describe();
  };
  EXPECT_EQ(
      v(R"(,"pic":{"cid":"bafkreiclp443lavogvhj3d2ob2cxbfuscni2k5jk7bebjzg7khl3esabwq","mimeType":"image/jpeg"})"),
      "");
  EXPECT_EQ(
      v(R"(,"pic":{"$type":"blob","ref":{"$link":"bafkreiclp443lavogvhj3d2ob2cxbfuscni2k5jk7bebjzg7khl3esabwq"},"mimeType":"image/jpeg","size":6})"),
      "pic: blob is larger than 5 bytes (6)");
  EXPECT_EQ(v(R"(,"pic":{"$type":"blob","ref":{"$link":"nope"},"mimeType":"image/jpeg","size":1})")
                .substr(0, 15),
            "pic.ref: $link:");
  EXPECT_EQ(v(R"(,"raw":{"$bytes":"AAEC"})"), "");
  EXPECT_EQ(v(R"(,"raw":{"$bytes":"AAECAw"})"), "raw: bytes are longer than 3 (4)");
  EXPECT_EQ(v(R"(,"raw":{"$bytes":"A"})"), "raw: $bytes is not base64");
  EXPECT_EQ(v(R"(,"link":{"$link":"x"})").substr(0, 12), "link: $link:");
  EXPECT_EQ(v(R"(,"any":[1])"), "any: expected an object, got an array");
  EXPECT_EQ(v(R"(,"any":{"$link":"bafkreiclp443lavogvhj3d2ob2cxbfuscni2k5jk7bebjzg7khl3esabwq"})"),
            "any: expected an object, got a cid-link");
  EXPECT_EQ(v(R"(,"any":{"x":{"$link":"y"}})"), "");
}

TEST(LexiconTest, BuilderReplacesAndRemovesDocuments) {
  LexiconCatalog::Builder b;
  std::string nsid;
  ASSERT_TRUE(b.Add(kPostLike, "post.json", &nsid).ok());
  EXPECT_EQ(nsid, "com.example.post");
  Status bad =
      b.Add(R"({"lexicon":1,"id":"com.example.bad","defs":{"main":{"type":"ref"}}})", "bad.json");
  EXPECT_EQ(bad.message().substr(0, 10), "bad.json: ");
  EXPECT_FALSE(b.Contains("com.example.bad"));
  ASSERT_TRUE(b.Add(R"({"lexicon":1,"id":"com.example.post","defs":{"main":{"type":"record",
      "key":"any","record":{"type":"object","required":["n"],"properties":{"n":{"type":"integer"}}}}}})")
                  .ok());
  EXPECT_EQ(b.size(), 1u);
  LexiconCatalog c = Build(b);
  EXPECT_EQ(c.ValidateJson("com.example.post", "x", R"({"$type":"com.example.post","text":"hi"})")
                .Describe(),
            "n: required field is missing");
  EXPECT_TRUE(b.Remove("com.example.post"));
  EXPECT_FALSE(b.Remove("com.example.post"));
  EXPECT_FALSE(Build(b).HasRecord("com.example.post"));
  EXPECT_EQ(b.AddPath("/nonexistent/lexicons").code(), StatusCode::kNotFound);
}

// Every atproto lexicon (app.bsky, chat.bsky, com.atproto, tools.ozone) loads, and every ref among
// them resolves.
TEST(AtprotoLexiconsTest, AllLoadAndResolve) {
  ATFILL_SHARED_PATH(dir, "lexicons");
  LexiconCatalog::Builder b;
  Status s = b.AddPath(dir);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_GT(b.size(), 300u);
  LexiconCatalog catalog = Build(b);
  EXPECT_TRUE(catalog.unresolved().empty()) << catalog.unresolved().front();
  EXPECT_TRUE(catalog.HasRecord("app.bsky.feed.post"));
  EXPECT_TRUE(catalog.HasRecord("app.bsky.actor.profile"));
  EXPECT_TRUE(catalog.HasRecord("com.atproto.lexicon.schema"));
}

// Real records from the network pass their lexicons.
TEST(AtprotoLexiconsTest, ProductionRecordsValidate) {
  ATFILL_SHARED_PATH(dir, "lexicons");
  ATFILL_SHARED_PATH(corpus, "protocols/jetstream/data/internal/corpus/testdata/expected_v1.jsonl");
  ATFILL_SHARED_PATH(golden,
                     "protocols/jetstream/data/internal/subscribe/testdata/golden_v1.jsonl");
  LexiconCatalog::Builder b;
  ASSERT_TRUE(b.AddPath(dir).ok());
  const LexiconCatalog catalog = Build(b);
  dom::parser parser;
  size_t known = 0;
  size_t unknown = 0;
  for (const auto& path : {corpus, golden}) {
    testing::ForEachRecordCommit(path, parser, [&](dom::element commit) {
      const std::string collection(commit["collection"].get_string().value());
      const std::string rkey(commit["rkey"].get_string().value());
      auto v = catalog.Validate(collection, rkey, commit["record"].value());
      if (v.outcome == LexiconVerdict::Outcome::kUnknown) {
        ++unknown;
        return;
      }
      ++known;
      EXPECT_TRUE(v.valid()) << collection << "/" << rkey << ": " << v.Describe() << "\n"
                             << simdjson::minify(commit);
    });
  }
  EXPECT_GT(known, 100u);
  std::cout << known << " records validated, " << unknown << " of collections without a lexicon\n";
}

}  // namespace
}  // namespace atfill::atproto
