# The runner image: what runs inside every job's pod (python -m services.runner) — OpenMM, the
# runner and the mdq library. Build from the repository root (or `make images`: docs/deploy.md):
#   docker build -f deploy/runner.Dockerfile -t mdq-runner:0.1.0 .  (the version of pyproject.toml)
# OpenMM comes from its PyPI wheel, pinned (the CPU platform, and OpenCL where the node has a
# driver); for NVIDIA GPUs build with --build-arg OPENMM_EXTRA="[cuda12]" so the CUDA platform
# plugin is installed too (the node must provide the NVIDIA driver and the device plugin; the
# plugin is not in deploy/requirements, so that build needs an index that has it).
# The Kubernetes backend names this image in MDQ_K8S_RUNNER_IMAGE and gives the pod
# the command, its job (MDQ_JOB_* variables) and the data volume at MDQ_DATA_DIR=/data.
#
# Build arguments: BASE_IMAGE, PIP_INDEX_URL, PIP_NO_INDEX, VERSION, REVISION, SOURCE as in
# deploy/Dockerfile, and OPENMM_EXTRA.

ARG BASE_IMAGE=python:3.11.11-slim

# -- source: only the files the wheel is made of (a stage of its own: one layer to copy) -----
FROM scratch AS source
COPY pyproject.toml README.md /src/
COPY libs /src/libs
COPY services /src/services

# -- build: mdq and its pinned dependencies into a virtual environment, /opt/mdq -------------
# The same lines in deploy/Dockerfile and deploy/runner.Dockerfile, so that either build reuses
# the other's layers. Build arguments and settings first: on a copying storage driver (vfs)
# every instruction is a layer, and these stay small.
FROM ${BASE_IMAGE} AS build
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_NO_INDEX=0
ARG OPENMM_EXTRA=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_FIND_LINKS=/wheelhouse
COPY deploy/requirements/ /tmp/requirements/
# The pinned packages (their own layer: large, changes only with the lock). OPENMM_EXTRA
# ("[cuda12]") adds OpenMM's GPU plugin at the locked OpenMM version (runner image).
RUN --mount=type=bind,source=deploy/wheelhouse,target=/wheelhouse \
    python3 -m venv /opt/tools \
    && /opt/tools/bin/pip install --require-hashes --no-deps -r /tmp/requirements/build.txt \
    && python3 -m venv --without-pip /opt/mdq \
    && /opt/tools/bin/pip --python /opt/mdq/bin/python install --require-hashes --no-deps \
        -r /tmp/requirements/runtime.txt \
    && if [ -n "$OPENMM_EXTRA" ]; then \
        /opt/tools/bin/pip --python /opt/mdq/bin/python install \
            "openmm${OPENMM_EXTRA}==$(sed -n 's/^openmm==\([^ ]*\).*/\1/p' /tmp/requirements/runtime.txt)"; \
    fi
COPY --from=source /src /src
# mdq's own wheel, then every check: the lock covers mdq's dependencies, the services import,
# OpenMM runs on the CPU.
RUN cd /src \
    && /opt/tools/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /tmp/wheels . \
    && /opt/tools/bin/pip --python /opt/mdq/bin/python install --no-deps /tmp/wheels/*.whl \
    && /opt/tools/bin/pip --python /opt/mdq/bin/python check \
    && /opt/mdq/bin/python -c "import mdq.contracts, services.intake, services.placement, services.watcher, services.recovery, services.metrics, services.runner" \
    && /opt/mdq/bin/python -c "import openmm; print('OpenMM', openmm.__version__, [openmm.Platform.getPlatform(i).getName() for i in range(openmm.Platform.getNumPlatforms())]); openmm.Platform.getPlatformByName('CPU')"

# -- runtime: the base image, a user and the virtual environment; no pip, compiler, source ---
# tree, wheelhouse or lock files (they stay in the build stage). The virtual environment last:
# the one large layer.
FROM ${BASE_IMAGE}
RUN groupadd --gid 10001 mdq \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin mdq \
    && mkdir -p /data \
    && chown 10001:10001 /data
ENV PATH=/opt/mdq/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MDQ_DATA_DIR=/data \
    OMP_NUM_THREADS=1
WORKDIR /data
USER 10001:10001
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=unknown
LABEL org.opencontainers.image.title="mdq-runner" \
      org.opencontainers.image.description="mdq's MD runner: OpenMM and python -m services.runner" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}"
COPY --from=build /opt/mdq /opt/mdq
CMD ["python", "-m", "services.runner"]
