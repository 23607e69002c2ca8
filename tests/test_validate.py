"""`factdb rules validate`: the shipped rules pass; each broken file is rejected with its own message."""
import json
import shutil

import pytest
from click.testing import CliRunner

from fact_db.discovery import rules as rules_mod
from fact_db.cli.main import cli

from conftest import BROKEN, ROOT

# file -> (line, field, substrings of the message and fix)
EXPECTED = {
    "yaml-syntax.yaml": (13, "", ["YAML syntax error at line 13, column 9", "mapping values are not allowed"]),
    "missing-title.yaml": (1, "title", ["missing required field `title`", "add `title:`"]),
    "bad-status.yaml": (5, "status", ["'beta' is not allowed", "preview, stable, deprecated"]),
    "unknown-field.yaml": (14, "realize.tempalte", ["unknown field `tempalte`", "did you mean `template`?"]),
    "stem-mismatch.yaml": (1, "id", ["file name `stem-mismatch.yaml` does not match id `stem-mismatched`"]),
    "unknown-op.yaml": (11, "match.nodes.act.op", ["unknown ATen op `aten.relux`", "did you mean `aten.relu`?"]),
    "unknown-template.yaml": (14, "realize.template", ["template `gemm_sm9` does not exist in kernels_cpp/", "did you mean `gemm_sm90`?"]),
    "bad-reference.yaml": (20, "references[0]", ["`examples/49_hopper_gemm_with_colective_builder` is not in the installed nvidia-cutlass package",
                                                  "did you mean `examples/49_hopper_gemm_with_collective_builder`?"]),
    "missing-fixture.yaml": (21, "fixture", ["missing-fixture.py` is missing", "# match: missing-fixture"]),
    "unsafe-where.yaml": (14, "match.where[0]", ["function `__import__('os').system` is not allowed"]),
    "unknown-node.yaml": (11, "match.nodes.act.inputs", ["input `gemm1` is not a node of this pattern", "`$gemm1`"]),
    "unknown-fragment.yaml": (11, "match.nodes.act.use", ["unknown fragment `rleu`", "did you mean `relu`?"]),
    "wrong-type.yaml": (6, "arch", ["expected array, got str 'sm90a'"]),
}


def test_shipped_rules_are_valid():
    assert rules_mod.validate() == []
    rs = rules_mod.load_rules()
    assert len(rs) >= 12
    families = {r.family for r in rs}
    assert {"gemm", "gemm_epilogue", "attention", "norm"} <= families


def test_every_rule_file_stem_equals_its_id(ruleset):
    for r in ruleset:
        assert r.path.stem == r.id
        assert r.fixture_path.name == f"{r.id}.py"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_broken_file_is_rejected_with_its_own_message(name):
    line, field, parts = EXPECTED[name]
    faults = rules_mod.validate([BROKEN / name])
    assert faults, f"{name} passed validation"
    f = next((f for f in faults if f.field == field or (not field and "YAML" in f.message)), None)
    assert f is not None, [str(x) for x in faults]
    assert f.line == line, str(f)
    text = str(f)
    assert f.path.endswith(name)
    for p in parts:
        assert p in text, text


def test_duplicate_ids_are_reported():
    faults = rules_mod.validate([BROKEN / "dup"])
    dup = [f for f in faults if "duplicate id `dup-rule`" in f.message]
    assert len(dup) == 1 and dup[0].field == "id" and dup[0].line == 1


def test_duplicate_of_a_shipped_rule_is_reported(tmp_path):
    shutil.copy(ROOT / "rules" / "gemm" / "gemm.yaml", tmp_path / "gemm.yaml")
    shutil.copy(ROOT / "rules" / "gemm" / "gemm.py", tmp_path / "gemm.py")
    faults = rules_mod.validate([tmp_path / "gemm.yaml"])
    assert any("duplicate id `gemm`" in f.message for f in faults)


def test_all_faults_reported_not_just_the_first():
    faults = rules_mod.validate([BROKEN])
    files = {f.path.split("/")[-1] for f in faults}
    assert set(EXPECTED) <= files


def test_cli_exit_status_and_json():
    runner = CliRunner()
    ok = runner.invoke(cli, ["rules", "validate"])
    assert ok.exit_code == 0, ok.output
    bad = runner.invoke(cli, ["rules", "validate", str(BROKEN / "bad-status.yaml")])
    assert bad.exit_code == 1
    assert "status: 'beta' is not allowed" in bad.output
    js = runner.invoke(cli, ["rules", "validate", "--json", str(BROKEN / "unknown-op.yaml")])
    assert js.exit_code == 1
    data = json.loads(js.stdout)
    assert data[0]["field"] == "match.nodes.act.op" and data[0]["line"] == 11


def test_load_rules_refuses_a_broken_directory(tmp_path):
    shutil.copy(BROKEN / "bad-status.yaml", tmp_path / "bad-status.yaml")
    shutil.copy(BROKEN / "bad-status.py", tmp_path / "bad-status.py")
    with pytest.raises(rules_mod.RuleError) as e:
        rules_mod.load_rules(tmp_path)
    assert "beta" in str(e.value)


def test_schema_documents_every_field():
    schema = json.loads((ROOT / "rules.schema.json").read_text())
    missing = []

    def walk(x, path):
        if isinstance(x, dict):
            for k, v in x.get("properties", {}).items():
                if isinstance(v, dict) and "description" not in v and "$ref" not in v:
                    missing.append("/".join(path + [k]))
            for k, v in x.items():
                walk(v, path + [str(k)])
        elif isinstance(x, list):
            for i, v in enumerate(x):
                walk(v, path + [str(i)])
    walk(schema, [])
    assert missing == []
    assert all("description" in d for d in schema["$defs"].values())
