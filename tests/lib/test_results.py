"""Tests of lib.results: recorded numbers, the ci/full entries, the scratch-folder overlay, tables."""
from __future__ import annotations

import json
import math
import os
import subprocess
from datetime import datetime, timezone

import numpy as np
import pytest
import torch

from lib import config, device, results


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    """A private 'committed' results folder and a scratch folder; COURSE_RESULTS_DIR unset."""
    committed = tmp_path / "committed"
    scratch = tmp_path / "scratch"
    monkeypatch.setattr(results, "COMMITTED_DIR", committed)
    monkeypatch.delenv(results.ENV_VAR, raising=False)
    monkeypatch.delenv(results.CI_ENV_VAR, raising=False)
    monkeypatch.delenv("COURSE_MODE", raising=False)
    return committed, scratch


def hp(mode):
    return config.recipe(ci=dict(epochs=1, lr=1e-3, name="tiny"), full=dict(epochs=20, lr=3e-4, name="base"),
                         mode_=mode)


def test_record_round_trip(dirs):
    committed, _ = dirs
    metrics = {"val_loss": 1.25, "steps": 300, "sample": "to be or not",
               "acc": {"pos": 0.9, "neg": np.float32(0.5)}, "curve": [3.0, 2.0, torch.tensor(1.5)]}
    before = datetime.now(timezone.utc).replace(microsecond=0)
    file = results.record("03_demo", metrics, hp("full"), notes="first run")
    assert file == committed / "03_demo.json"
    on_disk = json.loads(file.read_text())
    assert set(on_disk) == {"full"}
    entry = results.load("03_demo")["full"]
    assert entry["metrics"] == {"val_loss": 1.25, "steps": 300, "sample": "to be or not",
                                "acc": {"pos": 0.9, "neg": 0.5}, "curve": [3.0, 2.0, 1.5]}
    assert entry["hparams"] == {"epochs": 20, "lr": 3e-4, "name": "base"}
    assert entry["device"] == device.summary()
    assert entry["notes"] == "first run"
    date = datetime.fromisoformat(entry["date"])
    assert date.tzinfo is not None and before <= date <= datetime.now(timezone.utc)
    git = subprocess.run(["git", "-C", str(results.REPO), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    assert entry["commit"] == (git.stdout.strip() if git.returncode == 0 else "unknown")
    assert entry["dirty"] in (True, False, None)
    assert results.full("03_demo") == entry["metrics"]


def test_only_the_active_mode_is_replaced(dirs):
    committed, _ = dirs
    results.record("04_demo", {"loss": 2.0}, hp("ci"))
    results.record("04_demo", {"loss": 0.5, "bleu": 27.3}, hp("full"))
    full_before = json.loads((committed / "04_demo.json").read_text())["full"]
    results.record("04_demo", {"loss": 1.75}, hp("ci"), notes="again")
    data = json.loads((committed / "04_demo.json").read_text())
    assert data["full"] == full_before  # untouched, date and all
    assert data["ci"]["metrics"] == {"loss": 1.75} and data["ci"]["notes"] == "again"
    assert data["ci"]["hparams"]["epochs"] == 1


@pytest.mark.parametrize("bad,exc,where", [
    ({"loss": float("nan")}, ValueError, "loss"),
    ({"acc": {"pos": float("inf")}}, ValueError, "pos"),
    ({"curve": [1.0, -math.inf]}, ValueError, "curve"),
    ({"loss": torch.tensor(float("nan"))}, ValueError, "loss"),
    ({"model": object()}, TypeError, "model"),
    ({"t": torch.ones(3)}, TypeError, "tolist"),
    ({"none": None}, TypeError, "none"),
    ({1: 2.0}, TypeError, "key"),
    ({}, ValueError, "non-empty"),
])
def test_bad_metrics_are_rejected(dirs, bad, exc, where):
    committed, _ = dirs
    results.record("05_demo", {"loss": 1.0}, hp("ci"))
    before = (committed / "05_demo.json").read_bytes()
    with pytest.raises(exc, match=where):
        results.record("05_demo", bad, hp("ci"))
    assert (committed / "05_demo.json").read_bytes() == before


def test_bad_chapter_and_recipe(dirs):
    for name in ("", "../escape", "a/b", None):
        with pytest.raises(ValueError, match="chapter"):
            results.record(name, {"x": 1.0}, hp("ci"))
    with pytest.raises(TypeError, match="recipe"):
        results.record("06_demo", {"x": 1.0}, {"mode": "ci"})


def test_scratch_folder_overlays_committed_results(dirs, monkeypatch):
    committed, scratch = dirs
    results.record("07_demo", {"loss": 2.0}, hp("ci"))                # committed ci
    results.record("07_demo", {"loss": 0.5}, hp("full"))              # committed full
    committed_bytes = (committed / "07_demo.json").read_bytes()

    monkeypatch.setenv(results.ENV_VAR, str(scratch))
    assert results.results_dir() == scratch
    file = results.record("07_demo", {"loss": 1.5}, hp("ci"))        # a CI run writes to scratch only
    assert file == scratch / "07_demo.json"
    assert (committed / "07_demo.json").read_bytes() == committed_bytes
    assert set(json.loads(file.read_text())) == {"ci"}
    data = results.load("07_demo")
    assert data["ci"]["metrics"] == {"loss": 1.5}     # the scratch entry wins ...
    assert data["full"]["metrics"] == {"loss": 0.5}   # ... and the committed full entry shows through
    assert results.full("07_demo") == {"loss": 0.5}

    # a chapter only recorded in scratch, and one recorded nowhere
    results.record("08_demo", {"acc": 0.75}, hp("ci"))
    assert results.load("08_demo")["ci"]["metrics"] == {"acc": 0.75}
    assert results.full("08_demo") is None
    assert results.load("09_nothing") == {}

    # pointing the variable at the committed folder itself reads it once
    monkeypatch.setenv(results.ENV_VAR, str(committed))
    assert results.load("07_demo")["ci"]["metrics"] == {"loss": 2.0}


def test_table_live_and_recorded(dirs, monkeypatch):
    monkeypatch.setenv("COURSE_MODE", "ci")
    results.record("10_demo", {"loss": 0.523456, "acc": {"pos": 0.91, "neg": 0.88}, "steps": 20000},
                   hp("full"))
    results.record("10_demo", {"loss": 1.9, "acc": {"pos": 0.6}}, hp("ci"))
    entry = results.load("10_demo")["full"]

    live = {"loss": 1.7, "acc": {"pos": 0.65, "neg": 0.55}, "tokens_per_s": 12345.6}
    df = results.table("10_demo", live=live)
    full_col = f"full recipe ({entry['device'].split('device=')[1].split(' |')[0]}, {entry['date'][:10]})"
    assert list(df.columns) == [full_col, "this run (ci)"]
    assert list(df.index) == ["loss", "acc.pos", "acc.neg", "steps", "tokens_per_s"]
    assert df.loc["loss", full_col] == "0.5235" and df.loc["loss", "this run (ci)"] == "1.7"
    assert df.loc["acc.neg", full_col] == "0.88" and df.loc["acc.neg", "this run (ci)"] == "0.55"
    assert df.loc["steps", full_col] == "20000" and df.loc["steps", "this run (ci)"] == "—"
    assert df.loc["tokens_per_s", full_col] == "—" and df.loc["tokens_per_s", "this run (ci)"] == "12346"
    assert "07_demo" not in df.attrs["caption"] and "10_demo.json" in df.attrs["caption"]
    assert entry["commit"] in df.attrs["caption"]

    # without live numbers, the recorded ci entry is the second column
    df2 = results.table("10_demo")
    assert df2.columns[1].startswith("recorded ci (")
    assert df2.loc["loss"].tolist() == ["0.5235", "1.9"]
    assert df2.loc["acc.neg"].tolist() == ["0.88", "—"]

    # nothing recorded: only the live column
    df3 = results.table("11_none", live={"x": 2})
    assert list(df3.columns) == ["this run (ci)"] and df3.loc["x"].tolist() == ["2"]
    assert "no results recorded" in results.table("11_none").attrs["caption"]
    with pytest.raises(ValueError, match="live"):
        results.table("10_demo", live={"x": float("nan")})


def test_show_prints_caption_and_table(dirs, capsys):
    committed, _ = dirs
    results.record("12_demo", {"loss": 0.25}, hp("full"))
    results.show("12_demo", live={"loss": 0.5})
    out = capsys.readouterr().out
    first, *rest = out.splitlines()
    assert "12_demo.json" in first and "commit" in first and "device=" in first
    assert any(line.split()[:3] == ["loss", "0.25", "0.5"] for line in rest)


def test_write_is_atomic(dirs, monkeypatch):
    committed, _ = dirs
    results.record("13_demo", {"loss": 1.0}, hp("ci"))
    before = (committed / "13_demo.json").read_bytes()

    def crash(fd):
        raise OSError("power cut")

    monkeypatch.setattr(os, "fsync", crash)  # the new text is written, then the machine "dies"
    with pytest.raises(OSError, match="power cut"):
        results.record("13_demo", {"loss": 2.0}, hp("ci"))
    monkeypatch.undo()
    assert (committed / "13_demo.json").read_bytes() == before
    assert os.listdir(committed) == ["13_demo.json"]


def test_corrupt_file_is_reported_not_overwritten(dirs):
    committed, _ = dirs
    committed.mkdir(parents=True)
    (committed / "14_demo.json").write_text('{"ci": {"metrics": ')
    with pytest.raises(ValueError, match="14_demo.json"):
        results.record("14_demo", {"loss": 1.0}, hp("full"))
    assert (committed / "14_demo.json").read_text() == '{"ci": {"metrics": '
    (committed / "14_demo.json").write_text('{"gpu": {}}')
    with pytest.raises(ValueError, match="not a results file"):
        results.load("14_demo")


def test_ci_scratch_folder_takes_only_ci_runs(dirs, monkeypatch):
    # tools/env.sh sets COURSE_CI_RESULTS_DIR; a full run started from that shell (COURSE_MODE=full
    # set after sourcing it) must still write the committed file: decided at record time.
    committed, scratch = dirs
    monkeypatch.setenv(results.CI_ENV_VAR, str(scratch))
    assert results.results_dir("ci") == scratch and results.results_dir("full") == committed
    ci_file = results.record("09_demo", {"loss": 3.0}, hp("ci"))
    full_file = results.record("09_demo", {"loss": 1.0}, hp("full"))
    assert ci_file == scratch / "09_demo.json" and full_file == committed / "09_demo.json"
    assert set(json.loads(ci_file.read_text())) == {"ci"}
    assert set(json.loads(full_file.read_text())) == {"full"}
    assert repr(ci_file) == "RecordedFile('$COURSE_CI_RESULTS_DIR/09_demo.json')"
    data = results.load("09_demo")
    assert data["ci"]["metrics"] == {"loss": 3.0} and data["full"]["metrics"] == {"loss": 1.0}
    # a stale full entry in the CI scratch folder (written there by older scripts) never hides
    # the committed one
    stale = json.loads(ci_file.read_text())
    stale["full"] = dict(stale["ci"], metrics={"loss": 99.0})
    ci_file.write_text(json.dumps(stale))
    assert results.load("09_demo")["full"]["metrics"] == {"loss": 1.0}
    assert results.full("09_demo") == {"loss": 1.0}
    # an explicit COURSE_RESULTS_DIR still takes every run
    monkeypatch.setenv(results.ENV_VAR, str(committed / "elsewhere"))
    assert results.results_dir("full") == committed / "elsewhere"
    with pytest.raises(ValueError, match="mode must be one of"):
        results.results_dir("gpu")


def test_record_shows_its_file_without_the_machines_path(tmp_path, monkeypatch):
    # A chapter ends a cell with results.record(...): the published page shows the repr.
    monkeypatch.setattr(results, "COMMITTED_DIR", tmp_path / "committed")
    monkeypatch.delenv(results.CI_ENV_VAR, raising=False)
    monkeypatch.setenv(results.ENV_VAR, str(results.REPO / "_build" / "results-test-repr"))
    file = results.record("08_demo", {"loss": 1.0}, hp("ci"))
    try:
        assert isinstance(file, os.PathLike) and file.exists()
        assert repr(file) == "RecordedFile('_build/results-test-repr/08_demo.json')"
        monkeypatch.setenv(results.ENV_VAR, str(tmp_path / "scratch"))
        outside = results.record("08_demo", {"loss": 1.0}, hp("ci"))
        assert str(tmp_path) not in repr(outside)
        assert repr(outside) == "RecordedFile('$COURSE_RESULTS_DIR/08_demo.json')"
        assert outside == tmp_path / "scratch" / "08_demo.json"
    finally:
        file.unlink()
        file.parent.rmdir()


def test_stale_names_the_rows_a_recorded_run_has_and_lacks(dirs):
    assert results.stale("05_demo", {"loss": 1.0}) is None            # nothing recorded
    results.record("05_demo", {"loss": 2.0, "imdb": {"acc": 0.5}}, hp("full"))
    assert results.stale("05_demo", {"loss": 1.0, "imdb": {"acc": 0.7}}) is None
    note = results.stale("05_demo", {"loss": 1.0, "imdb_curve": {"seconds": 3}})
    assert note == ("the recorded full run predates this version of the page: its rows imdb come from sections "
                    "the page no longer has and it lacks imdb_curve")
    assert results.stale("05_demo", {"loss": 1.0}) == ("the recorded full run predates this version of the page: "
                                                        "its rows imdb come from sections the page no longer has")


def test_a_record_of_other_checkpoint_weights_is_stale(dirs):
    results.record("05_demo", {"checkpoints": {"a": "11", "b": "22"}, "bleu": 20.0}, hp("full"))
    assert results.stale("05_demo", {"checkpoints": {"a": "11", "b": "22"}, "bleu": 21.0}) is None
    note = results.stale("05_demo", {"checkpoints": {"a": "11", "b": "33"}, "bleu": 21.0})
    assert note == ("the recorded full run predates this version of the page: it evaluated other weights of b "
                    "than the page loads now")


def test_provenance_says_when_a_record_was_made_with_another_torch_or_a_dirty_tree(dirs):
    import json

    import torch
    committed, _ = dirs
    assert results.provenance("05_demo") is None                      # nothing recorded
    file = results.record("05_demo", {"loss": 2.0}, hp("full"))
    entry = json.loads(file.read_text())
    here = torch.__version__.split("+")[0]
    entry["full"].update(device=f"device=cpu (x86_64, 2 threads) | torch {here}", dirty=False, commit="abc1234")
    file.write_text(json.dumps(entry))
    assert results.provenance("05_demo") is None                      # made as this page runs
    entry["full"].update(device="device=cuda (H100) | torch 2.11.0", dirty=True)
    file.write_text(json.dumps(entry))
    assert results.provenance("05_demo") == (
        f"The recorded run in results/05_demo.json was made with PyTorch 2.11.0, not the {here} this page runs, "
        "and from commit abc1234 with uncommitted changes.")
