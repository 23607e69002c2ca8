"""What every `factdb` command shares: the click group, error handling, JSON output, the
problem sandbox, and the options several commands take (policies, GPUs, the registry)."""
from __future__ import annotations

import functools
import json
import traceback
from pathlib import Path

import click

from fact_db.core.device import ARCHES, build_arch, model_arch  # noqa: F401  (the commands import them from here)
from fact_db.core.errors import FactError, RuleError
from fact_db.core.policy import POLICIES  # noqa: F401


class Ctx:
    debug = False


# One vocabulary across commands: both spellings of Hopper are accepted everywhere; each
# command maps them to what it needs (discovery's roofline: sm90; kernels: sm90a).
DTYPES = ("float32", "bfloat16", "float16", "fp32", "bf16", "fp16")


def arch_choice():
    return click.Choice(ARCHES)


def _finite(x):
    import math
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def jdump(obj, **kw) -> str:
    """JSON for --json output: NaN and infinities become null (strict JSON parsers refuse them)."""
    import json
    default = kw.pop("default", None)
    if default is not None:  # objects rendered first, so their floats are cleaned too
        obj = json.loads(json.dumps(obj, default=default))
    return json.dumps(_finite(obj), allow_nan=False, **kw)


def handle_errors(fn):
    """Turn fact-db's user errors into one-sentence ClickExceptions (tracebacks with --debug)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (FactError, KeyError, ValueError) as e:
            if Ctx.debug:
                traceback.print_exc()
            if isinstance(e, RuleError):
                for f in e.faults:
                    click.echo(str(f), err=True)
            msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
            if isinstance(e, KeyError) and not isinstance(e, FactError):
                msg = f"internal error: no entry {msg!r} (rerun with --debug for the traceback, and report it)"
            raise click.ClickException(msg) from None
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort, KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:  # noqa: BLE001  (the last line of defence: one sentence, never a bare traceback)
            if Ctx.debug:
                traceback.print_exc()
            raise click.ClickException(_one_sentence(e)) from None
    return wrapper


def no_gpu() -> bool:
    import torch
    return not torch.cuda.is_available()


def require_gpu(what: str) -> None:
    """A ClickException at once where no CUDA GPU is visible, before anything is traced or built:
    `what` says what needs one and what to do instead."""
    if no_gpu():
        raise click.ClickException(f"no CUDA GPU is visible: {what}")


def problem_sandbox(when=lambda: True, gpu_unless: str | None = None, gpu_why: str = ""):
    """A command taking PROBLEM (a file of Python that runs) re-runs itself in a child process
    under the memory and time limits (fact_db/discovery/sandbox.py) where `when()` holds, so a file that
    allocates, loops or exits cannot take the CLI down or pass for success. The command's own
    `max_memory` and `timeout` options are the limits where it has them. Where `when()` does
    not hold (a GPU run that needs the model here), the problem is first built and traced on
    the meta device in a child (sandbox.preflight), then run here.

    First, before any child starts or torch is imported, a PROBLEM naming a file that is not
    there is refused; and where `gpu_unless` is given, a command without that option set
    needs a GPU (require_gpu, `gpu_why`) before anything is traced."""
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(**kw):
            from fact_db.core.paths import problem_file
            from fact_db.discovery import sandbox
            problem_file(kw["problem"])
            if gpu_unless is not None and not kw.get(gpu_unless) and not sandbox.in_child():
                require_gpu(gpu_why)
            if not sandbox.in_child():
                if when():
                    sandbox.rerun(click.get_current_context(), kw["problem"], kw.get("max_memory"),
                                  kw.get("timeout"), debug=Ctx.debug)
                    return None
                sandbox.preflight(kw["problem"], debug=Ctx.debug)  # it runs here next: try it in a child first
            with sandbox.guarded(kw["problem"], kw.get("max_memory")):
                return fn(**kw)
        return wrapper
    return deco


def _one_sentence(e: Exception) -> str:
    """An unexpected exception as one sentence: files that cannot be written (a read-only
    $FACTDB_HOME) named with what to do, anything else as an internal error."""
    import os
    first = str(e).splitlines()[0] if str(e) else ""
    home = os.environ.get("FACTDB_HOME", "~/.factdb")
    if isinstance(e, OSError):
        where = e.filename or home
        return (f"cannot use {where}: {e.strerror or first}; point FACTDB_HOME (now {home}) or --db at a writable "
                "directory")
    if type(e).__module__.startswith("duckdb") and type(e).__name__ in ("IOException", "PermissionException"):
        return f"a database file cannot be opened or written ({first}); check that FACTDB_HOME ({home}) is writable"
    return f"internal error: {type(e).__name__}: {first} (rerun with --debug for the traceback, and report it)"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show full tracebacks for errors.")
@click.version_option(package_name="fact-db")
def cli(debug):
    """fact-db: turn PyTorch modules into tuned CUTLASS kernels, and remember every kernel.

    \b
    Example:
      factdb discover benchmarks/problems/mingpt_block.py --explain
      factdb rules list
    """
    Ctx.debug = debug
    _plain_warnings()


def _plain_warnings() -> None:
    """fact-db's own warnings (a team registry's server away, ...) as one line on stderr, not
    Python's file:line form."""
    import warnings
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if category.__module__.startswith("fact_db"):
            click.echo(f"warning: {message}", err=True)
        else:
            shown(message, category, filename, lineno, file, line)
    if getattr(shown, "__name__", "") != "show":
        warnings.showwarning = show

def open_registry(db: str | None, use: bool):
    if not use:
        return None
    from fact_db.store.registry import Registry
    return Registry.open(db)


def gpu_list(spec: str | None) -> list[int] | None:
    if not spec:
        return None
    if spec == "all":
        import torch
        return list(range(torch.cuda.device_count())) or None
    try:
        return [int(g) for g in spec.split(",")]
    except ValueError:
        raise click.BadParameter(f"'{spec}' is not 'all' or a comma-separated list of device indices (e.g. 0,1)",
                                 param_hint="--gpus") from None


def consult_rules(problem, policy, offline, as_json, registry=None):
    """`--llm`: ask the agent about PROBLEM (its summary on stderr); the rule set with the rules
    it accepted joined to the shipped ones, or None where it accepted none. `registry` is the
    one the command uses (`--db`), where the agent looks kernels up and stores the ones it
    accepts; None (`--no-registry`): it neither looks up nor stores."""
    from fact_db.realization.agent import consult, summary_line
    info = consult(problem, policy=policy, offline=offline, registry=registry if registry is not None else False)
    click.echo(json.dumps({"llm": info}) if as_json else summary_line(info), err=True)
    if not info.get("rule_files"):
        return None
    from fact_db.discovery.rules import load_rules
    return load_rules(extra=[Path(f) for f in info["rule_files"]])


def max_held_of(spec: str):
    """--max-held: 'eager' (eager's per-call peak), 'none' (no bound), or MiB."""
    if spec in ("eager", "none"):
        return None if spec == "none" else spec
    try:
        value = float(spec)
    except ValueError:
        value = -1.0
    if value < 0:
        raise click.BadParameter(f"'{spec}' is not a bound: use eager (eager's per-call peak), none, or a number of "
                                 "MiB >= 0", param_hint="--max-held")
    return value
