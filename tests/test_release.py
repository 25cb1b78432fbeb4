"""The release tool: learner notebooks are generated from solutions/ and stay in sync."""
import nbformat

from course_utils import release


def test_notebooks_are_up_to_date_with_solutions(capsys):
    assert release.main(["--check"]) == 0, capsys.readouterr().out


def test_learner_notebooks_have_no_solutions_or_outputs():
    for src in release.solution_paths():
        nb = nbformat.reads(release.render(src), as_version=4)
        solved = nbformat.read(src, as_version=4)
        exercises = [c for c in nb.cells if "exercise" in c.metadata.get("tags", [])]
        assert len(exercises) == sum("exercise" in c.metadata.get("tags", []) for c in solved.cells), src.name
        for cell in nb.cells:
            assert "BEGIN SOLUTION" not in cell.source and "solution-only" not in cell.metadata.get("tags", [])
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, src.name
        for cell in exercises:
            assert "raise NotImplementedError(" in cell.source, src.name


def test_strip_solutions_keeps_indent_and_hint():
    source = "def f(x):\n    ### BEGIN SOLUTION 提示: 用 x * 2\n    return x * 2\n    ### END SOLUTION\n\nprint(f)"
    assert release.strip_solutions(source) == "def f(x):\n    raise NotImplementedError('提示: 用 x * 2')\n\nprint(f)"
    assert release.DEFAULT_HINT in release.strip_solutions("### BEGIN SOLUTION\nx = 1\n### END SOLUTION")
    try:
        release.strip_solutions("### BEGIN SOLUTION\nx = 1")
    except ValueError as exc:
        assert "END SOLUTION" in str(exc)
    else:
        raise AssertionError("an unterminated solution block must be rejected")
