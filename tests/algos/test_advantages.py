"""Advantage estimators and masked statistics against hand-computed cases."""
import math

import pytest
import torch

from ragrl.algos import ADVANTAGE_ESTIMATORS, compute_advantages
from ragrl.algos.advantages import enumerated, gae, grpo, place_outcome_reward, reinforce_pp, rloo
from ragrl.algos.masked import AlgoInputError, masked_mean, masked_sum, masked_var, masked_whiten
from ragrl.errors import ConfigError

NAN = float("nan")


def t(x, dtype=torch.float64):
    return torch.tensor(x, dtype=dtype)


def test_masked_statistics_ignore_garbage_off_the_mask():
    x = t([[1.0, 2.0, 3.0], [4.0, 100.0, NAN]])
    mask = t([[1, 1, 0], [1, 0, 0]], torch.bool)
    # kept values 1, 2, 4: sum 7, mean 7/3
    assert masked_sum(x, mask).item() == 7.0
    assert masked_mean(x, mask).item() == pytest.approx(7 / 3)
    # per row: (1+2)/2 = 1.5 and 4/1 = 4
    assert masked_mean(x, mask, dim=-1).tolist() == [1.5, 4.0]
    # deviations -4/3, -1/3, 5/3 → squares 16/9 + 1/9 + 25/9 = 42/9;
    # biased var 42/27 = 14/9, unbiased 42/18 = 7/3
    assert masked_var(x, mask, unbiased=False).item() == pytest.approx(14 / 9)
    assert masked_var(x, mask).item() == pytest.approx(7 / 3)
    # whitened: (x - 7/3) / sqrt(7/3), 0 off the mask (the nan is gone)
    w = masked_whiten(x, mask)
    s = math.sqrt(7 / 3)
    torch.testing.assert_close(w, t([[(1 - 7 / 3) / s, (2 - 7 / 3) / s, 0], [(4 - 7 / 3) / s, 0, 0]]))
    w_keep = masked_whiten(x, mask, shift_mean=False)
    assert w_keep[0, 0].item() == pytest.approx((1 - 7 / 3) / s + 7 / 3)
    # an empty mask has mean 0, not nan
    assert masked_mean(x, torch.zeros_like(mask)).item() == 0.0


def test_place_outcome_reward_puts_score_on_last_action_token():
    mask = t([[1, 1, 0, 0], [0, 1, 0, 1], [0, 0, 0, 0]], torch.long)
    out = place_outcome_reward(t([2.0, 5.0, 7.0]), mask)
    # row 0 ends its actions at index 1, row 1 at index 3, row 2 has none → no reward anywhere
    assert out.tolist() == [[0, 2, 0, 0], [0, 0, 0, 5], [0, 0, 0, 0]]
    with pytest.raises(AlgoInputError, match="scores"):
        place_outcome_reward(t([1.0, 2.0]), mask)


# gamma = 0.9, lam = 0.8, values V = [0.5, 0.2, 0.4], reward 1 on the last action:
#   t2: delta = 1 + 0 - 0.4 = 0.6                 A2 = 0.6
#   t1: delta = 0 + 0.9*0.4 - 0.2 = 0.16          A1 = 0.16 + 0.72*0.6 = 0.592
#   t0: delta = 0 + 0.9*0.2 - 0.5 = -0.32         A0 = -0.32 + 0.72*0.592 = 0.10624
#   returns = A + V = [0.60624, 0.792, 1.0]
GAE_ADV = [0.10624, 0.592, 0.6]
GAE_RET = [0.60624, 0.792, 1.0]


def test_gae_hand_computed():
    adv, ret = gae(t([[0.0, 0.0, 1.0]]), t([[0.5, 0.2, 0.4]]), t([[1, 1, 1]]), gamma=0.9, lam=0.8, whiten=False)
    assert adv[0].tolist() == pytest.approx(GAE_ADV)
    assert ret[0].tolist() == pytest.approx(GAE_RET)


def test_gae_with_group_baseline_hand_computed():
    # Two samples of one prompt (outcomes 1 and 0: group mean 0.5) and one prompt sampled once.
    # Centred rewards: +0.5, -0.5, 0. gamma = lam = 1, two action tokens each, V = (0.1, 0.3):
    # A_1 = r - V_1 = r - 0.3, A_0 = r - V_0 = r - 0.1; returns = A + V = r on both tokens.
    rewards = t([[0.0, 1.0], [0.0, 0.0], [0.0, 2.0]])
    values = t([[0.1, 0.3]] * 3)
    mask = t([[1, 1]] * 3, torch.bool)
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0, whiten=False, group_ids=[4, 4, 9])
    torch.testing.assert_close(adv, t([[0.4, 0.2], [-0.6, -0.8], [-0.1, -0.3]]))
    torch.testing.assert_close(ret, t([[0.5, 0.5], [-0.5, -0.5], [0.0, 0.0]]))
    # Without groups the same call is plain GAE on the raw rewards.
    _, ret_plain = gae(rewards, values, mask, gamma=1.0, lam=1.0, whiten=False)
    assert ret_plain[:, 0].tolist() == pytest.approx([1.0, 0.0, 2.0])


def test_gae_skips_observation_tokens():
    # The same three actions at positions 0, 3, 5 with observation tokens between them whose
    # values are garbage: the recursion must jump over them, giving the numbers above.
    mask = t([[1, 0, 0, 1, 0, 1, 0]], torch.bool)
    values = t([[0.5, 9.0, -7.0, 0.2, 100.0, 0.4, NAN]])
    rewards = t([[0.0, 0, 0, 0.0, 0, 1.0, 0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8, whiten=False)
    assert adv[0, [0, 3, 5]].tolist() == pytest.approx(GAE_ADV)
    assert ret[0, [0, 3, 5]].tolist() == pytest.approx(GAE_RET)
    assert adv[0, [1, 2, 4, 6]].tolist() == [0, 0, 0, 0]
    assert ret[0, [1, 2, 4, 6]].tolist() == [0, 0, 0, 0]


def test_gae_with_gaps_equals_gae_on_compacted_action_sequence():
    g = torch.Generator().manual_seed(0)
    B, T = 5, 16
    mask = torch.rand(B, T, generator=g) < 0.5
    mask[:, 0] = False                         # prompt token
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    rewards = torch.where(mask, torch.randn(B, T, generator=g, dtype=torch.float64), torch.zeros(()))
    adv, ret = gae(rewards, values, mask, gamma=0.95, lam=0.9, whiten=False)
    for b in range(B):
        keep = mask[b]
        a_c, r_c = gae(rewards[b, keep][None], values[b, keep][None], torch.ones(1, int(keep.sum()), dtype=torch.bool),
                       gamma=0.95, lam=0.9, whiten=False)
        torch.testing.assert_close(adv[b, keep], a_c[0])
        torch.testing.assert_close(ret[b, keep], r_c[0])
    # whitening is over all action tokens of the batch: mean 0, unbiased std 1
    w, _ = gae(rewards, values, mask, gamma=0.95, lam=0.9)
    assert masked_mean(w, mask).item() == pytest.approx(0.0, abs=1e-9)
    assert masked_var(w, mask).item() == pytest.approx(1.0, rel=1e-6)


def test_gae_rejects_rewards_on_observation_tokens():
    with pytest.raises(AlgoInputError, match="outside the action mask"):
        gae(t([[0.0, 1.0]]), t([[0.0, 0.0]]), t([[1, 0]], torch.bool))
    with pytest.raises(AlgoInputError, match="values has shape"):
        gae(t([[0.0, 1.0]]), t([[0.0]]), t([[1, 1]], torch.bool))


def test_grpo_hand_computed_and_dr_grpo():
    scores = t([1.0, 0.0, 1.0, 0.0, 5.0, 2.0, 2.0])
    groups = [0, 0, 0, 0, 1, 2, 2]
    mask = torch.ones(7, 3, dtype=torch.bool)
    mask[0, 2] = False
    adv, ret = grpo(scores, groups, mask, eps=0.0)
    # group 0: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = sqrt(1/3) → ±0.5 * sqrt(3) = ±0.8660254
    # group 1 has one sample → 0; group 2 has equal scores → 0
    expected = [0.8660254, -0.8660254, 0.8660254, -0.8660254, 0.0, 0.0, 0.0]
    assert adv[:, 0].tolist() == pytest.approx(expected)
    assert adv[0].tolist() == pytest.approx([0.8660254, 0.8660254, 0.0])  # 0 off the mask
    assert torch.equal(adv, ret)
    dr, _ = grpo(scores, groups, mask, scale_by_std=False)
    assert dr[:, 1].tolist() == pytest.approx([0.5, -0.5, 0.5, -0.5, 0.0, 0.0, 0.0])


def test_grpo_and_rloo_advantages_sum_to_zero_within_each_group():
    g = torch.Generator().manual_seed(1)
    scores = torch.rand(24, generator=g, dtype=torch.float64)
    groups = torch.arange(24) // 4 * 7          # six groups of four, arbitrary id values
    mask = torch.ones(24, 5, dtype=torch.bool)
    for fn in (grpo, rloo):
        adv, _ = fn(scores, groups, mask)
        sums = adv[:, 0].reshape(6, 4).sum(dim=1)
        assert sums.abs().max().item() < 1e-9
        assert adv[:, 0].abs().min().item() > 0          # not trivially zero


def test_rloo_hand_computed():
    mask = torch.ones(4, 2, dtype=torch.bool)
    adv, _ = rloo(t([1.0, 2.0, 6.0, 3.0]), ["q1", "q1", "q1", "q2"], mask)
    # 1 - (2+6)/2 = -3;  2 - (1+6)/2 = -1.5;  6 - (1+2)/2 = 4.5;  single sample in q2 → 0
    assert adv[:, 0].tolist() == [-3.0, -1.5, 4.5, 0.0]


def test_enumerated_hand_computed():
    """Group q1 holds three options with sequence log-probs log .5, log .3, log .2 (spread over two
    tokens in row 0), group q2 one option, and row 4 of q1 no action token (left out of pi)."""
    mask = t([[1, 1], [1, 0], [1, 0], [1, 0], [0, 0]], torch.bool)
    logprobs = t([[math.log(0.5) - 1.0, 1.0], [math.log(0.3), 9.0], [math.log(0.2), 0.0], [-1.0, 0.0], [0.0, 0.0]])
    adv, ret = enumerated(t([1.0, 0.0, 2.0, 5.0, 7.0]), ["q1", "q1", "q1", "q2", "q1"], mask, logprobs)
    # baseline .5*1 + .3*0 + .2*2 = 0.9; A = 3 * pi * (s - 0.9): 3*.5*.1 = .15, 3*.3*(-.9) = -.81, 3*.2*1.1 = .66
    assert adv[:, 0].tolist() == pytest.approx([0.15, -0.81, 0.66, 0.0, 0.0])
    assert adv[0].tolist() == pytest.approx([0.15, 0.15]) and adv[1, 1].item() == 0.0   # 0 off the mask
    assert torch.equal(adv, ret)


def test_enumerated_gives_the_gradient_of_the_expected_score():
    """Over a group holding every option once, the advantage-weighted sum of grad log p is the exact
    gradient of E_pi[s] for pi = softmax of the options' log-probs (k times it, the group's size)."""
    theta = torch.tensor([0.3, -1.2, 0.8, 0.1], dtype=torch.float64, requires_grad=True)
    scores = t([1.0, 3.0, 0.5, 2.0], torch.float64)
    logp = torch.log_softmax(theta, dim=0) - 0.7       # unnormalised over the options, as a title's p is
    expected = (torch.softmax(logp, dim=0) * scores).sum()
    (exact,) = torch.autograd.grad(expected, theta, retain_graph=True)
    adv, _ = enumerated(scores, [0, 0, 0, 0], torch.ones(4, 1, dtype=torch.bool), logp.detach()[:, None])
    (estimated,) = torch.autograd.grad((adv[:, 0] * logp).sum() / 4, theta)
    assert estimated.tolist() == pytest.approx(exact.tolist())
    assert exact.abs().min().item() > 1e-3


def test_reinforce_pp_hand_computed():
    # gamma 0.5; row 1 has an observation token at index 1 which the discount skips.
    mask = t([[1, 1, 1, 0], [1, 0, 1, 1]], torch.bool)
    rewards = t([[0.0, 0.0, 2.0, 0.0], [0.0, 0.0, 0.0, -1.0]])
    adv, ret = reinforce_pp(rewards, mask, gamma=0.5)
    # row 0: G2 = 2, G1 = 0.5*2 = 1, G0 = 0.5*1 = 0.5
    # row 1: G3 = -1, G2 = 0.5*-1 = -0.5, G0 = 0.5*-0.5 = -0.25
    assert ret.tolist() == [[0.5, 1.0, 2.0, 0.0], [-0.25, 0.0, -0.5, -1.0]]
    # whitening over the six returns: mean 1.75/6 = 0.2916667; squared deviations
    # 0.0434028 + 0.5017361 + 2.9184028 + 0.2934028 + 0.6267361 + 1.6684028 = 6.0520833,
    # unbiased var 6.0520833/5 = 1.2104167, std 1.1001894
    mean, std = 0.2916667, 1.1001894
    assert adv[0, :3].tolist() == pytest.approx([(v - mean) / std for v in (0.5, 1.0, 2.0)], abs=1e-6)
    assert adv[1, [0, 2, 3]].tolist() == pytest.approx([(v - mean) / std for v in (-0.25, -0.5, -1.0)], abs=1e-6)
    assert adv[0, 3].item() == 0 and adv[1, 1].item() == 0


def test_reinforce_pp_group_baseline():
    # outcomes 1, 0 (group 0, mean 0.5) and 0.5 (alone in group 1: its own baseline)
    mask = t([[1, 1, 0], [1, 1, 0], [0, 1, 0]], torch.bool)
    scores = t([1.0, 0.0, 0.5])
    adv, ret = reinforce_pp(place_outcome_reward(scores, mask), mask, gamma=1.0, group_ids=[0, 0, 1])
    # gamma 1: every action token carries outcome - baseline = +0.5, +0.5, -0.5, -0.5, 0
    assert ret.tolist() == [[0.5, 0.5, 0.0], [-0.5, -0.5, 0.0], [0.0, 0.0, 0.0]]
    # whitening: mean 0, unbiased var (4 * 0.25) / 4 = 0.25, std 0.5 → ±1 and 0
    torch.testing.assert_close(adv, t([[1.0, 1.0, 0.0], [-1.0, -1.0, 0.0], [0.0, 0.0, 0.0]]), atol=1e-6, rtol=0)


def test_registry_uniform_signature():
    mask = torch.ones(4, 3, dtype=torch.bool)
    scores = t([1.0, 0.0, 3.0, 1.0])
    groups = [0, 0, 1, 1]
    assert set(ADVANTAGE_ESTIMATORS) == {"gae", "gae_baseline", "grpo", "dr_grpo", "rloo", "reinforce_pp",
                                         "reinforce_pp_baseline", "enumerated"}
    adv, _ = compute_advantages("dr_grpo", scores=scores, mask=mask, group_ids=groups)
    assert adv[:, 0].tolist() == [0.5, -0.5, 1.0, -1.0]
    # scores derived from token rewards when only those are given: same answer
    adv2, _ = compute_advantages("dr_grpo", token_rewards=place_outcome_reward(scores, mask), mask=mask,
                                 group_ids=groups)
    assert torch.equal(adv, adv2)
    adv3, _ = compute_advantages("reinforce_pp_baseline", scores=scores, mask=mask, group_ids=groups)
    # outcome - group mean = ±0.5, ±1 on 3 tokens each: mean 0, unbiased var 3*(2*0.25 + 2*1)/11
    std = math.sqrt(7.5 / 11)
    assert adv3[:, 1].tolist() == pytest.approx([0.5 / std, -0.5 / std, 1 / std, -1 / std])
    adv4, ret4 = compute_advantages("gae", scores=scores, values=torch.zeros(4, 3), mask=mask,
                                    gamma=1.0, lam=1.0, whiten=False)
    assert ret4[:, 0].tolist() == [1.0, 0.0, 3.0, 1.0]   # gamma = lam = 1, V = 0: return = outcome
    with pytest.raises(ConfigError, match="unknown advantage estimator"):
        compute_advantages("ppo2", scores=scores, mask=mask)
    with pytest.raises(ConfigError, match="does not take lam"):
        compute_advantages("grpo", scores=scores, mask=mask, group_ids=groups, lam=0.9)
    with pytest.raises(AlgoInputError, match="needs values"):
        compute_advantages("gae", scores=scores, mask=mask)
    with pytest.raises(AlgoInputError, match="needs group_ids"):
        compute_advantages("rloo", scores=scores, mask=mask)
    with pytest.raises(AlgoInputError, match="needs logprobs"):
        compute_advantages("enumerated", scores=scores, mask=mask, group_ids=groups)
    adv6, _ = compute_advantages("enumerated", scores=scores, mask=mask, group_ids=groups,
                                 logprobs=torch.zeros(4, 3))   # equal log-probs: pi uniform, A = s - mean
    assert adv6[:, 0].tolist() == [0.5, -0.5, 1.0, -1.0]
    with pytest.raises(AlgoInputError, match="needs group_ids"):
        compute_advantages("gae_baseline", scores=scores, values=torch.zeros(4, 3), mask=mask)
    _, ret5 = compute_advantages("gae_baseline", scores=scores, values=torch.zeros(4, 3), mask=mask,
                                 group_ids=groups, gamma=1.0, lam=1.0, whiten=False)
    assert ret5[:, 0].tolist() == [0.5, -0.5, 1.0, -1.0]   # outcome - its group's mean


def test_whitening_with_a_cross_rank_reduce_equals_whitening_the_whole_batch():
    """Two 'ranks' each hold half the rows; with `reduce` summing their [count, sum, sum of
    squares], each half is whitened exactly as the rows are within the full batch (GAE and
    REINFORCE++ whiten over the batch, so per-rank statistics would give a different step)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, generator=g) * 3 + 1
    mask = (torch.rand(6, 5, generator=g) > 0.3).float()
    full = masked_whiten(x, mask)

    def local_stats(rows):
        xs = x[rows].double()[mask[rows].bool()]
        return torch.stack([xs.new_tensor(float(xs.numel())), xs.sum(), (xs * xs).sum()])

    halves = [slice(0, 2), slice(2, 6)]          # unequal token counts
    for mine, other in (halves, halves[::-1]):
        got = masked_whiten(x[mine], mask[mine], reduce=lambda s, o=other: s + local_stats(o))
        torch.testing.assert_close(got, full[mine], atol=1e-5, rtol=0)
        assert not torch.allclose(masked_whiten(x[mine], mask[mine]), full[mine], atol=1e-3)  # per-rank differs
    # the estimators pass it through
    rewards = place_outcome_reward(torch.tensor([1.0, 0.0, 0.5, 0.2, 0.9, 0.3]), mask)
    adv_full, _ = reinforce_pp(rewards, mask)
    adv_half, _ = reinforce_pp(rewards[:2], mask[:2], reduce=lambda s: s + _returns_stats(rewards[2:], mask[2:]))
    torch.testing.assert_close(adv_half, adv_full[:2], atol=1e-5, rtol=0)


def _returns_stats(rewards, mask):
    _, returns = reinforce_pp(rewards, mask)
    xs = returns.double()[mask.bool()]
    return torch.stack([xs.new_tensor(float(xs.numel())), xs.sum(), (xs * xs).sum()])
