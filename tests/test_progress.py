"""Progress on stderr (chainoffload/_progress.py) and the one-line compile notice."""

from chainoffload import _progress


def test_off_draws_nothing(capsys):
    _progress.configure(False)
    try:
        with _progress.progress("work", total=3) as bar:
            bar.update(1)
            bar.set(2.5)
            bar.note(x=1)
        _progress.note_once("hello")
    finally:
        _progress.configure(None)
    assert capsys.readouterr().err == ""


def test_on_draws_a_bar_on_stderr(capsys):
    _progress.configure(True)
    try:
        with _progress.progress("work", total=4, unit="s") as bar:
            bar.set(4)
        _progress.note_once("a line only once")
        _progress.note_once("a line only once")
    finally:
        _progress.configure(None)
    err = capsys.readouterr().err
    assert "work" in err and err.count("a line only once") == 1


def test_configure_rejects_other_values():
    import pytest

    with pytest.raises(ValueError, match="progress"):
        _progress.configure("yes")
