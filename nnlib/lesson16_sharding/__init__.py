"""Lesson 16 (notebooks/16_sharding_state.ipynb): parameters, gradients and optimizer state sharded over the ranks:
fsdp (ZeRO stage 3 / FSDP: a layer gathered to compute, then freed), demo (the notebook's multi-rank runs).
"""

LESSON = 16
