"""Gradient norms of a sharded step: clip_grad_norm_ and grad_norm for ShardedAdamW / ShardedSGD.

torch's loop clips between backward and step:

    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)   # refused under Braid (p.grad)
    opt.step()

Braid's sharded step runs during the backward (overlap) on gradient shards, so clipping is
configured when the optimizer is built and applied inside the step, exactly (the global
2-norm over every rank's shards, torch's max_norm / (norm + 1e-6) coefficient clamped to 1):

    opt = ShardedAdamW(model.parameters(), lr=1e-3, max_grad_norm=1.0)
    loss.backward()
    norm = opt.clip_grad_norm_(1.0)     # the step's global norm before clipping, as torch's
    opt.step()

Contract:
  - clip_grad_norm_(max_norm, norm_type=2.0, error_if_nonfinite=False): max_norm must be the
    max_grad_norm given at construction (ValueError saying what to pass otherwise), the
    2-norm only; returns the global gradient norm of the step of the last synced backward as
    a 0-dim tensor of the parameters' dtype. error_if_nonfinite=True needs
    skip_nonfinite=True (the step already ran: Braid drops a non-finite step on every rank,
    then this raises torch's error). With overlap=False the step runs here (the
    param_groups are read now) and step() then only returns.
  - grad_norm(): the last completed step's global gradient norm (before clipping) as a float,
    for logging; waits for the step in flight. Computed when max_grad_norm > 0,
    skip_nonfinite or track_grad_norm=True (host parameters: one more read of each gradient
    shard before its step and one 2-double all-reduce after the last bucket's gather started;
    the steps keep overlapping the backward); RuntimeError naming track_grad_norm otherwise.
The host class provides: optimizer (braid.core.Optimizer), ddp (the wrapper, with _armed and
_params), _overlap, _max_grad_norm, _skip_nonfinite, _track_grad_norm, _stepped_early and
_step_now().
"""

import math

import torch


class GradNorms:
    """Mixin of _ShardedOptimizer: clip_grad_norm_ and grad_norm (module docstring)."""

    def _norm_report(self, who):
        """The last completed step's (norm, skipped), after waiting for the step in flight."""
        self.optimizer.wait_all_params()
        report = self.optimizer.last_step()
        if report.rounds == 0:
            raise RuntimeError("%s: no step has completed yet (call it after a synced "
                               "backward)" % who)
        if report.grad_norm < 0:
            raise RuntimeError("%s: the last step has no gradient norm (its reduction or the "
                               "norm's all-reduce failed: see the error of that backward)" % who)
        return report.grad_norm, report.skipped

    def grad_norm(self):
        """The global gradient 2-norm (before clipping) of the last completed step, for
        logging (module docstring: when it is computed)."""
        who = "%s.grad_norm()" % type(self).__name__
        if not (self._max_grad_norm > 0 or self._skip_nonfinite or self._track_grad_norm):
            raise RuntimeError(
                "%s: the norm is not computed; pass track_grad_norm=True to %s(...) (one more "
                "read of each gradient shard and a 2-double all-reduce per step, overlapped) "
                "or max_grad_norm=... (clipping, which reports it too)" %
                (who, type(self).__name__))
        return self._norm_report(who)[0]

    def clip_grad_norm_(self, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
        """torch.nn.utils.clip_grad_norm_'s idiom for a sharded step (module docstring)."""
        cls = type(self).__name__
        who = "%s.clip_grad_norm_" % cls
        if float(norm_type) != 2.0:
            raise ValueError("%s(norm_type=%r): Braid clips by the global 2-norm; pass "
                             "norm_type=2.0" % (who, norm_type))
        max_norm = float(max_norm)
        if not self._max_grad_norm > 0:
            raise ValueError(
                "%s(max_norm=%g): Braid clips inside the step, which runs during the "
                "backward, so clipping is set when the optimizer is built: pass "
                "max_grad_norm=%g to %s(...); clip_grad_norm_(%g) then returns the step's "
                "global norm" % (who, max_norm, max_norm, cls, max_norm))
        if max_norm != self._max_grad_norm:
            raise ValueError(
                "%s(max_norm=%g), but this optimizer clips to max_grad_norm=%g (set at "
                "construction; the step has already used it): pass %g, or build the "
                "optimizer with max_grad_norm=%g" % (who, max_norm, self._max_grad_norm,
                                                     self._max_grad_norm, max_norm))
        if error_if_nonfinite and not self._skip_nonfinite:
            raise ValueError(
                "%s(error_if_nonfinite=True): the step has already run; pass "
                "skip_nonfinite=True to %s(...) so that a non-finite step is dropped on every "
                "rank (nothing changes), then this raises as torch does" % (who, cls))
        if self.ddp._armed != "sync":
            raise RuntimeError(
                "%s after a no_sync() backward: Braid clips the accumulated gradients in the "
                "step of the synced backward that ends the window; call it after that "
                "backward" % who)
        if not (self._overlap or self._stepped_early):
            self._step_now()  # overlap=False: the step runs here, step() then only returns
            self._stepped_early = True
        norm, skipped = self._norm_report(who)
        if error_if_nonfinite and (skipped or not math.isfinite(norm)):
            raise RuntimeError(
                "The total norm of order 2.0 for gradients from `parameters` is non-finite, "
                "so it cannot be clipped (Braid dropped this step on every rank: "
                "skip_nonfinite)")
        dtype = self.ddp._params[0].dtype if self.ddp._params else torch.float32
        return torch.tensor(norm, dtype=dtype if dtype.is_floating_point else torch.float32)
