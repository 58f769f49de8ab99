"""Notebook 18's measured case, run in its cluster: every schedule timed on P ranks, in rounds.

Every schedule (1F1B, interleaved with v = 2, ZB-H1, ZB-H2) runs steps with m = 8 micro-batches of
(64,) + (512,) * 9 + (10,), cut by schedules.balanced_split so that each of the P (or 2P) virtual stages
does the same work, as the bubble formulas assume. The rounds interleave the schedules, so that a slow spell
of the machine hits all alike (lesson 10's rule for timings).
"""

from __future__ import annotations

from threadpoolctl import threadpool_limits

from nnlib.lesson18_pipeline_schedules.schedules import balanced_split, measure_schedules

LESSON = 18
NOTEBOOKS_ONLY = True

WIDTH, WIDE_LAYERS, BATCH, MICRO_BATCHES = 512, 8, 512, 8
LAYER_SIZES = (64,) + (WIDTH,) * (WIDE_LAYERS + 1) + (10,)
SCHEDULE_NAMES = ("1f1b", "interleaved", "zb-h1", "zb-h2")


def balanced_layouts(ranks: int, names=SCHEDULE_NAMES, chunks: int = 2) -> dict:
    """{schedule: its layer counts per virtual stage}: balanced_split over P virtual stages (2P: interleaved)."""
    num_layers = len(LAYER_SIZES) - 1
    return {name: balanced_split(num_layers, ranks * (chunks if name == "interleaved" else 1)) for name in names}


def timed_rounds(comm, rounds: int = 5, repeats: int = 2, batch: int = BATCH) -> dict | None:
    """Every schedule's measure_schedules row from each of ``rounds`` rounds (each: one warm-up step and
    ``repeats`` timed ones per schedule, float32, one BLAS thread), on rank 0: {name: [row of each round]}."""
    results = {name: [] for name in SCHEDULE_NAMES}
    with threadpool_limits(1):  # the ranks share the cores
        for _ in range(rounds):
            rows = measure_schedules(comm, LAYER_SIZES, batch, MICRO_BATCHES, balanced_layouts(comm.size),
                                     repeats=repeats, dtype="float32")
            for name, row in (rows or {}).items():
                results[name].append(row)
    return results if comm.rank == 0 else None
