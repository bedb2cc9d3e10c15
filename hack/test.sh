#!/usr/bin/env bash
# Builds every test binary of the workspace once, then runs them a few at a time: most lab tests wait on
# controllers and timers far more than they compute (about a third of 2 cores), so one binary at a time left the
# machine idle. The two that boot most Debian guests under software emulation run one after the other in a lane
# of their own, since parallel emulated boots only slow each other down; the demo, which boots one, runs last. Every binary runs to the end (no fail-fast); each
# one's output is printed whole when it ends, and the run fails if any failed.
#
# Usage: hack/test.sh [extra cargo args]. FERRY_TEST_LANES sets the lanes beside the emulation lane (default 2);
# FERRY_TEST_ONLY, an extended regex, runs only the binaries whose names match it.
set -euo pipefail
cd "$(dirname "$0")/.."
lanes=${FERRY_TEST_LANES:-2}
# Boot real guests under emulation: one lane, in this order.
emulated=(linux_guest guest_image)
# The slowest first, so the long ones do not start last; binaries not named here follow in cargo's order.
slowest=(chaos migrate_lifecycle migrate migrate_through_faults bench_controlplane migrate_direct
  staging_resume lab_up kubevirt migrate_many_disks datapath_convert bench_migrate node_agent preflight_storage)
# Started once the others are done, when the emulation lane is on its last binary.
last=(lab_demo)

work=$(mktemp -d "${TMPDIR:-/tmp}/ferry-tests-XXXXXX")
trap 'rm -rf "$work"' EXIT

# One line per test binary: its name (an integration test's file name; a crate's unit tests as crate(lib) or
# crate(bin)), path and package directory.
cargo test --workspace --no-run --message-format=json-render-diagnostics "$@" |
  jq -r 'select(.reason == "compiler-artifact" and .profile.test and .executable != null)
         | [.target.name + (if .target.kind[0] == "test" then "" else "(" + .target.kind[0] + ")" end),
            .executable, (.manifest_path | rtrimstr("/Cargo.toml"))] | @tsv' |
  awk -F'\t' -v only="${FERRY_TEST_ONLY:-}" 'only == "" || $1 ~ ("^(" only ")")' >"$work/all"

is_in() {
  local name=$1; shift
  local n; for n in "$@"; do [ "$n" = "$name" ] && return 0; done; return 1
}
line_of() { awk -F'\t' -v n="$1" '$1 == n' "$work/all"; }

: >"$work/emulated"; : >"$work/rest"
for name in "${emulated[@]}"; do line_of "$name" >>"$work/emulated"; done
for name in "${slowest[@]}"; do line_of "$name" >>"$work/rest"; done
while IFS=$'\t' read -r name exe dir; do
  is_in "$name" "${emulated[@]}" "${slowest[@]}" "${last[@]}" || printf '%s\t%s\t%s\n' "$name" "$exe" "$dir" >>"$work/rest"
done <"$work/all"
for name in "${last[@]}"; do line_of "$name" >>"$work/rest"; done

# Runs one binary as cargo test would (from its package directory) and prints its output when it ends.
run_one() {
  local name=$1 exe=$2 dir=$3 work=$4
  local log="$work/${exe##*/}.log" start=$SECONDS rc=0
  (cd "$dir" && CARGO_MANIFEST_DIR="$dir" "$exe") >"$log" 2>&1 </dev/null || rc=$?
  local took=$((SECONDS - start))
  {
    flock 9
    echo "==> $name ($exe): $([ $rc = 0 ] && echo ok || echo "FAILED, exit $rc") in ${took}s"
    cat "$log"
  } 9>"$work/print.lock"
  echo "$name $rc $took" >>"$work/results"
  return 0
}
export -f run_one

# Each list as name, path and directory on lines of their own, run by xargs with `lanes` at a time.
run_list() {
  tr '\t' '\n' <"$1" | xargs -r -d '\n' -n 3 -P "$2" bash -c 'run_one "$1" "$2" "$3" "$0"' "$work"
}
run_list "$work/emulated" 1 </dev/null &
emulated_pid=$!
run_list "$work/rest" "$lanes" </dev/null
wait "$emulated_pid"

echo "==> test binaries, slowest first:"
sort -k3 -n -r "$work/results" | awk '{ printf "  %-28s %s %5ss\n", $1, ($2 == 0 ? "ok    " : "FAILED"), $3 }'
failed=$(awk '$2 != 0 { print $1 }' "$work/results")
expected=$(wc -l <"$work/all")
ran=$(wc -l <"$work/results")
if [ "$ran" != "$expected" ]; then
  echo "only $ran of $expected test binaries reported" >&2
  exit 1
fi
if [ -n "$failed" ]; then
  echo "failed: $failed" >&2
  exit 1
fi
echo "all $ran test binaries passed"
