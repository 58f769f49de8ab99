"""The trace writer (nnlib.course.trace): Chrome trace-event JSON that Perfetto opens.

Each trace is checked against a JSON schema of the Trace Event Format's parts it uses, its spans
must nest on every thread (Perfetto draws overlapping spans of one thread wrongly), and they must
be the recorded timeline: the pipeline stages' (from lesson 12's simulate, interleaved ones naming
their chunk, and from a batch job with the interleaved schedule under mpiexec), the data-parallel
phases of a batch job under mpiexec (--trace), the parameter server's updates, overlap's per-bucket
calls (lesson 10) and the watchdog's waits (lesson 13) of a training run. Each check is also shown failing.
"""

import json
import subprocess
import sys

import jsonschema
import numpy as np
import pytest
from mpi4py import MPI

from nnlib import Network
from nnlib.course.environment import mpiexec_path
from nnlib.course.trace import (Span, phase_spans, pipeline_spans, trace_events, update_instants,
                                              write_trace)
from nnlib.lesson06_data_parallel.data_parallel import train_parallel
from nnlib.lesson10_zero_overlap.overlap import BucketedAllreduce
from nnlib.lesson13_faults.watchdog import record_waits, train_watched, wait_spans
from nnlib.lesson18_pipeline_schedules.pictures import chunks_of
from nnlib.lesson18_pipeline_schedules.schedules import schedule_programs, simulated_timelines

NUMBER = {"type": "number"}
EVENT = {"type": "object", "required": ["ph", "pid", "tid", "name"],
         "properties": {"ph": {"enum": ["X", "i", "M"]}, "pid": {"type": "integer", "minimum": 0},
                        "tid": {"type": "integer", "minimum": 0}, "name": {"type": "string"},
                        "ts": {"type": "number", "minimum": 0}, "dur": {"type": "number", "minimum": 0},
                        "args": {"type": "object"}},
         "allOf": [{"if": {"properties": {"ph": {"const": "X"}}}, "then": {"required": ["ts", "dur"]}},
                   {"if": {"properties": {"ph": {"const": "i"}}}, "then": {"required": ["ts"]}},
                   {"if": {"properties": {"ph": {"const": "M"}}},
                    "then": {"properties": {"name": {"enum": ["process_name", "thread_name"]}},
                             "required": ["args"]}}]}
SCHEMA = {"type": "object", "required": ["traceEvents"],
          "properties": {"traceEvents": {"type": "array", "items": EVENT}, "displayTimeUnit": {"enum": ["ms", "ns"]}}}


def nesting_problems(events):
    """Spans of one (process, thread) that overlap without one holding the other."""
    problems, threads = [], {}
    for event in events:
        if event["ph"] == "X":
            threads.setdefault((event["pid"], event["tid"]), []).append((event["ts"], event["ts"] + event["dur"],
                                                                         event["name"]))
    for thread, spans in threads.items():
        open_spans = []
        for start, end, name in sorted(spans, key=lambda span: (span[0], -span[1])):
            while open_spans and open_spans[-1][1] <= start + 1e-6:
                open_spans.pop()
            if open_spans and end > open_spans[-1][1] + 1e-6:
                problems.append(f"{thread}: {name} overlaps {open_spans[-1][2]}")
            open_spans.append((start, end, name))
    return problems


def load_checked(path):
    trace = json.loads(path.read_text())
    jsonschema.validate(trace, SCHEMA)
    assert nesting_problems(trace["traceEvents"]) == []
    return trace


def named_threads(events):
    """{(pid, tid): thread name} from the metadata events."""
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}


def test_pipeline_stages_become_a_process_each_and_a_thread_per_kind_of_work(tmp_path):
    timelines = simulated_timelines(schedule_programs("zb-h1", 3, 5), lambda stage, kind: {"forward": 1.0}.get(kind, 0.5))
    trace = load_checked(write_trace(tmp_path / "pipeline.json", pipeline_spans(timelines)))
    events, threads = trace["traceEvents"], named_threads(trace["traceEvents"])
    assert {e["args"]["name"] for e in events if e["name"] == "process_name"} == {"rank 0", "rank 1", "rank 2"}
    assert set(threads.values()) == {"forward", "backward", "weight gradient"}
    spans = sorted((e["pid"], threads[e["pid"], e["tid"]], e["name"], e["ts"], e["dur"])
                   for e in events if e["ph"] == "X")
    letters = {"F": "forward", "B": "backward", "W": "weight gradient"}
    recorded = sorted((stage, letters[letter], f"{letter}{k}", start * 1e6, (end - start) * 1e6)
                      for stage, timeline in enumerate(timelines) for letter, k, start, end in timeline)
    assert spans == recorded


def spans_by_thread(events):
    """Sorted (pid, thread name, span name, ts, dur, args) of the trace's spans."""
    threads = named_threads(events)
    return sorted((e["pid"], threads[e["pid"], e["tid"]], e["name"], e["ts"], e["dur"], tuple(sorted(e["args"].items())))
                  for e in events if e["ph"] == "X")


def test_interleaved_spans_name_their_chunk_and_virtual_stage(tmp_path):
    programs = schedule_programs("interleaved", 2, 4, 2)
    timelines = simulated_timelines(programs, lambda stage, kind: {"forward": 1.0}.get(kind, 2.0))
    chunks = chunks_of(programs)
    events = load_checked(write_trace(tmp_path / "interleaved.json", pipeline_spans(timelines, chunks)))["traceEvents"]
    letters = {"F": "forward", "B": "backward"}
    recorded = sorted((stage, letters[letter], f"{letter}{k} (chunk {chunk})", start * 1e6, (end - start) * 1e6,
                       (("chunk", chunk), ("micro_batch", k), ("virtual_stage", 2 * chunk + stage)))
                      for stage, timeline in enumerate(timelines)
                      for (letter, k, start, end), chunk in zip(timeline, chunks[stage]))
    assert spans_by_thread(events) == recorded
    assert any(name == "F0 (chunk 1)" for _, _, name, *_ in recorded)


def test_an_interleaved_batch_job_traces_its_chunks_under_mpiexec(tmp_path):
    path = tmp_path / "interleaved-job.json"
    run = subprocess.run([mpiexec_path(), "-n", "2", sys.executable, "-m", "nnlib", "train", "--samples", "300",
                          "--epochs", "1", "--batch-size", "100", "--hidden", "8", "8", "8", "--grid",
                          "1,1,2", "--schedule", "interleaved", "--micro-batches", "3", "--trace", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    spans = [e for e in load_checked(path)["traceEvents"] if e["ph"] == "X"]
    for rank in (0, 1):  # the last step: 3 micro-batches x 2 chunks x (F, B) on each rank
        mine = [e for e in spans if e["pid"] == rank]
        assert len(mine) == 12
        assert {(e["args"]["chunk"], e["args"]["virtual_stage"]) for e in mine} == {(0, rank), (1, 2 + rank)}
        assert all(e["name"].endswith(f"(chunk {e['args']['chunk']})") for e in mine)


def test_overlap_starts_each_bucket_during_backpropagation():
    network = Network((20, 16, 12, 8, 3), dtype="float64", seed=0)
    rng = np.random.default_rng(0)
    inputs, labels = rng.random((30, 20)), rng.integers(0, 3, 30)
    overlap = BucketedAllreduce(MPI.COMM_SELF, network, bucket_bytes=0)  # a bucket per layer: 4
    started = []
    for _ in range(2):
        network.loss_and_gradient(inputs, labels, on_layer_done=lambda layer: (
            overlap.layer_done(layer), started.append(len(overlap.pending))))
        expected = network.grads.copy()
        overlap.finish()
        assert overlap.pending == [] and np.array_equal(network.grads, expected)  # one rank: the sum is its own
    assert started == [1, 2, 3, 4] * 2  # one request per layer, started as its gradient is final, each step anew
    assert [layer for layer, _, _ in overlap.buckets] == [3, 2, 1, 0]  # completed last layer first


def test_the_watchdogs_waits_of_a_training_run(tmp_path):
    network = Network((6, 5, 3), dtype="float64", seed=0)
    rng = np.random.default_rng(1)
    inputs, labels = rng.random((40, 6)), rng.integers(0, 3, 40)
    recorded = []

    def recording(watched):
        recorded.append(record_waits(watched))
        return watched

    history = train_watched(train_parallel, MPI.COMM_SELF, network, inputs, labels, num_samples=40, start=0,
                            wrap=recording, epochs=1, batch_size=10, learning_rate=0.5, progress=False)
    waits = recorded[0]
    assert history.steps == 4 and len(waits) >= 4  # at least the gradient's Allreduce of every step
    steps = {where.get("step") for what, where, _, _ in waits if what == "Allreduce"}
    assert steps >= {1, 2, 3, 4}
    events = load_checked(write_trace(tmp_path / "waits.json", wait_spans(recorded)))["traceEvents"]
    zero = min(start for *_, start, _ in waits)
    expected = sorted((0, "waits", what, (start - zero) * 1e6, (end - start) * 1e6, tuple(sorted(where.items())))
                      for what, where, start, end in waits)
    assert spans_by_thread(events) == expected


def test_data_parallel_phases_of_a_batch_job_under_mpiexec(tmp_path):
    path = tmp_path / "phases.json"
    run = subprocess.run([mpiexec_path(), "-n", "2", sys.executable, "-m", "nnlib", "train", "--samples", "500",
                          "--epochs", "1", "--batch-size", "50", "--hidden", "8", "--trace", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert f"wrote the trace {path}" in run.stdout
    events = load_checked(path)["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1}
    steps = {(e["pid"], e["args"]["step"]) for e in spans}
    assert steps == {(rank, step) for rank in (0, 1) for step in range(10)}  # 500 samples, batches of 50: 10 steps
    threads = named_threads(events)
    assert all(f"{threads[e['pid'], e['tid']]} (step" in e["name"] for e in spans)


def test_phases_and_updates_keep_their_times():
    timelines = [[(0, "compute", 0.5, 1.0), (0, "communicate", 1.0, 1.25)], [(0, "compute", 0.25, 1.0)]]
    events = trace_events(phase_spans(timelines))
    jsonschema.validate({"traceEvents": events}, SCHEMA)
    spans = sorted((e["pid"], e["name"], e["ts"], e["dur"]) for e in events if e["ph"] == "X")
    assert spans == [(0, "communicate (step 0)", 750000.0, 250000.0), (0, "compute (step 0)", 250000.0, 500000.0),
                     (1, "compute (step 0)", 0.0, 750000.0)]
    updates = trace_events([], update_instants([1, 2, 1], [0.1, 0.2, 0.4]))
    jsonschema.validate({"traceEvents": updates}, SCHEMA)
    instants = [(e["tid"], e["ts"]) for e in updates if e["ph"] == "i"]
    assert instants == [(1, 0.0), (2, pytest.approx(1e5)), (1, pytest.approx(3e5))]


def test_the_checks_catch_a_bad_trace():
    crossing = trace_events([Span(0, "compute", "a", 0.0, 2.0), Span(0, "compute", "b", 1.0, 3.0)])
    assert nesting_problems(crossing) == ["(0, 1): b overlaps a"]
    nested = trace_events([Span(0, "compute", "a", 0.0, 3.0), Span(0, "compute", "b", 1.0, 2.0)])
    assert nesting_problems(nested) == []
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"traceEvents": [dict(ph="X", pid=0, tid=1, name="no times")]}, SCHEMA)
