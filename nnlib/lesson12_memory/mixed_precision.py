"""Mixed precision: weights, activations and gradients stored in float16, products computed in float32,
float32 master weights for the update, and dynamic loss scaling (Micikevicius et al. 2018).

Per step, with the loss scale S:

    half  <- float16(master)                          (the model's copy: 2 bytes per parameter)
    forward and backward with :class:`HalfLayer`:     each product casts its float16 operands to float32
                                                      (as tensor cores accumulate in float32) and stores
                                                      its result in float16; the loss is float32
    the backward starts from S * dJ/dz_L, so half_grads = float16(S * g)
    grads = float32(half_grads) / S   (summed over the ranks by the sync, if any)
    overflow (an inf or NaN in grads):  skip the step, S <- S / 2
    otherwise:  SGD on the float32 master;  after every ``growth_interval`` good steps in a row, S <- 2 S

Why scale: float16's smallest subnormal is 2^-24 (about 6e-8), and a gradient below half of it
rounds to 0 (:func:`underflow_per_layer` counts them, layer by layer). Scaling moves the gradients
up into float16's range for the trip through backward; dividing in float32 brings them back.
Memory per parameter (SGD with momentum): float16 weights 2 + float16 gradients 2 + float32 master 4
+ float32 momentum 4 + float32 unscaled gradient 4 (the ZeRO paper counts 2 + 2 + 12 for Adam, whose
master, momentum and variance are 4 each). NumPy has no bfloat16 array type: float16 only here.
"""

from __future__ import annotations

import numpy as np

from nnlib.lesson02_network.network import Layer, backward_layers, dense_layers, forward_layers, output_loss
from nnlib.lesson03_training.training import Batches, LocalUpdate, Run, Settings, train_loop

LESSON = 12

HALF, SINGLE = np.float16, np.float32


class HalfLayer(Layer):
    """Lesson 02's Layer over float16 views (W, b, dW, db), computing every product in float32.

    forward: z = float32(a_in) @ float32(W) + float32(b) (float32), a = f(z) stored as float16;
    weight_gradient: float32 products written into the float16 gradient views (an overflow becomes inf);
    input_gradient: float32 product, returned as float16.
    """

    def logits(self, inputs):
        return inputs.astype(SINGLE) @ self.weights.astype(SINGLE) + self.biases.astype(SINGLE)

    def forward(self, inputs):
        logits, activation = super().forward(inputs)
        return logits, activation.astype(HALF)

    def weight_gradient(self, inputs, delta, accumulate: bool = False) -> None:
        super().weight_gradient(inputs.astype(SINGLE), delta.astype(SINGLE), accumulate)

    def input_gradient(self, delta):
        return (delta.astype(SINGLE) @ self.weights.astype(SINGLE).T).astype(HALF)


class MixedPrecision:
    """``network`` (a float32 lesson 02 Network: its params are the master weights, its grads the unscaled
    float32 gradient) trained in mixed precision. half_params, half_grads: the float16 copies; layers: HalfLayer.
    loss_scale S (``dynamic``: halved on overflow, doubled after ``growth_interval`` good steps);
    overflowed: the last step's verdict; skipped: how many steps were skipped."""

    def __init__(self, network, loss_scale: float = 2.0 ** 15, growth_interval: int = 100, dynamic: bool = True):
        if str(network.params.dtype) != "float32":
            raise ValueError(f"the master weights must be float32; got {network.params.dtype}")
        self.network, self.loss_scale = network, float(loss_scale)
        self.growth_interval, self.dynamic = int(growth_interval), dynamic
        self.half_params = network.params.astype(HALF)
        self.half_grads = np.zeros_like(self.half_params)
        views = dense_layers(self.half_params, self.half_grads, network.shapes, network.output)
        self.layers = [HalfLayer(layer.weights, layer.biases, layer.grad_weights, layer.grad_biases, layer.activation)
                       for layer in views]
        self.good_steps, self.skipped, self.overflowed, self.last_correct = 0, 0, False, 0

    def __getattr__(self, name):
        return getattr(self.network, name)

    def loss_and_gradient(self, inputs, labels, normalizer=None, check: bool = True, on_device: bool = False,
                          on_layer_done=None):
        """One float16 forward and backward from S dJ/dz_L, unscaled into the float32 grads (an overflow stays inf
        for the optimizer, :class:`ScaledStep`, to see). Returns J."""
        if check:
            self.network.check_inputs(inputs)
            self.network.check_labels(labels, inputs.shape[0])
        self.half_params[...] = self.network.params  # float16(master)
        activations, logits = forward_layers(self.layers, inputs.astype(HALF))
        scale = self.loss_scale / (inputs.shape[0] if normalizer is None else normalizer)
        loss, correct, delta = output_loss(logits, activations[-1].astype(SINGLE), labels, scale, self.network.output)
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is what the loss scaler looks for
            backward_layers(self.layers, activations, delta, False, on_layer_done)
            np.divide(self.half_grads, SINGLE(self.loss_scale), out=self.network.grads)  # inf stays inf
        self.last_correct = int(correct)
        return float(loss) / self.loss_scale

    def scaler_update(self, overflowed: bool) -> None:
        """The verdict on the (summed) gradient: overflow: skip, halve S; else double S after enough good steps."""
        self.overflowed = overflowed
        if overflowed:
            self.skipped += 1
            self.good_steps = 0
            self.loss_scale /= 2 if self.dynamic else 1
            return
        self.good_steps += 1
        if self.dynamic and self.good_steps % self.growth_interval == 0:
            self.loss_scale *= 2

    def state_bytes(self, optimizer) -> dict:
        """Bytes held per kind: float16 weights and gradients, float32 master, gradient and momentum."""
        velocity = 0 if optimizer.velocity is None else optimizer.velocity.nbytes
        return {"float16 weights": self.half_params.nbytes, "float16 gradients": self.half_grads.nbytes,
                "float32 master": self.network.params.nbytes, "float32 gradient": self.network.grads.nbytes,
                "float32 momentum": velocity}


class ScaledStep:
    """An optimizer that updates only when the gradient it is given is finite, and tells the loss scaler.

    It looks at the gradient the sync hands it: after lesson 05's Allreduce that is the sum over the ranks,
    the same on every rank, and an inf or NaN on any rank makes the sum non-finite everywhere, so every rank
    skips together, with no extra message. (ZeRO's slices would not see the others' overflow: not offered.)
    """

    def __init__(self, optimizer, mixed: MixedPrecision):
        self.optimizer, self.mixed = optimizer, mixed

    @property
    def learning_rate(self) -> float:
        return self.optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, rate: float) -> None:
        self.optimizer.learning_rate = rate

    @property
    def velocity(self):
        return self.optimizer.velocity

    def step(self) -> None:
        overflowed = not bool(np.isfinite(self.mixed.grads).all())
        self.mixed.scaler_update(overflowed)
        if not overflowed:
            self.optimizer.step()


def loss_scaled(sync_class):
    """``sync_class`` (lesson 03's LocalUpdate, lesson 05's Allreduce) whose optimizer is a :class:`ScaledStep`."""

    class LossScaled(sync_class):
        def optimizer(self, network, learning_rate: float, momentum: float):
            return ScaledStep(super().optimizer(network, learning_rate, momentum), network)

    LossScaled.__name__ = f"LossScaled{sync_class.__name__}"
    return LossScaled


def train_mixed(mixed: MixedPrecision, inputs, labels, settings: Settings) -> tuple:
    """Train ``mixed`` in one process with lesson 03's loop, skipping overflowed steps: (history, optimizer)."""
    run = Run(mixed, settings, Batches(inputs.shape[0], settings.batch_size, settings.seed),
              sync=loss_scaled(LocalUpdate)())
    history = train_loop(run, inputs, labels)
    return history, run.optimizer


def underflow_per_layer(network, inputs, labels, loss_scale: float = 1.0) -> list[float]:
    """For each layer l, the fraction of its nonzero float32 gradient entries (dJ/dW_l, dJ/db_l) that are 0
    once stored in float16 after multiplying by ``loss_scale``: what scaling saves from flushing to zero."""
    network.loss_and_gradient(inputs, labels)
    fractions = []
    for weights, biases in zip(network.grad_weights, network.grad_biases):
        gradient = np.concatenate([np.ravel(weights), biases]).astype(np.float64)
        nonzero = gradient != 0
        flushed = nonzero & ((gradient * loss_scale).astype(HALF) == 0)
        fractions.append(float(flushed.sum() / max(1, nonzero.sum())))
    return fractions


SGD_MOMENTUM_BYTES = {"float16 weights": 2, "float16 gradients": 2, "float32 master": 4, "float32 gradient": 4,
                      "float32 momentum": 4}  # the prediction, per parameter
