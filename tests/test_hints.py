"""Hint tiers: each names a real check, the second one a real section of its notebook, none contains a line of
the solution, and ``hint()`` walks through them one by one, recording the tier in the ledger. And the policy
for AI assistants (AGENTS.md and the files assistants read) that keeps them from writing the answers."""
from __future__ import annotations

import importlib
import json
import pkgutil
import re

import nbformat
import pytest

from course_tools import checks, progress
from course_tools.checks import CheckFailed, hint
from tests.support.notebook_cells import ROOT
from tests.support.quiz_leaks import graded_hits

# Every notebook's check module (course_tools/checks/nbNN_*.py), found, not listed: a new one is held to the tiers
# at once. 10's checks run scripts, so their answer is the reference scripts: their own test at the end.
CHECK_MODULES = tuple(sorted(info.name for info in pkgutil.iter_modules(checks.__path__)
                             if re.match(r"nb\d\d[a-z]?_", info.name)))
WITH_TIERS = tuple(name for name in CHECK_MODULES if name != "nb10_homework")
_MARKUP = re.compile(r"[`*]")


def _module(name: str):
    return importlib.import_module(f"course_tools.checks.{name}")


def _notebook(module: str) -> nbformat.NotebookNode:
    prefix = re.match(r"nb(\d\d[a-z]?)_", module).group(1)   # nb08b_flops_memory -> 08b_*.ipynb
    path, = (ROOT / "solutions").glob(f"{prefix}_*.ipynb")
    return nbformat.read(path, as_version=4)


def _solution_lines(module: str) -> list[str]:
    """The code lines a learner writes (between the solution markers), comments cut, spaces squeezed."""
    lines, inside = [], False
    for cell in _notebook(module).cells:
        if cell.cell_type != "code" or "exercise" not in cell.get("metadata", {}).get("tags", []):
            continue
        for line in cell.source.splitlines():
            if "### BEGIN SOLUTION" in line or "### END SOLUTION" in line:
                inside = "BEGIN" in line
            elif inside:
                code = " ".join(line.split("#")[0].split())
                if len(code) >= 6:
                    lines.append(code)
    return lines


def _headings(module: str) -> list[str]:
    found = []
    for cell in _notebook(module).cells:
        if cell.cell_type == "markdown":
            found += [re.sub(r"^\d+\.\s*", "", _MARKUP.sub("", line.lstrip("#")).strip())
                      for line in cell.source.splitlines() if line.startswith("#")]
    return found


def _tiers():
    for name in WITH_TIERS:
        for check, tiers in _module(name).HINTS.items():
            yield name, check, tiers


@pytest.mark.parametrize("name", WITH_TIERS)
def test_every_check_the_notebook_calls_has_two_or_three_tiers(name):
    module = _module(name)
    called = {ex.check.split(".")[1] for ex in progress.exercises(ROOT / "solutions") if ex.check.startswith(name + ".")}
    assert called and called <= set(module.HINTS)  # (nb12's check_cases is a public helper, not a check)
    assert all(callable(getattr(module, check)) and check in module.__all__ for check in module.HINTS)
    assert all(2 <= len(t) <= 3 and all(len(s) > 20 for s in t) for t in module.HINTS.values())


@pytest.mark.parametrize("name,check,tiers", list(_tiers()), ids=lambda v: v if isinstance(v, str) else "")
def test_the_second_tier_names_a_section_of_the_notebook(name, check, tiers):
    assert any(heading and heading in _MARKUP.sub("", tiers[1]) for heading in _headings(name)), tiers[1]


@pytest.mark.parametrize("name,check,tiers", list(_tiers()), ids=lambda v: v if isinstance(v, str) else "")
def test_no_tier_contains_a_line_of_the_solution(name, check, tiers):
    solution = _solution_lines(name)
    assert len(solution) >= 2
    for tier in tiers:
        squeezed = " ".join(tier.split())
        for line in solution:
            assert line not in squeezed and line.replace(" ", "") not in squeezed.replace(" ", ""), (line, tier)


def test_the_needs_scaler_tiers_do_not_name_its_graded_answer():
    # the answer is "fp16 only", reached through finfo's smallest normal number (as the stub hint's test in 01)
    for tier in _module("nb01_amp").HINTS["check_needs_scaler"]:
        for answer in ("float16", "fp16", "bfloat16", "bf16", "smallest_normal", "tiny", "True", "False"):
            assert answer not in tier, (answer, tier)


def test_the_self_test_tiers_give_no_graded_answer_away():
    # the same detector as 09's stub hints and check messages: quoted values, letter groups, numbers, "q1: B"

    for check, tiers in _module("nb09_self_test").HINTS.items():
        for tier in tiers:
            assert not graded_hits(tier), (check, tier, graded_hits(tier))


@pytest.fixture
def ledger(tmp_path, monkeypatch):
    path = tmp_path / ".progress.json"
    monkeypatch.setenv("COURSE_PROGRESS", str(path))
    monkeypatch.setattr(checks, "_last_failed", None)
    monkeypatch.setattr(checks, "_tiers_shown", {})
    return path


def test_hint_walks_the_tiers_of_the_last_failed_check_and_records_them(ledger, capsys):
    from course_tools.checks.nb08_time_estimate import HINTS, check_estimate_hours

    hint()
    assert "还没有未通过的检查" in capsys.readouterr().out
    with pytest.raises(CheckFailed):
        check_estimate_hours(lambda n, e, b, s: n * e / s / 3600)
    tiers = HINTS["check_estimate_hours"]
    for shown in (1, 2, 3, 3):
        hint()
        out = capsys.readouterr().out
        assert f"提示 {shown}/{len(tiers)}" in out and tiers[shown - 1] in out
        assert json.loads(ledger.read_text())["checks"]["nb08_time_estimate.check_estimate_hours"]["hints"] == shown
    assert "最后一级" in out


def test_hint_by_name_or_function_and_a_check_without_tiers(ledger, capsys, monkeypatch):
    from course_tools.checks import nb03_ema
    from course_tools.checks.nb02_grad_clipping import HINTS, check_clip_audit

    hint("check_global_clip")
    assert HINTS["check_global_clip"][0] in capsys.readouterr().out
    hint(check_clip_audit)
    assert HINTS["check_clip_audit"][0] in capsys.readouterr().out
    monkeypatch.delitem(nb03_ema.HINTS, "check_ema_update")
    hint(nb03_ema.check_ema_update)
    assert "还没有分级提示" in capsys.readouterr().out


def test_a_bare_name_two_notebooks_share_asks_for_the_full_name(ledger, capsys, monkeypatch):
    from course_tools.checks import nb07_single_batch_overfit as nb07, nb12_loss_spikes as nb12

    hint("check_diagnose")                      # nb07 and nb12 both have one
    out = capsys.readouterr().out
    assert "nb07_single_batch_overfit.check_diagnose" in out and "nb12_loss_spikes.check_diagnose" in out
    monkeypatch.setattr(checks, "_last_failed", "nb12_loss_spikes.check_diagnose")
    hint("check_diagnose")                      # the one that failed last
    assert nb12.HINTS["check_diagnose"][0] in capsys.readouterr().out
    hint("nb07_single_batch_overfit.check_diagnose")
    assert nb07.HINTS["check_diagnose"][0] in capsys.readouterr().out


def test_a_pass_clears_the_last_failure(ledger, capsys):
    from course_tools.checks.nb08_time_estimate import check_estimate_hours

    with pytest.raises(CheckFailed):
        check_estimate_hours(lambda *a: 1.0)
    check_estimate_hours(lambda n, e, b, s: n * e / b / s / 3600)
    capsys.readouterr()
    hint()
    assert "还没有未通过的检查" in capsys.readouterr().out


ASSISTANT_FILES = ("CLAUDE.md", ".github/copilot-instructions.md", ".cursorrules")


def test_agents_md_keeps_assistants_out_of_the_solutions_and_the_readme_links_it():
    policy = (ROOT / "AGENTS.md").read_text(encoding="utf-8")
    assert "`solutions/`" in policy and "hint()" in policy and "CONTRIBUTING.md" in policy
    assert "Never" in policy and "teaching assistant" in policy
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme.count("[AGENTS.md](AGENTS.md)") == 2  # the Chinese and the English quick start
    for name in ASSISTANT_FILES:
        text = (ROOT / name).read_text(encoding="utf-8")
        assert "AGENTS.md" in text and "solutions/" in text, name


def test_the_check_modules_are_found():
    assert {"nb01_amp", "nb08b_flops_memory", "nb10_homework", "nb12_loss_spikes"} <= set(CHECK_MODULES)
    assert all(name in CHECK_MODULES for name in ("upgrades", "untrusted_files")) is False, "only the notebooks' checks"


def test_the_homework_checks_have_tiers_that_give_no_line_of_the_reference_scripts():
    # 10's checks run scripts, so the answer is the reference scripts in solutions/homework/, not exercise cells
    from course_tools.checks import nb10_homework

    assert set(nb10_homework.HINTS) == {u.check.__name__ for u in nb10_homework.UPGRADES}
    headings = _headings("nb10_homework")
    lines = {" ".join(line.split("#")[0].split()) for path in (ROOT / "solutions" / "homework").glob("*.py")
             for line in path.read_text(encoding="utf-8").splitlines()}
    lines = {line for line in lines if len(line) >= 12}
    assert len(lines) > 50
    for check, tiers in nb10_homework.HINTS.items():
        assert 2 <= len(tiers) <= 3 and all(len(t) > 20 for t in tiers), check
        assert any(h and h in _MARKUP.sub("", tiers[1]) for h in headings), (check, tiers[1])
        for tier in tiers:
            assert not [line for line in lines if line in " ".join(tier.split())], (check, tier)
