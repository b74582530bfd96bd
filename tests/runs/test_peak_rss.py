"""Host memory of a streamed run does not grow with the dataset: a one-session tiny-network run on
256x256 JPEG records (Product-10K layout, data.in_memory_limit_mb=0) with N and with 10N images.

Each run is a fresh subprocess (prepare the records, train one epoch, embed the gallery, test) and its
peak RSS is measured there, so nothing of this test process counts.  What may grow with the dataset
is per-image bookkeeping (labels, digests, source names: bytes per image), not decoded pixels.
Marked ``benchmark`` (run it with ``-m benchmark``): three runs on a shared 2-core host measured
+54, -39 and +189 MB (load average 3+ during the last) against 338 MB of extra decoded images."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from cvs_jax.testing.tiny_data import write_fake_product10k

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLASSES = 10
SMALL, LARGE = 20, 200  # images per class (80% train): N = 200 and 10N = 2000
IMAGE_BYTES = 256 * 256 * 3  # a decoded stored image

_RUN = textwrap.dedent(
    """
    import json, resource, sys
    from configs import productm_general
    from cvs_jax.engine import runner
    from cvs_jax.data.builders import resize

    # preparing decodes the sources in blocks, two in flight: a constant buffer (2 x 256 images by
    # default, more than the small run has), lowered so that both runs hold it full
    resize.BLOCK = 32

    manual_dir, data_dir, workdir, epochs = sys.argv[1:5]
    c = productm_general.get_config()
    c.method = "finetune"
    c.data.manual_dir, c.data.data_dir = manual_dir, data_dir
    c.data.in_memory_limit_mb = 0.0  # streamed: every image read from its record when a batch needs it
    c.data.num_sessions = 1
    c.data.first_classes = %(classes)d
    c.data.classes_per_session = 0
    c.memory.budget = 0
    c.model.name, c.model.layout, c.model.width, c.model.embed_dim = "resnet18", "torchvision", 4, 8
    c.model.frozen_bn = False
    c.augment.size = 32  # random-resized crop / centre crop of the 256x256 stored images
    c.train.epochs, c.train.batch_size, c.train.eval_batch_size = int(epochs), 32, 64
    res = runner.run(c, workdir)
    print("RESULT " + json.dumps({
        "train_images": res["per_session"][0]["trained_on_images"],
        "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "children_maxrss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
    }))
    """
    % {"classes": CLASSES}
)


def _start(tmp_path, per_class: int, epochs: int) -> subprocess.Popen:
    manual_dir = write_fake_product10k(tmp_path / f"p10k_{per_class}", num_classes=CLASSES, per_class=per_class)
    args = [manual_dir, str(tmp_path / f"tfds_{per_class}"), str(tmp_path / f"run_{per_class}"), str(epochs)]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.Popen(
        [sys.executable, "-c", _RUN, *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(p: subprocess.Popen) -> dict:
    try:
        stdout, stderr = p.communicate(timeout=400)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, stdout[-3000:] + stderr[-3000:]
    line = [x for x in stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


@pytest.mark.benchmark  # a measurement: its noise (tens of MB) follows the host's load
@pytest.mark.timeout(600)
def test_peak_rss_of_a_streamed_run_does_not_grow_with_the_dataset(tmp_path):
    # the small run trains 10 epochs, the large one 1: about as many steps, so both reach the loop's
    # steady state (batches in flight, the step's buffers); what differs is the dataset's size
    small = _result(_start(tmp_path, SMALL, epochs=LARGE // SMALL))
    large = _result(_start(tmp_path, LARGE, epochs=1))
    extra_images = CLASSES * (LARGE - SMALL)
    decoded_extra = extra_images * IMAGE_BYTES
    growth = (large["maxrss_kb"] - small["maxrss_kb"]) * 1024
    print(
        f"peak RSS: {small['maxrss_kb'] / 1024:.0f} MB with {CLASSES * SMALL} images, "
        f"{large['maxrss_kb'] / 1024:.0f} MB with {CLASSES * LARGE} images: +{growth / 2**20:.0f} MB for "
        f"{extra_images} more images ({decoded_extra / 2**20:.0f} MB decoded)"
    )
    assert large["train_images"] > 5 * small["train_images"]
    assert growth < 0.25 * decoded_extra
