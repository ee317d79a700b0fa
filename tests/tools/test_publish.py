"""The publishing workflow (.github/workflows/book.yml) is valid and does what the README says.

Valid: the workflow matches the GitHub-workflow JSON schema that check-jsonschema vendors
(offline; actionlint cannot be installed here). Right: the README's test command runs, and
the site is deployed to GitHub Pages only by a push to main, only after that test pass
succeeded, with the permissions Pages needs. Each check is also run on a broken copy of the
workflow, to show it catches what it is there for. (The manual command, tools/publish.sh, is
tested in tests/site/test_site.py, against the built site.)
"""
from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "book.yml"
TEST_COMMAND = "bash tools/test.sh"
MAIN_PUSH = "github.event_name == 'push' && github.ref == 'refs/heads/main'"


def check_jsonschema(path: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("check-jsonschema")
    if not exe.exists():
        exe = shutil.which("check-jsonschema")
        if exe is None:
            pytest.fail("check-jsonschema is not installed (requirements.txt)")
    return subprocess.run([str(exe), "--builtin-schema", "vendor.github-workflows", str(path)],
                          capture_output=True, text=True, timeout=120)


def load(path: Path = WORKFLOW) -> dict:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    # YAML 1.1 reads the key `on` as True.
    if True in doc:
        doc["on"] = doc.pop(True)
    return doc


def _steps_using(job: dict, action: str) -> list[dict]:
    return [s for s in job.get("steps", []) if str(s.get("uses", "")).split("@")[0] == action]


def workflow_problems(doc: dict) -> list[str]:
    """What is wrong with the workflow's structure (an empty list when nothing is)."""
    problems = []
    on = doc.get("on") or {}
    if "main" not in ((on.get("push") or {}).get("branches") or []):
        problems.append("it does not run on pushes to main")
    jobs = doc.get("jobs") or {}
    testers = [name for name, job in jobs.items()
               if any(str(s.get("run", "")).strip() == TEST_COMMAND for s in job.get("steps", []))]
    if not testers:
        problems.append(f"no job runs the README's test command `{TEST_COMMAND}`")
    deployers = [name for name, job in jobs.items() if _steps_using(job, "actions/deploy-pages")]
    if not deployers:
        problems.append("no job deploys to GitHub Pages (actions/deploy-pages)")
    for name in deployers:
        job = jobs[name]
        needs = job.get("needs") or []
        needs = [needs] if isinstance(needs, str) else needs
        if not set(testers) & set(needs):
            problems.append(f"job {name!r} deploys without needing the test job {testers}")
        if " ".join(str(job.get("if", "")).split()) != MAIN_PUSH:
            problems.append(f"job {name!r} does not deploy only on a push to main (if: {job.get('if')!r})")
        perms = job.get("permissions") or {}
        if perms.get("pages") != "write" or perms.get("id-token") != "write":
            problems.append(f"job {name!r} lacks the permissions pages: write and id-token: write")
        if (job.get("environment") or {}).get("name") != "github-pages":
            problems.append(f"job {name!r} does not deploy to the github-pages environment")
    uploads = [(name, s) for name in testers for s in _steps_using(jobs[name], "actions/upload-pages-artifact")]
    if not uploads:
        problems.append("the test job does not upload the site (actions/upload-pages-artifact)")
    for name, step in uploads:
        steps = jobs[name]["steps"]
        test_at = next(i for i, s in enumerate(steps) if str(s.get("run", "")).strip() == TEST_COMMAND)
        if steps.index(step) < test_at:
            problems.append("the site is uploaded before the test pass ran")
        if (step.get("with") or {}).get("path") != "_build/html":
            problems.append(f"the uploaded site is {(step.get('with') or {}).get('path')!r}, not _build/html")
        if step.get("if") and " ".join(str(step["if"]).split()) != MAIN_PUSH:
            problems.append(f"the site upload runs under {step['if']!r}")
    if (doc.get("permissions") or {}).get("contents") != "read":
        problems.append("the workflow's default permissions are not read-only (permissions: contents: read)")
    return problems


def test_workflow_matches_the_github_workflow_schema():
    result = check_jsonschema(WORKFLOW)
    assert result.returncode == 0, result.stdout + result.stderr


def test_schema_check_rejects_an_invalid_workflow(tmp_path):
    doc = load()
    doc["jobs"]["test"]["runs-on"] = None
    doc["jobs"]["deploy"]["steps"][0]["uses"] = 42
    bad = tmp_path / "bad.yml"
    bad.write_text(yaml.safe_dump(doc), encoding="utf-8")
    assert check_jsonschema(bad).returncode != 0


def test_workflow_tests_then_deploys_only_main():
    assert workflow_problems(load()) == []


@pytest.mark.parametrize("break_it, expected", [
    (lambda d: d["jobs"]["deploy"].pop("needs"), "without needing the test job"),
    (lambda d: d["jobs"]["deploy"].pop("if"), "only on a push to main"),
    (lambda d: d["jobs"]["deploy"].update({"if": "github.event_name == 'push'"}), "only on a push to main"),
    (lambda d: d["jobs"]["deploy"]["permissions"].pop("id-token"), "permissions"),
    (lambda d: d["jobs"]["test"]["steps"].pop(
        next(i for i, s in enumerate(d["jobs"]["test"]["steps"]) if s.get("run") == TEST_COMMAND)),
     "test command"),
    (lambda d: d["on"]["push"].update({"branches": ["develop"]}), "pushes to main"),
    (lambda d: d["jobs"]["test"]["steps"].insert(1, d["jobs"]["test"]["steps"].pop()), "before the test pass"),
])
def test_structure_check_catches_a_broken_workflow(break_it, expected):
    doc = copy.deepcopy(load())
    break_it(doc)
    problems = workflow_problems(doc)
    assert any(expected in p for p in problems), problems
