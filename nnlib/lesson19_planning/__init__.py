"""Lesson 19 (notebooks/19_planning_a_run.ipynb): plan a run, predict its memory and time, run it, compare.

    roofline     the compute and memory roofs of one core, and a training step's kernels placed under them
    layout       Layout: data x tensor x pipeline degrees, ZeRO stage, recomputation, micro-batches, schedule, cut
    grid         the 3-D grid: GridPipelineMLP, pipeline stages of tensor-parallel layers, and train_grid
    memory       what a rank of a layout holds at its peak (the lessons' counts and what they leave out), measured
    planner      every layout of P ranks, its memory per rank and step time from the lessons' models, ranked,
                 with each refusal's reason; ``python -m nnlib plan``
    runs         the compute fit, the link and the real steps the notebook sets beside the predictions
"""

LESSON = 19
