#include <cstdio>
#include <string_view>

#include "tools/atfill/cli.hpp"

namespace atfill::cli {

bool WantsHelp(const Verb& verb, std::span<char* const> args) {
  for (const char* arg : args) {
    const std::string_view a = arg;
    if (a == "-h" || a == "--help") {
      std::fwrite(verb.usage.data(), 1, verb.usage.size(), stdout);
      return true;
    }
    if (a == "--") break;
  }
  return false;
}

std::span<const Verb> Verbs() {
  static const Verb kVerbs[] = {
      {"demo", "run the demonstration on the files the repository ships",
       "usage: atfill demo [--data DIR]\n\n"
       "Shows the inspection verbs (syntax, cid, car) on examples/data.\n"
       "  --data DIR   folder holding records.jsonl and sample.car (default: share/atfill/demo\n"
       "               of an installed atfill, else the source tree's examples/data)\n",
       RunDemo},
      {"ingest", "index Jetstream event files (JSON lines, plain or zstd) into the database",
       "usage: atfill ingest CONFIG FILE... [--dry-run]\n\n"
       "Runs the files through CID verification and the ingest guard into the configured sink, as\n"
       "a job. Running the same command again resumes the unfinished job from its saved\n"
       "position. Bad lines are skipped and listed in the job's error log. Ctrl-C pauses the job\n"
       "at its next checkpoint (a second Ctrl-C quits at once).\n"
       "  --dry-run   run the whole graph but write nothing; report what would have been "
       "written\n\n"
       "exit: 0 completed, 1 completed with errors in its log (bad lines) or failed,\n"
       "      2 usage or config, 3 files or state unavailable, 4 paused or cancelled\n",
       RunIngest},
      {"backfill", "crawl repos from a relay (or given DIDs) into the database",
       "usage: atfill backfill CONFIG [--collection NSID]... [--did DID]...\n"
       "                       [--mode listRecords|getRepo] [--discovery D] [--relay URL]\n"
       "                       [--source crawl|auto|replay]\n\n"
       "Lists repos from the relay ([crawl] relay, discovery listReposByCollection or\n"
       "listRepos), resolves each DID to its PDS, fetches the records of the target collections\n"
       "(listRecords pages, or one getRepo CAR whose commit signature is verified), verifies\n"
       "each record's CID and writes them to the configured sink, as a job. The same command\n"
       "again resumes the unfinished job; finished repos are not fetched again. Ctrl-C pauses.\n"
       "  --collection NSID   target collection (repeatable; replaces [crawl] collections)\n"
       "  --did DID           backfill these accounts only, no discovery (repeatable)\n"
       "  --mode M            listRecords (default) or getRepo\n"
       "  --discovery D       listReposByCollection (default), listRepos or dids\n"
       "  --relay URL         the relay (or PDS, with listRepos) to list\n"
       "  --source S          crawl, replay (read the collections from the Jetstream archive\n"
       "                      in [archive] dir instead: a records sweep, then an account sweep)\n"
       "                      or auto (replay when the archive can be read, else crawl);\n"
       "                      default [crawl] source. Account backfills (--did) always crawl.\n\n"
       "exit: 0 completed (accounts their PDS reports deactivated, taken down, suspended\n"
       "      or gone are counted, not errors), 1 completed with errors in its log (repos\n"
       "      that could not be fetched or verified) or failed, 2 usage or config,\n"
       "      3 state unavailable, 4 paused (on request, or with work left: see the stop\n"
       "      reason) or cancelled\n",
       RunBackfill},
      {"archive", "write Jetstream event files into a Jetstream v2 archive (.jss segments)",
       "usage: atfill archive write CONFIG DIR FILE... [--rows-per-block N] [--segment-kb N]\n\n"
       "Appends the events of the files (Jetstream v1 JSON lines, plain or zstd) to the archive\n"
       "in DIR as sealed .jss segments (the format Jetstream v2 serves), after its newest\n"
       "segment; a replay reads them back ([archive] dir, atfill backfill --source replay).\n"
       "Commits become create/update/delete rows (records stored as DAG-CBOR), accounts and\n"
       "identities markers. Bad lines are skipped and reported.\n"
       "  --rows-per-block N  rows per zstd block (default 4096)\n"
       "  --segment-kb N      seal a segment once it reaches N KiB (default 262144: 256 MiB)\n\n"
       "exit: 0 written, 1 some lines skipped, 2 usage or config, 3 files unavailable\n",
       RunArchive},
      {"retry-failed", "fetch again the archive blocks a replay job could not read",
       "usage: atfill retry-failed CONFIG JOB\n\n"
       "Starts a new job that reads only the failed blocks of replay job JOB (atfill job CONFIG\n"
       "JOB lists them), then applies the account events of every account those blocks wrote\n"
       "records for. Each block read leaves JOB's failed list; one that fails again is recorded\n"
       "in the new job. The same command again resumes the unfinished retry.\n\n"
       "exit: 0 completed (or nothing to retry), 1 completed with errors in its log or\n"
       "      failed, 2 usage or config, 3 state unavailable, 4 paused or cancelled\n",
       RunRetryFailed},
      {"verify", "compare stored repos with their PDSs' signed repos, and repair them",
       "usage: atfill verify CONFIG [--did DID]... [--collection NSID]... [--repair] [--json]\n\n"
       "For each repo the database holds records of (or each --did), resolves the DID, fetches\n"
       "the PDS's current signed repo (com.atproto.sync.getRepo: the commit signature and the\n"
       "MST are verified) and compares its records with the stored rows, as a job. Prints each\n"
       "difference on stdout: missing (in the repo, not stored), extra (stored, not in the\n"
       "repo), different (another CID); a repo that could not be checked (unreachable PDS, bad\n"
       "CAR, bad signature) is an error naming its DID, and the others go on.\n"
       "  --did DID           check these repos only (repeatable)\n"
       "  --collection NSID   compare these collections (repeatable; \"prefix.*\" too);\n"
       "                      default: [crawl] and [live] collections, all when both are empty\n"
       "  --repair            write the repo's records where they are missing or differ and\n"
       "                      delete the extra ones, through the ingest path\n"
       "  --json              print one JSON object (counters, differences, errors) instead\n\n"
       "exit: 0 no difference, 1 differences found (repaired or not) or repos that could not\n"
       "      be checked, 2 usage or config, 3 state or database unavailable, 4 paused\n",
       RunVerify},
      {"run", "resume unfinished jobs, then keep the database current from a Jetstream",
       "usage: atfill run CONFIG [--backfill]\n\n"
       "Resumes, oldest first, every job that was interrupted (running or pausing when its\n"
       "process died) or paused with work left; finishes interrupted cancellations. Jobs paused\n"
       "on request stay paused (atfill resume CONFIG ID). Then, when [live] hosts is set, runs\n"
       "the live consumer (Jetstream v2, or v1 where v2 is not served) from its saved cursor\n"
       "until Ctrl-C pauses it; unfinished backfills run beside it, and the live events of each\n"
       "repo they crawl are held until the repo is written, then applied (those at or below the\n"
       "fetched commit's rev dropped).\n"
       "--backfill: also backfill [crawl]'s targets (the unfinished job that crawls them, or a\n"
       "new one), beside the live consumer when [live] hosts is set.\n"
       "With [labels] labelers set, also follows those labelers (subscribeLabels) into the\n"
       "sink's atfill_labels, beside the rest; without [live] hosts, until Ctrl-C or [labels]\n"
       "idle_exit_ms.\n"
       "With [verify] every_hours set, also runs a verify job of the stored repos (atfill\n"
       "verify; [verify] repair, collections) every that many hours, beside the rest; without\n"
       "[live] hosts, until Ctrl-C.\n"
       "With [admin] port set, also serves the admin API, /metrics and the dashboard there\n"
       "(docs/admin.md); backfills then run on threads of their own, and atfill run keeps\n"
       "serving until Ctrl-C or SIGTERM, which pause the running jobs.\n"
       "--shard i/n (every verb): own only shard i of n of the DID space (docs/guide.md).\n\n"
       "exit: the worst of its jobs': 0 all completed, 1 one completed with errors or failed,\n"
       "      2 usage or config, 3 state unavailable, 4 paused, cancelled, or the live\n"
       "      stream went quiet ([live] idle_exit_ms)\n",
       RunRun},
      {"status", "show the live consumer: host, protocol, cursor, lag, rate",
       "usage: atfill status CONFIG\n\nWorks while atfill run holds the state (read-only view).\n"
       "Shows the live job's hosts, protocol, cursor, lag, rates, gaps, account checks, held\n"
       "events, and its failed or dropped connections with the last error.\n\n"
       "exit: 0 shown, 2 usage or config, 3 state unavailable\n",
       RunStatus},
      {"jobs", "list jobs",
       "usage: atfill jobs CONFIG [--json]\n\n"
       "Lists every job, newest first. Works while another atfill runs (read-only view).\n",
       RunJobs},
      {"job", "show one job (counters, errors, batch audit)",
       "usage: atfill job CONFIG ID [--json] [--errors] [--batches] [--hosts] [--recent]\n\n"
       "  --errors    list the job's error log entries\n"
       "  --batches   list the per-batch audit trail ([jobs] record_batches = true)\n"
       "  --hosts     a crawl's summary per PDS: units, done, errors, records\n"
       "  --recent    a crawl's most recently fetched repos, newest first\n",
       RunJob},
      {"pause", "pause a job at its next checkpoint",
       "usage: atfill pause CONFIG ID\n\n"
       "Asks the atfill process running the job to pause it (it commits what it read first);\n"
       "when no process runs it, marks it paused.\n",
       RunPause},
      {"resume", "resume a paused, failed or interrupted job",
       "usage: atfill resume CONFIG ID\n\nRuns the job again from its saved position.\n",
       RunResume},
      {"cancel", "cancel a job",
       "usage: atfill cancel CONFIG ID\n\n"
       "Asks the atfill process running the job to stop it for good; when no process runs it,\n"
       "marks it cancelled. What was written stays written.\n",
       RunCancel},
      {"cid", "print the CID of each record (one JSON object per line)",
       "usage: atfill cid [FILE...]\n\n"
       "Reads records, one JSON object per line, from each FILE (or stdin when none is given)\n"
       "and prints each record's CID (dag-cbor, sha2-256), one line per input line. A line that\n"
       "is not a valid atproto record prints an empty line on stdout and\n"
       "'error: line N: <reason>' on stderr, so outputs stay aligned with inputs.\n\n"
       "exit: 0 all lines valid, 1 some line failed, 2 usage, 3 a file could not be read\n",
       RunCid},
      {"validate", "check records against their lexicons (one JSON object per line)",
       "usage: atfill validate --lexicons PATH [--lexicons PATH]... [FILE...]\n\n"
       "Loads lexicon documents (a .json file, or every .json file under a folder: a checkout\n"
       "of the atproto lexicons, say), each checked as it loads, then reads records, one JSON\n"
       "object per line, from each FILE (or stdin when none is given). Each record's $type\n"
       "names its lexicon. Prints one line per input line: 'valid', 'invalid: <path>: <reason>'\n"
       "or 'unknown: no lexicon for <nsid>'.\n\n"
       "exit: 0 no record invalid, 1 some record (or lexicon) invalid, 2 usage, 3 a file could\n"
       "not be read\n",
       RunValidate},
      {"car", "verify a CAR repository and print its records",
       "usage: atfill car FILE.car [--key did:key:...]\n\n"
       "Verifies every block's hash and the repository structure, then prints every record as a\n"
       "JSON line {\"uri\",\"cid\",\"record\"}. With --key, also verifies the commit signature.\n"
       "A corrupt or truncated file is an error that names the byte offset.\n\n"
       "exit: 0 valid, 1 corrupt, invalid or bad signature, 2 usage, 3 file unreadable\n",
       RunCar},
      {"syntax", "check atproto identifiers (did, handle, nsid, rkey, ...)",
       "usage: atfill syntax KIND VALUE...\n\n"
       "KIND: did, handle, nsid, rkey, tid, aturi, datetime, cid, atidentifier, language, uri.\n"
       "Prints 'valid' or 'invalid: <reason>' for each VALUE, one per line.\n\n"
       "exit: 0 all valid, 1 some value invalid, 2 usage\n",
       RunSyntax},
  };
  return kVerbs;
}

}  // namespace atfill::cli
