"""Lesson 14 (notebooks/14_asynchronous_sgd.ipynb): fewer bytes, and no waiting.

    compression   float16, bfloat16 and top-k (with error feedback) gradients; counting the bytes sent
    asynchronous  a parameter server applying each worker's gradient as it arrives
    powersgd      each weight gradient as a low-rank approximation, two dense Allreduces per step
    local_sgd     local SGD and DiLoCo: H steps alone, then one Allreduce of the parameter changes
"""

LESSON = 14
