"""Mixed precision: weights, activations and gradients stored in float16 or bfloat16, products computed in
float32, float32 master weights for the update, and dynamic loss scaling (Micikevicius et al. 2018).

Per step, with the loss scale S and the low precision ``low`` (float16, or bfloat16 from ml_dtypes):

    half  <- low(master)                              (the model's copy: 2 bytes per parameter)
    forward and backward with :class:`HalfLayer`:     each product casts its low operands to float32
                                                      (as tensor cores accumulate in float32) and stores
                                                      its result in low precision; the loss is float32
    the backward starts from S * dJ/dz_L, so half_grads = low(S * g)
    grads = float32(half_grads) / S   (added up over the k micro-batches, if any, in float32; summed over
                                       the ranks by the sync in float32)
    overflow (an inf or NaN in the summed grads on any rank, or S |grads| beyond the low range: the sum
              itself would overflow, whichever pieces it was added from):  skip the step, S <- S / 2
    otherwise:  the optimizer's step on the float32 master;  after ``growth_interval`` good steps in a row, S <- 2 S

Why scale: float16's smallest subnormal is 2^-24 (about 6e-8), and a gradient below half of it rounds to 0
(:func:`underflow_per_layer` counts them, layer by layer). Scaling moves the gradients up into float16's range for
the trip through backward; dividing in float32 brings them back. bfloat16 keeps float32's 8 exponent bits (smallest
normal 2^-126, about 1e-38) and drops mantissa bits instead (8 significant bits against float16's 11): the same
gradients survive unscaled, so bfloat16 runs with S = 1 and no scaler (an overflow still skips the step).

With FSDP the gradient is reduce-scattered in float32: MPI has no 16-bit float sum, and rounding each partial
sum to 2 bytes would lose bits at every one of the P - 1 additions. Bytes per parameter with momentum: 2 + 2 low,
4 + 4 + 4 float32 (:meth:`MixedPrecision.state_bytes`).
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
from mpi4py import MPI

from nnlib.lesson02_network.arrays import array_namespace
from nnlib.lesson02_network.network import Layer, dense_layers
from nnlib.lesson03_training.training import Batches, Run, Settings, train_loop
from nnlib.lesson17_activations.accumulation import MicroBatched
from nnlib.lesson16_sharding.fsdp import ShardedLayer

LESSON = 17

HALF, SINGLE = np.float16, np.float32


def low_precision(name: str):
    """The NumPy dtype of ``name``: float16 (NumPy's own) or bfloat16 (the ml_dtypes package, JAX's)."""
    if name not in ("float16", "bfloat16"):
        raise ValueError(f"mixed precision stores float16 or bfloat16; got {name!r}")
    return np.dtype(HALF if name == "float16" else ml_dtypes.bfloat16)


class HalfLayer(Layer):
    """Lesson 02's Layer over low-precision views (W, b, dW, db), computing every product in float32.

    forward: z = float32(a_in) @ float32(W) + float32(b) (float32), a = f(z) stored in ``low_dtype``;
    weight_gradient: float32 products written into the low gradient views (a float16 overflow becomes inf);
    input_gradient: float32 product, returned in ``low_dtype``.
    """

    plain_logits = False  # (its own logits, in float32, below)

    def __init__(self, weights, biases, grad_weights, grad_biases, activation: str = "sigmoid", low_dtype=HALF):
        super().__init__(weights, biases, grad_weights, grad_biases, activation)
        self.low_dtype = np.dtype(low_dtype)

    def logits(self, inputs):
        return inputs.astype(SINGLE) @ self.weights.astype(SINGLE) + self.biases.astype(SINGLE)

    def forward(self, inputs):
        logits, activation = super().forward(inputs)
        return logits, activation.astype(self.low_dtype)

    def weight_gradient(self, inputs, delta, accumulate: bool = False) -> None:
        super().weight_gradient(inputs.astype(SINGLE), delta.astype(SINGLE), accumulate)

    def input_gradient(self, delta):
        return (delta.astype(SINGLE) @ self.weights.astype(SINGLE).T).astype(self.low_dtype)


class LossScaler:
    """Dynamic loss scaling: the object the training loop calls (lesson 03's ``Run.update``), as PyTorch's GradScaler.

    loss_scale S: backward starts from S dJ/dz_L (the network divides S out, in float32); 2^15 by default for float16,
    1 for bfloat16 (float32's range: nothing to scale). :meth:`step`: the optimizer's step unless the summed gradient
    overflowed, a verdict every rank shares (:meth:`found_inf`); then :meth:`update`: S halved on overflow (if
    ``dynamic``, the default for float16 only), doubled after ``growth_interval`` good steps in a row. overflowed:
    the last step's verdict; skipped: how many steps were skipped; verdicts: every step's (overflowed, S used).
    """

    def __init__(self, low, loss_scale: float | None = None, growth_interval: int = 100, dynamic: bool | None = None):
        scaled = np.dtype(low) == np.dtype(HALF)
        self.low, self.loss_scale = np.dtype(low), float(loss_scale if loss_scale is not None else
                                                          2.0 ** 15 if scaled else 1.0)
        self.growth_interval, self.dynamic = int(growth_interval), scaled if dynamic is None else bool(dynamic)
        self.good_steps, self.skipped, self.overflowed, self.verdicts = 0, 0, False, []

    def step(self, optimizer, params, grads, comm=None) -> None:
        """``optimizer.step(params, grads)`` unless the gradient overflowed (``comm``: the ranks holding the rest of
        it, None: this rank holds all of it); the step count of a skipped step is not advanced."""
        overflowed = self.found_inf(grads, comm)
        self.update(overflowed)
        if not overflowed:
            optimizer.step(params, grads)

    def found_inf(self, grads, comm=None) -> bool:
        """The verdict on the step's summed float32 gradient g: overflow if g has an inf or NaN (a piece
        overflowed on its way) or if S max|g| is beyond the low precision's largest value (the sum itself would
        not fit). The second test depends on the sum only, not on how it was cut into micro-batches and ranks:
        two cuttings can disagree only where one piece overflowed alone while the sum fits. ``grads``: all of g,
        or this rank's part (FSDP's chunks, ZeRO's slice), whose ``comm`` Allreduces the flag: one verdict."""
        xp = array_namespace(grads)
        peak = max(abs(float(grads.max())), abs(float(grads.min()))) if grads.size else 0.0  # (no temporary)
        largest = float(ml_dtypes.finfo(self.low).max)  # 65504 for float16, ~3.4e38 for bfloat16
        local = not (bool(xp.all(xp.isfinite(grads))) and peak * self.loss_scale <= largest)
        return bool(comm.allreduce(local, op=MPI.LOR)) if comm is not None else local

    def update(self, overflowed: bool) -> None:
        self.overflowed = overflowed
        self.verdicts.append((overflowed, self.loss_scale))
        if overflowed:
            self.skipped += 1
            self.good_steps = 0
            self.loss_scale /= 2 if self.dynamic else 1
            return
        self.good_steps += 1
        if self.dynamic and self.good_steps % self.growth_interval == 0:
            self.loss_scale *= 2

    def state_dict(self) -> dict:
        return dict(loss_scale=self.loss_scale, good_steps=self.good_steps, skipped=self.skipped)

    def load_state_dict(self, state: dict) -> None:
        self.loss_scale, self.good_steps = float(state["loss_scale"]), int(state["good_steps"])
        self.skipped = int(state["skipped"])


class MixedPrecision(MicroBatched):
    """``network`` (a float32 lesson 02 Network or a FullyShardedNetwork: its params are the master weights, its
    grads the unscaled float32 gradient) trained in mixed precision, ``precision`` "float16" or "bfloat16".

    half_params: the low copy of params; half_grads: the scaled gradient, low (float32 chunks for FSDP); layers:
    HalfLayer (in FSDP, its ShardedLayer computing with one); micro_batches, recompute_every: MicroBatched's.
    ``scaler``: its :class:`LossScaler` (loss_scale, growth_interval, dynamic: the scaler's), which the training
    run calls.
    """

    def __init__(self, network, loss_scale: float | None = None, growth_interval: int = 100,
                 dynamic: bool | None = None, precision: str = "float16", micro_batches: int = 1,
                 recompute_every: int | None = None):
        if str(network.params.dtype) != "float32":
            raise ValueError(f"the master weights must be float32; got {network.params.dtype}")
        super().__init__(network, micro_batches, recompute_every)
        self.precision, self.low = precision, low_precision(precision)
        self.scaler = LossScaler(self.low, loss_scale, growth_interval, dynamic)
        self.sharded = all(isinstance(layer, ShardedLayer) for layer in network.layers)  # each rank: its chunks
        self.half_params = network.params.astype(self.low)
        self.half_grads = network.xp.zeros(network.params.size, SINGLE if self.sharded else self.low)
        compute = functools.partial(HalfLayer, low_dtype=self.low)  # a layer computing in float32, storing low
        if self.sharded:  # over this rank's low chunks (gathered in low precision), else views of the low copies
            bounds = np.cumsum([0] + [layer.shard.size for layer in network.layers])
            self.layers = [ShardedLayer(network.comm, layer.index, layer.shape,
                                        (self.half_params[start:stop], self.half_grads[start:stop]),
                                        layer.activation, network.log, compute)
                           for layer, start, stop in zip(network.layers, bounds, bounds[1:])]
        else:
            self.layers = [compute(view.weights, view.biases, view.grad_weights, view.grad_biases, view.activation)
                           for view in dense_layers(self.half_params, self.half_grads, network.shapes, network.output,
                                                    network.xp)]

    @property
    def loss_scale(self) -> float:
        """S, the scaler's: backpropagation starts from S dJ/dz_L (lesson 17's MicroBatched reads it)."""
        return self.scaler.loss_scale

    def state_dict(self) -> dict:
        """The master network's state, and the loss scaler's: S, good steps in a row, steps skipped."""
        return dict(self.network.state_dict(), **self.scaler.state_dict())

    def load_state_dict(self, state: dict) -> None:
        self.network.load_state_dict(state)
        self.scaler.load_state_dict(state)

    def loss_and_gradient(self, inputs, labels, normalizer=None, check: bool = True, on_device: bool = False,
                          on_layer_done=None):
        """Low-precision forwards and backwards from S dJ/dz_L (micro-batch by micro-batch), unscaled into the
        float32 grads (an overflow stays inf, for the scaler, :class:`LossScaler`, to see). Returns J."""
        if on_layer_done is not None:
            raise ValueError("mixed precision unscales the gradient after backward: a strategy that sends it "
                             "during backward (overlap) does not combine with it")
        self.half_params[...] = self.network.params  # low(master)
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is what the loss scaler looks for
            loss = super().loss_and_gradient(inputs, labels, normalizer, check)
        return loss / self.loss_scale

    def micro_batch(self, inputs, labels, scale: float, accumulate: bool, on_layer_done):
        """One micro-batch's low gradient (scaled by S), unscaled into grads (added after the first); its loss."""
        loss = super().micro_batch(inputs.astype(self.low), labels, scale, False, on_layer_done)
        if accumulate:
            # grads += half_grads / S, the quotient computed straight in float32: one temporary (inf stays inf)
            self.network.grads += self.network.xp.divide(self.half_grads, SINGLE(self.loss_scale), dtype=SINGLE)
        else:
            self.network.xp.divide(self.half_grads, SINGLE(self.loss_scale), out=self.network.grads)
        return loss

    def state_bytes(self, optimizer) -> dict:
        """Bytes held per kind: low weights and gradients, float32 master, gradient and optimizer state (SGD's
        momentum, or Adam's moments)."""
        return {f"{self.precision} weights": self.half_params.nbytes,
                f"{self.precision} gradients": self.half_grads.nbytes,
                "float32 master": self.network.params.nbytes, "float32 gradient": self.network.grads.nbytes,
                "float32 " + ("Adam moments" if "m" in optimizer.state else "momentum"): optimizer.state_bytes}


def train_mixed(mixed: MixedPrecision, inputs, labels, settings: Settings) -> tuple:
    """Train ``mixed`` in one process with lesson 03's loop, skipping overflowed steps: (history, optimizer)."""
    run = Run(mixed, settings, Batches(inputs.shape[0], settings.batch_size, settings.seed), scaler=mixed.scaler)
    return train_loop(run, inputs, labels), run.optimizer  # (the optimizer made as the loop began)


def underflow_per_layer(network, inputs, labels, loss_scale: float = 1.0, precision: str = "float16") -> list[float]:
    """For each layer l, the fraction of its nonzero float32 gradient entries (dJ/dW_l, dJ/db_l) that are 0
    once stored in ``precision`` (float16 or bfloat16) after multiplying by ``loss_scale``: what scaling saves
    from flushing to zero (in float16; bfloat16's range is float32's, so nearly nothing flushes there)."""
    low = low_precision(precision)
    network.loss_and_gradient(inputs, labels)
    fractions = []
    for weights, biases in zip(network.grad_weights, network.grad_biases):
        gradient = np.concatenate([np.ravel(weights), biases]).astype(np.float64)
        nonzero = gradient != 0
        flushed = nonzero & ((gradient * loss_scale).astype(low) == 0)
        fractions.append(float(flushed.sum() / max(1, nonzero.sum())))
    return fractions
