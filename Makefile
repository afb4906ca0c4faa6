# ingot — two commands on a fresh machine: `make demo` and `make test`.
# Builds share one debug target directory outside the clone so a warm machine rebuilds only
# what changed; `make bench` alone builds --release.

CARGO_TARGET_DIR ?= $(HOME)/.cache/ingot-target
export CARGO_TARGET_DIR
CARGO ?= cargo
PYTHON ?= python3
INGOT := $(CARGO_TARGET_DIR)/debug/ingot
# demo, test and lint share one debug build with the optional parts enabled: `flight` (ingot serve)
# and `cluster` (ingot cluster, --cluster; Ballista). (`make bench` builds
# its own release binary without them)
FEATURES ?= flight cluster s3
# the `flight` feature's build needs protoc: PyPI's grpcio-tools in .venv-build, see scripts/protoc
export PROTOC := $(CURDIR)/scripts/protoc

.PHONY: build demo test bench bench-history lint data clean-lake fuzz protoc

.venv-build/bin/python:
	$(PYTHON) -m venv .venv-build
	.venv-build/bin/pip install --quiet --disable-pip-version-check grpcio-tools==1.76.0

protoc: .venv-build/bin/python

build: protoc
	$(CARGO) build --bin ingot --features "$(FEATURES)"

## demo: run the whole bronze story on the bundled data in data/landing (lake in data/lake)
demo: build
	INGOT=$(INGOT) bash scripts/demo.sh

## test: every test (the unit tests in src/ and one integration-test binary; the CLI binary is built alongside)
test: protoc
	$(CARGO) build --bin ingot --features "$(FEATURES)"
	$(CARGO) test --lib --test it --features "$(FEATURES)" -- --test-threads 2

## bench: TPC-H lineitem SF1 through ingot and DuckDB in the same run (release build, venv
## .venv-bench, data in bench/work); SF=0.01 for a quick run, SF10=1 adds the SF10 memory check,
## CLUSTER=1 the silver build on a loopback cluster (release build with --features cluster).
## Writes bench/results-sf$(SF).md, and bench/results-pull.md: ingot pull of 1,000,000 records beside
## dlt rest_api (venv .venv-bench-dlt; PULL=0 leaves it out), and bench/results-sources.md: a silver table
## fed by two sources beside a one-source build of the same rows and DuckDB (SOURCES=0 leaves it out).
bench: protoc
	bash scripts/bench.sh

## bench-history: one-row ingests and small queries on a source with 100, 1,000 and 10,000
## runs, filling that history, and a lake of 50 sources x 1,000 runs (release build, beside
## DuckDB reading the runs' files); writes bench/results-history.md. RUNS=100,1000 for a quick run.
bench-history: protoc
	bash scripts/bench-history.sh

## fuzz: the fuzz targets of tests/it/fuzz.rs at length (contract and rules parsers, CSV/NDJSON
## loader; failing cases land in tests/fuzz/regressions/ and are replayed by every `make test`)
## the model-based test of tests/it/model.rs with 200 cases instead of 6, the power-loss test of
## tests/it/power.rs at every step and the chaos test of tests/it/chaos.rs with 400 operations
fuzz:
	INGOT_FUZZ_CASES=$${INGOT_FUZZ_CASES:-200000} INGOT_MODEL_CASES=$${INGOT_MODEL_CASES:-200} INGOT_POWER_CASES=all INGOT_CHAOS_OPS=$${INGOT_CHAOS_OPS:-400} $(CARGO) test --test it --features "$(FEATURES)" -- fuzz:: model:: model_sources:: power:: chaos:: --test-threads 2

## lint: formatting and clippy
lint: protoc
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets --features "$(FEATURES)" -- -D warnings

## data: regenerate the deterministic sample files in data/landing and data/bad
data:
	$(PYTHON) scripts/gen_demo_data.py

clean-lake:
	rm -rf data/lake
