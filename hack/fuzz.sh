#!/usr/bin/env bash
# Builds the vSphere parser's fuzz targets (crates/vsphere/fuzz) and runs each for a bounded time.
#   hack/fuzz.sh [seconds per target, default 60] [target ...]
# Corpora grow in crates/vsphere/fuzz/corpus/<target> (not committed), seeded from seeds/<target>; a crash is
# saved under artifacts/<target>/ and fails the run.
set -euo pipefail
cd "$(dirname "$0")/../crates/vsphere/fuzz"
seconds=${1:-60}
shift || true
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(soap_response vmdk_descriptor)

# libFuzzer's instrumentation needs nightly flags: the nightly toolchain when rustup has one, else stable's
# compiler with its bootstrap switch.
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    toolchain=(+nightly)
else
    toolchain=()
    export RUSTC_BOOTSTRAP=1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install --quiet --locked cargo-fuzz --version 0.13.2
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo "${toolchain[@]}" fuzz build -O >"$log" 2>&1 || { cat "$log"; exit 1; }
for target in "${targets[@]}"; do
    corpus=corpus/$target
    mkdir -p "$corpus"
    dict=()
    [[ $target == soap_response ]] && dict=(-dict=soap.dict)
    echo "==> fuzzing $target for ${seconds}s"
    status=0
    cargo "${toolchain[@]}" fuzz run -O "$target" "$corpus" "seeds/$target" -- \
        -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        "${dict[@]}" >"$log" 2>&1 || status=$?
    if [[ $status -ne 0 ]]; then
        tail -60 "$log"
        echo "fuzz target $target failed (exit $status); the input is under crates/vsphere/fuzz/artifacts/$target" >&2
        exit "$status"
    fi
    grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb)' "$log" | tr '\n' ' '
    echo "corpus: $(find "$corpus" -type f | wc -l) inputs"
done
