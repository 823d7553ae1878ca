"""torch_xla's `apply_xla_patch_to_nn_linear` (torchprime's trainer applies it to every model): each
`nn.Linear` becomes an einsum, so a batch or sequence split survives the layer. A plain
`nn.Linear` lowers to a reshape of [batch, sequence, hidden] into [batch * sequence, hidden]: with
the sequence split, no tiling of the merged dim says what each device holds, and the output comes
back replicated (measured on 2.9.0: `{replicated}` without the patch, `{devices=[1,4,1]...}` with it).

The case runs a two-layer MLP block with the patch on a (1, n) mesh of (data, seq), its input split
over the sequence: the block's output and hidden activation keep the split, and the output and the
weights' gradients equal the same block's on the CPU. The patch exists from 2.7.0; before, the case
skips naming it. Self-test: the fault `einsum-linear-falls-back-to-matmul` (cases/faults.py) makes the
patched layer call F.linear again, and the case fails naming the split it lost.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.spmd

NO_PATCH = "has no apply_xla_patch_to_nn_linear (from 2.7.0)"
BATCH, SEQUENCE, HIDDEN, WIDE = 2, 8, 16, 32
ATOL = RTOL = 1e-5


def body_patched_block(ctx, fault: str | None = None) -> None:
    import copy

    import torch
    import torch_xla.distributed.spmd as xs
    import torch_xla.distributed.spmd.xla_sharding as xla_sharding

    from cases import faults
    from harness import xla

    if not hasattr(xla_sharding, "apply_xla_patch_to_nn_linear"):
        ctx.record("skip", NO_PATCH)
        return
    if fault is not None:
        faults.reintroduce(fault)
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(HIDDEN, WIDE), torch.nn.GELU(), torch.nn.Linear(WIDE, HIDDEN))
    reference = copy.deepcopy(block)
    tokens = torch.randn(BATCH, SEQUENCE, HIDDEN)

    n = xla.num_devices()
    mesh = xla.mesh((1, n), ("data", "seq"))
    patched = xla_sharding.apply_xla_patch_to_nn_linear(block).to(xla.device())
    x = tokens.to(xla.device())
    xs.mark_sharding(x, mesh, ("data", "seq", None))
    hidden = patched[1](patched[0](x))
    out = patched[2](hidden)
    out.square().mean().backward()
    xla.sync()  # the activations' shardings are read from their device data
    ctx.record_sharding("hidden", xla.spec_of(hidden))
    ctx.record_sharding("output", xla.spec_of(out))
    # the CPU's output and gradients: the same block, eager, unsharded (after the XLA run: autograd
    # sizes its device queues at its first backward, and XLA's device must be known by then)
    expected = reference(tokens)
    expected.square().mean().backward()
    ctx.record("output_matches_cpu", bool(torch.allclose(out.cpu(), expected.detach(), atol=ATOL, rtol=RTOL)))
    ctx.record(
        "gradients_differ",
        [
            name
            for (name, p), q in zip(patched.named_parameters(), reference.parameters())
            if not torch.allclose(p.grad.cpu(), q.grad, atol=ATOL, rtol=RTOL)
        ],
    )


def check_block(result) -> None:
    if "skip" in result.values:
        pytest.skip(f"torch_xla {result.torch_xla} {result.values['skip']}")
    from harness.sharding import parse_sharding

    lost = [
        f"{name} {result.shardings[name]}"
        for name in ("hidden", "output")
        if not _splits_the_sequence(parse_sharding(result.shardings[name]))
    ]
    assert not lost, (
        "apply_xla_patch_to_nn_linear: the sequence split did not survive the patched nn.Linear: "
        + ", ".join(lost)
        + " (the input was split over dim 1; an einsum keeps it, a reshape to 2-D loses it)"
    )
    assert result.values["output_matches_cpu"], "the patched block's output differs from the CPU's"
    assert not result.values["gradients_differ"], (
        f"gradients differ from the CPU's: {result.values['gradients_differ']}"
    )


def _splits_the_sequence(sharding) -> bool:
    """Whether a [batch, sequence, features] tensor's sharding cuts dim 1 and nothing else."""
    from harness.sharding import Tiled

    if not isinstance(sharding, Tiled) or len(sharding.data_tile_dims) != 3:
        return False
    batch, sequence, features = sharding.data_tile_dims
    return batch == 1 and sequence > 1 and features == 1


def test_the_patched_linear_keeps_the_sequence_split_and_the_numbers(spmd) -> None:
    check_block(spmd.run(body_patched_block))


@pytest.mark.no_cost_check("runs the block with a fault put back on purpose; the test judges it")
@pytest.mark.no_sharding_baseline("runs the block with a fault put back on purpose; the test judges it")
def test_the_case_fails_naming_the_split_a_plain_linear_loses(spmd) -> None:
    """Self-test: with the patched layer calling F.linear again, the case fails naming the lost split."""
    result = spmd.run(body_patched_block, fault="einsum-linear-falls-back-to-matmul")
    with pytest.raises(AssertionError, match=r"the sequence split did not survive the patched nn\.Linear: hidden "):
        check_block(result)
