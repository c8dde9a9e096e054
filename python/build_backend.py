"""The PEP 517 build backend of the package dfp (pyproject.toml): `pip install .` in a checkout builds
the extension with the project's CMake and installs the package for the interpreter that runs pip.

It lives in the tree and needs nothing but the standard library, so that pip installs offline
(pyproject.toml requires nothing to build) with or without build isolation. A wheel holds what
`cmake --install <build> --component python` installs (python/CMakeLists.txt): python/dfp's modules
and the extension _dfp, which contains the dfp library; its version is the project's
(CMakeLists.txt's `project(dfp VERSION ...)`), its tag the running interpreter's.

The build directory: the config setting build-dir (`pip install --config-settings build-dir=DIR .`),
else the environment variable DFP_BUILD_DIR, else build/ in the checkout; a relative path is relative
to the checkout. An existing build directory is used as it is configured, and only the module's
target dfp_python is built in it (a second install is quick); a new one is configured as
scripts/build.sh does (Release), for this interpreter.
"""
import base64
import csv
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "dfp"
SETTINGS = ("build-dir",)
EPOCH = (1980, 1, 1, 0, 0, 0)  # the zip entries' time: the same files give the same wheel


class BuildError(RuntimeError):
    pass


def _version():
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        m = re.search(r"project\(\s*dfp\s+VERSION\s+([0-9][0-9.]*)", f.read())
    if not m:
        raise BuildError("CMakeLists.txt: no `project(dfp VERSION x.y.z)` to take the version from")
    return m.group(1)


def _project():
    """pyproject.toml's [project] table, the version added."""
    try:
        import tomllib
    except ModuleNotFoundError:
        raise BuildError("python/build_backend.py reads pyproject.toml with tomllib: Python 3.11 or later") from None
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = dict(tomllib.load(f)["project"])
    if project.get("dynamic") != ["version"] or "version" in project:
        raise BuildError("pyproject.toml: [project] must leave the version to the backend (dynamic = [\"version\"])")
    project["version"] = _version()
    return project


def _metadata():
    """The core metadata (METADATA, PKG-INFO) of [project]'s fields; a field this backend does not
    write is refused by name rather than dropped."""
    p = _project()
    known = {"name", "version", "dynamic", "description", "requires-python", "dependencies", "optional-dependencies"}
    unknown = sorted(set(p) - known)
    if unknown:
        raise BuildError(f"pyproject.toml: [project] fields {unknown} are not written by python/build_backend.py")
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}"]
    if "description" in p:
        lines.append(f"Summary: {p['description']}")
    if "requires-python" in p:
        lines.append(f"Requires-Python: {p['requires-python']}")
    lines += [f"Requires-Dist: {d}" for d in p.get("dependencies", [])]
    for extra, deps in p.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f"Requires-Dist: {d}; extra == \"{extra}\"" for d in deps]
    return "\n".join(lines) + "\n"


def _tag():
    """The running interpreter's wheel tag, e.g. cp311-cp311-linux_x86_64 (the extension's ABI)."""
    if sys.implementation.name != "cpython":
        raise BuildError(f"the extension is built for CPython; this interpreter is {sys.implementation.name}")
    py = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    soabi = sysconfig.get_config_var("SOABI") or ""  # cpython-311-x86_64-linux-gnu
    abi = "cp" + soabi.split("-")[1] if soabi.startswith("cpython-") else py
    return f"{py}-{abi}-{sysconfig.get_platform().replace('-', '_').replace('.', '_')}"


def _dist_info():
    return f"{NAME}-{_version()}.dist-info"


def _wheel_file():
    return f"Wheel-Version: 1.0\nGenerator: dfp python/build_backend.py\nRoot-Is-Purelib: false\nTag: {_tag()}\n"


def _setting(config_settings, key):
    unknown = sorted(set(config_settings or {}) - set(SETTINGS))
    if unknown:
        raise BuildError(f"unknown config setting(s) {unknown}; this backend takes {list(SETTINGS)}")
    value = (config_settings or {}).get(key)
    if isinstance(value, list):  # given more than once: the last one counts
        value = value[-1]
    return value


def _build_dir(config_settings):
    d = _setting(config_settings, "build-dir") or os.environ.get("DFP_BUILD_DIR") or "build"
    return os.path.abspath(os.path.join(ROOT, d))


def _cache(build_dir):
    """CMakeCache.txt's entries, NAME -> value."""
    entries = {}
    with open(os.path.join(build_dir, "CMakeCache.txt"), encoding="utf-8", errors="replace") as f:
        for line in f:
            m = re.match(r"([A-Za-z_0-9]+):[A-Z]+=(.*)$", line.rstrip("\n"))
            if m:
                entries[m.group(1)] = m.group(2)
    return entries


def _run(cmd):
    # CMake runs the interpreter it builds for (pybind11, the install path) in the environment of
    # the checkout, not with pip's isolated build environment on the path.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    print("dfp:", " ".join(cmd), flush=True)
    if subprocess.run(cmd, cwd=ROOT, env=env).returncode != 0:
        raise BuildError(f"`{' '.join(cmd)}` failed (its output is above)")


def _ext_suffix(python):
    out = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))"],
                         capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else None


def _build(build_dir):
    """Configures build_dir if it is new, checks that it builds the module for this interpreter and
    builds the module's target."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    if not os.path.isfile(os.path.join(build_dir, "CMakeCache.txt")):
        python = getattr(sys, "_base_executable", None) or sys.executable  # a venv's own interpreter
        _run(["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release", f"-DDFP_PYTHON_EXECUTABLE={python}"])
    cache = _cache(build_dir)
    where = f"the build directory {build_dir}"
    choose = "; choose another with DFP_BUILD_DIR=DIR or --config-settings build-dir=DIR (docs/python.md)"
    home = cache.get("CMAKE_HOME_DIRECTORY", "")
    if home and os.path.realpath(home) != os.path.realpath(ROOT):
        raise BuildError(f"{where} builds the checkout {home}, not {ROOT}{choose}")
    python = cache.get("DFP_PYTHON_EXECUTABLE", "")
    if cache.get("DFP_PYTHON", "").upper() not in ("ON", "1", "TRUE", "YES", "Y"):
        raise BuildError(f"{where} does not build the Python package (DFP_PYTHON is OFF: pybind11 was not found for "
                         f"{python}; Debian: python3-pybind11 pybind11-dev, scripts/install-deps.sh){choose}")
    if cache.get("DFP_SANITIZE"):
        raise BuildError(f"{where} is a sanitizer build (DFP_SANITIZE={cache['DFP_SANITIZE']}), whose module needs the "
                         f"sanitizer's runtime preloaded{choose}")
    theirs = _ext_suffix(python)
    if theirs != suffix:
        raise BuildError(f"{where} builds the module for {python} ({theirs}), not for this interpreter "
                         f"{sys.executable} ({suffix}){choose}")
    cmd = ["cmake", "--build", build_dir, "--target", "dfp_python"]
    if "CMAKE_BUILD_PARALLEL_LEVEL" not in os.environ:
        cmd += ["-j", str(os.cpu_count() or 1)]
    _run(cmd)
    return cache


def _package_files(build_dir, cache, staging):
    """(path in the wheel, file) of what the component python installs, under dfp/."""
    _run(["cmake", "--install", build_dir, "--component", "python", "--prefix", staging])
    site = os.path.join(staging, cache["DFP_PYTHON_INSTALL_DIR"])
    files = []
    for top, dirs, names in os.walk(os.path.join(site, NAME)):
        dirs.sort()
        for n in sorted(names):
            path = os.path.join(top, n)
            files.append((os.path.relpath(path, site).replace(os.sep, "/"), path))
    ext = f"{NAME}/_dfp{sysconfig.get_config_var('EXT_SUFFIX')}"
    if ext not in [f for f, _ in files]:
        raise BuildError(f"`cmake --install {build_dir} --component python` installed no {ext}")
    return files


def _zip_entry(zf, name, data, executable=False):
    info = zipfile.ZipInfo(name, EPOCH)
    info.external_attr = (0o755 if executable else 0o644) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data)


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


# PEP 517 hooks.

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    d = os.path.join(metadata_directory, _dist_info())
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata())
    with open(os.path.join(d, "WHEEL"), "w", encoding="utf-8") as f:
        f.write(_wheel_file())
    return _dist_info()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    build_dir = _build_dir(config_settings)
    cache = _build(build_dir)
    name = f"{NAME}-{_version()}-{_tag()}.whl"
    staging = tempfile.mkdtemp(prefix="dfp-wheel-")
    try:
        files = _package_files(build_dir, cache, staging)
        record = []
        path = os.path.join(wheel_directory, name)
        with zipfile.ZipFile(path + ".part", "w") as zf:
            for arcname, src in files:
                with open(src, "rb") as f:
                    data = f.read()
                _zip_entry(zf, arcname, data, executable=arcname.endswith(".so"))
                record.append(_record_line(arcname, data))
            info = _dist_info()
            for meta, text in (("METADATA", _metadata()), ("WHEEL", _wheel_file())):
                data = text.encode("utf-8")
                _zip_entry(zf, f"{info}/{meta}", data)
                record.append(_record_line(f"{info}/{meta}", data))
            record.append([f"{info}/RECORD", "", ""])
            out = io.StringIO()
            csv.writer(out, lineterminator="\n").writerows(record)
            _zip_entry(zf, f"{info}/RECORD", out.getvalue().encode("utf-8"))
        os.replace(path + ".part", path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return name


def build_sdist(sdist_directory, config_settings=None):
    """The checkout's files that git knows and does not ignore (committed or not), under
    dfp-VERSION/, with PKG-INFO."""
    _setting(config_settings, "build-dir")  # refuses unknown settings
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise BuildError(f"an sdist lists the checkout's files with git, which failed: {e}") from e
    paths = sorted(p for p in out.decode("utf-8").split("\0") if p and os.path.isfile(os.path.join(ROOT, p)))
    base = f"{NAME}-{_version()}"
    name = f"{base}.tar.gz"
    path = os.path.join(sdist_directory, name)

    def normal(info):
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 315532800  # 1980-01-01, as the wheel's entries
        return info

    with tarfile.open(path + ".part", "w:gz", format=tarfile.PAX_FORMAT) as tf:
        for p in paths:
            tf.add(os.path.join(ROOT, p), f"{base}/{p}", recursive=False, filter=normal)
        data = _metadata().encode("utf-8")
        info = normal(tarfile.TarInfo(f"{base}/PKG-INFO"))
        info.size, info.mode = len(data), 0o644
        tf.addfile(info, io.BytesIO(data))
    os.replace(path + ".part", path)
    return name
