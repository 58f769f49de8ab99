"""Several MPI checker scripts (tests/mpi/check_*.py) in one mpiexec job, each with its own verdict.

Inside the job (``mpiexec -n P python run_checkers.py CHECKER.py ...``, see main) every rank imports and runs the
checkers one after another; each runs its checks collectively through the harness (harness.failures_here, then
harness.gathered: every rank's failures, one verdict). Rank 0 prints, flushed as it goes, a line when a checker
begins and a verdict block when it has ended:

    ======== check_parallel on 3 ranks: begins
    ======== check_parallel on 3 ranks: passed in 41.2 s
or
    ======== check_parallel on 3 ranks: 2 failures in 41.2 s
    rank 1: check_zero_keeps_one_slice_of_the_optimizer_state
    Traceback (most recent call last): ...
    ======== check_parallel: end of its failures

Each checker sees the process as it would alone (as_if_alone): its folder first on sys.path, its own sys.argv,
and afterwards the environment, working folder, warnings filters, signal handlers, sys.path, COMM_WORLD's error
handler and the globals of the nnlib modules loaded before it (a monkeypatch) are put back, and their functools
caches (check_parallel's ``environment.gpu_status``) emptied; sys.modules entries that are not modules
(check_parallel's stand-in CuPy) are removed, tracemalloc is stopped and garbage collected. A message that a
checker left unreceived on COMM_WORLD is received and reported as one of its failures.

From outside, ``verdicts(checkers, ranks)`` launches the job and reads the blocks. A checker that aborts (a rank
dies, MPI_Abort, a segfault) or hangs (no verdict within ``limit`` seconds: the job is stopped) gets a verdict
that says so, with the tail of the job's output; the runner is launched again for the checkers that had not
begun, so that each still gets its own verdict. No checker may take longer than ``limit`` seconds, nor the job
``start_limit`` to begin the first: nothing waits forever.
"""

import contextlib
import gc
import importlib.util
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
import tracemalloc
import types
import warnings
from dataclasses import dataclass
from pathlib import Path

RULE = "========"
MARKER = re.compile(rf"^{RULE} (\S+) on (\d+) ranks: (begins|passed|(\d+) failures?) ?")
END_OF_FAILURES = f"{RULE} {{}}: end of its failures"
LIMIT = 240.0  # seconds a checker may run (a checker script alone had 240 s, its start-up included)
START_LIMIT = 120.0  # seconds the job may take to begin its first checker
TAIL = 8000  # characters of output shown for a checker that aborted or hung


# -- inside the job ---------------------------------------------------------------------------------------------------


def say(line: str) -> None:
    print(line, flush=True)


def import_checker(path: Path) -> types.ModuleType:
    """The checker at ``path``, imported as a module named after its file (its checks run when they are called)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # (objects of its classes unpickle on other ranks by this name)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def as_if_alone(path: Path):
    """Run a checker as if it had the process to itself: put back afterwards what it may have changed."""
    from mpi4py import MPI

    saved_path, saved_argv, saved_environ, saved_cwd = list(sys.path), list(sys.argv), dict(os.environ), os.getcwd()
    saved_signals = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)}
    saved_modules = dict(sys.modules)
    nnlib_globals = {module: dict(vars(module)) for name, module in saved_modules.items()
                     if name.split(".")[0] == "nnlib" and isinstance(module, types.ModuleType)}
    handler = MPI.COMM_WORLD.Get_errhandler()
    sys.path.insert(0, str(path.parent))
    sys.argv = [str(path)]
    gc.collect()
    try:
        with warnings.catch_warnings():
            warnings.onceregistry.clear()
            yield
    finally:
        sys.path[:], sys.argv[:] = saved_path, saved_argv
        os.environ.clear()
        os.environ.update(saved_environ)
        os.chdir(saved_cwd)
        for number, handler_of_signal in saved_signals.items():
            signal.signal(number, handler_of_signal)
        MPI.COMM_WORLD.Set_errhandler(handler)
        for name, value in list(sys.modules.items()):
            if name in saved_modules and saved_modules[name] is not value:
                sys.modules[name] = saved_modules[name]
            elif name not in saved_modules and not isinstance(value, types.ModuleType):
                del sys.modules[name]
        restore_globals(nnlib_globals)
        if tracemalloc.is_tracing():
            tracemalloc.stop()


def restore_globals(saved: dict) -> None:
    """Put back the globals each module held (names it gained since are removed, submodules kept), and empty
    the functools caches of its functions, as in a process that had just imported it."""
    for module, names in saved.items():
        current = vars(module)
        for name in [name for name in current if name not in names]:
            if not isinstance(current[name], types.ModuleType):
                del current[name]
        for name, value in names.items():
            if current.get(name, names) is not value:
                current[name] = value
            if hasattr(value, "cache_clear") and hasattr(value, "cache_info") and not isinstance(value, type):
                value.cache_clear()  # (a functools.cache or lru_cache)


def unreceived_messages(comm) -> list[str]:
    """Receive what is still waiting for this rank on ``comm`` (every rank calls this after a Barrier): one
    failure per message, naming its sender and tag."""
    from mpi4py import MPI

    left = []
    status = MPI.Status()
    while (message := comm.Improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)) is not None:
        message.Recv(bytearray(status.Get_count(MPI.BYTE)))
        left.append(f"rank {comm.rank}: a message from rank {status.Get_source()} (tag {status.Get_tag()}, "
                    f"{status.Get_count(MPI.BYTE)} bytes) was left unreceived on COMM_WORLD")
    return left


def run_checker(path: Path) -> list[str]:
    """Import the checker and run its checks on every rank: every rank's failures (on rank 0; [] elsewhere).
    A checker that fails to import on any rank runs nowhere (its checks are collective)."""
    import harness
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    with as_if_alone(path):
        try:
            module = import_checker(path)
            failures = []
        except Exception:
            module, failures = None, [f"rank {comm.rank}: importing {path.name}\n{traceback.format_exc()}"]
        if comm.allreduce(module is not None, op=MPI.LAND):
            failures += harness.failures_here(vars(module), getattr(module, "CHECK_PREFIX", "test_"))
        comm.Barrier()
        failures += unreceived_messages(comm)
    return harness.gathered(failures)


def main(paths: list[Path]) -> None:
    """Run each checker in turn on every rank; rank 0 prints its verdict block. Exits 1 where one failed."""
    from mpi4py import MPI

    import nnlib  # noqa: F401  (loaded before the first checker, so that as_if_alone puts its state back)

    comm = MPI.COMM_WORLD
    failed = 0
    for path in paths:
        began = time.monotonic()
        if comm.rank == 0:
            say(f"{RULE} {path.stem} on {comm.size} ranks: begins")
        failures = run_checker(path)
        if comm.rank == 0:
            seconds = time.monotonic() - began
            if not failures:
                say(f"{RULE} {path.stem} on {comm.size} ranks: passed in {seconds:.1f} s")
            else:
                failed += 1
                say("\n".join([f"{RULE} {path.stem} on {comm.size} ranks: {len(failures)} failure"
                               f"{'s' if len(failures) > 1 else ''} in {seconds:.1f} s", *failures,
                               END_OF_FAILURES.format(path.stem)]))
    sys.exit(comm.bcast(1 if failed else 0, root=0))


# -- from outside: launch the job, read the verdicts ------------------------------------------------------------------


@dataclass
class Verdict:
    """One checker's verdict on ``ranks`` ranks: passed, or the report of what failed (failures, an abort, a hang)."""

    checker: str
    ranks: int
    passed: bool
    report: str


@dataclass
class Launch:
    """What one job printed (stdout and stderr as they came), its exit code, and whether it was stopped as hung."""

    output: str
    returncode: int
    hung: bool


def launch(paths: list[Path], ranks: int, limit: float, start_limit: float) -> Launch:
    """Run the checkers at ``paths`` in one ``mpiexec -n ranks`` job; stop it if ``limit`` seconds pass without
    a begin line or a verdict (a checker that hangs), or ``start_limit`` before the first (a job that does not
    start)."""
    from shared_runs import end_launch

    from nnlib.course.environment import mpiexec_path

    command = [mpiexec_path(), "-n", str(ranks), sys.executable, str(Path(__file__).resolve()), *map(str, paths)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               errors="replace", start_new_session=True)
    lines, deadline = [], [time.monotonic() + start_limit]

    def read():
        for line in process.stdout:
            lines.append(line)
            if MARKER.match(line):
                deadline[0] = time.monotonic() + limit

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    hung = False
    while process.poll() is None:
        if time.monotonic() > deadline[0]:
            hung = True
            end_launch(process)  # (tests/shared_runs.py: mpiexec and the ranks it started in sessions of their own)
            break
        time.sleep(0.1)
    reader.join(timeout=10)
    return Launch("".join(lines), process.returncode, hung)


def read_verdicts(run: Launch, ranks: int) -> tuple[dict, str | None]:
    """The verdicts that ``run`` printed, by checker, and the checker that had begun without one (or None)."""
    verdicts, running, failures = {}, None, None
    for line in run.output.splitlines(keepends=True):
        if failures is not None:
            if line.rstrip("\n") == END_OF_FAILURES.format(running):
                verdicts[running] = Verdict(running, ranks, False, "".join(failures))
                failures, running = None, None
            else:
                failures.append(line)
            continue
        mark = MARKER.match(line)
        if not mark:
            continue
        checker, outcome = mark.group(1), mark.group(3)
        if outcome == "begins":
            running = checker
        elif outcome == "passed":
            verdicts[checker], running = Verdict(checker, ranks, True, line), None
        else:
            running, failures = checker, [line]
    return verdicts, running


def cut_short(checker: str, run: Launch, ranks: int, limit: float) -> Verdict:
    """The verdict of a checker whose job ended before it had one: it hung, or the job aborted."""
    began = run.output.rfind(f"{RULE} {checker} on ")
    tail = run.output[began:][-TAIL:]
    what = (f"hung: no verdict within {limit:g} s, the job was stopped" if run.hung else
            f"aborted: the job ended (exit code {run.returncode}) before its verdict")
    return Verdict(checker, ranks, False, f"{checker} on {ranks} ranks {what}. The job's output since it began:\n"
                                          f"{tail}")


def verdicts(paths: list[Path], ranks: int, limit: float = LIMIT, start_limit: float = START_LIMIT) -> tuple[dict, int]:
    """Every checker's Verdict on ``ranks`` ranks, by name, and the number of launches it took: one, plus one
    after each checker that aborted or hung (launched again for the checkers that had not begun)."""
    if len({path.stem for path in paths}) != len(paths):
        raise ValueError(f"two checkers have the same name: {[path.name for path in paths]}")
    results, waiting, launches = {}, list(paths), 0
    while waiting:
        run = launch(waiting, ranks, limit, start_limit)
        launches += 1
        found, running = read_verdicts(run, ranks)
        found = {path.stem: found[path.stem] for path in waiting if path.stem in found}  # in the order they ran
        results.update(found)
        if running is not None:
            results[running] = cut_short(running, run, ranks, limit)
        elif not found:  # nothing began: the job did not start, or hung before the first checker
            for path in waiting:
                results[path.stem] = Verdict(path.stem, ranks, False, f"the job for {[p.stem for p in waiting]} on "
                                             f"{ranks} ranks {'hung' if run.hung else 'failed'} before any checker "
                                             f"began (exit code {run.returncode}):\n{run.output[-TAIL:]}")
        elif len(found) < len(waiting) or run.returncode != (0 if all(v.passed for v in found.values()) else 1):
            last = list(found)[-1]  # the job ended badly after this verdict, before the next checker began
            results[last] = Verdict(last, ranks, False, f"{found[last].report}\nthen the job ended (exit code "
                                    f"{run.returncode}) before the next checker began:\n{run.output[-TAIL:]}")
        waiting = [path for path in waiting if path.stem not in results]
    return results, launches


if __name__ == "__main__":
    main([Path(argument).resolve() for argument in sys.argv[1:]])
