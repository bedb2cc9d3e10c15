# The two commands of the README. Both install what they need and can be run again.
SHELL := /bin/bash
LAB_DIR ?= $(CURDIR)/.lab

.PHONY: demo test test-unit lab-down lint

## demo: start the local lab (real control plane, vSphere simulator, stand-ins, the controller) and migrate two
## demo VMs with live progress; ends with a summary, non-zero if a migration failed.
demo:
	@tools=$$(hack/setup.sh) && cargo build --quiet --bin ferry && \
	FERRY_TOOLS_BIN=$$tools ./target/debug/ferry lab demo --dir $(LAB_DIR)

## test: formatting, lints, the Helm chart (lint, deploy/ rendered from it, the alert rules through promtool:
## hack/chart.sh), then every unit and integration test against real components, a few test binaries at a time
## (hack/test.sh), then the vSphere parsers' fuzz targets for 30 s each (hack/fuzz.sh).
test: lint
	@date +'==> %T lint done; the tools, then the tests'
	@tools=$$(hack/setup.sh) && (cd tools/vcsim && GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-trimpath go test ./...) && \
	FERRY_TOOLS_BIN=$$tools hack/chart.sh --check && \
	FERRY_TOOLS_BIN=$$tools hack/test.sh --features ferry/chaos
	@date +'==> %T the fuzz targets, 30 s each'
	hack/fuzz.sh 30

## test-unit: the fast tiers only: every crate's unit tests and the reconcile tier (one reconcile against a mock
## API server, crates/controller/src/reconcile/tests/). No lab, no Go tools, no network.
test-unit:
	cargo test --workspace --lib --bins --features ferry/chaos

lint:
	@date +'==> %T lint'
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --quiet -- -D warnings
	cargo clippy --workspace --all-targets --quiet --features ferry/chaos -- -D warnings
	hack/shipped-build.sh

lab-down:
	@cargo build --quiet --bin ferry && ./target/debug/ferry lab down --dir $(LAB_DIR)
