"""Timelines as Chrome trace-event JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing open.

Any of the series' timelines (data-parallel phases, pipeline stages, the parameter server's updates;
lessons 10 and 13 make their own spans) becomes a trace that can be zoomed, searched and measured.
The Trace Event Format (Horovod's timeline and PyTorch's profiler write it too) is
``{"traceEvents": [...], "displayTimeUnit": "ms"}``, each event a dict with

    ph    "X" a complete span (ts, dur), "i" an instant (ts), "M" metadata (names)
    pid   the process: here one per rank
    tid   the thread: here one per kind of work (a phase, "forward", "backward", ...)
    ts    the start in microseconds; dur the length in microseconds (spans)
    name  what it was ("F3": the forward of micro-batch 3); args: anything more, shown on click
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

LESSON = 0  # the course's own tools: any lesson may use them

#: A pipeline timeline's letters and the thread they go on.
PIPELINE_THREADS = {"F": "forward", "B": "backward", "W": "weight gradient"}


@dataclass(frozen=True)
class Span:
    """One piece of work: rank (the process), thread (the kind of work), name, start and end in seconds."""

    rank: int
    thread: str
    name: str
    start: float
    end: float
    args: dict = field(default_factory=dict, hash=False, compare=False)


def trace_events(spans, instants=()) -> list[dict]:
    """Chrome trace events: process and thread names, then one "X" event per span, "i" per instant.
    spans, instants: Span objects (an instant's end is ignored). Times become microseconds since the earliest start
    (traces of different clocks all begin at 0); thread ids go in order of first appearance, per rank."""
    spans, instants = list(spans), list(instants)
    everything = spans + instants
    zero = min((span.start for span in everything), default=0.0)
    threads: dict[tuple[int, str], int] = {}
    for span in everything:
        threads.setdefault((span.rank, span.thread), sum(rank == span.rank for rank, _ in threads) + 1)
    events = [dict(ph="M", pid=rank, tid=0, name="process_name", args=dict(name=f"rank {rank}"))
              for rank in sorted({rank for rank, _ in threads})]
    events += [dict(ph="M", pid=rank, tid=tid, name="thread_name", args=dict(name=thread))
               for (rank, thread), tid in threads.items()]
    for span in spans:
        events.append(dict(ph="X", pid=span.rank, tid=threads[span.rank, span.thread], name=span.name,
                           ts=(span.start - zero) * 1e6, dur=(span.end - span.start) * 1e6, args=dict(span.args)))
    for span in instants:
        events.append(dict(ph="i", s="t", pid=span.rank, tid=threads[span.rank, span.thread], name=span.name,
                           ts=(span.start - zero) * 1e6, args=dict(span.args)))
    return events


def write_trace(path, spans, instants=()) -> Path:
    """Write the spans (and instants) as a Chrome trace-event JSON file; returns its path."""
    path = Path(path)
    path.write_text(json.dumps({"traceEvents": trace_events(spans, instants), "displayTimeUnit": "ms"}))
    return path


def phase_spans(timelines) -> list[Span]:
    """Data-parallel phases: timelines[rank] = [(step, phase, start, end)] -> one span per phase, a thread per phase."""
    return [Span(rank, phase, f"{phase} (step {step})", start, end, dict(step=step))
            for rank, timeline in enumerate(timelines) for step, phase, start, end in timeline]


def pipeline_spans(timelines, chunks=None, stages: int | None = None) -> list[Span]:
    """Pipeline stages: timelines[rank] = [(letter, micro-batch, start, end)] -> spans "F3", a thread per letter.
    chunks: chunks[rank][i], the chunk of the rank's i-th computation (ScheduledPipeline.timeline_chunks; for a
    schedule's lists, the chunk of each computing instruction); with several a span names its chunk, "F3 (chunk 1)".
    Every span's args hold its micro-batch, chunk and virtual stage chunk x P + stage, the stage being rank % P
    (P = ``stages``, default len(timelines); a replica of a (data x model) grid holds ranks d P .. d P + P - 1)."""
    spans, stages = [], stages or len(timelines)
    several = chunks is not None and any(chunk for rank_chunks in chunks for chunk in rank_chunks)
    for rank, timeline in enumerate(timelines):
        for index, (letter, micro_batch, start, end) in enumerate(timeline):
            chunk = chunks[rank][index] if chunks is not None else 0
            name = f"{letter}{micro_batch}" + (f" (chunk {chunk})" if several else "")
            spans.append(Span(rank, PIPELINE_THREADS.get(letter, letter), name, start, end,
                              dict(micro_batch=micro_batch, chunk=chunk, virtual_stage=chunk * stages + rank % stages)))
    return spans


def update_instants(workers, seconds) -> list[Span]:
    """The parameter server's updates (rank 0): one instant per update, on the thread of the worker that sent it.
    workers[i], seconds[i]: who sent update i and when it was applied (AsyncHistory.worker, .seconds)."""
    return [Span(0, f"updates from worker {worker}", f"update {index}", when, when, dict(worker=int(worker)))
            for index, (worker, when) in enumerate(zip(workers, seconds))]
