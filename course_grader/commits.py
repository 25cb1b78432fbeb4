"""The homework's commits: a learner's git history, read without trusting it (the verdict: ``discipline``).

:func:`open_history` takes a clone, a git folder or a bundle (its head: ``HEAD``, else branch, then tag
``homework-0.4``, else its only ref, else the newest); a plain folder is ``None`` (no penalty).
:attr:`History.start` is the newest first-parent commit on the course's published branch (:data:`PUBLISHED`),
not merely present in the checkout (it may hold the learner's commits); failing that, the newest commit whose
``train_cifar.py`` is the released baseline byte for byte, else the root; ``start_note`` says which and why.

Security: no git command runs in the learner's folder. A git folder is copied into scratch (regular files of
``HEAD``, ``packed-refs``, ``shallow``, ``refs/``, ``objects/`` without alternates; 256 MiB, 20 000 files), a bundle
copied and verified, so the learner's config, hooks, alternates and a symlinked or ``gitdir:`` ``.git`` are never
read; the head is fetched (fsck on) into a FRESH bare repository, the only one read. Every git call gets a clean
environment, :data:`_SAFE_CONFIG`, the ``file`` protocol only and a timeout; blobs are read with ``cat-file``.

Example::

    history = open_history(Path("submissions/alice"), Path(tmp))   # None: a plain folder
"""
from __future__ import annotations

import os
import re
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

__all__ = ["ROOT", "HOMEWORK", "PUBLISHED", "Commit", "History", "HistoryError", "open_history"]

ROOT = Path(__file__).resolve().parents[1]
HOMEWORK = "notebooks/homework"          # where the learner's scripts live in the workbook
_BASELINE = ROOT / HOMEWORK / "train_cifar.py"
_HEAD_REF = "refs/grader/head"
_BRANCH = "homework-0.4"                  # the branch the hand-in command bundles
# The course's published branch, first found wins: a clone's origin, then the course repository's own.
PUBLISHED = ("refs/remotes/origin/main", "refs/remotes/origin/master", "refs/heads/main", "refs/heads/master")
_BUNDLE_SIGNATURES = (b"# v2 git bundle\n", b"# v3 git bundle\n")

_MAX_COPY_BYTES = 256 * 2 ** 20           # a git folder or bundle copied into scratch
_MAX_COPY_FILES = 20_000
_MAX_FILE_BYTES = 2 ** 20                 # one exported file
_MAX_FILES = 50                           # files exported per commit
_MAX_COMMITS = 5_000                      # first-parent commits looked at (the oldest is the 'root')
_TIMEOUT = 60                             # seconds, every git call

# Command-line config outranks every config file git could still read.
_SAFE_CONFIG = ("core.hooksPath=/dev/null", "core.fsmonitor=false", "core.sshCommand=false",
                "core.alternateRefsCommand=false", "core.askPass=false", "credential.helper=",
                "protocol.allow=never", "protocol.file.allow=always", "transfer.fsckObjects=true",
                "fetch.fsckObjects=true", "fetch.recurseSubmodules=false", "submodule.recurse=false",
                "gc.auto=0", "maintenance.auto=false", "core.bigFileThreshold=1m", "log.showSignature=false")


class HistoryError(Exception):
    """The submitted history cannot be read (corrupt bundle, unreadable repository, over a limit); Chinese message."""


@dataclass(frozen=True)
class Commit:
    """One commit: full hash, short hash (7 characters) and subject line."""

    sha: str
    short: str
    subject: str


def _environment(home: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "XDG_CONFIG_HOME": str(home),
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_TERMINAL_PROMPT": "0",
            "GIT_ATTR_NOSYSTEM": "1", "GIT_NO_REPLACE_OBJECTS": "1", "GIT_OPTIONAL_LOCKS": "0",
            "GIT_PROTOCOL_FROM_USER": "0", "GIT_ALLOW_PROTOCOL": "file", "GIT_CEILING_DIRECTORIES": str(home),
            "LC_ALL": "C"}


def _git(home: Path, git_dir: Path | None, *args: str, what: str, stdin: bytes | None = None) -> bytes:
    """Run one git command with the safe config and environment; its stdout, or :class:`HistoryError` saying ``what``."""
    command = ["git", *(f for option in _SAFE_CONFIG for f in ("-c", option))]
    if git_dir is not None:
        command.append(f"--git-dir={git_dir}")
    try:
        done = subprocess.run([*command, *args], cwd=home, env=_environment(home), input=stdin,
                              capture_output=True, timeout=_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise HistoryError(f"{what}: git 超过 {_TIMEOUT} 秒没有结束") from None
    if done.returncode != 0:
        message = " ".join(done.stderr.decode("utf-8", "replace").split()) or f"git 退出码 {done.returncode}"
        raise HistoryError(f"{what}: {message}"[:300])
    return done.stdout


def _read_regular(path: Path, budget: list[int]) -> bytes | None:
    """The bytes of ``path`` if it is a regular file (never through a symlink), charged to ``budget``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        data = f.read(budget[0] + 1)
    budget[0] -= len(data)
    budget[1] -= 1
    if budget[0] < 0 or budget[1] < 0:
        raise HistoryError(f"提交历史超过上限 ({_MAX_COPY_BYTES // 2 ** 20} MiB, {_MAX_COPY_FILES} 个文件), 不读取")
    return data


def _copy_tree(src: Path, dst: Path, budget: list[int], skip: frozenset[str] = frozenset()) -> None:
    """Copy the regular files under ``src`` into ``dst``, leaving out links, devices, fifos and ``skip`` names."""
    if src.is_symlink():            # scandir would follow it
        return
    try:
        entries = sorted(os.scandir(src), key=lambda e: e.name)
    except OSError:
        return
    dst.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        if entry.name in skip or entry.is_symlink():
            continue
        if entry.is_dir(follow_symlinks=False):
            _copy_tree(Path(entry.path), dst / entry.name, budget, skip)
        else:
            data = _read_regular(Path(entry.path), budget)
            if data is not None:
                (dst / entry.name).write_bytes(data)


def _log(home: Path, repo: Path, rev: str) -> list[Commit]:
    """The first-parent line of ``rev``, newest first."""
    out = _git(home, repo, "log", "--first-parent", "--no-show-signature", "-z", "--format=%H%x1f%s",
               f"--max-count={_MAX_COMMITS}", rev, "--", what="读取提交历史")
    records = (r.decode("utf-8", "replace").strip("\n").partition("\x1f") for r in out.split(b"\0") if r.strip())
    return [Commit(sha, sha[:7], subject[:200]) for sha, _, subject in records]


def _batch_check(home: Path, repo: Path | None, queries: list[str], cwd_course: Path | None = None) -> list[str]:
    """``git cat-file --batch-check`` answers (``<sha> <type> <size>`` or ``<query> missing``), one per query."""
    where = (repo,) if cwd_course is None else (None, "-C", str(cwd_course))   # the course's own, trusted repository
    return _git(home, *where, "cat-file", "--batch-check", what="读取提交" if cwd_course is None else "读取课程仓库",
                stdin="".join(q + "\n" for q in queries).encode()).decode("utf-8", "replace").splitlines()


def _is_published(home: Path, course: Path, sha: str, branch: str) -> bool:
    """Whether the course's (trusted) ``branch`` contains ``sha``."""
    try:
        _git(home, None, "-C", str(course), "merge-base", "--is-ancestor", sha, branch, what="读取课程仓库")
    except HistoryError:
        return False
    return True


class History:
    """A learner's history in a fresh bare repository in scratch: ``source`` (``clone``, ``git``, ``bundle``),
    ``head``, ``start`` and ``start_note`` (how it was found), ``commits`` (the learner's after ``start``, oldest
    first), ``refused`` (the files :meth:`export` left out, and why)."""

    def __init__(self, repo: Path, home: Path, source: str, course: Path | None, baseline: bytes) -> None:
        self.repo, self._home, self.source = repo, home, source
        self.refused: dict[str, str] = {}
        line = _log(home, repo, _HEAD_REF)              # newest first
        if not line:
            raise HistoryError("提交历史是空的")
        self.head = line[0]
        index, self.start_note = self._find_start(line, course, baseline)
        self.start: Commit = line[index]
        self.commits: list[Commit] = line[:index][::-1]
        trees = _batch_check(home, repo, [f"{c.sha}:{HOMEWORK}" for c in line[:index + 1]])
        self._trees = {c.sha: answer.split()[0] if not answer.endswith("missing") else "" for c, answer in
                       zip(line, trees)}
        self._parent = {c.sha: line[i + 1].sha for i, c in enumerate(line[:index])}

    def _published(self, line: list[Commit], course: Path) -> tuple[int | None, str]:
        """The index in ``line`` of the newest commit on the course's published branch, or (None, why not)."""
        refs = _git(self._home, None, "-C", str(course), "for-each-ref", "--format=%(refname)", *PUBLISHED,
                    what="读取课程仓库").decode().split()
        branch = next((ref for ref in PUBLISHED if ref in refs), None)
        if branch is None:
            return None, "课程仓库没有发布分支 (origin/main 或 main), 分不出学员的提交"
        name = branch.removeprefix("refs/heads/").removeprefix("refs/remotes/")
        answers = _batch_check(self._home, None, [c.sha for c in line], cwd_course=course)
        for i, answer in enumerate(answers):
            if answer.split()[1:2] == ["commit"] and _is_published(self._home, course, line[i].sha, branch):
                if i == 0:
                    return None, f"课程仓库的 {name} 已包含交来的最后一次提交 {line[0].short}, 分不出学员的提交"
                return i, f"起点 {line[i].short} «{line[i].subject}» (课程仓库 {name} 上的提交)"
        return None, f"课程仓库的 {name} 上没有这段历史的提交"

    def _find_start(self, line: list[Commit], course: Path | None, baseline: bytes) -> tuple[int, str]:
        why = ""
        if course is not None and (course / ".git").exists():
            index, why = self._published(line, course)
            if index is not None:
                return index, why
            why += "; "
        blob = _git(self._home, self.repo, "hash-object", "--stdin", "--no-filters", what="计算基线",
                    stdin=baseline).decode().strip()
        answers = _batch_check(self._home, self.repo, [f"{c.sha}:{HOMEWORK}/train_cifar.py" for c in line])
        for i, answer in enumerate(answers):
            if answer.split()[0] == blob:
                return i, f"{why}起点 {line[i].short} «{line[i].subject}» (train_cifar.py 与发布的基线逐字节相同)"
        return len(line) - 1, (f"{why}起点 {line[-1].short} «{line[-1].subject}» (根提交: 既找不到课程仓库的提交, "
                               f"也找不到与基线相同的 train_cifar.py)")

    def touches_homework(self, commit: Commit) -> bool:
        """Whether ``commit`` (one of :attr:`commits`) changed ``notebooks/homework/`` against its first parent."""
        return self._trees[commit.sha] != self._trees[self._parent[commit.sha]]

    def export(self, commit: Commit, dest: Path) -> Path:
        """Write the regular files of ``notebooks/homework/`` at ``commit`` into the empty ``dest``; return ``dest``.
        Symlinks, submodules and files over 1 MiB are left out (:attr:`refused`); over 50 files or a path leaving
        ``dest`` raises :class:`HistoryError`."""
        if not re.fullmatch(r"[0-9a-f]{40}", commit.sha):
            raise HistoryError(f"不是提交号: {commit.sha[:50]!r}")
        dest.mkdir(parents=True, exist_ok=True)
        if any(dest.iterdir()):
            raise HistoryError(f"导出目录不是空的: {dest}")
        out = _git(self._home, self.repo, "ls-tree", "-r", "-l", "-z", "--full-tree", commit.sha, "--",
                   HOMEWORK + "/", what=f"读取 {commit.short} 的文件列表")
        wanted: list[tuple[tuple[str, ...], str]] = []
        for record in out.split(b"\0"):
            if not record:
                continue
            meta, _, raw_path = record.partition(b"\t")
            mode, kind, sha, size = meta.decode().split()
            path = raw_path.decode("utf-8", "replace")
            parts = PurePosixPath(path).parts[len(PurePosixPath(HOMEWORK).parts):]
            if not parts or any(p in ("", ".", "..") or "\\" in p for p in parts) or path.startswith("/"):
                raise HistoryError(f"{commit.short}: 路径 {path[:100]!r} 会跑出导出目录, 拒绝")
            if mode == "120000":
                self.refused[path] = "符号链接 (symlink), 不导出"
            elif kind != "blob":
                self.refused[path] = "子模块 (submodule), 不导出"
            elif int(size) > _MAX_FILE_BYTES:
                self.refused[path] = f"{int(size) / 2 ** 20:.1f} MiB, 超过 1 MiB, 不导出"
            else:
                wanted.append((parts, sha))
        if len(wanted) > _MAX_FILES:
            raise HistoryError(f"{commit.short}: {HOMEWORK}/ 下有 {len(wanted)} 个文件, 超过 {_MAX_FILES} 个, 不导出")
        blobs = _git(self._home, self.repo, "cat-file", "--batch", what=f"读取 {commit.short} 的文件",
                     stdin="".join(sha + "\n" for _, sha in wanted).encode())
        root = dest.resolve()
        offset = 0
        for parts, sha in wanted:
            header_end = blobs.index(b"\n", offset)
            if blobs[offset:header_end].endswith(b"missing"):
                raise HistoryError(f"{commit.short}: 缺少对象 {sha}")
            size = int(blobs[offset:header_end].split()[2])
            data = blobs[header_end + 1: header_end + 1 + size]
            offset = header_end + 2 + size
            target = root.joinpath(*parts)
            if root not in target.parents:
                raise HistoryError(f"{commit.short}: 路径 {'/'.join(parts)[:100]!r} 会跑出导出目录, 拒绝")
            target.parent.mkdir(parents=True, exist_ok=True)     # dest was empty: only folders made here
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        return dest


def _bundle_head(refs: list[tuple[str, str]], home: Path, repo: Path) -> str:
    names = [name for _, name in refs]
    preferred = [p for p in ("HEAD", f"refs/heads/{_BRANCH}", f"refs/tags/{_BRANCH}") if p in names]
    if preferred or len(names) == 1:
        return (preferred or names)[0]
    dates = {name: int(_git(home, repo, "log", "-1", "--format=%ct", sha, what="读取 bundle 的提交").strip() or 0)
             for sha, name in refs}
    return max(names, key=lambda n: (dates[n], n))


def _fetch_bundle(path: Path, home: Path, repo: Path) -> None:
    """A copy of the bundle ``path``, verified, fetched into ``repo``; its head ref becomes ``_HEAD_REF``."""
    data = _read_regular(path, [_MAX_COPY_BYTES, 1])
    if data is None or not data.startswith(_BUNDLE_SIGNATURES):
        raise HistoryError(f"{path.name} 不是 git bundle (应由 git bundle create hw.bundle {_BRANCH} 生成)")
    bundle = home / "hw.bundle"
    bundle.write_bytes(data)
    try:
        _git(home, repo, "bundle", "verify", str(bundle), what="bundle 校验失败")
    except HistoryError as error:
        hint = (f"; 它依赖不在其中的提交, 请用 git bundle create hw.bundle {_BRANCH} 打包整个分支"
                if "prerequisite" in str(error) or "lacks these" in str(error) else "")
        raise HistoryError(f"{error}{hint}") from None
    refs = [tuple(line.split(" ", 1)) for line in
            _git(home, repo, "bundle", "list-heads", str(bundle), what="读取 bundle").decode().splitlines()]
    if not refs:
        raise HistoryError("bundle 里没有分支")
    _git(home, repo, "fetch", "-q", "--no-tags", str(bundle),
         *(f"+{name}:refs/grader/all/{i}" for i, (_, name) in enumerate(refs)), what="读取 bundle")
    head = _bundle_head(refs, home, repo)
    _git(home, repo, "update-ref", _HEAD_REF, dict((n, s) for s, n in refs)[head], what="读取 bundle")
    bundle.unlink()


def _fetch_git_dir(git_dir: Path, home: Path, repo: Path) -> None:
    """The history parts of ``git_dir``, copied into a fresh bare repository, fetched into ``repo`` as ``_HEAD_REF``."""
    copy = home / "copy"
    _git(home, None, "init", "-q", "--bare", str(copy), what="建立空仓库")
    (copy / "HEAD").unlink()
    budget = [_MAX_COPY_BYTES, _MAX_COPY_FILES]   # the parts that hold history, regular files only
    for name in ("HEAD", "packed-refs", "shallow"):
        data = _read_regular(git_dir / name, budget)
        if data is not None:
            (copy / name).write_bytes(data)
    _copy_tree(git_dir / "refs", copy / "refs", budget)
    # alternates and http-alternates (in objects/info/) point at other repositories' objects
    _copy_tree(git_dir / "objects", copy / "objects", budget, frozenset({"alternates", "http-alternates"}))
    if not (copy / "HEAD").is_file():
        raise HistoryError(".git 里没有 HEAD")
    _git(home, repo, "fetch", "-q", "--no-tags", "--update-shallow", str(copy), f"+HEAD:{_HEAD_REF}",
         what="读取仓库 (可能损坏, 或 HEAD 上还没有提交)")


def open_history(path: Path, scratch: Path, course: Path | None = ROOT, baseline: bytes | None = None) -> History | None:
    """The history in ``path`` (clone folder, git folder or bundle) in a fresh repository under ``scratch``; ``None``
    for a plain folder. ``course``: the course repository (``None``: no course commits known); ``baseline``: the
    released ``train_cifar.py`` (default: the grader's own). Raises :class:`HistoryError` when it cannot be read."""
    path = Path(path)
    if path.is_symlink():
        raise HistoryError(f"{path.name} 是符号链接 (symlink), 不读取")
    if path.is_dir():
        dot_git = path / ".git"
        if dot_git.is_symlink():
            raise HistoryError(".git 是符号链接 (symlink), 不读取")
        if dot_git.is_file():
            raise HistoryError(".git 是指向别处的文件 (gitdir: ...), 不读取; 请交整个克隆或 bundle")
        if dot_git.is_dir():
            git_dir, source = dot_git, "clone"
        elif (path / "HEAD").is_file() and (path / "objects").is_dir() and (path / "refs").is_dir():
            git_dir, source = path, "git"
        else:
            return None
    elif path.is_file():
        git_dir, source = None, "bundle"
    else:
        raise HistoryError(f"找不到 {path.name}")
    scratch.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="history-", dir=scratch)).resolve()
    repo = home / "repo.git"
    _git(home, None, "init", "-q", "--bare", str(repo), what="建立空仓库")
    if source == "bundle":
        _fetch_bundle(path, home, repo)
    else:
        _fetch_git_dir(git_dir, home, repo)
    _git(home, repo, "rev-parse", "--verify", "-q", f"{_HEAD_REF}^{{commit}}", what="交来的历史里找不到 HEAD 指向的提交")
    return History(repo, home, source, course, _BASELINE.read_bytes() if baseline is None else baseline)
