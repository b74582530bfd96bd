"""The race: our jitted CVS step against PyTorch eager and ``torch.compile``, one device, one run.

Three configurations, each on the first device only (one GPU, or the CPU):

* ``cifar16``: ResNet-18 (CIFAR stem, width 64), 32x32x3, batch 16 (the paper's CIFAR batch);
* ``cifar256``: the same at batch 256;
* ``rn50_64``: the fine-grained recipe, ResNet-50 (frozen BN), stored 256x256 images with
  RandomResizedCrop 224 on the device (ours) / images already cropped to 224 (PyTorch), batch 64.

Rows per configuration:

* ``jax step``: our jitted step, one training step per call (``benchmarks/train_step.py``'s ``build`` and
  ``bench``, unchanged);
* ``jax k-step k=4, 8``: ``make_train_step(..., steps_per_call=k)``, k steps in one call, fed a batch of
  ``[k, B, ...]`` images (``[k, B]`` labels);
* ``jax population N=4, 8``: N independent members trained by one call, fed stacked states and a
  ``[N, B, ...]`` batch (each member its own images); found as ``make_train_step(..., population=N)`` or
  ``cvs_jax.engine.population.make_population_step``.  Per-member and total images/s are both reported;
* ``torch eager``: ``benchmarks/train_step_torch.py``'s models and loss, eager (the official code's way);
* ``torch.compile default``, ``max-autotune``, ``reduce-overhead`` (CUDA graphs; the last two on CUDA only):
  both models compiled, loss and SGD eager (as ``train_step_torch.py --compile``).

The k-step and population APIs are probed at run time (signatures, ``hasattr``); a row whose API is
absent prints ``not built yet``; a row whose API is present but whose call fails prints the error
(``_kstep_step`` and ``_population_step`` are the two adapters to adjust).  ``--emulate`` adds rows for
the same two modes built here from today's step (``lax.scan`` of k steps, ``jax.vmap`` over N members),
labelled ``emulated``: what the modes can give before ``cvs_jax`` has them.

Ratios: each row's total images/s over torch eager's and over the best ``torch.compile`` row of the
same configuration in the same run, and over our one-step row (for a population: the goal "N members
at >= 5x one member's throughput").  Precision: ``--dtype float32`` (default; PyTorch fp32 NCHW) or
``bfloat16`` (our bf16 model; PyTorch AMP bf16 + channels_last).

Each (configuration, side) runs in its own process (JAX and PyTorch never share the device's memory
in one process); ``--side``/``--merge`` run one part or render saved parts (``benchmarks/gpu_run.sh
race`` uses them to resume).

Usage:
  python benchmarks/race.py --json race.json                    # GPU: the three configurations
  python benchmarks/race.py --quick                             # CPU smoke run (tiny widths, few steps)
  python benchmarks/race.py --side jax --configs cifar16 --json part.json
  python benchmarks/race.py --merge part_jax.json part_torch.json --json race.json
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import importlib.util
import inspect
import os
import subprocess
import sys
import tempfile
import time

import _common

CONFIGS = {  # name -> (recipe, batch, quick batch)
    "cifar16": ("cifar", 16, 16),
    "cifar256": ("cifar", 256, 64),
    "rn50_64": ("finegrained", 64, 8),
}
TORCH_MODES = ("default", "max-autotune", "reduce-overhead")
# The paper's CIFAR-100 general schedule: 256 epochs x 5 sessions of ~8,000 training images (BENCHMARKS.md (a)).
PAPER_CIFAR_IMAGES = 10.2e6
NOT_BUILT = "not built yet"


def _row(config: str, impl: str, variant: str, batch: int, dtype: str, **kw) -> dict:
    row = dict(config=config, impl=impl, variant=variant, batch=batch, dtype=dtype, members=1, steps_per_call=1)
    row.update(status="ok", images_per_s_total=None, images_per_s_per_member=None, ms_per_call=None, compile_s=None)
    row.update(kw)
    return row


def _error(e: BaseException) -> str:
    msg = f"{type(e).__name__}: {e}".replace("\n", " ").replace("|", "/")
    if "RESOURCE_EXHAUSTED" in msg or "out of memory" in msg.lower():
        return "failed: out of memory"
    return "failed: " + msg[:160]


# ---------------------------------------------------------------- JAX side


def _jax_setup(recipe: str, quick: bool, width: int | None):
    """(config, stored side) as ``benchmarks/train_step.py`` makes them; tiny sizes with ``quick``."""
    from cvs_jax.config import cifar100_general, dogs_general

    if recipe == "cifar":
        config, side = cifar100_general.get_config(), 32
    else:
        config, side = dogs_general.get_config(), 256
        if quick:
            config.augment.size, side = 64, 72
    config.model.width = width or (8 if quick else 64)
    return config, side


@contextlib.contextmanager
def _step_kwargs(**kw):
    """``train_step.build`` with extra ``make_train_step`` keywords (reuses its setup code unchanged)."""
    import train_step

    orig = train_step.make_train_step
    train_step.make_train_step = functools.partial(orig, **kw)
    try:
        yield
    finally:
        train_step.make_train_step = orig


def _stack(tree, n: int):
    import jax
    import jax.numpy as jnp

    return jax.tree.map(lambda x: jnp.stack([x] * n), tree)


def _batch(batch: int, side: int, lead: tuple[int, ...] = ()):
    import jax
    import numpy as np
    from train_step import VALID_CLASSES

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=lead + (batch, side, side, 3), dtype=np.uint8)
    labels = rng.integers(0, VALID_CLASSES, size=lead + (batch,)).astype(np.int32)
    return jax.device_put({"images": images, "labels": labels}, jax.devices()[0])


PROFILE = {"dir": None, "calls": 5}  # --profile: after a row is timed, trace a few more calls (perfetto JSON)


def _time_calls(call, state, calls: int, label: str = "row"):
    """(seconds for ``calls`` calls, compile + first call s, last metrics); one untimed warm-up call.

    With ``--profile DIR``, ``PROFILE["calls"]`` more calls run afterwards under ``jax.profiler.trace``
    into ``DIR/<label>`` (``benchmarks/profile_summary.py`` reads the trace: device busy time and the
    kernels that fill it)."""
    import jax

    t0 = time.perf_counter()
    state, m = call(state)
    jax.block_until_ready(state)
    compile_s = time.perf_counter() - t0
    state, m = call(state)
    jax.block_until_ready(state)
    t0 = time.perf_counter()
    for _ in range(calls):
        state, m = call(state)
    jax.block_until_ready((state, m))
    elapsed = time.perf_counter() - t0
    if PROFILE["dir"]:
        with jax.profiler.trace(os.path.join(PROFILE["dir"], label), create_perfetto_trace=True):
            for _ in range(PROFILE["calls"]):
                state, m = call(state)
            jax.block_until_ready((state, m))
    return elapsed, compile_s, m


def _kstep_api():
    from cvs_jax.engine import train_step as ts

    return "steps_per_call" in inspect.signature(ts.make_train_step).parameters


def _population_api():
    """``("kwarg", None)`` when ``make_train_step`` takes ``population``; ``("module", fn)`` for
    ``cvs_jax.engine.population.make_population_step``; None when neither exists yet."""
    from cvs_jax.engine import train_step as ts

    if "population" in inspect.signature(ts.make_train_step).parameters:
        return "kwarg", None
    for modname in ("cvs_jax.engine.population", "cvs_jax.engine.train_step"):
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        for name in ("make_population_step", "make_population_train_step", "population_step"):
            if hasattr(mod, name):
                return "module", getattr(mod, name)
    return None


def _kstep_step(config, dtype, mesh, side, k: int, emulate: bool):
    """(step, state, frozen, consts) where ``step(state, frozen, batches[k], consts, lr, key)`` runs k steps."""
    import jax
    import train_step

    if not emulate:
        with _step_kwargs(steps_per_call=k):
            return train_step.build(config, dtype, mesh, side)
    step, state, frozen, consts = train_step.build(config, dtype, mesh, side)

    @functools.partial(jax.jit, donate_argnums=0)
    def ksteps(state, frozen, batches, consts, lr, key):
        return jax.lax.scan(lambda s, b: step(s, frozen, b, consts, lr, key), state, batches)

    return ksteps, state, frozen, consts


def _population_step(config, dtype, mesh, side, n: int, emulate: bool):
    """(step, states, frozens, consts) where ``step(states, frozens, batches[n], consts, lr, keys[n])``
    trains n members at once; states, frozen models and constants stacked on a leading member axis."""
    import jax
    import train_step

    if emulate:
        step, state, frozen, consts = train_step.build(config, dtype, mesh, side)
        vstep = jax.jit(jax.vmap(step, in_axes=(0, 0, 0, 0, None, 0)), donate_argnums=0)
        return vstep, _stack(state, n), _stack(frozen, n), _stack(consts, n)
    kind, fn = _population_api()
    if kind == "kwarg":
        with _step_kwargs(population=n):
            step, state, frozen, consts = train_step.build(config, dtype, mesh, side)
    else:
        step, state, frozen, consts = train_step.build(config, dtype, mesh, side)
        params = list(inspect.signature(fn).parameters)
        step = fn(step, n) if params and params[0] in ("step", "train_step", "step_fn") else fn(step)
    return step, _stack(state, n), _stack(frozen, n), _stack(consts, n)


def _jax_plan(a) -> list[tuple[str, str, int, int, bool]]:
    """(group, variant, members, steps per call, emulated) of the JAX rows ``a`` asks for."""
    plan = [("step", "step", 1, 1, False)] if "step" in a.rows else []
    for emulate in (False, True) if a.emulate else (False,):
        tag = " emulated" if emulate else ""
        if "kstep" in a.rows:
            plan += [("kstep", f"k-step k={k}{tag}", 1, k, emulate) for k in a.ks]
        if "population" in a.rows:
            plan += [("population", f"population N={n}{tag}", n, 1, emulate) for n in a.populations]
    return plan


def run_jax(name: str, a) -> tuple[list[dict], str | None]:
    recipe, full_batch, quick_batch = CONFIGS[name]
    batch = quick_batch if a.quick else full_batch
    plan = _jax_plan(a)
    if a.placeholder:  # a part that did not finish (e.g. killed by its time limit): rows that say so
        return [_row(name, "jax", v, batch, a.dtype, members=n, steps_per_call=k, status=a.placeholder)
                for _, v, n, k, _ in plan], None  # fmt: skip

    import jax
    import jax.numpy as jnp
    import numpy as np
    import train_step

    from cvs_jax import distributed

    config, side = _jax_setup(recipe, a.quick, a.width)
    mesh = distributed.data_mesh(jax.devices()[:1])  # one device: the race is per device
    timed = a.steps or (3 if a.quick else 50)
    lr, key = jnp.float32(0.03), jax.random.key(1)
    rows = []
    for group, variant, n, k, emulate in plan:
        base = dict(members=n, steps_per_call=k)
        try:
            if group == "step":
                r = train_step.bench(config, a.dtype, batch, timed, mesh, side)
                dt, c, calls, m = r["ms_per_step"] * timed / 1000, r["compile_s"], timed, {"loss": r["loss"]}
            elif (group == "kstep" and not emulate and not _kstep_api()) or (
                group == "population" and not emulate and _population_api() is None
            ):
                rows.append(_row(name, "jax", variant, batch, a.dtype, status=NOT_BUILT, **base))
                print(f"{name} jax {variant}: {NOT_BUILT}", flush=True)
                continue
            elif group == "kstep":
                step, state, frozen, consts = _kstep_step(config, a.dtype, mesh, side, k, emulate)
                data, calls = _batch(batch, side, (k,)), max(1, timed // k)
                label = f"{name}_{a.dtype}_k{k}"
                dt, c, m = _time_calls(lambda s: step(s, frozen, data, consts, lr, key), state, calls, label)
            else:
                step, states, frozens, consts = _population_step(config, a.dtype, mesh, side, n, emulate)
                data, keys, calls = _batch(batch, side, (n,)), jax.random.split(key, n), timed
                dt, c, m = _time_calls(
                    lambda s: step(s, frozens, data, consts, lr, keys), states, calls, f"{name}_{a.dtype}_pop{n}"
                )
            assert np.all(np.isfinite(np.asarray(m["loss"]))), "non-finite loss"
            total = calls * k * batch * n / dt
            rows.append(_row(name, "jax", variant, batch, a.dtype, images_per_s_total=total,
                             images_per_s_per_member=total / n, ms_per_call=1000 * dt / calls, compile_s=c,
                             **base))  # fmt: skip
        except Exception as e:  # noqa: BLE001  (a row that fails, e.g. out of memory, must not end the race)
            rows.append(_row(name, "jax", variant, batch, a.dtype, status=_error(e), **base))
        r = rows[-1]
        print(f"{name} jax {variant}: {r['status']} {r['images_per_s_total'] or ''}", flush=True)
    return rows, _common.environment()


# ---------------------------------------------------------------- PyTorch side


def _torch_bench(recipe: str, variant: str, batch: int, steps: int, width: int, amp: bool, side: int) -> dict:
    """``train_step_torch.bench``'s step on any device, with a ``torch.compile`` mode (None = eager)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from train_step_torch import EMBED, NUM_CLASSES, VALID_CLASSES, ResNet18, cvs_loss, resnet50_embedding

    torch.manual_seed(0)
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    mode = None if variant == "eager" else variant
    if recipe == "cifar":
        model, old = ResNet18(width).to(dev), ResNet18(width).to(dev)
    else:
        model, old = resnet50_embedding().to(dev), resnet50_embedding().to(dev)
    old.eval().requires_grad_(False)
    head = nn.Parameter(torch.randn(NUM_CLASSES, EMBED, device=dev) * 0.01)
    centers = F.normalize(torch.randn(NUM_CLASSES, EMBED, device=dev), dim=1)
    fmt = torch.channels_last if amp else torch.contiguous_format
    model, old = model.to(memory_format=fmt), old.to(memory_format=fmt)
    opt = torch.optim.SGD(list(model.parameters()) + [head], lr=0.03, momentum=0.9, nesterov=True, weight_decay=1e-4)
    if mode is not None:
        fwd, old_fwd = torch.compile(model, mode=mode), torch.compile(old, mode=mode)
    else:
        fwd, old_fwd = model, old
    x = torch.rand(batch, 3, side, side, device=dev).to(memory_format=fmt)
    y = torch.randint(0, VALID_CLASSES, (batch,), device=dev)
    graphs = mode == "reduce-overhead"

    def step():
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(dev.type, torch.bfloat16, enabled=amp):
            new = fwd(x)
            with torch.no_grad():
                o = old_fwd(x)
        loss = cvs_loss(new.float(), o.float(), head, y, centers)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    t0 = time.perf_counter()
    step()
    sync()
    first_s = time.perf_counter() - t0
    for _ in range(3):  # max-autotune / CUDA graphs record during the first calls
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    sync()
    dt = time.perf_counter() - t0
    assert torch.isfinite(loss).item(), "non-finite loss"
    return {"images_per_s": steps * batch / dt, "ms_per_step": 1000 * dt / steps, "first_step_s": first_s}


def run_torch(name: str, a) -> tuple[list[dict], str | None]:
    recipe, full_batch, quick_batch = CONFIGS[name]
    batch = quick_batch if a.quick else full_batch
    variants = [v for v in ["eager"] + a.torch_modes if v in a.rows]
    label = {v: ("torch eager" if v == "eager" else f"torch.compile {v}") for v in variants}
    if a.placeholder:
        return [_row(name, "torch", label[v], batch, a.dtype, status=a.placeholder) for v in variants], None
    env = _common.torch_environment()
    if env is None:
        return [_row(name, "torch", label[v], batch, a.dtype, status="torch not installed") for v in variants], None
    import torch

    torch.backends.cudnn.benchmark = True
    width = a.width or (8 if a.quick else 64)
    side = 32 if recipe == "cifar" else (64 if a.quick else 224)
    timed = a.steps or (3 if a.quick else 50)
    rows = []
    for v in variants:
        status = None
        if v in ("max-autotune", "reduce-overhead") and not torch.cuda.is_available():
            status = "skipped: CUDA only"
        elif recipe == "finegrained" and importlib.util.find_spec("torchvision") is None:
            status = "torchvision not installed"
        if status is None:
            try:
                r = _torch_bench(recipe, v, batch, timed, width, a.dtype == "bfloat16", side)
                rows.append(_row(name, "torch", label[v], batch, a.dtype, images_per_s_total=r["images_per_s"],
                                 images_per_s_per_member=r["images_per_s"], ms_per_call=r["ms_per_step"],
                                 compile_s=r["first_step_s"]))  # fmt: skip
            except Exception as e:  # noqa: BLE001
                rows.append(_row(name, "torch", label[v], batch, a.dtype, status=_error(e)))
        else:
            rows.append(_row(name, "torch", label[v], batch, a.dtype, status=status))
        print(f"{name} {label[v]}: {rows[-1]['status']} {rows[-1]['images_per_s_total'] or ''}", flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows, env


# ---------------------------------------------------------------- report


def dedupe(rows: list[dict]) -> list[dict]:
    """One row per (config, dtype, impl, variant): a measured row wins over a placeholder, later over earlier."""
    keep: dict[tuple, dict] = {}
    for r in rows:
        key = (r["config"], r["dtype"], r["impl"], r["variant"])
        if key not in keep or r["status"] == "ok" or keep[key]["status"] != "ok":
            keep[key] = r
    return list(keep.values())


def _order(r: dict) -> tuple:
    """Table order whatever the order of the parts: configs as in CONFIGS, then step, k-steps, populations,
    torch eager, the compile modes."""
    v = r["variant"]
    ranks = ["step", "k-step", "population", "torch eager"] + [f"torch.compile {m}" for m in TORCH_MODES]
    rank = next((i for i, p in enumerate(ranks) if v == p or v.startswith(p + " ")), len(ranks))
    cfg = list(CONFIGS).index(r["config"]) if r["config"] in CONFIGS else len(CONFIGS)
    return cfg, r["dtype"], rank, r["steps_per_call"], r["members"], "emulated" in v


def report(rows: list[dict], envs: list[str], quick: bool) -> str:
    rows, table_rows, goals = sorted(dedupe(rows), key=_order), [], []
    for name, dtype in dict.fromkeys((r["config"], r["dtype"]) for r in rows):  # ratios within one precision
        rs = [r for r in rows if r["config"] == name and r["dtype"] == dtype]
        eager = next((r["images_per_s_total"] for r in rs if r["variant"] == "torch eager"), None)
        best = max((r["images_per_s_total"] or 0 for r in rs if r["variant"].startswith("torch.compile")), default=0)
        ours = next(
            (r["images_per_s_total"] for r in rs if r["impl"] == "jax" and r["variant"] in ("step", "k-step k=1")), None
        )
        for r in rs:
            tot = r["images_per_s_total"]
            table_rows.append([
                name, r["batch"], r["dtype"], f"jax {r['variant']}" if r["impl"] == "jax" else r["variant"],
                r["members"], r["status"], r["images_per_s_per_member"] or "-", tot or "-",
                r["ms_per_call"] or "-", r["compile_s"] or "-", _common.ratio(tot, eager),
                _common.ratio(tot, best or None), _common.ratio(tot, ours) if r["impl"] == "jax" else "-",
            ])  # fmt: skip
        goals += _goals(name, dtype, rs, eager, best or None, ours, quick)
    headers = ["config", "batch", "dtype", "row", "members", "status", "img/s per member", "img/s total",
               "ms/call", "compile s", "x torch eager", "x best torch.compile", "x our 1-step"]  # fmt: skip
    head = ["# " + e for e in dict.fromkeys(envs)]
    return "\n".join(head + ["", _common.table(headers, table_rows), ""] + goals)


def _goals(name, dtype, rs, eager, best, ours, quick) -> list[str]:
    """The race's goals (>= 5x torch eager, >= 1.5x torch.compile, a population of 8 >= 5x our
    one step and < 20 min per member on the paper's CIFAR-100 schedule), measured against this run (batch 16
    only)."""
    if name != "cifar16":
        return []
    single = [r["images_per_s_total"] for r in rs if r["impl"] == "jax" and r["members"] == 1 and r["status"] == "ok"]
    top = max(single, default=None)
    pop8 = next((r for r in rs if r["impl"] == "jax" and r["members"] == 8 and r["status"] == "ok"), None)
    lines = [f"goals at batch 16, {dtype}{' (CPU --quick: a smoke check, not evidence)' if quick else ''}:"]
    lines.append(f"  our best single-member row / torch eager = {_common.ratio(top, eager)} (goal >= 5x)")
    lines.append(f"  our best single-member row / best torch.compile = {_common.ratio(top, best)} (goal >= 1.5x)")
    if pop8:
        lines.append(
            f"  population of 8 ({pop8['variant']}) total / our 1-step = "
            f"{_common.ratio(pop8['images_per_s_total'], ours)} (goal >= 5x); paper CIFAR-100 schedule "
            f"({PAPER_CIFAR_IMAGES / 1e6:.1f} M images per member, steps only) = "
            f"{PAPER_CIFAR_IMAGES / pop8['images_per_s_per_member'] / 60:.0f} min per member (goal < 20 min)"
        )
    else:
        lines.append("  population of 8: not measured in this run")
    return lines


# ---------------------------------------------------------------- driver


def _part_args(a, name: str, side: str, path: str) -> list[str]:
    args = [sys.executable, os.path.abspath(__file__), "--side", side, "--configs", name, "--json", path]
    args += ["--dtype", a.dtype, "--torch-modes", ",".join(a.torch_modes) or "none", "--rows", ",".join(a.rows)]
    args += ["--ks", ",".join(map(str, a.ks)), "--populations", ",".join(map(str, a.populations))]
    args += ["--quick"] * a.quick + ["--emulate"] * a.emulate
    args += [f"--steps={a.steps}"] * bool(a.steps) + [f"--width={a.width}"] * bool(a.width)
    return args


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--quick", action="store_true", help="CPU smoke run: width 8, small batches and crops, 3 steps, k=4, N=4"
    )
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, from {', '.join(CONFIGS)}")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--steps", type=int, default=None, help="timed training steps per row (default 50; 3 with --quick)")
    p.add_argument("--width", type=int, default=None, help="ResNet base width (default 64; 8 with --quick)")
    p.add_argument("--torch-modes", default=",".join(TORCH_MODES), help="torch.compile modes ('none': eager only)")
    p.add_argument("--ks", default=None, help="steps per call k (default 4,8; 4 with --quick)")
    p.add_argument("--populations", default=None, help="population sizes N (default 4,8; 4 with --quick)")
    p.add_argument("--emulate", action="store_true", help="add k-step / population rows built here from today's step")
    p.add_argument("--side", choices=["jax", "torch"], default=None, help="run one side in this process")
    p.add_argument(
        "--rows",
        default="step,kstep,population,eager," + ",".join(TORCH_MODES),
        help="which rows: step, kstep, population (JAX); eager and the torch.compile modes (PyTorch)",
    )
    p.add_argument("--placeholder", default=None, help="with --side: write the part's rows with this status, unrun")
    p.add_argument("--merge", nargs="+", default=None, help="render saved part JSON files")
    p.add_argument("--json", default=None, help="write the rows here")
    p.add_argument(
        "--profile",
        default=None,
        help="k-step and population rows: trace 5 more calls after timing into DIR/<row> (jax.profiler, perfetto "
        "JSON); read with benchmarks/profile_summary.py",
    )
    a = p.parse_args()
    PROFILE["dir"] = a.profile
    a.torch_modes = [m for m in a.torch_modes.split(",") if m and m != "none"]
    a.rows = set(a.rows.split(","))
    a.ks = [int(k) for k in (a.ks or ("4" if a.quick else "4,8")).split(",") if k]
    a.populations = [int(n) for n in (a.populations or ("4" if a.quick else "4,8")).split(",") if n]
    names = a.configs.split(",")
    unknown = set(names) - set(CONFIGS)
    if unknown:
        p.error(f"unknown configs {sorted(unknown)}; known: {', '.join(CONFIGS)}")

    if a.side:  # one part, in this process
        rows, envs = [], []
        for name in names:
            r, env = (run_jax if a.side == "jax" else run_torch)(name, a)
            rows += r
            envs += [env] if env else []
        if a.json:
            _common.write_json(a.json, rows, environment=envs, quick=a.quick, side=a.side)
        return
    if a.merge:
        parts = [_common.read_json(f) for f in a.merge]
    else:
        parts = []
        with tempfile.TemporaryDirectory() as tmp:
            for name in names:
                for side in ("jax", "torch"):
                    path = os.path.join(tmp, f"{name}_{side}.json")
                    subprocess.run(_part_args(a, name, side, path), check=False)
                    if os.path.exists(path):
                        parts.append(_common.read_json(path))
                    else:
                        print(f"{name} {side}: the part process wrote nothing (see its output above)", flush=True)
    rows = dedupe([r for part in parts for r in part["rows"]])
    envs = [e for part in parts for e in part["environment"]]
    quick = any(part.get("quick") for part in parts)
    print("\n" + report(rows, envs, quick))
    if a.json:
        _common.write_json(a.json, rows, environment=list(dict.fromkeys(envs)), quick=quick)
        print(f"\nwrote {a.json}")


if __name__ == "__main__":
    main()
