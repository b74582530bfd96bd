"""benchmarks/race.py's bookkeeping without running a model: placeholder parts, merge, ratios, goal lines."""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RACE = os.path.join(REPO, "benchmarks", "race.py")
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import race  # noqa: E402


def _ok(variant, impl, total, members=1):
    return race._row("cifar16", impl, variant, 16, "float32", members=members, images_per_s_total=total,
                     images_per_s_per_member=total / members, ms_per_call=1.0, compile_s=1.0)  # fmt: skip


def test_placeholder_parts_merge_with_measured_rows(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, RACE, *args], capture_output=True, text=True, check=True).stdout

    ph = tmp_path / "ph.json"
    run(
        "--side",
        "torch",
        "--configs",
        "cifar16",
        "--rows",
        "eager,default",
        "--placeholder",
        "timed out",
        "--json",
        str(ph),
    )
    rows = json.load(open(ph))["rows"]
    assert [(r["variant"], r["status"]) for r in rows] == [
        ("torch eager", "timed out"),
        ("torch.compile default", "timed out"),
    ]
    measured = tmp_path / "m.json"
    ours = [_ok("step", "jax", 5000.0), _ok("k-step k=8", "jax", 9000.0), _ok("population N=8", "jax", 40000.0, 8)]
    torch_rows = [_ok("torch eager", "torch", 1500.0), _ok("torch.compile default", "torch", 3000.0)]
    json.dump({"environment": ["test"], "rows": ours + torch_rows}, open(measured, "w"))
    out = run("--merge", str(ph), str(measured), "--json", str(tmp_path / "race.json"))
    merged = json.load(open(tmp_path / "race.json"))["rows"]
    assert len(merged) == 5 and all(r["status"] == "ok" for r in merged)  # measured rows replace placeholders
    assert "our best single-member row / torch eager = 6.00x" in out
    assert "our best single-member row / best torch.compile = 3.00x" in out
    assert "total / our 1-step = 8.00x" in out  # 40,000 img/s for 8 members vs 5,000 for one
    assert "= 34 min per member" in out  # 10.2 M images at 5,000 img/s per member


def test_jax_rows_report_not_built_yet_when_the_api_is_absent(monkeypatch):
    monkeypatch.setattr(race, "_population_api", lambda: None)
    a = type("A", (), dict(rows={"population"}, ks=[4], populations=[4, 8], emulate=False))()
    assert [v for _, v, *_ in race._jax_plan(a)] == ["population N=4", "population N=8"]


def test_ratios_compare_rows_of_one_precision_only():
    """A merge of f32 and bf16 parts (RACE_DTYPES=float32,bfloat16): each row's ratios are against the torch
    rows of its own dtype, and a k=1 k-step row is the one-step row."""

    def row(variant, impl, dtype, total, members=1):
        return race._row("cifar16", impl, variant, 16, dtype, members=members, images_per_s_total=total,
                         images_per_s_per_member=total / members, ms_per_call=1.0, compile_s=1.0)  # fmt: skip

    rows = [
        row("k-step k=1", "jax", "float32", 6000.0),
        row("population N=8", "jax", "float32", 12000.0, 8),
        row("torch eager", "torch", "float32", 1200.0),
        row("step", "jax", "bfloat16", 4000.0),
        row("torch eager", "torch", "bfloat16", 1000.0),
    ]
    out = race.report(rows, ["test"], quick=False)
    table = [ln for ln in out.splitlines() if ln.startswith("| cifar16")]
    lines = {ln.split("|")[3].strip() + " " + ln.split("|")[4].strip(): ln for ln in table}
    assert "| 5.00x |" in lines["float32 jax k-step k=1"]  # 6,000 / 1,200 (f32 eager), not / 1,000 (bf16)
    assert "| 2.00x |" in lines["float32 jax population N=8"]  # over the f32 k=1 row
    assert "| 4.00x |" in lines["bfloat16 jax step"]
    assert "goals at batch 16, float32:" in out and "goals at batch 16, bfloat16:" in out
    assert "our best single-member row / torch eager = 5.00x" in out
