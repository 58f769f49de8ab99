"""Lesson 02 (notebooks/02_network_from_scratch.ipynb): a sigmoid network and backpropagation, checked.

    arrays          which array library the math runs on (NumPy; CuPy from lesson 08), through the array API
    network         Layer (forward, backward) and Network, every parameter in one flat vector
    loss            the output layer: cross-entropy, the count of right answers, delta_L
    gradient_check  backpropagation against a numerical gradient, as a relative error
"""

LESSON = 2
