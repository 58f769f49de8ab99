"""Lesson 16 (notebooks/16_sharding_state.ipynb): parameters, gradients and optimizer state sharded over the ranks.

    fsdp  ZeRO stage 3 / FSDP: every rank holds 1/P of each layer; a layer is gathered to compute, then freed
    demo  the notebook's multi-rank runs: FSDP's bytes sent, Adam's bytes per parameter ZeRO stage by stage
"""

LESSON = 16
