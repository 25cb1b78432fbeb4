"""A failed check reads as four short Chinese lines in Jupyter, and the cell still ends in an error."""
from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from course_tools.checks import CheckFailed, call_learner, expect, failure_lines


def test_check_failed_message_keeps_expected_found_and_hint():
    with pytest.raises(CheckFailed) as info:
        expect(False, "loss < 0.05", "0.31", "先检查 optimizer.step()")
    assert str(info.value) == "期望 loss < 0.05;实际 0.31(提示: 先检查 optimizer.step())"
    assert isinstance(info.value, AssertionError)  # pytest.raises(AssertionError) keeps working


def test_stub_and_crash_name_the_problem_and_the_learners_line():
    def stub():
        raise NotImplementedError("提示: 先 unscale_")

    def crashes(x):
        y = [1, 2]
        return y[x]

    with pytest.raises(CheckFailed, match="练习尚未完成: 提示: 先 unscale_"):
        call_learner(stub)
    with pytest.raises(CheckFailed) as info:
        call_learner(crashes, 5)
    assert "IndexError" in info.value.found
    assert "第" in info.value.hint and "return y[x]" in info.value.hint


def test_failure_lines_are_at_most_four_and_carry_no_frames():
    exc = CheckFailed("一个数", "第一行\n第二行\n" + "x" * 2000, "提示")
    lines = failure_lines(exc)
    assert len(lines) <= 4
    assert "检查未通过" in lines[0] and lines[1].startswith("期望") and lines[2].startswith("实际")
    assert all(len(line) < 500 for line in lines)
    assert not any("File " in line or ".py" in line for line in lines)


def test_in_a_kernel_the_failure_is_short_and_the_cell_still_errors():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("from course_tools.checks import expect, call_learner\n"
                                          "def mine(x):\n    return [0][x]"),
                nbformat.v4.new_code_cell("call_learner(mine, 3)"),
                nbformat.v4.new_code_cell("assert 1 == 2, 'a learner assert keeps its traceback'")]
    client = NotebookClient(nb, timeout=60, kernel_name="python3", allow_errors=True)
    client.execute()
    errors = [o for o in nb.cells[1].outputs if o.output_type == "error"]
    assert len(errors) == 1, nb.cells[1].outputs
    shown = errors[0].traceback
    assert 3 <= len(shown) <= 4, shown
    assert "检查未通过" in shown[0] and "IndexError" in shown[2] and "return [0][x]" in shown[3]
    assert not any("course_tools" in line or "site-packages" in line for line in shown)
    plain = [o for o in nb.cells[2].outputs if o.output_type == "error"][0]
    assert plain.ename == "AssertionError" and len(plain.traceback) > 1  # ordinary errors are untouched
    strict = NotebookClient(nbformat.from_dict(nb), timeout=60, kernel_name="python3")
    with pytest.raises(CellExecutionError, match="检查未通过"):
        strict.execute()  # the reply status is "error": Run All stops, nbval and the grader count a failure
