"""The docs hold to the results JSON: every generated table matches what
benchmarks/tables.py makes of benchmarks/results/*.json, a block edited by hand fails, and the
README stays a short user's document that links every page in docs/. No torch, no GPU."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import benchmark_script

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))


def _tables():
    return benchmark_script("tables")


def test_generated_tables_match_the_json():
    """`python benchmarks/tables.py --check`, as CI and a contributor run it."""
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tables.py"), "--check"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr + r.stdout


@pytest.mark.parametrize("doc", ["README.md", "docs/kernels.md"])
def test_a_block_edited_by_hand_fails_the_check(tmp_path, capsys, doc):
    tables = _tables()
    copy = tmp_path / doc
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / doc, copy)
    argv = ["--check", "--root", str(tmp_path), "--results", str(RESULTS), str(copy)]
    assert tables.main(argv) == 0, capsys.readouterr().err  # the copy as committed passes

    text = copy.read_text()
    m = re.search(r"<!-- table:([\w-]+) -->\n(.*?)<!-- /table:", text, re.S)
    assert m, f"{doc} has no generated table"
    name = m.group(1)
    row = next(line for line in m.group(2).splitlines() if line.startswith("| ") and re.search(r"\d\.\d", line))
    edited = re.sub(r"(\d)\.(\d)", lambda d: f"{d.group(1)}.{(int(d.group(2)) + 1) % 10}", row, count=1)
    assert edited != row
    copy.write_text(text.replace(row, edited, 1))

    capsys.readouterr()
    assert tables.main(argv) == 1
    err = capsys.readouterr().err
    assert f"table {name} is stale" in err and str(copy) in err

    assert tables.main(["--root", str(tmp_path), "--results", str(RESULTS), str(copy)]) == 0  # rewrite
    assert copy.read_text() == (ROOT / doc).read_text()


def test_an_unknown_or_unclosed_block_fails(tmp_path, capsys):
    tables = _tables()
    md = tmp_path / "x.md"
    md.write_text("<!-- table:no-such-table -->\n<!-- /table:no-such-table -->\n")
    assert tables.main(["--check", "--root", str(tmp_path), "--results", str(RESULTS), str(md)]) == 1
    assert "unknown table 'no-such-table'" in capsys.readouterr().err
    md.write_text("<!-- table:e2e -->\n| stale |\n")
    assert tables.main(["--check", "--root", str(tmp_path), "--results", str(RESULTS), str(md)]) == 1
    assert "do not pair up" in capsys.readouterr().err


def test_every_table_is_shown_somewhere_and_every_row_names_gpu_date_and_json():
    tables = _tables()
    text = "\n".join(p.read_text() for p in [README, *DOCS])
    for name, spec in tables.TABLES.items():
        assert f"<!-- table:{name} -->" in text, f"table {name} is defined but no doc shows it"
        headers = [h for h, _ in spec["columns"]]
        assert headers[-3:] in (["GPU", "date", "JSON"], ["machine", "date", "JSON"]), name
        for row in tables.rows_for(name, RESULTS):
            if spec.get("set") and not row.get("file"):   # a pair of the set no run has a row for yet
                assert row["status"] == "not yet run", (name, row)
                continue
            assert row["gpu"] and row["gpu"] != "–" and re.match(r"\d{4}-\d{2}-\d{2}", row["date"]), (name, row)


def test_readme_is_short_and_links_every_docs_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail to docs/"
    text = README.read_text()
    assert DOCS, "docs/ is empty"
    for page in DOCS:
        assert f"](docs/{page.name})" in text, f"README.md does not link docs/{page.name}"


def _anchors(md: Path) -> set:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    heads = re.findall(r"^#+ (.+)$", md.read_text(), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_local_links_and_anchors_resolve():
    for md in [README, *DOCS]:
        for target in re.findall(r"\]\(([^)\s]+)\)", md.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = (md.parent / file).resolve() if file else md
            assert path.exists(), f"{md.relative_to(ROOT)} links {target}, which does not exist"
            if anchor and path.suffix == ".md":
                assert anchor in _anchors(path), f"{md.relative_to(ROOT)} links {target}: no such heading"


def test_a_scoreboard_level_run_on_two_gpu_models_names_both_with_their_rows():
    tables = _tables()
    row = {"level": 3, "policy": "fp32"}
    doc = {"results": [{**row, "device": "NVIDIA H200"}] * 2 + [{**row, "device": "NVIDIA H100 80GB HBM3"}]
           + [{**row, "level": 1, "device": "NVIDIA H100 80GB HBM3"}]}
    assert tables._kb_devices(doc, "3", "fp32") == {"gpu": "H200 (2), H100 (1)"}
    # one model: that model, not the merged file's own device (its newest part's, which may not
    # have run this level); no row naming its device: the head's column stands
    assert tables._kb_devices(doc, "1", "fp32") == {"gpu": "H100"}
    assert tables._kb_devices({**doc, "device": "NVIDIA H200"}, "1", "fp32") == {"gpu": "H100"}
    assert tables._kb_devices({"results": [{**row, "level": 2}]}, "2", "fp32") == {}


def test_the_peers_set_names_real_problems_and_policies_and_the_coverage_table_lists_every_pair(tmp_path):
    """Issue 25's target covers every problem at every policy it runs: benchmarks/peers_set.txt
    names them, and the coverage table has a row for each pair, saying so where no run has one."""
    from fact_db.core.policy import POLICIES
    tables = _tables()
    pairs = tables.peers_set(ROOT / "benchmarks" / "peers_set.txt")
    assert len(pairs) == len(set(pairs))
    assert {p for p, _ in pairs} == {f.stem for f in (ROOT / "benchmarks" / "problems").glob("*.py")}
    assert {pol for _, pol in pairs} <= set(POLICIES)
    one = next(RESULTS.glob("*-compile-peers-batched_gemm-fp32.json"))
    (tmp_path / one.name).write_text(one.read_text())
    rows = tables.rows_for("compile-peers-coverage", tmp_path)
    assert [(r["problem"], r["policy"]) for r in rows] == sorted(pairs, key=lambda p: (p[0], tables._rank(
        tables.POLICY_ORDER, p[1])))
    ran = [r for r in rows if r.get("file")]
    assert [(r["problem"], r["status"]) for r in ran] == [("batched_gemm", "met")]
    assert all(r["status"] == "not yet run" for r in rows if not r.get("file"))
    bad = tmp_path / "set.txt"
    bad.write_text("layernorm\n")
    with pytest.raises(SystemExit, match="names no policy"):
        tables.peers_set(bad)


def test_a_cold_compile_row_says_whether_torch_compiles_own_import_was_counted():
    """compile_peers.py times both cold compiles from the torch.compile call since 2026-11-29
    (its JSON says so: "compile_cold_from"); a row from before, timed from the first call after
    plain torch.compile had imported Inductor, says that its torch.compile time leaves it out."""
    tables = _tables()
    doc = {"problem": "p", "policy": "fp32", "date": "2026-11-29", "device": "NVIDIA H200", "commit": "abc",
           "returned": "composed", "variants": [
               {"name": "eager", "ms": 2.0},
               {"name": "torch.compile", "ms": 1.5, "compile_cold_s": 3.0},
               {"name": "fact-db (composed)", "ms": 1.0},
               {"name": 'torch.compile(backend="factdb")', "ms": 1.0, "compile_cold_s": 3.5}]}
    [old] = tables.rows_compile_peers(doc, "h200-2026-11-28-compile-peers-p-fp32.json")
    [new] = tables.rows_compile_peers(dict(doc, compile_cold_from="the torch.compile call"),
                                      "h200-2026-11-29-compile-peers-p-fp32.json")
    assert old["compile_s"] == "3 s / 3.5 s (both cold; torch.compile's Inductor import not counted)"
    assert new["compile_s"] == "3 s / 3.5 s (both cold)"
