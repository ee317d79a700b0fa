"""The CI proof: solutions 100 %, blanks and stubs 0, wrong answers below full, no leaks,
balanced multiple choice."""
from __future__ import annotations

import concurrent.futures as cf
import shutil
import tempfile
import time
from pathlib import Path

import nbformat
import yaml

from .masters import (
    DIST, EXERCISES, Master, MasterInfo, discover, find_leaks, load_tests, parse_master, test_file,
)
from .build import build
from .grade import Grade, grade_notebook, points_list
from .translate import LANGUAGES, differences


def wrong_answers(m: Master) -> dict[str, dict]:
    if not m.wrong_path.exists():
        return {}
    data = yaml.safe_load(m.wrong_path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{m.wrong_path.name}: expected a mapping of wrong-answer ids")
    return data


def make_variant(solution_nb: Path, info: MasterInfo, replace: dict[str, str], out: Path) -> dict[str, int]:
    """Write the solution notebook with the solution cells of each question in ``replace`` replaced by
    one cell of the given code; -> question: the number of that cell among the code cells (from 1,
    as the grader's notes count them)."""
    nb = nbformat.read(str(solution_nb), as_version=4)
    first = {}
    for q, code in replace.items():
        ids = info.solution_cells.get(q)
        if not ids:
            raise ValueError(f"question {q!r} has no solution block in the master")
        positions = [i for i, c in enumerate(nb.cells) if c.get("id") in ids]
        if not positions:
            raise ValueError(f"cannot find the solution cell(s) of {q!r} in {solution_nb.name}")
        nb.cells[positions[0]].source = code.rstrip("\n")
        first[q] = nb.cells[positions[0]].get("id")
        for i in reversed(positions[1:]):
            del nb.cells[i]
    nbformat.write(nb, str(out))
    code = [c.get("id") for c in nb.cells if c.cell_type == "code"]
    return {q: code.index(cid) + 1 for q, cid in first.items()}


STUB = "stub"   # the reserved wrong-answer id of the stub (constants of the right shape, a wrong letter)


STUB_CONSTANTS = (0, 1, 0.5, -1)   # the values of STUB_CONSTANT in the stubs prove grades


def stub_variants(info: MasterInfo, stub: dict[str, str]) -> list[tuple[str, dict[str, str], object]]:
    """(label, replacements, expectation) of the stubs prove grades, each of which must score 0:

    - the set's ``stub`` entry once per value in STUB_CONSTANTS, with ``STUB_CONSTANT`` set to it
      (the stub's code builds its constant answers from it: zeros, ones, 0.5, -1), and each time
      another wrong letter for every multiple-choice question (all wrong letters get tried);
    - ``stub[input]``: every function a solution defines returns its first argument unchanged.
    """
    out = []
    for i, c in enumerate(STUB_CONSTANTS):
        rep = {}
        for q, code in stub.items():
            if q in info.choices:
                name, right = info.choices[q]
                wrong = [x for x in sorted(info.options.get(q) or "abcd") if x != right]
                rep[q] = f"{name} = {wrong[i % len(wrong)]!r}"
            else:
                rep[q] = f"STUB_CONSTANT = {c!r}\n{code}"
        out.append((f"stub[{c:g}]", rep, "stub"))
    echo = {q: "\n\n".join(f"def {f}(*args, **kwargs):\n    return args[0] if args else next(iter(kwargs.values()), None)"
                           for f in fns)
            for q, fns in info.functions.items() if fns and q not in info.choices}
    if echo:
        out.append(("stub[input]", echo, ("zero on", sorted(echo))))
    return out


def check_expectation(g: Grade, expect) -> list[str]:
    """Why grade ``g`` does not meet ``expect`` ('full', 'zero', 'stub' or ('between', questions))."""
    if expect == "full":
        return [] if abs(g.percent - 100.0) < 1e-9 else ["expected 100 %"]
    if expect == "zero":
        return [] if g.total == 0 else ["expected 0"]
    if expect == "stub":   # its public tests are checked over all constants (stub_public_failures)
        return [] if g.total == 0 else ["a stub must score 0"]
    if expect[0] == "zero on":
        scored = [q for q in expect[1] if g.scores.get(q, 0.0) != 0]
        return [f"scored on {', '.join(scored)}; expected 0 there"] if scored else []
    _, questions, zero, cells = (*expect, {})[:4]
    out = [] if 0.0 < g.percent < 100.0 else ["expected strictly between 0 and 100 %"]
    if not zero:   # a wrong answer whose own code fails to run proves nothing about the tests
        for q, n in sorted(cells.items()):
            out += [f"its code for {q} fails when run ({note.split(': ', 1)[1]}); a wrong answer must run"
                    for note in g.notes if note.startswith(f"cell {n}: ")]
    full = [q for q in questions if g.scores.get(q, 0.0) >= g.possible.get(q, 0.0)]
    if full:
        out.append(f"full marks on the question(s) it answers wrongly: {', '.join(full)}")
    scored = [q for q in questions if g.scores.get(q, 0.0) != 0]
    if zero and scored:
        out.append(f"expect: zero, but it scored on {', '.join(scored)}")
    return out


MAX_LETTER_SHARE = 0.4     # no letter may be the right one in more of the book's multiple-choice questions


MAX_LONGEST_SHARE = 0.4    # nor may the right option be the longest in more of them


MAX_LENGTH_RATIO = 1.25    # the right option is at most this much longer than the longest distractor


def choice_problems(infos: dict[str, MasterInfo], whole_book: bool) -> tuple[dict[str, list[str]], list[str], str]:
    """Multiple choice that cannot be guessed: per set, each letter is right at most ceil(n/4) times
    (n: the set's questions) and no right option is much longer than every distractor; over the whole
    book, no letter is right in more than MAX_LETTER_SHARE of the questions and the right option is the
    longest in at most MAX_LONGEST_SHARE. -> (problems per set, book problems, summary line)."""
    per_set: dict[str, list[str]] = {}
    letters: dict[str, int] = {}
    n = longest = 0
    for key, info in infos.items():
        out = per_set.setdefault(key, [])
        counts: dict[str, int] = {}
        for q, (_, right) in info.choices.items():
            opts = info.options.get(q) or {}
            others = [len(t) for letter, t in opts.items() if letter != right]
            if right not in opts or not others:
                continue
            n += 1
            letters[right] = letters.get(right, 0) + 1
            counts[right] = counts.get(right, 0) + 1
            longest += len(opts[right]) > max(others)
            if len(opts[right]) > MAX_LENGTH_RATIO * max(others):
                out.append(f"multiple choice {q}: the right option ({len(opts[right])} characters) is much longer "
                           f"than every other (at most {max(others)}); write distractors as long and as precise")
        cap = -(-len(info.choices) // 4)
        for letter, c in sorted(counts.items()):
            if c > cap:
                out.append(f"multiple choice: {letter!r} is the right letter of {c} of the set's "
                           f"{len(info.choices)} questions; spread the right letters")
    book = []
    if whole_book and n:
        for letter, c in sorted(letters.items()):
            if c > MAX_LETTER_SHARE * n:
                book.append(f"multiple choice: {letter!r} is right in {c} of the book's {n} questions "
                            f"(more than {MAX_LETTER_SHARE:.0%})")
        if longest > MAX_LONGEST_SHARE * n:
            book.append(f"multiple choice: the right option is the longest in {longest} of {n} questions "
                        f"(more than {MAX_LONGEST_SHARE:.0%})")
    summary = (f"multiple choice: {n} question(s), right letters "
               + " ".join(f"{k}={v}" for k, v in sorted(letters.items()))
               + f", the right option the longest in {longest}")
    return per_set, book, summary


def stub_public_failures(grades: list[Grade]) -> list[str]:
    """The public tests that no stub passes (each must pass for at least one STUB_CONSTANT: a stub
    that passes them and scores 0 shows they carry no points)."""
    failing = None
    for g in grades:
        failed = {f"{q}:{name}" for q, res in g.results.items() for name, hidden, passed in res
                  if not hidden and not passed} | {f"{q} (not run)" for q in set(g.scores) - set(g.results)}
        failing = failed if failing is None else failing & failed
    return sorted(failing or ())


def prove(dist: Path = DIST, only: list[str] | None = None, timeout: float = 60.0, jobs: int = 2,
          do_build: bool = True, root: Path = EXERCISES) -> int:
    t0 = time.time()
    masters = build(dist, only, root=root) if do_build else discover(root, only=only)
    if not masters:
        print("no exercise masters found")
        return 0
    failures: dict[str, list[str]] = {m.key: [] for m in masters}
    jobs_list = []   # (master, variant label, notebook path, expectation)
    tmp = Path(tempfile.mkdtemp(prefix="prove-"))
    tests_by = {}
    infos: dict[str, MasterInfo] = {}
    shipped: dict[str, list[str]] = {m.key: [] for m in masters}   # its sound translated student notebooks
    for m in masters:
        fail = failures[m.key].append
        try:
            info = infos[m.key] = parse_master(m.path)
        except Exception as e:
            fail(f"cannot parse the master: {type(e).__name__}: {e}")
            continue
        for p in info.problems:
            fail(p)
        tests_cfg = (info.config or {}).get("tests") or {}
        if tests_cfg.get("ok_format", True) is not False:
            fail("assignment config must set tests: ok_format: false (exception-based tests)")
        if not info.questions:
            fail("no questions")
        for q in info.questions:
            if info.hidden_tests.get(q, 0) < 1:
                fail(f"question {q} has no hidden test")
            if not info.solution_cells.get(q):
                fail(f"question {q} has no raw '# BEGIN SOLUTION' block")
        if not m.student_nb(dist).exists() or not m.zip_path(dist).exists():
            fail("build outputs missing (run build)")
            continue
        for leak in find_leaks(m.student_nb(dist), info):
            fail(leak)
        for lang in LANGUAGES:   # a translated student notebook: the English one, Markdown text aside
            translated = m.student_nb(dist, lang)
            if translated.exists():
                problems = differences(m.student_nb(dist), translated) + find_leaks(translated, info)
                for problem in problems:
                    fail(f"the {lang} student notebook: {problem}")
                if not problems:
                    shipped[m.key].append(lang)
        try:
            tests = load_tests(m.zip_path(dist))
        except SystemExit as e:
            fail(str(e))
            continue
        tests_by[m.key] = tests
        for q, src in tests.items():
            cases = test_file(q, src).test_cases
            if not any(tc.hidden for tc in cases):
                fail(f"question {q} has no hidden test in the autograder zip")
            if points_list(src) is not None and any(tc.points for tc in cases if not tc.hidden):
                fail(f"question {q}: its points list gives points to a public test (public tests carry none)")
        missing = set(info.questions) - set(tests)
        if missing:
            fail(f"questions without tests in the autograder zip: {sorted(missing)}")
        jobs_list.append((m, "solution", m.solution_nb(dist), "full"))
        jobs_list.append((m, "blank", m.student_nb(dist), "zero"))
        try:
            wrongs = wrong_answers(m)
        except Exception as e:
            fail(f"{m.wrong_path.name}: {e}")
            wrongs = {}
        if not wrongs:
            fail(f"no wrong answers: add {m.wrong_path.name}")
        elif STUB not in wrongs:
            fail(f"{m.wrong_path.name}: no '{STUB}' entry (a stub answer for every question that passes the "
                 "public tests and must score 0)")
        else:
            stub_qs = set(((wrongs[STUB] or {}).get("replace") or {}))
            if stub_qs != set(info.questions):
                fail(f"{STUB}: must replace every question; missing {sorted(set(info.questions) - stub_qs)}")
        covered = {q for wid, spec in wrongs.items()
                   if wid != STUB and isinstance(spec, dict) and spec.get("expect") != "full"
                   for q in (spec.get("replace") or {})}
        for q in info.questions:
            if wrongs and q not in covered:
                fail(f"question {q} has no recorded wrong answer in {m.wrong_path.name}")
        for wid, spec in wrongs.items():
            rep = (spec or {}).get("replace") if isinstance(spec, dict) else None
            if not isinstance(rep, dict) or not rep:
                fail(f"wrong answer {wid}: needs a 'replace' mapping question -> code")
                continue
            unknown = set(rep) - set(info.questions)
            if unknown:
                fail(f"wrong answer {wid}: unknown question(s) {sorted(unknown)}")
                continue
            if wid == STUB:
                variants = stub_variants(info, rep)
            elif spec.get("expect") == "full":   # a correct answer written differently
                variants = [(f"right:{wid}", rep, "full")]
            else:
                variants = [(f"wrong:{wid}", rep, ("between", sorted(rep), spec.get("expect") == "zero"))]
            for n, (label, replace, expect) in enumerate(variants):
                out = tmp / f"{m.chapter}__{m.name}__{wid}__{n}.ipynb"
                try:
                    cells = make_variant(m.solution_nb(dist), info, replace, out)
                except Exception as e:
                    fail(f"{label}: {e}")
                    continue
                if expect[0] == "between":
                    expect = (*expect, cells)
                jobs_list.append((m, label, out, expect))

    def run_chunk(chunk):
        # our own notebooks are trusted: one kernel per worker, reset between notebooks
        pool: dict = {}
        try:
            return [(job, grade_notebook(job[2], tests_by[job[0].key], timeout, label=job[1], pool=pool))
                    for job in chunk]
        finally:
            if pool.get("kernel") is not None:
                pool["kernel"].kill()
            if pool.get("box"):
                shutil.rmtree(pool["box"], ignore_errors=True)

    n = max(1, min(jobs, len(jobs_list)))
    chunks = [jobs_list[i::n] for i in range(n)]
    results: dict[str, list] = {m.key: [] for m in masters}
    with cf.ThreadPoolExecutor(n) as ex:
        done = [r for chunk in ex.map(run_chunk, chunks) for r in chunk]
    order = {id(job): i for i, job in enumerate(jobs_list)}
    done.sort(key=lambda r: order[id(r[0])])
    for (m, label, path, expect), g in done:
        results[m.key].append((label, g))
        for problem in check_expectation(g, expect):
            failures[m.key].append(f"{label}: {problem}; scored {g.total:g}/{g.total_possible:g} "
                                   f"({g.percent:.1f} %); notes: {' | '.join(g.notes) or '-'}")
    for m in masters:
        stubs = [g for (mm, label, _, expect), g in done if mm is m and expect == "stub"]
        never = stub_public_failures(stubs) if stubs else []
        if never:
            failures[m.key].append("the stub must pass every public test for some STUB_CONSTANT (it shows they "
                                   "carry no points); no constant passes: " + ", ".join(never))
    shutil.rmtree(tmp, ignore_errors=True)
    per_set, book, choice_summary = choice_problems(infos, whole_book=only is None)
    for key, problems in per_set.items():
        failures[key] += problems

    print(f"\n{'exercise':40s} {'result':6s} details")
    for m in masters:
        parts = [f"{label}={g.percent:.0f}%" for label, g in results[m.key]]
        parts += [f"student[{lang}]=markdown-only" for lang in shipped[m.key]]
        status = "FAIL" if failures[m.key] else "ok"
        print(f"{m.key:40s} {status:6s} {' '.join(parts)}")
        for f in failures[m.key]:
            print(f"    - {f}")
    nfail = sum(1 for v in failures.values() if v)
    print(f"\n{choice_summary}" + ("" if only is None else " (the book's balance is checked when proving all sets)"))
    for problem in book:
        print(f"    - {problem}")
    print(f"{len(masters)} exercise set(s), {nfail} failing, {time.time() - t0:.0f} s")
    return 1 if nfail or book else 0
