"""dfp.torch.Conv2d and dfp.torch.Linear: torch.nn modules whose three passes run in dfp.

Each module is a subclass of torch's own (the same constructor arguments, parameters, state_dict
keys and initialisation) that runs its forward, backward-data and weight gradient in one
dfp.LayerOp (include/dfp/layer_op.hpp) through a torch.autograd.Function. The FP32 master weights
stay torch Parameters, updated by torch's optimizer; dfp copies and re-quantizes (int16) or
re-rounds (bf16, fp16) or re-packs (fp32) them only when the parameter's version changes.
"""
import fnmatch
import time

import torch
import torch.nn as nn

from .. import _dfp
from .. import PrecisionPolicy

_context = None

# The policy keywords a module takes besides precision (PrecisionPolicy's fields, and headroom= /
# rounding= for all three tensor classes).
_CLASSES = ("weights", "activations", "gradients")
_POLICY_KEYS = {"overrides", "headroom", "rounding"} | {
    f"{c}_{f}" for c in _CLASSES for f in ("format", "headroom", "rounding")}


def context():
    """The dfp.Context the bridge's layers use unless given one: made on first use with
    torch.get_num_threads() threads (so dfp and torch share the cores alike), seed 1."""
    global _context
    if _context is None:
        _context = _dfp.Context(threads=torch.get_num_threads())
    return _context


def set_context(ctx):
    """Makes `ctx` (a dfp.Context, or None for the default one) the bridge's context for layers
    made from now on."""
    global _context
    _context = ctx


def make_policy(precision="int16", policy=None, **policy_kwargs):
    """A dfp.PrecisionPolicy from a precision name and policy keywords (headroom=, rounding=,
    weights_rounding=, ...), or `policy` itself."""
    unknown = set(policy_kwargs) - _POLICY_KEYS
    if unknown:
        raise TypeError(f"dfp.torch: unknown keyword argument(s) {sorted(unknown)}; policy keywords are "
                        f"{sorted(_POLICY_KEYS)}")
    if policy is not None:
        if policy_kwargs:
            raise TypeError("dfp.torch: pass either policy= or policy keywords, not both")
        return policy
    return PrecisionPolicy(precision=precision, **policy_kwargs)


def _policy_fields(p):
    """The keywords that remake policy p (make_policy(**fields)): pickling keeps these."""
    fields = {"precision": p.precision, "overrides": list(p.overrides)}
    for c in _CLASSES:
        fields[f"{c}_headroom"] = getattr(p, f"{c}_headroom")
        fields[f"{c}_rounding"] = getattr(p, f"{c}_rounding")
        fmt = getattr(p, f"{c}_format")
        if fmt is not None:
            fields[f"{c}_format"] = fmt
    return fields


def conv2d_unsupported(conv):
    """Why dfp cannot run torch Conv2d `conv` (a string), or None when it can."""
    k, s, d = conv.kernel_size, conv.stride, conv.dilation
    if k[0] != k[1]:
        return f"kernel_size {tuple(k)} is not square (dfp runs square kernels)"
    if s[0] != s[1]:
        return f"stride {tuple(s)} differs between height and width"
    if tuple(d) != (1, 1):
        return f"dilation {tuple(d)} (dfp's convolutions are not dilated)"
    if conv.padding_mode != "zeros":
        return f"padding_mode '{conv.padding_mode}' (dfp pads with zeros)"
    if isinstance(conv.padding, str):
        if conv.padding == "same" and k[0] % 2 == 0:
            return f"padding 'same' with the even kernel {k[0]} (asymmetric padding)"
    else:
        p = conv.padding
        if p[0] != p[1]:
            return f"padding {tuple(p)} differs between height and width"
        if not 0 <= p[0] < k[0]:
            return f"padding {p[0]} not below the kernel size {k[0]}"
    return None


def _pad_of(conv):
    if isinstance(conv.padding, str):
        return (conv.kernel_size[0] - 1) // 2 if conv.padding == "same" else 0
    return conv.padding[0]


class _LayerFunction(torch.autograd.Function):
    """The autograd node of one dfp layer call: forward and both gradients in the layer's LayerOp.

    Tensors reach dfp as float32 (others, float64 included, are converted and the results
    converted back) and contiguous. The forward keeps x and the weight for the backward: torch's
    version check on them reports a weight changed in place before the backward, and x lets the
    backward run the forward again when another forward of the same shape replaced the state dfp
    keeps (LayerOp.holds)."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer):
        want = ctx.needs_input_grad
        train = any(want[:3])
        y, ticket = layer._run_forward(x, weight, bias, train, bool(want[0]))
        ctx.layer = layer
        ctx.ticket = ticket
        if train:
            ctx.save_for_backward(x, weight, bias)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias = ctx.saved_tensors
        dx, gw, gb = ctx.layer._run_backward(ctx.ticket, x, weight, bias, dy, ctx.needs_input_grad)
        return dx, gw, gb, None


class _DfpLayer:
    """What dfp.torch.Conv2d and dfp.torch.Linear share: the LayerOp, the weights' version, the
    passes and the bridge's own timing."""

    def _dfp_init(self, kind, precision, policy, ctx, name, policy_kwargs, **spec):
        self._dfp_kind = kind
        self._dfp_spec = spec
        self._dfp_name = name
        self._dfp_policy_fields = _policy_fields(make_policy(precision, policy, **policy_kwargs))
        self._dfp_ctx = ctx
        self.numerics_interval = 0
        self._dfp_make_op()

    def _dfp_make_op(self):
        ctx = self._dfp_ctx or context()
        self._op = _dfp.LayerOp(ctx, self._dfp_kind, name=self._dfp_name,
                                policy=make_policy(**self._dfp_policy_fields), **self._dfp_spec)
        self._weights_key = None
        self._weights_version = 0
        self._python_seconds = [0.0, 0.0]  # forward, backward: the whole call, as torch sees it

    # ---- pickling and copying (a LayerOp is remade, with the default context unless one was given)
    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_op", None)
        state["_dfp_ctx"] = None
        return state

    def __setstate__(self, state):
        nn.Module.__setstate__(self, state)
        self._dfp_make_op()

    # ---- what the bridge reports
    @property
    def precision(self):
        """The precision dfp runs this layer in (the policy resolved for its name)."""
        return self._op.precision

    @property
    def dfp_name(self):
        return self._dfp_name

    @property
    def weight_loads(self):
        """How many times dfp loaded (copied and re-quantized or re-packed) the weights."""
        return self._op.times()["weight_loads"]

    def weights_updated(self):
        """Load the weights again on the next call: for writes that torch's version counter does
        not see (through .data, or from outside torch)."""
        self._weights_key = None

    def dfp_numerics(self):
        """The last training step's numerics as a metrics.jsonl layer record, or None."""
        return self._op.numerics()

    def dfp_times(self):
        t = self._op.times()
        t["python_forward_seconds"], t["python_backward_seconds"] = self._python_seconds
        return t

    def reset_dfp_times(self):
        self._op.reset_times()
        self._python_seconds = [0.0, 0.0]

    # ---- the passes
    def _weights(self, weight, bias):
        """The weight and bias as float32 NumPy arrays, and their version number: a new one when
        a parameter's torch version (or storage) changed, or when it had to be converted."""
        key = (weight._version, weight.data_ptr(), None if bias is None else (bias._version, bias.data_ptr()))
        converted = False
        w = weight.detach()
        if w.dtype != torch.float32 or not w.is_contiguous():
            w, converted = w.to(torch.float32).contiguous(), True
        b = None
        if bias is not None:
            b = bias.detach()
            if b.dtype != torch.float32 or not b.is_contiguous():
                b, converted = b.to(torch.float32).contiguous(), True
        if converted or key != self._weights_key:
            self._weights_key = None if converted else key
            self._weights_version += 1
        return w.numpy(), None if b is None else b.numpy(), self._weights_version

    def _check_device(self, x):
        if x.device.type != "cpu" or self.weight.device.type != "cpu":
            raise RuntimeError(f"dfp.torch layer '{self._dfp_name}': dfp runs on the CPU; got input on "
                               f"{x.device} and weights on {self.weight.device}")

    def _run_forward(self, x, weight, bias, train, input_grad):
        t0 = time.perf_counter()
        x32 = x.detach().to(torch.float32).contiguous()
        w, b, version = self._weights(weight, bias)
        y = torch.empty(self._op.output_shape(tuple(x32.shape)), dtype=torch.float32)
        if train and self.numerics_interval > 0 and self._op.steps % self.numerics_interval == 0:
            self._op.sample_next_step()
        ticket = self._op.forward(x32.numpy(), w, b, version, y.numpy(), train, input_grad)
        if x.dtype != torch.float32:
            y = y.to(x.dtype)
        self._python_seconds[0] += time.perf_counter() - t0
        return y, ticket

    def _run_backward(self, ticket, x, weight, bias, dy, want):
        t0 = time.perf_counter()
        x32 = x.detach().to(torch.float32).contiguous()
        if not self._op.holds(ticket):
            # Another forward of this shape replaced dfp's saved state: run this one again.
            w, b, version = self._weights(weight, bias)
            scratch = torch.empty(self._op.output_shape(tuple(x32.shape)), dtype=torch.float32)
            ticket = self._op.forward(x32.numpy(), w, b, version, scratch.numpy(), True, bool(want[0]))
        dy32 = dy.detach().to(torch.float32).contiguous()
        dx = torch.empty(x32.shape, dtype=torch.float32) if want[0] else None
        gw = torch.empty(weight.shape, dtype=torch.float32)
        gb = torch.empty(bias.shape, dtype=torch.float32) if bias is not None else None
        self._op.backward(ticket, dy32.numpy(), None if dx is None else dx.numpy(), gw.numpy(),
                          None if gb is None else gb.numpy(), list(x32.shape))
        self._python_seconds[1] += time.perf_counter() - t0
        if dx is not None and x.dtype != torch.float32:
            dx = dx.to(x.dtype)
        gw = gw.to(weight.dtype) if want[1] else None
        gb = gb.to(bias.dtype) if gb is not None and want[2] else None
        return dx, gw, gb

    def _dfp_call(self, x, weight, bias):
        self._check_device(x)
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)):
            return _LayerFunction.apply(x, weight, bias, self)
        return self._run_forward(x, weight, bias, False, False)[0]  # inference: no autograd node


class Conv2d(_DfpLayer, nn.Conv2d):
    """torch.nn.Conv2d run in dfp: forward, backward-data and weight gradient in `precision`
    ('int16', 'bf16', 'fp16', 'fp32', or a format of the comparison: 'fp8', 'mxfp8', 'mxfp6', 'mxfp4',
    'mxint8', 'posit16', 'posit16es2'; or a dfp.PrecisionPolicy as `policy`, or its keywords:
    headroom=, rounding=, weights_rounding=, ...).

    Takes torch's arguments (square kernels, equal strides and paddings, padding 'valid' or 'same'
    with odd kernels, zero padding, groups; no dilation: those raise ValueError naming the
    setting). `name` is the layer's name for the policy's overrides and the numerics (convert()
    gives the module's name in the model); `ctx` a dfp.Context (default: dfp.torch.context())."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, padding_mode="zeros", device=None, dtype=None, *, precision="int16", policy=None,
                 ctx=None, name="conv2d", **policy_kwargs):
        nn.Conv2d.__init__(self, in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                           padding_mode, device, dtype)
        why = conv2d_unsupported(self)
        if why:
            raise ValueError(f"dfp.torch.Conv2d '{name}': {why}")
        self._dfp_init("conv2d", precision, policy, ctx, name, policy_kwargs, in_channels=in_channels,
                       out_channels=out_channels, kernel=self.kernel_size[0], stride=self.stride[0],
                       pad=_pad_of(self), groups=groups, bias=bias)

    def forward(self, x):
        if x.dim() == 3:  # torch's unbatched (C, H, W)
            return self._dfp_call(x.unsqueeze(0), self.weight, self.bias).squeeze(0)
        return self._dfp_call(x, self.weight, self.bias)

    def extra_repr(self):
        return super().extra_repr() + f", precision={self.precision}, dfp_name={self._dfp_name!r}"


class Linear(_DfpLayer, nn.Linear):
    """torch.nn.Linear run in dfp in `precision` (see Conv2d). Inputs (*, in_features)."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, *, precision="int16",
                 policy=None, ctx=None, name="linear", **policy_kwargs):
        nn.Linear.__init__(self, in_features, out_features, bias, device, dtype)
        self._dfp_init("linear", precision, policy, ctx, name, policy_kwargs, in_channels=in_features,
                       out_channels=out_features, bias=bias)

    def forward(self, x):
        lead = x.shape[:-1]
        y = self._dfp_call(x.reshape(-1, self.in_features), self.weight, self.bias)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self):
        return super().extra_repr() + f", precision={self.precision}, dfp_name={self._dfp_name!r}"


def dfp_layers(model):
    """(name, module) of every dfp.torch layer in `model` (named_modules order)."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, _DfpLayer)]


def matches(name, patterns):
    """Whether module name `name` matches one of the glob patterns ('*', '?', '[...]')."""
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)
