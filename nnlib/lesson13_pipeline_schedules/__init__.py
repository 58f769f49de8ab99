"""Lesson 13 (notebooks/13_pipeline_schedules.ipynb): pipelines with smaller bubbles.

    schedules  interleaved 1F1B (v virtual stages per rank), ZB-H1 and ZB-H2 (the backward split into
               B and W) as instruction lists for lesson 09's executor; their bubbles and memory
"""

LESSON = 13
