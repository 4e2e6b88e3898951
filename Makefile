# Two entry points: `make demo` and `make test`. Each creates .venv when missing and installs
# the project with the extras it uses: the demo only what the demos import (`local`: the
# embedded server, the default embedder, agent-framework), the tests every extra with the test,
# lint and type-check tools. `make lint` runs ruff (lint and format) and mypy.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
EXTRAS ?= embedded,use,minilm,ui,agent-framework,test,dev
DEMO_EXTRAS ?= local
DEMO_STAMP := $(VENV)/.installed-demo

# The venv, made once; before 0.3.0 this project was installed as `pgmemory`, the package
# index's name of an unrelated project with the same import name: neither may stay beside
# pgmemory-agents.
define venv_with
	@$(PYTHON) -c 'import sys; sys.exit("pgmemory needs Python >= 3.11, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(2) -e ".[$(1)]"
	$(PY) -m pip uninstall -q -y pgmemory 2>/dev/null || true
endef

.PHONY: demo test test-readme test-citus lint reliability bench docs clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(call venv_with,$(EXTRAS))
	@# The UI's browser tests drive Debian's chromium (playwright never downloads a browser);
	@# tests/store/test_pooler.py starts Debian's pgbouncer in front of the test server.
	if [ "$$(id -u)" = 0 ] && ! { command -v chromium && command -v pgbouncer; } >/dev/null; then apt-get update -qq && apt-get install -y -qq chromium pgbouncer; fi
	touch $(STAMP)

# What the demos import, and nothing else (tests/package/test_make.py checks the recipe);
# --no-compile: the demo compiles the modules it imports, not every installed one (49 s -> 32 s
# on a fresh clone with a warm pip cache).
$(DEMO_STAMP): pyproject.toml
	$(call venv_with,$(DEMO_EXTRAS),--no-compile)
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(PY) examples/quickstart.py
	$(PY) examples/food_delivery.py

# The second pass runs the store's tests as a least-privilege application role (`pgmemory db
# roles`): what the library does must work without owning the schema.
test: $(STAMP)
	$(PY) -m pytest
	PGMEMORY_TEST_APP_ROLE=1 $(PY) -m pytest -q tests/store

# Every README snippet as a new user runs it: from a built wheel, in a venv holding only the
# extras its section names, on a brand-new embedded data directory (tests/readme_extras.py;
# `make test` runs them with every extra on a new database). Venvs grow while the extras do,
# so this builds two; CI runs it once.
test-readme: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests/readme_extras.py

# The whole suite on a real Citus cluster (a coordinator and two workers,
# tests/citus/cluster.py) as the owner, then the store, admin, memory and reliability suites as
# the least-privilege role. Citus is compiled once per machine from ../shared/citus (needs gcc
# and make), then reused; tests that cannot apply to a cluster are listed, with why, in
# tests/citus/not_applicable.py. CI runs it after `make test`.
CITUS_ROLE_SUITES := tests/store tests/admin tests/memory tests/reliability tests/citus
test-citus: $(STAMP)
	PGMEMORY_TEST_CITUS=1 $(PY) -m pytest -q
	PGMEMORY_TEST_CITUS=1 PGMEMORY_TEST_APP_ROLE=1 $(PY) -m pytest -q $(CITUS_ROLE_SUITES)

# The heavy fault, concurrency and isolation runs (minutes); `make test` runs a fast version of each.
reliability: $(STAMP)
	$(PY) -m pytest -m reliability tests/reliability

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) bench/store/store_bench.py

# The API reference, rendered from the docstrings by pdoc into docs/api/ (HTML, not committed):
# the public surface (`pgmemory`) and the modules the README imports from directly.
API_MODULES := pgmemory pgmemory.integrations.alembic pgmemory.integrations.agent_framework \
	pgmemory.embedders.minilm pgmemory.ui.app pgmemory.ui.server
docs: $(STAMP)
	$(PY) -m pdoc --docformat google -o docs/api $(API_MODULES)

clean:
	rm -rf $(VENV) build dist *.egg-info
