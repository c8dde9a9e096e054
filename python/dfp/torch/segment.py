"""dfp.torch.convert(example_input=...): blocks of a torch model that run whole in dfp.

A block (a child module such as torchvision's BasicBlock, or an nn.Sequential of them) whose
forward dfp can trace and map takes one feature map and returns one. Converting it whole keeps
dfp's blocked DFP16 layout between its layers and runs its BatchNorm, ReLU and residual adds in
dfp (BatchNorm+ReLU fused), where the per-layer convert pays a layout conversion at every
convolution and runs those layers in torch. Each block is one dfp Model planned for a batch size
(compile.py's machinery, with a feature map instead of logits as its output).
"""
import torch
import torch.nn as nn

from .compile import _build
from .layers import _policy_fields, make_policy

# Models kept per block: the training batch and, with drop_last=False, the last partial batch.
_MAX_PLANS = 2


class Segment(nn.Module):
    """A block of a converted model running in dfp. It takes over the block's attributes (its
    children, parameters and buffers are the same objects, so state_dict keys, values and any
    optimizer holding the parameters are unchanged) and runs the block's traced graph as one dfp
    Model per (batch size, input gradient) it meets, planned on first use. Eval mode takes any
    batch size."""

    def __init__(self, block, name, in_shape, policy, ctx):
        super().__init__()
        self.__dict__.update({k: v for k, v in block.__dict__.items()})
        self._dfp_block_type = type(block)
        self._dfp_name = name
        self._dfp_in_shape = tuple(int(v) for v in in_shape)  # (C, H, W)
        self._dfp_policy_fields = _policy_fields(policy)
        self._dfp_ctx = ctx
        self._dfp_plans = {}  # (batch, input_grad) -> CompiledModule
        self.numerics_interval = 0
        self._dfp_sample_next = False
        self._dfp_steps = 0  # training forwards, for numerics_interval

    # ---- pickling and copying: the dfp Models are planned again on first use
    def __getstate__(self):
        state = self.__dict__.copy()
        state["_dfp_plans"] = {}
        state["_dfp_ctx"] = None
        return state

    def _block(self):
        """The block as its own class over this module's attributes (the same children,
        parameters and buffers), for tracing its forward."""
        block = self._dfp_block_type.__new__(self._dfp_block_type)
        block.__dict__.update({k: v for k, v in self.__dict__.items() if not k.startswith("_dfp_")})
        return block

    # The block's own methods and indexing (nn.Sequential's seg[0], len(seg)) on the same children.
    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            t = self.__dict__.get("_dfp_block_type")
            if t is None or name.startswith("__") or not hasattr(t, name):
                raise
            return getattr(self._block(), name)

    def __getitem__(self, i):
        return self._block()[i]

    def __len__(self):
        return len(self._block())

    def __iter__(self):
        return iter(self._block())

    def plan(self, batch, input_grad):
        """The dfp Model for training batches of `batch` images (built on first use)."""
        key = (int(batch), bool(input_grad))
        c = self._dfp_plans.get(key)
        if c is None:
            if len(self._dfp_plans) >= _MAX_PLANS:
                self._dfp_plans.pop(next(iter(self._dfp_plans)))
            example = torch.zeros((key[0],) + self._dfp_in_shape)
            c = _build(self._block(), example, self._dfp_ctx, key[1],
                       {"policy": make_policy(**self._dfp_policy_fields)}, self._dfp_name + ".", True)
            self._dfp_plans[key] = c
        return c

    def forward(self, x):
        if x.dim() != 4 or tuple(x.shape[1:]) != self._dfp_in_shape:
            raise ValueError(f"dfp.torch segment '{self._dfp_name}': input of shape {tuple(x.shape)}; converted "
                             f"for (N, {', '.join(map(str, self._dfp_in_shape))})")
        if x.device.type != "cpu":
            raise RuntimeError(f"dfp.torch segment '{self._dfp_name}': dfp runs on the CPU; got input on {x.device}")
        if self.training:
            c = self.plan(x.shape[0], x.requires_grad)
            # Numerics sampled on this segment's training steps, whichever plan runs them.
            sample = self._dfp_sample_next or (self.numerics_interval > 0 and
                                               self._dfp_steps % self.numerics_interval == 0)
            c.dfp_model.set_numerics_interval(1 if sample else 0)
            self._dfp_sample_next = False
            self._dfp_steps += 1
        else:
            c = next(iter(self._dfp_plans.values()), None) or self.plan(max(1, x.shape[0]), False)
        c.training = self.training
        y = c(x)
        return y if x.dtype == torch.float32 else y.to(x.dtype)

    # ---- what the bridge reports (dfp.torch.numerics and the others)
    def dfp_numerics(self):
        """{layer name: record} of the block's reduced-precision layers from its last training step."""
        out = {}
        for c in self._dfp_plans.values():
            for rec in c.numerics():
                out[rec["layer"]] = rec
        return out

    def sample_next_step(self):
        self._dfp_sample_next = True

    def weights_updated(self):
        for c in self._dfp_plans.values():
            c.weights_updated()

    def extra_repr(self):
        return f"dfp segment {self._dfp_name!r} of {self._dfp_block_type.__name__}, input (N, " + \
            ", ".join(map(str, self._dfp_in_shape)) + ")"


def find_blocks(model, example, policy, ctx, keep_fp32, matches):
    """{id(module): (name, Segment)} for the largest blocks of `model` that dfp runs whole: a child
    module (not the model itself) with children of its own and a Conv2d among them, called once
    in a forward of `example` (run in eval mode without gradients) with one (N, C, H, W) tensor and
    returning one, whose modules keep_fp32 does not name, and whose graph dfp maps. A block that
    fails (a node dfp has no layer for, control flow torch.fx cannot trace) is searched for
    smaller blocks inside it."""
    seen = {}

    def hook(mod, inputs, output):
        ok = (id(mod) not in seen and len(inputs) == 1 and torch.is_tensor(inputs[0]) and inputs[0].dim() == 4
              and torch.is_tensor(output) and output.dim() == 4)
        # The shape, and whether the input is the images (no input gradient in training then).
        seen[id(mod)] = (tuple(inputs[0].shape[1:]), inputs[0] is example) if ok else None

    handles = [m.register_forward_hook(hook) for m in model.modules() if m is not model]
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(example)
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()

    chosen = {}

    def visit(prefix, module):
        for cname, child in module.named_children():
            full = prefix + cname
            info = seen.get(id(child))
            names = [full] + [full + "." + n for n, _ in child.named_modules() if n]
            if (info is not None and any(True for _ in child.children()) and
                    any(type(m) is nn.Conv2d for m in child.modules()) and
                    not any(matches(n, keep_fp32) for n in names) and
                    all(p.device.type == "cpu" for p in child.parameters())):
                seg = Segment(child, full, info[0], policy, ctx)
                try:
                    seg.plan(example.shape[0], not info[1])
                except Exception:  # noqa: BLE001 - nodes dfp has no layer for, or a forward fx cannot trace
                    seg = None
                if seg is not None:
                    chosen[id(child)] = (full, seg)
                    continue
            visit(full + ".", child)

    visit("", model)
    return chosen
