"""Every rule's fixture: must-match cases match, must-not-match cases do not (like semgrep's test)."""
import pytest

from fact_db.discovery import fixture
from fact_db.discovery.rules import load_rules

RULES = load_rules()


@pytest.mark.parametrize("rule_id", [r.id for r in RULES])
def test_rule_fixture(rule_id):
    outcomes = fixture.run_rule_fixtures(RULES, [RULES.get(rule_id)])
    own = [o for o in outcomes if o.case.rule == rule_id]
    assert any(o.case.expect for o in own) and any(not o.case.expect for o in own)
    failed = [str(o) for o in outcomes if not o.ok]
    assert not failed, "\n".join(failed)


def test_a_wrong_marker_fails(tmp_path, ruleset):
    f = tmp_path / "case.py"
    f.write_text(
        "import torch\nfrom torch import nn\n\n"
        "# match: gemm-bias-relu\n"
        "class Sig(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.fc = nn.Linear(8, 8)\n"
        "    def forward(self, x):\n        return torch.sigmoid(self.fc(x))\n"
        "    def example_inputs(self):\n        return (torch.randn(4, 8),)\n"
    )
    out = fixture.run_fixture(f, ruleset)
    assert len(out) == 1 and not out[0].ok
    assert "did not match" in out[0].detail and "aten.sigmoid" in out[0].detail


def test_markers_are_parsed_without_importing(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("raise SystemExit('never imported')\n# a comment\n# match: gemm, gemm-bias\n# no-match: attention\nclass A:\n    pass\n")
    cases = fixture.parse_cases(f)
    assert sorted((c.rule, c.expect, c.cls, c.line) for c in cases) == [
        ("attention", False, "A", 5), ("gemm", True, "A", 5), ("gemm-bias", True, "A", 5)]
