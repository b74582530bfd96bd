"""reproduce: the paper's tables beside fake result directories, and the plan of every cell (no training)."""

import os

import numpy as np
import pytest

from configs import cifar100_general, tinyimagenet_disjoint
from cvs_jax import reproduce
from cvs_jax.data import splits
from cvs_jax.reports import paper_results
from cvs_jax.testing.result_dirs import fake_results, write_run_dir

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _row(text, title, setup_label, method_label):
    block = text.split(f"### {title}", 1)[1].split("###", 1)[0]
    rows = [r for r in block.splitlines() if r.startswith(f"| {setup_label} | {method_label} |")]
    assert len(rows) == 1, block
    return [cell.strip() for cell in rows[0].strip("|").split("|")]


def test_paper_entries_cite_the_spec_and_cover_table1():
    table1 = [e for e in paper_results.ENTRIES if e["group"] == paper_results.TABLE1]
    assert len(table1) == 24
    assert {(e["dataset"], e["setup"], e["method"]) for e in table1} == {
        (d, s, m) for d in paper_results.DATASETS for s in paper_results.SETUPS for m in paper_results.TABLE1_METHODS
    }
    assert all(list(e["ar"]) == ["1", "2", "4"] for e in table1)
    assert all(e["source"].startswith(("Table 1 (", "the paper's ")) for e in paper_results.ENTRIES)  # each cites
    cvs = [e for e in table1 if (e["dataset"], e["setup"], e["method"]) == ("cifar100", "general", "cvs")][0]
    assert cvs["ar"] == {"1": 73.95, "2": 76.73, "4": 78.84}


def test_report_marks_cells_not_run_and_gives_ours_and_delta(tmp_path):
    dirs = fake_results(tmp_path)
    runs = reproduce.find_runs(dirs)
    assert sorted((r.method, r.variant, r.status) for r in runs) == [
        ("bct", "", "diverged"),
        ("cvs", "", "ok"),
        ("cvs", "", "ok"),
        ("cvs", "lc_lm", "ok"),
    ]
    cells = reproduce.match(runs)
    text = reproduce.report(cells, runs, dirs)
    t1 = "Table 1: CIFAR-100"
    setup = "General (20,20,10,5)"
    ours = _row(text, t1, setup, "CVS")
    assert ours[2:] == [
        "73.95 / 76.73 / 78.84",
        "71.00 ± 1.41 / 75.50 ± 0.71 / 78.50 ± 0.71",
        "2",
        "-2.95 / -1.23 / -0.34",
    ]
    assert _row(text, t1, "Disjoint", "Joint Train")[3:5] == ["not run", "0"]
    assert _row(text, t1, setup, "BCT")[3] == "diverged (1 run(s))"
    assert "seed 0 diverged" in text and "loss is NaN at session 3" in text
    assert _row(text, "Table 1: Tiny-ImageNet", "General (20,20,30,10)", "CVS")[3] == "not run"
    # the lone L_c + L_m run counts for its ablation cell, marked: its recipe differs from the config file
    ab = _row(text, "Ablations (AR@1): CIFAR-100", setup, "L_c + L_m")
    assert ab[2:] == ["63.79", "60.00 †", "1", "-3.79"]
    assert "config differs from configs/cifar100_general.py:lc_lm: train.epochs: 256 -> 1" in text
    assert _row(text, "3-run means (general, AR@1): CIFAR-100", setup, "CVS")[2:] == [
        "73.81 ± 0.15 (3 runs)",
        "71.00 ± 1.41",
        "2",
        "-2.81",
    ]
    cvs = [c for c in cells if c["group"] == paper_results.TABLE1 and c["setup"] == "general" and c["method"] == "cvs"]
    assert cvs[0]["ours"]["1"]["per_run"] == [70.0, 72.0] and cvs[0]["delta"]["1"] == pytest.approx(-2.95)


def test_a_paper_config_run_on_other_data_is_marked(tmp_path):
    """The Tiny-ImageNet disjoint recipe run on the mini zip (100 train images per class, not 500) has the
    cell's config: its sessions' image counts mark the cell (it counted as a run of Tiny-ImageNet, unmarked)."""
    config = tinyimagenet_disjoint.get_config()
    sizes = {}
    for per_class in (500, 100):  # the real mini run's sessions have the sizes of this synthetic split (1,710 each)
        labels = np.repeat(np.arange(200), per_class)
        sizes[per_class] = [len(s.train) for s in splits.plan_from_config(labels, config, num_classes=200).sessions]
    ar = {"1": 30.0, "2": 35.0, "4": 40.0}
    for per_class in (500, 100):
        write_run_dir(str(tmp_path / str(per_class)), config, ar, new_images=sizes[per_class])
    title, row = "Table 1: Tiny-ImageNet", ("Disjoint", "CVS")
    full = reproduce.find_runs([str(tmp_path / "500")])
    assert _row(reproduce.report(reproduce.match(full), full, []), title, *row)[3] == "30.00 / 35.00 / 40.00"
    mini = reproduce.find_runs([str(tmp_path / "100")])
    text = reproduce.report(reproduce.match(mini), mini, [])
    assert _row(text, title, *row)[3] == "30.00 / 35.00 / 40.00 †"
    shown = "/".join(map(str, sizes[100]))
    assert (
        f"† Tiny-ImageNet disjoint CVS (Table 1): the data differs from Tiny-ImageNet's: its sessions brought {shown} "
        f"training images, where Tiny-ImageNet (500 per class) gives {'/'.join(map(str, sizes[500]))}"
    ) in text
    assert "config differs" not in text


def test_variant_inference():
    c = cifar100_general.get_config().to_dict()
    assert reproduce.infer_variant(c, "cifar100", "general") == ""
    for variant in ("lc_lm", "lc_ld", "lc_ld_noreplay", "cvs_noreplay", "half_budget"):
        assert reproduce.infer_variant(cifar100_general.get_config(variant).to_dict(), "cifar100", "general") == variant
    finetune = cifar100_general.get_config("lc").to_dict()
    assert reproduce.infer_variant(finetune, "cifar100", "general") == ""  # L_c alone is the finetune cell
    c["cvs"]["use_lm"] = c["cvs"]["use_ld"] = False
    assert reproduce.infer_variant(c, "cifar100", "general").startswith("custom(")


def test_images_per_epoch_from_the_config_split():
    c = cifar100_general.get_config()  # general (20,20,10,5): 7,200 then ~7,992 images, batch 16, budget 2000
    c.method = "finetune"
    finetune = reproduce.images_per_epoch(c, "cifar100")
    c.method = "cvs"
    cvs = reproduce.images_per_epoch(c, "cifar100")  # + the herded memory from session 2 on
    assert finetune[0] == cvs[0] == 7200
    # memory = floor(2000 / N) x N for the N = 20, 40, 60, 80 classes seen: 2000, 2000, 1980, 2000 images;
    # session 4: 7,956 + 1,980 = 9,936 images = 621 batches of 16, vs 7,956 -> 497 batches (7,952 images)
    assert [b - a for a, b in zip(finetune[1:], cvs[1:])] == [2000, 2000, 1984, 2000]
    assert all(n % 16 == 0 for n in finetune + cvs)


def test_plan_lists_every_table1_cell_with_a_command_and_hours():
    text, data = reproduce.plan([0, 1, 2], "wd")
    lines = text.splitlines()
    table1 = [i for i, line in enumerate(lines) if line.startswith("Table 1 | ")]
    assert len(table1) == 24
    for e in (e for e in paper_results.ENTRIES if e["group"] == paper_results.TABLE1):
        label = paper_results.DATASETS[e["dataset"]]["label"]
        i = lines.index(
            next(line for line in lines if line.startswith(f"Table 1 | {label} | {e['setup']} | {e['label']} "))
        )
        name = paper_results.DATASETS[e["dataset"]]["config"].format(setup=e["setup"])
        assert lines[i + 1].startswith(f"  python -m cvs_jax.compare --config configs/{name}.py --workdir wd/{name} ")
        assert f",{e['method']}" in lines[i + 1] or f" {e['method']}," in lines[i + 1]
        assert "--seeds 0,1,2 --fixed_split" in lines[i + 1]
        assert "GPU h" in lines[i + 2]
    assert "GPU h of one run = " in text and "4,676 img/s" in text
    assert "configs/cifar100_general.py:lc_lm" in text
    assert data["gpu_hours"] > 0 and len([c for c in data["cells"] if c["group"] == paper_results.TABLE1]) == 24
    # CIFAR-100 CVS general: 5 sessions x 256 epochs of ~10,000 images at 4,676 img/s, plus the allowance
    est = [c for c in data["cells"] if c["group"] == paper_results.TABLE1 and c["command"].count("general.py ")]
    cvs = [c["estimate"] for c in est if c["dataset"] == "cifar100" and c["method"] == "cvs"][0]
    assert cvs["hours"] == pytest.approx((1.25 * cvs["trained_images"] / 4676 + 5 * 120) / 3600)
