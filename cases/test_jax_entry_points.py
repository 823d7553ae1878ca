"""Bug 4 at every JAX entry point the installed release has (issue #20, pytorch/xla#8954).

#8954 saw the second MegaScale discovery come back after both fixes without naming the op, and
torch_xla guards JAX in many places (2.9.0: custom_kernel.py, splash_attention.py,
assume_pure.py, core/xla_builder.py's call_jax, distributed/spmd/xla_sharding.py). A hand-written
list of them would miss the next one, so the entry points are found in the installed release's
source: every function decorated with its JAX guard (`requires_jax`, `_requires_jax`), every
function that enters the guard's context (`jax_env_context`) or sets SKIP_MEGASCALE_PJRT_CLIENT
itself (2.6.x, inline in trace_pallas), and `call_jax` and `trace_pallas` where they exist (on
2.4-2.5 nothing is guarded, and trace_pallas is where the bug was seen).

Each module-level entry point is called in one child of its own: one taking a JAX function gets a
plain one (trace_pallas(kernel, t), call_jax(f, (t,)), assume_pure(f)(t), j2t_autograd(f)(t));
any other gets an XLA tensor per required argument, which its body may refuse: the guard runs
before the body, and an error there is recorded, not judged. Methods (autograd Functions'
forward/backward, Mesh.get_jax_mesh) are listed but not called: their module-level entry point
reaches them. JAX starts its backends once per process, so before each call they are dropped
(`_forget_jax_backends`): any entry point that uses JAX starts them again, inside the call, and
JAX's backend start-up (`xla_bridge._init_backend`) records the variable each time. It must be
'true' at every start-up during an entry point, and after the call the variable must hold what
it held before (unset, then 'false').
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.spmd

VAR = "SKIP_MEGASCALE_PJRT_CLIENT"
GUARD_DECORATORS = ("requires_jax", "_requires_jax")
GUARD_CONTEXTS = ("jax_env_context", "_jax_env_context")
ALWAYS = {"torch_xla.core.xla_builder": ("call_jax",), "torch_xla.experimental.custom_kernel": ("trace_pallas",)}
TAKES_A_JAX_FUNCTION = ("kernel", "jax_func", "fn", "func")


def find_entry_points(package_dir: str, package: str = "torch_xla") -> list[dict]:
    """Every guarded function in the package's source: [{module, qualname, method, why}].

    Read with `ast`, not by importing every module (some import TPU-only or optional packages)."""
    import ast
    import pathlib

    found = []
    root = pathlib.Path(package_dir)
    for path in sorted(root.rglob("*.py")):
        if "test" in path.relative_to(root).parts[0]:
            continue
        try:
            tree = ast.parse(path.read_text(errors="replace"))
        except SyntaxError:
            continue
        module = ".".join((package, *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        for qualname, node, in_class in _functions(tree):
            why = _guard_of(node)
            if not why and qualname in ALWAYS.get(module, ()):
                why = "named by the bug (pytorch/xla#8812) or documented as JAX's entry (call_jax)"
            if why and node.name not in GUARD_CONTEXTS + GUARD_DECORATORS:
                found.append({"module": module, "qualname": qualname, "method": in_class, "why": why})
    return found


def _functions(tree):
    import ast

    def walk(body, prefix, in_class):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield prefix + node.name, node, in_class
            elif isinstance(node, ast.ClassDef):
                yield from walk(node.body, f"{prefix}{node.name}.", True)

    yield from walk(tree.body, "", False)


def _guard_of(node) -> str:
    import ast

    for decorator in node.decorator_list:
        name = decorator.attr if isinstance(decorator, ast.Attribute) else getattr(decorator, "id", "")
        if name in GUARD_DECORATORS:
            return f"decorated @{name}"
    for inner in ast.walk(node):
        if isinstance(inner, ast.With):
            for item in inner.items:
                call = item.context_expr
                target = getattr(call, "func", None)
                name = getattr(target, "attr", None) or getattr(target, "id", "")
                if name in GUARD_CONTEXTS:
                    return f"enters {name}()"
        if isinstance(inner, ast.Constant) and inner.value == VAR:
            return f"sets {VAR} itself"
    return ""


def _plain_jax_function(x):
    return x + 1


def _call(entry, name: str, tensor):
    """Call `entry` as its release documents, with a plain JAX function where it takes one."""
    import inspect

    signature = inspect.signature(entry).parameters.values()
    params = [p for p in signature if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    # trace_pallas(kernel, *args): the kernel's arguments follow it
    takes_more = any(p.kind is p.VAR_POSITIONAL for p in signature)
    if name == "call_jax":
        return entry(_plain_jax_function, (tensor,))
    if params and params[0].name in TAKES_A_JAX_FUNCTION:
        result = entry(_plain_jax_function, *([tensor] * (len(params) - 1 + takes_more)))
        return result(tensor) if callable(result) and len(params) == 1 else result
    return entry(*([tensor] * len(params)))


def _forget_jax_backends(bridge) -> None:
    """Drop JAX's backends and the caches that hold them, so the next JAX use starts them again."""
    import jax

    bridge._clear_backends()
    for cached in ("get_backend", "local_devices", "process_count", "_get_backend_uncached"):
        clear = getattr(getattr(bridge, cached, None), "cache_clear", None)
        if clear:
            clear()
    jax.clear_caches()  # compiled and lowered functions keep their backend


def body_every_entry_point_guards_jax(ctx, reintroduce_deleting_guard: bool = False) -> None:
    import importlib
    import os

    import jax._src.xla_bridge as bridge

    seen: list = []
    original = bridge._init_backend

    def recording_init_backend(platform, *args, **kwargs):
        seen.append(os.environ.get(VAR))
        return original(platform, *args, **kwargs)

    bridge._init_backend = recording_init_backend
    os.environ.pop(VAR, None)

    import torch
    import torch_xla

    from harness import xla

    if bridge.backends_are_initialized():
        raise AssertionError("JAX backends were initialised by the child's set-up (import torch_xla, use_spmd)")
    import jax.experimental.pallas  # noqa: F401  (2.9.0 + jax 0.7.1: see test_multislice._trace_plain_kernel)

    if reintroduce_deleting_guard:  # self-test: the pre-#8819 guard, which deletes instead of restoring
        from cases.test_multislice import _reintroduce_deleting_guard

        _reintroduce_deleting_guard(ctx)
    entries = ctx.record("entry_points", find_entry_points(os.path.dirname(torch_xla.__file__)))
    calls = ctx.record("calls", [])
    problems = []
    tensor = torch.ones(8, device=xla.device())
    for entry in entries:
        if entry["method"]:
            continue
        try:
            function = getattr(importlib.import_module(entry["module"]), entry["qualname"])
        except Exception as exc:  # an optional module (e.g. TPU-only) that does not import here
            calls.append(
                {"entry": f"{entry['module']}.{entry['qualname']}", "skipped": f"{type(exc).__name__}: {exc}"[:200]}
            )
            continue
        for preset in (None, "false"):
            if preset is None:
                os.environ.pop(VAR, None)
            else:
                os.environ[VAR] = preset
            _forget_jax_backends(bridge)
            del seen[:]
            try:
                _call(function, entry["qualname"], tensor)
                raised = None
            except Exception as exc:  # the body may refuse placeholder arguments; the guard ran before it
                raised = f"{type(exc).__name__}: {str(exc)[:160]}"
            after = os.environ.get(VAR)
            name = f"{entry['module']}.{entry['qualname']}"
            calls.append({"entry": name, "preset": preset, "lookups": list(seen), "after": after, "raised": raised})
            if any(value != "true" for value in seen):
                problems.append(
                    f"{VAR} was not 'true' at JAX backend start-up in {name} (preset {preset!r}; saw {seen})"
                )
            if after != preset:
                problems.append(f"{VAR} not restored by {name}: {preset!r} before, {after!r} after")
    os.environ.pop(VAR, None)
    if not any(c.get("lookups") for c in calls):
        raise AssertionError(f"no entry point made JAX start a backend; nothing was checked ({calls})")
    if problems:
        raise AssertionError("; ".join(problems))


@pytest.mark.needs(jax=True)
@pytest.mark.known_bug("megascale-preset-dropped-by-trace-pallas")
@pytest.mark.known_bug("megascale-no-guard")
def test_every_jax_entry_point_sets_and_restores_skip_megascale(spmd) -> None:
    result = spmd.run(body_every_entry_point_guards_jax, fresh=True)
    called = {c["entry"] for c in result.values["calls"] if "lookups" in c}
    assert any(name.endswith(".trace_pallas") for name in called), (
        f"trace_pallas was not among the calls: {sorted(called)}"
    )


@pytest.mark.needs(jax=True)
def test_reintroduced_deleting_guard_is_detected_at_the_entry_points(spmd) -> None:
    """Self-test: with the pre-#8819 guard patched back in, the sweep fails with the entry's signature."""
    from harness.registry import get_entry

    result = spmd.run(body_every_entry_point_guards_jax, reintroduce_deleting_guard=True, fresh=True, check=False)
    if result.values.get("guard_api", "") is None:
        pytest.skip(f"torch_xla {result.torch_xla} has no guard function to patch (none before 2.7)")
    assert result.outcome == "error", f"expected the sweep to fail with the deleting guard; outcome {result.outcome}"
    entry = get_entry("megascale-guard-deleted-by-nesting")
    assert entry.matching_signature(result.error.evidence), result.error.evidence


@pytest.mark.selftest
def test_a_new_guarded_function_is_found_without_a_code_change(tmp_path) -> None:
    """A future release's new guarded function is an entry point by its decorator or context alone."""
    (tmp_path / "experimental").mkdir()
    (tmp_path / "experimental" / "new_kernel.py").write_text(
        "from torch_xla._internal.jax_workarounds import requires_jax, jax_env_context\n"
        "@requires_jax\ndef new_op(fn, x):\n    return fn(x)\n"
        "def lowered(x):\n    with jax_env_context():\n        return x\n"
        "def unguarded(x):\n    return x\n"
    )
    found = {(e["module"], e["qualname"]) for e in find_entry_points(str(tmp_path))}
    assert found == {("torch_xla.experimental.new_kernel", "new_op"), ("torch_xla.experimental.new_kernel", "lowered")}
