"""Shared pytest setup.

The real datasets: when ``COURSE_DATA_MIRROR`` is unset and the course's shared data folder
exists beside the repository (``<repo>/../shared/data``), point the variable at it, so that
tests read the checked-in copies instead of downloading. Tests that need the real data ask
for the ``data_mirror`` fixture, which skips them (saying why) when there is no mirror.

Threads: unit tests use tiny tensors, for which one intra-op thread is faster than two, and
much faster (and steadier) on a busy machine; every test runs with one thread.

Precision: tests run in float32 whatever the CPU (``COURSE_PRECISION=fp32`` unless set), so
that their numbers do not depend on whether the machine has native bfloat16; the tests of the
precision policy set the variable themselves.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"

os.environ.setdefault("COURSE_PRECISION", "fp32")

if not os.environ.get("COURSE_DATA_MIRROR") and SHARED_DATA.is_dir():
    os.environ["COURSE_DATA_MIRROR"] = str(SHARED_DATA)


@pytest.fixture(scope="session")
def data_mirror() -> Path:
    """The folder with the real datasets; skips the test when there is none."""
    value = os.environ.get("COURSE_DATA_MIRROR", "")
    if not value or not Path(value).is_dir():
        pytest.skip(f"needs the real datasets: set COURSE_DATA_MIRROR to the shared data folder "
                    f"(none found at {SHARED_DATA})")
    return Path(value)


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
