"""The KernelBench scoreboard: problems found in a KernelBench-shaped folder (small problems
written here, never KernelBench's own files), KernelBench's correctness check and fast_p as
KernelBench defines them, the per-level summary, resume, and one child per problem so a
problem that raises, exits, hangs or allocates costs only its own row."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fact_db.pipeline import kernelbench as kb
from fact_db.pipeline import scoreboard

from conftest import benchmark_script

ROOT = Path(__file__).resolve().parent.parent

GOOD = '''import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.matmul(a, b)

def get_inputs():
    return [torch.rand(256, 128), torch.rand(128, 64)]

def get_init_inputs():
    return []
'''
RELU = GOOD.replace("torch.matmul(a, b)", "torch.relu(a) + b.sum()")
BIG_RELU = RELU.replace("torch.rand(256, 128), torch.rand(128, 64)", "torch.rand(8192, 8192), torch.rand(128, 64)")


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    """A folder shaped like a clone of KernelBench: KernelBench/level<N>/<n>_<name>.py."""
    for rel, text in files.items():
        p = tmp_path / "KernelBench" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


# ------------------------------------------------------------------ the problems

def test_problems_are_found_by_level_and_number_and_named_three_ways(tmp_path):
    root = _tree(tmp_path, {"level1/10_Ten.py": GOOD, "level1/2_Two.py": GOOD, "level1/notes.py": "",
                            "level2/1_One.py": GOOD, "level3/1_Net.py": GOOD})
    assert [p.id for p in kb.problems(root)] == ["L1-2", "L1-10", "L2-1", "L3-1"]
    assert [p.id for p in kb.problems(root / "KernelBench", levels=(2, 3))] == ["L2-1", "L3-1"]
    got = kb.problems(root, only=["10_Ten", "level2/1_One.py", "l3-1"])
    assert [(p.id, p.name, p.level, p.number) for p in got] == [("L1-10", "10_Ten", 1, 10), ("L2-1", "1_One", 2, 1),
                                                               ("L3-1", "1_Net", 3, 1)]
    with pytest.raises(kb.KernelBenchError, match=r"no problem L1-99, 3_Three in level\(s\) 1, 2, 3"):
        kb.problems(root, only=["L1-2", "L1-99", "3_Three"])
    # --level with a selection (the GPU set's file): the selection's part in those levels
    assert [p.id for p in kb.problems(root, levels=(1,), only=["L3-1", "L1-10", "L2-1"])] == ["L1-10"]
    assert kb.problems(root, levels=(2,), only=["L1-10"]) == []
    with pytest.raises(kb.KernelBenchError, match=r"no problem L2-7 in level\(s\) 1, 2, 3"):
        kb.problems(root, levels=(1,), only=["L2-7"])
    with pytest.raises(kb.KernelBenchError, match="no KernelBench/level1 folder in it; point --kernelbench at a clone"):
        kb.problems(tmp_path / "elsewhere")


def test_a_selection_is_a_file_of_names_or_a_list(tmp_path):
    f = tmp_path / "set.txt"
    f.write_text("# a comment\nL1-2    2_Two.py\n\n  L3-1  # the net\n")
    assert kb.selection(str(f)) == ["L1-2", "L3-1"]
    assert kb.selection("L1-2, 10_Ten,") == ["L1-2", "10_Ten"]
    many = [f"L2-{i}" for i in range(1, 101)]  # longer than a file name may be: a list all the same
    assert kb.selection(",".join(many)) == many
    assert kb.selection(None) is None
    with pytest.raises(kb.KernelBenchError, match="no such file"):
        kb.selection("benchmarks/no_such_set.txt")
    assert kb.levels_of("3,1") == (1, 3) and kb.levels_of(None) is None
    with pytest.raises(kb.KernelBenchError, match="--level 4: use levels 1, 2 and 3"):
        kb.levels_of("4")


def test_the_committed_gpu_set_is_the_seeded_draw_and_its_names_parse():
    names = kb.selection(str(ROOT / "benchmarks" / "kernelbench_gpu_set.txt"))
    levels = [n.split("-")[0] for n in names]
    assert (levels.count("L1"), levels.count("L2"), levels.count("L3")) == (30, 30, 50)
    assert len(set(names)) == len(names)
    kbdir = Path("/work/kernelbench")
    if (kbdir / "KernelBench" / "level1").is_dir():  # a clone is here: the file is what the script draws
        r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernelbench_gpu_set.py"), "--kernelbench",
                            str(kbdir), "--check"], capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert len(kb.problems(kbdir, only=names)) == 110


def test_the_committed_conv_set_is_every_level_1_and_2_convolution_and_the_named_cnns():
    names = kb.selection(str(ROOT / "benchmarks" / "kernelbench_conv_set.txt"))
    levels = [n.split("-")[0] for n in names]
    # KernelBench 423217d: 35 of level 1's 100, 63 of level 2's 100
    assert (levels.count("L1"), levels.count("L2"), len(set(names))) == (35, 63, len(names))
    assert [n for n in names if n.startswith("L3")] == ["L3-8", "L3-9", "L3-10", "L3-11", "L3-12", "L3-15", "L3-20",
                                                        "L3-22"]
    kbdir = Path("/work/kernelbench")
    if (kbdir / "KernelBench" / "level1").is_dir():
        r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernelbench_gpu_set.py"), "--kernelbench",
                            str(kbdir), "--conv", "--check"], capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr


# ------------------------------------------------------------------ KernelBench's check and fast_p

def test_fast_p_is_kernelbenchs_share_of_all_problems_correct_and_faster_than_p():
    rows = [{"correct": True, "speedup": 2.5}, {"correct": True, "speedup": 1.2}, {"correct": True, "speedup": 0.8},
            {"correct": False, "speedup": 3.0}, {"correct": False, "speedup": None}]
    # score.py: fastp counts speed_up > p among the correct and divides by n, every problem
    assert [kb.fast_p(rows, p) for p in (0.0, 1.0, 1.5, 2.0)] == [3 / 5, 2 / 5, 1 / 5, 1 / 5]
    assert kb.fast_p([{"correct": True, "speedup": 1.0}], 1.0) == 0.0  # strictly faster than p
    assert kb.fast_p([], 1.0) is None


class _Scaled(torch.nn.Module):
    def __init__(self, inner, scale=1.0, shift=0.0):
        super().__init__()
        self.inner, self.scale, self.shift = inner, scale, shift

    def forward(self, *x):
        return self.inner(*x) * self.scale + self.shift


def test_the_check_passes_the_same_model_and_fails_outside_kernelbenchs_tolerance():
    lin = torch.nn.Linear(64, 32)

    def inputs():
        return [torch.rand(16, 64)]
    same = kb.check(lin, lin, inputs)
    assert same == {"correct": True, "trials_passed": 5, "trials": 5, "tolerance": 1e-4, "max_difference": None,
                    "avg_difference": None, "reason": ""}
    off = kb.check(lin, _Scaled(lin, shift=5e-4), inputs)
    assert not off["correct"] and off["trials_passed"] == 0 and off["reason"] == "output mismatch (atol = rtol = 0.0001)"
    assert off["max_difference"] == pytest.approx(5e-4, rel=1e-3)
    # the same error passes at bf16's tolerance (1e-2), where both run in bfloat16
    lin16 = torch.nn.Linear(64, 32).to(torch.bfloat16)
    assert kb.check(lin16, _Scaled(lin16, shift=5e-4), inputs, "bfloat16")["correct"]


def test_the_check_records_a_shape_mismatch_and_a_raising_candidate_as_incorrect():
    lin = torch.nn.Linear(64, 32)

    def inputs():
        return [torch.rand(16, 64)]

    class Raises(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("illegal memory access\nmore lines")
    assert kb.check(lin, torch.nn.Linear(64, 31), inputs)["reason"] == \
        "output shape mismatch: expected (16, 32), got (16, 31)"
    bad = kb.check(lin, Raises(), inputs)
    assert not bad["correct"] and bad["reason"] == "runtime error: RuntimeError: illegal memory access"


def test_the_check_draws_each_trials_inputs_with_kernelbenchs_seeds():
    seen = []

    def inputs():
        seen.append(torch.initial_seed())
        return [torch.rand(4, 8)]
    lin = torch.nn.Linear(8, 2)
    kb.check(lin, lin, inputs, trials=3, seed=42)
    torch.manual_seed(42)  # eval.py: run_and_check_correctness's trial seeds
    assert seen == [torch.randint(0, 2**32 - 1, (1,)).item() for _ in range(3)]


# ------------------------------------------------------------------ the scoreboard, in process

def _row(pid, level, policy="fp32", correct=True, speedup=None, vs_compile=None, status="ok"):
    return {"id": pid, "level": level, "name": pid, "policy": policy, "status": status, "correct": correct,
            "eager_ms": 1.0 if speedup else None, "compile_ms": None, "factdb_ms": 1.0 / speedup if speedup else None,
            "speedup": speedup, "speedup_vs_compile": vs_compile, "reason": "", "did": {"regions": 1}, "wall_s": 1.0}


@pytest.mark.subprocess
def test_the_kernelbench_commit_is_the_clones_own_never_an_enclosing_repositorys(tmp_path):
    """A KernelBench copy without .git inside another checkout (the device hosts' .kb inside this
    repository) recorded the enclosing repository's commit as KernelBench's."""
    import subprocess
    git = lambda *a, cwd: subprocess.run(["git", *a], cwd=cwd, check=True, capture_output=True, text=True)  # noqa: E731
    outer = tmp_path / "outer"
    (outer / "kb" / "KernelBench" / "level1").mkdir(parents=True)
    (outer / "f.txt").write_text("x")
    git("init", "-q", cwd=outer)
    git("-c", "user.email=a@b", "-c", "user.name=a", "add", "f.txt", cwd=outer)
    git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "-m", "outer", cwd=outer)
    assert kb.clone_commit(outer / "kb") is None
    assert kb.clone_commit(tmp_path / "nowhere") is None
    clone = tmp_path / "clone"
    (clone / "KernelBench").mkdir(parents=True)
    (clone / "KernelBench" / "a.py").write_text("x = 1\n")
    git("init", "-q", cwd=clone)
    git("-c", "user.email=a@b", "-c", "user.name=a", "add", ".", cwd=clone)
    git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "-m", "kb", cwd=clone)
    head = git("rev-parse", "HEAD", cwd=clone).stdout.strip()
    assert kb.clone_commit(clone) == head and kb.clone_commit(clone, short=True) == head[:7]


def test_the_summary_gives_fast_p_per_level_against_eager_and_torch_compile():
    rows = [_row("L1-1", 1, speedup=1.6, vs_compile=0.9), _row("L1-2", 1, speedup=1.1, vs_compile=1.2),
            _row("L1-3", 1, correct=False, speedup=3.0, vs_compile=3.0), _row("L2-1", 2, status="failed", correct=False),
            _row("L1-1", 1, policy="bf16", correct=None, status="plan")]
    s = scoreboard.summary(rows)
    one = s["fp32"]["1"]
    assert (one["problems"], one["correct"], one["timed"], one["failed"]) == (3, 2, 3, 0)
    assert one["fast_p"]["vs_eager"] == {"0": 2 / 3, "1": 2 / 3, "1.5": 1 / 3, "2": 0.0}
    assert one["fast_p"]["vs_compile"] == {"0": 2 / 3, "1": 1 / 3, "1.5": 0.0, "2": 0.0}
    assert s["fp32"]["2"]["fast_p"] == {"vs_eager": None, "vs_compile": None} and s["fp32"]["2"]["failed"] == 1
    assert s["bf16"]["1"]["plan_only"] == 1 and s["bf16"]["1"]["fast_p"]["vs_eager"] is None


def test_the_summary_gives_the_geometric_mean_over_correct_rows_and_without_a_refused_compile():
    """Issue targets are geometric means: over the rows correct by KernelBench's check (an
    incorrect row's speed says nothing), and against torch.compile also without the rows whose
    torch.compile fact-db's verification refused (their ratio compares with a module that does
    not pass the check: KernelBench L2-73's 0.30x)."""
    refused = {"choice": [{"name": "eager", "verified": True}, {"name": "torch.compile", "verified": False}]}
    rows = [_row("L2-1", 2, speedup=1.6, vs_compile=0.9), _row("L2-2", 2, speedup=1.1, vs_compile=1.2),
            _row("L2-3", 2, correct=False, speedup=3.0, vs_compile=3.0),
            {**_row("L2-4", 2, speedup=1.0, vs_compile=0.3), "did": refused}]
    g = scoreboard.summary(rows)["fp32"]["2"]["geomean"]
    assert g["rows"] == 3 and g["compile_refused"] == 1
    assert g["vs_eager"] == pytest.approx((1.6 * 1.1 * 1.0) ** (1 / 3))
    assert g["vs_compile"] == pytest.approx((0.9 * 1.2 * 0.3) ** (1 / 3))
    assert g["vs_compile_verified"] == pytest.approx((0.9 * 1.2) ** 0.5)
    assert scoreboard.summary([_row("L2-3", 2, correct=False, speedup=3.0)])["fp32"]["2"]["geomean"]["vs_eager"] is None


@pytest.mark.subprocess
def test_parts_run_apart_merge_into_one_scoreboard_with_the_summary_recomputed(tmp_path):
    head = {"budget_per_problem_s": 120.0, "max_candidates": 4, "peers": ["compile"], "timed": True,
            "kernelbench": {"commit": "423217d"}, "policies": ["fp32"]}
    a = {**head, "device": "NVIDIA H100 80GB HBM3", "date": "2026-11-26", "commit": "abc",
         "results": [_row("L1-1", 1, speedup=1.6), _row("L2-1", 2, speedup=0.9)]}
    b = {**head, "device": "NVIDIA H100 80GB HBM3", "date": "2026-11-27", "commit": "def",
         "results": [_row("L1-2", 1, speedup=2.5), _row("L1-1", 1, speedup=9.0)]}  # L1-1 twice: a's row is kept
    doc = scoreboard.merge([a, b])
    assert [r["id"] for r in doc["results"]] == ["L1-1", "L2-1", "L1-2"] and doc["results"][0]["speedup"] == 1.6
    assert [(p["date"], p["commit"], p["rows"]) for p in doc["parts"]] == [("2026-11-26", "abc", 2),
                                                                          ("2026-11-27", "def", 2)]
    assert doc["levels"]["fp32"]["1"]["fast_p"]["vs_eager"]["1.5"] == 1.0
    assert doc["levels"]["fp32"]["2"]["fast_p"]["vs_eager"]["0"] == 1.0 and doc["levels"]["fp32"]["2"]["correct"] == 1
    assert scoreboard.merge([doc, {**a, "results": []}])["parts"][:2] == doc["parts"]  # parts of a merge carry over
    with pytest.raises(kb.KernelBenchError, match=r"the parts differ in max_candidates \(4 and 12\)"):
        scoreboard.merge([a, {**b, "max_candidates": 12}])
    with pytest.raises(kb.KernelBenchError, match=r"different KernelBench commits \(423217d, 9999999\)"):
        scoreboard.merge([a, {**b, "kernelbench": {"commit": "9999999"}}])
    # a part from a copy without .git (commit unknown) merges, and the merge keeps the known commit
    unknown = scoreboard.merge([{**b, "kernelbench": {"commit": None}}, a])
    assert unknown["kernelbench"]["commit"] == "423217d" and len(unknown["results"]) == 3
    assert len(scoreboard.merge([a, {**b, "budget_per_problem_s": 300.0}])["results"]) == 3  # rows carry budgets
    # a row made before eager_time: returned eager, timed apart at 0.54x (L3-10 in blocks): eager's time
    old = {**_row("L3-10", 3, speedup=0.54), "did": {"returned": "eager (timed faster)"}}
    (fixed,) = scoreboard.merge([{**a, "results": [old]}])["results"]
    assert (fixed["speedup"], fixed["factdb_ms"], round(fixed["factdb_timed_ms"], 3)) == (1.0, 1.0, round(1 / 0.54, 3))
    composed = {**_row("L3-38", 3, speedup=0.92), "did": {"returned": "composed"}}  # another module: its own time
    assert scoreboard.merge([{**a, "results": [composed]}])["results"][0]["speedup"] == 0.92
    graphed = {**_row("L3-20", 3, speedup=2.5), "did": {"returned": "eager, CUDA graph"}}  # eager's ops, replayed
    assert scoreboard.merge([{**a, "results": [graphed]}])["results"][0]["speedup"] == 2.5
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    scoreboard.write(a, pa)
    scoreboard.write(b, pb)
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernelbench_merge.py"), str(pa), str(pb), "--out",
                        str(tmp_path / "all.json")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert len(json.loads((tmp_path / "all.json").read_text())["results"]) == 3


@pytest.mark.subprocess
def test_a_failed_newest_row_is_named_and_keep_finished_keeps_the_older_finished_one(tmp_path):
    """Newest part first: a problem that ran out of its budget in the newest part would hide the
    row an older part finished. The merge says so; --keep-finished keeps the finished row (and
    a failed row with no finished twin stays)."""
    head = {"budget_per_problem_s": 120.0, "max_candidates": 4, "peers": ["compile"], "timed": True,
            "kernelbench": {"commit": "423217d"}, "policies": ["bf16"], "device": "NVIDIA H200", "gpu": "h200"}
    timeout = {**_row("L2-13", 2, policy="bf16", correct=False, status="failed"),
               "reason": "did not finish within 120 s (the per-problem budget)"}
    new = {**head, "date": "2026-11-27", "commit": "def",
           "results": [timeout, _row("L2-1", 2, policy="bf16", speedup=3.9),
                       _row("L2-99", 2, policy="bf16", correct=False, status="failed")]}
    old = {**head, "date": "2026-11-26", "commit": "abc",
           "results": [_row("L2-13", 2, policy="bf16", speedup=1.7), _row("L2-1", 2, policy="bf16", speedup=2.9)]}
    assert [key for key, _ in scoreboard.hidden_finished([new, old])] == [("L2-13", "bf16")]
    assert scoreboard.hidden_finished([old, new]) == []  # the finished row is first: nothing hidden
    plain = {r["id"]: r for r in scoreboard.merge([new, old])["results"]}
    assert plain["L2-13"]["status"] == "failed" and plain["L2-1"]["speedup"] == 3.9
    kept = {r["id"]: r for r in scoreboard.merge([new, old], keep_finished=True)["results"]}
    assert kept["L2-13"]["speedup"] == 1.7 and kept["L2-1"]["speedup"] == 3.9  # newest still wins elsewhere
    assert kept["L2-99"]["status"] == "failed"  # no finished twin: the failure stays
    pn, po, out = tmp_path / "new.json", tmp_path / "old.json", tmp_path / "all.json"
    scoreboard.write(new, pn)
    scoreboard.write(old, po)
    cmd = [sys.executable, str(ROOT / "benchmarks" / "kernelbench_merge.py"), str(pn), str(po), "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "L2-13 bf16: the newest row failed" in r.stderr and "--keep-finished" in r.stderr
    assert {x["id"]: x["status"] for x in json.loads(out.read_text())["results"]}["L2-13"] == "failed"
    r = subprocess.run(cmd + ["--keep-finished"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "kept: a later part's finished row" in r.stderr
    assert {x["id"]: x.get("speedup") for x in json.loads(out.read_text())["results"]}["L2-13"] == 1.7


@pytest.mark.subprocess
def test_resumed_parts_list_each_run_once_and_rows_move_to_to_rerun(tmp_path):
    """A shard resumed from a merged file carries that file's head and parts: merged again,
    each part is listed once, and the rows the resumed runs added (stamped with their commit)
    count as parts of their own. --rerun moves a row to to_rerun; a to_rerun entry whose
    problem has a row now is dropped."""
    head = {"budget_per_problem_s": 300.0, "max_candidates": 4, "peers": ["compile"], "timed": True,
            "kernelbench": {"commit": "423217d"}, "policies": ["fp32"], "device": "NVIDIA H200", "gpu": "h200"}
    merged = {**head, "date": "2026-11-26", "commit": "abc", "results": [_row("L1-1", 1, speedup=1.6)],
              "parts": [{"date": "2026-11-26", "commit": "abc", "rows": 1}],
              "to_rerun": [{"id": "L1-2", "name": "L1-2", "why_rerun": "a fixed fault"},
                           {"id": "L1-3", "name": "L1-3", "why_rerun": "a fixed fault"}]}
    shard = json.loads(json.dumps(merged))  # what the resumed shard began from
    shard["results"] += [{**_row("L1-2", 1, speedup=2.0), "commit": "def", "date": "2026-11-27"},
                         {**_row("L2-1", 2, speedup=1.2), "commit": "def", "date": "2026-11-27"}]
    doc = scoreboard.merge([merged, shard])
    assert [(p["commit"], p["rows"]) for p in doc["parts"]] == [("abc", 1), ("def", 2)]
    assert scoreboard.merge([doc, shard])["parts"] == doc["parts"]  # a merge merged again: stamped parts recounted
    # a resumed run on other GPUs than the part it resumed from: its part names the rows' device
    other = json.loads(json.dumps(shard))
    other["results"].append({**_row("L2-2", 2, speedup=1.1), "commit": "fed", "date": "2026-11-28",
                             "device": "NVIDIA H100 80GB HBM3"})
    parts = scoreboard.merge([merged, other])["parts"]
    assert [(p["commit"], p.get("gpu"), p["rows"]) for p in parts] == [("abc", None, 1), ("def", "h200", 2), ("fed", "h100", 1)]
    pm, ps = tmp_path / "merged.json", tmp_path / "shard.json"
    scoreboard.write({**merged, "raw": ["raw/old.json"]}, pm)  # a merged file lists its raw parts
    scoreboard.write(shard, ps)
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernelbench_merge.py"), str(pm), str(ps), "--out",
                        str(tmp_path / "all.json"), "--rerun", "L2-1=its stage failed on a bug fixed since",
                        "--raw", "raw/shard.json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads((tmp_path / "all.json").read_text())
    assert [x["id"] for x in out["results"]] == ["L1-1", "L1-2"]
    assert [(e["id"], e["why_rerun"]) for e in out["to_rerun"]] == [("L1-3", "a fixed fault"),
                                                                   ("L2-1", "its stage failed on a bug fixed since")]
    assert out["raw"] == ["raw/old.json", "raw/shard.json"] and "2" not in out["levels"]["fp32"]
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernelbench_merge.py"), str(ps), str(pm), "--out",
                        str(tmp_path / "new-first.json"), "--raw", "raw/shard.json"], capture_output=True, text=True,
                       timeout=120)  # the new part first (its rows win): the merged file's raw list is kept
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "new-first.json").read_text())["raw"] == ["raw/old.json", "raw/shard.json"]
    assert [(p["commit"], p["rows"]) for p in out["parts"]] == [("abc", 1), ("def", 1)], "a row moved out is not counted"
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernelbench_merge.py"), str(pm), "--out",
                          str(tmp_path / "x.json"), "--rerun", "L9-9=no such row"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode != 0 and "no row for 'L9-9'" in bad.stderr


def test_a_run_writes_after_every_row_says_a_line_each_and_resumes(tmp_path):
    root = _tree(tmp_path, {"level1/1_A.py": GOOD, "level1/2_B.py": GOOD, "level2/1_C.py": GOOD})
    probs = kb.problems(root)
    out = tmp_path / "kb.json"
    ran, said = [], []

    def runner(p, pol):
        ran.append((p.id, pol))
        assert json.loads(out.read_text())["results"] if ran[1:] else True  # the rows before are on disk
        return _row(p.id, p.level, pol, speedup=1.5, vs_compile=1.1)
    doc = {"results": []}
    scoreboard.run(probs[:2], root, ["fp32"], out=out, doc=doc, say=said.append, runner=runner)
    assert ran == [("L1-1", "fp32"), ("L1-2", "fp32")] and len(said) == 2
    assert said[0].startswith("[1/2] L1-1 L1-1 fp32: correct; eager 1 ms") and said[0].endswith("; 1.0 s")
    again = scoreboard.load(out)
    scoreboard.run(probs, root, ["fp32", "bf16"], out=out, doc=again, say=said.append, runner=runner)
    assert ran[2:] == [("L1-1", "bf16"), ("L1-2", "bf16"), ("L2-1", "fp32"), ("L2-1", "bf16")]
    assert said[2] == f"resuming: 2 run(s) already in {out}, 4 to go"
    final = json.loads(out.read_text())
    assert {r["budget_s"] for r in final["results"]} == {scoreboard.DEFAULT_BUDGET_S}
    scoreboard.run(probs, root, ["tf32"], out=out, doc=scoreboard.load(out), say=said.append, runner=runner,
                   stamp={"commit": "def", "date": "2026-11-27"})  # a resumed run stamps the rows it adds
    rows = json.loads(out.read_text())["results"]
    assert [r.get("commit") for r in rows] == [None] * 6 + ["def"] * 3
    assert len(final["results"]) == 6 and final["levels"]["bf16"]["1"]["fast_p"]["vs_eager"]["1"] == 1.0



def test_a_resumed_run_with_a_larger_budget_runs_again_the_rows_their_budget_stopped(tmp_path):
    """KernelBench L1-68: stopped in its end-to-end verification by a 110 s budget (its kernel
    8x cuDNN's speed), skipped by a resumed run given 330 s. Where the resumed run is given a
    budget (--budget-per-problem), a row a smaller one stopped runs again, its old row replaced;
    one stopped by the same budget, or failed otherwise, stays; without one (the default budget),
    nothing runs again."""
    root = _tree(tmp_path, {"level1/1_A.py": GOOD, "level1/2_B.py": GOOD, "level1/3_C.py": GOOD})
    probs = kb.problems(root)
    out = tmp_path / "kb.json"
    stopped = lambda pid, budget: {**_row(pid, 1, "fp32", speedup=None, vs_compile=None), "status": "failed",  # noqa: E731
                                   "budget_s": budget, "did": {"stopped_in": "verify"}}
    other = {**_row("L1-3", 1, "fp32", speedup=None, vs_compile=None), "status": "failed", "did": {}, "budget_s": 110}
    doc = {"results": [stopped("L1-1", 110), stopped("L1-2", 330), other]}
    ran = []

    def runner(p, pol):
        ran.append(p.id)
        return _row(p.id, p.level, pol, speedup=8.0, vs_compile=8.0)
    scoreboard.run(probs, root, ["bf16"], out=out, doc=doc, budget_s=330, say=lambda _: None,
                   runner=lambda p, pol: _row(p.id, p.level, pol), rerun_stopped=True)
    assert sum(r["policy"] == "fp32" for r in doc["results"]) == 3  # another policy's stopped rows stay
    doc["results"] = [r for r in doc["results"] if r["policy"] == "fp32"]
    scoreboard.run(probs, root, ["fp32"], out=out, doc=doc, budget_s=330, say=lambda _: None, runner=runner)
    assert ran == []  # no budget given for the resumed run: every row stays as it is
    scoreboard.run(probs, root, ["fp32"], out=out, doc=doc, budget_s=330, say=lambda _: None, runner=runner,
                   rerun_stopped=True)
    assert ran == ["L1-1"]
    rows = {r["id"]: r for r in json.loads(out.read_text())["results"]}
    assert len(rows) == 3 and rows["L1-1"]["status"] == "ok" and rows["L1-1"]["budget_s"] == 330
    assert rows["L1-2"]["status"] == rows["L1-3"]["status"] == "failed"
    assert not scoreboard.out_of_budget(rows["L1-2"], 330) and scoreboard.out_of_budget(stopped("x", 110), 330)


BATCHNORM = GOOD.replace("super().__init__()", "super().__init__()\n        self.bn = nn.BatchNorm1d(64)").replace(
    "def forward(self, a, b):\n        return torch.matmul(a, b)", "def forward(self, a, b):\n        return self.bn(a @ b)")
ON_CPU = {"realizer": lambda disc, policy: [], "timer": lambda fn, xs: 1.0, "peers": ()}


def test_the_optimize_path_checks_the_module_fact_db_returns_and_times_it():
    """run_problem's GPU path, on the CPU: optimize with its realizer and timer stood in (every
    region eager), then KernelBench's check of the module it returned."""
    import tempfile
    root = _tree(Path(tempfile.mkdtemp()), {"level1/1_Matmul.py": GOOD, "level2/1_BN.py": BATCHNORM})
    mm, bn = kb.problems(root)
    row = scoreboard.run_problem(mm, "fp32", device="cpu", hooks=ON_CPU)
    assert (row["status"], row["correct"], row["reason"], row["device"]) == ("ok", True, "", "cpu")
    assert row["check"]["trials_passed"] == 5 and row["check"]["tolerance"] == 1e-4
    assert (row["eager_ms"], row["factdb_ms"], row["speedup"], row["compile_ms"]) == (1.0, 1.0, 1.0, None)
    # the composed module ran no kernel and timed as eager: a tie, which eager keeps
    assert row["did"]["returned"] == "eager" and row["did"]["verified"]
    assert row["check_pytorch_default"]["correct"]  # under fp32 also checked against PyTorch's defaults
    assert row["did"]["per_region"] == []  # the stand-in realizer realized nothing
    # returned eager, its time is eager's: timed apart it differs by the timing's spread alone
    # (L3-23 measured the same eager module 6% apart in alternating runs), kept as factdb_timed_ms
    noisy = {**ON_CPU, "timer": lambda fn, xs: 1.3 if fn.__name__ == "<lambda>" else 1.0}
    row = scoreboard.run_problem(mm, "fp32", device="cpu", hooks=noisy)
    assert row["did"]["returned"] == "eager" and row["did"]["rounds_ms"]["fact-db"] == [1.3, 1.3, 1.3]
    assert (row["eager_ms"], row["factdb_ms"], row["factdb_timed_ms"], row["speedup"]) == (1.0, 1.0, 1.3, 1.0)
    from test_compose import standin_realizer
    row = scoreboard.run_problem(mm, "fp32", device="cpu", hooks={**ON_CPU, "realizer": standin_realizer()})
    assert row["correct"] and row["did"]["kernels"] == 1
    (one,) = row["did"]["per_region"]
    assert (one["rule"], one["shape"], one["how"]) == ("gemm", "256x64x128", "tuned") and one["runs"], one
    # the choice's candidates, each with why it lost: a peer left out shows in the row (L3-48's
    # torch.compile timed 2.3x faster than what was returned, and the row could not say why)
    assert [c["name"] for c in row["did"]["choice"]] == ["eager", "composed"]
    assert sum(c["chosen"] for c in row["did"]["choice"]) == 1 and all(c["why"] for c in row["did"]["choice"]
                                                                        if not c["chosen"])
    # KernelBench builds its models in training mode; optimize keeps the mode it is given, so
    # BatchNorm runs on batch statistics in both, the check passes, and the report says why
    row = scoreboard.run_problem(bn, "fp32", device="cpu", hooks=ON_CPU)
    assert (row["status"], row["correct"], row["reason"]) == ("ok", True, ""), row
    assert any("training mode: its BatchNorm1d run as in training" in n for n in row["did"]["notes"])


def test_a_file_that_is_not_a_scoreboard_is_refused_with_its_name(tmp_path):
    f = tmp_path / "x.json"
    f.write_text("[1, 2]")
    with pytest.raises(kb.KernelBenchError, match=f"{f}: no `results` list in it"):
        scoreboard.load(f)


# ------------------------------------------------------------------ the command: a child per problem

def _bench(*args, cwd, timeout=240):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), FACTDB_HOME=str(cwd / "home"))
    return subprocess.run([sys.executable, "-m", "fact_db.cli", "bench", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=timeout)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the plan path; with a GPU each problem is optimized")
def test_each_problem_runs_in_its_own_child_and_a_bad_one_is_a_row_with_its_reason(tmp_path):
    """A problem that raises, exits, hangs or allocates past the limit ends as a row saying so;
    the others are planned; nothing prints a traceback; --resume runs only what is missing."""
    root = _tree(tmp_path, {
        "level1/1_Matmul.py": GOOD,
        "level1/2_Raises.py": "raise ValueError('no such layer')\n" + GOOD,
        "level1/3_Exits.py": "import os\nos._exit(3)\n",
        "level1/4_Hangs.py": "import time\ntime.sleep(600)\n" + GOOD,
        "level1/5_Hog.py": "hog = b'x' * (1536 << 20)\nimport time\ntime.sleep(60)\n" + GOOD,
        "level2/1_Relu.py": RELU,
    })
    out = tmp_path / "kb.json"
    r = _bench("--kernelbench", str(root), "--level", "1", "--budget-per-problem", "25", "--max-memory", "1200",
               "--out", str(out), cwd=tmp_path)
    text = r.stdout + r.stderr
    assert r.returncode == 0, text
    assert "Traceback" not in text and "no CUDA GPU here: the scoreboard runs the plan" in r.stderr
    rows = {x["id"]: x for x in json.loads(out.read_text())["results"]}
    assert list(rows) == ["L1-1", "L1-2", "L1-3", "L1-4", "L1-5"]
    assert rows["L1-1"]["status"] == "plan" and rows["L1-1"]["did"]["rules"] == ["gemm"]
    assert rows["L1-2"]["status"] == "failed" and "ValueError: no such layer" in rows["L1-2"]["reason"]
    assert "ended the process with exit code 3" in rows["L1-3"]["reason"]
    assert rows["L1-4"]["reason"].startswith("planning it did not finish within 25 s (the per-problem budget")
    assert rows["L1-4"]["wall_s"] < 40
    assert "used more than 1200 MiB of memory" in rows["L1-5"]["reason"]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("[")]
    assert len(lines) == 5 and lines[0].startswith("[1/5] L1-1 1_Matmul fp32: plan: 1 region(s), 1 to tune")
    assert lines[3].startswith("[4/5] L1-4 4_Hangs fp32: failed: planning it did not finish within 25 s")

    r = _bench("--kernelbench", str(root), "--resume", str(out), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resuming: 5 run(s) already in" in r.stderr and "[1/1] L2-1 1_Relu fp32: plan: 0 region(s)" in r.stderr
    doc = json.loads(r.stdout)
    assert len(doc["results"]) == 6 and doc["levels"]["fp32"]["2"]["fast_p"]["vs_eager"] is None


def test_kernelbench_options_need_kernelbench_and_its_problems_must_exist(tmp_path):
    from click.testing import CliRunner

    from fact_db.cli.main import cli
    r = CliRunner().invoke(cli, ["bench", "--level", "1"])
    assert r.exit_code == 2 and "go with --kernelbench DIR" in r.output
    root = _tree(tmp_path, {"level1/1_A.py": GOOD})
    r = CliRunner().invoke(cli, ["bench", "--kernelbench", str(root), "--problems", "L1-7"])
    assert r.exit_code == 1 and "no problem L1-7 in level(s) 1:" in r.output and "Traceback" not in r.output


def test_the_readme_table_reads_a_scoreboard_and_the_cpu_sweep():
    """benchmarks/tables.py's `kernelbench` rows: fast_p cells from a scoreboard's summary, and
    "not timed" for the plan."""
    tables = benchmark_script("tables")
    rows = [_row("L1-1", 1, speedup=1.6, vs_compile=0.9), _row("L1-2", 1, speedup=1.1, vs_compile=1.2),
            _row("L1-3", 1, correct=False, speedup=3.0, vs_compile=3.0)]
    doc = {"device": "NVIDIA H100 80GB HBM3", "date": "2026-12-01", "results": rows,
           "levels": scoreboard.summary(rows)}
    [r] = tables.rows_kernelbench(doc, "h100-2026-12-01-kernelbench-fp32.json")
    assert (r["level"], r["policy"], r["problems"], r["answered"], r["correct"], r["gpu"]) == (1, "fp32", 3, "3", 2,
                                                                                               "H100 80GB HBM3")
    assert r["fast_eager"] == "0.67 / 0.67 / 0.33 / 0.00" and r["fast_compile"] == "0.67 / 0.33 / 0.00 / 0.00"
    # a part of a set: how much of the level has run, and what waits to run again
    part = {**doc, "set_size": {"1": 30}, "to_rerun": [{"id": "L1-7"}, {"id": "L1-9"}, {"id": "L2-1"}]}
    [r] = tables.rows_kernelbench(part, "h100-2026-12-01-kernelbench-fp32.json")
    assert (r["problems"], r["answered"]) == ("3 of 30 (a part)", "3 (2 more to rerun)")
    sweep = {"device": "cpu", "machine": {"cpu": "AMD EPYC", "cores": 2}, "date": "2026-11-26", "results": [
        {"level": 2, "policy": "bf16", "exit_code": 0, "timed_out": False, "traceback": False, "internal_error": False,
         "seconds": 5.2, "regions": ["gemm"]},
        {"level": 2, "policy": "bf16", "exit_code": 1, "timed_out": False, "traceback": True, "internal_error": False,
         "seconds": 7.9, "regions": None}]}
    [r] = tables.rows_kernelbench(sweep, "cpu-2026-11-26-kernelbench-plan.json")
    assert (r["answered"], r["with_regions"], r["fast_eager"], r["gpu"]) == ("1 (plan, at most 8 s)", 1,
                                                                             "not timed (no GPU)", "AMD EPYC, 2 cores")


@pytest.mark.slow
def test_the_plan_row_names_what_no_rule_covers_with_its_share(tmp_path):
    """Without a GPU a row is the plan: its regions, and each op no rule covers with its share
    of the estimated eager time (what would have to be covered to go faster)."""
    root = _tree(tmp_path, {"level1/1_Matmul.py": GOOD, "level1/2_Relu.py": RELU, "level1/3_BigRelu.py": BIG_RELU})
    mm, relu, big = kb.problems(root)
    row = scoreboard.run_problem(big, "fp32")
    assert row["did"]["uncovered"]["aten.relu"] == row["did"]["uncovered"]["aten.add"] > 0.45  # one pass each
    row = scoreboard.run_problem(relu, "fp32")
    assert row["status"] == "plan" and row["did"]["regions"] == 0
    unc, rest = row["did"]["uncovered"], row["did"]["uncovered_rest"]
    assert all(v is None or 0 < v <= 1 for v in unc.values())
    assert rest["ops"] >= 1  # ops too small to list one by one (a launch or less each), summed
    assert sum(v for v in unc.values() if v) + rest["share"] == pytest.approx(1.0, abs=0.02)
    assert f"0 region(s), 0 to tune, {len(unc)} uncovered op(s)" in scoreboard.line(row)
    row = scoreboard.run_problem(mm, "fp32")
    assert row["did"]["regions"] == 1 and row["did"]["planned"] == 1 and row["did"]["uncovered"] == {}


def test_a_child_stopped_by_the_budget_says_the_stage_it_was_in():
    err = "[discover] ...\n[discover] done in 4.1 s\n[realize] ...\n[build] compiling 12 kernel(s), 12 at a time\nnoise\n"
    assert scoreboard._last_stage(err) == " (last: [build] compiling 12 kernel(s), 12 at a time)"
    assert scoreboard._last_stage("Traceback ...\nValueError: x\n") == ""
    # the row keeps where the time went: the stages done with their seconds, the one it was in
    got = scoreboard._stopped(err + "[verify] ...\n")
    assert got["stages_s"] == {"discover": 4.1} and got["stopped_in"] == "verify"
    assert got["stderr_tail"][-1] == "[verify] ..." and "noise" in got["stderr_tail"]


def test_gpu_clocks_reads_nvidia_smi_falls_back_to_the_older_field_and_is_kept_in_the_rows(tmp_path, monkeypatch):
    """The GPU's SM clock and clock event reasons after each timing, in the choice and the
    benchmark, go into the scoreboard's row: L3-35's eager model timed 37.1 ms in the choice
    and 51.1 ms in the benchmark, and nothing said whether the GPU had slowed down."""
    from fact_db.kernels import bench
    with monkeypatch.context() as m:
        smi = tmp_path / "nvidia-smi"
        smi.write_text("#!/bin/sh\ncase \"$*\" in *clocks_event_reasons*) echo 'Field is not valid' >&2; exit 2;; esac\n"
                       "echo $* >> " + str(tmp_path / "calls") + "\necho '1755, 1980, 512.3, 61, 0x0000000000000004'\n")
        smi.chmod(0o755)
        m.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
        m.setattr(torch.cuda, "is_available", lambda: True)
        m.setattr(bench, "_smi_id", lambda device: "00000000:1B:00.0")
        m.setattr(bench, "_smi", {"reasons": None, "off": False})
        assert bench.gpu_clocks() == {"sm_mhz": 1755.0, "max_sm_mhz": 1980.0, "power_w": 512.3, "temp_c": 61.0,
                                      "reasons": "0x0000000000000004"}
        bench.gpu_clocks()
        calls = (tmp_path / "calls").read_text().splitlines()
        assert len(calls) == 2 and all("-i 00000000:1B:00.0" in c and "clocks_throttle_reasons.active" in c for c in calls)
        # with no nvidia-smi: None, and not asked again
        m.setattr(bench, "_smi", {"reasons": None, "off": False})
        m.setenv("PATH", "/nonexistent")
        assert bench.gpu_clocks() is None and bench._smi["off"]
    # the choice's candidates and the benchmark's variants keep a sample per timing, and the row says so
    sample = {"sm_mhz": 1500.0, "reasons": "0x4"}
    monkeypatch.setattr(bench, "gpu_clocks", lambda device="cuda": sample)
    import tempfile
    root = _tree(Path(tempfile.mkdtemp()), {"level1/1_Matmul.py": GOOD})
    (mm,) = kb.problems(root)
    row = scoreboard.run_problem(mm, "fp32", device="cpu", hooks=ON_CPU)
    from fact_db.pipeline.choice import ROUNDS
    assert all(c["sm_mhz"] == [1500.0] * ROUNDS and c["reasons"] == ["0x4"] for c in row["did"]["choice"])
    assert row["did"]["clocks"]["fact-db"]["sm_mhz"][0] == 1500.0
    # and each interleaved round's time, with the host's load, to tell a steady gap from a slow round
    from fact_db.pipeline.measure import BENCH_ROUNDS
    assert len(row["did"]["rounds_ms"]["fact-db"]) == BENCH_ROUNDS and len(row["did"]["rounds_ms"]["eager fp32"]) == BENCH_ROUNDS
    assert len(row["did"]["load_average"]) == 3


def test_a_row_whose_rounds_did_not_settle_says_so():
    """KernelBench L2-36 at bf16: fact-db returned torch.compile of the model and timed 0.88x of
    the same compiled peer, over rounds that spread 28% after the fifth. The row names the
    variants whose rounds never settled (bench.rounds_unsettled), and its line says so."""
    from types import SimpleNamespace as NS
    steady, shaky = [0.3943, 0.4054, 0.4434], [0.405, 0.513, 0.5175, 0.5038, 0.4444]
    report = NS(regions=[], stages_s={}, verification=None, notes=[], choice=None,
                variants=[NS(name="fact-db", round_ms=shaky, clocks=[]),
                          NS(name="torch.compile", round_ms=steady, clocks=[])])
    did = scoreboard._did(report)
    assert list(did["unsettled"]) == ["fact-db"] and "spread 28%" in did["unsettled"]["fact-db"]
    row = {**_row("L2-36", 2, policy="bf16", speedup=2.25, vs_compile=0.88), "did": {**did, "returned": "torch.compile"}}
    assert scoreboard.line(row).endswith("returned torch.compile; rounds unsettled: fact-db; 1.0 s")
    report.variants[0].round_ms = steady
    assert "unsettled" not in scoreboard._did(report)
    assert "unsettled" not in scoreboard.line({**row, "did": scoreboard._did(report)})


def test_coverage_says_why_each_fp32_convolution_ran_cudnn():
    """kernelbench_coverage.classify: a conv row with per-region records names, per region, a
    geometry the family has no kernel for or fact-db's candidates losing to cuDNN; a row from
    before those records says a rerun tells."""
    cov = benchmark_script("kernelbench_coverage")
    plan = {"regions": [{"rule": "conv-transpose", "shape": "s", "share": 0.9}], "uncovered": [], "covered_share": 0.9,
            "est_eager_ms": 1.0, "rest": {}}
    row = {"status": "ok", "policy": "fp32", "eager_ms": 5.0, "did": {"per_region": [
        {"rule": "conv-transpose", "how": "tuned", "runs": "eager PyTorch",
         "note": "cuDNN only: a transposed convolution with a stride: the sm90 dgrad kernel is not templated yet"},
        {"rule": "conv-epilogue", "how": "tuned", "runs": "eager PyTorch", "note": "cudnn: 17.922 ms"}]}}
    cls, what = cov.classify(row, plan, 1.05)
    assert cls == "fp32 convolution kernel"
    assert "conv-transpose: no kernel for its geometry (a transposed convolution with a stride" in what
    assert "conv-epilogue: fact-db's candidates lost to cuDNN fp32 (cudnn: 17.922 ms)" in what
    old = {"status": "ok", "policy": "fp32", "eager_ms": 5.0, "did": {"kernels": 0}}
    assert "predates per-region records" in cov.classify(old, plan, 1.05)[1]
    won = dict(row, did={"per_region": [{"rule": "conv", "how": "tuned", "runs": "conv_sm90 split3", "note": ""}],
                         "returned": "eager"})
    assert cov.classify(won, plan, 1.05)[0] == "kernel lost"


def test_the_held_memory_bound_goes_to_every_problem_and_parts_must_share_it(tmp_path):
    """`factdb bench --kernelbench DIR --max-held none|MIB`: each problem's optimize gets the
    bound (KernelBench's CNNs: CUDA graphs 2-3x faster than eager, held out by eager's peak by
    default), the scoreboard's head records it, and parts or a resumed run with another bound
    are refused rather than mixed."""
    import tempfile

    from click.testing import CliRunner

    from fact_db.cli.main import cli
    from test_compose import standin_realizer
    linear = GOOD.replace("super().__init__()", "super().__init__()\n        self.fc = nn.Linear(128, 64)").replace(
        "def forward(self, a, b):\n        return torch.matmul(a, b)", "def forward(self, a, b):\n        return self.fc(a)")
    root = _tree(Path(tempfile.mkdtemp()), {"level1/1_Linear.py": linear})
    (mm,) = kb.problems(root)
    held = {**ON_CPU, "realizer": standin_realizer(lo=True)}  # the composed module holds the weight's lo parts
    timer = {"timer": lambda fn, xs: 0.5 if fn.__name__ == "composed" else 1.0}
    # over a bound of 0 MiB the weight is split per call (choice.within_bound): nothing held
    row = scoreboard.run_problem(mm, "fp32", device="cpu", hooks={**held, **timer}, max_held=0.0)
    composed = next(c for c in row["did"]["choice"] if c["name"] == "composed")
    assert composed["chosen"] and composed["held_mib"] == 0.0
    row = scoreboard.run_problem(mm, "fp32", device="cpu", hooks={**held, **timer}, max_held=None)
    composed = next(c for c in row["did"]["choice"] if c["name"] == "composed")
    assert composed["chosen"] and composed["held_mib"] > 0
    a = {"results": [], "max_candidates": 4, "peers": ["compile"], "timed": True}
    with pytest.raises(kb.KernelBenchError, match=r"the parts differ in max_held \('eager' and 'none'\)"):
        scoreboard.merge([a, {**a, "max_held": "none"}])
    out = tmp_path / "kb.json"
    scoreboard.write({**a, "results": [{**_row("L1-1", 1), "policy": "fp32"}]}, out)
    r = CliRunner().invoke(cli, ["bench", "--kernelbench", str(root), "--resume", str(out), "--max-held", "none"])
    assert r.exit_code == 2 and "ran with --max-held eager, this run gives none" in r.output, r.output
    r = CliRunner().invoke(cli, ["bench", "--kernelbench", str(root), "--max-held", "lots"])
    assert r.exit_code == 2 and "'lots' is not a bound" in r.output, r.output


def test_strict_allclose_goes_to_every_problem_and_parts_must_share_it(tmp_path, monkeypatch):
    """`factdb bench --kernelbench DIR --strict-allclose`: each problem's optimize verifies with
    KernelBench's allclose unexempted, the head records it, and parts or a resumed run verified
    the other way are refused rather than mixed."""
    import tempfile

    from click.testing import CliRunner

    from fact_db.cli.main import cli
    from fact_db.pipeline import run as run_mod
    root = _tree(Path(tempfile.mkdtemp()), {"level1/1_Matmul.py": GOOD})
    (mm,) = kb.problems(root)
    seen = []
    real = run_mod.optimize

    def spy(*a, **kw):
        seen.append(kw.get("strict_allclose"))
        return real(*a, **kw)
    monkeypatch.setattr(run_mod, "optimize", spy)
    for strict in (False, True):
        row = scoreboard.run_problem(mm, "fp32", device="cpu", hooks=ON_CPU, strict_allclose=strict)
        assert row["status"] == "ok", row["reason"]
    assert seen == [False, True]
    head = dict(kernelbench_dir=root, policies=["fp32"], budget_s=60, memory_mb=1024, max_candidates=4, commit="x")
    assert scoreboard.is_strict(scoreboard.new_doc(**head, strict=True))
    assert not scoreboard.is_strict(scoreboard.new_doc(**head)) and "allclose" not in scoreboard.new_doc(**head)
    a = {"results": [], "max_candidates": 4, "peers": ["compile"], "timed": True}
    with pytest.raises(kb.KernelBenchError, match="the parts differ in --strict-allclose"):
        scoreboard.merge([a, {**a, "allclose": "strict"}])
    out = tmp_path / "kb.json"
    scoreboard.write({**a, "results": [{**_row("L1-1", 1), "policy": "fp32"}]}, out)
    r = CliRunner().invoke(cli, ["bench", "--kernelbench", str(root), "--resume", str(out), "--strict-allclose"])
    assert r.exit_code == 2 and "ran without --strict-allclose" in r.output, r.output
