"""A layout of P ranks: how a run cuts its work (lesson 19's planner enumerates them, its memory model prices them)."""

from __future__ import annotations

from dataclasses import dataclass

from nnlib.lesson19_planning.grid import grid_problem

LESSON = 19


@dataclass(frozen=True)
class Layout:
    """data x tensor x pipeline degrees (their product: the ranks); zero: ZeRO stage 0-2 on the data axis, 3 = FSDP;
    recompute: keep every k-th layer's input (None: all); micro_batches: the pipeline's m, else accumulation's k;
    schedule: the pipeline's, "gpipe" or "1f1b"; cut: its layers per stage (None: lesson 12's even cut)."""

    data: int = 1
    tensor: int = 1
    pipeline: int = 1
    zero: int = 0
    recompute: int | None = None
    micro_batches: int = 1
    schedule: str = "1f1b"
    cut: tuple | None = None

    def check(self, ranks: int, layer_sizes) -> None:
        """Raise ValueError naming all that is wrong with this layout of ``ranks`` ranks for the chain layer_sizes."""
        found = [grid_problem(ranks, (self.data, self.tensor, self.pipeline), layer_sizes, self.cut)] + [
            problem for wrong, problem in [
            (self.micro_batches < 1, f"micro_batches must be at least 1; got {self.micro_batches}"),
            (self.recompute is not None and self.recompute < 1, f"recompute must be None or at least 1; got "
                                                                f"{self.recompute}"),
            (self.zero not in (0, 1, 2, 3), f"zero must be a stage 0, 1, 2 or 3 (FSDP); got {self.zero!r}"),
            (self.schedule not in ("gpipe", "1f1b"), f"schedule must be 'gpipe' or '1f1b'; got {self.schedule!r}")]
            if wrong]
        if any(found):
            raise ValueError("; ".join(problem for problem in found if problem))
