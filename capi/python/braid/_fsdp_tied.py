"""Tied parameters across fully sharded units (braid/fsdp.py): GPT-2's embedding weight, shared
with its LM head, registered by two modules that lie in different units (or one in a unit and
one at the root).

    fully_shard(net.wte); fully_shard(net.head)      # head.weight is wte.weight
    fully_shard(net)                                  # wte's unit owns it; head's borrows it

Contract: a parameter registered by modules of several units belongs to one, the unit of the
first registering module in module order (the same on every rank); every other of those units
borrows the owner: entering it (forward or backward) also enters the owner unless that is
entered already, and the owner is released only once no unit that entered or borrowed it is
still entered (a hold count per unit); a unit gathered from the forward is entered again for
the backward, as the root kept into its backward is. So whichever module reads the parameter finds it
gathered, and its gradient (autograd sums both uses before its one hook) is reduced once, in
the owner's buckets. Models without such parameters do not use this (fsdp.py keeps its own
path, unchanged).
"""

_ROOT = 0


def tied_owners(module, unit_modules, owner):
    """Resolves parameters registered in several units. `owner`: id(p) -> unit as fsdp.py found
    it (innermost unit containing it; conflicts left to this). Returns (owner, borrows) with
    borrows: unit -> sorted owner units it borrows; ({}, as given) when nothing is tied."""
    unit_of_module = {}
    units = {id(m): u for u, m in enumerate(unit_modules, 1)}
    depth = lambda m: sum(1 for _ in m.modules())  # noqa: E731 (outer units first: larger)
    for m in sorted(unit_modules, key=depth, reverse=True):
        for sub in m.modules():
            unit_of_module[id(sub)] = units[id(m)]  # inner units (visited later) override
    users = {}  # id(p) -> units of its registering modules, in module order
    for m in module.modules():
        for p in m._parameters.values():
            if p is None or not p.requires_grad:
                continue
            u = unit_of_module.get(id(m), _ROOT)
            seen = users.setdefault(id(p), [])
            if u not in seen:
                seen.append(u)
    borrows = {}
    for pid, us in users.items():
        if len(us) < 2:
            continue
        owner[pid] = us[0]
        for u in us[1:]:
            borrows.setdefault(u, set()).add(us[0])
    return owner, {u: sorted(o) for u, o in borrows.items()}


class TiedUnits:
    """Hold counts over fsdp's unit entries: fsdp._enter_unit / _exit_unit do the gathering."""

    def __init__(self, fsdp, borrows):
        self._fsdp = fsdp
        self.borrows = borrows
        self._holders = {}  # unit -> units holding it entered (itself, or its borrowers)

    def enter(self, unit, phase):
        f = self._fsdp
        for u in [unit] + self.borrows.get(unit, []):
            if u not in f._entered:
                self._holders[u] = set()  # (a stale count from an abandoned step: reset)
                f._enter_unit(u, phase)
            elif f._entered[u] != phase:
                f._enter_unit(u, phase)  # gathered from the forward: entered for backward
            self._holders.setdefault(u, set()).add(unit)

    def exit(self, unit, phase):
        f = self._fsdp
        for u in [unit] + self.borrows.get(unit, []):
            held = self._holders.get(u, set())
            held.discard(unit)
            if not held and u in f._entered:
                f._exit_unit(u, f._entered[u])

    def exit_all(self, phase):
        """Every unit entered in `phase`, innermost first, whatever holds it."""
        f = self._fsdp
        for u in sorted((u for u, ph in f._entered.items() if ph == phase), reverse=True):
            self._holders.pop(u, None)
            if u in f._entered:
                f._exit_unit(u, phase)
