"""dfp.torch.compile: a whole torch model captured with torch.fx and run as one dfp Model.

The model is traced (torch.fx.symbolic_trace), every node is mapped to a layer of a dfp Model
(so dfp plans its memory once and fuses BatchNorm+ReLU as for its own models), the torch
module's weights are copied in, and a module comes back whose forward and backward run in dfp
while its parameters stay the torch module's: torch's optimizer updates them, and dfp copies and
re-quantizes them once per change of their version, not per call. See docs/python.md.
"""
import operator
import threading
import weakref

import numpy as np
import torch
import torch.fx as fx
import torch.fx.passes.shape_prop as shape_prop

import dfp as _dfp

__all__ = ["compile", "CompiledModule", "UnsupportedError"]


class UnsupportedError(NotImplementedError):
    """A traced model holds nodes (or settings) with no dfp equivalent; the message names each."""


def _pair(v, what, where):
    if isinstance(v, (tuple, list)):
        if len(v) != 2 or v[0] != v[1]:
            raise UnsupportedError(f"{where}: {what} {tuple(v)} is not square; dfp takes one {what} for both sides")
        return int(v[0])
    return int(v)


class _Mapper:
    """Turns the nodes of an fx graph into the layers of a dfp Model, one by one."""

    def __init__(self, gm, model, example, prefix="", features=False):
        self.torch = torch
        # Layer names: prefix + the traced module's names (a block converted inside a bigger
        # model keeps its full names). features: the output is a feature map (N, C, H, W), not
        # logits (the block's output; see output()).
        self.prefix = prefix
        self.features = features
        self.out_shape = None
        self.gm = gm
        self.m = model
        self.values = {}         # fx node -> dfp node, or ("size", fx node) for x.size(0)
        self.problems = []
        self.modules = dict(gm.named_modules())
        self.batch = int(example.shape[0])
        # torch.nn module name -> the dfp layer kind standing for it, from the layer registry
        self.registry = {k["torch_module"]: k for k in _dfp.layer_kinds() if k["torch_module"] and k["inputs"] == 1}
        self.named = set()  # modules with parameters already mapped (dfp shares no weights)
        # Shapes of every node from one forward in eval mode: BatchNorm's running statistics and
        # num_batches_tracked stay as they are, and dropout is off.
        was_training = gm.training
        gm.eval()
        with torch.no_grad():
            shape_prop.ShapeProp(gm).propagate(example)
        gm.train(was_training)

    def fail(self, node, why):
        self.problems.append(f"'{node.name}' ({node.op} {self._target_text(node)}): {why}")

    @staticmethod
    def _target_text(node):
        t = node.target
        if isinstance(t, str):
            return t
        return getattr(t, "__module__", "") + "." + getattr(t, "__name__", repr(t))

    def arg(self, node, a):
        if a not in self.values:
            raise UnsupportedError(f"'{node.name}': its input '{getattr(a, 'name', a)}' has no dfp layer")
        return self.values[a]

    def run(self):
        nn = self.torch.nn
        for node in self.gm.graph.nodes:
            try:
                if node.op == "placeholder":
                    if self.values:
                        self.fail(node, "a second input; dfp models take one image tensor")
                        continue
                    shape = node.meta["tensor_meta"].shape
                    if len(shape) != 4:
                        self.fail(node, f"input of shape {tuple(shape)}; expected (N, C, H, W)")
                        continue
                    self.values[node] = self.m.input(int(shape[1]), int(shape[2]), int(shape[3]))
                elif node.op == "call_module":
                    self.module(node, self.modules[node.target])
                elif node.op == "call_function":
                    self.function(node, node.target)
                elif node.op == "call_method":
                    self.method(node, node.target)
                elif node.op == "output":
                    self.output(node)
                else:  # get_attr
                    self.fail(node, "reads a tensor attribute inside forward")
            except UnsupportedError as e:
                self.problems.append(str(e))
            if node in self.values and not isinstance(self.values[node], tuple) and "tensor_meta" in node.meta:
                self.check_shape(node)
        if self.problems:
            raise UnsupportedError("dfp.torch.compile: these nodes have no dfp equivalent:\n  " +
                                   "\n  ".join(self.problems))

    def check_shape(self, node):
        want = tuple(int(s) for s in node.meta["tensor_meta"].shape)
        n, c, h, w = self.m.shape(self.values[node])
        got = (self.batch, c, h, w)
        if len(want) == 2:
            want = want + (1, 1)
        if want != got:
            raise UnsupportedError(f"'{node.name}': dfp's layer gives shape {got}, torch's {want}")

    # ---- modules ----
    def module(self, node, mod):
        nn = self.torch.nn
        x = self.arg(node, node.args[0]) if node.args else None
        name = self.prefix + node.target
        if any(True for _ in mod.parameters(recurse=False)):
            if name in self.named:
                raise UnsupportedError(f"'{node.name}': module '{name}' is called twice; dfp layers share no weights")
            self.named.add(name)
        else:
            name = self.lname(node)  # a parameter-free module may be called many times: each call its own layer
        if isinstance(mod, nn.Conv2d):
            where = f"Conv2d '{name}'"
            if _pair(mod.dilation, "dilation", where) != 1:
                raise UnsupportedError(f"{where}: dilation {mod.dilation}; dfp convolves without dilation")
            if isinstance(mod.padding, str):
                raise UnsupportedError(f"{where}: padding '{mod.padding}'; expected numbers")
            if mod.padding_mode != "zeros":
                raise UnsupportedError(f"{where}: padding_mode '{mod.padding_mode}'; dfp pads with zeros")
            k = _pair(mod.kernel_size, "kernel_size", where)
            self.values[node] = self.m.conv(x, mod.out_channels, k, _pair(mod.stride, "stride", where),
                                            _pair(mod.padding, "padding", where), mod.bias is not None, name,
                                            mod.groups)
        elif isinstance(mod, nn.BatchNorm2d):
            where = f"BatchNorm2d '{name}'"
            if not (mod.affine and mod.track_running_stats):
                raise UnsupportedError(f"{where}: affine and track_running_stats must be on")
            if mod.momentum is None or abs(mod.momentum - 0.1) > 1e-12:
                raise UnsupportedError(f"{where}: momentum {mod.momentum}; dfp's BatchNorm updates its running "
                                       "statistics with momentum 0.1 (torch's default)")
            self.values[node] = self.m.batchnorm(x, name, float(mod.eps))
        elif isinstance(mod, nn.ReLU):
            self.values[node] = self.m.relu(x, name)
        elif isinstance(mod, nn.MaxPool2d):
            where = f"MaxPool2d '{name}'"
            if _pair(mod.dilation, "dilation", where) != 1 or mod.return_indices:
                raise UnsupportedError(f"{where}: dilation or return_indices; dfp pools without them")
            k = _pair(mod.kernel_size, "kernel_size", where)
            s = _pair(mod.stride if mod.stride is not None else mod.kernel_size, "stride", where)
            self.values[node] = self.m.maxpool(x, k, s, _pair(mod.padding, "padding", where), bool(mod.ceil_mode), name)
        elif isinstance(mod, nn.AvgPool2d):
            self.values[node] = self.avgpool(node, x, mod.kernel_size, mod.stride, mod.padding, mod.ceil_mode,
                                             mod.count_include_pad, mod.divisor_override, name)
        elif isinstance(mod, nn.AdaptiveAvgPool2d):
            self.values[node] = self.adaptive(node, x, mod.output_size, name)
        elif isinstance(mod, nn.Flatten):
            if mod.start_dim != 1 or mod.end_dim != -1:
                raise UnsupportedError(f"Flatten '{name}': start_dim {mod.start_dim}, end_dim {mod.end_dim}; expected 1, -1")
            self.values[node] = self.m.flatten(x, name)
        elif isinstance(mod, nn.Linear):
            self.values[node] = self.m.linear(x, mod.out_features, mod.bias is not None, name)
        elif isinstance(mod, nn.Dropout):
            self.values[node] = self.m.dropout(x, float(mod.p), name) if mod.p > 0 else x
        elif isinstance(mod, nn.Identity):
            self.values[node] = x
        elif type(mod).__name__ in self.registry and type(mod).__module__.startswith("torch.nn"):
            self.values[node] = self.registry_layer(node, mod, x, name)
        else:
            raise UnsupportedError(f"'{node.name}' (module {type(mod).__name__} '{name}'): no dfp layer for it")

    def registry_layer(self, node, mod, x, name):
        """A torch.nn module that dfp's layer registry names (dfp.layer_kinds()), built from the
        module's attributes by the row's field names: a kind added to dfp compiles without code here."""
        kind = self.registry[type(mod).__name__]
        where = f"{type(mod).__name__} '{name}'"
        params = {}
        for f in kind["fields"]:
            if not f["torch_name"]:
                continue
            value = getattr(mod, f["torch_name"], None)
            if isinstance(value, (tuple, list)):
                value = _pair(value, f["torch_name"], where)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if (f["type"] == "bool" and isinstance(value, (bool, int))) or \
                    (f["type"] == "int" and number and float(value).is_integer()) or (f["type"] == "float" and number):
                params[f["name"]] = value
            elif value is not None or f["required"]:
                raise UnsupportedError(f"{where}: {f['torch_name']} is {value!r}; dfp's {kind['name']} takes "
                                       f"a {f['type']}")
        return self.m.layer(kind["name"], x, name, **params)

    def avgpool(self, node, x, kernel, stride, padding, ceil_mode, count_include_pad, divisor, name):
        where = f"avg_pool2d '{node.name}'"
        k = _pair(kernel, "kernel_size", where)
        s = _pair(stride if stride not in (None, []) else kernel, "stride", where)
        p = _pair(padding, "padding", where)
        if ceil_mode or divisor is not None or (p > 0 and not count_include_pad):
            raise UnsupportedError(f"{where}: ceil_mode, divisor_override or count_include_pad=False with padding")
        return self.m.avgpool(x, k, s, p, name)

    def adaptive(self, node, x, size, name):
        size = size if isinstance(size, (tuple, list)) else (size, size)
        if tuple(size) != (1, 1):
            raise UnsupportedError(f"'{node.name}': adaptive average pool to {tuple(size)}; dfp has the global "
                                   "one (output size 1)")
        return self.m.global_avgpool(x, name)

    def lname(self, node):
        """The dfp layer name of a function or method call node."""
        return self.prefix + node.name

    # ---- functions and methods ----
    def function(self, node, f):
        torch = self.torch
        F = torch.nn.functional
        a = node.args
        kw = node.kwargs
        if f in (F.relu, torch.relu, torch.relu_):
            self.values[node] = self.m.relu(self.arg(node, a[0]), self.lname(node))
        elif f in (operator.add, operator.iadd, torch.add):
            if len(a) != 2 or kw.get("alpha", 1) != 1 or not all(v in self.values for v in a):
                raise UnsupportedError(f"'{node.name}': add of two layer outputs (no scalars, alpha 1) expected")
            self.values[node] = self.m.add(self.arg(node, a[0]), self.arg(node, a[1]), self.lname(node))
        elif f is torch.cat:
            dim = a[1] if len(a) > 1 else kw.get("dim", 0)
            if dim not in (1, -3):
                raise UnsupportedError(f"'{node.name}': cat along dim {dim}; dfp concatenates channels (dim 1)")
            self.values[node] = self.m.concat([self.arg(node, v) for v in a[0]], self.lname(node))
        elif f is torch.flatten:
            start = a[1] if len(a) > 1 else kw.get("start_dim", 0)
            end = a[2] if len(a) > 2 else kw.get("end_dim", -1)
            if start != 1 or end != -1:
                raise UnsupportedError(f"'{node.name}': flatten({start}, {end}); expected start_dim 1, end_dim -1")
            self.values[node] = self.m.flatten(self.arg(node, a[0]), self.lname(node))
        elif f is F.adaptive_avg_pool2d:
            self.values[node] = self.adaptive(node, self.arg(node, a[0]), a[1] if len(a) > 1 else kw["output_size"],
                                              self.lname(node))
        elif f is F.max_pool2d:
            names = ["kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices"]
            v = dict(zip(names, a[1:]), **kw)
            where = f"max_pool2d '{node.name}'"
            if _pair(v.get("dilation", 1), "dilation", where) != 1 or v.get("return_indices", False):
                raise UnsupportedError(f"{where}: dilation or return_indices; dfp pools without them")
            k = _pair(v["kernel_size"], "kernel_size", where)
            stride = v.get("stride") or v["kernel_size"]
            self.values[node] = self.m.maxpool(self.arg(node, a[0]), k, _pair(stride, "stride", where),
                                               _pair(v.get("padding", 0), "padding", where),
                                               bool(v.get("ceil_mode", False)), self.lname(node))
        elif f is F.avg_pool2d:
            names = ["kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override"]
            v = dict(zip(names, a[1:]), **kw)
            self.values[node] = self.avgpool(node, self.arg(node, a[0]), v["kernel_size"], v.get("stride"),
                                             v.get("padding", 0), v.get("ceil_mode", False),
                                             v.get("count_include_pad", True), v.get("divisor_override"), self.lname(node))
        elif f is F.dropout:
            p = a[1] if len(a) > 1 else kw.get("p", 0.5)
            training = a[2] if len(a) > 2 else kw.get("training", True)
            x = self.arg(node, a[0])
            self.values[node] = self.m.dropout(x, float(p), self.lname(node)) if training and p > 0 else x
        elif f is getattr:
            raise UnsupportedError(f"'{node.name}': reads attribute '{a[1]}' of a tensor")
        else:
            raise UnsupportedError(f"'{node.name}' (function {self._target_text(node)}): no dfp layer for it")

    def method(self, node, name):
        a = node.args
        if name in ("relu", "relu_"):
            self.values[node] = self.m.relu(self.arg(node, a[0]), self.lname(node))
        elif name in ("add", "add_") and len(a) == 2 and not node.kwargs:
            self.values[node] = self.m.add(self.arg(node, a[0]), self.arg(node, a[1]), self.lname(node))
        elif name == "flatten":
            start = a[1] if len(a) > 1 else node.kwargs.get("start_dim", 0)
            if start != 1 or (len(a) > 2 and a[2] != -1):
                raise UnsupportedError(f"'{node.name}': flatten from dim {start}; expected flatten(1)")
            self.values[node] = self.m.flatten(self.arg(node, a[0]), self.lname(node))
        elif name == "size" and len(a) == 2 and a[1] == 0:
            self.values[node] = ("size", a[0])  # only as the first size of view/reshape
        elif name in ("view", "reshape"):
            dims = a[1:] if len(a) > 2 else (a[1] if isinstance(a[1], (tuple, list)) else (a[1],))
            first = dims[0] if dims else None
            batch_dim = (isinstance(first, int) and first in (-1, self.batch)) or \
                (first in self.values and self.values[first] == ("size", a[0]))
            if len(dims) != 2 or dims[1] != -1 or not batch_dim:
                raise UnsupportedError(f"'{node.name}': {name} to {dims}; dfp flattens to (N, -1) only")
            self.values[node] = self.m.flatten(self.arg(node, a[0]), self.lname(node))
        elif name == "contiguous":
            self.values[node] = self.arg(node, a[0])
        else:
            raise UnsupportedError(f"'{node.name}' (method .{name}()): no dfp layer for it")

    def output(self, node):
        out = node.args[0]
        if isinstance(out, (tuple, list)) or out not in self.values:
            raise UnsupportedError(f"'{node.name}': the model returns {type(out).__name__}; dfp models return "
                                   "one logits tensor (N, classes)")
        shape = out.meta["tensor_meta"].shape
        if self.features:
            # A block's feature map leaves dfp as plain NCHW through a flatten: the loss layer then
            # reads (N, C*H*W) "logits", which logits() returns and backward(logits_grad) takes.
            if len(shape) != 4:
                raise UnsupportedError(f"'{node.name}': output of shape {tuple(shape)}; expected (N, C, H, W)")
            self.out_shape = tuple(int(v) for v in shape[1:])
            flat = self.m.flatten(self.values[out], self.prefix + "dfp_output")
            self.m.softmax_cross_entropy(flat)
            self.logits_node = flat
            return
        if len(shape) != 2:
            raise UnsupportedError(f"'{node.name}': output of shape {tuple(shape)}; expected logits (N, classes)")
        self.m.softmax_cross_entropy(self.values[out])
        self.logits_node = self.values[out]


# A parameter that views dfp's master weights -> (weakref to its CompiledModule, its place in that
# module's parameter list): the optimizer's way to the model whose INT16 weights it has to
# re-quantize. Keyed by id (a tensor's == is elementwise) with a weak reference to the parameter,
# whose end removes the entry.
_masters = {}


def _set_master(p, compiled, i):
    key = id(p)
    _masters[key] = (weakref.ref(p, lambda _: _masters.pop(key, None)), weakref.ref(compiled), i)


def master_of(p):
    """(CompiledModule, index in its dfp_model.parameters()) whose master weights parameter p views,
    or None (p's data is its own)."""
    entry = _masters.get(id(p))
    if entry is None or entry[0]() is not p:
        return None
    c, i = entry[1](), entry[2]
    if c is None or c._dfp_index[i] < 0 or not c._views_dfp(i):
        return None
    return c, c._dfp_index[i]


def _invalid(message):
    """dfp.InvalidArgumentError as the C++ side raises it (a dfp.Error and a ValueError)."""
    e = _dfp.InvalidArgumentError(message)
    e.status = "invalid_argument"
    return e


class _Step(torch.autograd.Function):
    """The compiled model's forward and backward in dfp, inside torch autograd. The parameters
    are inputs so that autograd hands their gradients to torch (and to its optimizer).

    dfp keeps the state of one forward (its planned activations), which the next forward of any
    kind overwrites: the backward checks that its forward is still the last one (the module's
    forward count) and refuses otherwise, where it would hand torch another batch's gradients."""

    @staticmethod
    def forward(ctx, compiled, x, *params):
        ctx.compiled = compiled
        images = x.detach().to(torch.float32).contiguous().numpy()
        logits = compiled._run(lambda m: m.logits(images, train=True))
        ctx.forward_number = compiled._forwards
        return compiled._shaped(torch.from_numpy(logits))

    @staticmethod
    def backward(ctx, grad):
        c = ctx.compiled
        with c._lock:
            if ctx.forward_number != c._forwards:
                raise _invalid("dfp.torch compiled module: backward of an output whose forward is no longer dfp's "
                             f"last one ({c._forwards - ctx.forward_number} forward(s) of this module ran since, "
                             "torch.no_grad() and eval() ones included): dfp keeps one forward's state, so run "
                             "each output's backward before the module's next forward")
            m = c.dfp_model
            m.backward(grad.detach().to(torch.float32).reshape(grad.shape[0], -1).contiguous().numpy())
            grads = [torch.from_numpy(g).clone() for g in c._grad_views]  # torch copies on its threads
            dx = torch.from_numpy(m.input_grad()) if ctx.needs_input_grad[1] else None
        return (None, dx, *grads)


class CompiledModule(torch.nn.Module):
    """What dfp.torch.compile returns. `module` is the traced torch module: its parameters (this
    module's parameters()) are what torch's optimizer updates; its BatchNorm buffers follow dfp's
    running statistics after each training step.

    forward(x) in training mode needs exactly the traced batch size (dfp plans one batch); in
    eval mode any number of images (run in chunks of that size; none gives an empty result). A
    training output's backward must come before the module's next forward (dfp keeps one
    forward's state; a later backward raises dfp.Error). Calls from several threads run one at
    a time."""

    def __init__(self, module, dfp_model, param_names, buffer_names, input_grad, prefix="", out_shape=None):
        super().__init__()
        self.module = module
        self._dfp_model = dfp_model
        self._param_names = param_names
        # dfp's names of the module's tensors (prefix + the module's own), and the feature map's
        # (C, H, W) of a block that returns one instead of logits.
        self._dfp_names = [prefix + n for n in param_names + buffer_names]
        self._out_shape = out_shape
        # Zero-copy views of dfp's tensors and gradients, taken once: the model's buffers do not
        # move after build, and state()/state_dict() build their lists anew on every call.
        self._views = dfp_model.state_dict()
        state = dfp_model.state()
        self._grad_views = [state[prefix + n].grad for n in param_names]
        order = {p.name: k for k, p in enumerate(dfp_model.parameters())}
        # Each parameter's place in dfp's list (-1: dfp holds it as a buffer, no optimizer reaches it).
        self._dfp_index = [order.get(prefix + n, -1) for n in param_names]
        self._buffer_names = buffer_names
        self._input_grad = input_grad
        self._params = [module.get_parameter(n) for n in param_names]
        self._tracked = [module.get_buffer(n) for n in buffer_names]
        self._bns = [b for b in module.modules() if isinstance(b, torch.nn.BatchNorm2d)]
        self._seen = None  # the versions of the parameters and buffers dfp holds
        self.weight_syncs = 0  # re-quantizations of dfp's weights (once per change of version)
        self.weight_copies = 0  # tensors copied from torch into dfp (a parameter once, then viewed)
        # Forwards run so far: each overwrites the state dfp keeps for a backward (_Step).
        self._forwards = 0
        # One forward or backward at a time: they share the dfp model and the version bookkeeping.
        self._lock = threading.RLock()
        self.train(module.training)

    @property
    def dfp_model(self):
        """The dfp Model the forward and backward run in."""
        return self._dfp_model

    def numerics(self):
        """Per-layer DFP16 exponents, SQNR and overflow/underflow counters, as metrics.jsonl
        records them (sampled every numerics interval: dfp_model.set_numerics_interval)."""
        return self._dfp_model.numerics()

    def _run(self, call):
        """call(dfp model) as a forward: counted, under the lock."""
        with self._lock:
            self._forwards += 1
            return call(self._dfp_model)

    def _views_dfp(self, i):
        """Whether parameter or buffer i (parameters first) is a view of dfp's own tensor."""
        t = self._params[i] if i < len(self._params) else self._tracked[i - len(self._params)]
        return t.data_ptr() == self._views[self._dfp_names[i]].ctypes.data and t.dtype == torch.float32 and \
            t.is_contiguous()

    def weights_updated(self):
        """Re-copy (what is not a view of dfp's) and re-quantize before the next forward: after writes
        torch's version counter does not see."""
        self._seen = None

    def _versions(self):
        return [t._version for t in self._params] + [t._version for t in self._tracked]

    def sync_weights(self, max_abs=None):
        """Brings dfp's weights up to date and re-quantizes them, if any torch parameter or buffer
        changed since the last time (their version counters say so). Runs before every forward.

        A float32 parameter is copied into dfp once and from then on is a view of dfp's master
        weights (its .data replaced; the Parameter object stays), so torch's optimizer updates
        dfp's weights in place and no copy follows. A parameter whose data is not dfp's (replaced,
        another dtype, or viewing another plan of the same block) is copied. Buffers (BatchNorm's
        running statistics) are copied: dfp's writes to them must bump torch's version counter.
        max_abs: {index in dfp_model.parameters(): max|value|} as an optimizer's update measured
        it (dfp.torch.optim.SGD), saving the re-quantization a pass over those weights."""
        with self._lock:
            v = self._versions()
            if v == self._seen:
                return
            sd = self._views
            with torch.no_grad():
                for i, (n, t) in enumerate(zip(self._dfp_names, self._params + self._tracked)):
                    view = sd[n]
                    if self._seen is not None and v[i] == self._seen[i]:
                        continue  # unchanged since dfp took it
                    if self._views_dfp(i):
                        continue  # a view of dfp's weights: already there
                    np.copyto(view, t.detach().to(torch.float32).reshape(view.shape).numpy())
                    self.weight_copies += 1
                    if i < len(self._params) and t.dtype == torch.float32 and t.device.type == "cpu" and \
                            t.layout == torch.strided:
                        t.data = torch.from_numpy(view).view(t.shape)
                        _set_master(t, self, i)
            if max_abs:
                measured = [-1.0] * len(self._dfp_index)
                for k, m in max_abs.items():
                    measured[k] = m
                self._dfp_model.weights_updated(measured)
            else:
                self._dfp_model.weights_updated()
            self._seen = self._versions()
            self.weight_syncs += 1

    def _copy_back_buffers(self):
        sd = self._views
        with torch.no_grad():
            for n, t in zip(self._dfp_names[len(self._params):], self._tracked):
                t.copy_(torch.from_numpy(sd[n]))
            for bn in self._bns:
                if bn.num_batches_tracked is not None:
                    bn.num_batches_tracked.add_(1)
        self._seen = self._versions()

    def forward(self, x):
        with self._lock:
            return self._forward(x)

    def _forward(self, x):
        if x.dim() != 4:
            raise ValueError(f"dfp.torch compiled module: input of shape {tuple(x.shape)}; expected (N, C, H, W)")
        self.sync_weights()
        batch = self._dfp_model.batch
        if self.training:
            if x.shape[0] != batch:
                raise ValueError(f"dfp.torch compiled module: a training batch of {x.shape[0]} images; the model was "
                                 f"compiled for {batch} (the example input's batch; use drop_last=True)")
            if x.requires_grad and not self._input_grad:
                raise ValueError("dfp.torch compiled module: the input requires a gradient; compile with "
                                 "input_grad=True")
            y = _Step.apply(self, x, *self._params)
            self._copy_back_buffers()
            return y
        with torch.no_grad():
            images = x.detach().to(torch.float32).contiguous().numpy()
            if images.shape[0] == 0:  # as torch's modules: no images, no logits
                return self._shaped(torch.empty((0, self._dfp_model.classes), dtype=torch.float32))
            outs = [self._run(lambda m: m.predict(images[i:i + batch])) for i in range(0, images.shape[0], batch)]
            return self._shaped(torch.from_numpy(np.concatenate(outs)))

    def _shaped(self, y):
        """dfp's (N, classes) output as the module returns it: a block's (N, C, H, W) feature map."""
        return y if self._out_shape is None else y.reshape(y.shape[0], *self._out_shape)


def compile(model, example_input, precision="int16", ctx=None, input_grad=False, **policy):
    """Traces `model` (a torch.nn.Module returning logits (N, classes)) with torch.fx on
    `example_input` (N, C, H, W; N is the batch the dfp model is planned for), builds one dfp
    Model from it in `precision` (and the PrecisionPolicy keywords: overrides=, headroom=,
    rounding=, ...), copies the module's weights in, and returns a CompiledModule running there.

    Supported: Conv2d (square kernels, groups, bias; no dilation), BatchNorm2d (eps 1e-5,
    momentum 0.1), ReLU, MaxPool2d, AvgPool2d, adaptive average pooling to 1x1, Linear, Flatten /
    torch.flatten / view(N, -1), Dropout, Identity, add, torch.cat on channels. Anything else
    raises UnsupportedError naming every node it cannot map. The layers keep the torch module's
    names, so dfp's per-layer numerics and --override patterns use them."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"dfp.torch.compile: expected a torch.nn.Module, got {type(model).__name__}")
    example = torch.as_tensor(example_input).detach().to(torch.float32)
    if example.dim() != 4 or example.shape[0] < 1:
        raise _invalid(f"dfp.torch.compile: example_input of shape {tuple(example.shape)}; expected (N, C, H, W) "
                       "with N >= 1 (the batch the dfp model is planned for)")
    return _build(model, example, ctx, input_grad, dict(precision=precision, **policy))


def _build(model, example, ctx, input_grad, build_args, prefix="", features=False):
    """compile()'s work: `build_args` go to dfp.Model.build (precision= and policy keywords, or
    policy=). prefix: put before every layer's name; features: the model returns a feature map
    (N, C, H, W), as a block inside a converted model does (convert(example_input=))."""
    gm = fx.symbolic_trace(model)
    m = _dfp.Model(ctx or _dfp.default_context(), type(model).__name__)
    mapper = _Mapper(gm, m, example, prefix, features)
    mapper.run()
    m.build(int(example.shape[0]), input_grad=input_grad, **build_args)
    dfp_names = set(m.state_dict().keys())
    tsd = dict(model.state_dict())
    params = [n for n, _ in model.named_parameters()]
    buffers = [n for n, _ in model.named_buffers() if not n.endswith("num_batches_tracked")]
    missing = sorted(set(prefix + n for n in params + buffers) - dfp_names)
    extra = sorted(dfp_names - set(prefix + n for n in params + buffers))
    if missing or extra:
        raise UnsupportedError("dfp.torch.compile: the dfp model's tensors differ from the module's: "
                               f"only in torch {missing}, only in dfp {extra}")
    for n in params + buffers:
        if tuple(tsd[n].shape) != tuple(m.tensor(prefix + n).shape):
            raise UnsupportedError(f"dfp.torch.compile: tensor '{prefix + n}' has shape {tuple(tsd[n].shape)} in torch "
                                   f"and {tuple(m.tensor(prefix + n).shape)} in dfp")
    compiled = CompiledModule(model, m, params, buffers, input_grad, prefix, mapper.out_shape)
    compiled.sync_weights()
    return compiled
