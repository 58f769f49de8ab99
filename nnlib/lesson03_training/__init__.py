"""Lesson 03 (notebooks/03_training.ipynb): gradient descent and SGD with momentum.

    training  Settings, Batches and train_loop: the one training loop that every later lesson reuses
"""

LESSON = 3
