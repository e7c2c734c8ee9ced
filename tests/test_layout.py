"""The tree's own rules, checked on its files: what each side may import, that
the docs' limit tables state what the limits modules hold, and that the docs
and the code cite only files the repository has."""

from __future__ import annotations

import ast
import importlib
import posixpath
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"

HELPER_IMPORTS = {
    "guilds_code": {"guilds_code"},
    "guilds_harness": {"guilds_harness", "guilds_code"},
}
"""What each in-sandbox helper may import besides the standard library: the
harness bundles guilds_code; guilds_code stands alone."""


def _modules(package: str) -> list[Path]:
    return sorted((SRC / package).rglob("*.py"))


def _runtime_nodes(tree: ast.AST):
    """Every node of tree but those under ``if TYPE_CHECKING:`` (never run)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))


def _imported(path: Path, root: Path = SRC) -> set[str]:
    """Every module path.py (under root) imports when it runs, anywhere in it, as a dotted absolute name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = ".".join(path.relative_to(root).with_suffix("").parts)
    if path.name == "__init__.py":
        here = here.rsplit(".", 1)[0] + ".__init__"
    names: set[str] = set()
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = here.rsplit(".", node.level)[0]
                base = f"{parent}.{base}" if base else parent
                names.update(f"{base}.{alias.name}" for alias in node.names)
            names.add(base)
    return names


@pytest.mark.parametrize("package", sorted(HELPER_IMPORTS))
def test_a_helper_imports_only_the_standard_library(package):
    allowed = HELPER_IMPORTS[package]
    for path in _modules(package):
        for name in _imported(path):
            top = name.split(".")[0]
            assert top in sys.stdlib_module_names or top in allowed, f"{path.relative_to(SRC)} imports {name}"


def test_the_rule_catches_a_third_party_import(tmp_path):
    """The check above fails for an import it must refuse (not vacuous)."""
    package = tmp_path / "guilds_code"
    package.mkdir()
    module = package / "bad.py"
    module.write_text("def f():\n    import sqlalchemy\n    from guilds import cli\n")
    names = {name.split(".")[0] for name in _imported(module, tmp_path)}
    assert names - sys.stdlib_module_names == {"sqlalchemy", "guilds"}


FORBIDDEN_IN_WEB = ("guilds.sandbox", "guilds.toolbox")
"""The app reads the run record; it reaches a sandbox only through what serve hands it."""


def test_the_app_imports_neither_the_sandboxes_nor_the_toolbox():
    for path in _modules("guilds/web"):
        for name in _imported(path):
            assert not name.startswith(FORBIDDEN_IN_WEB), f"{path.relative_to(SRC)} imports {name}"


def test_the_app_sees_no_table_and_no_engine():
    """Every query the app needs is the store's: no module of guilds.web imports SQLAlchemy."""
    for path in _modules("guilds/web"):
        assert not any(name.split(".")[0] == "sqlalchemy" for name in _imported(path)), path.name
        assert ".engine" not in path.read_text(encoding="utf-8"), path.name


def test_importing_the_app_loads_neither_the_sandboxes_nor_the_toolbox():
    """Also what the app's imports import (a fresh interpreter)."""
    code = ("import sys, guilds.web; print(' '.join(m for m in sys.modules "
            f"if m.startswith({FORBIDDEN_IN_WEB!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == []


# --- the docs' limit tables -----------------------------------------------

_TABLE_SOURCE = re.compile(r"All in `src/(guilds_code|guilds_harness)/limits\.py`")
_NUMBER = re.compile(r"(?<![\w.])(\d[\d,]*(?:\.\d+)?)(?:\s*(KiB|MiB))?(?![\w.])")
_UNITS = {"": 1, "KiB": 1024, "MiB": 1024 * 1024}


def _limit_tables() -> list[tuple[str, str, list[list[str]]]]:
    """(doc, limits module, rows) of every table headed `| limit | value | where |`."""
    found = []
    for doc in sorted((ROOT / "docs").glob("*.md")):
        text = doc.read_text(encoding="utf-8")
        for block in re.split(r"\n(?=\| limit \| value \| where \|)", text)[1:]:
            lines = block.split("\n")
            rows = []
            for line in lines[2:]:
                if not line.startswith("|"):
                    break
                rows.append([cell.strip() for cell in line.strip("|").split("|")])
            source = _TABLE_SOURCE.search("\n".join(lines[len(rows) + 2:len(rows) + 6]))
            assert source, f"{doc.name}: a limit table is followed by 'All in `src/<package>/limits.py`'"
            found.append((doc.name, f"{source.group(1)}.limits", rows))
    return found


def _numbers(cell: str) -> set[float]:
    return {float(n.replace(",", "")) * _UNITS[unit] for n, unit in _NUMBER.findall(cell)}


def _constants(module, where: str) -> dict[str, float]:
    names = re.findall(r"`([A-Z0-9_]+\*?)`", where)
    assert names, f"no constant named in {where!r}"
    values = {}
    for name in names:
        matched = [n for n in vars(module) if n == name or (name.endswith("*") and n.startswith(name[:-1]))]
        assert matched, f"{module.__name__} has no {name}"
        values.update({n: float(getattr(module, n)) for n in matched})
    return values


def test_the_docs_have_limit_tables():
    assert {module for _, module, _ in _limit_tables()} == {"guilds_code.limits", "guilds_harness.limits"}


@pytest.mark.parametrize("doc, module_name, rows", _limit_tables(), ids=lambda v: v if isinstance(v, str) else "")
def test_a_limit_table_states_what_limits_holds(doc, module_name, rows):
    module = importlib.import_module(module_name)
    for limit, value, where in rows:
        constants = _constants(module, where)
        assert _numbers(value) == set(constants.values()), f"{doc}: {limit!r} says {value!r}; {constants}"


# --- files cited ----------------------------------------------------------

_CITED = re.compile(r"(?<![\w/.<-])((?:[\w-]+/)*[\w-]+\.(?:py|md|sh))\b")
EXAMPLE_FILES = {"src/app.py", "NOTES.md", "app.py", "__main__.py"}
"""Names a text shows as an example of a file (a diffstat, the user's program, a
zipapp's entry), not citations."""


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.split()


def _cited_from(text: str) -> list[str]:
    """The folders a citation in text (a repository path) is read from: a doc's folder and
    the repository's root, as a link of it would be; a module's folder, its package's
    root and src/, as an import would name it."""
    folders = [posixpath.dirname(text), ""]
    if text.endswith(".py"):
        folders += ["/".join(text.split("/")[:2]), "src"]
    return folders


def _missing_citations(texts: list[str], tracked: set[str], read) -> list[str]:
    missing = []
    for path in texts:
        for cited in _CITED.findall(read(path)):
            if cited in EXAMPLE_FILES or any(posixpath.normpath(posixpath.join(folder, cited)) in tracked
                                             for folder in _cited_from(path)):
                continue
            missing.append(f"{path}: {cited}")
    return missing


def test_docs_and_code_cite_only_files_the_repository_has():
    tracked = _tracked()
    texts = [p for p in tracked if p.endswith(".md") or (p.startswith("src/") and p.endswith(".py"))]
    assert _missing_citations(texts, set(tracked), lambda p: (ROOT / p).read_text(encoding="utf-8")) == []


def test_a_citation_resolves_exactly():
    """A file of the same name elsewhere is no citation of it (not vacuous)."""
    tracked = {"docs/a.md", "docs/b.md", "src/pkg/sub/mod.py", "src/pkg/other.py", "bench/run.py"}
    texts = {"docs/a.md": "see b.md, docs/b.md, mod.py, sub/mod.py, src/pkg/sub/mod.py and run.py",
             "src/pkg/sub/mod.py": "see other.py, sub/mod.py, pkg/other.py, mod/other.py, run.py and b.md"}
    assert _missing_citations(list(texts), tracked, texts.__getitem__) == [
        "docs/a.md: mod.py", "docs/a.md: sub/mod.py", "docs/a.md: run.py",
        "src/pkg/sub/mod.py: mod/other.py", "src/pkg/sub/mod.py: run.py", "src/pkg/sub/mod.py: b.md"]


# --- the two sides' grace times ---------------------------------------------

def test_a_cancelled_helper_stops_its_command_before_the_orchestrator_kills_it():
    from guilds import limits as orchestrator
    from guilds_code import limits as sandbox_side

    assert sandbox_side.CANCEL_KILL_GRACE_SECONDS < orchestrator.EXEC_KILL_GRACE_SECONDS
    assert sandbox_side.SHELL_DRAIN_SECONDS <= orchestrator.EXEC_DRAIN_SECONDS


def test_the_harness_names_the_sandbox_sides_grace_times():
    from guilds_code import limits as sandbox_side
    from guilds_harness import limits as task

    assert (task.KILL_GRACE_SECONDS, task.FINAL_EXIT_GRACE_SECONDS, task.DRAIN_SECONDS) == (
        sandbox_side.TASK_KILL_GRACE_SECONDS, sandbox_side.TASK_FINAL_EXIT_GRACE_SECONDS,
        sandbox_side.TASK_DRAIN_SECONDS)


def _module_name(path: Path) -> str:
    name = ".".join(path.relative_to(SRC).with_suffix("").parts)
    return name.removesuffix(".__init__")


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of graph (module -> modules it imports), or []."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


@pytest.mark.parametrize("package", sorted(HELPER_IMPORTS))
def test_a_helpers_modules_import_one_another_without_a_circle(package):
    paths = [p for name in HELPER_IMPORTS[package] for p in _modules(name)]
    modules = {_module_name(p) for p in paths if p.name != "__init__.py"}
    graph = {_module_name(p): _imported(p) & modules for p in paths if p.name != "__init__.py"}
    assert _cycle(graph) == []


def test_the_circle_check_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


def test_the_orchestrators_waits_leave_room_for_the_helpers_grace():
    from guilds import limits as orchestrator
    from guilds_code import limits as sandbox_side

    assert orchestrator.CALL_CANCEL_WAIT_SECONDS > (
        sandbox_side.CANCEL_KILL_GRACE_SECONDS + orchestrator.EXEC_KILL_GRACE_SECONDS)
    assert orchestrator.SERVE_CANCEL_WAIT_SECONDS > orchestrator.CALL_CANCEL_WAIT_SECONDS
    assert orchestrator.STDIO_STOP_WAIT_SECONDS > orchestrator.CALL_CANCEL_WAIT_SECONDS
    assert orchestrator.MCP_TASK_CANCEL_WAIT_SECONDS > (
        sandbox_side.STOP_KILL_GRACE_SECONDS + sandbox_side.STOP_KILLER_POLL_SECONDS)


def test_the_orchestrators_channel_waits_leave_room_for_the_helpers_stop():
    from guilds import limits as orchestrator
    from guilds_code import limits as sandbox_side

    assert orchestrator.CHANNEL_CANCEL_WAIT_SECONDS > sandbox_side.SERVE_WORKER_KILL_SECONDS
    assert orchestrator.CHANNEL_CLOSE_WAIT_SECONDS > sandbox_side.CANCEL_KILL_GRACE_SECONDS
    assert orchestrator.KUBERNETES_DEADLINE_SLACK_SECONDS >= orchestrator.DOCKER_DEADLINE_SLACK_SECONDS


# --- the orchestrator's rooms -----------------------------------------------

BASE = ("guilds.errors", "guilds.limits", "guilds.procfs")
"""The base modules: every room may import them; they import nothing of the house."""
ROOMS = {
    "base": set(),
    "egress": {"base"},
    "config": {"base", "egress"},
    "record": {"base", "config"},
    "sandbox": {"base", "config", "egress"},
    "checkpoints": {"base"},
    "toolbox": {"base", "config", "record", "sandbox", "egress", "observe", "checkpoints"},
    "web": {"base", "config", "record"},
    "adapters": {"base"},
    "agents": {"base", "config", "record", "sandbox", "toolbox", "checkpoints"},
    "observe": {"base", "record", "toolbox"},
    "fronts": {"base", "config", "record", "sandbox", "toolbox", "web", "egress", "agents", "observe", "checkpoints"},
    "package": {"fronts"},
}
"""Which rooms of guilds each room may import (besides itself, the standard library,
the third-party packages and the in-sandbox helpers): the egress proxy stands on the
base alone (the settings parse its allowlist, the sandboxes start it); config (the settings), the
record, the sandboxes and the web app stand on the base alone or with the
settings and the record; the checkpoints of a home stand on the base alone; the
toolbox joins the record, the sandboxes and the checkpoints; the agents
made on demand stand on the toolbox and what it stands on; the metrics and log
lines (observe) hear the toolbox and read the record, and the toolbox writes its
log lines through them (the module circle test keeps the two free of a circle); the
fronts (CLI, MCP, serve, the Python API, doctor) join everything; ``guilds.open``
(the package) opens a front. The package's own name is no room: ``from .. import
limits`` names it, and the adapters call ``guilds.open``."""


def room_of(module: str) -> str | None:
    """The room of a dotted module name of guilds ("loose" outside every room), None outside guilds."""
    parts = module.split(".")
    if parts[0] != "guilds":
        return None
    if len(parts) == 1 or parts[1] == "__init__":
        return "package"
    if ".".join(parts[:2]) in BASE:
        return "base"
    return parts[1] if parts[1] in ROOMS else "loose"


def _guilds_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in _modules("guilds")}


def test_every_module_of_guilds_is_in_a_room():
    loose = [name for name in _guilds_modules() if room_of(name) == "loose"]
    assert loose == []


def _room_breaches(modules: dict[str, Path], root: Path = SRC) -> list[str]:
    breaches = []
    for name, path in sorted(modules.items()):
        here = room_of(name)
        for imported in sorted(_imported(path, root)):
            there = room_of(imported) if imported != "guilds" else None
            if there is not None and there != here and there not in ROOMS[here]:
                breaches.append(f"{name} ({here}) imports {imported} ({there})")
    return breaches


def test_a_room_imports_only_the_rooms_it_stands_on():
    assert _room_breaches(_guilds_modules()) == []


def test_the_room_rule_catches_a_breach(tmp_path):
    """The check above fails for an import it must refuse (not vacuous)."""
    record = tmp_path / "guilds" / "record"
    record.mkdir(parents=True)
    (record / "bad.py").write_text("def f():\n    from ..toolbox import Toolbox\n    from ..config import settings\n")
    modules = {"guilds.record.bad": record / "bad.py"}
    assert _room_breaches(modules, tmp_path) == [
        "guilds.record.bad (record) imports guilds.toolbox (toolbox)",
        "guilds.record.bad (record) imports guilds.toolbox.Toolbox (toolbox)",
    ]


def test_the_base_modules_import_nothing_of_the_house():
    for name in BASE:
        path = SRC / (name.replace(".", "/") + ".py")
        ours = {n for n in _imported(path) if n.split(".")[0] in ("guilds", "guilds_code", "guilds_harness")}
        assert ours == set(), name


def test_the_orchestrators_modules_import_one_another_without_a_circle():
    """Imports anywhere in a module count (a function's too); a package's __init__ is left out."""
    modules = {name: path for name, path in _guilds_modules().items() if path.name != "__init__.py"}
    graph = {name: _imported(path) & set(modules) for name, path in modules.items()}
    assert _cycle(graph) == []


NAMES_SHARED = {"__init__.py", "__main__.py", "limits.py"}
"""File names more than one package has: a package's front, a program's entry, and
each side's limits module (the same thing on each side)."""


def test_one_name_means_one_thing():
    """No two modules, and no two packages, of the three share a name."""
    files: dict[str, list[str]] = {}
    folders: dict[str, list[str]] = {}
    for package in ("guilds", "guilds_code", "guilds_harness"):
        for path in _modules(package):
            rel = str(path.relative_to(SRC))
            if path.name not in NAMES_SHARED:
                files.setdefault(path.name, []).append(rel)
            if path.name == "__init__.py" and path.parent != SRC / package:
                folders.setdefault(path.parent.name, []).append(rel)
    assert {n: p for n, p in files.items() if len(p) > 1} == {}
    assert {n: p for n, p in folders.items() if len(p) > 1} == {}


def _string_lists(path: Path) -> list[tuple[int, frozenset[str]]]:
    """(line, strings) of every tuple, list or set literal of two or more strings in path."""
    return [(node.lineno, frozenset(e.value for e in node.elts))
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) > 1
            and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)]


def test_each_name_list_is_written_once():
    """The sandboxes, the transports and the harnesses: one literal each in the whole tree."""
    from guilds.config.settings import SANDBOXES, TRANSPORTS
    from guilds_harness.harnesses import HARNESSES

    lists = {"sandboxes": frozenset(SANDBOXES), "transports": frozenset(TRANSPORTS)}
    written: dict[str, list[str]] = {name: [] for name in lists}
    for package in ("guilds", "guilds_code", "guilds_harness"):
        for path in _modules(package):
            for line, strings in _string_lists(path):
                for name, names in lists.items():
                    if strings == names:
                        written[name].append(f"{path.relative_to(SRC)}:{line}")
                assert strings != frozenset(HARNESSES), f"{path.relative_to(SRC)}:{line} lists the harnesses again"
    assert {name: len(places) for name, places in written.items()} == {"sandboxes": 1, "transports": 1}, written


def _literal_waits(path: Path, root: Path = SRC) -> list[str]:
    """Where path names a wait with a number of its own: a ``*_SECONDS``/``*_MS`` constant
    set from a literal, or a sleep of a literal."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and re.search(r"_(SECONDS|MS)(_[A-Z]+)?$", t.id) for t in node.targets):
            if not any(isinstance(n, (ast.Name, ast.Attribute)) for n in ast.walk(node.value)):  # a number alone
                found.append(f"{path.relative_to(root)}:{node.lineno}")
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "sleep" and node.args
              and isinstance(node.args[0], ast.Constant) and node.args[0].value):
            found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_every_wait_is_named_in_a_limits_module():
    found = [where for package in ("guilds", "guilds_code", "guilds_harness") for path in _modules(package)
             if path.name != "limits.py" for where in _literal_waits(path)]
    assert found == []


def test_the_wait_rule_catches_a_literal_wait(tmp_path):
    module = tmp_path / "bad.py"
    module.write_text("import time\nPOLL_SECONDS = 0.5\nALIAS_SECONDS = limits.X\ntime.sleep(0.1)\ntime.sleep(0)\n")
    assert [w.split(":")[1] for w in _literal_waits(module, tmp_path)] == ["2", "4"]


# --- each tool one object ----------------------------------------------------

TOOL_NAME_HOMES = {
    "guilds/toolbox/tools/": "the tools themselves",
    "guilds/record/rows.py": "the record's row texts",
    "guilds/record/statements.py": "the record's queries (code_task's text, file_read's ledger)",
    "guilds/web/flow.py": "the app's flow (code_task's detail)",
    "guilds/adapters/": "an adapter calls a tool by its name, as any client does",
}
"""Where guilds may write a tool's name as a literal; the helpers (guilds_code,
guilds_harness) name their own ops. Everywhere else a tool is asked through the
registry (``guilds.toolbox.tools``): the transport, the toolbox and the fronts."""


def _tool_name_literals(path: Path, root: Path = SRC) -> list[str]:
    from guilds.toolbox.tools import TOOL_NAMES

    return [f"{path.relative_to(root)}:{node.lineno}: {node.value}"
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Constant) and node.value in TOOL_NAMES]


def test_no_tool_name_is_written_outside_its_tool():
    found = [where for path in _modules("guilds")
             if not any(str(path.relative_to(SRC)).startswith(home) for home in TOOL_NAME_HOMES)
             for where in _tool_name_literals(path)]
    assert found == []


def test_the_tool_name_rule_catches_a_literal(tmp_path):
    module = tmp_path / "bad.py"
    module.write_text('"""A docstring naming shell is no literal."""\nif name == "shell_status":\n    pass\n')
    assert _tool_name_literals(module, tmp_path) == ["bad.py:2: shell_status"]


# --- the fronts ask the backends --------------------------------------------

SANDBOX_SHARED = {"guilds.sandbox", "guilds.sandbox.base", "guilds.sandbox.helpers",
                  "guilds.sandbox.process_channel", "guilds.sandbox.image"}
"""What of the sandboxes a front may import: the package (its table of backends,
``get_sandbox``), the seam, the helpers' build, the process channel and the sandbox
image's build; never a backend's own module nor the code backends share."""


def _module_of(name: str, modules: set[str]) -> str:
    """The module a dotted imported name is (or is a name of)."""
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _backend_names() -> set[str]:
    from guilds.config.settings import SANDBOXES

    return set(SANDBOXES)


def _name_compares(path: Path, names: set[str], root: Path = SRC) -> list[str]:
    """Where path compares a value with a backend's name, or keys a dict by one."""

    def named(node: ast.AST) -> bool:
        elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return any(isinstance(e, ast.Constant) and e.value in names for e in elts)

    def operands(node: ast.AST) -> list[ast.AST]:
        if isinstance(node, ast.Compare):
            return [node.left, *node.comparators]
        if isinstance(node, ast.Dict):
            return [k for k in node.keys if k is not None]
        return [node.value] if isinstance(node, ast.MatchValue) else []

    return [f"{path.relative_to(root)}:{node.lineno}" for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if any(named(n) for n in operands(node))]


def _sandbox_imports(modules: dict[str, Path], root: Path = SRC) -> list[str]:
    known = set(_guilds_modules())
    return [f"{name} imports {imported}" for name, path in sorted(modules.items())
            for imported in sorted(_imported(path, root)) if imported.startswith("guilds.sandbox")
            and _module_of(imported, known) not in SANDBOX_SHARED]


def test_the_fronts_ask_the_backends_and_never_name_one():
    """A front reaches a backend through ``guilds.sandbox``'s table, never its own modules,
    and asks it rather than branch on its name."""
    fronts = {name: path for name, path in _guilds_modules().items() if room_of(name) == "fronts"}
    assert _sandbox_imports(fronts) == []
    assert [where for path in fronts.values() for where in _name_compares(path, _backend_names())] == []


def test_the_fronts_rule_catches_a_backends_module_and_a_name(tmp_path):
    """The checks above fail for what they must refuse (not vacuous)."""
    fronts = tmp_path / "guilds" / "fronts"
    fronts.mkdir(parents=True)
    bad = fronts / "bad.py"
    bad.write_text("from ..sandbox.docker import docker_spec\nfrom ..sandbox.kubernetes.kube_spec import LABEL_AGENT\n"
                   "def f(s):\n    from ..sandbox._spawn import start_time\n"
                   "    if s.sandbox == 'docker' or s.sandbox in ('bwrap', 'x'):\n        return {'local': 1}\n")
    assert _sandbox_imports({"guilds.fronts.bad": bad}, tmp_path) == [
        "guilds.fronts.bad imports guilds.sandbox._spawn",
        "guilds.fronts.bad imports guilds.sandbox._spawn.start_time",
        "guilds.fronts.bad imports guilds.sandbox.docker",
        "guilds.fronts.bad imports guilds.sandbox.docker.docker_spec",
        "guilds.fronts.bad imports guilds.sandbox.kubernetes.kube_spec",
        "guilds.fronts.bad imports guilds.sandbox.kubernetes.kube_spec.LABEL_AGENT",
    ]
    assert [w.split(":")[1] for w in _name_compares(bad, _backend_names(), tmp_path)] == ["5", "5", "6"]


def test_the_table_of_backends_holds_every_sandbox_the_settings_name():
    from guilds.config.settings import SANDBOXES
    from guilds.sandbox import AUTO, BACKENDS, backends

    assert {*BACKENDS, AUTO} == set(SANDBOXES)
    assert [(name, kind.name) for name, kind in backends()] == [(name, name) for name in BACKENDS]


def _protocol_members() -> set[str]:
    """What the ``Sandbox`` protocol declares (sandbox/base.py): its attributes, methods and properties."""
    tree = ast.parse((SRC / "guilds" / "sandbox" / "base.py").read_text(encoding="utf-8"))
    protocol = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Sandbox")
    return ({n.target.id for n in protocol.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
            | {n.name for n in protocol.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))})


def _sandbox_typed(tree: ast.AST) -> set[str]:
    """Every name path annotates as a sandbox (its annotation names a class ending in Sandbox)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            name, annotation = node.arg, node.annotation
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name, annotation = node.target.id, node.annotation
        else:
            continue
        if re.search(r"\w*Sandbox\b", ast.unparse(annotation)):
            names.add(name)
    return names


def _sandbox_getattrs(path: Path, members: set[str], root: Path = SRC) -> list[str]:
    """Each ``getattr``/``hasattr`` in path asking a sandbox (a name or attribute holding
    "sandbox" or "box", or a name annotated as one) for a member the protocol declares."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typed = _sandbox_typed(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant) and node.args[1].value in members):
            continue
        receiver = node.args[0]
        last = receiver.attr if isinstance(receiver, ast.Attribute) else getattr(receiver, "id", "")
        if "box" in last.lower() or "sandbox" in last.lower() or last in typed:
            found.append(f"{path.relative_to(root)}:{node.lineno} {node.func.id}({ast.unparse(receiver)}, "
                         f"{node.args[1].value!r})")
    return found


def test_no_getattr_on_a_sandbox_for_what_the_protocol_declares():
    """What the Sandbox protocol declares (egress among it) is read as an attribute, so that a
    backend lacking it fails the type check instead of being passed over at run time."""
    members = _protocol_members()
    assert {"egress", "home", "exec"} <= members
    assert [hit for path in _modules("guilds") for hit in _sandbox_getattrs(path, members)] == []


def test_the_getattr_rule_catches_each_way_of_asking_a_sandbox(tmp_path):
    """The check above fails for what it must refuse (not vacuous), and leaves other objects alone."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "def f(self, agent: Sandbox, box, opts, other: LocalSandbox | None):\n"
        "    getattr(self.sandbox, 'egress', None)\n"
        "    getattr(agent, 'egress', None)\n"
        "    hasattr(box, 'exec')\n"
        "    getattr(other, 'home')\n"
        "    getattr(opts, 'home', None)\n"
        "    getattr(self.sandbox, 'idle_seconds', None)\n")
    assert [hit.split(" ", 1)[1] for hit in _sandbox_getattrs(bad, _protocol_members(), tmp_path)] == [
        "getattr(self.sandbox, 'egress')", "getattr(agent, 'egress')", "hasattr(box, 'exec')",
        "getattr(other, 'home')"]
