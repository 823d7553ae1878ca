"""Issue 51, item 1: every case body runs in a process that ran no other case (black-box runs, as a
hostile pull request or a buggy torch_xla build would write them). Each attack leaves something in
its process that no restore list named; the case after it must not see it. Nothing is restored,
because nothing is reused: the after-case asserts it ran first in its process (bodies_before == 0)
and that what the attack changed is as a fresh process has it.
"""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import run_cpu, run_fake

pytestmark = pytest.mark.selftest

ATTACKS = """
import gc, math, os, sys
import pytest

pytestmark = [pytest.mark.spmd, pytest.mark.needs(xla=False)]

def leave_code_swap(ctx):
    # The next case's body, made a no-op in place: its function object is the same, its code is not.
    after_code_swap.__code__ = (lambda ctx: None).__code__

def after_code_swap(ctx):
    ctx.record("ran", "the next case's own code")  # a body made a no-op records nothing

def leave_context_code_swap(ctx):
    from harness.isolation.child.context import CaseContext
    forged = lambda self, name, spec: self.shardings.__setitem__(name, "{replicated}")
    CaseContext.record_sharding.__code__ = forged.__code__

def after_context_code_swap(ctx):
    ctx.record_sharding("w", "{devices=[4,1]0,1,2,3}")
    assert ctx.shardings["w"] == "{devices=[4,1]0,1,2,3}", "the sharding recorded was forged"

def leave_function_mode(ctx):
    import torch
    from torch.overrides import TorchFunctionMode
    class Zeros(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            return out * 0 if isinstance(out, torch.Tensor) else out
    Zeros().__enter__()  # never exited

def after_function_mode(ctx):
    import torch
    assert float(torch.ones(3).add(1).sum()) == 6.0, "a TorchFunctionMode of the case before"

def leave_forward_hook(ctx):
    import torch
    torch.nn.modules.module.register_module_forward_hook(lambda module, args, out: out * 0)

def after_forward_hook(ctx):
    import torch
    layer = torch.nn.Linear(2, 2)
    torch.nn.init.ones_(layer.weight)
    assert float(layer(torch.ones(1, 2)).sum()) != 0.0, "a global forward hook of the case before"

def leave_default_device(ctx):
    import torch
    torch.set_default_device("meta")

def after_default_device(ctx):
    import torch
    assert torch.ones(2).device.type == "cpu", "the default device the case before set"

def leave_dynamo_config(ctx):
    import torch._dynamo
    torch._dynamo.config.cache_size_limit = 1

def after_dynamo_config(ctx):
    import torch._dynamo
    assert torch._dynamo.config.cache_size_limit != 1, "torch._dynamo.config of the case before"

def leave_gc_callback(ctx):
    def left_by_the_case_before(phase, info):
        pass
    gc.callbacks.append(left_by_the_case_before)

def after_gc_callback(ctx):
    names = [getattr(c, "__name__", "") for c in gc.callbacks]
    assert "left_by_the_case_before" not in names, names

def leave_audit_hook(ctx):
    def hook(event, args):
        if event == "os.listdir":
            raise PermissionError("an audit hook of the case before")
    sys.addaudithook(hook)

def after_audit_hook(ctx):
    os.listdir(".")

def leave_meta_path(ctx):
    import importlib.abc, importlib.util, types
    class Forger(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            return importlib.util.spec_from_loader(name, self) if name == "colorsys" else None
        def create_module(self, spec):
            return None
        def exec_module(self, module):
            module.rgb_to_hsv = lambda r, g, b: (0.0, 0.0, 0.0)
    sys.meta_path.insert(0, Forger())

def after_meta_path(ctx):
    import colorsys
    assert colorsys.rgb_to_hsv(1.0, 0.0, 0.0) == (0.0, 1.0, 1.0), "a finder of the case before"

def leave_isclose(ctx):
    math.isclose = lambda *args, **kwargs: True

def after_isclose(ctx):
    assert not math.isclose(1.0, 2.0), "math.isclose replaced by the case before"

def test_a_leaves(spmd):
    spmd.run(globals()["leave_" + os.environ["ATTACK"]])

def test_b_after(spmd):
    after = globals()["after_" + os.environ["ATTACK"]]
    values = spmd.run(after).values
    if after is after_code_swap:
        assert values.get("ran") == "the next case's own code", "the next case's body did not run its code"
"""

# The after-case records which body its process ran first; the harness's context counts it.
ATTACKS += """
def body_count(ctx):
    ctx.record("bodies_before", ctx.bodies_before)

def test_c_counts(spmd):
    assert spmd.run(body_count).values["bodies_before"] == 0, "this process ran another case first"
"""

PYTHON_ATTACKS = ("code_swap", "context_code_swap", "gc_callback", "audit_hook", "meta_path", "isclose")
TORCH_ATTACKS = ("function_mode", "forward_hook", "default_device", "dynamo_config")


@pytest.mark.parametrize("attack", PYTHON_ATTACKS + TORCH_ATTACKS)
def test_what_a_body_leaves_in_its_process_never_reaches_the_next_case(pytester, monkeypatch, attack):
    pytester.makepyfile(test_leaves=ATTACKS)
    monkeypatch.setenv("ATTACK", attack)
    result = run_fake(pytester, "-p", "no:randomly", "-rA", timeout=180)
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.assert_outcomes(passed=3)
    logs = [p.read_text(errors="replace") for p in pytester.path.glob("results/run-*/logs/*/child-*.log")]
    started = [log.count("[harness] case ") - log.count("is not reused") for log in logs]
    assert sorted(n for n in started if n) == [1, 1, 1], f"cases started per child process: {started}"


XLA_ATTACKS = """
import pytest

pytestmark = pytest.mark.spmd

def leave_global_mesh(ctx):
    import numpy as np
    import torch_xla.distributed.spmd as xs
    from harness import xla
    n = xla.num_devices()
    xs.set_global_mesh(xs.Mesh(np.arange(n), (n, 1), ("left", "behind")))

def after_global_mesh(ctx):
    import torch_xla.distributed.spmd as xs
    mesh = xs.get_global_mesh()
    assert mesh is None, f"the global mesh the case before set: {mesh.axis_names}"

def leave_precision(ctx):
    import torch_xla.backends
    torch_xla.backends.set_mat_mul_precision("highest")

def after_precision(ctx):
    import torch_xla.backends
    assert torch_xla.backends.get_mat_mul_precision() == "default", "the precision the case before set"

def test_a_leaves_mesh(spmd):
    spmd.run(leave_global_mesh)

def test_b_after_mesh(spmd):
    spmd.run(after_global_mesh)

def test_c_leaves_precision(spmd):
    spmd.run(leave_precision)

def test_d_after_precision(spmd):
    spmd.run(after_precision)
"""


@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is None, reason="torch_xla is not installed here")
def test_a_global_mesh_or_matmul_precision_left_by_a_case_on_real_torch_xla_never_reaches_the_next(pytester):
    pytester.makepyfile(test_xla_leaves=XLA_ATTACKS)
    result = run_cpu(pytester, "-p", "no:randomly", "-rA")
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.assert_outcomes(passed=4)
