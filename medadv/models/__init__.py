"""Reference architectures, checkpoint I/O and plain supervised training."""

from .io import cache_dir, load_checkpoint, save_checkpoint
from .nets import chexnet, small_cnn, small_unet
from .training import fit_supervised

__all__ = ["cache_dir", "load_checkpoint", "save_checkpoint", "chexnet", "small_cnn", "small_unet", "fit_supervised"]
