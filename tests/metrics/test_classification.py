import pytest
import torch

from medadv.metrics.classification import accuracy, flip_probability, fooling_rate, macro_auc, roc_auc


def test_roc_auc_matches_hand_computed_pairs_with_ties():
    s = torch.tensor([0.1, 0.4, 0.35, 0.8, 0.4])
    y = torch.tensor([0, 0, 1, 1, 1.0])
    # positives {0.35, 0.8, 0.4} vs negatives {0.1, 0.4}: wins 1+0 (0.35), 1+1 (0.8), 1+0.5 (0.4 tie)
    assert roc_auc(s, y).item() == pytest.approx(4.5 / 6)


def test_roc_auc_per_label_and_undefined_column():
    s = torch.tensor([[0.9, 0.2], [0.1, 0.3], [0.8, 0.1]])
    y = torch.tensor([[1, 0], [0, 0], [1, 0.0]])
    auc = roc_auc(s, y)
    assert auc[0].item() == 1.0 and torch.isnan(auc[1])
    assert macro_auc(s, y).item() == 1.0


def test_roc_auc_rejects_non_binary_labels():
    with pytest.raises(ValueError, match="labels"):
        roc_auc(torch.rand(4), torch.tensor([0, 1, 2, 0.0]))


def test_fooling_rate_all_and_correct_denominators():
    clean = torch.tensor([0, 1, 2, 3])
    adv = torch.tensor([1, 1, 0, 3])
    y = torch.tensor([0, 1, 1, 3])
    assert fooling_rate(clean, adv).item() == pytest.approx(0.5)
    # correct clean: samples 0, 1, 3; of these only sample 0 changed
    assert fooling_rate(clean, adv, y, denominator="correct").item() == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="denominator"):
        fooling_rate(clean, adv, denominator="some")


def test_multilabel_fooling_rate_is_mean_label_flip():
    clean = torch.tensor([[1, 0, 1, 0.0]])
    adv = torch.tensor([[1, 1, 0, 0.0]])
    assert fooling_rate(clean, adv).item() == pytest.approx(0.5)
    assert accuracy(adv, torch.tensor([[1, 1, 1, 1.0]])).item() == pytest.approx(0.5)


def test_flip_probability_previous_and_first():
    preds = torch.tensor([[0], [1], [1], [0]])  # one sequence of 4 frames
    assert flip_probability(preds, "previous").item() == pytest.approx(2 / 3)
    assert flip_probability(preds, "first").item() == pytest.approx(2 / 3)
    preds = torch.tensor([[0], [1], [0], [0]])
    assert flip_probability(preds, "previous").item() == pytest.approx(2 / 3)
    assert flip_probability(preds, "first").item() == pytest.approx(1 / 3)
