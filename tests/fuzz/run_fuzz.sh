#!/usr/bin/env bash
# Runs one libFuzzer target as a ctest (tests/fuzz/CMakeLists.txt):
#   run_fuzz.sh BINARY WORK_DIR SEED_DIR DATA_DIR MAX_LEN [SHARED_SEED_SUBDIR...]
# for ATFILL_FUZZ_SECONDS (default 10) seconds. WORK_DIR (in the build tree) comes first, so it is
# the only folder libFuzzer writes new inputs to; SEED_DIR (corpus/NAME, our own seeds) and each
# DATA_DIR/SUBDIR (third-party data read in place, never copied into the repository) are read
# only. DATA_DIR is ../shared/protocols/jetstream/data, or $ATFILL_SHARED/protocols/jetstream/data
# when ATFILL_SHARED is set; the target finds it as ATFILL_FUZZ_DATA (dictionaries, packed
# documents) and WORK_DIR as ATFILL_FUZZ_WORK. When a shared folder is missing the run fails if
# ATFILL_REQUIRE_SHARED=1 (CI), and otherwise goes on without those seeds after saying so.
# MAX_LEN 0 leaves libFuzzer's default.
set -euo pipefail
binary=$1 work=$2 seeds=$3 data=$4 max_len=$5
shift 5
if [ -n "${ATFILL_SHARED:-}" ]; then data="$ATFILL_SHARED/protocols/jetstream/data"; fi

corpora=("$work")
[ -d "$seeds" ] && corpora+=("$seeds")
for rel in "$@"; do
  if [ -d "$data/$rel" ]; then
    corpora+=("$data/$rel")
  elif [ "${ATFILL_REQUIRE_SHARED:-}" = 1 ]; then
    echo "*** THIRD-PARTY FUZZ SEEDS NOT FOUND: $data/$rel (ATFILL_REQUIRE_SHARED=1)" >&2
    exit 1
  else
    echo "*** THIRD-PARTY FUZZ SEEDS NOT FOUND: $data/$rel; set ATFILL_SHARED to the folder" \
      "holding protocols/. Fuzzing without them." >&2
  fi
done
if [ "$#" -gt 0 ] && [ -d "$data" ]; then export ATFILL_FUZZ_DATA="$data"; fi
# A target may write seeds it derives from the shared data (one file per document) here.
export ATFILL_FUZZ_WORK="$work"

flags=(-max_total_time="${ATFILL_FUZZ_SECONDS:-10}" -rss_limit_mb=2048 -timeout=10
  -print_final_stats=1)
[ "$max_len" != 0 ] && flags+=(-max_len="$max_len")
mkdir -p "$work"
exec "$binary" "${flags[@]}" "${corpora[@]}"
