"""Rules: the declarative YAML optimization rules, loaded and validated.

One rule per file, `rules/<family>/<id>.yaml`, with a fixture module `<id>.py` beside
it; reusable sub-patterns live in `rules/fragments/<name>.yaml`. A rule file is data:
it is parsed with `yaml.safe_load`, checked against `rules.schema.json`, and its
constraints are interpreted by `fact_db.discovery.expr`, never executed.

>>> rs = load_rules()                      # the shipped rules, raises RuleError if any is broken
>>> rs.get("gemm-bias-gelu-tanh").realize["template"]
'gemm_sm90'
>>> faults = validate([Path("rules/gemm/gemm.yaml")])   # every fault, not just the first
"""
from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml

from fact_db.core import paths
from fact_db.core.errors import ExprError, Fault, RuleError, display_path
from fact_db.discovery.pattern import Fragment, PatternError, build_patterns, expand
from fact_db.discovery.rulecache import RuleCache

FRAGMENTS_DIR = "fragments"


@dataclass
class Rule:
    id: str
    title: str
    description: str
    status: str
    arch: list
    family: str
    match: dict
    realize: dict
    benefit: str
    references: list
    fixture: str
    path: Path
    priority: int = 0
    patterns: list = field(default_factory=list)

    @property
    def fixture_path(self) -> Path:
        return self.path.parent / self.fixture

    def summary(self) -> dict:
        return {"id": self.id, "family": self.family, "status": self.status, "arch": self.arch,
                "title": self.title, "template": self.realize.get("template"), "path": str(self.path)}


@dataclass
class RuleSet:
    rules: list
    fragments: dict

    def get(self, rule_id: str) -> Rule:
        for r in self.rules:
            if r.id == rule_id:
                return r
        guess = difflib.get_close_matches(rule_id, [r.id for r in self.rules], n=1)
        hint = f"; did you mean `{guess[0]}`?" if guess else "; `factdb rules list` shows them"
        raise KeyError(f"no rule `{rule_id}`{hint}")

    def __iter__(self):
        return iter(self.rules)

    def __len__(self):
        return len(self.rules)


# ---------------------------------------------------------------- YAML with line numbers

def _line_map(node, path=(), out=None) -> dict:
    out = {} if out is None else out
    out[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = k.value
            out[path + (key,)] = k.start_mark.line + 1
            _line_map(v, path + (key,), out)
            out[path + (key,)] = k.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _line_map(v, path + (i,), out)
    return out


# A rule file is a page of YAML; anything near this size is not one (README, "Limits on
# untrusted input").
MAX_RULE_BYTES = 256 * 1024


MAX_RULE_NESTING = 64


def _flow_depth(text: str) -> tuple[int, int]:
    """(deepest nesting of [ and { outside quoted strings, its line), read in one linear pass
    before the YAML parser sees the text (it recurses per level: 20,000 levels took it 12 s
    and ended in a RecursionError)."""
    depth = best = 0
    line = best_line = 1
    quote = ""
    for ch in text:
        if ch == "\n":
            line += 1
            quote = ""  # an apostrophe in a plain scalar ("don't") must not hide the rest of the file
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
            if depth > best:
                best, best_line = depth, line
        elif ch in "]}":
            depth = max(0, depth - 1)
    return best, best_line


def _refuse(path: Path, line, message: str, fix: str):
    raise RuleError([Fault(str(path), line, "", message, fix)]) from None


def load_yaml(path: Path):
    """(data, lines) of a YAML file, or raise a Fault-carrying RuleError: unreadable, over the
    size limit, not UTF-8, using anchors or aliases (a few hundred bytes of nested aliases
    expand to gigabytes), or a syntax error."""
    data, lines, _ = _load_yaml(path)
    return data, lines


def _load_yaml(path: Path):
    """load_yaml's (data, lines), and the bytes they were read from."""
    try:
        size = path.stat().st_size
        if size > MAX_RULE_BYTES:
            _refuse(path, None, f"the file is {size} bytes, over the {MAX_RULE_BYTES // 1024} KiB limit for a rule file",
                    "a rule is a page of YAML: split it, or move data out of it")
        raw = path.read_bytes()
    except OSError as e:
        _refuse(path, None, f"cannot read file: {e.strerror}", "check the path")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        _refuse(path, line, f"the file is not UTF-8 text (byte {e.start} is 0x{raw[e.start]:02x})",
                "save it as UTF-8")
    depth, line = _flow_depth(text)
    if depth > MAX_RULE_NESTING:
        _refuse(path, line, f"brackets nest {depth} deep, past the limit of {MAX_RULE_NESTING} for a rule file",
                "flatten the structure")
    fast = _parse_fast(text)
    if fast is not None:
        anchor, data, lines = fast
        if anchor is None:
            return data, lines, raw
        _refuse(path, anchor, "YAML anchors and aliases (&name, *name) are not allowed in rules",
                "write the repeated part out, or share it through a fragment (`use:`)")
    return (*_parse_pure(path, text), raw)


_CLoader = getattr(yaml, "CSafeLoader", None)  # PyYAML built with libyaml


def _parse_fast(text: str):
    """(line of the first anchor or alias or None, data, lines) of `text` through libyaml (the
    pure-Python parser took 0.2 s for the shipped rules, most of a `factdb discover`'s rule
    loading), or None when libyaml is absent or finds any error: the pure-Python parse then
    runs and reports it, so faults read as before. One composition serves both the data and
    the line map; the data is constructed from it with the safe constructor, as
    yaml.safe_load does. tests/test_startup.py checks both parses agree on every rule file and
    broken-rule case."""
    if _CLoader is None:
        return None
    try:
        for tok in yaml.scan(text, Loader=_CLoader):
            if isinstance(tok, (yaml.AliasToken, yaml.AnchorToken)):
                return tok.start_mark.line + 1, None, None
        loader = _CLoader(text)
        try:
            node = loader.get_single_node()
            lines = _line_map(node) if node is not None else {}
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError:
        return None
    return None, data, lines


def _parse_pure(path: Path, text: str):
    """load_yaml's parse with the pure-Python parser (the reference for _parse_fast)."""
    try:
        for tok in yaml.scan(text):
            if isinstance(tok, (yaml.AliasToken, yaml.AnchorToken)):
                _refuse(path, tok.start_mark.line + 1, "YAML anchors and aliases (&name, *name) are not allowed in rules",
                        "write the repeated part out, or share it through a fragment (`use:`)")
    except yaml.MarkedYAMLError:
        pass  # the parse below reports it with its position
    try:
        data = yaml.safe_load(text)
        node = yaml.compose(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (None, None)
        what = f"{e.problem}" + (f" ({e.context})" if e.context else "")
        raise RuleError([Fault(str(path), line, "", f"YAML syntax error at line {line}, column {col}: {what}",
                               "fix the YAML syntax (indentation, a missing colon, an unclosed bracket or quote)")]) from None
    return data, (_line_map(node) if node is not None else {})


def _path_keys(field_path: str) -> tuple:
    keys = []
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", field_path):
        keys.append(int(part[1:-1]) if part.startswith("[") else part)
    return tuple(keys)


def _line(lines: dict, keys: tuple):
    for n in range(len(keys), -1, -1):
        if keys[:n] in lines:
            return lines[keys[:n]]
    return None


def _dotted(keys) -> str:
    out = ""
    for k in keys:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out


# ---------------------------------------------------------------- schema

@lru_cache(maxsize=1)
def _schema_source() -> tuple[bytes, dict]:
    """The schema file's bytes (which SchemaCache's digests include) and the schema read from them."""
    raw = paths.schema_path().read_bytes()
    return raw, json.loads(raw)


def schema() -> dict:
    return _schema_source()[1]


def _validator(kind: str):
    import jsonschema  # only where a file is checked: the schema cache (below) spares a `factdb discover` it
    s = schema()
    if kind == "fragment":
        s = {"$schema": s["$schema"], "$ref": "#/$defs/fragment", "$defs": s["$defs"]}
    return jsonschema.Draft202012Validator(s)


SCHEMA_CACHE_VERSION = 1
SCHEMA_CACHE_MAX = 4096  # digests kept; past it, only those of the last load


class SchemaCache:
    """Digests of rule and fragment files that passed the schema check, kept in
    `$FACTDB_HOME/cache/rules-schema.json` (never elsewhere), so that loading unchanged rules
    does not check them again: the check (and importing jsonschema for it) was two thirds
    of the rule loading of every `factdb discover` (0.08 of 0.12 s, after libyaml).

    A digest is the sha256 of the file's bytes, what it was checked as (rule or fragment),
    the schema file's bytes, and the installed PyYAML version and jsonschema package (its
    file's path, size and modification time): a change to any of them is a new digest and the
    file is checked again. Only passes are kept; a file with a fault is checked on every load
    and reports it. The cache is a convenience: unreadable, corrupt or unwritable, it is
    ignored, and everything is checked as before. The checks other than the schema's
    (ids, templates, fixtures, patterns) run on every load."""

    def __init__(self, home: Path | None = None):
        self.path = (home or paths.home()) / "cache" / "rules-schema.json"
        self.known: set = set()
        self.used: set = set()
        self.added: set = set()
        self._salt: bytes | None = None
        try:
            doc = json.loads(self.path.read_text())
            if isinstance(doc, dict) and doc.get("version") == SCHEMA_CACHE_VERSION and isinstance(doc.get("passed"), list):
                self.known = {d for d in doc["passed"] if isinstance(d, str)}
        except (OSError, ValueError):
            pass

    def salt(self) -> bytes:
        if self._salt is None:
            import importlib.util
            h = hashlib.sha256(f"v{SCHEMA_CACHE_VERSION}\0pyyaml {yaml.__version__}\0".encode())
            h.update(_schema_source()[0])  # the bytes the checks use
            spec = importlib.util.find_spec("jsonschema")
            origin = spec.origin if spec is not None and spec.origin else ""
            try:
                st = os.stat(origin)
                h.update(f"\0jsonschema {origin} {st.st_size} {st.st_mtime_ns}".encode())
            except OSError:
                h.update(f"\0jsonschema {origin}".encode())
            self._salt = h.digest()
        return self._salt

    def digest(self, kind: str, raw: bytes) -> str:
        return hashlib.sha256(self.salt() + kind.encode() + b"\0" + raw).hexdigest()

    def passed(self, kind: str, raw: bytes | None) -> bool:
        if raw is None:
            return False
        d = self.digest(kind, raw)
        if d in self.known:
            self.used.add(d)
            return True
        return False

    def add(self, kind: str, raw: bytes | None) -> None:
        if raw is not None:
            self.added.add(self.digest(kind, raw))

    def save(self) -> None:
        """Write the digests (atomically) where this load found new ones; errors are ignored."""
        new = self.added - self.known
        if not new:
            return
        keep = self.known | self.added
        if len(keep) > SCHEMA_CACHE_MAX:
            keep = self.used | self.added
        tmp = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"version": SCHEMA_CACHE_VERSION, "passed": sorted(keep)}))
            os.replace(tmp, self.path)
            self.known = keep
        except OSError:
            if tmp is not None:
                try:
                    tmp.unlink()
                except OSError:
                    pass


def _schema_faults(path: Path, data, lines: dict, kind: str, cache: SchemaCache | None = None,
                   raw: bytes | None = None) -> list:
    if cache is not None and cache.passed(kind, raw):
        return []
    faults = []
    for err in sorted(_validator(kind).iter_errors(data), key=lambda e: list(map(str, e.absolute_path))):
        keys = tuple(err.absolute_path)
        fieldname = _dotted(keys)
        fix = ""
        if err.validator == "required":
            missing = re.search(r"'([^']+)' is a required property", err.message)
            name = missing.group(1) if missing else "?"
            desc = _describe(err.schema.get("properties", {}).get(name, {}))
            msg, fix = f"missing required field `{name}`", f"add `{name}:`" + (f" — {desc}" if desc else "")
            fieldname = _dotted(keys + (name,))
        elif err.validator == "additionalProperties":
            extra = re.findall(r"'([^']+)'", err.message.split("(")[-1])
            known = list(err.schema.get("properties", {}))
            name = extra[0] if extra else "?"
            guess = difflib.get_close_matches(name, known, n=1)
            msg = f"unknown field `{name}`"
            fix = f"did you mean `{guess[0]}`?" if guess else f"allowed fields: {', '.join(known)}"
            fieldname = _dotted(keys + (name,))
            keys = keys + (name,)
        elif err.validator == "enum":
            msg = f"{err.instance!r} is not allowed"
            fix = f"use one of {', '.join(map(str, err.validator_value))}"
        elif err.validator == "type":
            msg = f"expected {err.validator_value}, got {type(err.instance).__name__} {err.instance!r}"
            fix = _describe(err.schema) or f"write a {err.validator_value}"
        elif err.validator == "pattern":
            msg = f"{err.instance!r} does not match the required form"
            fix = _describe(err.schema) or f"match /{err.validator_value}/"
        else:
            msg = err.message
            fix = _describe(err.schema)
        faults.append(Fault(str(path), _line(lines, keys), fieldname or "(file)", msg, fix))
    if not faults and cache is not None:
        cache.add(kind, raw)
    return faults


def _describe(sub: dict) -> str:
    """The first sentence of a schema description ("e.g. x" does not end one)."""
    d = (sub or {}).get("description", "")
    return re.split(r"(?<![.]g)\.\s+(?=[A-Z])", d)[0].rstrip(".") if d else ""


# ---------------------------------------------------------------- loading

def yaml_files(items) -> list:
    """Rule files under the given files and directories."""
    files = []
    for p in items:
        p = Path(p)
        if p.is_dir():
            files.extend(sorted(p.rglob("*.yaml")) + sorted(p.rglob("*.yml")))
        else:
            files.append(p)
    return files


def _is_fragment(path: Path) -> bool:
    return path.parent.name == FRAGMENTS_DIR


def _load_fragment(path: Path, data: dict) -> Fragment:
    body = {k: data[k] for k in ("nodes", "output", "either") if k in data}
    return Fragment(data["fragment"], list(data.get("params") or []), body, str(path))


def _templates() -> list:
    return sorted(p.name[:-len(".cu.j2")] for p in paths.templates_dir().glob("*.cu.j2"))


def _read(files, faults) -> list:
    """(path, data, lines, bytes) for each file that parses as a YAML mapping; faults for the rest."""
    out = []
    for f in files:
        if not f.exists():
            faults.append(Fault(str(f), None, "", "file does not exist", "check the path"))
            continue
        try:
            data, lines, raw = _load_yaml(f)
        except RuleError as e:
            faults.extend(e.faults)
            continue
        if not isinstance(data, dict):
            faults.append(Fault(str(f), 1, "(file)", f"a rule file must hold a YAML mapping, got {type(data).__name__}",
                                "start with `id: <rule-id>` (see rules.schema.json)"))
            continue
        out.append((f, data, lines, raw))
    return out


def _collect(files, cache: SchemaCache | None = None) -> tuple:
    """Parse files and check each: returns (rules, fragments, faults). With `cache`, files
    that passed the schema check before (unchanged, same schema) are not checked again."""
    faults: list = []
    parsed = _read(files, faults)
    fragments, rules, ids = {}, [], []
    shipped_frag_dir = paths.rules_dir() / FRAGMENTS_DIR
    # Shipped fragments are always available to the rules being checked.
    extra = [p for p in yaml_files([shipped_frag_dir]) if p.resolve() not in {f.resolve() for f, _, _, _ in parsed}] if shipped_frag_dir.is_dir() else []
    for f, data, lines, raw in _read(extra, []) + parsed:
        if not _is_fragment(f):
            continue
        fs = _schema_faults(f, data, lines, "fragment", cache, raw)
        if fs:
            if f in files:  # a broken shipped fragment is reported when it is checked itself
                faults.extend(fs)
            continue
        fragments[data["fragment"]] = _load_fragment(f, data)
        if f.stem != data["fragment"]:
            faults.append(Fault(str(f), _line(lines, ("fragment",)), "fragment",
                                f"file name `{f.name}` does not match fragment name `{data['fragment']}`",
                                f"rename the file to `{data['fragment']}.yaml` or the fragment to `{f.stem}`"))
    for f, data, lines, raw in parsed:
        if _is_fragment(f):
            if data.get("fragment") not in fragments:
                continue  # its schema faults are already reported
            try:
                expand(fragments[data["fragment"]].body, fragments, "")
            except PatternError as e:
                faults.append(Fault(str(f), _line(lines, _path_keys(e.where)), e.where.lstrip("."), e.message, e.fix))
            continue
        fs = _schema_faults(f, data, lines, "rule", cache, raw)
        if fs:
            faults.extend(fs)
            continue
        rule_faults = []
        rid = data["id"]
        ids.append((rid, f, _line(lines, ("id",))))
        if f.stem != rid:
            rule_faults.append(Fault(str(f), _line(lines, ("id",)), "id", f"file name `{f.name}` does not match id `{rid}`",
                                     f"rename the file to `{rid}.yaml` or set `id: {f.stem}`"))
        tmpl = data["realize"]["template"]
        known = _templates()
        if tmpl not in known:
            guess = difflib.get_close_matches(tmpl, known, n=1)
            rule_faults.append(Fault(str(f), _line(lines, ("realize", "template")), "realize.template",
                                     f"template `{tmpl}` does not exist in kernels_cpp/ (no kernels_cpp/{tmpl}.cu.j2)",
                                     f"did you mean `{guess[0]}`?" if guess else f"use one of: {', '.join(known)}"))
        ex_dir = paths.cutlass_examples_dir()
        for i, ref in enumerate(data["references"]):
            if isinstance(ref, str) and ref.startswith("examples/"):
                name = ref.split("/")[1]
                if ex_dir is None:
                    rule_faults.append(Fault(str(f), _line(lines, ("references", i)), f"references[{i}]",
                                             f"cannot check `{ref}`: the nvidia-cutlass package is not installed",
                                             "pip install nvidia-cutlass==4.2.0.0"))
                elif not (ex_dir / name).is_dir():
                    have = sorted(p.name for p in ex_dir.iterdir() if p.is_dir())
                    guess = difflib.get_close_matches(name, have, n=1, cutoff=0.5)
                    rule_faults.append(Fault(str(f), _line(lines, ("references", i)), f"references[{i}]",
                                             f"CUTLASS example directory `{ref}` is not in the installed nvidia-cutlass package",
                                             f"did you mean `examples/{guess[0]}`?" if guess else "list the directory as it appears under cutlass_library/source/examples"))
        fixture = f.parent / data["fixture"]
        if not fixture.is_file():
            rule_faults.append(Fault(str(f), _line(lines, ("fixture",)), "fixture", f"fixture `{display_path(str(fixture))}` is missing",
                                     f"add {fixture.name} beside the rule with `# match: {rid}` and `# no-match: {rid}` cases"))
        patterns = []
        try:
            patterns = build_patterns(data["match"], fragments)
        except PatternError as e:
            where = e.where if e.where.startswith("match") else f"match ({e.where})"
            rule_faults.append(Fault(str(f), _line(lines, _path_keys(e.where)), where, e.message, e.fix))
        except ExprError as e:
            rule_faults.append(Fault(str(f), _line(lines, ("match", "where")), "match.where", str(e),
                                     "use names of pattern nodes, captures and M, N, K, batch; see fact_db/discovery/expr.py"))
        faults.extend(rule_faults)
        if not rule_faults:
            rules.append(Rule(rid, data["title"], data["description"].strip(), data["status"], list(data["arch"]),
                              f.parent.name, data["match"], data["realize"], data["benefit"].strip(),
                              list(data["references"]), data["fixture"], f, int(data.get("priority", 0)), patterns))
    seen: dict = {}
    for rid, f, line in ids:
        if rid in seen:
            faults.append(Fault(str(f), line, "id", f"duplicate id `{rid}`, also used by {seen[rid]}", "give each rule a unique id"))
        else:
            seen[rid] = f
    return rules, fragments, faults


def validate(items=None) -> list:
    """Every fault in the given rule files or directories (default: the shipped rules).

    When single files are checked, their ids are also checked against the shipped rules.
    """
    files = yaml_files(items or [paths.rules_dir()])
    rules, _, faults = _collect(files)
    if items:
        checked = {f.resolve() for f in files}
        shipped = [p for p in yaml_files([paths.rules_dir()]) if p.resolve() not in checked and not _is_fragment(p)]
        others = {}
        for p in shipped:
            try:
                d, _ = load_yaml(p)
                if isinstance(d, dict) and "id" in d:
                    others[d["id"]] = p
            except RuleError:
                pass
        for r in rules:
            if r.id in others:
                faults.append(Fault(str(r.path), 1, "id", f"duplicate id `{r.id}`, also used by {others[r.id]}", "give each rule a unique id"))
    return faults


def load_rules(root=None, extra=()) -> RuleSet:
    """Load and check all rules under `root` (default: `FACTDB_RULES` or the shipped `rules/`),
    plus `extra` rule files or directories from elsewhere (a contribution not yet in the tree,
    which may use the shipped fragments). Files that passed the schema check unchanged before
    are not checked again (SchemaCache, in $FACTDB_HOME/cache); without `extra`, a directory
    whose files, schema and checks' inputs are unchanged since a load without faults is not
    read again at all: its RuleSet comes from the rule cache (fact_db.discovery.rulecache)."""
    root = Path(root) if root else paths.rules_dir()
    if not root.is_dir():
        raise RuleError([Fault(str(root), None, "", "rules directory does not exist", "set FACTDB_RULES to a directory of rules")])
    cache = SchemaCache()
    built = None if extra else RuleCache(root, cache.salt())
    hit = built.get() if built is not None else None
    if isinstance(hit, RuleSet):
        return hit
    files = yaml_files([root])
    have = {f.resolve() for f in files}
    files += [f for f in yaml_files(list(extra)) if f.resolve() not in have] if extra else []
    rules, fragments, faults = _collect(files, cache)
    cache.save()
    if faults:
        raise RuleError(faults)
    ruleset = RuleSet(sorted(rules, key=lambda r: (r.family, r.id)), fragments)
    if built is not None:
        built.put(ruleset)
    return ruleset
