"""The homework checks (course_tools.checks.nb10_homework) pass a right answer and fail each typical
wrong answer with the hint that names it.

Most wrong answers run as torch-free fakes (tests/fixtures/homework_fake/): a check takes about a
second on them, and they run side by side. The released baseline is a real script (slow). The
reference scripts pass every check in solutions/10_homework.ipynb, which the suite runs under nbval;
the scripted learner (real training, one round per upgrade) is tests/test_homework_learner.py.
"""
from __future__ import annotations

import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import psutil
import pytest

from course_utils import interrupt
from course_utils.resume_doctor import probe
from course_tools.checks import CheckFailed
from course_tools.checks import homework_resume, homework_runs
from course_tools.checks import untrusted_files as homework_files
from course_tools.checks import nb10_homework as homework
from tests.support.homework_scripts import BASELINE, FAKES, FORKED, FORKED_TORCH, HEALTHY, TRAIN, TWIN, fake_overfit_pair, fake_train
from tests.support.notebook_cells import ROOT, SECTION
from tests.support.sweep import SWEEP_SEEDS

sys.path.insert(0, str(FAKES))
import fake_overfit  # noqa: E402
import fake_train as fake_train_module  # noqa: E402

# id: (check, fake level (flags of upgrades 1..level), bug, {field of CheckFailed: fragment it must contain})
TRAIN_CASES = {
    "config/baseline-flags": ("check_config", 0, None,
                              {"found": "unrecognized arguments", "hint": "脚本还不认识 --out --seed --max-steps --model --data-fraction"}),
    "config/unseeded": ("check_config", 4, "unseeded", {"expected": "每步 loss 完全相同", "hint": "set_seed(args.seed) 要在建模型"}),
    "config/seed_ignored": ("check_config", 4, "seed_ignored", {"expected": "--seed 1235", "hint": "种子写死了"}),
    "config/no_config": ("check_config", 4, "no_config", {"expected": "config.json", "hint": "dump_run_config"}),
    "config/config_without_commit": ("check_config", 4, "config_without_commit", {"expected": "git commit"}),
    "config/steps_from_zero": ("check_config", 4, "steps_from_zero", {"found": "[0, 1, 2]", "hint": "step 从 1 开始"}),
    "config/max_steps_inner_loop": ("check_config", 4, "max_steps_inner_loop",
                                    {"expected": "在 step 3 结束", "hint": "连 epoch 循环一起跳出"}),
    "config/no_metrics": ("check_config", 4, "no_metrics", {"expected": "metrics.jsonl", "hint": '"step": 1'}),
    "config/crash": ("check_config", 4, "crash", {"found": "NameError: name 'undefined_name'",
                                                   "hint": "复现: python train_cifar.py --out runs/hw_check --seed 1234"}),
    # issue 13 item 2: a script that cannot even start shows argparse's own message, not a consequence
    "resume/upgrade1-flags": ("check_resume", 1, None, {"found": "unrecognized arguments: --ckpt-every-steps 10 --dropout",
                                                        "hint": "脚本还不认识 --ckpt-every-steps --dropout"}),
    "resume/metrics_at_end": ("check_resume", 4, "metrics_at_end", {"hint": "边训练边写"}),
    "resume/resume_restarts": ("check_resume", 4, "resume_restarts", {"found": "从 step 1 重新开始"}),
    "resume/no_optimizer_state": ("check_resume", 4, "no_optimizer_state", {"hint": "第一步一致"}),
    "resume/replays_epoch": ("check_resume", 4, "replays_epoch", {"hint": "第一步就不同"}),
    "resume/no_rng_state": ("check_resume", 4, "no_rng_state", {"expected": "曲线无缝衔接", "hint": "随机数状态也要存进检查点"}),
    # issue 29: a checkpoint saved at an epoch end before an evaluation that draws from the global generator
    "resume/eval_after_save": ("check_resume", 4, "eval_after_save",
                               {"expected": "在 epoch 结尾被 kill", "hint": "普通的 DataLoader 每次 iter()"}),
    "resume/no_epoch_eval": ("check_resume", 4, "no_epoch_eval", {"expected": "每个 epoch 结束时写一条评估记录"}),
    "resume/resume_adds_max_steps": ("check_resume", 4, "resume_adds_max_steps", {"hint": "--max-steps 是总步数"}),
    "resume/crash": ("check_resume", 4, "crash", {"found": "NameError"}),
    "resume/resume_crashes": ("check_resume", 4, "resume_crashes",
                              {"expected": "--resume 续训 正常结束", "found": "KeyError: 'momentum'", "hint": "原子写入"}),
    "clipping/upgrade2-flags": ("check_clipping", 2, None, {"found": "unrecognized arguments: --clip",
                                                            "hint": "脚本还不认识 --clip"}),
    "clipping/post_clip_norm": ("check_clipping", 4, "post_clip_norm", {"hint": "裁剪后的范数"}),
    "clipping/clipped_reversed": ("check_clipping", 4, "clipped_reversed", {"hint": "写反了"}),
    "clipping/clipped_always": ("check_clipping", 4, "clipped_always", {"expected": "--clip 1e6", "hint": "调用过"}),
    "clipping/no_clipped": ("check_clipping", 4, "no_clipped", {"expected": "grad_norm 和 clipped"}),
    "clipping/clip_noop": ("check_clipping", 4, "clip_noop", {"expected": "裁剪真的起作用", "hint": "根本没被裁剪"}),
    "ema/upgrade3-flags": ("check_ema", 3, None, {"found": "unrecognized arguments: --ema-decay",
                                                  "hint": "脚本还不认识 --ema-decay"}),
    "ema/ema_not_saved": ("check_ema", 4, "ema_not_saved", {"expected": "最后的 loss_ema 与不中断的运行相同",
                                                            "hint": "EMA 的状态要存进检查点"}),
    "ema/ema_not_restored": ("check_ema", 4, "ema_not_restored", {"expected": "最后的 loss_ema 与不中断的运行相同",
                                                                  "hint": "--resume 时恢复"}),
    "ema/eval_after_save": ("check_ema", 4, "eval_after_save",
                            {"expected": "在 epoch 结尾被 kill", "hint": "普通的 DataLoader 每次 iter()"}),
    "ema/ema_before_step": ("check_ema", 4, "ema_before_step", {"expected": "--ema-decay 1e-6", "hint": "落后一步"}),
    "ema/ema_decay_swapped": ("check_ema", 4, "ema_decay_swapped", {"expected": "--ema-decay 1e-6", "hint": "不要写反"}),
    "ema/ema_raw_twice": ("check_ema", 4, "ema_raw_twice", {"expected": "与原始权重不同", "hint": "评估的还是原始模型"}),
    "ema/ema_zero_not_off": ("check_ema", 4, "ema_zero_not_off", {"expected": "--ema-decay 0 关掉 EMA"}),
    "ema/no_final_eval": ("check_ema", 4, "no_final_eval", {"expected": "在训练结束时(step 3)写一条评估记录"}),
}
# id: (bug of debug_overfit.py, bug of the twin, {field: fragment})
OVERFIT_CASES = {
    "overfit/fixed_mapping": (None, "fixed_mapping", {"expected": "降不下去", "hint": "固定的错误映射"}),
    "overfit/twin_exits_zero": (None, "twin_exits_zero", {"expected": "非 0 退出码", "hint": "sys.exit(1)"}),
    "overfit/twin_crash": (None, "crash", {"expected": "不崩溃", "found": "KeyError: 'accuracy'"}),
    "overfit/twin_bad_flag": (None, "bad_flag", {"hint": "脚本还不认识 --batch-size"}),
    "overfit/stalls": ("stalls", None, {"expected": "loss ≈ 0", "hint": "学习率"}),
    "overfit/new_batch_each_step": ("new_batch_each_step", None, {"hint": "同一个 batch"}),
    "overfit/crash": ("crash", None, {"found": "KeyError"}),
    "overfit/no_grad_norm": ("no_grad_norm", None, {"expected": "grad_norm"}),
    "overfit/no_samples": ("no_samples", None, {"expected": "samples.png", "hint": "show_samples"}),
}
RIGHT = ["right/config", "right/resume", "right/clipping", "right/ema", "right/overfit"]


def _run_case(case: str, folder: Path) -> BaseException | None:
    try:
        if case.startswith("right/"):
            check = case.split("/")[1]
            if check == "overfit":
                homework.check_overfit(*fake_overfit_pair(folder), launcher=FORKED)
            else:
                getattr(homework, f"check_{check}")(fake_train(folder), launcher=FORKED)
        elif case == "overfit/swapped":  # the healthy script handed in as the twin
            healthy, _ = fake_overfit_pair(folder)
            homework.check_overfit(healthy, healthy, launcher=FORKED)
        elif case in TRAIN_CASES:
            check, level, bug, _ = TRAIN_CASES[case]
            getattr(homework, check)(fake_train(folder, level, bug), launcher=FORKED)
        else:
            healthy_bug, twin_bug, _ = OVERFIT_CASES[case]
            homework.check_overfit(*fake_overfit_pair(folder, healthy_bug, twin_bug), launcher=FORKED)
    except BaseException as exc:  # noqa: BLE001 - the test inspects it
        return exc
    return None


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every case run once, side by side (each check waits on its runs), the fakes forked (``FORKED``)."""
    cases = [*RIGHT, *TRAIN_CASES, *OVERFIT_CASES, "overfit/swapped"]
    root = tmp_path_factory.mktemp("homework_cases")
    with ThreadPoolExecutor(max_workers=32) as pool:
        results = pool.map(lambda c: _run_case(c, root / c.replace("/", "_")), cases)
        return dict(zip(cases, results))


@pytest.mark.parametrize("case", RIGHT)
def test_right_answer_passes(outcomes, case):
    assert outcomes[case] is None, f"{case}: {outcomes[case]!r}"


@pytest.mark.parametrize("case", [*TRAIN_CASES, *OVERFIT_CASES, "overfit/swapped"])
def test_wrong_answer_fails_with_its_hint(outcomes, case):
    exc = outcomes[case]
    assert isinstance(exc, CheckFailed), f"{case}: expected CheckFailed, got {exc!r}"
    wanted = TRAIN_CASES[case][3] if case in TRAIN_CASES else (
        OVERFIT_CASES[case][2] if case in OVERFIT_CASES else {"hint": "固定的错误映射"})
    for field, fragment in wanted.items():
        assert fragment in getattr(exc, field), f"{case}: {field} lacks {fragment!r}: {exc}"
    assert "/tmp" not in exc.found and "Traceback" not in exc.found, f"{case}: {exc.found}"


def test_every_fake_bug_is_a_case():
    used = {bug for _, _, bug, _ in TRAIN_CASES.values()}
    assert set(fake_train_module.BUGS) <= used, set(fake_train_module.BUGS) - used
    used = {bug for pair in OVERFIT_CASES.values() for bug in pair[:2]}
    assert set(fake_overfit.BUGS) <= used, set(fake_overfit.BUGS) - used


# The checks whose verdicts rest on measured numbers (EMA, RNG state, the clip acting), on 50 other seeds
SWEPT = ["right/resume", "right/clipping", "right/ema", "resume/no_rng_state", "resume/eval_after_save",
         "ema/eval_after_save", "clipping/clip_noop",
         "ema/ema_not_saved", "ema/ema_before_step", "ema/ema_decay_swapped", "ema/ema_raw_twice"]


@pytest.mark.slow
def test_numeric_verdicts_hold_on_50_other_seeds(tmp_path):
    def verdict(job):
        case, seed = job
        check, level, bug = TRAIN_CASES[case][:3] if case in TRAIN_CASES else (f"check_{case[6:]}", 4, None)
        try:
            getattr(homework, check)(fake_train(tmp_path / f"{case.replace('/', '_')}_{seed}", level, bug), seed=seed,
                                     launcher=FORKED)
        except CheckFailed as exc:
            return case, seed, exc.expected
        return case, seed, None

    expected = {case: None if case.startswith("right/") else TRAIN_CASES[case][3]["expected"] for case in SWEPT}
    with ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(verdict, [(case, seed) for seed in SWEEP_SEEDS for case in SWEPT]))
    wrong = [(case, seed, got) for case, seed, got in results
             if (got is None) != (expected[case] is None) or (got is not None and expected[case] not in got)]
    assert not wrong, wrong


# ------------------------------------------------------------------ the script's own error

def test_script_error_reads_argparse_tracebacks_and_plain_output(tmp_path):
    usage = ("usage: train_cifar.py [-h] [--epochs EPOCHS]\n"
             "train_cifar.py: error: unrecognized arguments: --max-steps 3 --model tiny\n")
    assert homework_runs.script_error(usage, tmp_path) == (
        "train_cifar.py: error: unrecognized arguments: --max-steps 3 --model tiny", ["--max-steps", "--model"])
    mine = tmp_path / "train_cifar.py"
    trace = ("epoch 0 step 0 loss 2.3\r 40%|####  | 2/5\n"
             "Traceback (most recent call last):\n"
             f'  File "{mine}", line 88, in <module>\n    main()\n'
             f'  File "{mine}", line 61, in main\n    grad_norm = clip(model)\n'
             '  File "/usr/lib/python3/site-packages/torch/x.py", line 5, in f\n    raise KeyError(k)\n'
             "KeyError: 'weight'\n")
    error, flags = homework_runs.script_error(trace, tmp_path)
    assert error == "KeyError: 'weight'(位置: train_cifar.py 第 61 行 `grad_norm = clip(model)`)" and flags == []
    assert homework_runs.script_error("a\nb\n\nc\n", tmp_path) == ("a | b | c", [])
    assert homework_runs.script_error("", tmp_path) == ("没有任何输出", [])


def test_a_failed_check_leaves_no_process_behind(tmp_path):
    # the guard on --max-steps stops three scripts that would train on for 8000 steps
    before = {p.pid for p in psutil.Process().children(recursive=True)}  # e.g. a wandb service of another test
    with pytest.raises(CheckFailed, match="在 step 3 结束"):
        homework.check_config(fake_train(tmp_path, bug="max_steps_inner_loop"))
    new = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    _, alive = psutil.wait_procs(new, timeout=5)  # a killed process may still be on its way out
    left = []
    for p in alive:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                left.append((p.pid, " ".join(p.cmdline())[:200]))
        except psutil.NoSuchProcess:
            pass
    assert left == []


def test_missing_scripts_are_named(tmp_path):
    with pytest.raises(CheckFailed, match="找不到"):
        homework.check_overfit(tmp_path / "debug_overfit.py", tmp_path / "debug_overfit_broken_labels.py")
    with pytest.raises(CheckFailed, match="找不到"):
        homework.check_config(tmp_path / "train_cifar.py")


def test_solution_notebook_runs_every_check_on_the_reference():
    """solutions/10_homework.ipynb (run by the suite under nbval) is where the reference scripts pass."""
    nb = nbformat.read(ROOT / "solutions" / "10_homework.ipynb", as_version=4)
    override = [c.source for c in nb.cells if "solution-only" in c.metadata.get("tags", [])]
    assert len(override) == 1 and '"solutions" / "homework"' in override[0] and '"train_cifar.py"' in override[0]
    calls = {c.source.split("(")[0]: c for c in nb.cells if c.cell_type == "code" and c.source.startswith("check_")}
    assert list(calls) == [u.check.__name__ for u in homework.UPGRADES]
    for name, cell in calls.items():
        lines = "".join(o.get("text", "") for o in cell.outputs).splitlines()
        assert len(lines) == 2 and lines[0].startswith("运行: /") and "solutions/homework/" in lines[0] \
            and lines[1].startswith("✅"), f"{name}: stored output {lines!r} (re-run release --execute --only 10)"


@pytest.mark.slow
@pytest.mark.parametrize("check, flags", [
    ("check_config", "--out --seed --max-steps --model --data-fraction"),
    ("check_resume", "--out --seed --max-steps --ckpt-every-steps --dropout --model --data-fraction"),
    ("check_clipping", "--out --seed --clip --max-steps --model --data-fraction"),
    ("check_ema", "--out --seed --max-steps --ckpt-every-steps --ema-decay --dropout --model --data-fraction"),
])
def test_released_baseline_fails_naming_the_missing_flags(check, flags):
    with pytest.raises(CheckFailed) as info:
        getattr(homework, check)(BASELINE, launcher=FORKED_TORCH)
    assert f"脚本还不认识 {flags}" in info.value.hint, info.value


def test_the_hint_names_every_unknown_flag_whichever_run_fails_first(tmp_path):
    """check_ema's runs pass different flags; the run that knows fewest flags failing first must
    not hide the others (CI saw ``--ckpt-every-steps`` missing from the hint when it lost the race)."""
    script = tmp_path / "train_cifar.py"
    script.write_text(
        "import argparse, sys, time\n"
        "if '--ckpt-every-steps' in sys.argv:\n"
        "    time.sleep(2)  # the runs that pass it fail last\n"
        "p = argparse.ArgumentParser()\n"
        "p.add_argument('--batch-size'); p.add_argument('--epochs')\n"
        "p.parse_args()\n", encoding="utf-8")
    with pytest.raises(CheckFailed) as info:
        homework.check_ema(script)
    assert "脚本还不认识 --out --seed --max-steps --ckpt-every-steps --ema-decay --dropout --model --data-fraction" \
        in info.value.hint, info.value


# ------------------------------------------------------------------ the grader's interface

def test_upgrades_list_every_check_in_order_with_its_scripts():
    assert [u.number for u in homework.UPGRADES] == [1, 2, 3, 4, 5]
    assert [u.check for u in homework.UPGRADES] == [homework.check_config, homework.check_resume,
                                                  homework.check_clipping, homework.check_ema, homework.check_overfit]
    assert all(u.scripts == (TRAIN,) for u in homework.UPGRADES[:4])
    assert homework.UPGRADES[4].scripts == (HEALTHY, TWIN)
    assert all(u.title for u in homework.UPGRADES)


class RecordingLauncher:
    """The grader's side of the interface: records each launch and what the run folder held then."""

    def __init__(self) -> None:
        self.launches: list[dict] = []

    def __call__(self, argv, *, cwd, env, stdout, writable):
        assert writable.is_dir(), "the check creates the run folder before the launch"
        self.launches.append({"argv": argv, "cwd": cwd, "writable": writable,
                              "holds": sorted(p.name for p in writable.iterdir())})
        return homework_runs.LOCAL(argv, cwd=cwd, env=env, stdout=stdout, writable=writable)


@pytest.mark.fresh_interpreter  # how a check launches: a real interpreter
def test_upgrade_run_passes_launcher_workdir_and_commit_through(tmp_path, capsys):
    folder = fake_train(tmp_path / "hw").parent
    launcher = RecordingLauncher()
    message = homework.UPGRADES[0].run(folder, launcher=launcher, workdir=tmp_path / "work", commit="")
    assert message.startswith("升级 1") and f"运行: {folder / TRAIN}" in capsys.readouterr().out
    assert len(launcher.launches) == 3
    for launch in launcher.launches:
        assert launch["argv"][:2] == [sys.executable, str(folder / TRAIN)] and launch["cwd"] == folder
        out = launch["argv"][launch["argv"].index("--out") + 1]
        assert Path(out) == launch["writable"] and launch["writable"].is_relative_to(tmp_path / "work")
    assert len({launch["writable"] for launch in launcher.launches}) == 3  # a folder of its own for each run
    with pytest.raises(CheckFailed, match="记录的 commit 等于当前 HEAD 0123456789"):
        homework.UPGRADES[0].run(folder, workdir=tmp_path / "work", commit="0123456789abcdef")
    # commit reaches only check_config; the other upgrades accept it from a grader that passes it to all
    assert homework.UPGRADES[2].run(folder, workdir=tmp_path / "work", commit="").startswith("升级 3")


@pytest.mark.parametrize("upgrade", homework.UPGRADES, ids=lambda u: u.check.__name__)
def test_each_check_first_prints_the_absolute_paths_of_its_scripts(upgrade, tmp_path, capsys):
    folder = tmp_path / "hw"
    fake_train(folder)
    fake_overfit_pair(folder)
    message = upgrade.run(folder, workdir=tmp_path / "work")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "运行: " + "、".join(str(folder.resolve() / name) for name in upgrade.scripts)
    assert lines[-1] == f"✅ {message}" and message.startswith(f"升级 {upgrade.number}")


def test_the_resumed_process_sees_only_its_own_folder(tmp_path):
    launcher = RecordingLauncher()
    homework.check_resume(fake_train(tmp_path / "hw"), launcher=launcher, workdir=tmp_path / "work")
    resumed = [la for la in launcher.launches if "--resume" in la["argv"]]
    assert len(resumed) == 2, resumed  # the mid-epoch and the epoch-end kill
    for launch in resumed:
        assert "metrics.jsonl" not in launch["holds"] and "checkpoint.json" in launch["holds"], launch  # moved away


def test_kills_are_exact_steps_counted_in_the_script(tmp_path):
    """issue 29: the killed runs start through the resume doctor's probe with their step (it kills through
    course_utils.interrupt); the reference and the resumes go through the probe too, recorded, never killed (issue 51)."""
    launcher = RecordingLauncher()
    message = homework.check_resume(fake_train(tmp_path / "hw"), launcher=launcher, workdir=tmp_path / "work")
    script = str((tmp_path / "hw" / TRAIN).resolve())
    assert all(la["argv"][1] == probe.__file__ and la["argv"][2] == "--record" for la in launcher.launches)
    own = {la["argv"][la["argv"].index("--") + 1] for la in launcher.launches}
    assert own == {script}, own  # the script's own command follows the probe's options
    killed = {la["argv"][la["argv"].index("--kill") + 1]: la["argv"] for la in launcher.launches if "--kill" in la["argv"]}
    assert set(killed) == {"25", "9"}, launcher.launches  # mid-epoch; the fake's epoch is 8 steps: after step 9
    every = killed["9"][killed["9"].index("--ckpt-every-steps") + 1]
    assert every == "8", killed["9"]  # a checkpoint at every epoch end
    plain = [la["argv"] for la in launcher.launches if "--kill" not in la["argv"]]
    assert len(plain) == 3  # the reference and the two resumes
    assert "step 20(epoch 中间)和 step 8(epoch 结尾" in message and homework_resume.POLLED_NOTE not in message


def test_a_script_without_a_torch_optimizer_is_killed_by_watching_its_log(tmp_path):
    message = homework.check_resume(fake_train(tmp_path / "hw", hook=False), launcher=FORKED)
    assert message.startswith("升级 2") and homework_resume.POLLED_NOTE in message


@pytest.mark.slow
def test_the_step_hook_kills_a_real_torch_script_after_exactly_k_steps(tmp_path):
    script = tmp_path / "steps.py"
    script.write_text("import sys, torch\n"
                      "m = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                      "for i in range(1, 50):\n"
                      "    m(torch.ones(1, 2)).sum().backward()\n    opt.step()\n    print(i, sys.argv[1:], flush=True)\n",
                      encoding="utf-8")
    import subprocess
    out = subprocess.run([sys.executable, interrupt.__file__, "7", str(script), "--x", "1"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == -9, out
    assert out.stdout.splitlines() == [f"{i} ['--x', '1']" for i in range(1, 7)]  # killed inside step 7
    # --stop: frozen at the same point (lab.multi_process then kills a whole torchrun job); the output so far is flushed
    log = tmp_path / "stop.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, interrupt.__file__, "--stop", "3", str(script), "--x", "1"], stdout=f)
    try:
        ps = psutil.Process(proc.pid)
        deadline = time.monotonic() + 120
        while ps.status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ps.status() == psutil.STATUS_STOPPED
        assert log.read_text().splitlines() == ["1 ['--x', '1']", "2 ['--x', '1']"]
    finally:
        proc.kill()
        proc.wait()


def test_files_written_by_the_script_are_read_with_care(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    secret = tmp_path / "secret.jsonl"
    secret.write_text('{"step": 1, "loss": 2.3}\n', encoding="utf-8")
    (out / "metrics.jsonl").symlink_to(secret)
    with pytest.raises(CheckFailed, match="符号链接"):
        homework_files.read_train_records(out)
    (out / "metrics.jsonl").unlink()
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 2.3}\n' * 100, encoding="utf-8")
    monkeypatch.setattr(homework_files, "METRICS_CAP", 1000)
    with pytest.raises(CheckFailed, match="不超过"):
        homework_files.read_train_records(out)
    monkeypatch.undo()
    assert homework_files.read_train_records(out) == {1: {"step": 1, "loss": 2.3}}
    (out / "config.json").write_text("[" * 100_000, encoding="utf-8")
    with pytest.raises(CheckFailed, match="合法 JSON"):
        homework_files.read_config(out)


class _Exiting:
    """A run seen alive at its first ``alive`` polls, exited with ``rc`` from then on (crashed when rc != 0)."""

    def __init__(self, tmp_path, alive: int, rc: int):
        self.polls, self.alive, self.rc, self.kill_after, self.what, self.advice = 0, alive, rc, None, "对照脚本", ""
        self.out, self.script, self.args = tmp_path / "out", tmp_path / "debug_overfit_broken_labels.py", []

    def poll(self):
        self.polls += 1
        return None if self.polls <= self.alive else self.rc

    def output(self):
        return "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nKeyError: 'accuracy'\n"

    def crashed(self):
        return self.rc != 0

    def killed_as_planned(self):
        return False

    def max_step(self):
        return 2

    def command(self):
        return "python debug_overfit_broken_labels.py"

    def kill(self):
        pass

    def cpu(self):
        return 0.0


def test_watch_judges_a_run_that_exits_between_two_polls(tmp_path):
    """issue 29: the healthy run has finished; the twin crashes right after the look that judged it alive. A
    fresh poll after the verdicts must not end the watch on a crash it never judged (it did under load)."""
    with pytest.raises(CheckFailed) as info:
        homework_runs.watch([_Exiting(tmp_path, alive=0, rc=0), _Exiting(tmp_path, alive=1, rc=1)], ok=False)
    assert "KeyError: 'accuracy'" in info.value.found and "不崩溃" in info.value.expected


def _racing_runs(tmp_path: Path, first_sleeps: float) -> list:
    """Two real runs of one script that both fail: the first in order after ``first_sleeps`` s, the second at once."""
    script = tmp_path / "train_cifar.py"
    script.write_text("import sys, time\n"
                      "if sys.argv[-1] == 'slow':\n"
                      f"    time.sleep({first_sleeps})\n"
                      "    sys.exit('error: the slow run failed')\n"
                      "sys.exit('error: the fast run failed')\n", encoding="utf-8")
    return [homework_runs.Run(script, ["slow"], tmp_path, "a", "慢的运行"),
            homework_runs.Run(script, ["fast"], tmp_path, "b", "快的运行")]


def test_side_by_side_runs_that_all_fail_report_the_first_in_order_not_the_first_to_end(tmp_path):
    """The same failing script gives the same message at every grading: the runs get time to end, and the first
    in the check's order is reported though the second failed sooner (before, whichever ended first was)."""
    with pytest.raises(CheckFailed) as info:
        homework_runs.run_all(_racing_runs(tmp_path, 1.5))
    assert "慢的运行" in info.value.expected and "the slow run failed" in info.value.found, info.value


def test_a_failure_waits_a_bounded_time_for_the_other_runs(tmp_path, monkeypatch):
    """A sibling that keeps running (here: sleeps 120 s) is waited for ``_SETTLE`` s (1 s here), not longer; then the
    run that did fail is reported and the sibling is killed."""
    monkeypatch.setattr(homework_runs, "_SETTLE", 1.0)
    start = time.monotonic()
    runs = _racing_runs(tmp_path, 120)
    with pytest.raises(CheckFailed) as info:
        homework_runs.run_all(runs)
    assert "快的运行" in info.value.expected and "the fast run failed" in info.value.found, info.value
    assert 1.0 <= time.monotonic() - start < 1.0 + 30 and runs[0].poll() is not None


def test_the_reading_map_of_the_professional_script_points_at_real_sections():
    """10's last section maps each thing the professional script adds to "NN §k" of a notebook: each exists."""
    cells = nbformat.read(ROOT / "solutions" / "10_homework.ipynb", as_version=4).cells
    table = next(c.source for c in cells if c.cell_type == "markdown" and "## 参考答案,以及专业版脚本的导读" in c.source)
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| 专业版多出来的")]
    assert len(rows) >= 10
    pointed = 0
    for row in rows:
        where = row.rstrip(" |").rsplit("|", 1)[-1]
        for notebook, sections in re.findall(r"(\d\d\w?) ((?:§\d+(?:–\d+)?[、,]?\s*)+)", where):
            path = next((ROOT / "solutions").glob(f"{notebook}_*.ipynb"))
            headings = {int(m) for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown"
                        for m in SECTION.findall(c.source)}
            for a, b in re.findall(r"§(\d+)(?:–(\d+))?", sections):
                wanted = set(range(int(a), int(b or a) + 1))
                assert wanted <= headings, f"{row}: {path.name} has no section {sorted(wanted - headings)}"
                pointed += 1
    assert pointed >= 15
