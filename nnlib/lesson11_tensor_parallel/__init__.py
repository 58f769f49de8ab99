"""Lesson 11 (notebooks/11_tensor_parallelism.ipynb): the hidden units of every layer split over the ranks.

    tensor     column- and row-split layers, TensorParallelMLP (Megatron's MLP)
    diagrams   the column/row split drawn, and which rank holds which block of every layer
"""

LESSON = 11
