"""Exercise masters: discovery, parsing (questions, solutions, hidden tests, multiple choice),
the leak search, and the tests in an autograder zip."""
from __future__ import annotations

import ast
import dataclasses
import json
import re
import zipfile
from pathlib import Path

import nbformat
import yaml


ROOT = Path(__file__).resolve().parents[2]


EXERCISES = ROOT / "exercises"


DIST = EXERCISES / "_dist"


@dataclasses.dataclass
class Master:
    chapter: str          # folder name, e.g. 03_transformer
    name: str             # file stem, e.g. sdpa_padding
    path: Path

    @property
    def key(self) -> str:
        return f"{self.chapter}/{self.name}"

    @property
    def wrong_path(self) -> Path:
        return self.path.with_name(self.name + ".wrong.yaml")

    def out_dir(self, dist: Path) -> Path:
        return dist / self.chapter / self.name

    def student_nb(self, dist: Path, lang: str | None = None) -> Path:
        """The student notebook: otter's (English), or its translation into ``lang`` (same name, in
        a folder named after the language)."""
        student = self.out_dir(dist) / "student"
        return (student / lang if lang else student) / f"{self.name}.ipynb"

    def solution_nb(self, dist: Path) -> Path:
        return self.out_dir(dist) / "autograder" / f"{self.name}.ipynb"

    def zip_path(self, dist: Path) -> Path:
        return self.out_dir(dist) / "autograder" / f"{self.name}-autograder.zip"


def discover(root: Path = EXERCISES, only: list[str] | None = None) -> list[Master]:
    masters = []
    for chapter in sorted(p for p in root.iterdir() if p.is_dir()):
        if chapter.name.startswith(("_", ".")):
            continue
        for nb in sorted(chapter.glob("*.ipynb")):
            if nb.name.startswith(("_", ".")) or "." in nb.stem:
                continue
            masters.append(Master(chapter.name, nb.stem, nb))
    if only:
        wanted = set(only)
        unknown = wanted - {m.key for m in masters}
        if unknown:
            raise SystemExit(f"unknown exercise(s): {', '.join(sorted(unknown))}; "
                             f"known: {', '.join(m.key for m in masters) or 'none'}")
        masters = [m for m in masters if m.key in wanted]
    return masters


_MARK_BEGIN = re.compile(r"^\s*#\s*BEGIN\s+SOLUTION\b", re.I)


_MARK_END = re.compile(r"^\s*#\s*END\s+SOLUTION\b", re.I)


_MARK_LINE = re.compile(r"^(.*?)\s*#\s*SOLUTION(\s+NO\s+PROMPT)?\s*$")


_PROMPT_BEGIN = re.compile(r"^\s*#\s*BEGIN\s+PROMPT\b", re.I)


_PROMPT_END = re.compile(r"^\s*#\s*END\s+PROMPT\b", re.I)


_TEST_CFG_BEGIN = re.compile(r'(?:.\s*=\s*)?""?"?\s*#\s*BEGIN\s*TEST\s*CONFIG', re.I)


_TEST_CFG_END = re.compile(r'""?"?\s*#\s*END\s*TEST\s*CONFIG', re.I)


def _raw_kind(cell) -> str | None:
    if cell.cell_type != "raw":
        return None
    first = (cell.source.strip().splitlines() or [""])[0]
    m = re.match(r"#\s*(begin|end)\s+(question|solution|tests|prompt)\b", first, re.I)
    if m:
        return f"{m.group(1).lower()} {m.group(2).lower()}"
    if re.match(r"#\s*assignment\s+config", first, re.I):
        return "config"
    return None


@dataclasses.dataclass
class MasterInfo:
    config: dict
    questions: list[str]
    solution_cells: dict[str, list[str]]     # question -> ids of the code cells of its SOLUTION block
    hidden_tests: dict[str, int]             # question -> number of hidden test cells
    secrets: list[tuple[str, str]]           # (kind, line) that must not appear in the student notebook
    problems: list[str]
    choices: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)   # MC q -> (name, right letter)
    options: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)    # MC q -> letter -> option text
    functions: dict[str, list[str]] = dataclasses.field(default_factory=dict)       # q -> functions its solution defines


_CHOICE = re.compile(r"""^\s*(\w+)\s*=\s*["']([a-z])["']\s*#\s*SOLUTION\s*$""", re.M)


_OPTION = re.compile(r"^\s*(?:[*-]\s+)?\(([a-h])\)\s+(.*)$")


def _options(markdown: str) -> dict[str, str]:
    """The options ``(a) ...``, ``* (b) ...`` of a multiple-choice prompt (an option runs on until the
    next option or a blank line), letter -> text without markup breaks."""
    out: dict[str, str] = {}
    letter = None
    for line in markdown.splitlines():
        m = _OPTION.match(line)
        if m:
            letter = m.group(1)
            out[letter] = m.group(2)
        elif letter and line.strip():
            out[letter] += " " + line.strip()
        else:
            letter = None
    return {k: " ".join(v.replace("<br>", " ").split()) for k, v in out.items()}


def _functions(source: str) -> list[str]:
    """Names of the top-level functions a solution cell defines (none if it does not parse)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]


def _solution_lines(source: str) -> tuple[list[str], list[str]]:
    """Split a code cell into (secret solution lines, public lines) following otter's markers."""
    secret, public = [], []
    in_sol = in_prompt = False
    for line in source.splitlines():
        if _MARK_END.match(line):
            in_sol = False
            continue
        if _MARK_BEGIN.match(line):
            in_sol = True
            continue
        if _PROMPT_BEGIN.match(line) or _PROMPT_END.match(line):
            in_prompt = _PROMPT_BEGIN.match(line) is not None
            continue
        if in_sol:
            secret.append(line)
            continue
        m = _MARK_LINE.match(line)
        if m and not in_prompt:
            secret.append(m.group(1))
        else:
            public.append(line)
    return secret, public


def parse_master(path: Path) -> MasterInfo:
    nb = nbformat.read(str(path), as_version=4)
    config: dict = {}
    questions: list[str] = []
    sol_cells: dict[str, list[str]] = {}
    hidden: dict[str, int] = {}
    secret_lines: list[tuple[str, str]] = []
    public_text: list[str] = []
    problems: list[str] = []
    choices: dict[str, tuple[str, str]] = {}
    options: dict[str, dict[str, str]] = {}
    functions: dict[str, list[str]] = {}
    question = None
    in_solution = in_tests = False
    for i, cell in enumerate(nb.cells):
        kind = _raw_kind(cell)
        if kind == "config":
            config = yaml.safe_load("\n".join(cell.source.splitlines()[1:])) or {}
            continue
        if kind == "begin question":
            q = yaml.safe_load("\n".join(cell.source.splitlines()[1:])) or {}
            question = str(q.get("name"))
            questions.append(question)
            sol_cells.setdefault(question, [])
            hidden.setdefault(question, 0)
            continue
        if kind == "end question":
            question = None
            continue
        if kind in ("begin solution", "end solution"):
            in_solution = kind == "begin solution"
            continue
        if kind in ("begin tests", "end tests"):
            in_tests = kind == "begin tests"
            continue
        if cell.cell_type == "raw":
            continue
        if cell.cell_type == "markdown":
            public_text.append(cell.source)
            if question is not None and _options(cell.source):
                options[question] = _options(cell.source)
            continue
        # code cell
        if in_tests:
            lines = cell.source.splitlines()
            is_hidden, start = False, 0
            if lines and _TEST_CFG_BEGIN.match(lines[0]):
                for j, line in enumerate(lines):
                    if _TEST_CFG_END.match(line):
                        break
                cfg = yaml.safe_load("\n".join(lines[1:j])) or {}
                is_hidden, start = bool(cfg.get("hidden", False)), j + 1
            elif lines and lines[0].lstrip().startswith("#") and re.search(r"\bhidden\b", lines[0], re.I):
                is_hidden, start = True, 1
            if is_hidden and question is not None:
                hidden[question] += 1
                secret_lines += [("hidden test", line) for line in lines[start:]]
            else:
                public_text.append(cell.source)
            continue
        if in_solution and question is not None:
            if not cell.get("id"):
                problems.append(f"cell {i + 1} has no id (save the master with nbformat >= 4.5)")
            sol_cells[question].append(cell.get("id"))
            m = _CHOICE.search(cell.source)
            if m:
                choices[question] = (m.group(1), m.group(2))
            functions.setdefault(question, []).extend(_functions(cell.source))
        secret, public = _solution_lines(cell.source)
        secret_lines += [("solution", line) for line in secret]
        public_text.append("\n".join(public))
    public_blob = "\n".join(public_text)
    secrets_out, seen = [], set()
    for kind, line in secret_lines:
        s = line.strip()
        if len(s) < 8 or not re.search(r"\w", s) or s in seen or s in public_blob:
            continue
        seen.add(s)
        secrets_out.append((kind, s))
    for q in choices:
        if q not in options:
            problems.append(f"multiple-choice question {q}: no options (a), (b), ... found in its prompt")
        elif choices[q][1] not in options[q]:
            problems.append(f"multiple-choice question {q}: its answer {choices[q][1]!r} is not an option")
    options = {q: o for q, o in options.items() if q in choices}
    return MasterInfo(config, questions, sol_cells, hidden, secrets_out, problems, choices, options, functions)


def _all_strings(obj) -> list[str]:
    out = []
    if isinstance(obj, str):
        out.append(obj)
    elif isinstance(obj, list):
        for x in obj:
            out += _all_strings(x)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.append(str(k))
            out += _all_strings(v)
    return out


def find_leaks(student_nb: Path, info: MasterInfo) -> list[str]:
    raw = student_nb.read_text(encoding="utf-8")
    decoded = "\n".join(_all_strings(json.loads(raw)))
    leaks = []
    for kind, s in info.secrets:
        if s in decoded or s in raw or json.dumps(s)[1:-1] in raw:
            leaks.append(f"{kind} line leaked into the student notebook: {s!r}")
    return leaks


def load_tests(zip_path: Path) -> dict[str, str]:
    """question name -> test file source (hidden tests included), in natural question order."""
    from otter.test_files import ExceptionTestFile

    tests = {}
    with zipfile.ZipFile(zip_path) as z:
        for n in z.namelist():
            m = re.fullmatch(r"tests/([^/]+)\.py", n)
            if m and not m.group(1).startswith("__"):
                tests[m.group(1)] = z.read(n).decode("utf-8")
    if not tests:
        raise SystemExit(f"{zip_path}: no tests/*.py in the autograder zip")
    for q, src in tests.items():
        if re.search(r"^OK_FORMAT\s*=\s*True", src, re.M):
            raise SystemExit(f"{zip_path}: test {q} is OK-format; the grader needs exception-based "
                             "tests (tests: ok_format: false in the assignment config)")
        ExceptionTestFile.from_string(src, path=f"tests/{q}.py")  # fail early on a broken file

    def natural(s):
        return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]
    return {q: tests[q] for q in sorted(tests, key=natural)}


def test_file(q: str, src: str):
    from otter.test_files import ExceptionTestFile
    return ExceptionTestFile.from_string(src, path=f"tests/{q}.py")
