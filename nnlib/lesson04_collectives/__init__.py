"""Lesson 04 (notebooks/04_mpi_collectives.ipynb): MPI ranks in a notebook and their collectives.

    collectives       collectives on NumPy arrays, uneven splits, one verdict on every rank
    collectives_demo  the lesson's collectives as a plain mpiexec script
    timing            warm-up, then the median of timed calls
    costmodel         every prediction of the series: alpha-beta (lesson 05), the ring, FLOPs, step time
    plots             what every rank holds before and after a collective, drawn

The cluster the notebook starts, and the deadline every student's collective runs under, are the course's
own tools (nnlib.course).
"""

LESSON = 4
