"""The benchmarks' model builders (``benchmarks/torch_models.py``) for the tests: ``benchmarks/``
is no package, so the module is loaded from its path, once, and shared by every test file."""

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "torch_models.py"

torch_models = sys.modules.get("torch_models")
if torch_models is None or getattr(torch_models, "__file__", None) != str(_PATH):
    _spec = importlib.util.spec_from_file_location("torch_models", _PATH)
    torch_models = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(torch_models)
