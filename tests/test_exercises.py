"""The lessons' exercises: each worked answer is written once (nnlib/exercises/lesson_NN.py) and agrees
with nnlib's own function or with values worked out by hand; every notebook shows exactly its def line
and docstring; every untouched exercise fails its check with "not written yet"; half-finished answers
get the message meant for them; and checking a lesson's exercise loads no later lesson's code."""

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import nbformat
import numpy as np
import pytest
from mpi4py import MPI
from layout import PACKAGE, lesson_of, modules
from thread_comm import ThreadRanks

from nnlib.check import check, solution, verdict, worked_answer_source
from nnlib.exercises import all_exercises, find, lesson_exercises, lessons
from nnlib.exercises.lesson_02 import layer_backward
from nnlib.exercises.lesson_09 import ring_step
from nnlib.lesson01_mnist import data
from nnlib.lesson02_network.network import count_parameters, cross_entropy_from_logits, sigmoid
from nnlib.lesson03_training import optimizers, training
from nnlib.lesson04_collectives import collectives, costmodel
from nnlib.lesson07_scaling import scaling
from nnlib.lesson09_ring_allreduce import allreduce
from nnlib.lesson10_zero_overlap import overlap, zero
from nnlib.lesson12_pipeline import bubbles, instructions
from nnlib.lesson15_compression import compression, local_sgd, powersgd
from nnlib.lesson16_sharding import fsdp
from nnlib.lesson17_activations import budget
from nnlib.lesson18_pipeline_schedules import schedules
from nnlib.lesson19_planning import planner

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
EXERCISES = all_exercises()


def defined(source: str, name: str):
    namespace = {"np": np}
    exec(source, namespace)
    return namespace[name]


def ring_step_by_nnlib_schedule(buffers, step):
    """One reduce-scatter step as nnlib.lesson09_ring_allreduce.allreduce's ring schedule sends it."""
    counts, starts = collectives.split_evenly(buffers.shape[1], buffers.shape[0])
    after = buffers.copy()
    for sender, receiver, chunk in allreduce.ring_schedule(buffers.shape[0])[step]["sends"]:
        part = slice(starts[chunk], starts[chunk] + counts[chunk])
        after[receiver, part] += buffers[sender, part]
    return after


def top_k_step_by_nnlib(gradient, residual, k):
    corrected = gradient + residual
    sent, chosen = np.zeros_like(corrected), compression.top_k(corrected, k)
    sent[chosen] = corrected[chosen]
    return sent, corrected - sent


def zb_h1_order_by_nnlib(stages, stage, micro_batches):
    """Stage s's work in nnlib's ZB-H1 lists, coded 0 = F, 1 = B, 2 = W, with the micro-batches."""
    codes = {"forward": 0, "backward_input": 1, "backward_weight": 2}
    work = [(codes[i.kind], i.micro_batch) for i in schedules.zb_h1(stages, micro_batches)[stage] if i.kind in codes]
    kinds, micro = np.array(work).T
    return kinds, micro


# -- lesson 18's exercise 18.3 (1F1B's instruction list): nnlib's lists, and three plausible wrong answers --
ONE_F_ONE_B_CODES = {"recv_forward": 0, "forward": 1, "send_forward": 2, "recv_backward": 3, "backward": 4,
                     "send_backward": 5}


def one_f_one_b_by_nnlib(stages, stage, micro_batches):
    """Stage s's instructions in nnlib's 1F1B lists (lesson 12's), coded as exercise 18.3 codes them."""
    program = instructions.one_f_one_b(stages, micro_batches)[stage]
    kinds, micro = np.array([(ONE_F_ONE_B_CODES[i.kind], i.micro_batch) for i in program]).T
    return kinds, micro


def one_f_one_b_program_from(order, stages, stage, send_first=False):
    """A stage's coded instructions from its order of work [(1 forward or 4 backward, k)], messages at the ends
    left out; send_first: the send written before the computation it carries (a wrong answer)."""
    first, last, program = stage == 0, stage == stages - 1, []
    for kind, k in order:
        receive, send = ((0, not first), (2, not last)) if kind == 1 else ((3, not last), (5, not first))
        middle = [send[:1] + (k,)] * send[1] + [(kind, k)] if send_first else [(kind, k)] + [send[:1] + (k,)] * send[1]
        program += [receive[:1] + (k,)] * receive[1] + middle
    kinds, micro = np.array(program).T
    return kinds, micro


def one_f_one_b_warming_up(warmup):
    """1F1B's order with warmup(P, s) forwards before the first backward (the right one: P - s - 1)."""
    def answer(stages, stage, micro_batches):
        ahead = min(warmup(stages, stage), micro_batches)
        order = [(1, k) for k in range(ahead)]
        for k in range(micro_batches - ahead):
            order += [(1, ahead + k), (4, k)]
        return one_f_one_b_program_from(order + [(4, k) for k in range(micro_batches - ahead, micro_batches)],
                                        stages, stage)
    return answer


def gpipe_order_instead(stages, stage, micro_batches):
    """Wrong: GPipe's order (all forwards, then all backwards), messages right."""
    order = [(1, k) for k in range(micro_batches)] + [(4, k) for k in range(micro_batches)]
    return one_f_one_b_program_from(order, stages, stage)


def sends_before_their_work(stages, stage, micro_batches):
    """Wrong: the right order of work, each send written before the computation whose result it carries."""
    kinds, micro = one_f_one_b_by_nnlib(stages, stage, micro_batches)
    order = [(kind, k) for kind, k in zip(kinds, micro) if kind in (1, 4)]
    return one_f_one_b_program_from(order, stages, stage, send_first=True)


def messages_past_the_ends(stages, stage, micro_batches):
    """Wrong: every forward and backward with both its messages, on the first and last stage too."""
    kinds, micro = one_f_one_b_by_nnlib(stages, stage, micro_batches)
    program = [(code, k) for kind, k in zip(kinds, micro) if kind in (1, 4)
               for code in ((0, 1, 2) if kind == 1 else (3, 4, 5))]
    kinds, micro = np.array(program).T
    return kinds, micro
# -- (end of lesson 18's 18.3 helpers) --


def momentum_step_by_nnlib(params, velocity, grads, learning_rate, momentum):
    params, velocity = params.copy(), velocity.copy()
    optimizers.sgd_update(params, grads, velocity, learning_rate, momentum)
    return params, velocity


def powersgd_approximation_by_nnlib(gradients, q):
    """nnlib's PowerSGD compressor on one rank holding the sum of the gradients: both of its Allreduces add up
    products linear in the gradients, so one rank with the sum computes what the ranks compute together."""
    class OneRank:
        size = 1

        def Allreduce(self, sendbuf, recvbuf, op=None):
            pass  # one rank: the sum is its own

    rows, columns = gradients.shape[1:]
    compressor = powersgd.PowerSGDCompressor([(rows, columns)], q.shape[1], np.float64)
    compressor.qs = [q.copy()]
    flat = np.concatenate([gradients.sum(axis=0).ravel(), np.zeros(columns)])
    compressor.allreduce(OneRank(), flat)
    return flat[:rows * columns].reshape(rows, columns)


def diloco_outer_step_by_nnlib(anchor, worker_params, velocity, learning_rate, momentum):
    anchor, velocity = anchor.copy(), velocity.copy()
    local_sgd.outer_step(anchor, (anchor - worker_params).mean(axis=0), velocity, learning_rate, momentum)
    return anchor, velocity


# ---- lesson 16 (exercise 16.1, one FSDP layer): nnlib's ShardedLayer on threads, its wrong answers ----
def fsdp_layer_step_by_nnlib(shards, inputs, deltas, n_in, n_out):
    """nnlib.lesson16_sharding.fsdp's ShardedLayer (a sigmoid layer) on every rank at once: P threads, one a rank,
    whose Allgatherv and Reduce_scatter meet at a barrier, an in-process stand-in for MPI's."""
    ranks, results = ThreadRanks(len(shards)), [None] * len(shards)

    def run(rank):
        views = (shards[rank].copy(), np.zeros_like(shards[rank]))
        layer = fsdp.ShardedLayer(ranks.comm(rank), 0, (n_in, n_out), views, "sigmoid", fsdp.GatherLog())
        _, output = layer.forward(inputs[rank])
        layer.weight_gradient(inputs[rank], deltas[rank])
        results[rank] = output, layer.grad_shard, layer.weights  # weights: None once freed

    ranks.run(run)
    assert all(weights is None for _, _, weights in results), "a rank kept the gathered layer"
    return tuple(output for output, _, _ in results), tuple(chunk for _, chunk, _ in results)


def fsdp_gradient(inputs, deltas):
    return [np.concatenate([(x.T @ delta).ravel(), delta.sum(axis=0)]) for x, delta in zip(inputs, deltas)]


def fsdp_outputs(shards, inputs, n_in, n_out, whole=None):
    whole = np.concatenate(shards) if whole is None else whole
    return tuple(sigmoid(x @ whole[:n_in * n_out].reshape(n_in, n_out) + whole[n_in * n_out:]) for x in inputs)


def fsdp_cut(summed, shards):
    stops = np.cumsum([len(shard) for shard in shards])
    return tuple(summed[stop - len(shard):stop] for shard, stop in zip(shards, stops))


def fsdp_own_gradient_only(shards, inputs, deltas, n_in, n_out):
    """No reduce-scatter: each rank keeps chunk r of its own rows' gradient."""
    cut = [fsdp_cut(gradient, shards)[rank] for rank, gradient in enumerate(fsdp_gradient(inputs, deltas))]
    return fsdp_outputs(shards, inputs, n_in, n_out), tuple(cut)


def fsdp_weights_reshaped_transposed(shards, inputs, deltas, n_in, n_out):
    """W read column after column: reshape(n_out, n_in).T instead of reshape(n_in, n_out)."""
    whole = np.concatenate(shards)
    weights = whole[:n_in * n_out].reshape(n_out, n_in).T
    outputs = tuple(sigmoid(x @ weights + whole[n_in * n_out:]) for x in inputs)
    return outputs, fsdp_cut(sum(fsdp_gradient(inputs, deltas)), shards)


def fsdp_gathered_in_reverse(shards, inputs, deltas, n_in, n_out):
    """The chunks put together last rank first."""
    whole = np.concatenate(shards[::-1])
    return fsdp_outputs(shards, inputs, n_in, n_out, whole), fsdp_cut(sum(fsdp_gradient(inputs, deltas)), shards)


def fsdp_allreduced(shards, inputs, deltas, n_in, n_out):
    """An Allreduce where the reduce-scatter belongs: every rank keeps the whole summed gradient."""
    summed = sum(fsdp_gradient(inputs, deltas))
    return fsdp_outputs(shards, inputs, n_in, n_out), tuple(summed for _ in shards)


def fsdp_averaged(shards, inputs, deltas, n_in, n_out):
    """The mean over the ranks where nnlib sums (each rank's delta already carries 1/B)."""
    summed = sum(fsdp_gradient(inputs, deltas)) / len(shards)
    return fsdp_outputs(shards, inputs, n_in, n_out), fsdp_cut(summed, shards)


FSDP_HALF_FINISHED = [
    ("16.1", fsdp_own_gradient_only, "values", ", result 2 of 2, result 1 of 3: wrong values"),
    ("16.1", fsdp_weights_reshaped_transposed, "values", ", result 1 of 2, result 1 of 3: wrong values"),
    ("16.1", fsdp_gathered_in_reverse, "values", ", result 1 of 2, result 1 of 3: wrong values"),
    ("16.1", fsdp_allreduced, "shape", "result 2 of 2, result 1 of 3 returned shape (32,); expected shape (11,)."),
    ("16.1", fsdp_averaged, "values", ", result 2 of 2, result 1 of 3: wrong values"),
    # 16.2: only the state sharded; everything from stage 1 on; the paper's K = 12 written in
    ("16.2", lambda stage, ranks, k: 2 + 2 + (k / ranks if stage >= 1 else k), "values", "(2, 4, 12.0): wrong values"),
    ("16.2", lambda stage, ranks, k: (4 + k) / (ranks if stage >= 1 else 1), "values", "(1, 4, 12.0): wrong values"),
    ("16.2", lambda stage, ranks, k: [16.0, 4 + 12 / ranks, 2 + 14 / ranks, 16 / ranks][stage], "values",
     "(1, 8, 4.0): wrong values"),
]
# ---- end of lesson 16's lines ----



# -- lesson 10's write-the-core exercises against nnlib's own overlap.py and zero.py ---------------------

def bucket_starts_by_nnlib_overlap(layer_bytes, bucket_bytes):
    """overlap.BucketedAllreduce's own hook through one backward pass, on a stand-in network whose float64
    layers' gradients have these bytes (backward's order), with a communicator that starts nothing."""
    class NoTransfer:
        def Iallreduce(self, sendbuf, recvbuf, op=None):
            return MPI.REQUEST_NULL  # a request that is already complete

    elements = [size // 8 for size in layer_bytes][::-1]  # forward order: layer 0 first
    network = SimpleNamespace(params=np.zeros(sum(elements)), grads=np.zeros(sum(elements)),
                              num_layers=len(elements), shapes=[(count - 1, 1) for count in elements])
    hook = overlap.BucketedAllreduce(NoTransfer(), network, bucket_bytes)
    started = []
    for layer in range(network.num_layers - 1, -1, -1):  # as backpropagation calls it
        before = len(hook.pending)  # the buckets started so far: the next one's number
        hook.layer_done(layer)
        started.append(before if len(hook.pending) > before else -1)
    hook.finish()
    return np.array(started)


def zero_step_by_nnlib(params, grads, velocity, learning_rate, momentum):
    """zero.ZeRO.step (the ring's two halves around the SGD step of its slice) on P threads, one per rank, whose
    Sendrecv passes copies through queues: nnlib's own ZeRO step, every rank at once."""
    ranks = grads.shape[0]
    threads = ThreadRanks(ranks)
    networks = [SimpleNamespace(params=params.copy(), grads=grads[rank].copy(), num_params=params.size, xp=np)
                for rank in range(ranks)]
    sliced = [optimizers.SGD(network.params[zero.rank_slice(params.size, ranks, rank)], learning_rate, momentum)
              for rank, network in enumerate(networks)]  # as ZeRO makes its optimizer
    for optimizer, mine in zip(sliced, velocity):
        optimizer.state["velocity"][...] = mine

    def run(rank):
        step = sliced[rank].step  # (lesson 03's Run.update without a scaler)
        zero.ZeRO(threads.comm(rank), networks[rank]).step(SimpleNamespace(
            phase=lambda name: None, update=lambda params, grads, comm=None: step(params, grads)))

    threads.run(run)
    return np.array([network.params for network in networks]), tuple(optimizer.state["velocity"] for optimizer in sliced)


# nnlib's own function for each exercise that has one: the lesson and the check cannot disagree.
NNLIB = {
    "00.1": count_parameters,
    "01.1": data.scale_pixels,
    "01.2": lambda labels, classes: data.one_hot(labels, classes, np.float32),
    "02.1": lambda inputs, weights, biases: sigmoid(inputs @ weights + biases),
    "02.3": lambda logits, targets: float(cross_entropy_from_logits(logits, targets, "sigmoid", np)) / len(logits),
    "03.1": momentum_step_by_nnlib,
    "03.3": lambda samples, batch: np.array(training.batch_ranges(samples, batch)).reshape(-1, 2),
    "04.1": lambda rows, ranks, length: tuple(np.array(part) * length for part in collectives.split_evenly(rows, ranks)),
    "05.1": costmodel.predicted_time,
    "07.1": scaling.amdahl_speedup,
    "07.2": scaling.gustafson_speedup,
    "09.1": ring_step_by_nnlib_schedule,
    "10.1": lambda layer_bytes, bucket_bytes: bucket_starts_by_nnlib_overlap(layer_bytes, bucket_bytes),
    "10.2": lambda params, grads, velocity, rate, momentum: zero_step_by_nnlib(params, grads, velocity, rate, momentum),
    "11.1": lambda inputs, weights, biases: sigmoid(inputs @ np.hstack(weights) + np.concatenate(biases)),
    "11.2": lambda hidden, weights, biases: np.hstack(hidden) @ np.vstack(weights) + biases,  # the unsplit layer
    "12.1": bubbles.bubble_fraction,
    "12.2": lambda stages, stage, m, schedule: int(np.cumsum([  # the most forwards not yet matched by a backward
        {"forward": 1, "backward": -1}.get(step.kind, 0) for step in instructions.SCHEDULES[schedule](stages, m)[stage]]).max()),
    "15.1": compression.to_bfloat16,
    "15.2": top_k_step_by_nnlib,
    "15.3": powersgd_approximation_by_nnlib,
    "15.4": diloco_outer_step_by_nnlib,
    "16.1": fsdp_layer_step_by_nnlib,  # (lesson 16's own lines: fsdp_layer_step_by_nnlib above)
    "17.1": lambda num_layers, every: budget.activation_widths((1,) * (num_layers + 1), every),  # widths of 1
    "18.1": lambda stages, micro_batches, chunks: schedules.bubble_formula("interleaved", stages, micro_batches,
                                                                          chunks=chunks),
    "18.2": lambda stages, stage, micro_batches: zb_h1_order_by_nnlib(stages, stage, micro_batches),
    "18.3": one_f_one_b_by_nnlib,
    "19.1": planner.pipeline_seconds,
}

# The others, on values worked out by hand: (key, arguments, the right result).
BY_HAND = [
    ("00.2", ((784, 30, 10), 4), 4 * (784 * 30 + 30 + 30 * 10 + 10)),
    ("02.2", (np.array([[1.0, 2.0]]), np.array([[3.0], [4.0]]), np.array([[0.5]]), np.array([[2.0]])),
     (np.array([[0.5], [1.0]]), np.array([0.5]), np.array([[1.5, 2.0]]))),  # dJ/dz = 2 * 0.5 * 0.5
    ("03.2", (np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]]), np.array([1, 1, 1])), 2 / 3),
    ("05.2", ([["send 1", "recv 1"], ["send 0", "recv 0"]],), np.array([0, 0])),  # both send first: a deadlock
    ("05.2", ([["recv 1", "send 1"], ["send 0", "recv 0"]],), np.array([2, 2])),  # rank 0 receives first
    ("05.2", ([["send 2"], ["send 2"], ["recv 1", "recv 0"]],), np.array([1, 1, 2])),  # rank 0 waits for rank 1's
    ("05.2", ([["send 1", "recv 2"], ["recv 0", "send 2"], ["send 0", "recv 1"]],), np.array([2, 2, 2])),
    ("06.1", (np.zeros(1), [np.array([1.0]), np.array([4.0])], [1, 3], 1.0), np.array([-3.25])),  # (1 + 12) / 4
    ("06.2", (np.array([7, 2, 9, 4, 0]), 3, 8), np.array([4, 1])),  # samples 7 and 4 of the shard 3..7
    ("06.2", (np.array([7, 2, 9, 4, 0]), 8, 9), np.zeros(0, dtype=int)),  # a shard this batch does not touch
    ("07.3", (10.0, np.array([10.0, 2.5]), np.array([1, 8])), np.array([1.0, 0.5])),
    ("08.1", (1000, 1000, 1000, 2.0), 1.0),
    ("08.2", (256, 128, 55, 25, 50, 120), False),  # CPU 0.873 ms; GPU 1.375 ms of launches + 0.002 ms
    ("08.2", (256, 1024, 55, 25, 50, 120), True),  # CPU 6.98 ms; GPU 1.375 ms + 0.017 ms
    ("08.2", (256, 128, 16, 25, 50, 120), True),  # fused: 0.400 ms + 0.002 ms against 0.873 ms
    ("13.1", ([3, 1, 0], 4), [2]),
    ("13.1", ([1, 0], 2), []),
    ("13.2", (50.0, 40_000.0, 4), 1000.0),  # sqrt(2 * 50 * 10 000)
    ("16.2", (0, 4, 12.0), 16.0),  # lesson 10's 16 bytes, on every rank
    ("16.2", (1, 4, 12.0), 7.0),  # 2 + 2 + 12 / 4
    ("16.2", (2, 8, 12.0), 3.75),  # 2 + 14 / 8
    ("16.2", (3, 64, 12.0), 0.25),  # 16 / 64
    ("16.2", (2, 8, 4.0), 2.75),  # K = 4 (SGD with momentum, float32 master): 2 + 6 / 8
    ("17.2", (1024.0, 5, True, 10), (512.0, 0, True)),
    ("17.2", (1024.0, 9, False, 10), (2048.0, 10, False)),
    ("17.2", (1024.0, 3, False, 10), (1024.0, 4, False)),
    ("14.1", (np.array([1, 2, 1, 1, 2]),), np.array([0, 1, 1, 0, 2])),  # worker 2 starts 1 behind
    ("14.1", (np.array([2, 2, 1, 2]),), np.array([0, 0, 2, 1])),
    ("19.2", ([3.0, 1.0, 2.0], [10, 30, 20], 25), 2),  # the fastest needs 30 bytes
    ("19.2", ([2.0, 1.0], [5, 6], 6), 1),  # exactly at the limit fits
    ("19.2", ([1.0], [9], 8), -1),
]


def same(got, expected) -> bool:
    if isinstance(expected, tuple):
        return len(got) == len(expected) and all(same(g, e) for g, e in zip(got, expected))
    got, expected = np.asarray(got), np.asarray(expected)
    return got.shape == expected.shape and np.allclose(got, expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("key", sorted(NNLIB))
def test_the_worked_answer_agrees_with_nnlibs_own_function(key):
    """nnlib's function, given as the student's answer, passes the check against the worked answer."""
    result = verdict(key, NNLIB[key])
    assert result.passed, result.message


@pytest.mark.parametrize("key, arguments, expected", BY_HAND, ids=[case[0] for case in BY_HAND])
def test_the_worked_answer_gives_the_values_worked_out_by_hand(key, arguments, expected):
    assert same(EXERCISES[key].worked_answer(*arguments), expected)


def test_every_exercise_has_its_answer_tested_and_every_lesson_has_exercises():
    assert set(NNLIB) | {key for key, _, _ in BY_HAND} == set(EXERCISES)
    assert lessons() == [path.name[:2] for path in NOTEBOOKS]


@pytest.mark.parametrize("key", sorted(EXERCISES))
def test_the_worked_answer_passes_its_check_and_solution_prints_it(key, capsys):
    exercise = EXERCISES[key]
    assert verdict(key, exercise.worked_answer).message == f"✓ {key} {exercise.function}: right, exactly, on all " \
                                                           f"{len(exercise.cases())} cases"
    solution(key)
    printed = capsys.readouterr().out
    assert printed == worked_answer_source(exercise)
    assert printed.startswith(f"# The worked answer to exercise {key}, from nnlib/exercises/lesson_{key[:2]}.py:")
    assert exercise.signature in printed and printed.endswith("\n")
    namespace = {}
    exec(printed, namespace)  # it runs as printed: the imports and helpers it needs are there
    assert verdict(key, namespace[exercise.function]).passed


@pytest.mark.parametrize("key", sorted(EXERCISES))
def test_the_untouched_exercise_fails_with_not_written_yet_and_a_hint(key):
    exercise = EXERCISES[key]
    result = verdict(key, defined(exercise.template(), exercise.function))
    assert not result.passed and result.reason == "not written"
    assert "not written yet: it returns None. Replace the `...` with your code" in flat(result.message)
    assert f"Hint: {exercise.hint}" in flat(result.message)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_every_notebook_exercise_cell_is_the_worked_answers_def_line_and_docstring(notebook):
    """The signature exists once, in the worked answer: the notebook's copy must not drift from it."""
    exercises = lesson_exercises(notebook.name[:2])
    cells = nbformat.read(notebook, 4).cells
    exercise_cells = [cell.source for cell in cells if "exercise" in cell.metadata.get("tags", [])]
    assert [source.rpartition("\n")[0] for source in exercise_cells] == [ex.signature for ex in exercises]
    assert all(source.endswith("\n    ...  # your code here") for source in exercise_cells)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_every_lesson_ends_with_its_exercises_each_followed_by_its_check(notebook):
    """1 to 4 exercises per lesson; the notebook's cells are the templates, unsolved, each followed by a
    sentence and its check cell, whose saved output is the "not written yet" verdict."""
    exercises = lesson_exercises(notebook.name[:2])
    assert 1 <= len(exercises) <= 4
    cells = nbformat.read(notebook, 4).cells
    exercise_cells = [index for index, cell in enumerate(cells) if "exercise" in cell.metadata.get("tags", [])]
    assert len(exercise_cells) == len(exercises)
    assert any(cell.source.startswith("## Exercises") for cell in cells[:exercise_cells[0]])
    for index, exercise in zip(exercise_cells, exercises):
        assert cells[index].source == exercise.template()
        assert cells[index - 1].cell_type == "markdown" and cells[index + 1].cell_type == "markdown"
        check_cell = cells[index + 2]
        assert check_cell.source == f'check("{exercise.key}", {exercise.function})'
        saved = "".join(output.get("text", "") for output in check_cell.outputs)
        assert saved == verdict(exercise.key, defined(exercise.template(), exercise.function)).message + "\n"


def test_checking_an_exercise_loads_no_later_lessons_code():
    """check("02.1", ...) imports lesson 02's exercises and nothing of a lesson after 02 (in a fresh process)."""
    program = ("import sys, nnlib.check; before = set(sys.modules); "
               "nnlib.check.check('02.1', lambda x, w, b: None); "
               "print(' '.join(sorted(set(sys.modules) - before)))")
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    loaded = run.stdout.split()
    assert "nnlib.exercises.lesson_02" in loaded
    lessons_of = {name: lesson_of(path) for name, path in modules(PACKAGE).items()}
    assert [name for name in loaded if lessons_of.get(name, 0) > 2] == []
    assert find("02.9") is None and find("99.1") is None and find("2.1") is None and find(None) is None


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_a_sentence_comes_before_every_code_cell(notebook):
    cells = nbformat.read(notebook, 4).cells
    for index, cell in enumerate(cells):
        if cell.cell_type == "code":
            assert index > 0 and cells[index - 1].cell_type == "markdown" and cells[index - 1].source.strip(), \
                f"{notebook.name}: code cell {index} has no sentence before it:\n{cell.source[:200]}"


def forward_right(inputs, weights, biases):
    return sigmoid(inputs @ weights + biases)


def backward_without_return(inputs, weights, activations, grad_activations):
    delta = grad_activations * activations * (1 - activations)  # noqa: F841 (half-finished on purpose)


def backward_name_error(inputs, weights, activations, grad_activations):
    delta = grad_activations * activations * (1 - activations)
    return inputs.T @ delt, delta.sum(axis=0), delta @ weights.T  # noqa: F821 (a typo, on purpose)


def backward_wrong_derivative(inputs, weights, activations, grad_activations):
    delta = grad_activations * sigmoid(activations) * (1 - sigmoid(activations))
    return inputs.T @ delta, delta.sum(axis=0), delta @ weights.T


# ---- lesson 14 (exercise 14.1, the staleness of each update): the mistakes a student makes ----
def staleness_counting_its_own_update(workers):
    """The answer's parameters taken as those before the worker's own update: one too stale."""
    sent, staleness = {}, []
    for version, worker in enumerate(workers):
        staleness.append(version - sent.get(worker, 0))
        sent[worker] = version
    return np.array(staleness)


def staleness_fresh_at_first(workers):
    """A worker's first gradient taken as fresh, although it comes from the first parameters (version 0)."""
    sent, staleness = {}, []
    for version, worker in enumerate(workers):
        staleness.append(version - sent.get(worker, version))
        sent[worker] = version + 1
    return np.array(staleness)


def top_k_without_error_feedback(gradient, residual, k):
    """Lesson 15's top-k forgetting the residual: what was not sent is lost."""
    sent = np.zeros_like(gradient)
    largest = np.argsort(np.abs(gradient))[-k:]
    sent[largest] = gradient[largest]
    return sent, gradient - sent


HALF_FINISHED = [
    ("02.1", ..., "not written", "`layer_forward` is still Ellipsis"),
    ("02.1", None, "not written", "`layer_forward` is still None"),
    ("02.1", 3.0, "not a function", "it is a float (3.0)"),
    ("02.1", lambda x, w, b: ..., "not written", "it returns `...`"),
    ("02.1", lambda x, w: x @ w, "raised", "raised TypeError"),
    ("02.1", lambda x, w, b: exit(), "raised", "raised SystemExit"),
    ("02.1", lambda x, w, b: (row for row in x), "kind", "not a number or an array of numbers"),
    ("02.1", lambda x, w, b: forward_right(x, w, b).T, "shape", "expected shape (5, 3): transposed?"),
    ("02.1", lambda x, w, b: forward_right(x, w, b)[:, 0], "shape", "returned shape (5,); expected shape (5, 3)."),
    ("02.1", lambda x, w, b: forward_right(x, w, b).astype(np.float32), "dtype", "keep the precision"),
    ("02.1", lambda x, w, b: forward_right(x, w, b).tolist(), "right", ""),  # a list of rows is fine
    ("02.1", lambda x, w, b: "sigmoid", "kind", "returned 'sigmoid', not a number or an array"),
    ("02.1", lambda x, w, b: [[1.0], [2.0, 3.0]], "kind", "rows of different lengths?"),
    ("02.1", lambda x, w, b: (x @ w + b) / 0.0, "not finite", "returned -inf at (0, 0)"),
    ("02.1", lambda x, w, b: sigmoid(x @ w), "values", "the first wrong element at (0, 0)"),
    ("02.2", backward_without_return, "not written", "it returns None"),
    ("02.2", backward_name_error, "raised", "raised NameError in `backward_name_error`, line"),
    ("02.2", lambda x, w, a, g: (x.T @ g, g.sum(axis=0)), "kind", "should return 3 results (a tuple)"),
    ("02.2", backward_wrong_derivative, "values", "result 1 of 3: wrong values, relative error"),
    ("03.2", lambda p, labels: int(np.sum(p.argmax(axis=1) == labels)), "dtype", "the answer has fractions"),
    ("04.1", lambda rows, ranks, length: ([rows // ranks] * ranks, [0] * ranks), "values",
     "scatterv_counts(10, 3, 4), result 1 of 2: 3 of 3 wrong; the first at (0,): got 3, expected 16."),
    ("04.1", lambda rows, ranks, length: (np.full(ranks, rows / ranks), np.zeros(ranks)), "dtype",
     "expected whole numbers (integers)"),
    ("05.1", lambda n_bytes, alpha, beta: alpha * n_bytes + beta, "values", "relative error"),  # alpha and beta swapped
    ("05.2", lambda programs: np.array([len(calls) for calls in programs]), "values",  # every call completes
     "calls_completed([['send 1', 'recv 1'], ['send 0', 'recv 0']]): 2 of 2 wrong; the first at (0,): got 2"),
    ("06.2", lambda batch, start, stop: batch[(batch >= start) & (batch < stop)], "values",
     "8, 16): 3 of 3 wrong; the first at (0,): got 8, expected 0."),  # sample numbers, not rows
    ("06.2", lambda batch, start, stop: np.sort(batch[(batch >= start) & (batch < stop)] - start), "values",
     "0, 8): 2 of 4 wrong; the first at (1,): got 2, expected 5."),  # sorted: not the batch's order
    ("06.2", lambda batch, start, stop: batch[(batch >= start) & (batch <= stop)] - start, "shape",
     "returned shape (5,); expected shape (4,)"),  # stop is not in the shard
    ("07.1", lambda ranks, s: 1 / (s + (1 - s) // ranks), "values", "relative error"),
    ("08.2", lambda batch, hidden, kernels, launch, gpu, cpu: 1, "dtype", "expected True/False values"),
    ("11.2", lambda hidden, weights, b: sum(h @ w + b for h, w in zip(hidden, weights)), "values", "wrong values"),
    ("12.2", lambda stages, stage, m, schedule: m if schedule == "gpipe" else stages - stage, "values",
     "micro_batches_alive(4, 1, 2, '1f1b'): 1 of 1 wrong; the first at the value: got 3, expected 2."),  # no min(., m)
    ("12.2", lambda stages, stage, m, schedule: m if schedule == "gpipe" else min(stages - stage - 1, m), "values",
     "micro_batches_alive(4, 0, 8, '1f1b'): 1 of 1 wrong; the first at the value: got 3, expected 4."),  # warm-up only
    ("12.2", lambda stages, stage, m, schedule: min(stages - stage, m), "values", "got 2, expected 4."),  # as 1F1B
    ("13.1", lambda arrived, size: [], "shape", "missing_ranks([0, 2], 3) returned shape (0,); expected shape (1,)"),
    ("13.1", lambda arrived, size: [0], "values", "got 0, expected 1"),
    ("99.9", forward_right, "unknown", "there is no exercise '99.9'"),
    # lesson 18's 18.3 (1F1B's instruction list):
    ("18.3", gpipe_order_instead, "values", "one_f_one_b_program(3, 0, 5), result 1 of 2"),
    ("18.3", one_f_one_b_warming_up(lambda stages, stage: stages - stage), "values",
     "one_f_one_b_program(3, 0, 5), result 1 of 2"),
    ("18.3", one_f_one_b_warming_up(lambda stages, stage: stages - stage - 1), "right", ""),  # the helpers are right
    ("18.3", sends_before_their_work, "values", "one_f_one_b_program(3, 0, 5), result 1 of 2"),
    ("18.3", messages_past_the_ends, "shape", "result 1 of 2 returned shape (30,); expected shape (20,)"),
    ("14.1", staleness_counting_its_own_update, "values", "got 2, expected 1"),
    ("14.1", staleness_fresh_at_first, "values", "got 0, expected 1"),
    ("14.1", lambda workers: np.zeros(len(workers)), "dtype", "expected whole numbers (integers)"),
    ("15.2", top_k_without_error_feedback, "values", "wrong values"),
] + FSDP_HALF_FINISHED  # lesson 16's, defined above

# Lesson 10's write-the-core exercises: the mistakes a student makes must fail, each with its message.
def buckets_forgetting_the_last(layer_bytes, bucket_bytes):
    started, bucket, filled = [], 0, 0
    for size in layer_bytes:
        filled += size
        started.append(bucket if filled >= bucket_bytes else -1)
        bucket, filled = (bucket + 1, 0) if filled >= bucket_bytes else (bucket, filled)
    return np.array(started)  # the last, part-full bucket is never sent: its gradients stay unsummed


def buckets_never_emptied(layer_bytes, bucket_bytes):
    started, bucket, filled = [], 0, 0
    for index, size in enumerate(layer_bytes):
        filled += size  # never set back to 0: once full, every later gradient starts a bucket of its own
        started.append(bucket if filled >= bucket_bytes or index == len(layer_bytes) - 1 else -1)
        bucket += started[-1] >= 0
    return np.array(started)


def buckets_started_over_the_size(layer_bytes, bucket_bytes):
    started, bucket, filled = [], 0, 0
    for index, size in enumerate(layer_bytes):
        filled += size
        full = filled > bucket_bytes or index == len(layer_bytes) - 1  # '>': a bucket filled to the byte waits
        started.append(bucket if full else -1)
        bucket, filled = (bucket + 1, 0) if full else (bucket, filled)
    return np.array(started)


def zero_with_own_gradient(params, grads, velocity, learning_rate, momentum):
    """No reduce-scatter: rank r updates its chunk with its own gradient only."""
    counts, starts = collectives.split_evenly(params.size, len(grads))
    after, new_velocity = params.copy(), []
    for rank, (start, count) in enumerate(zip(starts, counts)):
        new_velocity.append(momentum * velocity[rank] - learning_rate * grads[rank, start:start + count])
        after[start:start + count] += new_velocity[-1]
    return np.tile(after, (len(grads), 1)), tuple(new_velocity)


def zero_averaging(params, grads, velocity, learning_rate, momentum):
    """The ranks' gradients averaged (as if each were a whole batch's mean), not added."""
    return EXERCISES["10.2"].worked_answer(params, grads / len(grads), velocity, learning_rate, momentum)


def zero_without_allgather(params, grads, velocity, learning_rate, momentum):
    """Each rank updates its chunk, but nobody sends it on: rank r's other chunks stay as they were."""
    counts, starts = collectives.split_evenly(params.size, len(grads))
    after, new_velocity = np.tile(params, (len(grads), 1)), []
    for rank, (start, count) in enumerate(zip(starts, counts)):
        mine = slice(start, start + count)
        new_velocity.append(momentum * velocity[rank] - learning_rate * grads[:, mine].sum(axis=0))
        after[rank, mine] += new_velocity[-1]
    return after, tuple(new_velocity)


HALF_FINISHED += [
    ("10.1", buckets_forgetting_the_last, "values", "216793): 1 of 6 wrong; the first at (5,): got -1, expected 0."),
    ("10.1", buckets_never_emptied, "values", "4304): 4 of 6 wrong; the first at (2,): got 1, expected -1."),
    ("10.1", buckets_started_over_the_size, "values", "4304): 2 of 6 wrong; the first at (1,): got -1, expected 0."),
    ("10.1", lambda layer_bytes, bucket_bytes: np.arange(len(layer_bytes)), "values", "got 0, expected -1"),
    ("10.2", zero_with_own_gradient, "values", "result 1 of 2: wrong values"),
    ("10.2", zero_averaging, "values", "result 1 of 2: wrong values"),
    ("10.2", zero_without_allgather, "values", "result 1 of 2: wrong values"),
    ("10.2", lambda p, g, v, rate, mu: (p - rate * g, tuple(v)), "values",  # every rank: its own gradient, everywhere
     "result 1 of 2: wrong values, relative error"),
]


# -- lesson 05's exercise 05.2 (how far each rank gets when every Send waits for its Recv): wrong answers --------
def calls_with_buffered_sends(programs):
    """Wrong: every send completes at once (as if MPI buffered it), a recv once its message has been sent."""
    done, sent, progress = [0] * len(programs), [], True
    while progress:
        progress = False
        for rank, calls in enumerate(programs):
            if done[rank] < len(calls):
                kind, peer = calls[done[rank]].split()
                if kind == "send" or (int(peer), rank) in sent:
                    sent.append((rank, int(peer))) if kind == "send" else sent.remove((int(peer), rank))
                    done[rank], progress = done[rank] + 1, True
    return np.array(done)


def calls_matching(programs, matches, sweeps):
    """The worked answer's sweeps, with ``matches(sender, receiver's next call)`` deciding a match."""
    done = [0] * len(programs)
    for _ in range(sweeps):
        for sender, calls in enumerate(programs):
            if done[sender] < len(calls) and calls[done[sender]].startswith("send"):
                receiver = int(calls[done[sender]].split()[1])
                if done[receiver] < len(programs[receiver]) and matches(sender, programs[receiver][done[receiver]]):
                    done[sender], done[receiver] = done[sender] + 1, done[receiver] + 1
    return np.array(done)


HALF_FINISHED += [
    ("05.2", calls_with_buffered_sends, "values", "'recv 0']]): 2 of 2 wrong; the first at (0,): got 2, expected 0."),
    ("05.2", lambda programs: calls_matching(programs, lambda sender, call: call.startswith("recv"), 10), "values",
     "'recv 2'], ['recv 1']]): 2 of 3 wrong; the first at (0,): got 2, expected 1."),  # any recv taken for its own
    ("05.2", lambda programs: calls_matching(programs, lambda sender, call: call == f"recv {sender}", 1), "values",
     "got 1, expected 2"),  # one sweep over the ranks, not until nothing changes
]


HALF_FINISHED += [  # lesson 19's: a pipeline's compute; the fastest layout that fits
    ("19.1", lambda seconds, m: m * max(seconds), "values",
     "pipeline_compute_seconds([1.0, 1.0], 4): wrong values, relative error 2.0e-01"),  # the fill forgotten
    ("19.1", lambda seconds, m: m * sum(seconds), "values",
     "pipeline_compute_seconds([1.0, 1.0], 4): wrong values, relative error 6.0e-01"),  # no overlap of stages: one process's time
    ("19.1", lambda seconds, m: (m + len(seconds) - 1) * max(seconds), "values",
     "pipeline_compute_seconds([0.5, 2.0, 1.0], 1): wrong values, relative error 7.1e-01"),  # as if all were slowest
    ("19.2", lambda seconds, peaks, limit: int(np.argmin(seconds)), "values",
     "fastest_that_fits([3.0, 1.0, 2.0], [10, 30, 20], 25): 1 of 1 wrong"),  # the limit ignored
    ("19.2", lambda seconds, peaks, limit: min((i for i in range(len(seconds)) if peaks[i] < limit),
                                               key=lambda i: seconds[i], default=-1), "values",
     "fastest_that_fits([2.0, 2.0], [5, 5], 5): 1 of 1 wrong; the first at the value: got -1"),  # < for <=
]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the division by zero below is on purpose
@pytest.mark.parametrize("key, answer, reason, fragment", HALF_FINISHED)
def test_a_half_finished_answer_gets_a_helpful_message_and_check_never_raises(key, answer, reason, fragment, capsys):
    result = verdict(key, answer)
    assert result.reason == reason, result.message
    assert result.passed == (reason == "right")
    assert fragment in flat(result.message)
    assert max(len(line) for line in result.message.splitlines()) <= 100, "a projector shows 100 characters"
    if reason not in ("right", "unknown"):
        assert "\n  Hint: " in result.message
    check(key, answer)  # prints the same verdict, raises nothing
    assert capsys.readouterr().out == result.message + "\n"


def test_an_answer_that_changes_its_arguments_cannot_spoil_the_worked_answer():
    def scribbling_forward(inputs, weights, biases):
        result = sigmoid(inputs @ weights + biases)
        inputs *= 100
        weights[...] = 0
        return result

    assert verdict("02.1", scribbling_forward).passed


def test_the_worked_layer_backward_matches_finite_differences():
    """The check's own formula against the derivative of J = sum(g * sigma(a_prev W + b)) by central differences."""
    generator = np.random.default_rng(0)
    inputs, weights, biases = generator.normal(size=(4, 3)), generator.normal(size=(3, 2)), generator.normal(size=2)
    upstream = generator.normal(size=(4, 2))

    def cost(x, w, b):
        return np.sum(upstream * sigmoid(x @ w + b))

    analytic = layer_backward(inputs, weights, sigmoid(inputs @ weights + biases), upstream)
    for array, gradient in zip((weights, biases, inputs), analytic):
        numeric = np.zeros_like(array)
        for index in np.ndindex(array.shape):
            saved = array[index]
            array[index] = saved + 1e-6
            plus = cost(inputs, weights, biases)
            array[index] = saved - 1e-6
            minus = cost(inputs, weights, biases)
            array[index] = saved
            numeric[index] = (plus - minus) / 2e-6
        assert np.abs(numeric - gradient).max() / np.abs(gradient).max() < 1e-7


@pytest.mark.parametrize("ranks, length", [(2, 5), (3, 7), (4, 10)])
def test_ring_steps_leave_each_rank_its_complete_chunk(ranks, length):
    """P - 1 worked-answer ring steps: chunk r of rank r's buffer is the sum over all ranks, as in nnlib.lesson09_ring_allreduce.allreduce."""
    from nnlib.lesson04_collectives.collectives import split_evenly

    buffers = np.random.default_rng(1).normal(size=(ranks, length))
    after = buffers
    for step in range(ranks - 1):
        after = ring_step(after, step)
    counts, starts = split_evenly(length, ranks)
    total = buffers.sum(axis=0)
    for rank in range(ranks):
        part = slice(starts[rank], starts[rank] + counts[rank])
        assert np.allclose(after[rank, part], total[part], rtol=1e-12, atol=0)


def flat(message: str) -> str:
    """A verdict with its line breaks (it is wrapped at 100 characters) read as spaces."""
    return " ".join(message.split())
