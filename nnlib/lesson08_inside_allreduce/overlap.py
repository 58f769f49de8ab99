"""Overlap: send each layer's gradient while backpropagation is still computing the earlier layers.

Backpropagation produces the gradients last layer first. Here (the design of PyTorch's
DistributedDataParallel) the layers are grouped into *buckets*, and a bucket's non-blocking
``Iallreduce`` starts as soon as its last gradient is final, so that its transfer runs while the
remaining layers' backward pass computes:

    backward layer L   | backward layer L-1 | ... | backward layer 1 | wait for what is left
                        \\_ Iallreduce(bucket L) ... _/   \\_ Iallreduce(bucket 1) _/

The flat layout [W_1, b_1, ..., W_L, b_L] makes every bucket one contiguous slice of ``grads``
(layers l..m are params[offset(W_l) : offset(W_m) + size(W_m) + size(b_m)]), so a bucket is
reduced in place with no copy. A bucket closes once it holds at least ``bucket_bytes`` bytes:
one message per layer (``bucket_bytes=0``) overlaps the most but pays alpha per layer; one
bucket for all layers is the plain Allreduce again.

MPI moves a non-blocking collective forward only while some MPI call runs (no progress thread
here), so after each layer the pending requests are tested once (``Testall``): that is where
the overlap happens. The sums are the same Allreduce sums, in place, so the result equals the
plain Allreduce (tests/mpi/check_parallel.py). ``train_parallel(..., strategy=Overlap)`` trains this way.
"""

from __future__ import annotations

import time

from mpi4py import MPI

from nnlib.lesson02_network.arrays import to_numpy
from nnlib.lesson02_network.network import parameter_offsets
from nnlib.course.trace import Span
from nnlib.lesson05_data_parallel.data_parallel import DataParallel

LESSON = 8


BUCKET_BYTES = 1 << 16  # 64 KiB: 784-128-10 gets one bucket (its last layer is 5 kB); bucket_bytes=0 gives one per layer


def bucket_ranges(network, bucket_bytes: int = BUCKET_BYTES):
    """The buckets, in the order backpropagation completes them: [(lowest layer, start, stop)].

    Each bucket covers layers lowest..highest and is params[start:stop] of the flat layout.
    """
    if bucket_bytes < 0:
        raise ValueError(f"bucket_bytes must be 0 or more; got {bucket_bytes}")
    itemsize = to_numpy(network.params[:1]).itemsize
    layer_starts = parameter_offsets(network.shapes)
    buckets, stop = [], layer_starts[-1]
    for layer in range(network.num_layers - 1, -1, -1):
        start = layer_starts[layer]
        if (stop - start) * itemsize >= bucket_bytes or layer == 0:
            buckets.append((layer, start, stop))
            stop = start
    return buckets


class BucketedAllreduce:
    """Starts each bucket's in-place Iallreduce as backpropagation finishes it; ``finish`` waits.

    Use:   overlap = BucketedAllreduce(comm, network)
           network.loss_and_gradient(..., on_layer_done=overlap.layer_done)   # starts the sends
           overlap.finish()                                                    # grads hold the sums
    comm is an MPI communicator or a nnlib.course.deadline.WatchedComm (then ``finish`` has its deadline).
    """

    def __init__(self, comm, network, bucket_bytes: int | None = None):
        self.comm, self.network = comm, network
        self.buckets = bucket_ranges(network, BUCKET_BYTES if bucket_bytes is None else bucket_bytes)
        self.starts_at = {layer: (start, stop) for layer, start, stop in self.buckets}
        self.number = {layer: index for index, (layer, _, _) in enumerate(self.buckets)}  # bucket b: b-th completed
        self.pending: list = []
        self.calls: list = []  # the last step's (call, bucket, start, end), time.perf_counter seconds: "Iallreduce"
        # when bucket b was started, "wait" while finish waited for its sum (bucket_spans: a trace's spans)
        self._step_over = False

    def layer_done(self, layer: int) -> None:
        """Called by the backward pass when ``layer``'s gradient is final."""
        if layer in self.starts_at:
            if self._step_over:  # a new step's first bucket: keep only this step's calls
                self.calls, self._step_over = [], False
            start, stop = self.starts_at[layer]
            began = time.perf_counter()
            self.pending.append(self.comm.Iallreduce(MPI.IN_PLACE, self.network.grads[start:stop], op=MPI.SUM))
            self.calls.append(("Iallreduce", self.number[layer], began, time.perf_counter()))
        if self.pending:
            MPI.Request.Testall(self.pending)  # let MPI move the started transfers forward

    def finish(self) -> None:
        """Wait until every bucket is reduced (all ranks' gradients summed in ``network.grads``)."""
        pending, self.pending = self.pending, []
        started = [bucket for call, bucket, _, _ in self.calls if call == "Iallreduce"]  # this step's, in order
        assert len(started) == len(pending), f"{len(pending)} requests pending for {len(started)} buckets started"
        for bucket, request in zip(started, pending):
            began = time.perf_counter()
            if hasattr(self.comm, "wait_all"):
                self.comm.wait_all([request], "Iallreduce (overlapped)")
            else:
                request.Wait()
            self.calls.append(("wait", bucket, began, time.perf_counter()))
        self._step_over = True


class Overlap(DataParallel):
    """Allreduce, but each bucket of layers is sent (Iallreduce) as soon as backpropagation has produced it."""

    name = "overlap"

    def __init__(self, comm, network, bucket_bytes: int | None = None):
        super().__init__(comm, network)
        self.buckets = BucketedAllreduce(comm, network, bucket_bytes)
        self.layer_done = self.buckets.layer_done  # the training loop calls it during backpropagation

    def step(self, run) -> None:
        run.phase("communicate")
        self.buckets.finish()  # what the backward pass has not already sent
        run.phase("update")
        run.optimizer.step()


#: The trace thread of each kind of BucketedAllreduce call.
CALL_THREADS = {"Iallreduce": "Iallreduce started", "wait": "waiting for a bucket's sum"}


def bucket_spans(calls_per_rank, buckets=None) -> list[Span]:
    """Spans "bucket b" for lesson 04's trace writer: calls_per_rank[rank] = a BucketedAllreduce's ``calls``.

    One process per rank, one thread per kind of call (CALL_THREADS); buckets: the (lowest layer,
    start, stop) of each bucket (BucketedAllreduce.buckets), put in the args as its lowest layer.
    """
    return [Span(rank, CALL_THREADS[call], f"bucket {bucket}", start, end,
                 dict(bucket=bucket, **({"lowest_layer": buckets[bucket][0]} if buckets else {})))
            for rank, calls in enumerate(calls_per_rank) for call, bucket, start, end in calls]
