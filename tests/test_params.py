"""Declared parameters: constraint objects, one error format, did-you-mean, aliases, get_params/fingerprint."""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

import pytest
import torch

from medadv.params import (
    AnyOf,
    Bool,
    Configurable,
    Instance,
    Int,
    InvalidParameterError,
    Optional,
    Options,
    Pair,
    Real,
    closest,
    look_up_option,
    renamed,
    stable_hash,
)


class _Thing(Configurable):
    params: ClassVar[dict[str, Any]] = {
        "steps": Int(low=1),
        "step_size": Optional(Real(low=0, low_open=True)),
        "norm": Options("linf", "l2"),
        "flag": Bool(),
        "pair": Pair(Real(low=0), ordered=True),
        "weights": Optional(Instance(torch.Tensor, text="a tensor")),
    }

    @renamed(max_iter="steps")
    def __init__(self, *, steps: int = 10, step_size: float | None = None, norm: str = "linf", flag: bool = False,
                 pair: tuple[float, float] = (0.1, 0.2), weights: torch.Tensor | None = None) -> None:
        self._init_params(locals())


def test_values_are_converted_and_stored_under_their_names():
    t = _Thing(steps=5.0, step_size=1, norm="L2", pair=[0, 1])
    assert t.steps == 5 and isinstance(t.steps, int)
    assert t.step_size == 1.0 and isinstance(t.step_size, float)
    assert t.norm == "l2" and t.pair == (0.0, 1.0)
    assert t.get_params() == {"steps": 5, "step_size": 1.0, "norm": "l2", "flag": False, "pair": (0.0, 1.0),
                              "weights": None}


@pytest.mark.parametrize("kw,msg", [
    ({"steps": 2.5}, r"`steps` of _Thing must be an integer >= 1; got 2.5 \(float\)"),
    ({"steps": 0}, r"`steps` of _Thing must be an integer >= 1; got 0 \(int\)"),
    ({"steps": True}, r"`steps` of _Thing must be an integer >= 1; got True \(bool\)"),
    ({"steps": "10"}, r"`steps` of _Thing must be an integer >= 1; got '10' \(str\)"),
    ({"step_size": 0.0}, r"`step_size` of _Thing must be None or a finite number > 0; got 0.0"),
    ({"step_size": float("nan")}, r"`step_size` of _Thing must be None or a finite number > 0; got nan"),
    ({"norm": "lnf"}, r"`norm` of _Thing must be one of 'linf', 'l2'; got 'lnf' \(str\); did you mean 'linf'\?"),
    ({"flag": "false"}, r"`flag` of _Thing must be True or False; got 'false' \(str\)"),
    ({"pair": (0.3, 0.1)}, r"`pair` of _Thing must be a pair of finite number >= 0s \(first <= second\)"),
    ({"weights": [1.0]}, r"`weights` of _Thing must be None or a tensor; got list"),
])
def test_one_error_format(kw, msg):
    with pytest.raises(InvalidParameterError, match=msg) as e:
        _Thing(**kw)
    assert isinstance(e.value, ValueError) and isinstance(e.value, TypeError)


def test_deprecated_alias_warns_and_maps():
    with pytest.warns(FutureWarning, match="`max_iter` of _Thing is deprecated; use `steps`"):
        t = _Thing(max_iter=7)
    assert t.steps == 7
    with pytest.raises(InvalidParameterError, match="give `steps` only"):
        _Thing(max_iter=7, steps=3)


def test_unknown_keyword_gets_the_closest_name():
    with pytest.raises(InvalidParameterError, match=r"unknown parameter `stpes` for _Thing; did you mean 'steps'\?"):
        _Thing.check_kwargs({"stpes": 3})
    with pytest.raises(InvalidParameterError, match=r"unknown parameter `zzz` for _Thing; valid parameters: steps"):
        _Thing.check_kwargs({"zzz": 3})


def test_repr_fingerprint_and_set_params():
    a, b = _Thing(), _Thing(steps=11)
    assert repr(a) == "_Thing()" and repr(b) == "_Thing(steps=11)"
    assert a.fingerprint() != b.fingerprint()
    assert a.fingerprint() == _Thing().fingerprint()
    c = a.set_params(steps=11)
    assert c.fingerprint() == b.fingerprint() and a.steps == 10  # the original is not mutated
    # tensors are fingerprinted by content, not identity
    w = torch.ones(3)
    assert _Thing(weights=w).fingerprint() == _Thing(weights=w.clone()).fingerprint()
    assert _Thing(weights=w).fingerprint() != _Thing(weights=w * 2).fingerprint()


def test_declarations_are_checked():
    class Undeclared(Configurable):
        def __init__(self, *, steps: int = 1, other: int = 2) -> None:
            self._init_params(locals())

    with pytest.raises(TypeError, match=r"does not declare .*other"):
        Undeclared.check_declarations()


def test_helpers():
    assert closest("Linff", ["linf", "l2"]) == "linf"
    assert closest("q", ["linf", "l2"]) is None
    assert look_up_option("L2", ["linf", "l2"], argument="norm") == "l2"
    with pytest.raises(InvalidParameterError, match=r"`norm` must be one of 'linf', 'l2'; got 'Lnf'; did you mean 'linf'\?"):
        look_up_option("Lnf", ["linf", "l2"], argument="norm")
    assert AnyOf(Int(), Options("auto")).check("auto", "x") == "auto"
    assert Pair(Real(low=0), scalar_ok=True).check(2, "x") == (2.0, 2.0)
    assert stable_hash({"a": 1, "b": [1.0, "x"]}) == stable_hash({"b": [1.0, "x"], "a": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Bool().check(True, "flag") is True


def test_task_settings_change_the_attack_fingerprint():
    # repr(Segmentation) does not show dice_threshold, but `fooled` and best-iterate choices depend on it
    from medadv.attacks import PGD
    from medadv.tasks import Segmentation
    from medadv.threats import Linf

    threat = Linf(0.1, bounds=(0.0, 1.0))
    a = PGD(Segmentation(3, dice_threshold=0.0), threat).fingerprint()
    assert a != PGD(Segmentation(3, dice_threshold=1.0), threat).fingerprint()
    assert a == PGD(Segmentation(3, dice_threshold=0.0), threat).fingerprint()


def test_per_channel_boxes_of_different_widths_have_no_single_data_range():
    from medadv.threats import Box

    assert Box(torch.zeros(2, 1, 1), torch.ones(2, 1, 1)).data_range() == 1.0
    mixed = Box(torch.tensor([0.0, -1024.0]).reshape(2, 1, 1), torch.tensor([1.0, 3071.0]).reshape(2, 1, 1))
    with pytest.raises(ValueError, match="per-channel ranges of different widths .*give the step/size explicitly"):
        mixed.data_range()
