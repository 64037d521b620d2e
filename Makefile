# mdq — two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run up test test-fast test-images images lock lint proto asyncapi bench-placement bench-recovery bench-runner bench-ingest bench-scale bench-history bench-console bench-nodes-hour bench-fairshare bench-multicluster bench-requests bench-control bench-tenant-flood bench-simulate chaos clean install compose-secrets deploy-dev-secrets chaos-soak

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "mdq needs Python 3.11 or newer")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip uv
	$(BIN)/uv pip install --python $(BIN)/python --quiet --compile-bytecode -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## run: install, start the embedded stack, run the demo campaign, print the history, exit
run: $(STAMP)
	$(BIN)/mdq demo $(if $(KEEP_UP),--keep-up,)

## up: start the embedded stack (or use NATS_URL / DATABASE_URL) and keep it running
up: $(STAMP)
	$(BIN)/mdq up

## compose-secrets: generate docker-compose's passwords into .env (git-ignored, mode 0600;
## existing values are kept: PostgreSQL's, Grafana's admin, the group that may read the NATS
## credentials) and its NATS credentials into secrets/nats/ (git-ignored; `mdq credentials`,
## the generator of `mdq up`: an existing trust and unchanged credentials are kept) and the web
## console's access token into secrets/console.token (0640; kept once made)
compose-secrets: $(STAMP)
	PYTHONPATH=libs $(PYTHON) -m mdq.store.roles env-file .env
	grep -q '^GRAFANA_ADMIN_PASSWORD=' .env || echo "GRAFANA_ADMIN_PASSWORD=$$($(PYTHON) -c 'import secrets; print(secrets.token_urlsafe(32))')" >> .env
	grep -q '^MDQ_SECRETS_GID=' .env || echo "MDQ_SECRETS_GID=$$(id -g)" >> .env
	$(BIN)/mdq credentials --out secrets/nats --group-readable
	$(BIN)/mdq console-token --out secrets/console.token --group-readable

## deploy-dev-secrets: the same for the Kubernetes dev overlay (deploy/overlays/dev/postgres.env,
## deploy/overlays/dev/nats/ for its NATS Secrets)
deploy-dev-secrets: $(STAMP)
	PYTHONPATH=libs $(PYTHON) -m mdq.store.roles env-file deploy/overlays/dev/postgres.env
	$(BIN)/mdq credentials --out deploy/overlays/dev/nats

## test: install and run every test (real NATS, PostgreSQL and OpenMM), in TEST_WORKERS
## processes (pytest-xdist; each has its own NATS and PostgreSQL, a test file stays in one)
## (the image test, marked `images`, is left to `make test-images`: it builds both images)
## Temporary folders go to a base of this run's own, removed afterwards: under the shared
## /tmp/pytest-of-<user>, another pytest starting on the machine deletes older runs' folders
## and resets that folder to 0700 while an embedded PostgreSQL (run as pgserver's own user)
## still needs to traverse it.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/lint-imports
	@echo "note: tests marked 'images' (build + run the container images) are deselected here: make test-images"
	@base=$$(mktemp -d "$${TMPDIR:-/tmp}/mdq-tests-XXXXXX") && \
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not images" --basetemp="$$base"; \
	status=$$?; rm -rf "$$base"; exit $$status

## test-images: build both images with buildah and run intake and the runner inside them against
## a test NATS (tests/integration/test_images.py; as root, needs buildah and debootstrap;
## cached under MDQ_IMAGE_CACHE, default ~/.cache/mdq-images)
test-images: $(STAMP)
	$(BIN)/pytest -q -s -m images tests/integration/test_images.py --durations=0

## images: build deploy/Dockerfile (mdq) and deploy/runner.Dockerfile (mdq-runner) with buildah;
## IMAGE_MODE=auto (default: the public base and PyPI where a registry answers, else a
## debootstrap bookworm base and a host wheelhouse) | public | offline (docs/deploy.md)
IMAGE_MODE ?= auto
images: $(STAMP)
	$(BIN)/python -m tools.images --mode $(IMAGE_MODE)

## lock: re-pin the images' Python packages with their hashes (deploy/requirements/*.txt)
lock: $(STAMP)
	$(BIN)/uv pip compile pyproject.toml --universal --python-version 3.11 --generate-hashes \
		--no-header --index-url https://pypi.org/simple -o deploy/requirements/runtime.txt
	$(BIN)/uv pip compile deploy/requirements/build.in --universal --python-version 3.11 \
		--generate-hashes --no-header --index-url https://pypi.org/simple -o deploy/requirements/build.txt

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy libs services tests bench tools
	$(BIN)/lint-imports

## proto: regenerate the Python code of proto/ (reproducible: pinned grpcio-tools)
proto: $(STAMP)
	rm -rf build/proto && mkdir -p build/proto
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=build/proto --pyi_out=build/proto proto/mdq/v1/mdq.proto
	cp build/proto/mdq/v1/mdq_pb2.py build/proto/mdq/v1/mdq_pb2.pyi libs/mdq/contracts/

## asyncapi: regenerate docs/asyncapi.yaml (the bus contract) from the subjects, streams and .proto
asyncapi: $(STAMP)
	$(BIN)/python -m mdq.bus.asyncapi

clean:
	rm -rf $(VENV) build .pytest_cache .mdq

## bench-*: each prints one JSON line, mdq measured from outside against a raw baseline in the
## same run (docs/benchmarks.md); BENCH_ARGS=--quick for a short check
BENCH_ARGS ?=

## bench-placement: core decision cost, jobs bound/s end to end against a raw nats-py loop, p99 latency; fsync-always vs server default
bench-placement: $(STAMP)
	$(BIN)/python bench/placement.py $(BENCH_ARGS)

## bench-runner: OpenMM ns/day under the runner vs plain OpenMM with the same reports/checkpoints, timed from outside
bench-runner: $(STAMP)
	$(BIN)/python bench/runner.py $(BENCH_ARGS)

## bench-control: job control from outside: cancel → runner gone (p50/p99, against a raw SIGTERM), checkpointed on cancel, 10,000 pending jobs cancelled by one selector (against raw publishing), runners left, double terminals
bench-control: $(STAMP)
	$(BIN)/python bench/control.py $(BENCH_ARGS)

## bench-tenant-flood: one tenant floods the closed bus every way it may; another's submit -> bound p99 against the same submits alone, and every shared stream's growth (docs/security.md)
bench-tenant-flood: $(STAMP)
	$(BIN)/python bench/tenant_flood.py $(BENCH_ARGS)

## bench-recovery: eviction → runner process up again (p50/p95), steps lost per kill -9 from the runner's own files
bench-recovery: $(STAMP)
	$(BIN)/python bench/recovery.py $(BENCH_ARGS)

## bench-scale: a year of history against none, side by side: RSS of placement, recovery and intake, restart to the first job bound, jobs bound/s
bench-scale: $(STAMP)
	$(BIN)/python bench/scale.py $(BENCH_ARGS)

## bench-requests: hand-set (the brief's 2 cores, 4 Gi) against learned resource requests, same campaign on the same local nodes: memory and CPU slack measured from /proc, OOM kills from the node agent's record of each runner pid, makespan ratio (docs/requests.md)
bench-requests: $(STAMP)
	$(BIN)/python bench/requests.py $(BENCH_ARGS)

## bench-simulate: mdq simulate at 1,000 nodes and 100,000 jobs (speed against real time, measured from outside), learned vs hand-set requests on a memory-bound mix, fair share's share error, load-aware vs bin-packing under noisy neighbours (docs/simulate.md); BENCH_ARGS=--validate adds the real campaign's makespan error
bench-simulate: $(STAMP)
	$(BIN)/python bench/simulate.py $(BENCH_ARGS)

## bench-console: the web console at a year's size (1,000,000 jobs; BENCH_ARGS=--history-jobs 10000000 for a big site's): p99 of the jobs list, a job page, a campaign page; bus -> chart latency in headless Chromium
bench-console: $(STAMP)
	$(BIN)/python bench/console.py $(BENCH_ARGS)

## bench-nodes-hour: the nodes page's hour at 3,000 nodes: the summaries stream's size, a console restart's read of it against a bare consumer, the metrics service's pace with and without summarising
bench-nodes-hour: $(STAMP)
	$(BIN)/python bench/nodes_hour.py $(BENCH_ARGS)

## bench-multicluster: placement throughput over 3 clusters of 1,000 nodes against 1 of 3,000 (the real intake and placement, side by side)
bench-multicluster: $(STAMP)
	$(BIN)/python bench/multicluster.py $(BENCH_ARGS)

## bench-fairshare: three tenants (weights 1:1:2) flood the local backend, a fourth arrives: share error, utilisation, time to fair share, steps lost per preemption, Jain's index (from the process table)
bench-fairshare: $(STAMP)
	$(BIN)/python bench/fairshare.py $(BENCH_ARGS)

## bench-history: PostgreSQL at a big site's year (10,000,000 jobs, 200,000,000 progress rows, 40,000,000 job events; --quick 1,000,000 / 20,000,000): p99 of every CLI read, console page query and query docs/history.md documents; load time and disk against the same rows in unindexed tables
bench-history: $(STAMP)
	$(BIN)/python bench/history_shape.py
	$(BIN)/python bench/history_pg.py $(BENCH_ARGS)

## bench-ingest: progress events/s NATS → PostgreSQL, watcher vs the fastest raw fetch+COPY loop; fsync-always vs server default
bench-ingest: $(STAMP)
	$(BIN)/python bench/ingest.py $(BENCH_ARGS)

## chaos: >= 40 MD jobs while kill -9 hits every process, NATS/PostgreSQL restart, the data disk fills
chaos: $(STAMP)
	$(BIN)/python bench/chaos.py $(CHAOS_ARGS)

## chaos-soak: SEEDS campaigns on fresh random seeds (each printed); one JSON line; exit 0 only if all pass
SEEDS ?= 20
chaos-soak: $(STAMP)
	$(BIN)/python bench/chaos.py --soak $(SEEDS) $(CHAOS_ARGS)
