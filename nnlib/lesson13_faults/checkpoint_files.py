"""Checkpoint files: what a checkpoint holds, its file format, and the folder that keeps a run's newest ones.

A :class:`Checkpoint` holds the run's ``state`` as its sync's ``state_dict`` gives it, whole ({"network": {"params":
(num_params,), ...}, "optimizer": {"velocity", or "m" and "v": (num_params,), "steps": t}}); the epoch in progress
and the ``step`` s done in it; ``rng_state``, the shuffling's state as that epoch began (the resumed run draws the
same order and skips the steps done); ``partial``, the epoch's [summed loss, correct] so far, all ranks; the
finished epochs' ``history``; the ``settings`` a resume must match (epochs may grow); the ``ranks`` that wrote it (a
resume may use another number: P ranks take exactly the sequential steps) and ``total_steps``.

The file: an 8-byte magic ``NNLIBCKP``, the format version (uint32), the payload's length (uint64) and its SHA-256,
then the payload (an .npz of the state's arrays, "network/params" and so on, and a JSON of the rest), written whole or
not at all (atomic_write, flushed to disk). A damaged, truncated, foreign or other-version file raises
:class:`CheckpointError` before anything is used.
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

LESSON = 13

MAGIC = b"NNLIBCKP"
FORMAT_VERSION = 2  # (1: SGD's velocity only)
HEADER = struct.Struct("<8sIQ32s")  # magic, version, payload length, SHA-256 of the payload
SUFFIX = ".nnlib-checkpoint"


class CheckpointError(ValueError):
    """A checkpoint cannot be used or written; the message says which file, why, and what to do."""


@dataclass
class Checkpoint:
    state: dict
    epoch: int
    step: int
    rng_state: dict | None
    partial: list
    history: dict
    settings: dict
    ranks: int
    total_steps: int
    path: Path | None = field(default=None, compare=False)


def to_bytes(checkpoint: Checkpoint) -> bytes:
    """The file's bytes: header (magic, version, length, SHA-256), then the .npz payload."""
    meta = {f.name: getattr(checkpoint, f.name) for f in fields(Checkpoint) if f.name not in ("state", "path")}
    arrays, meta["state"] = {}, {part: {} for part in checkpoint.state}
    for part, values in checkpoint.state.items():
        for name, value in (values or {}).items():
            if np.ndim(value):  # an array: into the .npz (from a GPU: to the host)
                arrays[f"{part}/{name}"] = to_numpy(value)
            else:
                meta["state"][part][name] = value.item() if hasattr(value, "item") else value
    payload = io.BytesIO()
    np.savez(payload, **arrays, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))
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
        for key in arrays.files:
            if key != "meta":
                part, name = key.split("/")
                meta["state"][part][name] = arrays[key].copy()
    return Checkpoint(**meta)


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
    """Where a run keeps its checkpoints: ``every`` steps (None: at the end of every epoch), the newest ``keep``,
    named by the steps done (``step-00000120.nnlib-checkpoint``), so the newest sorts last."""

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
