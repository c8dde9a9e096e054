"""dfp: train CNNs on CPUs with INT16 dynamic fixed point (DFP16).

The compiled extension ``dfp._dfp`` binds dfp's C++ API; this module re-exports it and adds the
NumPy-facing helpers (quantize, dequantize), a default context, and the training entry points
(train, evaluate) with their metrics as dataclasses. See docs/python.md.
"""
import os as _os
from dataclasses import dataclass

import numpy as _np

from . import _dfp

__version__ = _dfp.__version__  # the project's version, as `dfp --version` prints it
from ._dfp import (
    DEFAULT_HEADROOM,
    MAX_HEADROOM,
    Context,
    Error,
    InvalidArgumentError,
    LayerOp,
    LossScaleOptions,
    Model,
    Parameter,
    PrecisionPolicy,
    STATE_VERSION,
    Sgd,
    StepResult,
    Tensor,
    TrainConfig,
    exponent_for,
    layer_kinds,
    sgd_update,
)
from . import models

__all__ = [
    "Context", "Error", "InvalidArgumentError", "LayerOp", "LossScaleOptions", "Model", "Parameter",
    "PrecisionPolicy", "Sgd", "StepResult", "Tensor", "TrainConfig", "EpochMetrics", "EvalResult",
    "DEFAULT_HEADROOM", "MAX_HEADROOM", "STATE_VERSION", "default_context", "quantize", "dequantize",
    "exponent_for", "layer_kinds", "save_state", "load_state", "read_state_policy", "train", "evaluate", "models",
]

_default_context = None


def default_context():
    """The context that quantize() and dequantize() use when given none: every core, the best
    kernel level (or DFP_ISA's), seed 1. Made on first use."""
    global _default_context
    if _default_context is None:
        _default_context = Context()
    return _default_context


def quantize(array, exponent=None, rounding="nearest", headroom=DEFAULT_HEADROOM, seed=0, ctx=None):
    """Quantizes `array` (converted to float32) to DFP16: returns (int16 array of the same
    shape, shared exponent), so that array ~= q * 2**exponent.

    exponent: None measures it from max|array| (floor(log2(max|x|)) - 14 + headroom); an int
    uses that one. rounding: 'nearest' (half to even), 'stochastic' (seeded by `seed`, element n's
    random number depends only on seed and n) or 'biased'. Values saturate to +-32767; NaN or Inf
    raises dfp.Error (status 'numerical_error'). Same bits as dfp's C++ kernels at every level."""
    return _dfp._quantize(ctx or default_context(), _np.asarray(array), exponent, rounding, headroom, seed)


def dequantize(q, exponent, ctx=None):
    """float32 array q * 2**exponent of an int16 array q."""
    return _dfp._dequantize(ctx or default_context(), _np.asarray(q), exponent)


def save_state(model, path):
    """Writes the built model's tensors (parameters and buffers, with their shapes) and its
    precision policy to `path` (str or os.PathLike) in dfp's checkpoint format, state version
    STATE_VERSION, atomically. dfp.Error (status 'io_error') names the file."""
    _dfp._save_state(model, _os.fspath(path))


def load_state(model, path):
    """Reads a state file (or a checkpoint of dfp.train) into the built model: every tensor of
    model.state() must be there with the model's shape; the weights are then re-quantized. The
    model keeps its precision (build it with read_state_policy(path) for the file's). dfp.Error
    names the file and the field or tensor ('io_error', 'corrupt_data')."""
    _dfp._load_state(model, _os.fspath(path))


def read_state_policy(path):
    """The PrecisionPolicy recorded in a state file (errors as load_state's)."""
    return _dfp._read_state_policy(_os.fspath(path))


@dataclass(frozen=True)
class EpochMetrics:
    """One epoch of dfp.train, as the C++ EpochMetrics (and a line of metrics.jsonl) has it."""

    epoch: int
    train_loss: float
    train_top1: float
    test_loss: float
    test_top1: float
    test_top5: float
    images_per_second: float
    data_wait_seconds: float
    epoch_seconds: float
    lr: float
    peak_rss_kib: int
    loss_scale: float
    skipped_steps: int


@dataclass(frozen=True)
class EvalResult:
    """A checkpoint evaluated on its dataset's test split (dfp.evaluate)."""

    loss: float
    top1: float
    top5: float
    images: int


def train(config=None, callback=None, log=None, **kwargs):
    """Trains as `dfp train` does and returns the list of EpochMetrics.

    config: a TrainConfig, or None to make one from the keyword arguments (its field names, and
    the policy's: precision=, overrides=, headroom=, ...). The C++ validator checks it first
    (dfp.InvalidArgumentError names the flag). callback(EpochMetrics) is called after each epoch,
    log(str) with each progress line. Runs with the GIL released; callbacks take it.

    Ctrl-C (SIGINT) stops the run after the step in progress and raises KeyboardInterrupt, whose
    `epochs` attribute lists the finished epochs' metrics; the run directory keeps their
    metrics.jsonl lines and checkpoint, so `resume=<out>/checkpoint.dfp` continues the run."""
    if config is None:
        config = TrainConfig(**kwargs)
    elif kwargs:
        raise TypeError("dfp.train: pass either a TrainConfig or keyword arguments, not both")
    on_epoch = None if callback is None else (lambda d: callback(EpochMetrics(**d)))
    done, interrupt = _dfp._train(config, on_epoch, log)
    epochs = [EpochMetrics(**d) for d in done]
    if interrupt is not None:
        # Ctrl-C (or another signal handler's exception) between steps: the run stopped there;
        # the exception carries the finished epochs' metrics.
        interrupt.epochs = epochs
        raise interrupt
    return epochs


def evaluate(checkpoint, data="", threads=0, log=None):
    """Evaluates a checkpoint written by train() on its dataset's test split (data: the dataset
    directory, "" = the one the run used). Returns an EvalResult."""
    return EvalResult(**_dfp._evaluate(checkpoint, data, threads, log))
