"""The random number generator states (python, numpy, torch cpu, cuda, mps) as plain tensors and
numbers, the only form ``torch.load(weights_only=True)`` reads back from a checkpoint."""
from __future__ import annotations

import random
import warnings
from typing import Any, Mapping

import numpy as np
import torch

from lib import device as _device

__all__ = ["rng_state", "set_rng_state"]


def rng_state() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    state = {
        "python": {"version": int(version), "internal": torch.tensor(internal, dtype=torch.int64),
                   "gauss": gauss},
        "numpy": {"bit_generator": np_state["bit_generator"],
                  "key": torch.from_numpy(np.asarray(np_state["state"]["key"]).astype(np.int64)),
                  "pos": int(np_state["state"]["pos"]), "has_gauss": int(np_state["has_gauss"]),
                  "gauss": float(np_state["gauss"])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    if _device._mps_available():
        try:
            state["mps"] = torch.mps.get_rng_state()
        except Exception:  # pragma: no cover - depends on the torch build
            pass
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["internal"].tolist()), py["gauss"]))
    nps = state["numpy"]
    np.random.set_state({"bit_generator": nps["bit_generator"],
                         "state": {"key": nps["key"].numpy().astype(np.uint32), "pos": nps["pos"]},
                         "has_gauss": nps["has_gauss"], "gauss": nps["gauss"]})
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
        else:
            warnings.warn(f"the checkpoint has RNG states for {len(cuda_states)} cuda devices, this machine "
                          f"has {torch.cuda.device_count()}: cuda RNG not restored", stacklevel=3)
    if "mps" in state and _device._mps_available():  # pragma: no cover
        torch.mps.set_rng_state(state["mps"])

