"""dfp.torch: PyTorch models run in dfp (INT16 DFP16, BF16, FP16, FP32).

    import dfp.torch
    fast = dfp.torch.compile(model, example_input, precision="int16")   # the whole model in dfp
    ...train `fast` as usual: torch's autograd, loss and optimizer...

Needs Debian's python3-torch (1.13). See docs/python.md.
"""
from .compile import CompiledModule, UnsupportedError, compile

__all__ = ["compile", "CompiledModule", "UnsupportedError"]
