"""course_grader.commits, .discipline: the learner's commits found in clones, git folders and bundles,
safely; the verdicts.

Pure git, no torch: every repository is built here (a small stand-in for the course repository,
learner clones of it with one commit per upgrade, squashed and out-of-order histories, bundles,
broken inputs and hostile ``.git`` folders whose config, hooks and alternates would touch a
canary file or read another learner's objects if git ever ran in them).
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from course_grader import commits as grade_history
from course_grader.commits import HOMEWORK, Commit, HistoryError, open_history
from course_grader.discipline import NO_HISTORY, judge_discipline
from tests.support.git_history import BASELINE, ENV, commit_file, git, upgrade
from tests.support.homework_scripts import PATCHES, apply_upgrade, learner_repo


@pytest.fixture()
def course(tmp_path: Path) -> Path:
    """A stand-in for the course repository: the released baseline, then a later course commit."""
    repo = tmp_path / "course"
    repo.mkdir()
    git(repo, "init", "-q")
    commit_file(repo, f"{HOMEWORK}/train_cifar.py", BASELINE, "course: homework baseline")
    commit_file(repo, "README.md", "workbook\n", "course: readme")
    return repo


def clone(course: Path, where: Path, upgrades: int = 4) -> Path:
    """The learner's clone of the workbook with one commit per upgrade."""
    git(course.parent, "clone", "-q", str(course), str(where))
    for k in range(1, upgrades + 1):
        upgrade(where, k)
    return where


def subjects(commits: list[Commit]) -> list[str]:
    return [c.subject for c in commits]


# ---- finding the commits ---------------------------------------------------------------------------

def test_a_plain_folder_has_no_history(tmp_path: Path) -> None:
    folder = tmp_path / "alice" / HOMEWORK
    folder.mkdir(parents=True)
    (folder / "train_cifar.py").write_bytes(BASELINE)
    assert open_history(tmp_path / "alice", tmp_path / "scratch") is None
    assert NO_HISTORY.ok and "无历史" in NO_HISTORY.column


def test_a_clone_starts_at_the_newest_course_commit(course: Path, tmp_path: Path) -> None:
    learner = clone(course, tmp_path / "alice")
    history = open_history(learner, tmp_path / "scratch", course=course)
    assert history.source == "clone"
    assert history.start.sha == git(course, "rev-parse", "HEAD") and "课程仓库" in history.start_note
    assert subjects(history.commits) == [f"upgrade {k}: feature {k}" for k in range(1, 5)]
    assert [c.sha for c in history.commits][-1] == history.head.sha == git(learner, "rev-parse", "HEAD")
    assert all(len(c.short) == 7 and c.sha.startswith(c.short) for c in history.commits)


def test_without_course_commits_the_start_is_the_byte_identical_baseline(course: Path, tmp_path: Path) -> None:
    learner = clone(course, tmp_path / "alice", upgrades=2)
    commit_file(learner, "notes.md", "mine\n", "notes")           # a later commit, baseline changed by then
    history = open_history(learner, tmp_path / "scratch", course=None)
    # the newest commit whose train_cifar.py is the baseline: the course's readme commit
    assert history.start.subject == "course: readme" and "基线" in history.start_note
    assert subjects(history.commits) == ["upgrade 1: feature 1", "upgrade 2: feature 2", "notes"]


def test_failing_both_the_start_is_the_root_commit(tmp_path: Path) -> None:
    repo = tmp_path / "bob"
    repo.mkdir()
    git(repo, "init", "-q")
    commit_file(repo, f"{HOMEWORK}/train_cifar.py", BASELINE.replace(b"\n", b"\r\n"), "my copy (CRLF)")
    upgrade(repo, 1)
    history = open_history(repo, tmp_path / "scratch", course=None)
    assert history.start.subject == "my copy (CRLF)" and "根提交" in history.start_note
    assert subjects(history.commits) == ["upgrade 1: feature 1"]


def test_a_course_checkout_holding_the_learners_commits_starts_at_its_published_branch(course: Path,
                                                                                       tmp_path: Path) -> None:
    """The instructor fetched the learner's bundle into the course repository, or grades in the learner's own
    clone: the learner's commits are present there, but only the published branch's commits make the start."""
    learner = clone(course, tmp_path / "alice")
    git(learner, "bundle", "create", str(tmp_path / "hw.bundle"), "main")
    git(course, "fetch", "-q", str(tmp_path / "hw.bundle"), "main:homework-0.4")     # now in the course repo too
    upgrades = [f"upgrade {k}: feature {k}" for k in range(1, 5)]
    for path, checkout in ((tmp_path / "hw.bundle", course), (learner, learner)):
        history = open_history(path, tmp_path / f"s-{checkout.name}", course=checkout)
        assert history.start.sha == git(course, "rev-parse", "main") and "课程仓库 " in history.start_note
        assert subjects(history.commits) == upgrades, history.start_note


def test_when_the_published_branch_holds_the_head_the_start_note_says_why(course: Path, tmp_path: Path) -> None:
    learner = clone(course, tmp_path / "alice")
    git(course, "pull", "-q", "--ff-only", str(learner), "main")      # the course's main now ends at alice's head
    history = open_history(learner, tmp_path / "scratch", course=course)
    assert history.start_note.startswith(f"课程仓库的 main 已包含交来的最后一次提交 {history.head.short}, 分不出学员的提交")
    assert history.start.subject == "course: readme" and "基线" in history.start_note   # the baseline's start
    assert subjects(history.commits) == [f"upgrade {k}: feature {k}" for k in range(1, 5)]
    git(course, "branch", "-q", "-m", "main", "published-elsewhere")
    history = open_history(learner, tmp_path / "s2", course=course)
    assert "没有发布分支" in history.start_note and len(history.commits) == 4


def test_a_clone_of_the_real_workbook_and_the_scripted_learner(tmp_path: Path) -> None:
    """The defaults: the grader's own checkout as the course repository, its baseline as the baseline."""
    learner = tmp_path / "alice"
    git(tmp_path, "clone", "-q", "--no-local", str(grade_history.ROOT), str(learner))
    origin = git(learner, "rev-parse", "HEAD")
    upgrade(learner, 1)
    history = open_history(learner, tmp_path / "s1")
    assert history.start.sha == origin and subjects(history.commits) == ["upgrade 1: feature 1"]
    scripted = learner_repo(tmp_path / "bob")          # its own root commit: the baseline as released
    for k in range(1, len(PATCHES) + 1):
        apply_upgrade(scripted, k)
    history = open_history(scripted, tmp_path / "s2")
    assert history.start.subject == "baseline (chapter 0.2)" and "基线" in history.start_note
    assert subjects(history.commits) == [f"upgrade {k}" for k in range(1, len(PATCHES) + 1)]


def test_a_shallow_clone_is_read(course: Path, tmp_path: Path) -> None:
    learner = tmp_path / "alice"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{course}", str(learner))
    upgrade(learner, 1)
    upgrade(learner, 2)
    history = open_history(learner, tmp_path / "scratch", course=course)
    assert history.start.subject == "course: readme" and len(history.commits) == 2


def test_the_first_parent_line_of_head_is_followed(course: Path, tmp_path: Path) -> None:
    learner = clone(course, tmp_path / "alice", upgrades=1)
    git(learner, "checkout", "-q", "-b", "side")
    commit_file(learner, "side.md", "x\n", "side work")
    git(learner, "checkout", "-q", "main")
    upgrade(learner, 2)
    git(learner, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    history = open_history(learner, tmp_path / "scratch", course=course)
    assert subjects(history.commits) == ["upgrade 1: feature 1", "upgrade 2: feature 2", "merge side"]


def test_a_git_folder_itself_is_read(course: Path, tmp_path: Path) -> None:
    learner = clone(course, tmp_path / "alice")
    history = open_history(learner / ".git", tmp_path / "scratch", course=course)
    assert history.source == "git" and len(history.commits) == 4


def test_a_bundle_of_the_homework_branch(course: Path, tmp_path: Path) -> None:
    learner = tmp_path / "alice"
    git(tmp_path, "clone", "-q", str(course), str(learner))
    git(learner, "checkout", "-q", "-b", "homework-0.4")
    for k in range(1, 5):
        upgrade(learner, k)
    git(learner, "checkout", "-q", "main")
    commit_file(learner, "other.md", "x\n", "unrelated work on main")
    git(learner, "checkout", "-q", "homework-0.4")
    git(learner, "bundle", "create", "-q", str(tmp_path / "hw.data"), "homework-0.4", "main")
    history = open_history(tmp_path / "hw.data", tmp_path / "scratch", course=course)   # any file name
    assert history.source == "bundle" and history.head.sha == git(learner, "rev-parse", "homework-0.4")
    assert subjects(history.commits) == [f"upgrade {k}: feature {k}" for k in range(1, 5)]


def test_a_bundle_without_the_branch_name_uses_its_newest_ref(course: Path, tmp_path: Path) -> None:
    learner = tmp_path / "alice"
    git(tmp_path, "clone", "-q", str(course), str(learner))
    git(learner, "checkout", "-q", "-b", "old")
    commit_file(learner, "a.md", "a\n", "old work", date=1_600_000_000)
    git(learner, "checkout", "-q", "-b", "new", "main")
    commit_file(learner, "b.md", "b\n", "new work", date=1_700_000_000)
    git(learner, "bundle", "create", "-q", str(tmp_path / "hw.bundle"), "old", "new")
    history = open_history(tmp_path / "hw.bundle", tmp_path / "scratch", course=course)
    assert subjects(history.commits) == ["new work"]


def test_broken_bundles_raise_a_chinese_error(course: Path, tmp_path: Path) -> None:
    learner = clone(course, tmp_path / "alice")
    git(learner, "bundle", "create", "-q", str(tmp_path / "full.bundle"), "main")
    data = (tmp_path / "full.bundle").read_bytes()
    (tmp_path / "cut.bundle").write_bytes(data[: len(data) // 2])
    (tmp_path / "text.bundle").write_text("not a bundle\n")
    git(learner, "bundle", "create", "-q", str(tmp_path / "part.bundle"), "origin/main..main")
    with pytest.raises(HistoryError, match="bundle"):
        open_history(tmp_path / "cut.bundle", tmp_path / "scratch", course=course)
    with pytest.raises(HistoryError, match="不是 git bundle"):
        open_history(tmp_path / "text.bundle", tmp_path / "scratch", course=course)
    with pytest.raises(HistoryError, match="打包整个分支"):
        open_history(tmp_path / "part.bundle", tmp_path / "scratch", course=course)


def test_a_repository_without_commits_or_with_missing_objects_raises(course: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q")
    with pytest.raises(HistoryError, match="读取仓库"):
        open_history(empty, tmp_path / "scratch", course=course)
    learner = clone(course, tmp_path / "alice")
    git(learner, "repack", "-q", "-a", "-d")
    for pack in (learner / ".git" / "objects" / "pack").glob("*.pack"):
        pack.write_bytes(pack.read_bytes()[:200])
    with pytest.raises(HistoryError):
        open_history(learner, tmp_path / "scratch", course=course)


# ---- exporting the scripts of one commit -----------------------------------------------------------

def test_export_writes_the_homework_files_of_that_commit(course: Path, tmp_path: Path) -> None:
    learner = clone(course, tmp_path / "alice", upgrades=1)
    commit_file(learner, f"{HOMEWORK}/debug_overfit.py", "print('overfit')\n", "upgrade 4: overfit")
    commit_file(learner, f"{HOMEWORK}/runs/notes.txt", "n\n", "notes in a subfolder")
    history = open_history(learner, tmp_path / "scratch", course=course)
    first, second, third = history.commits
    out = history.export(first, tmp_path / "at1")
    assert sorted(p.name for p in out.iterdir()) == ["train_cifar.py"]
    assert (out / "train_cifar.py").read_bytes() == BASELINE + b"# upgrade 1\n"
    out = history.export(third, tmp_path / "at3")
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == \
        ["debug_overfit.py", "runs/notes.txt", "train_cifar.py"]
    assert not (out / "README.md").exists()
    with pytest.raises(HistoryError, match="不是空的"):
        history.export(first, tmp_path / "at3")


def test_export_refuses_symlinks_big_files_and_too_many_files(course: Path, tmp_path: Path) -> None:
    learner = clone(course, tmp_path / "alice", upgrades=0)
    (learner / HOMEWORK / "link.py").symlink_to("/etc/passwd")
    git(learner, "add", f"{HOMEWORK}/link.py")
    commit_file(learner, f"{HOMEWORK}/big.pt", b"\0" * (2 ** 20 + 1), "a checkpoint")
    for i in range(grade_history._MAX_FILES):
        (learner / HOMEWORK / "many" / f"{i}.txt").parent.mkdir(exist_ok=True)
        (learner / HOMEWORK / "many" / f"{i}.txt").write_text(str(i))
    history_before = open_history(learner, tmp_path / "s1", course=course)
    out = history_before.export(history_before.head, tmp_path / "ok")
    assert sorted(p.name for p in out.iterdir()) == ["train_cifar.py"]
    assert set(history_before.refused) == {f"{HOMEWORK}/link.py", f"{HOMEWORK}/big.pt"}
    assert "符号链接" in history_before.refused[f"{HOMEWORK}/link.py"]
    assert "1 MiB" in history_before.refused[f"{HOMEWORK}/big.pt"]
    git(learner, "add", f"{HOMEWORK}/many")
    git(learner, "commit", "-q", "-m", "too many")
    history = open_history(learner, tmp_path / "s2", course=course)
    with pytest.raises(HistoryError, match="超过 50 个"):
        history.export(history.head, tmp_path / "many")


def test_touches_homework_tells_which_commits_can_change_a_check(course: Path, tmp_path: Path) -> None:
    learner = clone(course, tmp_path / "alice", upgrades=1)
    commit_file(learner, "README.md", "changed\n", "readme only")
    upgrade(learner, 2)
    history = open_history(learner, tmp_path / "scratch", course=course)
    assert [history.touches_homework(c) for c in history.commits] == [True, False, True]


# ---- hostile repositories --------------------------------------------------------------------------

def _canary_script(tmp_path: Path) -> tuple[Path, Path]:
    canary = tmp_path / "canary"
    script = tmp_path / "evil.sh"
    script.write_text(f"#!/bin/sh\ntouch {canary}\n")
    script.chmod(0o755)
    return script, canary


def test_hostile_config_hooks_and_filters_run_nothing(course: Path, tmp_path: Path) -> None:
    learner = clone(course, tmp_path / "alice")
    script, canary = _canary_script(tmp_path)
    (learner / ".gitattributes").write_text("*.py filter=evil\n")
    git(learner, "add", ".gitattributes")
    git(learner, "commit", "-q", "-m", "attributes")
    included = tmp_path / "included.cfg"
    included.write_text(f"[core]\n\tfsmonitor = {script}\n")
    hooks = learner / ".git" / "hooks"
    for hook in ("post-checkout", "reference-transaction", "pre-auto-gc", "post-index-change", "fsmonitor-watchman"):
        (hooks / hook).write_text(f"#!/bin/sh\ntouch {canary}\n")
        (hooks / hook).chmod(0o755)
    with open(learner / ".git" / "config", "a") as f:
        f.write(f"[core]\n\tfsmonitor = {script}\n\thooksPath = {hooks}\n\tsshCommand = {script}\n"
                f"\talternateRefsCommand = {script}\n[include]\n\tpath = {included}\n"
                f"[filter \"evil\"]\n\tsmudge = {script}\n\tclean = {script}\n\tprocess = {script}\n"
                f"[uploadpack]\n\tpackObjectsHook = {script}\n[diff]\n\texternal = {script}\n")
    history = open_history(learner, tmp_path / "scratch", course=course)
    out = history.export(history.head, tmp_path / "out")
    [history.touches_homework(c) for c in history.commits]
    assert (out / "train_cifar.py").read_bytes() == BASELINE + b"# upgrade 1\n# upgrade 2\n# upgrade 3\n# upgrade 4\n"
    assert not canary.exists()
    subprocess.run(["git", "status", "--short"], cwd=learner, env=ENV, capture_output=True, timeout=60)
    assert canary.exists(), "the canary works: git run in the learner's folder itself does touch it"


def test_alternates_pointing_at_another_learner_are_not_followed(course: Path, tmp_path: Path) -> None:
    alice = clone(course, tmp_path / "alice")
    bob = tmp_path / "bob"
    git(tmp_path, "clone", "-q", "--shared", str(alice), str(bob))      # bob's objects live in alice's repository
    assert (bob / ".git" / "objects" / "info" / "alternates").is_file()
    with pytest.raises(HistoryError, match="读取仓库"):
        open_history(bob, tmp_path / "scratch", course=course)
    for repo in (tmp_path / "scratch").glob("*/repo.git"):
        assert not (repo / "objects" / "info" / "alternates").exists()


def test_symlinks_into_other_repositories_are_not_followed(course: Path, tmp_path: Path) -> None:
    alice = clone(course, tmp_path / "alice")
    bob = tmp_path / "bob"
    bob.mkdir()
    (bob / ".git").symlink_to(alice / ".git")
    with pytest.raises(HistoryError, match="符号链接"):
        open_history(bob, tmp_path / "scratch", course=course)
    carol = tmp_path / "carol"
    carol.mkdir()
    (carol / ".git").write_text(f"gitdir: {alice / '.git'}\n")
    with pytest.raises(HistoryError, match="gitdir"):
        open_history(carol, tmp_path / "scratch", course=course)
    dave = tmp_path / "dave"                          # a real .git whose object folders are links to alice's
    dave.mkdir()
    git(dave, "init", "-q")
    (dave / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (dave / ".git" / "refs" / "heads" / "main").write_text(git(alice, "rev-parse", "HEAD") + "\n")
    objects = dave / ".git" / "objects"
    for sub in (alice / ".git" / "objects").iterdir():
        if sub.name not in ("info", "pack"):
            (objects / sub.name).symlink_to(sub)
    with pytest.raises(HistoryError, match="读取仓库"):
        open_history(dave, tmp_path / "scratch", course=course)
    erin = tmp_path / "erin"                          # the whole objects folder a link to alice's
    erin.mkdir()
    git(erin, "init", "-q")
    (erin / ".git" / "refs" / "heads" / "main").write_text(git(alice, "rev-parse", "HEAD") + "\n")
    (erin / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    os.rename(erin / ".git" / "objects", tmp_path / "erin-objects")
    (erin / ".git" / "objects").symlink_to(alice / ".git" / "objects")
    with pytest.raises(HistoryError, match="读取仓库"):
        open_history(erin, tmp_path / "scratch", course=course)


def test_a_fifo_head_and_an_oversized_history_do_not_hang_or_fill_the_scratch(course: Path, tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    learner = clone(course, tmp_path / "alice")
    head = learner / ".git" / "HEAD"
    saved = head.read_bytes()
    head.unlink()
    os.mkfifo(head)
    with pytest.raises(HistoryError, match="没有 HEAD"):
        open_history(learner, tmp_path / "scratch", course=course)
    head.unlink()
    head.write_bytes(saved)
    git(learner, "bundle", "create", "-q", str(tmp_path / "hw.bundle"), "main")
    monkeypatch.setattr(grade_history, "_MAX_COPY_BYTES", 1_000)
    with pytest.raises(HistoryError, match="超过上限"):
        open_history(learner, tmp_path / "scratch", course=course)
    with pytest.raises(HistoryError, match="超过上限"):
        open_history(tmp_path / "hw.bundle", tmp_path / "scratch", course=course)


def test_every_git_call_has_a_time_limit(course: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    learner = clone(course, tmp_path / "alice")
    monkeypatch.setattr(grade_history, "_TIMEOUT", 0.001)
    with pytest.raises(HistoryError, match="秒没有结束"):
        open_history(learner, tmp_path / "scratch", course=course)


# ---- the verdict -----------------------------------------------------------------------------------

COMMITS = [Commit(f"{k}" * 40, f"{k}" * 7, f"upgrade {k}") for k in range(1, 6)]


def test_separate_commits_in_order_are_ok_and_named() -> None:
    verdict = judge_discipline(COMMITS[:4], {k: COMMITS[k - 1] for k in range(1, 5)})
    assert verdict.ok and verdict.column == "合格: 4 个升级各自一个提交, 顺序正确"
    assert verdict.notes == [f"升级 {k}: {'%d' % k * 7} «upgrade {k}»" for k in range(1, 5)]


def test_commits_without_an_upgrade_between_them_are_fine() -> None:
    verdict = judge_discipline(COMMITS, {1: COMMITS[0], 2: COMMITS[2], 3: COMMITS[4]})
    assert verdict.ok


def test_squashed_upgrades_are_not_ok() -> None:
    verdict = judge_discipline(COMMITS[:1], {k: COMMITS[0] for k in range(1, 5)})
    assert not verdict.ok and verdict.column == "不合格: 升级 1+2+3+4 在同一提交"
    assert any("squashed" in n and "1111111" in n for n in verdict.notes)
    verdict = judge_discipline(COMMITS[:3], {1: COMMITS[0], 2: COMMITS[1], 3: COMMITS[1], 4: COMMITS[2]})
    assert not verdict.ok and verdict.column == "不合格: 升级 2+3 在同一提交"


def test_out_of_order_upgrades_are_not_ok() -> None:
    verdict = judge_discipline(COMMITS[:4], {1: COMMITS[0], 2: COMMITS[2], 3: COMMITS[1], 4: COMMITS[3]})
    assert not verdict.ok and verdict.column == "不合格: 升级 3 早于升级 2"
    assert any(n.startswith("顺序错") and "3333333" in n and "2222222" in n for n in verdict.notes)


def test_missing_upgrades_are_named_but_do_not_break_discipline() -> None:
    verdict = judge_discipline(COMMITS[:2], {1: COMMITS[0], 2: None, 3: COMMITS[1], 4: None})
    assert verdict.ok and verdict.column.startswith("合格: 2 个升级")
    assert "升级 2: 没有一个提交通过它的检查" in verdict.notes
    verdict = judge_discipline([], {1: None, 2: None})
    assert verdict.ok and "没有通过的升级" in verdict.column


def test_an_upgrade_passing_before_the_learners_commits_is_not_ok() -> None:
    start = Commit("0" * 40, "0" * 7, "my whole homework as the root commit")
    verdict = judge_discipline([], {1: start, 2: start})
    assert not verdict.ok and "升级 1 不在学员的提交里" in verdict.column
