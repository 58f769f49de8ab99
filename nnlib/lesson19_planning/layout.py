"""A layout of P ranks: how a run cuts its work (lesson 19's planner enumerates them, its memory model prices them)."""

from __future__ import annotations

from dataclasses import dataclass

LESSON = 19


@dataclass(frozen=True)
class Layout:
    """data x tensor x pipeline degrees (their product: the ranks); zero: ZeRO stage 0-2 on the data axis, 3 = FSDP;
    recompute: keep every k-th layer's input (None: all); micro_batches: the pipeline's m, else accumulation's k;
    schedule: the pipeline's, "gpipe" or "1f1b"."""

    data: int = 1
    tensor: int = 1
    pipeline: int = 1
    zero: int = 0
    recompute: int | None = None
    micro_batches: int = 1
    schedule: str = "1f1b"

    def check(self, ranks: int, layer_sizes) -> None:
        """Raise ValueError naming what is wrong with this layout of ``ranks`` ranks for the chain ``layer_sizes``."""
        problems = [
            (self.data * self.tensor * self.pipeline != ranks, f"data x tensor x pipeline = {self.data} x "
             f"{self.tensor} x {self.pipeline} = {self.data * self.tensor * self.pipeline}, not the {ranks} ranks"),
            (self.tensor > min(layer_sizes[1:-1], default=1), f"tensor degree {self.tensor} is wider than the "
             f"narrowest hidden layer ({min(layer_sizes[1:-1], default=1)} units): choose a smaller one"),
            (self.pipeline > len(layer_sizes) - 1, f"{self.pipeline} pipeline stages but only "
             f"{len(layer_sizes) - 1} layers: every stage needs one"),
            (self.micro_batches < 1, f"micro_batches must be at least 1; got {self.micro_batches}"),
            (self.zero not in (0, 1, 2, 3), f"zero must be a stage 0, 1, 2 or 3 (FSDP); got {self.zero!r}")]
        found = [problem for wrong, problem in problems if wrong]
        if found:
            raise ValueError("; ".join(found))
