"""Lesson 11 (notebooks/11_beyond_synchronous_sgd.ipynb): fewer bytes, and no waiting.

    compression   float16, bfloat16 and top-k (with error feedback) gradients
    asynchronous  a parameter server applying each worker's gradient as it arrives
"""

LESSON = 11
