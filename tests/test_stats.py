"""Statistics: streamed values equal numpy's over the whole data; NaNs do not poison them."""

from __future__ import annotations

import numpy as np

from eva_export.dataset import stats as S


def test_column_stats_equal_numpy_with_quantiles() -> None:
    rng = np.random.default_rng(0)
    v = rng.normal(size=(500, 3)).astype(np.float32)
    d = S.column_stats(v)
    f = v.astype(np.float64)
    assert np.allclose(d["mean"], f.mean(0)) and np.allclose(d["std"], f.std(0))
    assert d["min"] == f.min(0).tolist() and d["max"] == f.max(0).tolist() and d["count"] == [500]
    for name, q in S.QUANTILES.items():
        assert np.allclose(d[name], np.quantile(f, q, axis=0)), name


def test_non_finite_values_are_left_out() -> None:
    v = np.tile(np.arange(10.0)[:, None], (1, 2))
    v[3, 0] = np.nan
    v[4, 0] = np.inf
    d = S.column_stats(v)
    kept = np.delete(np.arange(10.0), [3, 4])
    assert d["count"] == [10]
    assert d["mean"][0] == kept.mean() and d["min"][0] == 0 and d["max"][0] == 9
    assert np.isclose(d["std"][0], kept.std()) and np.isclose(d["q50"][0], np.median(kept))
    assert d["mean"][1] == 4.5  # the other element is untouched


def test_aggregate_matches_stats_of_concatenation() -> None:
    rng = np.random.default_rng(1)
    parts = [rng.normal(loc=i, size=(n, 2)) for i, n in enumerate((30, 70, 5))]
    agg = S.aggregate({"x": S.column_stats(p)} for p in parts)["x"]
    allv = np.concatenate(parts)
    assert agg["count"] == [105]
    assert np.allclose(agg["mean"], allv.mean(0)) and np.allclose(agg["std"], allv.std(0))
    assert agg["min"] == allv.min(0).tolist() and agg["max"] == allv.max(0).tolist()
    assert "q01" in agg and "q99" in agg  # count-weighted, like LeRobot


def test_image_stats_per_channel_in_unit_range() -> None:
    im = S.ImageStats(every_nth_frame=1, pixel_stride=1)
    for level in (0, 51, 255):
        frame = np.zeros((4, 4, 3), np.uint8)
        frame[..., 0] = level
        frame[..., 2] = 255
        im.add(frame)
    d = im.to_dict()
    assert np.asarray(d["mean"]).shape == (3, 1, 1) and d["count"] == [3]
    assert np.isclose(d["mean"][0][0][0], (0 + 51 + 255) / 3 / 255)
    assert d["max"][2][0][0] == 1.0 and d["min"][1][0][0] == 0.0
    assert d["q50"][0][0][0] == 51 / 255 and d["q99"][0][0][0] == 1.0
