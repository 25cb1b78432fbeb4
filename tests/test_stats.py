"""course_utils.stats: the t quantiles against published tables, and the paired verdicts."""
from __future__ import annotations

import math

import pytest

from course_utils.stats import PairedResult, paired_comparison, t_cdf, t_quantile

# Student t quantiles from the standard tables (NIST/SEMATECH e-Handbook, table 1.3.6.7.2)
KNOWN = [(1, 0.975, 12.706), (2, 0.975, 4.303), (3, 0.975, 3.182), (4, 0.975, 2.776), (5, 0.975, 2.571),
         (9, 0.975, 2.262), (10, 0.975, 2.228), (30, 0.975, 2.042), (100, 0.975, 1.984),
         (4, 0.95, 2.132), (4, 0.995, 4.604), (10, 0.90, 1.372)]


@pytest.mark.parametrize("df,p,want", KNOWN)
def test_t_quantile_matches_the_table(df, p, want):
    assert t_quantile(p, df) == pytest.approx(want, abs=1.5e-3)
    assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-9)


def test_t_quantile_is_symmetric_and_tends_to_the_normal():
    assert t_quantile(0.025, 4) == pytest.approx(-t_quantile(0.975, 4))
    assert t_quantile(0.5, 7) == pytest.approx(0.0, abs=1e-9)
    assert t_quantile(0.975, 10_000) == pytest.approx(1.960, abs=1e-3)
    assert t_cdf(1.0, 1) == pytest.approx(0.75)          # Cauchy: arctan(1)/pi + 1/2


def test_two_standard_errors_are_not_95_percent_at_four_or_five_seeds():
    """The docstring's reason for t: mean ± 2 SE covers about 88 % (n = 5) and 86 % (n = 4)."""
    assert 2 * t_cdf(2.0, 4) - 1 == pytest.approx(0.88, abs=0.005)
    assert 2 * t_cdf(2.0, 3) - 1 == pytest.approx(0.86, abs=0.005)


def test_interval_by_hand():
    a, b = [0.61, 0.64, 0.60, 0.66], [0.60, 0.62, 0.60, 0.63]
    d = [x - y for x, y in zip(a, b)]
    mean = sum(d) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 3)
    half = 3.18244631 * sd / 2
    r = paired_comparison(a, b)
    assert isinstance(r, PairedResult)
    assert (r.n, r.verdict) == (4, "tie")                   # 0.0 is one of the differences: low < 0
    assert r.mean_diff == pytest.approx(mean)
    assert (r.low, r.high) == (pytest.approx(mean - half), pytest.approx(mean + half))


def test_pairing_finds_a_consistent_gain_that_the_ranges_hide():
    # seeds differ a lot, A wins by about 0.01 on every seed: the ranges overlap, the paired interval does not
    b = [0.50, 0.58, 0.53, 0.61, 0.55]
    a = [x + 0.01 + e for x, e in zip(b, [0.001, -0.002, 0.0, 0.002, -0.001])]
    assert min(a) < max(b)
    assert paired_comparison(a, b).verdict == "a>b"
    assert paired_comparison(b, a).verdict == "a<b"
    r = paired_comparison(a, b)
    assert "A 更好" in r.text() and "[+0.0" in r.text()


def test_tie_when_the_interval_contains_zero():
    r = paired_comparison([1.0, 2.0, 3.0], [1.5, 1.5, 3.5])
    assert r.verdict == "tie" and r.low < 0 < r.high
    assert "分不出" in r.text("x", "y")
    assert paired_comparison([1.0, 1.0], [1.0, 1.0]).verdict == "tie"


def test_wider_confidence_gives_a_wider_interval():
    a, b = [3.0, 2.5, 2.9, 3.4, 2.8], [2.0, 2.4, 2.1, 2.3, 2.6]
    r90, r99 = paired_comparison(a, b, 0.90), paired_comparison(a, b, 0.99)
    assert r99.low < r90.low < r90.mean_diff < r90.high < r99.high


@pytest.mark.parametrize("a,b", [([1.0], [2.0]), ([1.0, 2.0], [1.0]), ([1.0, float("nan")], [1.0, 2.0])])
def test_refuses_unpaired_or_too_few_values(a, b):
    with pytest.raises(ValueError):
        paired_comparison(a, b)
