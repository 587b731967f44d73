// Realistic Bluesky records, the same in every bench that costs a record (datamodel_bench's CID
// path, lexicon_bench's validation).
#pragma once

#include <string>

namespace atfill::bench {

// ~300 bytes: an app.bsky.feed.post with text, createdAt, langs and a hashtag facet.
inline const std::string& SmallPost() {
  static const std::string json =
      R"({"$type":"app.bsky.feed.post","text":"Finished the distributed systems book )"
      R"(tonight. The chapter on consensus finally made Raft click for me. #reading",)"
      R"("createdAt":"2024-11-05T21:14:09.387Z","langs":["en"],"facets":[{"index":)"
      R"({"byteStart":109,"byteEnd":117},"features":[{"$type":"app.bsky.richtext.facet#tag",)"
      R"("tag":"reading"}]}]})";
  return json;
}

// ~2 KB: a reply (root and parent strongRefs) with a quote of another post and three images
// (blob refs, alt text, aspect ratios), link and mention facets, and self-labels.
inline const std::string& LargePost() {
  static const std::string json = [] {
    std::string images;
    for (int i = 0; i < 3; ++i) {
      if (i > 0) images += ",";
      images += R"({"alt":"Photo )" + std::to_string(i + 1) +
                R"( of the harbour at dusk: fishing boats moored along the quay, gulls on the )"
                R"(railings, and the lighthouse just switching on in the distance.",)"
                R"("image":{"$type":"blob","ref":{"$link":"bafkreihdwdcefgh4dqkjv67uzcmw7ojee6)"
                R"(xedzdetojuzjevtenxquvyku"},"mimeType":"image/jpeg","size":)" +
                std::to_string(734512 + i * 1031) +
                R"(},"aspectRatio":{"width":2000,)"
                R"("height":1500}})";
    }
    return std::string(R"({"$type":"app.bsky.feed.post",)") +
           R"("text":"Evening walk along the harbour with @alice.example.com. The new )"
           R"(waterfront path is open; details and opening hours on the city site: )"
           R"(https://example.org/harbour-path and more photos later this week.",)"
           R"("createdAt":"2024-11-05T18:42:51.112Z","langs":["en","nl"],)"
           R"("reply":{"root":{"uri":"at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/app.bsky.feed.post/)"
           R"(3l7x2kb6qzs2a","cid":)"
           R"("bafyreiclp443lavogvhj3d2ob2cxbfuscni2k5jk7bebjzg7khl3esabwq"},)"
           R"("parent":{"uri":"at://did:plc:vwzwgnygau7ed7b7wt5ux7y2/app.bsky.feed.post/)"
           R"(3l7x3hjm5ur2c","cid":)"
           R"("bafyreihldkhcwijkde7gx4rpkkuw7pl6lbyu5gieunyc7ihactn5bkd2nm"}},)"
           R"("embed":{"$type":"app.bsky.embed.recordWithMedia","record":{"$type":)"
           R"("app.bsky.embed.record","record":{"uri":"at://did:plc:z72i7hdynmk6r22z27h6tvur/)"
           R"(app.bsky.feed.post/3l7wzq4xkbc2k","cid":)"
           R"("bafyreid3imdulnhgeytpf6uk7zahjvrsqlofkmm5b5ub2maw4kqus6jp4i"}},)"
           R"("media":{"$type":"app.bsky.embed.images","images":[)" +
           images +
           R"(]}},"facets":[{"index":{"byteStart":36,"byteEnd":54},"features":[{"$type":)"
           R"("app.bsky.richtext.facet#mention","did":"did:plc:vwzwgnygau7ed7b7wt5ux7y2"}]},)"
           R"({"index":{"byteStart":141,"byteEnd":173},"features":[{"$type":)"
           R"("app.bsky.richtext.facet#link","uri":"https://example.org/harbour-path"}]}],)"
           R"("labels":{"$type":"com.atproto.label.defs#selfLabels","values":[]},)"
           R"("tags":["harbour","photography"]})";
  }();
  return json;
}

// ~230 bytes: an app.bsky.feed.like (a strongRef to the post liked).
inline const std::string& Like() {
  static const std::string json =
      R"({"$type":"app.bsky.feed.like","subject":{"uri":"at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/)"
      R"(app.bsky.feed.post/3l7x2kb6qzs2a","cid":)"
      R"("bafyreiclp443lavogvhj3d2ob2cxbfuscni2k5jk7bebjzg7khl3esabwq"},)"
      R"("createdAt":"2024-11-05T21:15:40.021Z"})";
  return json;
}

}  // namespace atfill::bench
