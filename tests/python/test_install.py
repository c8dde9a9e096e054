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


def test_version_is_the_projects():
    import re

    import dfp
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "CMakeLists.txt"), encoding="utf-8") as f:
        version = re.search(r"project\(dfp VERSION ([0-9.]+)", f.read()).group(1)
    assert dfp.__version__ == version


# pip install: pyproject.toml's in-tree backend (python/build_backend.py) builds the package in the
# build directory that ctest names (already built: only a check that dfp_python is current) and
# installs it into a venv that sees Debian's NumPy and torch; nothing is downloaded (--no-index).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _clean_env():
    """The environment for the venv's interpreter and pip: the build directory named, no
    PYTHONPATH (it would import the build tree's package), no pip configuration of this machine."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("PIP_")}
    env.update(DFP_BUILD_DIR=BUILD, PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return env


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    if not BUILD:
        pytest.skip("DFP_BUILD_DIR not set (ctest sets it)")
    if os.environ.get("DFP_SANITIZED"):
        pytest.skip("a sanitizer build's module needs its runtime preloaded; pip builds from a plain build")
    path = tmp_path_factory.mktemp("venv")
    made = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(path)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"{sys.executable} -m venv failed (Debian: python3-venv): {made.stderr.strip()[-300:]}")
    python = str(path / "bin" / "python")
    if subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        pytest.skip("the venv has no pip (Debian: python3-pip, python3-venv)")
    return python


def _pip(python, *args):
    r = subprocess.run([python, "-m", "pip", *args], capture_output=True, text=True, env=_clean_env())
    assert r.returncode == 0, f"pip {' '.join(args)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


def _project_version():
    import re
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        return re.search(r"project\(dfp VERSION ([0-9.]+)", f.read()).group(1)


def _check_installed(python, cwd):
    """dfp and dfp.torch import from the venv (not the checkout) and run."""
    code = ("import json, dfp, numpy\n"
            "q, e = dfp.quantize(numpy.array([1.0, -0.5], numpy.float32))\n"
            "out = dict(file=dfp.__file__, version=dfp.__version__, q=q.tolist(), e=e)\n"
            "try:\n    import torch\nexcept ImportError:\n    torch = None\n"
            "if torch is not None:\n"
            "    import dfp.torch as dt\n"
            "    out['torch'] = dt.__file__\n"
            "    out['conv'] = list(dt.Conv2d(3, 4, 3, precision='int16')(torch.ones(1, 3, 5, 5)).shape)\n"
            "print(json.dumps(out))\n")
    r = subprocess.run([python, "-c", code], capture_output=True, text=True, env=_clean_env(), cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    import json
    out = json.loads(r.stdout.splitlines()[-1])
    site = os.path.dirname(os.path.dirname(python))  # the venv
    assert out["file"].startswith(site + os.sep), out["file"]
    assert out["version"] == _project_version()
    assert out["q"] == [4096, -2048] and out["e"] == -12  # 1.0 at the default headroom 2
    if "torch" in out:
        assert out["torch"].startswith(site + os.sep) and out["conv"] == [1, 4, 3, 3]


def test_pip_installs_the_package_into_a_venv(venv, tmp_path):
    _pip(venv, "install", "--no-build-isolation", "--no-index", ROOT)
    _check_installed(venv, tmp_path)


def test_pip_installs_offline_with_build_isolation(venv, tmp_path):
    _pip(venv, "uninstall", "--yes", "dfp")
    _pip(venv, "install", "--no-index", ROOT)  # the isolated build environment needs nothing
    _check_installed(venv, tmp_path)


@pytest.mark.skipif(not BUILD or bool(os.environ.get("DFP_SANITIZED")),
                    reason="DFP_BUILD_DIR not set (ctest sets it), or a sanitizer build")
def test_wheel_is_complete_and_valid(tmp_path):
    """build_wheel's zip: every python/dfp module and the extension for this interpreter, the
    dist-info (METADATA with the project's version, WHEEL with the interpreter's tag, RECORD with
    each file's sha256 and size), and an extension that needs nothing from the build directory."""
    import base64
    import csv
    import hashlib
    import io
    import sysconfig
    import zipfile

    code = "import sys, build_backend as b; print(b.build_wheel(sys.argv[1]))"
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                       env=dict(_clean_env(), PYTHONPATH=os.path.join(ROOT, "python")))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    name = r.stdout.splitlines()[-1]
    version = _project_version()
    py = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    tag = f"{py}-{py}-{sysconfig.get_platform().replace('-', '_').replace('.', '_')}"
    assert name == f"dfp-{version}-{tag}.whl"
    info = f"dfp-{version}.dist-info"
    ext = "dfp/_dfp" + sysconfig.get_config_var("EXT_SUFFIX")
    with zipfile.ZipFile(tmp_path / name) as z:
        assert z.testzip() is None
        names = z.namelist()
        modules = sorted(os.path.relpath(os.path.join(top, n), os.path.join(ROOT, "python")).replace(os.sep, "/")
                         for top, _, files in os.walk(os.path.join(ROOT, "python", "dfp"))
                         for n in files if n.endswith(".py"))
        assert sorted(n for n in names if n.endswith(".py")) == modules  # each is in python/CMakeLists.txt
        assert sorted(names) == sorted(modules + [ext] + [f"{info}/{f}" for f in ("METADATA", "WHEEL", "RECORD")])
        meta = z.read(f"{info}/METADATA").decode()
        assert "Name: dfp\n" in meta and f"Version: {version}\n" in meta and "Requires-Dist: numpy\n" in meta
        wheel = z.read(f"{info}/WHEEL").decode()
        assert f"Tag: {tag}\n" in wheel and "Root-Is-Purelib: false\n" in wheel
        record = list(csv.reader(io.StringIO(z.read(f"{info}/RECORD").decode())))
        assert sorted(row[0] for row in record) == sorted(names)
        for path, digest, size in record:
            if path == f"{info}/RECORD":
                assert digest == size == ""
                continue
            data = z.read(path)
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert int(size) == len(data)
        z.extract(ext, tmp_path / "x")
    so = str(tmp_path / "x" / ext)
    libs = subprocess.run(["ldd", so], check=True, capture_output=True, text=True).stdout
    assert "not found" not in libs and os.path.realpath(BUILD) not in libs and os.path.realpath(ROOT) not in libs, libs
