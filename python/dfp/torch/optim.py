"""dfp.torch.optim: torch optimizers whose update runs in dfp.

SGD is torch.optim.SGD with its update in one pass of dfp's kernel on dfp's threads. That pass
also measures each tensor's max|w|, so a dfp.torch.compile'd module or convert(example_input=)
segment, whose parameters view dfp's master weights, re-quantizes its INT16 weights right after
the update without a pass of its own: the optimizer step `dfp train` runs.
"""
import torch
from torch.optim.optimizer import Optimizer, required

import dfp as _dfp

from .compile import master_of
from .layers import context


def _in_place(t):
    """Whether dfp's kernel can update t where it is: a dense float32 tensor on the CPU, contiguous."""
    return t.dtype == torch.float32 and t.device.type == "cpu" and t.layout == torch.strided and t.is_contiguous()


class SGD(Optimizer):
    """torch.optim.SGD(params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False) with the
    same arithmetic per value (g' = g + weight_decay*w; v = momentum*v + g'; w -= lr*v, or
    lr*(g' + momentum*v) with Nesterov) and the same state: momentum buffers in
    self.state[p]["momentum_buffer"], so state_dict() and load_state_dict() move between the two.
    Every dense float32 CPU parameter is updated by dfp's kernel in one pass on dfp's threads
    (ctx, or dfp.torch's context); any other (another dtype or device, sparse gradients) by torch's
    SGD. After the update the dfp models whose master weights the parameters view re-quantize once,
    from the maxima the pass measured. dampening and maximize are refused (dfp's update has
    neither); use torch.optim.SGD for them."""

    def __init__(self, params, lr=required, momentum=0, dampening=0, weight_decay=0, nesterov=False, *,
                 maximize=False, ctx=None):
        if lr is not required and not lr >= 0.0:
            raise ValueError(f"dfp.torch.optim.SGD: lr: expected a learning rate >= 0, got {lr}")
        if not momentum >= 0.0:
            raise ValueError(f"dfp.torch.optim.SGD: momentum: expected a value >= 0, got {momentum}")
        if not weight_decay >= 0.0:
            raise ValueError(f"dfp.torch.optim.SGD: weight_decay: expected a value >= 0, got {weight_decay}")
        if dampening != 0:
            raise ValueError(f"dfp.torch.optim.SGD: dampening={dampening}: dfp's update has no dampening; expected 0 "
                             "(torch.optim.SGD has it)")
        if maximize:
            raise ValueError("dfp.torch.optim.SGD: maximize=True: expected False (torch.optim.SGD has it)")
        if nesterov and momentum <= 0:
            raise ValueError("dfp.torch.optim.SGD: nesterov=True needs momentum > 0")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=0, weight_decay=weight_decay,
                                      nesterov=nesterov, maximize=False, foreach=None))
        self._ctx = ctx

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        measured = {}  # id(CompiledModule) -> (module, {index in its dfp model's parameters: max|w|})
        for group in self.param_groups:
            fast, other = [], []
            for p in group["params"]:
                if p.grad is not None:
                    (fast if _in_place(p) and not p.grad.is_sparse else other).append(p)
            if other:
                self._torch_step(group, other)
            if not fast:
                continue
            bufs = []
            for p in fast:
                buf = self.state[p].get("momentum_buffer")
                if buf is None or not _in_place(buf) or buf.shape != p.shape:
                    buf = torch.zeros_like(p, memory_format=torch.contiguous_format)  # v = 0: torch's first step
                    self.state[p]["momentum_buffer"] = buf
                bufs.append(buf)
            maxima = _dfp.sgd_update(self._ctx or context(), [p.detach().numpy() for p in fast],
                                     [p.grad.detach().to(torch.float32).numpy() for p in fast],
                                     [b.numpy() for b in bufs], float(group["lr"]), float(group["momentum"]),
                                     float(group["weight_decay"]), bool(group["nesterov"]))
            for p, m in zip(fast, maxima):
                p.detach().view(-1)[:0].zero_()  # an in-place change, as torch's own update: its version moves
                owner = master_of(p)
                if owner is not None:
                    measured.setdefault(id(owner[0]), (owner[0], {}))[1][owner[1]] = m
        for c, max_abs in measured.values():
            c.sync_weights(max_abs)
        return loss

    def _torch_step(self, group, params):
        bufs = [self.state[p].get("momentum_buffer") for p in params]
        torch.optim._functional.sgd(
            params, [p.grad for p in params], bufs, weight_decay=group["weight_decay"], momentum=group["momentum"],
            lr=group["lr"], dampening=0, nesterov=group["nesterov"], maximize=False)
        for p, b in zip(params, bufs):  # the buffers torch made on a first step
            self.state[p]["momentum_buffer"] = b
