"""Pipeline schedules as data: for each stage, the list of instructions it runs in order.

A schedule is a function (stages, micro_batches) -> for each stage, the list of :class:`Instruction` s it
runs in order: "recv_forward", "forward", "send_forward", "recv_backward", "backward", "send_backward", each
for one micro-batch. One executor (nnlib.lesson09_model_parallel.pipeline's
:meth:`~nnlib.lesson09_model_parallel.pipeline.PipelineMLP.loss_and_gradient`) runs any schedule, and
:func:`simulate` runs the same lists on a clock, so a schedule is tested and its bubble predicted without
MPI (as in ShallowSpeed's pipe.py and schedule.py). Two schedules of the same work (Huang et al. 2019,
GPipe; Narayanan et al. 2019, PipeDream):

``gpipe``  every stage runs all m forwards, then all m backwards. Simple; each stage keeps the
           activations of all m micro-batches until their backward.
``1f1b``   stage s runs P - s - 1 forwards to fill the pipe, then alternates one forward, one
           backward, then drains. The same idle time, but at most P - s micro-batches alive.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass

LESSON = 9


#: The messages: each instruction's direction and the step from the stage that runs it to the channel's receiver
#: (a send goes to the next or the previous stage; a receive listens on its own stage's channel).
MESSAGES = {"send_forward": ("forward", +1), "recv_forward": ("forward", 0),
            "send_backward": ("backward", -1), "recv_backward": ("backward", 0)}


#: The computing instructions, and their letter in a timeline (F3: the forward of micro-batch 3).
COMPUTE = {"forward": "F", "backward": "B"}


@dataclass(frozen=True)
class Instruction:
    """One step of a stage's schedule: ``kind`` (a key of MESSAGES or COMPUTE) for micro-batch ``micro_batch``."""

    kind: str
    micro_batch: int


def program(stage: int, stages: int, order) -> list[Instruction]:
    """A stage's instructions from its order of work [(kind, k)], kind "forward" or "backward", messages included:
    receive the input (unless the first stage), forward, send it on (unless the last); receive the output's
    gradient (unless the last), backward, send the input's gradient back (unless the first)."""
    first, last, instructions = stage == 0, stage == stages - 1, []
    for kind, k in order:
        if kind == "forward":
            instructions += [Instruction("recv_forward", k)] if not first else []
            instructions += [Instruction("forward", k)] + ([Instruction("send_forward", k)] if not last else [])
        else:
            instructions += [Instruction("recv_backward", k)] if not last else []
            instructions += [Instruction("backward", k)] + ([Instruction("send_backward", k)] if not first else [])
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


def simulate(programs, seconds, letters=COMPUTE, position=None) -> list[list[tuple]]:
    """Run every stage's instructions on a clock, as the executor runs them; return the timelines.

    programs: a schedule's lists (one per stage). seconds(stage, kind): how long a computing
    instruction takes there. A send takes no time and never waits (MPI's Isend); a receive waits
    until the message has been sent, and takes the oldest one on its channel (MPI's order: one
    channel per direction and receiving stage), which must be the micro-batch it names.
    letters: the computing kinds and their letters; position(stage, instruction): the place in the pipe of
    the stage that runs it (default: the stage itself; lesson 13's virtual stages say otherwise).
    Returns each stage's [(letter, k, start, end)] of its computations, like PipelineMLP.timeline.
    Raises RuntimeError if the schedule deadlocks, receives out of order, or sends what nobody receives.
    """
    position = position or (lambda stage, instruction: stage)
    at, clock = [0] * len(programs), [0.0] * len(programs)
    channels = defaultdict(deque)  # (direction, receiving position) -> [(micro-batch, time sent)]
    timelines = [[] for _ in programs]
    progressed = True
    while progressed:
        progressed = False
        for stage, instructions in enumerate(programs):
            while at[stage] < len(instructions):
                instruction = instructions[at[stage]]
                if instruction.kind in MESSAGES:
                    direction, step = MESSAGES[instruction.kind]
                    channel = channels[direction, position(stage, instruction) + step]
                    if instruction.kind.startswith("send"):
                        channel.append((instruction.micro_batch, clock[stage]))
                    elif not channel:
                        break  # blocked: the message has not been sent yet
                    else:
                        clock[stage] = max(clock[stage], received(channel, instruction, stage))
                else:
                    began, clock[stage] = clock[stage], clock[stage] + seconds(stage, instruction.kind)
                    timelines[stage].append((letters[instruction.kind], instruction.micro_batch, began, clock[stage]))
                at[stage] += 1
                progressed = True
    check_finished(programs, at, channels)
    return timelines


def received(channel, instruction: Instruction, stage: int) -> float:
    """Take the oldest message of ``channel`` for ``instruction`` (a receive); the time it was sent."""
    micro_batch, sent = channel.popleft()
    if micro_batch != instruction.micro_batch:
        raise RuntimeError(f"stage {stage} runs {instruction} but the next message on its channel is micro-batch "
                           f"{micro_batch}: messages arrive in the order they were sent")
    return sent


def check_finished(programs, at, channels) -> None:
    """RuntimeError unless every stage ran all its instructions and every message was received."""
    stuck = [f"stage {stage} waits in {instructions[at[stage]]}"
             for stage, instructions in enumerate(programs) if at[stage] < len(instructions)]
    if stuck:
        raise RuntimeError("the schedule deadlocks: " + "; ".join(stuck))
    unread = [f"{len(channel)} {direction} message(s) to position {receiver}"
              for (direction, receiver), channel in channels.items() if channel]
    if unread:
        raise RuntimeError("the schedule sends what no stage receives: " + "; ".join(unread))
