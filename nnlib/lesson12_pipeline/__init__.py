"""Lesson 12 (notebooks/12_pipeline_parallelism.ipynb): consecutive layers on consecutive ranks, and grids:
pipeline (the stages), instructions (schedules as data), bubbles (formula, simulation, measured), grid (Comm.Split),
memory and tradeoffs (what a rank holds and sends, by kind), diagrams."""

LESSON = 12
