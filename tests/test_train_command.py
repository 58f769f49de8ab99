"""`mpiexec -n N python -m nnlib train`: the batch job, its output file and its errors; atomic writes."""

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
from stand_in_cupy import write_cupy_shim

from nnlib.course.environment import mpiexec_path
from nnlib.lesson01_mnist.files import atomic_write
from nnlib.lesson07_gpu import backend

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "cluster"


def run_training(ranks, *arguments, timeout=180, pythonpath=None):
    environment = dict(os.environ, PYTHONPATH=pythonpath) if pythonpath else None
    return subprocess.run([mpiexec_path(), "-n", str(ranks), sys.executable, "-m", "nnlib", "train", *arguments],
                          capture_output=True, text=True, timeout=timeout, env=environment)


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


@pytest.mark.parametrize("arguments, message", [
    (["--batch-size", "1"], "the global batch (1) is smaller than the number of ranks (2)"),
    (["--samples", "0"], "--samples must be between 1 and 60000"),
    (["--output", "/nonexistent/folder/run.npz"], "its folder does not exist"),
])
def test_bad_batch_job_settings_fail_clearly_on_every_rank(arguments, message):
    run = run_training(2, "--epochs", "1", "--samples", "500", *arguments)
    assert run.returncode == 2
    assert run.stderr.count(message) == 1, run.stderr  # said once (by rank 0), no hang, no traceback
    assert "Traceback" not in run.stderr


def test_batch_job_on_gpus_gives_each_rank_of_a_node_its_own_gpu(tmp_path):
    """With the stand-in CuPy (tests/stand_in_cupy.py) posing as 2 GPUs: 3 ranks on one node use
    GPUs 0, 1, 0, stage gradients through host memory, and learn as on the CPU."""
    pythonpath = write_cupy_shim(tmp_path, gpus=2)
    settings = ("--samples", "1500", "--epochs", "2", "--batch-size", "60", "--hidden", "16")
    run = run_training(3, "--device", "gpu", *settings, pythonpath=pythonpath)
    assert run.returncode == 0, run.stderr
    assert ("on the GPU (GPU Stand-in GPU (NumPy) passed a smoke test); GPU of each rank: [0, 1, 0]; "
            "gradients staged through host memory") in run.stdout
    on_cpu = run_training(3, "--device", "cpu", *settings)
    assert "on the GPU" not in on_cpu.stdout

    def results(stdout):
        return [line.split(", ")[:2] for line in stdout.splitlines() if line.startswith("epoch ")] + \
            [stdout.split("test accuracy ")[1].split(";")[0]]

    assert results(run.stdout) == results(on_cpu.stdout)


def run_on_cpu_and_stand_in_gpu(tmp_path, ranks, *arguments):
    """The job on the CPU and on the counting stand-in GPU (tests/stand_in_cupy.py: its arrays refuse silent trips to
    the host), float64 unless told: (the GPU run's stdout, the largest |difference| of the final weights / the largest
    |weight|)."""
    runs = {device: run_training(ranks, "--dtype", "float64", *arguments, "--device", device, "--output",
                                 str(tmp_path / f"{device}.npz"),
                                 pythonpath=write_cupy_shim(tmp_path, counting=True) if device == "gpu" else None)
            for device in ("cpu", "gpu")}
    assert [run.returncode for run in runs.values()] == [0, 0], runs["cpu"].stderr + runs["gpu"].stderr
    with np.load(tmp_path / "cpu.npz") as cpu, np.load(tmp_path / "gpu.npz") as gpu:
        return runs["gpu"].stdout, float(np.abs(gpu["params"] - cpu["params"]).max() / np.abs(cpu["params"]).max())


@pytest.mark.parametrize("mode", [("--model-parallel", "tensor"), ("--asynchronous",), ("--strategy", "fsdp"),
                                  ("--strategy", "fsdp", "--recompute", "2", "--accumulate", "2"),
                                  *[("--strategy", strategy, "--precision", "float16", "--dtype", "float32")
                                    for strategy in ("allreduce", "zero", "fsdp")],
                                  *[("--model-parallel", "pipeline", "--schedule", schedule) for schedule in
                                    ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2")]], ids=" ".join)
def test_fsdp_model_parallel_asynchronous_and_mixed_precision_jobs_on_the_stand_in_gpu_equal_the_cpu_run(tmp_path, mode):
    """Every array of the network on the device, its messages staged through host memory (lesson 07's HostStaging;
    the parameter server's through host copies); 2 ranks: the asynchronous job's one worker makes its order fixed.
    Mixed precision keeps float32 master weights: compared in float32 (the stand-in computes as NumPy does)."""
    stdout, difference = run_on_cpu_and_stand_in_gpu(tmp_path, 2, *mode, "--samples", "600", "--epochs", "2",
                                                     "--batch-size", "50", "--hidden", "16", "16", "16")
    assert "GPU of each rank: [0, 0]" in stdout and difference <= 1e-12, (stdout, difference)


@pytest.mark.skipif(backend.gpu_status()[0], reason="checks the message given on machines without a GPU")
def test_batch_job_asked_for_a_gpu_without_one_fails_clearly():
    run = run_training(2, "--device", "gpu", "--samples", "500", "--epochs", "1")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "device='gpu' was asked for, but" in run.stderr and run.stderr.count("error:") == 1, run.stderr


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

SMALL = ("--samples", "1001", "--epochs", "2", "--batch-size", "50", "--hidden", "16")  # 21 steps per epoch


def final_params(path):
    with np.load(path) as saved:
        return saved["params"]


def interrupted_then_resumed(tmp_path, ranks, settings, fault, resume_ranks=None):
    """The job run whole on ``ranks`` ranks; again with a checkpoint every 10 steps until ``fault`` (RANK:35:HOW)
    ends it in epoch 2; then resumed on ``resume_ranks`` (default the same). Checks each run's exit and the
    resume's report; returns (the uninterrupted run, the failed run, whole params, resumed params)."""
    uninterrupted = run_training(ranks, *settings, "--output", str(tmp_path / "whole.npz"))
    assert uninterrupted.returncode == 0, uninterrupted.stderr
    checkpoints = ("--checkpoint-dir", str(tmp_path / "checkpoints"), "--checkpoint-every", "10")
    failed = run_training(ranks, *settings, *checkpoints, "--fault", fault)
    assert failed.returncode != 0 and "epoch 2/2" not in failed.stdout  # it really ended in epoch 2
    resumed = run_training(resume_ranks or ranks, *settings, *checkpoints, "--resume",
                           "--output", str(tmp_path / "resumed.npz"))
    assert resumed.returncode == 0, resumed.stderr
    assert f"30 steps done (epoch 2, step 9), written by {ranks} ranks" in resumed.stdout
    return uninterrupted, failed, final_params(tmp_path / "whole.npz"), final_params(tmp_path / "resumed.npz")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_killed_rank_then_resume_gives_bit_identical_parameters(tmp_path, dtype):
    """SIGKILL on rank 1 in the middle of epoch 2; resuming with the same number of ranks gives exactly
    the uninterrupted run's parameters; with 3 ranks instead of 2, the same within 1e-10 (float64)."""
    settings = (*SMALL, "--dtype", dtype)
    uninterrupted = run_training(2, *settings, "--output", str(tmp_path / "whole.npz"))
    assert uninterrupted.returncode == 0, uninterrupted.stderr
    checkpoints = ("--checkpoint-dir", str(tmp_path / "checkpoints"), "--checkpoint-every", "10")
    killed = run_training(2, *settings, *checkpoints, "--fault", "1:35:kill")
    assert killed.returncode != 0 and "injecting the fault 'kill' after step 35" in killed.stderr
    assert "epoch 2/2" not in killed.stdout  # it really died in epoch 2
    resumed = run_training(2, *settings, *checkpoints, "--resume", "--output", str(tmp_path / "resumed.npz"))
    assert resumed.returncode == 0, resumed.stderr
    assert "30 steps done (epoch 2, step 9), written by 2 ranks" in resumed.stdout
    assert np.array_equal(final_params(tmp_path / "resumed.npz"), final_params(tmp_path / "whole.npz"))
    if dtype == "float64":
        more_ranks = run_training(3, *settings, *checkpoints, "--resume", "--output", str(tmp_path / "three.npz"))
        assert more_ranks.returncode == 0, more_ranks.stderr
        expected, got = final_params(tmp_path / "whole.npz"), final_params(tmp_path / "three.npz")
        assert np.abs(got - expected).max() / np.abs(expected).max() <= 1e-10


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


@pytest.mark.parametrize("arguments, message", [
    (["--timeout", "0"], "timeout must be a number of seconds above 0"),
    (["--timeout", "-5"], "timeout must be a number of seconds above 0"),
    (["--timeout", "1e9"], "timeout must be a number of seconds above 0"),
    (["--timeout", "nan"], "timeout must be a number of seconds above 0"),
    (["--fault", "1:kill"], "--fault must be RANK:STEP:KIND"),
    (["--resume"], "--resume needs --checkpoint-dir"),
    (["--checkpoint-every", "-1"], "--checkpoint-every must be 0"),
])
def test_bad_fault_settings_fail_clearly_on_every_rank(arguments, message):
    run = run_training(2, *SMALL, *arguments)
    assert run.returncode == 2
    assert run.stderr.count(message) == 1, run.stderr
    assert "Traceback" not in run.stderr


def test_resume_problems_fail_clearly_on_every_rank(tmp_path):
    folder = tmp_path / "checkpoints"
    empty = run_training(2, *SMALL, "--checkpoint-dir", str(folder), "--resume")
    assert empty.returncode == 2 and empty.stderr.count("the checkpoint folder") == 1, empty.stderr
    assert run_training(2, *SMALL, "--checkpoint-dir", str(folder)).returncode == 0
    other = run_training(2, *SMALL, "--hidden", "20", "--checkpoint-dir", str(folder), "--resume")
    assert other.returncode == 2
    assert other.stderr.count("layer_sizes: the checkpoint has [784, 16, 10], this run [784, 20, 10]") == 1
    newest = sorted(folder.iterdir())[-1]
    newest.write_bytes(newest.read_bytes()[:-100])
    damaged = run_training(2, *SMALL, "--checkpoint-dir", str(folder), "--resume")
    assert damaged.returncode == 2 and damaged.stderr.count("is truncated") == 1, damaged.stderr
    assert "Traceback" not in other.stderr + damaged.stderr


def test_the_batch_jobs_zero_and_overlap_strategies_equal_allreduce_and_per_rank_sampling_learns(tmp_path):
    settings = ("--samples", "1001", "--epochs", "2", "--batch-size", "64", "--hidden", "16", "8",
                "--dtype", "float64")
    results = {}
    for name, extra in [("allreduce", ()), ("zero", ("--strategy", "zero")), ("overlap", ("--strategy", "overlap")),
                        ("per_rank", ("--sampler", "per_rank"))]:
        run = run_training(3, *settings, *extra, "--output", str(tmp_path / f"{name}.npz"))
        assert run.returncode == 0, run.stderr
        with np.load(tmp_path / f"{name}.npz") as saved:
            results[name] = (saved["params"], saved["loss"])
    reference, _ = results["allreduce"]
    for name in ("zero", "overlap"):
        assert np.abs(results[name][0] - reference).max() / np.abs(reference).max() <= 1e-10, name
    params, loss = results["per_rank"]
    assert np.abs(params - reference).max() > 1e-6 and loss[1] < loss[0]  # other batches, and it learns


def test_zero_with_per_rank_sampling_resumes_bit_identically(tmp_path):
    """ZeRO keeps the momentum in slices: the checkpoint gathers it whole, the resume hands each rank its
    slice again; the per-rank sampler's batches depend only on (seed, rank, epoch)."""
    settings = (*SMALL, "--dtype", "float64", "--strategy", "zero", "--sampler", "per_rank")
    *_, whole, resumed = interrupted_then_resumed(tmp_path, 3, settings, "2:35:raise")
    assert np.array_equal(resumed, whole)


@pytest.mark.parametrize("ranks, options", [
    (2, ("--model-parallel", "tensor")),
    (2, ("--model-parallel", "pipeline", "--micro-batches", "3", "--schedule", "gpipe")),
    (4, ("--model-parallel", "tensor", "--model-size", "2")),
])
def test_the_batch_job_splits_the_model_and_equals_the_one_rank_run(tmp_path, ranks, options):
    settings = ("--samples", "1001", "--epochs", "2", "--batch-size", "64", "--hidden", "16", "8", "--dtype", "float64")
    alone = run_training(1, *settings, "--output", str(tmp_path / "alone.npz"))
    assert alone.returncode == 0, alone.stderr
    split = run_training(ranks, *settings, *options, "--output", str(tmp_path / "split.npz"))
    assert split.returncode == 0, split.stderr
    assert "parallelism inside" in split.stdout and "test accuracy" in split.stdout
    assert split.stdout.count("epoch 2/2:") == 1, split.stdout  # one progress line per epoch, not one per piece
    expected, got = final_params(tmp_path / "alone.npz"), final_params(tmp_path / "split.npz")
    assert np.abs(got - expected).max() / np.abs(expected).max() <= 1e-10


@pytest.mark.parametrize("options, message", [
    (("--model-parallel", "tensor", "--model-size", "3"), "model_size must divide the number of ranks (2)"),
    (("--model-parallel", "tensor", "--model-size", "-1"), "--model-size must be 0 (all ranks) or a positive number"),
    (("--model-parallel", "pipeline", "--checkpoint-dir", "somewhere"),
     "--model-parallel pipeline does not combine with --checkpoint-dir in the batch job. What combines:"),
    (("--model-parallel", "tensor", "--strategy", "zero"), "--strategy zero does not combine with --model-parallel tensor"),
    (("--model-parallel", "pipeline", "--hidden", "16", "--micro-batches", "0"), "micro_batches must be"),
])
def test_bad_model_parallel_settings_fail_clearly_on_every_rank(options, message):
    run = run_training(2, "--epochs", "1", "--samples", "500", *options)
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stderr.count(message) == 1, run.stderr
    assert "Traceback" not in run.stderr


def test_a_rank_whose_mpi_abort_never_returns_ends_itself():
    """If the process manager is gone, MPI_Abort can wait for ever: the rank's alarm ends it anyway."""
    program = textwrap.dedent("""
        import sys, time, types
        from nnlib.train_command import job  # (with the real mpi4py)
        from nnlib.lesson10_faults import watchdog
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


@pytest.mark.parametrize("ranks, arguments, message", [
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
])
def test_lesson_11_settings_are_refused_on_every_rank_at_once(ranks, arguments, message):
    run = run_training(ranks, *SMALL, *arguments, timeout=60)
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stderr.count(message) == 1, run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_asynchronous_job_with_bound_0_equals_synchronous_per_rank_training_on_the_workers(tmp_path, ranks):
    """The batch job's --asynchronous --staleness 0 on N ranks against the synchronous job (per-rank
    sampler, no momentum) on the N - 1 workers: the same parameters to 1e-10 (float64)."""
    settings = ("--samples", "1001", "--epochs", "2", "--batch-size", "50", "--hidden", "16", "--dtype", "float64",
                "--momentum", "0", "--learning-rate", "0.5")
    server = run_training(ranks, *settings, "--asynchronous", "--staleness", "0", "--output", str(tmp_path / "a.npz"))
    assert server.returncode == 0, server.stderr
    assert "staleness: mean" in server.stdout and "updates per worker" in server.stdout
    synchronous = run_training(ranks - 1, *settings, "--sampler", "per_rank", "--output", str(tmp_path / "s.npz"))
    assert synchronous.returncode == 0, synchronous.stderr
    expected, got = final_params(tmp_path / "s.npz"), final_params(tmp_path / "a.npz")
    assert np.abs(got - expected).max() / np.abs(expected).max() <= 1e-10
    with np.load(tmp_path / "a.npz") as saved:
        assert saved["staleness"].max() <= ranks - 2 and len(saved["worker"]) == 2 * 21 * (ranks - 1)
        assert int(saved["largest_lead"]) == 0  # s = 0: no worker was let ahead of the slowest (lesson 11 prints it)


def test_compressed_job_reports_its_bytes_and_top_k_of_everything_equals_the_plain_job(tmp_path):
    settings = ("--samples", "1001", "--epochs", "2", "--batch-size", "64", "--hidden", "16", "--dtype", "float64")
    plain = run_training(3, *settings, "--output", str(tmp_path / "plain.npz"))
    everything = run_training(3, *settings, "--compression", "topk", "--topk", "12730",
                              "--output", str(tmp_path / "all.npz"))
    half = run_training(3, *settings, "--compression", "bfloat16", "--slow", "1:0.001")
    assert plain.returncode == everything.returncode == half.returncode == 0, plain.stderr + everything.stderr
    assert "gradients compressed: topk (k = 12730), 152,760 bytes per rank per step instead of 101,840" \
        in everything.stdout
    assert "gradients compressed: bfloat16, 25,460 bytes per rank per step instead of 101,840" in half.stdout
    expected, got = final_params(tmp_path / "plain.npz"), final_params(tmp_path / "all.npz")
    assert np.abs(got - expected).max() / np.abs(expected).max() <= 1e-10


@pytest.mark.parametrize("script", sorted(path.name for path in EXAMPLES.glob("*.sbatch")))
def test_the_slurm_examples_give_settings_the_batch_job_accepts(script):
    """Each example's `python -m nnlib train ...` parses, passes the job's own checks for its number of ranks,
    and a model-parallel grid divides those ranks into whole replicas."""
    from nnlib.__main__ import build_parser
    from nnlib.lesson09_model_parallel.tradeoffs import check_pipeline_depth
    from nnlib.train_command import check_settings

    text = (EXAMPLES / script).read_text()
    settings = dict(re.findall(r"^#SBATCH --([a-z-]+)=(\S+)", text, flags=re.M))
    ranks = int(settings["nodes"]) * int(settings["ntasks-per-node"])
    command = re.search(r"^srun .*? -m nnlib (train .*?)(?<!\\)$", text, flags=re.M | re.S).group(1)
    command = command.replace("\\\n", " ").replace("$SLURM_JOB_ID", "1")
    args = build_parser().parse_args(shlex.split(command))
    check_settings(args, ranks)  # what the job checks on every rank before it starts
    if args.model_parallel != "none":
        assert ranks % args.model_size == 0, f"{script}: {ranks} ranks do not split into replicas of {args.model_size}"
        check_pipeline_depth(args.model_parallel, (784, *args.hidden, 10), args.model_size)


# -- lesson 13: the pipeline schedules and --trace in the batch job ------------------------------------

@pytest.mark.parametrize("options", [("--schedule", "interleaved", "--virtual-stages", "2"), ("--schedule", "zb-h2")])
def test_the_batch_job_runs_lesson_13s_schedules_equal_to_the_one_rank_run(tmp_path, options):
    settings = ("--samples", "1001", "--epochs", "2", "--batch-size", "64", "--hidden", "16", "12", "8",
                "--dtype", "float64")
    alone = run_training(1, *settings, "--output", str(tmp_path / "alone.npz"))
    trace = tmp_path / "stages.json"
    split = run_training(2, *settings, "--model-parallel", "pipeline", "--micro-batches", "3", *options,
                         "--trace", str(trace), "--output", str(tmp_path / "split.npz"))
    assert alone.returncode == 0 and split.returncode == 0, alone.stderr + split.stderr
    expected, got = final_params(tmp_path / "alone.npz"), final_params(tmp_path / "split.npz")
    assert np.abs(got - expected).max() / np.abs(expected).max() <= 1e-10
    spans = [event for event in json.loads(trace.read_text())["traceEvents"] if event["ph"] == "X"]
    per_stage = 3 * 2 * 2 if "interleaved" in options else 3 * 3  # the last step's 3 micro-batches: F, B per chunk; F, B, W
    assert sorted(event["pid"] for event in spans) == [0] * per_stage + [1] * per_stage


@pytest.mark.parametrize("options, message", [
    (("--schedule", "zb-h1"), "needs --model-parallel pipeline"),
    (("--model-parallel", "pipeline", "--virtual-stages", "2"), "--virtual-stages goes with --schedule interleaved"),
    (("--model-parallel", "pipeline", "--schedule", "interleaved", "--hidden", "16"), "every stage needs at least one"),
    (("--model-parallel", "tensor", "--trace", "t.json"), "--model-parallel tensor does not combine with --trace"),
])
def test_bad_schedule_settings_fail_clearly_on_every_rank(options, message):
    run = run_training(2, "--epochs", "1", "--samples", "500", *options)
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stderr.count(message) == 1, run.stderr


# -- what combines with what: one table (nnlib.train_command.options.COMBINES), one message --------------------------

def parsed(*arguments):
    import argparse

    from nnlib.train_command import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--epochs", "1", *arguments])


ASYNCHRONOUS, LOCAL = ("--asynchronous",), ("--local-steps", "2", "--sampler", "per_rank")
REFUSED = [  # (arguments, the kind of training, the option it does not take): each says so in the one message
    *[(("--model-parallel", kind, *option), f"--model-parallel {kind}", option[0])
      for kind in ("tensor", "pipeline")
      for option in (("--precision", "float16"), ("--precision", "bfloat16"), ("--recompute", "2"), ("--accumulate", "2"),
                     ("--checkpoint-dir", "x"), ("--fault", "1:3:raise"), ("--slow", "1:0.1"))],
    (("--model-parallel", "tensor", "--trace", "t.json"), "--model-parallel tensor", "--trace"),
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
    # two kinds of training at once: the first in the table's order names the second
    (("--strategy", "fsdp", *ASYNCHRONOUS), "--strategy fsdp", "--asynchronous"),
    (("--strategy", "zero", "--model-parallel", "pipeline"), "--strategy zero", "--model-parallel pipeline"),
    (("--compression", "float16", *LOCAL), "--compression float16/bfloat16/topk", "--local-steps"),
    (("--compression", "float16", "--model-parallel", "tensor"), "--compression float16/bfloat16/topk",
     "--model-parallel tensor"),
    ((*LOCAL, *ASYNCHRONOUS), "--local-steps", "--asynchronous"),
    ((*ASYNCHRONOUS, "--model-parallel", "pipeline"), "--asynchronous", "--model-parallel pipeline"),
]
ACCEPTED = [  # what combines, as the lessons run it
    ("--strategy", "fsdp", "--precision", "bfloat16", "--recompute", "2", "--accumulate", "3", "--checkpoint-dir", "x"),
    ("--strategy", "fsdp", "--recompute", "2", "--device", "gpu"),
    ("--strategy", "zero", "--precision", "float16", "--device", "cpu", "--fault", "1:3:raise", "--slow", "1:0.1"),
    ("--strategy", "overlap", "--recompute", "2", "--accumulate", "2", "--device", "gpu", "--trace", "t.json"),
    ("--model-parallel", "pipeline", "--schedule", "zb-h1", "--micro-batches", "3", "--trace", "t.json"),
    ("--model-parallel", "tensor", "--model-size", "2", "--sampler", "per_rank", "--device", "gpu"),
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
                                         f"--model-parallel tensor or pipeline), and {kind} takes "), refused.value
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
    assert set(COMBINES) - with_another == {"--strategy allreduce", "--strategy overlap", "--strategy parameter_server",
                                             "--strategy reduce_broadcast", "--compression powersgd"}
