# The two commands a new user needs: `make demo` runs the system, `make test` runs the tests.
# Both set everything up first (scripts/setup): a venv in .venv, the project, PostgreSQL binaries.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-done
PYTEST_ARGS ?=
# `make test` runs the suite in this many processes (pytest-xdist), each test file in one of them.
# One with a nats-server of your own (COS_TEST_NATS_URL): the tests empty its streams, they cannot share it.
TEST_WORKERS ?= $(if $(COS_TEST_NATS_URL),1,2)

.PHONY: setup demo up test test-fast lint format schema console-docs bench bench-scale chaos clients clients-gateway clean

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup
	scripts/setup
	@touch $(STAMP)

demo: setup
	$(BIN)/cos demo

up: setup
	$(BIN)/cos up

test: setup lint
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/pytest -m "not slow" $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The long fault-injection run: every chaos scenario at full size (a 1,000,000-event backlog, 30 s
# database refusal, ...) and every fuzz target at 10,000+ examples; prints the chaos report.
chaos: setup
	COS_CHAOS=long COS_FUZZ_PROFILE=long $(BIN)/pytest tests/chaos tests/fuzz -p no:randomly --hypothesis-show-statistics $(PYTEST_ARGS)

schema: setup
	$(BIN)/cos schema export proto/schema
	$(BIN)/cos console openapi proto/openapi/console.json

# docs/console.md's screenshots (docs/img/console-*.png) from a scripted demo on servers of its own, in Debian's
# Chromium (scripts/console_docs.py, ~1 min). Run it after changing a page; commit the pictures.
console-docs: setup
	$(BIN)/python -m scripts.console_docs

# Every figure of the performance targets from one run (own servers, ~10 min); table + bench/out/summary.json.
bench: setup
	$(BIN)/python -m bench.run

# The growth curve (bench/scale.py): a database grown through 1M, 5M and 10M messages, measured at each size;
# bench/out/scale.json and bench/out/scale.png. Under 60 minutes on 2 cores, about 18 GB of disk (it stops growing
# before leaving less than 20 GB free). Not part of `make test`. Other sizes: make bench-scale BENCH_SCALE_SIZES=1M,2M
BENCH_SCALE_SIZES ?= 1000000,5000000,10000000
bench-scale: setup
	@$(BIN)/python -c 'import matplotlib' 2>/dev/null || $(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev,bench]'
	BENCH_SCALE_SIZES=$(BENCH_SCALE_SIZES) $(BIN)/python -m bench.scale

# Ground truth for the importer: the real Claude Code and Codex CLIs (npm, into .cos/clients) against a
# fake model; writes tests/fixtures/clients/<cli>-<version>/ and prints the format diff to the previous
# version. Not part of `make test`. Other versions: make clients CLAUDE_CODE_VERSION=... CODEX_VERSION=...
CLAUDE_CODE_VERSION ?=
CODEX_VERSION ?=
clients: setup
	$(BIN)/python -m clients record $(if $(CLAUDE_CODE_VERSION),--claude-code-version $(CLAUDE_CODE_VERSION)) $(if $(CODEX_VERSION),--codex-version $(CODEX_VERSION))

# The same CLIs with their telemetry sent to the OTLP gateway of a temporary `cos up`, then their transcripts
# imported: each call the fake model answered billed once, with its usage (exit 1 otherwise). Not in `make test`.
# Claude Code's OTLP protocol: make clients-gateway OTEL_EXPORTER_OTLP_PROTOCOL=grpc (or http/protobuf; default
# http/json). CLIENTS_ARGS passes more, e.g. CLIENTS_ARGS="--cli claude-code".
OTEL_EXPORTER_OTLP_PROTOCOL ?=
CLIENTS_ARGS ?=
clients-gateway: setup
	$(BIN)/python -m clients gateway $(if $(CLAUDE_CODE_VERSION),--claude-code-version $(CLAUDE_CODE_VERSION)) $(if $(CODEX_VERSION),--codex-version $(CODEX_VERSION)) $(if $(OTEL_EXPORTER_OTLP_PROTOCOL),--protocol $(OTEL_EXPORTER_OTLP_PROTOCOL)) $(CLIENTS_ARGS)

clean:
	rm -rf $(VENV) .cos .pytest_cache .mypy_cache .ruff_cache bench/out
