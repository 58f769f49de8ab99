"""nnlib.lesson13_faults.checkpoint: the file format, every way a checkpoint can be bad, and an exact resume.

The training tests run train_parallel in this process on MPI.COMM_WORLD (one rank); the batch
job's kill-and-resume across ranks is in test_train_command.py.
"""

import contextlib
import os
import subprocess

import numpy as np
import pytest

from nnlib import Network
from nnlib.lesson13_faults.checkpoint import (FORMAT_VERSION, HEADER, MAGIC, SUFFIX, Checkpoint, CheckpointError,
                                              CheckpointFolder, from_bytes, load, save, to_bytes)

N = 203
SETTINGS = dict(epochs=3, learning_rate=0.5, batch_size=16, momentum=0.9, seed=4)


def example(params=np.arange(5.0), optimizer=None, **changes) -> Checkpoint:
    state = dict(network=dict(params=params, loss_scale=2.0 ** 15),
                 optimizer=dict(m=np.ones(5), v=np.full(5, 0.5), steps=7) if optimizer is None else optimizer)
    fields = dict(state=state, epoch=1, step=3,
                  rng_state={"bit_generator": "PCG64", "state": {"state": 2**100 + 7, "inc": 5}},
                  partial=[1.5, 7.0], history={"loss": [0.9], "train_accuracy": [0.5], "validation_accuracy": [],
                                               "seconds": [0.1]},
                  settings={"layer_sizes": [3, 2], "dtype": "float64"}, ranks=2, total_steps=17)
    fields.update(changes)
    return Checkpoint(**fields)


def same(first: Checkpoint, second: Checkpoint) -> bool:
    """Every field equal (the state's arrays exactly, with their dtype; its numbers with their type), the path aside."""
    for part in ("network", "optimizer"):
        a, b = first.state[part], second.state[part]
        if set(a) != set(b) or any(type(a[name]) is not type(b[name]) for name in a):
            return False
        if not all(np.array_equal(a[name], b[name]) and np.asarray(a[name]).dtype == np.asarray(b[name]).dtype
                   for name in a):
            return False
    names = ("epoch", "step", "rng_state", "partial", "history", "settings", "ranks", "total_steps")
    return all(getattr(first, name) == getattr(second, name) for name in names)


def test_same_can_fail():
    assert same(example(), example())
    assert not same(example(), example(params=np.arange(5.0, dtype=np.float32)))
    assert not same(example(), example(optimizer=dict(velocity=np.ones(5), steps=7)))
    assert not same(example(), example(total_steps=18))


def test_a_checkpoint_round_trips_exactly(tmp_path):
    original = example()
    size = save(tmp_path / "a", original)
    assert size == (tmp_path / "a").stat().st_size
    again = load(tmp_path / "a")
    assert same(again, original)  # every field, the rng state's 100-bit integer included
    assert again.path == tmp_path / "a"
    assert load(tmp_path / "a").state["optimizer"]["steps"] == 7  # Adam's step count, an int again
    plain = example(optimizer=dict(steps=3))  # SGD without momentum: no arrays
    save(tmp_path / "b", plain)
    assert same(load(tmp_path / "b"), plain)
    assert [path.name for path in tmp_path.iterdir()] in (["a", "b"], ["b", "a"])  # no temporary file left


@pytest.mark.parametrize("damage, message", [
    (lambda raw: raw[: len(raw) // 2], "is truncated"),
    (lambda raw: raw[:-1], "is truncated"),
    (lambda raw: raw[:100] + bytes([raw[100] ^ 1]) + raw[101:], "is damaged: its SHA-256 does not match"),
    (lambda raw: b"", "is not an nnlib checkpoint"),
    (lambda raw: b"PK\x03\x04" + raw[4:], "is not an nnlib checkpoint"),
    (lambda raw: HEADER.pack(MAGIC, FORMAT_VERSION + 1, 0, bytes(32)), f"this nnlib reads version {FORMAT_VERSION}"),
])
def test_a_bad_checkpoint_is_refused_with_a_clear_error(damage, message):
    with pytest.raises(CheckpointError, match=message):
        from_bytes(damage(to_bytes(example())))


def test_a_foreign_npz_file_is_refused(tmp_path):
    np.savez(tmp_path / "weights.npz", params=np.zeros(3))
    with pytest.raises(CheckpointError, match="weights.npz is not an nnlib checkpoint"):
        load(tmp_path / "weights.npz")


def test_the_folder_resumes_from_the_newest_and_keeps_two(tmp_path):
    folder = CheckpointFolder(tmp_path / "run", every=5)
    with pytest.raises(CheckpointError, match="does not exist"):
        folder.latest()
    folder.prepare()
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        folder.latest()
    for steps in (5, 10, 15):
        folder.write(example(total_steps=steps))
    assert [path.name for path in folder.files()] == [f"step-{steps:08d}{SUFFIX}" for steps in (10, 15)]
    (folder.folder / f"step-00000020{SUFFIX}.abc123.part").write_bytes(b"half a file")  # a killed write's leftover
    assert folder.latest().total_steps == 15
    newest = folder.files()[-1]
    newest.write_bytes(newest.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=f"is truncated.*The one before it is step-00000010{SUFFIX}"):
        folder.latest()


def test_an_interrupted_write_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch):
    folder = CheckpointFolder(tmp_path)
    folder.write(example(total_steps=4))

    def crash(descriptor):
        raise KeyboardInterrupt  # the process is stopped in the middle of writing

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(KeyboardInterrupt):
        folder.write(example(total_steps=8))
    monkeypatch.undo()
    assert [path.name for path in tmp_path.iterdir()] == [f"step-00000004{SUFFIX}"]
    assert same(folder.latest(), example(total_steps=4))


@pytest.mark.parametrize("every", [0, -3, 2.5, True])
def test_a_bad_interval_is_refused(every, tmp_path):
    with pytest.raises(ValueError, match="checkpoint interval must be a positive number of steps"):
        CheckpointFolder(tmp_path, every=every)


@contextlib.contextmanager
def mounted(folder, options):
    """A tmpfs mounted at ``folder`` with ``options`` (root only); unmounted afterwards, even on failure."""
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def can_mount() -> tuple[bool, str]:
    """(True, '') where this process can mount a tmpfs (root, and a kernel that lets it), else (False, why)."""
    import tempfile

    if os.geteuid() != 0:
        return False, "needs root to mount a small or read-only tmpfs"
    with tempfile.TemporaryDirectory() as folder:
        made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", folder], capture_output=True, text=True)
        subprocess.run(["umount", folder], capture_output=True)
    return (True, "") if made.returncode == 0 else (False, f"cannot mount a tmpfs here: {made.stderr.strip()}")


needs_root = pytest.mark.skipif(not can_mount()[0], reason=can_mount()[1])


@needs_root
def test_a_read_only_folder_is_refused_before_training(tmp_path):
    with mounted(tmp_path / "ro", "ro,size=1m") as folder:
        with pytest.raises(CheckpointError, match="cannot write checkpoints into .*Read-only file system"):
            CheckpointFolder(folder).prepare()


@needs_root
def test_a_full_folder_gives_a_clear_error_and_keeps_the_previous_checkpoint(tmp_path):
    with mounted(tmp_path / "full", "size=64k") as folder:
        checkpoints = CheckpointFolder(folder, keep=5)
        checkpoints.write(example(total_steps=1, params=np.zeros(6000)))  # 48 kB of 64
        with pytest.raises(CheckpointError, match="No space left on device; the previous checkpoint .*is intact"):
            checkpoints.write(example(total_steps=2, params=np.zeros(6000)))
        assert checkpoints.latest().total_steps == 1
        assert [path.name for path in folder.iterdir()] == [f"step-00000001{SUFFIX}"]


# --- training with checkpoints, one rank in this process --------------------------------------

def data(dtype="float64"):
    rng = np.random.default_rng(1)
    return rng.random((N, 9)).astype(dtype), rng.integers(0, 3, N)


def train_one_rank(checkpoints=None, resume=False, fail_at=None, dtype="float64", sizes=(9, 6, 3), **changes):
    from mpi4py import MPI

    from nnlib.lesson06_data_parallel import train_parallel
    from nnlib.lesson13_faults.checkpoint import Checkpointing

    inputs, labels = data(dtype)
    network = Network(sizes, dtype=dtype, seed=2)

    def on_step(epoch, step, total_steps):
        if total_steps == fail_at:
            raise RuntimeError("stopped on purpose")

    hooks = [] if checkpoints is None and not resume else [Checkpointing(checkpoints, resume)]
    history = train_parallel(MPI.COMM_WORLD, network, inputs, labels, num_samples=N, start=0,
                             hooks=hooks, on_step=on_step, **dict(SETTINGS, **changes))
    return network, history


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("every", [None, 5])
def test_a_resumed_run_is_bit_identical_to_an_uninterrupted_one(tmp_path, dtype, every):
    expected, expected_history = train_one_rank(dtype=dtype)
    folder = CheckpointFolder(tmp_path, every=every)
    with pytest.raises(RuntimeError, match="stopped on purpose"):
        train_one_rank(folder, fail_at=31, dtype=dtype)  # mid second epoch (13 steps per epoch)
    resumed, history = train_one_rank(folder, resume=True, dtype=dtype)
    assert np.array_equal(resumed.params, expected.params)
    assert history.loss == pytest.approx(expected_history.loss, rel=1e-12)
    assert len(history.loss) == 3 and len(history.seconds) == 3


def test_resume_refuses_another_network_or_other_settings(tmp_path):
    folder = CheckpointFolder(tmp_path)
    train_one_rank(folder, epochs=1)
    with pytest.raises(ValueError, match=r"layer_sizes: the checkpoint has \[9, 6, 3\], this run \[9, 4, 3\]"):
        train_one_rank(folder, resume=True, sizes=(9, 4, 3))
    with pytest.raises(ValueError, match="momentum: the checkpoint has 0.9, this run 0.5"):
        train_one_rank(folder, resume=True, momentum=0.5)
    with pytest.raises(ValueError, match="dtype: the checkpoint has 'float64', this run 'float32'"):
        train_one_rank(folder, resume=True, dtype="float32")
    network, history = train_one_rank(folder, resume=True, epochs=2)  # more epochs: continues
    assert len(history.loss) == 2


def test_a_new_run_refuses_a_folder_with_another_runs_checkpoints(tmp_path):
    """Kept by step count, another run's later files would push out the new run's newest checkpoint."""
    folder = CheckpointFolder(tmp_path, every=5, keep=2)
    train_one_rank(folder, epochs=2)  # 26 steps: step-00000020 and step-00000025 are kept
    before = [path.name for path in folder.files()]
    with pytest.raises(ValueError, match=r"holds checkpoints already \(step-00000025.nnlib-checkpoint the newest\)"):
        train_one_rank(folder, epochs=1)
    assert [path.name for path in folder.files()] == before  # nothing written, nothing removed
    network, history = train_one_rank(folder, resume=True, epochs=3)  # resuming it is what the folder is for
    assert len(history.loss) == 3


def test_resume_without_a_checkpoint_says_so(tmp_path):
    with pytest.raises(ValueError, match="holds no checkpoint"):
        train_one_rank(CheckpointFolder(tmp_path), resume=True)
    with pytest.raises(ValueError, match="checkpoints need a nnlib.lesson13_faults.checkpoint.CheckpointFolder; got NoneType"):
        train_one_rank(None, resume=True)


@needs_root
def test_training_into_a_full_folder_stops_with_the_write_error_and_keeps_the_last_good_checkpoint(tmp_path):
    with mounted(tmp_path / "full", "size=12k") as folder:  # room for a few checkpoints of this network
        checkpoints = CheckpointFolder(folder, every=5, keep=5)
        with pytest.raises(ValueError, match="could not write the checkpoint .*No space left on device"):
            train_one_rank(checkpoints)
        newest = checkpoints.latest()  # intact and loadable: the one written before the disk filled up
        assert newest.total_steps == 5 * len(checkpoints.sizes) and newest.total_steps >= 5
