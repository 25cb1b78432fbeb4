"""Reading what a learner's homework script wrote: untrusted files, size caps, the training records.

Reference machinery of the homework checks (:mod:`course_tools.checks.nb10_homework`): the script is untrusted, so
are its files; each refusal (:func:`read_untrusted_bytes`) is a ``CheckFailed`` with the usual expected / found /
hint. Example::

    records = read_train_records(run_folder)      # {step: record}, evaluation records left out
"""
from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from course_tools.checks import expect, fail

__all__ = ["METRICS_CAP", "CONFIG_CAP", "read_untrusted_bytes", "read_untrusted", "read_records", "read_train_records",
           "is_number", "read_config", "config_values"]

METRICS_CAP = 64 * 2**20   # bytes: a metrics.jsonl larger than this is refused unread
CONFIG_CAP = 2**20         # bytes: the same for config.json


def read_untrusted_bytes(path: Path, cap: int) -> bytes | None:
    """The bytes of a file the learner's script wrote, or None when it does not exist.

    A symlink (the file or its folder) and anything but a regular file are refused, and so is a
    file over ``cap`` bytes: the script is untrusted, its files may point anywhere or fill memory.
    """
    for p in (path.parent, path):
        if p.is_symlink():
            fail(f"{p.name} 是脚本自己写的普通文件", f"{p.name} 是符号链接", "直接写文件,不要链接到别处")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        fail(f"{path.name} 可以读取", f"{type(exc).__name__}: {exc.strerror}", "直接写文件,不要链接到别处")
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        expect(stat.S_ISREG(info.st_mode), f"{path.name} 是普通文件", "它不是", "用 open(..., \"w\") 写出")
        data = f.read(cap + 1)
    expect(len(data) <= cap, f"{path.name} 不超过 {cap // 2**20} MiB", "超过了",
           "检查只跑几十步: 每步一行 JSON,不会有这么大")
    return data


def read_untrusted(path: Path, cap: int) -> str | None:
    """The text of a file the learner's script wrote (see :func:`read_untrusted_bytes`)."""
    data = read_untrusted_bytes(path, cap)
    return None if data is None else data.decode("utf-8", errors="replace")


def read_records(path: Path) -> list[Any]:
    """Every complete JSON line of a ``metrics.jsonl`` written by the learner ([] when it does not exist).

    A torn or invalid line is skipped (the process may be killed while writing it).
    """
    text = read_untrusted(Path(path), METRICS_CAP)
    records = []
    for line in (text or "").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def read_train_records(out: Path) -> dict[int, dict[str, Any]]:
    """Training records of ``out/metrics.jsonl`` by step (the last record of a step wins)."""
    path = out / "metrics.jsonl"
    expect(path.exists() or path.is_symlink(), f"--out 目录里有 {path.name}", "没有这个文件",
           '每个优化器步追加一行 JSON,例如 {"step": 1, "loss": 2.3051}(见本节约定)')
    records: dict[int, dict[str, Any]] = {}
    for rec in read_records(path):
        if not isinstance(rec, dict) or rec.get("split", "train") != "train":
            continue
        expect("step" in rec and "loss" in rec, "每条训练记录都有 step 和 loss",
               f"记录 {json.dumps(rec, ensure_ascii=False)[:200]}", '评估记录要带 "split": "val"')
        expect(isinstance(rec["step"], int) and is_number(rec["loss"]),
               "step 是整数、loss 是数字", f"step={rec['step']!r}, loss={rec['loss']!r}", "写 loss.item(),不要写张量或字符串")
        records[rec["step"]] = rec
    expect(len(records) > 0, f"{path.name} 里至少有一条训练记录", "一条也没有")
    return records


def is_number(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_config(out: Path) -> Any:
    """``out/config.json`` parsed (fails when missing, refused or not JSON)."""
    text = read_untrusted(out / "config.json", CONFIG_CAP)
    expect(text is not None, "--out 目录里有 config.json", "没有",
           "启动时写出: course_utils.repro.dump_run_config(args.out, vars(args))")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        fail("config.json 是合法 JSON", f"{type(exc).__name__}: {str(exc)[:200]}", "用 json.dump 写,不要手拼字符串")


def config_values(obj: Any, name: str, substring: bool = False) -> list[Any]:
    """Values of every key (at any depth) equal to ``name`` (or containing it, with ``substring``)."""
    found = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if (name in str(k).lower()) if substring else str(k) == name:
                found.append(v)
            found += config_values(v, name, substring)
    elif isinstance(obj, list):
        for v in obj:
            found += config_values(v, name, substring)
    return found
