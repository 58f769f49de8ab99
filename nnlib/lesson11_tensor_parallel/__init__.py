"""Lesson 11 (notebooks/11_tensor_parallelism.ipynb): the network itself split over the ranks.

    tensor        the hidden units of each layer split over the ranks (Megatron's MLP)
    pipeline      consecutive layers on consecutive ranks: one stage, and the executor of any schedule
    instructions  schedules as data: GPipe and 1F1B as instruction lists per stage (bubbles simulates them)
    bubbles       the pipeline's idle time, the one place it is computed: formula, simulation, measurement
    grid          a data x tensor or data x pipeline grid of ranks made with Comm.Split
    memory        what a rank holds at the peak of a step, by kind (lesson 17 extends it)
    tradeoffs     bytes, memory and time per rank of each kind of parallelism
    diagrams      the column and row split of tensor parallelism, drawn; the pipeline's time line and
                  bubbles, the fastest split
"""

LESSON = 11
