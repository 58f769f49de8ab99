"""Lesson 07 (notebooks/07_gpu.ipynb): the same lines on the GPU with CuPy.

    backend  NumPy or CuPy; HostStaging, a communicator that stages GPU buffers through the host
    gpu      matrix products and training timed on the CPU and the GPU
"""

LESSON = 7
