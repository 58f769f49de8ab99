"""Lesson 13 (notebooks/13_when_things_go_wrong.ipynb): deadlines, clear errors and checkpoints.

    watchdog    lesson 04's deadline around whole training runs: train_watched, RunNotes
    checkpoint  everything a run needs to continue exactly where it stopped
"""

LESSON = 13
