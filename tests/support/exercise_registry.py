"""One record per exercise of the workbook, for the contract tests of tests/test_exercise_contracts.py.

A record names the notebook, the function its tagged exercise cell defines, the check, how the check
is called with a learner's namespace, the typical wrong answers (tables in tests/support/wrong_answers/, each
answer commented with its mistake) and what the sweep and the stub test expect. The notebook's own
test file keeps only what is special to it (accepted variants, targeted hints, designed cases, text).

To add an exercise: put its wrong answers in tests/support/wrong_answers/nbNN.py and append an ``Exercise``
to ``EXERCISES`` below; its contract tests (solution, stub, hint, wrong answers, demo cells, sweep)
are then collected with ids ``<notebook stem>:<function>``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import pytest

from course_tools.checks import nb01_amp, nb02_accumulation, nb02_grad_clipping, nb03_ema
from course_tools.checks import nb04_checkpoint_resume, nb05_reproducibility, nb06_monitoring
from course_tools.checks import nb07_single_batch_overfit as nb07_checks
from course_tools.checks import nb08_time_estimate, nb08b_flops_memory, nb09_self_test, nb11_multi_process
from course_tools.checks import nb12_loss_spikes, nb13_resume_doctor
from tests.support.notebook_cells import exercise_pairs, run_source
from tests.support.sweep import SWEEP_SEEDS
from tests.support.wrong_answers import nb01, nb02_accumulation as w02a, nb02_grad_clipping as w02c, nb03, nb04, nb05
from tests.support.wrong_answers import nb06, nb07, nb07_batch_mixing as w07b, nb08, nb08b, nb09, nb11, nb12
from tests.support.wrong_answers import nb13_resume_doctor as w13

Namespace = dict
# a wrong answer: (make the learner's namespace from the solution's source, a fragment the message must contain)
Wrong = tuple[Callable[[str], Namespace], "str | None"]


def call_one(function: str) -> Callable[..., Any]:
    """``check(namespace[function], **kwargs)``: the usual way a check is called."""
    return lambda check, ns, **kwargs: check(ns[function], **kwargs)


@dataclass(frozen=True)
class Exercise:
    notebook: str                         # file name under solutions/ and notebooks/
    function: str                         # the function the tagged exercise cell defines
    check: Callable[..., Any]
    index: int                            # which tagged exercise cell of the notebook (exercise_pairs)
    wrong: Mapping[str, Wrong] = field(default_factory=dict)
    call: Callable[..., Any] | None = None    # call(check, namespace, **kwargs); None: call_one(function)
    stub_message: str = "练习尚未完成"     # what the check's failure on the released stub says
    stub_raises: Callable[[Namespace], Any] | None = None  # calls the stub's function(s): NotImplementedError
    hint_count: int | None = None         # how many raise NotImplementedError(...) hints the stub has
    hint_min_chars: int = 8               # answer_lines_in's min_chars (0: short lines count too)
    regex: bool = False                   # fragments are regular expressions (pytest.raises(match=...))
    twice: tuple[str, ...] = ()           # wrong answers that must fail twice with the same message
    expect_prefix: bool = False           # every wrong answer's message starts with 期望 (sweep.fails_naming)
    solution_starts: bool = False         # the solution's output starts with ✅ (not only contains it)
    sweep_seeds: range | None = None      # the slow sweep's seeds; None: not swept
    sweep_threads: bool = False           # the sweep runs under the workbook_threads fixture
    sweep_fragments: bool = False         # the sweep also checks the 期望 prefix and each fragment
    slow: bool = False                    # its check starts training processes: its tests are marked slow

    @property
    def marks(self) -> tuple:
        return (pytest.mark.slow,) if self.slow else ()

    @property
    def id(self) -> str:
        return f"{self.notebook.removesuffix('.ipynb')}:{self.function}"

    def run(self, ns: Namespace, **kwargs: Any) -> Any:
        return (self.call or call_one(self.function))(self.check, ns, **kwargs)

    def pair(self) -> tuple[str, str]:
        """(solution source, released stub source) of the exercise; both define its function."""
        solution, stub = exercise_pairs(self.notebook)[self.index]
        for source in (solution, stub):
            assert f"def {self.function}(" in source, (self.id, source[:200])
        return solution, stub

    def assert_names(self, fragment: str | None, message: str) -> None:
        """A wrong answer's failure ``message`` starts with 期望 (where the record asks) and holds ``fragment``."""
        if self.expect_prefix:
            assert message.startswith("期望"), message
        if fragment:
            found = re.search(fragment, message) if self.regex else fragment in message
            assert found, (fragment, message)


def sources(table: Mapping[str, tuple[str, str | None]], template: str = "{body}") -> dict[str, Wrong]:
    """``name -> (source, fragment)``, each source put into ``template``'s ``{body}``, as wrong answers."""
    return {name: (lambda _, s=template.format(body=src): run_source(s), frag) for name, (src, frag) in table.items()}


def plain(table: Mapping[str, str]) -> dict[str, Wrong]:
    """``name -> source`` (no fragment) as wrong answers."""
    return {name: (lambda _, s=src: run_source(s), None) for name, src in table.items()}


def functions(table: Mapping[str, tuple[Callable[..., Any], str | None]], function: str) -> dict[str, Wrong]:
    """``name -> (function, fragment)`` as wrong answers."""
    return {name: (lambda _, f=fn: {function: f}, frag) for name, (fn, frag) in table.items()}


def _self_test_answers(solution: str, qid: str, wrong: Any) -> Namespace:
    answers = dict(run_source(solution)["self_test_answers"](), **{qid: wrong})
    return {"self_test_answers": lambda: answers}


def _raises(*calls: Callable[[Namespace], Any]) -> Callable[[Namespace], None]:
    """Call each ``calls(namespace)`` expecting NotImplementedError (the test asserts it per call)."""
    def run(ns: Namespace) -> None:
        for c in calls:
            with pytest.raises(NotImplementedError):
                c(ns)
    return run


def _linear(ns: Namespace) -> Any:
    import torch
    return ns["overfit_one_batch"](torch.nn.Linear(2, 2), torch.zeros(1, 2), torch.zeros(1, dtype=torch.long))


EXERCISES: tuple[Exercise, ...] = (
    Exercise("01_amp.ipynb", "amp_train_step", nb01_amp.check_amp_train_step, 0, sources(nb01.WRONG_STEPS),
             sweep_seeds=SWEEP_SEEDS, sweep_threads=True),
    # check_needs_scaler takes no random input: not swept
    Exercise("01_amp.ipynb", "needs_scaler", nb01_amp.check_needs_scaler, 1, sources(nb01.WRONG_NEEDS_SCALER)),
    Exercise("02_grad_clipping.ipynb", "my_clip_grad_norm_", nb02_grad_clipping.check_global_clip, 0,
             sources(w02c.WRONG_CLIPS), sweep_seeds=SWEEP_SEEDS, sweep_threads=True),
    Exercise("02_grad_clipping.ipynb", "clipping_is_effective", nb02_grad_clipping.check_clip_audit, 1,
             sources(w02c.WRONG_AUDITS), sweep_seeds=SWEEP_SEEDS, sweep_threads=True),
    # each wrong answer is the solution with its edits
    Exercise("02_grad_clipping.ipynb", "accumulated_step", nb02_accumulation.check_accumulated_step, 2,
             {name: (lambda solution, e=edits: run_source(w02a.mutant(solution, *e)), frag)
              for name, (edits, frag) in w02a.WRONG.items()},
             twice=tuple(w02a.WRONG), sweep_seeds=SWEEP_SEEDS, sweep_threads=True),
    Exercise("03_ema.ipynb", "ema_update_", nb03_ema.check_ema_update, 0, sources(nb03.WRONG),
             sweep_seeds=SWEEP_SEEDS, sweep_threads=True),
    Exercise("04_checkpoint_resume.ipynb", "load_checkpoint", nb04_checkpoint_resume.check_resume_equivalence, 0,
             sources(nb04.WRONG), call=lambda check, ns, **kw: check(ns["save_checkpoint"], ns["load_checkpoint"], **kw),
             stub_raises=_raises(lambda ns: ns["save_checkpoint"](None, None, None, None, 0, 0),
                                 lambda ns: ns["load_checkpoint"](None, None, None, None)),
             hint_count=2, regex=True, twice=("torch RNG only",), sweep_seeds=range(1, 51)),
    Exercise("05_reproducibility.ipynb", "set_seed", nb05_reproducibility.check_set_seed, 0, sources(nb05.WRONG),
             stub_raises=_raises(lambda ns: ns["set_seed"](0)), hint_count=1, hint_min_chars=0, regex=True,
             twice=("missing numpy",), sweep_seeds=range(1, 51)),
    Exercise("06_monitoring.ipynb", "find_spikes", nb06_monitoring.check_find_spikes, 0, plain(nb06.WRONG),
             stub_raises=_raises(lambda ns: ns["find_spikes"]([1.0, 2.0])), hint_count=1,
             twice=("local mean and std",), sweep_seeds=range(1, 51)),
    Exercise("07_single_batch_overfit.ipynb", "overfit_one_batch", nb07_checks.check_overfit_one_batch, 0,
             sources(nb07.WRONG_OVERFIT, nb07._LOOP), stub_raises=_raises(_linear),
             regex=True, sweep_seeds=range(1, 51)),
    Exercise("07_single_batch_overfit.ipynb", "diagnose", nb07_checks.check_diagnose, 1,
             sources({n: (b, "诊断为|之一") for n, b in nb07.WRONG_DIAGNOSE.items()}, nb07._DIAGNOSE),
             stub_raises=_raises(lambda ns: ns["diagnose"]([1.0], [1.0])), regex=True,
             twice=("final-loss thresholds",), sweep_seeds=range(1, 51)),
    Exercise("07_single_batch_overfit.ipynb", "batch_mixing", nb07_checks.check_batch_mixing, 2,
             sources(w07b.WRONG, w07b._SOURCE), twice=tuple(w07b.WRONG),
             sweep_seeds=SWEEP_SEEDS),
    Exercise("08_time_estimate.ipynb", "estimate_hours", nb08_time_estimate.check_estimate_hours, 0,
             functions(nb08.WRONG_ANSWERS, "estimate_hours"),
             stub_raises=_raises(lambda ns: ns["estimate_hours"](10_000, 3, 4, 0.5)), hint_count=1, hint_min_chars=0,
             expect_prefix=True, sweep_seeds=range(1, 51), sweep_fragments=True),
    Exercise("08_time_estimate.ipynb", "checkpoint_plan", nb08_time_estimate.check_checkpoint_plan, 1,
             functions(nb08.WRONG_PLANS, "checkpoint_plan"),
             stub_raises=_raises(lambda ns: ns["checkpoint_plan"](4.2, 2.4, 120, 10, 120)), hint_count=1,
             hint_min_chars=0, expect_prefix=True, sweep_seeds=range(1, 51), sweep_fragments=True),
    Exercise("08b_flops_memory.ipynb", "step_flops", nb08b_flops_memory.check_step_flops, 0,
             functions(nb08b.FLOP_WRONG_ANSWERS, "step_flops"), hint_count=1, hint_min_chars=0,
             expect_prefix=True, sweep_seeds=range(1, 51), sweep_fragments=True),
    Exercise("08b_flops_memory.ipynb", "peak_memory_bytes", nb08b_flops_memory.check_peak_memory, 1,
             functions(nb08b.MEMORY_WRONG_ANSWERS, "peak_memory_bytes"), hint_count=1, hint_min_chars=0,
             expect_prefix=True, sweep_seeds=SWEEP_SEEDS, sweep_fragments=True),
    # a wrong answer is the solution's dict with one distractor; its id is question=answer
    Exercise("09_self_test.ipynb", "self_test_answers", nb09_self_test.check_self_test_answers, 0,
             {f"{q}={a}": (lambda solution, q=q, a=a: _self_test_answers(solution, q, a), f"答错 {q}")
              for q, a in nb09.WRONG_ANSWERS},
             regex=True, solution_starts=True),
    Exercise("09_self_test.ipynb", "ema_start_weight", nb09_self_test.check_ema_start_weight, 1,
             functions(nb09.WRONG_EMA, "ema_start_weight"), solution_starts=True, sweep_seeds=range(1, 51)),
    Exercise("11_multi_process.ipynb", "rank_batch", nb11_multi_process.check_rank_batch, 0,
             sources(nb11.WRONG_SHARE), hint_count=1, sweep_seeds=SWEEP_SEEDS, sweep_threads=True),
    Exercise("11_multi_process.ipynb", "strip_module_prefix", nb11_multi_process.check_strip_module_prefix, 1,
             sources(nb11.WRONG_PREFIX), hint_count=1, sweep_seeds=SWEEP_SEEDS, sweep_threads=True),
    Exercise("12_loss_spikes.ipynb", "diagnose_spike", nb12_loss_spikes.check_diagnose, 0, plain(nb12.WRONG),
             stub_raises=_raises(lambda ns: ns["diagnose_spike"]([])), hint_count=1,
             twice=("smoothed loss only",), sweep_seeds=SWEEP_SEEDS),
    # each check runs the resume doctor (about eight training processes, as long as a notebook): the sweep takes
    # one other seed, not 50 (50 x 6 doctor runs would take hours). Its verdicts are exact comparisons, so a seed cannot
    # hide a defect: fp16 rounding changes random weights, a restarted epoch replays other samples (a permutation
    # without repeats), the warm-up's lr differs at another step, a reseeded generator draws other masks.
    Exercise("13_resume_doctor.ipynb", "save_checkpoint", nb13_resume_doctor.check_capstone, 0,
             {name: (lambda solution, d=defects: run_source(w13.mutant(solution, d)), frag)
              for name, (defects, frag) in w13.WRONG.items()},
             call=lambda check, ns, **kw: check(ns["save_checkpoint"], ns["load_checkpoint"], **kw),
             stub_raises=_raises(lambda ns: ns["save_checkpoint"](None, None, None, None, None, 0),
                                 lambda ns: ns["load_checkpoint"](None, None, None, None, None)),
             hint_count=2, sweep_seeds=range(7, 8), slow=True),
)

NOTEBOOKS: tuple[str, ...] = tuple(dict.fromkeys(e.notebook for e in EXERCISES))

# notebooks whose demo cells never use what an exercise defines (tests/support/exercise_isolation.py); in the others a
# later demo calls the learner's function on purpose (05's set_seed, 06's find_spikes, ...)
DEMO_ISOLATED: tuple[str, ...] = ("01_amp.ipynb", "02_grad_clipping.ipynb", "03_ema.ipynb", "11_multi_process.ipynb")
