"""nnlib: a sigmoid MNIST network from scratch, trained sequentially, with MPI, and on the GPU."""

from .data import MNISTError, load_mnist, one_hot, scale_pixels
from .network import Network
from .gradient_check import gradient_check, numerical_gradient, relative_error
from .training import SGD, History, train

LESSON = 3  # the package's face: lessons 01-03


__version__ = "0.1.0"

__all__ = [
    "MNISTError", "load_mnist", "one_hot", "scale_pixels", "Network",
    "gradient_check", "numerical_gradient", "relative_error", "SGD", "History", "train",
]
