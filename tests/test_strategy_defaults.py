import numpy as np
import pytest
from conftest import Ident

from subzero import Mode, StrategyError, Workflow
from subzero.model.strategy import default_for, parse


class Comp(Ident):
    default_strategy = "comp:paymany:backward"

    def supported_modes(self):
        return {Mode.COMP, Mode.FULL, Mode.BLACKBOX}


def test_operator_default_strategy_is_used(store):
    wf = Workflow("d")
    wf.add("c", Comp(), wf.input("x"))
    run = store.run(wf, inputs={"x": np.zeros(3)})
    assert run.ops()[0]["strategies"] == ["comp:paymany:backward"]
    run = store.run(wf, inputs={"x": np.zeros(3)}, strategies={"c": "full"})
    assert run.ops()[0]["strategies"] == ["full:fullone:backward"]


def test_default_rule():
    assert default_for(Comp()) == parse("comp:paymany:backward")
    with pytest.raises(StrategyError, match="pay and comp"):
        parse("pay+comp")
    with pytest.raises(StrategyError, match="blackbox cannot be combined"):
        parse("blackbox+full")
    with pytest.raises(StrategyError, match="unknown lineage mode 'ful'"):
        parse("ful")
    with pytest.raises(StrategyError, match="direction must be backward or forward"):
        parse("full:fullone:sideways")
    with pytest.raises(StrategyError, match="stores nothing"):
        parse("map:fullone")
