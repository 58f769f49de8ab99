"""Lesson 10 (notebooks/10_zero_and_overlap.ipynb): ZeRO stages 1 and 2 (zero), gradients sent by layer buckets
while backpropagation goes on (overlap) and on a link that takes wall time (simulated_link), how the ranks pick
their samples (sampling), a step's waiting and transfer (waiting), and the pictures (diagrams).
"""

LESSON = 10
