// The live consumer's collections changed at run time (sources/live_collections.hpp): what is
// saved, what a restart finds, what a config edited while atfill was stopped changes.
#include "sources/live_collections.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pipeline/components.hpp"
#include "sources/components.hpp"
#include "state/kv_store.hpp"

namespace atfill::sources {
namespace {

using Names = std::vector<std::string>;

TEST(LiveCollectionsTest, ChangesAreSavedAndHeardAndARestartKeepsThem) {
  auto kv = state::NewMemoryKvStore();
  {
    LiveCollections live(kv.get(), {"app.bsky.feed.post"});
    auto first = live.Load();
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    EXPECT_FALSE(first->changed());
    Names heard;
    live.Listen([&](const Names& now) {
      heard = now;
      return Status::OK();
    });
    auto change = live.Apply({"app.bsky.feed.like", "app.bsky.feed.post"}, {});
    ASSERT_TRUE(change.ok()) << change.status().ToString();
    EXPECT_EQ(change->added, Names{"app.bsky.feed.like"});  // post was there already
    EXPECT_TRUE(change->removed.empty());
    EXPECT_EQ(heard, (Names{"app.bsky.feed.like", "app.bsky.feed.post"}));
    // Refused, and nothing changes: an empty set would take every collection.
    EXPECT_EQ(live.Apply({}, {"app.bsky.feed.like", "app.bsky.feed.post"}).status().code(),
              StatusCode::kInvalid);
    EXPECT_EQ(live.Apply({"not an nsid"}, {}).status().code(), StatusCode::kInvalid);
    EXPECT_EQ(live.Current(), (Names{"app.bsky.feed.like", "app.bsky.feed.post"}));
  }
  // A restart with the same config keeps what was changed at run time.
  {
    LiveCollections live(kv.get(), {"app.bsky.feed.post"});
    auto loaded = live.Load();
    ASSERT_TRUE(loaded.ok());
    EXPECT_FALSE(loaded->changed());
    EXPECT_EQ(live.Current(), (Names{"app.bsky.feed.like", "app.bsky.feed.post"}));
  }
  // The config edited while stopped: its difference applies at the next start, and a reload
  // later applies only what the config changes again.
  {
    LiveCollections live(kv.get(), {"app.bsky.feed.post", "app.bsky.graph.follow"});
    auto loaded = live.Load();
    ASSERT_TRUE(loaded.ok());
    EXPECT_EQ(loaded->added, Names{"app.bsky.graph.follow"});
    EXPECT_EQ(live.Current(),
              (Names{"app.bsky.feed.like", "app.bsky.feed.post", "app.bsky.graph.follow"}));
    auto reload = live.Reload({"app.bsky.graph.follow"});
    ASSERT_TRUE(reload.ok());
    EXPECT_EQ(reload->removed, Names{"app.bsky.feed.post"});
    EXPECT_EQ(live.Current(), (Names{"app.bsky.feed.like", "app.bsky.graph.follow"}));
    auto again = live.Reload({"app.bsky.graph.follow"});
    ASSERT_TRUE(again.ok());
    EXPECT_FALSE(again->changed());
  }
}

TEST(LiveCollectionsTest, EveryCollectionCannotChange) {
  auto kv = state::NewMemoryKvStore();
  LiveCollections live(kv.get(), {});
  ASSERT_TRUE(live.Load().ok());
  auto refused = live.Apply({"app.bsky.feed.like"}, {});
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalid);
  EXPECT_NE(refused.status().message().find("every collection"), std::string::npos);
}

// [lexicons] track_network: the live consumer also takes the lexicon records accounts publish,
// whatever its collections (unless they already take them).
TEST(LiveCollectionsTest, TrackingTheNetworksLexiconsAddsTheirCollection) {
  pipeline::Components components;
  Register(components);
  auto collections = [&](const std::string& text) -> Names {
    auto settings = components.ParseConfig(text, "test.toml");
    EXPECT_TRUE(settings.ok()) << settings.status().ToString();
    if (!settings.ok()) return {};
    return settings->Get<SourceSettings>().live.collections;
  };
  const std::string live = "[live]\nhosts = [\"wss://jetstream.example\"]\n";
  EXPECT_EQ(collections(live + "collections = [\"app.bsky.feed.like\"]\n"),
            Names{"app.bsky.feed.like"});
  EXPECT_EQ(collections(live + "collections = [\"app.bsky.feed.like\"]\n[lexicons]\n"
                               "track_network = true\n"),
            (Names{"app.bsky.feed.like", "com.atproto.lexicon.schema"}));
  EXPECT_EQ(collections(live + "collections = [\"com.atproto.*\"]\n[lexicons]\n"
                               "track_network = true\n"),
            Names{"com.atproto.*"});
  // No collections: the consumer takes every one, lexicons included.
  EXPECT_EQ(collections(live + "[lexicons]\ntrack_network = true\n"), Names{});
}

}  // namespace
}  // namespace atfill::sources
