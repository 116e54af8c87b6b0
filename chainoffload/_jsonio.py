"""JSON text and file I/O shared by Chain, Platform and Schedule (one place for the error wording),
and :func:`atomic_write`, through which every file the library and the CLI write goes."""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np


def is_number(v: Any) -> bool:
    """A JSON number or its numpy equivalent; a bool is not one (``true`` is not ``1``)."""
    return not isinstance(v, (bool, np.bool_)) and isinstance(v, (int, float, np.integer, np.floating))


class TargetError(OSError):
    """A path that must not be written to (a device, a folder): refused before anything is written."""


def check_target(path: str | os.PathLike[str]) -> None:
    """Raise :class:`TargetError` unless ``path`` is absent or a regular file (links followed).

    ``os.replace`` would swap a device node such as ``/dev/null`` for a regular file (as root,
    for every other process too); a folder could not be replaced and would fail late.
    """
    target = os.fspath(path)
    if target == "":
        raise TargetError(errno.ENOENT, "empty path: name the file to write")
    try:
        st = os.stat(target)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise TargetError(exc.errno, f"cannot write {target}: {exc.strerror}") from None
    if stat.S_ISREG(st.st_mode):
        return
    kind = (
        "a folder" if stat.S_ISDIR(st.st_mode)
        else "a character device" if stat.S_ISCHR(st.st_mode)
        else "a block device" if stat.S_ISBLK(st.st_mode)
        else "a named pipe" if stat.S_ISFIFO(st.st_mode)
        else "a socket" if stat.S_ISSOCK(st.st_mode)
        else "not a regular file"
    )
    raise TargetError(errno.EEXIST, f"{target} is {kind}, not a regular file: refusing to replace it")


class PendingWrite:
    """A file written beside its target but not yet in place: :meth:`fill` writes it,
    :meth:`commit` renames it over the target, :meth:`discard` removes it. Split in two so that a caller (the CLI) can do
    something that may still fail, such as writing stdout, after the slow writing and before the
    one step that cannot be taken back.

    The new content lives in a private folder beside the target (same file system, so the rename
    cannot cross one), under the target's own name (writers that pick the format from the
    extension see the right one). A folder rather than a lone temporary file: :meth:`discard`
    may run in another thread while ``write`` is still running (Ctrl-C in the CLI), and once the
    folder is gone a late ``open`` by the writer fails instead of leaving a stray file behind.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.target = os.fspath(path)
        check_target(self.target)
        # Links are followed: the file a link points to is replaced and the link stays a link.
        self._real = os.path.realpath(self.target)
        folder, name = os.path.split(self._real)
        try:
            self._folder = tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot write {self.target}: {exc.strerror}") from None
        self._tmp = os.path.join(self._folder, name)

    def fill(self, write: Callable[[str], None]) -> None:
        """Run ``write(tmp)``, which creates the new content at ``tmp``, and flush it to disk."""
        try:
            write(self._tmp)
            if not os.path.isfile(self._tmp):
                raise OSError(errno.ENOENT, "the writer produced no file")
            with open(self._tmp, "rb+") as fh:
                os.fsync(fh.fileno())
            try:  # a file that is replaced keeps its mode; a new one has the umask's (open's default)
                os.chmod(self._tmp, stat.S_IMODE(os.stat(self._real).st_mode))
            except FileNotFoundError:
                pass
        except BaseException as exc:
            self.discard()
            if isinstance(exc, OSError):
                raise OSError(exc.errno, f"cannot write {self.target}: {exc.strerror or exc}") from None  # names the file, not the temporary
            raise

    def commit(self) -> None:
        """Rename the new content over the target (checked again: it may have changed since)."""
        try:
            check_target(self._real)
            os.replace(self._tmp, self._real)
        except BaseException as exc:
            self.discard()
            if isinstance(exc, TargetError):
                raise
            if isinstance(exc, OSError):
                raise OSError(exc.errno, f"cannot write {self.target}: {exc.strerror or exc}") from None
            raise
        self.discard()
        _fsync_folder(os.path.dirname(self._real))

    def discard(self) -> None:
        """Remove the private folder and whatever is in it; safe to call twice, or from another
        thread while ``write`` runs."""
        for _ in range(100):  # a writer still running may add an entry between the two steps
            try:
                for entry in os.listdir(self._folder):
                    try:
                        os.unlink(os.path.join(self._folder, entry))
                    except FileNotFoundError:
                        pass
                os.rmdir(self._folder)
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if exc.errno != errno.ENOTEMPTY:
                    return


def _fsync_folder(folder: str) -> None:
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


def atomic_write(path: str | os.PathLike[str], write: Callable[[str], None]) -> None:
    """Write a file so that ``path`` holds either its old content or the whole new one.

    ``write(tmp)`` creates the new content at a temporary path ``tmp`` beside ``path`` (same
    folder, same file name, for writers that pick the format from the extension); the file is
    then flushed to disk and renamed over ``path``. A new file gets the mode ``open`` gives
    (0666 less the umask), a replaced one keeps its mode; a link is followed. On any error the
    temporary file is removed and ``path`` is left as it was; an :class:`OSError` names
    ``path``, and a target that is not a regular file (``/dev/null``, a folder) is refused with
    :class:`TargetError` before ``write`` runs.
    """
    pending = PendingWrite(path)
    pending.fill(write)
    pending.commit()


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
