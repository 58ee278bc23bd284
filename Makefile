# Entry points (see README.md): `make run` installs everything and runs a real sandboxed print;
# `make test` installs everything and runs every test suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?= -n 2
FUZZ_SECONDS ?= 60

.PHONY: all deps install images run test test-c test-guest test-py fuzz lint clean

all: install images

deps:
	scripts/install-system-deps.sh

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

install: deps $(PY)
	$(PY) -m pip install -q '.[test]'

images: deps
	images/build.sh

run: install images
	$(VENV)/bin/sbx run -c 'import platform; print("hello from the sandbox, kernel", platform.release())'

test-c: deps
	$(MAKE) -C tests/c test

test-guest: deps
	$(MAKE) -C guest test

fuzz: deps
	$(MAKE) -C tests/c fuzz FUZZ_SECONDS=$(FUZZ_SECONDS)

lint: install
	$(PY) -m mypy

test-py: install images
	$(PY) -m pytest $(PYTEST_ARGS) tests/unit tests/integration

test: test-c test-guest fuzz lint test-py

clean:
	rm -rf build $(VENV) guest/build tests/c/build src/*.egg-info
