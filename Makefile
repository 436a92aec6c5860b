# Set-up + main job: `make image` (STACK=gfx1151|cpu|cuda). Tests: `make test`.
PYTHON ?= python3
STACK ?= gfx1151
ENGINE ?=
PYTEST_ARGS ?=

.PHONY: image test golden lint

image:
	$(PYTHON) -m toolbox build --stack $(STACK) $(if $(ENGINE),--engine $(ENGINE))

test:
	$(PYTHON) -m pytest -q $(PYTEST_ARGS)

# Re-render the golden Dockerfiles in tests/golden/ after an intended change.
golden:
	TOOLBOX_UPDATE_GOLDEN=1 $(PYTHON) -m pytest -q tests/test_golden.py

lint:
	$(PYTHON) -m toolbox lint
