"""mpi_test: a gtest binary run as `np` processes of mpirun by tests/run_mpi.sh.

mpirun needs the host's /tmp and /dev/shm and spawns its own processes, so these tests run
unsandboxed and one at a time (exclusive); `mpi` tags them for filtering. `limit_s` replaces
run_mpi.sh's wall-clock limit (240 s) for the long ones.
"""

def mpi_test(name, binary, np, args = [], data = [], size = "medium", timeout = None, limit_s = None):
    native.sh_test(
        name = name,
        size = size,
        timeout = timeout,
        srcs = ["//tests:run_mpi.sh"],
        args = [str(np), "$(location %s)" % binary] + args,
        data = [binary] + data,
        env = {"MPI_TEST_LIMIT_S": str(limit_s)} if limit_s else {},
        tags = ["exclusive", "local", "no-sandbox", "mpi"],
    )
