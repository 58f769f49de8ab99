"""The batch job's --precision with lessons 16-17's other options: float16 and bfloat16 combine with --strategy fsdp,
--accumulate, --recompute and --checkpoint-dir (the loss scale is checkpointed: --resume continues exactly, and the
checkpoint records its precision); and --strategy fsdp with --checkpoint-dir (chunks gathered on save, split on
resume, over any number of ranks). The uninterrupted jobs, and the jobs compared with float32, run several to a
launch, once per test session (tests/shared_runs.py). The refusals of what does not combine (lessons 11 and 12's model
parallelism among them) are in tests/test_train_command.py."""

import re

import numpy as np
import pytest
from shared_runs import Job, jobs_run_once
from test_train_command import SMALL, interrupted_then_resumed, relative_difference, run_here

STRATEGIES = ("allreduce", "zero", "fsdp")
FSDP_FLOAT64 = (*SMALL, "--dtype", "float64", "--strategy", "fsdp")


def float16_settings(strategy: str) -> tuple:
    return (*SMALL, "--precision", "float16", "--strategy", strategy, "--accumulate", "2", "--recompute", "1")


def whole_runs() -> dict:
    """The uninterrupted jobs on 3 ranks (float16 with each strategy; FSDP in float64), once per session."""
    jobs = {**{strategy: Job(float16_settings(strategy)) for strategy in STRATEGIES}, "fsdp float64": Job(FSDP_FLOAT64)}
    return jobs_run_once("test_train_command_precision-3-ranks", 3, jobs)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_float16_job_resumes_bit_identically_with_its_loss_scale(tmp_path, strategy, capsys, monkeypatch):
    """A rank raises after step 35 (mid epoch 2); resuming from the checkpoint after step 30 gives exactly the
    uninterrupted run's parameters (FSDP: each rank's chunks gathered into the whole network on save, split again
    on resume). That the scaler's state comes back is tested where it surely changes, from a scale that overflows
    at first: tests/test_mixed_precision.py and tests/mpi/check_mixed_precision.py. The checkpoint records its
    precision: a bfloat16 job refuses it (rank 0's check of the checkpoint, here through the job's entry point)."""
    settings = float16_settings(strategy)
    uninterrupted, _, whole, resumed = interrupted_then_resumed(tmp_path, 3, settings, "2:35:raise",
                                                                whole_runs()[strategy])
    assert f"memory: strategy {strategy}, recompute every 1, 2 micro-batch(es) per step, precision float16" \
        in uninterrupted.stdout
    assert np.array_equal(resumed, whole)
    checkpoints = ("--checkpoint-dir", str(tmp_path / "checkpoints"), "--checkpoint-every", "10")
    capsys.readouterr()
    assert run_here(monkeypatch, *SMALL, "--precision", "bfloat16", "--strategy", strategy, *checkpoints,
                    "--resume") == 2
    assert "precision: the checkpoint has 'float16', this run 'bfloat16'" in capsys.readouterr().err


def learns_as_float32_does(tmp_path, precision: str, *options, ranks: int = 2) -> str:
    """The job with ``options`` in ``precision`` against the same job in float32 on 2,000 samples, 2 epochs: both
    learn (the loss falls), and the test accuracies are within 0.02 (the tolerance of 16-bit storage). Returns what
    the job in ``precision`` printed. The two jobs run in one launch, once per session (``tmp_path``: unused)."""
    settings = ("--samples", "2000", "--epochs", "2", "--batch-size", "50", "--hidden", "32", *options)
    group = re.sub(r"[^\w.-]+", "_", "-".join(("learns-as-float32", precision, *options, f"{ranks}-ranks")))
    runs = jobs_run_once(group, ranks, {each: Job((*settings, "--precision", each)) for each in ("float32", precision)})
    accuracy = {}
    for each, run in runs.items():
        assert run.returncode == 0, run.stderr
        saved = run.saved()
        accuracy[each] = float(saved["test_accuracy"])
        assert saved["loss"][1] < saved["loss"][0]
    assert f"precision {precision}" in runs[precision].stdout
    assert accuracy["float32"] > 0.6 and abs(accuracy[precision] - accuracy["float32"]) <= 0.02, accuracy
    return runs[precision].stdout


def test_a_bfloat16_fsdp_job_learns_as_float32_does(tmp_path):
    learns_as_float32_does(tmp_path, "bfloat16", "--strategy", "fsdp", "--accumulate", "2")


def test_an_fsdp_job_checkpointed_on_3_ranks_resumes_on_2(tmp_path):
    """--strategy fsdp with --checkpoint-dir (float64): the checkpoint holds the whole network and momentum, gathered
    from 3 ranks' chunks; 2 ranks split them again and finish within 1e-10 of the uninterrupted run."""
    *_, expected, got = interrupted_then_resumed(tmp_path, 3, FSDP_FLOAT64, "1:35:raise", whole_runs()["fsdp float64"],
                                                 resume_ranks=2)
    assert relative_difference(got, expected) <= 1e-10
