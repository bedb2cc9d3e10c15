#!/usr/bin/env bash
# Checks the build users run (the Dockerfile's: `ferry` without default features) for what must not be in it:
# vSphere provisioning (ferry-vsphere's `provision`: CreateVM, datastore uploads) and the lab, benchmark and chaos
# crates. Workspace builds unify features across crates, so only a build of the shipped package alone can tell.
set -euo pipefail
cd "$(dirname "$0")/.."
shipped=(-p ferry --no-default-features --locked)

# The controller crate alone, then the shipped binary, must compile as they are built for users.
cargo clippy --quiet -p ferry-controller --locked -- -D warnings
cargo clippy --quiet "${shipped[@]}" --bins -- -D warnings

fail=0
features=$(cargo tree "${shipped[@]}" -e normal,features -i ferry-vsphere --prefix none)
if grep -q 'ferry-vsphere feature "provision"' <<<"$features"; then
  echo "error: the shipped build enables ferry-vsphere's provision feature; what turns it on:" >&2
  cargo tree "${shipped[@]}" -e normal,features -i ferry-vsphere -f '{p} {f}' | grep -B1 -A3 provision >&2 || true
  fail=1
fi
crates=$(cargo tree "${shipped[@]}" -e normal --prefix none -f '{p}')
for lab in ferry-lab ferry-lab-disks ferry-bench ferry-chaos ferry-testkit; do
  if grep -q "^$lab v" <<<"$crates"; then
    echo "error: the shipped build links $lab (the lab's commands belong behind ferry's \`lab\` feature)" >&2
    fail=1
  fi
done
[ "$fail" = 0 ] && echo "shipped build: no vSphere provisioning, no lab, bench or chaos crates"
exit "$fail"
