"""Tasks: per-element losses, reductions, predictions, fooled tests, metrics and target helpers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from medadv.tasks import MultiClass, MultiLabel, Segmentation


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


# --- MultiClass -------------------------------------------------------------------------------------------------
def test_multiclass_losses_and_predictions():
    task = MultiClass()
    logits = torch.randn(5, 4, generator=_gen())
    y = torch.tensor([0, 3, 1, 1, 2])
    torch.testing.assert_close(task.element_loss(logits, y), F.cross_entropy(logits, y, reduction="none"))
    torch.testing.assert_close(task.loss(logits, y), F.cross_entropy(logits, y, reduction="none"))
    w = torch.rand(5, generator=_gen(1))
    torch.testing.assert_close(task.loss(logits, y, w), w * F.cross_entropy(logits, y, reduction="none"))
    assert torch.equal(task.predict(logits), logits.argmax(1))
    hit = logits.argmax(1) == y
    assert torch.equal(task.fooled(logits, y), ~hit)
    assert torch.equal(task.fooled(logits, y, targeted=True), hit)
    assert torch.equal(task.metrics(logits, y)["correct"], hit.float())
    p, t = task.distributions(logits, y)
    assert p.shape == t.shape == (5, 4)
    torch.testing.assert_close(p.sum(1), torch.ones(5))
    assert torch.equal(t.argmax(1), y)
    # small integer dtypes are accepted as class indices
    task.validate(logits, y.to(torch.uint8))
    torch.testing.assert_close(task.loss(logits, y.to(torch.int32)), task.loss(logits, y))


# --- MultiLabel -------------------------------------------------------------------------------------------------
def test_multilabel_losses_and_predictions():
    task = MultiLabel()
    logits = torch.randn(6, 3, generator=_gen())
    y = (torch.rand(6, 3, generator=_gen(1)) > 0.5).float()
    ref = F.binary_cross_entropy_with_logits(logits, y, reduction="none")
    torch.testing.assert_close(task.element_loss(logits, y), ref)
    torch.testing.assert_close(task.loss(logits, y), ref.mean(1))
    pred = task.predict(logits)
    assert pred.dtype == logits.dtype and torch.equal(pred, (logits.sigmoid() > 0.5).float())
    same = pred == y
    assert torch.equal(task.fooled(logits, y), ~same.all(1))  # untargeted: any label flipped
    assert torch.equal(task.fooled(logits, y, targeted=True), same.all(1))  # targeted: the whole vector
    m = task.metrics(logits, y)
    torch.testing.assert_close(m["label_accuracy"], same.float().mean(1))
    torch.testing.assert_close(m["exact_match"], same.all(1).float())
    p, t = task.distributions(logits, y)
    assert p.shape == t.shape == (6, 2, 3)
    torch.testing.assert_close(p.sum(1), torch.ones(6, 3))
    # boolean and integer multi-hot labels are accepted and mean the same
    task.validate(logits, y.bool())
    task.validate(logits, y.long())
    torch.testing.assert_close(task.loss(logits, task.to_target(y.bool(), logits)), task.loss(logits, y))


def test_multilabel_threshold():
    task = MultiLabel(threshold=0.8)
    logits = torch.logit(torch.tensor([[0.79, 0.81, 0.5]]))
    assert torch.equal(task.predict(logits), torch.tensor([[0.0, 1.0, 0.0]]))


def test_multilabel_make_target():
    task = MultiLabel()
    ref = torch.tensor([[0.0, 1.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    ref_copy = ref.clone()
    names = ["Hernia", "Mass", "Nodule", "Effusion"]
    t = task.make_target(ref, present=["Hernia", "Nodule"], absent=[3], label_names=names)
    assert torch.equal(t, torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 1.0, 0.0]]))
    assert torch.equal(ref, ref_copy), "the reference must not be modified"
    assert t.dtype == torch.float32
    assert torch.equal(task.make_target(ref.bool()), ref)  # nothing forced: the reference itself
    with pytest.raises(ValueError, match=r"`present` has label index 4 out of range \[0, 3\]"):
        task.make_target(ref, present=[4])
    with pytest.raises(ValueError, match=r"`absent` names unknown label 'Cardiomegaly'"):
        task.make_target(ref, absent=["Cardiomegaly"], label_names=names)
    with pytest.raises(ValueError, match=r"`present` names unknown label 'Mass' \(pass `label_names`"):
        task.make_target(ref, present=["Mass"])
    with pytest.raises(ValueError, match=r"both `present` and `absent`"):
        task.make_target(ref, present=[1], absent=[1])
    with pytest.raises(ValueError, match=r"`label_names` has 2 names for 4 labels"):
        task.make_target(ref, label_names=["a", "b"])
    with pytest.raises(ValueError, match=r"`reference` must be an \(N, L\) tensor"):
        task.make_target(ref[0])


# --- Segmentation -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ndim", [2, 3])
def test_segmentation_ce_loss_and_ignore_index(ndim):
    task = Segmentation(3, ignore_index=255)
    logits = torch.randn(2, 3, *([5] * ndim), generator=_gen())
    y = torch.randint(0, 3, (2, *([5] * ndim)), generator=_gen(1))
    y[0].view(-1)[:7] = 255
    el = task.element_loss(logits, y)
    assert el.shape == y.shape
    valid = (y != 255).flatten(1).float()
    ref = (F.cross_entropy(logits, y.masked_fill(y == 255, 0), reduction="none").flatten(1) * valid).sum(1)
    torch.testing.assert_close(task.loss(logits, y), ref / valid.sum(1))
    # agrees with torch's own ignore_index handling on the whole batch
    torch.testing.assert_close(
        (task.loss(logits, y) * valid.sum(1)).sum() / valid.sum(), F.cross_entropy(logits, y, ignore_index=255)
    )
    oh = task.one_hot(y)
    assert oh.shape == logits.shape and float(oh[0].flatten(1)[:, :7].abs().sum()) == 0.0


@pytest.mark.parametrize("include_background", [False, True])
def test_segmentation_dice_loss_matches_monai_and_weighted_form(include_background):
    from monai.losses import DiceLoss

    task = Segmentation(3, include_background=include_background, loss="dice")
    logits = torch.randn(2, 3, 6, 6, 6, generator=_gen())
    y = torch.randint(0, 3, (2, 6, 6, 6), generator=_gen(1))
    ref = DiceLoss(include_background=include_background, reduction="none")(logits.softmax(1), task.one_hot(y))
    torch.testing.assert_close(task.loss(logits, y), ref.flatten(1).mean(1))
    # the weighted soft Dice used by CosPGD/SegPGD reduces to MONAI's with unit weights
    torch.testing.assert_close(task.loss(logits, y, torch.ones_like(y, dtype=torch.float32)), task.loss(logits, y))
    dicece = Segmentation(3, include_background=include_background, loss="dicece")
    ce = Segmentation(3).loss(logits, y)
    torch.testing.assert_close(dicece.loss(logits, y), task.loss(logits, y) + ce)


def test_segmentation_hard_dice_matches_monai():
    from monai.metrics import compute_dice

    task = Segmentation(4, ignore_index=255)
    pred = torch.randint(0, 4, (3, 5, 6, 7), generator=_gen())
    y = torch.randint(0, 3, (3, 5, 6, 7), generator=_gen(1))  # class 3 absent from y
    y[1, 0] = 255
    pred[2] = 0  # sample 2 predicts only background
    p = task.one_hot(pred) * (y != 255).unsqueeze(1)
    ref = compute_dice(p, task.one_hot(y), include_background=True, ignore_empty=False)
    torch.testing.assert_close(task.dice(pred, y), ref)


def test_segmentation_mean_dice_fooled_and_metrics():
    task = Segmentation(3, dice_threshold=0.5, target_fraction=0.9)
    y = torch.zeros(2, 8, 8, dtype=torch.long)
    y[:, :4, :4] = 1
    y[:, 4:, 4:] = 2
    perfect = F.one_hot(y, 3).movedim(-1, 1).float() * 10
    wrong = perfect.clone()
    wrong[1] = F.one_hot(torch.zeros(8, 8, dtype=torch.long), 3).movedim(-1, 0).float() * 10  # all background
    torch.testing.assert_close(task.mean_dice(task.predict(perfect), y), torch.ones(2))
    torch.testing.assert_close(task.mean_dice(task.predict(wrong), y), torch.tensor([1.0, 0.0]))
    assert torch.equal(task.fooled(wrong, y), torch.tensor([False, True]))
    assert torch.equal(task.fooled(wrong, y, targeted=True), torch.tensor([True, False]))
    m = task.metrics(wrong, y)
    assert set(m) == {"dice", "mean_dice", "pixel_accuracy", "miou"}
    torch.testing.assert_close(m["pixel_accuracy"], torch.tensor([1.0, 0.5]))
    assert m["dice"].shape == (2, 3)
    # include_background counts the background class in the mean
    with_bg = Segmentation(3, include_background=True).mean_dice(task.predict(wrong), y)
    assert float(with_bg[1]) > 0.0


def test_segmentation_make_target():
    task = Segmentation(3)
    ref = torch.tensor([[[0, 1, 2], [2, 1, 0]]])
    ref_copy = ref.clone()
    assert torch.equal(task.make_target(ref, replace={1: 0}), torch.tensor([[[0, 0, 2], [2, 0, 0]]]))
    assert torch.equal(task.make_target(ref, replace={1: 2, 2: 1}), torch.tensor([[[0, 2, 1], [1, 2, 0]]]))
    mask = torch.tensor([[[True, False, False], [True, False, False]]])
    assert torch.equal(task.make_target(ref, mask=mask, fill=1), torch.tensor([[[1, 1, 2], [1, 1, 0]]]))
    assert torch.equal(task.make_target(ref, mask=mask[0], fill=1), task.make_target(ref, mask=mask, fill=1))
    assert torch.equal(ref, ref_copy)
    with pytest.raises(ValueError, match=r"`replace` has class 3 out of range \[0, 2\]"):
        task.make_target(ref, replace={1: 3})
    with pytest.raises(ValueError, match=r"`fill` has class 5 out of range"):
        task.make_target(ref, mask=mask, fill=5)
    with pytest.raises(ValueError, match=r"`mask` and `fill` must be given together"):
        task.make_target(ref, mask=mask)
    with pytest.raises(TypeError, match=r"`mask` must be a boolean tensor"):
        task.make_target(ref, mask=mask.long(), fill=1)
    with pytest.raises(ValueError, match=r"`mask` of shape \(2, 2\) does not broadcast"):
        task.make_target(ref, mask=torch.ones(2, 2, dtype=torch.bool), fill=1)
    with pytest.raises(ValueError, match=r"`reference` must be an integer \(N, \*spatial\) label map"):
        task.make_target(ref.float())


def test_segmentation_targeted_fooled_respects_ignore_index():
    task = Segmentation(2, ignore_index=255, target_fraction=1.0)
    target = torch.tensor([[[1, 1], [255, 255]]])
    logits = torch.zeros(1, 2, 2, 2)
    logits[:, 1, 0] = 5.0  # predicts 1 on the valid row, 0 on the ignored row
    assert bool(task.fooled(logits, target, targeted=True)[0])


def test_validate_rejects_wrong_output_rank_for_each_task():
    with pytest.raises(ValueError, match=r"2 or 3 spatial dims"):
        Segmentation(3).validate(torch.zeros(1, 3, 4, 4, 4, 4), None)
    with pytest.raises(TypeError, match=r"`target` must be a torch.Tensor"):
        MultiClass().validate(torch.zeros(2, 3), [0, 1], name="target")


@pytest.mark.parametrize(
    "task,logit_shape",
    [(MultiClass(), (6, 4)), (MultiLabel(), (6, 5)), (Segmentation(3), (2, 3, 4, 5)),
     (Segmentation(3, ignore_index=255), (2, 3, 4, 4, 4))],
    ids=["multiclass", "multilabel", "seg2d", "seg3d-ignore"],
)
def test_target_cosine_matches_the_cosine_of_the_distributions(task, logit_shape):
    logits = 3 * torch.randn(logit_shape, generator=_gen())
    if isinstance(task, MultiLabel):
        y = (torch.rand(logit_shape, generator=_gen(1)) > 0.5).float()
    elif isinstance(task, MultiClass):
        y = torch.randint(0, logit_shape[1], logit_shape[:1], generator=_gen(1))
    else:
        y = torch.randint(0, 3, (logit_shape[0], *logit_shape[2:]), generator=_gen(1))
        if task.ignore_index is not None:
            y[0, 0] = 255
    ref = F.cosine_similarity(*task.distributions(logits, y), dim=1, eps=1e-12)
    cos = task.target_cosine(logits, y)
    assert cos.shape == task.element_loss(logits, task.to_target(y, logits)).shape
    torch.testing.assert_close(cos, ref, atol=1e-6, rtol=1e-5)
    assert bool((cos >= 0).all() and (cos <= 1 + 1e-6).all())
