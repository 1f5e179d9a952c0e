"""braid.optim_state: checkpoints of ShardedAdamW / ShardedSGD (braid/optim.py) that move.

    sd = opt.state_dict()                      # collective: the whole state, torch's layout
    if rank == 0:
        torch.save({"model": model.state_dict(), "opt": sd}, "ckpt.pt")
    ...                                        # any world size, mesh or bucket caps:
    model.module.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])           # collective: each rank takes its shard
    torch.optim.AdamW(net.parameters()).load_state_dict(ckpt["opt"])   # or torch's own

Forms and their contracts:
  - state_dict(): collective over the shard group (every rank calls it at the same point;
    it waits for the step in flight). Returns the whole state on every rank in torch's layout
    (as FSDP's full optimizer state dict): "state" keyed by parameter index in param_groups
    order, with torch.optim.AdamW's keys and types ("step": a float32 scalar tensor,
    "exp_avg", "exp_avg_sq": the parameter's shape) or torch.optim.SGD's ("momentum_buffer":
    a tensor, or None when the group's momentum is 0 and the buffer is zero); a parameter
    never stepped has no entry, as in torch. Moments are float32 (Braid's own precision; a
    torch optimizer casts them to its parameters' dtype on load), on the CPU. "param_groups"
    as torch's, with torch's keys. The top-level "braid" entry, which torch ignores (and
    drops in its own state_dict()), keeps what torch has no key for: the f32 master weights
    of bf16 / f16 parameters, SGD's step counts, the step count last_step() reports.
    Costs the whole state in host memory on every rank while it runs.
  - consolidate_state_dict(to=0): collective, as ZeroRedundancyOptimizer's: the whole state
    is kept on rank `to` (the rank in the optimizer's mesh: replica rank x shard size + shard
    rank). Until the next step, state_dict() on rank `to` returns it without communicating,
    and raises RuntimeError on every other rank; after a step (or a load) state_dict() is the
    collective form again on every rank.
  - load_state_dict(sd): collective over the shard group (every rank passes the same dict).
    Takes state_dict() of a Braid sharded optimizer of any world size, mesh or bucket plan,
    or torch.optim.AdamW's / SGD's state_dict() over the same model, and the dict's
    param_groups hyper-parameters: the next step is the one the saving optimizer would have
    taken. Master weights: the dict's "braid" ones where present, else the parameters'
    current values (so load the model's weights first). ValueError naming the first
    mismatch (parameter index and name, shape, group sizes, a key or hyper-parameter Braid
    lacks, step counts Braid cannot keep: it keeps one per bucket); nothing changes then on
    any rank.
  - sharded_state_dict() / load_sharded_state_dict(sd): the fast per-rank form for large
    models: this rank's shard as Braid's state file bytes, with the run's identity; it loads
    only into the same world, rank and bucket plan (ValueError naming the first mismatch).
    Not collective to save; collective to load. torch.optim's load_state_dict refuses it
    (ValueError: its "param_groups" is empty) instead of loading it as an empty state.
  - save(path) / load(path): the per-rank state file itself.
"""

import os
import struct
import tempfile

import torch

from . import core
from ._lib import BraidError

_SHARD_FORMAT = 2  # of sharded_state_dict()'s "braid_shard" entry (1: the "braid" entry before)
# Per kind: the per-parameter keys of torch's state, and the param_group keys Braid reads.
_STATE_KEYS = {"adamw": ("step", "exp_avg", "exp_avg_sq"), "sgd": ("momentum_buffer",)}
_GROUP_KEYS = {"adamw": ("lr", "betas", "eps", "weight_decay"),
               "sgd": ("lr", "momentum", "weight_decay", "nesterov")}
# torch 1.13's param_group keys that Braid's groups lack (no effect on the arithmetic).
_TORCH_GROUP_DEFAULTS = {"adamw": {"foreach": None, "capturable": False},
                         "sgd": {"foreach": None, "differentiable": False}}
_TORCH_NAMES = {"adamw": "torch.optim.AdamW", "sgd": "torch.optim.SGD"}


def _state_file_identity(blob):
    """(kind, plan fingerprint, world size, rank, step) from a Braid state file's header
    (optim/state_file.h, format 1); None if `blob` is not one."""
    if len(blob) < 28 or blob[:8] != b"BRAIDST\0":
        return None
    n = struct.unpack_from("<I", blob, 24)[0]
    off = 28 + n
    if off + 32 > len(blob):
        return None
    kind = blob[28:off].decode("utf-8", "replace")
    fingerprint, world, rank, _, _, step = struct.unpack_from("<Qiiiiq", blob, off)
    return kind, "%016x" % fingerprint, world, rank, step


def _step_count(value, where):
    """A torch "step" (tensor of one element, or number) as an int; ValueError naming it."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError("%s is a tensor of %d elements; a step count is one" %
                             (where, value.numel()))
        value = value.item()
    if not isinstance(value, (int, float)) or value != int(value) or value < 0:
        raise ValueError("%s is %r; a step count is a whole number >= 0" % (where, value))
    return int(value)


class CheckpointMixin:
    """state_dict / load_state_dict and their sharded and file forms for _ShardedOptimizer
    (braid/optim.py), which provides ddp, optimizer, param_groups, _names, _KIND,
    _fully_sharded, _check_options and _pushed. See the module docstring."""

    _consolidated = None  # (rank, step, whole state) kept by consolidate_state_dict

    # ---- helpers ---------------------------------------------------------------------------
    def _settle(self):
        """The step in flight done; fully sharded: the step's units ended first."""
        if self._fully_sharded:
            self.ddp._end_step()
        self.optimizer.wait_all_params()

    def _mesh_rank(self):
        reducer = self.ddp.reducer
        replica = reducer.replica_group
        shard = reducer.shard_group
        return ((replica.rank if replica is not None else 0) * shard.size + shard.rank,
                shard.size * (replica.size if replica is not None else 1))

    def _torch_order(self):
        """Registration index (pid) of each parameter, in torch's state_dict order; None for
        a frozen parameter listed in a group (Braid never steps it: no state, as torch's)."""
        index = {id(p): pid for pid, p in enumerate(self.ddp._params)}
        return [index.get(id(p)) for group in self.param_groups for p in group["params"]]

    def _label(self, idx, pid):
        g, k = self._group_position[idx]
        return "parameter %d (%r, param_groups[%d]['params'][%d])" % (idx, self._names[pid], g, k)

    @property
    def _group_position(self):
        return [(g, k) for g, group in enumerate(self.param_groups)
                for k in range(len(group["params"]))]

    def _packed_groups(self):
        """param_groups as torch's state_dict() has them ("params" as indices)."""
        groups, start = [], 0
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            for k, v in _TORCH_GROUP_DEFAULTS[self._KIND].items():
                packed.setdefault(k, v)
            packed["params"] = list(range(start, start + len(group["params"])))
            start += len(group["params"])
            groups.append(packed)
        return groups

    # ---- the whole state, torch's layout ---------------------------------------------------
    def _gather_state(self, masters_of=None):
        """Collective: (step, per-pid steps, {buffer name: per-pid f32 tensors}). Master
        weights only for the pids in `masters_of` (default: those of non-f32 parameters)."""
        self._settle()
        params = self.ddp._params
        if masters_of is None:
            masters_of = {pid for pid, p in enumerate(params) if p.dtype != torch.float32}
        names = core.Optimizer.STATE_BUFFERS[self._KIND]
        values = {name: [None if name == "master" and pid not in masters_of else
                         torch.empty(p.numel(), dtype=torch.float32)
                         for pid, p in enumerate(params)] for name in names}
        step, steps = self.optimizer.get_state([v for name in names for v in values[name]])
        return step, steps, values

    def _whole_state(self):
        """Collective: the "state" and "braid" entries of state_dict()."""
        step, steps, values = self._gather_state()
        params = self.ddp._params
        momentum = {id(p): group.get("momentum", 0) for group in self.param_groups
                    for p in group["params"]}
        state, masters, sgd_steps = {}, {}, []
        for idx, pid in enumerate(self._torch_order()):
            if pid is None:  # frozen
                sgd_steps.append(0)
                continue
            p, t = params[pid], steps[pid]
            sgd_steps.append(t)
            if values["master"][pid] is not None:
                masters[idx] = values["master"][pid].view(p.shape)
            if t == 0:
                continue  # torch keeps no state for a parameter never stepped
            if self._KIND == "adamw":
                state[idx] = {"step": torch.tensor(float(t)),
                              "exp_avg": values["exp_avg"][pid].view(p.shape),
                              "exp_avg_sq": values["exp_avg_sq"][pid].view(p.shape)}
            else:
                buf = values["momentum"][pid].view(p.shape)
                none = momentum[id(p)] == 0 and not bool(buf.any())
                state[idx] = {"momentum_buffer": None if none else buf}
        braid = {"kind": self._KIND, "step": step, "master": masters}
        if self._KIND == "sgd":
            braid["steps"] = sgd_steps
        return state, braid

    def state_dict(self):
        """The whole state in torch's layout (see the module docstring): collective, unless
        consolidate_state_dict() kept it here and no step ran since."""
        kept = self._consolidated
        if kept is not None:
            self.optimizer.wait_all_params()  # the step in flight (local: not _settle())
            if self.optimizer.last_step().rounds == kept[1]:
                if kept[0] != self._mesh_rank()[0]:
                    raise RuntimeError(
                        "%s.state_dict(): the state was consolidated on rank %d "
                        "(consolidate_state_dict(to=%d)); call state_dict() on that rank only, "
                        "or on every rank without consolidating for the whole state on each" %
                        (type(self).__name__, kept[0], kept[0]))
                state, braid = kept[2]
                return {"state": state, "param_groups": self._packed_groups(), "braid": braid}
            self._consolidated = None  # stale on every rank alike (the same step count)
        state, braid = self._whole_state()
        return {"state": state, "param_groups": self._packed_groups(), "braid": braid}

    def consolidate_state_dict(self, to=0):
        """Collective (ZeroRedundancyOptimizer's): keeps the whole state on rank `to`, where
        state_dict() then returns it until the next step (see the module docstring)."""
        rank, size = self._mesh_rank()
        if not isinstance(to, int) or not 0 <= to < size:
            raise ValueError("consolidate_state_dict(to=%r): a rank in [0, %d)" % (to, size))
        self._consolidated = None
        whole = self._whole_state()
        self._consolidated = (to, whole[1]["step"], whole if rank == to else None)

    def _checked_whole(self, sd):
        """(per-pid masters or None, per-pid steps, step, per-pid moment tensors by Braid's
        buffer name, the dict's groups) of a torch-layout dict; ValueError naming the first
        mismatch."""
        kind, name = self._KIND, type(self).__name__
        if not isinstance(sd, dict):
            raise ValueError("%s.load_state_dict: a dict is needed, got %s" %
                             (name, type(sd).__name__))
        if "braid_shard" in sd or isinstance(sd.get("braid"), dict) and "state_file" in sd["braid"]:
            raise ValueError("%s.load_state_dict: this is a sharded_state_dict() (one rank's "
                             "shard); load it with load_sharded_state_dict()" % name)
        for key in ("state", "param_groups"):
            if not isinstance(sd.get(key), (dict if key == "state" else list)):
                raise ValueError("%s.load_state_dict: the dict has no %r %s (not an optimizer "
                                 "state_dict)" % (name, key, "dict" if key == "state" else "list"))
        groups = sd["param_groups"]
        sizes = [len(g.get("params", ())) if isinstance(g, dict) else None for g in groups]
        mine = [len(g["params"]) for g in self.param_groups]
        if sizes != mine:
            raise ValueError("%s.load_state_dict: the state_dict has %d param groups of sizes "
                             "%s; this optimizer has %d of sizes %s" %
                             (name, len(groups), sizes, len(mine), mine))
        for g, group in enumerate(groups):
            missing = [k for k in _GROUP_KEYS[kind] if k not in group]
            if missing:
                raise ValueError("%s.load_state_dict: param_groups[%d] has no %s (not a %s "
                                 "state_dict)" % (name, g, ", ".join(map(repr, missing)),
                                                  _TORCH_NAMES[kind]))
            try:
                self._check_options(g, group)
            except ValueError as e:
                raise ValueError("%s.load_state_dict: the state_dict's %s" % (name, e)) from None
        params, order = self.ddp._params, self._torch_order()
        extra = sd.get("braid") if isinstance(sd.get("braid"), dict) else {}
        if extra:
            if extra.get("kind") != kind:
                raise ValueError("%s.load_state_dict: the state_dict was saved by Braid's %r "
                                 "optimizer" % (name, extra.get("kind")))
            if not isinstance(extra.get("master"), dict) or any(
                    not isinstance(k, int) or not 0 <= k < len(order) for k in extra["master"]):
                raise ValueError("%s.load_state_dict: state_dict['braid']['master'] is not a "
                                 "dict keyed by parameter index" % name)
            if kind == "sgd" and len(extra.get("steps") or ()) != len(order):
                raise ValueError("%s.load_state_dict: state_dict['braid']['steps'] does not "
                                 "hold %d step counts" % (name, len(order)))
        unknown = [k for k in sd["state"] if not (isinstance(k, int) and 0 <= k < len(order))]
        if unknown:
            raise ValueError("%s.load_state_dict: state_dict['state'] has key %r; this "
                             "optimizer has parameters 0..%d" % (name, unknown[0], len(order) - 1))
        masters = [None] * len(params)
        steps = [0] * len(params)
        moments = {n: [None] * len(params) for n in core.Optimizer.STATE_BUFFERS[kind][1:]}
        momentum = [group["momentum"] if kind == "sgd" else 0 for group in groups
                    for _ in group["params"]]
        for idx, pid in enumerate(order):
            if pid is None:
                continue  # frozen: Braid never steps it, so keeps no state for it
            p = params[pid]
            where = "state_dict['state'][%d]" % idx

            def tensor(value, what, p=p, idx=idx, pid=pid):
                if not isinstance(value, torch.Tensor) or not value.is_floating_point():
                    raise ValueError("%s is %s; a floating-point tensor is needed" %
                                     (what, type(value).__name__))
                if value.shape != p.shape:
                    raise ValueError("%s has shape %s; %s has shape %s" % (
                        what, tuple(value.shape), self._label(idx, pid), tuple(p.shape)))
                return value.detach().to("cpu", torch.float32).reshape(-1).contiguous()

            master = extra["master"].get(idx) if extra else None
            if master is not None:
                masters[pid] = tensor(master, "state_dict['braid']['master'][%d]" % idx)
            entry = sd["state"].get(idx)
            if entry is None:
                continue  # never stepped: zero moments, step 0 (a fresh optimizer's)
            if not isinstance(entry, dict):
                raise ValueError("%s is %s; a dict is needed" % (where, type(entry).__name__))
            bad = sorted(set(entry) - set(_STATE_KEYS[kind]), key=str)
            if bad:
                raise ValueError("%s has key %r: not in %s's state (%s), which Braid's %s "
                                 "keeps" % (where, bad[0], _TORCH_NAMES[kind],
                                            ", ".join(_STATE_KEYS[kind]), name))
            lacking = [k for k in _STATE_KEYS[kind] if k not in entry]
            if lacking:
                raise ValueError("%s has no %r (not a %s state)" % (where, lacking[0],
                                                                   _TORCH_NAMES[kind]))
            if kind == "adamw":
                steps[pid] = _step_count(entry["step"], where + "['step']")
                for key in ("exp_avg", "exp_avg_sq"):
                    moments[key][pid] = tensor(entry[key], "%s[%r]" % (where, key))
            elif entry["momentum_buffer"] is not None:
                moments["momentum"][pid] = tensor(entry["momentum_buffer"],
                                                  where + "['momentum_buffer']")
                steps[pid] = max(1, _step_count(extra["steps"][idx], "state_dict['braid']"
                                                "['steps'][%d]" % idx) if extra else 1)
            elif momentum[idx] == 0:
                steps[pid] = None  # no buffer and none used: any count serves (see below)
        self._check_bucket_steps(steps, order)
        step = _step_count(extra["step"], "state_dict['braid']['step']") if extra else max(
            steps, default=0)
        return masters, steps, step, moments, groups

    def _check_bucket_steps(self, steps, order):
        """Braid keeps one step count per bucket: a None count takes its bucket's; parameters
        sharing a bucket with different counts are named (ValueError)."""
        reducer = self.ddp.reducer
        pid_to_idx = {pid: idx for idx, pid in enumerate(order)}
        first = {}  # bucket -> the first pid with a count
        for pid, t in enumerate(steps):
            if t is None:
                continue
            b = reducer.param_bucket(pid)
            other = first.setdefault(b, pid)
            if steps[other] != t:
                raise ValueError(
                    "%s.load_state_dict: %s and %s were stepped %d and %d times, but they share "
                    "bucket %d and Braid keeps one step count per bucket (a parameter without a "
                    "gradient in some of torch's steps): load the state into torch.optim, or "
                    "give such parameters buckets of their own (bucket_cap_mb)" % (
                        type(self).__name__, self._label(pid_to_idx[other], other),
                        self._label(pid_to_idx[pid], pid), steps[other], t, b))
        for pid, t in enumerate(steps):
            if t is None:
                b = reducer.param_bucket(pid)
                steps[pid] = steps[first[b]] if b in first else 0

    def load_state_dict(self, state_dict):
        """Collective: loads the whole state in torch's layout (see the module docstring);
        ValueError naming the first mismatch, nothing changed on any rank."""
        try:
            checked = self._checked_whole(state_dict)
        except Exception as e:
            self._load_whole(None)  # take part, so that the other ranks fail too
            if isinstance(e, ValueError) and not str(e).startswith(type(self).__name__):
                raise ValueError("%s.load_state_dict: %s" % (type(self).__name__, e)) from None
            raise
        self._load_whole(checked)

    def _load_whole(self, checked):
        """The collective half of load_state_dict (the same calls on every rank): current
        master weights (fully sharded: gathered), then set_state (None: refuse)."""
        params = self.ddp._params
        self._consolidated = None
        current = None
        if self._fully_sharded:
            current = self._gather_state(masters_of=set(range(len(params))))[2]["master"]
        else:
            self._settle()
        if checked is None:
            try:
                self.optimizer.set_state(None)
            except BraidError:
                pass
            return
        masters, steps, step, moments, groups = checked
        for pid, p in enumerate(params):
            if masters[pid] is None:  # the parameter's current value
                value = (current[pid].to(p.dtype) if current is not None else
                         p.detach().reshape(-1))
                masters[pid] = value.to("cpu", torch.float32).contiguous()
            for name, values in moments.items():
                if values[pid] is None:
                    values[pid] = torch.zeros(p.numel(), dtype=torch.float32)
        values = masters + [v for name in core.Optimizer.STATE_BUFFERS[self._KIND][1:]
                            for v in moments[name]]
        try:
            self.optimizer.set_state(values, steps, step)
        except BraidError as e:
            raise ValueError("%s.load_state_dict: Braid refused the state: %s" %
                             (type(self).__name__, e.message)) from None
        self._take_groups(groups)

    def _take_groups(self, groups):
        for mine, theirs in zip(self.param_groups, groups):
            for k, v in theirs.items():
                if k != "params":
                    mine[k] = v
        self._pushed = {}  # push every group's values again at the next step
        self.optimizer.wait_all_params()

    # ---- the per-rank forms ------------------------------------------------------------------
    def save(self, path):
        """This rank's Braid state file (master weights, moments, step counts, the
        hyper-parameters last armed) at `path`; sharded_state_dict() is the torch.save-able
        form."""
        if self._fully_sharded:
            self.ddp._end_step()
        self.optimizer.save(path)

    def load(self, path):
        """Collective: restores a state file saved by the same plan, world and rank; the
        parameters are re-gathered from it. Keeps param_groups as they are."""
        if self._fully_sharded:
            self.ddp._end_step()
        self._consolidated = None
        self.optimizer.load(path)
        self._pushed = {}  # Braid now has the file's hyper-parameters: push ours again
        self.optimizer.wait_all_params()

    def _identity(self):
        reducer = self.ddp.reducer
        group_of = {}
        for g, group in enumerate(self.param_groups):
            for p in group["params"]:
                group_of[id(p)] = g
        params = []
        for pid, p in enumerate(self.ddp._params):
            params.append((self._names[pid], tuple(p.shape), str(p.dtype).replace("torch.", ""),
                           group_of[id(p)], reducer.param_bucket(pid)))
        replica = reducer.replica_group
        return {"kind": self._KIND, "rank": reducer.shard_group.rank,
                "shard_size": reducer.shard_group.size,
                "replica_size": replica.size if replica is not None else 1,
                "fully_sharded": self._fully_sharded, "params": params}

    def sharded_state_dict(self):
        """This rank's shard as a dict for torch.save, per rank (see the module docstring).
        Not collective (waits for the step in flight)."""
        with tempfile.TemporaryDirectory(prefix="braid-state-") as tmp:
            path = os.path.join(tmp, "state")
            self.save(path)
            with open(path, "rb") as f:
                blob = f.read()
        ident = _state_file_identity(blob)
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self._packed_groups()]
        shard = dict(self._identity(), format=_SHARD_FORMAT, state_file=blob,
                     plan_fingerprint=ident[1] if ident else None,
                     step=ident[4] if ident else None, param_groups=groups,
                     group_sizes=[len(g["params"]) for g in self.param_groups])
        # "param_groups": [] makes torch.optim's load_state_dict raise rather than load nothing.
        return {"state": {}, "param_groups": [], "braid_shard": shard}

    def _check_identity(self, saved):
        mine = self._identity()
        for key, what in (("kind", "optimizer kind"), ("fully_sharded", "fully_sharded"),
                          ("rank", "rank"), ("shard_size", "shard group size"),
                          ("replica_size", "replica group size")):
            if saved.get(key) != mine[key]:
                raise ValueError("state_dict was saved with %s %r; this optimizer has %r%s" % (
                    what, saved.get(key), mine[key],
                    " (each rank must load its own rank's state_dict)" if key == "rank" else ""))
        theirs, ours = [tuple(p) for p in saved["params"]], mine["params"]
        if len(theirs) != len(ours):
            raise ValueError("state_dict was saved for %d trainable parameters; this model has "
                             "%d" % (len(theirs), len(ours)))
        fields = ("name", "shape", "dtype", "param group", "bucket")
        for i, (a, b) in enumerate(zip(theirs, ours)):
            for field, x, y in zip(fields, a, b):
                if x != y:
                    hint = (" (a different bucket_cap_mb / first_bucket_cap_mb or bucket order)"
                            if field == "bucket" else "")
                    raise ValueError("state_dict parameter %d %r: saved %s %r, this model's is "
                                     "%r%s" % (i, a[0], field, x, y, hint))

    def _checked(self, state_dict):
        """(the shard entry, its param_groups) of a sharded_state_dict() that fits this
        optimizer; ValueError naming the first mismatch."""
        saved = state_dict.get("braid_shard") if isinstance(state_dict, dict) else None
        if saved is None and isinstance(state_dict, dict) and isinstance(
                state_dict.get("braid"), dict) and "state_file" in state_dict["braid"]:
            saved = dict(state_dict["braid"], param_groups=state_dict["param_groups"])  # format 1
        if not isinstance(saved, dict) or "state_file" not in saved:
            raise ValueError("not a %s sharded_state_dict() (no 'braid_shard' entry)%s" % (
                type(self).__name__, "; this is a whole state_dict(): load it with "
                "load_state_dict()" if isinstance(state_dict, dict) and "state" in state_dict
                and state_dict.get("param_groups") else ""))
        if saved.get("format") not in (1, _SHARD_FORMAT):
            raise ValueError("sharded state_dict format %r; this version reads 1 and %d" %
                             (saved.get("format"), _SHARD_FORMAT))
        self._check_identity(saved)
        groups = saved["param_groups"]
        sizes = saved.get("group_sizes") or [len(g["params"]) for g in groups]
        mine = [len(g["params"]) for g in self.param_groups]
        if sizes != mine:
            raise ValueError("state_dict has %d param groups of sizes %s; this optimizer %d of "
                             "sizes %s" % (len(sizes), sizes, len(mine), mine))
        return saved, groups

    def load_sharded_state_dict(self, state_dict):
        """Collective over the shard group: restores this rank's state from a
        sharded_state_dict() of the same run shape (ValueError naming the first mismatch,
        nothing changed), then the dict's param_groups hyper-parameters."""
        try:
            saved, groups = self._checked(state_dict)
        except ValueError:
            # Braid's load is collective (every rank loads or none does): take part with a
            # file that cannot load, so the other ranks fail at once instead of waiting.
            try:
                self.load(os.path.join(tempfile.gettempdir(), "braid-no-such-state-file"))
            except BraidError:
                pass
            raise
        with tempfile.TemporaryDirectory(prefix="braid-state-") as tmp:
            path = os.path.join(tmp, "state")
            with open(path, "wb") as f:
                f.write(saved["state_file"])
            try:
                self.load(path)
            except BraidError as e:
                raise ValueError("rank %d: Braid refused the state_dict: %s" % (
                    saved["rank"], e.message.replace(path, "(the state_dict's state file)"))
                ) from None
        self._take_groups(groups)
