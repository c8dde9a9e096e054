"""Runs the Python package's tests (tests/python) under pytest; ctest's entry point.

Exits 77 (ctest's SKIP_RETURN_CODE for this test) with the reason when the interpreter lacks
NumPy or pytest, so that a machine without them skips these tests instead of failing.
"""
import os
import sys

try:
    import numpy  # noqa: F401
    import pytest
except ImportError as e:
    print(f"skipped: {sys.executable} lacks {e.name} (Debian: apt-get install python3-numpy python3-pytest)")
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
# The default run leaves out the cases marked long; `--long` runs those alone.
args = sys.argv[1:]
marks = ["-m", "long"] if "--long" in args else ["-m", "not long"]
args = [a for a in args if a != "--long"]
sys.exit(pytest.main([here, "-q", "-p", "no:cacheprovider"] + marks + args))
