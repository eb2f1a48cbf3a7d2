"""Per-sample augmentation of the maps: the CPU work a real input pipeline does for every sample.

The synthetic maps are periodic and statistically isotropic, so a map shifted by any amount
(cyclically), mirrored, or rotated by any angle has the same parameters: each epoch the model sees
every map in a new position and orientation. The map is resampled from its own Fourier series
(trigonometric interpolation), which is exact for these band-limited, periodic maps: unlike a
bilinear or bicubic rotation it adds no blur, and the blur's width is one of the targets.

The work is done per sample, in the loader (its workers when ``num_workers > 0``), the way
CosmoFlow's and most image pipelines decode and augment; it costs a fraction of a millisecond per
map on one core, which lesson 02 uses to show a starved step and the workers that fix it.

The draws depend only on (seed, epoch, sample index), so an interrupted run resumes with the
same augmented maps, with or without workers.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def augment_map(x: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """One map (channels, height, width): a sub-pixel cyclic shift, a mirror, and a rotation by any angle."""
    return resample(
        x,
        angle=rng.uniform(0, 2 * math.pi),
        shift=(rng.uniform(0, x.shape[-2]), rng.uniform(0, x.shape[-1])),
        mirror=bool(rng.random() < 0.5),
    )


def resample(
    x: torch.Tensor, angle: float = 0.0, shift: tuple[float, float] = (0.0, 0.0), mirror: bool = False
) -> torch.Tensor:
    """Evaluate a periodic map's Fourier series on its own grid rotated by ``angle`` (radians) about the
    centre and moved by ``shift`` pixels (y, x), then mirrored left-right if ``mirror``."""
    height, width = x.shape[-2:]
    cy, cx = (height - 1) / 2, (width - 1) / 2
    cos, sin = math.cos(angle), math.sin(angle)
    flip = -1.0 if mirror else 1.0
    # Output pixel (row j, column i) reads the map at y = oy + dyi * i + dyj * j, x = ox + dxi * i + dxj * j.
    dyi, dyj, dxi, dxj = sin * flip, cos, cos * flip, -sin
    oy = cy + shift[0] - dyi * cx - dyj * cy
    ox = cx + shift[1] - dxi * cx - dxj * cy
    # Half the spectrum suffices for a real map: the other half is its complex conjugate, so the
    # columns 0 < kx < width/2 count twice.
    coefficients = torch.fft.rfft2(x.to(torch.float32))  # (channels, height, width // 2 + 1)
    along_x = coefficients @ _basis((ox, dxi, dxj), height, width, half=True).T  # (channels, height, points)
    values = (along_x * _basis((oy, dyi, dyj), height, width).T).sum(-2).real / (height * width)
    return values.reshape(x.shape).to(x.dtype)


def _basis(affine: tuple[float, float, float], height: int, width: int, half: bool = False) -> torch.Tensor:
    """exp(2 pi i k p / n) at the positions p = o + a * column + b * row of a (height, width) grid, for every
    frequency k of an n-point FFT along that axis (n = width when ``half``, else height), or of the
    non-negative frequencies of a real FFT (``half``), weighted for the ones left out. Shape (points, frequencies).

    The positions are affine in the grid, so the exponential factors into one per column and one per row:
    (height + width) exponentials per frequency instead of height * width. For even n the Nyquist
    frequency is shared by +n/2 and -n/2; the real interpolant takes half of each, which is cos(pi p)."""
    origin, per_column, per_row = affine
    n = width if half else height
    k = (torch.fft.rfftfreq(n, dtype=torch.float64) if half else torch.fft.fftfreq(n, dtype=torch.float64)) * n
    phase = 2j * math.pi * k / n
    columns = torch.exp(phase * per_column * torch.arange(width, dtype=torch.float64)[:, None])
    rows = torch.exp(phase * per_row * torch.arange(height, dtype=torch.float64)[:, None])
    basis = (torch.exp(phase * origin) * rows[:, None, :] * columns[None, :, :]).reshape(height * width, len(k))
    nyquist = n // 2 if n % 2 == 0 else None
    if nyquist is not None:
        basis[:, nyquist] = basis[:, nyquist].real.to(basis.dtype)  # cos(pi p)
    if half:
        weight = torch.full((len(k),), 2.0, dtype=torch.float64)
        weight[0] = 1.0
        if nyquist is not None:
            weight[nyquist] = 1.0
        basis = basis * weight
    return basis.to(torch.complex64)


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator for one sample's augmentation in one epoch."""
    return np.random.default_rng((seed, epoch, index))
