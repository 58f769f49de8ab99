"""Lesson 14's exercise (notebook 14_asynchronous_sgd): the staleness of each update of a fully asynchronous
parameter server, from the order in which its workers' gradients arrived.
"""

import numpy as np

from nnlib.exercises import Exercise, case_generator

LESSON = 14


def staleness_of_updates(workers):
    """A fully asynchronous server applies each gradient as it arrives and at once sends that worker the new
    parameters; every worker starts from the first parameters (version 0). workers (updates,): the worker of
    each update, in the order applied -> the staleness of each update (updates,): the updates applied
    between the parameters its gradient was computed from and it."""
    version_sent = {}  # the version of the parameters each worker last received
    staleness = []
    for version, worker in enumerate(workers):  # update number `version` finds `version` updates applied
        staleness.append(version - version_sent.get(worker, 0))
        version_sent[worker] = version + 1  # its answer: the parameters after this update
    return np.array(staleness, dtype=np.int64)


def staleness_cases():
    """A worker's first update, a worker alone, and random orders of 2 and 3 workers (one of them slow)."""
    generator = case_generator("14.1")
    return [(np.array([1, 2, 1, 1, 2]),), (np.array([1, 1, 1]),),
            (generator.choice([1, 2], size=12),), (generator.choice([1, 2, 3], size=20, p=[0.1, 0.45, 0.45]),)]


EXERCISES = [
    Exercise("14.1", staleness_of_updates, staleness_cases,
             "a worker's gradient was computed from the parameters it last received: remember, for each worker, "
             "how many updates had been applied when it received them (0 before its first answer)."),
]
