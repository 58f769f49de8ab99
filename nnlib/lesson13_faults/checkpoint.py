"""Checkpoints: everything needed to continue a training run exactly where it stopped (files: checkpoint_files.py):
the run's state as its sync gives it (``state_dict(run)``: the network's and the optimizer's, whole), where the run
is, its history and the settings a resume must match. :class:`Checkpointing` is the hook that writes and resumes::

    train_parallel(comm, ..., hooks=[Checkpointing(CheckpointFolder(folder, every=50), resume=True)])
"""

from __future__ import annotations

import numpy as np

from nnlib.lesson03_training.training import Hook
from nnlib.lesson04_collectives.collectives import fail_together
from nnlib.lesson13_faults.checkpoint_files import (FORMAT_VERSION, HEADER, MAGIC, SUFFIX, Checkpoint,  # noqa: F401
                                                    CheckpointError, CheckpointFolder, from_bytes, load, save, to_bytes)

LESSON = 13

HISTORY_FIELDS = ("loss", "train_accuracy", "validation_accuracy", "seconds")  # what a checkpoint keeps


def run_settings(run) -> dict:
    """What a checkpoint must match to be resumed: the network, the optimizer and the training settings."""
    network, settings = run.network, run.settings
    found = dict(layer_sizes=list(network.layer_sizes), output=network.output, dtype=str(network.params.dtype),
                 num_samples=int(run.plan.num_samples), seed=int(settings.seed),
                 batch_size=None if settings.batch_size is None else int(settings.batch_size),
                 learning_rate="a schedule" if callable(settings.learning_rate) else float(settings.learning_rate),
                 optimizer=settings.optimizer, momentum=float(settings.momentum))
    if settings.optimizer != "sgd":
        found.update(beta1=settings.beta1, beta2=settings.beta2, eps=settings.eps, weight_decay=settings.weight_decay)
    extra = dict(sampler=run.plan.name, compression=run.sync.compression, precision=network.precision)
    return dict(found, **{key: value for key, value in extra.items() if value not in ("exact", "none", None)})


class Checkpointing(Hook):
    """Writes checkpoints of a data-parallel training run, and resumes one, as a hook of its loop, over its sync's
    communicator. folder: a :class:`CheckpointFolder`; resume: continue from the newest checkpoint there, exactly
    (with the same number of ranks, bit-identical to an uninterrupted run)."""

    def __init__(self, folder: CheckpointFolder, resume: bool = False, progress: bool = False):
        self.folder, self.resume, self.progress, self.comm = folder, resume, progress, None
        self.epoch_rng_state = None  # the plan's random state as this epoch began

    def begin(self, run) -> None:
        self.comm = run.sync.comm
        problem, saved = None, None
        if not isinstance(self.folder, CheckpointFolder):
            problem = ("checkpoints need a nnlib.lesson13_faults.checkpoint.CheckpointFolder; got "
                       f"{type(self.folder).__name__}")
        elif run.sync.kept_between_steps:  # (lesson 15's top-k, PowerSGD, local SGD)
            problem = f"checkpoints do not keep {run.sync.kept_between_steps}: run it without checkpoints"
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
            self.restore(run, self.comm.bcast(saved, root=0))

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

    def restore(self, run, saved: Checkpoint) -> None:
        """Put the run where the checkpoint (on every rank) was: its state (the sync keeps each rank's part),
        position, the shuffling's state, the history and the epoch's partial sums."""
        run.sync.load_state_dict(run, saved.state)
        run.epoch, run.step, run.total_steps = saved.epoch, saved.step, saved.total_steps
        if run.plan.rng is not None:
            run.plan.rng.bit_generator.state = saved.rng_state
        for name in HISTORY_FIELDS:
            getattr(run.history, name).extend(saved.history[name])
        if run.step > 0 and self.comm.rank == 0:  # the steps done before the checkpoint, summed over ranks
            run.loss_sum, run.correct_sum = saved.partial[0], int(saved.partial[1])
        if self.progress and self.comm.rank == 0:
            print(f"resuming from {saved.path}: {run.total_steps} steps done (epoch {run.epoch + 1}, step "
                  f"{run.step}), written by {saved.ranks} rank{'s' if saved.ranks > 1 else ''}", flush=True)

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
        if hasattr(self.comm, "at"):  # a watched communicator (nnlib.course.deadline) quotes this in its errors
            self.comm.at(phase="checkpoint")
        partial = np.array([float(run.loss_sum), float(run.correct_sum)]) if steps_done else np.zeros(2)
        if steps_done:  # mid-epoch: the totals so far, summed over ranks
            run.sync.sum_over_ranks(partial)
        state, problem = run.sync.state_dict(run), None  # (collective where a strategy keeps parts of it)
        if self.comm.rank == 0:
            history = {name: list(getattr(run.history, name)) for name in HISTORY_FIELDS}
            record = Checkpoint(state=state, epoch=epoch, step=steps_done, rng_state=rng_state,
                                partial=partial.tolist(), history=history, settings=run_settings(run),
                                ranks=self.comm.size, total_steps=run.total_steps)
            try:
                self.folder.write(record)
            except CheckpointError as error:
                problem = str(error)
        fail_together(self.comm, problem)
