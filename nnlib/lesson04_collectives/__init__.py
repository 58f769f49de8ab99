"""Lesson 04 (notebooks/04_mpi_collectives.ipynb): MPI ranks in a notebook, and what their collectives cost.

    cluster           start(n): an ipyparallel cluster whose engines are MPI ranks
    reaper            no process outlives the one that started the cluster
    collectives       collectives on NumPy arrays, uneven splits, one verdict on every rank
    collectives_demo  the lesson's collectives as a plain mpiexec script
    timing            warm-up, then the median of timed calls
    trace             any timeline of the series as a Chrome trace (Perfetto): a process per rank, a thread per kind
    costmodel         every prediction of the series: alpha-beta, the ring, FLOPs, step time, the bubble
    deadline          WatchedComm: every collective under a deadline; the error names who did not come
    quiet_controller  the controller's log without ipykernel 7's harmless iopub_welcome errors
    classroom         the engines' comm: a student's own collectives never hang the class
    plots             what every rank holds before and after a collective, drawn
"""

LESSON = 4
