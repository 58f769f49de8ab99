"""The course's own tools, not a lesson: what every notebook and batch job of the series stands on.

    cluster           start(n): an ipyparallel cluster whose engines are MPI ranks
    reaper            no process outlives the one that started the cluster
    quiet_controller  the controller's log without ipykernel 7's harmless iopub_welcome errors
    deadline          WatchedComm: every collective under a deadline, the error naming who did not come (lesson 13)
    classroom         the engines' comm: a student's own collectives never hang the class
    trace             any timeline of the series as a Chrome trace (Perfetto): a process per rank, a thread per kind
    environment       what this machine runs: BLAS and its kernel, MPI, the GPU (notebook 00's report)

Nothing here imports a lesson's module, and any lesson may import from here.
"""

LESSON = 0
