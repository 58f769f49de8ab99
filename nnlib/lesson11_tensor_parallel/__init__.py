"""Lesson 11 (notebooks/11_tensor_parallelism.ipynb): the hidden units of every layer split over the ranks.
tensor: column- and row-split layers, TensorParallelMLP (Megatron's MLP); diagrams: the split and who holds what."""

LESSON = 11
