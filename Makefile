# Two commands do all the set-up on a fresh machine with Python 3.11 and pip:
#   make demo   -- distributed PPO on CartPole across local processes
#   make test   -- runs the test suite (fast tests, then the slow end-to-end ones)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CORE := $(VENV)/.installed-core
INSTALLED := $(VENV)/.installed

.PHONY: demo examples test test-fast test-slow bench docs docs-check clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# The demo and the examples need jaxdist's core alone; the tests and the docs need every extra.
$(CORE): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e .
	touch $(CORE)

$(INSTALLED): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(CORE) $(INSTALLED)

demo: $(CORE)
	$(PY) experiments/ppo.py --fresh --stop-at-target

examples: $(CORE)
	$(PY) experiments/producer_consumer.py --launcher processes
	$(PY) experiments/mapreduce_wordcount.py --launcher processes
	$(PY) experiments/es_futures.py --launcher processes

# Every test, fast and slow, in one run: one worker more than the machine has cores (the tests
# spend part of their time waiting on processes and sockets), a test file to a worker at a time
# (its module fixtures made once: one Ray cluster), in conftest's order (the files with the most
# slow tests first). JAXDIST_TEST_CPU_BURNERS=N keeps N cores busy meanwhile (a loaded machine).
TEST_WORKERS ?= $(shell $(PYTHON) -c 'import os; print(len(os.sched_getaffinity(0)) + 1)')

test: $(INSTALLED)
	$(PY) -m pytest -m "" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# Either kind alone, over two workers: make test-fast, make test-slow.
test-fast: $(INSTALLED)
	$(PY) -m pytest -n 2 --dist loadfile

# A marker that selects no test (pytest exits 5) fails the run: the slow tests are never skipped unseen.
test-slow: $(INSTALLED)
	$(PY) -m pytest -m slow -n 2 --dist loadfile

# The site, from docs/ and the docstrings; strict: a broken reference or page fails the build.
docs: $(INSTALLED)
	$(PY) -m mkdocs build --strict

# The site built, then every page opened in headless Chromium (Debian's package, else
# Playwright's): a broken link, a missing image or a console error fails it; screenshots land in
# site-check/.
docs-check: $(INSTALLED)
	$(PY) tools/docs_check.py --screenshots site-check

bench: $(INSTALLED)
	$(PY) experiments/benchmarks/courier.py

clean:
	rm -rf $(VENV) runs site site-check .pytest_cache .hypothesis
