"""Lesson 08 (notebooks/08_gpu.ipynb): the same lines on the GPU with CuPy.

    backend  NumPy or CuPy; HostStaging, a communicator that stages GPU buffers through the host
    gpu      matrix products and training timed on the CPU and the GPU
"""

LESSON = 8
