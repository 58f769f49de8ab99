"""Lesson 14 (notebooks/14_asynchronous_sgd.ipynb): asynchronous SGD, a parameter server without lock-step."""

LESSON = 14
