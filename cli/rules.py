"""`factdb rules ...`: list, show, validate and test the declarative rules."""
from __future__ import annotations

import json
from pathlib import Path

import click
import yaml

from .common import cli, handle_errors, jdump, problem_sandbox


@cli.group()
def rules():
    """List, show, validate and test optimization rules.

    \b
    Example:
      factdb rules list --json
    """


@rules.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.option("--family", help="Only rules of this family (directory), e.g. gemm_epilogue.")
@handle_errors
def list_(as_json, family):
    """List the shipped rules.

    \b
    Example:
      factdb rules list --family attention
    """
    from fact_db.discovery import rules as rules_mod  # lazy: keeps torch out of `factdb --help`
    rs = [r for r in rules_mod.load_rules() if not family or r.family == family]
    if as_json:
        click.echo(jdump([r.summary() for r in rs], indent=2))
        return
    width = max((len(r.id) for r in rs), default=2)
    click.echo(f"{'ID':{width}}  {'FAMILY':14} {'STATUS':10} {'TEMPLATE':18} TITLE")
    for r in rs:
        click.echo(f"{r.id:{width}}  {r.family:14} {r.status:10} {r.realize['template']:18} {r.title}")
    click.echo(f"{len(rs)} rules", err=True)


@rules.command()
@click.argument("rule_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@handle_errors
def show(rule_id, as_json):
    """Show one rule: its YAML and how many pattern alternatives it expands to.

    \b
    Example:
      factdb rules show gemm-bias-gelu-tanh
    """
    from fact_db.discovery import rules as rules_mod  # lazy: keeps torch out of `factdb --help`
    r = rules_mod.load_rules().get(rule_id)
    if as_json:
        data = yaml.safe_load(r.path.read_text())
        data["_path"] = str(r.path)
        data["_patterns"] = [p.label for p in r.patterns]
        click.echo(jdump(data, indent=2, default=str))
        return
    click.echo(f"# {r.path}")
    click.echo(r.path.read_text().rstrip())
    click.echo(f"# expands to {len(r.patterns)} pattern(s): " + "; ".join(p.label or "(single)" for p in r.patterns))


@rules.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the faults as JSON.")
@handle_errors
def validate(paths, as_json):
    """Check rule files (default: all shipped rules) and report every fault.

    Each fault names the file, the line, the field and the fix. Exit status is 1 when
    any fault is found, 0 otherwise.

    \b
    Example:
      factdb rules validate rules/gemm/gemm-bias.yaml
    """
    from fact_db.discovery import rules as rules_mod  # lazy: keeps torch out of `factdb --help`
    faults = rules_mod.validate(list(paths) or None)
    if as_json:
        click.echo(jdump([f.__dict__ for f in faults], indent=2))
    else:
        for f in faults:
            click.echo(str(f))
        n = len(rules_mod.yaml_files(list(paths) or [rules_mod.paths.rules_dir()]))
        click.echo(f"{n} files checked, {len(faults)} faults", err=True)
    raise SystemExit(1 if faults else 0)


@rules.command("test")
@click.argument("paths", nargs=-1, type=click.Path(exists=True, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the outcomes as JSON.")
@click.option("-v", "--verbose", is_flag=True, help="Show passing cases too.")
@handle_errors
def test_(paths, as_json, verbose):
    """Run rule fixtures: must-match cases match, must-not-match cases do not.

    PATHS are rule files or directories (default: all rules), inside rules/ or anywhere else
    (a rule you are writing, tested beside the shipped ones and their fragments). Exit
    status 1 on any failure.

    \b
    Example:
      factdb rules test rules/attention
      factdb rules test ~/my-rules/gemm-bias-swish.yaml
    """
    from fact_db.discovery import fixture, rules as rules_mod  # lazy: keeps torch out of `factdb --help`
    rs = rules_mod.load_rules(extra=paths)
    selected = None
    if paths:
        wanted = {p.resolve() for p in rules_mod.yaml_files(paths)}
        selected = [r for r in rs if r.path.resolve() in wanted]
        if not selected:
            raise click.ClickException(f"no rules among {', '.join(map(str, paths))}; pass rule .yaml files or directories")
    from tqdm import tqdm
    chosen = selected or list(rs)
    outcomes = []
    for r in tqdm(chosen, desc="fixtures", unit="rule", disable=as_json or None, leave=False):
        outcomes.extend(fixture.run_rule_fixtures(rs, [r]))
    failed = [o for o in outcomes if not o.ok]
    if as_json:
        click.echo(jdump([{"path": str(o.case.path), "line": o.case.line, "case": o.case.cls, "rule": o.case.rule,
                                "expect": "match" if o.case.expect else "no-match", "ok": o.ok, "detail": o.detail}
                               for o in outcomes], indent=2))
    else:
        for o in outcomes:
            if verbose or not o.ok:
                click.echo(str(o))
        click.echo(f"{len(outcomes) - len(failed)} passed, {len(failed)} failed", err=True)
    raise SystemExit(1 if failed else 0)


@rules.command()
@click.argument("problem")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Directory for accepted rules (written as rules/<family>/<id>.yaml and .py, ready for a pull request).")
@click.option("--arch", default="sm90", show_default=True, help="Target architecture.")
@click.option("--policy", default="fp32", show_default=True, help="Precision policy.")
@click.option("--offline", is_flag=True, help="Never call the model (replies already cached are not used either).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@handle_errors
@problem_sandbox()
def propose(problem, out_dir, arch, policy, offline, as_json):
    """Ask the configured language model for rules covering what PROBLEM leaves to eager.

    Only regions the shipped rules do not fuse are asked about; each proposal must validate,
    pass its own fixture and match the region before it is written to --out. The model is
    configured by FACTDB_LLM_BASE_URL/FACTDB_LLM_MODEL/FACTDB_LLM_API_KEY or
    $FACTDB_HOME/llm.yaml; without either nothing is called.

    \b
    Example:
      FACTDB_LLM_BASE_URL=http://127.0.0.1:8000/v1 FACTDB_LLM_MODEL=qwen \\
        factdb rules propose benchmarks/problems/gemm_div_gelu.py --out proposed/
    """
    from fact_db.realization.agent import Agent
    from fact_db.discovery.discover import discover_problem
    from fact_db.realization.llm import LLM
    from fact_db.discovery.rules import load_rules

    llm = LLM.open(offline=offline)
    if llm is None:
        raise click.ClickException("no language model configured (set FACTDB_LLM_BASE_URL and FACTDB_LLM_MODEL, "
                                   "or write $FACTDB_HOME/llm.yaml with base_url and model)" if not offline
                                   else "--offline: nothing to propose without the model")
    rs = load_rules()
    report = discover_problem(problem, arch=arch, policy=policy, rules=rs)
    agent = Agent(llm, out_dir=Path(out_dir))
    props = agent.run(report, rs, problem)
    if as_json:
        click.echo(json.dumps({"proposals": [p.as_dict() for p in props], "llm": llm.usage.as_dict()}, indent=2))
    else:
        for p in props:
            click.echo(f"{p.region:24} {p.kind:7} {p.outcome:18} {p.reason}")
            for f in p.files:
                click.echo(f"  wrote {f}")
        click.echo(f"{len(props)} proposal(s), {sum(p.outcome == 'accepted' for p in props)} accepted; "
                   f"{llm.usage.calls} call(s), {llm.usage.cached} from cache", err=True)
    if not any(p.outcome == "accepted" for p in props) and props:
        raise click.exceptions.Exit(1)
