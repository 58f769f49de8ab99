"""Lesson 05's exercises (notebook 05_messages): the alpha-beta model, and how far each rank gets when every Send
waits for its Recv (a deadlock finder)."""

import numpy as np

from nnlib.exercises import Exercise

LESSON = 5


def alpha_beta_time(n_bytes, alpha, beta):
    """The alpha-beta model's time to send messages of n_bytes (an array), alpha seconds of
    latency plus beta seconds per byte."""
    return alpha + beta * n_bytes


def calls_completed(programs):
    """How far each rank gets if every Send waits for its Recv. programs[r] lists rank r's
    blocking calls in order, each "send p" or "recv p" (p: the other rank). A send from a to b
    and a recv by b from a complete together, once each is the next call of its rank.
    -> (P,) integers: the calls each rank completes before no rank can go on."""
    done = [0] * len(programs)
    progress = True
    while progress:  # until a whole sweep over the ranks completes nothing
        progress = False
        for sender, calls in enumerate(programs):
            if done[sender] < len(calls) and calls[done[sender]].startswith("send"):
                receiver = int(calls[done[sender]].split()[1])
                waiting = programs[receiver][done[receiver]] if done[receiver] < len(programs[receiver]) else None
                if waiting == f"recv {sender}":  # the matching Recv is the receiver's next call
                    done[sender] += 1
                    done[receiver] += 1
                    progress = True
    return np.array(done)


def ring_programs(ranks, even_first):
    """A ring pass's calls: send to the right, receive from the left; with even_first, odd ranks receive first."""
    programs = []
    for rank in range(ranks):
        send, receive = f"send {(rank + 1) % ranks}", f"recv {(rank - 1) % ranks}"
        programs.append([receive, send] if even_first and rank % 2 else [send, receive])
    return programs


EXERCISES = [
    Exercise("05.1", alpha_beta_time,
             lambda: [(np.array([8.0, 1e3, 1e6]), 2e-6, 1e-9), (np.array([0.0]), 1e-5, 5e-10)],
             "a start-up cost paid once per message, plus a cost per byte."),
    Exercise("05.2", calls_completed,
             lambda: [([["send 1", "recv 1"], ["send 0", "recv 0"]],),  # both send first: a deadlock
                      ([["send 1", "recv 1"], ["recv 0", "send 0"]],),  # by parity
                      ([["send 1", "send 1"], ["recv 0", "recv 0"]],),  # two messages, in order
                      ([["send 1", "send 2"], ["recv 0", "recv 2"], ["recv 1"]],)]  # rank 2 waits for rank 1 only
             + [(ring_programs(ranks, even_first),) for ranks in (3, 4) for even_first in (False, True)],
             "repeat until nothing changes: a rank's next call 'send b' completes, with b's, only when b's next "
             "call is 'recv' from that rank."),
]
