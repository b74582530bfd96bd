"""Everything fixed for a whole run: config, method, data, model, compiled functions, checkpoints.

Built once by ``context_builder.build_context``; the session phases (``phases.py``) read it and never
change it.  The methods' host-side policies read only its ``policy_view`` (``methods.seams``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import ml_collections

from cvs_jax.augment import transforms as augment
from cvs_jax.engine.protocol import Protocol
from cvs_jax.methods.base import Method
from cvs_jax.methods.seams import PolicyView
from cvs_jax.models import networks as models
from cvs_jax.models.frozen_trunk import FrozenTrunk
from cvs_jax.models.heads import Head
from cvs_jax.retrieval.embedder import Embedder
from cvs_jax.rundir.checkpoint import Checkpoints
from cvs_jax.rundir.run_log import RunLog


@dataclasses.dataclass
class RunContext:
    config: ml_collections.ConfigDict
    workdir: str
    method: Method
    head: Head  # the classifier head the run trains with (``model.head`` resolved for the method)
    proto: Protocol
    mesh: Any
    model: Any
    tx: Any
    pipeline: augment.Views
    step_fn: Callable  # one training step per call
    steps_fn: Callable  # ``steps_per_call`` steps per call (lax.scan over stacked batches)
    steps_per_call: int  # k = ``train.steps_per_call``: read once, here, for the compiled step and the loop
    embed: Embedder
    log: RunLog
    sessions: Checkpoints  # one per completed session, kept forever (run_state.RunState)
    progress: Checkpoints  # rolling mid-session checkpoints, numbered by the run's global step
    init_key: jax.Array
    head_key: jax.Array  # folded with the session index: the rows a session adds to the head
    step_key: jax.Array  # folded with the session index, then with the step: augmentation draws
    ks: tuple[int, ...]
    trunk: FrozenTrunk | None = None  # a frozen pretrained trunk: what checkpoints leave out
    _cache: dict = dataclasses.field(default_factory=dict)

    def initial_variables(self, *, abstract: bool = False) -> dict:
        """The whole network's (``self.model`` may be the top of a cached trunk, which takes features);
        ``abstract``: the drawn leaves' shapes only, as ``models.init_variables`` gives them."""
        return models.init_variables(
            models.from_config(self.config),
            self.config,
            self.proto.image_shape,
            self.proto.num_classes,
            self.init_key,
            self.head_key,
            head=self.head,
            abstract=abstract,
        )

    def variables_template(self) -> dict:
        """``initial_variables()``'s shapes and dtypes, nothing drawn: what a session checkpoint is read into,
        which replaces every value (a resumed, updated or finished run). Drawing them compiled or read the
        draw's program and ran it for nothing: the rerun of a finished tiny run took 4.3 s of CPU with the draw,
        3.1-3.8 s without.  A weight file's leaves are read (a frozen trunk is the file's, not the checkpoint's):
        such runs drew too, and an ``update`` of the walkthrough's EfficientNet-Lite0 photo run took 15.7-18.8 s
        with the draw, 14.0-16.9 s without (4 alternated pairs, 2-core host)."""
        return self.initial_variables(abstract=True)

    def cached(self, name: str, factory: Callable[[], Any]) -> Any:
        """A compiled helper built on first use (e.g. Rainbow's perturbed predictions)."""
        if name not in self._cache:
            self._cache[name] = factory()
        return self._cache[name]

    def compiled(self, name: str, build: Callable[[Any, Any, Any], Any]) -> Any:
        """``build(model, pipeline, head)`` on first use: a policy's compiled helper, without the context."""
        return self.cached(name, lambda: build(self.model, self.pipeline, self.head))

    @functools.cached_property
    def policy_view(self) -> PolicyView:
        """What the method's policies read of the run."""
        return PolicyView(
            plan=self.proto.plan,
            train_labels=self.proto.train_labels,
            train_images=self.proto.train_images,
            embed=self.embed,
            log=self.log.print,
            num_classes=self.proto.num_classes,
            seed=self.config.seed,
            batch_size=self.config.train.batch_size,
            eval_batch_size=self.config.train.eval_batch_size,
            loss_weights=dict(self.config.loss_weights),
            compiled=self.compiled,
        )

    def close(self) -> None:
        self.sessions.close()
        self.progress.close()
