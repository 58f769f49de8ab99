"""Lesson 18 (notebooks/18_pipeline_schedules.ipynb): pipelines with smaller bubbles, and their timelines as traces.

    schedules    interleaved 1F1B (v chunks per rank), ZB-H1 and ZB-H2 (the backward split into B and W) as
                 instruction lists, lesson 12's executor and bubble extended to run and predict them
    pictures     the schedules side by side and a measured step, one row per stage
    demo         the notebook's measured case: every schedule timed on P ranks of its cluster, in rounds
"""

LESSON = 18
