"""Checkpoints: everything needed to continue a training run exactly where it stopped.

What a checkpoint holds (a :class:`Checkpoint`):

    params         (num_params,)  the flat parameter vector
    velocity       (num_params,)  the optimizer's momentum buffer, or None without momentum
    epoch, step    the epoch in progress (0-based) and how many of its steps are done
    rng_state      the shuffling generator's state at the *start* of that epoch, so the resumed
                   run draws the same order and skips the steps already done
    partial        [summed loss, correct predictions] of the steps done in that epoch, all ranks
    history        the finished epochs' loss, accuracies and seconds
    settings       network and training settings; a resume must match them (epochs may grow)
    ranks          how many ranks wrote it (a resume may use another number: P ranks take exactly
                   the sequential steps)
    total_steps    steps done since the run began
    extra          what the network keeps beyond its weights (its ``checkpoint_state()``, e.g. lesson 12's
                   loss scale), restored with its ``restore_checkpoint_state``; {} for most networks

The learning-rate schedule's position is epoch + step / steps_per_epoch, so it is restored too.

The file: an 8-byte magic ``NNLIBCKP``, the format version (uint32), the payload's length (uint64)
and its SHA-256, then the payload (an .npz with the arrays and a JSON of the rest). It is written
to a temporary file, flushed to disk, then renamed (nnlib.lesson01_mnist.files.atomic_write), so a crash during a
write leaves the previous checkpoint as it was. A damaged, truncated, foreign or other-version file
raises :class:`CheckpointError` before anything is used.

:class:`CheckpointFolder` keeps the newest ``keep`` checkpoints of a run in one folder;
:class:`Checkpointing` is the hook that writes them from a training run and resumes it::

    train_parallel(comm, ..., hooks=[Checkpointing(CheckpointFolder(folder, every=50), resume=True)])
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from nnlib.lesson01_mnist.files import atomic_write
from nnlib.lesson02_network.arrays import to_numpy
from nnlib.lesson03_training.training import Hook
from nnlib.lesson04_collectives.collectives import broadcast_new, fail_together

LESSON = 10


MAGIC = b"NNLIBCKP"
FORMAT_VERSION = 1
HEADER = struct.Struct("<8sIQ32s")  # magic, version, payload length, SHA-256 of the payload
SUFFIX = ".nnlib-checkpoint"


class CheckpointError(ValueError):
    """A checkpoint cannot be used or written; the message says which file, why, and what to do."""


@dataclass
class Checkpoint:
    params: np.ndarray
    velocity: np.ndarray | None
    epoch: int
    step: int
    rng_state: dict | None
    partial: list
    history: dict
    settings: dict
    ranks: int
    total_steps: int
    extra: dict = field(default_factory=dict)
    path: Path | None = field(default=None, compare=False)


def meta_of(checkpoint: Checkpoint) -> dict:
    """Everything in ``checkpoint`` but its arrays and its path (the JSON part of the file)."""
    arrays = ("params", "velocity", "path")
    return {f.name: getattr(checkpoint, f.name) for f in fields(Checkpoint) if f.name not in arrays}


def to_bytes(checkpoint: Checkpoint) -> bytes:
    """The file's bytes: header (magic, version, length, SHA-256), then the .npz payload."""
    meta = dict(meta_of(checkpoint), partial=[float(value) for value in checkpoint.partial])
    arrays = dict(params=checkpoint.params, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))
    if checkpoint.velocity is not None:
        arrays["velocity"] = checkpoint.velocity
    payload = io.BytesIO()
    np.savez(payload, **arrays)
    payload = payload.getvalue()
    return HEADER.pack(MAGIC, FORMAT_VERSION, len(payload), hashlib.sha256(payload).digest()) + payload


def from_bytes(raw: bytes, name="the checkpoint") -> Checkpoint:
    """Check and decode a checkpoint's bytes; raise CheckpointError if anything is wrong."""
    if len(raw) < HEADER.size or not raw.startswith(MAGIC):
        raise CheckpointError(f"{name} is not an nnlib checkpoint (it does not begin with {MAGIC.decode()}). "
                              "Pass a file written by nnlib, or start without --resume.")
    magic, version, length, digest = HEADER.unpack_from(raw)
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{name} has checkpoint format version {version}; this nnlib reads version "
                              f"{FORMAT_VERSION}. Resume with the nnlib that wrote it, or start afresh.")
    payload = raw[HEADER.size:]
    if len(payload) != length:
        raise CheckpointError(f"{name} is truncated: {len(payload)} of its {length} bytes are there (was its "
                              "write cut off?). Delete it to resume from the checkpoint before it.")
    if hashlib.sha256(payload).digest() != digest:
        raise CheckpointError(f"{name} is damaged: its SHA-256 does not match the one written with it. "
                              "Delete it to resume from the checkpoint before it.")
    with np.load(io.BytesIO(payload), allow_pickle=False) as arrays:
        meta = json.loads(arrays["meta"].tobytes().decode())
        velocity = arrays["velocity"].copy() if "velocity" in arrays.files else None
        return Checkpoint(params=arrays["params"].copy(), velocity=velocity, **meta)


def save(path, checkpoint: Checkpoint) -> int:
    """Write ``checkpoint`` to ``path`` atomically and flushed to disk; return its size in bytes."""
    raw = to_bytes(checkpoint)
    with atomic_write(path) as stream:
        stream.write(raw)
        stream.flush()
        os.fsync(stream.fileno())
    return len(raw)


def load(path) -> Checkpoint:
    """Read and check one checkpoint file (CheckpointError if it is unusable)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise CheckpointError(f"cannot read the checkpoint {path}: {error.strerror or error}") from None
    checkpoint = from_bytes(raw, name=str(path))
    checkpoint.path = path
    return checkpoint


class CheckpointFolder:
    """Where a run keeps its checkpoints: ``every`` steps (None: at the end of every epoch), the newest ``keep``.

    Files are named ``step-00000120.nnlib-checkpoint`` by the steps done, so the newest sorts last.
    """

    def __init__(self, folder, every: int | None = None, keep: int = 2):
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise ValueError(f"checkpoint interval must be a positive number of steps (or None: once per epoch); "
                             f"got {every!r}")
        if not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be at least 1; got {keep!r}")
        self.folder, self.every, self.keep = Path(folder).expanduser(), every, keep
        self.sizes, self.seconds = [], []  # of each write, for measuring their cost

    def prepare(self) -> None:
        """Create the folder if needed and check that a file can be written there (CheckpointError if not)."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with atomic_write(self.folder / ".write-test") as stream:
                stream.write(b"ok")
            (self.folder / ".write-test").unlink()
        except OSError as error:
            raise CheckpointError(f"cannot write checkpoints into {self.folder}: {error.strerror or error}. "
                                  "Choose another folder (--checkpoint-dir) or make this one writable.") from None

    def files(self) -> list[Path]:
        """This folder's checkpoint files, oldest first."""
        return sorted(self.folder.glob(f"step-*{SUFFIX}")) if self.folder.is_dir() else []

    def latest(self) -> Checkpoint:
        """The newest checkpoint here, checked; CheckpointError if there is none or it is unusable."""
        files = self.files()
        if not files:
            why = f"holds no checkpoint (*{SUFFIX})" if self.folder.is_dir() else "does not exist"
            raise CheckpointError(f"nothing to resume: the checkpoint folder {self.folder} {why}. "
                                  "Start without resuming, or point to the folder the earlier run wrote.")
        try:
            return load(files[-1])
        except CheckpointError as error:
            older = f" The one before it is {files[-2].name}." if len(files) > 1 else ""
            raise CheckpointError(f"{error}{older}") from None

    def due(self, total_steps: int, end_of_epoch: bool) -> bool:
        """Whether a checkpoint is due after ``total_steps`` steps."""
        return end_of_epoch if self.every is None else total_steps % self.every == 0

    def write(self, checkpoint: Checkpoint) -> Path:
        """Save ``checkpoint`` (atomically), then remove all but the newest ``keep``; return its path."""
        path = self.folder / f"step-{checkpoint.total_steps:08d}{SUFFIX}"
        began = time.perf_counter()
        try:
            self.sizes.append(save(path, checkpoint))
        except OSError as error:
            previous = self.files()
            kept = f"; the previous checkpoint {previous[-1]} is intact" if previous else ""
            raise CheckpointError(f"could not write the checkpoint {path}: {error.strerror or error}{kept}. "
                                  "Free some space or choose another --checkpoint-dir, then resume.") from None
        self.seconds.append(time.perf_counter() - began)
        for old in self.files()[:-self.keep]:
            old.unlink(missing_ok=True)
        return path


HISTORY_FIELDS = ("loss", "train_accuracy", "validation_accuracy", "seconds")  # what a checkpoint keeps


def run_settings(run) -> dict:
    """What a checkpoint must match to be resumed: the network and the training settings."""
    network, settings = run.network, run.settings
    found = dict(layer_sizes=list(network.layer_sizes), output=network.output, dtype=str(network.params.dtype),
                 num_samples=int(run.plan.num_samples),
                 batch_size=None if settings.batch_size is None else int(settings.batch_size),
                 momentum=float(settings.momentum), seed=int(settings.seed),
                 learning_rate="a schedule" if callable(settings.learning_rate) else float(settings.learning_rate))
    if getattr(run.plan, "name", "exact") != "exact":  # (exact runs, the default, keep their earlier settings)
        found["sampler"] = run.plan.name
    if getattr(run.sync, "compression", "none") != "none":
        found["compression"] = run.sync.compression
    if getattr(network, "precision", "float32") != "float32":  # (lesson 12's mixed precision)
        found["precision"] = network.precision
    return found


class Checkpointing(Hook):
    """Writes checkpoints of a data-parallel training run, and resumes one, as a hook of its loop.

    folder: a :class:`CheckpointFolder`; resume: continue from the newest checkpoint there, exactly
    (with the same number of ranks, bit-identical to an uninterrupted run). It talks over the run's own
    communicator (its sync's: under the run's deadline, if it has one): rank 0 writes, and every rank
    learns together whether that worked.
    """

    def __init__(self, folder: CheckpointFolder, resume: bool = False, progress: bool = False):
        self.folder, self.resume, self.progress, self.comm = folder, resume, progress, None
        self.epoch_rng_state = None  # the plan's random state as this epoch began

    def begin(self, run) -> None:
        self.comm = run.sync.comm
        problem, saved = None, None
        if not isinstance(self.folder, CheckpointFolder):
            problem = f"checkpoints need a nnlib.lesson10_faults.checkpoint.CheckpointFolder; got {type(self.folder).__name__}"
        elif getattr(run.sync, "kept_between_steps", None):  # (lesson 11's top-k, PowerSGD, local SGD)
            problem = f"checkpoints do not keep {run.sync.kept_between_steps}: run it without checkpoints"
        elif run.settings.optimizer != "sgd":
            problem = f"checkpoints keep SGD's velocity, not {run.settings.optimizer}'s moments: use SGD, or none"
        elif self.comm.rank == 0 and not self.resume and self.folder.files():  # (kept by step count, another
            # run's later files could push out this run's newest, and a later resume would pick up the other run)
            problem = (f"{self.folder} holds checkpoints already ({self.folder.files()[-1].name} the newest): resume "
                       "that run (resume=True, --resume), or give this run an empty folder.")
        elif self.comm.rank == 0:
            try:
                saved = self.newest(run) if self.resume else None
                self.folder.prepare()
            except CheckpointError as error:
                problem = str(error)
        fail_together(self.comm, problem)
        if self.resume:
            self.restore(run, saved)

    def newest(self, run) -> Checkpoint:
        """Rank 0: the newest checkpoint, checked against this run (CheckpointError if it does not fit)."""
        saved, current = self.folder.latest(), run_settings(run)
        differences = [f"{key}: the checkpoint has {saved.settings.get(key)!r}, this run {current.get(key)!r}"
                       for key in sorted(set(saved.settings) | set(current))  # (epochs may grow)
                       if key != "epochs" and saved.settings.get(key) != current.get(key)]
        if differences:
            raise CheckpointError(f"{saved.path} was written by another run; " + "; ".join(differences)
                                  + ". Resume with the same settings, or use another checkpoint folder.")
        if saved.epoch > run.settings.epochs or (saved.epoch == run.settings.epochs and saved.step > 0):
            raise CheckpointError(f"{saved.path} is at epoch {saved.epoch + 1}, beyond this run's "
                                  f"{run.settings.epochs} epochs; ask for more epochs to continue it.")
        return saved

    def restore(self, run, saved) -> None:
        """Put the run where the checkpoint was: parameters (rank 0, whose run's start broadcasts them; a sharded
        network's are broadcast here and every rank keeps its chunks), velocity, position, the shuffling's
        state, the history, the epoch's partial sums and the network's extra state (a loss scale)."""
        rank = self.comm.rank
        small = None if saved is None else dict(meta_of(saved), velocity=saved.velocity is not None)
        small = self.comm.bcast(small, root=0)
        dtype = to_numpy(run.network.params[:1]).dtype
        if hasattr(run.network, "load_full_params"):  # sharded: every rank keeps its chunks of the whole
            run.network.load_full_params(broadcast_new(self.comm, saved.params.astype(dtype) if rank == 0 else None))
        elif rank == 0:
            run.network.params[...] = run.network.xp.asarray(saved.params)
        if small["extra"]:
            run.network.restore_checkpoint_state(small["extra"])
        if small["velocity"] and run.settings.momentum:
            velocity = broadcast_new(self.comm, saved.velocity.astype(dtype) if rank == 0 else None)
            if getattr(run.sync, "sharded", False):
                run.sync.load_velocity(run.optimizer, velocity)  # its own slice
            elif run.optimizer is not None:  # (None: a rank not updating)
                run.optimizer.load_state_dict(dict(velocity=velocity, steps=run.optimizer.steps))
        run.epoch, run.step, run.total_steps = small["epoch"], small["step"], small["total_steps"]
        if run.plan.rng is not None:
            run.plan.rng.bit_generator.state = small["rng_state"]
        for name in HISTORY_FIELDS:
            getattr(run.history, name).extend(small["history"][name])
        if run.step > 0 and rank == 0:  # the steps done before the checkpoint, summed over ranks
            run.loss_sum, run.correct_sum = small["partial"][0], int(small["partial"][1])
        if self.progress and rank == 0:
            print(f"resuming from {saved.path}: {run.total_steps} steps done (epoch {run.epoch + 1}, step "
                  f"{run.step}), written by {small['ranks']} rank{'s' if small['ranks'] > 1 else ''}", flush=True)

    def begin_epoch(self, run) -> None:
        """Keep the plan's random state as the epoch begins: a checkpoint within the epoch draws it again."""
        self.epoch_rng_state = None if run.plan.rng is None else run.plan.rng.bit_generator.state

    def after_step(self, run) -> None:
        if run.step + 1 < run.steps_in_epoch and self.folder.due(run.total_steps, False):
            self.write(run, run.epoch, run.step + 1, self.epoch_rng_state)

    def after_epoch(self, run) -> None:
        if self.folder.due(run.total_steps, True):
            self.write(run, run.epoch + 1, 0, None if run.plan.rng is None else run.plan.rng.bit_generator.state)

    def write(self, run, epoch: int, steps_done: int, rng_state) -> None:
        """Rank 0 writes where the run is; every rank learns together whether that worked."""
        if hasattr(self.comm, "at"):  # a watched communicator quotes this in its errors
            self.comm.at(phase="checkpoint")
        partial = np.array([float(run.loss_sum), float(run.correct_sum)]) if steps_done else np.zeros(2)
        if steps_done:  # mid-epoch: the totals so far, summed over ranks
            run.sync.sum_over_ranks(partial)
        if getattr(run.sync, "sharded", False):  # ZeRO's or FSDP's: gathered from every rank's slice
            velocity = run.sync.full_velocity(run.optimizer)
        else:  # the whole momentum vector on rank 0 (None without momentum)
            mine = self.comm.rank == 0 and "velocity" in run.optimizer.state
            velocity = to_numpy(run.optimizer.state["velocity"]) if mine else None
        sharded = hasattr(run.network, "load_full_params")  # collective: every rank sends its chunks
        params = run.network.full_params() if sharded else run.network.params
        problem = None
        if self.comm.rank == 0:
            history = {name: list(getattr(run.history, name)) for name in HISTORY_FIELDS}
            extra = run.network.checkpoint_state() if hasattr(run.network, "checkpoint_state") else {}
            record = Checkpoint(params=to_numpy(params), velocity=velocity, epoch=epoch, step=steps_done,
                                rng_state=rng_state, partial=partial.tolist(), ranks=self.comm.size,
                                total_steps=run.total_steps, settings=run_settings(run), history=history, extra=extra)
            try:
                self.folder.write(record)
            except CheckpointError as error:
                problem = str(error)
        fail_together(self.comm, problem)
