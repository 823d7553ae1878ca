"""The training job's sharded checkpoint: saved mid-run, restored into a fresh job, resumed.

The job of cases/test_training_job.py (cases.trainjob) trains; after `save_after` steps its model
and AdamW state are saved with `torch.distributed.checkpoint` and torch_xla's SPMD planners
(cases.checkpointing; or through torch_xla's CheckpointManager), and it trains on. A fresh job,
built with other weights, primes its optimizer, restores the checkpoint and trains the remaining
steps on the same batches. Held:

* on the same mesh the resumed run is the uninterrupted run, bit for bit: every loss after the
  restore, every parameter and every optimizer state tensor at the end (the same program on the
  same data);
* every parameter and optimizer state tensor has after the restore the sharding it had before
  the save (on the same mesh), or the one the new mesh gave it (restored onto another mesh);
* restored onto another mesh (saved on the 1-D mesh of 4, restored on (2, 2) fsdp x tensor):
  the same numbers within the CPU reference's tolerance (another program, other reduction orders).

Self-tests (a torch_xla 2.9.0 site changed in the child after the save): a restore that gives
each device the next device's shard fails naming the parameter and how far it is off; one that
writes the tensor back replicated fails naming the parameter and both shardings.
"""

from __future__ import annotations

import pytest

# Slow: each child takes 10-20 s on 2 cores (two jobs, a save and a restore, seven steps).
pytestmark = [pytest.mark.spmd, pytest.mark.slow, pytest.mark.needs(devices=4)]

STEPS = 4
SAVE_AFTER = 2
ACROSS_MESHES_ATOL = 1e-4  # as cases/test_training_job.py's parameters against the CPU


def body_checkpoint_resume(
    ctx,
    save_layout: str,
    restore_layout: str,
    manager: bool = False,
    fault: str | None = None,
    writer_threads: int = 1,
) -> None:
    import tempfile

    from cases import checkpointing, decoder, faults, trainjob
    from harness import xla

    lacking = checkpointing.missing() or (_manager_missing() if manager else None)
    if lacking:
        ctx.record("skip", f"has no {lacking}")
        return
    rows = trainjob.ROWS_PER_DEVICE * xla.num_devices()
    tokens = decoder.token_batches(seed=2, count=STEPS, rows=rows)
    folder = tempfile.mkdtemp(prefix="job-checkpoint-", dir=xla.scratch_folder("job-checkpoints-"))
    store = checkpointing.ManagedCheckpoints(folder, SAVE_AFTER) if manager else None

    job = trainjob.Job(save_layout)
    losses = train(job, tokens[: SAVE_AFTER * rows])
    saved_specs = specs_of(job)
    if store is not None:
        assert store.save(SAVE_AFTER, job.state(SAVE_AFTER)), f"CheckpointManager did not save at step {SAVE_AFTER}"
    else:
        checkpointing.save(job.state(SAVE_AFTER), folder, writer_threads)
        lost = checkpointing.unsaved(job.state(SAVE_AFTER), folder)
        if lost:
            raise AssertionError(
                f"the checkpoint saved on the {save_layout} mesh holds no data for {len(lost)} tensor(s) the state "
                f"had: {', '.join(lost)}"
            )
    losses += train(job, tokens[SAVE_AFTER * rows :])
    expected = snapshot(job)

    if fault is not None:
        faults.reintroduce(fault)  # the restore is what the fault changes
    fresh = trainjob.Job(restore_layout, seed=1)  # other weights: the restore must replace them all
    checkpointing.prime(fresh.optimizer)
    fresh_specs = specs_of(fresh)
    state = fresh.state(0)
    if store is not None:
        store.load(state)
    else:
        checkpointing.load(state, folder)
    step = int(state["progress"]["step"])
    restored_specs = specs_of(fresh)
    fresh.resume_schedule(step)
    resumed = train(fresh, tokens[step * rows :])
    ctx.record(
        "resume",
        {
            "step": step,
            "losses": losses,
            "resumed_losses": resumed,
            "saved_specs": saved_specs if save_layout == restore_layout else fresh_specs,
            "restored_specs": restored_specs,
            "differences": differences(expected, snapshot(fresh)),
        },
    )


def _manager_missing() -> str | None:
    try:
        from torch_xla.experimental.distributed_checkpoint import CheckpointManager  # noqa: F401
    except ImportError:
        from cases import checkpointing

        return checkpointing.NO_MANAGER
    return None


def train(job, tokens) -> list[float]:
    """The job's steps over `tokens`, batches through its loader; the losses."""
    from cases import trainjob

    loader = job.loader(tokens)
    losses = []
    for (batch,) in loader:
        loss, _ = job.step(batch)
        losses.append(loss.item())
    trainjob.close(loader)
    return losses


def specs_of(job) -> dict[str, str]:
    """The sharding of every parameter and optimizer state tensor held on the devices."""
    from harness import xla

    specs = {f"param {name}": xla.spec_of(param) for name, param in job.wrapped.named_parameters()}
    names = dict(enumerate(name for name, _ in job.wrapped.named_parameters()))
    for index, state in job.optimizer.state_dict()["state"].items():
        for key, value in state.items():
            if value.device.type == "xla":
                specs[f"optimizer {key} of {names[index]}"] = xla.spec_of(value)
    return specs


def snapshot(job) -> dict[str, object]:
    """Every parameter and optimizer state tensor, on the CPU."""
    tensors = {f"param {name}": param.detach().cpu() for name, param in job.wrapped.named_parameters()}
    names = dict(enumerate(name for name, _ in job.wrapped.named_parameters()))
    for index, state in job.optimizer.state_dict()["state"].items():
        for key, value in state.items():
            tensors[f"optimizer {key} of {names[index]}"] = value.detach().cpu()
    return tensors


def differences(expected: dict, observed: dict) -> dict[str, float]:
    """Largest absolute difference of each tensor (0.0: bit for bit the same, NaN included)."""
    import torch

    found = {}
    for name, want in expected.items():
        got = observed[name]
        if want.is_floating_point():  # NaN where the other has NaN counts as the same
            same = torch.equal(want.isnan(), got.isnan()) and torch.equal(want.nan_to_num(0.0), got.nan_to_num(0.0))
        else:
            same = torch.equal(want, got)
        found[name] = 0.0 if same else (want.double() - got.double()).abs().nan_to_num(float("inf")).max().item()
    return found


def _run(spmd, **kwargs):
    result = spmd.run(body_checkpoint_resume, fresh=True, **kwargs)
    if "skip" in result.values:
        pytest.skip(f"torch_xla {result.torch_xla} {result.values['skip']}")
    return result.values["resume"]


def check_shardings(resume: dict) -> None:
    changed = {
        name: f"{spec} -> {resume['restored_specs'].get(name)}"
        for name, spec in resume["saved_specs"].items()
        if resume["restored_specs"].get(name) != spec
    }
    assert not changed, f"the restore changed the sharding of {len(changed)} tensor(s): " + "; ".join(
        f"{name}: {move}" for name, move in sorted(changed.items())
    )


def check_resumed(resume: dict, atol: float = 0.0) -> None:
    step, losses = resume["step"], resume["losses"]
    assert step == SAVE_AFTER, f"the checkpoint restored step {step}, saved at {SAVE_AFTER}"
    uninterrupted, resumed = losses[step:], resume["resumed_losses"]
    off = max(abs(a - b) for a, b in zip(uninterrupted, resumed, strict=True))
    worst = max(resume["differences"].items(), key=lambda item: item[1])
    how = "bit for bit" if atol == 0.0 else f"within {atol}"
    assert off <= atol and worst[1] <= atol, (
        f"resumed from the step-{step} checkpoint, the run is not the uninterrupted run {how}: losses "
        f"{resumed} vs {uninterrupted}; {worst[0]} differs by {worst[1]:.3g} at the end"
    )


@pytest.mark.parametrize(
    "manager",
    [
        pytest.param(False, marks=pytest.mark.known_bug("dcp-filesystem-writer-picks-torchax-device-module")),
        pytest.param(True, marks=pytest.mark.nightly),
    ],
    ids=["planners", "checkpoint-manager"],
)
def test_a_resumed_job_is_the_uninterrupted_job(spmd, manager: bool) -> None:
    resume = _run(spmd, save_layout="fsdp", restore_layout="fsdp", manager=manager)
    check_shardings(resume)
    check_resumed(resume)


@pytest.mark.known_bug("dcp-filesystem-writer-picks-torchax-device-module")
def test_a_job_saved_on_one_mesh_resumes_on_another(spmd) -> None:
    """Saved on the 1-D mesh of 4 devices (the (4, 1) layout), restored onto (2, 2) fsdp x tensor."""
    resume = _run(spmd, save_layout="fsdp", restore_layout="fsdp-tensor")
    check_shardings(resume)
    check_resumed(resume, atol=ACROSS_MESHES_ATOL)


@pytest.mark.known_bug("spmd-save-planner-drops-partially-replicated-tensors")
def test_a_job_saved_on_the_fsdp_tensor_mesh_resumes(spmd) -> None:
    """torchprime's fsdp x tensor layout: the norms are cut over fsdp and replicated over tensor."""
    resume = _run(
        spmd, save_layout="fsdp-tensor", restore_layout="fsdp-tensor", writer_threads=2
    )  # checkpointing.OTHER_WRITER_THREADS
    check_shardings(resume)
    check_resumed(resume)


@pytest.mark.nightly  # 10-16 s each: the PR tier runs the checks, the nightly tier shows they can fail
@pytest.mark.parametrize("fault", ["restore-permutes-shards", "restore-replicates-shards"])
@pytest.mark.known_bug("dcp-filesystem-writer-picks-torchax-device-module")
def test_a_resume_fails_naming_a_restore_that_moves_shards(spmd, fault: str) -> None:
    """Self-test: each restore fault put back into torch_xla fails the check that guards it."""
    resume = _run(spmd, save_layout="fsdp", restore_layout="fsdp", fault=fault)
    if fault == "restore-permutes-shards":
        check_shardings(resume)  # the shards moved between devices; each tensor's sharding did not
        with pytest.raises(AssertionError, match=r"is not the uninterrupted run bit for bit: .* differs by"):
            check_resumed(resume)
    else:
        with pytest.raises(AssertionError, match=r"the restore changed the sharding of .*-> \{replicated\}"):
            check_shardings(resume)


IN_FLIGHT = "while an async operation is in flight"  # torch_xla's check on data not yet computed
# A race: each attempt fails with a probability measured at 0.4-1.0 (2.4.0-2.9.0), so 10 attempts
# see it but once in a few hundred runs. The tensor is large enough that making it takes the device
# a while (a 64 x 8 one is made before the planner reads it: never seen).
RESTORE_ATTEMPTS = 10
RESTORE_SHAPE = (8192, 2048)


def body_restore_right_after_sync(ctx, attempts: int) -> None:
    """A restore into freshly made sharded tensors right after the sync that makes them, as a job
    that builds its model, syncs and restores does; each attempt's failure is recorded."""
    import tempfile

    import torch
    import torch_xla.distributed.spmd as xs

    from cases import checkpointing, trainjob
    from harness import xla

    lacking = checkpointing.missing()
    if lacking:
        ctx.record("skip", f"has no {lacking}")
        return
    mesh = trainjob.mesh_of("fsdp")
    saved = torch.randn(RESTORE_SHAPE).to(xla.device())
    xs.mark_sharding(saved, mesh, ("fsdp", None))
    folder = tempfile.mkdtemp(prefix="job-checkpoint-", dir=xla.scratch_folder("job-checkpoints-"))
    checkpointing.save({"weight": saved}, folder, checkpointing.OTHER_WRITER_THREADS)  # judges the load planner
    failures = ctx.record("in_flight", [])
    for _ in range(attempts):
        target = torch.zeros(RESTORE_SHAPE, device=xla.device())
        xs.mark_sharding(target, mesh, ("fsdp", None))
        xla.sync()
        try:
            checkpointing.load({"weight": target}, folder)
        except BaseException as exc:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
            line = next((x.strip() for x in str(exc).splitlines() if IN_FLIGHT in x), None)
            if line is None:
                raise
            failures.append(line[:300])
        xla.wait_device_ops()


@pytest.mark.nightly  # a race (see RESTORE_ATTEMPTS): kept out of the PR gate, where a rare miss would read as a fix
@pytest.mark.known_bug("spmd-load-planner-reads-targets-in-flight")
def test_a_restore_right_after_the_sync_that_made_its_targets(spmd) -> None:
    result = spmd.run(body_restore_right_after_sync, attempts=RESTORE_ATTEMPTS, fresh=True)
    if "skip" in result.values:
        pytest.skip(f"torch_xla {result.torch_xla} {result.values['skip']}")
    failures = result.values["in_flight"]
    assert not failures, (
        f"SPMDLoadPlanner read a restore target's shards while the sync that made it was in flight "
        f"({len(failures)} of {RESTORE_ATTEMPTS} restores right after the sync failed): {failures[0]}"
    )
