"""Lesson 03 (notebooks/03_training.ipynb): gradient descent, SGD with momentum, and Adam.

    optimizers  SGD (momentum optional) and Adam/AdamW: each rule written once, on a flat vector or a slice of it
    training    Settings, Batches and train_loop: the one training loop that every later lesson reuses
"""

LESSON = 3
