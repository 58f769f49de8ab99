"""Compressed gradients for data parallelism: fewer bytes per step, for some accuracy.

Every rank has its gradient g_r (n numbers); the step needs sum_r g_r on every rank. Instead of an
``Allreduce`` of n float64 numbers, each rank sends a smaller message and everyone adds up the
decoded messages (an ``Allgather``: MPI cannot add float16, bfloat16 or sparse vectors for us):

* ``float16``: IEEE half precision, 2 bytes a number (10 bits of mantissa; overflows above 65504);
* ``bfloat16``: the top 16 bits of float32 (8 bits of exponent, float32's range; 7 bits of mantissa),
  rounded to nearest even, computed here by hand on the bits (NumPy has no bfloat16)::

      bits = float32(g) viewed as uint32;   bf16 = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
      decode: float32 from (bf16 << 16)

* ``topk``: only the k largest |g| of each rank, as (index, value) pairs (4 + 8 bytes each), with
  *error feedback* (Deep Gradient Compression; Stich et al. 2018): what a rank did not send is kept
  (the residual e_r) and added to its next gradient, so nothing is lost, only delayed::

      c = g_r + e_r;   S = the k indices of largest |c|;   send c[S];   e_r <- c with c[S] set to 0

* ``none``: the plain ``Allreduce`` (the reference). ``topk`` with k = n and float64 values sends
  everything and equals it to rounding (the sum's order differs); the tests check that.
"""

from __future__ import annotations

from functools import partial

import numpy as np
from mpi4py import MPI

from nnlib.lesson02_network.arrays import through_host, to_numpy
from nnlib.lesson04_collectives.costmodel import ring_allgather_time, ring_allreduce_time
from nnlib.lesson06_data_parallel.data_parallel import DataParallel

LESSON = 15


METHODS = ("none", "float16", "bfloat16", "topk")
INDEX_BYTES = 4  # int32 indices


def to_bfloat16(values) -> np.ndarray:
    """float32 (or float64, rounded to float32 first) to bfloat16 bit patterns (uint16), nearest even."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    patterns = rounded.astype(np.uint16)
    patterns[np.isnan(values)] = 0x7FC0  # a NaN stays a NaN (rounding could carry it into infinity)
    return patterns


def from_bfloat16(patterns) -> np.ndarray:
    """bfloat16 bit patterns (uint16) to float32: the 16 bits become the top of a float32."""
    return (np.asarray(patterns, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def top_k(values, k: int) -> np.ndarray:
    """The indices (int32, ascending) of the k entries of largest absolute value."""
    if k >= values.size:
        return np.arange(values.size, dtype=np.int32)
    return np.sort(np.argpartition(np.abs(values), values.size - k)[values.size - k:]).astype(np.int32)


def check_method(method, k, num_params: int) -> list[str]:
    """What is wrong with a compression setting (an empty list if nothing); the same on every rank."""
    if method not in METHODS:
        return [f"compression must be one of {', '.join(METHODS)}; got {method!r}"]
    if method == "topk" and (not isinstance(k, (int, np.integer)) or isinstance(k, bool) or not 1 <= k <= num_params):
        return [f"top-k compression needs k, a whole number from 1 to the number of parameters ({num_params}); "
                f"got {k!r}"]
    if method != "topk" and k is not None:
        return [f"k is only for top-k compression (compression='topk'); got k={k!r} with compression={method!r}"]
    return []


class Compressor:
    """One rank's side of a compressed gradient sum: ``allreduce(comm, grads)`` replaces grads by the sum
    over ranks of what each rank sent (keeping the top-k residual between steps); ``name`` says how."""

    def __init__(self, method: str, num_params: int, dtype, k: int | None = None):
        problems = check_method(method, k, num_params)
        if problems:
            raise ValueError(problems[0])
        self.method, self.k, self.dtype = method, k, np.dtype(dtype)
        self.name = method if k is None else f"{method} (k = {k})"
        self.residual = np.zeros(num_params, dtype=self.dtype) if method == "topk" else None
        self.kept_between_steps = "top-k compression's residuals" if method == "topk" else None

    def allreduce(self, comm, grads) -> None:
        """grads (n,) on every rank -> in place, the sum over ranks of the decoded messages."""
        size = comm.size
        if self.method == "none":
            comm.Allreduce(MPI.IN_PLACE, grads, op=MPI.SUM)
            return
        if self.method in ("float16", "bfloat16"):
            message = grads.astype(np.float16) if self.method == "float16" else to_bfloat16(grads)
            everyone = np.empty((size, message.size), dtype=message.dtype)
            comm.Allgather(message, everyone)
            decoded = everyone if self.method == "float16" else from_bfloat16(everyone)
            grads[...] = decoded.astype(grads.dtype).sum(axis=0)
            return
        corrected = grads + self.residual                           # c = g + e
        chosen = top_k(corrected, self.k)                           # S
        values = np.ascontiguousarray(corrected[chosen])            # c[S]
        self.residual[...] = corrected
        self.residual[chosen] = 0                                   # e <- c outside S
        indices = np.empty((size, chosen.size), dtype=np.int32)
        sent = np.empty((size, chosen.size), dtype=values.dtype)
        comm.Allgather(chosen, indices)
        comm.Allgather(values, sent)
        grads[...] = 0
        for rank in range(size):  # in rank order: the same sum on every rank
            grads[indices[rank]] += sent[rank]  # (no index repeats within one rank's message)


class CompressedAllreduce(DataParallel):
    """Data parallelism whose step sends compressed gradients (a :class:`Compressor`), then updates.

    ``train_parallel(..., strategy=compressed("topk", k=1000))`` trains this way. ``compressor``: another
    object with ``allreduce(comm, grads)``, a ``name`` and what it keeps between steps (``kept_between_steps``,
    which checkpoints would lose), in place of a Compressor: nnlib.lesson15_compression.powersgd's.
    """

    def __init__(self, comm, network, method: str, k: int | None = None, compressor=None):
        super().__init__(comm, network)
        self.compression = method
        self.compressor = compressor or Compressor(method, network.num_params, to_numpy(network.params[:1]).dtype, k)
        self.name = self.compressor.name
        self.kept_between_steps = getattr(self.compressor, "kept_between_steps", None)

    def step(self, run) -> None:
        run.phase("communicate")
        through_host(self.network.grads, lambda grads: self.compressor.allreduce(self.comm, grads))
        run.phase("update")
        run.update(self.network.params, self.network.grads)


def compressed(method: str, k: int | None = None):
    """The strategy ``train_parallel`` takes for compressed gradients: a function of (comm, network)."""
    return partial(CompressedAllreduce, method=method, k=k)


def message_bytes(method: str, num_params: int, k: int | None = None, itemsize: int = 8) -> int:
    """The bytes one rank's message holds per step: n numbers, n halves, or k (index, value) pairs."""
    if method == "none":
        return num_params * itemsize
    if method in ("float16", "bfloat16"):
        return num_params * 2
    return int(k) * (INDEX_BYTES + itemsize)


def exchange_time(method: str, num_params: int, ranks: int, alpha: float, beta: float, k: int | None = None,
                  itemsize: int = 8) -> float:
    """The alpha-beta model's time for one step's exchange on ``ranks`` ranks (lesson 04's costmodel formulas).

    none: a ring Allreduce of n numbers, 2 (P-1) alpha + 2 (P-1)/P n_bytes beta.
    the others: a ring Allgather of every rank's message of b bytes, (P-1) (alpha + b beta)
    (top-k: two Allgathers, of the k indices and of the k values, so twice the alpha).
    """
    if method == "none":
        return float(ring_allreduce_time(message_bytes("none", num_params, itemsize=itemsize), ranks, alpha, beta))
    parts = [int(k) * INDEX_BYTES, int(k) * itemsize] if method == "topk" else [message_bytes(method, num_params)]
    return float(sum(ring_allgather_time(part, ranks, alpha, beta) for part in parts))


def counted_seconds(calls, ranks: int, alpha: float, beta: float) -> float:
    """The alpha-beta time of counted calls ({(collective, bytes): count}, CountingComm.messages()) on ``ranks`` ranks:
    a ring Allreduce of the message's n bytes, or a ring Allgather of every rank's b bytes, per call."""
    formulas = {"Allreduce": ring_allreduce_time, "Allgather": ring_allgather_time}
    return float(sum(count * formulas[name](nbytes, ranks, alpha, beta) for (name, nbytes), count in calls.items()))

