"""kmock 0.8 made fit for the real `kubernetes` client, served on 127.0.0.1 from a thread.

kmock is an in-memory Kubernetes API over real HTTP. Version 0.8 has gaps the real client trips
over; `PatchedEmulator` covers each one (see the comment at each fix):
  - creates answer 200, but the client deserialises create responses only for 201;
  - list responses lack `kind`/`apiVersion` and ignore label/field selectors;
  - watch responses need the JSON content type, and the server-side `timeoutSeconds` is ignored;
  - pod logs must be `text/plain` (kmock has no log store at all);
  - objects carry no `resourceVersion`, which the client's watch needs to resume;
  - objects need `metadata.namespace` for watch events to reach namespaced watches;
  - `POST /api/v1/namespaces` crashes its path parser (500), so namespaces are served here;
  - CustomResourceDefinitions are served here too (reads only): the JobSet CRD is installed
    unless a test removes it from `crds`.
On top of that it injects faults on request (`fail_next`, `expire_watches`) so tests can check
retries, 409 handling and the 410 re-list.

The launcher under test uses the synchronous client; kmock is asyncio. So the emulator runs its
own event loop in a daemon thread (`EmulatorThread`), and tests stay plain synchronous functions.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import itertools
import json
import threading
from collections.abc import Callable
from typing import Any

import aiohttp.web
import kmock
from kmock._internal import enums, k8s, rendering  # no public names for these in 0.8

JOBSETS = kmock.resource("jobset.x-k8s.io", "v1alpha2", "jobsets")
PODS = kmock.resource("", "v1", "pods")
STARTUP_TIMEOUT_S = 10.0
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
# What the launcher reads of the JobSet CRD: the served version and whether spec knows coordinator.
JOBSET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "jobsets.jobset.x-k8s.io"},
    "spec": {
        "group": "jobset.x-k8s.io",
        "scope": "Namespaced",
        "names": {"kind": "JobSet", "plural": "jobsets", "singular": "jobset"},
        "versions": [
            {
                "name": "v1alpha2",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {"coordinator": {"type": "object"}, "replicatedJobs": {"type": "array"}},
                            }
                        },
                    }
                },
            }
        ],
    },
}


@dataclasses.dataclass
class Fault:
    """Answer the next `times` requests that `matches` with HTTP `status` instead of serving them.

    With `after_effect`, the request is served (the state changes) and then the answer is lost:
    what a client sees when a create went through but the connection dropped.
    """

    matches: Callable[[rendering.Request], bool]
    status: int
    times: int = 1
    after_effect: bool = False


def is_create(resource: kmock.resource) -> Callable[[rendering.Request], bool]:
    return lambda r: r.action == enums.action.CREATE and r.resource == resource


def is_delete(resource: kmock.resource) -> Callable[[rendering.Request], bool]:
    return lambda r: r.action == enums.action.DELETE and r.resource == resource


def is_list(resource: kmock.resource) -> Callable[[rendering.Request], bool]:
    return lambda r: r.action == enums.action.LIST and r.resource == resource


class PatchedEmulator(k8s.KubernetesEmulator):
    """kmock's emulator with the 0.8 gaps covered and fault injection added."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # Declared so that listing an empty collection is a 200, not a 404 "unknown resource".
        self.resources["v1/pods"] = {"namespaced": True, "kind": "Pod"}
        self.resources["v1/namespaces"] = {"namespaced": False, "kind": "Namespace"}
        self.resources["v1/serviceaccounts"] = {"namespaced": True, "kind": "ServiceAccount"}
        self.resources["jobset.x-k8s.io/v1alpha2/jobsets"] = {
            "namespaced": True,
            "kind": "JobSet",
            "subresources": {"status"},
        }
        self.pod_logs: dict[tuple[str, str], str] = {}
        self.namespaces: dict[str, dict[str, Any]] = {}
        # Namespaces are served by this class (see __call__), so their faults are an HTTP status
        # per action: {"FETCH": 403} answers every namespace read with 403.
        self.namespace_statuses: dict[str, int] = {}
        self.crds: dict[str, dict[str, Any]] = {JOBSET_CRD["metadata"]["name"]: copy.deepcopy(JOBSET_CRD)}
        self.crd_read_status = 0  # e.g. 403: answer every CRD read with it
        self.faults: list[Fault] = []
        self.expired_watches = 0  # how many upcoming watches answer 410 Gone
        self.requests_seen: list[tuple[str, str, str]] = []  # (action, plural, name) in order
        self.on_create: dict[str, threading.Event] = {}  # plural -> set when one is created
        self._rv = itertools.count(1)

    # -- fault injection ------------------------------------------------------------------------
    def fail_next(self, fault: Fault) -> None:
        self.faults.append(fault)

    def expire_watches(self, count: int = 1) -> None:
        self.expired_watches += count

    def _take_fault(self, request: rendering.Request) -> Fault | None:
        for fault in self.faults:
            if fault.times > 0 and fault.matches(request):
                fault.times -= 1
                return fault
        return None

    # -- request handling -----------------------------------------------------------------------
    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        path = raw_request.path.rstrip("/")
        if path == "/api/v1/namespaces" and raw_request.method == "POST":
            return await self._create_namespace(raw_request)
        if path.startswith("/api/v1/namespaces/") and path.count("/") == 4 and raw_request.method == "GET":
            return await self._read_namespace(path.rsplit("/", 1)[1])
        if path.startswith(CRD_PATH) and raw_request.method == "GET":
            return await self._read_crd(path[len(CRD_PATH) :])
        return await super().__call__(raw_request)

    async def _create_namespace(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        body = await raw_request.json()
        name = body["metadata"]["name"]
        self.requests_seen.append(("CREATE", "namespaces", name))
        if self.namespace_statuses.get("CREATE"):
            return await self._render_error(
                k8s.KubernetesError(status=self.namespace_statuses["CREATE"], reason="Injected")
            )
        if name in self.namespaces:
            return await self._render_error(k8s.KubernetesObjectConflictError())
        self.namespaces[name] = body
        return aiohttp.web.json_response(body, status=201)

    async def _read_namespace(self, name: str) -> aiohttp.web.StreamResponse:
        self.requests_seen.append(("FETCH", "namespaces", name))
        if self.namespace_statuses.get("FETCH"):
            return await self._render_error(
                k8s.KubernetesError(status=self.namespace_statuses["FETCH"], reason="Injected")
            )
        if name not in self.namespaces:
            return await self._render_error(k8s.KubernetesObjectNotFoundError())
        return aiohttp.web.json_response({"apiVersion": "v1", "kind": "Namespace", **self.namespaces[name]})

    async def _read_crd(self, name: str) -> aiohttp.web.StreamResponse:
        self.requests_seen.append(("FETCH", "customresourcedefinitions", name))
        if self.crd_read_status:
            return await self._render_error(k8s.KubernetesError(status=self.crd_read_status, reason="Injected"))
        if name not in self.crds:
            return await self._render_error(k8s.KubernetesObjectNotFoundError())
        return aiohttp.web.json_response(self.crds[name])

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if request.resource is not None:
            self._record(request)
        fault = self._take_fault(request) if request.resource is not None else None
        if fault is not None and not fault.after_effect:
            raise k8s.KubernetesError(status=fault.status, reason="Injected", message="fault injected by the test")
        if request.action == enums.action.WATCH:
            return await self._watch(request)
        if request.action == enums.action.FETCH and request.subresource == "log":
            return self._log(request)
        self._stamp(request)
        response = await super()._handle(request)
        if request.action == enums.action.CREATE and response.status == 200:
            event = self.on_create.get(str(request.resource.plural))
            if event is not None:  # tell the test's controller, even if the answer gets lost below
                event.set()
        if fault is not None:
            raise k8s.KubernetesError(status=fault.status, reason="Injected", message="served, answer lost")
        return self._fix_response(request, response)

    def _record(self, request: rendering.Request) -> None:
        action = request.action.value if request.action is not None else request.method.value
        self.requests_seen.append((str(action), str(request.resource.plural), request.name or ""))

    def _stamp(self, request: rendering.Request) -> None:
        """Give created/patched objects a resourceVersion and their namespace (gaps in 0.8)."""
        if request.action not in (enums.action.CREATE, enums.action.UPDATE) or not isinstance(request.data, dict):
            return
        meta = request.data.setdefault("metadata", {})
        meta["resourceVersion"] = str(next(self._rv))
        if request.action == enums.action.CREATE and request.namespace:
            meta.setdefault("namespace", request.namespace)

    def _fix_response(
        self, request: rendering.Request, response: aiohttp.web.StreamResponse
    ) -> aiohttp.web.StreamResponse:
        if request.action == enums.action.CREATE and response.status == 200:
            response.set_status(201)  # the client deserialises creates only on 201
        if request.action == enums.action.LIST and response.status == 200:
            return self._fix_list(request, response)
        return response

    def _fix_list(self, request: rendering.Request, response: aiohttp.web.Response) -> aiohttp.web.Response:
        body = json.loads(response.body)
        info = self.resources[request.resource]
        body["kind"] = f"{info.kind}List"
        body["apiVersion"] = f"{request.resource.group}/{request.resource.version}".lstrip("/")
        body["items"] = [obj for obj in body["items"] if _selected(obj, request.params)]
        body["metadata"] = {"resourceVersion": str(next(self._rv))}
        return aiohttp.web.json_response(body)

    def _log(self, request: rendering.Request) -> aiohttp.web.Response:
        key = (request.namespace or "", request.name or "")
        if key not in self.pod_logs:
            raise k8s.KubernetesObjectNotFoundError()
        return aiohttp.web.Response(text=self.pod_logs[key], content_type="text/plain")

    async def _watch(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request._raw_request)
        if self.expired_watches > 0:
            self.expired_watches -= 1
            await _write_event(
                response,
                {
                    "type": "ERROR",
                    "object": {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "code": 410,
                        "reason": "Expired",
                        "message": "too old resource version (injected)",
                    },
                },
            )
            return response
        timeout = float(request.params.get("timeoutSeconds", "30"))
        try:
            await asyncio.wait_for(self._stream_events(request, response), timeout)
        except (asyncio.TimeoutError, ConnectionError):
            pass  # the server-side end of a watch, as a real API server does after timeoutSeconds
        return response

    async def _stream_events(self, request: rendering.Request, response: aiohttp.web.StreamResponse) -> None:
        since = int(request.params.get("resourceVersion") or 0)
        bus = self._buses[request.resource]
        mark = await bus.mark()
        try:
            for key, obj in list(self.objects.items()):  # replay what changed after `since`
                if key[0] == request.resource and not obj.deleted and _in_scope(obj.raw, request, since):
                    await _write_event(response, {"type": "ADDED", "object": obj.raw})
            async for event in bus.stream(since=mark):
                if _in_scope(event["object"], request, since):
                    await _write_event(response, event)
        finally:
            await bus.unmark(mark)


async def _write_event(response: aiohttp.web.StreamResponse, event: dict[str, Any]) -> None:
    await response.write(json.dumps(event).encode() + b"\n")


def _in_scope(obj: dict[str, Any], request: rendering.Request, since: int) -> bool:
    meta = obj.get("metadata", {})
    if request.namespace and meta.get("namespace") != request.namespace:
        return False
    if int(meta.get("resourceVersion") or 0) <= since:
        return False
    return _selected(obj, request.params)


def _selected(obj: dict[str, Any], params: dict[str, str]) -> bool:
    """Equality-based label and field selectors: all that the launcher uses."""
    meta = obj.get("metadata", {})
    for term in filter(None, params.get("labelSelector", "").split(",")):
        key, _, value = term.partition("=")
        if meta.get("labels", {}).get(key) != value:
            return False
    for term in filter(None, params.get("fieldSelector", "").split(",")):
        key, _, value = term.partition("=")
        if key == "metadata.name" and meta.get("name") != value:
            return False
        if key == "metadata.namespace" and meta.get("namespace") != value:
            return False
    return True


class EmulatorThread:
    """Serve a `PatchedEmulator` on 127.0.0.1 from a daemon thread with its own event loop."""

    def __init__(self) -> None:
        self.emulator: PatchedEmulator | None = None
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="kmock", daemon=True)
        self._error: BaseException | None = None

    def __enter__(self) -> EmulatorThread:
        self._thread.start()
        if not self._ready.wait(STARTUP_TIMEOUT_S) or self._error is not None:
            raise RuntimeError(f"kmock did not start: {self._error!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(STARTUP_TIMEOUT_S)

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to the test thread by __enter__
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with PatchedEmulator() as emulator, kmock.Server(emulator, host="127.0.0.1") as server:
            self.emulator = emulator
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()
