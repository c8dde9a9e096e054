"""scripts/formats-study.py: the study's tables from compare directories of several seeds."""
import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "formats-study.py")


def write_run(root, label, seed, top1, sqnr_dy, under_dy):
    d = os.path.join(root, label)
    os.makedirs(d)
    json.dump({"label": label, "seed": seed, "epochs": 2}, open(os.path.join(d, "config.json"), "w"))
    layers = [{"layer": name, "sqnr_x_db": 70.0, "sqnr_w_db": 60.0, "sqnr_dy_db": s, "underflow_dy": u,
               "nonzero_dy": 100, "underflow_x": 0, "nonzero_x": 100, "underflow_w": 0, "nonzero_w": 10}
              for name, s, u in (("conv1", sqnr_dy, under_dy), ("fc", sqnr_dy - 10, 2 * under_dy))]
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"epoch": 1, "test_top1": top1 - 5, "layers": layers}) + "\n")
        f.write(json.dumps({"epoch": 2, "test_top1": top1, "layers": layers}) + "\n")


def test_tables_pool_the_seeds_and_name_where_a_format_breaks(tmp_path):
    for seed, (a, b) in enumerate(((80.0, 70.0), (82.0, 74.0)), start=1):
        root = tmp_path / f"s{seed}"
        write_run(str(root), "fp32", seed, a, 0, 0)
        write_run(str(root), "mxfp4", seed, b, 20.0 + seed, 10)
    # A run still training (one epoch of two) is left out.
    write_run(str(tmp_path / "s2"), "fp8", 2, 50.0, 25.0, 0)
    with open(tmp_path / "s2" / "fp8" / "metrics.jsonl") as f:
        first = f.readline()
    (tmp_path / "s2" / "fp8" / "metrics.jsonl").write_text(first)
    out = subprocess.run([sys.executable, SCRIPT, str(tmp_path / "s1"), str(tmp_path / "s2")], check=True,
                         capture_output=True, text=True).stdout
    assert "| fp8 |" not in out
    first_table = out.split("\n\n")[0].splitlines()
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in first_table
            if line.startswith("| ") and not line.startswith("| format")}
    # mxfp4: seeds 70 and 74 -> 72.00 ± 2.83, 9 points below fp32's 81.
    assert rows["mxfp4"][:3] == ["2", "72.00 ± 2.83", "-9.00"]
    # dy SQNR mean over layers (21.5 -> (21+11)/2 = 16, (22+12)/2 = 17) and worst (11, 12), averaged over seeds.
    assert rows["mxfp4"][5] == "16.5 / 11.5"
    # Underflow: (10 + 20) / 200 values.
    assert rows["mxfp4"][6] == "15 %"
    where = [line for line in out.splitlines() if line.startswith("| mxfp4 |") and "fc, dy" in line]
    assert where and "fc, 11.0" in where[0]
