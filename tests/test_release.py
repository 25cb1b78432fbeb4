"""The release tool: learner notebooks are generated from solutions/ and stay in sync."""
import nbformat
import pytest

from course_tools import release
from course_tools.progress import width


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
    with pytest.raises(release.AuthoringError, match="END SOLUTION"):
        release.strip_solutions("### BEGIN SOLUTION\nx = 1")


@pytest.mark.parametrize("source, problem", [
    ("### BEGIN SOLUTION\nx = 1\n### BEGIN SOLUTION\ny = 2\n### END SOLUTION\n### END SOLUTION", "嵌套"),
    ("x = 1\n### END SOLUTION", "没有对应的"),
    ("### BEGIN SOLUTION\nx = 1", "缺少"),
    ("### BEGIN SOLUTION\nx = 1\n### END SOLUTION trailing", "不能有其他文字"),
])
def test_malformed_solution_blocks_are_authoring_errors(source, problem):
    with pytest.raises(release.AuthoringError, match=problem):
        release.strip_solutions(source)


def _notebook(*cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = list(cells)
    return nb


def test_solution_block_outside_an_exercise_cell_names_notebook_and_cell():
    untagged = nbformat.v4.new_code_cell("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION")
    untagged.id = "forgot-tag"
    with pytest.raises(release.AuthoringError, match=r"07_x\.ipynb 第 1 个格子\(id forgot-tag\).*exercise"):
        release.learner_notebook(_notebook(nbformat.v4.new_markdown_cell("# t"), untagged), "07_x.ipynb")
    nested = nbformat.v4.new_code_cell("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n### END SOLUTION",
                                       metadata={"tags": ["exercise"]})
    nested.id = "nested"
    with pytest.raises(release.AuthoringError, match=r"id nested.*嵌套"):
        release.learner_notebook(_notebook(nested), "01_y.ipynb")


def test_release_main_reports_an_authoring_error_and_writes_nothing(tmp_path, monkeypatch, capsys):
    bad = nbformat.v4.new_code_cell("### BEGIN SOLUTION\nx = 1\n### END SOLUTION")
    (tmp_path / "solutions").mkdir()
    nbformat.write(_notebook(bad), tmp_path / "solutions" / "03_bad.ipynb")
    monkeypatch.setattr(release, "SOLUTIONS", tmp_path / "solutions")
    monkeypatch.setattr(release, "NOTEBOOKS", tmp_path / "notebooks")
    assert release.main([]) == 2
    assert "编写错误" in capsys.readouterr().err
    assert not (tmp_path / "notebooks").exists()


def test_a_long_hint_is_wrapped_within_the_width_and_keeps_its_message():
    from tests.support.notebook_cells import stub_hints

    hint = "提示: 先收集所有非 None 的梯度,求全局 L2 范数;超过阈值时所有梯度乘同一个系数,返回裁剪前的范数" * 2
    stub = release.strip_solutions(f"def f():\n    ### BEGIN SOLUTION {hint}\n    return 1\n    ### END SOLUTION")
    assert len(stub.splitlines()) > 3 and max(map(width, stub.splitlines())) <= release.WIDTH
    assert stub_hints(stub) == [hint]
    with pytest.raises(NotImplementedError, match="返回裁剪前的范数"):
        exec(compile(stub + "\nf()", "<stub>", "exec"), {})


def test_every_learner_exercise_line_fits_and_no_nbval_marker_is_shown():
    too_wide, markers = [], []
    for src in release.solution_paths():
        nb = nbformat.reads(release.render(src), as_version=4)
        for index, cell in enumerate(nb.cells):
            markers += [f"{src.name} #{index}"] * (release.NBVAL_MARKER in cell.source)
            if "exercise" in cell.metadata.get("tags", []):
                too_wide += [f"{src.name} #{index}: {line}" for line in cell.source.splitlines()
                             if width(line) > release.WIDTH]
    assert not too_wide and not markers, (too_wide, markers)


def test_the_nbval_marker_stays_in_the_solution_that_nbval_runs():
    solved = [c for src in release.solution_paths() for c in nbformat.read(src, as_version=4).cells
              if release.NBVAL_MARKER in c.source.splitlines()]
    assert solved  # 01 and 09 compare outputs: the marker is only hidden from learners
