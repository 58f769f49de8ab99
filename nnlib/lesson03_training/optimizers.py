"""Optimizers: each update rule written once, over a flat parameter vector or any slice of it.

An optimizer is made for the parameters ``params`` (n,) it updates, the whole vector or the slice a rank owns, and
``step(params, grads)`` updates them in place from their gradient (n,). It holds no communicator and knows no network:
a strategy hands it its own slice (parameters that another communicator sums are another optimizer's). ``state``:
named arrays (n,), zeros at first, and ``steps`` taken: ``state_dict()``. Element-wise, with the learning rate eta:

    SGD     p <- p - eta g;  with momentum mu (0 <= mu < 1): v <- mu v - eta g, p <- p + v    (state: v)
    Adam    t <- t + 1,  m <- b1 m + (1 - b1) g,  v <- b2 v + (1 - b2) g^2,    (state: m, v, t; Kingma and Ba)
            p <- p - eta m_hat / (sqrt(v_hat) + eps),  m_hat = m / (1 - b1^t),  v_hat = v / (1 - b2^t)
    AdamW   Adam whose weights first decay apart from the gradient: p <- (1 - eta lambda) p   (Loshchilov, Hutter)
"""

from __future__ import annotations

import math

import numpy as np

LESSON = 3


def problems(learning_rate, momentum=0.0, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, optimizer=None) -> list:
    """What is wrong with an optimizer's numbers (none: []); and, with its name, a number that it does not use."""
    unit, positive = ("in [0, 1)", lambda x: 0 <= x < 1), ("a positive finite number", lambda x: x > 0)
    wanted = {"learning_rate": (learning_rate, *positive), "momentum": (momentum, *unit), "beta1": (beta1, *unit),
              "beta2": (beta2, *unit), "eps": (eps, *positive),
              "weight_decay": (weight_decay, "a finite number, 0 or more", lambda x: x >= 0)}
    found = [f"{name} must be {what}; got {value!r}" for name, (value, what, fine) in wanted.items()
             if not (isinstance(value, (int, float, np.integer, np.floating)) and math.isfinite(value) and fine(value))]
    if optimizer not in (None, "sgd", "adam", "adamw"):
        return found + [f"optimizer must be 'sgd', 'adam' or 'adamw' (Adam with weight decay); got {optimizer!r}"]
    unused = {"momentum is SGD's (Adam's is beta1)": optimizer in ("adam", "adamw") and momentum,
              "weight_decay is AdamW's": optimizer in ("sgd", "adam") and weight_decay,
              "beta1, beta2 and eps are Adam's": optimizer == "sgd" and (beta1, beta2, eps) != (0.9, 0.999, 1e-8)}
    return found + [f"{what}: leave it at its default, or use that optimizer" for what, used in unused.items() if used]


def check(found: list[str]) -> None:
    if found:  # every problem found, named
        raise ValueError("; ".join(found))


class Optimizer:
    """Made for ``params`` (n,) of namespace ``xp`` (numpy, cupy), it keeps the arrays ``names`` (zeros like them);
    a step counts itself, decays the weights (AdamW's ``weight_decay``), then runs ``rule`` (element-wise, one kernel
    if xp fuses) on params, grads, arguments() of each of the ``pieces`` in turn (FSDP's layers: short temporaries)."""

    weight_decay = 0.0

    def __init__(self, params, learning_rate: float, xp=np, pieces=(slice(None),)):
        self.learning_rate, self.xp, self.steps, self.pieces = float(learning_rate), xp, 0, pieces
        self.state = {name: xp.zeros_like(params) for name in self.names}
        fuse = getattr(xp, "fuse", None)  # (CuPy: the rule as one kernel)
        self.kernel = self.rule if fuse is None else fuse(kernel_name=self.rule.__name__)(self.rule)

    def step(self, params, grads) -> None:
        """Update ``params`` (n,) in place from ``grads`` (n,)."""
        self.steps += 1
        if self.weight_decay:  # decoupled from the gradient
            params *= 1 - self.learning_rate * self.weight_decay
        for piece in self.pieces:
            self.kernel(params[piece], grads[piece], *self.arguments(piece))

    def state_dict(self, vector=lambda array: array) -> dict:
        """The state's arrays by name (themselves, or each through ``vector``: a strategy's whole), and ``steps``."""
        return dict({name: vector(array) for name, array in self.state.items()}, steps=self.steps)

    def load_state_dict(self, state: dict, vector=lambda array: array) -> None:
        for name in self.names:  # (each through ``vector``, a strategy's part; from any device, into this state's)
            self.state[name][...] = self.xp.asarray(vector(state[name]))
        self.steps = int(state["steps"])

    @property
    def state_bytes(self) -> int:
        return sum(int(array.nbytes) for array in self.state.values())


def sgd_update(params, grads, velocity, learning_rate: float, momentum: float) -> None:
    """In place: velocity <- mu velocity - eta grads, params += velocity (no velocity: params -= eta grads)."""
    if velocity is None:
        params -= learning_rate * grads
    else:
        velocity *= momentum
        velocity -= learning_rate * grads
        params += velocity


class SGD(Optimizer):
    """Stochastic gradient descent; with momentum mu (not 0), its state is ``velocity`` (n,)."""
    rule = staticmethod(sgd_update)

    def __init__(self, params, learning_rate: float, momentum: float = 0.0, xp=np, pieces=(slice(None),)):
        check(problems(learning_rate, momentum))
        self.names, self.momentum = ("velocity",) if momentum else (), float(momentum)
        super().__init__(params, learning_rate, xp, pieces)

    def arguments(self, piece) -> tuple:
        return self.state["velocity"][piece] if self.names else None, self.learning_rate, self.momentum


def adam_update(params, grads, m, v, beta1: float, beta2: float, step_size: float, eps_hat: float) -> None:
    """In place: m <- b1 m + (1 - b1) g, v <- b2 v + (1 - b2) g^2, params -= step_size m / (sqrt(v) + eps_hat): Adam
    as Kingma and Ba write it to be fast, step_size = eta sqrt(1 - b2^t) / (1 - b1^t), eps_hat = eps sqrt(1 - b2^t)."""
    m *= beta1
    m += (1 - beta1) * grads
    v *= beta2
    v += (1 - beta2) * grads * grads
    params -= step_size * m / (v ** 0.5 + eps_hat)


class Adam(Optimizer):
    """Adam; AdamW if ``weight_decay`` (lambda) is not 0. State: the moments ``m`` and ``v`` (n,), and ``steps``, t."""
    names, rule = ("m", "v"), staticmethod(adam_update)

    def __init__(self, params, learning_rate: float, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, xp=np,
                 pieces=(slice(None),)):
        check(problems(learning_rate, 0.0, beta1, beta2, eps, weight_decay))
        self.beta1, self.beta2, self.eps, self.weight_decay = map(float, (beta1, beta2, eps, weight_decay))
        super().__init__(params, learning_rate, xp, pieces)

    def arguments(self, piece) -> tuple:
        root = math.sqrt(1 - self.beta2 ** self.steps)  # (steps: t, this step already counted)
        return (self.state["m"][piece], self.state["v"][piece], self.beta1, self.beta2,
                self.learning_rate * root / (1 - self.beta1 ** self.steps), self.eps * root)
