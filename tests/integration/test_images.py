"""The two container images, built and run: the services image's intake and the runner image's
runner, inside the images, against a real NATS that requires credentials.

``tools.images`` builds ``deploy/Dockerfile`` and ``deploy/runner.Dockerfile`` with
buildah (chroot isolation, vfs storage) on a debootstrap bookworm base and a host wheelhouse,
as ``make images`` does where no registry answers. Each image then runs in a working container
(``buildah run``: the host's network, the image's user, mounted secrets and data): intake from
the services image takes a submit from the stream and answers a request, and the runner image's
runner runs the very job intake accepted, a tiny water box, and reports its progress and
outputs on the bus. The server is configured by ``mdq.bus.security.auth`` as every deployment's is,
so each process inside an image proves who it is with the credentials file it is given.

Marked ``images`` (``make test-images``, run by ``.ci/run`` after ``make test``, which deselects
it): a cold build takes minutes (debootstrap, the wheelhouse, vfs copies), a warm one seconds.
Skipped where buildah or debootstrap is missing, or not as root.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from nats.aio.client import Client

from mdq.bus.connect import connect
from mdq.bus.security.auth import Generated, generate, runner_issuer, write_secret
from mdq.bus.setup import prepare_bus
from mdq.bus.subjects import Subjects
from mdq.core.ids import request_id_for_key
from mdq.core.runner_task import RunnerTask, job_dir
from mdq.embedded import EmbeddedNats, start_nats
from tests.helpers import read_all, wait_for
from tools.images import INSTALL_HINT, Builder, Image, missing_tools, project_version

pytestmark = [pytest.mark.images, pytest.mark.timeout(1800)]

UID = 10001
"""The user both images run as (deploy/*.Dockerfile)."""
NAMESPACE = "mdq"
SECRETS = "/run/secrets/mdq"
"""Where the containers find their credentials (as compose and the manifests mount them)."""
WAIT_S = 120.0


@pytest.fixture(scope="module")
def builder() -> Builder:
    missing = missing_tools()
    if missing:
        pytest.skip(
            f"the image test needs {' and '.join(missing)} (as root: {INSTALL_HINT}); "
            "it builds deploy/Dockerfile and deploy/runner.Dockerfile with buildah"
        )
    return Builder()


@pytest.fixture(scope="module")
def images(builder: Builder) -> dict[str, Image]:
    """Both images, built offline from this checkout (cached: seconds when nothing changed)."""
    started = time.monotonic()
    built = builder.build_all(mode="offline")
    took = time.monotonic() - started
    for image in built:
        print(f"\n{image.name}: {image.size_bytes / 1e6:.0f} MB, built in {image.seconds:.0f} s")
    print(f"both images ready in {took:.0f} s (cache: {builder.cache})")
    return {image.dockerfile: image for image in built}


@dataclass
class Bus:
    nats: EmbeddedNats
    generated: Generated
    secrets: Path
    """A folder the images' user may read, mounted at ``SECRETS`` (the credentials)."""

    def creds(self, identity: str) -> Path:
        return self.generated.creds[identity]


@pytest.fixture(scope="module")
async def bus() -> AsyncIterator[Bus]:
    """A NATS server with ``mdq.bus.security.auth``'s trust (no anonymous client gets in), its
    streams made by the admin identity as ``mdq up`` and the bus-setup job make them."""
    folder = Path(tempfile.mkdtemp(prefix="mdq-images-"))
    generated = generate(folder / "nats-secrets", NAMESPACE)
    server = start_nats(folder / "nats", auth_file=generated.server_block)
    await prepare_bus(server.url, namespace=NAMESPACE, creds=generated.creds["admin"])
    secrets = folder / "secrets"
    secrets.mkdir()
    shutil.copy(generated.creds["intake"], secrets / "intake.creds")  # intake's alone
    for path in (secrets, secrets / "intake.creds"):
        os.chown(path, UID, UID)
    yield Bus(server, generated, secrets)
    server.stop()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
async def cli(bus: Bus) -> AsyncIterator[Client]:
    client = await connect(bus.nats.url, name="test", creds=bus.creds("cli"))
    yield client
    await client.drain()


@contextmanager
def working_container(builder: Builder, image: str) -> Iterator[str]:
    container = builder.container(image)
    try:
        yield container
    finally:
        builder.remove(container)


async def run_in(
    builder: Builder,
    container: str,
    *command: str,
    log: Path,
    mounts: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> asyncio.subprocess.Process:
    """Start ``command`` inside ``container``; its output goes to ``log``."""
    with log.open("wb") as output:
        return await asyncio.create_subprocess_exec(
            *builder.run_command(container, *command, mounts=mounts, env=env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=output,
            stderr=asyncio.subprocess.STDOUT,
        )


def text(log: Path) -> str:
    return log.read_text(errors="replace")


async def finished(process: asyncio.subprocess.Process, log: Path, within_s: float) -> int:
    try:
        return await asyncio.wait_for(process.wait(), within_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(f"not finished in {within_s} s:\n{text(log)}") from None


def signal_inside(process: asyncio.subprocess.Process, module: str) -> None:
    """SIGTERM to ``python -m module`` itself, inside the container: chroot isolation shares
    the host's process table, and ``buildah run`` does not pass SIGTERM on (it kills its child
    and exits 1), while Kubernetes and compose signal the container's process directly."""
    for child in psutil.Process(process.pid).children(recursive=True):
        # the interpreter itself, not buildah's chroot helper that carries the same arguments
        if child.name().startswith("python") and module in " ".join(child.cmdline()):
            child.terminate()
            return
    raise AssertionError(f"no {module} process under buildah run {process.pid}")


async def stopped(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 30)
        except TimeoutError:
            process.kill()
            await process.wait()


async def test_the_images_run_as_their_user_and_carry_their_version(
    builder: Builder, images: dict[str, Image], tmp_path: Path
) -> None:
    for dockerfile, image in images.items():
        config = builder.config(image.name)
        assert config["User"] == f"{UID}:{UID}", dockerfile
        labels = config["Labels"]
        assert isinstance(labels, dict)
        assert labels["org.opencontainers.image.version"] == project_version(), dockerfile
        assert labels["org.opencontainers.image.revision"] not in ("", "unknown"), dockerfile
        env = config["Env"]
        assert isinstance(env, list)
        assert not [v for v in env if any(s in v.upper() for s in ("PASSWORD", "CREDS", "SEED"))]
        # Inside: the image's user, the installed packages, and no pip, build tools, source
        # tree, wheelhouse or lock files.
        check = (
            "import importlib.util as u, os, pathlib as p, mdq, services.runner\n"
            f"assert os.getuid() == {UID}, os.getuid()\n"
            "assert u.find_spec('pip') is None and u.find_spec('setuptools') is None\n"
            "assert not [x for x in ('/src', '/opt/tools', '/wheelhouse', '/tmp/requirements',"
            " '/tmp/wheels') if p.Path(x).exists()]\n"
            "assert 'site-packages' in mdq.__file__, mdq.__file__\n"
            "print('inside ok')\n"
        )
        with working_container(builder, image.name) as container:
            log = tmp_path / f"{dockerfile}.log"
            process = await run_in(builder, container, "python", "-c", check, log=log)
            assert await finished(process, log, WAIT_S) == 0, text(log)
            assert "inside ok" in text(log)


async def test_a_job_submitted_to_the_services_image_runs_in_the_runner_image(
    builder: Builder, images: dict[str, Image], bus: Bus, cli: Client, tmp_path: Path
) -> None:
    subjects = Subjects(NAMESPACE)
    js = cli.jetstream()
    key = f"images-{time.time_ns()}"
    submit = {
        "idempotency_key": key,
        "jobs": [
            {
                "name": "water",
                "system": {"water_box": {"box_nm": 1.5}},
                "steps": 200,
                "report_interval_steps": 50,
                "checkpoint_interval_steps": 100,
                "seed": 7,
            }
        ],
    }
    job_id = f"{request_id_for_key(key)}-water"

    # intake, from the services image, with its own credentials only
    with working_container(builder, images["Dockerfile"].name) as container:
        intake_log = tmp_path / "intake.log"
        intake = await run_in(
            builder,
            container,
            "python",
            "-m",
            "services.intake",
            log=intake_log,
            mounts=(f"{bus.secrets}:{SECRETS}:ro",),
            env={
                "NATS_URL": bus.nats.url,
                "MDQ_NAMESPACE": NAMESPACE,
                "MDQ_NATS_CREDS": f"{SECRETS}/intake.creds",
            },
        )
        try:
            # fire-and-forget, kept by the stream until intake (still starting) takes it
            await js.publish(subjects.submit, json.dumps(submit).encode())

            async def accepted() -> bool:
                assert intake.returncode is None, text(intake_log)
                return bool(await read_all(js, subjects.job(job_id, "submitted")))

            await wait_for(accepted, timeout=WAIT_S, interval=0.5, what="job.submitted")
            # request-reply: intake answers from inside the image (same content: same id)
            reply = await cli.request(subjects.api_submit, json.dumps(submit).encode(), 30)
            assert json.loads(reply.data)["job_ids"] == [job_id], reply.data
            signal_inside(intake, "services.intake")  # SIGTERM: a clean stop
            assert await finished(intake, intake_log, 30) == 0, text(intake_log)
        finally:
            await stopped(intake)
    [submitted] = await read_all(js, subjects.job(job_id, "submitted"))
    spec = submitted.submitted.spec
    assert spec.steps == 200 and spec.system.water_box.box_nm == pytest.approx(1.5)

    # the runner, from the runner image, with credentials minted for this job alone
    data = tmp_path / "data"
    data.mkdir()
    runner_secrets = tmp_path / "runner-secrets"
    runner_secrets.mkdir()
    issuer = runner_issuer(bus.generated.trust)
    write_secret(runner_secrets / "runner.creds", issuer.creds(job_id))
    for path in (data, runner_secrets, runner_secrets / "runner.creds"):
        os.chown(path, UID, UID)
    task = RunnerTask(
        job_id=job_id, attempt=1, spec=spec, job_dir=job_dir(Path("/data"), job_id), threads=1
    )
    with working_container(builder, images["runner.Dockerfile"].name) as container:
        runner_log = tmp_path / "runner.log"
        runner = await run_in(
            builder,
            container,
            "python",
            "-m",
            "services.runner",
            log=runner_log,
            mounts=(f"{data}:/data", f"{runner_secrets}:{SECRETS}:ro"),
            env={
                **task.to_env(),
                "NATS_URL": bus.nats.url,
                "MDQ_NAMESPACE": NAMESPACE,
                "MDQ_NATS_CREDS": f"{SECRETS}/runner.creds",
            },
        )
        try:
            assert await finished(runner, runner_log, 300) == 0, text(runner_log)
        finally:
            await stopped(runner)

    progress = [event.progress for event in await read_all(js, subjects.progress(job_id))]
    assert [p.step for p in progress] == [50, 100, 150, 200], text(runner_log)
    assert progress[-1].done_reason == "steps_reached"
    assert all(p.potential_kj_mol < 0 < p.kinetic_kj_mol for p in progress)
    [outputs] = await read_all(js, subjects.job(job_id, "outputs"))
    assert outputs.outputs.final_step == 200
    checkpoints = await read_all(js, subjects.job(job_id, "checkpoint"))
    # every checkpoint_every steps, and the final step's, from which `mdq extend` resumes
    assert [event.checkpoint.step for event in checkpoints] == [100, 200]
    # written by the image's user, into the mounted data volume
    final = data / "jobs" / job_id / "final_state.xml"
    assert "<State" in text(final)
    assert final.stat().st_uid == UID
