"""The mesh layouts training uses, for case bodies. Imported only inside child processes.

A layout is a name a case is parametrized by; the body asks it for the mesh, the keyword arguments
FSDPv2 gets and the partition spec of a batch. The names say how the devices are used:

    fsdp          1-D mesh ("fsdp",): every parameter cut over all devices (FSDPv2's own example)
    data-fsdp     (data=2, fsdp=n/2): HSDP, parameters cut over fsdp and replicated over data
                  (`last_tile_dim_replicate`); batch, inputs and unit outputs over (data, fsdp)
    hybrid-data   torch_xla's HybridMesh for 2 slices, dcn (data=2) x ici (fsdp=n/2): torchprime's
                  `dcn_mesh.data=2 ici_mesh.fsdp=4`, the data axis across the slices
    hybrid-fsdp   HybridMesh, dcn (fsdp=2) x ici (fsdp=n/2): torchprime's `dcn_mesh.fsdp=2
                  ici_mesh.fsdp=4`, parameters cut across both slices (data=1)

Hybrid meshes on CPU. `HybridMesh` reads the slice and chip coordinates of every device from
`xr.global_runtime_device_attributes()`; CPU devices have neither (only `name`), so on CPU it
refuses a dcn shape ("Invalid dcn_mesh_shape for single slice mesh"). `describe_as_slices`
hands it the attributes a 2-slice TPU job reports (`slice_index`, chip `coords`) for the CPU
devices, and makes `xm.xla_device_hw` answer 'TPU' while the mesh is built, because
`_get_physical_tpu_mesh` asserts that before it reads the coordinates. Everything else is
torch_xla's own code (`_create_hybrid_device_mesh`, `_create_device_mesh`,
`_create_device_mesh_for_nd_torus`): it decides the device order, which is what the cases record.
On a TPU backend whose devices already carry `slice_index` (the GKE multi-slice job), nothing is
described and the mesh is built from the real attributes.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

# The hybrid layouts' slice count: a 2-slice job, as the nightly GKE run and torchprime's daily runs.
SLICES = 2


@dataclasses.dataclass(frozen=True)
class Layout:
    name: str
    axes: tuple[str, ...]
    data_parallel: bool  # a "data" axis of size 2 (HSDP): FSDPv2 gets extra_data_axis="data"
    dcn_axis: str | None = None  # hybrid: the axis that spans the slices (None: a plain Mesh)

    def shape(self, devices: int) -> tuple[int, ...]:
        """The logical mesh shape on `devices` devices."""
        if self.axes == ("fsdp",):
            return (devices,)
        if devices % 2:
            raise ValueError(f"layout {self.name} needs an even device count, got {devices}")
        data = 2 if self.data_parallel else 1
        return (data, devices // data)

    def shapes_per_network(self, devices: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(ici_mesh_shape, dcn_mesh_shape) for HybridMesh: SLICES along dcn_axis, the rest within a slice."""
        if self.dcn_axis is None:
            raise ValueError(f"layout {self.name} is not a hybrid mesh")
        dcn = tuple(SLICES if axis == self.dcn_axis else 1 for axis in self.axes)
        ici = tuple(size // d for size, d in zip(self.shape(devices), dcn))
        return ici, dcn

    @property
    def extra_data_axis(self) -> str | None:
        return "data" if "data" in self.axes else None

    def batch_spec(self, rank: int) -> tuple:
        """Partition spec of a batch: dim 0 over every data-like axis, the rest replicated."""
        batch_axes = ("data", "fsdp") if self.extra_data_axis else "fsdp"
        return (batch_axes,) + (None,) * (rank - 1)

    def fsdpv2_kwargs(self) -> dict[str, Any]:
        """What SpmdFullyShardedDataParallel gets besides module and mesh."""
        return {"extra_data_axis": self.extra_data_axis} if self.extra_data_axis else {}


LAYOUTS = {
    layout.name: layout
    for layout in (
        Layout("fsdp", ("fsdp",), data_parallel=False),
        Layout("data-fsdp", ("data", "fsdp"), data_parallel=True),
        Layout("hybrid-data", ("data", "fsdp"), data_parallel=True, dcn_axis="data"),
        Layout("hybrid-fsdp", ("data", "fsdp"), data_parallel=False, dcn_axis="fsdp"),
    )
}


def get(name: str) -> Layout:
    try:
        return LAYOUTS[name]
    except KeyError:
        raise ValueError(f"unknown mesh layout {name!r}; known: {', '.join(LAYOUTS)}") from None


def build(layout: str | Layout, ctx: Any = None) -> Any:
    """The layout's mesh over every device; with ctx, its shape and device order are recorded."""
    import numpy as np
    import torch_xla.distributed.spmd as xs

    from harness import xla

    layout = get(layout) if isinstance(layout, str) else layout
    devices = xla.num_devices()
    if layout.dcn_axis is None:
        mesh = xs.Mesh(np.arange(devices), layout.shape(devices), layout.axes)
    else:
        ici, dcn = layout.shapes_per_network(devices)
        with describe_as_slices(SLICES):
            mesh = xs.HybridMesh(ici_mesh_shape=ici, dcn_mesh_shape=dcn, axis_names=layout.axes)
    if ctx is not None:
        ctx.record(
            "mesh",
            {
                "layout": layout.name,
                "shape": [int(s) for s in mesh.mesh_shape],
                "axes": list(mesh.axis_names),
                "device_ids": [int(d) for d in mesh.device_ids],
            },
        )
    return mesh


def fsdpv2_wrapper(layout: Layout) -> Any:
    """The wrapper class for FSDPv2's auto-wrapped units: FSDPv2 hands them only mesh and
    shard_output, so without this the blocks' outputs would lose the data axis the root has."""
    import functools

    from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel

    return functools.partial(SpmdFullyShardedDataParallel, **layout.fsdpv2_kwargs())


def slice_attributes(attributes: list[dict[str, Any]], slices: int) -> list[dict[str, Any]]:
    """The runtime's device attributes as a `slices`-slice TPU job reports them.

    Devices are split into contiguous runs, one per slice (a multi-slice job numbers them slice by
    slice). Within a slice, chips sit on a 2-wide grid, (0,0,0), (1,0,0), (0,1,0), (1,1,0), ...,
    the coordinates a v4/v5e slice of 2 or 4 chips reports.
    """
    count = len(attributes)
    if count % slices:
        raise ValueError(f"{count} devices cannot form {slices} equal slices")
    per_slice = count // slices
    described = []
    for ordinal, attrs in enumerate(sorted(attributes, key=_ordinal)):
        local = ordinal % per_slice
        described.append(
            {**attrs, "slice_index": ordinal // per_slice, "coords": [local % 2, local // 2, 0], "core_on_chip": 0}
        )
    return described


def _ordinal(attrs: dict[str, Any]) -> int:
    return int(str(attrs["name"]).rsplit(":", 1)[-1])


@contextlib.contextmanager
def describe_as_slices(slices: int) -> Iterator[None]:
    """While HybridMesh is built: CPU devices described as `slices` TPU slices (see the module doc).

    Nothing is changed where the devices already report `slice_index` (a real multi-slice job).
    """
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    real = xr.global_runtime_device_attributes()
    if real and "slice_index" in real[0]:
        yield
        return
    if not all(str(a.get("name", "")).startswith("CPU:") for a in real):
        # Real chips of one slice: describing them as two would invent their coordinates.
        raise ValueError(
            f"the devices report no slice_index ({real[0].get('name')!r}, ...): this is a single-slice "
            "job, where a hybrid mesh across slices cannot be built; run it on a multi-slice job"
        )
    real_attributes, real_hw = xr.global_runtime_device_attributes, xm.xla_device_hw
    described = slice_attributes(real, slices)
    xr.global_runtime_device_attributes = lambda: [dict(a) for a in described]
    xm.xla_device_hw = lambda device: "TPU"
    try:
        yield
    finally:
        xr.global_runtime_device_attributes, xm.xla_device_hw = real_attributes, real_hw
