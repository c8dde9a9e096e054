"""dfp.quantize / dfp.dequantize: the bits of dfp's C++ kernels, checked against NumPy
reimplementations of the rounding modes and against the scalar reference kernels (isa='ref')."""
import numpy as np
import pytest

import dfp

ROUNDINGS = ["nearest", "stochastic", "biased"]


def sample(n=5000, seed=0, scale=3.0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * scale).astype(np.float32)
    x[:4] = [0.0, -0.0, 1.5, -2.5]  # exact halves at some exponents
    return x


def numpy_exponent(x, headroom):
    m = float(np.max(np.abs(x)))
    return 0 if m == 0 else int(np.frexp(np.float32(m))[1]) - 1 - 14 + headroom


def scaled(x, e):
    return x.astype(np.float64) * 2.0 ** -e  # exact: a power-of-two scaling of a float32


def numpy_nearest(x, e):
    return np.clip(np.rint(scaled(x, e)), -32767, 32767).astype(np.int16)  # rint: half to even


def numpy_biased(x, e):
    y = scaled(x, e)
    a = np.abs(y)
    fl = np.floor(a)
    return np.clip(np.copysign(np.where(a - fl >= 0.25, fl + 1, fl), y), -32767, 32767).astype(np.int16)


@pytest.mark.parametrize("headroom", [0, 2, 5])
def test_nearest_matches_numpy_round_half_even(headroom):
    x = sample()
    q, e = dfp.quantize(x, headroom=headroom)
    assert q.dtype == np.int16 and q.shape == x.shape
    assert e == numpy_exponent(x, headroom) == dfp.exponent_for(float(np.max(np.abs(x))), headroom)
    np.testing.assert_array_equal(q, numpy_nearest(x, e))


def test_nearest_rounds_exact_halves_to_even():
    q, e = dfp.quantize(np.array([0.5, 1.5, 2.5, -0.5, -1.5, 3.0], np.float32), exponent=0)
    assert e == 0
    assert q.tolist() == [0, 2, 2, 0, -2, 3]


def test_biased_matches_numpy():
    x = sample(seed=1)
    q, e = dfp.quantize(x, rounding="biased")
    np.testing.assert_array_equal(q, numpy_biased(x, e))
    q, _ = dfp.quantize(np.array([1.25, 1.2, -1.25, -0.3], np.float32), exponent=0, rounding="biased")
    assert q.tolist() == [2, 1, -2, -1]


def test_stochastic_rounds_to_a_neighbour_unbiased_and_seeded():
    x = np.full(20000, 0.3, np.float32)
    q, e = dfp.quantize(x, exponent=0, rounding="stochastic", seed=7)
    assert set(np.unique(q).tolist()) == {0, 1}
    assert abs(q.mean() - 0.3) < 0.02
    again, _ = dfp.quantize(x, exponent=0, rounding="stochastic", seed=7)
    other, _ = dfp.quantize(x, exponent=0, rounding="stochastic", seed=8)
    np.testing.assert_array_equal(q, again)
    assert not np.array_equal(q, other)
    y = sample(seed=2)
    q, e = dfp.quantize(y, rounding="stochastic", seed=3)
    fl = np.floor(scaled(y, e))
    assert np.all((q == fl) | (q == fl + 1))


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_same_bits_as_the_scalar_reference_kernels(rounding):
    ref = dfp.Context(isa="ref", threads=1)
    best = dfp.Context()
    x = sample(n=70001, seed=4, scale=0.01)  # several chunks, an odd tail
    q_ref, e_ref = dfp.quantize(x, rounding=rounding, seed=11, ctx=ref)
    q_best, e_best = dfp.quantize(x, rounding=rounding, seed=11, ctx=best)
    assert e_ref == e_best
    np.testing.assert_array_equal(q_ref, q_best)
    q2, _ = dfp.quantize(x, exponent=e_ref - 1, rounding=rounding, seed=11, ctx=ref)
    q3, _ = dfp.quantize(x, exponent=e_ref - 1, rounding=rounding, seed=11, ctx=best)
    np.testing.assert_array_equal(q2, q3)


def test_given_exponent_saturates_and_keeps_shape():
    x = np.array([[2000.0, -2000.0], [1.0, 0.25]], np.float32)
    q, e = dfp.quantize(x, exponent=-5)
    assert e == -5 and q.shape == (2, 2)
    assert q.tolist() == [[32767, -32767], [32, 8]]


def test_dequantize_is_exact_and_round_trips():
    x = sample(seed=5)
    q, e = dfp.quantize(x)
    d = dfp.dequantize(q, e)
    assert d.dtype == np.float32 and d.shape == q.shape
    np.testing.assert_array_equal(d, (q.astype(np.float64) * 2.0 ** e).astype(np.float32))
    assert np.max(np.abs(d - x)) <= 2.0 ** (e - 1)
    np.testing.assert_array_equal(dfp.quantize(d, exponent=e)[0], q)


def test_float64_and_list_inputs_are_converted_to_float32():
    q, e = dfp.quantize([0.1, 0.2, 0.3])
    q32, e32 = dfp.quantize(np.array([0.1, 0.2, 0.3], np.float32))
    assert e == e32
    np.testing.assert_array_equal(q, q32)


def test_errors_carry_status_and_message():
    with pytest.raises(dfp.Error) as info:
        dfp.quantize(np.array([1.0, np.nan], np.float32))
    assert info.value.status == "numerical_error"
    assert "first at element 1" in str(info.value)
    with pytest.raises(dfp.InvalidArgumentError) as info:
        dfp.quantize(np.ones(4, np.float32), headroom=99)
    assert isinstance(info.value, ValueError) and isinstance(info.value, RuntimeError)
    assert info.value.status == "invalid_argument" and "headroom" in str(info.value)
    with pytest.raises(ValueError, match="stochastic"):
        dfp.quantize(np.ones(4, np.float32), rounding="up")
