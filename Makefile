# Two front-door commands: `make run` (the demo) and `make test` (everything CI runs).
# Both bootstrap .venv from a bare python3 and are idempotent.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: run test lint typecheck unit e2e soak bench sim clean system-deps lock

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/watchd demo

sim: $(STAMP)
	$(BIN)/watchd sim --scenario demo

lint: $(STAMP)
	$(BIN)/ruff check watchd tests bench
	$(BIN)/ruff format --check watchd tests bench
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy --strict watchd

# Unit tests mostly wait on sockets and timers, so they run in parallel workers
# (pytest-xdist). E2e and system tests start real processes and time them, with timeouts
# sized for a loaded machine: they run in E2E_WORKERS workers (0: one at a time), every
# system test on one worker in file order (tests/system/conftest.py), so at most one heavy
# thing (a Docker build, a booted machine) runs beside one end-to-end test.
UNIT_WORKERS ?= 4
E2E_WORKERS ?= 2

unit: $(STAMP)
	$(BIN)/pytest -n $(UNIT_WORKERS) tests/unit

system-deps:
	tests/setup/system-deps

e2e: $(STAMP) system-deps
	$(BIN)/pytest -n $(E2E_WORKERS) tests/e2e

test: lint typecheck system-deps
	$(BIN)/pytest -n $(UNIT_WORKERS) tests/unit
	$(BIN)/pytest -n $(E2E_WORKERS) --dist loadgroup tests/e2e tests/system
	$(BIN)/pytest tests/soak

# The randomized soak (docs/testing.md): the real daemon against the simulator under motion
# and faults, judged by an oracle. `make test` runs 2 minutes of seed 1 (and the oracle's
# own tests); `make soak` writes its summary and the run's record to bench/results/soak/.
MINUTES ?= 30
SEED ?= 1

soak: $(STAMP)
	SOAK_MINUTES=$(MINUTES) SOAK_SEED=$(SEED) \
		SOAK_RESULTS=bench/results/soak/seed$(SEED)-$(MINUTES)min \
		$(BIN)/pytest -s -p no:cacheprovider tests/soak/test_soak.py

bench: $(STAMP)
	@# The Node.js peer row (bench/node) needs its `ws` module; skipped (said) without npm.
	@if command -v npm >/dev/null 2>&1 && [ ! -d bench/node/node_modules/ws ]; then \
		npm install --prefix bench/node --no-audit --no-fund --silent; fi
	$(BIN)/python -m bench $(BENCH_ARGS)

# The image's pinned, hashed dependencies (Dockerfile): refresh after changing
# pyproject's dependencies or to take new releases, and commit the result.
lock: $(STAMP)
	$(BIN)/python -m pip install -q pip-tools
	$(BIN)/pip-compile --quiet --generate-hashes --strip-extras --no-emit-index-url \
		--no-emit-find-links --output-file requirements.lock pyproject.toml

# The config's JSON Schema, generated from the models (a test fails when they drift).
.PHONY: schema
schema: $(STAMP)
	$(BIN)/python -m watchd.config.schema -o config/watchd.schema.json

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
