"""A held-out set of the answers attendees write, right and wrong, for the stages of lessons 01-05, 07 and 13.

Written from the lessons' text and the recipes alone, by a developer who did not read the probes: each answer is our
stage with one realistic change (``(old, new)`` replacements of whole lines, each found once). ``scripts/check_heldout.py``
runs them through the lessons' own check; the stage records' own answers (``dlscale/lessons/stages``) are another
set, tried by the tests. Keep the two apart: an answer added here is not copied into a record.
"""

STAGE = {
    "01": "01_baseline.py",
    "02": "02_data_loading.py",
    "03": "03_mixed_precision.py",
    "04": "04_compile.py",
    "05": "05_ddp.py",
    "07": "07_large_batch.py",
    "13": "13_pipeline.py",
}
V = []


def v(name, expect, where, what, *subs):
    V.append((name, expect, where, what, subs))


# ---------------------------------------------------------------- 01.a
R01A = "    return float((1 - ((y - pred) ** 2).sum(0) / ((y - y.mean(0)) ** 2).sum(0)).mean())\n"
v(
    "01_a_wrong_1",
    "wrong",
    "inside",
    "R² pooled over all targets (sums over every element, one global mean) instead of per target then averaged",
    (R01A, "    return float(1 - ((y - pred) ** 2).sum() / ((y - y.mean()) ** 2).sum())\n"),
)
v(
    "01_a_wrong_2",
    "wrong",
    "inside",
    "sums over dim 1 (per sample, across targets) instead of over the rows, then the mean",
    (R01A, "    return float((1 - ((y - pred) ** 2).sum(1) / ((y - y.mean(1, keepdim=True)) ** 2).sum(1)).mean())\n"),
)
v(
    "01_a_wrong_3",
    "wrong",
    "inside",
    "returns the unexplained share SS_res / SS_tot (forgot the `1 -`)",
    (R01A, "    return float((((y - pred) ** 2).sum(0) / ((y - y.mean(0)) ** 2).sum(0)).mean())\n"),
)
v(
    "01_a_wrong_4",
    "wrong",
    "inside",
    "SS_tot about zero, not about the target mean (y ** 2 instead of (y - y.mean(0)) ** 2)",
    (R01A, "    return float((1 - ((y - pred) ** 2).sum(0) / (y ** 2).sum(0)).mean())\n"),
)
v(
    "01_a_wrong_5",
    "wrong",
    "inside",
    "1 - MSE / y.var(0): var's default Bessel correction (n-1) makes the ratio n-1/n too small",
    (R01A, "    return float((1 - ((y - pred) ** 2).mean(0) / y.var(0)).mean())\n"),
)
v(
    "01_a_right_1",
    "right",
    "inside",
    "1 - MSE / population variance (var with correction=0), per target, then mean",
    (R01A, "    return float((1 - ((pred - y) ** 2).mean(dim=0) / y.var(dim=0, correction=0)).mean())\n"),
)
v(
    "01_a_right_2",
    "right",
    "inside",
    "sklearn.metrics.r2_score (multioutput uniform_average) on numpy arrays",
    (
        R01A,
        "    from sklearn.metrics import r2_score as sklearn_r2\n"
        '    return float(sklearn_r2(y.numpy(), pred.numpy(), multioutput="uniform_average"))\n',
    ),
)
v(
    "01_a_right_3",
    "right",
    "inside",
    "explicit loop over target columns, per-target R² collected in a list, python mean",
    (
        R01A,
        "    scores = []\n"
        "    for j in range(y.shape[1]):\n"
        "        ss_res = torch.sum((y[:, j] - pred[:, j]) ** 2)\n"
        "        ss_tot = torch.sum((y[:, j] - torch.mean(y[:, j])) ** 2)\n"
        "        scores.append((1 - ss_res / ss_tot).item())\n"
        "    return sum(scores) / len(scores)\n",
    ),
)

# ---------------------------------------------------------------- 01.b
S01B = (
    "            optimizer.zero_grad()\n"
    "            loss = loss_fn(model(x), y)\n"
    "            loss.backward()\n"
    "            optimizer.step()\n"
)
v(
    "01_b_wrong_1",
    "wrong",
    "inside",
    "gradients never cleared: no zero_grad, so they accumulate over the epoch",
    (S01B, "            loss = loss_fn(model(x), y)\n            loss.backward()\n            optimizer.step()\n"),
)
v(
    "01_b_wrong_2",
    "wrong",
    "inside",
    "zero_grad between backward and step: the step sees zero gradients",
    (
        S01B,
        "            loss = loss_fn(model(x), y)\n            loss.backward()\n            optimizer.zero_grad()\n            optimizer.step()\n",
    ),
)
v(
    "01_b_wrong_3",
    "wrong",
    "inside",
    "optimizer.step() before loss.backward(): each step uses the previous batch's gradients",
    (
        S01B,
        "            optimizer.zero_grad()\n            loss = loss_fn(model(x), y)\n            optimizer.step()\n            loss.backward()\n",
    ),
)
v(
    "01_b_wrong_4",
    "wrong",
    "inside",
    "optimizer.step() forgotten: gradients computed but weights never move",
    (S01B, "            optimizer.zero_grad()\n            loss = loss_fn(model(x), y)\n            loss.backward()\n"),
)
v(
    "01_b_wrong_5",
    "wrong",
    "outside",
    "zero_grad once per epoch, before the batch loop, instead of per step (gradients accumulate within the epoch)",
    (S01B, "            loss = loss_fn(model(x), y)\n            loss.backward()\n            optimizer.step()\n"),
    (
        "        progress.begin()\n        for x, y in DataLoader",
        "        progress.begin()\n        optimizer.zero_grad()\n        for x, y in DataLoader",
    ),
)
v(
    "01_b_right_1",
    "right",
    "inside",
    "model.zero_grad() instead of optimizer.zero_grad()",
    (
        S01B,
        "            model.zero_grad()\n            loss = loss_fn(model(x), y)\n            loss.backward()\n            optimizer.step()\n",
    ),
)
v(
    "01_b_right_2",
    "right",
    "inside",
    "grads set to None by hand (for p in model.parameters(): p.grad = None); loss_fn(y, pred) argument order (MSE symmetric)",
    (
        S01B,
        "            for p in model.parameters():\n                p.grad = None\n"
        "            pred = model(x)\n            loss = loss_fn(y, pred)\n            loss.backward()\n            optimizer.step()\n",
    ),
)
v(
    "01_b_right_3",
    "right",
    "inside",
    "clear the gradients after the step (backward, step, zero_grad) instead of before the forward",
    (
        S01B,
        "            loss = loss_fn(model(x), y)\n            loss.backward()\n            optimizer.step()\n            optimizer.zero_grad(set_to_none=True)\n",
    ),
)

# ---------------------------------------------------------------- 02.a
L02A = '    loading = dict(num_workers=workers, pin_memory=device.type == "cuda")\n'
v(
    "02_a_wrong_1",
    "wrong",
    "inside",
    "pin_memory=True always, also on a CPU run",
    (L02A, "    loading = dict(num_workers=workers, pin_memory=True)\n"),
)
v(
    "02_a_wrong_2",
    "wrong",
    "inside",
    "workers ignored: num_workers hard-coded to 2",
    (L02A, '    loading = dict(num_workers=2, pin_memory=device.type == "cuda")\n'),
)
v(
    "02_a_wrong_3",
    "wrong",
    "inside",
    "pin_memory=torch.cuda.is_available(): pins on a --device cpu run on a GPU host (same as ours on a CPU-only host)",
    (L02A, "    loading = dict(num_workers=workers, pin_memory=torch.cuda.is_available())\n"),
)
v(
    "02_a_wrong_4",
    "wrong",
    "inside",
    "num_workers=os.cpu_count() (workers argument ignored)",
    (L02A, '    import os\n    loading = dict(num_workers=os.cpu_count() or 0, pin_memory=device.type == "cuda")\n'),
)
v(
    "02_a_wrong_5",
    "wrong",
    "inside",
    "pin_memory left out: no page-locked memory on a GPU (non_blocking copies stay synchronous)",
    (L02A, "    loading = dict(num_workers=workers)\n"),
)
v(
    "02_a_right_1",
    "right",
    "inside",
    "dict literal {'num_workers': ..., 'pin_memory': ...}",
    (L02A, '    loading = {"num_workers": workers, "pin_memory": device.type == "cuda"}\n'),
)
v(
    "02_a_right_2",
    "right",
    "inside",
    "num_workers only, then pin_memory=True added in an if for a CUDA device (default False otherwise)",
    (
        L02A,
        '    loading = dict(num_workers=workers)\n    if device.type == "cuda":\n        loading["pin_memory"] = True\n',
    ),
)
v(
    "02_a_right_3",
    "right",
    "inside",
    "pin_memory=device.type != 'cpu' (cuda or cpu are the only devices here), separate variable",
    (L02A, '    on_gpu = device.type != "cpu"\n    loading = dict(pin_memory=on_gpu, num_workers=int(workers))\n'),
)

# ---------------------------------------------------------------- 02.b
L02B = "            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)\n"
v(
    "02_b_wrong_1",
    "wrong",
    "inside",
    "plain blocking copies: .to(device) without non_blocking",
    (L02B, "            x, y = x.to(device), y.to(device)\n"),
)
v(
    "02_b_wrong_2",
    "wrong",
    "inside",
    ".to() results not assigned (to is not in-place): the batch stays on the host",
    (L02B, "            x.to(device, non_blocking=True)\n            y.to(device, non_blocking=True)\n"),
)
v(
    "02_b_wrong_3",
    "wrong",
    "inside",
    "only the inputs moved; targets left on the host",
    (L02B, "            x = x.to(device, non_blocking=True)\n"),
)
v(
    "02_b_wrong_4",
    "wrong",
    "inside",
    "non_blocking only on the targets, the (large) input copy blocking",
    (L02B, "            x, y = x.to(device), y.to(device, non_blocking=True)\n"),
)
v(
    "02_b_right_1",
    "right",
    "inside",
    "two statements with keyword device=",
    (
        L02B,
        "            x = x.to(device=device, non_blocking=True)\n            y = y.to(device=device, non_blocking=True)\n",
    ),
)
v(
    "02_b_right_2",
    "right",
    "inside",
    "generator over (x, y) unpacked",
    (L02B, "            x, y = (t.to(device, non_blocking=True) for t in (x, y))\n"),
)
v(
    "02_b_right_3",
    "right",
    "inside",
    ".cuda(device, non_blocking=True) on a GPU, the batch as is on the CPU (already there)",
    (
        L02B,
        '            if device.type == "cuda":\n'
        "                x, y = x.cuda(device, non_blocking=True), y.cuda(device, non_blocking=True)\n",
    ),
)

# ---------------------------------------------------------------- 03.a
L03A_D = '    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[precision]\n'
L03A_S = '    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")\n'
v(
    "03_a_wrong_1",
    "wrong",
    "inside",
    "scaler enabled for bf16 too (enabled=precision != 'fp32')",
    (L03A_S, '    scaler = torch.amp.GradScaler(device.type, enabled=precision != "fp32")\n'),
)
v(
    "03_a_wrong_2",
    "wrong",
    "inside",
    "dtype map swapped: bf16 -> float16, fp16 -> bfloat16",
    (L03A_D, '    dtype = {"bf16": torch.float16, "fp16": torch.bfloat16, "fp32": None}[precision]\n'),
)
v(
    "03_a_wrong_3",
    "wrong",
    "inside",
    "scaler hard-coded for 'cuda' (tutorial copy): on a CPU device it disables itself, fp16 runs unscaled",
    (L03A_S, '    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")\n'),
)
v(
    "03_a_wrong_4",
    "wrong",
    "inside",
    "GradScaler without enabled=: scales (and may skip steps) for bf16 and fp32 as well",
    (L03A_S, "    scaler = torch.amp.GradScaler(device.type)\n"),
)
v(
    "03_a_wrong_5",
    "wrong",
    "inside",
    "old torch.cuda.amp.GradScaler API: CUDA-only, silently disabled on a CPU fp16 run",
    (L03A_S, '    scaler = torch.cuda.amp.GradScaler(enabled=precision == "fp16")\n'),
)
v(
    "03_a_right_1",
    "right",
    "inside",
    "if/elif chain for dtype; enabled=dtype is torch.float16",
    (
        L03A_D,
        '    if precision == "bf16":\n        dtype = torch.bfloat16\n    elif precision == "fp16":\n        dtype = torch.float16\n    else:\n        dtype = None\n',
    ),
    (L03A_S, "    scaler = torch.amp.GradScaler(device=device.type, enabled=dtype is torch.float16)\n"),
)
v(
    "03_a_right_2",
    "right",
    "inside",
    "dict(bf16=..., fp16=...).get(precision) (None for fp32); scaler keyword device=, enabled=(dtype == torch.float16)",
    (L03A_D, "    dtype = dict(bf16=torch.bfloat16, fp16=torch.float16).get(precision)\n"),
    (L03A_S, "    scaler = torch.amp.GradScaler(device=str(device.type), enabled=(dtype == torch.float16))\n"),
)
v(
    "03_a_right_3",
    "right",
    "inside",
    "getattr(torch, name) for the dtype; enabled computed once as a bool",
    (
        L03A_D,
        '    dtype = None if precision == "fp32" else getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[precision])\n',
    ),
    (
        L03A_S,
        '    use_scaler = precision == "fp16"\n    scaler = torch.amp.GradScaler(device.type, enabled=use_scaler)\n',
    ),
)

# ---------------------------------------------------------------- 03.b
A03 = "            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):\n"
F03 = "                loss = loss_fn(model(x), y)  # matmuls and convolutions in dtype, the loss in fp32\n"
B03 = "            scaler.scale(loss).backward()\n"
U03 = "            scaler.unscale_(optimizer)  # the true gradients, before clipping compares them with `clip`\n"
C03 = "            nn.utils.clip_grad_norm_(model.parameters(), clip)\n"
S03 = "            scaler.step(optimizer)  # skipped when a gradient overflowed (and the scale is lowered)\n"
P03 = "            scaler.update()\n"
v(
    "03_b_wrong_1",
    "wrong",
    "inside",
    "clipping the scaled gradients: no scaler.unscale_ before clip_grad_norm_",
    (U03, ""),
)
v(
    "03_b_wrong_2",
    "wrong",
    "inside",
    "optimizer.step() instead of scaler.step(optimizer): overflowed (inf) steps are not skipped",
    (S03, "            optimizer.step()\n"),
)
v(
    "03_b_wrong_3",
    "wrong",
    "inside",
    "autocast dtype hard-coded to bfloat16 (ignores dtype: fp16 runs in bf16)",
    (A03, "            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype is not None):\n"),
)
v(
    "03_b_wrong_4",
    "wrong",
    "inside",
    "backward of the unscaled loss while unscale_ still divides by the scale (gradients 1/scale too small)",
    (B03, "            loss.backward()\n"),
)
v(
    "03_b_wrong_5",
    "wrong",
    "inside",
    "clip after the optimizer step (clipping has no effect on the update)",
    (C03, ""),
    (P03, "            scaler.update()\n            nn.utils.clip_grad_norm_(model.parameters(), clip)\n"),
)
v(
    "03_b_wrong_6",
    "wrong",
    "inside",
    "autocast always enabled (no enabled=): fp32 runs in the device's default autocast dtype",
    (A03, "            with torch.autocast(device.type, dtype=dtype):\n"),
)
v("03_b_wrong_7", "wrong", "inside", "scaler.update() forgotten: the scale never changes after an overflow", (P03, ""))
v(
    "03_b_right_1",
    "right",
    "inside",
    "nullcontext for fp32 (import contextlib added at the top), autocast(device_type=..., dtype=...) otherwise",
    ("from typing import Literal\n", "import contextlib\nfrom typing import Literal\n"),
    (
        A03,
        "            amp = (torch.autocast(device_type=device.type, dtype=dtype) if dtype is not None\n"
        "                   else contextlib.nullcontext())\n"
        "            with amp:\n",
    ),
)
v(
    "03_b_right_2",
    "right",
    "inside",
    "unscale_ only when the scaler is enabled; clip over the optimizer's param groups with max_norm=",
    (U03, "            if scaler.is_enabled():\n                scaler.unscale_(optimizer)\n"),
    (
        C03,
        '            torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], max_norm=clip)\n',
    ),
)
v(
    "03_b_right_3",
    "right",
    "inside",
    "prediction and loss on separate lines inside autocast; scaled loss kept in a variable",
    (F03, "                pred = model(x)\n                loss = loss_fn(pred, y)\n"),
    (B03, "            scaled = scaler.scale(loss)\n            scaled.backward()\n"),
)

# ---------------------------------------------------------------- 04.a
L04A = "    step_model = torch.compile(model) if compile else model\n"
v(
    "04_a_wrong_1",
    "wrong",
    "inside",
    "torch.compile(model) called but its result thrown away (step_model is the plain model)",
    (L04A, "    step_model = model\n    if compile:\n        torch.compile(model)\n"),
)
v(
    "04_a_wrong_2",
    "wrong",
    "inside",
    "compiled regardless of the compile switch (--no-compile still compiles)",
    (L04A, "    step_model = torch.compile(model)\n"),
)
v(
    "04_a_wrong_3",
    "wrong",
    "inside",
    "model rebound to the compiled wrapper: validation runs compiled in eval mode and checkpoints get _orig_mod. keys",
    (L04A, "    if compile:\n        model = torch.compile(model)\n    step_model = model\n"),
)
v(
    "04_a_wrong_4",
    "wrong",
    "inside",
    "torch.jit.script instead of PyTorch 2's torch.compile (TorchScript, no Inductor fused kernels)",
    (L04A, "    step_model = torch.jit.script(model) if compile else model\n"),
)
v(
    "04_a_wrong_5",
    "wrong",
    "inside",
    "torch.compile(backend='eager'): traced by Dynamo but no fused kernels generated",
    (L04A, '    step_model = torch.compile(model, backend="eager") if compile else model\n'),
)
v(
    "04_a_right_1",
    "right",
    "inside",
    "if/else block, torch.compile(model, mode='default', fullgraph=True)",
    (
        L04A,
        '    if compile:\n        step_model = torch.compile(model, mode="default", fullgraph=True)\n    else:\n        step_model = model\n',
    ),
)
v(
    "04_a_right_2",
    "right",
    "inside",
    "torch.compile(model, backend='inductor', dynamic=False) in a conditional expression",
    (L04A, '    step_model = model if not compile else torch.compile(model, backend="inductor", dynamic=False)\n'),
)
v(
    "04_a_right_3",
    "right",
    "inside",
    "step_model = plain model first, replaced by torch.compile(model) when the switch is on",
    (L04A, "    step_model = model\n    if compile:\n        step_model = torch.compile(step_model)\n"),
)

# ---------------------------------------------------------------- 04.b
F04 = (
    '            with marked("forward"), torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):\n'
    "                loss = loss_fn(step_model(x), y)  # matmuls and convolutions in dtype, the loss in fp32\n"
)
B04 = '            with marked("backward"):\n                scaler.scale(loss).backward()\n'
O04 = (
    '            with marked("optimizer step"):\n'
    "                scaler.step(optimizer)  # skipped when a gradient overflowed (and the scale is lowered)\n"
)
U04 = "            scaler.unscale_(optimizer)  # the true gradients, before clipping compares them with `clip`\n"
C04 = "            nn.utils.clip_grad_norm_(model.parameters(), clip)\n"
W04 = "            progress.step(loss)\n            window.step()\n"
v(
    "04_b_wrong_1",
    "wrong",
    "inside",
    "range names swapped: 'backward' around the forward pass, 'forward' around the backward",
    (F04, F04.replace('marked("forward")', 'marked("backward")')),
    (B04, B04.replace('marked("backward")', 'marked("forward")')),
)
v(
    "04_b_wrong_2",
    "wrong",
    "inside",
    "forward calls model(x), not step_model(x): the compiled model is never used",
    (F04, F04.replace("step_model(x)", "model(x)")),
)
v(
    "04_b_wrong_3",
    "wrong",
    "outside",
    "window.step() once per epoch (after the batch loop) instead of after each step",
    (W04, "            progress.step(loss)\n"),
    ("        progress.step()\n        r2.append", "        progress.step()\n        window.step()\n        r2.append"),
)
v(
    "04_b_wrong_4",
    "wrong",
    "inside",
    "range named 'optimizer_step' (underscore) instead of 'optimizer step'",
    (O04, O04.replace('"optimizer step"', '"optimizer_step"')),
)
v(
    "04_b_wrong_5",
    "wrong",
    "inside",
    "loss computed outside the 'forward' range (only the model call is marked)",
    (
        F04,
        '            with marked("forward"), torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):\n'
        "                out = step_model(x)  # matmuls and convolutions in dtype\n"
        "            loss = loss_fn(out, y)\n",
    ),
)
v(
    "04_b_wrong_6",
    "wrong",
    "inside",
    "stage 03's gradient clipping dropped when rewriting the step with ranges",
    (C04, ""),
)
v(
    "04_b_right_1",
    "right",
    "inside",
    "nested with-blocks, autocast outside and marked('forward') inside; window.step() before progress.step(loss)",
    (
        F04,
        "            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):\n"
        '                with marked("forward"):\n'
        "                    loss = loss_fn(step_model(x), y)\n",
    ),
    (W04, "            window.step()\n            progress.step(loss)\n"),
)
v(
    "04_b_right_2",
    "right",
    "inside",
    "unscale_, clipping and scaler.update() inside the 'optimizer step' range too",
    (
        U04 + C04 + O04 + "            scaler.update()\n",
        '            with marked("optimizer step"):\n'
        "                scaler.unscale_(optimizer)\n"
        "                nn.utils.clip_grad_norm_(model.parameters(), clip)\n"
        "                scaler.step(optimizer)\n"
        "                scaler.update()\n",
    ),
)
v(
    "04_b_right_3",
    "right",
    "inside",
    "prediction kept in a variable inside the forward range; scaled loss assigned then backward",
    (
        F04,
        '            with marked("forward"), torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):\n'
        "                pred = step_model(x)\n                loss = loss_fn(pred, y)\n",
    ),
    (
        B04,
        '            with marked("backward"):\n                scaled_loss = scaler.scale(loss)\n                scaled_loss.backward()\n',
    ),
)

# ---------------------------------------------------------------- 05.a
L05A = "    dist.all_reduce(sums)  # (a mean of the ranks' R² would be wrong: R² is a ratio of sums)\n"
RET05 = "    count, total, squares, errors = sums\n    return float((1 - errors / (squares - total * total / count)).mean())\n"
v(
    "05_a_wrong_1",
    "wrong",
    "inside",
    "dist.reduce(sums, dst=0): only rank 0 gets the totals, other ranks return their own share's R²",
    (L05A, "    dist.reduce(sums, dst=0)\n"),
)
v(
    "05_a_wrong_2",
    "wrong",
    "inside",
    "all_reduce of a copy whose result is dropped (sums stays this rank's)",
    (L05A, "    dist.all_reduce(sums.clone())\n"),
)
v(
    "05_a_wrong_3",
    "wrong",
    "inside",
    "each rank's R² averaged over the ranks (all_reduce of the R², / world size) instead of summing the sums",
    (
        L05A + RET05,
        "    count, total, squares, errors = sums\n"
        "    local = (1 - errors / (squares - total * total / count)).mean()\n"
        "    dist.all_reduce(local)\n"
        "    return float(local / dist.get_world_size())\n",
    ),
)
v(
    "05_a_wrong_4",
    "wrong",
    "inside",
    "only the squared errors all-reduced (sums[3]); count, totals and squares stay local",
    (L05A, "    dist.all_reduce(sums[3])\n"),
)
v(
    "05_a_wrong_5",
    "wrong",
    "inside",
    "all_reduce with ReduceOp.MAX instead of SUM",
    (L05A, "    dist.all_reduce(sums, op=dist.ReduceOp.MAX)\n"),
)
v(
    "05_a_right_1",
    "right",
    "inside",
    "explicit op=dist.ReduceOp.SUM, group=WORLD, async_op=True then .wait()",
    (L05A, "    dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=dist.group.WORLD, async_op=True).wait()\n"),
)
v(
    "05_a_right_2",
    "right",
    "inside",
    "all_gather of every rank's sums, then their sum",
    (
        L05A,
        "    gathered = [torch.zeros_like(sums) for _ in range(dist.get_world_size())]\n"
        "    dist.all_gather(gathered, sums)\n"
        "    sums = torch.stack(gathered).sum(0)\n",
    ),
)
v(
    "05_a_right_3",
    "right",
    "inside",
    "torch.distributed.all_reduce spelled in full, op=SUM given by name",
    (L05A, "    torch.distributed.all_reduce(sums, op=torch.distributed.ReduceOp.SUM)\n"),
)

# ---------------------------------------------------------------- 05.b
L05B = (
    '    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world_size,\n'
    '                            timeout=datetime.timedelta(minutes=5), device_id=device if device.type == "cuda" else None)\n'
)
v(
    "05_b_wrong_1",
    "wrong",
    "inside",
    "backend 'nccl' for every device (fails on a CPU run)",
    (
        L05B,
        '    dist.init_process_group("nccl", rank=rank, world_size=world_size, timeout=datetime.timedelta(minutes=5))\n',
    ),
)
v(
    "05_b_wrong_2",
    "wrong",
    "inside",
    "no timeout: the default (10 or 30 minutes), not 5",
    (
        L05B,
        '    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world_size)\n',
    ),
)
v(
    "05_b_wrong_3",
    "wrong",
    "inside",
    "timeout=timedelta(seconds=5) instead of 5 minutes",
    (
        L05B,
        '    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world_size,\n'
        "                            timeout=datetime.timedelta(seconds=5))\n",
    ),
)
v(
    "05_b_wrong_4",
    "wrong",
    "inside",
    "rank=local_rank (the rank on this node; wrong on more than one node)",
    (
        L05B,
        '    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=local_rank, world_size=world_size,\n'
        "                            timeout=datetime.timedelta(minutes=5))\n",
    ),
)
v(
    "05_b_wrong_5",
    "wrong",
    "inside",
    "backend 'gloo' for every device (GPU gradients all-reduced by gloo, not NCCL)",
    (
        L05B,
        '    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(minutes=5))\n',
    ),
)
v(
    "05_b_right_1",
    "right",
    "inside",
    "keyword backend=, init_method='env://', timeout as timedelta(seconds=300), no device_id",
    (
        L05B,
        '    dist.init_process_group(backend="gloo" if device.type == "cpu" else "nccl", init_method="env://",\n'
        "                            rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=300))\n",
    ),
)
v(
    "05_b_right_2",
    "right",
    "inside",
    "dist.Backend constants chosen in an if/else, timedelta(minutes=5)",
    (
        L05B,
        '    if device.type == "cuda":\n        backend = dist.Backend.NCCL\n    else:\n        backend = dist.Backend.GLOO\n'
        "    dist.init_process_group(backend, world_size=world_size, rank=rank, timeout=datetime.timedelta(minutes=5))\n",
    ),
)
v(
    "05_b_right_3",
    "right",
    "inside",
    "timedelta imported by name; device_id passed only on a GPU via kwargs",
    (
        L05B,
        "    from datetime import timedelta\n"
        '    extra = {"device_id": device} if device.type == "cuda" else {}\n'
        '    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", rank=rank,\n'
        "                            world_size=world_size, timeout=timedelta(minutes=5), **extra)\n",
    ),
)

# ---------------------------------------------------------------- 05.c
L05C = "    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, seed=seed, drop_last=True)\n"
v(
    "05_c_wrong_1",
    "wrong",
    "inside",
    "sampler without seed= (always the default seed 0, --seed ignored)",
    (L05C, "    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, drop_last=True)\n"),
)
v(
    "05_c_wrong_2",
    "wrong",
    "inside",
    "drop_last left at False: the sampler pads with repeated samples instead of leaving the remainder out",
    (L05C, "    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, seed=seed)\n"),
)
v(
    "05_c_wrong_3",
    "wrong",
    "inside",
    "shuffle=False: the same fixed order every epoch",
    (
        L05C,
        "    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=False, seed=seed, drop_last=True)\n",
    ),
)
v(
    "05_c_wrong_4",
    "wrong",
    "inside",
    "seed=seed + rank: each rank a different permutation, so the shares overlap",
    (
        L05C,
        "    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, seed=seed + rank, drop_last=True)\n",
    ),
)
v(
    "05_c_wrong_5",
    "wrong",
    "inside",
    "rank=local_rank: ranks on different nodes take the same share",
    (
        L05C,
        "    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=local_rank, seed=seed, drop_last=True)\n",
    ),
)
v(
    "05_c_right_1",
    "right",
    "inside",
    "num_replicas and rank left to their defaults (taken from the initialized process group)",
    (L05C, "    sampler = DistributedSampler(train_set, seed=seed, drop_last=True)\n"),
)
v(
    "05_c_right_2",
    "right",
    "inside",
    "all keywords, shuffle=True explicit, dist.get_world_size()/get_rank()",
    (
        L05C,
        "    sampler = DistributedSampler(dataset=train_set, num_replicas=dist.get_world_size(), rank=dist.get_rank(),\n"
        "                                 shuffle=True, seed=seed, drop_last=True)\n",
    ),
)
v(
    "05_c_right_3",
    "right",
    "inside",
    "positional num_replicas, rank, shuffle, seed, drop_last",
    (L05C, "    sampler = DistributedSampler(train_set, world_size, rank, True, seed, True)\n"),
)

# ---------------------------------------------------------------- 05.d
L05D = '    ddp_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)\n'
L05D_C = "    step_model = torch.compile(ddp_model) if compile else ddp_model\n"
v(
    "05_d_wrong_1",
    "wrong",
    "inside",
    "device_ids=[local_rank] always (tutorial copy): a CPU module refuses device_ids, and a task bound to one GPU has index 0",
    (L05D, "    ddp_model = DistributedDataParallel(model, device_ids=[local_rank])\n"),
)
v(
    "05_d_wrong_2",
    "wrong",
    "inside",
    "nn.DataParallel (single-process, multi-GPU) instead of DistributedDataParallel: no averaging over ranks",
    (L05D, "    ddp_model = nn.DataParallel(model)\n"),
)
v(
    "05_d_wrong_3",
    "wrong",
    "outside",
    "the uncompiled branch steps the plain model, not ddp_model: no gradient averaging with --no-compile",
    (L05D_C, "    step_model = torch.compile(ddp_model) if compile else model\n"),
)
v(
    "05_d_wrong_4",
    "wrong",
    "inside",
    "ddp_model = model: the wrap forgotten, gradients never averaged (DistributedSampler alone)",
    (L05D, "    ddp_model = model  # the sampler already splits the data\n"),
    (
        "                with ddp_model.no_sync() if i < accumulate - 1 else contextlib.nullcontext():\n",
        "                with contextlib.nullcontext():\n",
    ),
)
v(
    "05_d_right_1",
    "right",
    "inside",
    "device_ids=[device] (a torch.device) on a GPU, output_device too; None on a CPU",
    (
        L05D,
        '    on_gpu = device.type == "cuda"\n'
        "    ddp_model = DistributedDataParallel(model, device_ids=[device] if on_gpu else None,\n"
        "                                        output_device=device if on_gpu else None)\n",
    ),
)
v(
    "05_d_right_2",
    "right",
    "inside",
    "if/else; torch.cuda.current_device() (set by pick_device); gradient_as_bucket_view=True",
    (
        L05D,
        '    if device.type == "cuda":\n'
        "        ddp_model = DistributedDataParallel(model, device_ids=[torch.cuda.current_device()], gradient_as_bucket_view=True)\n"
        "    else:\n"
        "        ddp_model = DistributedDataParallel(model, gradient_as_bucket_view=True)\n",
    ),
)
v(
    "05_d_right_3",
    "right",
    "inside",
    "keyword module=, device_ids=None spelled for 'cpu' first, bucket_cap_mb=25 (the default)",
    (
        L05D,
        '    ddp_model = DistributedDataParallel(module=model, device_ids=None if device.type == "cpu" else [device.index],\n'
        "                                        bucket_cap_mb=25)\n",
    ),
)

# ---------------------------------------------------------------- 05.e
L05E = "        sampler.set_epoch(epoch)  # a new order every epoch (without it every epoch repeats the first one's)\n"
v(
    "05_e_wrong_1",
    "wrong",
    "inside",
    "sampler.set_epoch(0): every epoch repeats the first order",
    (L05E, "        sampler.set_epoch(0)\n"),
)
v("05_e_wrong_2", "wrong", "inside", "set_epoch missing: every epoch the same order", (L05E, ""))
v(
    "05_e_wrong_3",
    "wrong",
    "inside",
    "set_epoch(epoch + rank): a different permutation on each rank, shares overlap",
    (L05E, "        sampler.set_epoch(epoch + rank)\n"),
)
v(
    "05_e_wrong_4",
    "wrong",
    "inside",
    "torch.manual_seed(seed + epoch) instead of set_epoch (DistributedSampler ignores the global RNG)",
    (L05E, "        torch.manual_seed(seed + epoch)\n"),
)
v(
    "05_e_wrong_5",
    "wrong",
    "outside",
    "set_epoch inside the batch loop: the loader's indices were drawn at its first batch, so each epoch uses the previous epoch's order",
    (L05E, ""),
    (
        "            x = x.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)\n",
        "            sampler.set_epoch(epoch)\n            x = x.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)\n",
    ),
)
v(
    "05_e_wrong_6",
    "wrong",
    "inside",
    "sampler.epoch += 1 at each epoch start: the first epoch uses epoch 1's order, and a resumed run counts from 1 again",
    (L05E, "        sampler.epoch += 1\n"),
)
v(
    "05_e_right_1",
    "right",
    "outside",
    "set_epoch(epoch) after progress.begin(), just before the loader is built",
    (L05E, ""),
    (
        "        progress.begin()\n        for x, y in DataLoader",
        "        progress.begin()\n        sampler.set_epoch(epoch)\n        for x, y in DataLoader",
    ),
)
v(
    "05_e_right_2",
    "right",
    "inside",
    "sampler.epoch = epoch (the attribute set_epoch sets)",
    (L05E, "        sampler.epoch = epoch\n"),
)
v(
    "05_e_right_3",
    "right",
    "outside",
    "set_epoch(first epoch) before the epoch loop, then set_epoch(epoch + 1) at each epoch's end",
    (L05E, ""),
    (
        '    for epoch in range(state["epoch"] if state else 0, epochs):\n',
        '    first_epoch = state["epoch"] if state else 0\n    sampler.set_epoch(first_epoch)\n    for epoch in range(first_epoch, epochs):\n',
    ),
    (
        "        progress.step()\n        r2.append",
        "        progress.step()\n        sampler.set_epoch(epoch + 1)\n        r2.append",
    ),
)

# ---------------------------------------------------------------- 07.a
L07A = '    peak_lr = lr * {"linear": k, "sqrt": math.sqrt(k), "none": 1.0}[scaling]\n'
v(
    "07_a_wrong_1",
    "wrong",
    "inside",
    "square root written k ** 1/2 (precedence: k / 2)",
    (L07A, '    peak_lr = lr * {"linear": k, "sqrt": k ** 1/2, "none": 1.0}[scaling]\n'),
)
v(
    "07_a_wrong_2",
    "wrong",
    "inside",
    "'none' mapped to 0 (learning rate 0) instead of a factor 1",
    (L07A, '    peak_lr = lr * {"linear": k, "sqrt": math.sqrt(k), "none": 0}[scaling]\n'),
)
v(
    "07_a_wrong_3",
    "wrong",
    "inside",
    "linear and sqrt rules swapped",
    (L07A, '    peak_lr = lr * {"linear": math.sqrt(k), "sqrt": k, "none": 1.0}[scaling]\n'),
)
v(
    "07_a_wrong_4",
    "wrong",
    "inside",
    "scaled by the number of ranks (world_size), not by the batch ratio k",
    (L07A, '    peak_lr = lr * {"linear": world_size, "sqrt": math.sqrt(world_size), "none": 1.0}[scaling]\n'),
)
v(
    "07_a_wrong_5",
    "wrong",
    "outside",
    "k from the per-rank batch (batch_size // world_size / base_batch)",
    ("    k = batch_size / base_batch\n", "    k = batch_size // world_size / base_batch\n"),
)
v(
    "07_a_right_1",
    "right",
    "inside",
    "if/elif chain with ** 0.5",
    (
        L07A,
        '    if scaling == "linear":\n        peak_lr = lr * k\n    elif scaling == "sqrt":\n        peak_lr = lr * k ** 0.5\n'
        "    else:\n        peak_lr = lr\n",
    ),
)
v(
    "07_a_right_2",
    "right",
    "inside",
    "nested conditional expression",
    (L07A, '    peak_lr = lr * (k if scaling == "linear" else math.sqrt(k) if scaling == "sqrt" else 1.0)\n'),
)
v(
    "07_a_right_3",
    "right",
    "inside",
    "k raised to an exponent per rule: math.pow(k, {linear: 1, sqrt: 0.5, none: 0})",
    (L07A, "    exponent = dict(linear=1.0, sqrt=0.5, none=0.0)[scaling]\n    peak_lr = lr * math.pow(k, exponent)\n"),
)

# ---------------------------------------------------------------- 07.b
L07B = (
    "        if step < warmup_steps:\n"
    "            return start + (1 - start) * step / warmup_steps\n"
    "        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))))\n"
)
COS = "        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))))\n"
v(
    "07_b_wrong_1",
    "wrong",
    "inside",
    "warmup from 0 (step / warmup_steps), ignoring start (lr / peak_lr)",
    (L07B, "        if step < warmup_steps:\n            return step / warmup_steps\n" + COS),
)
v(
    "07_b_wrong_2",
    "wrong",
    "inside",
    "warmup off by one: (step + 1) / warmup_steps, so step 0 is not at start and the peak comes a step early",
    (
        L07B,
        "        if step < warmup_steps:\n            return start + (1 - start) * (step + 1) / warmup_steps\n" + COS,
    ),
)
v(
    "07_b_wrong_3",
    "wrong",
    "inside",
    "cosine over step / total_steps (warmup not subtracted): it does not start at 1 after warmup",
    (
        L07B,
        "        if step < warmup_steps:\n            return start + (1 - start) * step / warmup_steps\n"
        "        return 0.5 * (1 + math.cos(math.pi * min(1.0, step / total_steps)))\n",
    ),
)
v(
    "07_b_wrong_4",
    "wrong",
    "inside",
    "absolute learning rates returned (lr ... peak_lr) instead of factors of peak_lr",
    (
        L07B,
        "        if step < warmup_steps:\n            return lr + (peak_lr - lr) * step / warmup_steps\n"
        "        return peak_lr * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))))\n",
    ),
)
v(
    "07_b_wrong_5",
    "wrong",
    "inside",
    "cosine without the 0.5 (1 + cos): factor 2 right after warmup",
    (
        L07B,
        "        if step < warmup_steps:\n            return start + (1 - start) * step / warmup_steps\n"
        "        return 1 + math.cos(math.pi * min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps)))\n",
    ),
)
v(
    "07_b_wrong_6",
    "wrong",
    "inside",
    "step <= warmup_steps: same curve, but --warmup-steps 0 divides by zero at step 0",
    (L07B, "        if step <= warmup_steps:\n            return start + (1 - start) * step / warmup_steps\n" + COS),
)
v(
    "07_b_right_1",
    "right",
    "inside",
    "branches inverted: cosine when step >= warmup_steps, else the linear warmup",
    (
        L07B,
        "        if step >= warmup_steps:\n"
        "            t = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))\n"
        "            return 0.5 * (1 + math.cos(math.pi * t))\n"
        "        return start + (1 - start) * step / warmup_steps\n",
    ),
)
v(
    "07_b_right_2",
    "right",
    "inside",
    "interpolation written start*(1-t) + t; cosine progress clamped with min/max in its own variable",
    (
        L07B,
        "        if step < warmup_steps:\n"
        "            t = step / warmup_steps\n"
        "            return start * (1.0 - t) + t\n"
        "        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)\n"
        "        progress = max(0.0, min(1.0, progress))\n"
        "        return (1.0 + math.cos(progress * math.pi)) / 2\n",
    ),
)
v(
    "07_b_right_3",
    "right",
    "inside",
    "warmup guarded by `warmup_steps > 0 and`, cosine as cos^2(pi*t/2) (identical to (1+cos(pi t))/2)",
    (
        L07B,
        "        if warmup_steps > 0 and step < warmup_steps:\n"
        "            return start + (1.0 - start) * (step / warmup_steps)\n"
        "        t = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))\n"
        "        return math.cos(math.pi * t / 2) ** 2\n",
    ),
)

# ---------------------------------------------------------------- 07.c
L07C = "            scaler.update()\n            scheduler.step()\n"
v(
    "07_c_wrong_1",
    "wrong",
    "outside",
    "scheduler stepped once per epoch (after the batch loop)",
    (L07C, "            scaler.update()\n"),
    (
        "        progress.step()\n        r2.append",
        "        scheduler.step()\n        progress.step()\n        r2.append",
    ),
)
v(
    "07_c_wrong_2",
    "wrong",
    "outside",
    "scheduler stepped at the top of each step, before the optimizer step (schedule one step ahead)",
    (L07C, "            scaler.update()\n"),
    (
        "            optimizer.zero_grad()\n            loss = 0\n",
        "            scheduler.step()\n            optimizer.zero_grad()\n            loss = 0\n",
    ),
)
v(
    "07_c_wrong_3",
    "wrong",
    "inside",
    "scheduler.step(epoch): the deprecated epoch argument pins the factor to lr_factor(epoch) for the whole epoch",
    (L07C, "            scaler.update()\n            scheduler.step(epoch)\n"),
)
v(
    "07_c_wrong_4",
    "wrong",
    "inside",
    "scheduler stepped on rank 0 only: the other ranks stay at the first factor, the ranks' weights diverge",
    (L07C, "            scaler.update()\n            if rank == 0:\n                scheduler.step()\n"),
)
v(
    "07_c_wrong_5",
    "wrong",
    "outside",
    "scheduler stepped after every micro-batch's backward (accumulate times per optimizer step)",
    (L07C, "            scaler.update()\n"),
    (
        "                loss = loss + micro_loss.detach()\n",
        "                loss = loss + micro_loss.detach()\n                scheduler.step()\n",
    ),
)
v(
    "07_c_right_1",
    "right",
    "outside",
    "scheduler.step() after progress.step(loss) and window.step(), at the end of the step",
    (L07C, "            scaler.update()\n"),
    (
        "            progress.step(loss)\n            window.step()\n",
        "            progress.step(loss)\n            window.step()\n            scheduler.step()\n",
    ),
)
v(
    "07_c_right_2",
    "right",
    "outside",
    "scheduler.step() inside the 'optimizer step' range, right after scaler.step (before scaler.update)",
    (L07C, "            scaler.update()\n"),
    (
        "                scaler.step(optimizer)  # skipped when a gradient overflowed (and the scale is lowered)\n",
        "                scaler.step(optimizer)  # skipped when a gradient overflowed (and the scale is lowered)\n                scheduler.step()\n",
    ),
)
v(
    "07_c_right_3",
    "right",
    "inside",
    "scheduler.step() then the new learning rate read for logging (get_last_lr)",
    (
        L07C,
        "            scaler.update()\n            scheduler.step()\n            current_lr = scheduler.get_last_lr()[0]  # for the log\n",
    ),
)

# ---------------------------------------------------------------- 13.a
A13 = (
    "    ids = [place + round_ * pp for round_ in range(per_rank)]  # this rank's stages: r, r + pp, ... (round-robin)\n"
    "    runs = torch.arange(depth).tensor_split(total)  # consecutive blocks per stage, as even as they divide\n"
    "    parts = [model.pipeline_stage(runs[i].tolist(), first=i == 0, last=i == total - 1) for i in ids]\n"
)
A13_IDS = "    ids = [place + round_ * pp for round_ in range(per_rank)]  # this rank's stages: r, r + pp, ... (round-robin)\n"
A13_RUNS = (
    "    runs = torch.arange(depth).tensor_split(total)  # consecutive blocks per stage, as even as they divide\n"
)
A13_PARTS = "    parts = [model.pipeline_stage(runs[i].tolist(), first=i == 0, last=i == total - 1) for i in ids]\n"
v(
    "13_a_wrong_1",
    "wrong",
    "inside",
    "the global rank, not the place in the pipeline, numbers this rank's stages (with --tp 2 rank 1 asks for stage 1 of 1)",
    (A13_IDS, "    ids = [rank + round_ * pp for round_ in range(per_rank)]\n"),
)
v(
    "13_a_wrong_2",
    "wrong",
    "inside",
    "a rank's virtual stages next to each other (rank 0: stages 0, 1; rank 1: 2, 3) instead of round-robin",
    (A13_IDS, "    ids = [place * per_rank + k for k in range(per_rank)]  # this rank's stages, one after the other\n"),
)
v(
    "13_a_wrong_3",
    "wrong",
    "inside",
    "the blocks cut into pp runs, not pp x virtual (the virtual stages forgotten)",
    (A13_RUNS, "    runs = torch.arange(depth).tensor_split(pp)  # one run of blocks per rank\n"),
)
v(
    "13_a_wrong_4",
    "wrong",
    "inside",
    "first/last from the rank's place (place == 0, place == pp - 1), not the stage's number: every interleaved stage of rank 0 embeds, of the last rank ends in the head",
    (
        A13_PARTS,
        "    parts = [model.pipeline_stage(runs[i].tolist(), first=place == 0, last=place == pp - 1) for i in ids]\n",
    ),
)
v(
    "13_a_wrong_5",
    "wrong",
    "inside",
    "a stage's blocks as range(first block, last block): the end left out, so each stage drops its last block",
    (
        A13_PARTS,
        "    parts = [model.pipeline_stage(range(int(runs[i][0]), int(runs[i][-1])), first=i == 0, last=i == total - 1)\n"
        "             for i in ids]\n",
    ),
)
v(
    "13_a_right_1",
    "right",
    "inside",
    "ids as range(place, total, pp); the split by hand with divmod (the first `extra` stages one block more)",
    (
        A13,
        "    ids = list(range(place, total, pp))  # round-robin: place, place + pp, ...\n"
        "    per, extra = divmod(depth, total)\n"
        "    starts = [s * per + min(s, extra) for s in range(total + 1)]\n"
        "    parts = [model.pipeline_stage(range(starts[i], starts[i + 1]), first=i == 0, last=i == total - 1) for i in ids]\n",
    ),
)
v(
    "13_a_right_2",
    "right",
    "inside",
    "a loop with append, numpy.array_split for the runs, first and last passed positionally",
    (
        A13,
        "    import numpy as np\n"
        "\n"
        "    ids, parts = [], []\n"
        "    for k in range(per_rank):\n"
        "        stage_id = place + k * pp\n"
        "        blocks = np.array_split(np.arange(depth), total)[stage_id]\n"
        "        ids.append(stage_id)\n"
        "        parts.append(model.pipeline_stage([int(b) for b in blocks], stage_id == 0, stage_id == total - 1))\n",
    ),
)
v(
    "13_a_right_3",
    "right",
    "inside",
    "stage boundaries by integer arithmetic (k * depth // total), keyword blocks=",
    (
        A13_RUNS + A13_PARTS,
        "    bounds = [k * depth // total for k in range(total + 1)]\n"
        "    parts = [\n"
        "        model.pipeline_stage(blocks=list(range(bounds[i], bounds[i + 1])), first=(i == 0), last=(i == total - 1))\n"
        "        for i in ids\n"
        "    ]\n",
    ),
)

# ---------------------------------------------------------------- 13.b
B13 = "    stages = [PipelineStage(part, i, total, device, group=group) for part, i in zip(parts, ids)]\n"
v(
    "13_b_wrong_1",
    "wrong",
    "inside",
    "each stage numbered by its index in this rank's list (enumerate), not its number in the pipeline",
    (B13, "    stages = [PipelineStage(part, i, total, device, group=group) for i, part in enumerate(parts)]\n"),
)
v(
    "13_b_wrong_2",
    "wrong",
    "inside",
    "num_stages=pp (the ranks), not pp x virtual (the stages)",
    (B13, "    stages = [PipelineStage(part, i, pp, device, group=group) for part, i in zip(parts, ids)]\n"),
)
v(
    "13_b_wrong_3",
    "wrong",
    "inside",
    "every stage numbered by the global rank, of world_size stages, on the default group",
    (B13, "    stages = [PipelineStage(part, rank, world_size, device) for part in parts]\n"),
)
v(
    "13_b_wrong_4",
    "wrong",
    "inside",
    "group= left out: the stages talk over the whole world, not the pipeline's ranks",
    (B13, "    stages = [PipelineStage(part, i, total, device) for part, i in zip(parts, ids)]\n"),
)
v(
    "13_b_wrong_5",
    "wrong",
    "inside",
    "every one of this rank's stages given the rank's place as its number",
    (B13, "    stages = [PipelineStage(part, place, total, device, group=group) for part in parts]\n"),
)
v(
    "13_b_right_1",
    "right",
    "inside",
    "all keywords: submodule=, stage_index=, num_stages=, device=, group=",
    (
        B13,
        "    stages = [PipelineStage(submodule=part, stage_index=i, num_stages=total, device=device, group=group)\n"
        "              for part, i in zip(parts, ids)]\n",
    ),
)
v(
    "13_b_right_2",
    "right",
    "inside",
    "a loop with append: stage number place + k * pp, num_stages=pp * per_rank, the group from mesh.get_group('pp')",
    (
        B13,
        "    stages = []\n"
        "    for k, part in enumerate(parts):\n"
        '        stages.append(PipelineStage(part, place + k * pp, pp * per_rank, device, group=mesh.get_group("pp")))\n',
    ),
)
v(
    "13_b_right_3",
    "right",
    "inside",
    "indexing ids by position, num_stages as len(ids) * pp, group=mesh['pp'].get_group()",
    (
        B13,
        '    stages = [PipelineStage(parts[k], ids[k], len(ids) * pp, device, group=mesh["pp"].get_group())\n'
        "              for k in range(len(parts))]\n",
    ),
)

# ---------------------------------------------------------------- 13.c
C13 = (
    '    if schedule == "interleaved-1f1b":  # each rank\'s stages take turns\n'
    "        runner = ScheduleInterleaved1F1B(stages, n_microbatches=microbatches, loss_fn=loss_fn)\n"
    "    else:  # one stage per rank\n"
    '        kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]\n'
    "        runner = kind(stages[0], n_microbatches=microbatches, loss_fn=loss_fn)\n"
)
C13_KIND = '        kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]\n'
C13_SINGLE = "        runner = kind(stages[0], n_microbatches=microbatches, loss_fn=loss_fn)\n"
C13_INTER = "        runner = ScheduleInterleaved1F1B(stages, n_microbatches=microbatches, loss_fn=loss_fn)\n"
v(
    "13_c_wrong_1",
    "wrong",
    "inside",
    "gpipe and 1f1b swapped in the table (--schedule gpipe runs 1F1B and back)",
    (C13_KIND, '        kind = {"gpipe": Schedule1F1B, "1f1b": ScheduleGPipe}[schedule]\n'),
)
v(
    "13_c_wrong_2",
    "wrong",
    "inside",
    "one table for all three schedules, each given stages[0]: interleaved-1f1b gets one stage, not the list",
    (
        C13,
        '    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved-1f1b": ScheduleInterleaved1F1B}[schedule]\n'
        "    runner = kind(stages[0], n_microbatches=microbatches, loss_fn=loss_fn)\n",
    ),
)
v(
    "13_c_wrong_3",
    "wrong",
    "inside",
    "n_microbatches = batch_size // microbatches: the micro-batch size taken for their count (8, not 4)",
    (C13_SINGLE, "        runner = kind(stages[0], n_microbatches=batch_size // microbatches, loss_fn=loss_fn)\n"),
    (
        C13_INTER,
        "        runner = ScheduleInterleaved1F1B(stages, n_microbatches=batch_size // microbatches, loss_fn=loss_fn)\n",
    ),
)
v(
    "13_c_wrong_4",
    "wrong",
    "inside",
    "loss_fn not passed to the schedule (the last stage computes no loss, so nothing to run backward from)",
    (C13_SINGLE, "        runner = kind(stages[0], n_microbatches=microbatches)\n"),
    (C13_INTER, "        runner = ScheduleInterleaved1F1B(stages, n_microbatches=microbatches)\n"),
)
v(
    "13_c_wrong_5",
    "wrong",
    "inside",
    "each micro-batch's loss summed over its elements (MSELoss(reduction='sum')), not its mean",
    (
        C13,
        '    loss_fn = nn.MSELoss(reduction="sum")  # the schedule divides by the micro-batches\n'
        '    if schedule == "interleaved-1f1b":\n'
        "        runner = ScheduleInterleaved1F1B(stages, n_microbatches=microbatches, loss_fn=loss_fn)\n"
        "    else:\n"
        '        kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]\n'
        "        runner = kind(stages[0], n_microbatches=microbatches, loss_fn=loss_fn)\n",
    ),
)
v(
    "13_c_right_1",
    "right",
    "inside",
    "an if/elif/else chain, the schedules' arguments passed positionally",
    (
        C13,
        '    if schedule == "gpipe":\n'
        "        runner = ScheduleGPipe(stages[0], microbatches, loss_fn)\n"
        '    elif schedule == "1f1b":\n'
        "        runner = Schedule1F1B(stages[0], microbatches, loss_fn)\n"
        "    else:\n"
        "        runner = ScheduleInterleaved1F1B(stages, microbatches, loss_fn)\n",
    ),
)
v(
    "13_c_right_2",
    "right",
    "inside",
    "a match statement; the single stage unpacked (stage, = stages) and passed as stage=",
    (
        C13,
        "    match schedule:\n"
        '        case "interleaved-1f1b":\n'
        "            runner = ScheduleInterleaved1F1B(stages=stages, n_microbatches=microbatches, loss_fn=loss_fn)\n"
        '        case "gpipe":\n'
        "            (stage,) = stages\n"
        "            runner = ScheduleGPipe(stage=stage, n_microbatches=microbatches, loss_fn=loss_fn)\n"
        "        case _:\n"
        "            (stage,) = stages\n"
        "            runner = Schedule1F1B(stage=stage, n_microbatches=microbatches, loss_fn=loss_fn)\n",
    ),
)
v(
    "13_c_right_3",
    "right",
    "inside",
    "the loss as a lambda over F.mse_loss; the schedule class and its first argument chosen by conditional expressions",
    (
        C13,
        "    def mse(output, target):\n"
        "        return nn.functional.mse_loss(output, target)\n"
        "\n"
        '    interleaved = schedule == "interleaved-1f1b"\n'
        '    cls = ScheduleInterleaved1F1B if interleaved else ScheduleGPipe if schedule == "gpipe" else Schedule1F1B\n'
        "    runner = cls(stages if interleaved else stages[0], n_microbatches=microbatches, loss_fn=mse)\n",
    ),
)

# ---------------------------------------------------------------- 13.d
D13 = (
    "            losses = []\n"
    '            with marked("pipeline step"):\n'
    "                runner.step(*([x] if ends[0] else []), target=y if ends[1] else None, losses=losses)\n"
    "            loss = torch.stack(losses).mean().detach() if losses else torch.zeros((), device=device)\n"
    "            dist.broadcast(loss, src=last_rank, group=group)  # every rank logs the last stage's loss\n"
)
D13_STEP = "                runner.step(*([x] if ends[0] else []), target=y if ends[1] else None, losses=losses)\n"
D13_LOSS = "            loss = torch.stack(losses).mean().detach() if losses else torch.zeros((), device=device)\n"
D13_BCAST = "            dist.broadcast(loss, src=last_rank, group=group)  # every rank logs the last stage's loss\n"
v(
    "13_d_wrong_1",
    "wrong",
    "inside",
    "no broadcast: the stages without the loss log 0",
    (D13_BCAST, ""),
)
v(
    "13_d_wrong_2",
    "wrong",
    "inside",
    "the micro-batches' losses summed, not averaged",
    (D13_LOSS, "            loss = torch.stack(losses).sum().detach() if losses else torch.zeros((), device=device)\n"),
)
v(
    "13_d_wrong_3",
    "wrong",
    "inside",
    "the last micro-batch's loss logged as the batch's (losses[-1])",
    (D13_LOSS, "            loss = losses[-1].detach() if losses else torch.zeros((), device=device)\n"),
)
v(
    "13_d_wrong_4",
    "wrong",
    "inside",
    "the loss broadcast from rank 0 (the first stage, which holds no loss)",
    (D13_BCAST, "            dist.broadcast(loss, src=0, group=group)\n"),
)
v(
    "13_d_wrong_5",
    "wrong",
    "inside",
    "the loss broadcast over the whole world, without group= (with --tp 2 each pipeline's last rank is a different source)",
    (D13_BCAST, "            dist.broadcast(loss, src=last_rank)\n"),
)
v(
    "13_d_wrong_6",
    "wrong",
    "inside",
    "the maps fed on rank 0 and the targets on the last global rank, not by the stages' ends (with --tp 2 rank 1 holds the first stage too)",
    (
        D13_STEP,
        "                runner.step(*([x] if rank == 0 else []), target=y if rank == world_size - 1 else None,\n"
        "                            losses=losses)\n",
    ),
)
v(
    "13_d_wrong_7",
    "wrong",
    "inside",
    "the loss all-reduced over the pipeline and divided by pp, as if every stage held one (it halves it on 2 stages)",
    (D13_BCAST, "            dist.all_reduce(loss, group=group)\n            loss = loss / pp\n"),
)
v(
    "13_d_right_1",
    "right",
    "inside",
    "x and y passed to every stage (only the first uses the maps, only the last the targets)",
    (D13_STEP, "                runner.step(x, target=y, losses=losses)\n"),
)
v(
    "13_d_right_2",
    "right",
    "inside",
    "all_reduce (sum) over the pipeline instead of broadcast: the other stages add a zero",
    (D13_BCAST, "            dist.all_reduce(loss, group=group)  # only the last stage's is not zero\n"),
)
v(
    "13_d_right_3",
    "right",
    "inside",
    "python sum(losses) / len(losses), torch.tensor(0.0) elsewhere, broadcast with positional src and group",
    (
        D13_LOSS + D13_BCAST,
        "            if losses:\n"
        "                loss = (sum(losses) / len(losses)).detach()\n"
        "            else:\n"
        "                loss = torch.tensor(0.0, device=device)\n"
        "            dist.broadcast(loss, last_rank, group)\n",
    ),
)
v(
    "13_d_right_4",
    "right",
    "inside",
    "the loss recomputed on the last stage from the step's returned predictions (the mean over the whole batch)",
    (
        D13,
        '            with marked("pipeline step"):\n'
        "                out = runner.step(*([x] if ends[0] else []), target=y if ends[1] else None)\n"
        "            if ends[1]:\n"
        "                with torch.no_grad():\n"
        "                    loss = loss_fn(out, y)\n"
        "            else:\n"
        "                loss = torch.zeros((), device=device)\n"
        "            dist.broadcast(loss, src=last_rank, group=group)\n",
    ),
)
v(
    "13_d_right_5",
    "right",
    "inside",
    "an if/elif chain on the stages' ends for the step's arguments",
    (
        D13_STEP,
        "                if ends[0] and ends[1]:\n"
        "                    runner.step(x, target=y, losses=losses)\n"
        "                elif ends[0]:\n"
        "                    runner.step(x)\n"
        "                elif ends[1]:\n"
        "                    runner.step(target=y, losses=losses)\n"
        "                else:\n"
        "                    runner.step()\n",
    ),
)

# ---------------------------------------------------------------- 13, outside the gaps
LAST13 = (
    "    last_rank = dist.get_global_rank(group, pp - 1)  # this rank's pipeline's last stage: it computes the loss\n"
)
v(
    "13_out_wrong_1",
    "wrong",
    "outside",
    "last_rank = pp - 1: the last stage's place taken for its global rank (with --tp 2 rank 1's pipeline is rank 1 alone)",
    (LAST13, "    last_rank = pp - 1  # the last stage\n"),
)
v(
    "13_out_wrong_2",
    "wrong",
    "outside",
    "last_rank = world_size - 1: the last rank of the world, not of this rank's pipeline",
    (LAST13, "    last_rank = world_size - 1\n"),
)
v(
    "13_out_wrong_3",
    "wrong",
    "outside",
    "total = pp: the virtual stages left out of the stage count",
    ("    total = pp * per_rank\n", "    total = pp\n"),
)
v(
    "13_out_wrong_4",
    "wrong",
    "outside",
    "the sampler split over the pipeline's ranks as in DDP: the first stage feeds other maps than the last stage's targets",
    (
        "    sampler = DistributedSampler(train_set, num_replicas=1, rank=0, seed=seed, drop_last=True)\n",
        "    sampler = DistributedSampler(train_set, num_replicas=pp, rank=place, seed=seed, drop_last=True)\n",
    ),
)
v(
    "13_out_wrong_5",
    "wrong",
    "outside",
    "place = the global rank, not the rank's place in the pipeline mesh",
    (
        '    place, group = mesh["pp"].get_local_rank(), mesh["pp"].get_group()\n',
        '    place, group = rank, mesh["pp"].get_group()\n',
    ),
)
v(
    "13_out_right_1",
    "right",
    "outside",
    "ends from the first stage's is_first and the last stage's is_last (a rank's stages are in order)",
    (
        "    ends = (any(stage.is_first for stage in stages), any(stage.is_last for stage in stages))\n",
        "    ends = (stages[0].is_first, stages[-1].is_last)\n",
    ),
)
v(
    "13_out_right_2",
    "right",
    "outside",
    "last_rank read off the pipeline mesh's global ranks (mesh['pp'].mesh[-1])",
    (LAST13, '    last_rank = int(mesh["pp"].mesh[-1])  # the global rank of this pipeline\'s last stage\n'),
)
