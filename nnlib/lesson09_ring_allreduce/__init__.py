"""Lesson 09 (notebooks/09_ring_allreduce.ipynb): Allreduce from point-to-point messages. allreduce: the ring,
recursive doubling and reduce-then-broadcast, from Sendrecv; counting: a communicator that counts the bytes each
collective makes this rank send; diagrams: the ring's schedule and measured times; the lab, allreduce_timing: every
algorithm timed against MPI's (the notebook's CSV)."""

LESSON = 9
