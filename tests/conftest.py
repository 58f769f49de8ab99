"""Shared fixtures: small IDX files, a local HTTP server, the real MNIST; and how `make test` shares
the tests out among pytest-xdist's workers (`-n 2 --dist loadgroup`)."""

import gzip
import hashlib
import http.server
import os
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from nnlib.course.environment import ONE_BLAS_THREAD

# One BLAS thread per process, in the tests and in everything they start (notebook kernels, mpiexec's ranks,
# batch jobs). make test runs two pytest-xdist workers on two cores, each often with MPI ranks that
# busy-wait: a pool of BLAS threads per process oversubscribes the cores, and OpenBLAS's idle threads spin.
# Beside one busy process, notebook 03's training ran 4 to 30 times slower with two threads than with one;
# check_memory.py on 2 ranks 3 times slower.
os.environ.update(ONE_BLAS_THREAD)
threadpool_limits(1)  # this process: OpenBLAS read the variables when NumPy loaded it

# Under pytest-xdist each worker gets an IPython folder of its own (ipyparallel's profiles and connection
# files, the kernels' history database), so that two workers' clusters and kernels never share one.
if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("IPYTHONDIR"):
    os.environ["IPYTHONDIR"] = str(Path(os.environ["IPYTHONDIR"]) / os.environ["PYTEST_XDIST_WORKER"])

# -- one folder for the whole test session, shared by pytest-xdist's workers ------------------------------------------
#
# The process that starts the session (xdist's controller, or pytest alone) makes it and names it in
# $NNLIB_TEST_SESSION before the workers start, so they inherit it; it is removed when that process ends. It holds:
#   bin/mpiexec      a wrapper that notes each launch in launches.log, then runs this environment's mpiexec; every
#                    launch made through nnlib.course.environment.mpiexec_path() goes through it ($NNLIB_MPIEXEC);
#   launches.log     one line per launch: the test that made it, ipyparallel's cluster id for a cluster's engines,
#                    then the arguments (read by the summary below);
#   mnist-arrays/    MNIST verified once, each file's array saved as <sha256>.npy ($NNLIB_MNIST_ARRAYS): jobs load
#                    these instead of decompressing and hashing the files again (nnlib.lesson01_mnist.data).
SESSION = "NNLIB_TEST_SESSION"
MADE_SESSION = SESSION not in os.environ


def make_session_folder() -> Path:
    """The session's folder, its counting mpiexec and its MNIST arrays: made once, by the first process."""
    from nnlib.course.environment import mpiexec_path

    folder = Path(tempfile.mkdtemp(prefix="nnlib-tests-"))
    real = mpiexec_path()
    (folder / "bin").mkdir()
    wrapper = folder / "bin" / "mpiexec"
    wrapper.write_text(f"#!/bin/sh\nprintf '%s\\t%s\\t%s\\n' \"$PYTEST_CURRENT_TEST\" \"$IPP_CLUSTER_ID\" \"$*\" >> "
                       f"{shlex.quote(str(folder))}/launches.log\nexec {shlex.quote(str(real))} \"$@\"\n")
    wrapper.chmod(0o755)
    os.environ.update({SESSION: str(folder), "NNLIB_MPIEXEC": str(wrapper),
                       "NNLIB_MNIST_ARRAYS": str(folder / "mnist-arrays")})
    (folder / "mnist-arrays").mkdir()
    try:  # decompress and verify MNIST once (a test that needs it says so if it is missing)
        from nnlib.lesson01_mnist.data import MNISTError, load_mnist

        load_mnist(download=False, progress=False)
    except MNISTError:
        pass
    return folder


if MADE_SESSION:
    SESSION_FOLDER = make_session_folder()


def pytest_unconfigure(config):
    if MADE_SESSION:
        shutil.rmtree(SESSION_FOLDER, ignore_errors=True)


def launches() -> list[tuple[str, str, str]]:
    """(the test, the cluster id or '', mpiexec's arguments) of every launch so far in this session, --version and
    the like left out."""
    log = Path(os.environ[SESSION]) / "launches.log"
    lines = log.read_text().splitlines() if log.exists() else []
    rows = [tuple(line.split("\t", 2)) for line in lines if line.count("\t") >= 2]
    return [row for row in rows if row[2].split()[:1] not in (["--version"], ["-info"])]


def in_nbval(nodeid: str) -> bool:
    """Whether ``nodeid`` is a notebook's cell under nbval (a browser test may name a notebook in its parameters)."""
    return nodeid.split("::")[0].endswith(".ipynb")


def pytest_terminal_summary(terminalreporter):
    """What the session spent its time and processes on: worker-seconds of nbval and of the rest, mpiexec
    launches and cluster start-ups outside nbval (a cluster's engines are one launch; a restart launches them
    again for the same cluster, whose $IPP_CLUSTER_ID stays)."""
    if not MADE_SESSION:
        return
    seconds = {True: 0.0, False: 0.0}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "nodeid", None) and hasattr(report, "duration"):
                seconds[in_nbval(report.nodeid)] += report.duration
    outside = [(test, cluster, arguments) for test, cluster, arguments in launches() if not in_nbval(test)]
    engines = [cluster for _, cluster, arguments in outside if "ipyparallel" in arguments]
    clusters = set(engines)
    by_file = {}
    for test, _, _ in outside:
        name = test.split("::")[0].split("/")[-1] or "(outside a test)"
        by_file[name] = by_file.get(name, 0) + 1
    write = terminalreporter.write_line
    terminalreporter.section("where the time and the processes went")
    write(f"worker-seconds: {seconds[False]:.0f} outside nbval, {seconds[True]:.0f} in nbval of the notebooks")
    write(f"mpiexec launches outside nbval: {len(outside)}, of which {len(engines)} started a cluster's engines "
          f"({len(clusters)} cluster start-ups, {len(engines) - len(clusters)} restarts)")
    write("launches by file: " + (", ".join(f"{name} {count}" for name, count in sorted(by_file.items())) or "none"))


# Test modules whose tests must run one after another in one worker, and why.
ONE_WORKER = {
    "test_browser.py": "one JupyterLab server and one Chromium for the module (module fixtures)",
    "test_book.py": "one book build for the module, into build/book-src (a fixed folder)",
    "test_classroom.py": "one kernel and its cluster for the module, its cells run in order",
    "test_cluster.py": "one cluster for the module (a module fixture)",
    "test_multihost.py": "the virtual hosts have fixed names and addresses",
}


def work_unit(nodeid: str) -> str:
    """What must run in one worker, in order, with the test ``nodeid``: its notebook (nbval runs a
    notebook's cells in one kernel, one after another), its module if ONE_WORKER names it, the MPI checkers of one
    rank count (test_mpi.py's cases "[P-checker]" share one mpiexec launch of P ranks), else itself."""
    path = nodeid.split("::")[0]
    if path.endswith(".ipynb") or Path(path).name in ONE_WORKER:
        return path
    if Path(path).name == "test_mpi.py" and "::test_mpi_checker[" in nodeid:
        return path + "[" + nodeid.split("[", 1)[1].split("-", 1)[0] + " ranks]"
    return nodeid


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup` (make test) with the groups of work_unit: each goes to one worker whole, every
    other test to whichever worker is free, the largest units first. (xdist's own loadgroup reads
    xdist_group marks by renaming the tests' nodeids, which pytest 9 no longer allows.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return work_unit(nodeid)

    return WorkUnitScheduling(config, log)


def idx_bytes(array: np.ndarray) -> bytes:
    """The IDX encoding of a uint8 array: 00 00 08 ndim, big-endian dimensions, data."""
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


@pytest.fixture
def tiny_mnist():
    """Four small IDX files with the MNIST names: {name: (array, idx bytes, sha256)}."""
    rng = np.random.default_rng(0)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (20, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": np.arange(20, dtype=np.uint8) % 10,
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (10, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": np.arange(10, dtype=np.uint8),
    }
    files = {}
    for name, array in arrays.items():
        raw = idx_bytes(array)
        files[name] = (array, raw, hashlib.sha256(raw).hexdigest())
    return files


class FileServer:
    """A threaded HTTP server on 127.0.0.1 serving ``routes`` {path: bytes}; other paths get 404.

    ``lie_about_length`` paths announce more bytes than they send, then close: an interrupted download.
    """

    def __init__(self):
        self.routes, self.lie_about_length, self.requests = {}, set(), []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                server.requests.append(self.path)
                body = server.routes.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body) * (2 if self.path in server.lie_about_length else 1)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def file_server():
    server = FileServer()
    yield server
    server.close()


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    """An empty user cache and no NNLIB_DATA, so only what a test provides is found."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("NNLIB_DATA", raising=False)
    monkeypatch.delenv("NNLIB_MNIST_ARRAYS", raising=False)
    return tmp_path / "cache" / "nnlib" / "mnist"


@pytest.fixture(scope="session")
def mnist():
    """The real MNIST (from $NNLIB_DATA or the cache; `make test` fetches it first)."""
    from nnlib.lesson01_mnist.data import load_mnist

    return load_mnist(download=False)


def gzip_bytes(raw: bytes) -> bytes:
    return gzip.compress(raw, mtime=0)


def run_mpi_script(script, ranks: int, timeout: float = 240):
    """Run a checker script under this environment's mpiexec with ``ranks`` ranks.

    Returns the CompletedProcess. A rank that raises alone before a collective leaves the
    others waiting forever: the timeout turns that hang into a test failure.
    """
    from nnlib.course.environment import mpiexec_path

    return subprocess.run([mpiexec_path(), "-n", str(ranks), sys.executable, str(script)],
                          capture_output=True, text=True, timeout=timeout)
