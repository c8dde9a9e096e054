"""cmake --install puts the package where /usr/bin/python3 imports it: under a chosen prefix with
PYTHONPATH, and under the default prefix on the interpreter's own sys.path."""
import os
import subprocess
import sys

import pytest

BUILD = os.environ.get("DFP_BUILD_DIR")
INSTALL_DIR = os.environ.get("DFP_PYTHON_INSTALL_DIR")
needs_build = pytest.mark.skipif(not BUILD or not INSTALL_DIR,
                                 reason="DFP_BUILD_DIR / DFP_PYTHON_INSTALL_DIR not set (ctest sets them)")


@needs_build
def test_installed_package_imports_from_a_prefix(tmp_path):
    prefix = tmp_path / "prefix"
    subprocess.run(["cmake", "--install", BUILD, "--prefix", str(prefix)], check=True, capture_output=True)
    site = prefix / INSTALL_DIR
    assert (site / "dfp" / "__init__.py").is_file()
    assert (site / "dfp" / "torch" / "convert.py").is_file()  # the subpackage keeps its folder
    env = dict(os.environ, PYTHONPATH=str(site))
    out = subprocess.run([sys.executable, "-c", "import dfp; print(dfp.__file__); print(dfp.quantize([1.0])[1])"],
                         check=True, capture_output=True, text=True, env=env, cwd=tmp_path).stdout.split()
    assert out[0].startswith(str(site)) and out[1] == "-12"  # 1.0 at the default headroom 2


@needs_build
def test_default_prefix_is_on_the_interpreters_path():
    prefix = subprocess.run(["cmake", "-L", "-N", BUILD], check=True, capture_output=True, text=True).stdout
    prefix = [line.split("=", 1)[1] for line in prefix.splitlines() if line.startswith("CMAKE_INSTALL_PREFIX:")][0]
    if prefix != "/usr/local":
        pytest.skip(f"this build installs to {prefix}, not the default prefix")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    path = subprocess.run([sys.executable, "-c", "import sys; print('\\n'.join(sys.path))"], check=True,
                          capture_output=True, text=True, env=env).stdout.splitlines()
    assert os.path.join(prefix, INSTALL_DIR) in path
