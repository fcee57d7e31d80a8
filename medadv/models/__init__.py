"""Reference architectures, GAP generators, whole-volume wrappers, checkpoint I/O and plain training."""

from .generators import ResnetGenerator, UnetGenerator, build_generator
from .io import cache_dir, load_checkpoint, save_checkpoint
from .nets import chexnet, small_cnn, small_unet
from .sliding import SlidingWindow, TileWise, attack_tilewise, tile_slices
from .training import fit_supervised

__all__ = [
    "cache_dir", "load_checkpoint", "save_checkpoint",
    "chexnet", "small_cnn", "small_unet",
    "UnetGenerator", "ResnetGenerator", "build_generator",
    "SlidingWindow", "TileWise", "attack_tilewise", "tile_slices",
    "fit_supervised",
]
