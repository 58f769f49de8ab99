"""Lesson 05 (notebooks/05_messages.ipynb): point-to-point messages, and what one costs.

    alpha_beta   the alpha-beta fit of one message, made once on this machine and read by the later lessons
"""

LESSON = 5
