"""An ipyparallel cluster whose engines are MPI ranks, started and stopped in one call.

    with nnlib.course.cluster.start(n=4) as cluster:   # in a notebook: `%%px` cells now run on 4 ranks
        cluster.view.apply_sync(...)            # the view's engines are in MPI rank order

It runs the ``mpiexec`` beside this Python, with Open MPI's settings for root and for more ranks than cores when that
is the MPI in use, and one BLAS thread per rank. ``%%px`` shows one output block per rank, in rank order, without a
progress bar. A failed start raises :class:`ClusterStartError` within ``timeout`` seconds, with the command, the
engines' log and the likely fix. The engines' ``comm`` has the classroom deadline; no process outlives the kernel.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import time

LESSON = 0  # the course's own tools: any lesson may use them
NOTEBOOKS_ONLY = True  # started by the notebooks (and tests, benchmarks); no nnlib module imports it

#: Seconds a collective waits in the notebook cluster ($NNLIB_TIMEOUT of its engines; nnlib.course.deadline).
CLASSROOM_TIMEOUT = 20.0
ENGINE_SETUP = ("from mpi4py import MPI\nfrom nnlib.course.classroom import install\n"
                "comm = install()  # MPI.COMM_WORLD, with the classroom deadline\nrank, size = comm.rank, comm.size\n")


def settle_on_engine() -> str:
    """Run on every engine after a cell: nnlib.course.classroom.settle (imported there: the client has no MPI)."""
    from nnlib.course.classroom import settle

    return settle()


class ClusterStartError(RuntimeError):
    """The MPI engines did not start; the message says what ran, what it printed, and what to try."""


OPEN_MPI_SETTINGS = {  # Open MPI's, to run as root and with more ranks than cores (MPICH needs none)
    "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe", "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def engine_environment(mpiexec: str) -> dict:
    """Environment variables for mpiexec and its ranks: one BLAS thread, OPEN_MPI_SETTINGS if ``mpiexec
    --version`` says it is Open MPI's, and $NNLIB_TIMEOUT (CLASSROOM_TIMEOUT unless set)."""
    from nnlib.course.environment import ONE_BLAS_THREAD

    try:
        version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=10).stdout.lower()
    except (OSError, subprocess.TimeoutExpired):
        version = ""
    open_mpi = any(name in version for name in ("open mpi", "openrte", "prte"))
    timeout = os.environ.get("NNLIB_TIMEOUT", str(CLASSROOM_TIMEOUT))
    return {**ONE_BLAS_THREAD, **(OPEN_MPI_SETTINGS if open_mpi else {}), "NNLIB_TIMEOUT": timeout}


class MPICluster:
    """A running ipyparallel cluster of MPI engines (:func:`start` makes one): ``cluster``, the ipyparallel.Cluster;
    ``client``, its Client; ``view``, a DirectView of all engines in MPI rank order; ``rank_of``, {engine id: rank}."""

    def __init__(self, cluster, client, n: int, timeout: float, reaper=None):
        self.cluster, self.client, self.n, self.timeout = cluster, client, n, timeout
        self.view, self.rank_of, self.sent = None, {}, 0
        self.reaper = reaper  # ends this kernel's cluster processes if the kernel dies (nnlib.course.reaper)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.stop()  # (None: an error in the block goes on)

    def _start_engines(self):
        """Launch the n engines and wait until all registered (an error as soon as mpiexec exits, or after timeout)."""
        engine_set = self.cluster.start_engines_sync(self.n)
        launcher = self.cluster.engines[engine_set]
        deadline = time.monotonic() + self.timeout
        while len(self.client.ids) < self.n:
            if _has_exited(launcher.process):
                raise self._start_error("mpiexec exited before all engines started", launcher.args)
            if time.monotonic() > deadline:
                raise self._start_error(f"only {len(self.client.ids)} of {self.n} engines registered within "
                                        f"{self.timeout:g} s", launcher.args)
            time.sleep(0.1)
        self._map_ranks()

    def _start_error(self, what: str, mpiexec_command) -> ClusterStartError:
        log = "".join(launcher.get_output(remove=False) for launcher in self.cluster.engines.values())
        tail = "\n".join(log.strip().splitlines()[-25:]) or "(mpiexec printed nothing)"
        self.stop()
        return ClusterStartError(
            f"The MPI engines did not start: {what}.\nCommand: {' '.join(map(str, mpiexec_command))}\n"
            f"Its output (last lines):\n{tail}\nLikely fixes: check that the mpiexec above belongs to the MPI that "
            "mpi4py was built for (pip install mpich mpi4py into this environment); with Open MPI as root or with more "
            f"ranks than cores, set {', '.join(f'{name}={value}' for name, value in OPEN_MPI_SETTINGS.items())}; ask "
            "for fewer engines; or pass a longer timeout= if the machine is just slow.")

    def _map_ranks(self):
        """Set every engine up (ENGINE_SETUP); order the view by MPI rank; check the ranks are 0..n-1."""
        everyone = self.client[:]
        everyone.execute(ENGINE_SETUP, block=True)
        ranks = everyone.pull("rank", block=True)
        self.rank_of = dict(zip(everyone.targets, ranks))
        if sorted(ranks) != list(range(self.n)):
            raise ClusterStartError(f"engine ranks {sorted(ranks)} are not 0..{self.n - 1}: the engines are "
                                    "not one MPI job (was mpi4py built for another MPI than this mpiexec?)")
        self.view = self.client[sorted(self.rank_of, key=self.rank_of.get)]
        self.view.block = True

    def activate(self):
        """Make ``%%px`` run on this cluster's view, with stable output (no streaming, no progress bar)."""
        from IPython import get_ipython  # (installed with ipyparallel)

        shell = get_ipython()
        if shell is None:
            return
        self.view.activate()
        shell.run_line_magic("pxconfig", "--no-stream --progress-after -1")
        if self.after_cell not in shell.events.callbacks["post_run_cell"]:
            shell.events.register("pre_run_cell", self.before_cell)
            shell.events.register("post_run_cell", self.after_cell)
        from ipyparallel.error import CompositeError

        shell.set_custom_exc((CompositeError,), show_failing_rank_first)

    def before_cell(self, info=None) -> None:
        """IPython's pre_run_cell: remember how many tasks the engines had been sent."""
        self.sent = len(self.client.history) if self.client is not None else 0

    def after_cell(self, result=None) -> None:
        """IPython's post_run_cell: after a cell that sent the engines anything, every engine settles its comm
        (nnlib.course.classroom.settle), so that all ranks start the next cell afresh, together. A script calls it."""
        if self.cluster is None or self.view is None or len(self.client.history) == self.sent:
            return
        busy = set(self.client.outstanding)
        if busy and not self.client.wait(list(busy), timeout=3):  # an interrupted wait in comm ends at once
            print("Some ranks are still busy in that cell (stuck in MPI outside comm?): if they do not finish, "
                  "run mpi.restart()", file=sys.stderr)
        # An apply, not an execute: an engine whose cell raised aborts the execute requests that reach it before
        # it has finished replying (ipykernel's stop_on_error), and a loaded engine then skipped its settle.
        self.view.apply_async(settle_on_engine)
        self.sent = len(self.client.history)

    def restart(self):
        """Restart every engine (e.g. after a rank died); the rank mapping and the ``%%px`` view are rebuilt."""
        self._quiet()
        self.cluster.stop_engines_sync()
        deadline = time.monotonic() + self.timeout
        while self.client.ids:  # the controller notices the engines are gone (heartbeat)
            if time.monotonic() > deadline:
                raise ClusterStartError(f"the stopped engines did not unregister within {self.timeout:g} s")
            time.sleep(0.1)
        self._start_engines()
        self.activate()

    def _quiet(self):
        """mpiexec exits 1 on SIGTERM and ipyparallel then logs the whole engine log: keep it out."""
        for logger in [self.cluster.log, *(launcher.log for launcher in self.cluster.engines.values())]:
            logger.setLevel(logging.CRITICAL)
        if self.cluster.controller is not None:
            self.cluster.controller.log.setLevel(logging.CRITICAL)

    def stop(self):
        """Stop the engines, the controller and the reaper; safe twice. Every step runs even if one before it failed;
        then the failure is raised, and the cluster and its reaper stay, for stop() again (or the kernel's end)."""
        if self.cluster is None:
            return
        self._quiet()
        closing = attempt(self.client.close) if self.client is not None else None
        # The engines first: stopped with the controller (stop_cluster_sync), 4 took 4.2-4.5 s to exit, not 1.3-1.7 s.
        stopping = [attempt(self.cluster.stop_engines_sync), attempt(self.cluster.stop_controller_sync)]
        if not any(stopping):
            stopping.append(attempt(self._end_reaper))
            self.cluster = None
        failures = [failure for failure in [closing, *stopping] if failure is not None]
        if failures:  # a KeyboardInterrupt first; the others told in its notes
            failures.sort(key=lambda failure: isinstance(failure, Exception))
            for other in failures[1:]:
                failures[0].add_note(f"while stopping the cluster, also: {other!r}")
            raise failures[0]

    def _end_reaper(self):
        """End this cluster's reaper (its processes have ended: nothing is left for it to watch)."""
        if self.reaper is not None:
            self.reaper.terminate()
            self.reaper.wait(10)
            self.reaper = None

    def __repr__(self):
        state = "stopped" if self.cluster is None else f"{self.n} MPI engines"
        return f"<MPICluster: {state}>"


def show_failing_rank_first(shell, kind, error, trace, tb_offset=None):
    """IPython's handler for a %%px cell's errors: the ranks whose own code raised come first, with their
    traceback; each rank that only stopped waiting for them (CollectiveTimeout) gets one line after them."""
    for index, (name, value, _, info) in enumerate(error.elist):
        if name == "CollectiveTimeout":
            lines = str(value).splitlines() or [""]
            summary = [line for line in lines if " stopped waiting in " in line][:1] or \
                [lines[0], *(line for line in lines[1:] if " was waiting in " in line or line.startswith("Make "))]
            error.elist[index] = (name, value, f"{name}: " + "\n".join(summary), info)
    error.elist.sort(key=lambda entry: entry[0] == "CollectiveTimeout")
    error.tb_limit = len(error.elist)
    shell.showtraceback((kind, error, trace), tb_offset=tb_offset)


def attempt(step) -> BaseException | None:
    """Run ``step()``; the exception it raised (KeyboardInterrupt too), or None."""
    try:
        step()
    except BaseException as error:
        return error
    return None


def _has_exited(process) -> bool:
    """Whether a psutil.Process has ended (gone, or a zombie nobody has reaped yet)."""
    import psutil

    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def start(n: int = 4, timeout: float = 30.0, mpiexec: str | None = None, activate: bool = True) -> MPICluster:
    """Start ``n`` ipyparallel engines as the ranks of one ``mpiexec`` job; return an :class:`MPICluster`.

    mpiexec:  path of mpiexec (default: the one beside this Python, else on PATH)
    timeout:  seconds to wait for every engine before raising ClusterStartError
    activate: in IPython, point ``%%px`` at this cluster with stable output
    """
    import ipyparallel

    from nnlib.course.environment import mpiexec_path
    from nnlib.course import reaper

    mpiexec = mpiexec or mpiexec_path()
    if not mpiexec or not (os.path.isfile(mpiexec) and os.access(mpiexec, os.X_OK)):
        raise ClusterStartError(f"no usable mpiexec (looked for {mpiexec or 'mpiexec beside this Python and on PATH'})."
                                " Install an MPI runtime into this environment (pip install mpich mpi4py), or pass "
                                "mpiexec='/path/to/mpiexec'.")
    mpiexec = os.path.abspath(mpiexec)
    reaper.clean_up_orphans()  # clusters left behind by a dead kernel of this user
    owner = os.environ[reaper.TAG] = reaper.tag_of()  # inherited by the controller, mpiexec and every engine
    quiet = importlib.util.find_spec("nnlib.course.quiet_controller").origin  # a config file
    cluster = ipyparallel.Cluster(engines="mpi", n=n, controller_args=["--HeartMonitor.period=500", f"--config={quiet}"],
                                  log_level=logging.ERROR)
    cluster.config.MPIEngineSetLauncher.mpi_cmd = [mpiexec]
    cluster.config.MPIEngineSetLauncher.environment = engine_environment(mpiexec)
    handle = MPICluster(cluster, None, n, timeout, reaper.start_reaper(owner))
    try:
        cluster.start_controller_sync()
        handle.client = cluster.connect_client_sync()
        handle._start_engines()
    except BaseException:
        handle.stop()  # (safe twice: a ClusterStartError has stopped it already)
        raise
    if activate:
        handle.activate()
    return handle
