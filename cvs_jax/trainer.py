"""The continual visual-search protocol, session after session (one readable trainer).

Sections: (1) set-up: data, session plan, mesh, model, compiled functions;
(2) resume from the last completed session; (3) per session: training data,
head growth, epochs with validation recall@1 and best-model selection, test
recall@K against the accumulated gallery, gallery update, replay memory,
checkpoint; (4) results table and ``results.json``.

Protocol details follow the official code (spec §1.4, §2.5, §4, §5): model
selection on accumulated validation queries against (stored gallery + the
session's images embedded by the current model); test queries embedded by the
newest model against a gallery whose older rows were made by older models.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from cvs_jax import (
    augment,
    config_checks,
    distributed,
    evaluate,
    faults,
    importance,
    losses,
    memory,
    plots,
    schedules,
)
from cvs_jax import (
    workdir as workdir_lib,
)
from cvs_jax.checkpoint import Checkpoints
from cvs_jax.compatibility import compatibility_matrix
from cvs_jax.data import official_splits, sources, splits
from cvs_jax.gallery import Gallery, GalleryPart, RowConcat
from cvs_jax.methods import Method, get_method
from cvs_jax.models import build_model, grow_head, init_head
from cvs_jax.models.pretrained import load_torchvision_resnet50, merge_pretrained
from cvs_jax.run_log import RunLog, format_eta
from cvs_jax.train_step import TrainState, make_embed_fn, make_optimizer, make_train_step


@dataclasses.dataclass
class Protocol:
    """The data of a run: images, protocol labels and the session plan."""

    dataset: sources.ImageDataset
    plan: splits.SessionPlan
    train_labels: np.ndarray  # protocol labels of the train split (-1: class not used)
    test_labels: np.ndarray

    @classmethod
    def build(cls, config: ml_collections.ConfigDict) -> "Protocol":
        d = config.data
        dataset = sources.load_dataset(d.name, data_dir=d.data_dir, manual_dir=d.manual_dir, on_corrupt=d.on_corrupt)
        if d.official_split_dir is not None:  # the official CVS JSON session files (CIFAR-100)
            plan = official_splits.official_plan_for_dataset(os.path.expanduser(d.official_split_dir), d.setup, dataset)
            return cls(
                dataset,
                plan,
                plan.to_protocol_labels(dataset.train.labels),
                plan.to_protocol_labels(dataset.test.labels),
            )
        plan = splits.make_session_plan(
            dataset.train.labels,
            setup=d.setup,
            num_sessions=d.num_sessions,
            first_classes=d.first_classes,
            classes_per_session=d.classes_per_session,
            old_class_percent=d.old_class_percent,
            samples_per_new_class=d.samples_per_new_class,
            blurry_minor_percent=d.blurry_minor_percent,
            val_fraction=d.val_fraction,
            num_classes=dataset.num_classes,
            shuffle_classes=d.shuffle_classes,
            seed=config.seed,
            val_per_class=d.val_per_class,
            general_shares=d.general_shares,
        )
        return cls(
            dataset, plan, plan.to_protocol_labels(dataset.train.labels), plan.to_protocol_labels(dataset.test.labels)
        )

    @property
    def num_classes(self) -> int:
        return max(s.num_outputs for s in self.plan.sessions)

    def training_indices(self, method: Method, s: int) -> np.ndarray:
        return self.plan.joint_train(s) if method.train_on == "cumulative" else self.plan.sessions[s].train

    def session_class_counts(self, method: Method) -> np.ndarray:
        """``[session, class]`` counts of the images each session trains on (without replay)."""
        return np.stack(
            [
                np.bincount(self.train_labels[self.training_indices(method, s)], minlength=self.num_classes)
                for s in range(self.plan.num_sessions)
            ]
        )

    def description(self) -> dict:
        """What ``protocol.json`` records: class names in protocol order and the session sizes."""
        names = self.dataset.class_names
        return {
            "dataset": self.dataset.name,
            "setup": self.plan.setup,
            "image_shape": list(self.dataset.image_shape),
            "class_names": [names[int(c)] for c in self.plan.class_order],
            "sessions": [
                {
                    "train": int(len(s.train)),
                    "val": int(len(s.val)),
                    "num_outputs": s.num_outputs,
                    "new_classes": s.new_classes.tolist(),
                }
                for s in self.plan.sessions
            ],
        }


class Embedder:
    """Embeds uint8 images in fixed-size, device-sharded chunks (one compile per chunk size)."""

    def __init__(self, model, pipeline: augment.Pipeline, chunk: int, dtype: str, mesh):
        self._fn = make_embed_fn(model, pipeline)
        self._chunk = chunk
        self._dtype = dtype
        self._mesh = mesh
        self._lo, self._hi = distributed.process_slice(self._chunk, mesh)  # this process's rows of a chunk

    def __call__(self, variables: dict, images: np.ndarray) -> np.ndarray:
        out = []
        for start in range(0, images.shape[0], self._chunk):
            chunk = images[start : start + self._chunk]
            n = chunk.shape[0]
            if n < self._chunk:
                chunk = np.concatenate([chunk, np.zeros((self._chunk - n,) + chunk.shape[1:], chunk.dtype)])
            emb = self._fn(
                variables["params"],
                variables["batch_stats"],
                distributed.global_batch(chunk[self._lo : self._hi], self._mesh),
            )
            out.append(distributed.to_host(emb)[:n])
        if not out:
            return np.zeros((0, self._fn_dim(variables)), np.float32)
        emb = np.concatenate(out).astype(np.float32)
        if not np.isfinite(emb).all():  # a finite loss does not guarantee finite eval-mode embeddings
            raise FloatingPointError(
                f"{int((~np.isfinite(emb).all(axis=1)).sum())} of {emb.shape[0]} embeddings are NaN/inf "
                f"(model.dtype={self._dtype}); lower train.lr, or use model.dtype=float32 if the compiler "
                f"mishandles reduced precision on this backend. Nothing was written to the gallery."
            )
        return emb

    @staticmethod
    def _fn_dim(variables) -> int:
        return int(variables["params"]["head"].shape[1])


@functools.lru_cache(maxsize=2)  # called every step; the permutation is drawn once per epoch
def _epoch_order(seed: int, session: int, epoch: int, n: int) -> np.ndarray:
    """The sample order of an epoch, a pure function of (seed, session, epoch): resumable."""
    return np.random.default_rng([seed, session, epoch]).permutation(n)


def _results_table(per_session: list[dict], ks) -> str:
    head = "| session | " + " | ".join(f"R@{k}" for k in ks) + " |"
    rows = [head, "|" + "---|" * (len(ks) + 1)]
    for r in per_session:
        rows.append(f"| {r['session'] + 1} | " + " | ".join(f"{100 * r['recall'][str(k)]:.2f}" for k in ks) + " |")
    ar = evaluate.average_recall([{k: r["recall"][str(k)] for k in ks} for r in per_session])
    rows.append("| **AR** | " + " | ".join(f"**{100 * ar[k]:.2f}**" for k in ks) + " |")
    return "\n".join(rows)


_NO_BAD_STEP = np.iinfo(np.int32).max
_PROGRESS_STRIDE = 10**9  # progress checkpoint number = session * stride + step
_RAINBOW_PERTURBATIONS = 8


def _make_uncertainty_fn(model, pipeline: augment.Pipeline, chunk: int):
    """Labels predicted by a model under random train-time perturbations (Rainbow Memory)."""

    @jax.jit
    def predict(variables, images, key, valid_classes):
        x = pipeline.train(key, images)
        emb = model.apply(
            {"params": variables["params"]["net"], "batch_stats": variables["batch_stats"]}, x, train=False
        )
        logits = losses.cosine_logits(emb, variables["params"]["head"])
        return jnp.argmax(jnp.where(jnp.arange(logits.shape[1])[None] < valid_classes, logits, -jnp.inf), axis=1)

    def uncertainty(variables, images, valid_classes, seed):
        preds = np.zeros((_RAINBOW_PERTURBATIONS, images.shape[0]), np.int64)
        for t in range(_RAINBOW_PERTURBATIONS):
            key = jax.random.fold_in(jax.random.key(seed), t)
            for start in range(0, images.shape[0], chunk):
                part = images[start : start + chunk]
                n = part.shape[0]
                if n < chunk:
                    part = np.concatenate([part, np.zeros((chunk - n,) + part.shape[1:], part.dtype)])
                preds[t, start : start + n] = np.asarray(
                    predict(variables, jnp.asarray(part), jax.random.fold_in(key, start), valid_classes)
                )[:n]
        return memory.prediction_uncertainty(preds)

    return uncertainty


def _update_memory(method: Method, config, proto: "Protocol", mem: dict, variables, embed, uncertainty_fn, s: int):
    """The replay memory after session s-1, by the method's policy, under ``memory.budget``."""
    prev = proto.plan.sessions[s - 1].train
    budget = config.memory.budget
    if method.memory_policy == "reservoir":
        rng = np.random.default_rng([config.seed, s, 7])
        ids, seen = memory.reservoir_update(mem["source_ids"], mem["seen"], prev, budget, rng)
        return {
            "source_ids": ids.astype(np.int64),
            "labels": proto.train_labels[ids].astype(np.int32),
            "built_after": s - 1,
            "seen": seen,
        }
    pool = np.concatenate([prev, mem["source_ids"]])
    images = proto.dataset.train.images[pool]
    if method.memory_policy == "herding":
        ids, labels = memory.rebuild_memory(embed(variables, images), proto.train_labels[pool], pool, budget)
    elif method.memory_policy == "rainbow":
        unc = uncertainty_fn(variables, images, jnp.int32(proto.plan.sessions[s - 1].num_outputs), config.seed + s)
        ids, labels = memory.uncertainty_select(unc, proto.train_labels[pool], pool, budget)
    else:
        raise ValueError(f"unknown memory policy {method.memory_policy!r}")
    return {
        "source_ids": np.asarray(ids, np.int64),
        "labels": np.asarray(labels, np.int32),
        "built_after": s - 1,
        "seen": mem["seen"] + len(prev),
    }


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Runs (or resumes) the whole continual protocol; returns the contents of results.json."""
    # ---------------------------------------------------------------- 1. set-up
    distributed.maybe_initialize(config.distributed.multihost)  # before anything touches the devices
    n_dev = jax.device_count()
    config_checks.check(config, num_devices=n_dev)  # before any data loading or compilation
    with workdir_lib.open_run(config, workdir):
        log = RunLog(workdir)
        try:
            return _run_sessions(config, workdir, log)
        finally:  # also after an error: the TensorBoard file is flushed and no writer thread outlives the run
            log.close()


def _run_sessions(config: ml_collections.ConfigDict, workdir: str, log: RunLog) -> dict[str, Any]:
    """The body of ``run`` once the config is checked and the workdir prepared."""
    method = get_method(config)
    ks = tuple(int(k) for k in config.eval.ks)
    mesh = distributed.data_mesh()  # one "data" axis over every device of every process

    t0 = time.time()
    proto = Protocol.build(config)
    plan = proto.plan
    images = proto.dataset.train.images
    log.print(
        f"data: {proto.dataset.name} {images.shape[0]} train / {proto.dataset.test.images.shape[0]} test "
        f"images, setup={plan.setup}, {plan.num_sessions} sessions, {proto.num_classes} classes "
        f"({time.time() - t0:.1f}s)"
    )

    if jax.process_index() == 0:
        with open(os.path.join(workdir, "protocol.json"), "w") as f:
            json.dump(proto.description(), f, indent=1)

    model = build_model(
        config.model.name,
        width=config.model.width,
        layout=config.model.layout,
        embed_dim=config.model.embed_dim,
        dtype=config.model.dtype,
        frozen_bn=config.model.frozen_bn,
    )
    tx = make_optimizer(
        momentum=config.train.momentum, nesterov=config.train.nesterov, weight_decay=config.train.weight_decay
    )
    pipeline = augment.Pipeline.from_config(config)  # train-time augmentation and eval preprocessing
    step_fn = make_train_step(
        model,
        tx,
        method,
        temperature=config.train.temperature,
        loss_weights=dict(config.loss_weights),
        pipeline=pipeline,
    )
    embed = Embedder(model, pipeline, config.train.eval_batch_size, config.model.dtype, mesh)
    fisher_grad_fn = importance.make_batch_grad_fn(model, pipeline, temperature=config.train.temperature)
    uncertainty_fn = (
        _make_uncertainty_fn(model, pipeline, config.train.eval_batch_size)
        if method.memory_policy == "rainbow"
        else None
    )

    root = jax.random.key(config.seed)
    init_key, head_key, step_key = jax.random.split(root, 3)
    dummy = jnp.zeros((1,) + images.shape[1:], jnp.float32)
    init_vars = model.init(init_key, dummy, train=False)
    if config.model.pretrained is not None:  # ImageNet weights (fine-grained recipe), refused early if absent
        init_vars = merge_pretrained(init_vars, load_torchvision_resnet50(os.path.expanduser(config.model.pretrained)))
    variables = {
        "params": {"net": init_vars["params"], "head": init_head(head_key, proto.num_classes, config.model.embed_dim)},
        "batch_stats": init_vars["batch_stats"],
    }
    opt_template = tx.init(variables["params"])

    # ---------------------------------------------------------------- 2. resume
    session_ckpts = Checkpoints(os.path.join(workdir, "checkpoints", "sessions"), max_to_keep=None, log=log.print)
    progress_ckpts = Checkpoints(os.path.join(workdir, "checkpoints", "progress"), max_to_keep=2, log=log.print)
    gallery = Gallery.empty(config.model.embed_dim)
    # replay memory; "built_after" = the last session whose images it has seen (-1: none yet)
    mem = {"source_ids": np.zeros((0,), np.int64), "labels": np.zeros((0,), np.int32), "built_after": -1, "seen": 0}
    # EWC/RWalk: importance and anchor of the regularized network, same "built_after" convention
    reg: dict = {}
    reg_built_after = -1
    per_session: list[dict] = []
    start = 0
    restored = session_ckpts.restore_latest(
        {"variables": variables, "opt_state": opt_template, "gallery": None, "regularizer": None}
    )
    if restored is not None:
        last, items = restored
        variables = items["variables"]
        gallery = Gallery.restore(session_ckpts, last, config.model.embed_dim)  # one part per session
        stored_mem = items["meta"]["memory"]
        mem = {
            "source_ids": np.asarray(stored_mem["source_ids"], np.int64),
            "labels": np.asarray(stored_mem["labels"], np.int32),
            "built_after": stored_mem["built_after"],
            "seen": stored_mem["seen"],
        }
        reg, reg_built_after = items["regularizer"], items["meta"]["regularizer_built_after"]
        per_session = items["meta"]["per_session"]
        start = last + 1
        log.truncate(session=last + 1, step=None)
        log.print(f"resumed after session {last + 1}: gallery {len(gallery)} rows, memory {len(mem['labels'])}")

    # ---------------------------------------------------------------- 3. sessions
    for s in range(start, plan.num_sessions):
        sess = plan.sessions[s]
        prev_outputs = plan.sessions[s - 1].num_outputs if s > 0 else 0
        frozen = distributed.replicate(variables, mesh) if s > 0 else None

        # 3a. what carries over from session s-1, computed with its selected model at the start of
        # session s (the official code builds session 1's exemplars this way); a run that shares
        # session 1 with another method builds them here too.
        if method.uses_memory and s > 0 and mem["built_after"] != s - 1:
            mem = _update_memory(method, config, proto, mem, variables, embed, uncertainty_fn, s)
        if method.importance != "none" and s > 0 and reg_built_after != s - 1:
            prev = plan.sessions[s - 1].train
            fisher = importance.session_fisher(
                method.importance,
                fisher_grad_fn,
                variables,
                images[prev],
                proto.train_labels[prev],
                plan.sessions[s - 1].num_outputs,
                config.train.batch_size,
                running=reg.get("raw") if method.importance == "rwalk" else None,
            )
            raw, used = importance.accumulate(
                method.importance, reg.get("raw"), fisher, normalize=config.importance.normalize
            )
            log.print(
                f"importance ({method.importance}) after session {s}: {importance.describe(raw)}"
                + (", normalised to max 1" if config.importance.normalize else "")
            )
            reg = {"raw": raw, "importance": used, "anchor": jax.device_get(variables["params"]["net"])}
            reg_built_after = s - 1

        # training data: the session's (or all seen) images, plus replayed exemplars.
        idx = proto.training_indices(method, s)
        mem_idx = mem["source_ids"] if (method.uses_memory and s > 0) else np.zeros((0,), np.int64)
        half = method.half_memory_batches and len(mem_idx) > 0
        if not half:
            idx = np.concatenate([idx, mem_idx])
        bs = config.train.batch_size
        steps_per_epoch = len(idx) // (bs // 2 if half else bs)
        if steps_per_epoch == 0:
            raise config_checks.ConfigError(
                f"session {s + 1} has {len(idx)} training images, fewer than "
                f"train.batch_size={bs}; lower the batch size."
            )
        total_steps = steps_per_epoch * config.train.epochs
        lo, hi = distributed.process_slice(bs, mesh)
        steps_before = sum(r["steps"] for r in per_session)  # x-axis of the run's TensorBoard curves

        def batch_indices(epoch: int, i: int) -> np.ndarray:
            """Dataset indices of step i of an epoch: a pure function of (seed, session, epoch, i)."""
            if not half:
                return idx[_epoch_order(config.seed, s, epoch, len(idx))[i * bs : (i + 1) * bs]]
            h = bs // 2  # Rainbow: half session stream, half memory
            stream = idx[_epoch_order(config.seed, s, epoch, len(idx))[i * h : (i + 1) * h]]
            rng = np.random.default_rng([config.seed, s, epoch, i, 1])
            return np.concatenate([stream, mem_idx[rng.integers(0, len(mem_idx), bs - h)]])

        # 3b. head growth, method extras and per-session constants.
        params = dict(variables["params"])
        params["head"] = grow_head(params["head"], jax.random.fold_in(head_key, s), prev_outputs, sess.num_outputs)
        if method.extra_params is not None and s > 0:
            params.update(method.extra_params(variables["params"]))
        aux = {"valid_classes": jnp.int32(sess.num_outputs), "old_classes": jnp.int32(prev_outputs)}
        if method.uses_centers:
            centers, center_mask = losses.class_centers(
                gallery.embeddings,
                gallery.labels,
                proto.num_classes,
                gallery_sessions=gallery.sessions,
                per_session_mean=config.cvs.per_session_centers,
            )
            aux["centers"], aux["center_mask"] = jnp.asarray(centers), jnp.asarray(center_mask)
        if method.importance != "none" and s > 0:
            aux["reg_importance"], aux["reg_anchor"] = reg["importance"], reg["anchor"]
        aux = distributed.replicate(aux, mesh)
        state = TrainState(
            step=jnp.int32(0), params=params, batch_stats=variables["batch_stats"], opt_state=tx.init(params)
        )
        cur = {"params": state.params, "batch_stats": state.batch_stats}
        best = {"r1": -1.0, "epoch": -1, "variables": cur}
        sums: dict[str, jax.Array] = {}

        # 3c. mid-session resume: training state, best model so far, running sums of the epoch.
        progress = progress_ckpts.restore_latest(
            {"state": state, "best": cur, "sums": None}, steps=range(s * _PROGRESS_STRIDE, (s + 1) * _PROGRESS_STRIDE)
        )
        if progress is not None:
            items = progress[1]
            state, meta = items["state"], items["meta"]
            best = {"r1": meta["best_r1"], "epoch": meta["best_epoch"], "variables": items["best"]}
            sums = {k: jnp.asarray(v) for k, v in (items["sums"] or {}).items()}
            log.truncate(session=s + 1, step=int(state.step))
            log.print(f"resumed session {s + 1} at step {int(state.step)}/{total_steps}")
        state = distributed.replicate(state, mesh)

        # 3d. what validation and the gallery see in this session.
        gal_idx = proto.training_indices(method, s)
        stored = Gallery.empty(config.model.embed_dim) if method.reextract_gallery else gallery
        val_idx = plan.val_queries(s)
        test_idx = plan.test_queries(s, proto.test_labels)

        g_lab = np.concatenate([stored.labels, proto.train_labels[gal_idx]])  # fixed for the session
        val_images, val_labels = images[val_idx], proto.train_labels[val_idx]

        def search(vars_, query_images, query_labels):
            # stored rows + the session's rows by the current model, streamed without a joint copy
            g_emb = RowConcat([p.embeddings for p in stored.parts] + [embed(vars_, images[gal_idx])])
            faults.maybe_fail("validation")
            return evaluate.recall_at_k_blocked(embed(vars_, query_images), query_labels, g_emb, g_lab, ks, mesh=mesh)

        def check_finite(bad_step):
            bad = int(bad_step)
            if bad != _NO_BAD_STEP:
                raise FloatingPointError(
                    f"the loss became NaN/inf at step {bad + 1} of session {s + 1} ({method.name}); lower "
                    f"train.lr or check the data. Checkpoints up to the last good step are intact."
                )

        def save_progress(step):
            faults.fail_while_writing("progress_write", progress_ckpts.directory)
            progress_ckpts.save(
                s * _PROGRESS_STRIDE + step,
                {"state": state, "best": best["variables"], "sums": sums},
                {"session": s, "step": step, "best_r1": best["r1"], "best_epoch": best["epoch"]},
            )

        log.print(
            f"== session {s + 1}/{plan.num_sessions} [{method.name}]: {len(idx)} train images "
            f"({steps_per_epoch} steps/epoch), {sess.num_outputs} classes, gallery {len(stored)} stored "
            f"+ {len(gal_idx)} new, {len(val_idx)} val / {len(test_idx)} test queries"
        )
        session_key = jax.random.fold_in(step_key, s)
        t_session, steps_at_start = time.time(), int(state.step)
        bad_step = jnp.int32(_NO_BAD_STEP)
        step, t_epoch = int(state.step), time.time()
        while step < total_steps:
            epoch, i = divmod(step, steps_per_epoch)
            lr = schedules.epoch_lr(config.train.schedule, epoch, config.train.lr, config.train.epochs)
            b = batch_indices(epoch, i)[lo:hi]  # each process loads only its rows of the global batch
            batch = distributed.global_batch(
                {"images": images[b], "labels": proto.train_labels[b].astype(np.int32)}, mesh
            )
            state, metrics = step_fn(state, frozen, batch, aux, jnp.float32(lr), session_key)
            bad_step = jnp.minimum(bad_step, jnp.where(jnp.isfinite(metrics["loss"]), _NO_BAD_STEP, step))
            sums = {k: sums[k] + v if k in sums else v for k, v in metrics.items()}  # on device, no sync
            step += 1
            faults.maybe_fail("step")
            if config.log_every_steps and step % config.log_every_steps == 0 and step % steps_per_epoch:
                done = (step - steps_at_start) / max(total_steps - steps_at_start, 1)
                log.print(
                    f"  session {s + 1} epoch {epoch + 1} step {step}/{total_steps} "
                    f"ETA {format_eta((time.time() - t_session) / done * (1 - done))}"
                )
            if step % steps_per_epoch:
                if config.train.checkpoint_every_steps and step % config.train.checkpoint_every_steps == 0:
                    check_finite(bad_step)
                    save_progress(step)
                continue
            # end of an epoch: validation recall@1, best model, metrics, checkpoint.
            check_finite(bad_step)
            epoch_metrics = {k: float(v) / steps_per_epoch for k, v in sums.items()}
            sums = {}
            train_time = time.time() - t_epoch
            cur = {"params": state.params, "batch_stats": state.batch_stats}
            val_r1 = search(cur, val_images, val_labels)[1]
            if val_r1 > best["r1"]:  # strict improvement, as the official code
                best = {"r1": val_r1, "epoch": epoch, "variables": cur}
            done = (step - steps_at_start) / max(total_steps - steps_at_start, 1)
            eta = (time.time() - t_session) / done * (1 - done)
            ips = steps_per_epoch * bs / max(train_time, 1e-9)  # images trained per second
            log.write(
                global_step=steps_before + step,
                session=s + 1,
                epoch=epoch + 1,
                step=step,
                val_recall1=val_r1,
                images_per_s=ips,
                **epoch_metrics,
            )
            terms = " ".join(f"{k}={v:.4f}" for k, v in epoch_metrics.items() if k.startswith("L_"))
            log.print(
                f"session {s + 1}/{plan.num_sessions} epoch {epoch + 1}/{config.train.epochs} "
                f"step {step} lr={lr:.5f} loss={epoch_metrics['loss']:.4f} {terms} "
                f"val R@1={100 * val_r1:.2f} {ips:.0f} img/s ETA {format_eta(eta)}"
            )
            save_progress(step)
            t_epoch = time.time()

        # 3e. test with the selected model against the accumulated gallery.
        variables = jax.device_get(best["variables"])
        variables["params"] = {k: variables["params"][k] for k in ("net", "head")}  # method extras end here
        test_recall = search(variables, proto.dataset.test.images[test_idx], proto.test_labels[test_idx])
        new_emb = embed(variables, images[gal_idx])
        part = GalleryPart(
            new_emb, proto.train_labels[gal_idx], np.asarray(gal_idx, np.int64), s, replaces=method.reextract_gallery
        )
        gallery = gallery.with_part(part)  # adds a part: the stored rows are not copied

        record = {
            "session": s,
            "recall": {str(k): v for k, v in test_recall.items()},
            "best_epoch": best["epoch"] + 1,
            "val_recall1": best["r1"],
            "train_images": int(len(idx)),
            "gallery_rows": len(gallery),
            "test_queries": int(len(test_idx)),
            "steps": total_steps,
            "seconds": round(time.time() - t_session, 1),
        }
        per_session.append(record)
        log.write(
            global_step=steps_before + total_steps,
            session=s + 1,
            step=total_steps + 1,
            **{f"test_recall{k}": v for k, v in test_recall.items()},
        )
        log.print(
            f"session {s + 1} test: "
            + " ".join(f"R@{k}={100 * v:.2f}" for k, v in test_recall.items())
            + f" (best epoch {best['epoch'] + 1}, val R@1 {100 * best['r1']:.2f})"
        )
        faults.fail_while_writing("session_write", session_ckpts.directory)
        session_ckpts.save(
            s,
            {"variables": variables, "opt_state": state.opt_state, "gallery": part.as_dict(), "regularizer": reg},
            {
                "per_session": per_session,
                "regularizer_built_after": reg_built_after,
                "memory": {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in mem.items()},
            },
        )
    # ---------------------------------------------------------------- 4. results, pictures
    ar = evaluate.average_recall([{k: r["recall"][str(k)] for k in ks} for r in per_session])
    results = {
        "method": method.name,
        "dataset": config.data.name,
        "setup": plan.setup,
        "seed": config.seed,
        "per_session": per_session,
        "average_recall": {str(k): v for k, v in ar.items()},
    }
    last_test = plan.test_queries(plan.num_sessions - 1, proto.test_labels)

    def embed_queries(i):
        vars_i = session_ckpts.restore(i, {"variables": variables})["variables"]
        return embed(vars_i, proto.dataset.test.images[last_test])

    compat = compatibility_matrix(plan.num_sessions, gallery, embed_queries, proto.test_labels[last_test])
    results["compatibility_recall1"] = [[None if np.isnan(v) else float(v) for v in row] for row in compat]
    session_ckpts.close()
    progress_ckpts.close()
    if jax.process_index() == 0:
        tmp = os.path.join(workdir, "results.json.tmp")
        with open(tmp, "w") as f:
            json.dump(results, f, indent=2)
        os.replace(tmp, os.path.join(workdir, "results.json"))
        title = f"{config.data.name} / {plan.setup} / {method.name}"
        plots.recall_per_session([results], os.path.join(workdir, "recall_per_session.png"))
        plots.class_distribution(
            proto.session_class_counts(method),
            os.path.join(workdir, "class_distribution.png"),
            f"{config.data.name} / {plan.setup}: training images per session",
        )
        plots.compatibility(compat, os.path.join(workdir, "compatibility.png"), title)
    log.print(
        f"\nresults ({method.name}, {config.data.name}, {plan.setup}; recall in %):\n" + _results_table(per_session, ks)
    )
    return results
