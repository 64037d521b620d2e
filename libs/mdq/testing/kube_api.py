"""A Kubernetes API emulator: the subset of the API server that mdq and its kubelet use.

An aiohttp server spoken to over real HTTP by kubernetes-asyncio, keeping pods, nodes and
secrets in memory, with watches, the garbage collector and the node lifecycle controller as the
API server has them; tests steer it (``expire_watches``, ``disrupt_pod``, ...) and read the
``requests`` clients made.

What it emulates and how: docs/testing.md, "The Kubernetes API emulator".
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import copy
import json
import re
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from mdq.testing.tasks import Background

Json = dict[str, Any]
Key = tuple[str, str]
"""(namespace, name); namespace is "" for nodes."""
NodeUsage = Callable[[], Mapping[str, tuple[float, float]]]
"""{node: (cpu cores in use, memory bytes in use)}."""

UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
KINDS = {"pods": "Pod", "nodes": "Node", "secrets": "Secret"}
"""Each resource the emulator keeps, and its kind."""


def query_flag(value: str | None) -> bool:
    """A boolean query parameter as Go's ParseBool reads it ("true", "True", "1", "t" ...)."""
    return (value or "").lower() in ("1", "t", "true")


def now_rfc3339(at: datetime | None = None) -> str:
    """Times as the API writes them: UTC, second precision."""
    return (at or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def status_body(code: int, reason: str, message: str, **details: Any) -> Json:
    """A ``Status`` object, the body of every error."""
    body: Json = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


class ApiError(Exception):
    """An error answer of the emulated API server."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


# -- selectors ----------------------------------------------------------------------------
_SET_REQUIREMENT = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_requirements(expression: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in expression:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current)
    return [part.strip() for part in parts if part.strip()]


def _field(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return "" if value is None else str(value)


Requirement = tuple[str, str, frozenset[str]]
"""(operator, key or field path, values)."""


def _holds(requirement: Requirement, value: str | None) -> bool:
    operator, _key, values = requirement
    if operator in ("=", "in"):
        return value in values
    if operator in ("!=", "notin"):
        return value not in values
    return (value is not None) == (operator == "exists")


def _requirements(expression: str) -> list[Requirement]:
    requirements: list[Requirement] = []
    for text in _split_requirements(expression or ""):
        if match := _SET_REQUIREMENT.match(text):
            values = frozenset(v.strip() for v in match.group(3).split(",") if v.strip())
            requirements.append((match.group(2), match.group(1), values))
        elif "!=" in text:
            key, value = text.split("!=", 1)
            requirements.append(("!=", key.strip(), frozenset({value.strip()})))
        elif "=" in text:
            key, value = text.replace("==", "=").split("=", 1)
            requirements.append(("=", key.strip(), frozenset({value.strip()})))
        elif text.startswith("!"):
            requirements.append(("absent", text[1:].strip(), frozenset()))
        else:
            requirements.append(("exists", text, frozenset()))
    return requirements


def label_matcher(expression: str) -> Callable[[Mapping[str, str]], bool]:
    """A label selector: ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)``,
    ``k notin (a)``, comma-separated (all must hold)."""
    requirements = _requirements(expression)
    return lambda labels: all(_holds(r, labels.get(r[1])) for r in requirements)


def field_matcher(expression: str) -> Callable[[Mapping[str, Any]], bool]:
    """A field selector: ``path=value``, ``path==value``, ``path!=value``, comma-separated."""
    requirements = _requirements(expression)
    return lambda obj: all(_holds(r, _field(obj, r[1])) for r in requirements)


def merge_patch(target: Any, patch: Any, *, strategic: bool = False) -> Any:
    """JSON merge patch (RFC 7386); ``strategic`` merges ``conditions`` lists by ``type``."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif strategic and key == "conditions" and isinstance(value, list):
            merged = {c.get("type"): c for c in result.get(key) or []}
            for condition in value:
                merged[condition.get("type")] = merge_patch(
                    merged.get(condition.get("type"), {}), condition
                )
            result[key] = list(merged.values())
        else:
            result[key] = merge_patch(result.get(key), value, strategic=strategic)
    return result


# -- the store ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Change:
    """One committed change of one object."""

    version: int
    resource: str
    key: Key
    before: Json | None
    after: Json | None
    """None: deleted."""

    @property
    def final(self) -> Json:
        """The object to send: the new state, or the deleted one at the delete's version."""
        if self.after is not None:
            return self.after
        assert self.before is not None
        gone = copy.deepcopy(self.before)
        gone["metadata"]["resourceVersion"] = str(self.version)
        return gone


@dataclass(slots=True, eq=False)
class _Watch:
    resource: str
    namespace: str
    labels: Callable[[Mapping[str, str]], bool]
    fields: Callable[[Mapping[str, Any]], bool]
    queue: asyncio.Queue[Change | None] = field(default_factory=asyncio.Queue)

    def matches(self, obj: Mapping[str, Any] | None) -> bool:
        if obj is None:
            return False
        metadata = obj.get("metadata") or {}
        if self.namespace and metadata.get("namespace") != self.namespace:
            return False
        return self.labels(metadata.get("labels") or {}) and self.fields(obj)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request the emulator answered."""

    method: str
    path: str
    query: dict[str, str]
    status: int
    user_agent: str
    watch: bool


class KubeApiEmulator:
    """The emulated API server; ``start`` it, point a kubeconfig at ``url``."""

    def __init__(
        self,
        *,
        history_limit: int = 5000,
        bookmark_interval_s: float = 1.0,
        node_monitor_grace_s: float | None = 4.0,
        node_usage: NodeUsage | None = None,
    ) -> None:
        self.history_limit = history_limit
        self.bookmark_interval_s = bookmark_interval_s
        self.node_monitor_grace_s = node_monitor_grace_s
        self.node_usage = node_usage
        self.version = 1
        self.objects: dict[str, dict[Key, Json]] = {resource: {} for resource in KINDS}
        self.gc_paused = False
        """While True, nothing is garbage-collected (``collect_garbage`` catches up)."""
        self._history: deque[Change] = deque()
        self._floor = 0
        """Resuming a watch from a version below this answers 410 Expired."""
        self._watches: set[_Watch] = set()
        self.requests: list[RequestRecord] = []
        self.expired: list[str] = []
        """User agents of the watches answered 410 Expired."""
        self._runner: web.AppRunner | None = None
        self._background = Background("kube API emulator")
        """The node lifecycle controller, and every handler's unexpected exception."""
        self.url = ""

    # -- serving ---------------------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on ``host:port`` (0: any free port); return the URL."""
        app = web.Application(middlewares=[self._record])
        app.router.add_routes(
            [
                web.get("/api", self._versions),
                web.get("/api/v1/pods", self._pods_collection),
                web.get("/api/v1/namespaces/{namespace}/pods", self._pods_collection),
                web.post("/api/v1/namespaces/{namespace}/pods", self._create_pod),
                web.get("/api/v1/namespaces/{namespace}/pods/{name}", self._get_pod),
                web.delete("/api/v1/namespaces/{namespace}/pods/{name}", self._delete_pod),
                web.post("/api/v1/namespaces/{namespace}/pods/{name}/binding", self._bind),
                web.get("/api/v1/namespaces/{namespace}/pods/{name}/status", self._get_pod),
                web.put("/api/v1/namespaces/{namespace}/pods/{name}/status", self._put_status),
                web.patch("/api/v1/namespaces/{namespace}/pods/{name}/status", self._patch_status),
                web.get("/api/v1/secrets", self._secrets_collection),
                web.get("/api/v1/namespaces/{namespace}/secrets", self._secrets_collection),
                web.post("/api/v1/namespaces/{namespace}/secrets", self._create_secret),
                web.get("/api/v1/namespaces/{namespace}/secrets/{name}", self._get_secret),
                web.delete("/api/v1/namespaces/{namespace}/secrets/{name}", self._delete_secret),
                web.get("/api/v1/nodes", self._nodes_collection),
                web.post("/api/v1/nodes", self._create_node),
                web.get("/api/v1/nodes/{name}", self._get_node),
                web.patch("/api/v1/nodes/{name}", self._patch_node),
                web.delete("/api/v1/nodes/{name}", self._delete_node),
                web.get("/api/v1/nodes/{name}/status", self._get_node),
                web.put("/api/v1/nodes/{name}/status", self._put_status),
                web.patch("/api/v1/nodes/{name}/status", self._patch_status),
                web.get("/apis/metrics.k8s.io/v1beta1/nodes", self._node_metrics),
                web.get("/apis/metrics.k8s.io/v1beta1/nodes/{name}", self._node_metrics),
            ]
        )
        self._runner = web.AppRunner(
            app, handle_signals=False, shutdown_timeout=0.5, access_log=None
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        server = site._server
        assert server is not None and server.sockets  # type: ignore[attr-defined]
        bound_port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self.url = f"http://{host}:{bound_port}"
        if self.node_monitor_grace_s is not None:
            self._background.spawn(self._node_lifecycle(), name="node lifecycle controller")
        return self.url

    async def stop(self) -> None:
        """Stop serving; raise ``BackgroundFailed`` if the controller or a request handler
        raised unexpectedly while it served."""
        try:
            await self._background.close()
        finally:
            self.drop_watches()
            if self._runner is not None:
                await self._runner.cleanup()
                self._runner = None

    def check(self) -> None:
        """Raise ``BackgroundFailed`` if the controller or a request handler has raised."""
        self._background.check()

    def kubeconfig(self, *, namespace: str = "default") -> Json:
        """A kubeconfig (as a dict; write it as JSON or YAML) pointing at this emulator."""
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "emulator", "user": {"token": "emulator"}}],
            "contexts": [
                {
                    "name": "emulator",
                    "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace},
                }
            ],
            "current-context": "emulator",
        }

    @web.middleware
    async def _record(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        watch = query_flag(request.query.get("watch"))
        try:
            response: web.StreamResponse = await handler(request)
        except ApiError as error:
            response = web.json_response(
                status_body(error.code, error.reason, error.message), status=error.code
            )
        except json.JSONDecodeError as error:
            response = web.json_response(
                status_body(400, "BadRequest", f"invalid JSON: {error}"), status=400
            )
        except (web.HTTPException, ConnectionError):
            raise  # an answer, or a client that went away
        except Exception as error:
            # A bug of the emulator, not an answer a real API server gives: answered 500 and
            # raised again by ``check`` and ``stop``.
            self._background.fail(f"{request.method} {request.path}", error)
            raise
        self.requests.append(
            RequestRecord(
                method=request.method,
                path=request.path,
                query=dict(request.query),
                status=response.status,
                user_agent=request.headers.get("User-Agent", ""),
                watch=watch,
            )
        )
        return response

    async def _versions(self, _request: web.Request) -> web.Response:
        return web.json_response({"kind": "APIVersions", "versions": ["v1"]})

    # -- committing ------------------------------------------------------------------------
    def _commit(self, resource: str, key: Key, after: Json | None) -> Change:
        self.version += 1
        before = self.objects[resource].get(key)
        if after is None:
            self.objects[resource].pop(key, None)
        else:
            after = copy.deepcopy(after)
            after["metadata"]["resourceVersion"] = str(self.version)
            self.objects[resource][key] = after
        change = Change(self.version, resource, key, before, after)
        self._history.append(change)
        while len(self._history) > self.history_limit:
            self._floor = self._history.popleft().version
        for watch in list(self._watches):
            if watch.resource == resource:
                watch.queue.put_nowait(change)
        if resource == "pods" and after is None and not self.gc_paused:
            self.collect_garbage()
        return change

    def _get(self, resource: str, key: Key) -> Json:
        obj = self.objects[resource].get(key)
        if obj is None:
            raise ApiError(404, "NotFound", f'{resource} "{key[1]}" not found')
        return obj

    # -- the garbage collector -------------------------------------------------------------
    def _owner_exists(self, namespace: str, reference: Mapping[str, Any]) -> bool:
        if reference.get("kind") != "Pod":
            return True  # an owner of a kind the emulator does not keep: left alone
        owner = self.objects["pods"].get((namespace, str(reference.get("name", ""))))
        return owner is not None and owner["metadata"].get("uid") == reference.get("uid")

    def collect_garbage(self) -> list[Key]:
        """Delete every secret whose owners (``ownerReferences``) are all gone, as Kubernetes'
        garbage collector does with the dependents of a deleted owner; what it deleted."""
        collected: list[Key] = []
        for key, obj in list(self.objects["secrets"].items()):
            owners = obj["metadata"].get("ownerReferences") or []
            if owners and not any(self._owner_exists(key[0], ref) for ref in owners):
                self._commit("secrets", key, None)
                collected.append(key)
        return collected

    # -- test controls ---------------------------------------------------------------------
    def expire_watches(self) -> int:
        """Compact the history: every open watch ends, and resuming from any version seen so
        far answers 410 Expired (a re-list is needed). Returns the new floor version."""
        self.version += 1
        self._floor = self.version
        self._history.clear()
        self.drop_watches()
        return self._floor

    def drop_watches(self) -> None:
        """End every open watch stream (clients resume from their last version)."""
        for watch in list(self._watches):
            watch.queue.put_nowait(None)

    def pod(self, name: str, namespace: str = "default") -> Json | None:
        obj = self.objects["pods"].get((namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def pods(self) -> list[Json]:
        return [copy.deepcopy(obj) for obj in self.objects["pods"].values()]

    def node(self, name: str) -> Json | None:
        obj = self.objects["nodes"].get(("", name))
        return copy.deepcopy(obj) if obj is not None else None

    def secret(self, name: str, namespace: str = "default") -> Json | None:
        obj = self.objects["secrets"].get((namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def secrets(self, namespace: str | None = None) -> list[Json]:
        return [
            copy.deepcopy(obj)
            for (where, _), obj in self.objects["secrets"].items()
            if namespace is None or where == namespace
        ]

    def disrupt_pod(self, name: str, namespace: str, *, reason: str, message: str = "") -> None:
        """Add a True DisruptionTarget condition (as the eviction API, the taint manager or
        the scheduler's preemption do before deleting a pod)."""
        pod = copy.deepcopy(self._get("pods", (namespace, name)))
        conditions = [
            c for c in pod["status"].get("conditions") or [] if c.get("type") != "DisruptionTarget"
        ]
        conditions.append(
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": reason,
                "message": message or reason,
                "lastTransitionTime": now_rfc3339(),
            }
        )
        pod["status"]["conditions"] = conditions
        self._commit("pods", (namespace, name), pod)

    def set_node_ready(self, name: str, status: str, *, reason: str, message: str = "") -> None:
        """Set a node's Ready condition ("True", "False", "Unknown") as a controller would."""
        node = copy.deepcopy(self._get("nodes", ("", name)))
        self._set_ready(node, status, reason=reason, message=message)
        self._commit("nodes", ("", name), node)

    # -- lists and watches -----------------------------------------------------------------
    def _matching(self, watch: _Watch) -> list[Json]:
        return [
            obj
            for obj in sorted(
                self.objects[watch.resource].values(),
                key=lambda o: int(o["metadata"]["resourceVersion"]),
            )
            if watch.matches(obj)
        ]

    def _watch_for(self, request: web.Request, resource: str) -> _Watch:
        try:
            return _Watch(
                resource=resource,
                namespace=request.match_info.get("namespace", ""),
                labels=label_matcher(request.query.get("labelSelector", "")),
                fields=field_matcher(request.query.get("fieldSelector", "")),
            )
        except ValueError as error:
            raise ApiError(400, "BadRequest", f"invalid selector: {error}") from None

    async def _collection(self, request: web.Request, resource: str) -> web.StreamResponse:
        watch = self._watch_for(request, resource)
        if query_flag(request.query.get("watch")):
            return await self._stream(request, watch)
        return web.json_response(
            {
                "kind": f"{KINDS[resource]}List",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self.version)},
                "items": self._matching(watch),
            }
        )

    async def _stream(self, request: web.Request, watch: _Watch) -> web.StreamResponse:
        query = request.query
        bookmarks = query_flag(query.get("allowWatchBookmarks"))
        timeout = float(query.get("timeoutSeconds") or 1800)
        deadline = asyncio.get_running_loop().time() + timeout
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        self._watches.add(watch)
        kind = KINDS[watch.resource]

        async def send(event_type: str, obj: Json) -> None:
            line = json.dumps({"type": event_type, "object": obj}) + "\n"
            await response.write(line.encode())

        try:
            since = query.get("resourceVersion", "")
            if since in ("", "0"):
                current, sent = self._matching(watch), self.version
                for obj in current:
                    await send("ADDED", obj)
            else:
                try:
                    version = int(since)
                except ValueError:
                    version = -1
                if version < self._floor:
                    self.expired.append(request.headers.get("User-Agent", ""))
                    await send(
                        "ERROR",
                        status_body(
                            410, "Expired", f"too old resource version: {since} ({self._floor})"
                        ),
                    )
                    return response
                history, sent = list(self._history), self.version
                for past in history:
                    event = self._event_for(watch, past) if past.version > version else None
                    if event is not None and past.resource == watch.resource:
                        await send(*event)
            while True:
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                wait = min(remaining, self.bookmark_interval_s) if bookmarks else remaining
                try:
                    change = await asyncio.wait_for(watch.queue.get(), timeout=wait)
                except TimeoutError:
                    if bookmarks and watch.queue.empty():
                        bookmark = {
                            "kind": kind,
                            "apiVersion": "v1",
                            "metadata": {"resourceVersion": str(self.version)},
                        }
                        await send("BOOKMARK", bookmark)
                    continue
                if change is None:
                    break
                if change.version <= sent:
                    continue
                if (event := self._event_for(watch, change)) is not None:
                    await send(*event)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self._watches.discard(watch)
        with contextlib.suppress(ConnectionResetError, RuntimeError):
            await response.write_eof()
        return response

    @staticmethod
    def _event_for(watch: _Watch, change: Change) -> tuple[str, Json] | None:
        was, now = watch.matches(change.before), watch.matches(change.after)
        if change.after is None:
            return ("DELETED", change.final) if was else None
        if was and now:
            return "MODIFIED", change.final
        if now:
            return "ADDED", change.final
        if was:
            return "DELETED", change.final
        return None

    # -- pods ------------------------------------------------------------------------------
    async def _pods_collection(self, request: web.Request) -> web.StreamResponse:
        return await self._collection(request, "pods")

    async def _create_pod(self, request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        pod = await request.json()
        metadata = pod.setdefault("metadata", {})
        name = metadata.get("name")
        if not name:
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        if (namespace, name) in self.objects["pods"]:
            raise ApiError(409, "AlreadyExists", f'pods "{name}" already exists')
        metadata.update(
            namespace=namespace,
            uid=str(uuid.uuid4()),
            creationTimestamp=now_rfc3339(),
            generation=1,
        )
        pod["apiVersion"], pod["kind"] = "v1", "Pod"
        spec = pod.setdefault("spec", {})
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        pod["status"] = {"phase": "Pending", "qosClass": "Burstable"}
        if spec.get("nodeName"):
            pod["status"]["conditions"] = [self._scheduled()]
        change = self._commit("pods", (namespace, name), pod)
        return web.json_response(change.final, status=201)

    @staticmethod
    def _scheduled() -> Json:
        return {"type": "PodScheduled", "status": "True", "lastTransitionTime": now_rfc3339()}

    async def _get_pod(self, request: web.Request) -> web.Response:
        key = (request.match_info["namespace"], request.match_info["name"])
        return web.json_response(self._get("pods", key))

    async def _delete_pod(self, request: web.Request) -> web.Response:
        key = (request.match_info["namespace"], request.match_info["name"])
        pod = self._get("pods", key)
        grace: Any = request.query.get("gracePeriodSeconds")
        if request.can_read_body:
            with contextlib.suppress(json.JSONDecodeError):
                options = await request.json()
                if isinstance(options, dict) and options.get("gracePeriodSeconds") is not None:
                    grace = options["gracePeriodSeconds"]
        grace_s = (
            int(grace)
            if grace is not None
            else int(pod["spec"].get("terminationGracePeriodSeconds", 30))
        )
        phase = pod["status"].get("phase")
        if grace_s <= 0 or not pod["spec"].get("nodeName") or phase in ("Succeeded", "Failed"):
            change = self._commit("pods", key, None)
            return web.json_response(change.final)
        metadata = pod["metadata"]
        current = metadata.get("deletionGracePeriodSeconds")
        if current is not None and int(current) <= grace_s:
            return web.json_response(pod)
        deleting = copy.deepcopy(pod)
        deleting["metadata"]["deletionTimestamp"] = now_rfc3339(
            datetime.now(UTC) + timedelta(seconds=grace_s)
        )
        deleting["metadata"]["deletionGracePeriodSeconds"] = grace_s
        return web.json_response(self._commit("pods", key, deleting).final)

    async def _bind(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        body = await request.json()
        node = str((body.get("target") or {}).get("name", ""))
        if not node:
            raise ApiError(422, "Invalid", "target.name: Required value")
        pod = self._get("pods", (namespace, name))
        assigned = pod["spec"].get("nodeName")
        if assigned:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is '
                f'already assigned to node "{assigned}"',
            )
        if pod["metadata"].get("deletionTimestamp"):
            raise ApiError(409, "Conflict", f"pod {name} is being deleted, cannot be assigned")
        bound = copy.deepcopy(pod)
        bound["spec"]["nodeName"] = node
        conditions = [
            c for c in bound["status"].get("conditions") or [] if c["type"] != "PodScheduled"
        ]
        bound["status"]["conditions"] = [*conditions, self._scheduled()]
        self._commit("pods", (namespace, name), bound)
        return web.json_response(status_body(201, "", ""), status=201)

    def _key_of(self, request: web.Request) -> tuple[str, Key]:
        if "namespace" in request.match_info:
            return "pods", (request.match_info["namespace"], request.match_info["name"])
        return "nodes", ("", request.match_info["name"])

    async def _put_status(self, request: web.Request) -> web.Response:
        resource, key = self._key_of(request)
        current = self._get(resource, key)
        body = await request.json()
        expected = (body.get("metadata") or {}).get("resourceVersion")
        if expected and expected != current["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {resource} "{key[1]}": the object has been '
                "modified; please apply your changes to the latest version and try again",
            )
        updated = copy.deepcopy(current)
        updated["status"] = body.get("status") or {}
        return web.json_response(self._commit(resource, key, self._after_status(updated)).final)

    async def _patch_status(self, request: web.Request) -> web.Response:
        resource, key = self._key_of(request)
        current = self._get(resource, key)
        patch = await request.json()
        strategic = "strategic" in request.content_type
        updated = copy.deepcopy(current)
        updated["status"] = merge_patch(
            current.get("status") or {}, patch.get("status") or {}, strategic=strategic
        )
        return web.json_response(self._commit(resource, key, self._after_status(updated)).final)

    def _after_status(self, obj: Json) -> Json:
        """Node controller: a node Ready again loses the unreachable taints."""
        if obj.get("kind") == "Node" and self._ready_status(obj) == "True":
            taints = obj["spec"].get("taints") or []
            obj["spec"]["taints"] = [t for t in taints if t.get("key") != UNREACHABLE_TAINT]
        return obj

    # -- secrets ---------------------------------------------------------------------------
    async def _secrets_collection(self, request: web.Request) -> web.StreamResponse:
        return await self._collection(request, "secrets")

    async def _create_secret(self, request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        secret = await request.json()
        metadata = secret.setdefault("metadata", {})
        name = metadata.get("name")
        if not name:
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        if (namespace, name) in self.objects["secrets"]:
            raise ApiError(409, "AlreadyExists", f'secrets "{name}" already exists')
        data = dict(secret.get("data") or {})
        for key, value in data.items():
            try:
                base64.b64decode(str(value), validate=True)
            except (binascii.Error, ValueError):
                raise ApiError(400, "BadRequest", f"data[{key}]: illegal base64 data") from None
        for key, value in (secret.pop("stringData", None) or {}).items():
            data[key] = base64.b64encode(str(value).encode()).decode()
        secret["data"] = data
        metadata.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339())
        secret["apiVersion"], secret["kind"] = "v1", "Secret"
        secret.setdefault("type", "Opaque")
        change = self._commit("secrets", (namespace, name), secret)
        if not self.gc_paused:
            self.collect_garbage()  # an owner that does not exist: collected at once
        return web.json_response(change.final, status=201)

    async def _get_secret(self, request: web.Request) -> web.Response:
        key = (request.match_info["namespace"], request.match_info["name"])
        return web.json_response(self._get("secrets", key))

    async def _delete_secret(self, request: web.Request) -> web.Response:
        key = (request.match_info["namespace"], request.match_info["name"])
        secret = self._get("secrets", key)
        preconditions: Json = {}
        if request.can_read_body:
            with contextlib.suppress(json.JSONDecodeError):
                options = await request.json()
                if isinstance(options, dict):
                    preconditions = options.get("preconditions") or {}
        for field_name in ("uid", "resourceVersion"):
            wanted = preconditions.get(field_name)
            if wanted and wanted != secret["metadata"].get(field_name):
                raise ApiError(
                    409,
                    "Conflict",
                    f"Precondition failed: {field_name} in precondition: {wanted}, "
                    f"{field_name} in object meta: {secret['metadata'].get(field_name)}",
                )
        return web.json_response(self._commit("secrets", key, None).final)

    # -- nodes -----------------------------------------------------------------------------
    async def _nodes_collection(self, request: web.Request) -> web.StreamResponse:
        return await self._collection(request, "nodes")

    async def _create_node(self, request: web.Request) -> web.Response:
        node = await request.json()
        metadata = node.setdefault("metadata", {})
        name = metadata.get("name")
        if not name:
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        if ("", name) in self.objects["nodes"]:
            raise ApiError(409, "AlreadyExists", f'nodes "{name}" already exists')
        metadata.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339())
        node["apiVersion"], node["kind"] = "v1", "Node"
        node.setdefault("spec", {})
        node.setdefault("status", {})
        return web.json_response(self._commit("nodes", ("", name), node).final, status=201)

    async def _get_node(self, request: web.Request) -> web.Response:
        return web.json_response(self._get("nodes", ("", request.match_info["name"])))

    async def _patch_node(self, request: web.Request) -> web.Response:
        key = ("", request.match_info["name"])
        current = self._get("nodes", key)
        patch = await request.json()
        patch.pop("status", None)
        updated = merge_patch(current, patch, strategic="strategic" in request.content_type)
        return web.json_response(self._commit("nodes", key, updated).final)

    async def _delete_node(self, request: web.Request) -> web.Response:
        key = ("", request.match_info["name"])
        self._get("nodes", key)
        return web.json_response(self._commit("nodes", key, None).final)

    @staticmethod
    def _ready_status(node: Mapping[str, Any]) -> str:
        for condition in (node.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "Ready":
                return str(condition.get("status", "Unknown"))
        return "Unknown"

    @staticmethod
    def _set_ready(node: Json, status: str, *, reason: str, message: str) -> None:
        conditions = node.setdefault("status", {}).setdefault("conditions", [])
        ready = next((c for c in conditions if c.get("type") == "Ready"), None)
        if ready is None:
            ready = {"type": "Ready"}
            conditions.append(ready)
        if ready.get("status") != status:
            ready["lastTransitionTime"] = now_rfc3339()
        ready.update(status=status, reason=reason, message=message)
        taints = [t for t in node["spec"].get("taints") or [] if t.get("key") != UNREACHABLE_TAINT]
        if status != "True":
            stamp = now_rfc3339()
            taints += [
                {"key": UNREACHABLE_TAINT, "effect": effect, "timeAdded": stamp}
                for effect in ("NoSchedule", "NoExecute")
            ]
        node["spec"]["taints"] = taints

    async def _node_lifecycle(self) -> None:
        """The node lifecycle controller: stale heartbeats make a node Ready=Unknown."""
        assert self.node_monitor_grace_s is not None
        grace = timedelta(seconds=self.node_monitor_grace_s)
        while True:
            await asyncio.sleep(min(0.5, self.node_monitor_grace_s / 4))
            now = datetime.now(UTC)
            for key, node in list(self.objects["nodes"].items()):
                ready = next(
                    (c for c in node["status"].get("conditions") or [] if c.get("type") == "Ready"),
                    None,
                )
                if ready is None or ready.get("status") == "Unknown":
                    continue
                beat = _parse_time(ready.get("lastHeartbeatTime"))
                if beat is not None and now - beat > grace:
                    updated = copy.deepcopy(node)
                    self._set_ready(
                        updated,
                        "Unknown",
                        reason="NodeStatusUnknown",
                        message="Kubelet stopped posting node status.",
                    )
                    self._commit("nodes", key, updated)

    # -- metrics.k8s.io ---------------------------------------------------------------------
    async def _node_metrics(self, request: web.Request) -> web.Response:
        if self.node_usage is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        usage = dict(self.node_usage())
        stamp = now_rfc3339()

        def item(name: str, cpu: float, memory: float) -> Json:
            return {
                "metadata": {"name": name, "creationTimestamp": stamp},
                "timestamp": stamp,
                "window": "10s",
                "usage": {"cpu": f"{int(cpu * 1e9)}n", "memory": f"{int(memory // 1024)}Ki"},
            }

        if name := request.match_info.get("name"):
            if name not in usage:
                raise ApiError(404, "NotFound", f'nodemetrics.metrics.k8s.io "{name}" not found')
            return web.json_response(item(name, *usage[name]))
        return web.json_response(
            {
                "kind": "NodeMetricsList",
                "apiVersion": "metrics.k8s.io/v1beta1",
                "metadata": {},
                "items": [
                    item(name, cpu, memory)
                    for name, (cpu, memory) in sorted(usage.items())
                    if ("", name) in self.objects["nodes"]
                ],
            }
        )

    # -- reading the request log ----------------------------------------------------------
    def requests_where(
        self,
        *,
        method: str | None = None,
        path_suffix: str = "",
        user_agent: str = "",
        statuses: Iterable[int] | None = None,
        watch: bool | None = None,
    ) -> list[RequestRecord]:
        """The requests matching every given criterion."""
        wanted = set(statuses) if statuses is not None else None
        return [
            r
            for r in self.requests
            if (method is None or r.method == method)
            and r.path.endswith(path_suffix)
            and user_agent in r.user_agent
            and (wanted is None or r.status in wanted)
            and (watch is None or r.watch == watch)
        ]
