"""Lesson 16 (notebooks/16_sharding_state.ipynb): training a network bigger than one rank can hold.

    fsdp             ZeRO stage 3 / FSDP: parameters, gradients and optimizer state sharded; a layer gathered to compute
    recompute        activation recomputation: keep every k-th layer's input, recompute the rest in backward
    accumulation     gradient accumulation: k micro-batches per step, nothing sent before the last
    mixed_precision  float16 storage, float32 compute and master weights, dynamic loss scaling
    budget           a rank's memory by kind: lesson 12's count of the arrays the math needs, with these savers
    demo             the notebook's multi-rank runs as one MPI script: FSDP's bytes sent, the memory measured
"""

LESSON = 16
