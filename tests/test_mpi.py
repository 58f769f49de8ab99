"""The MPI checker scripts in tests/mpi/, under mpiexec with several numbers of ranks: each (checker, ranks) a case.

How they run: for each number of ranks P, one job ``mpiexec -n P python tests/mpi/run_checkers.py check_a.py ...``
runs every checker that needs P ranks, one after another on all ranks; each checker's checks run collectively
through tests/mpi/harness.py, which gathers every rank's failures into one verdict, and rank 0 prints one verdict
block per checker (run_checkers.py says how, and what it puts back between checkers so that each sees the process
as it would alone). The case "P-check_x" passes or fails on check_x's verdict, with its failures and tracebacks;
the job is launched once per P in a process (conftest.work_unit sends the cases of one P to one worker) and its
verdicts are kept in VERDICTS. A checker that aborts the job (a rank dies, MPI_Abort, a segfault) or hangs (no
verdict in run_checkers.LIMIT seconds: the job is stopped) fails its own case with the output's tail, and the
runner is launched again for the checkers that had not begun (test_an_aborting_or_hanging_checker_hides_no_other).
Each script still runs alone: ``mpiexec -n P python tests/mpi/check_x.py``. check_watchdog.py makes a rank fail
and must own its processes: it keeps a launch of its own (run_mpi_script) for each of its rank counts.

check_collectives.py: every nnlib.lesson04_collectives.collectives helper, exact values on every rank, uneven sizes.
check_parallel.py (1 to 5 ranks): data-parallel training equals sequential for every strategy (Adam too); bad
setups fail on every rank at once. A rank that raises alone before a collective would hang the others: the
runner's time limit turns that into a failure.
check_watchdog.py (2 and 3 ranks: it makes the last rank fail): a raising, hanging or absent rank
stops the others at once or at the deadline, named; the ranks recover and train again.
check_allreduce.py (1 to 7 ranks): the ring, recursive doubling and reduce-then-broadcast equal
MPI's Allreduce; bad buffers fail on every rank at once.
check_tensor_parallel.py, check_pipeline.py (1 to 4 ranks): hidden units split over the ranks, or
layers over the stages of a pipeline, train exactly as sequential. check_hybrid.py (2, 4 and 6 ranks):
every (data x model) grid of both kinds does too. check_schedules.py (1 to 4 ranks): lesson 18's
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
check_grid.py (2, 4 and 8 ranks): every data x tensor x pipeline grid of degrees 1 and 2 (lesson 19) trains exactly as
sequential, with GPipe and 1F1B, ZeRO-1 on the data axis and Adam; bad degrees fail on every rank at once.
check_plan_memory.py (4 ranks): lesson 19's memory model within 15% of tracemalloc's peak on every rank, for every
layout of a sweep (data with ZeRO 0-3, accumulation, recomputation; tensor; pipelines; 2-D grids), two networks.
"""

import importlib.util
from pathlib import Path

import psutil
import pytest
from conftest import run_mpi_script

CHECKERS = Path(__file__).parent / "mpi"
_spec = importlib.util.spec_from_file_location("run_checkers", CHECKERS / "run_checkers.py")
run_checkers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_checkers)  # (it imports mpi4py and the harness only inside the job)

ONE_TO_FOUR = (1, 2, 3, 4)
RANK_COUNTS = {  # each checker (tests/mpi/<name>.py) and the numbers of ranks it runs with
    "check_collectives": ONE_TO_FOUR, "check_parallel": (1, 2, 3, 4, 5), "check_watchdog": (2, 3),
    "check_allreduce": tuple(range(1, 8)), "check_tensor_parallel": ONE_TO_FOUR, "check_pipeline": ONE_TO_FOUR,
    "check_hybrid": (2, 4, 6), "check_schedules": ONE_TO_FOUR, "check_async": ONE_TO_FOUR,
    "check_compression": ONE_TO_FOUR, "check_communication_light": ONE_TO_FOUR, "check_memory": (1, 2, 3, 4, 7),
    "check_mixed_precision": ONE_TO_FOUR, "check_messages": ONE_TO_FOUR, "check_grid": (2, 4, 8),
    "check_plan_memory": (4,),
}
OWN_LAUNCH = {"check_watchdog"}  # it makes a rank fail: it owns its processes
CASES = [pytest.param(checker, ranks, id=f"{ranks}-{checker}")
         for checker, counts in RANK_COUNTS.items() for ranks in counts]
VERDICTS = {}  # (checker, ranks): run_checkers.Verdict, from this process's one launch per number of ranks


def shared_launch_checkers(ranks: int, items) -> list[str]:
    """The checkers that the selected cases (pytest's ``items``) run with ``ranks`` ranks in the shared job."""
    chosen = [item.callspec.params["checker"] for item in items
              if getattr(item, "function", None) is test_mpi_checker and item.callspec.params["ranks"] == ranks]
    return [checker for checker in chosen if checker not in OWN_LAUNCH]


def verdict(checker: str, ranks: int, items) -> "run_checkers.Verdict":
    """``checker``'s verdict on ``ranks`` ranks, from the one job that runs every selected checker of ``ranks``."""
    if (checker, ranks) not in VERDICTS:
        waiting = [name for name in shared_launch_checkers(ranks, items) if (name, ranks) not in VERDICTS]
        waiting += [checker] if checker not in waiting else []
        found, _ = run_checkers.verdicts([CHECKERS / f"{name}.py" for name in waiting], ranks)
        VERDICTS.update({(name, ranks): result for name, result in found.items()})
    return VERDICTS[checker, ranks]


@pytest.mark.parametrize("checker, ranks", CASES)
def test_mpi_checker(checker, ranks, request):
    if checker in OWN_LAUNCH:
        run = run_mpi_script(CHECKERS / f"{checker}.py", ranks)
        assert run.returncode == 0, run.stdout + run.stderr
        assert f"{ranks} ranks: all checks passed" in run.stdout
        return
    result = verdict(checker, ranks, request.session.items)
    assert (result.checker, result.ranks) == (checker, ranks)
    assert result.passed, result.report


# -- the runner itself: a checker that fails, aborts or hangs hides no other's verdict --------------------------------

PLANTED = {  # a checker's name: its source (run by the test below, in this order, on 2 ranks)
    "check_a_passes": "from mpi4py import MPI\n\ndef test_barrier():\n    MPI.COMM_WORLD.Barrier()\n",
    "check_b_fails_on_rank_1": (
        "from mpi4py import MPI\n\ndef test_rank_1_disagrees():\n"
        "    assert MPI.COMM_WORLD.rank != 1, 'rank 1 disagrees'\n\ndef test_after_it():\n"
        "    MPI.COMM_WORLD.Barrier()\n"),
    "check_c_patches_the_process": (
        "import os, sys\nfrom mpi4py import MPI\nfrom nnlib.course import environment\n\n"
        "def test_patch():\n    environment.MINIMUM_CUPY = 99\n    os.environ['NNLIB_PLANTED'] = '1'\n"
        "    sys.modules['cupy'] = object()\n    assert not environment.gpu_status()[0]  # cached\n"
        "    if MPI.COMM_WORLD.rank == 1:\n        MPI.COMM_WORLD.send('left behind', dest=0, tag=7)\n"),
    "check_d_sees_a_fresh_process": (
        "import os, sys\nfrom nnlib.course import environment\n\n"
        "def test_fresh():\n    assert environment.MINIMUM_CUPY == 14 and 'NNLIB_PLANTED' not in os.environ\n"
        "    assert environment.gpu_status.cache_info().currsize == 0\n"
        "    assert 'cupy' not in sys.modules\n"),
    "check_e_a_rank_dies": (
        "import os\nfrom mpi4py import MPI\n\ndef test_dies():\n    if MPI.COMM_WORLD.rank == 1:\n"
        "        print('rank 1 exits', flush=True)\n        os._exit(3)\n    MPI.COMM_WORLD.Barrier()\n"),
    "check_f_passes_after_it": "from mpi4py import MPI\n\ndef test_barrier():\n    MPI.COMM_WORLD.Barrier()\n",
    "check_g_hangs": (
        "import time\nfrom mpi4py import MPI\n\ndef test_hangs():\n    if MPI.COMM_WORLD.rank == 1:\n"
        "        print('rank 1 sleeps', flush=True)\n        time.sleep(600)\n    MPI.COMM_WORLD.Barrier()\n"),
}


def test_an_aborting_or_hanging_checker_hides_no_other(tmp_path):
    """Seven planted checkers on 2 ranks: each gets its own verdict. A failing check is reported with its rank
    and message; what a checker patches (nnlib's globals, os.environ, sys.modules, a message left on
    COMM_WORLD) is put back before the next (the message is reported); a rank that exits kills the job: that
    checker says so with the output's tail, and the runner is launched again for the checkers after it; there a
    rank that sleeps makes the last checker hang past the limit: the job is stopped, the verdict before it kept
    (two launches in all)."""
    paths = []
    for name, source in PLANTED.items():
        paths.append(tmp_path / f"{name}.py")
        paths[-1].write_text(source)
    found, launches = run_checkers.verdicts(paths, 2, limit=8)
    assert list(found) == list(PLANTED) and launches == 2, (list(found), launches)
    assert {name: result.passed for name, result in found.items()} == {
        "check_a_passes": True, "check_b_fails_on_rank_1": False, "check_c_patches_the_process": False,
        "check_d_sees_a_fresh_process": True, "check_e_a_rank_dies": False, "check_f_passes_after_it": True,
        "check_g_hangs": False}, {name: result.report for name, result in found.items()}
    failed = found["check_b_fails_on_rank_1"].report
    assert "1 failure" in failed and "rank 1: test_rank_1_disagrees" in failed and "rank 1 disagrees" in failed
    left = found["check_c_patches_the_process"].report
    assert "rank 0: a message from rank 1 (tag 7" in left and "1 failure" in left, left
    died = found["check_e_a_rank_dies"].report
    assert "check_e_a_rank_dies on 2 ranks aborted: the job ended" in died and "rank 1 exits" in died, died
    hung = found["check_g_hangs"].report
    assert "check_g_hangs on 2 ranks hung: no verdict within 8 s" in hung and "rank 1 sleeps" in hung, hung
    left_running = [process.info for process in psutil.process_iter(["pid", "cmdline"])
                    if any(str(tmp_path) in word for word in process.info["cmdline"] or ())]
    assert not left_running, f"the stopped job left processes running: {left_running}"
