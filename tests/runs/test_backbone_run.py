"""A whole run on a pretrained ViT backbone (the reduced timm fixture in tests/fixtures/backbones/)."""

import json
import os

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "backbones")


def test_a_run_trains_a_pretrained_vit(tmp_path):
    """main with model.name='vit' on a photo folder: no BatchNorm (empty batch_stats) through training,
    checkpoints and the gallery; the pretrained weights are what the run starts from."""
    from cvs_jax.engine import runner
    from cvs_jax.rundir import paths
    from cvs_jax.testing.image_folders import SESSIONS, folder_config, write_folder

    folder = write_folder(tmp_path / "photos", SESSIONS[0], 2, seed=0)
    c = folder_config(tmp_path, folder)
    c.model.name, c.model.pretrained = "vit", os.path.join(FIXTURES, "dinov2_patch14.safetensors")
    c.data.stored_size, c.augment.size = 32, 28
    workdir = str(tmp_path / "run")
    res = runner.run(c, workdir)
    assert json.load(open(paths.results_file(workdir))) == json.loads(json.dumps(res))
    assert len(res["per_session"]) == 1 and 0 < res["per_session"][0]["recall"]["1"] <= 1
