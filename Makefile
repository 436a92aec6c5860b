# The two commands, each doing its own set-up first (a project venv in .venv, reused while current):
#   make image   build the default stack's image (toolbox.paths.DEFAULT_STACK: gfx1151-rocm10.0);
#                STACK=cpu|cuda|gfx1151|... for others, ENGINE=podman|docker,
#                LOCAL_BASE=1 where no registry answers (a Debian base made here with debootstrap)
#   make test    the test suite, what CI runs (installs .ci/apt-packages.txt as root, else says how)
PYTHON ?= python3
VENV ?= .venv
STACK ?=
ENGINE ?=
LOCAL_BASE ?=
PYTEST_ARGS ?=
BUILD_ARGS ?=
export PYTHON VENV ENGINE

PY := $(VENV)/bin/python

.PHONY: image test golden lint venv venv-test

image:
	@bash .ci/setup venv
	@bash .ci/setup engine
	@stack="$(STACK)"; [ -n "$$stack" ] || stack=$$($(PY) -c 'from toolbox.paths import DEFAULT_STACK; print(DEFAULT_STACK)'); \
	  base=""; $(if $(LOCAL_BASE),base=$$(bash .ci/setup base "$$stack") || exit $$?;) \
	  cmd="$(PY) -m toolbox build --stack $$stack $(if $(ENGINE),--engine $(ENGINE))$$base$$(bash .ci/setup build-args) $(BUILD_ARGS)"; \
	  echo "$$cmd"; eval "$$cmd"

test:
	@bash .ci/setup apt
	@bash .ci/setup venv train,test
	@# pytest's exit 5 = it collected no tests: a failure here, said so (make itself exits 2).
	$(PY) -m pytest -q $(PYTEST_ARGS) || { rc=$$?; [ $$rc -ne 5 ] || echo "make test: pytest collected no tests" >&2; exit $$rc; }

venv:
	@bash .ci/setup venv

venv-test:
	@bash .ci/setup venv train,test

# Re-render the golden Dockerfiles in tests/golden/ after an intended change.
golden: venv-test
	TOOLBOX_UPDATE_GOLDEN=1 $(PY) -m pytest -q tests/test_golden.py

lint: venv-test
	$(PY) -m toolbox lint
