"""In-process checks of the checkpoint directory rules and the stop flag (single process)."""

import os
import signal
from pathlib import Path

import torch

from contract.failure import PeerFailedError
from train.persist.layout import MARKER, complete_checkpoints, failed_save, latest_checkpoint, prune
from train.engine.stop import StopRequest


def _make(root, name, complete=True):
    path = root / name
    path.mkdir(parents=True)
    if complete:
        (path / MARKER).write_text("ok\n")
    return path


def test_latest_ignores_unmarked_and_tmp(tmp_path):
    _make(tmp_path, "step-00000005")
    _make(tmp_path, "step-00000010")
    _make(tmp_path, "step-00000015", complete=False)  # renamed, marker not yet written
    _make(tmp_path, ".tmp-step-00000020", complete=False)
    assert latest_checkpoint(tmp_path).name == "step-00000010"
    assert latest_checkpoint(tmp_path / "missing") is None


def test_prune_keeps_last_k_complete(tmp_path):
    for step in (5, 10, 15, 20):
        _make(tmp_path, f"step-{step:08d}")
    prune(tmp_path, keep=2)
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step-00000015", "step-00000020"]
    prune(tmp_path, keep=0)  # the newest complete checkpoint is never removed
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step-00000020"]


def test_a_save_whose_folder_another_failing_rank_removed_is_a_follow_on(tmp_path):
    """CI: rank 1's first file found no room and its failed save removed the shared .tmp folder; rank 0's next write
    there then failed with torch.save's "Parent directory ... does not exist." and, recorded first, hid the cause."""
    tmp = tmp_path / ".tmp-step-00000008"
    gone = RuntimeError(f"Parent directory {tmp} does not exist.")
    assert isinstance(failed_save(tmp_path, tmp, gone), PeerFailedError)
    assert isinstance(failed_save(tmp_path, tmp, FileNotFoundError(str(tmp / "x"))), PeerFailedError)
    other = RuntimeError("CUDA error: an illegal memory access")
    assert failed_save(tmp_path, tmp, other) is other  # not for want of the folder: this rank's own cause
    tmp.mkdir()
    assert failed_save(tmp_path, tmp, gone) is gone and not tmp.exists()  # there (so not removed by a peer): its own


def test_stop_request_from_signal_or_file(tmp_path):
    stop_file = tmp_path / "STOP_REQUESTED"
    stop = StopRequest(stop_file, torch.device("cpu"))
    previous = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM)}
    try:
        stop.install_signal_handlers()
        assert not stop.agreed(step=1, is_main_process=True)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.agreed(step=2, is_main_process=True) and stop.signalled == "SIGUSR1"
        assert stop_file.exists()  # written for the launcher's "checkpoint newer than stop file" rule
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    fresh = StopRequest(stop_file, torch.device("cpu"))
    assert fresh.requested_locally()  # the file alone is a request


def test_stop_file_is_dropped_only_once_a_checkpoint_answered_it(tmp_path):
    stop_file = tmp_path / "STOP_REQUESTED"
    checkpoint = tmp_path / "checkpoints" / "step-00000005"
    checkpoint.mkdir(parents=True)
    stop = StopRequest(stop_file, torch.device("cpu"))
    stop_file.touch()
    os.utime(stop_file, (1000, 1000))
    (checkpoint / MARKER).touch()  # saved after the request: the request was answered
    stop.clear_answered_file(is_main_process=True, latest_checkpoint=None)
    assert stop_file.exists()  # no checkpoint: a live request (e.g. signal during startup)
    stop.clear_answered_file(is_main_process=False, latest_checkpoint=checkpoint)
    assert stop_file.exists()  # only rank 0 touches the file
    stop.clear_answered_file(is_main_process=True, latest_checkpoint=checkpoint)
    assert not stop_file.exists()
    stop_file.touch()  # a new request after that checkpoint stays
    os.utime(checkpoint / MARKER, (1000, 1000))
    stop.clear_answered_file(is_main_process=True, latest_checkpoint=checkpoint)
    assert stop_file.exists()


def test_materialize_optimizer_state_creates_moments_and_changes_no_weight():
    """FSDP1 resume (train.engine.checkpoint.load_checkpoint): Accelerate reads the checkpoint into the fresh
    optimizer's own state_dict, so the moments must exist first or none are restored."""
    import torch

    from train.engine.optim import materialize_optimizer_state

    model = torch.nn.Linear(4, 3)
    model.bias.requires_grad_(False)  # a frozen parameter gets no state
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.5)
    materialize_optimizer_state(optimizer)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert set(optimizer.state[model.weight]) >= {"exp_avg", "exp_avg_sq", "step"}
    assert model.bias not in optimizer.state and model.weight.grad is None
    assert optimizer.param_groups[0]["lr"] == 0.1


def test_a_save_asks_to_give_the_allocators_free_gpu_memory_back_first(tmp_path, monkeypatch):
    """The save's first NCCL gather allocates outside PyTorch's allocator; on a full card it failed
    (8B at 10,240 tokens per GPU on 4 H100s, bench/results/h100/four-gpu-2026-11-27g/save-crash-machine0.log).
    What runs here is the order: the cache is released before Accelerate's save starts. The release itself
    (torch.cuda.empty_cache) needs a GPU; it is a no-op on CPU."""
    from accelerate import Accelerator

    from train.engine import checkpoint

    accelerator = Accelerator(cpu=True)
    accelerator.prepare(torch.nn.Linear(2, 2))
    calls = []
    monkeypatch.setattr(checkpoint, "release_cached_gpu_memory", lambda: calls.append("release"))
    save_state = accelerator.save_state
    monkeypatch.setattr(accelerator, "save_state", lambda path: (calls.append("save"), save_state(path))[1])
    saved = checkpoint.save_checkpoint(accelerator, tmp_path, checkpoint.TrainState(step=3), keep=2)
    assert calls == ["release", "save"]
    assert (saved / MARKER).exists()


def test_the_cache_is_released_only_when_the_saves_object_collectives_run_over_nccl(tmp_path, monkeypatch):
    """Over gloo (train.cpu_object_collectives, the default) the save takes no GPU memory, and a release
    would only make the allocator grow again after it. The GPU is faked (none here); the group is real."""
    import torch.distributed as dist

    from train.engine import checkpoint

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not checkpoint.object_collectives_on_gpu()  # no process group: nothing to release for
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert not checkpoint.object_collectives_on_gpu()
        assert "gloo" in dist.Backend("cuda:nccl,cpu:gloo")  # the mixed group's name, as get_backend gives it
        monkeypatch.setattr(dist, "get_backend", lambda group=None: dist.Backend("nccl"))
        assert checkpoint.object_collectives_on_gpu()
    finally:
        dist.destroy_process_group()


def test_the_background_write_is_a_snapshot_of_the_staged_step(tmp_path):
    """train/persist/snapshot.py in one process: what the thread writes is the state as staged, whatever the
    training changes after; a second stage waits for the write; a failed write is this rank's error."""
    import torch.distributed.checkpoint as dcp

    from train.persist.snapshot import SnapshotWriter, tensor_bytes, unstageable_tensor

    class Wrapped(torch.Tensor):  # as QLoRA's NF4 weights are: staged synchronously instead (Checkpointer)
        pass

    weight = torch.arange(6, dtype=torch.float32)
    assert unstageable_tensor({"a": [weight, torch.nn.Parameter(weight)]}) == ""
    assert unstageable_tensor({"a": {"b": torch.zeros(2).as_subclass(Wrapped)}}) == "Wrapped"
    writer = SnapshotWriter(timeout=None)
    staged = writer.stage({"model": {"weight": weight}})
    assert tensor_bytes(staged) == 24 and staged["model"]["weight"].data_ptr() != weight.data_ptr()
    release = __import__("threading").Event()
    writer.submit([(staged["model"], tmp_path / "model")], after=release.wait)
    weight.add_(100)  # the next optimizer step, while the write is in flight
    try:
        writer.stage({"model": {"weight": weight}})
        raise AssertionError("a second stage while a write is in flight must be refused")
    except RuntimeError as err:
        assert "in flight" in str(err)
    assert not writer.all_finished(group=None)
    release.set()
    assert writer.wait() is None and writer.all_finished(group=None)
    loaded = {"weight": torch.zeros(6)}
    dcp.load(loaded, checkpoint_id=str(tmp_path / "model"))
    assert torch.equal(loaded["weight"], torch.arange(6, dtype=torch.float32))

    # The staged write's threads: this rank's tensors split by size over as many files, read back as one state.
    from train.persist.snapshot import STAGED_WRITE_THREADS

    state = {f"w{i}": torch.randn(i + 1, 3) for i in range(7)}
    writer.submit([(writer.stage(state), tmp_path / "threads")], after=lambda: None)
    assert writer.wait() is None
    files = sorted(p.name for p in (tmp_path / "threads").glob("*.distcp"))
    assert STAGED_WRITE_THREADS > 1 and files == [f"__0_{i}.distcp" for i in range(STAGED_WRITE_THREADS)]
    loaded = {name: torch.zeros_like(tensor) for name, tensor in state.items()}
    dcp.load(loaded, checkpoint_id=str(tmp_path / "threads"))
    assert all(torch.equal(loaded[name], state[name]) for name in state)

    (tmp_path / "blocked").write_text("a file where the folder should be")
    writer.submit([(writer.stage({"weight": weight}), tmp_path / "blocked")], after=lambda: None)
    assert writer.wait() is not None  # the error comes back to the caller, who removes the partial save
    writer.close()


def test_node_local_staging_folder_and_durable_copy(tmp_path, monkeypatch):
    """train/persist/staging.py: where a disk-staged save goes ($SLURM_TMPDIR by default, $VARS expanded on the node,
    one folder per run), and the background copy: every file to the same place under the target, the source removed."""
    import tempfile

    from train.persist.staging import copy_durable, node_local_root, run_staging_dir

    monkeypatch.delenv("SLURM_TMPDIR", raising=False)
    assert node_local_root("") == Path(tempfile.gettempdir())
    monkeypatch.setenv("SLURM_TMPDIR", str(tmp_path / "job"))
    assert node_local_root("") == tmp_path / "job"
    assert node_local_root("$SLURM_TMPDIR/mine") == tmp_path / "job" / "mine"
    one, two = run_staging_dir(tmp_path, tmp_path / "a" / "checkpoints"), run_staging_dir(tmp_path, tmp_path / "b")
    assert one != two and one == run_staging_dir(tmp_path, tmp_path / "a" / ".." / "a" / "checkpoints")

    source, target = tmp_path / "staged" / ".tmp-step-00000005", tmp_path / "shared" / ".tmp-step-00000005"
    (source / "optimizer_0").mkdir(parents=True)
    (source / "optimizer_0" / "__1_0.distcp").write_bytes(b"x" * 1000)
    (source / "optimizer_0" / ".metadata").write_bytes(b"meta")
    (target / "optimizer_0").mkdir(parents=True)
    (target / "optimizer_0" / "__0_0.distcp").write_bytes(b"another rank's")  # the other ranks' copies stay
    copied: list[str] = []
    assert copy_durable(source, target, lambda path: copied.append(path.name)) == 1004
    assert sorted(copied) == [".metadata", "__1_0.distcp"] and not source.exists()
    assert (target / "optimizer_0" / "__1_0.distcp").read_bytes() == b"x" * 1000
    assert (target / "optimizer_0" / "__0_0.distcp").read_bytes() == b"another rank's"


def test_cpu_stager_reuses_its_buffers_and_keeps_dtensor_layout(tmp_path, monkeypatch):
    """The stager of asynchronous saves: the second stage copies into the first one's buffers (torch's
    DefaultStager failed at its second pinned stage on the GPU image), a DTensor comes back as a DTensor
    of the same spec over a CPU shard, and the rebuilt containers are not the live ones."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    from train.persist.snapshot import CpuStager

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29581")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        weight = distribute_tensor(torch.arange(8, dtype=torch.float32).reshape(4, 2), mesh, [Shard(0)])
        groups = [{"lr": 1e-4, "params": ["weight"]}]
        state = {"model": {"weight": weight, "step": torch.tensor(3)}, "param_groups": groups}
        stager = CpuStager(pin=False)
        first = stager.stage(state)
        staged = first["model"]["weight"]
        assert isinstance(staged, DTensor) and staged.placements == weight.placements
        assert staged.to_local().data_ptr() != weight.to_local().data_ptr()
        groups[0]["lr"] = 5e-5  # the scheduler, while the thread writes
        assert first["param_groups"][0]["lr"] == 1e-4
        with torch.no_grad():
            weight.to_local().add_(1)
        second = stager.stage(state)
        assert second["model"]["weight"].to_local().data_ptr() == staged.to_local().data_ptr()
        assert torch.equal(second["model"]["weight"].to_local(), weight.to_local())
        dcp.save({"weight": second["model"]["weight"]}, checkpoint_id=str(tmp_path / "ckpt"))
        loaded = {"weight": distribute_tensor(torch.zeros(4, 2), mesh, [Shard(0)])}
        dcp.load(loaded, checkpoint_id=str(tmp_path / "ckpt"))
        assert torch.equal(loaded["weight"].to_local(), weight.to_local())
        stager.close()
    finally:
        dist.destroy_process_group()


def test_cpu_stager_gives_each_tensor_a_storage_of_its_own_bytes():
    """DCP's writer clones a tensor whose storage is larger than the tensor (its _SerialCpuLoader): staged views of
    one flat buffer were each cloned again in the writer thread, which wrote at 0.2 GB/s on one H100. Each staged
    tensor owns exactly its bytes (of the one flat allocation), so the writer writes them as they are."""
    from torch.distributed.checkpoint.filesystem import _SerialCpuLoader

    from train.persist.snapshot import CpuStager

    state = {"w": torch.randn(3, 5), "moments": [torch.zeros(0), torch.tensor(3.0), torch.randn(7, dtype=torch.bfloat16)]}
    stager = CpuStager(pin=False)
    staged = stager.stage(state)
    tensors = [staged["w"], *staged["moments"]]
    assert [t.untyped_storage().size() for t in tensors] == [t.nbytes for t in tensors]
    assert all(torch.equal(s, t) for s, t in zip(tensors, [state["w"], *state["moments"]], strict=True))
    loader = _SerialCpuLoader(lambda item: item)
    loader.add(staged["w"].nbytes, staged["w"])
    loader.start_loading()
    (written, _), = loader.values()
    assert written.data_ptr() == staged["w"].data_ptr()  # not a clone
    stager.close()


def test_cpu_stager_prepares_its_buffers_beside_training():
    """`prepare` allocates the buffers in a background thread (at the run's first step boundary), so the first
    `stage` only copies into them: allocating and pinning 25.7 GB had paused the first save 10 s on one H100."""
    from train.persist.snapshot import CpuStager

    state = {"w": torch.randn(4, 4), "step": torch.tensor(1.0)}
    stager = CpuStager(pin=False)
    stager.prepare(state)
    stager._preparing.join()
    prepared = stager._views[0].data_ptr()
    staged = stager.stage(state)
    assert staged["w"].data_ptr() == prepared and torch.equal(staged["w"], state["w"])
    stager.close()


def test_pin_groups_cover_every_tensor_once_in_order_within_the_cap():
    """The staging buffers are registered with CUDA one group of whole tensors at a time (each registration holds the
    driver's lock that training's CUDA calls wait for): consecutive groups, every tensor in exactly one, each group at
    most the cap unless a single tensor is larger."""
    import random

    from train.persist.snapshot import pin_groups

    assert pin_groups([], 100) == []
    assert pin_groups([40, 60, 1, 250, 0, 98, 2], 100) == [range(0, 2), range(2, 3), range(3, 4), range(4, 7)]
    rng = random.Random(0)
    for _ in range(200):
        sizes = [rng.choice([0, 1, 512, rng.randrange(1, 3000)]) for _ in range(rng.randrange(0, 40))]
        cap = rng.randrange(1, 2000)
        groups = pin_groups(sizes, cap)
        assert [i for group in groups for i in group] == list(range(len(sizes)))
        assert all(len(group) > 0 for group in groups)
        for group in groups:
            assert sum(sizes[i] for i in group) <= cap or len(group) == 1
        for before, after in zip(groups, groups[1:]):  # a group closes only when the next tensor would not fit
            assert sum(sizes[i] for i in before) + sizes[after[0]] > cap


def test_staging_layout_puts_each_tensor_inside_one_page_aligned_registered_range():
    from train.persist.snapshot import staging_layout

    sizes = [3000, 0, 100, 5000, 512, 7, 4096, 0]
    offsets, ranges, total = staging_layout(sizes, align=512, page=4096, cap=4096)
    assert all(offset % 512 == 0 for offset in offsets)
    assert all(start % 4096 == 0 and length > 0 for start, length in ranges)
    for (start, length), (next_start, _) in zip(ranges, ranges[1:]):
        assert start + length <= next_start  # no two ranges share a page: each starts at a page boundary
    assert ranges[-1][0] + ranges[-1][1] == total
    for offset, size in zip(offsets, sizes, strict=True):
        holding = [r for r in ranges if r[0] <= offset and offset + size <= r[0] + r[1]]
        assert size == 0 or len(holding) == 1, (offset, size, ranges)
    slots = sorted(zip(offsets, sizes))
    assert all(a + size <= b for (a, size), (b, _) in zip(slots, slots[1:]))  # no two tensors overlap
    assert staging_layout([0], 512, 4096, 4096) == ([0], [], 0)


def test_cpu_stager_views_stay_right_across_several_registration_groups(monkeypatch):
    """With a small group cap the flat buffer holds several page-aligned groups: each staged tensor still owns exactly
    its bytes (no clone in DCP's writer) and holds the live values; each group's first tensor starts on a page."""
    import mmap

    from train.persist import snapshot

    monkeypatch.setattr(snapshot, "PIN_GROUP_BYTES", 3000)
    state = {"a": torch.randn(300), "b": [torch.randn(5, 7), torch.zeros(0), torch.randn(2000, dtype=torch.bfloat16)],
             "c": torch.tensor(4.0)}
    stager = snapshot.CpuStager(pin=False)
    staged = stager.stage(state)
    live, copies = [state["a"], *state["b"], state["c"]], [staged["a"], *staged["b"], staged["c"]]
    assert all(torch.equal(s, t) for s, t in zip(copies, live, strict=True))
    assert all(s.data_ptr() != t.data_ptr() for s, t in zip(copies, live, strict=True) if t.numel())
    assert [t.untyped_storage().size() for t in copies] == [t.nbytes for t in copies]
    assert all(copies[i].data_ptr() % mmap.PAGESIZE == 0 for i in (0, 3, 4))  # the 3 groups' first tensors
    state["a"].add_(1)
    assert torch.equal(stager.stage(state)["a"], state["a"])
    stager.close()
