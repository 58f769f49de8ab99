"""Deadlines around whole training runs: every collective of a run watched, and the errors saying where it was.

Lesson 13 takes apart the deadline that the course's cluster already gives every ``comm`` (nnlib.course.deadline:
``watch``, ``WatchedComm``, ``CollectiveTimeout``), then puts it around a training run:

    train_watched(train_parallel, comm, network, inputs, labels, ...)   # a deadline on every collective
    RunNotes(watched)   a hook: the errors say the epoch, the step and the phase the run was in
    record_waits, wait_spans   a run's waits, in a trace
"""

from __future__ import annotations

import time

from nnlib.course.deadline import WatchedComm, watch
from nnlib.course.trace import Span
from nnlib.lesson03_training.training import Hook

LESSON = 13


class RunNotes(Hook):
    """Keeps a WatchedComm told where the training run is (epoch, step, phase), for its errors' messages."""

    def __init__(self, watched: WatchedComm):
        self.watched = watched

    def begin(self, run) -> None:
        self.watched.at(phase="preparing")

    def phase(self, run, name) -> None:
        self.watched.at(epoch=run.epoch + 1, step=run.step + 1, phase=name or "between steps")


def train_watched(train, comm, *args, timeout=None, hooks=(), wrap=None, **keywords):
    """``train(watched, *args, hooks=[RunNotes(watched), *hooks], **keywords)`` under a deadline (e.g. ``train`` =
    train_parallel): ``watched`` = :func:`watch` (comm, timeout), and inside its guard a rank that raises tells the
    others, which stop at once. ``wrap(watched)``, if given, is the communicator the run gets instead (e.g.
    ``lambda watched: HostStaging(watched, xp)`` for GPU arrays, lesson 08)."""
    watched = watch(comm, timeout)
    with watched.guard():
        return train(watched if wrap is None else wrap(watched), *args, hooks=(RunNotes(watched), *hooks), **keywords)


def record_waits(watched: WatchedComm) -> list:
    """Make ``watched`` note each of its waits; returns the list it appends (what, where, start, end) to: every
    collective, receive and wait_all waits in ``wait`` (what: "Allreduce", "Recv from rank 2", ...); where: a copy of
    ``watched.where`` as it began; start, end: time.perf_counter seconds, also when the wait ends in an error. In a
    run, call it in train_watched's ``wrap`` (returning watched)."""
    waits, wait = [], watched.wait

    def timed_wait(request, what: str) -> None:
        where, began = dict(watched.where), time.perf_counter()
        try:
            wait(request, what)
        finally:
            waits.append((what, where, began, time.perf_counter()))

    watched.wait = timed_wait
    return waits


def wait_spans(waits_per_rank) -> list[Span]:
    """Spans for the course's trace writer: waits_per_rank[rank] = record_waits' list; a thread "waits" per rank,
    a span per wait named by what it waited for, its epoch, step and phase in the args."""
    return [Span(rank, "waits", what, start, end, dict(where))
            for rank, waits in enumerate(waits_per_rank) for what, where, start, end in waits]
