"""Weight averaging (ema_decay): hand-computed updates, the swap, and a refused setting."""
import pytest
import torch
from torch import nn

from ragrl.errors import ConfigError
from ragrl.train.averaging import WeightAverage


def test_moving_average_matches_a_hand_computed_case_and_skips_frozen_parameters():
    m = nn.Linear(1, 1)
    with torch.no_grad():
        m.weight.fill_(0.0)
        m.bias.fill_(4.0)
    m.bias.requires_grad_(False)                   # frozen: not averaged, never touched
    avg = WeightAverage(m, decay=0.5)
    assert avg.names == ["weight"]
    for w in (1.0, 2.0):
        with torch.no_grad():
            m.weight.fill_(w)
        avg.update(m)
    # 0 -> 0.5*0 + 0.5*1 = 0.5 -> 0.5*0.5 + 0.5*2 = 1.25
    assert float(avg.avg_0) == pytest.approx(1.25)
    with avg.swapped_in(m):
        assert float(m.weight) == pytest.approx(1.25) and float(m.bias) == 4.0
    assert float(m.weight) == 2.0                  # the online weights are back
    with pytest.raises(RuntimeError), avg.swapped_in(m):
        raise RuntimeError("an evaluation that fails still restores the weights")
    assert float(m.weight) == 2.0


def test_decay_outside_the_open_unit_interval_is_refused():
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ConfigError, match="ema_decay"):
            WeightAverage(nn.Linear(1, 1), bad)

