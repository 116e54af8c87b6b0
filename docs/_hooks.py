"""MkDocs hooks: the pages that are generated from the repository at build time, so that they
never go stale (issue 34).

* **Every results file.** Each ``benchmarks/results/*.md`` becomes a page under
  ``results/files/`` (its figures beside it), with an index of them all; a results page quotes
  a file's table with ``<!-- include benchmarks/results/NAME.md "HEADING" -->``, replaced by the
  table under that heading in the file as it is now.
* **The NOTE index.** ``<!-- notes-index -->`` on the architecture page becomes the list of every
  ``# NOTE [ name ]`` block in the packages: where it is and its first sentence.
* **The rooms and the arrows.** ``<!-- rooms -->`` becomes every module of both packages with its
  docstring's first sentence and the modules it imports; ``<!-- layer-arrows -->`` the imports
  between the core's layers (the layer map is ``tests/test_imports.py``'s ``LAYERS``).
* **Sphinx roles.** The docstrings' ``:class:`~chainoffload.Timeline``` shows as code.

The functions below are plain Python and are what ``tests/test_docs.py`` checks; the ``on_*``
functions at the end are MkDocs' hook events.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PACKAGES = ("chainoffload", "chainoffload_torch")
FILES_DIR = "results/files"  # where the results files' pages go in the site

# A NOTE block opens with its header alone on a line, in one of two forms: a comment,
# "# NOTE [ name ]", followed by more comment lines (its text); or, in a docstring, "NOTE [ name ]"
# underlined with dashes. A line that goes on after the bracket ("# NOTE [ name ]: so ...") or
# stands alone over code cites a block, it does not open one.
NOTE_HEADER = re.compile(r"^\s*# NOTE \[ (.+?) \]\s*$")
NOTE_DOC_HEADER = re.compile(r"^(?:.*\s)?NOTE \[ (.+?) \]\s*$")
DASHES = re.compile(r"^\s*(#\s*)?-{3,}\s*$")
NOTE_CITED = re.compile(r"NOTE \[ (.+?) \]")
INCLUDE = re.compile(r"^<!-- include (\S+) \"([^\"]+)\" -->$", re.M)
NOTES_MARK = "<!-- notes-index -->"


@dataclass(frozen=True)
class Note:
    """One ``# NOTE [ name ]`` block: its name, file (relative to the root), line and gist."""

    name: str
    path: str
    line: int
    gist: str


def _first_sentence(text: str, limit: int = 240, stops: str = ".:;") -> str:
    """The first sentence of ``text`` (up to one of ``stops``), reST roles made Markdown code."""
    text = " ".join(text.split())
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")
    m = re.search(rf"(.+?[{re.escape(stops)}])(\s|$)", text)
    out = m.group(1) if m else text
    return out if len(out) <= limit else out[: limit - 3].rstrip() + "..."


def _note_at(lines: list[str], i: int) -> tuple[str, list[str]] | None:
    """``(name, text lines)`` when line ``i`` opens a NOTE block, else None."""
    following = lines[i + 1:]
    m = NOTE_HEADER.match(lines[i])
    if m and following and following[0].strip().startswith("#") and following[0].strip() != "#":
        body = []
        for nxt in following:
            stripped = nxt.strip()
            if not stripped.startswith("#") or stripped == "#":
                break
            body.append(stripped.lstrip("#").strip())
        return m.group(1), body
    m = NOTE_DOC_HEADER.match(lines[i])
    if m and following and DASHES.match(following[0]) and not lines[i].lstrip().startswith("#"):
        body = []
        for nxt in following[1:]:
            if not nxt.strip() or DASHES.match(nxt):
                break
            body.append(nxt.strip())
        return m.group(1), body
    return None


def notes(root: Path = ROOT) -> list[Note]:
    """Every NOTE block of the packages under ``root``, in file and line order."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            lines = path.read_text().splitlines()
            for i in range(len(lines)):
                at = _note_at(lines, i)
                if at is not None:
                    body = [line for line in at[1] if not DASHES.match(line)]
                    found.append(Note(at[0], path.relative_to(root).as_posix(), i + 1, _first_sentence(" ".join(body))))
    return found


def cited_notes(root: Path = ROOT) -> dict[str, list[str]]:
    """Every NOTE name the packages cite (headers included), with the ``path:line`` citing it."""
    cited: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            for i, line in enumerate(path.read_text().splitlines(), 1):
                for name in NOTE_CITED.findall(line):
                    cited.setdefault(name, []).append(f"{path.relative_to(root).as_posix()}:{i}")
    return cited


def notes_markdown(root: Path = ROOT) -> str:
    """The NOTE index as a Markdown table, grouped by file."""
    rows = ["| NOTE | where | what it says first |", "|---|---|---|"]
    for note in notes(root):
        gist = note.gist.replace("|", "\\|")
        rows.append(f"| `{note.name}` | `{note.path}:{note.line}` | {gist} |")
    return "\n".join(rows) + "\n"


def results_files() -> list[Path]:
    """The Markdown files of ``benchmarks/results/``, sorted by name."""
    return sorted(RESULTS.glob("*.md"))


def title_of(text: str, fallback: str) -> str:
    """A results file's first heading, or ``fallback``."""
    m = re.search(r"^#+ (.+)$", text, re.M)
    return m.group(1).strip() if m else fallback


def section(text: str, heading: str) -> str:
    """The first Markdown table, or fenced block, after the line of ``text`` that starts with
    ``heading`` (whichever comes first)."""
    lines = text.splitlines()
    at = next((i for i, line in enumerate(lines) if line.startswith(heading)), None)
    if at is None:
        raise ValueError(f"no line starting with {heading!r}")
    first = next((i for i in range(at, len(lines)) if lines[i].startswith(("|", "```"))), None)
    if first is None:
        raise ValueError(f"no table or fenced block after {heading!r}")
    if lines[first].startswith("```"):
        end = next(i for i in range(first + 1, len(lines)) if lines[i].startswith("```")) + 1
    else:
        end = first
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
    return "\n".join(lines[first:end]) + "\n"


def expand_includes(markdown: str, root: Path = ROOT, page_depth: int = 1) -> str:
    """Replace every include marker with the table it names, read from the file now; the link
    to the file's page is relative to a page ``page_depth`` folders below the site's root."""

    def table(m: re.Match) -> str:
        source = root / m.group(1)
        quoted = section(source.read_text(), m.group(2))
        name = Path(m.group(1)).name
        link = "/".join([".."] * page_depth + ["results", "files", name])
        return f"{quoted}\n*From [`{m.group(1)}`]({link}), as that file says it now.*\n"

    return INCLUDE.sub(table, markdown)


def results_page(path: Path) -> str:
    """The site page of one results file: a line saying where it comes from, then the file."""
    text = path.read_text()
    # A file that opens with a lower heading (or none) gets a title, so that every page has one.
    body = text if text.lstrip().startswith("# ") else f"# {title_of(text, path.stem)}\n\n{text}"
    head, _, rest = body.partition("\n")
    source = f"`benchmarks/results/{path.name}`"
    return f"{head}\n\n!!! note \"Generated from {source}\"\n    This page is that file as committed; the command it names regenerates it.\n{rest}"


def results_index() -> str:
    """The index page of every results file."""
    rows = ["# Every results file", "",
            "Each benchmark writes its results to `benchmarks/results/`, with the command and the",
            "machine's load; every one of those files is a page here, generated at build time.", "",
            "| file | title |", "|---|---|"]
    for path in results_files():
        rows.append(f"| [`{path.name}`]({path.name}) | {title_of(path.read_text(), path.stem)} |")
    return "\n".join(rows) + "\n"


# -- The rooms: every module, its layer, what it does, what it imports -------------------------

ROOMS_MARK = "<!-- rooms -->"
LAYER_MAP = ROOT / "tests" / "test_imports.py"  # the layer map the import test holds the core to


def layers() -> dict[str, list[str]]:
    """``LAYERS`` of ``tests/test_imports.py`` (read, not imported: the docs build needs no pytest)."""
    for node in ast.parse(LAYER_MAP.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "LAYERS" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def _layer(name: str, table: dict[str, list[str]]) -> str:
    for layer, names in table.items():
        if any(name == n or (n.endswith(".*") and name.startswith(n[:-1])) for n in names):
            return layer
    return ""


@dataclass(frozen=True)
class Room:
    """One module: its dotted name, layer (core only), gist and the package modules it imports."""

    module: str
    layer: str
    gist: str
    imports: tuple[str, ...]


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _run_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` that can run: ``ast.walk`` less the bodies of ``if TYPE_CHECKING:``
    (imports for annotations only, as ``tests/test_imports.py`` leaves them out too)."""
    out, todo = [], [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in (getattr(node.test, "id", None), getattr(node.test, "attr", None)):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def rooms(root: Path = ROOT) -> list[Room]:
    """Every module of the two packages, with every import of a sibling module it makes (at module
    level or inside a function, not under ``if TYPE_CHECKING:``; ``_kernels.lazy("name")`` counts
    as importing that kernel)."""
    paths = {_module_name(p, root): p for package in PACKAGES for p in sorted((root / package).rglob("*.py"))}
    table = layers()
    out = []
    for name, path in paths.items():
        tree = ast.parse(path.read_text())
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in _run_nodes(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")
                    up = up[: len(up) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in paths else base)
            elif (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "lazy"
                  and node.args and isinstance(node.args[0], ast.Constant)):
                targets = [f"chainoffload._kernels.{node.args[0].value}"]
            for target in targets:
                while target and target not in paths:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    found.add(target)
        doc = ast.get_docstring(tree) or ""
        out.append(Room(name, _layer(name, table), _first_sentence(doc.split("\n\n")[0], stops="."), tuple(sorted(found))))
    return out


ARROWS_MARK = "<!-- layer-arrows -->"


def layer_arrows(root: Path = ROOT) -> list[tuple[str, str, list[str]]]:
    """``(from layer, to layer, [module -> module, ...])`` for every import between two different
    layers of the core, in layer order; an arrow that points up is a break of the layer map."""
    table = layers()
    order = list(table)
    found: dict[tuple[str, str], list[str]] = {}
    for room in rooms(root):
        if not room.layer:
            continue
        for target in room.imports:
            layer = _layer(target, table)
            if layer and layer != room.layer:
                found.setdefault((room.layer, layer), []).append(f"{room.module} -> {target}")
    return [(a, b, sorted(found[a, b])) for a, b in sorted(found, key=lambda k: (order.index(k[0]), order.index(k[1])))]


def arrows_markdown(root: Path = ROOT) -> str:
    """The arrows between the core's layers as a Markdown table."""
    order = list(layers())
    text = ["| from | to | direction | imports |", "|---|---|---|---|"]
    for a, b, edges in layer_arrows(root):
        way = "down" if order.index(b) < order.index(a) else "**up**"
        shown = ", ".join(f"`{e}`" for e in edges[:4]) + (f" and {len(edges) - 4} more" if len(edges) > 4 else "")
        text.append(f"| {a} | {b} | {way} | {shown} |")
    return "\n".join(text) + "\n"


def _relative(module: str, package: str) -> str:
    """``module`` named relative to ``package`` (``.chain``) when inside it."""
    return "." + module[len(package) + 1:] if module.startswith(package + ".") else module


def rooms_markdown(root: Path = ROOT) -> str:
    """The rooms as Markdown tables, one per package; the core's in layer order, lowest first."""
    table = layers()
    order = {layer: i for i, layer in enumerate(table)}
    every = rooms(root)
    text = []
    for package in PACKAGES:
        mine = [r for r in every if r.module == package or r.module.startswith(package + ".")]
        mine.sort(key=lambda r: (order.get(r.layer, len(order)), r.module) if package == "chainoffload" else r.module)
        layer_col = package == "chainoffload"
        text.append(f"### `{package}`\n")
        text.append(f"Names starting with a dot are inside `{package}`.\n")
        text.append("| layer | module | what it does | imports |" if layer_col else "| module | what it does | imports |")
        text.append("|---|---|---|---|" if layer_col else "|---|---|---|")
        for r in mine:
            imports = ", ".join(f"`{_relative(m, package)}`" for m in r.imports) or "-"
            gist = r.gist.replace("|", "\\|")
            cells = ([r.layer or "-"] if layer_col else []) + [f"`{_relative(r.module, package)}`", gist, imports]
            text.append("| " + " | ".join(cells) + " |")
        text.append("")
    return "\n".join(text)


# -- Sphinx roles in the docstrings ----------------------------------------------------------

# The docstrings cite objects the Sphinx way (":class:`~chainoffload.Timeline`"), which Markdown
# renders as ":class:" before the code; the site shows the code alone, "~" keeping the last name.
SPHINX_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):<code>(~?)([^<]*)</code>")


def plain_roles(html: str) -> str:
    """``html`` with Sphinx roles before inline code removed (``~a.b.c`` shown as ``c``)."""
    return SPHINX_ROLE.sub(lambda m: f"<code>{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}</code>", html)


# -- MkDocs hook events ---------------------------------------------------------------------


def on_files(files, config):
    from mkdocs.structure.files import File

    files.append(File.generated(config, f"{FILES_DIR}/index.md", content=results_index()))
    for path in results_files():
        files.append(File.generated(config, f"{FILES_DIR}/{path.name}", content=results_page(path)))
    for path in sorted(RESULTS.glob("*.png")):
        files.append(File.generated(config, f"{FILES_DIR}/{path.name}", abs_src_path=str(path)))
    return files


def on_page_markdown(markdown, page, config, files):
    if NOTES_MARK in markdown:
        markdown = markdown.replace(NOTES_MARK, notes_markdown())
    if ROOMS_MARK in markdown:
        markdown = markdown.replace(ROOMS_MARK, rooms_markdown())
    if ARROWS_MARK in markdown:
        markdown = markdown.replace(ARROWS_MARK, arrows_markdown())
    return expand_includes(markdown, page_depth=page.file.src_uri.count("/"))


def on_page_content(html, page, config, files):
    return plain_roles(html)
