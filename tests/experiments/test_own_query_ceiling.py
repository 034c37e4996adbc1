"""own_query_ceiling.ceiling, by hand: the greedy gain, the samples' mean and best per question, and the
shares; a question without its n sampled gains (a yes/no one, or episodes cut) is left out of all."""
from experiments.search_agents.own_query_ceiling import ceiling


def test_ceiling_takes_each_questions_best_sample_and_counts_the_shares():
    greedy = {"a": [-1.0], "b": [0.0], "c": [1.0], "d": [-1.0], "yes_no": [0.0]}
    sampled = {"a": [-1.0, 0.0, 1.0], "b": [-1.0, -1.0, -1.0], "c": [1.0, 1.0, 0.0], "d": [-1.0, -1.0, -1.0],
               "yes_no": [0.0]}   # fewer than n: left out
    out = ceiling(greedy, sampled, 3)
    assert out["questions"] == 4 and out["n"] == 3
    gains = out["search_gain"]
    assert gains["greedy"]["mean"] == (-1 + 0 + 1 - 1) / 4 * 100                      # -25.0
    assert abs(gains["sample mean"]["mean"] - (0 - 1 + 2 / 3 - 1) / 4 * 100) < 1e-9   # -33.3
    assert gains["best of 3"]["mean"] == (1 - 1 + 1 - 1) / 4 * 100                    # 0.0
    assert out["share_some_sample_beats_the_question"] == 50.0        # a, c
    assert out["share_every_sample_loses"] == 50.0                    # b, d
    assert out["share_greedy_loses_but_a_sample_does_not"] == 25.0    # a (d loses throughout)
