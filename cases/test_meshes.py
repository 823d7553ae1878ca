"""The mesh layouts multi-slice training uses (issue #20): FSDPv2 and DTensor on 2-D meshes.

Every other case puts its tensors on a 1-D mesh, or merges (data, fsdp) onto one dimension, so no
tensor is partially replicated and torch_xla's partial-replication path (`_get_group_assignment`)
is never reached. Real 2-slice training is exactly that path: torchprime's daily runs use
`dcn_mesh.data=2 ici_mesh.fsdp=4` (HSDP: parameters cut over fsdp, replicated over data) and
`dcn_mesh.fsdp=2 ici_mesh.fsdp=4`. The layouts are harness.meshes':

* the ViT train step and the scalar-parameter bodies of test_functionalization.py and
  test_scalar_specs.py, run over each layout, numerics against CPU as there;
* torch_xla's own HybridMesh for 2 slices, on CPU with the devices described as two slices (see
  harness.meshes: torch_xla's `_create_hybrid_device_mesh` decides the device order), and a
  TPU twin for the nightly multi-slice job that builds the same mesh from the real slices;
* DTensor on a 2-D ("dp", "tp") DeviceMesh: the `distribute_tensor` workaround with
  [Replicate(), Shard(k)] placements (tensor parallel within a slice, data parallel across), and
  `parallelize_module` on the mesh's "tp" dimension, judged by the registry.

Every sharding is checked against `harness.tiles.holders_from_mesh`, which derives from the
recorded mesh which devices must hold which tile, independently of torch_xla's tile-assignment
code; the recordings also go to the sharding baseline.
"""

from __future__ import annotations

import pytest

from cases.test_functionalization import LEARNING_RATE, TRAIN_STEPS, body_fsdpv2_vit_train, check_losses
from cases.test_scalar_specs import body_fsdpv2_scalar_output, body_fsdpv2_scalar_param
from harness import costs
from harness.sharding import Tiled, as_sharding, is_replicated
from harness.tiles import device_grid, holders_from_mesh, tile_holders

pytestmark = [pytest.mark.spmd, pytest.mark.needs(devices=4)]


# Hybrid rows build the 2-slice mesh from CPU devices described as slices; on a TPU backend the
# twin below builds it from the real slices instead (a single TPU slice has none to build it from).
ON_CPU = pytest.mark.needs(backend="cpu", reason="the TPU twin builds this mesh from real slices")

LAYOUTS = [
    pytest.param("fsdp", id="fsdp"),  # 1-D ("fsdp",): every parameter cut over all devices
    pytest.param("data-fsdp", id="data-fsdp"),  # HSDP (data=2, fsdp=n/2): parameters partially replicated
    pytest.param("hybrid-data", marks=ON_CPU, id="hybrid-data"),  # HybridMesh, data across 2 slices
    pytest.param("hybrid-fsdp", marks=ON_CPU, id="hybrid-fsdp"),  # HybridMesh, fsdp across 2 slices
]
DATA_LAYOUTS = [p for p in LAYOUTS if p.values[0] in ("data-fsdp", "hybrid-data")]


# --------------------------------------------------------------------------------------------
# Parent-side checks
# --------------------------------------------------------------------------------------------


def _mesh(result) -> dict:
    mesh = result.values["mesh"]
    assert sorted(mesh["device_ids"]) == list(range(result.values.get("devices", len(mesh["device_ids"])))), mesh
    return mesh


def _assert_holders(result, name: str, spec: tuple, rank: int) -> None:
    """The recorded sharding of `name` puts each tile on exactly the devices `spec` over the mesh implies."""
    mesh = _mesh(result)
    text = result.shardings[name]
    expected = holders_from_mesh(mesh["shape"], mesh["device_ids"], mesh["axes"], spec)
    if all(len(devices) == len(mesh["device_ids"]) for devices in expected.values()):
        assert is_replicated(text), f"{name}: {spec} over {mesh['axes']} means replicated, got {text}"
        return
    got = tile_holders(text)
    assert got is not None and len(next(iter(got))) == rank, (
        f"{name}: expected a rank-{rank} tiled sharding, got {text}"
    )
    expected = {tile + (0,) * (rank - len(tile)): devices for tile, devices in expected.items()}
    assert got == expected, (
        f"{name}: spec {spec} over mesh {mesh['axes']}={mesh['shape']} devices {mesh['device_ids']} "
        f"puts tiles on {expected}, the recorded {text} on {got}:\n" + "\n".join(device_grid(text))
    )


def _fsdpv2_param_spec(shape: list[int]) -> tuple:
    """FSDPv2's rule for a parameter (shard_maximal): its first largest dim over "fsdp" only."""
    if not shape:
        return ()
    spec = [None] * len(shape)
    spec[shape.index(max(shape))] = "fsdp"
    return tuple(spec)


def _batch_axes(layout: str):
    return "fsdp" if layout == "fsdp" else ("data", "fsdp")


def _check_fsdpv2_params(result, layout: str, prefix: str = "", suffix: str = "") -> None:
    shapes = result.values["param_shapes"]
    assert shapes, "the case recorded no parameters"
    for name, shape in shapes.items():
        _assert_holders(result, prefix + name + suffix, _fsdpv2_param_spec(shape), len(shape))
    if "data" in result.values["mesh"]["axes"] and result.values["mesh"]["shape"][0] > 1:
        partial = [
            n
            for n, s in shapes.items()
            if s
            and as_sharding(result.shardings[prefix + n + suffix]).__class__ is Tiled
            and as_sharding(result.shardings[prefix + n + suffix]).subgroup_types == ("replicated",)
        ]
        assert len(partial) == len([s for s in shapes.values() if s]), (
            f"{layout}: every non-scalar parameter must be partially replicated over data; only {partial} are"
        )


# --------------------------------------------------------------------------------------------
# FSDPv2: the ViT train step and the scalar-parameter bodies over each layout
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fsdpv2_vit_train_steps_match_cpu(spmd, layout: str) -> None:
    steps = costs.metered_steps(spmd.tier)  # 5 on a PR, 20 nightly (docs/tiers.md)
    result = spmd.run(body_fsdpv2_vit_train, steps=steps, lr=LEARNING_RATE, layout=layout, fresh=True)
    losses = result.values["losses"]
    assert len(losses) == steps, f"expected {steps} losses, got {losses}"
    check_losses(losses, result.values["cpu_losses"])
    _check_fsdpv2_params(result, layout)
    _check_fsdpv2_params(result, layout, suffix="@after-steps")
    # Every unit (the root and each block) cuts its output's batch dim over the batch axes:
    # extra_data_axis reaches the auto-wrapped blocks, not only the root.
    outputs = sorted(name for name in result.shardings if name.endswith(":output"))
    assert outputs == ["blocks.0:output", "blocks.1:output", "model:output"], outputs
    for name in outputs:
        rank = len(as_sharding(result.shardings[name]).data_tile_dims)
        _assert_holders(result, name, (_batch_axes(layout),) + (None,) * (rank - 1), rank)


@pytest.mark.known_bug("fsdpv2-scalar-param-spec")
@pytest.mark.parametrize("layout", DATA_LAYOUTS)
def test_fsdpv2_scalar_parameter_on_layout(spmd, layout: str) -> None:
    result = spmd.run(body_fsdpv2_scalar_param, steps=costs.metered_steps(spmd.tier), layout=layout, fresh=True)
    assert result.values["param_shapes"]["scale"] == []
    _check_fsdpv2_params(result, layout)
    _check_fsdpv2_params(result, layout, prefix="after_steps.")


@pytest.mark.known_bug("fsdpv2-scalar-output-spec")
@pytest.mark.parametrize("layout", DATA_LAYOUTS)
def test_fsdpv2_scalar_output_on_layout(spmd, layout: str) -> None:
    result = spmd.run(body_fsdpv2_scalar_output, steps=costs.metered_steps(spmd.tier), layout=layout, fresh=True)
    assert result.values["output_rank"] == 0
    assert is_replicated(result.shardings["output"]), result.shardings["output"]
    _check_fsdpv2_params(result, layout)


# --------------------------------------------------------------------------------------------
# The hybrid mesh's device order, and its TPU twin
# --------------------------------------------------------------------------------------------


def body_hybrid_mesh(ctx, layout: str) -> None:
    from harness import meshes

    meshes.build(layout, ctx)


def _assert_axis_across_slices(mesh: dict, axis: str, slices: int) -> None:
    """Moving along `axis` by one slice's share crosses into the next slice; within it, never.

    A 2-slice job numbers devices slice by slice, so slice s holds ids [s*k, (s+1)*k)."""
    count = len(mesh["device_ids"])
    per_slice = count // slices
    shape, axes = mesh["shape"], mesh["axes"]
    along = axes.index(axis)
    grid = _reshape(mesh["device_ids"], shape)
    for coords, device in grid.items():
        slice_of_device = device // per_slice
        expected_slice = coords[along] * slices // shape[along]
        assert slice_of_device == expected_slice, (
            f"device {device} at {dict(zip(axes, coords))} is in slice {slice_of_device}; the {axis} axis "
            f"({shape[along]} long, across {slices} slices) puts that position in slice {expected_slice}: "
            f"mesh {shape} {mesh['device_ids']}"
        )


def _reshape(flat: list[int], shape: list[int]) -> dict[tuple[int, ...], int]:
    import itertools

    return dict(zip(itertools.product(*(range(s) for s in shape)), flat))


@ON_CPU
@pytest.mark.parametrize(
    "layout,axis",
    [
        pytest.param("hybrid-data", "data", id="hybrid-data"),  # dcn data=2: each data row is one slice
        pytest.param("hybrid-fsdp", "fsdp", id="hybrid-fsdp"),  # dcn fsdp=2: fsdp's halves are the slices
    ],
)
def test_hybrid_mesh_puts_the_dcn_axis_across_slices(spmd, layout: str, axis: str) -> None:
    result = spmd.run(body_hybrid_mesh, layout=layout)
    _assert_axis_across_slices(result.values["mesh"], axis, slices=2)


@pytest.mark.needs(backend="tpu", multislice=True)
@pytest.mark.parametrize("layout", ["hybrid-data", "hybrid-fsdp"])
def test_fsdpv2_vit_on_real_slices(spmd, layout: str) -> None:
    """The TPU twin (nightly GKE job): the same HybridMesh from the slices' own attributes."""
    result = spmd.run(body_fsdpv2_vit_train, steps=TRAIN_STEPS, lr=LEARNING_RATE, layout=layout, fresh=True)
    check_losses(result.values["losses"], result.values["cpu_losses"])
    _check_fsdpv2_params(result, layout)
    _assert_axis_across_slices(result.values["mesh"], "data" if layout == "hybrid-data" else "fsdp", slices=2)


# --------------------------------------------------------------------------------------------
# DTensor on a 2-D ("dp", "tp") DeviceMesh
# --------------------------------------------------------------------------------------------

# Tensor parallel over "tp" (within a slice), data parallel over "dp" (across): the parameters
# are replicated over dp and cut over tp as in the 1-D workaround; the batch is cut over dp.
# Placements per mesh dim (dp, tp): "R" Replicate(), "S0"/"S1" Shard(0)/Shard(1).
DTENSOR_2D_PLACEMENTS = {
    "in_proj.weight": ("R", "S0"),
    "in_proj.bias": ("R", "S0"),
    "out_proj.weight": ("R", "S1"),
    "out_proj.bias": ("R", "R"),
    "x": ("S0", "R"),
}
DTENSOR_RANKS = {"in_proj.weight": 2, "in_proj.bias": 1, "out_proj.weight": 2, "out_proj.bias": 1, "x": 2}


def _xla_2d_mesh(ctx):
    from torch.distributed.device_mesh import init_device_mesh

    from harness import xla

    n = xla.num_devices()
    mesh = init_device_mesh("xla", (2, n // 2), mesh_dim_names=("dp", "tp"))
    ctx.record(
        "mesh",
        {"shape": [2, n // 2], "axes": ["dp", "tp"], "device_ids": [int(d) for d in mesh.mesh.flatten().tolist()]},
    )
    return mesh


def _placements(dt, codes):
    return [dt.Replicate() if c == "R" else dt.Shard(int(c[1:])) for c in codes]


def body_dtensor_2d_workaround(ctx, steps: int) -> None:

    from cases.test_dtensor import _toy_model_and_reference, train_next_to_reference
    from harness import recording, xla

    dt = xla.dtensor()
    model, reference, x = _toy_model_and_reference()
    model = model.to(xla.device())
    mesh = _xla_2d_mesh(ctx)
    for name, param in model.named_parameters():
        recording.record_placements(
            ctx, name, dt.distribute_tensor(param, mesh, _placements(dt, DTENSOR_2D_PLACEMENTS[name]))
        )
    recording.record_parameters(ctx, model, placements=True)
    x_xla = x.to(xla.device())
    recording.record_placements(
        ctx, "x", dt.distribute_tensor(x_xla, mesh, _placements(dt, DTENSOR_2D_PLACEMENTS["x"]))
    )
    ctx.record_sharding("x", xla.spec_of(x_xla))

    train_next_to_reference(
        ctx, model, reference, x, x_xla, steps, lambda loss: recording.record_step_graph(ctx, "step0", [loss])
    )


def _spec_of_placements(codes: tuple[str, ...], rank: int) -> tuple:
    """The partition spec placements mean over ("dp", "tp"): dim k gets the mesh dims that Shard(k)."""
    return tuple(tuple(axis for axis, c in zip(("dp", "tp"), codes) if c == f"S{dim}") or None for dim in range(rank))


@pytest.mark.parametrize("functionalization", [pytest.param(True, id="func-on"), pytest.param(False, id="func-off")])
def test_dtensor_2d_distribute_tensor_workaround(spmd, functionalization: bool) -> None:
    result = spmd.run(
        body_dtensor_2d_workaround,
        functionalization=functionalization,
        steps=costs.metered_steps(spmd.tier),
        fresh=True,
    )  # a cost-measured loop: no graph cached by an earlier case
    for name, codes in DTENSOR_2D_PLACEMENTS.items():
        spec = _spec_of_placements(codes, DTENSOR_RANKS[name])
        _assert_holders(result, name, spec, DTENSOR_RANKS[name])
        if name != "x":
            _assert_holders(result, name + "@after-steps", spec, DTENSOR_RANKS[name])
    placements = result.shardings.get("in_proj.weight:placements")
    if placements is not None:  # only releases whose XLAShardedTensor is a DTensor (2.9) have them
        assert placements == "[Replicate(), Shard(dim=0)]", placements


def body_parallelize_module_2d(ctx) -> None:
    from torch.distributed.tensor.parallel import parallelize_module

    from cases.test_dtensor import _assert_close, _toy_model_and_reference, _tp_plan
    from harness import recording, xla

    model, reference, x = _toy_model_and_reference()
    mesh = _xla_2d_mesh(ctx)
    # The 2-D way to ask for tensor parallelism: the plan over the mesh's "tp" dimension.
    model = parallelize_module(model.to(xla.device()), mesh["tp"], _tp_plan())
    recording.record_parameters(ctx, model, placements=True)
    out = model(x.to(xla.device()))
    xla.sync()
    _assert_close("forward output", out, reference(x).detach())


@pytest.mark.known_bug("dtensor-xla-mesh-slicing")
@pytest.mark.parametrize("functionalization", [pytest.param(True, id="func-on"), pytest.param(False, id="func-off")])
def test_parallelize_module_on_2d_xla_mesh(spmd, functionalization: bool) -> None:
    spmd.run(body_parallelize_module_2d, functionalization=functionalization)
