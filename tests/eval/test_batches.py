"""ragrl.eval.batches: the one loop over questions in batches."""
import pytest

from ragrl.eval.batches import in_batches


def test_every_item_once_in_order_with_progress_after_each_batch():
    calls, seen = [], []
    out = in_batches(list("abcdefg"), 3, lambda b: (calls.append(list(b)), [x.upper() for x in b])[1],
                     progress=lambda done, total: seen.append((done, total)))
    assert out == list("ABCDEFG")
    assert calls == [["a", "b", "c"], ["d", "e", "f"], ["g"]]
    assert seen == [(3, 7), (6, 7), (7, 7)]
    assert in_batches([], 4, lambda b: list(b)) == []


def test_a_batch_size_below_one_is_refused():
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        in_batches([1], 0, lambda b: list(b))
