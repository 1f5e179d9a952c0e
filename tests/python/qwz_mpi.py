"""Quantized unit gathers (gather_dtype="int8" and "float8_e4m3fn") under mpirun -np 2
(Braid's "mpi" world, one process per rank): the weights each forward reads and the summoned
exact master weights against qwz_test.py's serial reference in the same process, bit for bit."""

import sys
import unittest

import torch

import braid
import qwz_test


def main():
    torch.set_num_threads(1)
    world = braid.World("mpi")
    group = world.group()
    rank = group.rank
    failures = []
    for dtype in ("int8", "float8_e4m3fn"):
        result = qwz_test.braid_run(rank, group, dtype)
        try:
            qwz_test.check(unittest.TestCase(), result, group.size, dtype)
        except AssertionError as e:
            failures.append("%s: %s" % (dtype, e))
    group.close()
    world.close()
    if failures:
        print("rank %d: quantized gathers differ from the reference:\n  %s" %
              (rank, "\n  ".join(failures)))
        sys.exit(1)
    print("rank %d: quantized gathers equal the serial reference" % rank)


if __name__ == "__main__":
    main()
