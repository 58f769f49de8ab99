"""Lesson 07 (notebooks/07_scaling.ipynb): strong and weak scaling, measured against the model.

    scaling     data-parallel training over a grid of rank counts and problem sizes
    plots       speedup and efficiency against the rank count, beside Amdahl's or Gustafson's law
"""

LESSON = 7
