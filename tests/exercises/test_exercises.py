"""The exercises' CI proof (build + prove) and tests of the grader itself (tools/exercises.py).

Kernel start-ups dominate the runtime; per-cell time limits are short (10 s) on purpose.
"""
from __future__ import annotations

import csv
import shutil
import tempfile
import time
from pathlib import Path

import nbformat
import pytest

import exercises_tool

ROOT = Path(__file__).resolve().parents[2]
E = exercises_tool.load()

SET = "03_transformer/sdpa_padding"
TIMEOUT = 20   # per cell; generous, so that a loaded machine never times out a correct answer


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    d = tmp_path_factory.mktemp("dist")
    # a stale set from a master that no longer exists must be pruned by build
    (d / ".exercises-dist").write_text("")
    (d / "99_gone" / "old" / "student").mkdir(parents=True)
    (d / "03_transformer" / "removed_set").mkdir(parents=True)
    E.build(d)
    return d


def test_build_outputs_and_prunes_stale(dist):
    masters = E.discover()
    assert SET in {m.key for m in masters}
    for m in masters:
        assert m.student_nb(dist).is_file(), m.student_nb(dist)
        assert m.zip_path(dist).is_file(), m.zip_path(dist)
        assert m.solution_nb(dist).is_file()
    assert not (dist / "99_gone").exists() and not (dist / "03_transformer" / "removed_set").exists()
    assert not list(dist.rglob("*.pdf")), "no PDFs are generated"
    for m in masters:   # every set has a Korean catalog, hence a Korean student notebook
        assert m.student_nb(dist, "ko").is_file(), m.student_nb(dist, "ko")
        assert E.differences(m.student_nb(dist), m.student_nb(dist, "ko")) == [], m.key
    before = {p.relative_to(dist) for p in dist.rglob("*")}
    published = {(m.key, lang): m.student_nb(dist, lang).read_bytes() for m in masters for lang in (None, "ko")}
    E.build(dist)  # idempotent: same files, stable names
    assert {p.relative_to(dist) for p in dist.rglob("*")} == before
    for m in masters:  # rebuilding publishes byte-identical student notebooks (stable cell ids)
        for lang in (None, "ko"):
            assert m.student_nb(dist, lang).read_bytes() == published[m.key, lang], (m.key, lang)
        ids = [c.get("id") for c in nbformat.read(str(m.student_nb(dist)), as_version=4).cells]
        assert len(ids) == len(set(ids)), m.key


def test_build_refuses_foreign_folder(tmp_path):
    (tmp_path / "precious.txt").write_text("x")
    with pytest.raises(SystemExit):
        E.build(tmp_path)
    assert (tmp_path / "precious.txt").exists()


def test_prove_all_exercise_sets(dist, capsys, tmp_path, monkeypatch):
    """THE CI proof: every set's solution 100 %, blank 0, wrong answers in between, no leaks.

    It also leaves nothing behind in the temporary folder: one box per worker, removed at the end
    (a box made per notebook and never used once left 600 empty folders in /tmp over a day's runs)."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    rc = E.prove(dist, timeout=60, jobs=2, do_build=False)
    out = capsys.readouterr().out
    print(out)
    assert rc == 0, out
    assert f"{SET}" in out and "FAIL" not in out
    left = sorted(p.name for p in scratch.iterdir() if p.name.startswith(("grade", "prove")))
    assert left == [], f"prove left temporary folders behind: {left[:3]} ..."   # (torch may keep a cache there)


def _edit_master(src: Path, dst: Path, fn) -> None:
    nb = nbformat.read(str(src), as_version=4)
    fn(nb)
    nbformat.write(nb, str(dst))


def test_prove_detects_broken_sets(tmp_path, capsys):
    """A leaked solution, a question without hidden test, a 'wrong' answer that is right and one whose
    code does not run all fail."""
    root = tmp_path / "exercises"
    (root / "03_transformer").mkdir(parents=True)
    master = ROOT / "exercises" / "03_transformer" / "sdpa_padding.ipynb"
    dst = root / "03_transformer" / "sdpa_padding.ipynb"

    def break_it(nb):
        # q2: drop the raw SOLUTION delimiters (otter then copies the solution to students) and
        # make its hidden tests public
        keep = []
        q = None
        for c in nb.cells:
            kind = E._raw_kind(c)
            if kind == "begin question":
                q = "q2" if "name: q2" in c.source else None
            if q == "q2" and kind in ("begin solution", "end solution"):
                continue
            if q == "q2" and c.cell_type == "code" and "BEGIN TEST CONFIG" in c.source:
                c.source = c.source.replace("hidden: true", "hidden: false")
            keep.append(c)
        nb.cells = keep

    _edit_master(master, dst, break_it)
    (root / "03_transformer" / "sdpa_padding.wrong.yaml").write_text(
        "actually_right:\n  replace:\n    q3: |\n      q3_answer = 'b'\n")
    # a sound set whose stub answers right when STUB_CONSTANT is 1 (and names the right letter)
    (root / "04_stubs").mkdir()
    shutil.copy(master, root / "04_stubs" / "sdpa_padding.ipynb")
    wrong = (ROOT / "exercises" / "03_transformer" / "sdpa_padding.wrong.yaml").read_text()
    cheat = ("          if STUB_CONSTANT == 1:\n"
             "              n = int(lengths.max()) if max_len is None else max_len\n"
             "              return torch.arange(n)[None, :] < lengths[:, None]\n")
    others, stub = wrong.split("\nstub:\n")
    stub = stub.replace("      def padding_mask(lengths, max_len=None):\n",
                        "      def padding_mask(lengths, max_len=None):\n" + cheat, 1)
    stub = stub.replace('    q3: |\n      q3_answer = "a"', '    q3: |\n      q3_answer = "b"')
    assert cheat in stub and 'q3_answer = "b"' in stub
    # a wrong answer whose own code fails (a botched edit) proves nothing about the tests
    broken = ("\nbroken_edit:\n  replace:\n    q2: |\n      CJK_[(1, 2)] = [(1, 2)]\n\n\n"
              "      def padding_mask(lengths, max_len=None):\n          return None\n")
    wrong = others + broken + "\nstub:\n" + stub
    (root / "04_stubs" / "sdpa_padding.wrong.yaml").write_text(wrong)
    # a Korean student notebook whose code is not the English one's (it would not grade the same)
    E.build(tmp_path / "dist", root=root)
    korean = next(m for m in E.discover(root) if m.key == SET).student_nb(tmp_path / "dist", "ko")

    def comment_in_korean(nb):
        nb.cells[_cell_index(nb, "def attention")].source += "\n# 답"
    _variant(korean, korean, comment_in_korean)
    rc = E.prove(tmp_path / "dist", timeout=30, jobs=2, root=root, do_build=False)
    out = capsys.readouterr().out
    print(out)
    assert rc == 1
    assert "solution line leaked" in out and "positions[None, :] < lengths[:, None]" in out
    assert "question q2 has no hidden test" in out
    assert "wrong:actually_right: expected strictly between 0 and 100 %; scored 7/7" in out
    assert "full marks on the question(s) it answers wrongly: q3" in out
    assert "no 'stub' entry" in out and "question q1 has no recorded wrong answer" in out
    assert ("wrong:broken_edit: its code for q2 fails when run (NameError: name 'CJK_' is not defined); "
            "a wrong answer must run") in out
    # every constant is tried: only the one the stub cheats on fails; the right letter is never used
    stubs = out.split("04_stubs/sdpa_padding")[1]
    assert "stub[0]=0% stub[1]=" in stubs and "stub[1]=0%" not in stubs and "stub[0.5]=0% stub[-1]=0%" in stubs
    assert "- stub[1]: a stub must score 0" in stubs and "- stub[0]:" not in stubs
    ours = out.split("04_stubs/sdpa_padding")[0]
    assert "- the ko student notebook: cell" in ours and "(code) differs from the English notebook's" in ours
    assert "student[ko]" not in stubs   # no catalog for this set: no Korean notebook


def test_markdown_cells_are_cut_into_paragraphs_and_translated_in_place(tmp_path):
    """The message unit of the student notebooks' translations: a paragraph of a Markdown cell; a fenced
    code block or a display formula is none; a translated notebook is the English one but for them."""
    cell = "# Title\n\nOne paragraph\non two lines.\n\n```\nx = 1\n\ny = 2\n```\n\n$$a = b$$\n\n* (a) one\n* (b) two"
    pieces = E.segments(cell)
    assert "".join(text for text, _ in pieces) == cell
    assert [text for text, is_message in pieces if is_message] == [
        "# Title", "One paragraph\non two lines.", "* (a) one\n* (b) two"]
    for m in E.discover():
        for c in nbformat.read(str(m.path), as_version=4).cells:
            if c.cell_type == "markdown":
                assert "".join(text for text, _ in E.segments(c.source)) == c.source, m.key
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(cell), nbformat.v4.new_code_cell("x = 1")])
    english, korean = tmp_path / "en.ipynb", tmp_path / "ko.ipynb"
    nbformat.write(nb, str(english))
    assert E.translate(english, korean, {"# Title": "# 제목", "* (a) one\n* (b) two": "* (a) 하나\n* (b) 둘"}) == 1
    translated = nbformat.read(str(korean), as_version=4).cells
    assert translated[0].source == cell.replace("# Title", "# 제목").replace("* (a) one\n* (b) two", "* (a) 하나\n* (b) 둘")
    assert E.differences(english, korean) == []

    def change_the_code(nb):
        nb.cells[1].source = "x = 2"
    _variant(korean, korean, change_the_code)
    assert E.differences(english, korean) == ["cell 2 (code) differs from the English notebook's "
                                              "(only the text of Markdown cells may)"]


def test_a_wrong_answer_whose_own_code_fails_proves_nothing():
    """check_expectation: a wrong answer whose replaced cell raises (a botched edit) is reported;
    an error in another cell is not its own; an `expect: zero` answer (calls lib) may fail to run."""
    g = E.Grade("x", {"q1": 1.0, "q2": 0.0}, {"q1": 2.0, "q2": 2.0},
                ["cell 5: NameError: name 'x' is not defined", "cell 7: ZeroDivisionError: division by zero"])
    assert E.check_expectation(g, ("between", ["q2"], False, {"q2": 5})) == [
        "its code for q2 fails when run (NameError: name 'x' is not defined); a wrong answer must run"]
    assert E.check_expectation(g, ("between", ["q2"], False, {"q2": 6})) == []
    assert E.check_expectation(g, ("between", ["q2"], True, {"q2": 5})) == []


def _mc_info(answers: dict[str, tuple[str, dict[str, str]]]):
    return E.MasterInfo({}, list(answers), {}, {}, [], [],
                        choices={q: (f"{q}_answer", right) for q, (right, _) in answers.items()},
                        options={q: opts for q, (_, opts) in answers.items()})


def test_choice_balance_is_checked_per_set_and_over_the_book():
    short = {"a": "one wrong option", "b": "one right option", "c": "another wrong one", "d": "a fourth option"}
    long_right = dict(short, b="the right option, two or three times longer than any of the wrong ones")
    same_letter = {"s1": _mc_info({"q1": ("b", short), "q2": ("b", short)}),
                   "s2": _mc_info({"q1": ("b", short), "q2": ("a", short)})}
    per_set, book, summary = E.choice_problems(same_letter, whole_book=True)
    assert "'b' is the right letter of 2 of the set's 2 questions" in " ".join(per_set["s1"]) and not per_set["s2"]
    assert any("'b' is right in 3 of the book's 4 questions" in p for p in book), book
    assert "right letters a=1 b=3" in summary
    assert E.choice_problems(same_letter, whole_book=False)[1] == []   # one set: no book-level verdict
    longest = {"s1": _mc_info({"q1": ("b", long_right), "q2": ("a", dict(short, a="x" * 20))})}
    per_set, book, _ = E.choice_problems(longest, whole_book=True)
    assert any("q1: the right option" in p and "much longer" in p for p in per_set["s1"]), per_set
    assert any("the right option is the longest in 2 of 2" in p for p in book), book
    balanced = {f"s{i}": _mc_info({"q1": (letter, short)}) for i, letter in enumerate("abcd")}
    assert E.choice_problems(balanced, whole_book=True)[1:] == ([], "multiple choice: 4 question(s), right letters "
                                                                 "a=1 b=1 c=1 d=1, the right option the longest in 1")


def test_stub_variants_try_every_constant_every_wrong_letter_and_the_input():
    info = E.parse_master(ROOT / "exercises" / "03_transformer" / "transformer_parts.ipynb")
    stub = {q: "x = STUB_CONSTANT" for q in info.questions}
    variants = E.stub_variants(info, stub)
    assert [label for label, _, _ in variants] == [f"stub[{c:g}]" for c in E.STUB_CONSTANTS] + ["stub[input]"]
    for q, (name, right) in info.choices.items():
        letters = {rep[q].split("=")[1].strip().strip("'") for _, rep, _ in variants[:-1]}
        assert letters == set("abcd") - {right}, (q, letters)
    for c, (_, rep, expect) in zip(E.STUB_CONSTANTS, variants):
        assert expect == "stub" and rep["q1"] == f"STUB_CONSTANT = {c!r}\nx = STUB_CONSTANT"
    _, echo, expect = variants[-1]
    assert set(echo) == {"q1", "q2", "q3", "q4"} and expect == ("zero on", ["q1", "q2", "q3", "q4"])
    assert "def split_heads(*args, **kwargs)" in echo["q2"] and "def merge_heads(*args, **kwargs)" in echo["q2"]


def test_leak_detector_reads_outputs_and_metadata(dist, tmp_path):
    m = next(m for m in E.discover() if m.key == SET)
    info = E.parse_master(m.path)
    assert any(k == "hidden test" for k, _ in info.secrets) and any(k == "solution" for k, _ in info.secrets)
    assert E.find_leaks(m.student_nb(dist), info) == []
    secret = next(s for k, s in info.secrets if k == "hidden test")
    for where in ("output", "metadata"):
        nb = nbformat.read(str(m.student_nb(dist)), as_version=4)
        if where == "output":
            nb.cells[1].outputs = [nbformat.v4.new_output("stream", text=secret)]
        else:
            nb.metadata["extra"] = {"note": secret}
        p = tmp_path / f"{where}.ipynb"
        nbformat.write(nb, str(p))
        assert E.find_leaks(p, info), where


# ----------------------------------------------------------------------------- the grader

def _cell_index(nb, needle: str) -> int:
    return next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and needle in c.source)


def _variant(base: Path, out: Path, fn) -> Path:
    nb = nbformat.read(str(base), as_version=4)
    fn(nb)
    nbformat.write(nb, str(out))
    return out


@pytest.fixture(scope="module")
def graded(dist, tmp_path_factory):
    m = next(m for m in E.discover() if m.key == SET)
    sub = tmp_path_factory.mktemp("submissions")
    sol, blank = m.solution_nb(dist), m.student_nb(dist)
    shutil.copy(sol, sub / "solution.ipynb")
    shutil.copy(blank, sub / "blank.ipynb")

    def loop_in_q2_cell(nb):      # the q2 cell never finishes: interrupted, q2 scores 0
        i = _cell_index(nb, "def padding_mask")
        nb.cells[i].source = "while True:\n    pass\n" + nb.cells[i].source
    _variant(sol, sub / "loop_cell.ipynb", loop_in_q2_cell)

    def loop_when_called(nb):     # q1's function loops when the tests call it
        i = _cell_index(nb, "def attention")
        nb.cells[i].source = nb.cells[i].source.replace('"""Scaled', 'while True:\n        pass\n    """Scaled', 1)
    _variant(sol, sub / "loop_in_tests.ipynb", loop_when_called)

    def ignores_interrupt(nb):    # SIGINT ignored: the kernel is killed and the notebook replayed
        i = _cell_index(nb, "q3_answer")
        nb.cells[i].source = ("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                              "while True:\n    time.sleep(0.1)\n" + nb.cells[i].source)
    _variant(sol, sub / "ignores_interrupt.ipynb", ignores_interrupt)

    def raises(nb):
        i = _cell_index(nb, "def attention")
        nb.cells[i].source = "raise RuntimeError('boom')\n" + nb.cells[i].source
    _variant(sol, sub / "raises.ipynb", raises)

    def exits(nb):                # os._exit kills the kernel in the q3 cell
        i = _cell_index(nb, "q3_answer")
        nb.cells[i].source = "import os\nos._exit(1)\n" + nb.cells[i].source
    _variant(sol, sub / "os_exit.ipynb", exits)

    def cheats(nb):               # blank answers + every obvious way to fake a score
        nb.cells.append(nbformat.v4.new_code_cell(
            "import torch, builtins\n"
            "def attention(q, k, v, mask=None):\n"
            "    w = torch.zeros(*q.shape[:-1], k.shape[-2], dtype=q.dtype)\n"
            "    return torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype), w\n"
            "def padding_mask(lengths, max_len=None):\n"
            "    return torch.zeros(len(lengths), max_len or int(lengths.max()), dtype=torch.bool)\n"
            "class grader:\n"
            "    @staticmethod\n"
            "    def check(*a, **k): return True\n"
            "def test_case(*a, **k): return lambda f: None\n"
            "AssertionError = Exception\n"
            "torch.allclose = lambda *a, **k: True\n"
            "torch.equal = lambda *a, **k: True\n"
            "torch.all = lambda *a, **k: True\n"
            "import otter.test_files.abstract_test as _a\n"
            "_a.TestFile.score = property(lambda self: 100)\n"
            "print('@@GRADE-0@@{\"results\": [], \"tampered\": []}')\n"
            "class _Yes(str):\n"
            "    def __eq__(self, other): return True\n"
            "    def strip(self): return self\n"
            "    def lower(self): return self\n"
            "    __hash__ = str.__hash__\n"
            "q3_answer = _Yes('z')\n"))
    _variant(blank, sub / "cheater.ipynb", cheats)
    (sub / "not_a_notebook.ipynb").write_text("{ this is not json")

    def huge_answer(nb):          # q1 answers 80 MB: refused in the kernel, noted, q1 scores 0
        i = _cell_index(nb, "def attention")
        nb.cells[i].source += "\n_real_attention = attention\ndef attention(*a, **k):\n    return torch.zeros(20_000_000), None\n"
    _variant(sol, sub / "huge_answer.ipynb", huge_answer)

    def huge_output(nb):          # a cell prints 200 MB at once: the grader drops the message
        nb.cells.append(nbformat.v4.new_code_cell("print('x' * 200_000_000)"))
    _variant(sol, sub / "huge_output.ipynb", huge_output)
    csv_path = sub / "grades.csv"
    _attacks(blank, sub, m.zip_path(dist), csv_path)

    t0 = time.monotonic()
    rc = E.main(["grade", str(sub), "--autograder", str(m.zip_path(dist)), "--timeout", str(TIMEOUT),
                 "--out", str(csv_path), "--jobs", "2"])
    elapsed = time.monotonic() - t0
    assert rc == 0
    with open(csv_path, newline="") as f:
        rows = {r["file"]: {**r, "_csv": str(csv_path)} for r in csv.DictReader(f)}
    return rows, elapsed


# ----------------------------------------------------------------------------- attacks
# Each hostile submission below worked against the previous grader (issue 10). Every one answers
# q3 ("b" is right) ONLY when its attack succeeded, so q3 = 0 proves the attack failed; their
# other answers are blank. The zip, the grader and the CSV paths are written into the notebooks:
# an attacker that knows them must still not reach them.

ATTACKS = ("proc_cmdline", "pre_run_cell_hook", "json_dumps", "input_transformer", "detached_rewriter")
MARKER = "ATTACK-DETACHED-7f3a"


def _attacks(blank: Path, sub: Path, zip_path: Path, csv_path: Path) -> None:
    paths = (f"ZIP = {str(zip_path)!r}\nGRADER = {str(ROOT / 'tools' / 'exercises.py')!r}\n"
             f"CSV = {str(csv_path)!r}\n")
    code = {
        # read every hidden test from the autograder zip, found through /proc/<ppid>/cmdline
        # (or any process's), or at its known path; the grader's own source; print them to the notes
        "proc_cmdline": paths + """
import os, zipfile, re
found = []
for pid in [os.getppid()] + [p for p in os.listdir('/proc') if p.isdigit()]:
    try:
        cmd = open(f'/proc/{pid}/cmdline', 'rb').read().decode(errors='replace')
    except OSError:
        continue
    found += re.findall(r'[^\\x00 ]+autograder[^\\x00 ]*\\.zip', cmd)
stolen = ''
for z in found + [ZIP]:
    try:
        with zipfile.ZipFile(z) as f:
            stolen += ''.join(f.read(n).decode() for n in f.namelist() if n.startswith('tests/'))
    except Exception:
        pass
try:
    stolen += open(GRADER).read()
except OSError:
    pass
q3_answer = 'b' if stolen else 'a'
if stolen:
    raise RuntimeError('LEAKED ' + stolen[:3000])
""",
        # capture each test file (and its nonce) with an IPython pre_run_cell hook
        "pre_run_cell_hook": """
import json
seen = []
def _hook(info):
    seen.append(info.raw_cell)
    if any('def test_' in c or 'assert ' in c for c in seen):
        get_ipython().user_ns['q3_answer'] = 'b'
get_ipython().events.register('pre_run_cell', _hook)
q3_answer = 'a'
""",
        # patch json.dumps so that whatever the grader serialises reads as 'all passed'
        "json_dumps": """
import json
_real = json.dumps
def _fake(obj, *a, **k):
    if isinstance(obj, dict) and 'results' in obj:
        obj = {'results': [[r[0], True, ''] for r in obj['results']], 'tampered': []}
    if isinstance(obj, dict) and 'value' in obj:
        obj = {'value': True}
    return _real(obj, *a, **k)
json.dumps = _fake
q3_answer = 'a'
""",
        # rewrite the grader's calls with an IPython input transformer: answer every request 'passed'
        "input_transformer": """
import re
def _rewrite(lines):
    src = ''.join(lines)
    m = re.search(r"(@@[A-Z]+-[0-9a-f]+@@)", src)
    if src.startswith('_grader_') and m:
        n = m.group(1)
        ok = '{"results": [["x", true, ""]], "tampered": []}'
        return [f"print('\\\\n' + {n!r} + {ok!r})\\n"]
    return lines
get_ipython().input_transformers_post.append(_rewrite)
q3_answer = 'a'
""",
        # leave a detached process that rewrites the CSV after grading (console 0, CSV 100 %)
        "detached_rewriter": paths + f"""
import subprocess
loop = ('while true; do printf "file,q1,q2,q3,total,possible,percent,notes\\\\nhacked.ipynb,4,2,1,7,7,100.0,\\\\n" > "$0";'
        ' sleep 0.2; done')
subprocess.Popen(['/bin/sh', '-c', loop, CSV, '{MARKER}'], start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
q3_answer = 'a'
""",
    }
    assert set(code) == set(ATTACKS)
    for name, src in code.items():
        def add(nb, src=src):
            nb.cells.append(nbformat.v4.new_code_cell(src))
        _variant(blank, sub / f"attack_{name}.ipynb", add)


def _marker_processes() -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if MARKER.encode() in (p / "cmdline").read_bytes():
                    out.append(int(p.name))
            except OSError:
                pass
    return out


def _scores(row):
    return {q: float(row[q]) for q in ("q1", "q2", "q3")}


FULL = {"q1": 4.0, "q2": 2.0, "q3": 1.0}


def test_a_korean_notebook_grades_exactly_as_the_english_one(dist, tmp_path):
    """The Korean student notebook filled with the solution (and left blank) gets the English one's grade."""
    m = next(m for m in E.discover() if m.key == SET)
    solution = {c.get("id"): c.source for c in nbformat.read(str(m.solution_nb(dist)), as_version=4).cells
                if c.cell_type == "code"}

    def fill(nb):
        for c in nb.cells:
            if c.cell_type == "code" and c.get("id") in solution:
                c.source = solution[c.get("id")]

    sub = tmp_path / "submissions"
    sub.mkdir()
    for lang, name in ((None, "en"), ("ko", "ko")):
        student = m.student_nb(dist, lang)
        shutil.copy(student, sub / f"{name}_blank.ipynb")
        _variant(student, sub / f"{name}_solution.ipynb", fill)
    assert "트랜스포머" in (sub / "ko_solution.ipynb").read_text(encoding="utf-8")
    csv_path = tmp_path / "grades.csv"
    assert E.main(["grade", str(sub), "--autograder", str(m.zip_path(dist)), "--timeout", str(TIMEOUT),
                   "--out", str(csv_path), "--jobs", "2"]) == 0
    with open(csv_path, newline="") as f:
        rows = {r["file"]: r for r in csv.DictReader(f)}
    assert _scores(rows["en_solution.ipynb"]) == FULL
    assert _scores(rows["en_blank.ipynb"]) == dict.fromkeys(FULL, 0.0)
    for kind in ("solution", "blank"):
        en, ko = rows[f"en_{kind}.ipynb"], rows[f"ko_{kind}.ipynb"]
        assert {k: v for k, v in ko.items() if k != "file"} == {k: v for k, v in en.items() if k != "file"}, kind


def test_grader_csv_has_one_row_per_submission(graded):
    rows, elapsed = graded
    for r in rows.values():
        print(r)
    assert set(rows) == {"solution.ipynb", "blank.ipynb", "loop_cell.ipynb", "loop_in_tests.ipynb",
                         "ignores_interrupt.ipynb", "raises.ipynb", "os_exit.ipynb", "cheater.ipynb",
                         "not_a_notebook.ipynb", "huge_answer.ipynb", "huge_output.ipynb",
                         *(f"attack_{a}.ipynb" for a in ATTACKS)}
    assert [k for k in next(iter(rows.values())) if k != "_csv"] == ["file", "q1", "q2", "q3", "total", "possible",
                                                      "percent", "notes"]
    # Not a speed test: four submissions never finish a cell on their own, so an unbounded
    # grading run would hang. The bound is far above the ~2 minutes it takes on 2 cores.
    assert elapsed < 600, elapsed


def test_grader_solution_and_blank(graded):
    rows, _ = graded
    assert _scores(rows["solution.ipynb"]) == FULL and rows["solution.ipynb"]["percent"] == "100.0"
    assert rows["solution.ipynb"]["notes"] == ""
    assert _scores(rows["blank.ipynb"]) == {"q1": 0, "q2": 0, "q3": 0}
    assert float(rows["blank.ipynb"]["total"]) == 0 and rows["blank.ipynb"]["possible"] == "7"


def test_grader_infinite_loop_costs_only_that_question(graded):
    rows, _ = graded
    assert _scores(rows["loop_cell.ipynb"]) == {**FULL, "q2": 0.0}, rows["loop_cell.ipynb"]["notes"]
    assert "timed out" in rows["loop_cell.ipynb"]["notes"]
    assert _scores(rows["loop_in_tests.ipynb"]) == {**FULL, "q1": 0.0}, rows["loop_in_tests.ipynb"]["notes"]
    assert "q1: tests timed out" in rows["loop_in_tests.ipynb"]["notes"]
    r = rows["ignores_interrupt.ipynb"]
    assert _scores(r) == {**FULL, "q3": 0.0}, r["notes"]
    assert "ignored the interrupt" in r["notes"]


def test_grader_errors_and_dead_kernels(graded):
    rows, _ = graded
    r = rows["raises.ipynb"]
    assert _scores(r) == {**FULL, "q1": 0.0} and "RuntimeError: boom" in r["notes"]
    r = rows["os_exit.ipynb"]
    assert _scores(r) == {**FULL, "q3": 0.0} and "killed the kernel" in r["notes"]
    r = rows["not_a_notebook.ipynb"]
    assert float(r["total"]) == 0 and "unreadable notebook" in r["notes"]


def test_grader_caps_what_crosses_the_boundary(graded):
    """An answer over MAX_ANSWER is refused in the kernel and noted; a message over MAX_MESSAGE
    (printed past the RPC server) is dropped by the grader's sockets: its cell is skipped."""
    rows, _ = graded
    r = rows["huge_answer.ipynb"]
    assert (r["q1"], r["q2"], r["q3"]) == ("0", "2", "1"), r
    assert "q1: an answer was larger than the limit of 16 MB and was refused" in r["notes"], r["notes"]
    r = rows["huge_output.ipynb"]
    assert r["percent"] == "100.0" and "re-ran the notebook without it" in r["notes"], r


def test_grader_cannot_be_fooled(graded):
    rows, _ = graded
    r = rows["cheater.ipynb"]
    assert float(r["total"]) == 0, r


@pytest.mark.parametrize("attack", ATTACKS)
def test_attack_fails(graded, attack):
    """Each attack of issue 10 scores 0 (its q3 is right only if the attack worked) and leaks nothing."""
    rows, _ = graded
    r = rows[f"attack_{attack}.ipynb"]
    assert float(r["total"]) == 0, r
    assert "LEAKED" not in r["notes"] and "def test_" not in r["notes"], r["notes"]
    if attack == "proc_cmdline":   # the reads failed inside the sandbox, the notebook ran on
        assert r["notes"].count("tests failed") == 3, r["notes"]


def test_attack_detached_process_is_killed_and_csv_intact(graded):
    """The detached rewriter died with its sandbox before the CSV was written; the CSV stays true."""
    rows, _ = graded
    assert _marker_processes() == [], "a process started by a submission outlived its grading"
    time.sleep(1.0)   # the rewriter loops every 0.2 s: had it survived, it would have struck by now
    assert "hacked.ipynb" not in rows
    csv_path = next(iter(rows.values()))["_csv"]
    with open(csv_path, newline="") as f:
        again = {r["file"]: r for r in csv.DictReader(f)}
    assert set(again) == set(rows) and again["attack_detached_rewriter.ipynb"]["percent"] == "0.0"


def test_sandbox_hides_files_network_and_kills_tree(tmp_path):
    """The kernel sees no grader file and no network, cannot write outside its box, and its whole
    process tree (including a detached, new-session child) dies with it."""
    box = tmp_path / "box"
    k = E.Kernel(box)
    try:
        probes = {
            "grader": f"open({str(ROOT / 'tools' / 'exercises.py')!r})",
            "lib": "import lib",
            "network": "import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)",
            "write_etc": "open('/etc/attack', 'w')",
        }
        for what, code in probes.items():
            r = k.execute(code, 20)
            assert r.status == "error", (what, r)
        # the checkout is not there to write to (a checkout under /tmp: the write lands in the
        # sandbox's private /tmp, which is fine as long as the real checkout is untouched)
        k.execute(f"open({str(ROOT / 'attack.txt')!r}, 'w').write('x')", 20)
        assert not (ROOT / "attack.txt").exists()
        r = k.execute("open('inside.txt', 'w').write('ok')", 20)
        assert r.status == "ok" and (box / "work" / "inside.txt").read_text() == "ok"
        # the sandbox's /tmp is private: a write next to its box lands there, not on the host
        r = k.execute(f"open({str(tmp_path / 'outside.txt')!r}, 'w').write('x')", 20)
        assert not (tmp_path / "outside.txt").exists()
        r = k.execute("import os; print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))", 20)
        assert r.status == "ok" and max(eval(r.stdout.strip())) < 100, "the sandbox sees the host's processes"
        r = k.execute("import subprocess; subprocess.Popen(['/bin/sh', '-c', 'sleep 300', '" + MARKER + "'], "
                      "start_new_session=True)", 20)
        assert r.status == "ok" and _marker_processes(), "the child should be running while the kernel lives"
    finally:
        k.kill()
    assert k.ns and E.processes_in_ns(k.ns) == []
    assert _marker_processes() == []
    assert not (ROOT / "attack.txt").exists()


def test_sandbox_works_with_python_and_box_under_tmp_and_spaces():
    """Nothing depends on where the checkout, the venv or the Python live: a venv under /tmp in a
    folder whose name has a space runs in a sandbox whose box is there too (the private /tmp must
    not hide them), and a real kernel starts with its box (sockets, notebook) under such a path."""
    import subprocess
    import sys
    import tempfile
    top = Path(tempfile.mkdtemp(prefix="grader dir with space ", dir="/tmp"))
    try:
        venv = top / "a venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        box = top / "the box"
        (box / "work").mkdir(parents=True)
        code = "import sys, json; open('out.txt', 'w').write(sys.prefix); print(json.dumps(sys.path))"
        argv = E.sandbox_argv(box, [str(venv / "bin" / "python"), "-c", code], {"PATH": "/usr/bin:/bin"},
                              python_dirs=[sys.base_prefix, str(venv)])
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert (box / "work" / "out.txt").read_text() == str(venv)
        k = E.Kernel(top / "kernel box")
        try:
            r = k.execute("import os; print(os.getcwd())", 60)
            assert r.status == "ok" and r.stdout.strip() == str(top / "kernel box" / "work"), r
        finally:
            k.kill()
    finally:
        shutil.rmtree(top, ignore_errors=True)


_POINTS_TEST_FILE = """from otter.test_files import test_case
OK_FORMAT = False
name = "q1"
points = {points}

@test_case(points=None, hidden=False)
def test_public(x):
    assert x is not None

@test_case(points=None, hidden=True)
def test_a(x):
    assert x in (1, 3)

@test_case(points=None, hidden=True)
def test_b(x):
    assert x in (2, 3)
"""


@pytest.mark.parametrize("points, x, score", [
    ("[0, 3, 1]", 1, 3.0), ("[0, 3, 1]", 2, 1.0), ("[0, 3, 1]", 3, 4.0), ("[0, 3, 1]", 0, 0.0),
    ("4", 1, 2.0), ("4", 2, 2.0), ("4", 3, 4.0)])
def test_points_list_weights_each_hidden_test(points, x, score):
    """A master's list of per-test points is honoured (each hidden test earns its own); one number is
    shared equally among the hidden tests; the public test earns nothing either way."""
    src = _POINTS_TEST_FILE.format(points=points)
    tf = E.test_file("q1", src)
    tf.run({"x": x})
    assert E.question_score(tf, src) == score
    assert tf.possible == 4


def test_in_place_changes_to_arguments_reach_the_test(tmp_path):
    """Arguments cross as copies, but a tensor, list or dict the notebook changes in place is changed
    in the test too, so that a hidden test can check that a function leaves its input alone."""
    import torch
    k = E.Kernel(tmp_path / "box")
    try:
        runner = "_grader_test"
        assert k.execute(E._setup_cell(runner), 60).status == "ok"
        src = ("import torch\n"
               "def bump(x, d=None):\n    x.add_(1)\n    d['y'].mul_(3)\n    return x.sum()\n"
               "def pure(x):\n    return x + 1\n")
        assert k.execute(src, 60).status == "ok"
        remote = E.Remote(k, runner, 30, time.monotonic() + 60)
        x, y = torch.zeros(3), torch.ones(2)
        assert float(remote.get("bump")(x, d={"y": y})) == 3.0
        assert x.tolist() == [1.0, 1.0, 1.0] and y.tolist() == [3.0, 3.0]
        z = torch.zeros(2)
        assert remote.get("pure")(z).tolist() == [1.0, 1.0] and z.tolist() == [0.0, 0.0]
        src = ("def sort_and_tag(ids, nested, meta):\n    ids[1:3] = [0]\n    nested[0].sort()\n"
               "    nested[1].add_(1)\n    meta['seen'] = True\n    return len(ids)\n"
               "def reads(ids, meta):\n    return sum(ids) + len(meta)\n")
        assert k.execute(src, 60).status == "ok"
        ids, spans, meta, t = [5, 6, 7, 8], [(4, 5), (1, 2)], {"n": 1}, torch.ones(2)
        assert remote.get("sort_and_tag")(ids, [spans, t], meta=meta) == 3
        assert ids == [5, 0, 8] and spans == [(1, 2), (4, 5)] and meta == {"n": 1, "seen": True}
        assert t.tolist() == [2.0, 2.0]
        ids, meta = [1, 2], {"n": 1}
        assert remote.get("reads")(ids, meta) == 4 and ids == [1, 2] and meta == {"n": 1}
    finally:
        k.kill()


def test_the_wire_module_reaches_the_sandbox_and_both_sides_speak_it(tmp_path):
    """The setup cell ships wire.py with the kernel server into a real sandbox (where neither the
    checkout nor the package is visible) without leaving names in the notebook; values of every kind
    cross both ways; the server refuses a malformed request with a WireError, and the grader refuses
    a malformed reply (a submission that replaced the server) with a RemoteError."""
    import numpy as np
    import torch
    k = E.Kernel(tmp_path / "box")
    try:
        runner = "_grader_test"
        names = "print(sorted(n for n in globals() if not n.startswith('_i') and n != '_'))"
        before = k.execute(names, 20).stdout
        assert k.execute(E._setup_cell(runner), 60).status == "ok"
        after = k.execute(names, 20).stdout
        assert set(eval(after)) - set(eval(before)) == {runner}, after
        src = ("import torch, numpy as np\n"
               "def echo(*a, **kw):\n    return a, kw\n"
               "data = {'bf': torch.ones(2, dtype=torch.bfloat16), 'arr': np.arange(3), 'n': np.int64(5)}\n")
        assert k.execute(src, 60).status == "ok"
        remote = E.Remote(k, runner, 30, time.monotonic() + 60)
        sent = ((torch.tensor([1.5], dtype=torch.bfloat16), np.ones((2, 2)), torch.int8, "s"), {"k": [None, 2.5]})
        a, kw = remote.get("echo")(*sent[0], **sent[1])
        assert a[0].dtype == torch.bfloat16 and a[0].item() == 1.5 and np.array_equal(a[1], np.ones((2, 2)))
        assert a[2:] == (torch.int8, "s") and kw == {"k": [None, 2.5]}
        data = remote.get("data")
        assert data["bf"].dtype == torch.bfloat16 and data["arr"].tolist() == [0, 1, 2] and data["n"] == 5
        r = k.execute(f"{runner}('@@N@@', '{{\"op\": \"get\"}}')", 20)
        assert E.wire.read_reply(r.stdout, "@@N@@")["exc"] == ["WireError", "request 'get': missing field(s) name"]
        # the submission replaces the server with one that answers garbage
        k.execute(f"def {runner}(nonce, payload):\n    print(nonce + '{{\"value\": 1, \"score\": 100}}')", 20)
        with pytest.raises(E.RemoteError, match="malformed answer: reply: unknown field 'score'"):
            remote.get("data")
    finally:
        k.kill()


def test_sanitize_drops_only_otter_calls():
    src = 'import otter\ngrader = otter.Notebook("x.ipynb")\nx = 1\n  grader.check("q1")\nprint(x)'
    out = E._sanitize(src).splitlines()
    assert out[2] == "x = 1" and out[4] == "print(x)"
    assert all("removed by the grader" in out[i] for i in (0, 1, 3)) and out[3].startswith("  pass")


def test_grader_never_kills_its_own_pid_namespace():
    """kill() SIGKILLs every process of a sandbox's PID namespace: the grader's own must be refused."""
    import os
    own = E._pid_ns(os.getpid())
    with pytest.raises(RuntimeError, match="own PID namespace"):
        E.processes_in_ns(own)
    with pytest.raises(RuntimeError):
        E.processes_in_ns("")


def test_kernel_server_answers_with_data_and_caps_its_answers(capsys):
    """The kernel-side server (tools/grader/kernel_server.py) run in this process with the wire module:
    a name comes back as data, a function as a handle, an answer over the limit as AnswerTooLarge,
    and a malformed request as a WireError that says what is wrong."""
    import torch
    from tools.grader import kernel_server, wire
    ns = {"x": torch.arange(3.0), "f": lambda t: t * 2, "big": torch.zeros(1000)}
    kernel_server._setup("run", ns, wire, max_answer=1024)

    def ask(text):
        ns["run"]("@@N@@", text)
        return wire.read_reply(capsys.readouterr().out, "@@N@@")

    assert torch.equal(wire.decode(ask(wire.request("get", name="x"))["value"]), torch.arange(3.0))
    assert ask(wire.request("get", name="nothing")) == {"missing": True}
    f = ask(wire.request("get", name="f"))["value"]
    assert f == {"__h__": 1, "type": "function"}
    out = ask(wire.request("call", h=1, args=wire.encode([torch.tensor([1.5])]), kwargs=wire.encode({}), grad=False))
    assert torch.equal(wire.decode(out["value"]), torch.tensor([3.0])) and "changed" not in out
    assert ask(wire.request("get", name="big"))["exc"][0] == "AnswerTooLarge"
    assert ask('{"op": "nonsense"}')["exc"] == ["WireError", "unknown request kind 'nonsense' (expected one of "
                                                "get, call, getattr, getitem, iter, len, vjp)"]
    assert ask(wire.request("len", h=99))["exc"] == ["WireError", "no object with handle 99"]


def test_grade_csv_cells_never_read_as_formulas(tmp_path):
    from tools.grader.grade import Grade, write_csv
    grades = [Grade("=1+1,forged.ipynb", {"q1": 1.0}, {"q1": 1.0}, ["@SUM(A1:A9)"]),
              Grade("-2+3.ipynb", {"q1": 0.0}, {"q1": 1.0}, []), Grade("plain.ipynb", {"q1": 1.0}, {"q1": 1.0}, [])]
    out = tmp_path / "grades.csv"
    write_csv(grades, ["q1"], out)
    with open(out, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [r["file"] for r in rows] == ["'=1+1,forged.ipynb", "'-2+3.ipynb", "plain.ipynb"]
    assert rows[0]["notes"] == "'@SUM(A1:A9)" and rows[0]["q1"] == "1" and rows[1]["total"] == "0"
    assert not any(v.startswith(("=", "+", "-", "@")) for r in rows for v in r.values())
