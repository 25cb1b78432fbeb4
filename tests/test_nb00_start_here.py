"""00_start_here: the orientation notebook says what a newcomer needs, agrees with the README's first-hour
path, and its learner copy is current."""
from __future__ import annotations

import re
import tomllib

import nbformat
import pytest

from course_tools.release import render
from tests.support.notebook_cells import ROOT, tagged_sources

NAME = "00_start_here.ipynb"
SOLVED = ROOT / "solutions" / NAME
README = ROOT / "README.md"


def _text(cell_type: str) -> str:
    nb = nbformat.read(SOLVED, as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == cell_type)


def _readme_section(title: str) -> str:
    """The README section that starts with the heading ``## <title>``, up to the next heading of level 1 or 2."""
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^#{{1,2}} )", text, flags=re.M | re.S)
    assert match, f"README has no section '## {title}'"
    return match.group(1)


def _bash_commands(markdown: str) -> list[str]:
    """Command lines of the ```bash blocks, comments removed."""
    blocks = re.findall(r"```bash\n(.*?)```", markdown, flags=re.S)
    return [line.split("#")[0].strip() for block in blocks for line in block.splitlines() if line.split("#")[0].strip()]


QUICK_STARTS = ("快速开始", "Quick start")


def test_no_exercises_and_learner_copy_is_current():
    assert tagged_sources(SOLVED, "exercise") == []
    learner = ROOT / "notebooks" / NAME
    assert learner.read_text(encoding="utf-8") == render(SOLVED), "notebooks/ 已过期: 运行 python -m course_tools.release"


def test_chapter_map_lists_every_chapter_in_order():
    from course_tools.cells import NOTEBOOK_GLOB

    prose = _text("markdown")
    rows = re.findall(r"^\| (\d\db?) \|", prose, flags=re.M)
    numbered = [r for r in rows if len(r) == 2]
    assert numbered == [f"{i:02d}" for i in range(1, len(numbered) + 1)]
    prefixes = sorted(p.name.split("_")[0] for p in (ROOT / "solutions").glob(NOTEBOOK_GLOB))
    assert rows == [p for p in prefixes if p != "00"] and "08b" in rows   # 08b: the second part of 08


def _standard() -> str:
    nb = nbformat.read(SOLVED, as_version=4)
    return next(c.source for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("## 学完标准"))


def test_states_the_standard_of_completion_and_maps_each_part():
    text = _standard()
    rows = {cells[0]: cells for cells in (
        [x.strip() for x in line.strip().strip("|").split("|")] for line in text.splitlines() if line.startswith("| "))}
    # the four parts of the learner's script, each with the notebook that teaches it and the upgrade that checks it
    for part, notebook in (("断点续训", "04"), ("梯度裁剪", "02"), ("EMA", "03"), ("完整日志", "06")):
        assert part in rows and notebook in rows[part][2] and "升级" in rows[part][3], (part, rows.get(part))
    assert "标准排查顺序" in text and "course_utils.debug.TROUBLESHOOTING" in text
    for where in ("07 §2", "09 第 6 题", "10", "debug_overfit.py"):
        assert where in text, where


def test_the_standard_is_in_own_words():
    # the seed's sentence is not pasted
    seed = "你的训练脚本具备断点续训、梯度裁剪、EMA、完整日志四件套,并且知道"
    prose = _text("markdown")
    assert seed not in prose and "四件套" not in prose


def test_says_what_run_all_does_with_unfinished_and_wrong_exercises():
    prose = _text("markdown")
    assert "还没做的练习不会挡住 Run All" in prose and "答案写错时** Run All 会停在" in prose
    assert "Run Selected Cell and All Below" in prose and "评分时,还没做的练习记 0 分" in prose


def test_install_chooses_the_torch_build_first():
    commands = _bash_commands(_text("markdown"))
    cpu = "pip install torch==2.14.1 torchvision==0.29.1 --index-url https://download.pytorch.org/whl/cpu"
    assert commands.index(cpu) < commands.index("pip install -r requirements.txt")


def test_explains_fast_mode_and_real_data():
    prose = _text("markdown")
    for needle in ("COURSE_FAST=1", "data/cifar-10-batches-py", "COURSE_DATA", "solutions/", "notebooks/", "✅",
                   "GLOSSARY.md"):
        assert needle in prose, needle


def test_describes_checks_as_they_are():
    # checks use fixed seeds and fail with at most four Chinese lines, not a random-input AssertionError
    prose = _text("markdown")
    assert "固定种子" in prose and "四行" in prose
    assert "每次换一组随机数" not in prose and "AssertionError" not in prose


def test_uses_the_helpers_it_promises():
    source = _text("code")
    for needle in ("configure_cpu_threads(device)", "environment_table(", "load_cifar10(", ".source", "show_samples(",
                   "from tqdm.auto import tqdm", "build_model(\"small\"", "expect(test_acc > chance"):
        assert needle in source, needle


def test_first_hour_commands_agree_with_the_readme():
    commands = _bash_commands(_text("markdown"))
    assert "python3 -m venv .venv" in commands and "pip install -r requirements.txt" in commands
    assert any(c.startswith("COURSE_FAST=1 jupyter lab") for c in commands), commands
    for title in QUICK_STARTS:
        readme = _bash_commands(_readme_section(title))
        missing = [c for c in commands if c not in readme]
        assert not missing, f"README '{title}' lacks what 00 tells learners to run: {missing}"


@pytest.mark.parametrize("title", QUICK_STARTS)
def test_readme_first_hour_path(title):
    section = _readme_section(title)
    commands = _bash_commands(section)
    # a virtual environment first, then the install, then JupyterLab from the repository root
    order = [commands.index(c) for c in ("python3 -m venv .venv", "source .venv/bin/activate",
                                          "pip install -r requirements.txt")]
    assert order == sorted(order), commands
    jupyter = [c for c in commands if "jupyter lab" in c]
    assert jupyter and all(c.split() == ["COURSE_FAST=1", "jupyter", "lab"] for c in jupyter), \
        "jupyter lab must start at the repository root so that solutions/ is reachable"
    assert "solutions/" in section and "notebooks/00_start_here.ipynb" in section
    # the Python version the package declares
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["requires-python"]
    assert requires == ">=3.10" and "3.10" in section
    # the CPU-only torch build, installed before the requirements, with the pinned versions
    cpu = "pip install torch==2.14.1 torchvision==0.29.1 --index-url https://download.pytorch.org/whl/cpu"
    assert cpu in commands and commands.index(cpu) < len(commands) - 1 - commands[::-1].index("pip install -r requirements.txt")
    pins = (ROOT / "requirements.txt").read_text(encoding="utf-8")
    assert "torch==2.14.1" in pins and "torchvision==0.29.1" in pins
    assert "6 GB" in section and "CUDA" in section


def test_the_notebook_mentions_the_python_version_and_the_cpu_build():
    prose = _text("markdown")
    assert "3.10" in prose and "CPU 版" in prose and "仓库根目录" in prose
