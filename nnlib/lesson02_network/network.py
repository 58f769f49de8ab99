"""A fully connected sigmoid network, with every parameter in one flat vector.

Notation (one row per sample, a batch of N samples):

    a_0 = X                                  (N, n_0)      the inputs
    z_l = a_{l-1} @ W_l + b_l                (N, n_l)      W_l: (n_{l-1}, n_l), b_l: (n_l,)
    a_l = sigmoid(z_l)                       hidden layers l = 1 .. L-1
    a_L = sigmoid(z_L) or softmax(z_L)       the output layer, (N, n_L)

Cost (mean cross-entropy over the batch, Y one-hot (N, n_L)):

    sigmoid outputs: J = -1/N sum_n sum_k [ Y log a_L + (1 - Y) log(1 - a_L) ]
    softmax outputs: J = -1/N sum_n sum_k   Y log a_L

Backpropagation (both outputs give the same output error):

    delta_L = (a_L - Y) / N                               (N, n_L)
    delta_l = (delta_{l+1} @ W_{l+1}.T) * a_l * (1 - a_l)  (N, n_l)
    dJ/dW_l = a_{l-1}.T @ delta_l                          (n_{l-1}, n_l)
    dJ/db_l = sum over samples of delta_l                  (n_l,)

The weights and biases are views into ``params``, one flat vector laid out [W_1, b_1, W_2, b_2, ...];
the gradients are views into ``grads`` with the same layout, so all gradients can travel in one message.
:func:`forward_layers` and :func:`backward_layers` are nnlib's one backpropagation, over a list of
:class:`Layer` (lessons 11 and 12's tensor and pipeline layers run it too). The math uses only the array API
(``xp``), so it runs on NumPy and CuPy; each element-wise piece is one fused kernel on a GPU (arrays.fused).
"""

from __future__ import annotations

import math

import numpy as np

from nnlib.lesson02_network.arrays import (array_namespace, constant_vector, fused, is_numpy, namespace_of_device,
                                           product_into, to_numpy)
from nnlib.lesson02_network.loss import cross_entropy_from_logits, one_hot, output_loss

LESSON = 2


def sigmoid(z, xp=None):
    """sigma(z) = 1 / (1 + exp(-z)), element-wise.

    Computed as the equal 0.5 + 0.5 tanh(z / 2): exp(-z) overflows to inf for
    z < -89 in float32 (harmless, but NumPy warns), tanh never does.
    """
    xp = xp or array_namespace(z)
    activation = xp.tanh(z * 0.5)
    activation *= 0.5
    activation += 0.5
    return activation


def bias_sigmoid(logits, biases):
    """z += b in place (z (N, n_out) = a_in @ W, b (n_out,)), and a = sigma(z) (N, n_out) returned."""
    logits += biases
    return sigmoid(logits)


def sigmoid_backward(activation_gradient, activation) -> None:
    """dJ/dz = dJ/da * sigma'(z) = dJ/da * a (1 - a), over dJ/da (N, n_out) in place; a = sigma(z) (N, n_out)."""
    activation_gradient *= activation * (1 - activation)


def softmax(z, xp):
    """Row-wise softmax of logits z (N, K), shifted by the row maximum for stability."""
    shifted = z - xp.max(z, axis=1, keepdims=True)
    exponentials = xp.exp(shifted)
    return exponentials / xp.sum(exponentials, axis=1, keepdims=True)


class Layer:
    """One fully connected layer, a = f(a_in @ W + b): weights W (n_in, n_out) and biases b (n_out,) are views into
    the network's ``params``, grad_weights and grad_biases the same views into its ``grads`` (the backward pass writes
    them in place). activation: "sigmoid" (every hidden layer) or "softmax" (allowed for the output layer).
    """

    plain_logits = True  # z is a_in @ W + b, so a sigmoid's pass may add b (a layer that makes z its own way: False)

    def __init__(self, weights, biases, grad_weights, grad_biases, activation: str = "sigmoid"):
        self.weights, self.biases = weights, biases
        self.grad_weights, self.grad_biases = grad_weights, grad_biases
        self.activation = activation
        self.xp = array_namespace(weights)

    @property
    def shape(self) -> tuple[int, int]:
        """(n_in, n_out) of this layer's W (on this rank, for a split layer)."""
        return tuple(self.weights.shape)

    def logits(self, inputs):
        """z = a_in @ W + b (N, n_out), from the inputs a_in (N, n_in)."""
        logits = inputs @ self.weights
        logits += self.biases
        return logits

    def forward(self, inputs):
        """(z, a): the logits and the activation f(z), both (N, n_out), for inputs a_in (N, n_in). A sigmoid layer
        adds its bias in the activation's pass (bias_sigmoid: one kernel on a GPU) unless it makes z its own way.
        """
        if self.activation == "sigmoid" and self.plain_logits:
            logits = inputs @ self.weights
            return logits, fused(bias_sigmoid, self.xp)(logits, self.biases)
        logits = self.logits(inputs)
        if self.activation == "softmax":
            return logits, softmax(logits, self.xp)
        return logits, fused(sigmoid, self.xp)(logits)

    def weight_gradient(self, inputs, delta, accumulate: bool = False) -> None:
        """Write dJ/dW = a_in.T @ delta and dJ/db = sum of delta into the gradient views, or with ``accumulate`` add
        them (a later chunk of a large batch, or micro-batch of a pipeline); a_in (N, n_in), delta = dJ/dz (N, n_out).
        """
        # dJ/db = sum over samples of delta, written as the product 1^T delta with a vector of ones (N,):
        # BLAS does it faster than sum(delta, axis=0) (tests/test_network.py checks that the two agree)
        ones = constant_vector("ones", delta.shape[0], self.xp, delta.dtype)
        if accumulate:
            self.grad_weights += inputs.T @ delta                         # (n_in, n_out)
            self.grad_biases += ones @ delta                              # (n_out,)
        else:
            product_into(inputs.T, delta, self.grad_weights)              # grad_weights = inputs.T @ delta
            product_into(ones, delta, self.grad_biases)                   # grad_biases = 1^T delta

    def input_gradient(self, delta):
        """dJ/da_in = delta @ W.T (N, n_in), from delta = dJ/dz (N, n_out)."""
        return delta @ self.weights.T

    def logits_gradient(self, activation_gradient, activation):
        """dJ/dz = dJ/da * a (1 - a) (N, n_out), in place, with a = sigmoid(z) this layer's output: hidden layers only
        (a softmax output layer's delta comes with the loss, output_loss)."""
        fused(sigmoid_backward, self.xp)(activation_gradient, activation)
        return activation_gradient


def dense_layers(params, grads, shapes, output: str = "sigmoid", xp=np) -> list[Layer]:
    """Layers over flat vectors ``params`` and ``grads`` laid out [W_1, b_1, W_2, b_2, ...], for ``shapes``
    [(n_in, n_out)] per layer: sigmoid, and ``output`` for the last."""
    weights, biases = layer_views(params, shapes, xp)
    grad_weights, grad_biases = layer_views(grads, shapes, xp)
    activations = ["sigmoid"] * (len(shapes) - 1) + [output]
    return [Layer(*views) for views in zip(weights, biases, grad_weights, grad_biases, activations)]


def forward_layers(layers, inputs):
    """Through ``layers`` in order: ([a_0 = inputs, a_1, ..., a_L], z_L, the last layer's logits)."""
    activations = [inputs]
    logits = None
    for layer in layers:
        logits, activation = layer.forward(activations[-1])
        activations.append(activation)
    return activations, logits


def backward_layers(layers, activations, delta, accumulate: bool, on_layer_done=None, input_gradient: bool = False):
    """Backpropagation through ``layers``, last to first: each writes (or adds) its gradient in its views.

    activations: [a_0, ..., a_L] of forward_layers; delta: dJ/dz_L (N, n_L) of the last layer.
    Going down, delta_{l-1} = (delta_l @ W_l.T) * a_{l-1} (1 - a_{l-1}).
    ``on_layer_done(index)`` is called as soon as layer ``index``'s gradient is final (L-1 down to 0).
    Returns dJ/da_0 = delta_1 @ W_1.T (N, n_0) if ``input_gradient`` (a pipeline stage sends it to
    the stage before), else None (nobody needs the gradient of the network's inputs).
    """
    for index in range(len(layers) - 1, -1, -1):
        layer = layers[index]
        layer.weight_gradient(activations[index], delta, accumulate)
        if on_layer_done is not None:
            on_layer_done(index)
        if index > 0:
            delta = layers[index - 1].logits_gradient(layer.input_gradient(delta), activations[index])
        elif input_gradient:
            return layer.input_gradient(delta)
    return None


class Classifier:
    """What every classifier of nnlib shares: checking its inputs and labels, predicting classes. Needs
    ``layer_sizes`` (n_0, ..., n_L), ``xp`` (its arrays' namespace) and ``predict_probabilities(inputs)``: a_L (N, n_L).
    """

    def check_inputs(self, inputs):
        """Raise ValueError unless inputs is a non-empty (N, n_0) array."""
        shape = getattr(inputs, "shape", None)
        if shape is None or len(shape) != 2:
            raise ValueError(f"inputs must be a 2-D array (samples, {self.layer_sizes[0]}); got shape {shape}")
        if shape[0] == 0:
            raise ValueError("inputs is an empty batch (0 samples); pass at least one sample")
        if shape[1] != self.layer_sizes[0]:
            raise ValueError(
                f"inputs have {shape[1]} features but the network expects {self.layer_sizes[0]}: "
                f"reshape images to (samples, {self.layer_sizes[0]}) (see nnlib.lesson01_mnist.data.scale_pixels) "
                "or build the network with a matching first layer size"
            )

    def check_labels(self, labels, num_samples: int):
        """Raise ValueError unless labels are num_samples integers in 0..n_L-1."""
        shape = getattr(labels, "shape", None)
        if shape is None or len(shape) != 1:
            raise ValueError(f"labels must be a 1-D array of class numbers; got shape {shape}")
        if shape[0] != num_samples:
            raise ValueError(f"{num_samples} samples but {shape[0]} labels; they must match")
        if not self.xp.isdtype(labels.dtype, "integral"):
            raise ValueError(f"labels must be integers (class numbers); got dtype {labels.dtype}")
        low, high = int(self.xp.min(labels)), int(self.xp.max(labels))
        if low < 0 or high >= self.layer_sizes[-1]:
            raise ValueError(
                f"labels must lie in 0..{self.layer_sizes[-1] - 1}; got values from {low} to {high}"
            )

    def fused(self, function):
        """``function`` as one kernel on this network's device (arrays.fused, for the trainer: it imports no arrays)."""
        return fused(function, self.xp)

    def predict(self, inputs):
        """The most likely class for each sample: (N,) integers."""
        return self.xp.argmax(self.predict_probabilities(inputs), axis=1)

    def accuracy(self, inputs, labels) -> float:
        """The fraction of samples whose predicted class equals the label."""
        inputs, labels = self.xp.asarray(inputs), self.xp.asarray(labels)
        self.check_labels(labels, inputs.shape[0])
        return int(self.xp.count_nonzero(self.predict(inputs) == labels)) / inputs.shape[0]


class LayerStack(Classifier):
    """A network as a list of layers over one flat parameter vector, trained a batch at a time. The trainer
    uses: params and grads (flat), loss_and_gradient, last_correct, and the evaluation methods.
    """

    precision = None  # every array in dtype (lesson 17's mixed precision: "float16" or "bfloat16" copies too)

    def __init__(self, layer_sizes, output: str, layers, params, grads, xp=None):
        self.layer_sizes, self.output, self.layers = tuple(layer_sizes), output, list(layers)
        self.params, self.grads = params, grads
        self.xp, self.dtype = xp or array_namespace(params), params.dtype
        self.shapes = list(zip(self.layer_sizes[:-1], self.layer_sizes[1:]))  # the whole network's
        self.num_params, self.num_layers = int(params.shape[0]), len(self.layers)  # params held here
        self.weights, self.biases = [layer.weights for layer in self.layers], [layer.biases for layer in self.layers]
        self.grad_weights = [layer.grad_weights for layer in self.layers]
        self.grad_biases = [layer.grad_biases for layer in self.layers]
        # Rows per piece of a large batch on the CPU (larger pieces measured slower: benchmarks/RESULTS.md,
        # "chunk size"); a GPU takes the whole batch at once (None).
        self.chunk_size = 1024 if is_numpy(self.xp) else None
        self.last_correct, self.output_logits = 0, None

    def chunks(self, num_samples: int):
        """(start, end) row ranges of at most ``chunk_size`` rows covering 0..num_samples (one if None)."""
        if self.chunk_size is None:
            return [(0, num_samples)]
        return [(start, min(start + self.chunk_size, num_samples)) for start in range(0, num_samples, self.chunk_size)]

    # -- forward and backward -------------------------------------------------

    def forward(self, inputs):
        """[a_0 = inputs, a_1, ..., a_L] for inputs (N, n_0); the output logits z_L go to ``self.output_logits``."""
        activations, self.output_logits = forward_layers(self.layers, inputs)
        return activations

    def loss_and_gradient(self, inputs, labels, normalizer=None, check: bool = True, on_device: bool = False,
                          on_layer_done=None):
        """Cost J of a batch, inputs (N, n_0) and labels (N,) integers, summed over samples / ``normalizer`` (default
        N: a rank holding a shard of a bigger batch passes the global batch size, so that the ranks' gradients add up
        to exactly the full-batch gradient); its gradient goes into ``self.grads``, the count into ``last_correct``.
        On the CPU the batch goes in chunks of ``chunk_size`` rows (a sum over samples splits into sums over chunks;
        a chunk's arrays stay in the cache). With ``on_device`` the loss and count stay 0-d arrays on the device (no
        wait for a GPU); ``on_layer_done(layer)`` as in :func:`backward_layers`.
        """
        if check:
            self.check_inputs(inputs)
            self.check_labels(labels, inputs.shape[0])
        scale = 1.0 / (inputs.shape[0] if normalizer is None else normalizer)
        loss, self.last_correct = None, 0
        chunks = self.chunks(inputs.shape[0]) or [(0, 0)]  # no rows: one empty chunk, whose gradient is 0
        for start, end in chunks:
            activations = self.forward(inputs[start:end, ...])
            chunk_loss, correct, delta = output_loss(self.output_logits, activations[-1], labels[start:end], scale,
                                                     self.output)
            self.last_correct = self.last_correct + correct if start > 0 else correct
            backward_layers(self.layers, activations, delta, start > 0, on_layer_done if end == chunks[-1][1] else None)
            loss = chunk_loss if loss is None else loss + chunk_loss  # (one chunk: no addition, no GPU kernel)
        if on_device:
            return loss
        self.last_correct = int(self.last_correct)
        return float(loss)

    # -- state --------------------------------------------------------------

    def state_dict(self) -> dict:
        """What training changes here, whole and on the host: {"params": a copy of the flat vector (num_params,)}."""
        return {"params": to_numpy(self.params).copy()}

    def load_state_dict(self, state: dict) -> None:
        """Take ``state`` (as :meth:`state_dict` gives it) into the parameters, in place (the layers' views stay)."""
        self.params[...] = self.xp.asarray(state["params"], dtype=self.dtype)

    # -- evaluation -----------------------------------------------------------

    def predict_probabilities(self, inputs):
        """Output activations a_L (N, n_L), chunk by chunk. Like predict, loss and accuracy, it takes host (NumPy)
        arrays on any device and moves them there (no copy when they are there already)."""
        inputs = self.xp.asarray(inputs)
        self.check_inputs(inputs)
        chunks = [self.forward(inputs[start:end, ...])[-1] for start, end in self.chunks(inputs.shape[0])]
        return self.xp.concat(chunks, axis=0)

    def loss(self, inputs, labels) -> float:
        """The mean cross-entropy J over the samples (no gradient)."""
        inputs, labels = self.xp.asarray(inputs), self.xp.asarray(labels)
        self.check_inputs(inputs)
        self.check_labels(labels, inputs.shape[0])
        total, classes = 0.0, constant_vector("classes", self.layer_sizes[-1], self.xp)
        for start, end in self.chunks(inputs.shape[0]):
            self.forward(inputs[start:end, ...])
            targets = one_hot(labels[start:end, None], classes, self.dtype)
            total += float(cross_entropy_from_logits(self.output_logits, targets, self.output, self.xp))
        return total / inputs.shape[0]


class Network(LayerStack):
    """A fully connected network: sigmoid hidden layers, sigmoid or softmax outputs.

    layer_sizes: e.g. (784, 128, 10): inputs, hidden layers, outputs.
    output:      "sigmoid" (cross-entropy over independent outputs) or "softmax".
    dtype:       "float32" (default) or "float64".
    seed:        initial weights are uniform in +-sqrt(6 / (n_in + n_out)) (Glorot),
                 drawn on the CPU from numpy.random.default_rng(seed); biases start at 0.
    device:      "cpu", or an array API namespace (numpy, cupy: nnlib.lesson08_gpu.backend.resolve_backend("gpu"),
                 array_api_strict for tests); the weights are drawn on the CPU and then moved, so
                 every device starts from the same weights.
    """

    def __init__(self, layer_sizes=(784, 30, 10), output: str = "sigmoid", dtype="float32",
                 seed: int = 0, device: str = "cpu"):
        layer_sizes = tuple(int(size) for size in layer_sizes)
        if len(layer_sizes) < 2 or min(layer_sizes) < 1:
            raise ValueError(f"layer_sizes needs at least two positive sizes (inputs, outputs); got {layer_sizes}")
        if output not in ("sigmoid", "softmax"):
            raise ValueError(f"output must be 'sigmoid' or 'softmax'; got {output!r}")
        if str(np.dtype(dtype)) not in ("float32", "float64"):
            raise ValueError(f"dtype must be float32 or float64; got {dtype}")
        xp = namespace_of_device(device)
        shapes = list(zip(layer_sizes[:-1], layer_sizes[1:]))
        params = xp.asarray(np.concatenate(list(initial_layers(shapes, seed))), dtype=getattr(xp, str(np.dtype(dtype))))
        grads = xp.zeros_like(params)
        super().__init__(layer_sizes, output, dense_layers(params, grads, shapes, output, xp), params, grads, xp)

    # -- copying --------------------------------------------------------------

    def set_params(self, flat) -> None:
        """Overwrite the parameters (in place, so the layer views stay valid)."""
        if tuple(flat.shape) != (self.num_params,):
            raise ValueError(f"expected a flat vector of {self.num_params} parameters; got shape {tuple(flat.shape)}")
        self.params[...] = self.xp.asarray(flat, dtype=self.dtype)

    def __repr__(self) -> str:
        sizes = "-".join(map(str, self.layer_sizes))
        return f"Network({sizes}, output={self.output}, dtype={self.params.dtype}, params={self.num_params})"


def count_parameters(layer_sizes) -> int:
    """Weights and biases of a network with these layer sizes: sum over layers of n_in n_out + n_out."""
    return parameter_offsets(list(zip(layer_sizes[:-1], layer_sizes[1:])))[-1]


def parameter_offsets(shapes) -> list[int]:
    """Where each layer's [W_l, b_l] begins in the flat vector, then the total: [0, ..., num_params], for
    ``shapes`` [(n_in, n_out)] per layer. Layers l..m are flat[offsets[l]:offsets[m + 1]]."""
    return np.cumsum([0] + [n_in * n_out + n_out for n_in, n_out in shapes]).tolist()


def layer_views(flat, shapes, xp=np):
    """Per-layer views into ``flat``, laid out [W_1, b_1, W_2, b_2, ...]: ([W_l], [b_l]), W_l (rows, columns) and b_l
    (columns,) for ``shapes`` [(rows, columns)]."""
    weights, biases = [], []
    for (rows, columns), offset in zip(shapes, parameter_offsets(shapes)):
        weights.append(xp.reshape(flat[offset:offset + rows * columns], (rows, columns)))
        biases.append(flat[offset + rows * columns:offset + rows * columns + columns])
    return weights, biases


def initial_layers(shapes, seed: int):
    """Each layer's flat float64 starting [W_l, b_l] in turn (W_l uniform in +-sqrt(6 / (n_in + n_out)), b_l = 0), from
    one default_rng(seed): one layer at a time in memory (lesson 16's sharded network keeps a slice of each)."""
    rng = np.random.default_rng(seed)
    for n_in, n_out in shapes:
        limit = math.sqrt(6.0 / (n_in + n_out))
        yield np.concatenate([rng.uniform(-limit, limit, size=n_in * n_out), np.zeros(n_out)])
