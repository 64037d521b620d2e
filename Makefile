# mdq — two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run up test test-fast lint proto bench-placement bench-recovery bench-runner bench-ingest chaos clean install

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "mdq needs Python 3.11 or newer")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip uv
	$(BIN)/uv pip install --python $(BIN)/python --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## run: install, start the embedded stack, run the demo campaign, print the history, exit
run: $(STAMP)
	$(BIN)/mdq demo

## up: start the embedded stack (or use NATS_URL / DATABASE_URL) and keep it running
up: $(STAMP)
	$(BIN)/mdq up

## test: install and run every test (real NATS, PostgreSQL and OpenMM)
test: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy libs services tests bench
	$(BIN)/lint-imports

## proto: regenerate the Python code of proto/ (reproducible: pinned grpcio-tools)
proto: $(STAMP)
	rm -rf build/proto && mkdir -p build/proto
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=build/proto --pyi_out=build/proto proto/mdq/v1/mdq.proto
	cp build/proto/mdq/v1/mdq_pb2.py build/proto/mdq/v1/mdq_pb2.pyi libs/mdq/contracts/

clean:
	rm -rf $(VENV) build .pytest_cache .mdq

## bench-placement: core decision cost, jobs bound/s end to end against a raw nats-py loop, p99 latency
bench-placement: $(STAMP)
	$(BIN)/python bench/placement.py

## bench-runner: OpenMM ns/day bare vs under the runner (water box, LJ fluid), alternated
bench-runner: $(STAMP)
	$(BIN)/python bench/runner.py

## bench-recovery: eviction → running again (p50/p95), MD steps lost per runner kill
bench-recovery: $(STAMP)
	$(BIN)/python bench/recovery.py

## bench-ingest: progress events/s NATS → PostgreSQL through the watcher vs a raw fetch+COPY loop
bench-ingest: $(STAMP)
	$(BIN)/python bench/ingest.py

## chaos: >= 40 MD jobs while kill -9 hits every process, NATS/PostgreSQL restart, the data disk fills
chaos: $(STAMP)
	$(BIN)/python bench/chaos.py $(CHAOS_ARGS)
