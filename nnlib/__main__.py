"""Command line: ``python -m nnlib <command>``, e.g. ``mpiexec -n 4 python -m nnlib train ...``; ``python -m nnlib
--help`` lists the commands, and each command's ``--help`` its options."""

from __future__ import annotations

import argparse
import importlib
import sys

LESSON = 19  # the command line: every lesson's commands

#: The commands with options of their own: the module whose main(argv) runs each, and what it does.
OWN_OPTIONS = {"scaling": ("nnlib.lesson07_scaling.scaling", "strong and weak scaling tables (its own mpiexec jobs)"),
               "allreduce-timing": ("nnlib.lesson09_ring_allreduce.allreduce_timing",
                                    "time MPI's Allreduce against the hand-built ones, under mpiexec"),
               "gpu-benchmark": ("nnlib.lesson08_gpu.gpu", "record CPU-versus-GPU figures")}


def fetch_data(args) -> int:
    from nnlib.lesson01_mnist.data import SHA256, MNISTError, candidate_dirs, fetch_mnist, find_file

    try:
        fetch_mnist(args.dir, progress=not args.quiet)
    except MNISTError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    where = find_file(next(iter(SHA256)), candidate_dirs(args.dir)).parent
    print(f"MNIST: all {len(SHA256)} files present and verified (SHA-256) in {where}")
    return 0


def run_collectives(args) -> int:
    from nnlib.lesson04_collectives.collectives_demo import main as demo

    demo()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m nnlib", description="nnlib command line")
    commands = parser.add_subparsers(dest="command", required=True)
    fetch = commands.add_parser("fetch-data", help="download (if needed) and verify MNIST")
    fetch.add_argument("--dir", default=None,
                       help="folder to look in first and download into (default: $NNLIB_DATA, then the user cache)")
    fetch.add_argument("--quiet", action="store_true", help="no download progress bar")
    fetch.set_defaults(handler=fetch_data)
    demo = commands.add_parser("collectives", help="run notebook 04's collectives (under mpiexec -n N)")
    demo.set_defaults(handler=run_collectives)
    from nnlib.train_command import add_arguments, run

    training = commands.add_parser("train", help="data-parallel MNIST training (run under mpiexec -n N)")
    add_arguments(training)
    training.set_defaults(handler=run)
    for name, (_, does) in OWN_OPTIONS.items():
        commands.add_parser(name, help=f"{does}; see: python -m nnlib {name} --help")
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] and argv[0] in OWN_OPTIONS:
        return importlib.import_module(OWN_OPTIONS[argv[0]][0]).main(argv[1:])
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
