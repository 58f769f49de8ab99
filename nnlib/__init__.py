"""nnlib: a sigmoid MNIST network from scratch, trained sequentially, with MPI, and on the GPU."""

from nnlib.lesson01_mnist.data import MNISTError, load_mnist, one_hot, scale_pixels
from nnlib.lesson02_network.gradient_check import gradient_check, numerical_gradient, relative_error
from nnlib.lesson02_network.network import Network
from nnlib.lesson03_training.training import SGD, History, train

LESSON = 3  # the package's face: lessons 01-03


__version__ = "0.1.0"

__all__ = [
    "MNISTError", "load_mnist", "one_hot", "scale_pixels", "Network",
    "gradient_check", "numerical_gradient", "relative_error", "SGD", "History", "train",
]
