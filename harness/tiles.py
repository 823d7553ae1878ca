"""Which device holds which tile of a sharded tensor: read from a sharding, drawn as a grid, and
derived independently from a mesh and a partition spec.

Two shardings can share a tile shape and differ only in which devices hold each tile (the case of
a partially replicated parameter whose replication groups moved). The one-line HLO text of both
hides that in a device list; `device_grid` draws each layout as a table of tiles, so a drift or a
cross-host disagreement shows what moved. `holders_from_mesh` is the cases' oracle: what a
partition spec over a logical mesh means, computed here without torch_xla's own tile-assignment
code, so that a regression in that code is seen against it.

Standard library only: the parent pytest process imports this.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from harness.sharding import Sharding, ShardingParseError, Tiled, TupleSharding, as_sharding

Tile = tuple[int, ...]  # index of a tile along each tensor dimension
Holders = dict[Tile, tuple[int, ...]]  # tile -> devices that hold it, ascending
AxisSpec = None | str | Sequence[str]


def tile_holders(value: str | Sharding) -> Holders | None:
    """{tile index: devices holding it} for a tiled sharding; None for any other kind.

    The tile assignment is laid out row-major over `tile_dims`; the leading data dimensions index
    the tile, the trailing subgroup dimensions (replicated, ...) list the devices sharing it.
    """
    value = as_sharding(value)
    if not isinstance(value, Tiled):
        return None
    data_dims = value.data_tile_dims
    per_tile = math.prod(value.subgroup_dims)
    holders: Holders = {}
    for position, tile in enumerate(itertools.product(*(range(d) for d in data_dims))):
        holders[tile] = tuple(sorted(value.devices[position * per_tile : (position + 1) * per_tile]))
    return holders


def holders_from_mesh(
    mesh_shape: Sequence[int], device_ids: Sequence[int], axis_names: Sequence[str], spec: Sequence[AxisSpec]
) -> Holders:
    """What `spec` over the mesh means: {tile: devices}, one entry per tile of the tensor.

    `device_ids` is the mesh's devices in row-major order of `mesh_shape`. Tensor dimension i is
    cut over the mesh axes `spec[i]` names (None: not cut; a tuple: those axes, major first); a
    device holds the tile whose index along each dimension is its coordinate over those axes.
    Axes no dimension names replicate the tile.
    """
    if math.prod(mesh_shape) != len(device_ids):
        raise ValueError(f"mesh shape {tuple(mesh_shape)} needs {math.prod(mesh_shape)} devices, got {len(device_ids)}")
    sizes = dict(zip(axis_names, mesh_shape))
    dims_axes = [() if s is None else ((s,) if isinstance(s, str) else tuple(s)) for s in spec]
    for axes in dims_axes:
        unknown = [a for a in axes if a not in sizes]
        if unknown:
            raise ValueError(f"partition spec names axis {unknown[0]!r}; the mesh has {tuple(axis_names)}")
    holders: dict[Tile, list[int]] = {}
    for coords in itertools.product(*(range(s) for s in mesh_shape)):
        at = dict(zip(axis_names, coords))
        tile = tuple(_flat_index([at[a] for a in axes], [sizes[a] for a in axes]) for axes in dims_axes)
        device = device_ids[_flat_index(list(coords), list(mesh_shape))]
        holders.setdefault(tile, []).append(int(device))
    return {tile: tuple(sorted(devices)) for tile, devices in sorted(holders.items())}


def _flat_index(index: list[int], dims: list[int]) -> int:
    flat = 0
    for i, d in zip(index, dims):
        flat = flat * d + i
    return flat


def is_multi_axis(text: str) -> bool:
    """Partially replicated, or cut along more than one tensor dimension: where the one-line
    text no longer shows at a glance which device holds what."""
    try:
        value = as_sharding(text)
    except (ShardingParseError, TypeError):
        return False
    if isinstance(value, TupleSharding):
        return any(is_multi_axis(str(e)) for e in value.elements)
    return isinstance(value, Tiled) and (bool(value.subgroup_types) or sum(d > 1 for d in value.data_tile_dims) > 1)


def device_grid(value: str | Sharding) -> list[str]:
    """Lines drawing which device holds which tile.

    The tensor's cut dimensions become the grid: rows index the first cut dimension, columns the
    others (row-major); each cell lists the devices holding that tile. Dimensions in one piece are
    left out. Example, `{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}` of an (8, 16) weight:

        dim 1 ->  [0]  [1]
                  0,2  1,3
    """
    value = as_sharding(value)
    holders = tile_holders(value)
    if holders is None:
        return [f"(no tiles: {value or chr(39) * 2})"]
    assert isinstance(value, Tiled)
    cut = [d for d, pieces in enumerate(value.data_tile_dims) if pieces > 1]
    if not cut:
        only = holders[next(iter(holders))]
        return [f"one tile, on devices {_devices(only)}"]
    rows_dim, col_dims = (cut[0], cut[1:]) if len(cut) > 1 else (None, cut)
    col_tiles = list(itertools.product(*(range(value.data_tile_dims[d]) for d in col_dims)))
    row_tiles = range(value.data_tile_dims[rows_dim]) if rows_dim is not None else [None]
    header = [f"[{','.join(map(str, t))}]" for t in col_tiles]
    cells = []
    for r in row_tiles:
        row = []
        for c in col_tiles:
            tile = [0] * len(value.data_tile_dims)
            if rows_dim is not None and r is not None:  # r is None exactly when rows_dim is
                tile[rows_dim] = r
            for d, i in zip(col_dims, c):
                tile[d] = i
            row.append(_devices(holders[tuple(tile)]))
        cells.append((f"[{r}]" if r is not None else "", row))
    width = max(len(x) for x in header + [cell for _, row in cells for cell in row])
    label = f"dim {','.join(map(str, col_dims))} ->"
    lead = (
        max(len(label), *(len(r) + len(f"dim {rows_dim} ") for r, _ in cells)) if rows_dim is not None else len(label)
    )
    lines = [label.ljust(lead) + "  " + "  ".join(h.ljust(width) for h in header)]
    for row_label, row in cells:
        name = f"dim {rows_dim} {row_label}" if row_label else ""
        lines.append(name.ljust(lead) + "  " + "  ".join(cell.ljust(width) for cell in row))
    return [line.rstrip() for line in lines]


def _devices(devices: tuple[int, ...]) -> str:
    return ",".join(map(str, devices))


def grids_side_by_side(before: str, after: str, titles: tuple[str, str] = ("before", "after")) -> list[str]:
    """Two layouts' device grids next to each other, each under its title."""
    left, right = [titles[0], *device_grid(before)], [titles[1], *device_grid(after)]
    width = max(len(line) for line in left)
    rows = itertools.zip_longest(left, right, fillvalue="")
    return [f"{a.ljust(width)}    {b}".rstrip() for a, b in rows]
