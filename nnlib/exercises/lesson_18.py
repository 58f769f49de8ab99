"""Lesson 18's exercises (notebook 18_pipeline_schedules): the interleaved schedule's bubble, ZB-H1's
order of work on one stage, and 1F1B's full instruction list of one stage, its messages included.
"""

import numpy as np

from nnlib.exercises import Exercise

LESSON = 18


def interleaved_bubble(stages, micro_batches, chunks):
    """The idle fraction of an interleaved 1F1B step with P equal stages, m micro-batches and v chunks per
    stage: the fill and drain of (P - 1) chunk-steps, each 1/v of a stage's work, beside m whole ones."""
    return (stages - 1) / (chunks * micro_batches + stages - 1)


def zb_h1_order(stages, stage, micro_batches):
    """ZB-H1's order of work on stage s of P, for m micro-batches: (kinds, micro) two int arrays (3m,),
    kind 0 = F (forward), 1 = B (input gradient), 2 = W (weight gradient). The stage runs P - s - 1
    forwards; then for k = 0 .. m-1: the next forward (if one is left), B of k, and the oldest waiting W
    once more than s W's wait; then the W's still waiting, oldest first."""
    ahead = min(stages - stage - 1, micro_batches)
    order, waiting = [(0, k) for k in range(ahead)], []
    for k in range(micro_batches):
        order += [(0, ahead + k)] if ahead + k < micro_batches else []
        order.append((1, k))
        waiting.append(k)
        if len(waiting) > stage:
            order.append((2, waiting.pop(0)))
    order += [(2, k) for k in waiting]
    kinds, micro = np.array(order).T
    return kinds, micro


def one_f_one_b_program(stages, stage, micro_batches):
    """1F1B's instruction list of stage s of P, for m micro-batches, messages included: (kinds, micro) two
    int arrays, kind 0 = recv_forward, 1 = forward, 2 = send_forward, 3 = recv_backward, 4 = backward,
    5 = send_backward. The stage's work: w = min(P - s - 1, m) forwards, then forward w + k and backward k
    for k = 0 .. m-w-1, then the last w backwards. Each forward is received before (not on the first
    stage) and sent on after (not on the last); each backward's gradient received before (not on the
    last stage) and sent back after (not on the first)."""
    first, last = stage == 0, stage == stages - 1
    warmup = min(stages - stage - 1, micro_batches)
    work = [(1, k) for k in range(warmup)]
    for k in range(micro_batches - warmup):
        work += [(1, warmup + k), (4, k)]
    work += [(4, k) for k in range(micro_batches - warmup, micro_batches)]
    program = []
    for kind, k in work:
        if kind == 1:
            program += ([] if first else [(0, k)]) + [(1, k)] + ([] if last else [(2, k)])
        else:
            program += ([] if last else [(3, k)]) + [(4, k)] + ([] if first else [(5, k)])
    kinds, micro = np.array(program).T
    return kinds, micro


def interleaved_cases():
    return [(2, 8, 2), (4, 8, 2), (4, 12, 3), (3, 5, 4), (1, 7, 2)]


def zb_h1_cases():
    return [(2, 0, 4), (2, 1, 4), (4, 0, 8), (4, 2, 8), (4, 3, 5), (3, 1, 2)]


def one_f_one_b_cases():
    """Every stage of P = 3 with m = 5 and of P = 4 with m = 2 and 3 (m < P), and one stage alone."""
    return [(3, stage, 5) for stage in range(3)] + [(4, stage, 3) for stage in range(4)] + [(4, 1, 2), (1, 0, 3)]


EXERCISES = [
    Exercise("18.1", interleaved_bubble, interleaved_cases,
             "1F1B idles (P - 1)/(m + P - 1) of a step; with v chunks each fill and drain step is 1/v as long, "
             "so count the work in chunk-steps: v m of them, beside the P - 1 idle ones."),
    Exercise("18.2", zb_h1_order, zb_h1_cases,
             "keep a list of the micro-batches whose W waits; after each B, append to it, and run the oldest "
             "W when the list holds more than s; the warm-up is 1F1B's (P - s - 1 forwards)."),
    Exercise("18.3", one_f_one_b_program, one_f_one_b_cases,
             "the first backward (4) comes after min(P - s - 1, m) forwards (1): not after all m (GPipe's "
             "order), nor after P - s. A receive (0, 3) comes just before its computation, a send (2, 5) just "
             "after it; stage 0 receives no forward, the last stage no gradient."),
]
