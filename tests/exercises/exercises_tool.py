"""``tools/exercises.py`` (the exercise grader's command line, which re-exports the names of the
package ``tools/grader``) imported once under one module name, for the tests that use it."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

NAME = "course_exercises_tool"


def load():
    """The grader module, imported on first use."""
    if NAME not in sys.modules:
        root = Path(__file__).resolve().parents[2]
        spec = importlib.util.spec_from_file_location(NAME, root / "tools" / "exercises.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[NAME] = module
        spec.loader.exec_module(module)
    return sys.modules[NAME]
