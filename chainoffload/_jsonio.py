"""JSON text and file I/O shared by Chain, Platform and Schedule (one place for the error wording),
and :func:`atomic_write`, through which every file the library and the CLI write goes."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Callable, ClassVar

import numpy as np


def is_number(v: Any) -> bool:
    """A JSON number or its numpy equivalent; a bool is not one (``true`` is not ``1``)."""
    return not isinstance(v, (bool, np.bool_)) and isinstance(v, (int, float, np.integer, np.floating))


def atomic_write(path: str | os.PathLike[str], write: Callable[[str], None]) -> None:
    """Write a file so that ``path`` holds either its old content or the whole new one.

    ``write(tmp)`` writes the new content to a temporary file beside ``path`` (same folder, so
    the rename cannot cross file systems; same extension, for writers that pick the format from
    it); the file is then flushed to disk and renamed over ``path``. On any error the temporary
    file is removed and ``path`` is left as it was; an :class:`OSError` names ``path``.
    """
    target = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(target))
    suffix = os.path.splitext(name)[1]
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=f".tmp{suffix}", dir=folder)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot write {target}: {exc.strerror}") from None
    try:
        os.close(fd)
        write(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise OSError(exc.errno, f"cannot write {target}: {exc.strerror or exc}") from None  # names the file, not the temporary
        raise
    try:  # make the rename itself durable; not every file system lets a folder be opened
        dir_fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """:func:`atomic_write` of a UTF-8 text."""

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)

    atomic_write(path, write)


class DuplicateKeyError(ValueError):
    """A JSON object that names a key twice (``json`` would silently keep the last value)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(key)
        out[key] = value
    return out


def loads(text: str) -> Any:
    """``json.loads`` that refuses a key given twice in one object (:class:`DuplicateKeyError`):
    which of two values counts is no reading a file should leave to chance."""
    return json.loads(text, object_pairs_hook=_unique_keys)


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
            data = loads(text)
        except DuplicateKeyError as exc:
            raise cls._json_error(f"{cls._json_label}: duplicate key {exc.args[0]!r} in a JSON object (each key may appear once)") from None
        except json.JSONDecodeError as exc:
            raise cls._json_error(
                f"{cls._json_label}: malformed JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
            ) from None
        except RecursionError:
            raise cls._json_error(f"{cls._json_label}: malformed JSON (nested too deeply)") from None
        return cls.from_dict(data)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write as JSON to ``path``, atomically (:func:`atomic_write`)."""
        write_text(path, self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike[str]):
        """Read from a JSON file; errors name the file."""
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise cls._json_error(f"{cls._json_label}: cannot read {os.fspath(path)!r}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise cls._json_error(f"{cls._json_label}: cannot read {os.fspath(path)!r}: not UTF-8 text (byte {exc.start})") from None
        try:
            return cls.from_json(text)
        except cls._json_error as exc:
            raise cls._json_error(f"{os.fspath(path)}: {exc}") from None
