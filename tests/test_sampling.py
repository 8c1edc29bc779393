import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from quantflow.data.sampling import allocate, manifest_paths, sample, write_manifest
from quantflow.errors import DataError

REPO = Path(__file__).resolve().parents[1]


def make_folder(root: Path, counts: dict[int, int], size=(8, 8)) -> Path:
    rng = np.random.default_rng(0)
    for c, n in counts.items():
        (root / str(c)).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            cv2.imwrite(str(root / str(c) / f"img_{i:03d}.png"), rng.integers(0, 256, size + (3,), dtype=np.uint8))
    return root


def test_allocate_respects_minimum_and_proportions():
    take = allocate({0: 100, 1: 10, 2: 50}, count=40, per_class_min=5)
    assert sum(take.values()) == 40
    assert all(v >= 5 for v in take.values())
    assert take[0] > take[2] > take[1]
    assert all(take[c] <= n for c, n in {0: 100, 1: 10, 2: 50}.items())


def test_allocate_errors():
    with pytest.raises(DataError, match="class 1: 3"):
        allocate({0: 10, 1: 3}, count=8, per_class_min=4)
    with pytest.raises(DataError, match="only 13 usable"):
        allocate({0: 10, 1: 3}, count=20, per_class_min=1)


def test_sample_real_demo_folder_is_stratified_and_deterministic():
    args = dict(data_dir=REPO / "calib_data", root=REPO, count=200, per_class_min=15, num_classes=10,
                channels=3, height=32, width=32)
    a = sample(seed=0, **args)
    b = sample(seed=0, **args)
    c = sample(seed=1, **args)
    assert a == b
    assert [i["path"] for i in a["images"]] != [i["path"] for i in c["images"]]
    assert len(a["images"]) == 200
    labels = [i["label"] for i in a["images"]]
    assert {l: labels.count(l) for l in set(labels)} == {l: 20 for l in range(10)}
    # paths are relative to the project, so the manifest does not depend on where it is checked out
    assert all(not Path(i["path"]).is_absolute() and i["path"].startswith("calib_data/") for i in a["images"])
    assert len({i["path"] for i in a["images"]}) == 200


def test_bad_images_are_reported_by_path(tmp_path):
    data = make_folder(tmp_path / "d", {0: 4, 1: 4})
    (data / "0" / "broken.png").write_bytes(b"not a png at all")
    cv2.imwrite(str(data / "1" / "big.png"), np.zeros((9, 8, 3), np.uint8))
    with pytest.raises(DataError) as e:
        sample(data, tmp_path, count=4, per_class_min=1, seed=0, num_classes=2, channels=3, height=8, width=8)
    msg = str(e.value)
    assert "2 unusable calibration image(s)" in msg
    assert str(data / "0" / "broken.png") in msg and "unreadable" in msg
    assert str(data / "1" / "big.png") in msg and "wrong size 8x9 (expected 8x8)" in msg


def test_skip_mode_lists_bad_images_and_never_uses_them(tmp_path):
    data = make_folder(tmp_path / "d", {0: 4, 1: 4})
    (data / "0" / "broken.png").write_bytes(b"garbage")
    m = sample(data, tmp_path, count=8, per_class_min=1, seed=0, num_classes=2, channels=3, height=8, width=8,
               on_bad_image="skip")
    assert [s["path"] for s in m["skipped"]] == ["d/0/broken.png"]
    assert "d/0/broken.png" not in [i["path"] for i in m["images"]]
    assert len(m["images"]) == 8


def test_class_folder_outside_the_model_classes(tmp_path):
    data = make_folder(tmp_path / "d", {0: 2, 7: 2})
    with pytest.raises(DataError, match="outside the model's 5 classes: 7"):
        sample(data, tmp_path, count=2, per_class_min=1, seed=0, num_classes=5, channels=3, height=8, width=8)


def test_a_class_without_images_fails_the_per_class_minimum(tmp_path):
    data = make_folder(tmp_path / "d", {0: 3, 2: 3})
    with pytest.raises(DataError, match="no usable images of class\\(es\\) 1 of the model's 3"):
        sample(data, tmp_path, count=3, per_class_min=1, seed=0, num_classes=3, channels=3, height=8, width=8)
    m = sample(data, tmp_path, count=3, per_class_min=0, seed=0, num_classes=3, channels=3, height=8, width=8)
    assert len(m["images"]) == 3


def test_empty_or_missing_folder(tmp_path):
    with pytest.raises(DataError, match="not found"):
        sample(tmp_path / "none", tmp_path, 1, 0, 0, 2, 3, 8, 8)
    (tmp_path / "flat").mkdir()
    cv2.imwrite(str(tmp_path / "flat" / "a.png"), np.zeros((8, 8, 3), np.uint8))
    with pytest.raises(DataError, match="no per-class sub-folders"):
        sample(tmp_path / "flat", tmp_path, 1, 0, 0, 2, 3, 8, 8)


def test_an_unlabelled_folder_is_sampled_by_its_groups(tmp_path):
    """num_classes None (evaluation.metric = "outputs"): images directly in the folder form one group, each
    sub-folder another (any names); hidden entries are ignored; the sample is seeded and stratified as by class."""
    data = make_folder(tmp_path / "frames", {"day": 12, "night": 4})
    rng = np.random.default_rng(1)
    for i in range(8):
        cv2.imwrite(str(data / f"f_{i}.png"), rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
    (data / ".cache").mkdir()
    cv2.imwrite(str(data / ".cache" / "x.png"), np.zeros((8, 8, 3), np.uint8))
    m = sample(data, tmp_path, 12, 2, 3, None, 3, 8, 8)
    take = allocate({0: 8, 1: 12, 2: 4}, 12, 2)  # the groups in order: the folder itself, then sorted sub-folders
    assert m["classes"] == {".": {"available": 8, "selected": take[0]}, "day": {"available": 12, "selected": take[1]},
                            "night": {"available": 4, "selected": take[2]}}
    assert min(take.values()) >= 2 and sum(take.values()) == 12
    assert not any(".cache" in i["path"] for i in m["images"]) and len(m["images"]) == 12
    assert m == sample(data, tmp_path, 12, 2, 3, None, 3, 8, 8)
    with pytest.raises(DataError, match="no image files in it or its sub-folders"):
        sample(make_folder(tmp_path / "empty", {"sub": 0}), tmp_path, 1, 0, 0, None, 3, 8, 8)


def test_manifest_detects_changed_images(tmp_path):
    data = make_folder(tmp_path / "d", {0: 3, 1: 3})
    m = sample(data, tmp_path, count=4, per_class_min=2, seed=3, num_classes=2, channels=3, height=8, width=8)
    write_manifest(m, tmp_path / "m.json")
    assert json.loads((tmp_path / "m.json").read_text()) == m
    paths = manifest_paths(m, tmp_path)
    assert len(paths) == 4
    cv2.imwrite(str(paths[0]), np.full((8, 8, 3), 7, np.uint8))
    with pytest.raises(DataError, match="changed since it was sampled"):
        manifest_paths(m, tmp_path)
