"""Lesson 17 (notebooks/17_shrinking_activations.ipynb): the activations, which sharding leaves whole, made smaller:
accumulation (k micro-batches a step), recompute (a checkpoint every k layers), mixed_precision (16-bit storage,
dynamic loss scaling), budget (a rank's memory by kind, predicted), demo (the notebook's multi-rank runs).
"""

LESSON = 17
