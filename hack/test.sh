#!/usr/bin/env bash
# Builds every test binary of the workspace once, then runs them a few at a time: most lab tests wait on
# controllers and timers far more than they compute (about a third of 2 cores), so one binary at a time left the
# machine idle. The ones that boot most Debian guests under software emulation run in a lane of their own, since
# parallel emulated boots only slow each other down; the demo and the guest image's boots run last, on the core
# the others leave. Every binary runs to the end (no fail-fast); each one's output is printed whole when it ends,
# and the run fails if any failed.
#
# Usage: hack/test.sh [extra cargo args]. FERRY_TEST_LANES sets the lanes beside the emulation lane (default 2);
# FERRY_TEST_ONLY, an extended regex, runs only the binaries whose names match it.
set -euo pipefail
cd "$(dirname "$0")/.."
lanes=${FERRY_TEST_LANES:-2}
# Boot real guests under emulation: one lane, in this order, at normal priority. The others run at a lower one
# (nice 10): they mostly wait on timers, while an emulated guest's boot is CPU-bound and judged by its clock (a
# guest check's settle), so on a busy machine it is the guest that must not starve.
emulated=(linux_guest windows_guest)
# The slowest first, so the long ones do not start last; binaries not named here follow in cargo's order.
slowest=(chaos migrate_lifecycle migrate migrate_through_faults bench_controlplane migrate_direct migrate_warm
  staging_resume lab_up kubevirt migrate_many_disks datapath_convert bench_migrate node_agent preflight_storage)
# Started once the others are done, while the emulation lane still runs; at normal priority, since each boots
# guests too: by then the other core is free. kubevirt_conformance boots few, and would only lengthen the lane.
last=(lab_demo guest_image kubevirt_conformance)

work=$(mktemp -d "${TMPDIR:-/tmp}/ferry-tests-XXXXXX")
trap 'rm -rf "$work"' EXIT

# One line per test binary: its name (an integration test's file name; a crate's unit tests as crate(lib) or
# crate(bin)), path and package directory.
built_at=$SECONDS
cargo test --workspace --no-run --message-format=json-render-diagnostics "$@" |
  jq -r 'select(.reason == "compiler-artifact" and .profile.test and .executable != null)
         | [.target.name + (if .target.kind[0] == "test" then "" else "(" + .target.kind[0] + ")" end),
            .executable, (.manifest_path | rtrimstr("/Cargo.toml"))] | @tsv' |
  awk -F'\t' -v only="${FERRY_TEST_ONLY:-}" 'only == "" || $1 ~ ("^(" only ")")' >"$work/all"
echo "==> $(wc -l <"$work/all") test binaries built in $((SECONDS - built_at))s"

is_in() {
  local name=$1; shift
  local n; for n in "$@"; do [ "$n" = "$name" ] && return 0; done; return 1
}
line_of() { awk -F'\t' -v n="$1" '$1 == n' "$work/all"; }

: >"$work/emulated"; : >"$work/rest"
# A fourth column: the binary's niceness.
with_nice() { awk -v n="$1" 'NF { print $0 "\t" n }'; }
for name in "${emulated[@]}"; do line_of "$name" | with_nice 0 >>"$work/emulated"; done
for name in "${slowest[@]}"; do line_of "$name" | with_nice 10 >>"$work/rest"; done
while IFS=$'\t' read -r name exe dir; do
  is_in "$name" "${emulated[@]}" "${slowest[@]}" "${last[@]}" || printf '%s\t%s\t%s\t10\n' "$name" "$exe" "$dir" >>"$work/rest"
done <"$work/all"
for name in "${last[@]}"; do line_of "$name" | with_nice 0 >>"$work/rest"; done

# Runs one binary as cargo test would (from its package directory) and prints its output when it ends, with the
# machine's load averages then (a slow binary on a loaded machine tells a different story).
run_one() {
  local name=$1 exe=$2 dir=$3 niceness=$4 work=$5
  local log="$work/${exe##*/}.log" start=$SECONDS rc=0
  (cd "$dir" && CARGO_MANIFEST_DIR="$dir" nice -n "$niceness" "$exe") >"$log" 2>&1 </dev/null || rc=$?
  local took=$((SECONDS - start)) load
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  {
    flock 9
    echo "==> $name ($exe): $([ $rc = 0 ] && echo ok || echo "FAILED, exit $rc") in ${took}s (load $load)"
    cat "$log"
  } 9>"$work/print.lock"
  echo "$name $rc $took" >>"$work/results"
  return 0
}
export -f run_one

# Each list as name, path, directory and niceness on lines of their own, run by xargs with `lanes` at a time.
run_list() {
  tr '\t' '\n' <"$1" | xargs -r -d '\n' -n 4 -P "$2" bash -c 'run_one "$1" "$2" "$3" "$4" "$0"' "$work"
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
