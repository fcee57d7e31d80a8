"""Offline data: real medical images shipped inside installed packages, and synthetic test data."""

from .brain_patches import BrainPatches
from .chest_xray import ImageNetNormalize, load_chest_xray, load_fundus
from .mni152 import TISSUE_CLASSES, load_tissue_map, mni152_files, tissue_patches
from .synthetic import multiclass_blobs, multilabel_blobs, segmentation_blobs

__all__ = [
    "BrainPatches",  # the loader: medadv.data.brain_patches.brain_patches
    "load_chest_xray", "load_fundus", "ImageNetNormalize",
    "TISSUE_CLASSES", "load_tissue_map", "mni152_files", "tissue_patches",
    "multiclass_blobs", "multilabel_blobs", "segmentation_blobs",
]
