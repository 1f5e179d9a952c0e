"""Run by wheel_test.sh with the python of a fresh virtual environment the wheel was installed
into, from a directory outside the source tree, LIBBRAID_SO and PYTHONPATH unset:

    wheel_check.py local   # one process: the package and every library it loads come from the
                           # venv; 2 steps of DistributedDataParallel on a 2-rank local world
                           # equal serial torch bit for bit; missing modules are named
    wheel_check.py mpi     # each rank under mpirun -np 2: World() picks "mpi", which loads
                           # libbraid-mpi.so from the venv; the same 2 steps, bit for bit
    wheel_check.py bare    # where Open MPI, Abseil and spdlog cannot load (wheel_test.sh
                           # hides them): the local steps, and World("mpi") names what to
                           # install

Prints "wheel_check <mode>: OK" at the end; any failure is an exception (exit 1).
"""

import os
import shutil
import sys
import tempfile
import threading

import braid
from braid import _lib

MODULES = {"mpi": ("libbraid-mpi.so", "libmpi.so.40", "libopenmpi3"),
           "gloo": ("libbraid-gloo.so", "libgloo.so.0", "libgloo0")}
N = 2
STEPS = 2
LR = 0.1


def mapped_files():
    """Paths of every file mapped into this process."""
    paths = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/"):
                paths.add(parts[5].strip())
    return paths


def mapped(name_prefix):
    return sorted(p for p in mapped_files() if os.path.basename(p).startswith(name_prefix))


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def check_installed(package_dir):
    """The package and libbraid.so are the venv's, and so is every bundled library (loaded
    before torch, which maps the system's libfmt itself)."""
    check(os.path.realpath(package_dir).startswith(os.path.realpath(sys.prefix) + os.sep),
          "braid imported from %s, not from the venv %s" % (package_dir, sys.prefix))
    check("LIBBRAID_SO" not in os.environ, "LIBBRAID_SO is set")
    check(braid.version().count(".") == 2, "braid.version() = %r" % braid.version())
    want = os.path.realpath(package_dir)
    libs = mapped("libbraid") + mapped("libabsl_") + mapped("libspdlog") + mapped("libfmt")
    check(any(p.endswith("/libbraid.so") for p in libs), "libbraid.so is not mapped: %s" % libs)
    check(any("libabsl_status" in p for p in libs), "no Abseil mapped: %s" % libs)
    stray = [p for p in libs if not os.path.realpath(p).startswith(want + os.sep)]
    check(not stray, "loaded from outside %s: %s" % (want, stray))
    print("loaded from the venv %s: %d libraries (libbraid.so, %s)" % (
        want, len(libs), ", ".join(os.path.basename(p) for p in libs if "absl" not in p)))


def batch(r, step):
    import torch
    g = torch.Generator().manual_seed(100 * step + r)
    return torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)


def new_model():
    import torch
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def serial_reference():
    """torch alone: per step, each rank's gradient on its batch, averaged, then SGD."""
    import torch
    model = new_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        grads = []
        for r in range(N):
            model.zero_grad()
            x, y = batch(r, step)
            torch.nn.functional.mse_loss(model(x), y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for p, *g in zip(model.parameters(), *grads):
            p.grad = sum(g) / N
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def train(rank, group, model):
    """braid.pytorch's DDP and torch's SGD: STEPS steps on this rank's batches."""
    import torch
    from braid import pytorch as bt
    ddp = bt.DistributedDataParallel(model, group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    for step in range(STEPS):
        opt.zero_grad()
        x, y = batch(rank, step)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    params = [p.detach().clone() for p in ddp.parameters()]
    ddp.close()
    return params


def check_same(got, want, who):
    import torch
    for i, (a, b) in enumerate(zip(got, want)):
        check(torch.equal(a, b), "%s: parameter %d differs from serial torch by %g"
              % (who, i, (a - b).abs().max().item()))


def check_missing_modules():
    """A module that is not there, or whose system library is not, is named with the library
    and the Debian package to install."""
    package_dir = os.path.dirname(os.path.abspath(braid.__file__))
    for backend, (module, library, package) in MODULES.items():
        check(os.path.exists(os.path.join(package_dir, module)), "%s not installed" % module)
        for env in ("/nonexistent/braid-modules", None):
            scratch = None
            if env is None:  # the module is there but its system library is not
                scratch = tempfile.mkdtemp()
                blob = open(os.path.join(package_dir, module), "rb").read()
                missing = library.replace("lib", "lbx", 1)  # same length: a valid ELF still
                check(blob.count(library.encode()) == 1, "%s names %s once" % (module, library))
                with open(os.path.join(scratch, module), "wb") as f:
                    f.write(blob.replace(library.encode(), missing.encode()))
                env = scratch
            os.environ["BRAID_BACKEND_MODULE_DIR"] = env
            try:
                braid.World(backend)
                raise AssertionError("World(%r) with modules from %s succeeded" % (backend, env))
            except braid.BraidError as e:
                msg = str(e)
                print("World(%r), modules from %s:\n  %s" % (backend, env, msg))
                check(e.code == "FAILED_PRECONDITION", msg)
                for item in (backend, library, package, module if scratch is None else missing):
                    check(item in msg, "%r not named in: %s" % (item, msg))
            finally:
                del os.environ["BRAID_BACKEND_MODULE_DIR"]
                if scratch:
                    shutil.rmtree(scratch)


def train_local():
    """2 steps on a 2-rank local world (threads) equal serial torch bit for bit."""
    want = serial_reference()
    world = braid.World("local", local_ranks=N, read_env=False)
    groups = [world.group(r) for r in range(N)]
    models = [new_model() for _ in range(N)]
    results, errors = [None] * N, []

    def body(r):
        try:
            results[r] = train(r, groups[r], models[r])
        except BaseException as e:  # noqa: B902 (re-raised below)
            errors.append(e)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        check(not t.is_alive(), "a rank thread hung")
    if errors:
        raise errors[0]
    for r in range(N):
        check_same(results[r], want, "local rank %d" % r)
    for g in groups:
        g.close()
    world.close()


def run_local():
    train_local()
    check_missing_modules()


def run_bare():
    train_local()
    try:
        braid.World("mpi")
        raise AssertionError("World('mpi') succeeded without Open MPI")
    except braid.BraidError as e:
        msg = str(e)
        print("World('mpi') without Open MPI:\n  %s" % msg)
        for item in ("backend 'mpi'", "libmpi.so.40", "not installed", "apt install libopenmpi3"):
            check(item in msg, "%r not named in: %s" % (item, msg))


def run_mpi():
    world = braid.World()  # the launcher rule: mpirun -> "mpi", a module loaded now
    check(world.backend == "mpi", "World() under mpirun is %r" % world.backend)
    package_dir = os.path.realpath(os.path.dirname(braid.__file__))
    modules = mapped("libbraid-mpi")
    check(modules == [os.path.join(package_dir, "libbraid-mpi.so")],
          "libbraid-mpi.so mapped from %s, not %s" % (modules, package_dir))
    check(any("libmpi.so.40" in p for p in mapped_files()), "libmpi.so.40 not mapped")
    group = world.group()
    check(group.size == N, "world size %d, want %d" % (group.size, N))
    want = serial_reference()
    check_same(train(group.rank, group, new_model()), want, "mpi rank %d" % group.rank)
    group.close()
    world.close()


def main():
    mode = sys.argv[1]
    check_installed(os.path.dirname(os.path.abspath(braid.__file__)))
    check(not mapped("libbraid-"), "a backend module was loaded before any world needed it")
    {"local": run_local, "mpi": run_mpi, "bare": run_bare}[mode]()
    print("wheel_check %s: OK" % mode)


if __name__ == "__main__":
    main()
