"""Which parameters a backward reduced, checked as torch 1.13 DDP checks them, for
braid.pytorch's DistributedDataParallel: the unused-parameter error and static_graph.

    graph = GraphCheck(names, static_graph, rank)
    graph.before_forward()            # a forward with grad: raises the pending error, if any
    graph.check_hooked(pid)           # its AccumulateGrad hook fired in a synced backward
    graph.end_of_backward(unhooked, find_unused)   # a synced backward ends: ids whose hook
                                                   # did not fire
    graph_grad(ddp, pid, p, view)     # backward(create_graph=True): p.grad back to its bucket
    ddp._get_ddp_logging_data()       # {"iteration", "has_error", "error"} (torch's keys)

Contract (torch's reducer: ensure_prior_reduction_finished, static graph):
  - find_unused_parameters=False, static_graph=False: a synced backward in which some
    parameter's hook did not fire (it got no gradient on this rank) returns, as in torch;
    where torch leaves the buckets it could not launch unreduced (p.grad then holds a mix
    of averaged and local gradients), Braid reduces those parameters as they are (zero if
    .grad was None, else its value, e.g. a no_sync window's sum), so every bucket is
    averaged on every rank: nothing is dropped or left half reduced. The NEXT forward with grad raises
    torch's RuntimeError ("Expected to have finished reduction in the prior iteration before
    starting a new one ... `find_unused_parameters=True` ... parameter indices and names");
  - static_graph=True: the first synced backward records which parameters' hooks did not
    fire; later, a recorded one whose hook fires raises in that backward ("Your training
    graph has changed in this iteration ... unused in first iteration, but then got used"),
    which ends it (the gradients are zeroed, braid.pytorch's _abandon_backward), and one
    recorded as used whose hook does not fire raises at the next forward, as above, in
    torch's static-graph wording;
  - after either error the wrapper refuses every later forward with grad with that error
    again, as torch's reducer (still waiting for the reduction) does; forwards under
    torch.no_grad() work. Recover as torch's users do: wrap the module again (the constructor
    closes this wrapper) with find_unused_parameters=True, or without static_graph;
  - the names and indices (torch's: positions among the parameters that require grad) are
    always in the message; torch prints the names only with TORCH_DISTRIBUTED_DEBUG=INFO or
    DETAIL, which the message says in torch's words.
Nothing here is collective: a rank whose parameters all got gradients raises nothing, so a
job whose ranks differ hangs at its next collective until the reducer's timeout (torch too).
"""

import os
import warnings

import torch

from ._fsdp_params import _tensors

_PRIOR = ("Expected to have finished reduction in the prior iteration before starting a new "
          "one. ")
_UNUSED = (
    "This error indicates that your module has parameters that were not used in producing "
    "loss. You can enable unused parameter detection by passing the keyword argument "
    "`find_unused_parameters=True` to `torch.nn.parallel.DistributedDataParallel` (Braid's "
    "braid.pytorch.DistributedDataParallel), and by making sure all `forward` function "
    "outputs participate in calculating loss. Braid completed that backward's reduction "
    "(the parameters below reduced as their .grad was: zero if None) and refuses every "
    "forward with grad from now on; wrap the module again to go on.")
_STATIC_UNUSED = (
    "This error indicates that your training graph has changed in this iteration, e.g., one "
    "parameter is used in first iteration, but then got unused in the second iteration. "
    "this is not compatible with static_graph set to True.")
_STATIC_USED = (
    "Your training graph has changed in this iteration, e.g., one parameter is unused in "
    "first iteration, but then got used in the second iteration. this is not compatible with "
    "static_graph set to True.")
_DEBUG_HINT = ("\n(torch DDP prints these names only if you set the environment variable "
               "TORCH_DISTRIBUTED_DEBUG to either INFO or DETAIL; Braid always does)")


class GraphCheck:
    """The unused-parameter accounting of one wrapper (see the module docstring)."""

    def __init__(self, names, static_graph, rank):
        self._names, self._rank = names, rank
        self.static_graph = bool(static_graph)
        self._static_unused = None  # static_graph: ids unused in the first synced backward
        self._pending = None        # the error the next forward with grad raises
        self.iteration = 0          # forwards with grad (torch's logging "iteration")
        self.error = ""             # the last error raised (torch's logging "error")

    def set_static_graph(self):
        """torch's _set_static_graph(): refused after the first forward with grad; a second
        call warns, as torch's."""
        if self.static_graph:
            warnings.warn("You've set static_graph to be True, no need to set it again.")
            return
        if self.iteration:
            self.error = ("_set_static_graph() should be called before training loop starts "
                          "(the first forward with grad) and after DistributedDataParallel "
                          "is constructed, as torch requires")
            raise RuntimeError(self.error)
        self.static_graph = True

    def before_forward(self):
        """A forward with grad: raises the pending error (every time, as torch)."""
        if self._pending is not None:
            self.error = self._pending
            raise RuntimeError(self._pending)
        self.iteration += 1

    def static_unused(self):
        """static_graph: the ids a forward marks unused (ready at the start of the backward):
        none in the first iteration (every one not hooked is reduced at its end), then the
        first synced backward's, as torch 1.13 (it never searches the graph under
        static_graph, so a parameter that only a reentrant checkpoint's inner backward reaches
        counts as used). None without static_graph (find_unused_parameters searches)."""
        if not self.static_graph:
            return None
        return sorted(self._static_unused or ())

    def check_hooked(self, pid):
        """A synced backward's hook of `pid` fired: under static_graph, a parameter unused in
        the first iteration is an error (raised into the backward, which ends it)."""
        if self._static_unused is not None and pid in self._static_unused:
            self.error = "%s (parameter %r)" % (_STATIC_USED, self._names[pid])
            raise RuntimeError(self.error)

    def abandoned(self, unhooked):
        """A synced backward ended by an error: under static_graph, the next forward reports
        the parameters it did not reach, as torch's reducer (the reduction never finished)."""
        if self.static_graph and unhooked:
            self._pending = self._message(_STATIC_UNUSED, unhooked)

    def end_of_backward(self, unhooked, find_unused):
        """A synced backward completed; `unhooked`: ids whose hook did not fire in it. Sets
        the error the next forward raises, if torch's reducer would raise one there."""
        if self.static_graph:
            if self._static_unused is None:
                self._static_unused = set(unhooked)
                return
            changed = sorted(set(unhooked) - self._static_unused)
            if changed:
                self._pending = self._message(_STATIC_UNUSED, changed)
        elif not find_unused and unhooked:
            self._pending = self._message(_UNUSED, sorted(unhooked))

    def _message(self, why, pids):
        names = ", ".join(self._names[pid] for pid in pids)
        indices = " ".join(str(pid) for pid in pids)
        hint = "" if os.environ.get("TORCH_DISTRIBUTED_DEBUG") in ("INFO", "DETAIL") else (
            _DEBUG_HINT)
        return ("%s%s\nParameter indices which did not receive grad for rank %d: %s\n"
                "Parameters which did not receive grad for rank %d: %s%s" %
                (_PRIOR, why, self._rank, indices, self._rank, names, hint))

    def logging_data(self):
        """torch's _get_ddp_logging_data() keys that Braid keeps (see LoggingData)."""
        return LoggingData(iteration=self.iteration, has_error=int(bool(self.error)),
                           error=self.error)


class LoggingData(dict):
    """torch DDP's private logging data, reduced to what Braid can fill truthfully
    (iteration, has_error, error); any other key torch records (bucket sizes, comm hook,
    rebuilt buckets, timings, ...) is a KeyError naming what Braid keeps, also from .get():
    a default standing in for a value torch would record would read as a wrong number."""

    def __missing__(self, key):
        raise KeyError("%r: braid.pytorch.DistributedDataParallel keeps only %s of torch's "
                       "private DDP logging data" % (key, ", ".join(sorted(self))))

    absent = ()  # keys torch too leaves out in this state: .get() gives its default

    def get(self, key, default=None):
        if key in self.absent:
            return default
        return self[key]


def unreached(out, params, grad_accs):
    """Ids of the `params` whose AccumulateGrad node (in `grad_accs`) the autograd graph of
    `out` (every tensor in it) does not reach: unused in this forward, as torch DDP's
    find_unused_parameters computes them."""
    tensors = _tensors(out, [])
    seen, stack = set(), [t.grad_fn for t in tensors if t.grad_fn is not None]
    direct = {id(t) for t in tensors if t.grad_fn is None and t.requires_grad}
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        stack.extend(nxt for nxt, _ in fn.next_functions if nxt is not None)
    return [pid for pid, (p, acc) in enumerate(zip(params, grad_accs))
            if acc not in seen and id(p) not in direct]


def graph_grad(ddp, pid, p, view):
    """backward(create_graph=True), in `ddp`'s AccumulateGrad hook of parameter `pid`:
    autograd replaced p.grad by a tensor with a graph (the bucket view plus this gradient). Its values go into the bucket, which is reduced,
    and p.grad is the bucket view again: the reduced gradient without a graph, as torch
    DDP's p.grad with gradient_as_bucket_view=True (torch reduces no higher-order
    gradient either). Higher-order terms: torch.autograd.grad(..., create_graph=True),
    which runs no DDP hook (a local computation, in torch DDP too)."""
    if ddp._mode != "allreduce" or ddp._stepper is not None:
        raise RuntimeError(
            "parameter %r: backward(create_graph=True) works with mode='allreduce' and a "
            "torch optimizer only (here mode=%r%s); use backward() or torch.autograd.grad"
            % (ddp._names[pid], ddp._mode, ", a ShardedAdamW / ShardedSGD" if
               ddp._stepper is not None else ""))
    if not ddp._warned_graph:
        ddp._warned_graph = True  # pylint: disable=protected-access
        warnings.warn("DistributedDataParallel with backward(create_graph=True): the "
                      "gradients are reduced, their graph is not kept (p.grad is the "
                      "reduced gradient, as torch DDP's with gradient_as_bucket_view=True)")
    with torch.no_grad():
        view.copy_(p.grad)
    p.grad = ddp._exposed[pid]
