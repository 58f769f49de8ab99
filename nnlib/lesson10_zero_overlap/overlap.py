"""Overlap: send each layer's gradient while backpropagation is still computing the earlier layers.

Backpropagation produces the gradients last layer first. As in PyTorch's DistributedDataParallel, the layers are
grouped into *buckets*, and a bucket's non-blocking ``Iallreduce`` starts as soon as its last gradient is final, so
that its transfer runs while the remaining layers' backward pass computes:

    backward layer L   | backward layer L-1 | ... | backward layer 1 | wait for what is left
                        \\_ Iallreduce(bucket L) ... _/   \\_ Iallreduce(bucket 1) _/

In the flat layout [W_1, b_1, ..., W_L, b_L] a bucket of layers l..m is one contiguous slice of ``grads``
(offsets[l]:offsets[m + 1], lesson 02's parameter_offsets), reduced in place with no copy. A bucket closes once it
holds at least ``bucket_bytes`` bytes: one per layer (``bucket_bytes=0``) overlaps the most but pays alpha per
layer; one for all layers is the plain Allreduce again.

MPI moves a non-blocking collective forward only while some MPI call runs (no progress thread here), so after each
layer the pending requests are tested once (``Testall``): that is where the overlap happens. The sums, in place,
equal the plain Allreduce's (tests/mpi/check_parallel.py); ``train_parallel(..., strategy=Overlap)`` trains this way.
"""

from __future__ import annotations

from mpi4py import MPI

from nnlib.lesson02_network.arrays import to_numpy
from nnlib.lesson02_network.network import parameter_offsets
from nnlib.lesson06_data_parallel.data_parallel import DataParallel

LESSON = 10


BUCKET_BYTES = 1 << 16  # 64 KiB: 784-128-10 gets one bucket (its last layer is 5 kB); 0 gives one per layer


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
        self.pending: list = []  # this step's requests, in the order the buckets were started

    def layer_done(self, layer: int) -> None:
        """Called by the backward pass when ``layer``'s gradient is final."""
        if layer in self.starts_at:
            start, stop = self.starts_at[layer]
            self.pending.append(self.comm.Iallreduce(MPI.IN_PLACE, self.network.grads[start:stop], op=MPI.SUM))
        if self.pending:
            MPI.Request.Testall(self.pending)  # let MPI move the started transfers forward

    def finish(self) -> None:
        """Wait until every bucket is reduced (all ranks' gradients summed in ``network.grads``)."""
        pending, self.pending = self.pending, []
        if hasattr(self.comm, "wait_all"):
            self.comm.wait_all(pending, "Iallreduce (overlapped)")
        else:
            MPI.Request.Waitall(pending)


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
        run.update(self.network.params, self.network.grads)
