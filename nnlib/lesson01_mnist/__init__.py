"""Lesson 01 (notebooks/01_mnist.ipynb): the MNIST digits, loaded, checked and looked at.

    data   load_mnist: find, download, verify (SHA-256) and parse MNIST; scale_pixels, one_hot
    files  atomic_write: a file is written whole or not at all
    plots  the digits, learning curves, confusion matrices and weights drawn (lessons 01 and 03)
"""

LESSON = 1
