# The runner image: what runs inside every job's pod (python -m services.runner) — OpenMM, the
# runner and the mdq library. Build from the repository root:
#   docker build -f deploy/runner.Dockerfile -t mdq-runner:0.1.0 .  (the version of pyproject.toml)
# OpenMM comes from its PyPI wheel (the CPU platform, and OpenCL where the node has a driver);
# for NVIDIA GPUs build with --build-arg OPENMM_EXTRA="[cuda12]" so the CUDA platform plugin
# is installed too (the node must provide the NVIDIA driver and the device plugin).
# The Kubernetes backend names this image in MDQ_K8S_RUNNER_IMAGE and gives the pod
# the command, its job (MDQ_JOB_* variables) and the data volume at MDQ_DATA_DIR=/data.

FROM python:3.11.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY libs ./libs
COPY services ./services
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM python:3.11.11-slim
ARG OPENMM_EXTRA=""
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MDQ_DATA_DIR=/data \
    OMP_NUM_THREADS=1
COPY --from=build /wheels /wheels
# OpenMM first (its own layer: large, changes rarely), then mdq.
RUN pip install "openmm${OPENMM_EXTRA}>=8.1" \
    && pip install /wheels/*.whl \
    && rm -rf /wheels \
    && groupadd --gid 10001 mdq \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin mdq \
    && mkdir -p /data \
    && chown 10001:10001 /data \
    && python -c "import openmm, services.runner; print('OpenMM', openmm.__version__, [openmm.Platform.getPlatform(i).getName() for i in range(openmm.Platform.getNumPlatforms())])" \
    && python -c "import openmm; openmm.Platform.getPlatformByName('CPU')"
USER 10001:10001
WORKDIR /data
CMD ["python", "-m", "services.runner"]
