"""Lesson 15 (notebooks/15_sending_less.ipynb): fewer bytes per step. compression: float16, bfloat16 and top-k
gradients; powersgd: low-rank gradients; local_sgd: local SGD and DiLoCo, H steps alone, then one Allreduce.
"""

LESSON = 15
