"""Lesson 19 (notebooks/19_planning_a_run.ipynb): plan a run, predict its memory and time, run it, compare.

    planner      every layout of P ranks (data x tensor x pipeline, ZeRO, recomputation, micro-batches, schedule),
                 its memory per rank and its step time from the lessons' models, ranked, with each refusal's reason
"""

LESSON = 19
