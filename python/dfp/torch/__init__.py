"""dfp.torch: PyTorch models run in dfp (INT16 DFP16, BF16, FP16, FP32).

    import dfp.torch
    names = dfp.torch.convert(model, precision="int16", keep_fp32=["conv1", "fc"])
    ...train as usual: torch's autograd, loss and optimizer...
    dfp.torch.numerics(model)   # per-layer exponents, SQNR, overflow counters

    fast = dfp.torch.compile(model, example_input, precision="int16")   # the whole model in dfp

dfp.torch.Conv2d and dfp.torch.Linear are torch.nn.Conv2d / torch.nn.Linear with their three
passes in dfp (layers.py); convert() swaps them into any model (convert.py); compile() traces a
whole model with torch.fx into one dfp Model (compile.py). Needs Debian's python3-torch (1.13).
See docs/python.md.
"""
from .layers import Conv2d, Linear, context, dfp_layers, make_policy, set_context
from .convert import convert
from .compile import CompiledModule, UnsupportedError, compile
from .segment import Segment
from . import optim

__all__ = ["Conv2d", "Linear", "convert", "compile", "CompiledModule", "Segment", "UnsupportedError", "optim", "context",
           "set_context", "make_policy", "numerics",
           "sample_numerics", "set_numerics_interval", "weights_updated", "layer_times", "reset_layer_times"]


def numerics(model):
    """{module name: record} for every dfp layer of `model` that has run a training step in a
    reduced precision, each record as a layer of metrics.jsonl has it: 'layer', 'format'; for int16
    the DFP16 exponents 'exp_x', 'exp_w', 'exp_dy', the INT32 chain lengths 'chain_fwd',
    'chain_bwd', 'chain_wgrad', 'saturated' and 'overflow_events'; once sampled (sample_numerics,
    set_numerics_interval) 'sqnr_x_db', 'sqnr_w_db', 'sqnr_dy_db', 'overflow', 'underflow',
    'nonzero' of the last sampled step, and 'underflow' and 'nonzero' per operand ('underflow_x',
    'underflow_w', 'underflow_dy', 'nonzero_x', ...). FP32 layers have none. The layers of a
    segment (convert(example_input=)) are there by their module names too."""
    out = {}
    for name, m in dfp_layers(model):
        rec = m.dfp_numerics()
        if rec is not None:
            out[name] = rec
    for _, s in _segments(model):
        out.update(s.dfp_numerics())
    return out


def _segments(model):
    return [(n, m) for n, m in model.named_modules() if isinstance(m, Segment)]


def sample_numerics(model):
    """Measure the rounding statistics (SQNR, overflow and underflow counts) of every dfp layer of
    `model` in its next training step."""
    for _, m in dfp_layers(model):
        m._op.sample_next_step()
    for _, s in _segments(model):
        s.sample_next_step()


def set_numerics_interval(model, interval):
    """Sample the rounding statistics every `interval` training steps of each layer (0: never), as
    dfp train --numerics-every does."""
    if interval < 0:
        raise ValueError(f"dfp.torch.set_numerics_interval: interval must be >= 0, got {interval}")
    for _, m in dfp_layers(model) + _segments(model):
        m.numerics_interval = int(interval)


def weights_updated(model):
    """Make every dfp layer of `model` (a converted model or a compiled module) load its weights
    again on its next call: after writes that torch's version counter does not see
    (param.data[...] = ..., or memory written outside torch). Writes through torch's in-place
    operations (optimizers, load_state_dict, nn.init) are seen."""
    for _, m in dfp_layers(model) + _segments(model):
        m.weights_updated()
    for m in model.modules():
        if isinstance(m, CompiledModule):
            m.weights_updated()


def layer_times(model):
    """{module name: times} of every dfp layer since it was made or reset_layer_times(): seconds in
    layout conversions (NCHW <-> dfp's blocked layout), weight loads (copy, quantization, packing),
    dfp's forward and backward passes, the whole call as torch sees it (python_forward_seconds,
    python_backward_seconds), and the counts (forwards, backwards, weight_loads). Segments
    (convert(example_input=)) are not timed per layer."""
    return {name: m.dfp_times() for name, m in dfp_layers(model)}


def reset_layer_times(model):
    for _, m in dfp_layers(model):
        m.reset_dfp_times()
