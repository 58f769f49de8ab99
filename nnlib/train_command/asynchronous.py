"""The asynchronous job (lesson 11): a parameter server on rank 0 applying each worker's gradient as it arrives."""

from __future__ import annotations

import numpy as np

from nnlib.train_command.options import parse_slow
from nnlib.train_command.reports import save_npz, save_trace

LESSON = 13


def asynchronous_job(args, comm, settings, data, test) -> int:
    """--asynchronous: nnlib.lesson11_beyond_sync.asynchronous's parameter server on rank 0; every rank gets the data
    from rank 0."""
    from nnlib.lesson02_network.network import Network
    from nnlib.lesson04_collectives.collectives import broadcast_new
    from nnlib.lesson11_beyond_sync.asynchronous import train_async
    from nnlib.train_command.data_parallel import job_device

    inputs, labels = broadcast_new(comm, data[0]), broadcast_new(comm, data[1])
    xp, gpus = job_device(args, comm)
    network = Network((784, *args.hidden, 10), output=args.output_layer, dtype=args.dtype, seed=args.seed, device=xp)
    bound = "unbounded" if args.staleness is None else f"at most {args.staleness} steps ahead"
    if comm.rank == 0:
        print(f"{comm.size} ranks: a parameter server and {comm.size - 1} workers (staleness {bound}), network "
              f"{'-'.join(map(str, network.layer_sizes))}, {args.samples} samples, global batch {args.batch_size}"
              + ("; plain SGD, --momentum is not used" if args.momentum else "")
              + (f"; GPU of each rank: {gpus}" if gpus[0] is not None else ""), flush=True)
    history = train_async(comm, network, inputs, labels, settings, staleness=args.staleness, slow=parse_slow(args.slow))
    if comm.rank == 0:
        report_asynchronous(args, comm.size, history, network, test)
        if args.trace:
            from nnlib.course.trace import update_instants
            save_trace(args.trace, [], update_instants(history.worker, history.seconds))
    return 0


def report_asynchronous(args, ranks: int, history, network, test) -> None:
    """On rank 0: every epoch's loss and accuracy, the test accuracy, the staleness; write --output if given."""
    for epoch, (loss, accuracy, seconds) in enumerate(zip(history.loss, history.train_accuracy,
                                                          history.epoch_seconds)):
        print(f"epoch {epoch + 1}/{args.epochs}: loss {loss:.4f}, training accuracy {accuracy:.4f}, "
              f"{seconds:.2f} s from the start")
    staleness = np.array(history.staleness)
    test_accuracy = network.accuracy(*test)
    print(f"test accuracy {test_accuracy:.4f}; staleness: mean {staleness.mean():.2f}, largest {staleness.max()} "
          f"updates; updates per worker: {np.bincount(history.worker, minlength=ranks)[1:].tolist()}")
    if args.output:
        save_npz(args.output, params=network.get_params(), layer_sizes=np.array(network.layer_sizes),
                 loss=np.array(history.loss), train_accuracy=np.array(history.train_accuracy),
                 epoch_seconds=np.array(history.epoch_seconds), staleness=staleness, worker=np.array(history.worker),
                 update_seconds=np.array(history.seconds), test_accuracy=np.array(test_accuracy),
                 epoch_params=np.array(history.params), largest_lead=np.array(history.largest_lead),
                 ranks=np.array(ranks), strategy=np.array("asynchronous"))
        print(f"wrote {args.output}")
