"""The resume doctor (course_utils.resume_doctor, issue 51): its command line, its comparison, end to end.

The comparison is tested on hand-made records (each cause from the state that shows it first); the probe and
the chains on real runs of the zoo's tiny script (slow: each doctor run starts two interpreters and forks the
chains' processes from one of them, ``--fresh`` eight interpreters). The whole
zoo, five runs each, quiet and beside CPU hogs, is ``bench/resume_doctor.py``.
"""
from __future__ import annotations

import json
import re
import struct
import subprocess
import sys

import pytest

from course_utils.resume_doctor import cli
from course_utils.resume_doctor.compare import compare_chain, rounded_to
from course_utils.resume_doctor.explain import CAUSES, COMPONENTS, explain, headline
from course_utils.resume_doctor.forks import ForkServer
from course_utils.resume_doctor.runs import Proc, UsageError, environ, kill_plan, parse_command, parse_records
from tests.support.notebook_cells import ROOT

ZOO = ROOT / "bench" / "resume_zoo"


# ------------------------------------------------------------------ the command line

def test_the_command_keeps_the_script_and_fills_in_the_folder_and_the_resume_slot(tmp_path):
    cmd = parse_command(["python", "-u", "train.py", "--out", "{out}", "[--resume --allow-change lr]", "--lr", "1"])
    assert cmd.argv(tmp_path, resumed=False) == ["train.py", "--out", str(tmp_path), "--lr", "1"]
    assert cmd.argv(tmp_path, resumed=True) == ["train.py", "--out", str(tmp_path), "--resume", "--allow-change", "lr",
                                                "--lr", "1"]
    assert cmd.python == ["python", "-u"]
    assert parse_command([sys.executable, "-m", "pkg.train", "--out={out}/run"]).argv(tmp_path, True) == \
        ["-m", "pkg.train", f"--out={tmp_path}/run"]


@pytest.mark.parametrize("cmd, says", [
    (["bash", "train.sh", "{out}"], "Python interpreter"),
    (["python", "train.py", "--out", "runs/x"], "{out}"),
    (["python", "t.py", "{out}", "[--resume]", "[--again]"], "more than one"),
    (["python", "-u"], "names no script"),
])
def test_a_command_the_doctor_cannot_run_is_a_usage_error(cmd, says):
    with pytest.raises(UsageError, match=re.escape(says)):
        parse_command(cmd)


def test_usage_errors_exit_2_before_anything_runs(capsys):
    assert cli.main(["--steps", "10", "--", "python", "train.py"]) == cli.ERROR
    assert "{out}" in capsys.readouterr().err
    assert cli.main(["--steps", "1", "--", "python", "train.py", "{out}"]) == cli.ERROR


def test_help_shows_the_contract():
    out = subprocess.run([sys.executable, "-m", "course_utils.resume_doctor", "--help"], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert out.returncode == 0 and "{out}" in out.stdout and "'[--resume]'" in out.stdout, out


# ------------------------------------------------------------------ the comparison, on hand-made records

def _state(params: str, **kw) -> dict:
    base = {"params": params, "psample": [0.1, 0.2], "dtypes": ["torch.float32"], "opt": f"o{params}", "opt_empty": False,
            "opt_step": None, "lr": [1e-3], "before": {"buffers": "b", "extras": {"Sequential#0": f"e{params}"},
                                                         "rng": {"torch": "r"}}}
    base.update(kw)
    return base


_SCALER_FRESH = json.dumps({"_growth_tracker": "0", "scale": "1024.0"})


def _step(k: int, batch: str | None = None, epoch: int = 0, position: int | None = None, **kw) -> dict:
    tag = "TensorDataset:96:8"
    rec = _state(f"p{k}", **kw)
    rec.update(kind="step", n=k, batch=[batch or f"x{k}"], out=[f"y{k}"],
               data=[[tag, epoch, k - 1 if position is None else position, [k]]])
    return rec


def _reference(n: int = 8, per_epoch: int = 4) -> Proc:
    steps = [_step(k, epoch=(k - 1) // per_epoch, position=(k - 1) % per_epoch) for k in range(1, n + 1)]
    for k, rec in enumerate(steps):  # the state a step starts from is the previous step's
        rec["before"]["extras"] = {"Sequential#0": f"ep{k}",
                                   "GradScaler#1": json.dumps({"_growth_tracker": str(k % 4), "scale": str(1024.0 * 2 ** (k // 4))})}
    return Proc("ref", None, 0, ROOT / "none.log", {"kind": "loaded", **_state("p0")}, steps)


def _chain(ref: Proc, c: int, loaded: dict, resumed: list[dict]) -> list[Proc]:
    kill = c + 1  # killed inside the step after its last checkpoint
    killed = Proc("p0", kill, -9, ROOT / "none.log", ref.loaded, [dict(s) for s in ref.steps[:kill]])
    return [killed, Proc("p1", None, 0, ROOT / "none.log", {"kind": "loaded", **loaded}, resumed)]


def _resumed_exactly(ref: Proc, c: int) -> tuple[dict, list[dict]]:
    loaded = {**ref.steps[c - 1], "before": ref.steps[c]["before"]}
    return loaded, [dict(s) for s in ref.steps[c:]]


def test_an_exact_resume_has_no_finding():
    ref = _reference()
    loaded, resumed = _resumed_exactly(ref, 2)
    assert compare_chain(ref, "mid", _chain(ref, 2, loaded, resumed), 8, 4)[0] is None


def _finding(ref: Proc, c: int, change_loaded=None, change_first=None):
    loaded, resumed = _resumed_exactly(ref, c)
    if change_loaded:
        loaded = change_loaded(loaded)
    if change_first:
        resumed[0] = change_first(resumed[0])
    return compare_chain(ref, "mid", _chain(ref, c, loaded, resumed), 8, 4)[0]


def _fp16(values: list[float]) -> list[float]:
    return [struct.unpack("<e", struct.pack("<e", v))[0] for v in values]


def test_weights_rounded_to_fp16_are_named_at_the_load():
    ref = _reference()
    for rec in ref.steps:
        rec["psample"] = [0.1 + 1e-4 * k + 1e-2 * rec["n"] for k in range(12)]
    f = _finding(ref, 2, lambda s: {**s, "params": "other", "psample": _fp16(ref.steps[1]["psample"])})
    assert (f.component, f.cause, f.when, f.step) == ("weights", "rounded_float16", "loaded", 3)
    assert rounded_to(_fp16([0.1 + 1e-4 * k for k in range(12)])) == "float16"
    assert rounded_to([0.1 + 1e-4 * k for k in range(12)]) is None


@pytest.mark.parametrize("change, component, cause", [
    (lambda s: {**s, "opt": "fresh", "opt_empty": True}, "optimizer", "optimizer_empty"),
    (lambda s: {**s, "before": {**s["before"], "extras": {**s["before"]["extras"], "Sequential#0": "fresh"}}}, "ema", "ema"),
    (lambda s: {**s, "before": {**s["before"], "buffers": "fresh"}}, "buffers", "buffers"),
    (lambda s: {**s, "before": {**s["before"], "extras": {**s["before"]["extras"], "GradScaler#1": _SCALER_FRESH}}},
     "grad_scaler", "grad_scaler"),
])
def test_state_the_checkpoint_did_not_restore_is_named_before_the_first_resumed_step(change, component, cause):
    f = _finding(_reference(), 2, change)
    assert (f.component, f.cause, f.when, f.step) == (component, cause, "loaded", 3)


def test_a_grad_scaler_not_restored_shows_the_fields_that_differ():
    ref = _reference()
    f = _finding(ref, 2, lambda s: {**s, "before": {**s["before"], "extras": {**s["before"]["extras"],
                                                                              "GradScaler#1": _SCALER_FRESH}}})
    assert f.evidence == {"scaler": "GradScaler#1", "differs": {"_growth_tracker": ["0", "2"]}, "resumed_from_step": 2}
    assert "_growth_tracker" in explain(f, "en")[1] and "scaler.state_dict()" in explain(f, "zh")[2]


def test_the_checkpoints_own_step_trained_again_is_the_step_counter():
    ref = _reference()
    f = _finding(ref, 2, change_first=lambda s: {**s, "batch": ref.steps[1]["batch"], "params": "x"})
    assert (f.component, f.cause, f.step) == ("step_counter", "step_repeated", 3)
    assert f.evidence["equals_reference_step"] == 2


def test_data_from_the_beginning_and_an_earlier_epochs_order_are_told_apart():
    ref = _reference()
    f = _finding(ref, 2, change_first=lambda s: {**s, "batch": ref.steps[0]["batch"], "params": "x"})
    assert (f.component, f.cause) == ("data", "restarted")  # mid-epoch: back to step 1
    f = _finding(ref, 4, change_first=lambda s: {**s, "batch": ref.steps[0]["batch"], "params": "x"})
    assert (f.component, f.cause, f.step) == ("data", "replayed_epoch", 5)  # epoch 1 opens with epoch 0's order
    f = _finding(ref, 4, change_first=lambda s: {**s, "batch": ["unseen"], "params": "x"})
    assert (f.component, f.cause) == ("data", "augmentation")  # the same sample indices, other content
    f = _finding(ref, 4, change_first=lambda s: {**s, "batch": ["unseen"], "params": "x",
                                                 "data": [[*s["data"][0][:3], [99]]]})
    assert (f.component, f.cause) == ("data", "order")
    assert f.evidence["once_per_epoch"] is None or f.evidence["once_per_epoch"]["epoch"] == 1


def _rng_at(rec: dict, state: str) -> dict:
    return {**rec, "before": {**rec["before"], "rng": {"torch": state}}}


def test_equal_batches_with_other_outputs_are_the_rng_and_an_evaluation_between_save_and_step_is_named():
    ref = _reference()
    f = _finding(ref, 2, change_first=lambda s: {**s, "out": ["other"], "params": "x"})
    assert (f.component, f.cause) == ("rng", "rng_not_restored")
    # after the save of step 4 the uninterrupted run evaluates: its plain loader draws from the saved state "s"
    ref.steps[4] = {**_rng_at(ref.steps[4], "s+1"), "draws": [["TensorDataset:32:16", "s"]]}
    f = _finding(ref, 4, change_first=lambda s: {**_rng_at(s, "s"), "out": ["other"], "params": "x", "draws": []})
    assert (f.component, f.cause, f.step) == ("rng", "drawn_between_save_and_resume", 5)
    assert f.evidence["loaders_in_between"] == ["TensorDataset:32:16"]
    # an evaluation before the save: the resumed process starts where the uninterrupted run's loader left it
    ref.steps[4] = {**_rng_at(ref.steps[4], "s"), "draws": [["TensorDataset:32:16", "e"]]}
    f = _finding(ref, 4, change_first=lambda s: {**_rng_at(s, "r"), "out": ["other"], "params": "x", "draws": []})
    assert (f.component, f.cause) == ("rng", "rng_not_restored")


def test_a_resumed_loader_that_draws_from_the_global_generator_once_more_is_named():
    ref = _reference()  # the training loader's iterator drew at the epoch's start, before the save of step 2
    ref.steps[2] = _rng_at(ref.steps[2], "s")
    train = "TensorDataset:96:8"
    f = _finding(ref, 2, change_first=lambda s: {**_rng_at(s, "s+1"), "out": ["other"], "params": "x",
                                                 "draws": [[train, "s"]]})
    assert (f.component, f.cause, f.step) == ("rng", "loader_drew_more", 3)
    assert (f.evidence["draws"], f.evidence["reference_draws"]) == ({train: 1}, {})
    # at an epoch end (torchdata's StatefulDataLoader loaded with a finished state): two iterators, two draws
    ref.steps[4] = {**_rng_at(ref.steps[4], "s+1"), "draws": [["TensorDataset:32:16", "e"], [train, "s"]]}
    f = _finding(ref, 4, change_first=lambda s: {**_rng_at(s, "s+2"), "out": ["other"], "params": "x",
                                                 "draws": [[train, "s"], [train, "s+1"]]})
    assert (f.cause, f.evidence["draws"], f.evidence["reference_draws"]) == ("loader_drew_more", {train: 2}, {train: 1})


def test_an_lr_back_at_its_start_is_the_scheduler():
    ref = _reference()
    for k, rec in enumerate(ref.steps):
        rec["lr"] = [1e-3 * (k + 1)]
    f = _finding(ref, 3, change_first=lambda s: {**s, "lr": ref.steps[0]["lr"], "params": "x"})
    assert (f.component, f.cause, f.step) == ("scheduler", "lr_restarted", 4)


def test_a_window_that_starts_inside_the_references_is_a_split_accumulation_window():
    ref = _reference()
    for rec in ref.steps:
        rec["batch"] = [f"{rec['n']}.{m}" for m in range(3)]
    f = _finding(ref, 2, change_first=lambda s: {**s, "batch": ["3.2", "4.0", "4.1"], "params": "x"})
    assert (f.component, f.cause, f.evidence["starts_at_micro_batch"]) == ("accumulation", "window_split", 3)


def test_every_cause_and_component_has_words_in_both_languages():
    assert all(len(words) == 4 and all(words) for words in CAUSES.values())
    ref = _reference()
    f = _finding(ref, 2, change_first=lambda s: {**s, "out": ["other"], "params": "x"})
    assert explain(f, "en")[0] == "step 3: RNG state" and "RNG" in headline(f, "en")
    assert set(COMPONENTS) >= {"weights", "data", "rng", "scheduler", "optimizer", "ema", "step_counter", "accumulation"}


def test_kill_points_follow_the_epochs():
    ref = _reference(n=36, per_epoch=12)
    plan, epoch, notes = kill_plan(ref, 36)
    assert epoch == 12 and plan == {"mid": [7], "epoch_end": [13], "twice": [5, 12]} and not notes


def test_records_written_by_the_script_are_parsed_leniently():
    loaded, steps = parse_records('garbage\n[1, 2]\n{"kind": "loaded", "params": "a"}\n{"kind": "step", "n": 1}\n{"kind"')
    assert loaded == {"kind": "loaded", "params": "a"} and steps == [{"kind": "step", "n": 1}]


# ------------------------------------------------------------------ end to end (real runs of the zoo)

_SCRIPT = """import atexit, random, sys, time
atexit.register(lambda: print("atexit ran"))
print("argv", sys.argv[1:], random.random(), flush=True)
if sys.argv[1:] == ["sleep"]:
    time.sleep(60)
sys.exit(7)
"""


@pytest.mark.slow
def test_the_fork_server_runs_a_script_as_a_fresh_interpreter_would(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(_SCRIPT, encoding="utf-8")
    server = ForkServer([sys.executable], environ(1), tmp_path / "forks.log")
    try:
        assert server.usable(300), (tmp_path / "forks.log").read_text()
        args = [["--record", str(tmp_path / f"p{i}.jsonl"), "--", str(script), arg] for i, arg in enumerate(["x", "x", "sleep"])]
        codes = [server.run(a, tmp_path / f"p{i}.log", 5 if i == 2 else 60) for i, a in enumerate(args)]
    finally:
        server.close()
    logs = [(tmp_path / f"p{i}.log").read_text() for i in range(3)]
    assert codes == [7, 7, None], (codes, logs)  # the script's exit status; None: past its timeout, killed
    assert all("argv ['x']" in t and "atexit ran" in t for t in logs[:2]), logs
    assert logs[0].split()[2] != logs[1].split()[2], logs  # Python's generator seeded anew in each child, as at start-up

def _doctor(tmp_path, script: str, *extra: str) -> tuple[int, dict]:
    """One chain (three processes) of the doctor's command line; every chain, every bug: bench/resume_doctor.py."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = subprocess.run([sys.executable, "-m", "course_utils.resume_doctor", "--steps", "36", "--workdir", str(tmp_path),
                          "--chains", "epoch_end", *extra, "--", sys.executable, str(ZOO / script), "--out", "{out}",
                          "[--resume]"], capture_output=True, text=True, cwd=ROOT, timeout=900)
    return out.returncode, json.loads((tmp_path / "report.json").read_text())


@pytest.mark.slow
def test_the_correct_zoo_run_resumes_exactly(tmp_path):
    code, report = _doctor(tmp_path, "correct.py")
    assert code == 0 and report["verdict"] == "exact", report
    chain = report["chains"]["epoch_end"]
    assert chain["kills"] == [13] and chain["resumes"] == [{"killed_after": 13, "resumed_after": 12, "exact_load": True}]


@pytest.mark.slow
def test_a_missing_grad_scaler_is_found_right_after_loading(tmp_path):
    code, report = _doctor(tmp_path, "no_grad_scaler.py")
    first = report["first"]
    assert code == 1 and (first["component"], first["step"], first["when"]) == ("grad_scaler", 13, "loaded"), report
    # [resumed, uninterrupted]: after 12 steps the scale has doubled 3 times and the growth tracker is back at 0
    assert first["evidence"]["differs"] == {"scale": ["1024.0", "8192.0"]}, first


@pytest.mark.slow
def test_a_stateful_dataloader_resumes_exactly_with_its_own_generators_not_with_the_global_one(tmp_path):
    pytest.importorskip("torchdata")
    code, report = _doctor(tmp_path / "control", "stateful_loader.py")
    assert code == 0 and report["chains"]["epoch_end"]["resumes"][0]["resumed_after"] == 12, report
    code, report = _doctor(tmp_path / "global", "torchdata_global.py")
    first = report["first"]
    assert code == 1 and (first["component"], first["cause"], first["step"]) == ("rng", "loader_drew_more", 13), report
    assert first["evidence"]["draws"] == {"TensorDataset:96:8": 2}, first  # the loaded finished iterator, then the next


@pytest.mark.slow
def test_a_missing_ema_is_found_right_after_loading_with_its_report(tmp_path):
    code, report = _doctor(tmp_path, "no_ema.py", "--lang", "en", "--fresh")  # every process a fresh interpreter
    first = report["first"]
    assert code == 1 and (first["component"], first["step"], first["when"]) == ("ema", 13, "loaded"), report
    assert set(first) >= {"chain", "cause", "evidence", "what", "meaning", "fix"} and "EMA" in first["meaning"]


@pytest.mark.slow
def test_a_script_that_fails_by_itself_exits_2(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("import sys\nsys.exit(3)\n", encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "course_utils.resume_doctor", "--steps", "5", "--workdir",
                          str(tmp_path / "w"), "--", sys.executable, str(script), "{out}"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 2 and "退出码 3" in out.stdout, out
