"""Entry point of the runner: read the task, connect, run it, exit with a meaningful code.

The composition root: task, settings and bus come from the environment; the task is checked
again (``checked_task``) before anything runs; SIGTERM and SIGINT only set a flag, on which the
running task checkpoints and returns PREEMPTED; every failure is mapped to a
:class:`RunnerExit`. Design: docs/engines.md, "The runner"; docs/security.md,
"Every consumer validates the spec it acts on".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from google.protobuf.json_format import ParseError
from nats.aio.client import Client

from mdq import datadisk
from mdq.bus.connect import CREDS_ENV, connect
from mdq.bus.copies import CopyStore
from mdq.bus.inputs import InputFetch
from mdq.bus.publisher import EventPublisher
from mdq.bus.security.runner_creds import RenewableCreds
from mdq.bus.subjects import Subjects
from mdq.core.exit_codes import RunnerExit
from mdq.core.runner_task import RunnerTask, jobs_root
from mdq.core.spec import SpecError, normalize_job
from mdq.errors import InvalidInput
from mdq.forcefields import ForceFieldFolders
from mdq.settings import CommonSettings
from services.runner.copies import CheckpointCopier
from services.runner.engines import ENGINE_TASKS, load_engine, unstable
from services.runner.errors import RunnerError
from services.runner.inputs import InputFetcher
from services.runner.md import TASKS, RunContext
from services.runner.metrics import RunnerMetrics
from services.runner.outbox import Outbox
from services.runner.settings import RunnerSettings
from services.runner.usage import measure

log = logging.getLogger("mdq.runner")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
CLOSE_TIMEOUT_S = 10.0
RECONNECT_FLUSH_S = 5.0
"""How long a renewal's reconnect waits for the events in flight to be acknowledged."""


def configure_logging(task: RunnerTask | None = None) -> None:
    """One line per record on stderr, tagged with the job and attempt."""
    tag = f"{task.job_id}#{task.attempt}" if task else "-"
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format=f"%(asctime)s %(levelname)s runner[{tag}] %(name)s: %(message)s",
        force=True,
    )


def exit_code_for(error: BaseException) -> RunnerExit:
    """The exit code that tells recovery what kind of failure ``error`` is: a data disk that
    failed under the runner (full, over quota, read-only, I/O errors, not mounted) is the
    node's failure (``mdq.datadisk``), whatever raised it."""
    if isinstance(error, RunnerError):
        return error.exit_code
    if (disk := datadisk.exit_code_for(error)) is not None:
        return disk
    if isinstance(error, MemoryError) or "bad_alloc" in str(error):
        return RunnerExit.OUT_OF_MEMORY
    if unstable(error):
        return RunnerExit.UNSTABLE
    return RunnerExit.CRASHED


async def _connect_unless_stopped(
    url: str, task: RunnerTask, stopped: asyncio.Event, creds: RenewableCreds | None = None
) -> Client | None:
    """Connect to NATS, waiting (with backoff, one log line per try) while it is not there;
    None if SIGTERM/SIGINT came first.

    The runner does not start MD without the bus: its progress and checkpoint events are the
    only record of its work that recovery and the watcher see, and an attempt that cannot tell
    anyone what it did would be work lost. Nothing has been computed yet, so waiting costs no
    MD; a pod that waits too long is stopped by the cluster (SIGTERM), which ends the wait.
    """
    connecting = asyncio.create_task(
        connect(url, name=f"runner-{task.job_id}-{task.attempt}", wait=True, creds=creds)
    )
    stopping = asyncio.create_task(stopped.wait())
    try:
        await asyncio.wait({connecting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if connecting.done():
        return connecting.result()
    connecting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await connecting
    return None


async def run(task: RunnerTask, *, common: CommonSettings, settings: RunnerSettings) -> RunnerExit:
    """Run one attempt; return its exit code (never raises for a failure of the task)."""
    loop = asyncio.get_running_loop()
    stop = threading.Event()
    stopped = asyncio.Event()

    def request_stop(signum: signal.Signals) -> None:
        log.info("%s received: checkpointing and stopping", signum.name)
        stop.set()
        stopped.set()

    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, request_stop, signum)
    task.job_dir.mkdir(parents=True, exist_ok=True)
    os.chdir(task.job_dir)  # relative names resolve in the job's own folder, nowhere else
    # the engine's module and library load while the runner connects and fetches its inputs
    engine_loading = (
        asyncio.ensure_future(asyncio.to_thread(load_engine, task.spec))
        if task.spec.task in ENGINE_TASKS
        else None
    )
    found = os.environ.get(CREDS_ENV)
    creds = RenewableCreds.load(Path(found)) if found else None
    try:
        client = await _connect_unless_stopped(common.nats_url, task, stopped, creds)
    except BaseException:
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)
        await _settled(engine_loading)
        raise
    if client is None:
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)
        await _settled(engine_loading)
        log.info("stopped while waiting for NATS: no step was run; exiting with PREEMPTED")
        return RunnerExit.PREEMPTED
    subjects = Subjects(common.namespace)
    publisher = EventPublisher(js=client.jetstream(), subjects=subjects, producer="runner")
    outbox = Outbox(
        publisher=publisher,
        job_id=task.job_id,
        attempt=task.attempt,
        attempts_per_important_event=settings.publish_attempts,
    )
    renewing = None
    if creds is not None:

        def credentials_lost(why: str) -> None:
            log.error("%s: checkpointing and stopping", why)
            stop.set()
            stopped.set()

        renewing = asyncio.create_task(
            creds.keep_renewed(
                client,
                subjects,
                job_id=task.job_id,
                attempt=task.attempt,
                on_lost=credentials_lost,
                before_reconnect=lambda: outbox.flush(timeout_s=RECONNECT_FLUSH_S),
            ),
            name="renew-credentials",
        )
    metrics = RunnerMetrics(job_id=task.job_id, attempt=task.attempt)
    copies = CopyStore(client.jetstream(), subjects) if settings.copy_to_shared_store else None
    context = RunContext(
        task=task,
        settings=settings,
        outbox=outbox,
        metrics=metrics,
        stop=stop,
        data_dir=common.data_dir,
        copies=copies,
        copier=None
        if copies is None
        else CheckpointCopier(copies, outbox, job_id=task.job_id, attempt=task.attempt),
        inputs=InputFetcher(InputFetch(client, subjects, task.job_id))
        if task.spec.inputs
        else None,
        engine_loading=engine_loading,
    )
    code = RunnerExit.CRASHED  # until the task says otherwise (for the usage report)
    try:
        if settings.metrics_port > 0:
            metrics.serve(port=settings.metrics_port)
        runner = TASKS.get(task.spec.task)
        if runner is None:
            log.error("INVALID_INPUT: unknown task %d", task.spec.task)
            code = RunnerExit.INVALID_INPUT
        else:
            code = await runner(context)
    except (Exception, MemoryError) as error:
        code = exit_code_for(error)
        if isinstance(error, RunnerError):
            log.error("%s: %s", code.name, error)
        elif disk := datadisk.disk_error(error):
            log.error(
                "%s: %s; stopping (the last checkpoint announced stays the one to resume from)",
                code.name,
                datadisk.describe(disk),
            )
        else:
            log.exception("%s: %s", code.name, error)
        await outbox.flush(timeout_s=min(settings.flush_timeout_s, CLOSE_TIMEOUT_S))
    finally:
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)
        if context.copier is not None:  # the last checkpoint's copy: what a move resumes from
            await context.copier.finish(timeout_s=settings.copy_timeout_s)
        with contextlib.suppress(Exception):  # a report about the attempt, never its outcome
            _report_usage(task, outbox, settings, code=code)
            await outbox.flush(timeout_s=min(settings.flush_timeout_s, CLOSE_TIMEOUT_S))
        if renewing is not None:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await renewing
        metrics.close()
        await _settled(engine_loading)
        try:
            await asyncio.wait_for(client.drain(), timeout=CLOSE_TIMEOUT_S)
        except Exception as error:  # the outcome stands even if the goodbye fails
            log.warning("closing the NATS connection failed: %r", error)
    if outbox.failed:
        log.warning("%d events could not be published", outbox.failed)
    log.info("exiting with %s (%d)", code.name, int(code))
    return code


async def _settled(loading: asyncio.Future[None] | None) -> None:
    """Wait for the engine's loading to end, whatever its outcome (a failure to load is the
    task's to report, when it opens the engine; one that never did has nothing to report)."""
    if loading is not None:
        with contextlib.suppress(Exception):
            await loading


def _report_usage(
    task: RunnerTask, outbox: Outbox, settings: RunnerSettings, *, code: RunnerExit
) -> None:
    """Publish the attempt's ``usage`` (``services.runner.usage``) as it ends."""
    resumed = outbox.first_step
    if resumed is None:  # the engine never started
        resumed = task.resume_from.step if task.resume_from is not None else 0
    outbox.usage(
        measure(
            task.spec,
            exit_code=int(code),
            steps=max(0, outbox.last_step - resumed),
            ns_per_day=outbox.ns_per_day,
            source=settings.usage_source,
        )
    )


def checked_task(task: RunnerTask, *, data_dir: Path, env: Mapping[str, str]) -> RunnerTask:
    """``task`` with its spec validated again (``normalize_job``, force fields checked
    against the trusted folders of ``env``); InvalidTask if the spec is invalid or a folder
    is not the one ``data_dir`` gives its job id."""

    def force_field_exists(name: str) -> bool:
        # OpenMM's folders are looked up (importing OpenMM) only for a spec naming a force
        # field: a LAMMPS attempt never loads OpenMM
        return ForceFieldFolders.from_env(env).exists(name)

    try:
        spec = normalize_job(task.spec, "spec", force_field_exists=force_field_exists)
    except SpecError as error:
        raise InvalidTask(f"the job spec is invalid: {error}") from None
    root = jobs_root(data_dir).resolve()
    for what, folder, job in (
        ("job folder", task.job_dir, task.job_id),
        *(("input folder", path, path.name) for path in task.input_dirs),
    ):
        expected = (root / job).resolve()
        if expected.parent != root or folder.resolve() != expected:
            raise InvalidTask(f"the {what} {folder} is not the folder of job {job!r} in {root}")
    return replace(
        task,
        spec=spec,
        job_dir=task.job_dir.resolve(),
        input_dirs=tuple(path.resolve() for path in task.input_dirs),
    )


class InvalidTask(InvalidInput):
    """The task handed to the runner cannot be trusted or used."""


def main(environ: Mapping[str, str] | None = None) -> int:
    """Run the attempt described by ``environ`` (default: the process environment)."""
    env = os.environ if environ is None else environ
    configure_logging()
    try:
        task = RunnerTask.from_env(env)
    except (KeyError, ValueError, ParseError) as error:
        log.error("INVALID_INPUT: the runner's environment does not describe a task: %r", error)
        return RunnerExit.INVALID_INPUT
    configure_logging(task)
    common = CommonSettings()
    common = common.model_copy(update={"data_dir": common.data_dir.resolve()})
    try:
        task = checked_task(task, data_dir=common.data_dir, env=env)
    except InvalidTask as error:
        log.error("INVALID_INPUT: %s", error)
        return RunnerExit.INVALID_INPUT
    try:
        return asyncio.run(run(task, common=common, settings=RunnerSettings()))
    except MemoryError:
        log.error("OUT_OF_MEMORY before the task could start")
        return RunnerExit.OUT_OF_MEMORY
    except Exception as error:
        code = exit_code_for(error)
        if disk := datadisk.disk_error(error):
            log.error("%s before the task could start: %s", code.name, datadisk.describe(disk))
        else:
            log.exception("%s before the task could start", code.name)
        return code
