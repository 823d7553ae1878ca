"""The child process: runs one case body, then ends.

A fork server's keeper starts it for harness.isolation.parent.child_process, in a session of its own
with an explicit environment (harness.isolation.server.forkserver): forked from the server, which then
calls `main()`, or exec'd fresh as `python -m harness.isolation.child`. At start it forks a
watchdog (below), runs the backend's set-up hooks (for XLA backends: import torch_xla and switch
SPMD on), says "ready", then for its one request on stdin says "started", runs the body and
answers with a verdict on the result pipe (harness.isolation.wire.protocol.ChildAnswer). A body that
raises is reported as an exception; a body that kills the process (SIGABRT from a C++ CHECK, a
segfault) is noticed by the parent, which owns the attribution.

A process that ran a body never runs another (issue 51): whatever the body changed of its process
(a function's `__code__`, a mode left entered, a hook, the default device, a global mesh) cannot
reach another case, and nothing has to be put back. The child still checks that the process is
quiet: torch_xla's pending device work is waited for before the verdict (a failure there belongs
to this case), and a thread or process the body left running keeps the child until the next case
begins, so that what it does meanwhile is charged to this case, never to an innocent one.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import hashlib
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import signal
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable
from typing import Any

from harness.errors import ChangedSinceCollection
from harness.isolation.child.context import CaseContext
from harness.isolation.system import dropuser, files, processes
from harness.isolation.wire import protocol

WATCHDOG_PID: int | None = None  # the harness's own process; not a helper the body left running
KEEPER_PID: int | None = None  # the process that adopts this child's helpers that leave its session


def start_watchdog() -> None:
    """Fork a process that SIGKILLs this process group once the parent (pytest) is gone.

    The parent holds the only write end of the lifeline pipe; when it exits for any reason,
    SIGKILL included, the read below returns EOF. A thread would not do: a body stuck in native
    code holding the GIL would stall it. The group holds everything this child started, so a
    busy child and its helpers (gloo ranks, compile workers) go with it.
    """
    lifeline = int(os.environ.pop(protocol.LIFELINE_FD_ENV, "-1"))
    if lifeline < 0:
        return
    global WATCHDOG_PID
    pid = os.fork()
    if pid != 0:
        WATCHDOG_PID = pid
        os.close(lifeline)
        return
    try:  # the watchdog: keep only the lifeline (and the log on 1/2), so it holds no pipe open
        os.closerange(3, lifeline)
        os.closerange(lifeline + 1, 65536)
        os.close(0)
        while os.read(lifeline, 1):
            pass
    finally:
        os.killpg(0, signal.SIGKILL)
        os._exit(0)


def installed_torch_xla_version() -> str | None:
    fake = os.environ.get(protocol.FAKE_VERSION_ENV)
    if os.environ.get(protocol.BACKEND_ENV) == "fake":
        return fake or None
    try:
        return importlib.metadata.version("torch_xla")
    except importlib.metadata.PackageNotFoundError:
        return None


def resolve(spec: str) -> Callable[..., Any]:
    """`package.module:function` -> the function."""
    module_name, _, attr = spec.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def load_body(ref: dict[str, str]) -> Callable[..., Any]:
    if ref["root"] and ref["root"] not in sys.path:
        sys.path.insert(0, ref["root"])
    if ref.get("sha256") and ref["module"] not in sys.modules:
        import_held(ref["module"], ref["sha256"])
    return resolve(f"{ref['module']}:{ref['qualname']}")


class _HeldSource(importlib.machinery.SourceFileLoader):
    """Compiles the bytes that were checked, never a `.pyc` beside them (one could be planted)."""

    def __init__(self, fullname: str, path: str, data: bytes) -> None:
        super().__init__(fullname, path)
        self.data = data

    def get_code(self, fullname: str) -> types.CodeType:
        return compile(self.data, self.path, "exec", dont_inherit=True)


def import_held(name: str, sha256: str) -> None:
    """Import module `name` from the bytes whose hash the run took at collection, or refuse."""
    parent, _, leaf = name.rpartition(".")
    parent_module = importlib.import_module(parent) if parent else None
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin or not spec.has_location:
        return  # not a file: imported the usual way
    data = files.read_bytes(spec.origin)
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ChangedSinceCollection(
            f"{spec.origin} changed after the run collected it (by an earlier case?): the case is not run "
            "from a file the run did not read; run it again from a clean checkout"
        )
    spec = importlib.util.spec_from_file_location(name, spec.origin, loader=_HeldSource(name, spec.origin, data))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    if parent_module is not None:
        setattr(parent_module, leaf, module)


def run_preload_hooks() -> list[str]:
    hooks = [h for h in os.environ.get(protocol.PRELOAD_ENV, "").split(",") if h]
    for hook in hooks:
        resolve(hook)()
    return hooks


def describe_exception(exc: BaseException) -> dict[str, str]:
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return {"type": name, "message": str(exc), "traceback": "".join(traceback.format_exception(exc))}


class ThreadsAtStart:
    """The threads the process had before the body: one it started and left running could act
    (crash, answer) after the verdict, which would then be charged to nobody."""

    def __init__(self) -> None:
        self.threads = set(threading.enumerate())

    def unquiet(self) -> list[str]:
        """What the body left running: threads, and processes (ours, or adopted by our keeper)."""
        problems = []
        threads = [t.name for t in threading.enumerate() if t not in self.threads and t.is_alive()]
        if threads:
            problems.append(f"threads the body started are still running: {', '.join(threads)}")
        helpers = _helpers_left()
        if helpers:
            problems.append(f"processes the body started are still running: {', '.join(map(str, helpers))}")
        return problems


def _helpers_left() -> list[int]:
    """Our children but the watchdog, and what our keeper adopted but us (helpers that left the
    session: their parent ended, the keeper, a subreaper, took them)."""
    parents = processes.parents()
    mine = {os.getpid(), WATCHDOG_PID}
    adopters = {os.getpid(), KEEPER_PID} - {None}
    return sorted(pid for pid, parent in parents.items() if parent in adopters and pid not in mine)


def wait_for_device_work() -> None:
    """Wait for the device work the body queued, where torch_xla is loaded and has the call: an
    asynchronous failure then kills or fails this case, not the next one. Never imports torch_xla."""
    xm = sys.modules.get("torch_xla.core.xla_model")
    wait = getattr(xm, "wait_device_ops", None)
    if wait is not None:
        wait()


# Bodies this process has run so far (CaseContext.bodies_before).
BODIES_RUN = 0


def run_request(request: protocol.Request) -> protocol.ChildAnswer:
    """Run the one body this process runs; nothing of it is put back (the process ends after)."""
    started = time.monotonic()
    threads = ThreadsAtStart()
    global BODIES_RUN
    ctx = CaseContext(bodies_before=BODIES_RUN)
    BODIES_RUN += 1
    outcome, exception = "ok", None
    try:
        body = load_body(request.body)
        print(f"[harness] case {request.case} starts", file=sys.stderr, flush=True)
        body(ctx, **request.kwargs)
    except BaseException as exc:  # the body's failure is the verdict, whatever its type
        outcome, exception = "error", describe_exception(exc)
    try:
        wait_for_device_work()
    except BaseException as exc:  # asynchronous work the body queued failed: this case's failure
        if outcome == "ok":
            outcome, exception = "error", describe_exception(exc)
    unquiet = threads.unquiet()
    return protocol.ChildAnswer(
        id=request.id,
        case=request.case,
        outcome=outcome,
        exception=exception,
        observations=ctx.observations(),
        duration_s=round(time.monotonic() - started, 3),
        poisoned="; ".join(unquiet + ctx.poisoned),
        quiet=not unquiet,
    )


def encode_answer(answer: protocol.ChildAnswer) -> bytes:
    """The answer's bytes; an answer that cannot be sent as it is becomes an error saying why."""
    try:
        data = protocol.encode(answer)
    except (TypeError, ValueError):  # CaseContext checks each value as recorded; this is the backstop
        return _replace_observations(answer, "HarnessUsageError", _not_json(answer.observations))
    if len(data) > protocol.MAX_MESSAGE_BYTES and answer.exception is not None:
        # The cause leads the evidence: an exception's huge message is cut, not replaced by a size note.
        answer = dataclasses.replace(answer, exception={k: _cut(v) for k, v in answer.exception.items()})
        data = protocol.encode(answer)
    if len(data) > protocol.MAX_MESSAGE_BYTES:
        return _replace_observations(
            answer,
            "ObservationsTooLarge",
            (
                f"the verdict is {len(data) / 1e6:.1f} MB, over the harness's limit of "
                f"{protocol.MAX_MESSAGE_BYTES / 1e6:.0f} MB (harness.isolation.wire.protocol.MAX_MESSAGE_BYTES): record less "
                f"(sizes: {_observation_sizes(answer.observations)})"
            ),
        )
    return data


MAX_EXCEPTION_TEXT = 1 << 20  # characters of an exception's message or traceback kept in an answer too large to send


def _cut(text: str) -> str:
    if len(text) <= MAX_EXCEPTION_TEXT:
        return text
    half = MAX_EXCEPTION_TEXT // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut by the harness ...]\n{text[-half:]}"


def _not_json(observations: dict[str, Any]) -> str:
    """Which recorded value is not strict JSON (a list recorded early and appended to later)."""
    for kind, entries in observations.items():
        for key, value in entries.items():
            problem = protocol.json_problem(value)
            if problem:
                return (
                    f"ctx {kind} {key!r} is not strict JSON ({problem}); record numbers, text, lists and "
                    f"dicts of them, and write NaN/Infinity as text"
                )
    return "the observations are not strict JSON"


def _observation_sizes(observations: dict[str, Any]) -> str:
    sizes = []
    for kind, entries in observations.items():
        for key, value in entries.items():
            sizes.append((len(json.dumps(value, default=repr)), f"{kind}[{key!r}]"))
    return ", ".join(f"{name} {size / 1e6:.1f} MB" for size, name in sorted(sizes, reverse=True)[:5])


def _replace_observations(answer: protocol.ChildAnswer, error_type: str, message: str) -> bytes:
    replaced = protocol.ChildAnswer(
        id=answer.id,
        case=answer.case,
        outcome="error",
        exception={"type": f"harness.errors.{error_type}", "message": message, "traceback": message + "\n"},
        observations={"shardings": {}, "hlo": {}, "values": {}},
        duration_s=answer.duration_s,
        poisoned=answer.poisoned,
        quiet=answer.quiet,
    )
    return protocol.encode(replaced)


class ResultChannel:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, message: Any) -> None:
        self.send_bytes(protocol.encode(message))

    def send_bytes(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]


def serve(channel: ResultChannel) -> None:
    """Answer one request, then take no other: a process that ran a body never runs another."""
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        request = protocol.decode(line.rstrip(b"\n"))
        if not isinstance(request, protocol.Request):
            raise protocol.ProtocolError(f"expected a request on stdin, got {request!r}")
        channel.send(protocol.Started(id=request.id))
        channel.send_bytes(encode_answer(run_request(request)))
        linger()
        return


def linger() -> None:
    """A child that answered takes no more requests but stays until the parent ends it (stdin closed):
    what the body left running (a thread that crashes later) then shows, forked or exec'd alike,
    and is charged to the case that left it."""
    try:
        for _ in sys.stdin.buffer:
            pass
    except (OSError, ValueError):
        pass  # the body closed stdin: nothing to wait on


def drop_to_case_user() -> None:
    """Become the case user the run names (--spmd-case-user), before anything of the case runs:
    it can write nothing the run reads and signal none of the run's processes. The descriptors
    the child needs (stdio, its log, the result pipe, the lifeline) are open already. A forked
    child is that user already (its server dropped before importing); its keeper gave it a HOME
    of its own (harness.isolation.server.forkserver.keep_child). Not dumpable: another case's process
    of the same uid cannot read its memory or environment."""
    user = dropuser.case_user()
    if user is None:
        return
    dropuser.become(*user)
    dropuser.not_dumpable()
    if not os.path.basename(os.environ.get("HOME", "")).startswith(dropuser.HOME_PREFIX):
        os.environ["HOME"] = dropuser.make_home(*user)
        os.environ.pop("XDG_CACHE_HOME", None)


def main() -> int:
    global KEEPER_PID
    keeper = os.environ.pop(protocol.KEEPER_PID_ENV, "")
    KEEPER_PID = int(keeper) if keeper.isdigit() else None
    drop_to_case_user()
    start_watchdog()
    # A crash or a SIGTERM on timeout writes every thread's Python stack into the log.
    faulthandler.enable(all_threads=True)
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    channel = ResultChannel(int(os.environ[protocol.RESULT_FD_ENV]))
    started = time.monotonic()
    try:
        preloaded = run_preload_hooks()
    except BaseException as exc:
        channel.send(protocol.StartupFailed(exception=describe_exception(exc)))
        return 3
    channel.send(
        protocol.Ready(
            pid=os.getpid(),
            torch_xla=installed_torch_xla_version(),
            preloaded=preloaded,
            startup_s=round(time.monotonic() - started, 3),
        )
    )
    serve(channel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
