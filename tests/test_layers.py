"""The package's imports point one way (docs/design.md, "Layout"):

    core <- discovery <- store <- kernels <- realization, composition <- pipeline <- cli

A module imports only from its own stage or a stage to its left; realization and composition
do not import each other; kernel families (kernels/<family>/) never import each other or the
registry class; and no import, at module level or inside a function, closes a cycle. Read
from the source with `ast`, so a function-level import counts like any other.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STAGES = {"core": 0, "discovery": 1, "store": 2, "kernels": 3, "realization": 4, "composition": 4, "pipeline": 5,
          "cli": 6}
FAMILIES = ("gemm", "attention", "norm", "region")


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted name -> file for every module of the package (cli/ is packaged as fact_db.cli)."""
    out = {}
    for top, pkg in (("fact_db", "fact_db"), ("cli", "fact_db.cli")):
        for p in sorted((root / top).rglob("*.py")):
            rel = p.relative_to(root / top).with_suffix("")
            parts = [x for x in rel.parts if x != "__init__"]
            out[".".join([pkg, *parts])] = p
    return out


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere in its body (functions included)."""
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_pkg else name.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    found.add(t)
        edges[name] = found
    return edges


def stage(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in STAGES else None


def family(name: str) -> str | None:
    parts = name.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "kernels" and parts[2] in FAMILIES else None


def wrong_way(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for a, targets in sorted(edges.items()):
        for b in sorted(targets):
            sa, sb = stage(a), stage(b)
            if sa is None or sb is None:
                continue
            if STAGES[sb] > STAGES[sa] or (STAGES[sb] == STAGES[sa] and sa != sb):
                bad.append(f"{a} ({sa}) imports {b} ({sb})")
            fa, fb = family(a), family(b)
            if fa and fb and fa != fb:
                bad.append(f"{a} (family {fa}) imports {b} (family {fb})")
            if fa and b == "fact_db.store.registry":
                bad.append(f"{a} (family {fa}) imports the registry class's module {b}; take the registry "
                           "object as an argument")
    return bad


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_every_stage_is_a_folder_and_every_module_has_one():
    mods = modules()
    loose = [m for m in mods if m.count(".") >= 1 and stage(m) is None]
    assert loose == [], f"modules outside the stage folders: {loose}"


def test_imports_point_one_way():
    assert wrong_way(imports(modules())) == []


def test_no_import_cycle_counting_function_level_imports():
    assert cycles(imports(modules())) == []


@pytest.mark.slow
def test_the_check_catches_a_wrong_way_import_and_a_cycle(tmp_path):
    """The same check on a copy of the package with one wrong-way import added (kernels
    importing realization, inside a function) fails, naming it; and one closing a cycle."""
    import shutil
    for top in ("fact_db", "cli"):
        shutil.copytree(ROOT / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__"))
    bench = tmp_path / "fact_db" / "kernels" / "bench.py"
    bench.write_text(bench.read_text() + "\n\ndef _late():\n    from fact_db.realization import realize\n"
                     "    return realize\n")
    before = set(wrong_way(imports(modules())))
    edges = imports(modules(tmp_path))
    added = [b for b in wrong_way(edges) if b not in before]
    assert "fact_db.kernels.bench (kernels) imports fact_db.realization.realize (realization)" in added
    assert all(b.startswith("fact_db.kernels.bench (kernels) imports fact_db.realization") for b in added)
    assert any("fact_db.kernels.bench" in c and "fact_db.realization.realize" in c for c in cycles(edges))
    gemm = tmp_path / "fact_db" / "kernels" / "gemm" / "kernel.py"
    gemm.write_text(gemm.read_text() + "\nfrom fact_db.kernels.norm import workload  # noqa\n")
    added = [b for b in wrong_way(imports(modules(tmp_path))) if b not in before]
    assert "fact_db.kernels.gemm.kernel (family gemm) imports fact_db.kernels.norm.workload (family norm)" in added


@pytest.mark.parametrize("name", ["discover", "optimize", "plan", "load"])
def test_no_public_function_shares_a_name_with_a_module_of_the_package(name):
    """`fact_db.optimize` was a function on first read and the module fact_db.optimize after
    it: no module directly under fact_db/ may take a public function's name."""
    assert not (ROOT / "fact_db" / f"{name}.py").exists() and not (ROOT / "fact_db" / name).is_dir()
