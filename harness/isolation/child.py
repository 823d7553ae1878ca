"""The child process: runs case bodies one at a time.

A fork server's keeper starts it for harness.isolation.child_process, in a session of its own
with an explicit environment (harness.isolation.forkserver): forked from the server, which then
calls `main()`, or exec'd fresh as `python -m harness.isolation.child`. At start it forks a
watchdog (below), runs the backend's set-up hooks (for XLA backends: import torch_xla and switch
SPMD on, once per process), says "ready", then for each request on stdin says "started", runs the
body and answers with a verdict on the result pipe (harness.isolation.protocol.ChildAnswer). A body
that raises is reported as an exception and the child lives on; a body that kills the process
(SIGABRT from a C++ CHECK, a segfault) is noticed by the parent, which owns the attribution.

After each body the child checks that the process is still fit for the next case (stdio open,
resource limits and signal handlers as they were, the working directory back where it was);
what it cannot undo makes the verdict non-reusable, and the parent discards the child. It also
checks that the process is quiet: torch_xla's pending device work is waited for before the
verdict (a failure there belongs to this case), and threads or processes the body left running
make the child unfit, so it is ended before the next case starts and whatever they do later
cannot be charged to an innocent case.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import gc
import importlib
import importlib.metadata
import itertools
import json
import os
import resource
import signal
import sys
import tempfile
import threading
import time
import traceback
import types
from collections.abc import Callable
from typing import Any

from harness.isolation import processes, protocol
from harness.isolation.context import CaseContext
from harness.isolation.leftovers import Leftovers

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
    return resolve(f"{ref['module']}:{ref['qualname']}")


def run_preload_hooks() -> list[str]:
    hooks = [h for h in os.environ.get(protocol.PRELOAD_ENV, "").split(",") if h]
    for hook in hooks:
        resolve(hook)()
    return hooks


def describe_exception(exc: BaseException) -> dict[str, str]:
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return {"type": name, "message": str(exc), "traceback": "".join(traceback.format_exception(exc))}


class ProcessState:
    """What a body may change that the next case in this process must not inherit: a verdict must
    never depend on which case ran before in the same child. What can be put back is (the
    working directory, umask, environment, sys.path, signal handlers and mask, resource limits,
    the collector); what cannot (a replaced function of a watched module, a lowered hard limit,
    a closed stdio descriptor) makes the child unfit, and it is not reused."""

    def __init__(self) -> None:
        self.cwd = os.getcwd()
        self.umask = _umask()
        self.environ = dict(os.environ)
        self.c_environ = _c_environ()
        self.path = list(sys.path)
        self.limits = {name: resource.getrlimit(getattr(resource, name)) for name in _LIMIT_NAMES}
        self.handlers = _signal_handlers()
        self.mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        self.threads = set(threading.enumerate())
        self.collector = (gc.isenabled(), gc.get_threshold())
        self.modules = _watched_modules()
        self.leftovers = Leftovers(_watched_module_objects())

    def watch_again(self) -> None:
        """Take the watched modules again (one was just imported), before the body runs."""
        self.modules = _watched_modules()
        self.leftovers.watch_classes(_watched_module_objects())

    def unquiet(self) -> list[str]:
        """What the body left running: a thread or a process could act (crash, answer) during the
        next case, which would then be charged with it."""
        problems = []
        threads = [t.name for t in threading.enumerate() if t not in self.threads and t.is_alive()]
        if threads:
            problems.append(f"threads the body started are still running: {', '.join(threads)}")
        helpers = _helpers_left()
        if helpers:
            problems.append(f"processes the body started are still running: {', '.join(map(str, helpers))}")
        return problems

    def restore(self) -> list[str]:
        """Put back what can be put back; return what cannot (the child is then not reusable)."""
        problems = self.leftovers.restore(_watched_module_objects())
        try:
            os.chdir(self.cwd)
        except OSError as exc:
            problems.append(f"cannot return to {self.cwd}: {exc}")
        os.umask(self.umask)
        self._restore_environment()
        sys.path[:] = self.path
        for name, (soft, hard) in self.limits.items():
            now = resource.getrlimit(getattr(resource, name))
            if now == (soft, hard):
                continue
            try:
                resource.setrlimit(getattr(resource, name), (soft, hard))
            except (ValueError, OSError):
                problems.append(f"{name} changed from {(soft, hard)} to {now} and cannot be raised back")
        # The collector as the body found it: a body that turns it off (or retunes it) would
        # change what the next case in this process keeps alive and how long its steps take.
        enabled, thresholds = self.collector
        gc.set_threshold(*thresholds)
        if enabled:
            gc.enable()
        else:
            gc.disable()
        signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)
        for sig, handler in self.handlers.items():
            if handler is not None and signal.getsignal(sig) != handler:
                try:
                    signal.signal(sig, handler)
                except (ValueError, OSError, TypeError):
                    pass  # checked below
        if _signal_handlers() != self.handlers:
            problems.append("signal handlers changed")
        for fd in (0, 1, 2):
            try:
                os.fstat(fd)
            except OSError:
                problems.append(f"file descriptor {fd} was closed")
        problems += _replaced(self.modules, _watched_modules())
        return problems

    def _restore_environment(self) -> None:
        """os.environ as it was, and the C library's environment (what native code reads with
        getenv, which a native setenv changes behind os.environ's back)."""
        for name in set(os.environ) - set(self.environ):
            del os.environ[name]
        for name, value in self.environ.items():
            if os.environ.get(name) != value:
                os.environ[name] = value
        now = _c_environ()
        if self.c_environ is None or now is None:
            return
        for key in set(now) - set(self.c_environ):
            os.unsetenv(key)
        for key, data in self.c_environ.items():
            if now.get(key) != data:
                os.putenv(key, data)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _c_environ() -> dict[bytes, bytes] | None:
    """The C library's environment (`environ`), None where it cannot be read."""
    try:
        import ctypes

        entries = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
    except (OSError, ValueError, AttributeError):
        return None
    found = {}
    for index in itertools.count():
        entry = entries[index]
        if entry is None:
            break
        name, _, value = entry.partition(b"=")
        found[name] = value
    return found


# Modules whose functions and classes a body could replace (monkeypatch) to change a later case's
# verdict: the harness's own, torch_xla's API the cases use, and what the child itself relies on.
# Not every module: with torch_xla loaded that is 3000 modules and ~0.7 s per case.
WATCHED_MODULES = frozenset(
    {
        "torch",
        "torch_xla",
        "torch_xla.core.xla_model",
        "torch_xla.runtime",
        "torch_xla.debug.metrics",
        "torch_xla._XLAC",
        "jax",
        "builtins",
        "gc",  # what the cost meter reads (harness.stepcosts binds its functions, the next case's code may not)
        "os",
        "sys",
        "signal",
        "time",
        "random",
        "json",
        "threading",
        "subprocess",
    }
)


# The modules of the bodies this process has loaded: a body that replaces a later case's body
# function (or a helper it calls) in its module would decide that case's verdict.
BODY_MODULES: set[str] = set()


def _is_watched(name: str) -> bool:
    return (
        name in WATCHED_MODULES or name in BODY_MODULES or name.startswith(("harness.", "torch_xla.distributed.spmd"))
    )


def _watched_module_objects() -> list[types.ModuleType]:
    return [m for name, m in list(sys.modules.items()) if _is_watched(name) and isinstance(m, types.ModuleType)]


def _watched_modules() -> dict[str, tuple[int, dict[str, int]]]:
    """Each watched module loaded now: its identity, and that of each function, class and module it holds."""
    found = {}
    for name, module in list(sys.modules.items()):
        if not _is_watched(name):
            continue
        names = getattr(module, "__dict__", None)
        if isinstance(names, dict):
            found[name] = (id(module), {k: id(v) for k, v in list(names.items()) if isinstance(v, _WATCHED_KINDS)})
    return found


_WATCHED_KINDS = (types.FunctionType, types.BuiltinFunctionType, types.ModuleType, type)


def _replaced(before: dict[str, tuple[int, dict[str, int]]], after: dict[str, tuple[int, dict[str, int]]]) -> list[str]:
    """What the body replaced or removed in watched modules (monkeypatching): it cannot be put back."""
    changed = []
    for name, (module, names) in before.items():
        now = after.get(name)
        if now is None or now[0] != module:
            changed.append(f"module {name} was removed or replaced")
            continue
        changed += [f"{name}.{attr}" for attr, value in names.items() if now[1].get(attr) != value]
    if not changed:
        return []
    return [f"the body replaced what later cases would use (monkeypatched?): {', '.join(changed[:5])}"]


_LIMIT_NAMES = tuple(
    n
    for n in (
        "RLIMIT_AS",
        "RLIMIT_DATA",
        "RLIMIT_NOFILE",
        "RLIMIT_CPU",
        "RLIMIT_FSIZE",
        "RLIMIT_STACK",
        "RLIMIT_CORE",
        "RLIMIT_NPROC",
    )
    if hasattr(resource, n)
)


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


def _signal_handlers() -> dict[int, Any]:
    handlers = {}
    for sig in signal.valid_signals():
        try:
            handlers[int(sig)] = signal.getsignal(sig)
        except (ValueError, OSError):
            continue
    return handlers


# Bodies this process has run so far (CaseContext.bodies_before).
BODIES_RUN = 0


def run_request(request: protocol.Request) -> protocol.ChildAnswer:
    started = time.monotonic()
    state = ProcessState()
    global BODIES_RUN
    ctx = CaseContext(bodies_before=BODIES_RUN)
    BODIES_RUN += 1
    outcome, exception = "ok", None
    try:
        body = load_body(request.body)
        if request.body["module"] not in BODY_MODULES:  # just imported: watched from now on
            BODY_MODULES.add(request.body["module"])
            state.watch_again()
        print(f"[harness] case {request.case} starts", file=sys.stderr, flush=True)
        body(ctx, **request.kwargs)
    except BaseException as exc:  # the body's failure is the verdict, whatever its type
        outcome, exception = "error", describe_exception(exc)
        if isinstance(exc, MemoryError):
            ctx.poison("the body ran out of memory (MemoryError); the heap may be fragmented or limits lowered")
    try:
        wait_for_device_work()
    except BaseException as exc:  # asynchronous work the body queued failed: this case's failure
        if outcome == "ok":
            outcome, exception = "error", describe_exception(exc)
        ctx.poison(f"waiting for the body's device work raised {type(exc).__name__}")
    unquiet = state.unquiet()
    problems = state.restore() + unquiet + ctx.poisoned
    if problems:  # in the child's log: why the next case gets a new child (when the body left stderr open)
        with contextlib.suppress(OSError, ValueError):
            print(f"[harness] case {request.case}: this child is not reused: {'; '.join(problems)}", file=sys.stderr)
            sys.stderr.flush()
    return protocol.ChildAnswer(
        id=request.id,
        case=request.case,
        outcome=outcome,
        exception=exception,
        observations=ctx.observations(),
        duration_s=round(time.monotonic() - started, 3),
        reusable=not problems,
        poisoned="; ".join(problems),
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
                f"{protocol.MAX_MESSAGE_BYTES / 1e6:.0f} MB (harness.isolation.protocol.MAX_MESSAGE_BYTES): record less "
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
        reusable=answer.reusable,
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
    """Answer requests until stdin ends (the parent closed it) or a body left the process unfit."""
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        request = protocol.decode(line.rstrip(b"\n"))
        if not isinstance(request, protocol.Request):
            raise protocol.ProtocolError(f"expected a request on stdin, got {request!r}")
        channel.send(protocol.Started(id=request.id))
        answer = run_request(request)
        channel.send_bytes(encode_answer(answer))
        if not answer.reusable:
            linger()
            return


def linger() -> None:
    """An unfit child takes no more requests but stays until the parent ends it (stdin closed):
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
    the child needs (stdio, its log, the result pipe, the lifeline) are open already. HOME
    becomes a folder of its own: root's is not the case user's to write (caches, jax's config)."""
    user = os.environ.get(protocol.CASE_USER_ENV, "")
    if not user:
        return
    uid, gid = (int(part) for part in user.split(":"))
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    home = tempfile.mkdtemp(prefix="spmd-case-home-")
    os.environ["HOME"] = home
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
