"""Lesson 09 (notebooks/09_ring_allreduce.ipynb): Allreduce from messages, and what data parallelism does with it.

    allreduce  the ring, recursive doubling and reduce-then-broadcast, from Sendrecv
    counting   a communicator that counts the bytes each collective makes this rank send
    zero       ZeRO stages 1 and 2: each rank updates one slice of the parameters (stage 2: holds one of the gradient)
    overlap    gradients sent by layer buckets while backpropagation goes on (PyTorch DDP)
    sampling   which samples each rank computes: the sequential batch, or its own
    waiting    a step's communication time split into waiting and transfer
    diagrams   the ring's schedule, one ZeRO step and overlap, drawn; measured Allreduce times

The lab: allreduce_timing (every algorithm timed against MPI's, the notebook's CSV).
"""

LESSON = 9
