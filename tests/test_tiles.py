"""harness.tiles (which device holds which tile) and the device grids drift and disagreement
reports show; end to end, a partially replicated parameter whose tiles moved to other devices."""

from __future__ import annotations

import importlib.util
import json

import pytest

from harness.gke.aggregate import HostDisagreement
from harness.judges.baseline import Baseline, ShardingChange, listing
from harness.tiles import device_grid, holders_from_mesh, is_multi_axis, tile_holders
from tests.conftest import REPO, run_cpu

pytestmark = pytest.mark.selftest

HSDP_WEIGHT = "{devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}"  # FSDPv2, mesh (data=2, fsdp=2)
MOVED = "{devices=[2,1,2]1,3,0,2 last_tile_dim_replicate}"  # same tiles, the other replication groups


@pytest.mark.parametrize(
    "text, holders",
    [
        # dim 0 in 2 pieces, each held by one device of each data row
        (HSDP_WEIGHT, {(0, 0): (0, 2), (1, 0): (1, 3)}),
        # an iota spelling of a 2x2 cut: one device per tile
        ("{devices=[2,2]<=[4]}", {(0, 0): (0,), (0, 1): (1,), (1, 0): (2,), (1, 1): (3,)}),
        # all data dims in one piece: one tile on every device
        ("{devices=[1,1,4]0,1,2,3 last_tile_dim_replicate}", {(0, 0): (0, 1, 2, 3)}),
        ("{replicated}", None),  # no tile assignment at all
    ],
)
def test_tile_holders(text, holders):
    assert tile_holders(text) == holders


@pytest.mark.parametrize(
    "spec, holders",
    [
        # FSDPv2's parameter spec on (data, fsdp): cut over fsdp, replicated over data
        (("fsdp", None), {(0, 0): (0, 2), (1, 0): (1, 3)}),
        # a batch over both axes, data major
        ((("data", "fsdp"), None), {(0, 0): (0,), (1, 0): (1,), (2, 0): (2,), (3, 0): (3,)}),
        # DTensor [Shard(0), Shard(1)] on (dp, tp) named data/fsdp here
        (("data", "fsdp"), {(0, 0): (0,), (0, 1): (1,), (1, 0): (2,), (1, 1): (3,)}),
    ],
)
def test_holders_from_mesh_is_what_the_spec_means(spec, holders):
    assert holders_from_mesh((2, 2), [0, 1, 2, 3], ("data", "fsdp"), spec) == holders


def test_holders_from_mesh_follows_the_mesh_device_order():
    # A hybrid mesh on 8 devices orders each slice's chips 0,2,1,3: the oracle follows it,
    # so torch_xla's tile assignment is held to the mesh it was given, not to 0..n-1.
    ids = [0, 2, 1, 3, 4, 6, 5, 7]
    assert holders_from_mesh((2, 4), ids, ("data", "fsdp"), (None, "fsdp")) == {
        (0, 0): (0, 4),
        (0, 1): (2, 6),
        (0, 2): (1, 5),
        (0, 3): (3, 7),
    }
    assert tile_holders(HSDP_WEIGHT) != tile_holders(MOVED)


def test_multi_axis_and_grids():
    assert is_multi_axis(HSDP_WEIGHT) and is_multi_axis("{devices=[2,2]0,1,2,3}")
    assert not is_multi_axis("{devices=[4,1]0,1,2,3}") and not is_multi_axis("{replicated}") and not is_multi_axis("")
    assert device_grid(HSDP_WEIGHT) == ["dim 0 ->  [0]  [1]", "          0,2  1,3"]
    assert device_grid("{devices=[2,2]0,2,1,3}") == ["dim 1 ->   [0]  [1]", "dim 0 [0]  0    2", "dim 0 [1]  1    3"]


def test_a_drift_listing_draws_multi_axis_moves_as_grids():
    text = listing(
        [ShardingChange("w", HSDP_WEIGHT, MOVED), ShardingChange("b", "{devices=[4]0,1,2,3}", "{replicated}")]
    )
    assert text.splitlines() == [
        f"  w: {HSDP_WEIGHT} -> {MOVED}",
        "      baseline              this run",
        "      dim 0 ->  [0]  [1]    dim 0 ->  [0]  [1]",
        "                0,2  1,3              1,3  0,2",
        "  b: {devices=[4]0,1,2,3} -> {replicated}",  # one axis: the text says it all
    ]


def test_a_cross_host_disagreement_draws_both_layouts():
    d = HostDisagreement("c::t", "w", [(HSDP_WEIGHT, ["slice0.host0", "slice1.host0"]), (MOVED, ["slice1.host1"])])
    assert d.grids() == [
        "slice0.host0, slice1.host0    slice1.host1",
        "dim 0 ->  [0]  [1]            dim 0 ->  [0]  [1]",
        "          0,2  1,3                      1,3  0,2",
    ]
    assert HostDisagreement("c::t", "w", [("{devices=[4]0,1,2,3}", ["a"]), ("{replicated}", ["b"])]).grids() == []


# --------------------------------------------------------------------------------------------
# End to end with torch_xla: the HSDP ViT case, replication groups of its parameters moved
# --------------------------------------------------------------------------------------------

HSDP_CASE_ID = "cases/test_meshes.py::test_fsdpv2_vit_train_steps_match_cpu[data-fsdp]"
HSDP_WITH_MOVED_PARAMETERS = """
import os
import pytest

pytestmark = pytest.mark.spmd

def body_vit(ctx, repo, move_parameter_tiles):
    import sys
    sys.path.insert(0, repo)
    import torch
    import torch_xla.distributed.spmd as xs

    if move_parameter_tiles:
        # FSDPv2 marks each parameter over a mesh whose fsdp axis is reversed: tile k of a
        # parameter goes to the devices that held tile n-1-k. Tile shape, replication and the
        # numbers are unchanged; only which devices hold which tile moves.
        installed = xs.mark_sharding

        def mark_parameters_on_reversed_fsdp(tensor, mesh, spec, *args, **kwargs):
            if isinstance(tensor, torch.nn.Parameter):
                ids = mesh.device_ids.reshape(mesh.mesh_shape)[:, ::-1].flatten()
                mesh = xs.Mesh(ids, mesh.mesh_shape, mesh.axis_names)
            return installed(tensor, mesh, spec, *args, **kwargs)

        xs.mark_sharding = mark_parameters_on_reversed_fsdp
    from cases.test_functionalization import LEARNING_RATE, TRAIN_STEPS, body_fsdpv2_vit_train

    body_fsdpv2_vit_train(ctx, TRAIN_STEPS, LEARNING_RATE, layout="data-fsdp")

def test_vit(spmd):
    spmd.run(body_vit, fresh=True, repo=os.environ["REPO"], move_parameter_tiles=os.environ["PATCH"] == "1")
"""


def lit(text: str) -> str:
    """`text` for fnmatch_lines, whose patterns read [...] as a character class."""
    return "".join(f"[{c}]" if c in "[]*?" else c for c in text)


@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is None, reason="torch_xla is not installed here")
def test_moved_tiles_of_a_partially_replicated_parameter_fail_against_the_baseline(pytester, monkeypatch):
    import importlib.metadata

    committed = json.loads((REPO / "baselines" / "shardings" / "cpu-4.json").read_text())
    version = importlib.metadata.version("torch_xla")
    if not Baseline(REPO, "cpu", 4, committed["torch_xla"], {}).on_release_line(version):
        pytest.skip(f"the committed baseline is from torch_xla {committed['torch_xla']}; this is {version}")
    entry = committed["cases"][HSDP_CASE_ID]
    assert entry["blocks.0.attn.qkv.weight"] == HSDP_WEIGHT, "the committed HSDP entry is not partially replicated"
    pytester.makepyfile(test_vit=HSDP_WITH_MOVED_PARAMETERS)
    (pytester.path / "baseline.json").write_text(json.dumps({**committed, "cases": {"test_vit.py::test_vit": entry}}))
    monkeypatch.setenv("REPO", str(REPO))

    def run(patch: bool, baseline: str) -> pytest.RunResult:
        monkeypatch.setenv("PATCH", "1" if patch else "0")
        return run_cpu(pytester, f"--spmd-shardings-baseline={baseline}")

    run(False, "baseline.json").assert_outcomes(passed=1)  # unpatched: the committed entry holds
    run(True, "absent.json").assert_outcomes(passed=1)  # losses and tile shapes unchanged: nothing else sees it
    changed = run(True, "baseline.json")
    changed.assert_outcomes(failed=1)
    changed.stdout.fnmatch_lines(
        [
            "*sharding drift: * tensor(s) differ from baseline.json*",
            "*" + lit(f"blocks.0.attn.qkv.weight: {HSDP_WEIGHT} -> {MOVED}"),
            "*baseline*this run*",
            "*" + lit("dim 0 ->  [0]  [1]    dim 0 ->  [0]  [1]"),
            "*0,2  1,3              1,3  0,2",
        ]
    )
