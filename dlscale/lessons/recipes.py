"""The plain-PyTorch recipe the lessons grow: where its stages live, their diffs, and their files.

Each lesson holds its stage of the recipe in a code cell tagged ``recipe`` whose first line names
the file (``# recipes/05_ddp.py``): the attendee reads, edits and runs it there. :func:`write_recipes`
writes each such cell to ``recipes/`` with the two lines that make it a script, so that the file
an attendee copies (and ``torchrun`` or ``srun`` starts) is the code the lesson ran; the tests
check that the files are up to date and that every stage trains as ``dlscale.train`` does.
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path

from dlscale.bench.parity import (  # (the twin is a measurement: bench/; the lessons and their door use it from here)
    RecipeError,
    recipe_path,
)

#: What a recipe file has after its cell: the command line (a kernel must not run it, its argv is Jupyter's).
SCRIPT_FOOTER = '\n\nif __name__ == "__main__":\n    main(**parse_args(main))\n'

def recipe_diff(old: str, new: str) -> str:
    """The unified diff from one stage's file to the next's: the lines a lesson adds to the recipe."""
    before, after = recipe_path(old).read_text().splitlines(), recipe_path(new).read_text().splitlines()
    return "\n".join(difflib.unified_diff(before, after, f"recipes/{old}", f"recipes/{new}", lineterm="", n=2))


#: How each kind of diff line is shown: added green, removed red, the hunk headers grey.
_DIFF_STYLES = (("+++", "font-weight:bold"), ("---", "font-weight:bold"), ("+", "background:#e6ffec"),
                ("-", "background:#ffebe9"), ("@@", "color:#57606a;background:#f6f8fa"))


def recipe_change_html(old: str, new: str) -> str:
    """:func:`recipe_diff` as HTML: one line per line of code, never wrapped (a long line scrolls), added lines
    green and removed ones red, then the whole new file behind a click."""
    import html

    rows = []
    for line in recipe_diff(old, new).splitlines():
        style = next((css for prefix, css in _DIFF_STYLES if line.startswith(prefix)), "")
        rows.append(f'<div style="{style}">{html.escape(line) or "&nbsp;"}</div>')
    box = "font-family:monospace;font-size:12px;line-height:1.35;white-space:pre;overflow-x:auto"
    whole = html.escape(recipe_path(new).read_text())
    return (f'<div class="dlscale-diff" style="{box}">{"".join(rows)}</div>'
            f'<details><summary>the whole of recipes/{new}</summary><div style="{box}">{whole}</div></details>')


def show_recipe_change(old: str, new: str) -> None:
    """Display the lines a stage changes (:func:`recipe_change_html`) in a notebook."""
    from IPython.display import HTML, display

    display(HTML(recipe_change_html(old, new)))


def recipe_cells(notebooks: Path) -> dict[str, str]:
    """{file name: cell source} for each cell tagged ``recipe`` in the notebooks of a folder."""
    found: dict[str, str] = {}
    if not Path(notebooks).is_dir():
        raise RecipeError(f"{notebooks} is not a folder of notebooks: run this in a clone of dlscale, or name the "
                          f"lessons' folder with --notebooks")
    for path in sorted(Path(notebooks).glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if "recipe" not in cell.get("metadata", {}).get("tags", []):
                continue
            source = "".join(cell["source"])
            first = source.splitlines()[0] if source else ""
            if not first.startswith("# recipes/") or not first.endswith(".py"):
                raise RecipeError(f"{path.name}: a cell tagged recipe must start with '# recipes/NAME.py', "
                                  f"not {first[:60]!r}")
            name = first.removeprefix("# recipes/")
            if not _PLAIN_NAME.fullmatch(name):  # (never a path: a recipe is written inside recipes/ only)
                raise RecipeError(f"{path.name}: a recipe cell must name a plain file in recipes/ "
                                  f"('# recipes/NAME.py', letters, digits, _ . -), not {first[:60]!r}")
            if name in found:
                raise RecipeError(f"{path.name}: recipes/{name} is written by two cells")
            found[name] = source
    if not found:
        raise RecipeError(f"{notebooks} holds no cell tagged recipe: name the lessons' folder with --notebooks")
    return found


_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.py")


def write_recipes(notebooks: Path, recipes: Path, check: bool = False) -> list[Path]:
    """Write each recipe cell of ``notebooks`` to ``recipes`` (cell + :data:`SCRIPT_FOOTER`); return the
    files that changed, or with ``check`` the files that would change (nothing is written)."""
    changed = []
    for name, source in recipe_cells(notebooks).items():
        path = Path(recipes) / name
        text = source.rstrip("\n") + "\n" + SCRIPT_FOOTER
        if not path.is_file() or path.read_text() != text:
            changed.append(path)
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    return changed


# -- the stage the attendee writes ----------------------------------------------------------------

#: What each lesson leaves for the attendee to write in its stage: (the first line's text, the last line's
#: text, what to write there), in the order of the file. Each gap is the statements from the first line
#: that holds the first text to the next line that holds the second; it becomes a TODO that raises.
GAPS: dict[str, list[tuple[str, str, str]]] = {
    "01_baseline.py": [
        ("return float((1 - ((y - pred)", "return float((1 - ((y - pred)",
         "return the validation R²: 1 - squared error / variance per target (sums over the rows), averaged "
         "over the targets, as a float"),
        ("optimizer.zero_grad()", "optimizer.step()",
         "one step: zero the gradients, loss = loss_fn(model(x), y), backward, the optimizer's step"),
    ],
    "02_data_loading.py": [
        ("loading = dict(", "loading = dict(",
         "loading = the DataLoader's settings: `workers` worker processes, pinned memory on a GPU only"),
        ("x, y = x.to(device, non_blocking=True)", "x, y = x.to(device, non_blocking=True)",
         "copy x and y to the device without making the host wait (the batch is pinned on a GPU)"),
    ],
    "03_mixed_precision.py": [
        ("dtype = {", "scaler = torch.amp.GradScaler(",
         "dtype = torch.bfloat16, torch.float16 or None (fp32) from `precision`; scaler = a GradScaler for "
         "device.type, enabled only for fp16"),
        ("with torch.autocast(", "scaler.update()",
         "forward and loss under torch.autocast(device.type, dtype), enabled unless fp32; backward of the scaled "
         "loss; unscale, clip the gradient norm to `clip`, step and update through the scaler"),
    ],
    "04_compile.py": [
        ("step_model = torch.compile(", "step_model = torch.compile(",
         "step_model = torch.compile(model), or the model itself when compile is False"),
        ('with marked("forward")', "scaler.update()",
         "stage 03's step, with its forward, backward and optimizer step each inside `with marked(name):` "
         '("forward", "backward", "optimizer step")'),
        ("window.step()", "window.step()", "tell the profiling window that a step ended"),
    ],
    "05_ddp.py": [
        ("dist.all_reduce(sums)", "dist.all_reduce(sums)", "add up every rank's sums (one all-reduce)"),
        ("dist.init_process_group(", "timedelta(minutes=5)",
         "join the process group: nccl on a GPU, gloo on a CPU, this rank of world_size, a 5-minute timeout"),
        ("sampler = DistributedSampler(", "sampler = DistributedSampler(",
         "sampler = this rank's share of train_set (DistributedSampler: world_size, rank, seed, drop_last=True)"),
        ("ddp_model = DistributedDataParallel(", "ddp_model = DistributedDataParallel(",
         "ddp_model = the model in DistributedDataParallel (device_ids=[device.index] on a GPU, None on a CPU)"),
        ("sampler.set_epoch(epoch)", "sampler.set_epoch(epoch)", "a new order every epoch: tell the sampler the epoch"),
    ],
    "06_horovod.py": [
        ("hvd.init()", "rank, world_size, local_rank = hvd.rank()",
         "join Horovod's job, then rank, world_size, local_rank from hvd"),
        ("optimizer = hvd.DistributedOptimizer(", "op=hvd.Average, backward_passes_per_step",
         "optimizer = AdamW(groups, lr=lr) in hvd.DistributedOptimizer: named parameters, op=hvd.Average, "
         "backward_passes_per_step=accumulate"),
        ("hvd.broadcast_parameters(", "hvd.broadcast_parameters(", "every rank starts from rank 0's weights"),
    ],
    "07_large_batch.py": [
        ("peak_lr = lr * {", "peak_lr = lr * {",
         "peak_lr = lr scaled by k = batch_size / base_batch: k (linear), sqrt(k) (sqrt) or 1 (none)"),
        ("if step < warmup_steps:", "return 0.5 * (1 + math.cos(",
         "the factor at `step`: from `start` up to 1 linearly over warmup_steps, then a cosine down to 0 at "
         "total_steps"),
        ("scheduler.step()", "scheduler.step()", "advance the schedule after each optimizer step"),
    ],
    "10_fsdp_tp.py": [
        ('with torch.device("meta"):', "model = ViTRegressor(",
         "model = the ViTRegressor built on the meta device (shapes only, no memory)"),
        ("if tp > 1:", "parallelize_module(block",
         'with tp > 1, split each block over mesh["tp"] with parallelize_module: attention.wq, wk, wv and mlp.w1 '
         "column-wise, attention.wo and mlp.w2 row-wise"),
        ("for block in model.blocks:", "if bf16 else MixedPrecisionPolicy())",
         'fully_shard each block over mesh["dp"] with MixedPrecisionPolicy(**bf16), then the whole model (its '
         "output in float32 under bf16)"),
        ("model.to_empty(", "model.init_weights(seed)",
         "allocate this rank's shards on the device, then initialize them from the seed"),
        ("dcp.save(", "checkpoint_id=os.path.join(",
         'save {"model", "optimizer", "epoch": epoch + 1} with dcp.save, in os.path.join(checkpoint, f"epoch-{...}")'),
    ],
}


def gapped_recipe(name: str, source: str) -> str:
    """The source of stage ``name`` with each of its :data:`GAPS` replaced by a TODO that raises
    ``NotImplementedError("TODO 05.b: ...")`` (indented as the first line it replaces): what the attendee fills in."""
    lines, start = source.splitlines(keepends=True), 0
    for letter, (first, last, hint) in zip("abcdefgh", GAPS[name]):
        label = f"TODO {name[:2]}.{letter}: {hint}"
        begin = next((i for i in range(start, len(lines)) if first in lines[i]), None)
        end = next((i for i in range(begin, len(lines)) if last in lines[i]), None) if begin is not None else None
        if end is None:
            raise RecipeError(f"recipes/{name}: the gap {label!r} needs a line with {first!r}, then one with {last!r}")
        indent = lines[begin][:len(lines[begin]) - len(lines[begin].lstrip())]
        stub = [f"{indent}# {label}\n", f"{indent}raise NotImplementedError({json.dumps(label, ensure_ascii=False)})\n"]
        lines[begin:end + 1] = stub
        start = begin + len(stub)
    text = "".join(lines)
    compile(text, f"recipes/{name} with gaps", "exec")  # a gap must cut whole statements
    return text


def run_stage(path: str, **arguments) -> dict:
    """``main(**arguments)`` of a stage's file (the one an attendee wrote in a lesson, say), on an engine too:
    as :func:`~dlscale.jobs.notebook_engines.run_file`, with ``recipes/`` importable (this module puts it on
    the path where it is imported), so that the file finds ``training_tools`` wherever it was written."""
    from dlscale.jobs.notebook_engines import run_file

    return run_file(path, **arguments)
