"""Reference architectures used in examples and tests (MONAI and torchvision nets, small CNNs)."""

from __future__ import annotations

from torch import nn

__all__ = ["small_cnn", "small_unet", "chexnet"]


def small_cnn(in_channels: int = 1, num_outputs: int = 4, width: int = 16, ndim: int = 2) -> nn.Module:
    """A small conv classifier (2-D or 3-D) producing ``(N, num_outputs)`` logits."""
    conv = nn.Conv2d if ndim == 2 else nn.Conv3d
    pool = nn.AdaptiveAvgPool2d if ndim == 2 else nn.AdaptiveAvgPool3d
    return nn.Sequential(
        conv(in_channels, width, 3, padding=1), nn.ReLU(),
        conv(width, 2 * width, 3, padding=1, stride=2), nn.ReLU(),
        conv(2 * width, 2 * width, 3, padding=1, stride=2), nn.ReLU(),
        pool(2), nn.Flatten(), nn.Linear(2 * width * 2**ndim, num_outputs),
    )


def small_unet(in_channels: int = 1, num_classes: int = 3, ndim: int = 3, channels: tuple[int, ...] = (8, 16, 32)) -> nn.Module:
    """MONAI ``UNet`` sized for CPU tests and demos (residual units, instance norm)."""
    from monai.networks.nets import UNet

    return UNet(spatial_dims=ndim, in_channels=in_channels, out_channels=num_classes, channels=channels,
                strides=(2,) * (len(channels) - 1), num_res_units=1)


def chexnet(num_labels: int = 14, in_channels: int = 3) -> nn.Module:
    """CheXNet architecture: torchvision DenseNet-121 with a ``num_labels`` linear head (logits).

    Weights are random: no registry ships CheXNet or ImageNet weights offline. Load your own with
    :func:`medadv.models.io.load_checkpoint`.
    """
    from torchvision.models import densenet121

    net = densenet121(weights=None, num_classes=num_labels)
    if in_channels != 3:
        net.features.conv0 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return net
