"""JSON text and file I/O shared by Chain, Platform and Schedule (one place for the error wording)."""

from __future__ import annotations

import json
import os
from typing import Any, ClassVar


class JsonIO:
    """Mixin: ``to_json``/``from_json``/``save``/``load`` over ``to_dict``/``from_dict``.

    Subclasses set ``_json_label`` (the word error messages start with) and ``_json_error``
    (the ValueError subclass raised for malformed input).
    """

    _json_label: ClassVar[str]
    _json_error: ClassVar[type[ValueError]]

    def to_dict(self) -> dict[str, Any]:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    @classmethod
    def from_dict(cls, data: Any) -> Any:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    def to_json(self, *, indent: int | None = 1) -> str:
        """This object as a JSON string."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str):
        """Parse from a JSON string; malformed JSON raises with line and column."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise cls._json_error(
                f"{cls._json_label}: malformed JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
            ) from None
        return cls.from_dict(data)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write as JSON to ``path``."""
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(self.to_json())
            fh.write("\n")

    @classmethod
    def load(cls, path: str | os.PathLike[str]):
        """Read from a JSON file; errors name the file."""
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise cls._json_error(f"{cls._json_label}: cannot read {os.fspath(path)!r}: {exc.strerror}") from None
        try:
            return cls.from_json(text)
        except cls._json_error as exc:
            raise cls._json_error(f"{os.fspath(path)}: {exc}") from None
