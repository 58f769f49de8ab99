"""Lesson 05 (notebooks/05_messages.ipynb): point-to-point messages, and what one costs (alpha_beta: the one
alpha-beta fit of the series, made on this machine and read by the later lessons)."""

LESSON = 5
