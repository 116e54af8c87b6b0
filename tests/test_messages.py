"""A message a user sees stands alone (issue 34): it says what happened and what to do, never
"see NOTE [ ... ]", a source file or a module path the user would have to read the code to find.

Every string literal of the two packages is scanned, docstrings and comments apart (those are
for readers of the code, where NOTE citations belong): not only those written inside a ``raise``
or ``warnings.warn`` call, since messages are often built in a variable first (``why = ...``)."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("chainoffload", "chainoffload_torch")

# A citation a user cannot follow without the source: a NOTE, a Python file, a path into a package.
CITATION = re.compile(r"NOTE \[|\bsee chainoffload|\b[\w/]+\.py\b|\bchainoffload(_torch)?/[\w/]+")

# Literals that match but are no message: each with why.
NOT_MESSAGES = {
    # chainoffload_torch/_instrument.py: the frame file torch.compile's wrapper runs in, compared
    # against stack frames to tell a compiled call.
    "eval_frame.py",
}


def docstrings(tree):
    """The ``Constant`` nodes that are docstrings (module, class, function)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


def citations(source, name="<source>"):
    """``(line, text)`` of every non-docstring string literal in ``source`` that cites the code."""
    tree = ast.parse(source, name)
    skip = docstrings(tree)
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
            and node.value not in NOT_MESSAGES and CITATION.search(node.value)]


def test_the_scan_finds_citations_in_messages_and_leaves_docstrings():
    source = '''
"""Module docstring: NOTE [ fine here ] and chainoffload/solvers/best.py."""
import warnings

def f(x):
    """Docstring (NOTE [ also fine ])."""
    why = f"the simulator rejected it (NOTE [ cpsat: time scale ])"
    if x:
        raise ValueError(f"x: {x} is bad, see chainoffload_torch/plans.py")
    warnings.warn("look in api.py", RuntimeWarning)
    raise ValueError("memory: 5 B is below the floor of 10 B; give at least 10 B")
'''
    found = [text for _, text in citations(source)]
    assert len(found) == 3 and not any("fine" in text for text in found)
    assert "memory: 5 B" not in " ".join(found)


def test_no_message_cites_a_note_or_a_source_file():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found += [f"{path.relative_to(ROOT)}:{line}: {text!r}" for line, text in citations(path.read_text(), str(path))]
    assert not found, ("user-facing strings that cite the source (say what happened and what to do, and the docs "
                       "page if any, instead):\n" + "\n".join(found))
