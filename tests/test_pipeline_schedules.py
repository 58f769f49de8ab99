"""Lesson 18's schedules on their own, without MPI: interleaved 1F1B, ZB-H1 and ZB-H2 as instruction lists.

For P <= 8 stages, m <= 32 micro-batches (and v = 2, 3 chunks for interleaved): every (micro-batch,
chunk) is forwarded, backwarded (B and W, or the whole backward) once per stage with the messages
that carry it; every dependency holds on a clock (forward k of virtual stage j after that of j - 1,
B after B of j + 1 and after its own forward, W after its B); the lists run to the end with
blocking receives (no deadlock); the peak of micro-batches alive is as the module states. With equal
stages the simulation gives the formulas exactly at P = 2 and 4. Each check is shown failing on a
broken schedule. A custom split of the layers over the (virtual) stages is used as given, and
checked; balanced_split gives the notebook's network stages of equal work.
"""

import re
from collections import Counter

import pytest

from nnlib.lesson18_pipeline_schedules.demo import LAYER_SIZES, balanced_layouts
from nnlib.lesson18_pipeline_schedules.schedules import (ChunkInstruction, balanced_split, bubble_formula, chunk_of,
                                                          interleaved, schedule_bubble, schedule_programs,
                                                          simulated_timelines, virtual_stage_layers)

CASES = [(stages, micro_batches) for stages in range(1, 9) for micro_batches in (1, 2, 3, 5, 8, 13, 32)]
NEW = [("interleaved", 2), ("interleaved", 3), ("zb-h1", 1), ("zb-h2", 1)]
SECONDS = {"forward": 1.0, "backward": 3.0, "backward_input": 1.5, "backward_weight": 1.5}


def computed(instruction):
    return instruction.kind in ("forward", "backward", "backward_input", "backward_weight")


def count_problems(programs, micro_batches, chunks):
    """Each (kind, k, chunk) of work once per stage; each message once, where a neighbour exists."""
    stages, problems = len(programs), []
    for stage, instructions in enumerate(programs):
        split = any(i.kind == "backward_input" for i in instructions)
        work = ("forward", "backward_input", "backward_weight") if split else ("forward", "backward")
        expected = Counter()
        for chunk in range(chunks):
            virtual = chunk * stages + stage
            kinds = list(work) + (["recv_forward", "send_backward"] if virtual > 0 else [])
            kinds += ["send_forward", "recv_backward"] if virtual < chunks * stages - 1 else []
            expected.update((kind, k, chunk) for kind in kinds for k in range(micro_batches))
        got = Counter((i.kind, i.micro_batch, chunk_of(i)) for i in instructions)
        if got != expected:
            problems.append(f"stage {stage}: {sorted((got - expected).items())[:3]} too many, "
                            f"{sorted((expected - got).items())[:3]} missing")
    return problems


def dependency_problems(programs, chunks):
    """Work that starts before what it needs has ended, from one run of the lists on a clock."""
    stages = len(programs)
    timelines = simulated_timelines(programs, lambda stage, kind: SECONDS[kind])
    span = {}
    for stage, (instructions, timeline) in enumerate(zip(programs, timelines)):
        work = [i for i in instructions if computed(i)]
        for instruction, (letter, k, start, end) in zip(work, timeline):
            span[letter, k, chunk_of(instruction) * stages + stage] = (start, end)
    last, problems = chunks * stages - 1, []
    for (letter, k, virtual), (start, _) in span.items():
        needs = {"F": [("F", k, virtual - 1)] if virtual > 0 else [],
                 "B": [("F", k, virtual)] + ([("B", k, virtual + 1)] if virtual < last else []),
                 "W": [("B", k, virtual)]}[letter]
        problems += [f"{letter}{k} of virtual stage {virtual} starts at {start} before {need} ends"
                     for need in needs if need not in span or span[need][1] > start]
    return problems


def peaks(instructions):
    """The most (micro-batch, chunk) pairs forwarded and not yet through their last backward."""
    alive = peak = 0
    for instruction in instructions:
        alive += {"forward": 1, "backward": -1, "backward_weight": -1}.get(instruction.kind, 0)
        peak = max(peak, alive)
    return peak


def expected_peak(name, stage, stages, m, chunks):
    group = m if m < stages else -(-m // (m // stages))  # the first group: as even as possible, earlier larger
    return {"interleaved": min((chunks - 1) * group + 2 * (stages - stage - 1) + 1, chunks * m),
            "zb-h1": min(stages, m), "zb-h2": 2 * stages - 1 if m >= 2 * stages - 1 else min(stages, m)}[name]


@pytest.mark.parametrize("name, chunks", NEW)
def test_every_unit_of_work_and_message_once(name, chunks):
    for stages, m in CASES:
        programs = schedule_programs(name, stages, m, chunks)
        assert len(programs) == stages
        assert count_problems(programs, m, chunks) == [], (stages, m)


@pytest.mark.parametrize("name, chunks", NEW)
def test_every_dependency_holds_and_nothing_deadlocks(name, chunks):
    for stages, m in CASES:
        assert dependency_problems(schedule_programs(name, stages, m, chunks), chunks) == [], (stages, m)


@pytest.mark.parametrize("name, chunks", NEW)
def test_peak_alive_is_as_stated(name, chunks):
    for stages, m in CASES:
        got = [peaks(instructions) for instructions in schedule_programs(name, stages, m, chunks)]
        assert got == [expected_peak(name, s, stages, m, chunks) for s in range(stages)], (stages, m, got)


def test_zb_h1_keeps_1f1b_count_waiting_for_b():
    for stages, m in CASES:
        for stage, instructions in enumerate(schedule_programs("zb-h1", stages, m)):
            waiting = peak = 0
            for instruction in instructions:
                waiting += {"forward": 1, "backward_input": -1}.get(instruction.kind, 0)
                peak = max(peak, waiting)
            assert peak == min(stages - stage, m), (stages, m, stage)


@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("name, chunks", [("1f1b", 1), ("gpipe", 1)] + NEW)
def test_the_simulation_gives_the_formula_for_equal_stages(stages, name, chunks):
    times = [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (2.0, 1.0, 1.0), (1.0, 1.0, 0.5), (3.0, 2.0, 1.0)]
    counts = (stages, 2 * stages, 3 * stages)  # zb-h2 at m = P < 2P - 1: ZB-H1's lists and formula
    for forward, backward, weight in times:
        for m in counts:
            equal = [dict(F=forward, B=backward, W=weight)] * stages
            simulated = schedule_bubble(name, equal, m, chunks)
            assert simulated == pytest.approx(bubble_formula(name, stages, m, (forward, backward, weight), chunks),
                                              abs=1e-12), (forward, backward, weight, m)


def test_zb_h2_never_idles_more_than_zb_h1():
    """With m < 2P - 1, ZB-H2's own warm-up and deferral idled more than ZB-H1 (P = 3, m = 3: 0.250 against
    0.182, equal F, B, W); there it runs ZB-H1's lists, and from m = 2P - 1 on its own, which idle less."""
    for stages in range(2, 9):
        for m in range(1, 3 * stages):
            for forward, backward, weight in [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (2.0, 1.0, 1.0), (3.0, 2.0, 1.0)]:
                equal = [dict(F=forward, B=backward, W=weight)] * stages
                h1, h2 = (schedule_bubble(name, equal, m) for name in ("zb-h1", "zb-h2"))
                assert h2 <= h1 + 1e-12, (stages, m, forward, backward, weight, h2, h1)
                if m < 2 * stages - 1:
                    assert h2 == pytest.approx(h1, abs=1e-12), (stages, m)
    assert schedule_bubble("zb-h2", [dict(F=1.0, B=1.0, W=1.0)] * 3, 3) == pytest.approx(2 / 11)  # ZB-H1's


def test_the_new_schedules_shrink_the_bubble_as_stated():
    one_f_one_b = bubble_formula("1f1b", 4, 8)
    assert bubble_formula("zb-h1", 4, 8) < one_f_one_b and bubble_formula("interleaved", 4, 8, chunks=2) < one_f_one_b
    zb_h1 = bubble_formula("zb-h1", 4, 8)  # idle / busy: a third of 1F1B's when F = B = W
    assert zb_h1 / (1 - zb_h1) == pytest.approx(one_f_one_b / (1 - one_f_one_b) / 3)


# -- each check fails on a broken schedule -----------------------------------------------------------

def test_the_checks_catch_broken_lists():
    programs = schedule_programs("zb-h1", 3, 4)
    assert count_problems([p[:-1] if s == 1 else p for s, p in enumerate(programs)], 4, 1)
    early = [list(p) for p in programs]  # stage 2's first W moved before its B
    w, b = early[2].index(ChunkInstruction("backward_weight", 0)), early[2].index(ChunkInstruction("backward_input", 0))
    early[2][w], early[2][b] = early[2][b], early[2][w]
    assert any("W0 of virtual stage 2" in problem for problem in dependency_problems(early, 1))
    assert peaks(schedule_programs("zb-h2", 3, 6)[0]) > peaks(schedule_programs("zb-h1", 3, 6)[0])


def test_a_chunk_order_that_deadlocks_is_caught():
    programs = interleaved(2, 2, 2)
    stuck = [[i for i in p if not (i.kind == "send_forward" and i.chunk == 0)] if s == 1 else p
             for s, p in enumerate(programs)]
    with pytest.raises(RuntimeError, match="deadlocks"):
        simulated_timelines(stuck, lambda stage, kind: 1.0)


# -- custom and balanced splits of the layers ----------------------------------------------------------

def test_a_custom_split_is_used_as_given():
    assert virtual_stage_layers(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]  # as even as possible
    assert virtual_stage_layers(10, 4, (3, 2, 2, 3)) == [(0, 3), (3, 5), (5, 7), (7, 10)]
    assert virtual_stage_layers(10, 2, [5, 5]) == [(0, 5), (5, 10)]


@pytest.mark.parametrize("split, words", [((3, 2, 2), "each of the 4 (virtual) stages a positive number"),
                                          ((3, 0, 4, 3), "each of the 4 (virtual) stages"),
                                          ((3, 2.0, 2, 3), "a positive number of layers, e.g. (3, 3, 2, 2)"),
                                          ((3, 2, 2, 2), "split (3, 2, 2, 2) holds 9 layers but the network has 10"),
                                          ("3223", "got '3223'")])
def test_a_bad_split_says_what_is_wrong(split, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        virtual_stage_layers(10, 4, split)


def work_units(layer_sizes, first: int, stop: int, virtual: int):
    """(F, B, W) multiply-adds per sample of the virtual stage holding layers first..stop-1: a layer's
    forward and weight gradient n_in n_out each, its input gradient n_in n_out unless it is the network's
    first layer (whose input gradient nobody needs)."""
    products = [layer_sizes[layer] * layer_sizes[layer + 1] for layer in range(first, stop)]
    return sum(products), sum(products) - (products[0] if virtual == 0 else 0), sum(products)


@pytest.mark.parametrize("ranks", [2, 4])
def test_balanced_split_gives_every_virtual_stage_the_same_work(ranks):
    assert balanced_split(10, 4) == (3, 2, 2, 3) and balanced_split(10, 2) == (5, 5)
    for name, split in balanced_layouts(ranks).items():
        ranges = virtual_stage_layers(len(LAYER_SIZES) - 1, len(split), split)
        units = [work_units(LAYER_SIZES, first, stop, virtual) for virtual, (first, stop) in enumerate(ranges)]
        for kind in range(3):  # the narrow layers add under 15% of a wide one's product to the end stages
            low, high = min(unit[kind] for unit in units), max(unit[kind] for unit in units)
            assert high <= low + 0.15 * LAYER_SIZES[1] ** 2, (name, ranks, split, units)
        even = virtual_stage_layers(len(LAYER_SIZES) - 1, len(split))  # where it differs, the even one is not balanced
        even_forward = [work_units(LAYER_SIZES, first, stop, virtual)[0] for virtual, (first, stop) in enumerate(even)]
        if even != ranges:
            assert max(even_forward) - min(even_forward) >= 0.5 * LAYER_SIZES[1] ** 2, (name, ranks, even)


def test_balanced_split_needs_a_wide_layer_per_virtual_stage():
    with pytest.raises(ValueError, match="cannot give each of 9 virtual stages a wide layer"):
        balanced_split(10, 9)


def test_the_scheduled_pipeline_checks_its_split():
    from mpi4py import MPI

    from nnlib.lesson18_pipeline_schedules.schedules import ScheduledPipeline

    assert ScheduledPipeline(MPI.COMM_SELF, (6, 5, 4, 3), chunks=(3,)).chunk_ranges == [(0, 3)]
    with pytest.raises(ValueError, match=re.escape("split (2,) holds 2 layers but the network has 3 weight layers")):
        ScheduledPipeline(MPI.COMM_SELF, (6, 5, 4, 3), chunks=(2,))
