"""`mpiexec -n N python -m nnlib train`: the batch job, its output file and its errors; atomic writes.

Each refusal is tested where it is decided, in this process: the settings check that every rank makes before any
collective (nnlib.train_command.check_settings, then the deadline's check of --timeout), with the job's parser and
the rank count; what the job refuses later (rank 0's data checks, lesson 12's pipeline and grid, lesson 06's check
of the run, the GPU check, a resume's checkpoint checks) through the job's entry point on this process's one rank,
or with a stand-in communicator where the rank count decides. Each way a job ends is launched once: a refusal (the
settings check's, lesson 06's check of the run's and lesson 18's pipeline's, in the launch of the 2-rank jobs), rank
0's shared verdict, an error on one rank (MPI_Abort), a hang, a resume that does not fit.

Jobs whose results are compared run several to a launch, once per test session (tests/shared_runs.py,
tests/job_driver.py): a one-rank reference run (in this process) against the data-parallel strategies, the model
splits and lesson 18's schedules; each stand-in GPU mode against the CPU. Notebook 13, under nbval, kills a rank of
a float64 job and resumes it on 2 and on 3 ranks; the float32 kill is here.
"""

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from shared_runs import Job, jobs_run_once

from nnlib.course.environment import mpiexec_path
from nnlib.lesson01_mnist.files import atomic_write

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "cluster"


def run_training(ranks, *arguments, timeout=180):
    """``mpiexec -n ranks python -m nnlib train *arguments``: the completed process (its output captured)."""
    return subprocess.run([mpiexec_path(), "-n", str(ranks), sys.executable, "-m", "nnlib", "train", *arguments],
                          capture_output=True, text=True, timeout=timeout)


def job_arguments(*arguments):
    """``arguments`` as the batch job parses them (``python -m nnlib train``'s parser)."""
    from nnlib.__main__ import build_parser

    return build_parser().parse_args(["train", *arguments])


def run_here(monkeypatch, *arguments) -> int:
    """The batch job, run in this process (its one rank) through its entry point, nnlib.train_command.run: its exit
    status. An error that would end the job with MPI_Abort fails the test instead (AssertionError)."""
    from nnlib.train_command import job

    def abort_job(error):
        raise AssertionError(f"the job would have ended with MPI_Abort: {error!r}") from error

    monkeypatch.setattr(job, "abort_job", abort_job)
    return job.run(job_arguments(*arguments))


def relative_difference(got, expected) -> float:
    """The largest |difference| of two parameter vectors, over the largest |expected| value."""
    return float(np.abs(got - expected).max() / np.abs(expected).max())


SMALL = ("--samples", "1001", "--epochs", "2", "--batch-size", "50", "--hidden", "16")  # 21 steps per epoch
# the one-rank reference run, and the strategies and model splits compared with it (4 weight layers: lesson 18's
# interleaved schedule gives each of 2 ranks 2 of them)
REFERENCE = ("--samples", "1001", "--epochs", "2", "--batch-size", "64", "--hidden", "16", "12", "8", "--dtype",
             "float64")
PIPELINE = (*REFERENCE, "--grid", "1,1,2", "--micro-batches", "3")
# lesson 14's asynchronous job against synchronous per-rank training (plain SGD: the server has no momentum)
ASYNCHRONOUS = ("--samples", "1001", "--epochs", "2", "--batch-size", "50", "--hidden", "16", "--dtype", "float64",
                "--momentum", "0", "--learning-rate", "0.5")
COMPRESSED = ("--samples", "1001", "--epochs", "2", "--batch-size", "64", "--hidden", "16", "--dtype", "float64")
ZERO_PER_RANK = (*SMALL, "--dtype", "float64", "--strategy", "zero", "--sampler", "per_rank")
ADAM = (*COMPRESSED, "--optimizer", "adam", "--learning-rate", "0.01")  # ZeRO's and FSDP's resume on 2, 3, 4 ranks
SHARDED = {"zero": ("--strategy", "zero"), "zero-2": ("--strategy", "zero", "--zero-stage", "2"),
           "fsdp": ("--strategy", "fsdp")}  # the strategies that keep a slice of the optimizer's state
ADAMW = (*REFERENCE, "--optimizer", "adamw", "--learning-rate", "0.01")  # the model splits with AdamW

#: Each way a job on 2 ranks refuses, run in JOBS_ON[2]'s launch: the settings check (before any collective), lesson
#: 06's check of the run (check_run, then fail_together, in train_parallel), lesson 18's pipeline (ScheduledPipeline
#: with the job's own number of virtual stages: 2 ranks, 2 chunks each, 2 weight layers; lesson 12's check of the
#: micro-batches): {name: (Job, message)}.
REFUSED_ON_2_RANKS = {
    "refused setting": (Job((*SMALL, "--slow", "5:0.1")), "error: --slow names rank 5, but the job has ranks 0 to 1"),
    "global batch below the ranks": (Job(("--epochs", "1", "--samples", "500", "--batch-size", "1")),
                                     "the global batch (1) is smaller than the number of ranks (2)"),
    "interleaved deeper than the network": (Job(("--epochs", "1", "--samples", "500", "--grid", "1,1,2",
                                                 "--schedule", "interleaved", "--hidden", "16")),
                                            "every stage needs at least one"),
    "no micro-batches": (Job(("--epochs", "1", "--samples", "500", "--grid", "1,1,2", "--hidden", "16",
                              "--micro-batches", "0")), "micro_batches must be a positive integer; got 0"),
}
#: The jobs whose results the tests compare (and REFUSED_ON_2_RANKS), by number of ranks: each group runs once per
#: session, in one launch.
JOBS_ON = {
    1: {"reference": Job(REFERENCE), "synchronous": Job((*ASYNCHRONOUS, "--sampler", "per_rank")),
        "adamw reference": Job(ADAMW)},
    2: {"tensor": Job((*REFERENCE, "--grid", "1,2,1")),
        "pipeline gpipe": Job((*PIPELINE, "--schedule", "gpipe")),
        "interleaved": Job((*PIPELINE, "--schedule", "interleaved", "--virtual-stages", "2", "--trace",
                            "{folder}/interleaved.json")),
        "zb-h2": Job((*PIPELINE, "--schedule", "zb-h2", "--trace", "{folder}/zb-h2.json")),
        "asynchronous": Job((*ASYNCHRONOUS, "--asynchronous", "--staleness", "0")),
        "synchronous": Job((*ASYNCHRONOUS, "--sampler", "per_rank")),
        "whole float32": Job((*SMALL, "--dtype", "float32")),
        "adamw tensor": Job((*ADAMW, "--grid", "1,2,1")),
        "adamw zb-h2": Job((*ADAMW, "--grid", "1,1,2", "--micro-batches", "3", "--schedule", "zb-h2")),
        **{name: job for name, (job, _) in REFUSED_ON_2_RANKS.items()}},  # last: a refusal that aborted would stop
    3: {"allreduce": Job(REFERENCE), "zero": Job((*REFERENCE, "--strategy", "zero")),
        "overlap": Job((*REFERENCE, "--strategy", "overlap")), "fsdp": Job((*REFERENCE, "--strategy", "fsdp")),
        "per_rank": Job((*REFERENCE, "--sampler", "per_rank")),
        "asynchronous": Job((*ASYNCHRONOUS, "--asynchronous", "--staleness", "0")),
        "synchronous": Job((*ASYNCHRONOUS, "--sampler", "per_rank")),
        "plain": Job(COMPRESSED), "topk everything": Job((*COMPRESSED, "--compression", "topk", "--topk", "12730")),
        "bfloat16": Job((*COMPRESSED, "--compression", "bfloat16", "--slow", "1:0.001")),
        "zero per_rank": Job(ZERO_PER_RANK),
        "zero-2": Job((*REFERENCE, *SHARDED["zero-2"])),
        **{f"adam {kind}{stop}": Job((*ADAM, *SHARDED[kind], *more)) for kind in SHARDED
           for stop, more in (("", ()), (" epoch 1", ("--epochs", "1", "--checkpoint-dir", f"{{folder}}/{kind}")))}},
    4: {"tensor 2x2": Job((*REFERENCE, "--grid", "2,2,1")),
        "grid 1x2x2": Job((*REFERENCE, "--grid", "1,2,2", "--micro-batches", "3", "--schedule", "gpipe")),
        **{f"adamw zero {layout}": Job((*ADAMW, "--grid", layout, "--strategy", "zero", "--micro-batches", "3"))
           for layout in ("2,2,1", "2,1,2")},
        "asynchronous": Job((*ASYNCHRONOUS, "--asynchronous", "--staleness", "0"))},
}


def runs_on(ranks: int) -> dict:
    """{name: JobRun} of JOBS_ON[ranks], run once per session (tests/shared_runs.py)."""
    return jobs_run_once(f"test_train_command-{ranks}-ranks", ranks, JOBS_ON[ranks])


def reference_params():
    """The one-rank run's parameters (REFERENCE)."""
    reference = runs_on(1)["reference"]
    assert reference.returncode == 0, reference.stderr
    return reference.params()


def test_batch_job_trains_reports_on_rank_0_only_and_writes_its_output(tmp_path):
    output = tmp_path / "run.npz"
    run = run_training(2, "--samples", "3001", "--epochs", "2", "--batch-size", "64", "--hidden", "32",
                       "--strategy", "parameter_server", "--output", str(output))
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert sum(line.startswith("epoch 1/2") for line in lines) == 1  # one progress line, from rank 0
    assert "2 ranks, strategy parameter_server, network 784-32-10, 3001 samples, global batch 64" in lines
    with np.load(output) as saved:
        assert saved["params"].shape == (784 * 32 + 32 + 32 * 10 + 10,)
        assert saved["layer_sizes"].tolist() == [784, 32, 10]
        assert saved["loss"].shape == (2,) and saved["loss"][1] < saved["loss"][0]
        assert saved["phase_seconds"].shape == (2, 4)
        assert 0.8 < float(saved["test_accuracy"]) <= 1.0
    assert [p.name for p in tmp_path.iterdir()] == ["run.npz"]  # no temporary file left


# -- refusals, where they are decided ---------------------------------------------------------------------------

def settings_refusal(ranks, *arguments) -> str:
    """What the job's first check refuses on ``ranks`` ranks, on every rank alike and before any collective
    (nnlib.train_command.job.train_job): the settings check, then the deadline's check of --timeout."""
    from mpi4py import MPI

    from nnlib.course.deadline import watch
    from nnlib.train_command import check_settings

    args = job_arguments(*arguments)
    with pytest.raises(ValueError) as refused:
        check_settings(args, ranks)
        watch(MPI.COMM_WORLD, args.timeout)
    return str(refused.value)


SETTINGS_REFUSED = [  # (ranks, arguments after SMALL, message); what the table refuses: REFUSED, below
    (2, ["--timeout", "0"], "timeout must be a number of seconds above 0"),
    (2, ["--timeout", "-5"], "timeout must be a number of seconds above 0"),
    (2, ["--timeout", "1e9"], "timeout must be a number of seconds above 0"),
    (2, ["--timeout", "nan"], "timeout must be a number of seconds above 0"),
    (2, ["--fault", "1:kill"], "--fault must be RANK:STEP:KIND"),
    (2, ["--resume"], "--resume needs --checkpoint-dir"),
    (2, ["--checkpoint-every", "-1"], "--checkpoint-every must be 0"),
    *[(2, ["--grid", grid], f"--grid must be D,T,P, three whole numbers (data x tensor x pipeline ranks, e.g. 2,2,1 "
                            f"on 4 ranks); got {grid!r}") for grid in ("2,1", "1,2,x", "1,-2,1", "1,2,1,1")],
    (4, ["--grid", "2,2,2"], "--grid 2,2,2: data x tensor x pipeline = 2 x 2 x 2 = 8, but there are 4 ranks: choose "
                             "degrees whose product is 4"),
    (2, ["--grid", "0,2,1"], "the grid needs three positive whole degrees"),
    (4, ["--grid", "1,4,1", "--hidden", "3"], "--grid 1,4,1: tensor degree 4 is too wide: its narrowest layer split "
                                              "by columns has 3 hidden units. Use a tensor degree of at most 3"),
    (3, ["--grid", "1,1,3"], "--grid 1,1,3: 3 pipeline stages but the network has only 2 weight layers"),
    (2, ["--grid", "1,2,1", "--strategy", "zero", "--zero-stage", "2"], "--grid D,T,P does not combine with "
                                                                        "--zero-stage"),
    (2, ["--schedule", "zb-h1"], "--schedule zb-h1 needs a pipeline of whole layers: --grid D,1,P with P above 1"),
    (4, ["--grid", "1,2,2", "--hidden", "16", "8", "8", "--schedule", "interleaved"],
     "--schedule interleaved needs a pipeline of whole layers"),
    (2, ["--grid", "1,1,2", "--virtual-stages", "2"], "--virtual-stages goes with --schedule interleaved"),
    (2, ["--compression", "topk", "--topk", "0"], "top-k compression needs --topk K, a whole number from 1"),
    (3, ["--compression", "topk", "--topk", "999999"], "from 1 to the number of parameters (12730)"),
    (2, ["--compression", "topk"], "needs --topk K"),
    (2, ["--compression", "int8"], "compression must be one of none, float16, bfloat16, topk; got 'int8'"),
    (2, ["--compression", "float16", "--topk", "5"], "k is only for top-k compression"),
    (4, ["--compression", "float16", "--strategy", "zero"], "--strategy zero does not combine with --compression"),
    (2, ["--staleness", "2"], "--staleness bounds the asynchronous parameter server: add --asynchronous"),
    (3, ["--asynchronous", "--staleness", "-1"], "--staleness must be a whole number of steps, 0 or more"),
    (1, ["--asynchronous"], "--asynchronous needs a server and at least one worker"),
    (2, ["--asynchronous", "--slow", "0:0.1"], "--slow's rank must be a worker, 1 to 1; got 0"),
    (2, ["--slow", "5:0.1"], "--slow names rank 5, but the job has ranks 0 to 1"),
    (2, ["--slow", "1:fast"], "--slow must be RANK:SECONDS"),
    (3, ["--asynchronous", "--compression", "float16"], "--compression float16/bfloat16/topk does not combine with "
                                                        "--asynchronous"),
    (2, ["--asynchronous", "--batch-size", "0"], "--asynchronous needs mini-batches: give --batch-size"),
    (3, ["--dtype", "float16"], "--dtype must be float32 or float64"),
    *[(2, ["--strategy", "zero", "--zero-stage", "2", *other], "--zero-stage 2 keeps float32 or float64 gradients on "
       "the CPU") for other in (("--precision", "float16"), ("--device", "gpu"))],
    *[(2, arguments, message) for arguments, message in [
        (["--optimizer", "adam", "--momentum", "0.9"], "momentum is SGD's (Adam's is beta1): leave it at its default"),
        (["--optimizer", "sgd", "--beta1", "0.8", "--eps", "1e-6"], "beta1, beta2 and eps are Adam's"),
        (["--optimizer", "adam", "--weight-decay", "0.1"], "weight_decay is AdamW's"),
        (["--asynchronous", "--optimizer", "adamw"], "--asynchronous updates with plain SGD, not adamw"),
        (["--optimizer", "adamw", "--beta2", "1.5"], "beta2 must be in [0, 1); got 1.5")]],
]


@pytest.mark.parametrize("ranks, arguments, message", SETTINGS_REFUSED)
def test_each_refused_setting_gets_its_message_from_the_check_every_rank_makes_first(ranks, arguments, message):
    assert message in settings_refusal(ranks, *SMALL, *arguments)


@pytest.mark.parametrize("name", REFUSED_ON_2_RANKS)
def test_a_refusal_on_2_ranks_ends_every_rank_with_exit_2_said_once_by_rank_0(name):
    """Each way the job refuses (REFUSED_ON_2_RANKS; the settings check's messages: the test above), run on 2 ranks
    (tests/job_driver.py, through the job's entry point): every rank refuses, rank 0 says it once, no traceback,
    exit status 2. (The process's own exit status 2: test_rank_0s_verdict_on_its_data_ends_every_rank...)"""
    run, message = runs_on(2)[name], REFUSED_ON_2_RANKS[name][1]
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stderr.startswith("error: ") and run.stderr.count(message) == 1, run.stderr
    assert "Traceback" not in run.stderr


JOB_REFUSED = [  # (arguments, message): refused inside the job, after the settings check; "{tmp}": tmp_path
    (["--samples", "0"], "--samples must be between 1 and 60000; got 0"),  # rank 0's data checks
    (["--output", "/nonexistent/folder/run.npz"], "its folder does not exist"),
    (["--device", "gpu"], "device='gpu' was asked for, but CuPy is not installed"),  # (no CuPy here)
    (["--checkpoint-dir", "{tmp}/none", "--resume"], "nothing to resume: the checkpoint folder"),  # rank 0's
]


@pytest.mark.parametrize("arguments, message", JOB_REFUSED)
def test_what_the_job_refuses_after_its_settings_check_is_said_once_with_exit_2(arguments, message, tmp_path, capsys,
                                                                                monkeypatch, request):
    """Through the job's entry point in this process: every rank's verdict (here one rank's), said once, no
    traceback, exit status 2. The launch of test_rank_0s_verdict... checks that path across ranks."""
    from nnlib.course import environment

    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy fails, as without CuPy
    environment.gpu_status.cache_clear()  # (the GPU check is cached: made again, and again after the test)
    request.addfinalizer(environment.gpu_status.cache_clear)
    arguments = [word.replace("{tmp}", str(tmp_path)) for word in arguments]
    assert run_here(monkeypatch, "--epochs", "1", "--samples", "500", *arguments) == 2
    stderr = capsys.readouterr().err
    assert stderr.startswith("error: ") and stderr.count(message) == 1 and "Traceback" not in stderr, stderr


class SameOnEveryRank:
    """A stand-in for rank 0 of a communicator of ``size`` ranks, all of them passing the same values."""

    def __init__(self, size: int):
        self.size, self.rank = size, 0

    def allgather(self, value):
        return [value] * self.size


def test_a_global_batch_smaller_than_the_ranks_is_refused_by_lesson_05s_check_of_the_run():
    """Decided on every rank as training begins (check_run, then fail_together), for 2 ranks here (on 2 real ranks,
    through the job: REFUSED_ON_2_RANKS)."""
    from nnlib import Network
    from nnlib.lesson06_data_parallel.data_parallel import check_run
    from nnlib.train_command import check_settings

    args = job_arguments("--epochs", "1", "--samples", "500", "--batch-size", "1")
    settings = check_settings(args, 2)  # (the settings check lets it through)
    network = Network((784, *args.hidden, 10))
    shard = np.zeros((250, 784), dtype=np.float32), np.zeros(250, dtype=np.int64)
    problems = check_run(SameOnEveryRank(2), network, *shard, args.samples, settings, None)
    assert any("the global batch (1) is smaller than the number of ranks (2)" in problem for problem in problems)


def test_rank_0s_verdict_on_its_data_ends_every_rank_with_exit_2_said_once():
    """Rank 0 alone finds it (the data checks: see JOB_REFUSED), every rank stops together, rank 0 says it once."""
    run = run_training(2, "--epochs", "1", "--samples", "0")
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stderr.count("--samples must be between 1 and 60000") == 1, run.stderr
    assert "Traceback" not in run.stderr


# -- the stand-in GPU (tests/stand_in_cupy.py): jobs run several to a launch (tests/job_driver.py) -------------------

def test_batch_job_on_gpus_gives_each_rank_of_a_node_its_own_gpu():
    """With the stand-in CuPy posing as 2 GPUs: 3 ranks on one node use GPUs 0, 1, 0, stage gradients through host
    memory, and learn as on the CPU."""
    settings = ("--samples", "1500", "--epochs", "2", "--batch-size", "60", "--hidden", "16")
    runs = jobs_run_once("test_train_command-stand-in-gpus-3-ranks", 3, {
        "gpu": Job((*settings, "--device", "gpu"), cupy={"gpus": 2}), "cpu": Job((*settings, "--device", "cpu"))})
    on_gpu, on_cpu = runs["gpu"], runs["cpu"]
    assert on_gpu.returncode == on_cpu.returncode == 0, on_gpu.stderr + on_cpu.stderr
    assert ("on the GPU (GPU Stand-in GPU (NumPy) passed a smoke test); GPU of each rank: [0, 1, 0]; "
            "gradients staged through host memory") in on_gpu.stdout
    assert "on the GPU" not in on_cpu.stdout

    def results(stdout):
        return [line.split(", ")[:2] for line in stdout.splitlines() if line.startswith("epoch ")] + \
            [stdout.split("test accuracy ")[1].split(";")[0]]

    assert results(on_gpu.stdout) == results(on_cpu.stdout)


GPU_MODES = [("--grid", "1,2,1"), ("--asynchronous",), ("--strategy", "fsdp"),
             ("--strategy", "fsdp", "--recompute", "2", "--accumulate", "2"),
             *[("--strategy", strategy, "--precision", "float16", "--dtype", "float32")
               for strategy in ("allreduce", "zero", "fsdp")],
             *[("--grid", "1,1,2", "--schedule", schedule) for schedule in
               ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2")],
             *[(*mode, "--optimizer", "adamw", "--learning-rate", "0.01") for mode in  # Adam's kernel, fused
               [("--strategy", "allreduce"), ("--strategy", "zero"), ("--grid", "1,1,2")]]]


def stand_in_gpu_runs() -> dict:
    """Every mode of GPU_MODES on 2 ranks, on the CPU and on the counting stand-in GPU (its arrays refuse silent
    trips to the host), float64 unless the mode says otherwise: {(mode, device): JobRun}, one launch per session."""
    settings = ("--samples", "600", "--epochs", "2", "--batch-size", "50", "--hidden", "16", "16", "16")
    jobs = {(mode, device): Job(("--dtype", "float64", *mode, *settings, "--device", device),
                                cupy={"counting": True} if device == "gpu" else None)
            for mode in GPU_MODES for device in ("cpu", "gpu")}
    runs = jobs_run_once("test_train_command-stand-in-gpu-2-ranks", 2, {" ".join((*mode, device)): job
                                                                        for (mode, device), job in jobs.items()})
    return {(mode, device): runs[" ".join((*mode, device))] for mode, device in jobs}


@pytest.mark.parametrize("mode", GPU_MODES, ids=" ".join)
def test_fsdp_model_parallel_asynchronous_and_mixed_precision_jobs_on_the_stand_in_gpu_equal_the_cpu_run(mode):
    """Every array of the network on the device, its messages staged through host memory (lesson 08's HostStaging;
    the parameter server's through host copies); 2 ranks: the asynchronous job's one worker makes its order fixed.
    Mixed precision keeps float32 master weights: compared in float32 (the stand-in computes as NumPy does)."""
    runs = stand_in_gpu_runs()
    cpu, gpu = runs[mode, "cpu"], runs[mode, "gpu"]
    assert [cpu.returncode, gpu.returncode] == [0, 0], cpu.stderr + gpu.stderr
    difference = relative_difference(gpu.params(), cpu.params())
    assert "GPU of each rank: [0, 0]" in gpu.stdout and difference <= 1e-12, (gpu.stdout, difference)


def test_atomic_write_renames_on_success_and_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "file.bin"
    with atomic_write(target) as stream:
        stream.write(b"complete")
        assert not target.exists()  # nothing visible until the block ends
    assert target.read_bytes() == b"complete"
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask
    with pytest.raises(RuntimeError):
        with atomic_write(target) as stream:
            stream.write(b"half")
            raise RuntimeError("interrupted")
    assert target.read_bytes() == b"complete" and [p.name for p in tmp_path.iterdir()] == ["file.bin"]


# --- when things go wrong: faults, deadlines, checkpoints and resume ----------------------------

def final_params(path):
    with np.load(path) as saved:
        return saved["params"]


def interrupted_then_resumed(tmp_path, ranks, settings, fault, whole, resume_ranks=None):
    """``whole``: the job run whole on ``ranks`` ranks (a JobRun of tests/shared_runs.py, shared by the session).
    The job again with a checkpoint every 10 steps until ``fault`` (RANK:35:HOW) ends it in epoch 2; then resumed
    on ``resume_ranks`` (default the same). Checks each run's exit and the resume's report; returns (the
    uninterrupted run, the failed run, whole params, resumed params)."""
    assert whole.returncode == 0, whole.stderr
    checkpoints = ("--checkpoint-dir", str(tmp_path / "checkpoints"), "--checkpoint-every", "10")
    failed = run_training(ranks, *settings, *checkpoints, "--fault", fault)
    assert failed.returncode != 0 and "epoch 2/2" not in failed.stdout  # it really ended in epoch 2
    resumed = run_training(resume_ranks or ranks, *settings, *checkpoints, "--resume",
                           "--output", str(tmp_path / "resumed.npz"))
    assert resumed.returncode == 0, resumed.stderr
    assert f"30 steps done (epoch 2, step 9), written by {ranks} ranks" in resumed.stdout
    return whole, failed, whole.params(), final_params(tmp_path / "resumed.npz")


def test_a_killed_rank_then_resume_gives_bit_identical_parameters(tmp_path):
    """SIGKILL on rank 1 of a float32 job in the middle of epoch 2; resuming with the same number of ranks gives
    exactly the uninterrupted run's parameters. (Notebook 13, under nbval, kills a float64 job the same way and
    resumes it on 2 ranks, bit for bit, and on 3, within 1e-10.)"""
    settings = JOBS_ON[2]["whole float32"].arguments
    checkpoints = ("--checkpoint-dir", str(tmp_path / "checkpoints"), "--checkpoint-every", "10")
    killed = run_training(2, *settings, *checkpoints, "--fault", "1:35:kill")
    assert killed.returncode != 0 and "injecting the fault 'kill' after step 35" in killed.stderr
    assert "epoch 2/2" not in killed.stdout  # it really died in epoch 2
    resumed = run_training(2, *settings, *checkpoints, "--resume", "--output", str(tmp_path / "resumed.npz"))
    assert resumed.returncode == 0, resumed.stderr
    assert "30 steps done (epoch 2, step 9), written by 2 ranks" in resumed.stdout
    whole = runs_on(2)["whole float32"]
    assert whole.returncode == 0, whole.stderr
    assert np.array_equal(final_params(tmp_path / "resumed.npz"), whole.params())


def test_a_rank_that_raises_ends_the_whole_job_with_its_message():
    run = run_training(3, *SMALL, "--fault", "1:5:raise", "--timeout", "60", timeout=60)
    assert run.returncode == 1
    assert "rank 1: error:" in run.stderr and "RuntimeError: injected fault: rank 1 raised after step 5" in run.stderr
    assert "rank 1: ending the whole job (MPI_Abort)" in run.stderr
    assert "epoch 1/2" not in run.stdout


def test_a_hanging_rank_is_named_and_the_job_ends_at_the_deadline():
    import time

    began = time.monotonic()
    run = run_training(3, *SMALL, "--fault", "2:5:hang", "--timeout", "3", timeout=60)
    assert run.returncode == 1
    assert "rank 2 did not arrive in Allreduce within 3 s" in run.stderr, run.stderr
    assert "at epoch 1, step 6, communicate" in run.stderr
    assert time.monotonic() - began < 20


def test_a_resume_that_does_not_fit_its_checkpoints_is_refused_said_once(tmp_path, capsys, monkeypatch):
    """The job's checkpoints (written here, on this process's one rank); resumed by a job with another network on
    2 ranks: rank 0's check of the checkpoint refuses it, said once, no traceback, exit status 2. A truncated newest
    checkpoint is refused by the same check (here, through the job's entry point). (No checkpoint at all:
    JOB_REFUSED.)"""
    folder = ("--checkpoint-dir", str(tmp_path / "checkpoints"))
    assert run_here(monkeypatch, *SMALL, *folder) == 0
    other = run_training(2, *SMALL, "--hidden", "20", *folder, "--resume")
    assert other.returncode == 2, other.stdout + other.stderr
    assert other.stderr.count("layer_sizes: the checkpoint has [784, 16, 10], this run [784, 20, 10]") == 1
    assert "Traceback" not in other.stderr
    newest = sorted((tmp_path / "checkpoints").iterdir())[-1]
    newest.write_bytes(newest.read_bytes()[:-100])
    capsys.readouterr()
    assert run_here(monkeypatch, *SMALL, *folder, "--resume") == 2
    stderr = capsys.readouterr().err
    assert stderr.count("is truncated") == 1 and "Traceback" not in stderr, stderr


def test_zero_with_per_rank_sampling_resumes_bit_identically(tmp_path):
    """ZeRO keeps the momentum in slices: the checkpoint gathers it whole, the resume hands each rank its
    slice again; the per-rank sampler's batches depend only on (seed, rank, epoch)."""
    *_, whole, resumed = interrupted_then_resumed(tmp_path, 3, ZERO_PER_RANK, "2:35:raise",
                                                  runs_on(3)["zero per_rank"])
    assert np.array_equal(resumed, whole)


def test_adamw_with_the_model_split_equals_the_one_rank_adamw_run():
    """Tensor parallelism and a pipeline (zb-h2) on 2 ranks, each rank's optimizer on its own piece: the one-rank
    AdamW run's parameters within 1e-10 (float64)."""
    reference = runs_on(1)["adamw reference"]
    assert reference.returncode == 0, reference.stderr
    for name in ("adamw tensor", "adamw zb-h2"):
        split = runs_on(2)[name]
        assert split.returncode == 0, split.stderr
        assert relative_difference(split.params(), reference.params()) <= 1e-10, name


def test_adam_stopped_after_epoch_1_on_3_ranks_resumes_with_zero_1_and_2_and_fsdp_on_2_3_and_4_ranks(tmp_path):
    """ZeRO-1, ZeRO-2 and FSDP with Adam in float64: a 1-epoch run on 3 ranks leaves its checkpoint (the moments and
    the step count gathered whole from the ranks' slices); resumed for epoch 2 on 3 ranks it ends bit for bit where
    the uninterrupted 2-epoch run does, on 2 and 4 ranks (each rank takes its slice of the moments) within 1e-10."""
    import shutil

    runs = runs_on(3)
    for ranks in (2, 3, 4):
        jobs = {}
        for kind in SHARDED:
            stopped = runs[f"adam {kind} epoch 1"]
            assert stopped.returncode == 0 and stopped.stdout.count("epoch 1/1:") == 1, stopped.stderr
            shutil.copytree(stopped.output.parent / kind, tmp_path / f"{kind}-{ranks}")
            jobs[kind] = Job((*ADAM, *SHARDED[kind], "--checkpoint-dir", str(tmp_path / f"{kind}-{ranks}"),
                              "--resume"))
        resumed = jobs_run_once(f"test_train_command-adam-resumed-on-{ranks}", ranks, jobs)
        for kind, run in resumed.items():
            assert run.returncode == 0 and "16 steps done (epoch 2, step 0), written by 3 ranks" in run.stdout, \
                run.stdout + run.stderr
            whole = runs[f"adam {kind}"]
            assert whole.returncode == 0, whole.stderr
            if ranks == 3:
                assert np.array_equal(run.params(), whole.params()), kind
            else:
                assert relative_difference(run.params(), whole.params()) <= 1e-10, (kind, ranks)


# -- results compared: each group of jobs runs once per session (JOBS_ON) ---------------------------------------

def test_the_batch_jobs_strategies_equal_the_one_rank_run_and_per_rank_sampling_learns():
    """allreduce, zero (stages 1 and 2), overlap and fsdp on 3 ranks: the one-rank run's parameters to 1e-10; per-rank
    sampling: other batches, and it learns."""
    runs, reference = runs_on(3), reference_params()
    for name in ("allreduce", "zero", "zero-2", "overlap", "fsdp", "per_rank"):
        assert runs[name].returncode == 0, runs[name].stderr
    for name in ("allreduce", "zero", "zero-2", "overlap", "fsdp"):
        assert relative_difference(runs[name].params(), reference) <= 1e-10, name
    per_rank = runs["per_rank"].saved()
    assert np.abs(per_rank["params"] - reference).max() > 1e-6 and per_rank["loss"][1] < per_rank["loss"][0]


@pytest.mark.parametrize("ranks, name", [(2, "tensor"), (2, "pipeline gpipe"), (4, "tensor 2x2"), (4, "grid 1x2x2"),
                                         (4, "adamw zero 2,2,1"), (4, "adamw zero 2,1,2")])
def test_the_batch_job_splits_the_model_and_equals_the_one_rank_run(ranks, name):
    """--grid D,T,P: tensor, pipeline (1F1B unless named), both (lesson 19), with the allreduce or ZeRO-1 with AdamW on
    the data axis: the one-rank run's parameters within 1e-10."""
    split = runs_on(ranks)[name]
    assert split.returncode == 0, split.stderr
    assert f"{ranks} ranks as a grid of " in split.stdout and "test accuracy" in split.stdout
    assert split.stdout.count("epoch 2/2:") == 1, split.stdout  # one progress line per epoch, not one per piece
    expected = runs_on(1)["adamw reference"].params() if "adamw" in name else reference_params()
    assert relative_difference(split.params(), expected) <= 1e-10
    assert f"strategy {'zero' if 'zero' in name else 'allreduce'} on the data axis" in split.stdout


@pytest.mark.parametrize("name", ["interleaved", "zb-h2"])
def test_the_batch_job_runs_lesson_13s_schedules_equal_to_the_one_rank_run(name):
    """--trace: the last step's spans of each stage (pid), with 3 micro-batches."""
    split = runs_on(2)[name]
    assert split.returncode == 0, split.stderr
    assert relative_difference(split.params(), reference_params()) <= 1e-10
    trace = json.loads((split.output.parent / f"{name}.json").read_text())
    spans = [event for event in trace["traceEvents"] if event["ph"] == "X"]
    per_stage = 3 * 2 * 2 if name == "interleaved" else 3 * 3  # 3 micro-batches: F, B per chunk; F, B, W
    assert sorted(event["pid"] for event in spans) == [0] * per_stage + [1] * per_stage


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_asynchronous_job_with_bound_0_equals_synchronous_per_rank_training_on_the_workers(ranks):
    """The batch job's --asynchronous --staleness 0 on N ranks against the synchronous job (per-rank
    sampler, no momentum) on the N - 1 workers: the same parameters to 1e-10 (float64)."""
    server, synchronous = runs_on(ranks)["asynchronous"], runs_on(ranks - 1)["synchronous"]
    assert server.returncode == 0, server.stderr
    assert "staleness: mean" in server.stdout and "updates per worker" in server.stdout
    assert synchronous.returncode == 0, synchronous.stderr
    assert relative_difference(server.params(), synchronous.params()) <= 1e-10
    saved = server.saved()
    assert saved["staleness"].max() <= ranks - 2 and len(saved["worker"]) == 2 * 21 * (ranks - 1)
    assert int(saved["largest_lead"]) == 0  # s = 0: no worker was let ahead of the slowest (lesson 14 prints it)


def test_compressed_job_reports_its_bytes_and_top_k_of_everything_equals_the_plain_job():
    runs = runs_on(3)
    plain, everything, half = runs["plain"], runs["topk everything"], runs["bfloat16"]
    assert plain.returncode == everything.returncode == half.returncode == 0, plain.stderr + everything.stderr
    assert "gradients compressed: topk (k = 12730), 152,760 bytes per rank per step instead of 101,840" \
        in everything.stdout
    assert "gradients compressed: bfloat16, 25,460 bytes per rank per step instead of 101,840" in half.stdout
    assert relative_difference(everything.params(), plain.params()) <= 1e-10


# -- the shared runs themselves (tests/shared_runs.py, tests/job_driver.py): in this process ---------------------------

def test_after_a_job_that_aborts_the_driver_runs_no_later_job_and_says_why(tmp_path):
    """The ranks' verdict on each job (here of this process's one rank): the job that aborted keeps its message,
    the later ones are noted as not run, naming it; the launch would end with exit status 1 (run_jobs: False)."""
    import job_driver
    from shared_runs import job_run

    spec = [dict(name="raises", arguments=[*SMALL, "--fault", "0:2:raise"], cupy=None),
            dict(name="later", arguments=list(SMALL), cupy=None)]
    assert job_driver.run_jobs(spec, tmp_path) is False
    raised, later = job_run(tmp_path, 0, 1), job_run(tmp_path, 1, 1)
    assert raised.returncode == 1 and "injected fault: rank 0 raised after step 2" in raised.stderr, raised.stderr
    assert (later.returncode, later.stderr) == (1, "not run because job 'raises' failed before it in the same launch")
    assert not (tmp_path / "job1.rank0.json").exists()


def test_a_launch_past_its_deadline_is_ended_with_everything_it_started(tmp_path, monkeypatch):
    """A process that the launch started in a session of its own (as Hydra starts its proxies and ranks), and that
    ignores SIGTERM, is killed too."""
    import psutil
    import shared_runs

    monkeypatch.setattr(shared_runs, "KILL_GRACE", 1)
    child = ("import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
             "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)")
    program = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}, sys.argv[1]], "
               "start_new_session=True); time.sleep(120)")
    began = time.monotonic()
    with pytest.raises(TimeoutError, match="ran past 4 s: ended, with everything it started"):
        shared_runs.launch(tmp_path, [sys.executable, "-c", program, str(tmp_path / "child.pid")], 4)
    assert time.monotonic() - began < 20
    with contextlib.suppress(psutil.NoSuchProcess):  # (gone: as it should be)
        child = psutil.Process(int((tmp_path / "child.pid").read_text()))
        with contextlib.suppress(psutil.TimeoutExpired):
            child.wait(5)
        outlived = child.status() != psutil.STATUS_ZOMBIE
        child.kill()  # (if it outlived the launch: not past this test)
        assert not outlived, "the launch's child outlived it"


def test_a_shared_make_that_is_interrupted_is_not_made_again_and_later_asks_say_so(tmp_path, monkeypatch):
    """A BaseException (KeyboardInterrupt; pytest's outcomes are ones too) is noted as the make's failure."""
    import shared_runs

    monkeypatch.setenv("NNLIB_TEST_SESSION", str(tmp_path))
    made = []

    def make(folder):
        made.append(folder)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        shared_runs.once_per_session("runs", make, 10)
    with pytest.raises(RuntimeError, match=r"runs, made once for the test session, failed:(.|\n)*KeyboardInterrupt"):
        shared_runs.once_per_session("runs", make, 10)
    assert len(made) == 1


def test_a_process_waits_for_another_processs_shared_make_only_until_its_deadline(tmp_path, monkeypatch):
    import fcntl

    import shared_runs

    monkeypatch.setenv("NNLIB_TEST_SESSION", str(tmp_path))
    monkeypatch.setattr(shared_runs, "LOCK_MARGIN", 0)
    with open(tmp_path / "runs.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as another process that is making it (each open file has its own lock)
        with pytest.raises(TimeoutError, match="another process of the test session has been making it for more"):
            shared_runs.once_per_session("runs", lambda folder: None, 1)


def test_two_groups_of_one_name_with_other_jobs_do_not_share_results(tmp_path, monkeypatch):
    """A group is kept under its name and its jobs' hash: the second group runs its own job."""
    monkeypatch.setenv("NNLIB_TEST_SESSION", str(tmp_path))
    one = jobs_run_once("group", 1, {"job": Job((*SMALL, "--dtype", "float16"))})["job"]
    other = jobs_run_once("group", 1, {"job": Job((*SMALL, "--slow", "5:0.1"))})["job"]
    assert "--dtype must be float32 or float64" in one.stderr and "--slow names rank 5" in other.stderr


def test_a_rank_whose_mpi_abort_never_returns_ends_itself():
    """If the process manager is gone, MPI_Abort can wait for ever: the rank's alarm ends it anyway."""
    program = textwrap.dedent("""
        import sys, time, types
        from nnlib.train_command import job  # (with the real mpi4py)
        from nnlib.lesson13_faults import watchdog
        fake = types.ModuleType("mpi4py")  # an MPI_Abort that never returns, as with its manager gone
        fake.MPI = types.SimpleNamespace(COMM_WORLD=types.SimpleNamespace(rank=0, Abort=lambda code: time.sleep(600)))
        sys.modules["mpi4py"] = fake
        job.ABORT_GRACE = 1
        job.abort_job(RuntimeError("the error to report"))
    """)
    began = time.monotonic()
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert run.returncode == -signal.SIGALRM, (run.returncode, run.stderr)
    assert time.monotonic() - began < 30
    assert "the error to report" in run.stderr and "ending the whole job (MPI_Abort)" in run.stderr


@pytest.mark.parametrize("script", sorted(path.name for path in EXAMPLES.glob("*.sbatch")))
def test_the_slurm_examples_give_settings_the_batch_job_accepts(script):
    """Each example's `python -m nnlib train ...` parses and passes the job's own checks for its number of ranks
    (a --grid's degrees among them)."""
    from nnlib.__main__ import build_parser
    from nnlib.train_command import check_settings

    text = (EXAMPLES / script).read_text()
    settings = dict(re.findall(r"^#SBATCH --([a-z-]+)=(\S+)", text, flags=re.M))
    ranks = int(settings["nodes"]) * int(settings["ntasks-per-node"])
    command = re.search(r"^srun .*? -m nnlib (train .*?)(?<!\\)$", text, flags=re.M | re.S).group(1)
    command = command.replace("\\\n", " ").replace("$SLURM_JOB_ID", "1")
    args = build_parser().parse_args(shlex.split(command))
    check_settings(args, ranks)  # what the job checks on every rank before it starts


# -- what combines with what: one table (nnlib.train_command.options.COMBINES), one message --------------------------

def parsed(*arguments):
    import argparse

    from nnlib.train_command import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--epochs", "1", *arguments])


ASYNCHRONOUS, LOCAL = ("--asynchronous",), ("--local-steps", "2", "--sampler", "per_rank")
REFUSED = [  # (arguments, the kind of training, the option it does not take): each says so in the one message
    *[(("--grid", grid, *option), f"--grid {kind}", option[0])
      for grid, kind in (("2,2,1", "D,T,P"), ("2,1,2", "D,1,P"))
      for option in (("--precision", "float16"), ("--precision", "bfloat16"), ("--recompute", "2"), ("--accumulate", "2"),
                     ("--checkpoint-dir", "x"), ("--fault", "1:3:raise"), ("--slow", "1:0.1"))],
    (("--grid", "2,2,1", "--trace", "t.json"), "--grid D,T,P", "--trace"),
    *[((*ASYNCHRONOUS, *option), "--asynchronous", option[0])
      for option in (("--recompute", "2"), ("--accumulate", "2"), ("--precision", "float16"), ("--checkpoint-dir", "x"),
                     ("--fault", "1:3:raise"))],
    *[(("--compression", "topk", "--topk", "5", *option), "--compression float16/bfloat16/topk", option[0])
      for option in (("--recompute", "2"), ("--accumulate", "2"), ("--precision", "float16"))],
    *[(("--compression", "powersgd", "--rank", "2", *option), "--compression powersgd", option[0])
      for option in (("--recompute", "2"), ("--accumulate", "2"), ("--precision", "float16"), ("--checkpoint-dir", "x"))],
    ((*LOCAL, "--checkpoint-dir", "x"), "--local-steps", "--checkpoint-dir"),
    ((*LOCAL, "--precision", "float16"), "--local-steps", "--precision"),
    *[(("--strategy", strategy, "--precision", "float16"), f"--strategy {strategy}", "--precision")
      for strategy in ("overlap", "parameter_server", "reduce_broadcast")],
    *[((*arguments, "--zero-stage", "2"), kind, "--zero-stage") for kind, arguments in [  # (ZeRO's alone)
        *[(f"--strategy {strategy}", ("--strategy", strategy))
          for strategy in ("allreduce", "fsdp", "overlap", "parameter_server", "reduce_broadcast")],
        ("--compression float16/bfloat16/topk", ("--compression", "float16")),
        ("--compression powersgd", ("--compression", "powersgd", "--rank", "2")), ("--local-steps", LOCAL),
        ("--asynchronous", ASYNCHRONOUS), ("--grid D,T,P", ("--grid", "2,2,1")),
        ("--grid D,1,P", ("--grid", "2,1,2"))]],
    # two kinds of training at once: the first in the table's order names the second
    (("--strategy", "fsdp", *ASYNCHRONOUS), "--strategy fsdp", "--asynchronous"),
    (("--strategy", "zero", *ASYNCHRONOUS), "--strategy zero", "--asynchronous"),
    (("--strategy", "fsdp", "--grid", "2,1,2"), "--strategy fsdp", "--grid D,1,P"),
    (("--strategy", "overlap", "--grid", "2,2,1"), "--strategy overlap", "--grid D,T,P"),
    (("--compression", "float16", *LOCAL), "--compression float16/bfloat16/topk", "--local-steps"),
    (("--compression", "float16", "--grid", "2,2,1"), "--compression float16/bfloat16/topk", "--grid D,T,P"),
    ((*LOCAL, *ASYNCHRONOUS), "--local-steps", "--asynchronous"),
    ((*ASYNCHRONOUS, "--grid", "2,1,2"), "--asynchronous", "--grid D,1,P"),
]
ACCEPTED = [  # what combines, as the lessons run it
    ("--strategy", "fsdp", "--precision", "bfloat16", "--recompute", "2", "--accumulate", "3", "--checkpoint-dir", "x"),
    ("--strategy", "fsdp", "--recompute", "2", "--device", "gpu"),
    ("--strategy", "zero", "--precision", "float16", "--device", "cpu", "--fault", "1:3:raise", "--slow", "1:0.1"),
    ("--strategy", "zero", "--zero-stage", "2", "--recompute", "2", "--accumulate", "2", "--checkpoint-dir", "x"),
    ("--strategy", "overlap", "--recompute", "2", "--accumulate", "2", "--device", "gpu", "--trace", "t.json"),
    ("--grid", "2,1,2", "--schedule", "zb-h1", "--micro-batches", "3", "--trace", "t.json"),
    ("--grid", "2,2,1", "--sampler", "per_rank", "--device", "gpu"),
    ("--grid", "2,2,1", "--strategy", "zero", "--optimizer", "adam", "--learning-rate", "0.01"),
    ("--grid", "1,2,2", "--hidden", "9", "8", "7", "--strategy", "zero", "--zero-stage", "1", "--schedule", "gpipe",
     "--device", "gpu"),
    ("--grid", "4,1,1", "--strategy", "fsdp", "--recompute", "2"),
    ("--compression", "topk", "--topk", "5", "--checkpoint-dir", "x", "--slow", "1:0.1"),
    (*ASYNCHRONOUS, "--staleness", "1", "--slow", "1:0.1", "--trace", "t.json", "--device", "gpu"),
    (*LOCAL, "--outer-optimizer", "nesterov", "--recompute", "2", "--accumulate", "2"),
]


@pytest.mark.parametrize("arguments, kind, option", REFUSED)
def test_each_refused_combination_gets_the_one_message_that_lists_what_combines(arguments, kind, option):
    from nnlib.train_command import check_settings
    from nnlib.train_command.options import COMBINES

    with pytest.raises(ValueError) as refused:
        check_settings(parsed(*arguments), 4)
    takes = ", ".join(sorted(COMBINES[kind][1]))
    assert str(refused.value).startswith(f"{kind} does not combine with {option} in the batch job. What combines: one "
                                         f"kind of training at a time (--strategy allreduce or zero or fsdp or "
                                         f"overlap or parameter_server or reduce_broadcast; --compression "
                                         f"float16/bfloat16/topk or powersgd; --local-steps; --asynchronous; "
                                         f"--grid D,1,P or D,T,P), and {kind} takes "), refused.value
    assert str(refused.value).endswith(f"takes {takes}." if takes else "takes none of --recompute, --accumulate, "
                                       "--precision, --device, --checkpoint-dir, --fault, --slow, --trace."), refused.value


@pytest.mark.parametrize("arguments", ACCEPTED)
def test_what_the_table_combines_passes_the_checks(arguments):
    from nnlib.train_command import check_settings

    check_settings(parsed(*arguments), 4)


def test_every_pair_the_table_refuses_is_tested():
    """REFUSED holds each (kind, option) pair outside the table's row, and names every kind but the default with
    another kind at least once."""
    from nnlib.train_command.options import COMBINES, OPTIONS

    tested = {(kind, option) for _, kind, option in REFUSED}
    refused = {(kind, option) for kind, (_, takes) in COMBINES.items() for option in OPTIONS if option not in takes}
    assert refused - tested == set()
    with_another = {name for pair in tested if pair[1] in COMBINES for name in pair}
    assert set(COMBINES) - with_another == {"--strategy allreduce", "--strategy parameter_server",
                                             "--strategy reduce_broadcast", "--compression powersgd"}
