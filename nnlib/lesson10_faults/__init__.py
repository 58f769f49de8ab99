"""Lesson 10 (notebooks/10_when_things_go_wrong.ipynb): deadlines, clear errors and checkpoints.

    watchdog    a deadline for every collective; the error names who did not come
    checkpoint  everything a run needs to continue exactly where it stopped
"""

LESSON = 10
