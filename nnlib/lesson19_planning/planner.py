"""Plan a run: every layout of P ranks, its memory per rank and its step time, ranked, with each refusal's reason.

A :class:`Job` is the model, the optimizer (sgd, momentum, adam), the precision and the global batch N. The model is
a chain of layer widths (784-128-10 here; a large one as :func:`Job.large`: Psi parameters in L layers of one width,
with the activation bytes one sample keeps). A :class:`Cluster` is P ranks of M bytes each, R ranks per node, two
links (lesson 04's Machine: alpha, beta), one within a node and one across, and one rank's compute, a layer's pass
on r rows costing t = overhead + FLOPs / rate (fitted as alpha-beta is: :func:`fit_compute`). A layout
(layout.Layout) is D x T x S = P (rank = (d S + s) T + t: tensor groups are neighbours), a ZeRO stage (3: FSDP),
recomputation, m micro-batches and a schedule. :func:`predict` gives:

memory per rank   a built chain: memory.peak_bytes (the lessons' counts, with what they leave out); a large model:
                  per parameter, weights w, gradients g and optimizer state k bytes (:func:`value_bytes`) on the
                  Psi / (T S) a rank holds, each divided by D from the ZeRO stage that shards it, plus activations.
step time         compute: stage s's layers on one micro-batch take t_s; through the pipe (m - 1) max_s t_s + sum_s t_s
                  (GPipe and 1F1B alike, m t_0 for one stage); recomputation adds one forward per micro-batch.
                  data: the gradient's ring Allreduce over D (ZeRO 1-2: reduce-scatter + allgather, the same bytes;
                  FSDP: three ring passes); tensor: lesson 12's allreduce_messages per micro-batch over T; pipeline:
                  2 m boundary messages; update: the values a rank updates / update rate. Each axis uses the link
                  its group spans. ``hideable``: the data axis's part that can overlap backward (lesson 10). Left
                  out: copies (FSDP's gathers, accumulation's sums), per-call costs of the collectives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from itertools import product

from nnlib.lesson04_collectives.costmodel import (Machine, fit_latency_bandwidth, predicted_time, ring_allgather_time,
                                                  ring_allreduce_time)
from nnlib.lesson12_pipeline.balance import balanced_cut, layer_flops
from nnlib.lesson12_pipeline.memory import layer_params, tensor_parallel_sizes
from nnlib.lesson12_pipeline.pipeline import stage_layers
from nnlib.lesson12_pipeline.tradeoffs import allreduce_messages
from nnlib.lesson17_activations.budget import BYTES, activation_widths
from nnlib.lesson19_planning.layout import Layout
from nnlib.lesson19_planning.memory import STATE_VALUES, peak_bytes, unbuildable

LESSON = 19



@dataclass(frozen=True)
class Job:
    """What to train: ``layer_sizes`` (n_0, ..., n_L), ``optimizer``, ``precision`` and the global ``batch``;
    ``activation_bytes`` per sample for a large model (None: counted from the chain), ``paper``: the ZeRO paper's
    accounting of mixed precision (no float32 gradient kept; the float32 master is optimizer state)."""

    layer_sizes: tuple
    batch: int
    optimizer: str = "momentum"
    precision: str = "float64"
    activation_bytes: float | None = None
    paper: bool = False

    def __post_init__(self):  # a list of widths becomes a tuple: a Job is a key (cost_cut's cache)
        object.__setattr__(self, "layer_sizes", tuple(self.layer_sizes))

    @classmethod
    def large(cls, parameters: float, layers: int, activation_bytes: float, batch: int, **job) -> "Job":
        """Psi parameters as L layers of one width h = sqrt(Psi / L) (so that L h^2 = Psi, biases aside)."""
        width = max(1, round(math.sqrt(parameters / layers)))
        return cls((width,) * (layers + 1), batch, activation_bytes=activation_bytes, **job)


@dataclass(frozen=True)
class Compute:
    """One rank's compute: seconds of a layer's pass = overhead + FLOPs / flops_per_second; and the optimizer's
    updated values per second."""

    overhead: float
    flops_per_second: float
    updates_per_second: float

    def seconds(self, flops: float, calls: int = 1) -> float:
        return calls * self.overhead + flops / self.flops_per_second


@dataclass(frozen=True)
class Cluster:
    """Where to train: ``ranks`` P, ``memory`` bytes per rank, ``per_node`` ranks a node holds, the links ``inside``
    and ``across`` nodes (Machine: alpha s, beta s/byte), ``compute``; ``tensor_across_nodes``: allow it."""

    ranks: int
    memory: float
    per_node: int
    inside: Machine
    across: Machine
    compute: Compute
    tensor_across_nodes: bool = False

    def link(self, stride: int, degree: int) -> Machine:
        """The link of the groups of ``degree`` ranks ``stride`` apart (rank b + i stride, i < degree): across nodes
        if any of them has ranks on two nodes (node = rank // per_node), else inside."""
        starts = [rank for rank in range(self.ranks) if rank // stride % degree == 0]
        spans = any(len({(start + i * stride) // self.per_node for i in range(degree)}) > 1 for start in starts)
        return self.across if spans else self.inside


def value_bytes(optimizer: str, precision: str, paper: bool = False) -> dict:
    """Bytes per parameter by kind. Plain float64/32: weight, gradient and each state value s bytes. Mixed float16
    or bfloat16 (lesson 17, whose ZeRO shards the state alone): low weight 2 + float32 master 4, low gradient 2 +
    float32 gradient 4, float32 state;
    ``paper`` (Rajbhandari et al. 2020): 2 + 2 + K, K = 4 (master) + 4 per state value (Adam: K = 12)."""
    state = STATE_VALUES[optimizer]
    if BYTES[precision] >= 4:
        size = BYTES[precision]
        return {"weights": size, "gradients": size, "optimizer state": size * state}
    if paper:
        return {"weights": 2, "gradients": 2, "optimizer state": 4 + 4 * state}
    return {"weights": 2 + 4, "gradients": 2 + 4, "optimizer state": 4 * state}


def check(job: Job, cluster: Cluster) -> None:
    """Refuse what no layout can mend, with what to change."""
    whole = [isinstance(value, int) and not isinstance(value, bool) and value >= 1
             for value in (*job.layer_sizes, job.batch, cluster.ranks, cluster.per_node)]
    rates = (cluster.compute.flops_per_second, cluster.compute.updates_per_second)
    for wrong, problem in [
            (not (math.isfinite(cluster.memory) and cluster.memory > 0),
             f"memory per rank must be positive bytes; got {cluster.memory}"),
            (not all(whole) or len(job.layer_sizes) < 2, f"layer widths, the batch, the ranks and ranks per node must "
                                                         f"be whole numbers of at least 1, with two widths at least; "
                                                         f"got {job.layer_sizes}, {job.batch}, {cluster.ranks}, "
                                                         f"{cluster.per_node}"),
            (not all(math.isfinite(rate) and rate > 0 for rate in rates), f"the compute's rates must be positive; "
                                                                          f"got {rates}"),
            (job.optimizer not in STATE_VALUES, f"optimizer must be one of {', '.join(STATE_VALUES)}"),
            (job.precision not in BYTES, f"precision must be one of {', '.join(BYTES)}")]:
        if wrong:
            raise ValueError(problem)


def fit_compute(flops, seconds, updates_per_second: float) -> Compute:
    """Fit t = overhead + FLOPs / rate to measured layer passes (lesson 05's alpha-beta fit, FLOPs for bytes)."""
    overhead, seconds_per_flop = fit_latency_bandwidth(flops, seconds)
    return Compute(max(overhead, 0.0), 1 / seconds_per_flop, updates_per_second)


def stages(job: Job, layout: Layout) -> list[tuple]:
    """Each pipeline stage's chain of widths as tensor rank 0 holds it (the largest slice: lesson 12's memory)."""
    return [tensor_parallel_sizes(job.layer_sizes[first:stop + 1], layout.tensor, 0)
            for first, stop in stage_layers(len(job.layer_sizes) - 1, layout.pipeline, layout.cut)]


@lru_cache(maxsize=None)
def cost_cut(job: Job, compute: Compute, rows: int, pipe: int) -> tuple:
    """Lesson 12's balanced_cut of the layers' predicted seconds on a micro-batch of ``rows`` rows: the pipeline's
    stages cut by cost, not by count (lesson 12's layer_flops: 6 FLOPs per weight and row, 4 in the first layer)."""
    return balanced_cut([compute.seconds(rows * flops) for flops in layer_flops(job.layer_sizes)], pipe)


def stage_seconds(job: Job, cluster: Cluster, layout: Layout) -> list[float]:
    """t_s: stage s's forward and backward of one micro-batch (6 FLOPs per weight and row; no input gradient for
    the network's first layer), times 4/3 with recomputation (one more forward: 2 of the 6)."""
    rows = math.ceil(job.batch / layout.data / layout.micro_batches)
    times = []
    for position, sizes in enumerate(stages(job, layout)):
        flops = layer_flops(sizes)  # (lesson 12's: the chain's first layer computes no input gradient)
        if position:  # but a later stage's first layer does, for the stage before it: 2 FLOPs per weight and row
            flops[0] += 2 * sizes[0] * sizes[1]
        times.append(cluster.compute.seconds(rows * sum(flops), len(flops)) * (4 / 3 if layout.recompute else 1))
    return times


def pipeline_seconds(stage_seconds, micro_batches: int) -> float:
    """A step through stages of t_s seconds per micro-batch: the first micro-batch passes every stage once, each of
    the m - 1 others adds the slowest stage's time, (m - 1) max_s t_s + sum_s t_s (m t_0 for one stage)."""
    return (micro_batches - 1) * max(stage_seconds) + sum(stage_seconds)


def step_seconds(job: Job, cluster: Cluster, layout: Layout) -> dict:
    """The step's time by part (the module's formulas); ``step``: their sum; ``hideable``: data's overlap. A stage's
    tensor Allreduces are part of its time per micro-batch, so they pass through the pipeline's formula too."""
    data, tensor, pipe, m = layout.data, layout.tensor, layout.pipeline, layout.micro_batches
    itemsize, rows, chains = BYTES[job.precision], math.ceil(job.batch / data / m), stages(job, layout)
    parameters_held = max(sum(layer_params(sizes)) for sizes in chains)  # the busiest rank's parameters
    data_link, tensor_link, pipe_link = (cluster.link(tensor * pipe, data), cluster.link(1, tensor),
                                         cluster.link(tensor, pipe))
    gradient = parameters_held * itemsize
    if layout.zero == 3:
        data_time = 3 * ring_allgather_time(gradient / data, data, data_link.alpha, data_link.beta)
    else:
        data_time = ring_allreduce_time(gradient, data, data_link.alpha, data_link.beta)
    per_stage = stage_seconds(job, cluster, layout)
    tensor_per_stage = [float(sum(ring_allreduce_time(n_bytes, tensor, tensor_link.alpha, tensor_link.beta)
                                  for n_bytes in allreduce_messages("tensor", sizes, rows, tensor, itemsize)))
                        for sizes in chains]
    compute = pipeline_seconds(per_stage, m)
    tensor_time = pipeline_seconds([t + c for t, c in zip(per_stage, tensor_per_stage)], m) - compute
    sent = [(sizes[-1] if s < pipe - 1 else 0, sizes[0] if s else 0) for s, sizes in enumerate(chains)]
    pipe_time = max(m * sum(predicted_time(rows * width * itemsize, pipe_link.alpha, pipe_link.beta)
                            for width in pair if width) for pair in sent)
    update = parameters_held / (data if layout.zero else 1) / cluster.compute.updates_per_second
    parts = {"compute": compute, "data": float(data_time), "tensor": tensor_time, "pipeline": float(pipe_time),
             "update": update}
    return {**parts, "step": sum(parts.values()), "hideable": min(parts["data"], compute * 2 / 3)}


def memory_bytes(job: Job, layout: Layout, ranks: int) -> dict:
    """The busiest rank's bytes by kind: memory.peak_bytes for a chain built here; for a large model, value_bytes
    on its parameters (ZeRO: state from stage 1, gradients from 2, weights at 3 divided by D) and its activations:
    a stage of L_s of the L layers keeps L_s / L of a sample's bytes, 1 / T of them, for the micro-batches alive
    (accumulation 1, GPipe m, 1F1B min(S, m)); recomputation every k keeps (ceil(L_s / k) + k) / L_s of them."""
    if job.activation_bytes is None:
        return max((peak_bytes(job.layer_sizes, job.batch, ranks, rank, layout, job.optimizer, job.precision)
                    for rank in range(ranks)), key=lambda held: sum(held.values()))
    chains = stages(job, layout)
    parameters_held = max(sum(layer_params(sizes)) for sizes in chains)
    sharded = {"optimizer state": 1, "gradients": 2, "weights": 3}
    memory = {kind: parameters_held * size / (layout.data if layout.zero >= sharded[kind] else 1)
              for kind, size in value_bytes(job.optimizer, job.precision, job.paper).items()}
    m, pipe, stage_layers_most = layout.micro_batches, layout.pipeline, max(len(sizes) - 1 for sizes in chains)
    alive = 1 if pipe == 1 else m if layout.schedule == "gpipe" else min(pipe, m)
    every = layout.recompute or 1
    kept = min(1.0, (math.ceil(stage_layers_most / every) + every - 1) / stage_layers_most) if layout.recompute else 1
    rows = math.ceil(job.batch / layout.data / m) * alive
    share = stage_layers_most / (len(job.layer_sizes) - 1) / layout.tensor
    memory["activations"] = job.activation_bytes * rows * kept * share
    return memory


def cannot_run(job: Job, cluster: Cluster, layout: Layout) -> str | None:
    """Why ``layout`` cannot run ``job`` on ``cluster`` at all, whatever the memory (None if it can)."""
    try:
        layout.check(cluster.ranks, job.layer_sizes)
    except ValueError as error:
        return str(error)
    if layout.zero > 1 and layout.tensor * layout.pipeline > 1:
        return ("ZeRO-2 and FSDP shard a whole replica's gradient; with a model split over ranks, this series (as "
                "DeepSpeed with a pipeline) runs ZeRO-1 on the data axis")
    if math.ceil(job.batch / layout.data) < layout.micro_batches:
        return f"{layout.micro_batches} micro-batches of a {math.ceil(job.batch / layout.data)}-row share"
    if cluster.link(1, layout.tensor) is cluster.across and cluster.across != cluster.inside and \
            not cluster.tensor_across_nodes:
        return (f"tensor degree {layout.tensor} spans nodes of {cluster.per_node} ranks: its Allreduces come in "
                f"every layer, on the critical path, over the slower link (allow it: tensor_across_nodes)")
    return None if job.activation_bytes is not None else unbuildable(layout, job.precision)


def refusal(job: Job, cluster: Cluster, layout: Layout) -> str | None:
    """Why ``layout`` cannot run ``job`` on ``cluster`` (:func:`cannot_run`, or too little memory); None if it can."""
    reason = cannot_run(job, cluster, layout)
    needed = 0 if reason else sum(memory_bytes(job, layout, cluster.ranks).values())
    return reason or (f"needs {size(needed)} per rank, has {size(cluster.memory)}" if needed > cluster.memory else None)


def predict(job: Job, cluster: Cluster, layout: Layout) -> tuple[dict, dict]:
    """(step seconds by part, the busiest rank's bytes by kind) of one layout, whether or not it fits in memory;
    ValueError if it cannot run at all."""
    check(job, cluster)
    reason = cannot_run(job, cluster, layout)
    if reason:
        raise ValueError(reason)
    return step_seconds(job, cluster, layout), memory_bytes(job, layout, cluster.ranks)


def layouts(job: Job, cluster: Cluster):
    """Every layout the planner weighs: D x T x S = P, ZeRO 0-3 (with D > 1), m in (1, 2, 4) without a pipeline
    and (S, 2 S, 4 S) with one, GPipe and 1F1B, the stages cut by cost (:func:`cost_cut`); recomputation none or
    every round(sqrt(L_s)) layers of the longest stage, where that keeps fewer activations (lesson 17's count)."""
    layers, ranks = len(job.layer_sizes) - 1, cluster.ranks
    for data, tensor in product(range(1, ranks + 1), repeat=2):
        pipe = ranks // (data * tensor)
        if data * tensor * pipe != ranks:
            continue
        for zero, per_stage, schedule in product(range(4 if data > 1 else 1), (1, 2, 4),
                                                 ("gpipe", "1f1b") if pipe > 1 else ("1f1b",)):
            m = per_stage * pipe
            cut = cost_cut(job, cluster.compute, math.ceil(job.batch / data / m), pipe) if 1 < pipe <= layers else None
            yield Layout(data, tensor, pipe, zero, None, m, schedule, cut)
            longest = max(cut or (math.ceil(layers / pipe),))
            every = round(math.sqrt(longest))
            widths = job.layer_sizes[:longest + 1]
            if every > 1 and activation_widths(widths, every) < activation_widths(widths):
                yield Layout(data, tensor, pipe, zero, every, m, schedule, cut)


def plan(job: Job, cluster: Cluster, degrees: tuple | None = None) -> tuple[list, list]:
    """(fits, refused): fits [(step seconds by part, memory by kind, layout)] fastest first; refused [(reason,
    layout)]. ``degrees`` (D, T, S): only those layouts (ValueError if they cannot run this job)."""
    check(job, cluster)
    if degrees is not None:
        Layout(*degrees).check(cluster.ranks, job.layer_sizes)
    fits, refused = [], []
    for layout in layouts(job, cluster):
        if degrees is not None and (layout.data, layout.tensor, layout.pipeline) != tuple(degrees):
            continue
        reason = refusal(job, cluster, layout)
        if reason:
            refused.append((reason, layout))
        else:
            fits.append((step_seconds(job, cluster, layout), memory_bytes(job, layout, cluster.ranks), layout))
    return sorted(fits, key=lambda fit: fit[0]["step"]), refused


# Published figures of an NVIDIA H100 SXM node (the DGX H100's data sheet): 80 GB of HBM3 at 3.35 TB/s, 989 TFLOP/s
# dense bfloat16, 8 GPUs a node over NVLink 4 (900 GB/s both ways: 450 each way), each with its own 400 Gbit/s
# InfiniBand NDR port (50 GB/s). Assumed, not published: the links' alpha (a few microseconds), a layer's launch
# overhead (10 us) and the update rate (Adam reads and writes about 32 bytes a parameter: 3.35e12 / 32).
H100_NODES = dict(per_node=8, memory=80e9, inside=Machine(3e-6, 1 / 450e9), across=Machine(5e-6, 1 / 50e9),
                  compute=Compute(10e-6, 989e12, 3.35e12 / 32))


def size(n_bytes: float) -> str:
    """Bytes as MiB or GiB, three digits (or whole GiB)."""
    gib = n_bytes / 2**30
    return f"{gib:,.0f} GiB" if gib >= 1000 else f"{gib:.3g} GiB" if gib >= 1 else f"{n_bytes / 2**20:.3g} MiB"


def table(fits, refused, top: int = 10) -> str:
    """The ranked layouts as text, lines of at most 100 characters: degrees, ZeRO, recomputation every k, m,
    schedule, the busiest rank's memory, the step in ms and its parts; then a few refusals with their reasons."""
    import re
    import textwrap

    lines = ["   D x T x S ZeRO   k   m schedule    memory  step ms = compute + data + tensor + pipeline + update"]
    for seconds, held, layout in fits[:top]:
        parts = " + ".join(f"{seconds[part] * 1e3:.3g}" for part in ("compute", "data", "tensor", "pipeline", "update"))
        lines.append(f"{layout.data:>4} x {layout.tensor} x {layout.pipeline} {layout.zero:>4} "
                     f"{layout.recompute or '-':>3} {layout.micro_batches:>3} {layout.schedule if layout.pipeline > 1 else '-':>8} "
                     f"{size(sum(held.values())):>9} {seconds['step'] * 1e3:>8.4g} = {parts}")
    reasons = {}
    for reason, layout in refused:  # one layout for each kind of reason
        reasons.setdefault(re.sub(r"[0-9.]+", "", reason), (reason, layout))
    lines.append(f"{len(fits)} layouts fit, {len(refused)} refused, e.g.:")
    for reason, layout in list(reasons.values())[:6]:
        lines += textwrap.wrap(f"{layout.data} x {layout.tensor} x {layout.pipeline}, ZeRO {layout.zero}: {reason}",
                               100, initial_indent="  ", subsequent_indent="    ")
    return "\n".join(lines)


def main(argv=None) -> int:
    """``python -m nnlib plan``: the ranked table for a job on a cluster."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m nnlib plan", description="rank every layout of a job")
    parser.add_argument("--layers", default="784,128,10", help="the layer widths, e.g. 784,128,10")
    parser.add_argument("--parameters", type=float, help="a large model: its parameter count (with --depth)")
    parser.add_argument("--depth", type=int, default=32, help="a large model's layers")
    parser.add_argument("--activation-bytes", type=float, help="a large model's bytes kept per sample (with --parameters)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--optimizer", choices=tuple(STATE_VALUES), default="adam")
    parser.add_argument("--precision", choices=tuple(BYTES), default="float32")
    parser.add_argument("--paper", action="store_true", help="the ZeRO paper's accounting of mixed precision")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--memory-gib", type=float, help="memory per rank (default: the cluster's)")
    parser.add_argument("--cluster", choices=("h100",), default="h100", help="published figures (H100_NODES)")
    parser.add_argument("--tensor-across-nodes", action="store_true")
    parser.add_argument("--grid", help="only the layouts of these degrees: data,tensor,pipeline, e.g. 8,1,1")
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args(argv)
    if args.parameters and not args.activation_bytes:
        parser.error("a large model (--parameters) needs --activation-bytes: the bytes one sample keeps for backward")
    settings = dict(H100_NODES, tensor_across_nodes=args.tensor_across_nodes)
    if args.memory_gib is not None:
        settings["memory"] = args.memory_gib * 2**30
    job = dict(batch=args.batch, optimizer=args.optimizer, precision=args.precision, paper=args.paper)
    try:
        job = (Job.large(args.parameters, args.depth, args.activation_bytes, **job) if args.parameters else
               Job(tuple(int(width) for width in args.layers.split(",")), **job))
        degrees = tuple(int(degree) for degree in args.grid.split(",")) if args.grid else None
        print(table(*plan(job, Cluster(args.ranks, **settings), degrees), top=args.top))
    except ValueError as error:
        print(f"error: {error}")
        return 2
    return 0
if __name__ == "__main__":
    raise SystemExit(main())
