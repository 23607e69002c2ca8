"""The CLI: help with an example on every command, JSON output, clean errors."""
import json

import click
import pytest
from click.testing import CliRunner

from fact_db.cli.main import cli

from conftest import BAD, PROBLEMS


def all_commands(group=cli, prefix=()):
    for name, cmd in group.commands.items():
        yield prefix + (name,), cmd
        if isinstance(cmd, click.Group):
            yield from all_commands(cmd, prefix + (name,))


@pytest.mark.parametrize("path", [p for p, _ in all_commands()] + [()], ids=lambda p: " ".join(p) or "factdb")
def test_every_command_has_help_with_an_example(path):
    res = CliRunner().invoke(cli, list(path) + ["--help"])
    assert res.exit_code == 0
    assert "Example:" in res.output and "factdb " in res.output.split("Example:")[1]


def test_rules_list_and_show():
    r = CliRunner().invoke(cli, ["rules", "list", "--json"])
    assert r.exit_code == 0
    data = json.loads(r.stdout)
    assert {"gemm", "gemm-bias-gelu-tanh", "attention-causal"} <= {d["id"] for d in data}
    s = CliRunner().invoke(cli, ["rules", "show", "gemm-bias-gelu-tanh"])
    assert s.exit_code == 0 and "id: gemm-bias-gelu-tanh" in s.output and "decomposed" in s.output
    miss = CliRunner().invoke(cli, ["rules", "show", "gemm-bias-gelu-tan"])
    assert miss.exit_code == 1 and "did you mean `gemm-bias-gelu-tanh`?" in miss.output


@pytest.mark.slow
def test_discover_table_json_and_explain():
    p = str(PROBLEMS / "mingpt_block.py")
    r = CliRunner().invoke(cli, ["discover", p, "--explain"])
    assert r.exit_code == 0, r.output
    assert "gemm-bias-gelu-tanh" in r.output and "attention-causal" in r.output
    assert "explain:" in r.output and "won over" in r.output
    # a rule that matched nowhere, with its nearest candidate and reason
    assert "gemm-large-k: no match; nearest candidate `matmul_1` (mingpt_block.py:74): `batch == 1` is false (batch=1024)" in r.output
    j = CliRunner().invoke(cli, ["discover", p, "--json", "--policy", "tf32", "--arch", "sm80"])
    data = json.loads(j.stdout)
    assert data["policy"] == "tf32" and data["gpu"] == "A100"
    assert {r["rule"] for r in data["regions"]} >= {"gemm-residual", "attention-causal"}


@pytest.mark.slow
def test_explain_gives_the_reason_for_a_deliberate_mismatch():
    # exact GELU: the tanh rule misses, and says it is the approximate= argument
    r = CliRunner().invoke(cli, ["discover", str(PROBLEMS / "gemm_bias_gelu.py"), "--explain"])
    line = next(l for l in r.output.splitlines() if l.strip().startswith("gemm-bias-gelu-tanh:"))
    assert "approximate='none'" in line and "tanh" in line


@pytest.mark.slow
def test_user_errors_have_no_traceback_and_debug_shows_it():
    r = CliRunner().invoke(cli, ["discover", str(BAD / "init_raises.py")])
    assert r.exit_code == 1
    assert "Error: building the model raised ValueError" in r.output and "Traceback" not in r.output
    d = CliRunner().invoke(cli, ["--debug", "discover", str(BAD / "init_raises.py")])
    assert d.exit_code == 1 and "Traceback" in d.output


@pytest.mark.slow
def test_partial_result_is_printed_with_the_error():
    r = CliRunner().invoke(cli, ["discover", str(BAD / "data_dependent.py")])
    assert r.exit_code == 1
    assert "[PARTIAL]" in r.output and "gemm-bias-relu" in r.output
    assert "data-dependent control flow" in r.output


@pytest.mark.slow
def test_missing_path():
    r = CliRunner().invoke(cli, ["discover", "no/such/problem.py"])
    assert r.exit_code == 1 and "does not exist" in r.output


@pytest.mark.slow
def test_one_vocabulary_for_arch_and_dtype_and_json_without_nan():
    from fact_db.cli.common import jdump
    assert jdump({"a": float("nan"), "b": [float("inf"), 1.5]}) == '{"a": null, "b": [null, 1.5]}'
    for arch in ("sm90", "sm90a"):
        r = CliRunner().invoke(cli, ["tune", "--shape", "64x64x64", "--arch", arch, "--compile-only",
                                     "--max-candidates", "1", "--no-registry"])
        assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["tune", "--shape", "64x64x64", "--arch", "sm100"])
    assert r.exit_code == 2 and "'sm90', 'sm90a', 'sm80'" in r.output
    r = CliRunner().invoke(cli, ["tune", "--shape", "64x64x64", "--dtype", "int8"])
    assert r.exit_code == 2 and "'float32'" in r.output
    r = CliRunner().invoke(cli, ["discover", str(PROBLEMS / "layernorm.py"), "--arch", "sm90a"])
    assert r.exit_code == 0 and "(sm90)" in r.output


@pytest.mark.slow
def test_discover_lists_what_no_region_covers_with_its_share(tmp_path):
    p = tmp_path / "conv_gru.py"
    p.write_text(
        "import torch\nfrom torch import nn\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.conv = nn.Conv1d(64, 128, 5, padding=2, groups=4)\n"
        "        self.gru = nn.GRU(128, 256)\n"
        "        self.head = nn.Linear(256, 10)\n\n"
        "    def forward(self, x):\n"
        "        y, _ = self.gru(self.conv(x).permute(2, 0, 1))\n"
        "        return self.head(y[-1])\n\n"
        "def get_inputs():\n    return [torch.rand(16, 64, 512)]\n\n"
        "def get_init_inputs():\n    return []\n")
    r = CliRunner().invoke(cli, ["discover", str(p), "--no-registry"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    head = next(i for i, l in enumerate(lines) if l.startswith("uncovered: "))
    assert lines[head + 1].split() == ["SHARE", "EST", "EAGER", "OP", "NODE", "SOURCE"]
    rows = {l.split()[3]: l.split()[0] for l in lines[head + 2:head + 4]}
    assert set(rows) == {"aten.gru", "aten.conv1d"} and all(v.endswith("%") for v in rows.values())
    assert any(l.strip().startswith("why aten.gru (`gru`): no rule matches aten.gru: recurrent layers") for l in lines)
    j = CliRunner().invoke(cli, ["discover", str(p), "--no-registry", "--json"])
    data = json.loads(j.stdout)
    unc = {u["op"]: u for u in data["uncovered"]}
    assert unc["aten.gru"]["share"] > unc["aten.conv1d"]["share"] > 0
    assert f"{unc['aten.gru']['share'] * 100:.0f}%" == rows["aten.gru"]
    total = sum(x["share"] for x in data["regions"]) + sum(u["share"] for u in data["uncovered"])
    assert total + data["uncovered_rest"]["share"] == pytest.approx(1.0)
    if not __import__("torch").cuda.is_available():  # optimize's plan lists them too (its JSON once failed on them)
        o = CliRunner().invoke(cli, ["optimize", str(p), "--no-registry", "--json"])
        assert o.exit_code == 0, o.output
        plan = json.loads(o.stdout)
        assert {u["op"]: round(u["share"], 6) for u in plan["uncovered"]} == \
            {op: round(u["share"], 6) for op, u in unc.items()}
        assert plan["uncovered_rest"]["share"] == pytest.approx(data["uncovered_rest"]["share"])


def test_eval_traces_and_plans_the_model_in_eval_mode(tmp_path):
    """A problem file builds its model in training mode, where BatchNorm runs on batch
    statistics and cannot fold; --eval puts it in eval mode, and the conv-bn rule takes it."""
    p = tmp_path / "conv_bn.py"
    p.write_text(
        "import torch\nfrom torch import nn\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.conv = nn.Conv2d(64, 64, 3, padding=1, bias=False)\n"
        "        self.bn = nn.BatchNorm2d(64)\n\n"
        "    def forward(self, x):\n"
        "        return torch.relu(self.bn(self.conv(x)))\n\n"
        "def get_inputs():\n    return [torch.rand(8, 64, 32, 32)]\n\n"
        "def get_init_inputs():\n    return []\n")
    rules = {}
    for flag in ([], ["--eval"]):
        r = CliRunner().invoke(cli, ["discover", str(p), "--no-registry", "--json", *flag])
        assert r.exit_code == 0, r.output
        data = json.loads(r.stdout)
        rules[bool(flag)] = {x["rule"] for x in data["regions"]}
        if not flag:  # the training-mode BatchNorm is left over, among the small ops, and the note says why
            assert data["uncovered_rest"]["share"] > 0.3
            assert data["note"].startswith("traced in training mode, as the problem builds it: its BatchNorm2d run")
            assert "--eval traces it for inference" in data["note"]
        else:
            assert data["note"] == ""
    assert rules == {False: {"conv"}, True: {"conv-bn"}}
    if not __import__("torch").cuda.is_available():  # optimize's plan builds it the same way
        o = CliRunner().invoke(cli, ["optimize", str(p), "--no-registry", "--json", "--eval"])
        assert o.exit_code == 0, o.output
        assert "conv-bn" in {x["rule"] for x in json.loads(o.stdout)["regions"]}


def test_the_share_floor_the_cli_prints_is_discoverys():
    from fact_db.cli.discover import SHARE_FLOOR_TEXT
    from fact_db.discovery.discover import SHARE_FLOOR
    assert SHARE_FLOOR_TEXT == f"{SHARE_FLOOR * 100:.0f}%"
