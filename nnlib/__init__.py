"""nnlib: a sigmoid MNIST network from scratch, trained sequentially, with MPI, and on the GPU."""

from nnlib.course.environment import keep_freed_memory
from nnlib.lesson01_mnist.data import MNISTError, load_mnist, one_hot, scale_pixels
from nnlib.lesson02_network.gradient_check import gradient_check, numerical_gradient, relative_error
from nnlib.lesson02_network.network import Network
from nnlib.lesson03_training.optimizers import SGD
from nnlib.lesson03_training.training import History, train

LESSON = 3  # the package's face: lessons 01-03

# Every process that uses nnlib (a notebook's kernel, each MPI rank, a batch job) reuses the memory its
# training steps free instead of faulting fresh pages in at every step (see keep_freed_memory).
keep_freed_memory()


__version__ = "0.1.0"

__all__ = [
    "MNISTError", "load_mnist", "one_hot", "scale_pixels", "Network",
    "gradient_check", "numerical_gradient", "relative_error", "SGD", "History", "train",
]
