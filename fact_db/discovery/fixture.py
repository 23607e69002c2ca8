"""Fixtures: the small nn.Module cases beside each rule that say where it must and must not match.

A fixture module `rules/<family>/<id>.py` holds classes, each preceded by one or more
marker comments (after semgrep's `# ruleid:` / `# ok:`):

    # match: gemm-bias-gelu-tanh
    class HandWrittenGelu(nn.Module):
        ...
        def example_inputs(self):
            return (torch.randn(8, 64),)

`# match: ID` means rule ID must match somewhere in the traced case, `# no-match: ID`
that it must not match anywhere. Matching is raw (before overlap resolution), so a
case for `gemm-bias` may also contain a larger fusion. Fixture modules are test code
and are imported; rule files never are.
"""
from __future__ import annotations

import ast
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from fact_db.core.errors import FactError
from fact_db.discovery.match import match_rule
from fact_db.discovery.trace import trace_module

MARKER = re.compile(r"^\s*#\s*(match|no-match)\s*:\s*([a-z0-9, -]+?)\s*$")


@dataclass
class Case:
    path: Path
    line: int
    cls: str
    rule: str
    expect: bool  # True: must match


@dataclass
class Outcome:
    case: Case
    ok: bool
    detail: str

    def __str__(self):
        c = self.case
        verdict = "ok" if self.ok else "FAIL"
        want = "match" if c.expect else "no-match"
        return f"{verdict}: {c.path}:{c.line} {c.cls} ({want}: {c.rule}): {self.detail}"


def parse_cases(path: Path) -> list:
    """Cases marked in a fixture file, without importing it."""
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text, filename=str(path))
    cases = []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        i = first - 2
        while i >= 0 and lines[i].lstrip().startswith("#"):
            m = MARKER.match(lines[i])
            if m:
                for rid in (r.strip() for r in m.group(2).split(",")):
                    if rid:
                        cases.append(Case(path, node.lineno, node.name, rid, m.group(1) == "match"))
            i -= 1
    return cases


def _import(path: Path):
    name = f"_factdb_fixture_{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_fixture(path: Path, rules) -> list:
    """Outcomes of every case in one fixture file against `rules` (a RuleSet)."""
    path = Path(path)
    try:
        cases = parse_cases(path)
        mod = _import(path)
    except Exception as e:
        return [Outcome(Case(path, getattr(e, "lineno", 0) or 0, "(module)", "?", True), False,
                        f"fixture does not load: {type(e).__name__}: {e}")]
    by_id = {r.id: r for r in rules}
    graphs: dict = {}
    out = []
    for c in cases:
        rule = by_id.get(c.rule)
        if rule is None:
            out.append(Outcome(c, False, f"no rule `{c.rule}`"))
            continue
        if c.cls not in graphs:
            try:
                model = getattr(mod, c.cls)().eval()
                graphs[c.cls] = trace_module(model, model.example_inputs(), name=c.cls)
            except FactError as e:
                graphs[c.cls] = e
            except Exception as e:
                graphs[c.cls] = FactError(f"{type(e).__name__}: {e}")
        g = graphs[c.cls]
        if isinstance(g, Exception):
            out.append(Outcome(c, False, f"case does not trace: {g}"))
            continue
        found, nearest = match_rule(rule, g)
        if c.expect:
            ok = bool(found)
            detail = f"matched at {', '.join(m.output.name for m in found)}" if ok else f"did not match: {nearest}"
        else:
            ok = not found
            detail = f"no match ({nearest})" if ok else f"matched at {', '.join(m.output.name for m in found)} but must not"
        out.append(Outcome(c, ok, detail))
    return out


def run_rule_fixtures(rules, selected=None) -> list:
    """Run the fixtures of `selected` rules (default all). Each rule's fixture must hold at
    least one `# match:` and one `# no-match:` case for that rule."""
    selected = list(selected or rules)
    outcomes = []
    for rule in selected:
        path = rule.fixture_path
        if not path.exists():
            outcomes.append(Outcome(Case(path, 0, "(file)", rule.id, True), False, "fixture file is missing"))
            continue
        results = run_fixture(path, rules)
        outcomes.extend(results)
        own = [o.case for o in results if o.case.rule == rule.id]
        for expect, word in ((True, "match"), (False, "no-match")):
            if not any(c.expect is expect for c in own):
                outcomes.append(Outcome(Case(path, 0, "(file)", rule.id, expect), False,
                                        f"fixture has no `# {word}: {rule.id}` case; add one above a class"))
    return outcomes
