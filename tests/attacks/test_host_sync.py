"""No host synchronisation inside any iterative attack's step loop, on the device of ``pytest --device``.

Parametrized over every registered attack built on the engine (``IterativeAttack``) and every task setting it
supports (the conformance factory), so a new attack is checked without editing a list. The loop is run through
``attack.run`` (the engine's loop: restarts, steps, best-iterate keeping) with the clean output given, i.e.
without the one validation read that ``attack()`` makes before the first step and without the per-call summaries
(``details``) computed after the loop.

* CPU: every device-to-host read (``.item()``, ``bool(t)``, ``.tolist()``, ...) raises (the ``forbid_host_sync``
  trap);
* CUDA (``pytest --device cuda``): ``torch.cuda.set_sync_debug_mode("error")`` turns every synchronising CUDA call
  into an error — the check the trap can only approximate.

``auto`` is left out: it is an ensemble that decides between members which samples are still to be attacked (one
read per member, by design); each member is checked here on its own.
"""

from __future__ import annotations

import pytest
import torch

from medadv.attacks.base import attack_class, available_attacks
from medadv.attacks.engine import IterativeAttack

ENSEMBLES = {"auto"}  # reads between members by design (see the module docstring)


#: every registered attack built on the engine (a new one is checked without editing this file)
ENGINE_ATTACKS = [n for n in available_attacks() if n not in ENSEMBLES and issubclass(attack_class(n), IterativeAttack)]


def test_every_engine_attack_is_covered():
    assert {"pgd", "apgd", "cospgd", "segpgd", "dag", "vafa"} <= set(ENGINE_ATTACKS), ENGINE_ATTACKS


@pytest.mark.parametrize("name", ENGINE_ATTACKS)
def test_no_host_sync_in_the_step_loop(name, factory, device, forbid_host_sync):
    for setting in factory.settings_for(attack_class(name)):
        case = factory.Case(name, setting)
        try:
            attack = case.build(steps=3) if "steps" in attack_class(name).param_names() else case.build()
        except (ValueError, TypeError):
            continue  # refused before any work (a kind the attack does not apply to): the conformance suite checks it
        model = case.model().eval().to(device)
        x, y = (t.to(device) for t in case.data())
        with torch.no_grad():
            logits = model(x)
        y = attack.task.to_target(y, logits)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.set_sync_debug_mode("error")
            try:
                out = attack.run(model, x, y, logits)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        else:
            monkeypatch = forbid_host_sync()
            try:
                out = attack.run(model, x, y, logits)
            finally:
                monkeypatch.undo()
        assert out.x_adv.shape == x.shape and out.x_adv.device == x.device, case.id
