"""The professional script's command line and run-folder refusals: one Chinese line, exit code 2, no torch.

Every run here has a poisoned ``torch`` on its path: a script that imported torch before
refusing would print "TORCH WAS IMPORTED" instead of its one line. No training happens.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from course_utils.cli import unchecked_options
from course_utils.runfolder import ExitCode
from tests.support.pro_runs import SCRIPT, command, load_script, poisoned_torch

# Nonsense for every option that takes a value; the test below requires an entry per option.
BAD_VALUES = {
    "--out": ["{file}", "{file}/run"],
    "--epochs": ["0", "-1", "2.5", "two"],
    "--max-steps": ["-1", "1e3"],
    "--batch-size": ["0", "-32", "3.0"],
    "--lr": ["0", "-1e-3", "nan", "inf", "3e-3O"],
    "--weight-decay": ["-1", "nan"],
    "--warmup-steps": ["-5"],
    "--seed": ["-1", str(2**32)],
    "--model": ["huge"],
    "--width": ["0", "-8"],
    "--dropout": ["1", "1.5", "-0.1", "nan"],
    "--amp": ["fp8"],
    "--clip": ["-1", "nan", "inf"],
    "--ema-decay": ["1", "1.5", "-0.1", "nan"],
    "--ckpt-every-steps": ["-1"],
    "--ckpt-every-seconds": ["-1", "inf", "hourly"], "--mtbf": ["0", "-1", "nan"],
    "--keep-last": ["0"],
    "--data-fraction": ["0", "1.5", "-0.1", "nan"],
    "--workers": ["-1"],
    "--device": ["gpu", "cuda:x", "tpu"],
    "--logger": ["csv"],
    "--log-every": ["0", "-20"],
    "--peak-flops": ["-1", "nan", "inf"],
    "--allow-change": ["seed", "batch_size"],
    "--max-bad-steps": ["0", "-1"],
    "--bad-step-window": ["0"],
    "--inject-nan-at-step": ["0", "a,b"],
    "--on-spike": ["skip"], "--skip-batches": ["-1"], "--rollback-lr-factor": ["0", "1.5", "nan"],
    "--max-rollbacks": ["0"], "--inject-bad-batch": ["-1", "a"],
    "--hang-timeout": ["-1", "nan"], "--inject-stall": ["1:5:data", "1:5:nap:1", "a:5:data:1", "1:5:data:0"],
    "--inject-stuck-worker": ["0"], "--inject-straggler": ["1", "1:x"], "--accum-steps": ["0", "1.5"],
}
# Combinations that are wrong although each value is fine.
BAD_COMBINATIONS = [
    (["--resume", "--overwrite"], "--overwrite"),
    (["--allow-change", "lr"], "--allow-change"),
    (["--max-bad-steps", "60", "--bad-step-window", "50"], "--max-bad-steps"),
    (["--skip-batches", "3"], "--skip-batches"),  # a rollback flag without --on-spike rollback
    (["--lrr", "3e-3"], "--lrr"),
    (["--batch", "64"], "--batch"),  # no prefix matching: --batch is not --batch-size
    (["--lr"], "--lr"),
    (["stray"], "stray"),
    (["--ckpt-every-seconds", "auto"], "--mtbf"),  # Young's interval needs M
    (["--mtbf", "20"], "--mtbf"),  # M without auto is ignored: refused
]
CJK = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture(scope="module")
def parser():
    return load_script().build_parser()


def value_options(parser) -> set[str]:
    return {a.option_strings[-1] for a in parser._actions if a.option_strings and a.nargs != 0}


def test_every_option_has_a_validator_and_nonsense_values(parser):
    assert unchecked_options(parser) == [], "every option needs a validator (a type from course_utils.cli or choices)"
    assert value_options(parser) == set(BAD_VALUES), "BAD_VALUES needs nonsense values for every option"


def _cases(tmp_path) -> list[tuple[str, str, list[str]]]:
    """(what the line must name, the value, the arguments) for every nonsense value and combination."""
    (tmp_path / "afile").write_text("not a folder")
    cases = []
    for option, values in BAD_VALUES.items():
        for value in (v.format(file=tmp_path / "afile") for v in values):
            cases.append((option, value, [option, value, *(["--resume"] if option == "--allow-change" else [])]))
    return cases + [(mark, " ".join(args), args) for args, mark in BAD_COMBINATIONS]


def test_each_nonsense_value_gets_one_chinese_line_and_exit_2(tmp_path, capsys):
    parse_args = load_script().parse_args
    for option, value, args in _cases(tmp_path):
        with pytest.raises(SystemExit) as exited:
            parse_args(["--out", str(tmp_path / "run"), *args])
        out, err = capsys.readouterr()
        where = f"{option} {value}: stdout={out!r} stderr={err!r}"
        assert exited.value.code == ExitCode.REFUSED == 2, where
        lines = err.strip().splitlines()
        assert len(lines) == 1 and not out and option in lines[0] and CJK.search(lines[0]), where
    assert not (tmp_path / "run").exists(), "a refused command line creates nothing"


def test_the_script_refuses_before_importing_torch(tmp_path):
    """The same lines from the script itself, with an unimportable torch: validation comes first."""
    env = poisoned_torch(tmp_path)
    cases = [c for c in _cases(tmp_path) if c[0] in ("--lr", "--out", "--data-fraction", "--overwrite", "--lrr")]

    def run(case):
        return subprocess.run(command(tmp_path / "run", *case[2]), capture_output=True, text=True, env=env,
                              timeout=60)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, cases))
    for (option, value, _), result in zip(cases, results):
        where = f"{option} {value}: stdout={result.stdout!r} stderr={result.stderr!r}"
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and option in lines[0] and not result.stdout, where
        assert "TORCH" not in result.stderr, where


def test_defaults_and_help_pass(parser, tmp_path):
    args = parser.parse_args(["--out", str(tmp_path / "x")])
    assert args.batch_size == 128 and args.max_bad_steps == 5 and args.bad_step_window == 50
    result = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True,
                            env=poisoned_torch(tmp_path), timeout=60)
    assert result.returncode == 0 and "--allow-change" in result.stdout and "status.json" in result.stdout


def files(folder) -> dict[str, bytes]:
    """Every file's bytes except the lock file (which a refused run may create, empty of meaning)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and p.name != "run.lock"}


def _fake_run(folder, hparams: dict) -> None:
    """A run folder as the script leaves it: config.json, a metrics record, a checkpoint name."""
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "step_00000004.pt").write_bytes(b"not read by a refusal")
    (folder / "metrics.jsonl").write_text(json.dumps({"split": "train", "step": 1, "loss": 2.3}) + "\n")
    (folder / "config.json").write_text(json.dumps({"hparams": hparams, "git_commit": "x"}))
    (folder / "status.json").write_text(json.dumps({"state": "finished", "step": 4}))


@pytest.fixture
def saved_run(parser, tmp_path):
    """A fake finished run (tiny model, batch 32) and the command line that made it."""
    argv = ["--model", "tiny", "--batch-size", "32", "--seed", "0", "--max-steps", "4"]
    hparams = {k: (str(v) if k == "out" else v) for k, v in vars(parser.parse_args(
        ["--out", str(tmp_path / "run"), *argv])).items()}
    _fake_run(tmp_path / "run", hparams)
    return tmp_path / "run", argv


def test_resume_with_other_trajectory_is_refused_naming_each_field(saved_run, tmp_path):
    out, argv = saved_run
    before = files(out)
    result = subprocess.run(command(out, *argv, "--resume", "--batch-size", "64", "--seed", "1", "--lr", "1e-3"),
                            capture_output=True, text=True, env=poisoned_torch(tmp_path), timeout=60)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    line = result.stderr
    assert "batch_size 32 → 64" in line and "seed 0 → 1" in line and "--allow-change lr" in line, line
    assert files(out) == before


def test_free_and_allowed_changes_pass_the_identity_check(saved_run, tmp_path):
    out, argv = saved_run
    mod = load_script()
    import course_utils.runfolder as rf
    saved = json.loads((out / "config.json").read_text())["hparams"]
    new = vars(mod.parse_args(["--out", str(tmp_path / "moved"), *argv, "--resume", "--workers", "2",
                               "--log-every", "5", "--ckpt-every-steps", "7", "--keep-last", "3", "--lr", "1e-3",
                               "--allow-change", "lr"]))
    changes = rf.config_changes(saved, new, free=mod.FREE, changeable=mod.CHANGEABLE, allowed=new["allow_change"])
    assert changes == {"lr": (2e-3, 1e-3)}


def test_forgotten_resume_is_refused_and_nothing_changes(saved_run, tmp_path):
    out, argv = saved_run
    before = files(out)
    result = subprocess.run(command(out, *argv), capture_output=True, text=True, env=poisoned_torch(tmp_path),
                            timeout=60)
    assert result.returncode == 2 and "--resume" in result.stderr and "--overwrite" in result.stderr, result.stderr
    assert files(out) == before


def test_busy_folder_is_refused_with_the_holders_pid(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    fd = os.open(out / "run.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, f"pid {os.getpid()} @ here\n".encode())
        result = subprocess.run(command(out, "--resume"), capture_output=True, text=True,
                                env=poisoned_torch(tmp_path), timeout=60)
    finally:
        os.close(fd)
    assert result.returncode == 2 and f"pid {os.getpid()}" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
