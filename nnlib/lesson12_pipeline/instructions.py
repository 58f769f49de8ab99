"""Pipeline schedules as data: for each stage, the list of instructions it runs in order.

A schedule is a function (stages, micro_batches) -> for each stage, the list of :class:`Instruction` s it
runs in order: "recv_forward", "forward", "send_forward", "recv_backward", "backward", "send_backward", each
for one micro-batch. One executor (PipelineMLP.loss_and_gradient) runs any schedule, and bubbles.simulate
runs the same lists on a clock, without MPI (as in ShallowSpeed's pipe.py and schedule.py). Two schedules of
the same work (Huang et al. 2019, GPipe; Narayanan et al. 2019, PipeDream):

``gpipe``  every stage runs all m forwards, then all m backwards. Simple; each stage keeps the
           activations of all m micro-batches until their backward.
``1f1b``   stage s runs P - s - 1 forwards to fill the pipe, then alternates one forward, one
           backward, then drains. The same idle time, but at most P - s micro-batches alive.
"""

from __future__ import annotations

from dataclasses import dataclass

LESSON = 12


#: The computing instructions, and their letter in a timeline (F3: the forward of micro-batch 3).
COMPUTE = {"forward": "F", "backward": "B"}


@dataclass(frozen=True)
class Instruction:
    """One step of a stage's schedule: ``kind`` (a message kind or a key of COMPUTE) for micro-batch ``micro_batch``."""

    kind: str
    micro_batch: int


def program(stage: int, stages: int, order) -> list[Instruction]:
    """A stage's instructions from its order of work [(kind, k)], kind "forward" or a backward, messages included:
    receive the input (unless the first stage), forward, send it on (unless the last); receive the output's
    gradient (unless the last), backward, send the input's gradient back (unless the first)."""
    first, last, instructions = stage == 0, stage == stages - 1, []
    for kind, k in order:
        if kind == "forward":
            instructions += [Instruction("recv_forward", k)] if not first else []
            instructions += [Instruction("forward", k)] + ([Instruction("send_forward", k)] if not last else [])
        else:  # a backward (or lesson 18's B, which sends what a backward sends)
            instructions += [Instruction("recv_backward", k)] if not last else []
            instructions += [Instruction(kind, k)] + ([Instruction("send_backward", k)] if not first else [])
    return instructions


def gpipe(stages: int, micro_batches: int) -> list[list[Instruction]]:
    """GPipe: on every stage all m forwards, then all m backwards (in the same order)."""
    order = [("forward", k) for k in range(micro_batches)] + [("backward", k) for k in range(micro_batches)]
    return [program(stage, stages, order) for stage in range(stages)]


def one_f_one_b(stages: int, micro_batches: int) -> list[list[Instruction]]:
    """1F1B: stage s runs w = min(P - s - 1, m) forwards, then alternates forward k + w and backward k, then drains."""
    programs = []
    for stage in range(stages):
        warmup = min(stages - stage - 1, micro_batches)
        order = [("forward", k) for k in range(warmup)]
        for k in range(micro_batches - warmup):
            order += [("forward", warmup + k), ("backward", k)]
        order += [("backward", k) for k in range(micro_batches - warmup, micro_batches)]
        programs.append(program(stage, stages, order))
    return programs


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b}
