# Inference Explorer: two commands do all the set-up.
#   make app    installs into .venv if needed, then serves the Voila dashboard
#   make test   installs into .venv if needed, then runs the whole test suite
#   make lab    (optional) adds JupyterLab to .venv if needed, then opens notebooks/ in it
# GPU users: name your own torch build, e.g.
#   make setup TORCH="torch --index-url <the CUDA wheel index that pytorch.org's selector gives>"
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PORT   ?= 8866
APP_ARGS ?=
LAB_ARGS ?=
# torch threads for the notebooks under `make lab` (their THREADS parameter reads it): one thread
# keeps a small model's step steady on a busy laptop; torch's default (one per core) does not
THREADS ?= 1
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed

.PHONY: setup browser test app lab lint bench screenshot clean-venv

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# pip compiles every installed file to bytecode on one core (~34 s here); compileall does the
	@# same on every core (~18 s). Compiled they must be: where PYTHONDONTWRITEBYTECODE is set (it is
	@# on this machine) nothing is cached on import, and every kernel and server would compile torch
	@# again (the suite took 133 s longer). Files that do not compile (packages' own py2 fixtures)
	@# are skipped, as pip skips them.
	$(BIN)/python -m pip install --quiet --no-compile $(TORCH)
	$(BIN)/python -m pip install --quiet --no-compile -e ".[test]"
	$(BIN)/python -m compileall -qq -j 0 "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || true
	@touch $(STAMP)
	@echo "installed into $(VENV)"

# Debian chromium for the real-browser tests (only where missing and we are root).
browser: setup
	@bash scripts/ensure_browser.sh

# Two pytest workers by default (a test file stays on one worker: its fixtures are shared);
# make test WORKERS=0 runs in one process.
WORKERS ?= 2
test: setup browser
	$(BIN)/python -m pytest $(if $(filter 0,$(WORKERS)),,-n $(WORKERS) --dist loadfile) --durations=15

# make app APP_ARGS="--shared --models-config models.json --pool-size 2" for a classroom server
app: setup
	$(BIN)/explorer app --port $(PORT) $(APP_ARGS)

# The numbered notebooks (and `Dashboard()`) in JupyterLab; not needed by the app or the tests.
lab: setup
	@$(BIN)/python -c "import jupyterlab" 2>/dev/null || $(BIN)/python -m pip install --quiet -e ".[test,lab]"
	@# Jupyter refuses to run as root (a container) without --allow-root: added only when we are root
	EXPLORER_THREADS=$(THREADS) OMP_NUM_THREADS=$${OMP_NUM_THREADS:-$(THREADS)} \
		$(BIN)/jupyter lab notebooks/ $$( [ "$$(id -u)" = 0 ] && echo --allow-root ) $(LAB_ARGS)

# Benchmarks print ratios measured side by side in one run (never asserted by timed tests).
# About 14 minutes on a 2-core CPU.
bench: setup browser
	$(BIN)/explorer hardware
	$(BIN)/explorer bench overhead --threads 1
	$(BIN)/explorer bench overhead --model arch:qwen2.5-0.5b --new-tokens 32 --repeats 3
	$(BIN)/explorer bench speculative --modes greedy,sample --arch-pair arch:qwen2.5-0.5b arch:smollm2-135m
	$(BIN)/explorer sweep batch --model arch:qwen2.5-0.5b --batches 1,2,4,8,16,32,64 --repeats 3
	$(BIN)/explorer sweep pays --trick speculative --over batch --values 1,4,16,64
	$(BIN)/explorer bench serving --engine continuous --num-prompts 32 --compare sequential,static
	$(BIN)/explorer bench serving --engine continuous --num-prompts 32 --vs-plain --repeats 5
	$(BIN)/explorer sweep serving --over batch --values 1,2,4,8,16,32 --engines static,continuous --num-prompts 32
	$(BIN)/explorer sweep serving --over rate --values 4,16,64,256 --num-prompts 32
	$(BIN)/python scripts/bench_browser.py

screenshot: setup browser
	$(BIN)/python scripts/screenshot.py

lint: setup
	$(BIN)/ruff check explorer tests scripts
	$(BIN)/ruff format --check explorer tests scripts

clean-venv:
	rm -rf $(VENV)
