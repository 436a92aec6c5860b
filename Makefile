# The two commands, each doing its own set-up first (a project venv in .venv, reused while current):
#   make image   build the default stack's image (toolbox.paths.DEFAULT_STACK: gfx1151-rocm10.1);
#                STACK=cpu|cuda|gfx1151|... for others, ENGINE=podman|docker,
#                LOCAL_BASE=1 where no registry answers (a Debian base made here with debootstrap)
#   make test    the test suite, what CI runs (installs .ci/apt-packages.txt as root, else says how)
#   make test-fast  the suite without the tests that build or run images (marker `image`)
PYTHON ?= python3
VENV ?= .venv
STACK ?=
ENGINE ?=
LOCAL_BASE ?=
PYTEST_ARGS ?=
# pytest-xdist workers: one more than the cores (the cluster, Ray and engine tests wait on processes,
# sshd and containers much of the time); 0 runs the suite in one process
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
BUILD_ARGS ?=
export PYTHON VENV ENGINE

PY := $(VENV)/bin/python

.PHONY: image test test-fast pytest golden lint venv venv-test

image:
	@bash .ci/setup venv
	@bash .ci/setup engine
	@stack="$(STACK)"; [ -n "$$stack" ] || stack=$$($(PY) -c 'from toolbox.paths import DEFAULT_STACK; print(DEFAULT_STACK)'); \
	  base=""; $(if $(LOCAL_BASE),base=$$(bash .ci/setup base "$$stack") || exit $$?;) \
	  cmd="$(PY) -m toolbox build --stack $$stack $(if $(ENGINE),--engine $(ENGINE))$$base$$(bash .ci/setup build-args) $(BUILD_ARGS)"; \
	  echo "$$cmd"; eval "$$cmd"

# Each phase prints its time (.ci/phase; .ci/run lists them all at the end); pytest its 30 slowest.
# The slow shared inputs (base image, cpu image, llama.cpp's host tools, the Ray image) are made
# once, first, by tests/prebuild.py; every test folder then reuses them (docs/images.md, "Test suite times").
test:
	@bash .ci/phase apt bash .ci/setup apt
	@bash .ci/phase venv bash .ci/setup venv train,test
	@$(PY) tests/prebuild.py
	@$(MAKE) --no-print-directory pytest

# The inner loop for changes that touch no image: every test but those that build or run an image
# (marker `image`, given by the fixtures they use: tests/conftest.py). `make test` stays the whole suite.
test-fast:
	@bash .ci/setup venv train,test
	@$(MAKE) --no-print-directory pytest PYTEST_ARGS='-m "not image" $(PYTEST_ARGS)'

# pytest's exit 5 = it collected no tests: a failure here, said so (make itself exits 2).
pytest:
	@bash .ci/phase pytest $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=30 $(PYTEST_ARGS) || { rc=$$?; [ $$rc -ne 5 ] || echo "make test: pytest collected no tests" >&2; exit $$rc; }

venv:
	@bash .ci/setup venv

venv-test:
	@bash .ci/setup venv train,test

# Re-render the golden Dockerfiles in tests/golden/ after an intended change.
golden: venv-test
	TOOLBOX_UPDATE_GOLDEN=1 $(PY) -m pytest -q tests/test_golden.py

lint: venv-test
	$(PY) -m toolbox lint
