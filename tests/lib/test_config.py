"""lib.config: the ci / full recipes."""
import copy
import pickle

import pytest
import torch

from lib import config

CI = dict(epochs=1, max_len=200, lr=1e-3)
FULL = dict(epochs=3, max_len=500, lr=3e-4)


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv("COURSE_MODE", raising=False)
    return monkeypatch


@pytest.mark.parametrize("gpu, expected", [(False, "ci"), (True, "full")])
def test_default_mode_follows_the_gpu(no_env, gpu, expected):
    no_env.setattr(torch.cuda, "is_available", lambda: gpu)
    assert config.mode() == expected
    assert config.is_full() is (expected == "full")


@pytest.mark.parametrize("value, expected", [("ci", "ci"), ("full", "full"), (" FULL ", "full"), ("Ci", "ci")])
def test_course_mode_overrides(no_env, value, expected):
    no_env.setattr(torch.cuda, "is_available", lambda: expected == "ci")  # the opposite default
    no_env.setenv("COURSE_MODE", value)
    assert config.mode() == expected


def test_invalid_course_mode_is_an_error(no_env):
    no_env.setenv("COURSE_MODE", "fast")
    with pytest.raises(ValueError, match="COURSE_MODE='fast' is not a recipe: use one of ci, full"):
        config.mode()


@pytest.mark.parametrize("mode, values", [("ci", CI), ("full", FULL)])
def test_recipe_picks_the_active_dict(no_env, mode, values):
    no_env.setenv("COURSE_MODE", mode)
    r = config.recipe(ci=CI, full=FULL)
    assert r.mode == mode
    assert r.asdict() == values
    for k, v in values.items():
        assert getattr(r, k) == v and r[k] == v
    assert repr(r).startswith(f"Recipe[{mode}](")


def test_explicit_mode_argument(no_env):
    no_env.setenv("COURSE_MODE", "ci")
    assert config.recipe(CI, FULL, mode_="full").epochs == FULL["epochs"]
    with pytest.raises(ValueError, match="unknown recipe 'big'"):
        config.recipe(CI, FULL, mode_="big")


def test_mismatched_keys_are_an_error():
    with pytest.raises(ValueError, match=r"only in ci \['lr'\], only in full \['lrate'\]"):
        config.recipe(ci=dict(epochs=1, lr=1e-3), full=dict(epochs=2, lrate=1e-3), mode_="ci")


def test_recipe_is_read_only(no_env):
    no_env.setenv("COURSE_MODE", "ci")
    source = dict(CI)
    r = config.recipe(ci=source, full=FULL)
    with pytest.raises(AttributeError, match="read-only"):
        r.epochs = 5
    with pytest.raises(AttributeError, match="read-only"):
        r.new_name = 1
    with pytest.raises(TypeError):
        r._values["epochs"] = 5
    # neither the dict it came from nor the one asdict() hands out can change it
    source["epochs"] = 99
    r.asdict()["epochs"] = 98
    assert r.epochs == CI["epochs"]


def test_unknown_hyper_parameter_names_the_known_ones():
    r = config.recipe(CI, FULL, mode_="ci")
    with pytest.raises(AttributeError, match=r"has no hyper-parameter 'epoch'.*\['epochs', 'lr', 'max_len'\]"):
        r.epoch
    with pytest.raises(AttributeError, match="has no hyper-parameter"):
        r["batch"]


def test_recipe_survives_copy_and_pickle():
    # results files, DataLoader workers and notebooks copy recipes around
    r = config.recipe(CI, FULL, mode_="full")
    for clone in (copy.copy(r), copy.deepcopy(r), pickle.loads(pickle.dumps(r))):
        assert clone.mode == "full" and clone.asdict() == FULL
        with pytest.raises(AttributeError, match="read-only"):
            clone.epochs = 0


@pytest.mark.parametrize("device_type, mode, asked, expected", [
    ("cuda", "full", None, False),      # never silently: the recorded CPU-sized recipe
    ("cuda", "full", "0", False),
    ("cuda", "full", "1", True),        # an explicit opt-in
    ("cuda", "ci", "1", False),         # the CI recipe stays the CI recipe
    ("cpu", "full", "1", False),
])
def test_gpu_recipe_only_on_explicit_request(no_env, capsys, device_type, mode, asked, expected):
    no_env.setenv("COURSE_MODE", mode)
    if asked is None:
        no_env.delenv(config.GPU_ENV_VAR, raising=False)
    else:
        no_env.setenv(config.GPU_ENV_VAR, asked)
    assert config.gpu_recipe(device_type) is expected
    if device_type == "cuda" and mode == "full" and not expected:
        assert f"{config.GPU_ENV_VAR}=1" in capsys.readouterr().out


def test_gpu_recipe_rejects_other_values(no_env):
    no_env.setenv(config.GPU_ENV_VAR, "yes")
    with pytest.raises(ValueError, match="COURSE_GPU_RECIPE='yes'"):
        config.gpu_recipe("cuda")


def test_every_model_config_has_asdict_and_a_checked_replace():
    import dataclasses
    import importlib
    import pkgutil

    import lib.models
    from lib.config import ModelConfig
    configs = {obj for info in pkgutil.iter_modules(lib.models.__path__)
               for obj in vars(importlib.import_module(f"lib.models.{info.name}")).values()
               if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__name__.endswith("Config")}
    assert len(configs) >= 12, sorted(c.__name__ for c in configs)
    not_shared = sorted(c.__name__ for c in configs if not issubclass(c, ModelConfig))
    assert not not_shared, f"configs that do not derive from lib.config.ModelConfig: {not_shared}"
    from lib.models.gpt import GPTConfig
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=8)
    assert cfg.replace(n_layer=3).asdict() == {**cfg.asdict(), "n_layer": 3} and cfg.n_layer == 2
    with pytest.raises(ValueError, match="divisible"):
        cfg.replace(n_embd=9)                          # the copy is checked as a new config is
