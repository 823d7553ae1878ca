"""The child process: `python -m harness.child`. Runs case bodies one at a time.

Started by harness.runner with an explicit environment. At start it runs the backend's set-up
hooks (for XLA backends: import torch_xla and switch SPMD on, once per process), says "ready",
then answers one request per line on stdin with a verdict on the result pipe. A body that
raises is reported as an exception and the child lives on; a body that kills the process
(SIGABRT from a C++ CHECK, a segfault) is noticed by the parent, which owns the attribution.
"""

from __future__ import annotations

import faulthandler
import importlib
import importlib.metadata
import json
import os
import signal
import sys
import time
import traceback
from typing import Any, Callable, TextIO

from harness import protocol
from harness.context import CaseContext


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
    return {
        "type": name,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    }


def run_request(request: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    ctx = CaseContext()
    verdict: dict[str, Any] = {"kind": "verdict", "case": request.get("case", "")}
    try:
        body = load_body(request["body"])
        print(f"[harness] case {verdict['case']} starts", file=sys.stderr, flush=True)
        body(ctx, **request.get("kwargs", {}))
        verdict.update(outcome="ok", exception=None)
    except BaseException as exc:  # the body's failure is the verdict, whatever its type
        verdict.update(outcome="error", exception=describe_exception(exc))
    verdict["observations"] = ctx.observations()
    verdict["duration_s"] = round(time.monotonic() - started, 3)
    return verdict


def send(channel: TextIO, message: dict[str, Any]) -> None:
    channel.write(json.dumps(message, default=repr) + "\n")
    channel.flush()


def main() -> int:
    # A crash or a SIGTERM on timeout writes every thread's Python stack into the log.
    faulthandler.enable(all_threads=True)
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    channel = os.fdopen(int(os.environ[protocol.RESULT_FD_ENV]), "w", encoding="utf-8")
    started = time.monotonic()
    try:
        preloaded = run_preload_hooks()
    except BaseException as exc:
        send(channel, {"kind": "startup-failed", "exception": describe_exception(exc)})
        return 3
    send(channel, {
        "kind": "ready",
        "pid": os.getpid(),
        "torch_xla": installed_torch_xla_version(),
        "preloaded": preloaded,
        "startup_s": round(time.monotonic() - started, 3),
    })
    for line in sys.stdin:
        if line.strip():
            send(channel, run_request(json.loads(line)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
