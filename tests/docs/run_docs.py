#!/usr/bin/env python3
"""Runs the documentation: every fenced block of README.md and docs/ that a user would copy.

Each block is one of:
  shell   a plain fence whose lines are commands (build/dfp, scripts/, mpirun, cmake, python ...):
          run line by line from a scratch directory, with the substitutions below; each must exit 0
  python  a ```python fence: the blocks of one file run in order in one interpreter (later blocks
          use what earlier ones made), against the installed package
  cpp, c  a ```cpp / ```c fence: compiled and run as a program (the block wrapped in main() unless it
          has one) against the installed CMake package, with the ```cmake fence or plain fence of
          find_package lines before it as the project's CMakeLists.txt
  text    diagrams, formats, listings: not run (said so by a marker)

Markers, HTML comments on the lines just before a fence (invisible on a rendered page):
  <!-- doc: text -->            the block is not a command or a program
  <!-- doc: skip REASON -->     not run here, for REASON (listed in the summary)
  <!-- doc: long -->            run only with --long (ctest label long): a block that takes minutes
  <!-- doc: expect TEXT -->     the block's output must contain TEXT (several markers: each)
  <!-- doc: before             code run first, not shown: what a snippet assumes the reader has
  CODE                          (the images x and labels y of a training step, say)
  -->
A fence that is none of these (a plain fence with a line that is not a command, say) fails the
run: a new block is either runnable or says why not.

Substitutions, so that the documented commands run as written in a few seconds each:
  - dfp train and dfp compare get the documented short-run limits --limit-train 256
    --limit-test 128 (unless they set their own) and --threads 2;
  - "..." in a dfp command stands for the flags of the block's previous dfp train command (not its
    --out, --resume, --config or --overwrite);
  - `cmake --install build` installs into the runner's prefix, not /usr/local, and python runs
    with that prefix's package directory on PYTHONPATH;
  - mpirun runs as root where the README says how (OMPI_ALLOW_RUN_AS_ROOT and its confirmation,
    as the README's MPI section names them), with --oversubscribe on a 2-core machine;
  - a benchmark (build/bench/..., bench/*.py) runs a small part of what it measures, the flags
    of BENCH_SHORT below that the command does not set itself (a Google Benchmark filter of a
    row or two, one round, one step): each program, its flags and its output format are checked
    in seconds where a full run takes hours.
Files a block needs that a user would have (resnet50.pth, a torchvision state_dict) are made first
by the runner, where torch is installed; otherwise the block is skipped with that reason.

Exit status 0 when every block ran as promised, 1 otherwise; 77 when the build lacks what the
runner needs (ctest's skip code).
"""
import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = "/usr/bin/python3"
COMMANDS = ("build/", "scripts/", "mpirun", "mpiexec", "cmake", "/usr/bin/python3", "python3", "bench/", "cd ",
            "PYTHONPATH=", "OMP_", "MODELS=", "dfp ")
SHORT = ["--limit-train", "256", "--limit-test", "128"]
# Per benchmark program: the flags that bound a documented run to seconds, each added unless the
# command sets that flag itself. train_bench's own modes instead: with --kinds, one round; with a
# --benchmark_filter (a family of rows), that family's ResNet-20 rows of INT16 against FP32
# (train_ratio) or slice against tensor exponents (train_granularity).
BENCH_SHORT = {
    "build/bench/conv_bench": ["--benchmark_filter=^conv/resnet20_b128_c16_k16_in32_3x3_s1/fwd/(int16|onednn_f32)/threads:2/"],
    "build/bench/train_bench": ["--benchmark_filter=^train/resnet20_1x28/(fp32|int16)/threads:2/"],
    "build/bench/memory_bench": ["--benchmark_filter=^memory/resnet20/(fp32|int16)/"],
    "build/bench/resnet50_bench": ["--batch=16", "--rounds=1", "--steps=1"],
    "build/bench/quant_bench": ["--benchmark_filter=^(copy_f32|quantize_known_exp)/threads:2/(stochastic:0/)?real_time"],
    "build/bench/flush_bench": ["--benchmark_filter=^flush/none/chain:8/"],
    "bench/torch_resnet50_bench.py": ["--dtypes=fp32", "--batch=8", "--steps=1", "--warmup=1"],
    "bench/torch_bridge_bench.py": ["--reps=1", "--steps=1", "--warmup=1"],
    "bench/torch_compile_bench.py": ["--rounds=1", "--steps=1"],
}


class Block:
    def __init__(self, path, line, lang, text, marks, before):
        self.path, self.line, self.lang, self.text, self.marks, self.before = path, line, lang, text, marks, before
        self.kind = None
        self.reason = ""

    def where(self):
        return f"{os.path.relpath(self.path, ROOT)}:{self.line}"


def parse(path):
    """The fenced blocks of a Markdown file, with the markers on the lines before each."""
    lines = open(path, encoding="utf-8").read().split("\n")
    blocks, marks, before = [], [], None
    i = 0
    while i < len(lines):
        s = lines[i].strip()
        m = re.match(r"<!-- doc: (.*?)\s*(-->)?$", s)
        if m:
            word = m.group(1)
            if word == "before" and not m.group(2):
                j = i + 1
                while j < len(lines) and lines[j].strip() != "-->":
                    j += 1
                before = "\n".join(lines[i + 1:j])
                i = j + 1
                continue
            marks.append(word)
            i += 1
            continue
        if s.startswith("```"):
            lang = s[3:].strip()
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith("```"):
                j += 1
            indent = len(lines[i]) - len(lines[i].lstrip())
            body = "\n".join(l[indent:] if l[:indent].isspace() else l for l in lines[i + 1:j])
            blocks.append(Block(path, i + 1, lang, body, marks, before))
            marks, before = [], None
            i = j + 1
            continue
        if s:  # markers belong to the fence right after them
            marks, before = [], None
        i += 1
    return blocks


def classify(b):
    for m in b.marks:
        if m == "text":
            b.kind = "text"
        elif m.startswith("skip"):
            b.kind, b.reason = "skip", m[4:].strip()
        elif m == "long":
            b.reason = "long"
    if b.kind:
        return
    if b.lang in ("python", "cpp", "c", "cmake"):
        b.kind = b.lang
        return
    cmds = [l for l in logical_lines(b.text)]
    if b.lang in ("", "sh", "bash") and cmds:
        if all(c.startswith(COMMANDS) for c in cmds):
            b.kind = "shell"
        elif all(c.startswith(("find_package", "target_link_libraries", "project(", "add_executable")) for c in cmds):
            b.kind = "cmake"
    if not b.kind:
        b.kind = "unclassified"


def logical_lines(text):
    """Commands with their continuation lines joined, comments and blank lines dropped."""
    out, cur = [], ""
    for raw in text.split("\n"):
        line = raw.rstrip()
        cont = line.endswith("\\")
        if cont:
            line = line[:-1]
        cur += (" " if cur else "") + line.strip()
        if not cont:
            if cur and not cur.startswith("#"):
                out.append(cur)
            cur = ""
    if cur:
        out.append(cur)
    return out


class Runner:
    def __init__(self, args):
        self.args = args
        self.build = os.path.abspath(args.build)
        self.work = tempfile.mkdtemp(prefix="dfp-docs-")
        self.prefix = os.path.join(self.work, "prefix")
        self.failures = []
        self.counts = {}
        self.skipped = []
        self.python_dir = None
        self.notes = set()
        self.resnet50 = None
        self.flag_failures = []
        self.torch = subprocess.run([PY, "-c", "import torch, torchvision"], capture_output=True).returncode == 0

    # ---- environment ------------------------------------------------------------------------
    def install(self):
        r = subprocess.run(["cmake", "--install", self.build, "--prefix", self.prefix], capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout + r.stderr)
            sys.exit(1)
        for dirpath, dirnames, _ in os.walk(self.prefix):
            if os.path.basename(dirpath) == "dfp" and os.path.exists(os.path.join(dirpath, "__init__.py")):
                self.python_dir = os.path.dirname(dirpath)

    def new_reader(self, rel):
        """A scratch directory per file, as a reader who starts that page: the blocks' relative paths
        (build/dfp, scripts/..., bench/...) are the checkout's, and runs/ is the reader's own."""
        self.cwd = os.path.join(self.work, "run-" + re.sub(r"[^A-Za-z0-9]", "_", rel))
        os.makedirs(self.cwd)
        for name in ("scripts", "bench", "tests", "docs", "models", "python"):
            os.symlink(os.path.join(ROOT, name), os.path.join(self.cwd, name))
        os.symlink(self.build, os.path.join(self.cwd, "build"))
        self.prepare_files()

    def env(self):
        e = dict(os.environ)
        e["PYTHONPATH"] = self.python_dir or ""
        if os.geteuid() == 0:  # as the README's MPI section says for root (containers, CI)
            e["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
            e["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
        e["PATH"] = os.path.join(self.prefix, "bin") + os.pathsep + e.get("PATH", "")
        return e

    def run_bounded(self, b, what, args, **kw):
        """subprocess.run(args) for block b with the runner's environment, its output captured and
        at most --timeout seconds; past that, a failure of b named by `what`, and None."""
        try:
            return subprocess.run(args, env=self.env(), capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                  timeout=self.args.timeout, **kw)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            self.fail(b, f"{what} ran past --timeout {self.args.timeout} s", out)
            return None

    def fail(self, b, what, out=""):
        tail = "\n".join(out.strip().split("\n")[-25:])
        self.failures.append(f"{b.where()}: {what}" + (f"\n{tail}" if tail else ""))

    # ---- shell ------------------------------------------------------------------------------
    def substitute(self, cmd, last_train):
        toks = shlex.split(cmd, comments=True)
        if not toks:
            return None, last_train
        prog = toks[0]
        if prog == "cmake" and toks[1:3] == ["--install", "build"] and "--prefix" not in toks:
            toks += ["--prefix", self.prefix]
        if prog == "scripts/build.sh" and self.build != os.path.join(ROOT, "build"):
            toks = ["true"]  # it builds the checkout's build/, not the one under test (said in the summary)
            self.notes.add(f"scripts/build.sh not run: the build under test is {self.build}, not build/")
        toks = self.shorten_benchmark(toks)
        is_dfp = prog in ("build/dfp", "dfp") or (prog.startswith("mpi") and "build/dfp" in toks)
        if prog == "dfp":
            toks[0] = os.path.join(self.build, "dfp")
        if prog.startswith("mpirun") and "--oversubscribe" not in toks:
            toks.insert(1, "--oversubscribe")
        if is_dfp:
            at = toks.index("build/dfp") if "build/dfp" in toks else 0
            sub = toks[at + 1] if len(toks) > at + 1 else ""
            if "..." in toks:
                i = toks.index("...")
                have = {t for t in toks if t.startswith("--")}
                inherited, k = [], 0
                src = last_train or []
                while k < len(src):
                    t = src[k]
                    takes = k + 1 < len(src) and not src[k + 1].startswith("--")
                    if t.startswith("--") and t not in have and t not in ("--out", "--resume", "--config", "--overwrite"):
                        inherited += [t] + ([src[k + 1]] if takes else [])
                    k += 2 if takes else 1
                toks[i:i + 1] = inherited
            if sub in ("train", "compare"):
                if "--limit-train" not in toks and "--config" not in toks:
                    toks += SHORT
                if "--threads" not in toks and not prog.startswith("mpi"):
                    toks += ["--threads", "2"]
            if sub == "train" and "..." not in cmd.split():
                last_train = toks[at + 2:]
        return " ".join(shlex.quote(t) if t not in ("&&", "||", "|", ";") else t for t in toks), last_train

    @staticmethod
    def shorten_benchmark(toks):
        """BENCH_SHORT's flags for the benchmark program among toks (after VAR=value and python3)."""
        at = next((i for i, t in enumerate(toks) if t in BENCH_SHORT), None)
        if at is None:
            return toks
        prog = toks[at]
        have = {t.split("=")[0] for t in toks[at + 1:] if t.startswith("--")}
        if prog == "build/bench/train_bench" and "--kinds" in have:
            return toks + ([] if "--rounds" in have else ["--rounds=1"])
        if prog == "build/bench/train_bench" and "--benchmark_filter" in have:
            return [t + "/resnet20_[^/]*/(int16:fp32|slice:tensor)/" if t.startswith("--benchmark_filter=") else t
                    for t in toks]
        return toks + [f for f in BENCH_SHORT[prog] if f.split("=")[0] not in have]

    def run_shell(self, b):
        last = None
        cwd = self.cwd
        for cmd in logical_lines(b.text):
            if "resnet50.pth" in cmd and not self.torch:
                self.notes.add(f"{b.where()}: `{cmd[:60]}...` not run: torch is not installed, so no resnet50.pth")
                continue
            if "&&" in cmd:
                parts = [p.strip() for p in cmd.split("&&")]
                subs = []
                for p in parts:
                    s, last = self.substitute(p, last)
                    subs.append(s)
                line = " && ".join(s for s in subs if s)
            else:
                line, last = self.substitute(cmd, last)
            if not line:
                continue
            t0 = time.time()
            r = self.run_bounded(b, f"`{cmd}` (ran: {line})", ["bash", "-c", line], cwd=cwd)
            if r is None:
                return
            out = r.stdout + r.stderr
            if self.args.verbose:
                print(f"  $ {line}  ({time.time() - t0:.1f} s, exit {r.returncode})")
            if r.returncode != 0:
                self.fail(b, f"`{cmd}` exited {r.returncode} (ran: {line})", out)
                return
            self.check_expect(b, out)

    def check_expect(self, b, out):
        for m in b.marks:
            if m.startswith("expect "):
                want = m[len("expect "):]
                if want not in out:
                    self.fail(b, f"the output lacks the promised '{want}'", out)

    # ---- python -----------------------------------------------------------------------------
    def run_python(self, blocks):
        """A file's python blocks in order, in one interpreter, each reported by its line."""
        if not blocks:
            return
        if not self.python_dir:
            for b in blocks:
                b.kind, b.reason = "skip", "the build has no Python package (DFP_PYTHON=OFF: pybind11 missing)"
            return
        if any(re.search(r"\bimport torch\b|dfp\.torch", b.text) for b in blocks) and not self.torch:
            for b in blocks:
                if re.search(r"\bimport torch\b|dfp\.torch", b.text):
                    b.kind, b.reason = "skip", "torch is not installed (Debian: python3-torch python3-torchvision)"
            blocks = [b for b in blocks if b.kind == "python"]
        parts = ["import os, sys, traceback", "os.chdir(sys.argv[1])"]
        for b in blocks:
            code = (b.before + "\n" if b.before else "") + b.text
            parts.append(f"print('@@block {b.line}', flush=True)")
            parts.append(f"exec(compile({code!r}, {b.where()!r}, 'exec'))")
        script = "\n".join(parts) + "\nprint('@@done', flush=True)\n"
        cwd = os.path.join(self.work, "py-" + os.path.basename(blocks[0].path))
        os.makedirs(cwd, exist_ok=True)
        r = self.run_bounded(blocks[0], "the file's python blocks", [PY, "-c", script, cwd])
        if r is None:
            return
        out = r.stdout + r.stderr
        if r.returncode != 0 or "@@done" not in r.stdout:
            started = re.findall(r"@@block (\d+)", r.stdout)
            line = int(started[-1]) if started else blocks[0].line
            bad = next(b for b in blocks if b.line == line)
            self.fail(bad, f"the python block raised (exit {r.returncode})", out)
            return
        for b in blocks:
            seg = out.split(f"@@block {b.line}")[1].split("@@")[0]
            self.check_expect(b, seg)

    # ---- C and C++ ------------------------------------------------------------------------
    def run_program(self, b, cmake_text):
        lang = "c" if b.lang == "c" else "cpp"
        d = os.path.join(self.work, f"prog-{os.path.basename(b.path)}-{b.line}")
        os.makedirs(d)
        before = (b.before or "").split("\n")
        includes = [l for l in before + b.text.split("\n") if l.startswith("#include")]
        body = "\n".join(l for l in b.text.split("\n") if not l.startswith("#include"))
        setup = "\n".join(l for l in before if not l.startswith("#include"))
        std = ["#include <stdio.h>", "#include <stdint.h>", "#include <stdlib.h>"] if lang == "c" else \
              ["#include <cstdio>", "#include <cstdint>", "#include <vector>"]
        if re.search(r"\bint main\s*\(", b.text):
            src = b.text
        else:
            src = "\n".join(std + includes) + "\nint main(void) {\n" + setup + "\n" + body + "\nreturn 0;\n}\n"
        name = "main.c" if lang == "c" else "main.cpp"
        open(os.path.join(d, name), "w").write(src)
        cm = cmake_text or "find_package(dfp REQUIRED)\ntarget_link_libraries(app PRIVATE dfp::dfp)"
        if "project(" not in cm:
            cm = "project(app LANGUAGES C CXX)\n" + cm
        if "add_executable" not in cm:
            cm = cm.replace("find_package(dfp REQUIRED)", f"find_package(dfp REQUIRED)\nadd_executable(app {name})", 1)
        cm = "cmake_minimum_required(VERSION 3.25)\n" + cm
        open(os.path.join(d, "CMakeLists.txt"), "w").write(cm)
        steps = [["cmake", "-S", d, "-B", os.path.join(d, "b"), f"-DCMAKE_PREFIX_PATH={self.prefix}",
                  "-DCMAKE_BUILD_TYPE=Release"], ["cmake", "--build", os.path.join(d, "b")], [os.path.join(d, "b", "app")]]
        for s in steps:
            r = self.run_bounded(b, " ".join(s[:2]), s, cwd=d)
            if r is None:
                return
            if r.returncode != 0:
                self.fail(b, f"{' '.join(s[:2])} failed (exit {r.returncode})", r.stdout + r.stderr)
                return
        self.check_expect(b, r.stdout + r.stderr)

    # ---- the files --------------------------------------------------------------------------
    def prepare_files(self):
        """What a reader already has: an MPI hostfile, a torchvision state_dict for --init-from."""
        run = self.cwd
        with open(os.path.join(run, "hosts"), "w") as f:  # an MPI hostfile: this machine
            f.write("localhost slots=4\n")
        if self.torch:
            if not self.resnet50:
                self.resnet50 = os.path.join(self.work, "resnet50.pth")
                subprocess.run([PY, "-c", "import sys, torch, torchvision; "
                                "torch.save(torchvision.models.resnet50().state_dict(), sys.argv[1])", self.resnet50],
                               check=True, capture_output=True)
            os.symlink(self.resnet50, os.path.join(run, "resnet50.pth"))

    def run(self, files):
        self.install()
        for path in files:
            self.new_reader(os.path.relpath(path, ROOT))
            blocks = parse(path)
            for b in blocks:
                classify(b)
            rel = os.path.relpath(path, ROOT)
            ran = 0
            pending_cmake = None
            py = []
            for b in blocks:
                if b.reason == "long" and not self.args.long:
                    b.kind, b.reason = "skip", "long (run with --long, ctest -L long)"
                if b.kind == "unclassified":
                    self.fail(b, "a block that is neither runnable nor marked (<!-- doc: text --> or "
                                 "<!-- doc: skip REASON --> before it)")
                elif b.kind == "shell":
                    if "python3" in b.text and not self.python_dir:
                        b.kind, b.reason = "skip", "the build has no Python package (DFP_PYTHON=OFF)"
                    else:
                        self.run_shell(b)
                        ran += 1
                elif b.kind == "cmake":
                    pending_cmake = b.text
                    ran += 1
                elif b.kind in ("cpp", "c"):
                    self.run_program(b, pending_cmake)
                    pending_cmake = None
                    ran += 1
                elif b.kind == "python":
                    py.append(b)
            n_py = len(py)
            self.run_python(py)
            n_py -= sum(1 for b in py if b.kind == "skip")
            ran += n_py
            skipped = [b for b in blocks if b.kind == "skip"]
            texts = sum(1 for b in blocks if b.kind == "text")
            self.counts[rel] = (ran, len(skipped), texts)
            self.skipped += [f"{b.where()}: {b.reason}" for b in skipped]

    # ---- flags named in the text ---------------------------------------------------------------
    def check_flags(self, files):
        """Every --flag the docs name for the dfp program is one of its commands' flags: in a code
        span or block line that runs dfp, or a code span that is a flag alone."""
        dfp = os.path.join(self.build, "dfp")
        known = set()
        for sub in ("", "info", "bench", "train", "eval", "compare", "export"):
            r = subprocess.run([dfp] + ([sub] if sub else []) + ["--help"], capture_output=True, text=True)
            known |= set(re.findall(r"--[a-z][a-z0-9-]*", r.stdout + r.stderr))
        # Other programs' flags, where a dfp line passes them on (mpirun, the launcher).
        # bench/torch_resnet50_bench.py's --no-amx and the PyTorch ImageNet example's --dummy are
        # named beside dfp's flags, as what they compare with.
        others = {"--allow-run-as-root", "--oversubscribe", "--bind-to", "--hostfile", "--map-by", "--no-amx", "--dummy"}
        for path in files:
            rel = os.path.relpath(path, ROOT)
            if rel in ("docs/measurements.md",):  # a log of past runs: their flags as they were
                continue
            text = open(path, encoding="utf-8").read()
            spans = re.findall(r"`([^`\n]+)`", text)
            lines = [l for b in parse(path) if b.lang in ("", "sh", "bash") for l in logical_lines(b.text)]
            named = []
            for t in spans + lines:
                runs_dfp = re.search(r"(^|[\s/])dfp (train|eval|compare|export|info|bench)\b", t)
                if runs_dfp or re.fullmatch(r"--[a-z][a-z0-9-]*( \S+)?", t.strip()):
                    named += re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", t.split(" # ")[0])
            for f in sorted(set(named) - known - others):
                self.flag_failures.append(f"{rel}: names `{f}`, which no dfp command has (dfp COMMAND --help)")

    def report(self):
        print("doc blocks per file: ran / skipped / text")
        for rel, (ran, sk, tx) in self.counts.items():
            print(f"  {rel:40s} {ran:3d} {sk:3d} {tx:3d}")
        total = sum(c[0] for c in self.counts.values())
        for s in self.skipped:
            print(f"  skipped {s}")
        for n in sorted(self.notes):
            print(f"  note: {n}")
        for f in self.flag_failures:
            print("FAILED " + f)
        for f in self.failures:
            print("FAILED " + f)
        ok = total - len(self.failures)
        failed = len(self.failures) + len(self.flag_failures)
        print(f"docs: {ok} passed, {failed} failed, {sum(c[1] for c in self.counts.values())} skipped")
        return 0 if not failed else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build directory (default: build)")
    ap.add_argument("--long", action="store_true", help="also the blocks marked long")
    ap.add_argument("--timeout", type=int, default=600, help="seconds one command may take")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("--flags-only", action="store_true", help="only check the flags the text names")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each command as it runs")
    ap.add_argument("files", nargs="*", help="Markdown files (default: README.md and docs/)")
    args = ap.parse_args()
    if not os.path.exists(os.path.join(args.build, "dfp")):
        print(f"skipped: {args.build}/dfp is not built")
        return 77
    files = args.files or ([os.path.join(ROOT, "README.md")] +
                           [os.path.join(dp, f) for dp, _, fs in sorted(os.walk(os.path.join(ROOT, "docs")))
                            for f in sorted(fs) if f.endswith(".md")])
    r = Runner(args)
    try:
        paths = [os.path.abspath(f) for f in files]
        if not args.flags_only:
            r.run(paths)
        r.check_flags(paths)
        return r.report()
    finally:
        if not args.keep:
            shutil.rmtree(r.work, ignore_errors=True)
        else:
            print("kept", r.work)


if __name__ == "__main__":
    sys.exit(main())
