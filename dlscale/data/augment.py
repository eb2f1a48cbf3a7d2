"""Per-sample augmentation of the maps: the CPU work a real input pipeline does for every sample.

The synthetic maps are periodic and statistically isotropic, so a map shifted by any
amount (cyclically), mirrored, or rotated by any angle has the same parameters: each epoch
the model sees every map in a new position and orientation. The work is done per sample,
in the loader (its workers when ``num_workers > 0``), the way CosmoFlow's and most image
pipelines decode and augment; on this data it costs about 0.1-0.2 ms per map on one core,
which lesson 02 uses to show a starved step and the workers that fix it.

The draws depend only on (seed, epoch, sample index), so an interrupted run resumes with the
same augmented maps, with or without workers.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F


def augment_map(x: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """One map (channels, height, width): a sub-pixel cyclic shift, a mirror, and a rotation by any angle."""
    height, width = x.shape[-2:]
    # A cyclic shift by a fraction of a pixel is a phase ramp in Fourier space: exact for periodic maps.
    dy, dx = rng.uniform(0, height), rng.uniform(0, width)
    ky = torch.fft.fftfreq(height, dtype=torch.float64)[:, None]
    kx = torch.fft.rfftfreq(width, dtype=torch.float64)[None, :]
    ramp = torch.exp(-2j * math.pi * (ky * dy + kx * dx)).to(torch.complex64)
    x = torch.fft.irfft2(torch.fft.rfft2(x) * ramp, s=(height, width))
    if rng.random() < 0.5:
        x = x.flip(-1)
    # Rotation by any angle, bicubic; the corners are filled by reflection.
    angle = rng.uniform(0, 2 * math.pi)
    cos, sin = math.cos(angle), math.sin(angle)
    theta = torch.tensor([[[cos, -sin, 0.0], [sin, cos, 0.0]]], dtype=x.dtype)
    grid = F.affine_grid(theta, (1, *x.shape), align_corners=False)
    return F.grid_sample(x[None], grid, mode="bicubic", padding_mode="reflection", align_corners=False)[0]


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator for one sample's augmentation in one epoch."""
    return np.random.default_rng((seed, epoch, index))
