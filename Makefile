# A minute's read: everything a newcomer runs.
.PHONY: install test lint types ci demo bench chaos newest-pydantic-ai

install:        ## the package, its tests' tools and linters
	pip install -e '.[dev]'

test:           ## the default suite (fast; stress runs are behind -m slow)
	python -m pytest

chaos:          ## the long SIGKILL chaos run
	python -m pytest -m slow

newest-pydantic-ai:  ## the Pydantic AI integration's tests on the newest release (a throwaway venv)
	python -m pytest -m newest tests/test_integration_pydantic_ai_newest.py -n 0 -s

lint:           ## ruff lint + format check
	ruff check . && ruff format --check .

types:          ## strict type check of the package
	mypy

ci:             ## exactly what CI runs on a clean clone
	bash .ci/run

demo:           ## the main job: a workflow survives its worker's SIGKILL
	mainspring demo

bench:          ## step overhead beside raw sqlite3, DBOS and LangGraph
	python bench/step_overhead.py
