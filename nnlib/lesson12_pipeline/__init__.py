"""Lesson 12 (notebooks/12_pipeline_parallelism.ipynb): consecutive layers on consecutive ranks, and grids.

    pipeline, instructions, bubbles   the stages, their schedules as data, and the bubble (formula, simulation, measured)
    grid, memory, tradeoffs, diagrams a data x model grid (Comm.Split); what a rank holds and sends; pictures
"""

LESSON = 12
