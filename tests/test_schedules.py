"""Pipeline schedules on their own, without MPI: the instruction lists of every schedule are right.

nnlib.lesson12_pipeline.instructions' schedules are data: for each stage, the list of instructions its
executor runs. For every schedule, P <= 8 stages and m <= 32 micro-batches, these tests check:
every micro-batch is forwarded and backwarded exactly once per stage, with the messages that
carry it; every dependency holds (forward k on stage s after forward k on s-1; backward k on s
after backward k on s+1 and after forward k on s); the lists run to the end with blocking
receives (no deadlock); and the peak of live activations is as stated (GPipe: m on every stage;
1F1B: min(P - s, m) on stage s). Each check is also shown failing on a deliberately broken schedule.
"""

from collections import Counter

import pytest

from nnlib.lesson12_pipeline.bubbles import simulate
from nnlib.lesson12_pipeline.instructions import SCHEDULES, Instruction

CASES = [(stages, micro_batches) for stages in range(1, 9) for micro_batches in (1, 2, 3, 5, 8, 13, 32)]


def unit_times(stage, kind):
    """Forward 1, backward 2 on every stage."""
    return {"forward": 1.0, "backward": 2.0}[kind]


def each_micro_batch_once(programs, micro_batches):
    """Problems with the instructions' counts: each (kind, k) once per stage, messages only where they go."""
    stages, problems = len(programs), []
    for stage, instructions in enumerate(programs):
        wanted = {"forward": 1, "backward": 1, "recv_forward": stage > 0, "send_forward": stage < stages - 1,
                  "recv_backward": stage < stages - 1, "send_backward": stage > 0}
        counts = Counter((instruction.kind, instruction.micro_batch) for instruction in instructions)
        expected = Counter({(kind, k): int(times) for kind, times in wanted.items() for k in range(micro_batches)
                            if times})
        if counts != expected:
            problems.append(f"stage {stage}: {sorted((counts - expected).items())} too many, "
                            f"{sorted((expected - counts).items())} missing")
    return problems


def dependency_violations(programs):
    """Problems with the order of work, from one run of the lists on a clock (blocking receives)."""
    timelines = simulate(programs, unit_times)
    begin = {(stage, kind, k): start for stage, timeline in enumerate(timelines) for kind, k, start, _ in timeline}
    end = {(stage, kind, k): finish for stage, timeline in enumerate(timelines) for kind, k, _, finish in timeline}
    problems = []
    for (stage, kind, k), start in begin.items():
        needs = [(stage, "F", k)] if kind == "B" else []
        needs += [(stage - 1, "F", k)] if kind == "F" and stage > 0 else []
        needs += [(stage + 1, "B", k)] if kind == "B" and stage < len(programs) - 1 else []
        problems += [f"{kind}{k} on stage {stage} starts at {start} before {need} ends"
                     for need in needs if need not in end or end[need] > start]
    return problems


def peak_live_activations(instructions):
    """The most micro-batches forwarded and not yet backwarded, along one stage's list."""
    alive = peak = 0
    for instruction in instructions:
        alive += {"forward": 1, "backward": -1}.get(instruction.kind, 0)
        peak = max(peak, alive)
    return peak


EXPECTED_PEAK = {"gpipe": lambda stage, stages, m: m, "1f1b": lambda stage, stages, m: min(stages - stage, m)}


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_every_micro_batch_runs_once_per_stage_with_its_messages(schedule):
    for stages, micro_batches in CASES:
        programs = SCHEDULES[schedule](stages, micro_batches)
        assert len(programs) == stages
        assert each_micro_batch_once(programs, micro_batches) == [], (stages, micro_batches)


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_every_dependency_holds_and_nothing_deadlocks(schedule):
    for stages, micro_batches in CASES:
        assert dependency_violations(SCHEDULES[schedule](stages, micro_batches)) == [], (stages, micro_batches)


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_peak_live_activations_are_as_stated(schedule):
    for stages, micro_batches in CASES:
        peaks = [peak_live_activations(instructions) for instructions in SCHEDULES[schedule](stages, micro_batches)]
        assert peaks == [EXPECTED_PEAK[schedule](stage, stages, micro_batches) for stage in range(stages)]


def test_the_1f1b_lists_read_as_the_textbook_order():
    programs = SCHEDULES["1f1b"](3, 4)
    work = [[f"{instruction.kind[0].upper()}{instruction.micro_batch}" for instruction in instructions
             if instruction.kind in ("forward", "backward")] for instructions in programs]
    assert work == [["F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"],
                    ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"],
                    ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]]
    assert programs[1][:3] == [Instruction("recv_forward", 0), Instruction("forward", 0), Instruction("send_forward", 0)]


# -- each check fails on a broken schedule --------------------------------------------------------

def without(programs, stage, unwanted):
    return [[i for i in instructions if not (s == stage and i == unwanted)] for s, instructions in enumerate(programs)]


def test_the_counting_check_catches_a_missing_or_doubled_micro_batch():
    programs = SCHEDULES["gpipe"](3, 4)
    assert each_micro_batch_once(without(programs, 1, Instruction("backward", 2)), 4)
    doubled = [instructions + [Instruction("forward", 0)] if stage == 2 else instructions
               for stage, instructions in enumerate(programs)]
    assert each_micro_batch_once(doubled, 4)


def test_the_dependency_check_catches_work_that_does_not_wait_for_its_message():
    # stage 1 forwards micro-batch 0 without receiving it: it could run before stage 0's forward
    programs = without(SCHEDULES["1f1b"](2, 3), 1, Instruction("recv_forward", 0))
    programs[0] = [i for i in programs[0] if i != Instruction("send_forward", 0)]
    assert dependency_violations(programs)
    # a backward before its own forward, on the last stage
    broken = SCHEDULES["gpipe"](2, 2)
    forward, backward = broken[1].index(Instruction("forward", 1)), broken[1].index(Instruction("backward", 1))
    broken[1][forward], broken[1][backward] = broken[1][backward], broken[1][forward]
    assert any("B1 on stage 1" in problem for problem in dependency_violations(broken))


def test_a_deadlocking_schedule_is_caught():
    # stage 0 waits for backward 0 before sending forward 1, stage 1 wants forward 1 before it sends backward 0
    programs = SCHEDULES["gpipe"](2, 2)
    programs[1] = [Instruction("recv_forward", 0), Instruction("forward", 0), Instruction("recv_forward", 1),
                   Instruction("forward", 1), Instruction("backward", 0), Instruction("send_backward", 0),
                   Instruction("backward", 1), Instruction("send_backward", 1)]
    programs[0] = [Instruction("forward", 0), Instruction("send_forward", 0), Instruction("recv_backward", 0),
                   Instruction("forward", 1), Instruction("send_forward", 1), Instruction("backward", 0),
                   Instruction("recv_backward", 1), Instruction("backward", 1)]
    with pytest.raises(RuntimeError, match="deadlocks: stage 0 waits in .*recv_backward.*stage 1 waits in"):
        simulate(programs, unit_times)


def test_messages_received_out_of_order_or_never_are_caught():
    programs = SCHEDULES["gpipe"](2, 2)
    swapped = [Instruction("recv_forward", 1) if i == Instruction("recv_forward", 0) else
               Instruction("recv_forward", 0) if i == Instruction("recv_forward", 1) else i for i in programs[1]]
    with pytest.raises(RuntimeError, match="messages arrive in the order they were sent"):
        simulate([programs[0], swapped], unit_times)
    with pytest.raises(RuntimeError, match="sends what no stage receives"):
        simulate([programs[0], programs[1] + [Instruction("send_backward", 1)]], unit_times)


def test_the_peak_check_catches_a_schedule_that_keeps_too_much():
    programs = SCHEDULES["gpipe"](3, 6)  # GPipe keeps all 6 alive; 1F1B's bound on stage 1 is 2
    assert [peak_live_activations(p) for p in programs] != [EXPECTED_PEAK["1f1b"](s, 3, 6) for s in range(3)]
