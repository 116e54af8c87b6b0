"""``python -m chainoffload`` runs the command line."""

from .cli import console

console()
