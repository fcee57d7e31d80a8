"""Metrics: classification, segmentation (MONAI), image quality, attack success, saliency similarity."""

from .attack_success import attack_success_rate, segmentation_asr
from .classification import accuracy, flip_probability, fooling_rate, macro_auc, roc_auc
from .image import lpips, mse, psnr, ssim
from .saliency import (
    center_of_mass_shift,
    compare_maps,
    map_jsd,
    map_mse,
    map_pearson,
    map_spearman,
    map_ssim,
    psc,
    topk_intersection,
)
from .segmentation import dice_per_class, hd95_per_class
from .surface import surface_distance_per_class

__all__ = [
    "accuracy", "roc_auc", "macro_auc", "fooling_rate", "flip_probability",
    "dice_per_class", "hd95_per_class", "surface_distance_per_class",
    "mse", "psnr", "ssim", "lpips",
    "attack_success_rate", "segmentation_asr",
    "map_ssim", "map_pearson", "map_mse", "map_spearman", "topk_intersection", "center_of_mass_shift",
    "map_jsd", "psc", "compare_maps",
]
