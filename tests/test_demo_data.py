from pathlib import Path

import numpy as np

from quantflow.data.images import load_images, scan_class_folders
from quantflow.demo import data

REPO = Path(__file__).resolve().parents[1]


def test_shipped_images_are_reproduced_by_the_generator(tmp_path):
    counts = data.write_folders(tmp_path)
    assert counts == {"calib_data": 300, "eval_data": 359}
    for name in ("calib_data", "eval_data"):
        shipped = sorted(p.relative_to(REPO / name) for p in (REPO / name).rglob("*.png"))
        made = sorted(p.relative_to(tmp_path / name) for p in (tmp_path / name).rglob("*.png"))
        assert shipped == made
        a = load_images([REPO / name / p for p in shipped], 3, 32, 32)
        b = load_images([tmp_path / name / p for p in made], 3, 32, 32)
        np.testing.assert_array_equal(a, b)


def test_eval_set_is_held_out_from_training():
    images, labels = data.make_images()
    train, held, pool = data.split(labels)
    assert not set(train) & set(held)
    assert set(pool) <= set(train)
    eval_names = {p.path.name for p in scan_class_folders(REPO / "eval_data")}
    assert eval_names == {f"digit_{i:04d}.png" for i in held}


def test_preprocess_matches_declared_normalization():
    from quantflow.config import load_config
    from quantflow.data.images import preprocess

    cfg = load_config(REPO / "quantflow.toml")
    n = cfg.normalization
    img = load_images([scan_class_folders(REPO / "calib_data")[0].path], 3, 32, 32)
    np.testing.assert_allclose(data.preprocess(img[0]), preprocess(img, n.mean, n.std, n.scale, n.channel_order)[0],
                               rtol=1e-6, atol=1e-6)
