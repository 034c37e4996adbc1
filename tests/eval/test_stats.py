import numpy as np
import pytest

from ragrl.errors import RagrlError
from ragrl.eval.stats import bootstrap_ci, paired_bootstrap_diff, paired_diffs, per_question_scores, summarize
from ragrl.rollout.trajectory import Trajectory


def make_traj(sid, em, f1, cover, *, searches=0, turns=1, fmt=0, answer="x", gen_tokens=None, action_tokens=3):
    metrics = {"em": em, "f1": f1, "cover_em": cover}
    if gen_tokens is not None:
        metrics["gen_tokens"] = gen_tokens
    return Trajectory(sample_id=sid, question=f"q {sid}", golds=["g"], token_ids=[1] * (2 + action_tokens),
                      action_mask=[0, 0] + [1] * action_tokens, logprobs=[0.0] * (2 + action_tokens),
                      prompt_len=2, answer=answer, num_searches=searches, num_turns=turns,
                      format_errors=fmt, metrics=metrics)


def test_bootstrap_ci_contains_mean_and_is_deterministic():
    values = np.random.default_rng(3).binomial(1, 0.4, size=200).astype(float)
    mean, lo, hi = bootstrap_ci(values, seed=7)
    assert mean == pytest.approx(values.mean())
    assert lo < mean < hi
    assert bootstrap_ci(values, seed=7) == (mean, lo, hi)
    assert bootstrap_ci(values, seed=8) != (mean, lo, hi)


def test_bootstrap_ci_narrower_for_larger_n():
    rng = np.random.default_rng(0)
    _, lo_s, hi_s = bootstrap_ci(rng.binomial(1, 0.5, size=50))
    _, lo_l, hi_l = bootstrap_ci(rng.binomial(1, 0.5, size=2000))
    assert (hi_l - lo_l) < 0.5 * (hi_s - lo_s)


def test_bootstrap_ci_matches_binomial_width():
    # For a 0/1 vector the bootstrap CI half-width is close to 1.96 * sqrt(p(1-p)/n).
    values = [1.0] * 300 + [0.0] * 700
    mean, lo, hi = bootstrap_ci(values, n_boot=4000)
    half = 1.96 * np.sqrt(0.3 * 0.7 / 1000)
    assert mean == 0.3
    assert (hi - lo) / 2 == pytest.approx(half, rel=0.1)


def test_bootstrap_ci_constant_vector_is_a_point():
    assert bootstrap_ci([0.25] * 17) == (0.25, 0.25, 0.25)
    assert bootstrap_ci([1.0]) == (1.0, 1.0, 1.0)


def test_bootstrap_rejects_bad_input():
    with pytest.raises(RagrlError, match="non-empty"):
        bootstrap_ci([])
    with pytest.raises(RagrlError, match="NaN"):
        bootstrap_ci([0.1, float("nan")])
    with pytest.raises(RagrlError, match="same questions"):
        paired_bootstrap_diff([1, 0], [1])


def test_paired_diff_sign_and_p_value():
    rng = np.random.default_rng(1)
    a = rng.binomial(1, 0.3, size=300).astype(float)
    b = np.maximum(a, rng.binomial(1, 0.3, size=300))  # B fixes some of A's misses, never breaks one
    d, lo, hi, p = paired_bootstrap_diff(a, b)
    assert d == pytest.approx(b.mean() - a.mean()) and d > 0
    assert 0 < lo <= d <= hi
    assert p < 0.01
    d2, lo2, hi2, p2 = paired_bootstrap_diff(b, a)  # swapped: worse
    assert d2 == pytest.approx(-d) and hi2 < 0 and p2 > 0.99
    assert paired_bootstrap_diff(a, a) == (0.0, 0.0, 0.0, 1.0)


def test_summary_hand_computed():
    trajs = [
        make_traj("a", 1.0, 1.0, 1.0, searches=2, turns=3, gen_tokens=10),
        make_traj("b", 0.0, 0.5, 1.0, searches=1, turns=2, fmt=1, gen_tokens=20),
        make_traj("c", 0.0, 0.0, 0.0, searches=0, turns=1, answer=None, action_tokens=6),  # no gen_tokens
        make_traj("d", 1.0, 0.5, 1.0, searches=1, turns=2, fmt=2, answer="  ", gen_tokens=30),
    ]
    s = summarize(trajs, wall_time_s=12.5)
    assert s["n"] == 4
    assert s["em"]["mean"] == 50.0
    assert s["f1"]["mean"] == 50.0
    assert s["cover_em"]["mean"] == 75.0
    for k in ("em", "f1", "cover_em"):
        assert 0.0 <= s[k]["ci_lo"] <= s[k]["mean"] <= s[k]["ci_hi"] <= 100.0
    assert s["searches_per_q"] == 1.0
    assert s["retrieval_rate"] == 0.75   # c never searched
    assert s["turns_per_q"] == 2.0
    assert s["tokens_per_q"] == (10 + 20 + 6 + 30) / 4
    assert s["format_error_rate"] == 0.5
    assert s["answer_rate"] == 0.5  # None and whitespace-only do not count as answers
    assert s["wall_time_s"] == 12.5
    assert "per_question" not in s
    assert summarize(trajs, 0.0, per_question=True)["per_question"]["b"] == {"em": 0.0, "f1": 0.5, "cover_em": 1.0}


def test_summary_requires_scored_trajectories():
    t = make_traj("a", 1.0, 1.0, 1.0)
    del t.metrics["cover_em"]
    with pytest.raises(RagrlError, match="'a' has no metric 'cover_em'"):
        summarize([t], 1.0)
    with pytest.raises(RagrlError, match="outside"):
        summarize([make_traj("b", 2.0, 1.0, 1.0)], 1.0)
    with pytest.raises(RagrlError, match="no trajectories"):
        summarize([], 1.0)


def test_per_question_averages_samples_and_pairs_by_id():
    base = per_question_scores([make_traj("q1", 0.0, 0.0, 0.0), make_traj("q2", 1.0, 1.0, 1.0)])
    other = per_question_scores([make_traj("q2", 1.0, 1.0, 1.0), make_traj("q1", 1.0, 1.0, 1.0),
                                 make_traj("q1", 0.0, 0.5, 1.0), make_traj("q3", 1.0, 1.0, 1.0)])
    assert other["q1"] == {"em": 0.5, "f1": 0.75, "cover_em": 1.0}
    d = paired_diffs(base, other)
    assert d["n_paired"] == 2  # q3 has no partner
    assert d["em"]["diff"] == pytest.approx(25.0)
    assert paired_diffs(base, {"zz": {"em": 1, "f1": 1, "cover_em": 1}}) is None
