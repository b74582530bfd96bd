"""Every config's defaults apart from the methods' loss weights: the official CVS training recipe
(ivclab/CVS ``train.py`` defaults).

Every field a run reads is set here, in ``config/base.py`` (the loss weights each registered method
declares) or in the dataset config that imports it; nothing falls back to a hidden default in the code.
Apart from the methods so that a run's stored config can be read (``config/stored.py``) without the
method registry.  Where each default comes from (the official code, the paper's text, the author's
Rainbow-Memory fork, earlier cvs-jax) is in ``docs/config-provenance.md``.
"""

import ml_collections
from ml_collections import config_dict


def get_config() -> ml_collections.ConfigDict:
    """Every section's defaults, one function per section (below, in this order)."""
    c = ml_collections.ConfigDict()
    for section in (_run, _data, _model, _train, _augment, _method_sections, _distributed_and_eval):
        section(c)
    return c


def _run(c: ml_collections.ConfigDict) -> None:
    """The run's own fields: method, seeds, overwrite, logging, population, determinism."""
    c.method = "finetune"
    c.seed = 0  # initialisation, augmentation, data order (and the split unless split_seed is set)
    c.split_seed = config_dict.placeholder(int)  # session plan (class order + image split); None: same as seed
    c.overwrite = False  # True: move a different run found in --workdir aside and start anew
    c.log_every_steps = 0  # >0: progress lines inside epochs too (0: one line per epoch)
    # >1: train N members in one vmapped step (cvs_jax/engine/population.py): member m uses seed + m, all share
    # the session plan of split_seed (else seed), each writes its own run in <workdir>/member<m>/
    c.population = 1
    c.deterministic = False  # True: bit-reproducible GPU runs (XLA deterministic ops; slower, see BENCHMARKS.md)
    # "a:b": a jax.profiler trace of global training steps a..b in <workdir>/profile (engine/profiling.py)
    c.profile_steps = ""
    # False: the run writes no report.html and no PNG pictures (a sweep of many small runs: ~2.3 s of the ~13 s of
    # CPU of a tiny two-session run on 2 cores); `python -m cvs_jax.report --workdir W` writes the page later.
    # Changes no result, so a resumed run may set or drop it.
    c.pictures = True


def _data(c: ml_collections.ConfigDict) -> None:
    """``data``: the source, its preparation and the session split."""
    c.data = ml_collections.ConfigDict()
    c.data.name = config_dict.placeholder(str)
    c.data.data_dir = "~/tensorflow_datasets"
    c.data.manual_dir = config_dict.placeholder(str)
    # Session split: "generator" (our seeded generator, cvs_jax/data/splits.py, from the fields below) or
    # "official" (the official CVS CIFAR-100 sessions, packaged with cvs_jax; the CIFAR-100 configs' default).
    c.data.split = "generator"
    c.data.official_split_dir = config_dict.placeholder(str)  # with split="official": read the CVS JSON files here
    # decoded images above this size are read from their records on demand, batch by batch and chunk by
    # chunk (host memory bounded by the batch, not the dataset); below it they are decoded into memory
    # once. Either way gives identical batches and results.
    c.data.in_memory_limit_mb = 4096.0
    c.data.loader_threads = 2  # threads that read the next training batches while the step runs
    # processes that decode the next training batches (0: the threads above, in this process); used when
    # the train split is streamed from its records (an in-RAM split is gathered by the threads)
    c.data.loader_workers = 0
    # image_folder (your own images): stored side (shorter side resized, centre crop), and the test split
    # drawn when the folder gives none
    c.data.stored_size = 256
    c.data.test_fraction = 0.2
    c.data.test_seed = 0
    # image folders added to a run by `python -m cvs_jax.update`, one session each (written by update)
    c.data.updates = ()
    c.data.on_corrupt = "refuse"  # undecodable source images: "refuse" (stop, name one) or "skip" (count them)
    c.data.setup = "general"
    c.data.num_sessions = 5
    c.data.first_classes = 20
    c.data.classes_per_session = 20
    c.data.old_class_percent = 10.0
    c.data.samples_per_new_class = config_dict.placeholder(int)
    c.data.blurry_minor_percent = 10.0
    c.data.general_shares = "uniform"  # "proportional": general-setup counts scale with class size (long-tailed data)
    c.data.val_fraction = 0.1
    c.data.val_per_class = config_dict.placeholder(int)  # Product-M: 2 val queries per class (val_fraction=0)
    c.data.shuffle_classes = True
    # at most this many train images (the first of the seeded order) and test queries (the first of the test
    # split) of each class; None: all. ``:smoke`` sets it so that a smoke run on real data stays small
    c.data.max_per_class = config_dict.placeholder(int)
    c.data.mean = (0.5071, 0.4867, 0.4408)
    c.data.std = (0.2675, 0.2565, 0.2761)


def _model(c: ml_collections.ConfigDict) -> None:
    """``model``: the network, its width, weights and head."""
    c.model = ml_collections.ConfigDict()
    c.model.name = "resnet18"
    c.model.width = 64
    c.model.layout = "cifar"
    c.model.embed_dim = 128
    c.model.frozen_bn = False  # fine-grained recipe: BatchNorm frozen on its ImageNet statistics
    # weight file: timm / Hugging Face .safetensors (ViT, DINOv2, ResNet-50) or torchvision ResNet-50 .npz/.pth;
    # model.name names the architecture ("vit": read from the file). docs/pretrained-backbones.md
    c.model.pretrained = config_dict.placeholder(str)
    # what trains of a pretrained backbone: "all", or k: the last k ViT blocks (+ final norm) or ResNet stages,
    # the projection and head, on a frozen trunk (models/vit.py, resnet.py); 0: only the projection and head.
    c.model.train_blocks = "all"
    # with train_blocks set: 1 = the frozen trunk's outputs are computed once per image, of the evaluation
    # view (no train-time crops/flips/policy), and cached in data.data_dir/cvs_features (engine/features.py);
    # V > 1 = V - 1 augmented views cached beside it, each step picks one per image; 0 = no cache: the trunk
    # runs at every step, so the augmentation applies in full. docs/pretrained-backbones.md
    c.model.cache_views = 1
    # head rows: the classes rounded up to a multiple of head_block (0: exactly the classes). Live runs
    # (`update`) grow their head; a multiple means one recompile per head_block new classes, not per session.
    c.model.head_block = 0
    c.model.dtype = "float32"  # "bfloat16": bf16 convolutions; params, embeddings and losses stay f32
    # the classifier head that trains the embedding (models/heads.py): "official" = the method's reference
    # code's head (Method.official_head), or "cosine" / "linear_reset" (a fresh linear layer with bias every
    # session) for every method
    c.model.head = "official"


def _train(c: ml_collections.ConfigDict) -> None:
    """``train``: the official recipe's optimizer, schedule and checkpoint cadence."""
    c.train = ml_collections.ConfigDict()
    c.train.epochs = 256
    c.train.batch_size = 16
    c.train.eval_batch_size = 512
    c.train.lr = 0.03
    c.train.schedule = "official"
    c.train.momentum = 0.9
    c.train.nesterov = True
    c.train.weight_decay = 1e-4
    c.train.temperature = 0.05
    # one entry per session (index 0: session 1), None or absent: train.lr / train.epochs. Written by
    # python -m cvs_jax.update --config.train.lr / --config.train.epochs for the session it adds.
    c.train.session_lr = []
    c.train.session_epochs = []
    c.train.checkpoint_every_steps = 500  # mid-session checkpoints (plus one after every epoch)
    # training steps per jitted call (lax.scan over k stacked batches; calls never cross an epoch end,
    # mid-epoch checkpoints and progress lines fall on call boundaries: cvs_jax/engine/cadence.py)
    c.train.steps_per_call = 1


def _augment(c: ml_collections.ConfigDict) -> None:
    """``augment``: crops, flips and the augmentation policy."""
    c.augment = ml_collections.ConfigDict()
    c.augment.crop = "pad"  # "pad": RandomCrop(crop_padding) (CIFAR, Tiny); "resized": RandomResizedCrop(size), eval CenterCrop(size)
    c.augment.size = config_dict.placeholder(int)  # output side of the "resized" crops (224 for fine-grained data)
    c.augment.crop_padding = 4
    c.augment.flip = True
    c.augment.policy = "none"  # "cifar10": AutoAugment CIFAR-10 policy; "randaugment": RandAugment


def _method_sections(c: ml_collections.ConfigDict) -> None:
    """The methods' sections: loss weights (filled by ``config/base.py``), CVS, importance, memory and the baselines' own."""
    # Weights of the loss terms added to L_c: each method declares its terms with their default weights
    # (Method.loss_terms, filled in by config/base.py); --config.loss_weights.<term>=<w> overrides one
    c.loss_weights = ml_collections.ConfigDict()

    # CVS switches (ablations) and the paper's written variants (provenance: docs/config-provenance.md)
    c.cvs = ml_collections.ConfigDict()
    c.cvs.use_lm = True  # neighbor-session triplet L_m
    c.cvs.use_ld = True  # inter-session coherence L_d
    c.cvs.replay = True  # herded exemplars join the training data
    c.cvs.batches = "mixed"  # exemplars shuffled into the session's data; "half": Rainbow's half-memory batches
    c.cvs.margin = 0.1
    # L_m alternatives (the supplement's ablation): triplet, batch_hard, dark_knowledge, mlkd_absolute,
    # mlkd_relative, rkd_distance, rkd_angle, darkrank
    c.cvs.lm_loss = "triplet"
    c.cvs.squared_triplet = False  # True: squared distances in L_m
    c.cvs.per_batch_coherence = False  # True: L_d divided by the batch size (False: by the old samples)
    c.cvs.per_session_centers = False  # True: L_d's class centres averaged per session (False: all rows pooled)

    # EWC / RWalk parameter importance (cvs_jax/methods/importance_policies.py): mode "fork": one slot per
    # session anchored at its last epoch; "online": one summed / running Fisher of the selected model (use
    # it with normalize=True and loss_weights.L_reg=10)
    c.importance = ml_collections.ConfigDict()
    c.importance.mode = "fork"
    c.importance.normalize = False  # True: divide each slot's importance by its maximum before use

    c.memory = ml_collections.ConfigDict()
    c.memory.budget = 2000
    # "official": each method's own memory rule; "budget" / "per_class" / "all": cvs's, CL²R's or CoReS's
    # size rule for any replay method, to compare at equal memory (cvs_jax/methods/memory_rules.py)
    c.memory.rule = "official"
    c.memory.per_class = 20  # memory.rule=per_class: images kept of every class seen

    # Rainbow Memory (cvs_jax/methods/policies.py UncertaintyMemory and HalfMemoryBatches, cvs_jax/methods/replay.py)
    c.rainbow = ml_collections.ConfigDict()
    c.rainbow.perturbations = 12  # uncertainty = 1 - (votes of the most-voted class) / T over T draws
    # "randaugment": RandAugment, then the test transform, model in eval mode; "train_pipeline": the training
    # augmentation
    c.rainbow.perturbation = "randaugment"
    # "stride": per class (quota = budget // classes) ascending uncertainty, every (len // quota)-th from the most
    # certain on; "spread": quota evenly spaced (linspace)
    c.rainbow.selection = "stride"
    c.rainbow.refill = True  # unused slots (classes under the quota) refilled at random from the other candidates
    c.rainbow.first_session = (
        "random"  # the first memory at random, equal shares per class; "uncertainty": the rule above
    )
    # "cycle": batch_size // 2 rows from a shuffled memory that cycles (a new order each pass, restarted every
    # epoch); "with_replacement": i.i.d. draws from the memory at every step
    c.rainbow.memory_batches = "cycle"
    # ablations: "herding" replaces the uncertainty memory by CVS's iCaRL herding; batches "mixed" shuffles the
    # memory into the session's data as CVS does, instead of half-memory batches
    c.rainbow.memory = "uncertainty"
    c.rainbow.batches = "half"

    # RACT (cvs_jax/methods/ract.py; OpenCompatible config.json comp_loss): the contrastive term's temperature and
    # negatives kept per block (-1: all, at most train.batch_size); variant "contra" drops the new->new block
    c.ract = ml_collections.ConfigDict()
    c.ract.temperature = 0.01
    c.ract.topk_neg = 10
    c.ract.variant = "contra_ract"

    # LCE (cvs_jax/methods/lce.py): L_bound on the raw embedding as LCE's code (True: the cosine the paper writes)
    c.lce = ml_collections.ConfigDict()
    c.lce.normalize_features = False

    # CL²R and d-Simplex-HOC (cvs_jax/methods/simplex.py): fixed d-simplex head, a memory of per_class random
    # images per class, half-memory batches; HOC's L = ce_weight L_c + (1 - ce_weight) L_HOC from session 2 on
    c.cl2r = ml_collections.ConfigDict()
    c.cl2r.per_class = 20
    # lambda = 5 sqrt(new / old): "present" counts as CL²R's code (classes in the session's data / classes in
    # the earlier sessions' data); "introduced": classes first seen this session / classes seen before (0 on blurry)
    c.cl2r.class_count = "present"
    c.hoc = ml_collections.ConfigDict()
    c.hoc.per_class = 20
    c.hoc.mu = 10.0
    c.hoc.ce_weight = 0.1


def _distributed_and_eval(c: ml_collections.ConfigDict) -> None:
    """``distributed``, ``eval`` and ``retrieval``."""
    c.distributed = ml_collections.ConfigDict()
    c.distributed.multihost = False  # True (or env CVS_JAX_MULTIHOST=1): jax.distributed.initialize() first

    c.eval = ml_collections.ConfigDict()
    c.eval.ks = (1, 2, 4)
    # query maps (cvs_jax/retrieval/query_maps.py): "none", or "procrustes" / "affine" / "mean_shift" fitted after
    # each session s >= 1 and applied, composed, when the newest model's queries score older gallery parts
    c.retrieval = ml_collections.ConfigDict({"query_map": "none"})
