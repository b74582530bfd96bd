"""Torchvision ResNet-50 weight import against an independent numpy reference forward (no torch)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvs_jax.errors import ConfigError, WeightsError
from cvs_jax.models.networks import INIT_COMPILER_OPTIONS, build_model
from cvs_jax.models.pretrained import (
    PretrainedWeightsError,
    load_torchvision_resnet50,
    merge_pretrained,
    read_state_dict,
)

EPS = 1e-5


# ---------------------------------------------------------------- torchvision layout, written out independently
def _random_state_dict(seed=0):
    """A torchvision resnet50 state dict (real shapes) with random, well-scaled values."""
    rng = np.random.default_rng(seed)
    sd = {}

    def conv(name, o, i, k):
        sd[f"{name}.weight"] = (rng.standard_normal((o, i, k, k)) * np.sqrt(2.0 / (i * k * k))).astype(np.float32)

    def bn(name, c):
        sd[f"{name}.weight"] = rng.uniform(0.5, 1.0, c).astype(np.float32)
        sd[f"{name}.bias"] = rng.normal(0, 0.1, c).astype(np.float32)
        sd[f"{name}.running_mean"] = rng.normal(0, 0.1, c).astype(np.float32)
        sd[f"{name}.running_var"] = rng.uniform(0.5, 2.0, c).astype(np.float32)
        sd[f"{name}.num_batches_tracked"] = np.array(7, np.int64)

    conv("conv1", 64, 3, 7)
    bn("bn1", 64)
    inplanes = 64
    for li, (planes, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3)), 1):
        for b in range(blocks):
            p = f"layer{li}.{b}"
            conv(f"{p}.conv1", planes, inplanes, 1)
            bn(f"{p}.bn1", planes)
            conv(f"{p}.conv2", planes, planes, 3)
            bn(f"{p}.bn2", planes)
            conv(f"{p}.conv3", planes * 4, planes, 1)
            bn(f"{p}.bn3", planes * 4)
            if b == 0:
                conv(f"{p}.downsample.0", planes * 4, inplanes, 1)
                bn(f"{p}.downsample.1", planes * 4)
            inplanes = planes * 4
    sd["fc.weight"] = rng.standard_normal((1000, 2048)).astype(np.float32)
    sd["fc.bias"] = np.zeros(1000, np.float32)
    return sd


def _np_conv(x, w, stride, pad):
    """NCHW x OIHW convolution via im2col (float64)."""
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    k = w.shape[-1]
    win = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))[:, :, ::stride, ::stride]
    return np.einsum("nchwij,ocij->nohw", win, w, optimize=True)


def _np_bn(x, sd, name):
    g, b, m, v = (sd[f"{name}.{s}"].astype(np.float64) for s in ("weight", "bias", "running_mean", "running_var"))
    return (x - m[:, None, None]) / np.sqrt(v[:, None, None] + EPS) * g[:, None, None] + b[:, None, None]


def _np_maxpool(x):
    x = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    return np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))[:, :, ::2, ::2].max(axis=(-1, -2))


def _np_resnet50(x, sd, emb_w, emb_b):
    relu = lambda a: np.maximum(a, 0)  # noqa: E731
    w = lambda n: sd[f"{n}.weight"].astype(np.float64)  # noqa: E731
    x = relu(_np_bn(_np_conv(x, w("conv1"), 2, 3), sd, "bn1"))
    x = _np_maxpool(x)
    for li, blocks in enumerate((3, 4, 6, 3), 1):
        for b in range(blocks):
            p = f"layer{li}.{b}"
            s = 2 if (li > 1 and b == 0) else 1
            y = relu(_np_bn(_np_conv(x, w(f"{p}.conv1"), 1, 0), sd, f"{p}.bn1"))
            y = relu(_np_bn(_np_conv(y, w(f"{p}.conv2"), s, 1), sd, f"{p}.bn2"))
            y = _np_bn(_np_conv(y, w(f"{p}.conv3"), 1, 0), sd, f"{p}.bn3")
            short = x
            if f"{p}.downsample.0.weight" in sd:
                short = _np_bn(_np_conv(x, w(f"{p}.downsample.0"), s, 0), sd, f"{p}.downsample.1")
            x = relu(y + short)
    feat = x.mean(axis=(2, 3))  # [N, 2048]
    return feat @ emb_w.astype(np.float64).T + emb_b  # torch Linear: W [out, in]


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    sd = _random_state_dict()
    path = tmp_path_factory.mktemp("w") / "resnet50.npz"
    np.savez(path, **sd)
    return sd, str(path)


def test_resnet50_import_matches_numpy_reference(weights):
    sd, path = weights
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 64, 64)).astype(np.float32)
    emb_w = (rng.standard_normal((128, 2048)) / np.sqrt(2048)).astype(np.float32)
    emb_b = rng.normal(0, 0.1, 128).astype(np.float32)
    ref = _np_resnet50(x.astype(np.float64), sd, emb_w, emb_b)

    model = build_model("resnet50", width=64, layout="torchvision", embed_dim=128, frozen_bn=True)
    x_nhwc = jnp.asarray(x.transpose(0, 2, 3, 1))
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), x_nhwc, train=False))
    variables = merge_pretrained(shapes, load_torchvision_resnet50(path))
    assert isinstance(variables["params"]["embedding"]["kernel"], jax.ShapeDtypeStruct)  # kept, not pretrained
    variables["params"]["embedding"] = {"kernel": emb_w.T, "bias": emb_b}
    n_body = sum(v.size for k, v in sd.items() if k.endswith("weight") or k.endswith("bias")) - 1000 * 2048 - 1000
    assert sum(np.size(p) for p in jax.tree.leaves(variables["params"])) == n_body + 2048 * 128 + 128
    assert n_body == 23_508_032  # torchvision resnet50 without fc

    out = np.asarray(jax.jit(lambda v, x: model.apply(v, x, train=False))(variables, x_nhwc))
    scale = np.abs(ref).max()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * scale)

    # frozen BN: training mode uses the running statistics and leaves them untouched.
    out_train, upd = jax.jit(lambda v, x: model.apply(v, x, train=True, mutable=["batch_stats"]))(variables, x_nhwc)
    np.testing.assert_allclose(np.asarray(out_train), out, rtol=1e-5, atol=1e-5 * scale)
    jax.tree.map(np.testing.assert_array_equal, upd["batch_stats"], variables["batch_stats"])


def test_torchvision_basic_and_unfrozen_bn_update_statistics():
    model = build_model("tiny", width=8, layout="torchvision", embed_dim=16)
    x = jnp.ones((2, 32, 32, 3))
    # Both compiled, not run op by op (~110 single-operation compiles, 19 s of CPU on a cold XLA cache), the
    # initialisation as networks.init_variables compiles it (the same bits, a fraction of the compile).
    init = jax.jit(lambda k: model.init(k, x, train=False), compiler_options=INIT_COMPILER_OPTIONS)
    variables = init(jax.random.key(0))
    assert "downsample_0" in variables["params"]["layer2_0"] and "downsample_0" not in variables["params"]["layer1_0"]
    emb, upd = jax.jit(lambda v: model.apply(v, x, train=True, mutable=["batch_stats"]))(variables)
    assert emb.shape == (2, 16)
    assert not np.allclose(upd["batch_stats"]["bn1"]["mean"], variables["batch_stats"]["bn1"]["mean"])
    with pytest.raises(ConfigError, match="torchvision"):
        build_model("resnet50", width=64, layout="imagenet", embed_dim=128)


def test_missing_file_names_path_and_fix(tmp_path):
    missing = tmp_path / "nope.npz"
    with pytest.raises(WeightsError, match="nope.npz") as e:
        load_torchvision_resnet50(str(missing))
    assert "np.savez" in str(e.value) and "torch.load" in str(e.value)
    pth = tmp_path / "w.pth"
    pth.write_bytes(b"\0")  # read without torch (models/torch_pickle.py): not a pickle, refused in one line
    with pytest.raises(PretrainedWeightsError, match="w.pth.*as a PyTorch state dict of tensors"):
        read_state_dict(str(pth))
    assert "weights_only=True" in str(e.value)  # the conversion one-liner never unpickles code either


class _RunsCode:
    """A pickled object whose loading would run code (``torch.load`` without ``weights_only``)."""

    def __reduce__(self):
        import os

        return (os.makedirs, ("UNPICKLED-CODE-RAN",))


def test_pth_is_read_weights_only(weights, tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    sd, _ = weights
    good = tmp_path / "good.pth"
    torch.save({"state_dict": {k: torch.from_numpy(v) for k, v in sd.items()}}, str(good))
    got = read_state_dict(str(good))
    np.testing.assert_array_equal(got["layer1.0.conv1.weight"], sd["layer1.0.conv1.weight"])
    evil = tmp_path / "evil.pth"
    torch.save({"conv1.weight": torch.zeros(1), "payload": _RunsCode()}, str(evil))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(WeightsError, match="evil.pth.*tensors"):
        read_state_dict(str(evil))
    assert not (tmp_path / "UNPICKLED-CODE-RAN").exists()


def test_key_and_shape_mismatches_are_listed(weights, tmp_path):
    sd, _ = weights
    bad = dict(sd)
    del bad["layer1.0.conv1.weight"]
    bad["layer5.0.conv1.weight"] = np.zeros((1, 1, 1, 1), np.float32)
    bad["bn1.weight"] = np.ones(65, np.float32)
    path = tmp_path / "bad.npz"
    np.savez(path, **bad)
    with pytest.raises(PretrainedWeightsError) as e:
        load_torchvision_resnet50(str(path))
    msg = str(e.value)
    assert str(path) in msg
    assert "1 missing (first: layer1.0.conv1.weight)" in msg
    assert "1 unexpected (first: layer5.0.conv1.weight)" in msg
    assert "bn1.weight: file (65,) vs model (64,)" in msg
    # a model of the wrong architecture is refused when merging
    small = build_model("tiny", width=8, layout="torchvision", embed_dim=16)
    shapes = jax.eval_shape(lambda: small.init(jax.random.key(0), jnp.ones((1, 32, 32, 3)), train=False))
    with pytest.raises(PretrainedWeightsError, match="do not fit"):
        merge_pretrained(shapes, {"params": {"conv1": {"kernel": np.zeros((7, 7, 3, 64))}}, "batch_stats": {}})
