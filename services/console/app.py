"""Composition root and pages of the console: Starlette, Jinja2 templates, server-sent events.

``build_app`` takes what the pages need (``Console``: the read-only engine, a NATS client with
the console's own credentials, the data folder) and returns the ASGI app; ``main`` builds them
from the environment and serves the app with uvicorn. It writes nothing but submits and
job-control requests, as the operator.

The pages and how they work: docs/console.md, "Pages" and "How it works".
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import re
import secrets
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote

import uvicorn
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from mdq.bus.codec import decode_event
from mdq.bus.log import IDLE_HEARTBEAT_S
from mdq.bus.runtime import Service, serve
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core import ids
from mdq.core.control import VERB_OF_WORD
from mdq.core.documents import field_names
from mdq.core.recovery import NOT_CHARGED, charged_to_the_job
from mdq.core.runner_task import job_dir
from mdq.core.spec import PRIORITY_CLASSES
from mdq.core.state import TERMINAL_STATES
from mdq.sdk.client import (
    ControlRefused,
    ControlUnavailable,
    IntakeUnavailable,
    MdqClient,
    SubmitRefused,
)
from mdq.sdk.jobfile import JobFileError, parse_job_text
from mdq.sim.config import presets
from mdq.sim.generator import GeneratorSpec
from mdq.sim.history import HistoryTooLarge, read_history
from mdq.store import queries
from mdq.store.engine import create_engine
from services.console import reads
from services.console.access import AccessGate, read_token
from services.console.filters import (
    OPERATOR,
    PAGE_SIZES,
    FilterError,
    JobFilter,
    parse_filter,
    parse_label,
)
from services.console.live import NodeBoard, follow_nodes
from services.console.settings import ConsoleSettings
from services.console.simulate import (
    DEFAULTS as SIMULATION_DEFAULTS,
)
from services.console.simulate import (
    HistorySource,
    SimulationBusy,
    SimulationFailed,
    SimulationRefused,
    Simulations,
    charts,
    parse_request,
)

log = logging.getLogger("mdq.console")

PACKAGE = Path(__file__).resolve().parent
JOB_ID = re.compile(r"^(?:[a-z][a-z0-9-]{0,30}\.)?[0-9a-f]{12}-[a-z][a-z0-9-]{0,39}$")
"""A job id (``mdq.core.ids``): an optional tenant, the request's hex digits, the name."""
MAX_SUBMIT_BYTES = 1 << 20
"""Largest job file the submit page takes (intake's own limit is lower)."""
PENDING_REFRESH_S = 2
"""A job page asked for before the job is in PostgreSQL reloads itself this often."""
LIVE_REWIND_S = 2.0
"""The live stream starts this long before the newest point the page was drawn with."""
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
"""Sent with every page: scripts and styles only from the console itself, never framed."""


@dataclass
class Console:
    """What the pages read from and submit through."""

    engine: AsyncEngine
    nc: Client
    subjects: Subjects
    data_dir: Path
    nodes: NodeBoard = field(default_factory=NodeBoard)
    submit_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    """Every form (submit, job control, simulation) carries it; a form posted from another site
    cannot know it."""
    simulations: Simulations = field(default_factory=Simulations)
    """Runs the simulation page's comparisons, one at a time, each in a process of its own."""


templates = Jinja2Templates(directory=str(PACKAGE / "templates"))
templates.env.globals["OPERATOR"] = OPERATOR
templates.env.globals["PAGE_SIZES"] = PAGE_SIZES
templates.env.globals["not_charged"] = NOT_CHARGED
templates.env.filters["when"] = lambda at: "" if at is None else at.strftime("%Y-%m-%d %H:%M:%S")
templates.env.filters["tenant_label"] = lambda job_id: ids.tenant_of(job_id) or "(operator)"
templates.env.filters["charged"] = charged_to_the_job


def _console(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


def _page(request: Request, name: str, context: Mapping[str, Any], status: int = 200) -> Response:
    response = templates.TemplateResponse(request, name, dict(context), status_code=status)
    response.headers.update(SECURITY_HEADERS)
    if "control" in context:  # its forms carry a control key: drawn anew, never from a cache
        response.headers["Cache-Control"] = "no-store"
    return response


def _refuse(request: Request, field_name: str, message: str) -> Response:
    return _page(
        request,
        "error.html",
        {"field": field_name, "message": message, "title": "Bad request"},
        400,
    )


def _foreign_origin(request: Request) -> bool:
    """A form posted from another site's page (a browser names the page's origin)."""
    origin = request.headers.get("origin")
    return origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}"


def _refused_form(
    request: Request,
    name: str,
    context: dict[str, Any],
    field_name: str,
    message: str,
    status: int = 400,
) -> Response:
    """The form's page ``name`` again, saying why its request was refused (``field_name``: the
    field at fault, "" for none)."""
    context["refusal"] = {"field": field_name, "message": message}
    return _page(request, name, context, status)


def _job_id(request: Request) -> str:
    job_id = str(request.path_params["job_id"])
    if not JOB_ID.match(job_id):
        raise HTTPException(404, "no such job")
    return job_id


# -- the JSON the browser reads: the protobuf JSON mapping of the events --------------------
def progress_event(job_id: str, point: queries.ProgressPoint) -> dict[str, Any]:
    """One stored progress report as the ``Event`` it came from (protobuf JSON mapping)."""
    event = pb.Event(
        job_id=job_id,
        attempt=point.attempt,
        progress=pb.Progress(
            step=point.step,
            target_steps=point.target_steps,
            time_ps=point.time_ps,
            potential_kj_mol=point.potential_kj_mol,
            kinetic_kj_mol=point.kinetic_kj_mol,
            temperature_k=point.temperature_k,
            ns_per_day=point.ns_per_day,
            eta_s=point.eta_s,
            done_reason=point.done_reason,
        ),
    )
    event.time.FromDatetime(point.time)
    return json_format.MessageToDict(event, preserving_proto_field_name=True)


_JOB_SPEC = cast(Descriptor, pb.JobSpec.DESCRIPTOR)
_WIDE_INTEGERS = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def plain_numbers(value: Any, descriptor: Descriptor | None) -> Any:
    """The protobuf JSON mapping of a ``descriptor`` message (a job's spec, as stored) with
    its 64-bit integers as numbers: the mapping writes them as strings (``"steps":
    "15000"``), for JavaScript's sake, which a person reads as text. Keys the message does
    not define are kept as they are."""
    if isinstance(value, list):
        return [plain_numbers(item, descriptor) for item in value]
    if not isinstance(value, dict) or descriptor is None:
        return value
    known = field_names(descriptor)
    plain: dict[str, Any] = {}
    for key, item in value.items():
        field = known.get(key)
        if field is None:
            plain[key] = item
        elif field.type in _WIDE_INTEGERS:
            plain[key] = _integer(item)
        elif field.message_type is not None and field.message_type.GetOptions().map_entry:
            values = field.message_type.fields_by_name["value"].message_type
            is_map = isinstance(item, dict)
            plain[key] = {k: plain_numbers(v, values) for k, v in item.items()} if is_map else item
        else:
            plain[key] = plain_numbers(item, field.message_type)
    return plain


def _integer(value: Any) -> Any:
    if isinstance(value, list):
        return [_integer(item) for item in value]
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return value


def event_json(event: pb.Event) -> dict[str, Any]:
    return json_format.MessageToDict(event, preserving_proto_field_name=True)


def _json_script(value: object) -> str:
    """JSON safe to place inside a ``<script type="application/json">`` element."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


templates.env.filters["json_script"] = _json_script


# -- pages ------------------------------------------------------------------------------------
async def home(request: Request) -> Response:
    return RedirectResponse("/jobs", status_code=302)


async def jobs_page(request: Request) -> Response:
    try:
        chosen = parse_filter(dict(request.query_params))
    except FilterError as error:
        return _refuse(request, error.field, error.message)
    page = await reads.list_jobs(_console(request).engine, chosen)
    return _page(
        request,
        "jobs.html",
        {
            "title": "Jobs",
            "filter": chosen,
            "page": page,
            "next_query": chosen.query(after=page.next_cursor) if page.next_cursor else "",
            "first_query": chosen.query(after=None) if chosen.after else "",
        },
    )


async def job_page(request: Request) -> Response:
    job_id = _job_id(request)
    found = await reads.job_page(_console(request).engine, job_id)
    if found is None:  # unknown, or just submitted and not projected yet: look again soon
        return _page(
            request,
            "error.html",
            {
                "title": "Not in the history yet",
                "field": "",
                "message": f"no job {job_id} in the history yet; this page looks again "
                f"every {PENDING_REFRESH_S} s",
                "refresh_s": PENDING_REFRESH_S,
            },
            404,
        )
    points = [progress_event(job_id, point) for point in found.progress]
    spec = found.detail.job.spec
    md = spec.get("task", "TASK_MD") == "TASK_MD"
    return _page(
        request,
        "job.html",
        {
            "title": f"Job {found.detail.job.name}",
            "job": found.detail.job,
            "found": found,
            "spec_json": json.dumps(plain_numbers(spec, _JOB_SPEC), indent=2, sort_keys=True),
            "points": points,
            # the line the temperature chart draws at the job's thermostat (MD only)
            "target_temperature_k": float(spec.get("temperature_k", 0)) if md else None,
            "events_since": found.detail.job.updated_at.isoformat(),
            "tenant": ids.tenant_of(job_id),
            "control": control_form(_console(request)),
        },
    )


async def job_live(request: Request) -> Response:
    """Server-sent events of a job, both gap-free: its progress after ``attempt``/``step``
    from the progress stream (``progress``, read from a little before ``since``, the newest
    point the page has), and its lifecycle events from the jobs stream (``event``, read from
    a little before ``events_since``, the time of the last event the page's state was folded
    from: the history lags the bus, so an event between the two would be missed otherwise)."""
    job_id = _job_id(request)
    try:
        attempt = int(request.query_params.get("attempt", "0"))
        step = int(request.query_params.get("step", "-1"))
        since_text = request.query_params.get("since", "")
        since = datetime.fromisoformat(since_text) if since_text else None
        events_text = request.query_params.get("events_since", "")
        events_since = datetime.fromisoformat(events_text) if events_text else None
    except ValueError:
        return _refuse(request, "attempt/step/since/events_since", "integers and ISO times")
    console = _console(request)
    return EventSourceResponse(
        _live_events(
            console, job_id, attempt=attempt, step=step, since=since, events_since=events_since
        ),
        ping=15,
    )


def _rewound(at: datetime | None, default: datetime) -> datetime:
    chosen = at or default
    if chosen.tzinfo is None:
        chosen = chosen.replace(tzinfo=UTC)
    return (chosen - timedelta(seconds=LIVE_REWIND_S)).astimezone(UTC)


async def _live_events(
    console: Console,
    job_id: str,
    *,
    attempt: int,
    step: int,
    since: datetime | None,
    events_since: datetime | None,
) -> AsyncIterator[ServerSentEvent]:
    queue: asyncio.Queue[pb.Event] = asyncio.Queue(4_096)

    async def on_message(message: Msg) -> None:
        with contextlib.suppress(ValueError):
            event = decode_event(message.data)
            if event.job_id == job_id:
                if queue.full():
                    queue.get_nowait()
                queue.put_nowait(event)

    now = datetime.now(UTC)
    js = console.nc.jetstream()

    async def follow(
        subject: str, stream: str, start: datetime
    ) -> JetStreamContext.PushSubscription:
        return await js.subscribe(
            subject,
            stream=stream,
            cb=on_message,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.BY_START_TIME,
            config=ConsumerConfig(opt_start_time=start),
            idle_heartbeat=IDLE_HEARTBEAT_S,
        )

    subjects = console.subjects
    progress = await follow(
        subjects.progress(job_id),
        subjects.progress_stream,
        _rewound(since, now - timedelta(days=1)),
    )
    lifecycle = await follow(
        subjects.job_all(job_id), subjects.jobs_stream, _rewound(events_since, now)
    )
    last = (attempt, step)
    try:
        yield ServerSentEvent(data="{}", event="ready")
        while True:
            event = await queue.get()
            if event.WhichOneof("body") == "progress":
                position = (event.attempt, event.progress.step)
                if position <= last:
                    continue
                last = position
                yield ServerSentEvent(data=json.dumps(event_json(event)), event="progress")
            else:
                yield ServerSentEvent(data=json.dumps(event_json(event)), event="event")
    finally:
        for subscription in (progress, lifecycle):
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()


async def job_output(request: Request) -> Response:
    """One of the job's own output files, by its place in the job's outputs list: nothing
    else under the data folder can be named."""
    job_id = _job_id(request)
    index = int(request.path_params["index"])
    console = _console(request)
    outputs = await reads.job_outputs(console.engine, job_id)
    if not 0 <= index < len(outputs):
        raise HTTPException(404, "no such output")
    output = outputs[index]
    path = await asyncio.to_thread(_inside_job_dir, console.data_dir, job_id, output.path)
    if path is None:
        raise HTTPException(404, "the output is not in the job's folder here")
    return FileResponse(path, filename=path.name, headers=SECURITY_HEADERS)


def _inside_job_dir(data_dir: Path, job_id: str, reported: str) -> Path | None:
    """The reported file, if it resolves (links followed) to a file inside the job's own
    folder; None otherwise."""
    home_dir = job_dir(data_dir, job_id).resolve()
    path = Path(reported).resolve()
    return path if path.is_relative_to(home_dir) and path.is_file() else None


async def campaign_page(request: Request) -> Response:
    label_text = request.query_params.get("label", "")
    try:
        key, value = parse_label(label_text)
    except FilterError as error:
        return _refuse(request, error.field, error.message)
    jobs = await reads.campaign(_console(request).engine, key, value)
    curves = [
        {
            "jobId": job.row.job_id,
            "name": job.row.name,
            "state": job.row.state,
            "steps": job.steps,
            "potentialKjMol": job.potential_kj_mol,
            "temperatureK": job.temperature_k,
        }
        for job in jobs
    ]
    states: dict[str, int] = {}
    for job in jobs:
        states[job.row.state] = states.get(job.row.state, 0) + 1
    return _page(
        request,
        "campaign.html",
        {
            "title": f"Campaign {key}={value}",
            "label": f"{key}={value}",
            "jobs": jobs,
            "curves": curves,
            "states": sorted(states.items()),
            "list_query": JobFilter(label=(key, value)).query(),
            "control": control_form(_console(request)),
        },
    )


async def nodes_page(request: Request) -> Response:
    console = _console(request)
    on_nodes = await reads.jobs_on_nodes(console.engine)
    started = await reads.node_attempts_last_hour(console.engine, datetime.now(UTC))
    names = sorted(set(console.nodes.nodes) | {n for n in on_nodes if n})
    nodes = []
    for name in names:
        view = console.nodes.nodes.get(name)
        nodes.append(
            {
                "name": name,
                "latest": view.latest if view else None,
                "jobs": on_nodes.get(name, []),
                "started_last_hour": started.get(name, 0),
                "history": console.nodes.history(name).columns(),
            }
        )
    context = {"title": "Nodes", "nodes": nodes, "history_read": console.nodes.history_read}
    return _page(request, "nodes.html", context)


async def submit_page(request: Request) -> Response:
    console = _console(request)
    context: dict[str, Any] = {"title": "Submit", "token": console.submit_token, "text": ""}
    if request.method == "GET":
        return _page(request, "submit.html", context)
    if _foreign_origin(request):
        return _refuse(request, "origin", "a submit must come from the console's own page")
    async with request.form(max_files=1, max_fields=4, max_part_size=MAX_SUBMIT_BYTES) as form:
        token = str(form.get("token", ""))
        upload = form.get("file")
        text = str(form.get("text", ""))
        source = "the pasted job"
        if isinstance(upload, UploadFile) and upload.filename:
            text = (await upload.read(MAX_SUBMIT_BYTES + 1)).decode("utf-8", errors="replace")
            source = upload.filename
    if not hmac.compare_digest(token, console.submit_token):
        return _refuse(request, "token", "the form is stale: reload the submit page")
    context["text"] = text
    if len(text.encode()) > MAX_SUBMIT_BYTES:
        return _refused_form(
            request, "submit.html", context, "", f"at most {MAX_SUBMIT_BYTES} bytes"
        )
    try:
        submit = parse_job_text(text, source=source)
    except JobFileError as error:
        return _refused_form(
            request, "submit.html", context, error.field, f"{error.source}: {error.message}"
        )
    client = MdqClient(nc=console.nc, subjects=console.subjects)
    try:
        job_ids = await client.submit(submit)
    except SubmitRefused as error:
        return _refused_form(request, "submit.html", context, error.field, error.message)
    except IntakeUnavailable as error:
        return _refused_form(request, "submit.html", context, "", str(error), 503)
    context["submitted"] = job_ids
    return _page(request, "submit.html", context)


async def simulate_page(request: Request) -> Response:
    """Compare scheduler configurations (docs/simulate.md): the form, and on a post its
    comparison as one bar chart per metric, the JSON line and the command that prints it."""
    console = _console(request)
    context: dict[str, Any] = {
        "title": "Simulate",
        "token": console.submit_token,
        "presets": list(presets()),
        "chosen": list(presets()),
        "fields": dict(SIMULATION_DEFAULTS),
        "time_limit_s": console.simulations.time_limit_s,
    }
    if request.method == "GET":
        return _page(request, "simulate.html", context)
    if _foreign_origin(request):
        return _refuse(request, "origin", "a simulation must be asked for from the console's page")
    async with request.form(max_files=0, max_fields=40, max_part_size=4096) as form:
        chosen = [str(value) for value in form.getlist("config")]
        fields = {name: str(form.get(name, "")) for name in (*SIMULATION_DEFAULTS, "token")}
    if not hmac.compare_digest(fields.pop("token"), console.submit_token):
        return _refuse(request, "token", "the form is stale: reload the page")
    context["chosen"] = chosen
    context["fields"] = {name: fields[name] or value for name, value in SIMULATION_DEFAULTS.items()}
    try:
        asked = parse_request(chosen, fields)
    except SimulationRefused as error:
        return _refused_form(request, "simulate.html", context, error.field, error.message)
    simulations = console.simulations
    try:
        async with simulations.turn():  # one at a time, a history's reading included
            if asked.source == "history":
                history = asked.history()
                try:  # the turn is held: a database that never answers may not keep it
                    async with asyncio.timeout(simulations.time_limit_s):
                        limit = simulations.max_history_jobs
                        rows = await read_history(console.engine, history, max_jobs=limit)
                except HistoryTooLarge as error:
                    raise SimulationRefused(
                        "days",
                        f"{error}: ask for fewer days, or run `mdq simulate --from-history` itself",
                    ) from None
                except (OSError, SQLAlchemyError, TimeoutError) as error:
                    log.warning("simulation page: the history could not be read: %r", error)
                    return _refused_form(
                        request,
                        "simulate.html",
                        context,
                        "",
                        "the history database did not answer; try again in a moment",
                        503,
                    )
                source: GeneratorSpec | HistorySource = HistorySource(rows, history)
            else:
                source = asked.generator()
            line = await simulations.compute(source, asked.resolved_configs())
    except SimulationRefused as error:  # a history that makes no workload: its window
        return _refused_form(request, "simulate.html", context, error.field, error.message)
    except SimulationBusy as error:
        return _refused_form(
            request, "simulate.html", context, "", f"{error}: try again when it ends", 409
        )
    except SimulationFailed as error:
        return _refused_form(request, "simulate.html", context, "", str(error), 503)
    context["line"] = json.dumps(line)
    context["workload"] = line["workload"]
    context["configs"] = line["configs"]
    context["charts"] = charts(line)
    context["command"] = asked.command()
    return _page(request, "simulate.html", context)


BULK_VERBS = ("cancel", "hold", "release", "requeue", "reprioritize")
"""What a campaign's page may do to every job of its label (extend takes job ids)."""
CONFIRM_LISTED = 50
"""Jobs a bulk confirmation page names (it counts them all)."""


def control_form(console: Console) -> dict[str, Any]:
    """What a page's control forms carry: the console's token, a fresh control key (one per
    drawn page: a form posted twice is one request), the verbs and classes."""
    return {
        "token": console.submit_token,
        "control_key": f"console-{secrets.token_hex(12)}",
        "verbs": BULK_VERBS,
        "classes": tuple(PRIORITY_CLASSES),
    }


async def _control_form(request: Request) -> dict[str, str] | Response:
    """The fields of a control form, or the refusal of one not from the console's page."""
    console = _console(request)
    if _foreign_origin(request):
        return _refuse(request, "origin", "a request must come from the console's own page")
    async with request.form(max_files=0, max_fields=12, max_part_size=4096) as form:
        fields = {name: str(value) for name, value in form.items()}
    if not hmac.compare_digest(fields.get("token", ""), console.submit_token):
        return _refuse(request, "token", "the form is stale: reload the page")
    if fields.get("verb", "") not in VERB_OF_WORD:
        return _refuse(request, "verb", f"must be one of {', '.join(VERB_OF_WORD)}")
    return fields


async def _send_control(
    request: Request, fields: Mapping[str, str], *, job_ids: list[str], labels: dict[str, str]
) -> Response:
    """Ask placement, as the operator, and show each job's outcome (or the refusal)."""
    console = _console(request)
    verb = fields["verb"]
    try:
        steps = int(fields.get("extend_steps") or 0)
    except ValueError:
        return _refuse(request, "extend_steps", "must be a whole number of steps")
    client = MdqClient(nc=console.nc, subjects=console.subjects)
    context: dict[str, Any] = {"title": f"{verb.capitalize()}", "verb": verb}
    context["back"] = (
        f"/jobs/{job_ids[0]}" if job_ids else "/campaigns?label=" + quote_label(labels)
    )
    try:
        reply = await client.control(
            verb,
            job_ids,
            labels=labels,
            reason=fields.get("reason", ""),
            requested_by="the console",
            priority_class=fields.get("priority_class", "") if verb == "reprioritize" else "",
            extend_steps=steps if verb == "extend" else 0,
            # one key per drawn page and verb: a form posted twice is one request, while the
            # page's other buttons are requests of their own (pages with forms are not cached,
            # so going back draws the page, and its key, anew)
            control_key=f"{fields['control_key']}-{verb}" if fields.get("control_key") else None,
        )
    except ControlRefused as error:
        return _refused_form(request, "control.html", context, error.field, error.message)
    except ControlUnavailable as error:
        return _refused_form(request, "control.html", context, "", str(error), 503)
    context["reply"] = {
        "matched": reply.matched,
        "omitted": reply.omitted,
        "outcomes": [
            {
                "job_id": outcome.job_id,
                "result": pb.ControlResult.Name(outcome.result).removeprefix("CONTROL_").lower(),
                "state": outcome.state,
                "message": outcome.message,
            }
            for outcome in reply.outcomes
        ],
    }
    return _page(request, "control.html", context)


def quote_label(labels: Mapping[str, str]) -> str:
    [(key, value)] = labels.items()
    return quote(f"{key}={value}")


async def job_control(request: Request) -> Response:
    """One job's control form (its page's buttons): sent at once."""
    job_id = _job_id(request)
    fields = await _control_form(request)
    if isinstance(fields, Response):
        return fields
    return await _send_control(request, fields, job_ids=[job_id], labels={})


async def campaign_control(request: Request) -> Response:
    """Every job of a label (a campaign's page): first a page that says how many jobs it would
    change and asks to confirm; sent only with ``confirmed=yes``."""
    fields = await _control_form(request)
    if isinstance(fields, Response):
        return fields
    try:
        key, value = parse_label(fields.get("label", ""))
    except FilterError as error:
        return _refuse(request, error.field, error.message)
    if fields["verb"] not in BULK_VERBS:
        return _refuse(request, "verb", f"a campaign takes {', '.join(BULK_VERBS)}")
    if fields.get("confirmed") == "yes":
        return await _send_control(request, fields, job_ids=[], labels={key: value})
    jobs = await reads.campaign(_console(request).engine, key, value)
    ended = {state.value for state in TERMINAL_STATES}
    live = [job.row for job in jobs if job.row.state not in ended]
    context = {
        "title": f"{fields['verb'].capitalize()} {key}={value}?",
        "fields": {name: fields.get(name, "") for name in (
            "verb", "label", "reason", "priority_class", "control_key", "token")},
        "count": len(live),
        "listed": live[:CONFIRM_LISTED],
        "label": f"{key}={value}",
    }  # fmt: skip
    return _page(request, "control_confirm.html", context)


async def healthz(request: Request) -> Response:
    console = _console(request)
    healthy = console.nc.is_connected
    return Response(
        "ok\n" if healthy else "nats disconnected\n", status_code=200 if healthy else 503
    )


async def not_found(request: Request, error: Exception) -> Response:
    detail = error.detail if isinstance(error, HTTPException) else "not found"
    return _page(request, "error.html", {"title": "Not found", "field": "", "message": detail}, 404)


def build_app(console: Console, *, access_token: str | None = None) -> Starlette:
    """The console's ASGI app over ``console``'s engine and NATS client; with
    ``access_token``, only requests that carry it (or its session) get in
    (``services.console.access``)."""
    app = Starlette(
        routes=[
            Route("/", home),
            Route("/jobs", jobs_page),
            Route("/jobs/{job_id}", job_page),
            Route("/jobs/{job_id}/live", job_live),
            Route("/jobs/{job_id}/outputs/{index:int}", job_output),
            Route("/jobs/{job_id}/control", job_control, methods=["POST"]),
            Route("/campaigns/control", campaign_control, methods=["POST"]),
            Route("/campaigns", campaign_page),
            Route("/nodes", nodes_page),
            Route("/submit", submit_page, methods=["GET", "POST"]),
            Route("/simulate", simulate_page, methods=["GET", "POST"]),
            Route("/healthz", healthz),
            Mount("/static", app=StaticFiles(directory=PACKAGE / "static"), name="static"),
        ],
        exception_handlers={404: not_found},
        middleware=[Middleware(AccessGate, token=access_token)] if access_token else [],
    )
    app.state.console = console
    return app


# -- composition root ------------------------------------------------------------------------
def server_config(app: Starlette, host: str, port: int) -> uvicorn.Config:
    """uvicorn's settings for the console. uvicorn logs through the service's own handlers
    (``log_config=None``: its default installs handlers of its own that pass by the root's),
    so what anyone can make it log (a malformed request, say) is held to the budget every
    service's log keeps (``mdq.bus.runtime.configure_logging``)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        log_config=None,
        timeout_graceful_shutdown=2,  # live pages hold their event streams open
    )


async def compose(service: Service) -> None:
    """The console on a connection of its own: the nodes it follows and the web server, as
    parts of ``service``."""
    common, settings, subjects = service.common, ConsoleSettings(), service.subjects
    if not common.database_url:
        raise SystemExit("the console needs DATABASE_URL (the read-only role's)")
    nc = await service.connect()
    engine = create_engine(common.database_url, pool_size=4)
    service.on_stop(engine.dispose)
    console = Console(
        engine=engine,
        nc=nc,
        subjects=subjects,
        data_dir=common.data_dir,
        simulations=Simulations(settings.simulation_time_limit_s),
    )
    token = read_token(settings.access_token_file) if settings.access_token_file else None
    config = server_config(build_app(console, access_token=token), settings.host, settings.port)
    service.part("nodes", lambda: follow_nodes(console.nodes, nc, subjects))
    service.part("web", lambda: serve_web(_Server(config)))


async def serve_web(server: uvicorn.Server) -> None:
    """Serve until cancelled: then uvicorn closes its sockets and ends its requests."""
    announcing = asyncio.create_task(_announce(server), name="announce")
    serving = asyncio.create_task(server.serve(), name="uvicorn")
    try:
        await asyncio.shield(serving)
    except asyncio.CancelledError:
        server.should_exit = True
        await serving
        raise
    finally:
        announcing.cancel()


class _Server(uvicorn.Server):
    """uvicorn, leaving the process's stop signals to ``mdq.bus.runtime.run_service``: its own
    handlers would re-raise SIGTERM after its shutdown and end the process before the
    console's connections are closed."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _announce(server: uvicorn.Server) -> None:
    """Log the URL once the server listens."""
    while not server.started:  # noqa: ASYNC110 - uvicorn offers no event to wait on
        await asyncio.sleep(0.05)
    sockets = [sock for listener in server.servers for sock in listener.sockets]
    host, port = sockets[0].getsockname()[:2]
    log.warning("console at http://%s:%s/", host, port)


def main() -> None:
    serve("console", compose)
