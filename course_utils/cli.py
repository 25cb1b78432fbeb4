"""Command-line flags that are checked before anything heavy is imported.

A training script that imports torch first spends seconds before it notices ``--lr 3e-3O``,
and a value that parses but makes no sense (``--lr nan``, ``--batch-size 0``,
``--data-fraction 1.5``) ends minutes later in a 40-line traceback, or is accepted
silently and wastes the run. Here every option gets a *validator*: an argparse
``type=`` from this module, or ``choices``. A bad value ends the program with one
Chinese line and exit code 2, argparse's convention for a usage error::

    train_cifar_pro.py: 参数错误: --lr 'nan': 应为 > 0 的有限数

This module imports only the standard library (and the course's stdlib-only ``runfolder``,
``distributed``, ``signals`` and ``heartbeat``; ``failed`` alone reads ``checkpoint``, after the training has
loaded torch), so ``parse_args`` can run before torch. So can ``start_run``:
everything else that may refuse a run of a run-folder script (``--out``, ``--resume``,
``--overwrite``, ``--allow-change``): torchrun's environment, the folder's lock, and on ``--resume``
the run's identity (``runfolder.config_changes``). A refusal is one line too (``refuse``), exit 2.

Pitfalls handled:
- ``float("nan")`` and ``float("inf")`` parse fine, and ``nan > 0`` is simply False:
  a check written ``if lr <= 0: error`` lets NaN through. Validators reject non-finite floats.
- argparse accepts any unambiguous prefix (``--batch 64`` for ``--batch-size``); ``Parser``
  turns that off, so a command line, and a saved config, only ever holds full names.
- argparse's own errors print the whole usage (dozens of lines for a real script) and an
  English sentence; ``Parser.error`` prints one line.
- ``unchecked_options(parser)`` lists options without a validator: a test can require none.

Example::

    p = Parser(prog="train.py")
    p.add_argument("--lr", type=float_in(0, None, low_open=True), default=2e-3)
    p.add_argument("--epochs", type=int_at_least(1), default=2)
    args = p.parse_args()          # "--epochs 0" -> one line, exit 2
    assert not unchecked_options(p)

Reference machinery of ``solutions/homework/train_cifar_pro.py`` (no notebook calls it): its flags' types
and ranges, checked before torch is imported, alone and in combination (``check_combinations``), and the refusals
of a run (``start_run``, ``refuse``), its hidden fault flags (``add_probe_flags``), what a --resume changes
(``resume_notes``) and the one line that says how a run failed (``guarded``, ``failed``).
"""
from __future__ import annotations

import argparse
import math
import os
import re
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple, NoReturn

from course_utils.distributed import World
from course_utils.heartbeat import PHASES
from course_utils.runfolder import ExitCode, Refused, RunFolder, config_changes, holds_run
from course_utils.signals import StopSignal

__all__ = ["USAGE_ERROR", "Parser", "usage_error", "int_at_least", "int_in", "float_in", "int_list", "entries", "run_folder",
           "device_spec", "unchecked_options", "check_combinations", "PROBE_FLAGS", "add_probe_flags", "refuse", "Started",
           "start_run", "resume_notes", "guarded", "failed"]


USAGE_ERROR = 2  # argparse's exit status for a bad command line


def usage_error(message: str, prog: str | None = None) -> NoReturn:
    """Print ``prog: 参数错误: message`` on one line to stderr and exit with status 2."""
    prog = prog or os.path.basename(sys.argv[0])
    print(f"{prog}: 参数错误: {' '.join(message.split())}", file=sys.stderr)
    sys.exit(USAGE_ERROR)


# argparse's own messages (CPython 3.10-3.13 wording) in one Chinese line each
_ARGPARSE = [
    (re.compile(r"argument (\S+): invalid choice: '?([^']*?)'? \(choose from (.*)\)"),
     lambda m: f"{m[1]} {m[2]!r}: 不是可选值(可选: {m[3].replace(chr(39), '')})"),
    (re.compile(r"argument (\S+): expected one argument"), lambda m: f"{m[1]}: 缺少取值"),
    (re.compile(r"argument (\S+): not allowed with argument (\S+)"), lambda m: f"{m[2]} 和 {m[1]} 不能同时使用"),
    (re.compile(r"argument (\S+): invalid \S+ value: (.*)"), lambda m: f"{m[1]} {m[2]}: 不是合法的值"),
    (re.compile(r"unrecognized arguments: (.*)"), lambda m: f"不认识的参数 {m[1]}(--help 列出全部开关)"),
    (re.compile(r"argument (\S+): (.*)"), lambda m: f"{m[1]} {m[2]}"),  # our validators' messages
]


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` without prefix matching whose errors are one Chinese line (exit 2)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        for pattern, render in _ARGPARSE:
            match = pattern.fullmatch(message.strip())
            if match:
                message = render(match)
                break
        usage_error(message, self.prog)


def _validator(check: Callable[[str], object], expected: str) -> Callable[[str], object]:
    """Wrap ``check`` as an argparse ``type=``: a ValueError becomes "'value': expected"."""
    def parse(text: str):
        try:
            return check(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"{text!r}: {expected}") from None
    parse.__name__ = expected  # argparse names the type in some messages
    parse.validates = expected  # marks a validator for unchecked_options
    return parse


def int_at_least(low: int) -> Callable[[str], int]:
    """An integer ``>= low``."""
    def check(text: str) -> int:
        value = int(text)
        if value < low:
            raise ValueError
        return value
    return _validator(check, f"应为 ≥ {low} 的整数")


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An integer in ``[low, high]``."""
    def check(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise ValueError
        return value
    return _validator(check, f"应为 {low} 到 {high} 之间的整数")


def float_in(low: float, high: float | None = None, *, low_open: bool = False,
             high_open: bool = False) -> Callable[[str], float]:
    """A finite float in the interval from ``low`` to ``high`` (``None``: no upper bound)."""
    def check(text: str) -> float:
        value = float(text)
        ok = math.isfinite(value) and (value > low if low_open else value >= low)
        if high is not None:
            ok = ok and (value < high if high_open else value <= high)
        if not ok:
            raise ValueError
        return value
    if high is None:
        expected = f"应为 {'>' if low_open else '≥'} {low:g} 的有限数"
    else:
        expected = f"应在 {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'} 之间"
    return _validator(check, expected)


def int_list(low: int) -> Callable[[str], tuple[int, ...]]:
    """Comma-separated integers, each ``>= low`` (``"6"`` or ``"6,8,10"``)."""
    def check(text: str) -> tuple[int, ...]:
        values = tuple(int(part) for part in text.split(","))
        if any(v < low for v in values):
            raise ValueError
        return values
    return _validator(check, f"应为逗号分隔的 ≥ {low} 的整数")


def entries(*fields: Callable[[str], object], expected: str) -> Callable[[str], tuple[tuple, ...]]:
    """Comma-separated entries of colon-separated fields, each converted by its function (a ValueError: refused);
    ``entries(int, float, expected=...)("1:0.05")`` is ``((1, 0.05),)``."""
    def check(text: str) -> tuple[tuple, ...]:
        parts = [entry.split(":") for entry in text.split(",")]
        if any(len(p) != len(fields) for p in parts):
            raise ValueError
        return tuple(tuple(f(x) for f, x in zip(fields, p)) for p in parts)
    return _validator(check, expected)


def _check_folder(text: str) -> Path:
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError
    return path


run_folder = _validator(_check_folder, "应为一个可写的文件夹(不能是已存在的文件)")
run_folder.__doc__ = "A folder that exists or can be created: not an existing file, under a writable parent."

_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def _check_device(text: str) -> str:
    if not _DEVICE.fullmatch(text.strip().lower()):
        raise ValueError
    return text.strip().lower()


device_spec = _validator(_check_device, "应为 auto、cpu、cuda、cuda:N 或 mps")
device_spec.__doc__ = ("A device name's spelling: auto, cpu, cuda, cuda:N or mps (whether it is there is "
                       "checked once torch is imported).")


def unchecked_options(parser: argparse.ArgumentParser) -> list[str]:
    """Options whose value no validator checks: neither ``choices`` nor a ``type=`` from this module.

    Flags without a value (``store_true``) and ``--help`` count as checked.
    """
    unchecked = []
    for action in parser._actions:
        if not action.option_strings or action.nargs == 0:
            continue
        if action.choices is None and not hasattr(action.type, "validates"):
            unchecked.append(action.option_strings[-1])
    return unchecked


def check_combinations(p: argparse.ArgumentParser, args: argparse.Namespace, *,
                       rollback_only: Iterable[str]) -> argparse.Namespace:
    """``args``, once the combinations of ``train_cifar_pro.py``'s flags that no single validator sees are checked.

    Refused through ``p.error`` (one line, exit 2): --allow-change without --resume; --ckpt-every-seconds auto
    without --mtbf, or the reverse; a --hang-timeout under 5 s (0 is off); a --max-bad-steps larger than its
    --bad-step-window; a ``rollback_only`` flag off its default without --on-spike rollback. The pitfall: each
    value is valid alone, so the run would start and go wrong later: an alarm that can never trip (--max-bad-steps),
    a healthy run called hung within seconds (a --hang-timeout of 2 s), a flag with no effect. Example, with ``p`` the script's
    ``build_parser()``: ``check_combinations(p, p.parse_args(["--mtbf", "600"]), rollback_only=())`` exits with 2.
    """
    if args.allow_change and not args.resume:
        p.error("--allow-change 只在 --resume 时有意义")
    if (args.ckpt_every_seconds == "auto") != (args.mtbf is not None):
        p.error("--ckpt-every-seconds auto 和 --mtbf 秒数 要一起给(Young 间隔需要平均多久被抢占一次)")
    if args.hang_timeout is not None and 0 < args.hang_timeout < 5:
        p.error(f"--hang-timeout {args.hang_timeout:g} 太短:至少 5 秒(心跳约每秒写一次),或 0 关闭")
    if args.max_bad_steps > args.bad_step_window:
        p.error(f"--max-bad-steps {args.max_bad_steps} 大于 --bad-step-window {args.bad_step_window},永远不会触发")
    given = [f"--{k.replace('_', '-')}" for k in rollback_only if getattr(args, k) != p.get_default(k)]
    if given and args.on_spike != "rollback":
        p.error(f"{', '.join(given)} 只在 --on-spike rollback 时有意义")
    return args


PROBE_FLAGS = ("inject_nan_at_step", "inject_bad_batch", "sample_ledger", "inject_stall", "inject_stuck_worker",
               "inject_straggler")
"""The hidden flags of ``add_probe_flags``: a script imports its fault hooks (``course_tools.probes``) only when one
is given, and lists them among the fields a --resume may change."""


def add_probe_flags(p: argparse.ArgumentParser) -> None:
    """The faults that tests and demos inject into a training script (``PROBE_FLAGS``), hidden from --help.

    They are validated like every flag, so a test's typo fails as a learner's would. Example::

        add_probe_flags(p); p.parse_args(["--inject-nan-at-step", "3,5"]).inject_nan_at_step == (3, 5)
    """
    hidden = argparse.SUPPRESS
    p.add_argument("--inject-nan-at-step", type=int_list(1), default=(), help=hidden)  # NaN outputs at these steps
    p.add_argument("--inject-bad-batch", type=int_list(0), default=(), help=hidden)  # corrupted global batches
    p.add_argument("--sample-ledger", action="store_true", help=hidden)  # the samples of each step
    p.add_argument("--inject-stall", default=(), help=hidden,  # a rank freezes in a phase of a step
                   type=entries(int, int, PHASES.index, int_at_least(1), expected="应为 RANK:STEP:PHASE:NTH,..."))
    p.add_argument("--inject-stuck-worker", type=int_at_least(1), default=0, help=hidden)
    p.add_argument("--inject-straggler", type=entries(int, float, expected="应为 RANK:SECONDS"), default=(), help=hidden)


def refuse(exc: Exception) -> int:
    """Print ``prog: 拒绝运行: exc`` on one line to stderr; the exit status 2 (``ExitCode.REFUSED``: nothing changed)."""
    print(f"{Path(sys.argv[0]).name}: 拒绝运行: {exc}", file=sys.stderr)
    return ExitCode.REFUSED


class Started(NamedTuple):
    """What ``start_run`` hands to the training: ``run``, ``saved`` and ``changes`` are None/None/{} off rank 0."""

    args: argparse.Namespace
    stop: StopSignal  # installed in a plain run; under torchrun the script installs it once the group is up
    run: RunFolder | None  # the claimed folder (rank 0)
    saved: dict[str, Any] | None  # the saved config.json the command line was checked against (--resume)
    changes: dict[str, tuple[Any, Any]]  # the allowed changes (--allow-change), {field: (old, new)}
    world: World  # this process's place in the job


def start_run(args: argparse.Namespace, *, free: Iterable[str], changeable: Iterable[str],
              defaults: dict[str, Any]) -> Started:
    """All that can refuse a run, in milliseconds and before torch: torchrun's environment, the lock of
    ``args.out``, and on ``--resume`` the run's identity (``free``/``changeable``/``defaults``: see
    ``runfolder.config_changes``). Exits with status 2 and one line when the run cannot start as asked. With
    ``--overwrite``, says where the old run went (renamed, not deleted).

    Under torchrun only rank 0 claims the folder (the others get None); its refusal stops the job.
    """
    try:
        world = World.from_env()  # torchrun's RANK, WORLD_SIZE...; rank 0 of 1 in a plain run
    except ValueError as exc:
        sys.exit(refuse(Refused(str(exc))))
    stop = StopSignal()
    if not world.launched:  # from here on SIGTERM/Ctrl-C ask for a clean stop, start-up included
        stop.install()      # (under torchrun once the process group is up)
    if not world.is_main:
        return Started(args, stop, None, None, {}, world)
    try:
        run = RunFolder.claim(args.out, resume=args.resume, overwrite=args.overwrite)
        if run.moved_aside:
            print(f"--overwrite: 原来的运行已改名为 {run.moved_aside}(没有删除)")
        saved = run.saved_config() if args.resume and holds_run(args.out) else None
        changes = {} if saved is None else config_changes(
            saved["hparams"], vars(args), free=free, changeable=changeable, allowed=args.allow_change or (),
            defaults=defaults)
    except Refused as exc:
        sys.exit(refuse(exc))
    return Started(args, stop, run, saved, changes, world)


def resume_notes(changes: dict[str, tuple[Any, Any]], saved_device: str | None, device: object, saved_world: int,
                 world_size: int, batch_size: int) -> list[str]:
    """What differs between a checkpoint and the run that resumes from it, one line each (rank 0 prints them).

    The allowed changes (``start_run``'s, recorded in config.json's history), another device, another number of
    processes (the global batch and the sample order stay). The pitfall: such a resume goes on correctly but not
    bit for bit, and a learner who compares two curves must be told. Example: ``resume_notes({}, "cpu", "cpu", 1,
    2, 128)`` is one line that says 1 process saved it, 2 resume it.
    """
    notes = ["已记录到 config.json 的 history: " + ", ".join(f"{k} {a} → {b}" for k, (a, b) in changes.items())]
    notes = notes if changes else []
    if saved_device not in (None, str(device)):
        notes.append(f"注意: 检查点在 {saved_device} 上保存,现在在 {device} 上续训;数值不再逐位一致")
    if saved_world != world_size:
        notes.append(f"注意: 检查点由 {saved_world} 个进程保存,现在是 {world_size} 个: 全局 batch 仍是 "
                     f"{batch_size},样本顺序不变;求和顺序变了,数值不再逐位一致")
    return notes


def guarded(train: Callable[[], int], run: RunFolder | None, world: World, out: str | os.PathLike,
            expected: tuple[type[Exception], ...] = ()) -> int:
    """``train()``'s exit code, or the one every other way out of a training earns, said on one line.

    A ``Refused`` (a flag only torch or the data could judge; nothing changed): exit 2. An ``expected`` error
    (its message says it all), a disk error, a second Ctrl-C or any crash (with its traceback): ``failed``.
    The pitfall it avoids: a crash that leaves status.json at "running" for a launcher or a watcher to trust.
    Example: ``return guarded(lambda: train(args), run, world, args.out, expected=(UnreadableDataError,))``.
    """
    try:
        return train()
    except Refused as exc:
        return refuse(exc) if world.is_main else ExitCode.REFUSED
    except expected as exc:
        return failed(run, str(exc), world)
    except OSError as exc:  # disk full, read-only folder, a file system gone
        return failed(run, f"读写 {exc.filename or out} 失败({exc.strerror or exc})", world)
    except KeyboardInterrupt:
        return failed(run, "第二次 Ctrl-C: 立即停止,本次没有保存", world)
    except Exception as exc:
        traceback.print_exc()
        return failed(run, f"{type(exc).__name__}: {exc}", world)


def failed(run: RunFolder | None, message: str, world: World) -> int:
    """Say what went wrong and what is still safe on one line; status.json says "failed" (``RunFolder.failed``).
    A rank other than 0 owns no file: it prints its rank and message; torchrun stops the job, rank 0 records it."""
    if run is None:
        print(f"rank {world.rank} 失败: {message}", file=sys.stderr)
    else:
        from course_utils.checkpoint import newest_step  # torch: loaded by the training this follows
        run.failed(message, newest_step(run.files.checkpoints))
    return ExitCode.FAILED
