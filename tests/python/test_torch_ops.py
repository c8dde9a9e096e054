"""dfp.torch.Conv2d / Linear against torch.nn.functional: forward and both gradients, per precision,
within the tolerance table (tests/common/tolerance.hpp); gradcheck of the fp32 mode; weight loads
once per version; state_dict keys; errors."""
import copy
import os
import pickle
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="/usr/bin/python3 lacks torch (Debian: apt-get install python3-torch)")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import dfp  # noqa: E402
import dfp.torch as dt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def tolerance(name):
    """A bound of the suite's one tolerance table, tests/common/tolerance.hpp (read, not copied)."""
    text = open(os.path.join(HERE, "..", "common", "tolerance.hpp")).read()
    m = re.search(r"constexpr double " + name + r" = ([0-9.e+-]+);", text)
    assert m, f"{name} not in tolerance.hpp"
    return float(m.group(1))


# Per precision, the bound on the relative L2 error of y, dx, dw and db of one layer against FP32.
# The table's per-operand bounds for a network without kinks hold for one layer a fortiori: each
# output is a sum of products of operands perturbed by at most their format's rounding (DFP16:
# 2^-13 of the tensor's maximum at headroom 2; BF16 2^-9, FP16 2^-12 relative). FP32: dfp's oneDNN
# kernels against torch's, other summation orders.
BOUND = {
    "int16": tolerance("kInt16GradRelL2Smooth"),
    "bf16": tolerance("kBf16GradRelL2Smooth"),
    "fp16": tolerance("kFp16GradRelL2Smooth"),
    "fp32": tolerance("kF32RelL2"),
}

CTX = dfp.Context(threads=2, seed=1)


def rel_l2(a, ref):
    a, ref = a.double(), ref.double()
    return float((a - ref).norm() / ref.norm())


# (in, out, kernel, stride, padding, groups, bias, input (n, h, w)): odd channel counts, strides,
# paddings (numbers and 'same'), groups and depthwise, 1x1, a 5x5 kernel, channels across a
# 16-channel block.
CONVS = [
    (3, 8, 3, 1, 1, 1, True, (4, 9, 9)),
    (16, 24, 3, 2, 1, 1, False, (3, 11, 10)),
    (12, 18, 3, 1, 1, 3, True, (2, 8, 8)),
    (17, 33, 1, 2, 0, 1, True, (2, 7, 9)),
    (5, 7, 5, 1, "same", 1, False, (2, 12, 12)),
    (8, 8, 3, 1, 1, 8, False, (2, 6, 6)),
    (20, 40, 3, 1, "valid", 4, True, (2, 7, 7)),
]


def conv_case(precision, case, seed=0):
    cin, cout, k, s, p, g, bias, (n, h, w) = case
    torch.manual_seed(seed)
    m = dt.Conv2d(cin, cout, k, stride=s, padding=p, groups=g, bias=bias, precision=precision, ctx=CTX, name="c")
    x = torch.randn(n, cin, h, w, requires_grad=True)
    return m, x


@pytest.mark.parametrize("precision", ["int16", "bf16", "fp16", "fp32"])
@pytest.mark.parametrize("case", CONVS, ids=lambda c: "x".join(map(str, c[:6])))
def test_conv2d_matches_torch_forward_and_gradients(precision, case):
    m, x = conv_case(precision, case)
    y = m(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    # The reference in float64: torch's conv on the same FP32 values.
    xr = x.detach().double().requires_grad_()
    wr = m.weight.detach().double().requires_grad_()
    br = m.bias.detach().double().requires_grad_() if m.bias is not None else None
    yr = F.conv2d(xr, wr, br, m.stride, m.padding, m.dilation, m.groups)
    yr.backward(dy.double())
    errors = {"y": rel_l2(y, yr), "dx": rel_l2(x.grad, xr.grad), "dw": rel_l2(m.weight.grad, wr.grad)}
    if br is not None:
        errors["db"] = rel_l2(m.bias.grad, br.grad)
    assert y.shape == yr.shape and y.dtype == torch.float32
    for what, e in errors.items():
        assert e <= BOUND[precision], f"{precision} {what}: relative L2 {e:.3g} > {BOUND[precision]:.3g}"
    if precision != "fp32":  # the operands were rounded: not torch's FP32 computation in disguise
        assert errors["y"] > 1e-7 and errors["dw"] > 1e-7, errors
    assert m.precision == precision


@pytest.mark.parametrize("precision", ["int16", "bf16", "fp16", "fp32"])
def test_linear_matches_torch_with_leading_dimensions(precision):
    torch.manual_seed(1)
    m = dt.Linear(37, 11, precision=precision, ctx=CTX, name="fc")
    x = torch.randn(2, 3, 37, requires_grad=True)
    y = m(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    xr = x.detach().double().requires_grad_()
    wr = m.weight.detach().double().requires_grad_()
    br = m.bias.detach().double().requires_grad_()
    F.linear(xr, wr, br).backward(dy.double())
    assert y.shape == (2, 3, 11)
    for what, a, r in (("y", y, F.linear(xr, wr, br)), ("dx", x.grad, xr.grad), ("dw", m.weight.grad, wr.grad),
                       ("db", m.bias.grad, br.grad)):
        assert rel_l2(a, r) <= BOUND[precision], f"{precision} {what}: {rel_l2(a, r):.3g}"


@pytest.mark.parametrize("case", [CONVS[0], CONVS[2], CONVS[3]], ids=["plain", "groups", "strided1x1"])
def test_gradcheck_fp32_conv(case):
    # dfp computes in float32: float64 inputs are converted on the way in and the results back. The
    # convolution is linear in each input, so central differences have no truncation error and eps
    # can be large: with eps = 1e-2 the float32 rounding of the outputs (2^-24 relative, |y| ~ 10)
    # costs ~1e-5 in a numerical derivative, well inside atol = rtol = 1e-3, while a wrong index or
    # a missing term is off by O(1).
    cin, cout, k, s, p, g, bias, (n, h, w) = case
    torch.manual_seed(2)
    m = dt.Conv2d(cin, cout, k, stride=s, padding=p, groups=g, bias=bias, precision="fp32", ctx=CTX, name="g").double()
    x = torch.randn(min(n, 2), cin, min(h, 6), min(w, 6), dtype=torch.float64, requires_grad=True)
    params = [m.weight] + ([m.bias] if bias else [])

    def fn(x, *p):
        return m._dfp_call(x, p[0], p[1] if len(p) > 1 else None)

    assert torch.autograd.gradcheck(fn, (x, *params), eps=1e-2, atol=1e-3, rtol=1e-3)


def test_gradcheck_fp32_linear():
    torch.manual_seed(3)
    m = dt.Linear(19, 5, precision="fp32", ctx=CTX, name="l").double()
    x = torch.randn(3, 19, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: m._dfp_call(x, w, b), (x, m.weight, m.bias),
                                    eps=1e-2, atol=1e-3, rtol=1e-3)


def test_weights_load_once_per_version_and_follow_the_optimizer():
    torch.manual_seed(4)
    m = dt.Conv2d(8, 16, 3, padding=1, precision="int16", ctx=CTX, name="v")
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(2, 8, 6, 6)
    for step in range(3):
        opt.zero_grad()
        m(x).square().mean().backward()
        m(x.detach())  # a second call of the same version loads nothing
        assert m.weight_loads == step + 1
        opt.step()     # a new version: the next call loads it, once
    with torch.no_grad():
        y = m(x)
        assert m.weight_loads == 4
        ref = F.conv2d(x, m.weight, m.bias, padding=1)
        assert rel_l2(y, ref) <= BOUND["int16"]  # the optimizer's latest weights, not a stale copy
        m.weight.data.mul_(-1)  # a write torch's version counter does not see ...
        m(x)
        assert m.weight_loads == 4
        dt.weights_updated(m)  # ... is announced
        assert rel_l2(m(x), -ref + 2 * F.conv2d(x, torch.zeros_like(m.weight), m.bias, padding=1)) <= BOUND["int16"]
        assert m.weight_loads == 5
        m(torch.randn(3, 8, 6, 6))  # another batch size: another plan, which loads the weights once
        assert m.weight_loads == 6 and m._op.plans == 2


def test_weight_changed_between_forward_and_backward_is_reported():
    m = dt.Conv2d(4, 4, 3, precision="int16", ctx=CTX)
    y = m(torch.randn(1, 4, 5, 5))
    with torch.no_grad():
        m.weight.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.parametrize("precision", ["fp32", "int16"])
def test_two_forwards_of_one_shape_before_backward(precision):
    # The second forward replaces dfp's saved state; the first one's backward runs its forward
    # again, so both gradients are right (in fp32 as torch's, to FP32 rounding).
    torch.manual_seed(5)
    m = dt.Conv2d(6, 10, 3, padding=1, precision=precision, ctx=CTX)
    x1 = torch.randn(2, 6, 7, 7, requires_grad=True)
    x2 = torch.randn(2, 6, 7, 7, requires_grad=True)
    (m(x1).square().sum() + 3 * m(x2).sum()).backward()
    r1 = x1.detach().clone().requires_grad_()
    r2 = x2.detach().clone().requires_grad_()
    w = m.weight.detach().clone().requires_grad_()
    b = m.bias.detach().clone().requires_grad_()
    (F.conv2d(r1, w, b, padding=1).square().sum() + 3 * F.conv2d(r2, w, b, padding=1).sum()).backward()
    bound = BOUND[precision]
    assert rel_l2(x1.grad, r1.grad) <= bound and rel_l2(x2.grad, r2.grad) <= bound
    assert rel_l2(m.weight.grad, w.grad) <= bound and rel_l2(m.bias.grad, b.grad) <= bound


def test_modules_are_torch_modules_with_torch_state_dict_keys():
    c = dt.Conv2d(3, 5, 3, bias=True, precision="bf16", ctx=CTX)
    assert isinstance(c, nn.Conv2d) and list(c.state_dict()) == ["weight", "bias"]
    assert list(dt.Linear(4, 2, bias=False, ctx=CTX).state_dict()) == ["weight"]
    torch.manual_seed(6)
    ref = nn.Conv2d(3, 5, 3)
    torch.manual_seed(6)
    same = dt.Conv2d(3, 5, 3, ctx=CTX)  # torch's initialisation, drawn the same way
    assert torch.equal(ref.weight, same.weight) and torch.equal(ref.bias, same.bias)
    x = torch.randn(2, 3, 6, 6)
    c(x)  # loads the initial weights into dfp ...
    c.load_state_dict(ref.state_dict())  # ... and load_state_dict's in-place copy is a new version
    assert torch.equal(c.weight, ref.weight)
    assert rel_l2(c(x), F.conv2d(x, ref.weight, ref.bias)) <= BOUND["bf16"]
    assert "precision=bf16" in repr(c)


def test_deepcopy_and_pickle_keep_the_layer_working():
    torch.manual_seed(7)
    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 3))
    dt.convert(m, "int16", ctx=CTX)
    x = torch.randn(2, 3, 6, 6)
    y = m(x)
    for clone in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert isinstance(clone[0], dt.Conv2d) and clone[0].precision == "int16"
        assert torch.equal(clone(x), y)


def test_unbatched_conv_input():
    m = dt.Conv2d(2, 3, 3, precision="fp32", ctx=CTX)
    x = torch.randn(2, 5, 5)
    assert torch.allclose(m(x), F.conv2d(x.unsqueeze(0), m.weight, m.bias).squeeze(0), atol=1e-5)


def test_policy_keywords_reach_dfp():
    x = torch.randn(1, 4, 5, 5, requires_grad=True)
    m = dt.Conv2d(4, 4, 3, precision="int16", headroom=4, rounding="stochastic", ctx=CTX)
    m(x).sum().backward()
    x_exp = dt.numerics(nn.Sequential(m))["0"]["exp_x"]
    m2 = dt.Conv2d(4, 4, 3, precision="int16", headroom=2, ctx=CTX)
    m2(x).sum().backward()
    assert x_exp == dt.numerics(nn.Sequential(m2))["0"]["exp_x"] + 2  # two more bits of headroom
    with pytest.raises(TypeError, match="unknown keyword"):
        dt.Conv2d(4, 4, 3, headrom=3)


def test_unsupported_settings_are_clear_errors():
    with pytest.raises(ValueError, match="dilation"):
        dt.Conv2d(4, 4, 3, dilation=2)
    with pytest.raises(ValueError, match="not square"):
        dt.Conv2d(4, 4, (3, 1))
    with pytest.raises(ValueError, match="padding_mode 'reflect'"):
        dt.Conv2d(4, 4, 3, padding=1, padding_mode="reflect")
    with pytest.raises(dfp.InvalidArgumentError, match="precision"):
        dt.Conv2d(4, 4, 3, precision="int8")
    m = dt.Conv2d(4, 4, 3, ctx=CTX, name="named")
    with pytest.raises(dfp.InvalidArgumentError, match="layer 'named'.*3 channels.*takes 4"):
        m(torch.randn(1, 3, 5, 5))
    with pytest.raises(dfp.InvalidArgumentError, match="layer 'named'.*kernel 3 larger"):
        m(torch.randn(1, 4, 2, 2))


def test_convert_swaps_supported_layers_and_warns_about_the_rest():
    torch.manual_seed(8)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=2, dilation=2),
                      nn.Sequential(nn.Conv2d(8, 8, 1)), nn.Flatten(), nn.Linear(8 * 36, 4))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)  # made before the swap
    keys = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.warns(UserWarning, match="'1' \\(Conv2d\\) stays torch's: dilation"):
        names = dt.convert(m, "int16", keep_fp32=["2.*"], ctx=CTX)
    assert names == ["0", "4"]
    assert isinstance(m[0], dt.Conv2d) and isinstance(m[4], dt.Linear)
    assert type(m[1]) is nn.Conv2d and type(m[2][0]) is nn.Conv2d
    assert m[0].dfp_name == "0" and m[4].precision == "int16"
    assert {k: v for k, v in m.state_dict().items()}.keys() == keys.keys()
    assert all(torch.equal(v, keys[k]) for k, v in m.state_dict().items())
    before = m[0].weight.detach().clone()
    m(torch.randn(2, 3, 6, 6)).sum().backward()
    opt.step()  # the optimizer made before convert updates the dfp layer's weight
    assert not torch.equal(before, m[0].weight)
    with pytest.raises(ValueError, match="dilation"):
        dt.convert(m, "int16", strict=True)


def test_convert_replaces_a_shared_module_everywhere():
    conv = nn.Conv2d(4, 4, 3, padding=1)
    m = nn.Sequential(conv, nn.ReLU(), conv)
    assert dt.convert(m, "fp32", ctx=CTX) == ["0"]
    assert m[0] is m[2] and isinstance(m[2], dt.Conv2d)


def test_numerics_per_layer_as_metrics_jsonl_has_them():
    torch.manual_seed(9)
    m = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.Flatten(),
                      nn.Linear(16 * 8 * 8, 10))
    dt.convert(m, "int16", ctx=CTX, overrides="4=bf16")
    x = torch.randn(4, 3, 8, 8)
    assert dt.numerics(m) == {}  # no training step yet
    dt.sample_numerics(m)
    F.cross_entropy(m(x), torch.randint(0, 10, (4,))).backward()
    n = dt.numerics(m)
    assert set(n) == {"0", "2", "4"}
    r = n["2"]
    assert r["layer"] == "2" and r["format"] == "int16"
    for key in ("exp_x", "exp_w", "exp_dy", "chain_fwd", "chain_bwd", "chain_wgrad", "saturated",
                "overflow_events", "sqnr_x_db", "sqnr_w_db", "sqnr_dy_db", "overflow", "underflow", "nonzero",
                "underflow_x", "underflow_w", "underflow_dy", "nonzero_x", "nonzero_w", "nonzero_dy"):
        assert key in r, key
    assert r["underflow"] == r["underflow_x"] + r["underflow_w"] + r["underflow_dy"]
    assert r["nonzero"] == r["nonzero_x"] + r["nonzero_w"] + r["nonzero_dy"]
    assert r["nonzero_x"] > 0 and r["nonzero_w"] > 0 and r["nonzero_dy"] > 0
    # DFP16 at headroom 2 keeps ~13 bits of the largest magnitude: far above 40 dB on Gaussian data.
    assert r["sqnr_x_db"] > 40 and r["sqnr_w_db"] > 40 and r["sqnr_dy_db"] > 40
    assert r["overflow_events"] == 0 and r["nonzero"] > 0
    assert n["4"]["format"] == "bf16" and "exp_x" not in n["4"] and 20 < n["4"]["sqnr_w_db"] < 80
    # x's exponent is that of max|x| (dfp.exponent_for), the weights' that of max|w|
    assert n["0"]["exp_x"] == dfp.exponent_for(float(x.abs().max()))
    assert n["0"]["exp_w"] == dfp.exponent_for(float(m[0].weight.abs().max()))
    # Every second step sampled: step 1 is not (the last sample's statistics stay), step 2 is.
    dt.set_numerics_interval(m, 2)
    F.cross_entropy(m(torch.randn(4, 3, 8, 8)), torch.randint(0, 10, (4,))).backward()
    assert dt.numerics(m)["2"]["sqnr_x_db"] == r["sqnr_x_db"]
    F.cross_entropy(m(torch.randn(4, 3, 8, 8)), torch.randint(0, 10, (4,))).backward()
    assert dt.numerics(m)["2"]["sqnr_x_db"] != r["sqnr_x_db"]


def test_layer_times_count_the_calls():
    m = nn.Sequential(nn.Conv2d(3, 8, 3))
    dt.convert(m, "int16", ctx=CTX)
    m(torch.randn(2, 3, 6, 6, requires_grad=True)).sum().backward()
    t = dt.layer_times(m)["0"]
    assert t["forwards"] == 1 and t["backwards"] == 1 and t["weight_loads"] == 1
    assert t["layout_seconds"] > 0 and t["python_forward_seconds"] >= t["forward_seconds"]
    dt.reset_layer_times(m)
    assert dt.layer_times(m)["0"]["forwards"] == 0


def test_layer_op_checks_arrays():
    op = dfp._dfp.LayerOp(CTX, "conv2d", 2, 3, kernel=3, pad=1, name="raw")
    x = np.zeros((1, 2, 4, 4), np.float32)
    w = np.zeros((3, 2, 3, 3), np.float32)
    y = np.zeros((1, 3, 4, 4), np.float32)
    op.forward(x, w, None, 1, y, False, False)
    with pytest.raises(dfp.InvalidArgumentError, match="layer 'raw': y must have shape \\(1, 3, 4, 4\\)"):
        op.forward(x, w, None, 1, np.zeros((1, 3, 4, 5), np.float32), False, False)
    with pytest.raises(dfp.InvalidArgumentError, match="x must be float32"):
        op.forward(x.astype(np.float64), w, None, 1, y, False, False)
    with pytest.raises(dfp.InvalidArgumentError, match="C-contiguous"):
        op.forward(x, np.asfortranarray(w), None, 1, y, False, False)
    with pytest.raises(dfp.InvalidArgumentError, match="no longer held"):
        op.backward(12345, y, None, w.copy(), None, [1, 2, 4, 4])
    with pytest.raises(dfp.InvalidArgumentError, match="bias must be a NumPy array"):
        op.forward(x, w, [0.0, 0.0, 0.0], 1, y, False, False)
    ro = y.copy()
    ro.setflags(write=False)
    with pytest.raises(dfp.InvalidArgumentError, match="y must be writable"):
        op.forward(x, w, None, 1, ro, False, False)
