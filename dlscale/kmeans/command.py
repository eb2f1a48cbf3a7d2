"""``dlscale kmeans``: read each rank's data, fit, and write the centres, labels and a summary.

Inputs, as in Intel's daal4py tutorials:

- ``--input data_{rank}.npy`` (or ``.csv``): one file per rank, ``{rank}`` replaced by the rank;
- ``--input data.npy``: one file, split into contiguous blocks, one per rank;
- ``--image sample`` (scikit-learn's bundled photo, no download) or ``--image PATH``: colour
  quantization, the pixels' RGB values as the samples.

The job runs under ``torchrun``, ``srun`` or ``mpirun`` unchanged; only rank 0 writes the
shared outputs (``centers.npy``, ``summary.json``, the quantized image); each rank writes its
own labels.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from dlscale import distributed
from dlscale.errors import DlscaleError, import_optional
from dlscale.kmeans.errors import KMeansError
from dlscale.runtime.devices import resolve_device


class InputError(DlscaleError):
    """A K-Means input that is missing or unreadable; the message names it."""


def _read_array(path: Path) -> np.ndarray:
    if not path.is_file():
        raise InputError(f"no such input file: {path}")
    try:
        if path.suffix == ".npy":
            data = np.load(path, mmap_mode="r")
        elif path.suffix == ".csv":
            data = np.loadtxt(path, delimiter=",", dtype=np.float32, ndmin=2)
        else:
            raise InputError(f"{path}: give a .npy or .csv file (rows = samples, columns = features)")
    except (ValueError, OSError) as err:
        raise InputError(f"{path} could not be read as a table of numbers ({err})") from None
    if data.ndim != 2:
        raise InputError(f"{path} holds an array of shape {data.shape}; K-Means needs samples × features")
    return data


def rank_block(n: int, rank: int, world: int) -> slice:
    """Rows ``[start, stop)`` of rank ``rank`` when ``n`` rows are split into ``world`` contiguous blocks."""
    return slice(rank * n // world, (rank + 1) * n // world)


def _rank_part(pattern: str, rank: int, world: int, read) -> tuple[np.ndarray, Path]:
    """This rank's rows: its own file for a pattern with {rank}, else its block of the one file.

    ``np.array`` copies out of the read-only memory map, so only this rank's block is read into memory.
    """
    path = Path(pattern.format(rank=rank)) if "{rank}" in pattern else Path(pattern)
    data = read(path)
    return np.array(data if "{rank}" in pattern else data[rank_block(len(data), rank, world)]), path


def load_sample_image(name: str = "sample") -> np.ndarray:
    """An RGB image as floats in [0, 1]: scikit-learn's ``china.jpg`` for ``sample`` (its ``flower.jpg`` too, by
    name), else a file."""
    if name in ("sample", "china.jpg", "flower.jpg"):
        datasets = import_optional(
            "sklearn.datasets",
            "kmeans",
            "--image sample (scikit-learn's bundled photo)",
            InputError,
            "or pass --image PATH",
        )
        image = datasets.load_sample_image("china.jpg" if name == "sample" else name)
    else:
        image = _read_image(Path(name))
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[2] < 3:
        raise InputError(
            f"{name} holds an image of shape {image.shape}, not colours: give an RGB picture (PNG or JPEG) to quantize"
        )
    if image.dtype == np.uint8:
        image = image / 255.0
    return np.ascontiguousarray(image[..., :3], dtype=np.float32)


def _read_image(path: Path) -> np.ndarray:
    """The pixels of an image file, or an :class:`InputError` naming it where it is no image Pillow reads."""
    from matplotlib import image as mpimg
    from PIL import Image

    if not path.is_file():
        raise InputError(f"no such image: {path}")
    try:
        return mpimg.imread(path)
    # (Pillow says "not an image" as an OSError, a SyntaxError (a damaged PNG), a ValueError, or a decompression bomb)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise InputError(
            f"{path} is not an image that can be read ({' '.join(str(err).split())[:120]}): give a PNG or JPEG "
            f"file, or --image sample"
        ) from None


def load_input(inputs: list[str], image: str | None, rank: int, world: int) -> tuple[np.ndarray, Any]:
    """This rank's samples and, for an image, the whole image (for the quantized output)."""
    if image:
        picture = load_sample_image(image)
        pixels = picture.reshape(-1, 3)
        return np.ascontiguousarray(pixels[rank_block(len(pixels), rank, world)]), picture
    if len(inputs) != 1:
        raise InputError("give one --input: a file (split by rank) or a pattern with {rank}, or --image")
    return _rank_part(inputs[0], rank, world, _read_array)[0], None


def load_weights(pattern: str | None, rank: int, world: int, n_rows: int) -> np.ndarray | None:
    """``--sample-weight``: one weight per row of this rank, from a .npy file split like ``--input`` or a {rank}
    pattern."""
    if pattern is None:
        return None

    def read(path: Path) -> np.ndarray:
        if not path.is_file():
            raise InputError(f"no such weights file: {path}")
        return np.load(path, mmap_mode="r")

    weights, path = _rank_part(pattern, rank, world, read)
    if weights.shape != (n_rows,):
        raise InputError(
            f"{path} holds weights of shape {weights.shape}, but this rank has {n_rows} samples: "
            "give one weight per sample, in the order of --input"
        )
    return weights.astype(np.float64, copy=False)


def initial_centers(init: str) -> str | np.ndarray:
    """``--init``: a method name, or a ``.npy`` file of starting centres."""
    if init.endswith(".npy"):
        return _read_array(Path(init)).copy()
    return init


def run(args: Any) -> list[dict]:
    """Fit as the CLI arguments say and write the outputs; returns the summaries (on every rank), one per ``--input``.

    Several inputs are fitted in turn by the same ranks, in one launch (one process start and one process group for
    all of them: ``dlscale bench kmeans`` measures strong and weak scaling so); each one's outputs go to ``OUT/<n>/``.
    With ``--warm-up`` each rank first fits its first rows once, untimed, so the timings hold no first-call costs
    (numba loading its compiled loops, the first collectives).
    """
    from dlscale.kmeans.backend import resolve_backend
    from dlscale.kmeans.daal import spmd_ranks
    from dlscale.runtime.threads import apply_threads

    inputs = [[path] for path in args.input] or [[]]  # (no --input: --image)
    if len(inputs) > 1 and args.sample_weight:
        raise InputError("--sample-weight goes with one --input (one weight per sample of that file)")
    threads = apply_threads()
    launcher = distributed.detect_launcher()
    backend = args.backend
    device = resolve_device(args.device or "auto", InputError)
    if backend == "auto":  # under MPI on CPUs daal4py joins the ranks itself; otherwise torch.distributed does
        backend = resolve_backend("auto", device)
    if backend == "torch":
        env = distributed.init(str(device) if args.device else "auto")
        rank, world = env.rank, env.world_size
    else:
        env = distributed.detect()
        rank, world = env.rank, spmd_ranks()
    job = {"backend": backend, "ranks": world, "launcher": launcher, "device": str(device)}
    summaries = []
    for number, source in enumerate(inputs):
        x, picture = load_input(source, args.image, rank, world)
        weights = load_weights(args.sample_weight, rank, world, len(x))
        if args.warm_up and number == 0:
            _fit(args, backend, x[: 10 * args.k], None if weights is None else weights[: 10 * args.k], max_iter=1)
        model, seconds = _fit(args, backend, x, weights)
        out = Path(args.out) / str(number) if len(inputs) > 1 else Path(args.out)
        summaries.append(_write_outputs(args, model, seconds, x, picture, out, rank, {**job}, threads.to_dict()))
    if backend == "torch":
        distributed.shutdown()
    return summaries


def _fit(args: Any, backend: str, x: np.ndarray, weights: np.ndarray | None, max_iter: int | None = None) -> tuple:
    """The fitted model and the fit's seconds."""
    from dlscale.kmeans.estimator import KMeans

    model = KMeans(
        args.k,
        init=initial_centers(args.init),
        max_iter=max_iter or args.max_iter,
        tol=args.tol,
        backend=backend,
        device=args.device,
        chunk_size=args.chunk_size,
        random_state=args.seed,
    )
    started = time.perf_counter()
    try:
        model.fit(x, sample_weight=weights)
    except ValueError as err:  # scikit-learn's checks (a bad --k, NaN in the data): one line, no traceback
        raise KMeansError(str(err)) from None
    return model, time.perf_counter() - started


def _write_outputs(
    args: Any,
    model: Any,
    seconds: float,
    x: np.ndarray,
    picture: Any,
    out: Path,
    rank: int,
    summary: dict,
    threads: dict,
) -> dict:
    """Each rank's labels; on rank 0 the centres, the quantized picture and ``summary.json``. The summary, the job's
    facts (``summary``) completed by the fit's."""
    world = summary["ranks"]
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / (f"labels_rank{rank}.npy" if world > 1 else "labels.npy"), model.labels_)
    summary.update(
        n_samples_rank0=int(len(x)),
        n_features=int(x.shape[1]),
        n_clusters=args.k,
        inertia=model.inertia_,
        n_iter=model.n_iter_,
        seconds=seconds,
        seconds_per_iteration=model.timings_["per_iteration"],
        init_seconds=model.timings_["init"],
        threads=threads,
    )
    if rank == 0:
        np.save(out / "centers.npy", model.cluster_centers_)
        if picture is not None:
            _write_quantized(model, picture, out)
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(
            f"K-Means ({summary['backend']}, {world} rank{'s' if world > 1 else ''}): k={args.k}, inertia "
            f"{model.inertia_:.6g}, {model.n_iter_} iterations, {summary['seconds_per_iteration'] * 1e3:.1f} ms "
            f"per iteration, {seconds:.2f} s in all; outputs in {out}/",
            flush=True,
        )
    return summary


def quantize(model: Any, picture: np.ndarray) -> np.ndarray:
    """The picture with every pixel replaced by its cluster's centre colour."""
    labels = model.predict(picture.reshape(-1, 3))
    return model.cluster_centers_[labels].reshape(picture.shape).clip(0, 1)


def _write_quantized(model: Any, picture: np.ndarray, out: Path) -> None:
    from matplotlib import image as mpimg

    from dlscale.reporting.plots import quantized_images

    quantized = quantize(model, picture)
    mpimg.imsave(out / "quantized.png", quantized)
    quantized_images(picture, {f"{model.n_clusters} colours": quantized}).savefig(out / "comparison.png", dpi=100)
