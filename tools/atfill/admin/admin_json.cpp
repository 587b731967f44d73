// What the admin API answers, as JSON: jobs, their counters, stages, hosts, errors and batches,
// the live consumer's status and history, collections (docs/admin.md).
#include "tools/atfill/admin/admin_internal.hpp"

namespace atfill::admin {

void WriteCounters(JsonWriter& w, const state::JobCounters& c) {
  w.BeginObject();
  w.Key("total_repos").Uint(c.total_repos).Key("resolved_repos").Uint(c.resolved_repos);
  w.Key("processed_repos").Uint(c.processed_repos).Key("total_records").Uint(c.total_records);
  w.Key("records_written").Uint(c.records_written).Key("failed_records").Uint(c.failed_records);
  w.Key("bytes").Uint(c.bytes).Key("events_read").Uint(c.events_read);
  for (const auto& [k, v] : c.extra) w.Key(k).Uint(v);
  w.EndObject();
}

void WriteProgress(JsonWriter& w, const state::JobRecord& job, int64_t now_us) {
  const auto p = pipeline::DeriveProgress(job, now_us);
  w.BeginObject();
  if (p.percent >= 0) {
    w.Key("percent").Double(p.percent);
  } else {
    w.Key("percent").Null();
  }
  w.Key("records_per_s").Double(p.records_per_s).Key("events_per_s").Double(p.events_per_s);
  if (p.eta_s >= 0) {
    w.Key("eta_s").Int(p.eta_s);
  } else {
    w.Key("eta_s").Null();
  }
  w.EndObject();
}

void WriteStopReason(JsonWriter& w, const state::StopReason& reason) {
  if (reason.empty()) {
    w.Null();
    return;
  }
  w.BeginObject().Key("code").String(reason.code);
  w.Key("sentence").String(reason.sentence).EndObject();
}

void WriteWaiting(JsonWriter& w, const state::JobRecord& job) {
  if (job.waiting.empty()) {
    w.Null();
    return;
  }
  w.BeginObject().Key("code").String(job.waiting.code);
  w.Key("sentence").String(job.waiting.sentence);
  w.Key("since").String(FormatTime(job.waiting_since_us)).EndObject();
}

void WriteParams(JsonWriter& w, const std::map<std::string, std::string>& params) {
  w.BeginObject();
  for (const auto& [k, v] : params) {
    w.Key(k);
    if (std::find(std::begin(kListParams), std::end(kListParams), k) == std::end(kListParams)) {
      w.String(v);
      continue;
    }
    w.BeginArray();
    std::string_view rest = v;
    while (!rest.empty()) {
      const size_t nl = rest.find('\n');
      const std::string_view item = rest.substr(0, nl);
      if (!item.empty()) w.String(item);
      rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
    }
    w.EndArray();
  }
  w.EndObject();
}

void WriteJobFields(JsonWriter& w, const state::JobRecord& job, int64_t now_us) {
  w.Key("id").Uint(job.id).Key("kind").String(job.kind);
  w.Key("status").String(state::JobStatusName(job.status));
  w.Key("stage").String(state::JobStageName(job.stage));
  w.Key("started_by").String(job.started_by);
  w.Key("created_at").String(FormatTime(job.created_us));
  w.Key("started_at").String(FormatTime(job.started_us));
  w.Key("updated_at").String(FormatTime(job.updated_us));
  w.Key("finished_at").String(FormatTime(job.finished_us));
  w.Key("heartbeat_at").String(FormatTime(job.heartbeat_us));
  w.Key("counters");
  WriteCounters(w, job.counters);
  w.Key("progress");
  WriteProgress(w, job, now_us);
  w.Key("stop_reason");
  WriteStopReason(w, job.stop_reason);
  w.Key("waiting");
  WriteWaiting(w, job);
  w.Key("params");
  WriteParams(w, job.params);
}

void WriteHosts(JsonWriter& w, const std::vector<state::HostSummary>& hosts) {
  w.BeginArray();
  for (const auto& h : hosts) {
    w.BeginObject().Key("host").String(h.host).Key("units").Uint(h.units);
    w.Key("done").Uint(h.done).Key("errors").Uint(h.errors).Key("records").Uint(h.records);
    w.EndObject();
  }
  w.EndArray();
}

void WriteRecent(JsonWriter& w, const std::vector<state::RecentRepo>& recent) {
  w.BeginArray();
  for (const auto& r : recent) {
    w.BeginObject().Key("seq").Uint(r.seq).Key("did").String(r.did).Key("host").String(r.host);
    w.Key("rev").String(r.rev).Key("records").Uint(r.records).Key("outcome").String(r.outcome);
    w.Key("fetched_at").String(FormatTime(r.fetched_at_us)).EndObject();
  }
  w.EndArray();
}

void WriteErrorsByKind(JsonWriter& w, const std::map<std::string, uint64_t>& counts) {
  w.BeginObject();
  for (const auto& [k, v] : counts) w.Key(k).Uint(v);
  w.EndObject();
}

void WriteStageChange(JsonWriter& w, uint64_t job_id, const StageChange& c) {
  w.BeginObject();
  if (job_id != 0) w.Key("id").Uint(job_id);
  w.Key("index").Uint(c.index);
  w.Key("from").String(state::JobStageName(c.from)).Key("to").String(state::JobStageName(c.to));
  w.Key("at").String(FormatTime(c.at_us)).EndObject();
}

std::string BatchesJson(uint64_t id, uint64_t from, const std::vector<state::BatchAudit>& batches) {
  JsonWriter w;
  w.BeginObject().Key("id").Uint(id).Key("batches").BeginArray();
  for (const auto& b : batches) {
    w.BeginObject().Key("batch").Uint(b.batch_no).Key("from").String(b.first_position);
    w.Key("to").String(b.last_position).Key("count").Uint(b.count);
    w.Key("failures").Uint(b.failures).Key("duration_us").Int(b.duration_us);
    w.Key("attempts").Uint(b.attempts).Key("committed_at").String(FormatTime(b.committed_at_us));
    w.Key("committed_us").Int(b.committed_at_us).EndObject();
  }
  w.EndArray();
  w.Key("next").Uint(batches.empty() ? from : batches.back().batch_no + 1);
  w.EndObject();
  return w.Take();
}

std::string LiveHistoryJson(const std::vector<LiveSample>& samples, int64_t interval_ms) {
  JsonWriter w;
  w.BeginObject().Key("interval_ms").Int(interval_ms).Key("samples").BeginArray();
  for (const auto& s : samples) {
    w.BeginObject().Key("at_us").Int(s.at_us).Key("lag_s");
    if (s.lag_s >= 0) {
      w.Double(s.lag_s);
    } else {
      w.Null();
    }
    w.Key("cursor").Uint(s.cursor).EndObject();
  }
  w.EndArray().EndObject();
  return w.Take();
}

std::string ErrorJson(std::string_view message) {
  JsonWriter w;
  w.BeginObject().Key("error").String(message).EndObject();
  return w.Take();
}

void WriteLabels(JsonWriter& w, const LabelsStatus& l) {
  w.BeginObject().Key("configured").Bool(l.configured);
  {
    w.Key("status").String(l.status).Key("job_id");
    if (l.job_id != 0) {
      w.Uint(l.job_id);
    } else {
      w.Null();
    }
    w.Key("labelers").BeginArray();
    for (const LabelerCursor& c : l.labelers) {
      w.BeginObject().Key("did").String(c.did).Key("cursor").Uint(c.cursor).EndObject();
    }
    w.EndArray();
    w.Key("labels_per_s").Double(l.labels_per_s);
    w.Key("frames").Uint(l.frames).Key("labels").Uint(l.labels);
    w.Key("stored").Uint(l.stored).Key("negated").Uint(l.negated).Key("stale").Uint(l.stale);
    w.Key("refused").Uint(l.refused).Key("refused_by").BeginObject();
    for (const auto& [kind, n] : l.refused_by) w.Key(kind).Uint(n);
    w.EndObject();
    w.Key("bad_frames").Uint(l.bad_frames).Key("connection_errors").Uint(l.connection_errors);
    w.Key("error");
    if (!l.error.empty()) {
      w.String(l.error);
    } else {
      w.Null();
    }
  }
  w.EndObject();
}

std::string LiveJson(const LiveStatus& live) {
  JsonWriter w;
  w.BeginObject().Key("configured").Bool(live.configured);
  if (live.configured) {
    w.Key("status").String(live.status).Key("host").String(live.host);
    w.Key("protocol").String(live.protocol).Key("cursor").Uint(live.cursor);
    w.Key("witnessed_at").String(FormatTime(live.witnessed_us));
    w.Key("witnessed_us").Int(live.witnessed_us);
    w.Key("lag_s");
    if (live.lag_s >= 0) {
      w.Double(live.lag_s);
    } else {
      w.Null();
    }
    w.Key("events_per_s").Double(live.events_per_s);
    w.Key("records_per_s").Double(live.records_per_s);
    w.Key("job_id");
    if (live.job_id != 0) {
      w.Uint(live.job_id);
    } else {
      w.Null();
    }
    w.Key("error");
    if (!live.error.empty()) {
      w.String(live.error);
    } else {
      w.Null();
    }
  }
  if (live.labels.configured) {
    w.Key("labels");
    WriteLabels(w, live.labels);
  }
  w.EndObject();
  return w.Take();
}

std::string CollectionsJson(const CollectionsAnswer& a, bool change) {
  JsonWriter w;
  w.BeginObject().Key("collections").BeginArray();
  for (const auto& c : a.collections) w.String(c);
  w.EndArray();
  if (change) {
    w.Key("added").BeginArray();
    for (const auto& c : a.added) w.String(c);
    w.EndArray().Key("removed").BeginArray();
    for (const auto& c : a.removed) w.String(c);
    w.EndArray();
    if (a.backfill_job != 0) {
      w.Key("backfill_job").Uint(a.backfill_job);
    } else {
      w.Key("backfill_job").Null();
    }
    w.Key("purged").BeginObject();
    for (const auto& [c, n] : a.purged) w.Key(c).Uint(n);
    w.EndObject();
  }
  w.EndObject();
  return w.Take();
}

std::string LexiconsJson(const std::vector<LexiconInfo>& lexicons) {
  JsonWriter w;
  w.BeginObject().Key("lexicons").BeginArray();
  for (const auto& l : lexicons) {
    w.BeginObject().Key("nsid").String(l.nsid).Key("record").Bool(l.record);
    w.Key("source").String(l.from_config ? "config" : !l.published_by.empty() ? "network" : "api");
    if (!l.published_by.empty()) w.Key("published_by").String(l.published_by);
    w.EndObject();
  }
  w.EndArray().EndObject();
  return w.Take();
}

std::string LexiconAnswerJson(const LexiconAnswer& a, bool added) {
  JsonWriter w;
  w.BeginObject().Key("nsid").String(a.nsid).Key("record").Bool(a.record);
  if (added) w.Key("replaced").Bool(a.replaced);
  w.Key("collections").BeginArray();
  for (const auto& c : a.collections) w.String(c);
  w.EndArray().Key(added ? "collection_added" : "collection_removed").Bool(a.collection_changed);
  if (added) {
    if (a.backfill_job != 0) {
      w.Key("backfill_job").Uint(a.backfill_job);
    } else {
      w.Key("backfill_job").Null();
    }
  }
  w.EndObject();
  return w.Take();
}

std::string EndEvent(uint64_t id, state::JobStatus status, std::string_view reason) {
  JsonWriter w;
  w.BeginObject().Key("id").Uint(id).Key("status").String(state::JobStatusName(status));
  w.Key("reason").String(reason).EndObject();
  return SseEvent("end", w.str());
}

std::string CountersJson(const JobDetails& d, int64_t now_us) {
  JsonWriter w;
  w.BeginObject().Key("id").Uint(d.job.id).Key("counters");
  WriteCounters(w, d.job.counters);
  w.Key("progress");
  WriteProgress(w, d.job, now_us);
  w.Key("queued_units").Uint(d.queued_units).Key("failed_blocks").Uint(d.failed_blocks);
  w.Key("errors_by_kind");
  WriteErrorsByKind(w, d.errors_by_kind);
  w.Key("updated_at").String(FormatTime(d.job.updated_us));
  w.Key("heartbeat_at").String(FormatTime(d.job.heartbeat_us));
  w.Key("waiting");
  WriteWaiting(w, d.job);
  w.EndObject();
  return w.Take();
}

std::string HostsJson(const JobDetails& d) {
  JsonWriter w;
  w.BeginObject().Key("id").Uint(d.job.id).Key("hosts");
  WriteHosts(w, d.hosts);
  w.Key("recent");
  WriteRecent(w, d.recent);
  w.EndObject();
  return w.Take();
}

std::string StatusJson(const state::JobRecord& before, const state::JobRecord& now) {
  JsonWriter w;
  w.BeginObject().Key("id").Uint(now.id);
  w.Key("from").String(state::JobStatusName(before.status));
  w.Key("to").String(state::JobStatusName(now.status));
  w.Key("stage").String(state::JobStageName(now.stage));
  w.Key("stop_reason");
  WriteStopReason(w, now.stop_reason);
  w.Key("finished_at").String(FormatTime(now.finished_us));
  w.EndObject();
  return w.Take();
}

}  // namespace atfill::admin
