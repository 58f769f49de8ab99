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

Lesson 13 (nnlib.lesson13_pipeline_schedules.schedules) adds interleaved 1F1B and the zero-bubble schedules
as more such lists, for the same executor.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass

LESSON = 9


#: Where each message goes: a send's (direction, stage step) and a receive's (direction, the sender's step).
SENDS = {"send_forward": ("forward", +1), "send_backward": ("backward", -1)}
RECEIVES = {"recv_forward": ("forward", -1), "recv_backward": ("backward", +1)}


#: The computing instructions, and their letter in a timeline (F3: the forward of micro-batch 3).
COMPUTE = {"forward": "F", "backward": "B", "backward_input": "B", "backward_weight": "W"}


@dataclass(frozen=True)
class Instruction:
    """One step of a stage's schedule.

    kind:        "recv_forward", "forward", "send_forward", "recv_backward", "backward" or "send_backward";
                 or the backward split in two: "backward_input" (every layer's delta and the input
                 gradient sent back: B) and "backward_weight" (the weight gradients a_in.T @ delta: W),
                 which a schedule may run later than B
    micro_batch: k, which micro-batch (0 .. m-1)
    chunk:       which of the stage's model chunks (0 here: one slice of layers per stage). A stage
                 with v chunks holds v slices of layers; chunk c of stage s is *virtual stage* c P + s
                 of v P, and messages go from virtual stage j to j + 1 (forward) or j - 1 (backward).
    """

    kind: str
    micro_batch: int
    chunk: int = 0


def forward_steps(stage: int, stages: int, micro_batch: int, chunk: int = 0, chunks: int = 1,
                  kind: str = "forward") -> list[Instruction]:
    """Receive the activation (unless the first virtual stage), run the forward, send it on (unless the last)."""
    virtual = chunk * stages + stage
    steps = [Instruction("recv_forward", micro_batch, chunk)] if virtual > 0 else []
    steps.append(Instruction(kind, micro_batch, chunk))
    return steps + ([Instruction("send_forward", micro_batch, chunk)] if virtual < chunks * stages - 1 else [])


def backward_steps(stage: int, stages: int, micro_batch: int, chunk: int = 0, chunks: int = 1,
                   kind: str = "backward") -> list[Instruction]:
    """Receive the output gradient (unless the last virtual stage), run the backward, send the input gradient back.

    kind: "backward", or "backward_input" (B of the split backward, which sends what "backward" sends).
    """
    virtual = chunk * stages + stage
    steps = [Instruction("recv_backward", micro_batch, chunk)] if virtual < chunks * stages - 1 else []
    steps.append(Instruction(kind, micro_batch, chunk))
    return steps + ([Instruction("send_backward", micro_batch, chunk)] if virtual > 0 else [])


def weight_steps(stage: int, stages: int, micro_batch: int, chunk: int = 0, chunks: int = 1,
                 kind: str = "backward_weight") -> list[Instruction]:
    """W of the split backward: no message, only this stage's weight gradients of micro-batch k."""
    return [Instruction(kind, micro_batch, chunk)]


STEPS = {"forward": forward_steps, "backward": backward_steps, "backward_input": backward_steps,
         "backward_weight": weight_steps}


def program(stage: int, stages: int, order, chunks: int = 1) -> list[Instruction]:
    """A stage's instructions from its order of work, messages included.

    order: [(kind, k)] or [(kind, k, chunk)], kind "forward", "backward", "backward_input" or
    "backward_weight"; chunks: v, the model chunks of every stage (1 unless interleaved).
    """
    instructions = []
    for kind, k, *chunk in order:
        instructions += STEPS[kind](stage, stages, k, *(chunk or [0]), chunks, kind=kind)
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


def simulate(programs, seconds) -> list[list[tuple]]:
    """Run every stage's instructions on a clock, as the executor runs them; return the timelines.

    programs: a schedule's lists (one per stage). seconds(stage, kind): how long a computing
    instruction takes there. A send takes no time and never waits (MPI's Isend); a receive waits
    until the message has been sent, and takes the oldest one on its channel (MPI's order: one
    channel per sending and receiving virtual stage), which must be the micro-batch it names.
    Returns each stage's [(letter, k, start, end)] of its computations, like PipelineMLP.timeline.
    Raises RuntimeError if the schedule deadlocks, receives out of order, or sends what nobody receives.
    """
    stages = len(programs)
    position, clock = [0] * stages, [0.0] * stages
    channels = defaultdict(deque)  # (direction, receiving virtual stage) -> [(micro-batch, time sent)]
    timelines = [[] for _ in programs]
    progressed = True
    while progressed:
        progressed = False
        for stage, instructions in enumerate(programs):
            while position[stage] < len(instructions):
                instruction = instructions[position[stage]]
                virtual = instruction.chunk * stages + stage
                if instruction.kind in RECEIVES:
                    channel = channels[RECEIVES[instruction.kind][0], virtual]
                    if not channel:
                        break  # blocked: the message has not been sent yet
                    clock[stage] = max(clock[stage], received(channel, instruction, stage))
                elif instruction.kind in SENDS:
                    direction, step = SENDS[instruction.kind]
                    channels[direction, virtual + step].append((instruction.micro_batch, clock[stage]))
                else:
                    began, clock[stage] = clock[stage], clock[stage] + seconds(stage, instruction.kind)
                    timelines[stage].append((COMPUTE[instruction.kind], instruction.micro_batch, began, clock[stage]))
                position[stage] += 1
                progressed = True
    check_finished(programs, position, channels)
    return timelines


def received(channel, instruction: Instruction, stage: int) -> float:
    """Take the oldest message of ``channel`` for ``instruction`` (a receive); the time it was sent."""
    micro_batch, sent = channel.popleft()
    if micro_batch != instruction.micro_batch:
        raise RuntimeError(f"stage {stage} runs {instruction} but the next message on its channel is micro-batch "
                           f"{micro_batch}: messages arrive in the order they were sent")
    return sent


def check_finished(programs, position, channels) -> None:
    """RuntimeError unless every stage ran all its instructions and every message was received."""
    stuck = [f"stage {stage} waits in {instructions[position[stage]]}"
             for stage, instructions in enumerate(programs) if position[stage] < len(instructions)]
    if stuck:
        raise RuntimeError("the schedule deadlocks: " + "; ".join(stuck))
    unread = [f"{len(channel)} {direction} message(s) to virtual stage {virtual}"
              for (direction, virtual), channel in channels.items() if channel]
    if unread:
        raise RuntimeError("the schedule sends what no stage receives: " + "; ".join(unread))
