"""Targeted relevance attack on a trained model and the real chest X-ray: the map moves onto the square.

Zhang et al. (Radiology: AI 2024) pull the gradient map of a chest-radiograph classifier towards an
upper-right square under L∞ ε = 0.06 while the prediction stays put (spec 002 §1.4). Here a small max-pool
CNN is trained on augmented crops of the bundled real chest radiograph with synthetic nodules, and the
attack is compared with two controls: the clean map and random ±ε noise of the same L∞ norm. The
softplus surrogate's smoothed max pools (``smooth_pools=True``, the default) are what make the map
steerable; the same attack with hard max pools is the feature's control.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from medadv.attacks.relevance import SaliencyRelevance
from medadv.attacks.saliency import square_target
from medadv.data.chest_xray import load_chest_xray
from medadv.explain import Gradient
from medadv.metrics.saliency import map_ssim, mass_in_region
from medadv.tasks import MultiLabel
from medadv.threats import Linf

SIZE, EPS = 64, 0.06


def _crops(n: int, seed: int) -> tuple[Tensor, Tensor]:
    """Random 64² crops of the real radiograph (contrast/brightness jitter), nodules in either lung field."""
    g = torch.Generator().manual_seed(seed)
    base = load_chest_xray(size=72, channels=1)
    yy, xx = torch.meshgrid(torch.arange(SIZE).float(), torch.arange(SIZE).float(), indexing="ij")
    xs, ys = [], []
    for _ in range(n):
        r0, c0 = (int(torch.randint(0, base.shape[-1] - SIZE + 1, (1,), generator=g)) for _ in range(2))
        img = base[:, r0:r0 + SIZE, c0:c0 + SIZE].clone()
        img = (img - 0.5) * (0.8 + 0.4 * torch.rand(1, generator=g)) + 0.5 + 0.1 * (torch.rand(1, generator=g) - 0.5)
        y = (torch.rand(2, generator=g) < 0.5).float()
        for k in range(2):
            if y[k]:
                cy = SIZE * (0.35 + 0.3 * torch.rand(1, generator=g))
                cx = SIZE * ((0.2 if k == 0 else 0.62) + 0.18 * torch.rand(1, generator=g))
                s = SIZE * (0.03 + 0.02 * torch.rand(1, generator=g))
                img = img + 0.5 * torch.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * s ** 2))
        xs.append((img + 0.02 * torch.randn(img.shape, generator=g)).clamp(0, 1))
        ys.append(y)
    return torch.stack(xs), torch.stack(ys)


class _Standardise(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return (x - 0.6) / 0.2


def _fit(model: nn.Module, x: Tensor, y: Tensor, epochs: int, one_cycle: bool) -> None:
    """Adam (lr 3e-3, batch 16) on BCE, optionally under a one-cycle learning-rate schedule."""
    opt = torch.optim.Adam(model.parameters(), 3e-3)
    n = len(x)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, 3e-3, total_steps=epochs * -(-n // 16)) if one_cycle else None
    for _ in range(epochs):
        perm = torch.randperm(n)
        for i in range(0, n, 16):
            idx = perm[i:i + 16]
            loss = F.binary_cross_entropy_with_logits(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
    model.eval()


def _trained() -> tuple[nn.Module, Tensor]:
    torch.manual_seed(0)
    w = 8
    model = nn.Sequential(
        _Standardise(), nn.Conv2d(1, w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(w, 2 * w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(2 * w, 2 * w, 3, padding=1), nn.ReLU(), nn.AdaptiveMaxPool2d(2), nn.Flatten(), nn.Linear(8 * w, 2))
    x, y = _crops(384 + 32, seed=0)
    _fit(model, x[:384], y[:384], epochs=12, one_cycle=False)
    with torch.no_grad():
        acc = ((model(x[384:]) > 0).float() == y[384:]).float().mean()
    assert acc > 0.85  # the model really learned the nodules
    return model, x[384:388]


def test_relevance_target_moves_map_mass_into_square():
    model, x = _trained()
    task, threat, expl = MultiLabel(), Linf(EPS, bounds=(0.0, 1.0)), Gradient()
    with torch.no_grad():
        label = model(x).argmax(1)
    target = square_target((SIZE, SIZE))[None].expand(len(x), -1, -1)

    def scores(v: Tensor) -> tuple[float, float]:
        m = expl.map(model, v, label)
        return float(map_ssim(m, target).mean()), float(mass_in_region(m, target).mean())

    g = torch.Generator().manual_seed(1)
    noise = (x + EPS * (torch.randint(0, 2, x.shape, generator=g) * 2 - 1)).clamp(0, 1)
    ssim_clean, mass_clean = scores(x)
    ssim_noise, mass_noise = scores(noise)

    res = SaliencyRelevance(task, threat, expl, label=label, steps=200, max_prob_change=0.02)(model, x)
    d = res.details
    ssim_adv, mass_adv = scores(res.x_adv)
    hard = SaliencyRelevance(task, threat, expl, label=label, steps=100, max_prob_change=0.02,
                             smooth_pools=False)(model, x)
    _, mass_hard = scores(hard.x_adv)
    print(f"ssim clean {ssim_clean:.3f} noise {ssim_noise:.3f} adv {ssim_adv:.3f}; mass clean {mass_clean:.4f} "
          f"noise {mass_noise:.4f} adv {mass_adv:.4f} hard-pool adv {mass_hard:.4f}; dp {float(d.prob_change.max()):.4f}")

    # prediction kept on the original model, within the budget
    assert d.admissible.all() and not res.fooled.any()
    assert float(d.prob_change.max()) <= 0.02 + 1e-6
    assert (res.linf <= EPS + 1e-6).all()
    # the map's mass inside the square: several times the clean share and the noise control's
    assert abs(float(d.target_mass.mean()) - mass_adv) < 1e-5  # details agree with the re-computed map
    # (measured ×2.4 / ×2.4 with one thread, ×1.9 / ×1.8 with two: the trained weights differ with the thread count)
    assert mass_adv > 1.5 * mass_clean and mass_adv > 1.5 * mass_noise
    # SSIM to the target: above the clean map's, but NOT clearly above the noise control (measured 0.364 vs
    # 0.352 noise, 0.308 clean): SSIM of min-max maps against a mostly empty target mainly rewards quiet
    # background, which ±ε noise also changes; the mass share above is the honest success measure
    assert ssim_adv > ssim_clean + 0.03
    # smoothing the max pools is what moves the mass: hard pools move it less (×2.0 one thread, ×1.55 two)
    assert mass_adv > 1.3 * mass_hard


def _trained_strided() -> tuple[nn.Module, Tensor]:
    """A max-pool-free CNN: stride-2 convolutions 64² → 8², one stride-1 conv, 2×2 average pool, linear.

    Global average pooling to 1×1 cannot tell the left lung field from the right (held-out accuracy ≈ 0.56);
    the 2×2 average pool keeps the side and reaches ≈ 0.95.
    """
    torch.manual_seed(0)
    layers: list[nn.Module] = [_Standardise(), nn.Conv2d(1, 16, 3, padding=1), nn.ReLU()]
    for c_in, c_out, stride in ((16, 32, 2), (32, 64, 2), (64, 64, 2), (64, 64, 1)):
        layers += [nn.Conv2d(c_in, c_out, 3, padding=1, stride=stride), nn.ReLU()]
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(64 * 4, 2))
    x, y = _crops(384 + 64, seed=0)
    _fit(model, x[:384], y[:384], epochs=12, one_cycle=True)
    with torch.no_grad():
        acc = ((model(x[384:]) > 0).float() == y[384:]).float().mean()
    assert acc > 0.85  # well trained: the map steering is not an artefact of a model that learned nothing
    return model, x[384:388]


def test_relevance_target_reaches_target_ssim_on_avg_pool_cnn():
    """Without max pools the map is steerable: SSIM to the target beats both controls and the map's mass in the
    target square is several times theirs."""
    model, x = _trained_strided()
    task, threat, expl = MultiLabel(), Linf(EPS, bounds=(0.0, 1.0)), Gradient()
    with torch.no_grad():
        label = model(x).argmax(1)
        p0 = model(x).sigmoid()
    target = square_target((SIZE, SIZE))[None].expand(len(x), -1, -1)

    def scores(v: Tensor) -> tuple[float, float]:
        m = expl.map(model, v, label)
        return float(map_ssim(m, target).mean()), float(mass_in_region(m, target).mean())

    g = torch.Generator().manual_seed(1)
    noise = (x + EPS * (torch.randint(0, 2, x.shape, generator=g) * 2 - 1)).clamp(0, 1)
    ssim_clean, mass_clean = scores(x)
    ssim_noise, mass_noise = scores(noise)
    # γ_p = 10 instead of the default 1e4: the prediction is still held by max_prob_change (defaults reach
    # SSIM 0.47, mass 0.047 at |Δp| 0.0006)
    res = SaliencyRelevance(task, threat, expl, label=label, steps=200, prefactors=(1.0, 10.0),
                            max_prob_change=0.02)(model, x)
    ssim_adv, mass_adv = scores(res.x_adv)
    with torch.no_grad():
        p_adv = model(res.x_adv).sigmoid()
    dp = float((p_adv - p0).abs().max())
    print(f"ssim clean {ssim_clean:.3f} noise {ssim_noise:.3f} adv {ssim_adv:.3f}; mass clean {mass_clean:.4f} "
          f"noise {mass_noise:.4f} adv {mass_adv:.4f}; dp {dp:.4f}")

    # prediction kept (no label flips, every probability within 0.02), inside the L∞ ball
    assert res.details.admissible.all() and not res.fooled.any()
    assert ((p_adv > 0.5) == (p0 > 0.5)).all() and dp <= 0.02 + 1e-6
    assert (res.linf <= EPS + 1e-6).all()
    # SSIM to the target, above both controls. The trained weights, and with them the reachable SSIM, depend on
    # the machine's float kernels and thread count: measured 0.557 (clean 0.235, noise 0.224) where this test was
    # written, 0.407 (0.185 / 0.223) with one thread and 0.302 (0.209 / 0.199) with two on the 2-core CI machine.
    # So no absolute SSIM is asserted (the paper's 0.65-0.94 is not reproduced: issue 32, item 2; why, on the
    # recipe's models: benchmarks/zhang_ablation.md: the prediction bound and the small inputs), only the margin
    # over both controls that every measurement clears (+0.09 at the least) and the mass share below
    assert ssim_adv > max(ssim_clean, ssim_noise) + 0.05
    # the mass share in the square (measured 0.078 vs 0.005): several times both controls
    assert mass_adv > 5.0 * max(mass_clean, mass_noise)
