"""What a case body records of its shardings, under stable names. Used inside children only.

The sharding baseline (harness.judges.baseline) catches a change of any sharding a case records, so a
case records everything it builds, not only what it asserts: every parameter after wrapping or
distribution and after the steps, the output of every wrapped unit (FSDPv2 shards each unit's
output), the entry parameters and ROOT of a compiled step (read by role: `parameter(N)`, never an
SSA name), and DTensor placements. Names are module paths with wrapper segments removed
(`blocks.0.mlp.fc1.weight`, `blocks.0:output`, `step0:parameter(3)`, `in_proj.weight:placements`),
so they are the same in every process and on every release.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Attribute names torch_xla's wrappers put between a module and what they wrap (FSDPv2 keeps the
# wrapped module as `_orig_module`; torch's checkpoint/compile wrappers use the others).
WRAPPER_SEGMENTS = ("_orig_module", "_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod")
ROOT_NAME = "model"


def stable_name(name: str) -> str:
    """`_orig_module.blocks.0._orig_module.attn.qkv.weight` -> `blocks.0.attn.qkv.weight`."""
    parts = [part for part in name.split(".") if part not in WRAPPER_SEGMENTS]
    return ".".join(parts) or ROOT_NAME


def spec_of_any(tensor: Any) -> str:
    """The sharding spec of a plain XLA tensor or of an XLAShardedTensor/DTensor wrapper.

    A wrapper (parallelize_module leaves them as parameters) holds its spec on its global tensor:
    asking the wrapper itself raises "Expected XLA tensor" on 2.9, "Check failed: xtensor" on 2.6.
    """
    from harness import xla

    return xla.spec_of(getattr(tensor, "global_tensor", tensor))


# suffix stays where it was (a public function: case files may pass it by position); the options
# added since are keyword-only.
def record_parameters(
    ctx: Any, module: Any, suffix: str = "", *, prefix: str = "", placements: bool = False
) -> dict[str, list[int]]:
    """Every parameter's full sharding (tile shape and device assignment), recorded as
    `prefix + stable name + suffix` (`after_steps.fc1.weight`, `fc1.weight@after-steps`); with
    `placements`, also each DTensor parameter's placements under that name (record_placements).
    Returns the parameters' shapes by stable name."""
    shapes = {}
    for name, param in module.named_parameters():
        readable = stable_name(name)
        recorded = f"{prefix}{readable}{suffix}"
        ctx.record_sharding(recorded, spec_of_any(param))
        if placements:
            record_placements(ctx, recorded, param)
        shapes[readable] = list(param.shape)
    return shapes


def record_placements(ctx: Any, name: str, dtensor: Any) -> None:
    """A DTensor's placements (`[Shard(dim=0)]`), where the release's wrapper has them: torch_xla's
    XLAShardedTensor is a DTensor from 2.9 on; before that it carries no placements, and on 2.9 an
    op's result without mesh and partition spec raises ValueError when asked. Then nothing is
    recorded (a placement that appears or disappears shows as a new or missing name)."""
    try:
        placements = getattr(dtensor, "placements", None)
    except (ValueError, RuntimeError, AttributeError):
        return
    if placements is not None:
        ctx.record_sharding(f"{name}:placements", repr(list(placements)))


def record_unit_outputs(ctx: Any, model: Any, is_unit: Callable[[Any], bool], suffix: str = "") -> Callable[[], None]:
    """Record the output sharding of every module for which is_unit(module) (e.g. each FSDPv2
    wrapper, the root included) at its next forward; returns the function that stops recording.

    A forward hook runs after the module's forward, i.e. after FSDPv2's shard_output marked it.
    Each unit is recorded once (its first forward), so a training loop records step 0 only.
    """
    handles = []
    recorded: set[str] = set()

    def hook_for(name: str) -> Callable[..., None]:
        def hook(module: Any, inputs: Any, output: Any) -> None:
            if name in recorded:
                return
            recorded.add(name)
            for key, tensor in _tensors_of(output):
                ctx.record_sharding(f"{name}:output{key}{suffix}", spec_of_any(tensor))

        return hook

    for name, module in model.named_modules():
        if is_unit(module):
            handles.append(module.register_forward_hook(hook_for(stable_name(name))))

    def stop() -> None:
        for handle in handles:
            handle.remove()

    return stop


def _tensors_of(output: Any) -> list[tuple[str, Any]]:
    """('', t) for a tensor output, ('[i]', t) for each tensor of a tuple or list output."""
    import torch

    if isinstance(output, torch.Tensor):
        return [("", output)]
    if isinstance(output, (tuple, list)):
        return [(f"[{i}]", t) for i, t in enumerate(output) if isinstance(t, torch.Tensor)]
    return []


def record_step_graph(ctx: Any, label: str, tensors: list[Any]) -> str:
    """The shardings of the graph computing `tensors` (call before the step executes), by role:
    `label:parameter(N)` for each entry parameter, `label:ROOT[i]` for each operand of a ROOT
    tuple (torch_xla's usual ROOT) or `label:ROOT` for another ROOT. Returns the HLO text."""
    from harness import xla
    from harness.hlo import parameter_shardings, parse_hlo, root_instruction
    from harness.sharding import NoSharding, format_sharding

    text = xla.hlo_of([getattr(t, "global_tensor", t) for t in tensors])
    module = parse_hlo(text)
    for number, sharding in parameter_shardings(module).items():
        ctx.record_sharding(f"{label}:parameter({number})", format_sharding(sharding))
    root = root_instruction(module)
    if root.opcode == "tuple" and not root.has_sharding:
        for index, name in enumerate(root.operand_names):
            operand = module.entry.find(name)
            ctx.record_sharding(
                f"{label}:ROOT[{index}]", format_sharding(operand.sharding if operand else NoSharding())
            )
    else:
        ctx.record_sharding(f"{label}:ROOT", format_sharding(root.sharding))
    return text
