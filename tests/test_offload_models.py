"""benchmarks/offload_models.py's search for the least memory offload() accepts."""

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _script():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("offload_models", BENCH / "offload_models.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def test_least_accepted_finds_the_threshold_and_tries_the_floor_first():
    script = _script()
    calls = []

    def accepts_from(threshold):
        def accepts(memory):
            calls.append(memory)
            return memory >= threshold
        return accepts

    assert script.least_accepted(accepts_from(1000), 1000, 5000) == 1000 and calls == [1000]
    calls.clear()
    found = script.least_accepted(accepts_from(1010), 1000, 5000)
    assert 1010 <= found <= 1010 * (1 + script.BISECT_TOL) + 1
    assert calls[:2] == [1000, 1020]  # the floor, then the floor + 2 %
    found = script.least_accepted(accepts_from(3333), 1000, 5000)
    assert 3333 <= found <= 3333 * (1 + script.BISECT_TOL) + 1
    assert script.least_accepted(accepts_from(6000), 1000, 5000) is None
    with pytest.raises(ValueError, match="floor, top"):
        script.least_accepted(accepts_from(1), 10, 5)


def test_splice_puts_rerun_rows_in_place_and_counts_the_summary_from_the_table():
    script = _script()
    rows = [
        {
            "model": name, "blocks": "8: a .. b", "keep_all": 1000, "cover": 0.9, "least": 600, "moved": 10, "moved_is_plan": True,
            "equal": True, "setup": 0.5, "least_any": least, "least_method": "rotor", "floor": 400, "said": said,
            "trained": {"30 %": {"memory": 300, "refused": True}},
        }
        for name, least, said in (("gpt2", 400, []), ("bert", 500, ["note of bert"]), ("resnet", 400, []))
    ]
    old = script.table(rows) + "\n\n" + script.summary(rows) + "\n\ntiming\n"
    assert "within 2 % of the floor for any schedule: 2 of 3 rows" in old
    rows[1] = {**rows[1], "least_any": 404, "said": ["new note of bert"], "trained": {
        "30 %": {"memory": 300, "refused": False, "method": "rotor", "equal": True, "moved_is_plan": True, "moved": 0, "recomputes": True}}}
    new = script.splice(old, [rows[1]], "rerun: bert")
    assert "within 2 % of the floor for any schedule: 3 of 3 rows" in new
    assert (
        "At 30 %: 1 trained torch.equal with the plan's bytes moved (1 of them recomputing), 2 refused "
        "(2 of them below the floor for any schedule, where no schedule fits), 0 raised."
    ) in new
    assert "- bert: new note of bert" in new and "- bert: note of bert" not in new
    assert new.count("| gpt2 |") == new.count("| bert |") == 1 and "\n\nrerun: bert\n\ntiming\n" in new


def _bench(name):
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def test_never_recomputed_names_every_block_under_a_parent_side_residual():
    line = _bench("never_recomputed").row("parent-residual")
    # The parent's adds are stages of their own (NOTE [ the code after a block as a stage ]): the
    # blocks are recomputable, the adds are not.
    assert line.startswith(
        "- parent-residual (15 stages): the code after a block, before the next one: no module call to run again: "
        "stages 2, 4, 6, 8, 10, 12, 14 ("
    )
    assert "the last block, with the head and the loss: stage 15 (" in line


def test_fuzz_recomputed_stages_counts_a_plan_that_recomputes_the_prefix(tmp_path, capsys):
    import json

    from test_torch_fuzz_regressions import SPEC_4579

    record = {"kind": "equal", "recomputations": 5, "memory": 0.42, "method": "recompute-all", "spec": repr(SPEC_4579)}
    path = tmp_path / "fuzz.jsonl"
    path.write_text(json.dumps(record) + "\n" + json.dumps({**record, "kind": "refused"}) + "\n")
    assert _bench("fuzz_recomputed_stages").main([str(path)]) == 0
    out = capsys.readouterr().out
    assert out.strip() == "1 models trained equal with a recomputing plan; 1 of them recompute stage 1, the code before the first block"
