# tandem: developer and demo entry points. `make demo` and `make test` work on a fresh machine
# (Python 3.11, pip, make; no GPU). Torch is pinned here (TORCH_PIN) to one tested version,
# installed before tandem so that pip keeps it; the library itself only asks for torch>=2.2.
# MLflow is pinned likewise (MLFLOW_PIN): tandem writes the SQLite stores of the MLflow versions
# whose schema it was tested against directly (tandem.watch.stores.sqlite_writer), and its tests
# check that it does, so a new MLflow is taken on deliberately, not by a release on PyPI.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_PIN ?= torch==2.13.0
MLFLOW_PIN ?= mlflow==3.18.0
STAMP := $(VENV)/.installed

.PHONY: setup bytecode demo test lint docs bench-share clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_PIN)"
	$(BIN)/python -m pip install -q -e ".[all,ray,dev,docs]" "$(MLFLOW_PIN)"
	touch $(STAMP)

setup: $(STAMP)

# tandem's own modules compiled once (cheap when up to date): where the environment sets
# PYTHONDONTWRITEBYTECODE, every interpreter tandem starts (a CLI command, a supervisor, a
# producer: hundreds in the tests) would otherwise compile them anew, about 0.1 CPU-s each.
# A stale file is only not used: Python checks each against its source.
bytecode: setup
	$(BIN)/python -m compileall -q src >/dev/null

demo: setup bytecode
	$(BIN)/tandem demo

# The share tests run twice: as on x86-64 (announcement table), and socket-only as on every
# other architecture (TANDEM_SHARE_TABLE=0), so that path is tested on every commit.
# Both passes run even when the first fails, and both are reported; the exit says whether all passed.
test: setup bytecode
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy
	@first=0; second=0; \
	$(BIN)/python -m pytest -q || first=$$?; \
	TANDEM_SHARE_TABLE=0 $(BIN)/python -m pytest -q tests/share || second=$$?; \
	echo "make test: all tests $$( [ $$first = 0 ] && echo passed || echo FAILED ); share tests, socket transport: $$( [ $$second = 0 ] && echo passed || echo FAILED )"; \
	[ $$first = 0 ] && [ $$second = 0 ]

lint: setup
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

# The documentation site (mkdocs.yml, docs/) into site/, with warnings as errors; no network.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

bench-share: setup
	$(BIN)/python -m pip install -q "tensorsocket==0.0.5" || echo "tensorsocket not installed: its column is skipped"
	$(BIN)/python benchmarks/share_bench.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache src/*.egg-info site
