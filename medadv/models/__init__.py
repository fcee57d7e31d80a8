"""Reference architectures, GAP generators, whole-volume wrappers, checkpoint I/O, plain training, and the zoo of
published pretrained models (:mod:`medadv.models.zoo`: deepbet brain extraction, RobustBench)."""

from .deepbet import Deepbet, DeepbetBBox
from .generators import ResnetGenerator, UnetGenerator, build_generator
from .io import cache_dir, load_checkpoint, save_checkpoint
from .nets import chexnet, small_cnn, small_unet
from .sliding import SlidingWindow, TileWise, tile_slices
from .training import fit_supervised
from .zoo import available_models, load_model, zoo_entry, zoo_task

__all__ = [
    "cache_dir", "load_checkpoint", "save_checkpoint",
    "chexnet", "small_cnn", "small_unet",
    "UnetGenerator", "ResnetGenerator", "build_generator",
    "SlidingWindow", "TileWise", "tile_slices",
    "fit_supervised",
    "available_models", "load_model", "zoo_entry", "zoo_task", "Deepbet", "DeepbetBBox",
]
