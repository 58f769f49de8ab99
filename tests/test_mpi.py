"""The MPI checker scripts in tests/mpi/, each under mpiexec with several numbers of ranks.

check_collectives.py: every nnlib.lesson04_collectives.collectives helper, exact values on every rank, uneven sizes.
check_parallel.py: data-parallel training equals sequential for every strategy; bad setups fail
on every rank at once. A rank that raises alone before a collective would hang the others: the
timeout in run_mpi_script turns that into a failure.
check_watchdog.py (2 and 3 ranks: it makes the last rank fail): a raising, hanging or absent rank
stops the others at once or at the deadline, named; the ranks recover and train again.
check_allreduce.py (1 to 7 ranks): the ring, recursive doubling and reduce-then-broadcast equal
MPI's Allreduce; bad buffers fail on every rank at once.
check_tensor_parallel.py, check_pipeline.py (1 to 4 ranks): hidden units split over the ranks, or
layers over the stages of a pipeline, train exactly as sequential. check_hybrid.py (2 and 4 ranks):
every (data x model) grid of both kinds does too. check_schedules.py (1 to 4 ranks): lesson 13's
interleaved, ZB-H1 and ZB-H2 schedules train exactly as sequential.
check_async.py (1 to 4 ranks): the parameter server with staleness bound 0 equals synchronous data
parallelism; bounds are kept with a straggler. check_compression.py (1 to 4 ranks): compressed
gradients equal the uncompressed ones where they must (float64, k = all), and learn otherwise.
check_communication_light.py (1 to 4 ranks): local SGD with H = 1 equals synchronous training, PowerSGD
at full rank the plain Allreduce; the bytes counted on the real calls are the formulas'.
check_memory.py (1 to 4 and 7 ranks): ZeRO-3 / FSDP, gradient accumulation and recomputation train
exactly as sequential; FSDP's bytes sent, counted on the real calls, against the formula; mixed-precision
ranks skip the same steps; peak memory per rank within the memory model's stated error; on 4 ranks, a network over
twice the per-rank budget trains under it. check_mixed_precision.py (1 to 4 ranks): float16 and bfloat16 with
accumulation and recomputation, under the Allreduce and FSDP, take the sequential run's scale decisions and
weights (within a stated tolerance), every rank the same verdict; an FSDP float16 run resumes exactly.
"""

from pathlib import Path

import pytest
from conftest import run_mpi_script

CHECKERS = Path(__file__).parent / "mpi"
RUNS = [(checker, ranks) for checker in ("check_collectives.py", "check_parallel.py") for ranks in (1, 2, 3, 4)]
RUNS += [("check_watchdog.py", ranks) for ranks in (2, 3)]
RUNS += [("check_allreduce.py", ranks) for ranks in range(1, 8)]
RUNS += [(checker, ranks) for checker in ("check_tensor_parallel.py", "check_pipeline.py") for ranks in (1, 2, 3, 4)]
RUNS += [("check_hybrid.py", ranks) for ranks in (2, 4)]
RUNS += [("check_schedules.py", ranks) for ranks in (1, 2, 3, 4)]
RUNS += [(checker, ranks) for checker in ("check_async.py", "check_compression.py") for ranks in (1, 2, 3, 4)]
RUNS += [("check_communication_light.py", ranks) for ranks in (1, 2, 3, 4)]
RUNS += [("check_memory.py", ranks) for ranks in (1, 2, 3, 4, 7)]
RUNS += [("check_mixed_precision.py", ranks) for ranks in (1, 2, 3, 4)]


@pytest.mark.parametrize("checker, ranks", RUNS)
def test_mpi_checker(checker, ranks):
    run = run_mpi_script(CHECKERS / checker, ranks)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"{ranks} ranks: all checks passed" in run.stdout
