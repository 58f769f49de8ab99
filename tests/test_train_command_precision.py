"""The batch job's --precision with lesson 12's other options: float16 and bfloat16 combine with --strategy fsdp,
--accumulate, --recompute and --checkpoint-dir (the loss scale is checkpointed: --resume continues exactly); and
--strategy fsdp with --checkpoint-dir (chunks gathered on save, split on resume, over any number of ranks). The
refusals of what does not combine (lesson 09's model parallelism among them) are in tests/test_train_command.py."""

import numpy as np
import pytest

from test_train_command import SMALL, interrupted_then_resumed, run_training


@pytest.mark.parametrize("strategy", ["allreduce", "zero", "fsdp"])
def test_a_float16_job_resumes_bit_identically_with_its_loss_scale(tmp_path, strategy):
    """A rank raises after step 35 (mid epoch 2); resuming from the checkpoint after step 30 gives exactly the
    uninterrupted run's parameters (FSDP: each rank's chunks gathered into the whole network on save, split again
    on resume). That the scaler's state comes back is tested where it surely changes, from a scale that overflows
    at first: tests/test_mixed_precision.py and tests/mpi/check_mixed_precision.py."""
    settings = (*SMALL, "--precision", "float16", "--strategy", strategy, "--accumulate", "2", "--recompute", "1")
    uninterrupted, _, whole, resumed = interrupted_then_resumed(tmp_path, 3, settings, "2:35:raise")
    assert f"memory: strategy {strategy}, recompute every 1, 2 micro-batch(es) per step, precision float16" \
        in uninterrupted.stdout
    assert np.array_equal(resumed, whole)
    checkpoints = ("--checkpoint-dir", str(tmp_path / "checkpoints"), "--checkpoint-every", "10")
    other = run_training(3, *SMALL, "--precision", "bfloat16", "--strategy", strategy, *checkpoints, "--resume")
    assert other.returncode != 0 and "precision: the checkpoint has 'float16', this run 'bfloat16'" in other.stderr


def learns_as_float32_does(tmp_path, precision: str, *options, ranks: int = 2) -> str:
    """The job with ``options`` in ``precision`` against the same job in float32 on 2,000 samples, 2 epochs: both
    learn (the loss falls), and the test accuracies are within 0.02 (the tolerance of 16-bit storage). Returns what
    the job in ``precision`` printed."""
    accuracy = {}
    for each in ("float32", precision):
        output = tmp_path / f"{each}.npz"
        run = run_training(ranks, "--samples", "2000", "--epochs", "2", "--batch-size", "50", "--hidden", "32",
                           *options, "--precision", each, "--output", str(output))
        assert run.returncode == 0, run.stderr
        with np.load(output) as saved:
            accuracy[each] = float(saved["test_accuracy"])
            assert saved["loss"][1] < saved["loss"][0]
    assert f"precision {precision}" in run.stdout
    assert accuracy["float32"] > 0.6 and abs(accuracy[precision] - accuracy["float32"]) <= 0.02, accuracy
    return run.stdout


def test_a_bfloat16_fsdp_job_learns_as_float32_does(tmp_path):
    learns_as_float32_does(tmp_path, "bfloat16", "--strategy", "fsdp", "--accumulate", "2")


def test_an_fsdp_job_checkpointed_on_3_ranks_resumes_on_2(tmp_path):
    """--strategy fsdp with --checkpoint-dir (float64): the checkpoint holds the whole network and momentum, gathered
    from 3 ranks' chunks; 2 ranks split them again and finish within 1e-10 of the uninterrupted run."""
    settings = (*SMALL, "--dtype", "float64", "--strategy", "fsdp")
    *_, expected, got = interrupted_then_resumed(tmp_path, 3, settings, "1:35:raise", resume_ranks=2)
    assert np.abs(got - expected).max() / np.abs(expected).max() <= 1e-10
