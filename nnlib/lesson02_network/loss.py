"""The output layer: the loss, the count of right answers, and delta_L, where backpropagation starts.

For a batch of N samples with logits z_L and outputs a_L (N, K), labels y (N,) and their one-hot Y (N, K):

    sigmoid outputs: J = sum_n sum_k [ softplus(z) - y z ]          (= -[y log a + (1-y) log(1-a)])
    softmax outputs: J = sum_n [ logsumexp(z_n) - sum_k y_k z_k ]    (= -sum_k y log a)
    delta_L = dJ/dz_L = (a_L - Y) * scale                            (both outputs)

(nnlib.lesson02_network.network has the whole network.) On a GPU the loss of sigmoid outputs, the count and
delta_L are one fused kernel each (nnlib.lesson02_network.arrays.fused); NumPy runs the same lines as written.
"""

from __future__ import annotations

from nnlib.lesson02_network.arrays import array_namespace, as_type, constant_vector, fused

LESSON = 2


def softplus(z, xp):
    """log(1 + exp(z)), computed without overflow as max(z, 0) + log1p(exp(-|z|))."""
    return xp.maximum(z, 0) + xp.log1p(xp.exp(-xp.abs(z)))


def cross_entropy_from_logits(logits, targets, output: str, xp):
    """Summed cross-entropy J over the batch (the module docstring's forms), from the output layer's logits
    z_L (N, K) and targets Y (N, K). Both forms stay finite where a rounds to 0 or 1. Returns a 0-d array.
    """
    if output == "sigmoid":
        return xp.sum(softplus(logits, xp) - targets * logits)
    row_max = xp.max(logits, axis=1, keepdims=True)
    log_sum_exp = xp.log(xp.sum(xp.exp(logits - row_max), axis=1)) + row_max[:, 0]
    return xp.sum(log_sum_exp) - xp.sum(targets * logits)


def one_hot(labels_column, classes, dtype):
    """Y (N, K) of ``dtype``: Y[n, k] = 1 where label n (labels_column (N, 1)) is k (classes = 0..K-1), else 0."""
    return as_type(labels_column == classes, dtype)


def sigmoid_cross_entropy(logits, labels_column, classes, scale):
    """J * scale = sum over n, k of [softplus(z) - y z] * scale (0-d), from the logits z_L (N, K).

    The GPU's one-kernel form of cross_entropy_from_logits(z, Y, "sigmoid") * scale, which the CPU runs:
    each term is scaled before the sum, as a fused kernel cannot apply a parameter after its reduction;
    the two agree within rounding."""
    xp = array_namespace(logits)
    return xp.sum((softplus(logits, xp) - one_hot(labels_column, classes, logits.dtype) * logits) * scale)


def count_equal(predicted, labels):
    """How many of ``predicted`` (N,) equal ``labels`` (N,): a 0-d integer array."""
    xp = array_namespace(predicted, labels)
    return xp.sum(as_type(predicted == labels, xp.int64))


def output_delta(outputs, labels_column, classes, scale):
    """delta_L = dJ/dz_L = (a_L - Y) * scale (N, K), for sigmoid and softmax outputs alike."""
    return (outputs - one_hot(labels_column, classes, outputs.dtype)) * scale


def output_loss(logits, outputs, labels, scale: float, output: str):
    """Where backpropagation starts, for one batch: (J * scale, how many argmax(a_L) equal the label, delta_L).

    logits z_L and outputs a_L (N, n_L) of the output layer, labels (N,) integers, ``output`` "sigmoid" or
    "softmax", ``scale`` = 1 / normalizer. The loss and count are 0-d arrays where the arrays live.
    """
    xp = array_namespace(outputs)
    labels_column, classes = labels[:, None], constant_vector("classes", outputs.shape[1], xp)
    if output == "sigmoid" and fused(sigmoid_cross_entropy, xp) is not sigmoid_cross_entropy:  # a GPU: one kernel
        loss = fused(sigmoid_cross_entropy, xp)(logits, labels_column, classes, scale)
    else:
        loss = cross_entropy_from_logits(logits, one_hot(labels_column, classes, logits.dtype), output, xp) * scale
    correct = fused(count_equal, xp)(xp.argmax(outputs, axis=1), labels)
    return loss, correct, fused(output_delta, xp)(outputs, labels_column, classes, scale)
