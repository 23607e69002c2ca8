"""A throwaway PostgreSQL server for the tests: initdb in a temporary directory, started with
pg_ctl on 127.0.0.1 at a free port (and a Unix socket in that directory), stopped and removed
at the end. Never a mock, and never any address but the loopback one.

    server = PgServer.start()
    url = server.new_schema()          # an empty schema of its own, as the registry's role sees it
    server.stop(); server.restart()    # the server going away and coming back (same port, same data)
    server.destroy()

Binaries: $FACTDB_PG_BIN, else the newest /usr/lib/postgresql/<version>/bin (Debian's
`postgresql` package), else initdb and pg_ctl on PATH. Where none is found, find_bin() returns
None and the tests marked `postgres` skip, saying so; with FACTDB_TEST_POSTGRES=1 (CI) they fail.

PostgreSQL refuses to run as root. CI runs as root, so there the server runs as the `postgres`
user (which the distribution's package creates), else as `nobody`, and that user owns the
temporary directory; as any other user it runs as that user.

Roles (password authentication over TCP, as a team's server would have it):
  factdb_admin  the superuser initdb makes (it creates schemas and roles here, nothing else)
  factdb_owner  owns the registry's schemas and nothing else: no superuser, no CREATEDB or CREATEROLE
  factdb_host   only USAGE on a schema and SELECT, INSERT, UPDATE, DELETE on its tables (host_url)
which are the two sets of grants docs/registry.md documents.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

PASSWORDS = {"factdb_admin": "admin-secret", "factdb_owner": "owner-s3cret", "factdb_host": "host-s3cret"}
DB = "factdb"


def find_bin() -> Path | None:
    env = os.environ.get("FACTDB_PG_BIN")
    if env:
        return Path(env) if (Path(env) / "pg_ctl").is_file() else None
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3])
                   if Path(p).parts[-3].isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    exe = shutil.which("pg_ctl")
    return Path(exe).parent if exe and shutil.which("initdb") else None


def _run_as() -> tuple[int, int] | None:
    """(uid, gid) to run the server as when this process is root, else None."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pw = pwd.getpwnam(name)
            return pw.pw_uid, pw.pw_gid
        except KeyError:
            continue
    raise RuntimeError("running as root, and neither a postgres nor a nobody user exists to run PostgreSQL as")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    def __init__(self, bindir: Path, root: Path, port: int, owner: tuple[int, int] | None):
        self.bindir, self.root, self.port, self.owner = bindir, root, port, owner
        self.data = root / "data"
        self.log = root / "server.log"

    # ----------------------------------------------------------------------------------
    @classmethod
    def start(cls, bindir: Path | None = None) -> PgServer:
        bindir = bindir or find_bin()
        if bindir is None:
            raise RuntimeError("no PostgreSQL binaries found")
        root = Path(tempfile.mkdtemp(prefix="factdb-pg-"))
        owner = _run_as()
        pwfile = root / "pw"
        pwfile.write_text(PASSWORDS["factdb_admin"] + "\n")
        if owner:
            os.chown(root, *owner)
            os.chown(pwfile, *owner)
        server = cls(bindir, root, _free_port(), owner)
        server._pg("initdb", "-D", str(server.data), "-U", "factdb_admin", "--pwfile", str(pwfile), "-E", "UTF8",
                   "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync", "--no-instructions")
        server.restart()
        server._setup()
        return server

    def _pg(self, exe: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        kw = {"user": self.owner[0], "group": self.owner[1], "extra_groups": []} if self.owner else {}
        out = subprocess.run([str(self.bindir / exe), *args], capture_output=True, text=True, cwd=self.root,
                             timeout=120, **kw)
        if check and out.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{exe} {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()} {log}")
        return out

    def restart(self) -> None:
        """Start (again) on the same port and data: only 127.0.0.1 and a socket in the temporary directory."""
        opts = (f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories={self.root} "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._pg("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.log), "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        self._pg("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop", check=False)

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    # ----------------------------------------------------------------------------------
    def admin(self, dbname: str = DB):
        import psycopg
        return psycopg.connect(host=str(self.root), port=self.port, user="factdb_admin", dbname=dbname,
                               autocommit=True)

    def _setup(self) -> None:
        with self.admin("postgres") as c:
            c.execute(f"CREATE DATABASE {DB}")
            for role in ("factdb_owner", "factdb_host"):
                c.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{PASSWORDS[role]}'")
        with self.admin() as c:
            c.execute(f"REVOKE ALL ON DATABASE {DB} FROM PUBLIC")
            c.execute("REVOKE ALL ON SCHEMA public FROM PUBLIC")
            c.execute(f"GRANT CONNECT ON DATABASE {DB} TO factdb_owner, factdb_host")

    def url(self, role: str = "factdb_owner", schema: str | None = None, driver: str = "postgresql+psycopg") -> str:
        q = f"?options=-csearch_path%3D{schema}" if schema else ""
        return f"{driver}://{role}:{PASSWORDS[role]}@127.0.0.1:{self.port}/{DB}{q}"

    def new_schema(self, host_role: bool = False) -> str:
        """A fresh schema owned by factdb_owner (its URL; host_role: also usable by factdb_host with DML
        only, as docs/registry.md's second set of grants gives)."""
        name = "s_" + uuid.uuid4().hex[:12]
        with self.admin() as c:
            c.execute(f"CREATE SCHEMA {name} AUTHORIZATION factdb_owner")
            if host_role:
                c.execute(f"GRANT USAGE ON SCHEMA {name} TO factdb_host")
                c.execute(f"ALTER DEFAULT PRIVILEGES FOR ROLE factdb_owner IN SCHEMA {name} "
                          "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO factdb_host")
        return self.url("factdb_owner", name)

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._pg("pg_isready", "-h", "127.0.0.1", "-p", str(self.port), check=False).returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"PostgreSQL on port {self.port} did not come up")
