"""lib.checkpoints: the registry's checks (missing file, wrong checksum, wrong configuration),
writes that are never seen half-done, the mirror folder and the size budget."""
import json
import os

import pytest
import torch

from lib import checkpoints, io as lib_io
from lib.models import bert as B
from lib.models.t5 import COURSE_SENTINELS
from lib.text import train_tokenizer

CONFIG = dict(vocab_size=60, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_position=16)
COMMAND = "python -m tools.pretrain toy --tokens 1M"


def make_model(seed: int = 0) -> B.BertForPreTraining:
    torch.manual_seed(seed)
    return B.BertForPreTraining(B.BertConfig(**CONFIG))


def build(root, model, name="toy", dtype=torch.float32, base=None):
    """Write weights, tokenizer and card under ``root`` the way tools.pretrain does, and register them."""
    cfg = checkpoints.config_dict(model.cfg)
    checkpoints.save_weights(model, root / name / "model.safetensors", dtype,
                             {"name": name, "kind": "bert-mlm", "config": cfg}, base=base)
    tok = train_tokenizer(["영화 정말 재밌다", "배우 연기 최고", "a b c d"] * 5, vocab_size=60, min_frequency=1)
    tok.save(root / name / "tokenizer.json")
    (root / name / "card.json").write_text(json.dumps({"name": name, "tokens_seen": 123}))
    files = {k: checkpoints.file_entry(root, f"{name}/{f}") for k, f in
             (("weights", "model.safetensors"), ("tokenizer", "tokenizer.json"), ("card", "card.json"))}
    checkpoints.register(checkpoints.CheckpointInfo(name, "bert-mlm", cfg, files, COMMAND), root)
    return root / name / "model.safetensors"


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.delenv(checkpoints.MIRROR_ENV, raising=False)
    return tmp_path / "checkpoints"


def test_round_trip_stores_tied_weights_once_and_loads_the_same_model(root):
    model = make_model()
    build(root, model)
    ckpt = checkpoints.load("toy", root=root)
    for k, v in model.state_dict().items():
        assert torch.equal(ckpt.model.state_dict()[k], v), k
    assert ckpt.model.mlm.decoder.weight is ckpt.model.bert.word_embeddings.weight      # still tied
    from safetensors.torch import load_file
    assert "mlm.decoder.weight" not in load_file(str(root / "toy" / "model.safetensors"))
    assert ckpt.card["tokens_seen"] == 123 and ckpt.tokenizer.vocab_size > 7
    assert not ckpt.model.training


def test_int8_weights_are_a_quarter_of_float32_and_load_within_half_a_step_of_their_group(root):
    model = make_model()
    full = build(root, model, name="full", dtype=torch.float32).stat().st_size
    small = build(root, model, name="small", dtype=torch.int8).stat().st_size
    assert small < 0.5 * full            # (a toy model: the header is a good part of the file)
    loaded = checkpoints.load("small", root=root).model.state_dict()
    for k, v in model.state_dict().items():
        if not v.is_floating_point():
            continue
        if v.dim() < 2:                     # biases and norms: float16
            assert torch.equal(loaded[k], v.half().float()), k
            continue
        size = checkpoints.INT8_GROUP if v.shape[-1] % checkpoints.INT8_GROUP == 0 else v.shape[-1]
        groups, got = v.reshape(-1, size), loaded[k].reshape(-1, size)
        step = groups.abs().amax(1, keepdim=True) / 127          # one int8 step of each group
        assert torch.all((got - groups).abs() <= step * 0.5 + 1e-3 * step + 1e-8), k
        assert not torch.equal(got, groups), k
        assert torch.equal(checkpoints.as_stored(v, torch.int8), loaded[k]), k
    assert checkpoints.stored_bytes(model, torch.int8) < 0.3 * checkpoints.stored_bytes(model, torch.float32)


def test_int8_embeddings_store_the_tables_in_int8_and_the_rest_in_float16(root):
    model = make_model()
    tables = {f"bert.embeddings.{t}_embeddings.weight" for t in ("word", "position", "token_type")}
    plan = checkpoints.storage_plan(model, checkpoints.INT8_EMBEDDINGS)
    assert {k for k, d in plan.items() if d == torch.int8} == tables
    build(root, model, name="mixed", dtype=checkpoints.INT8_EMBEDDINGS)
    loaded = checkpoints.load("mixed", root=root).model.state_dict()
    twin = checkpoints.rounded_copy(model, checkpoints.INT8_EMBEDDINGS).state_dict()     # what a page reads
    for k, v in model.state_dict().items():
        assert torch.equal(loaded[k], twin[k]), k
        if v.is_floating_point() and k != "mlm.decoder.weight":           # (tied: stored as the table)
            assert torch.equal(loaded[k], checkpoints.as_stored(v, torch.int8 if k in tables else torch.float16)), k
    assert torch.equal(loaded["mlm.decoder.weight"], loaded["bert.embeddings.word_embeddings.weight"])
    sizes = {d: checkpoints.stored_bytes(model, d) for d in (torch.int8, checkpoints.INT8_EMBEDDINGS, torch.float16)}
    assert sizes[torch.int8] < sizes[checkpoints.INT8_EMBEDDINGS] < sizes[torch.float16]
    with pytest.raises(ValueError, match="unknown storage 'int4'"):
        checkpoints.storage_plan(model, "int4")


def test_an_overlay_stores_only_what_changed_from_its_base_and_loads_whole(root):
    base_model = make_model()
    build(root, base_model, name="base", dtype=torch.float16)
    tuned = checkpoints.load("base", root=root).model            # trained on top of the stored base
    with torch.no_grad():                                        # "training" changes the last layer only
        for p in tuned.bert.encoder.layers[-1].parameters():
            p.add_(0.01)
    base = checkpoints.Base.of("base", root)
    changed = {k for k in checkpoints.weights_state(tuned)[0] if k.startswith("bert.encoder.layers.0.")}
    file = build(root, tuned, name="tuned", dtype=torch.float16, base=base)
    from safetensors.torch import load_file
    assert set(load_file(str(file))) == changed                  # the untouched tensors are not written
    assert checkpoints.stored_bytes(tuned, torch.float16, base) < checkpoints.stored_bytes(tuned, torch.float16)
    loaded = checkpoints.load("tuned", root=root).model.state_dict()
    twin = checkpoints.rounded_copy(tuned, torch.float16, base).state_dict()
    for k, v in tuned.state_dict().items():
        assert torch.equal(loaded[k], twin[k]), k
        assert torch.equal(loaded[k], v.half().float() if k in changed else v), k
    # the base trained again: the overlay no longer fits it, and says how to rebuild it
    build(root, make_model(seed=1), name="base", dtype=torch.float16)
    with pytest.raises(checkpoints.CheckpointError, match="trained on top of 'base'.*rebuild 'tuned'"):
        checkpoints.load("tuned", root=root)
    reg = json.loads((root / "registry.json").read_text())
    del reg["checkpoints"]["base"]
    (root / "registry.json").write_text(json.dumps(reg))
    with pytest.raises(checkpoints.CheckpointError, match="only what it changed from 'base', which is not registered"):
        checkpoints.load("tuned", root=root)


def test_half_precision_weights_load_as_float32(root):
    model = make_model()
    build(root, model, dtype=torch.bfloat16)
    loaded = checkpoints.load("toy", root=root).model
    w = model.bert.word_embeddings.weight
    assert loaded.bert.word_embeddings.weight.dtype == torch.float32
    assert torch.equal(loaded.bert.word_embeddings.weight, w.detach().to(torch.bfloat16).float())
    assert not torch.equal(loaded.bert.word_embeddings.weight, w)
    state, _, meta = checkpoints.load_state("toy", root=root)
    assert {v.dtype for v in state.values() if v.is_floating_point()} == {torch.float32}
    assert meta["kind"] == "bert-mlm"


def test_missing_file_names_the_file_and_the_rebuild_command(root):
    build(root, make_model())
    (root / "toy" / "model.safetensors").unlink()
    with pytest.raises(checkpoints.CheckpointError) as e:
        checkpoints.load("toy", root=root)
    msg = str(e.value)
    assert "missing" in msg and str(root / "toy" / "model.safetensors") in msg and COMMAND in msg
    assert checkpoints.MIRROR_ENV in msg


def test_wrong_checksum_names_the_file_and_the_rebuild_command(root):
    file = build(root, make_model())
    blob = bytearray(file.read_bytes())
    blob[-3] ^= 0xFF                                  # one weight changed, the file still parses
    file.write_bytes(bytes(blob))
    with pytest.raises(checkpoints.CheckpointError) as e:
        checkpoints.load("toy", root=root)
    assert "sha256" in str(e.value) and str(file) in str(e.value) and COMMAND in str(e.value)


def test_config_mismatch_is_refused_with_the_differing_field(root):
    build(root, make_model())
    asked = B.BertConfig(**{**CONFIG, "num_layers": 2})
    with pytest.raises(checkpoints.CheckpointError) as e:
        checkpoints.load("toy", config=asked, root=root)
    assert "num_layers" in str(e.value) and COMMAND in str(e.value) and "model.safetensors" in str(e.value)
    assert checkpoints.load("toy", config=B.BertConfig(**CONFIG), root=root).model.cfg == B.BertConfig(**CONFIG)
    # dropout is a setting of the run that fine-tunes, not of the weights: asked for, it is given
    tuned = checkpoints.load("toy", config=B.BertConfig(**CONFIG, dropout=0.3, attention_dropout=0.0), root=root)
    assert (tuned.model.cfg.dropout, tuned.model.cfg.attention_dropout) == (0.3, 0.0)


def test_weights_written_for_another_config_than_registered_are_refused(root):
    build(root, make_model())
    reg = json.loads((root / "registry.json").read_text())
    reg["checkpoints"]["toy"]["config"]["hidden_size"] = 32      # the registry says one thing, the file another
    (root / "registry.json").write_text(json.dumps(reg))
    with pytest.raises(checkpoints.CheckpointError, match="registry says"):
        checkpoints.load("toy", root=root)


def test_an_interrupted_write_leaves_the_previous_file_and_no_partial_one(root, monkeypatch):
    first = make_model(0)
    file = build(root, first)
    before = file.read_bytes()
    real_fsync = os.fsync

    def crash(fd):              # the bytes are in the temporary file; the process dies before the rename
        real_fsync(fd)
        raise KeyboardInterrupt

    monkeypatch.setattr(lib_io.os, "fsync", crash)
    with pytest.raises(KeyboardInterrupt):
        checkpoints.save_weights(make_model(1), file, torch.float32, {"kind": "bert-mlm"})
    monkeypatch.setattr(lib_io.os, "fsync", real_fsync)
    assert file.read_bytes() == before
    assert sorted(p.name for p in file.parent.iterdir()) == ["card.json", "model.safetensors", "tokenizer.json"]
    loaded = checkpoints.load("toy", root=root).model
    assert torch.equal(loaded.bert.word_embeddings.weight, first.bert.word_embeddings.weight)


def test_an_interrupted_first_write_leaves_nothing_to_load(root, monkeypatch):
    build(root, make_model())
    file = root / "toy" / "model.safetensors"
    file.unlink()
    monkeypatch.setattr(lib_io.os, "replace", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        checkpoints.save_weights(make_model(), file, torch.float32, {"kind": "bert-mlm"})
    assert not any(p.suffix == ".tmp" for p in file.parent.iterdir())
    with pytest.raises(checkpoints.CheckpointError, match="missing"):
        checkpoints.load("toy", root=root)


def test_a_file_missing_here_is_taken_from_the_mirror(root, tmp_path, monkeypatch):
    build(root, make_model())
    mirror = tmp_path / "mirror"
    (mirror / "toy").mkdir(parents=True)
    (root / "toy" / "model.safetensors").rename(mirror / "toy" / "model.safetensors")
    with pytest.raises(checkpoints.CheckpointError, match="missing"):
        checkpoints.load("toy", root=root)
    monkeypatch.setenv(checkpoints.MIRROR_ENV, str(mirror))
    assert checkpoints.path("toy", root=root) == mirror / "toy" / "model.safetensors"
    checkpoints.load("toy", root=root)


def test_unknown_name_says_how_to_build_it(root):
    build(root, make_model())
    with pytest.raises(checkpoints.CheckpointError, match="`python -m tools.pretrain ko-bert`"):
        checkpoints.load("ko-bert@2M", root=root)


def test_register_refuses_files_that_are_not_in_place_and_a_broken_budget(root):
    build(root, make_model())
    entry = checkpoints.info("toy", root)
    with pytest.raises(checkpoints.CheckpointError, match="budget"):
        checkpoints.register(entry, root, budget=entry.size - 1)
    (root / "toy" / "card.json").write_text("{}")
    with pytest.raises(checkpoints.CheckpointError, match="card"):
        checkpoints.register(entry, root)


def test_the_repository_checkpoints_fit_the_budget_and_every_file_is_registered():
    entries = checkpoints.registry()
    assert checkpoints.total_size(entries) <= checkpoints.BUDGET_BYTES
    registered = {f.path for e in entries.values() for f in e.files.values()}
    on_disk = {p.relative_to(checkpoints.CHECKPOINT_DIR).as_posix() for p in checkpoints.CHECKPOINT_DIR.rglob("*")
               if p.is_file() and p.name not in (checkpoints.REGISTRY_FILE, "README.md")}
    assert on_disk <= registered, f"files in checkpoints/ that no registry entry lists: {sorted(on_disk - registered)}"
    assert not any(p.endswith((".pt", ".tmp")) for p in on_disk)


def test_every_repository_checkpoint_loads_with_its_tokenizer_and_card():
    """Each registered checkpoint passes load's checks (checksums, configuration) and ships what the
    chapters read from it: a tokenizer, and a card (its weights' metadata for a snapshot) that says
    how many tokens it read; a snapshot read fewer than its final model."""
    entries = checkpoints.registry()
    read = {}
    for name in entries:
        ckpt = checkpoints.load(name)
        # a T5 model's vocabulary is its tokenizer's plus the sentinels, the last ids (tools.pretrain)
        extra = COURSE_SENTINELS if ckpt.info.kind in ("t5-span", "t5-task") else 0
        cfg = ckpt.info.config
        if "src_vocab_size" in cfg:     # an encoder-decoder on sentence pairs: a vocabulary per side, or one for both
            target = ckpt.target_tokenizer or ckpt.tokenizer
            assert (ckpt.tokenizer.vocab_size, target.vocab_size) == (cfg["src_vocab_size"], cfg["tgt_vocab_size"])
        else:
            assert ckpt.tokenizer is not None and ckpt.tokenizer.vocab_size + extra == cfg["vocab_size"]
        read[name] = checkpoints.tokens_seen(name)
    for name, tokens in read.items():
        base = name.split("@")[0]
        if "@" in name and base in read:
            assert tokens < read[base], name
