"""Problem files run in a child process with a memory limit and a time limit.

A problem file is Python that runs: building its model and tracing it executes whatever the
file says. `factdb discover` therefore re-runs itself in a child process (this module) with
`RLIMIT_DATA` set to the memory limit and a wall-clock limit, so a file that allocates
gigabytes, loops forever or ends the process (`os._exit(0)`, `sys.exit(3)`) cannot take the
CLI down or pass for success. The child marks its own end in a file the parent names
(`FACTDB_SANDBOX_DONE`); a child that ends without that mark was ended by the problem file,
and the parent says how: exit code, signal, limit hit.

Limits: `--max-memory` MiB (default 8192, `FACTDB_PROBLEM_MAX_MEMORY`) and `--timeout`
seconds (default 300, `FACTDB_PROBLEM_TIMEOUT`).
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile

from fact_db.core.errors import ProblemError

ENV_CHILD = "FACTDB_SANDBOX_DONE"
DEFAULT_MEMORY_MB = 8192
DEFAULT_TIMEOUT_S = 300.0


def in_child() -> bool:
    return bool(os.environ.get(ENV_CHILD))


def mark_done(status: str) -> None:
    """Called by the child when the command itself finished (ok, or an error it reported)."""
    path = os.environ.get(ENV_CHILD)
    if path:
        with open(path, "w") as f:
            f.write(status)


@contextlib.contextmanager
def trusted_imports():
    """In the child, around importing fact-db's own heavy dependencies (torch, torch._dynamo,
    the registry's SQLAlchemy) and loading the rules: the garbage collector is off for the
    block, and what it built is frozen after it (gc.freeze), so later collections skip it.
    torch and torch._dynamo alone leave half a million objects tracked by the collector and
    no garbage; the collections their imports set off took about a quarter of their time.
    The problem file never runs inside the block (it runs with the collector on, as
    before). Elsewhere (the parent, tests, the Python API) a no-op."""
    import gc
    if not in_child() or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


_QUICK_EXIT = []


def allow_quick_exit() -> None:
    """Said by a command whose child may end by exit_child: one that holds nothing open at its
    end but stdout and stderr (`factdb discover`: its registry connection is closed before it
    prints). Commands that write files or databases end the usual way."""
    _QUICK_EXIT.append(True)


def quick_exit_allowed() -> bool:
    return in_child() and bool(_QUICK_EXIT)


def exit_child(code: int) -> None:
    """End the child with exit code `code` once the command is over, without the interpreter's
    teardown: atexit handlers run and stdout and stderr are flushed, as at a normal exit, but
    the half million objects of torch and torch._dynamo are not freed one by one (0.4-0.6 s on
    2 cores, after the output was written). Non-daemon threads the problem file started
    are not waited for. Only where allow_quick_exit() was said."""
    import atexit
    try:
        atexit._run_exitfuncs()
    finally:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:  # noqa: BLE001  (a closed or broken pipe: nothing more to say)
                pass
        os._exit(code)


def limits(max_memory_mb: int | None, timeout_s: float | None) -> tuple[int, float]:
    mem = max_memory_mb or int(os.environ.get("FACTDB_PROBLEM_MAX_MEMORY", DEFAULT_MEMORY_MB))
    tmo = timeout_s or float(os.environ.get("FACTDB_PROBLEM_TIMEOUT", DEFAULT_TIMEOUT_S))
    return mem, tmo


def args_of(ctx) -> list[str]:
    """The command line of click context `ctx` (its command path less the program name, its
    arguments and the options given other than their defaults), to run it again in the child."""
    import click
    path, c = [], ctx
    while c.parent is not None:  # the subcommands' names, not the program's (`python -m fact_db.cli`)
        path.insert(0, c.info_name)
        c = c.parent
    args, opts = [], []
    for p in ctx.command.params:
        v = ctx.params.get(p.name)
        if isinstance(p, click.Argument):
            args.append(str(v))
        elif v is None or v == p.default or (p.is_flag and not v):
            continue
        elif p.is_flag:
            opts.append(p.opts[0])
        else:
            opts += [p.opts[0], str(v)]
    return path + args + opts


def guarded(problem: str, max_memory_mb: int | None = None):
    """In the child: marks the end of the command (ok, or an error it reports itself) so the
    parent can tell it from the problem file ending the process; a MemoryError becomes one
    sentence naming the limit."""
    import contextlib

    import click

    @contextlib.contextmanager
    def guard():
        try:
            yield
        except MemoryError:
            mark_done("error")
            raise click.ClickException(f"{problem}: building or tracing ran out of memory (the limit is "
                                       f"{limits(max_memory_mb, None)[0]} MiB: --max-memory or "
                                       "$FACTDB_PROBLEM_MAX_MEMORY)") from None
        except (SystemExit, KeyboardInterrupt):
            raise  # the problem file's own exit: the parent names it, unmarked
        except BaseException:
            mark_done("error")
            raise
        mark_done("ok")
    return guard()


def time_limit(problem: str, timeout_s: float | None = None):
    """Around code of PROBLEM that must run in this process (building the model on the GPU,
    after `preflight`): past the time limit (the child's: --timeout or $FACTDB_PROBLEM_TIMEOUT)
    it stops with a ProblemError naming the file. A no-op inside the child (the parent keeps
    the time there) and off the main thread (no signal can reach it)."""
    import contextlib
    import threading

    @contextlib.contextmanager
    def limit():
        if in_child() or threading.current_thread() is not threading.main_thread():
            yield
            return
        tmo = limits(None, timeout_s)[1]

        def stop(signum, frame):
            raise ProblemError(f"{problem}: building it took longer than {tmo:g} s (the limit: --timeout or "
                               "$FACTDB_PROBLEM_TIMEOUT)")
        old = signal.signal(signal.SIGALRM, stop)
        signal.setitimer(signal.ITIMER_REAL, tmo)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    return limit()


def rerun(ctx, problem: str, max_memory_mb: int | None = None, timeout_s: float | None = None,
          debug: bool = False) -> None:
    """Run the command of `ctx` again in a child under the limits (module docstring); its exit
    code becomes ours. Call it where not in_child()."""
    import click
    mem, tmo = limits(max_memory_mb, timeout_s)
    rc = run((["--debug"] if debug else []) + args_of(ctx), problem, max_memory_mb=mem, timeout_s=tmo)
    if rc:
        raise click.exceptions.Exit(rc)


def preflight(problem: str, debug: bool = False) -> None:
    """Where a command must build PROBLEM in its own process (on the GPU), first build and
    trace it on the meta device in a child under the limits (`factdb discover`, output kept
    back): a file that exits, loops or allocates at import, construction or tracing is
    stopped and named before it runs here. Code that misbehaves only on real data is not
    caught. ProblemError names the file and what the child said. FACTDB_PROBLEM_PREFLIGHT=0
    skips it (a trusted problem on a host where the child cannot run)."""
    if os.environ.get("FACTDB_PROBLEM_PREFLIGHT") == "0":
        return
    mem, tmo = limits(None, None)
    err: list = []
    rc = run((["--debug"] if debug else []) + ["discover", problem, "--no-registry", "--json"], problem,
             max_memory_mb=mem, timeout_s=tmo, stderr=err)
    if rc:
        said = [ln for ln in "".join(err).splitlines() if ln.strip()]
        raise ProblemError(f"{problem}: building and tracing it in a child process failed before it runs here"
                           + (f" ({said[-1].removeprefix('Error: ')})" if said else f" (exit code {rc})"))


MAX_OUTPUT = 4 * 1024 * 1024  # bytes of the child's stdout (and of its stderr) passed on; a file that prints more is cut


class _Capped:
    """Reads a pipe to its end in a thread, keeping at most MAX_OUTPUT bytes."""

    def __init__(self, pipe):
        import threading
        self.pipe, self.kept, self.size, self.dropped = pipe, [], 0, 0
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        while True:
            chunk = self.pipe.read1(65536) if hasattr(self.pipe, "read1") else self.pipe.read(65536)
            if not chunk:
                return
            room = MAX_OUTPUT - self.size
            if room > 0:
                self.kept.append(chunk[:room])
                self.size += min(room, len(chunk))
            self.dropped += max(0, len(chunk) - max(room, 0))

    def text(self) -> str:
        self.thread.join(timeout=5)
        out = b"".join(self.kept).decode("utf-8", "replace")
        return out + (f"\n[{self.dropped} more bytes of output cut]\n" if self.dropped else "")


def _relay(readers) -> None:
    """The child's stdout and stderr, passed on through click (so CliRunner and pipes see them)."""
    import click
    out, err = readers[0].text(), readers[1].text()
    if out:
        click.echo(out, nl=False)
    if err:
        click.echo(err, nl=False, err=True)


def _die_with_parent() -> None:
    """Linux: the child is killed when the process that started it dies (a parent killed with
    SIGKILL cannot stop its child at the time limit; without this a looping problem file ran
    on for an hour). Elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def group_rss_mb(pgid: int) -> float:
    """Resident memory of every process in process group `pgid` (a child and what it
    started: torch.compile's compile workers), in MiB; Linux only (0 elsewhere)."""
    total = 0
    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
    try:
        pids = [d for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            if int(fields[2]) != pgid:  # after the command's name: state, ppid, pgrp
                continue
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
    return total / (1 << 20)


def _wait(child, timeout_s: float, rss_mb: int | None) -> tuple[int | None, str]:
    """(exit code, "") when the child ends in time; (None, "time") past `timeout_s`; (None,
    "memory") where `rss_mb` is set and its process group's resident memory passed it."""
    if rss_mb is None:
        try:
            return child.wait(timeout=timeout_s), ""
        except subprocess.TimeoutExpired:
            return None, "time"
    import time
    end = time.monotonic() + timeout_s
    while True:
        try:
            return child.wait(timeout=max(0.0, min(0.5, end - time.monotonic()))), ""
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() >= end:
            return None, "time"
        if group_rss_mb(child.pid) > rss_mb:
            return None, "memory"


def run(args: list[str], problem: str, *, max_memory_mb: int, timeout_s: float, stderr: list | None = None,
        memory: str = "data", doing: str = "building and tracing it",
        hint: str = "(a loop in the problem file?); it was stopped. Raise --timeout if it needs longer",
        lost: str = "nothing was discovered") -> int:
    """Run `python -m fact_db.cli ARGS` in a child under the limits, its output passed
    through (or, given a `stderr` list, its stderr appended there and nothing shown);
    returns its exit code, or raises ProblemError saying how the problem file ended it.

    `memory`: "data" sets RLIMIT_DATA in the child (an allocation past it fails there, with a
    MemoryError the command names); "rss" leaves the child's address space alone and the
    parent stops its whole process group once their resident memory passes the limit (a CUDA
    process maps far more than it uses, and torch.compile's workers are processes of their
    own). `doing`, `hint` and `lost` word the messages: what the child was doing, what to do
    about a child stopped at the time limit, and what a child that died took with it."""
    relay = stderr is None
    import resource

    def limit():  # in the child, before exec
        os.setsid()
        _die_with_parent()
        # a backstop where the parent cannot stop it (killed itself): CPU seconds for every core
        cpu = int(timeout_s * max(1, os.cpu_count() or 1)) + 10
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
        if memory != "data":
            return
        cap = max_memory_mb * 1024 * 1024
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)  # a caller's own limit stands
        resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))

    fd, done = tempfile.mkstemp(prefix="factdb-sandbox-")
    os.close(fd)
    env = dict(os.environ, **{ENV_CHILD: done, "FACTDB_MAX_MEMORY_MB": str(max_memory_mb)})  # builds size to it
    try:
        child = subprocess.Popen([sys.executable, "-m", "fact_db.cli", *args], env=env, preexec_fn=limit,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        readers = [_Capped(child.stdout), _Capped(child.stderr)]
        rc, over = _wait(child, timeout_s, max_memory_mb if memory == "rss" else None)
        if over:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            if relay:
                _relay(readers)
            elif stderr is not None:
                stderr.append(readers[1].text())
            if over == "memory":
                raise ProblemError(f"{problem}: {doing} used more than {max_memory_mb} MiB of memory (its processes' "
                                   "resident memory together); it was stopped. Raise --max-memory if it needs more")
            raise ProblemError(f"{problem}: {doing} did not finish within {timeout_s:g} s {hint}") from None
        if relay:
            _relay(readers)
        else:
            readers[0].text()
            stderr.append(readers[1].text())
        with open(done) as f:
            status = f.read()
    finally:
        os.unlink(done)
    if status:
        return rc  # the command ran to its end and reported its own result
    if rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
        raise ProblemError(f"{problem}: the process {doing} was killed by {name}"
                           + (" (out of memory? the limit is --max-memory "
                              f"{max_memory_mb} MiB)" if -rc == signal.SIGKILL else "")
                           + f"; {lost}")
    raise ProblemError(f"{problem}: the problem file ended the process with exit code {rc} before {doing} "
                       f"finished (it calls sys.exit or os._exit?); {lost}")
