"""mpi_test: a gtest binary run as `np` processes of mpirun by tests/run_mpi.sh.

mpirun needs the host's /tmp and /dev/shm and spawns its own processes, so these tests run
unsandboxed and one at a time (exclusive); `mpi` tags them for filtering.
"""

def mpi_test(name, binary, np, args = [], size = "medium", timeout = None):
    native.sh_test(
        name = name,
        size = size,
        timeout = timeout,
        srcs = ["//tests:run_mpi.sh"],
        args = [str(np), "$(location %s)" % binary] + args,
        data = [binary],
        tags = ["exclusive", "local", "no-sandbox", "mpi"],
    )
